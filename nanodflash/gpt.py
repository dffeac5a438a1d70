"""The target: a minimal decoder-only GPT in Qwen3 layer math, with an explicit KV cache.

    logits, features = target(idx, cache=None, layer_ids=None)

`idx` is (B, T) token ids. With a `KVCache`, the new tokens sit at positions cache.length ...
cache.length+T-1, attend to everything cached before them, and are appended to the cache.
`layer_ids` (0-indexed decoder layers) asks for the *outputs* of those layers, concatenated on the
last axis: features (B, T, len(layer_ids) * n_embd). They are what the DFlash drafter conditions on.
Layer id i means Hugging Face's `hidden_states[i+1]`: the output of decoder layer i, except that for the
LAST layer it is the output after the final norm (HF returns that one normed). The paper's rule never
picks the last layer; when asked for, it comes normed, so an exported drafter sees what it saw here.

Its building blocks, shared with the drafter, in Qwen3's exact layer math:

- RMSNorm: x * rsqrt(mean(x^2) + eps) * weight
- RoPE in the "rotate-half" convention: the head dimension is split into two halves (x1, x2) and
  rotated as (x1*cos - x2*sin, x2*cos + x1*sin), frequency base `theta`; RopeTable computes cos/sin once
- SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases anywhere
- attention projections with per-head q_norm / k_norm applied *before* RoPE, optional GQA

The checkpoints keep Qwen3's names (q_proj, k_proj, v_proj; gate_proj, up_proj): store/checkpoint.py splits
the stacked weights on save and stacks them on load.
"""

