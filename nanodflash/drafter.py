"""The DFlash drafter: a small block-diffusion model conditioned on the target's hidden features.

It drafts a whole block in ONE forward pass. The block is the anchor (the last token the target
emitted, not yet processed by the target) followed by B-1 MASK tokens; the drafter fills every MASK
at once. It has no embedding or LM head of its own: it borrows the target's, frozen.

Conditioning is by *KV injection*. The target's features at the chosen `target_layer_ids` are fused
into one vector per verified position, h = RMSNorm(fc(concat(layer outputs))), and every drafter
layer projects them with its own W_K, W_V -- the same projections it applies to the block -- so the
context enters each layer as extra keys/values. Queries come from the block only; there is no causal
mask. Positions are absolute (RoPE): context feature j sits at j, block slot i at start+i.

    context (verified, features from the target)        block (drafted now)
    pos:  0    1    2   ...  start-1                    start   start+1  ...  start+B-1
         [h0] [h1] [h2] ... [h_{s-1}]                  [anchor] [MASK]   ...  [MASK]
    keys:  K/V of every h_j (cached)          +         K/V of every block slot
    queries: block slots only; each block slot sees ALL context keys and ALL block keys

At inference the context K/V are cached. The features of newly verified positions are queued by
`extend` and projected at the start of the next draft pass (`project_context`), so each speculative
step runs the drafter once. During training, K blocks share one forward: block b (anchor a_b) sees
context features j < a_b and its own slots, nothing of the other blocks (`training_mask`).
The same, stated precisely: docs/design.md §1.1-1.4 and §1.7.

The drafter interface: what the decoders ask of a drafter, and the answers of a drafter that has only its
slots' logits (DrafterInterface, below).

Every decoder (speculative.py; ext/: tree.py, sampled_tree.py, batch.py) and every tool speaks to a drafter
through these methods and never asks which kind it is. A new kind subclasses `DrafterInterface`, writes
`new_cache`, `extend` and `slot_logits`, and inherits the rest; it overrides a method where it knows better
(DFlash 2's selector scores its candidates after each predecessor; an autoregressive chain drafts one token at
a time).

    block_size, target_layer_ids                B (the anchor and at most B-1 drafts a pass), and the target
                                                layers whose outputs the decoders hand to `extend`
    new_cache(max_len)                          its context for one sequence
    extend(cache, features, tokens)             append verified positions: features (1, t, F), ids (1, t)
    context_length(cache)                       the verified positions it holds
    mark(cache), rewind(cache, mark)            forget what a step added (timing steps: ext/step_costs.py)
    project_context(cache)                      do now what the next draft would do first (default: nothing)
    slot_logits(cache, anchor, n_draft)         the draft slots' logits (n, V), one pass
    draft(cache, anchor, n_draft, choose)       the path: (tokens (n,), q (n, V) or None), choose a DraftRule
    candidates(cache, anchor, n_draft, T)       top-K trees: cand (n, K), logp (n, K, K) after each parent
    draft_distribution(cache, anchor, n, T)     sampled trees: q(t, prev) -> (V,), the q a path draws from
    slot_scores(cache, anchor, drafts)          the trace page: per slot [[token, score], ...], or None

The defaults read the slots' logits as independent marginals: slot t's distribution is the same whatever
was drafted before it (DFlash 1, docs/design.md §1.4).
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .gpt import Block, KVCache, RMSNorm, RopeTable
from .loss import block_labels, mix_soft, weighted_cross_entropy
from .sampling import draft_temperature, probs_from_logits

TOP_K = 16          # candidates per slot of a drafter without a selector of its own (trees)


class DrafterInterface:
    """The defaults of the drafter interface (module docstring); a subclass writes new_cache, extend and
    slot_logits."""

    kind = "custom"         # a label for tables and checkpoints, never a switch (the methods answer)
    uses_block_pass = False  # whether its drafts run Drafter.block_pass through its cache's `attend`: the
                             # compiled pass and the batched rows (ext/) run such a drafter their own way
    compiled = False         # whether that pass runs compiled (ext/compiled.py's compile_drafter)
    cost_book = None        # its step costs (step_costs.CostBook), made when first asked for

    @property
    def block_size(self):
        """B: the anchor and the drafts of one pass, at most (a model drafter's, from its config)."""
        return self.config.block_size

    @property
    def target_layer_ids(self):
        """The target layers whose outputs `extend` gets as features (a model drafter's, from its config)."""
        return self.config.target_layer_ids

    def context_length(self, cache):
        """How many verified positions the drafter's context holds."""
        return cache.length

    def project_context(self, cache):
        """Do the work the next draft would start with (a drafter that projects its context lazily)."""

    def mark(self, cache):
        """The state of the context, for `rewind` (timing a step again from the same context)."""
        return cache.length

    def rewind(self, cache, mark):
        """Forget what the context gained since `mark` was taken."""
        cache.length = mark

    def draft(self, cache, anchor, n_draft, choose):
        """n_draft drafts after `anchor` in one pass: choose(the slots' logits (n, V))."""
        return choose(self.slot_logits(cache, anchor, n_draft))

    def candidates(self, cache, anchor, n_draft, temperature):
        """One pass -> the top-K candidates cand (n, K) of slots 1..n and logp (n, K, K): the log-prob of
        candidate c at slot t+1 after candidate i of slot t, a softmax of the scores / temperature. Here the
        slot's own softmax over the whole vocabulary, the same row for every parent."""
        logits = self.slot_logits(cache, anchor, n_draft).detach().cpu()              # (n, V)
        k = min(TOP_K, logits.size(-1))
        logp, cand = (logits / temperature).log_softmax(-1).topk(k, dim=-1)         # (n, K) each
        return cand, logp[:, None, :].expand(-1, cand.size(1), -1)                  # any parent: one row

    def draft_distribution(self, cache, anchor, n_draft, temperature):
        """One pass -> q(t, prev): the distribution (V,) float64 a sampled path draws slot t+1 from after the
        token `prev` at slot t (t = 0: after the anchor), at sampling.draft_temperature(temperature). Here
        the slot's own softmax, whatever came before."""
        logits = self.slot_logits(cache, anchor, n_draft).detach().cpu()              # (n, V)
        q = probs_from_logits(logits, draft_temperature(temperature))                # (n, V)
        return lambda t, prev: q[t]

    def slot_scores(self, cache, anchor, drafts, top=4):
        """What each slot chose among, for the trace page: None for a drafter that picks by its logits."""
        return None


def default_target_layer_ids(n_target_layers, n_features):
    """The paper's rule: n=1 -> [L//2]; else round(1 + i*(L-4)/(n-1)), i = 0..n-1 (0-indexed layers).

    For targets too shallow for that rule to give n distinct layers (L - 4 < n - 1), we spread the n
    layers evenly over all of them instead: round(i*(L-1)/(n-1)).
    Example: L=6, n=2 -> [1, 3]; L=4, n=2 -> [0, 3].
    """
    L, n = n_target_layers, n_features
    if not 1 <= n <= L:
        raise ValueError(f"need 1 <= number of target layers used ({n}) <= target depth ({L})")
    if n == 1:
        return [L // 2]
    if L - 4 >= n - 1:
        return [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]
    return [int(round(i * (L - 1) / (n - 1))) for i in range(n)]


def training_mask(anchors, seq_len, block_size):
    """Bool mask (N, K*B, S + K*B): may the query (block b, slot i) see key j?

    Keys are [context features 0..S-1 ; block slots of all K blocks]. Block b sees context j iff
    j < anchors[n, b], and every slot of its own block. anchors: (N, K) LongTensor.
    """
    N, K = anchors.shape
    B = block_size
    ctx_pos = torch.arange(seq_len, device=anchors.device)
    query_anchor = anchors.repeat_interleave(B, dim=1)                          # (N, K*B)
    sees_ctx = ctx_pos[None, None, :] < query_anchor[:, :, None]               # (N, K*B, S)
    block_of = torch.arange(K, device=anchors.device).repeat_interleave(B)      # (K*B,)
    sees_block = (block_of[:, None] == block_of[None, :]).expand(N, -1, -1)     # (N, K*B, K*B)
    return torch.cat([sees_ctx, sees_block], dim=-1)


class ContextCache(KVCache):
    """The drafter's cache: K/V of the verified context, and `pending`, the features of the newest
    verified positions (the last ones before `length`) whose K/V are not computed yet.

    `extend` only queues features; the next drafting pass projects them first (`project_context`), so a
    speculative step runs the drafter once, as in the paper's code. An autoregressive chain drafter
    (tools/baselines.py) writes its chain slots' K/V past `length` as scratch that the next write overwrites.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending = []                         # feature tensors (1, t, n_feat*D), oldest first

    def attend(self, drafter, x, cos, sin):
        """The drafter's block pass over this context, its `length` verified positions: x (1, b, D) at RoPE
        cos, sin -> final hidden states (1, b, D). (compiled.CompiledCache attends to its whole buffer.)"""
        return drafter.block_pass(x, cos, sin, self.prefix(self.length))


class DrafterLayer(Block):
    """A pre-norm transformer layer with KV injection: queries from the block, keys/values [context ; block].

    The context keys/values are the fused target features projected by this layer's own W_K, W_V (the same
    projections the block gets), computed by the caller: all of them at once in training, cached at inference.
    No causal mask inside the block. Returns the new x and the block's own K/V (a DFlash block discards
    them; an autoregressive chain keeps them as context for its next slot).
    """

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.project(h, cos, sin)                              # k, v (N, Hkv, T, hd)
        keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)  # (N, Hkv, S+T, hd)
        x = x + self.self_attn.attend(q, keys, values, mask)
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


@dataclass
class DrafterConfig:
    n_layer: int = 1
    block_size: int = 16                      # the DFlash draft block B (anchor + B-1 masks)
    target_layer_ids: list = field(default_factory=list)
    mask_token_id: int = -1
    n_embd: int = 256                         # must equal the target's width (shared embed / head)
    n_head: int = 4
    n_kv_head: int = 4
    mlp_hidden: int = 768
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    head_dim: int = 0                         # 0 = n_embd // n_head

    def __post_init__(self):
        self.head_dim = self.head_dim or self.n_embd // self.n_head

    @classmethod
    def for_target(cls, tc, mask_token_id, n_layer=1, block_size=16, n_target_layers=None, **kw):
        """A drafter config matched to target config `tc` (same width, heads and RoPE)."""
        ids = default_target_layer_ids(tc.n_layer, n_target_layers or n_layer)
        return cls(n_layer=n_layer, block_size=block_size, target_layer_ids=ids, mask_token_id=mask_token_id,
                   n_embd=tc.n_embd, n_head=tc.n_head, n_kv_head=tc.n_kv_head, mlp_hidden=tc.mlp_hidden,
                   rope_theta=tc.rope_theta, norm_eps=tc.norm_eps, head_dim=tc.head_dim, **kw)


class Drafter(DrafterInterface, nn.Module):
    kind = "dflash"                               # the checkpoint's "kind" (see store/checkpoint.py)
    uses_block_pass = True                        # its drafts attend through the cache: a CompiledCache's too
    config_class = DrafterConfig

    def __init__(self, config, target):
        super().__init__()
        c = self.config = config
        if c.n_embd != target.config.n_embd:
            raise ValueError(f"drafter width {c.n_embd} must equal the target's {target.config.n_embd}")
        if not 0 <= c.mask_token_id < target.config.vocab_size:
            raise ValueError(f"mask_token_id {c.mask_token_id} is not in the target's vocabulary")
        L = target.config.n_layer
        if not c.target_layer_ids or not all(0 <= i < L for i in c.target_layer_ids):
            raise ValueError(f"target_layer_ids {c.target_layer_ids} must name at least one target layer, "
                             f"each in 0..{L - 1}; DrafterConfig.for_target(target.config, mask_id) "
                             "picks them by the paper's rule")
        if c.block_size < 2 or c.n_layer < 1:
            raise ValueError(f"need block_size >= 2 (an anchor and a draft) and n_layer >= 1, "
                             f"got {c.block_size} and {c.n_layer}")
        object.__setattr__(self, "target", target)    # borrowed, frozen, and NOT one of our parameters
        # RoPE for the target's max_seq_len positions plus one block
        self.rope = RopeTable(target.config.max_seq_len + c.block_size, c.head_dim, c.rope_theta)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.n_embd, c.n_embd, bias=False)
        self.hidden_norm = RMSNorm(c.n_embd, c.norm_eps)
        self.layers = nn.ModuleList(self.new_layer(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.norm_eps)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                residual_out = name.endswith(("o_proj.weight", "down_proj.weight"))
                std = 0.02 / math.sqrt(2 * c.n_layer) if residual_out else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def new_layer(self, c):
        return DrafterLayer(c)

    def rope_at(self, positions, dtype):
        """cos, sin at integer positions (T,) or (N, T) -> (1 or N, 1, T, hd): broadcast over the heads."""
        cos, sin = self.rope(positions, dtype)
        return cos.unsqueeze(-3), sin.unsqueeze(-3)          # (..., T, hd) -> (..., 1, T, hd)

    # ---------------- the two equations every pass shares: context K/V, and the block pass ----------------

    def context_kv(self, features, positions):
        """Fused target features -> every layer's context keys/values, [(k, v)] with k, v (N, Hkv, t, hd):
        h = RMSNorm(fc(features (N, t, F))), then each layer's own W_K, W_V and RoPE at `positions` ((t,) or
        (N, t)). Training projects a whole sequence at once; inference, the newest verified positions."""
        h = self.hidden_norm(self.fc(features))                                  # (N, t, D) fused features
        cos, sin = self.rope_at(positions, h.dtype)
        return [layer.self_attn.key_value(h, cos, sin) for layer in self.layers]

    def block_pass(self, x, cos, sin, context, mask=None):
        """The drafter's layers over embedded block slots x (N, T, D) at RoPE cos, sin: layer i attends from
        the block to [its context K/V context[i] ; the block] (mask (N, 1, T, S+T), or None: all of it)
        -> final hidden states (N, T, D)."""
        for layer, (ctx_k, ctx_v) in zip(self.layers, context):
            x, _, _ = layer(x, ctx_k, ctx_v, cos, sin, mask)
        return self.norm(x)

    # ---------------- inference: a cache of projected context K/V ----------------

    def new_cache(self, max_len):
        """Context K/V for every drafter layer; `max_len` verified positions (+ room for one block)."""
        p = next(self.parameters())
        return ContextCache(self.config, 1, max_len + self.config.block_size, p.device, p.dtype)

    def extend(self, cache, features, tokens=None):
        """Append newly verified positions: features (1, t, n_feat*D) at positions cache.length... .

        Lazy: the features are queued and projected by the next drafting pass (`project_context`).
        `tokens` (their ids) are part of the drafter protocol (an autoregressive drafter needs them);
        DFlash conditions on the features alone.
        """
        if cache.length + features.size(1) > cache.max_len:
            raise ValueError(f"drafter cache overflow: {cache.length + features.size(1)} positions "
                             f"> max_len={cache.max_len}")
        cache.pending.append(features)
        cache.length += features.size(1)

    def project_context(self, cache):
        """Turn the queued features into every layer's context K/V: h = RMSNorm(fc(features)), then each
        layer's W_K, W_V and RoPE at the features' own positions (the last t before cache.length)."""
        if not cache.pending:
            return
        features = torch.cat(cache.pending, dim=1)                               # (1, t, n_feat*D)
        cache.pending.clear()
        start = cache.length - features.size(1)
        positions = torch.arange(start, cache.length, device=features.device)
        for i, (k, v) in enumerate(self.context_kv(features, positions)):
            cache.write(i, start, k, v)

    def block_hidden(self, cache, block):
        """block (1, b) = [anchor, MASK, ...] at positions cache.length.. -> final hidden states (1, b, D),
        in one pass. Every slot sees the whole context and the whole block; the block's K/V are not kept."""
        self.project_context(cache)
        n = cache.length
        x = self.target.embed_tokens(block)                                       # (1, b, D)
        cos, sin = self.rope_at(torch.arange(n, n + block.size(1), device=x.device), x.dtype)
        return cache.attend(self, x, cos, sin)

    def block_logits(self, cache, block):
        """block (1, b) = [anchor, MASK, ...] at positions cache.length.. -> logits (1, b, V), in one pass."""
        return self.target.lm_head(self.block_hidden(cache, block))

    def mask_block(self, cache, anchor, n_draft):
        """The block one draft fills: [anchor, MASK x n_draft], (1, n_draft+1), on the cache's device."""
        block = torch.full((1, n_draft + 1), self.config.mask_token_id, device=cache.k.device)
        block[0, 0] = anchor
        return block

    # ---------------- the drafter interface (above): what the decoders ask ----------------

    def slot_hidden(self, cache, anchor, n_draft):
        """One pass over [anchor, MASK x n_draft] -> the draft slots' final hidden states (n_draft, D)."""
        return self.block_hidden(cache, self.mask_block(cache, anchor, n_draft))[0, 1:]

    def slot_logits(self, cache, anchor, n_draft):
        """One pass over [anchor, MASK x n_draft] -> the draft slots' logits (n_draft, V)."""
        return self.block_logits(cache, self.mask_block(cache, anchor, n_draft))[0, 1:]

    def pick(self, hidden, logits, anchor, choose):
        """The drafts from the slots' hidden states (..., n, D) and logits (..., n, V): each slot's own
        choice, choose(logits) (a DFlash 1 slot does not see the others' drafts)."""
        return choose(logits)

    def mark(self, cache):
        return cache.length, list(cache.pending)

    def rewind(self, cache, mark):
        cache.length, cache.pending[:] = mark[0], mark[1]

    # ---------------- training: K blocks per sequence in one forward ----------------

    def forward(self, features, input_ids, anchors):
        """features (N, S, F), input_ids (N, S), anchors (N, K) with anchors <= S-B -> logits (N, K, B, V)."""
        return self.target.lm_head(self.hidden(features, input_ids, anchors))

    def hidden(self, features, input_ids, anchors):
        """The training forward up to the final norm: hidden states (N, K, B, D) of every block slot."""
        N, S, _ = features.shape
        K, B = anchors.size(1), self.config.block_size
        context = self.context_kv(features, torch.arange(S, device=features.device))   # every position
        x, cos, sin = self.training_blocks(input_ids, anchors)                  # (N, K*B, D), (N, 1, K*B, hd)
        mask = training_mask(anchors, S, B).unsqueeze(1)                        # (N, 1, K*B, S+K*B)
        return self.block_pass(x, cos, sin, context, mask).view(N, K, B, -1)    # (N, K*B, D) -> (N, K, B, D)

    def training_blocks(self, input_ids, anchors):
        """The K blocks [x_a, MASK, ..., MASK] of every sequence, embedded: (N, K*B, D), and their RoPE."""
        N, K, B = *anchors.shape, self.config.block_size
        block = torch.full((N, K, B), self.config.mask_token_id, device=input_ids.device)
        block[:, :, 0] = torch.gather(input_ids, 1, anchors)
        x = self.target.embed_tokens(block).view(N, K * B, -1)                   # (N, K, B, D) -> (N, K*B, D)
        block_pos = (anchors[:, :, None] + torch.arange(B, device=anchors.device)).view(N, K * B)
        return (x, *self.rope_at(block_pos, x.dtype))                              # cos, sin: (N, 1, K*B, hd)

    def loss(self, features, input_ids, anchors, weights, soft=None, soft_weight=0.0):
        """Decay-weighted cross-entropy of slots 1..B-1 against x_{a+k}; weights (B,) with weights[0] = 0.

        `soft` (optional): the target's next-token distributions (loss.soft_targets: probs, ids, each
        (N, S, m), row j for the token at j+1); then the loss is (1 - soft_weight) * that cross-entropy
        + soft_weight * the cross-entropy against the target's distribution (loss.mix_soft).
        Returns (loss, out): out["logits"] (N, K, B, V), out["labels"] (N, K, B) = x_{a+k}, out["pred"]
        (N, K, B) the tokens the drafter would draft given the true tokens before them (here the argmax)."""
        logits = self(features, input_ids, anchors)                               # (N, K, B, V)
        labels = block_labels(input_ids, anchors, self.config.block_size)
        ce = weighted_cross_entropy(logits, labels, weights)
        loss = mix_soft(ce, logits, soft, anchors, weights, soft_weight)
        return loss, dict(logits=logits, labels=labels, pred=logits.argmax(-1), loss=loss.detach())

