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


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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

    def _heads(self, x, n):
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)           # (B, T, n*hd) -> (B, n, T, hd)

    def query(self, x, cos, sin):
        return apply_rope(self.q_norm(self._heads(self.q_proj(x), self.n_head)), cos, sin)

    def key_value(self, x, cos, sin):
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.n_kv_head)), cos, sin)
        return k, self._heads(self.v_proj(x), self.n_kv_head)

    def attend(self, q, k, v, mask=None):
        """q: (B, H, Tq, hd), k/v: (B, Hkv, Tk, hd), mask: bool (.., Tq, Tk), True = may attend."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_head != self.n_kv_head)
        B, H, T, hd = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))     # (B, H, T, hd) -> (B, T, H*hd)
