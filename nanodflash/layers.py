"""Building blocks shared by the target GPT and the drafter, in Qwen3's exact layer math.

- RMSNorm: x * rsqrt(mean(x^2) + eps) * weight
- RoPE in the "rotate-half" convention: the head dimension is split into two halves (x1, x2) and
  rotated as (x1*cos - x2*sin, x2*cos + x1*sin), frequency base `theta`; RopeTable computes cos/sin once
- SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases anywhere
- attention projections with per-head q_norm / k_norm applied *before* RoPE, optional GQA
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)   # the formula above, in one op


class Stacked:
    """One tensor built from some weights, `build(*weights)` (by default torch.cat: several projections as one
    matmul), kept while the weights stay as they are. It is built again when one of them is another tensor
    (`.to()`, `.double()`) or was written in place (its version counter moved: an optimizer step,
    load_state_dict), and on every call while gradients flow to them (training), so a stale copy is never
    used. Inside a compiled graph it is built on every call too: the compiler cannot keep a Python cache.

    >>> a, b = torch.ones(1, 2), torch.zeros(1, 2)
    >>> stack = Stacked()                              # torch.cat of the weights
    >>> stack(a, b).tolist()
    [[1.0, 1.0], [0.0, 0.0]]
    >>> _ = b.add_(1)
    >>> stack(a, b).tolist()                           # b changed in place: built again
    [[1.0, 1.0], [1.0, 1.0]]
    """

    def __init__(self, build=lambda *weights: torch.cat(weights)):
        self.build, self.key, self.value = build, None, None

    def __call__(self, *weights):
        training = torch.is_grad_enabled() and any(w.requires_grad for w in weights)
        if training or torch.compiler.is_compiling():      # a compiled graph builds it as one of its ops
            return self.build(*weights)
        key = [(w.data_ptr(), w._version, w.dtype, w.device) for w in weights]
        if key != self.key:
            self.key, self.value = key, self.build(*weights)
        return self.value


def rope_cos_sin(positions, head_dim, theta, dtype):
    """cos, sin for integer `positions` (any shape P...) -> (P..., head_dim), rotate-half layout.

    Computed exactly as Hugging Face computes them (angles and cos/sin in float32, then cast), so an
    exported target gives the same logits in transformers, in float64 too, to rounding of the matmuls."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
                                / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq      # (P..., head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)                     # (P..., head_dim)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class RopeTable:
    """rope_cos_sin for positions 0..n-1, computed once per device and dtype on first use, then looked up.

    The same values bit for bit (each angle is computed on its own), for 2 ops instead of 11: at batch 1 a
    small model's forward is mostly per-op overhead on a CPU. A plain attribute, not a buffer: nothing in the
    state dict, and nothing to fill for a model built on the meta device.

    >>> cos, sin = RopeTable(512, 16, 10000.0)(torch.tensor([3, 4]), torch.float32)   # (2, 16) each
    """

    def __init__(self, n, head_dim, theta):
        self.n, self.head_dim, self.theta, self.tables = n, head_dim, theta, {}

    def __call__(self, positions, dtype):
        key = (positions.device, dtype)
        if key not in self.tables:
            self.tables[key] = rope_cos_sin(torch.arange(self.n, device=positions.device), self.head_dim,
                                            self.theta, dtype)
        cos, sin = self.tables[key]
        return cos[positions], sin[positions]                          # (P..., head_dim) each


def apply_rope(x, cos, sin):
    """x: (B, H, T, hd); cos/sin broadcastable to it, e.g. (B, 1, T, hd) or (T, hd)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def per_head(n_q, n_kv):
    """A Stacked build: the q_norm weight once per query head, then the k_norm weight once per key head."""
    return lambda q, k: torch.cat([q.expand(n_q, -1), k.expand(n_kv, -1)])                # (n_q + n_kv, hd)


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)
        self.gate_up = Stacked()                               # gate and up as one matmul, then split

    def forward(self, x):
        gate, up = F.linear(x, self.gate_up(self.gate_proj.weight, self.up_proj.weight)).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class AttentionProjections(nn.Module):
    """q/k/v/o projections plus per-head q_norm and k_norm (Qwen3). Shapes are (B, H, T, hd)."""

    def __init__(self, dim, n_head, n_kv_head, eps=1e-6, head_dim=None):
        super().__init__()
        assert n_head % n_kv_head == 0, "n_head % n_kv_head must be 0"
        assert head_dim or dim % n_head == 0, "dim % n_head must be 0 unless head_dim is given"
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim or dim // n_head
        self.q_proj = nn.Linear(dim, n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * self.head_dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        # project's stacked weights, with the queries and without: [W_q,] W_k, W_v; each head's norm weight
        self.stacks = {with_query: (Stacked(), Stacked(per_head(n_head * with_query, n_kv_head)))
                       for with_query in (True, False)}

    def project(self, x, cos, sin, with_query=True):
        """x (B, T, D) -> q (B, H, T, hd) when with_query, then k, v (B, Hkv, T, hd):

            q = RoPE(q_norm(W_q x)),  k = RoPE(k_norm(W_k x)),  v = W_v x

        The projections run as one matmul (their weights stacked), q and k are normed and rotated together
        (each head on its own, so the numbers are the separate ones'): about 21 tensor operations a layer
        where three projections, two norms and two rotations take 42, and at batch 1 a small model's forward
        on a CPU is mostly per-operation overhead."""
        B, T, _ = x.shape
        n_q, n_kv, hd = self.n_head if with_query else 0, self.n_kv_head, self.head_dim
        W, g = self.stacks[with_query]
        heads = F.linear(x, W(*self.weights(with_query))).view(B, T, n_q + 2 * n_kv, hd)   # (B, T, n, hd)
        qk, v = heads.split([n_q + n_kv, n_kv], dim=2)
        norm_weight = g(self.q_norm.weight, self.k_norm.weight)                    # (n_q + n_kv, hd)
        qk = F.rms_norm(qk, (hd,), eps=self.k_norm.eps) * norm_weight
        qk = apply_rope(qk.transpose(1, 2), cos, sin)                     # (B, T, n, hd) -> (B, n, T, hd)
        v = v.transpose(1, 2)                                                       # (B, n_kv, T, hd)
        return (*qk.split([n_q, n_kv], dim=1), v) if with_query else (qk, v)

    def weights(self, with_query):
        """The projections' weights project stacks: [W_q,] W_k, W_v."""
        kv = [self.k_proj.weight, self.v_proj.weight]
        return [self.q_proj.weight, *kv] if with_query else kv

    def key_value(self, x, cos, sin):
        """k, v (B, Hkv, T, hd) of x: project without the queries (the drafter's context)."""
        return self.project(x, cos, sin, with_query=False)

    def attend(self, q, k, v, mask=None):
        """q: (B, H, Tq, hd), k/v: (B, Hkv, Tk, hd), mask: bool (.., Tq, Tk), True = may attend."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_head != self.n_kv_head)
        B, H, T, hd = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))     # (B, H, T, hd) -> (B, T, H*hd)
