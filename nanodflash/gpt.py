"""The target: a minimal decoder-only GPT in Qwen3 layer math, with an explicit KV cache.

    logits, features = target(idx, cache=None, layer_ids=None)

`idx` is (B, T) token ids. With a `KVCache`, the new tokens sit at positions cache.length ...
cache.length+T-1, attend to everything cached before them, and are appended to the cache.
`layer_ids` (0-indexed decoder layers) asks for the *outputs* of those layers, concatenated on the
last axis: features (B, T, len(layer_ids) * n_embd). They are what the DFlash drafter conditions on.
Layer id i means Hugging Face's `hidden_states[i+1]`: the output of decoder layer i, except that for the
LAST layer it is the output after the final norm (HF returns that one normed). The paper's rule never
picks the last layer; when asked for, it comes normed, so an exported drafter sees what it saw here.
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn

from .layers import MLP, AttentionProjections, RMSNorm, RopeTable


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

    def fingerprint(self):
        """A short hash of config + weights, so a drafter can check which target it was trained on."""
        import hashlib
        config = asdict(self.config)
        if config["head_dim"] == self.config.n_embd // self.config.n_head:
            del config["head_dim"]                          # a derived head_dim is not a setting of its own
        h = hashlib.sha256(repr(sorted(config.items())).encode())
        for name, t in sorted(self.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]