import math
from dataclasses import dataclass

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
        self.gate_up_proj = nn.Linear(dim, 2 * hidden, bias=False)      # W_gate and W_up stacked: one matmul
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class AttentionProjections(nn.Module):
    """q/k/v/o projections plus per-head q_norm and k_norm (Qwen3). Shapes are (B, H, T, hd)."""

    def __init__(self, dim, n_head, n_kv_head, eps=1e-6, head_dim=None):
        super().__init__()
        assert n_head % n_kv_head == 0, "n_head % n_kv_head must be 0"
        assert head_dim or dim % n_head == 0, "dim % n_head must be 0 unless head_dim is given"
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim or dim // n_head
        # W_q, W_k, W_v stacked (rows: n_head, then n_kv_head, then n_kv_head heads): one matmul
        self.qkv_proj = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_head * self.head_dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)

    def project(self, x, cos, sin, with_query=True):
        """x (B, T, D) -> q (B, H, T, hd) when with_query, then k, v (B, Hkv, T, hd):

            q = RoPE(q_norm(W_q x)),  k = RoPE(k_norm(W_k x)),  v = W_v x

        The projections run as one matmul (without the queries: W_k, W_v, the last rows), q and k are normed
        and rotated together (each head on its own, so the numbers are the separate ones'): at batch 1 a
        small model's forward on a CPU is mostly per-operation overhead, and this halves the operations."""
        B, T, _ = x.shape
        n_q, n_kv, hd = self.n_head if with_query else 0, self.n_kv_head, self.head_dim
        W = self.qkv_proj.weight[(self.n_head - n_q) * hd:]                      # [W_q;] W_k; W_v
        heads = F.linear(x, W).view(B, T, n_q + 2 * n_kv, hd)                    # (B, T, n, hd)
        qk, v = heads.split([n_q + n_kv, n_kv], dim=2)
        norm_weight = torch.cat([self.q_norm.weight.expand(n_q, -1), self.k_norm.weight.expand(n_kv, -1)])
        qk = F.rms_norm(qk, (hd,), eps=self.k_norm.eps) * norm_weight          # norm_weight: (n_q + n_kv, hd)
        qk = apply_rope(qk.transpose(1, 2), cos, sin)                     # (B, T, n, hd) -> (B, n, T, hd)
        v = v.transpose(1, 2)                                                       # (B, n_kv, T, hd)
        return (*qk.split([n_q, n_kv], dim=1), v) if with_query else (qk, v)

    def key_value(self, x, cos, sin):
        """k, v (B, Hkv, T, hd) of x: project without the queries (the drafter's context)."""
        return self.project(x, cos, sin, with_query=False)

    def attend(self, q, k, v, mask=None):
        """q: (B, H, Tq, hd), k/v: (B, Hkv, Tk, hd), mask: bool (.., Tq, Tk), True = may attend."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_head != self.n_kv_head)
        B, H, T, hd = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))     # (B, H, T, hd) -> (B, T, H*hd)


@dataclass
class GPTConfig:
    vocab_size: int = 1024     # including the special tokens <|endoftext|> and <|mask|>
    n_layer: int = 6
    n_head: int = 4
    n_kv_head: int = 4         # < n_head gives grouped-query attention
    n_embd: int = 256
    mlp_hidden: int = 768      # SwiGLU hidden width
    max_seq_len: int = 512     # the context window (block_size is the *draft* block, see drafter.py)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    head_dim: int = 0          # per-head width; 0 = n_embd // n_head (real Qwen3s use 128 whatever the width)

    def __post_init__(self):
        self.head_dim = self.head_dim or self.n_embd // self.n_head


class KVCache:
    """Preallocated keys/values for every layer, plus how many positions are filled.

    k, v: (n_layer, batch, n_kv_head, max_len, head_dim). Rolling back rejected tokens is just
    `crop(n)`: the length goes back to n and later writes overwrite the stale entries.
    """

    def __init__(self, config, batch_size, max_len, device=None, dtype=torch.float32):
        shape = (config.n_layer, batch_size, config.n_kv_head, max_len, config.head_dim)
        # not zeroed: positions >= length are never read, so zeroing would be work for nothing
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.by_layer = self.layer_views()
        self.max_len, self.length = max_len, 0

    def layer_views(self):
        """[(k, v)] per layer, each (batch, Hkv, max_len, hd): views of k and v made once, so a write slices
        one layer's tensor instead of indexing the whole cache (4 tensor operations a layer fewer). Made with
        gradients on: torch lets such a view be written with them off or on, while one made under no_grad (in
        a decoder) could not be written by a forward with gradients later."""
        with torch.enable_grad():
            return [(self.k[i], self.v[i]) for i in range(self.k.size(0))]

    def crop(self, n):
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {n}")
        self.length = n

    def write(self, layer, start, k, v):
        """Store k/v (B, Hkv, T, hd) at positions start..start+T-1; return all keys/values up to there."""
        end = start + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: position {end - 1} does not fit max_len={self.max_len}")
        keys, values = self.by_layer[layer]
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    def prefix(self, n):
        """Every layer's keys/values of positions 0..n-1, as views: [(k, v)], each (batch, Hkv, n, hd)."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self.by_layer]


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.self_attn = AttentionProjections(c.n_embd, c.n_head, c.n_kv_head, c.norm_eps, c.head_dim)
        self.post_attention_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.mlp = MLP(c.n_embd, c.mlp_hidden)

    def forward(self, x, cos, sin, mask, cache, layer, start):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, cos, sin)
        if cache is not None:
            k, v = cache.write(layer, start, k, v)                          # all keys up to the new ones
        x = x + self.self_attn.attend(q, k, v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.rope = RopeTable(config.max_seq_len, config.head_dim, config.rope_theta)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():        # GPT-2 style scaled init of residual outputs
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def new_cache(self, batch_size=1, max_len=None):
        p = next(self.parameters())
        return KVCache(self.config, batch_size, max_len or self.config.max_seq_len, p.device, p.dtype)

    def forward(self, idx, cache=None, layer_ids=None, positions=None, mask=None):
        """idx (B, T) -> logits (B, T, V) and, with `layer_ids`, features (B, T, len(layer_ids) * D).

        By default token t sits at position cache.length + t and sees every cached key and the new keys up
        to its own (causal). Tree verification and ragged batches pass their own `positions` ((T,) or
        (B, T)) and boolean `mask` (broadcastable to (B, 1, T, cache.length + T), True = may attend)."""
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.config.max_seq_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_seq_len={self.config.max_seq_len}")
        x = self.embed_tokens(idx)                                          # (B, T, D)
        if positions is None:
            positions = torch.arange(start, start + T, device=idx.device)
            if T > 1 and mask is None:
                # (T, start+T), causal over [cached keys ; new keys]: query i sees keys 0..start+i
                mask = torch.arange(start + T, device=idx.device)[None, :] <= positions[:, None]
        cos, sin = self.rope(positions, x.dtype)                            # (..., T, hd)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]                            # -> (B, 1, T, hd): per row
        by_id = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i, start)
            if layer_ids is not None and i in layer_ids:
                by_id[i] = x
        if cache is not None:
            cache.length = start + T
        x = self.norm(x)
        logits = self.lm_head(x)                                             # (B, T, vocab)
        if layer_ids is None:
            return logits, None
        if len(self.layers) - 1 in by_id:
            # HF's convention: the last one normed
            by_id[len(self.layers) - 1] = x
        return logits, torch.cat([by_id[i] for i in layer_ids], dim=-1)       # (B, T, len(ids)*D)
