"""Tiny seeded models the checks (and the test suite) run on: no trained run needed, a check takes seconds.

They are built to make mistakes visible: float64 everywhere, so batched and one-token forwards agree to
~1e-15 and an argmax cannot flip by accident; a target with peaked distributions over 4 tokens, small enough
to enumerate every sampled output; drafters that are right only on part of a block; and a DFlash 2 drafter
whose selector and convolutions are moved away from their start (a fresh selector adds zero to the drafter's
logits, so a walk that ignored the predecessor would still draw the right tokens).
"""


import torch

from ..dflash2 import DFlash2Config, DFlash2Drafter
from ..drafter import Drafter, DrafterConfig, DrafterInterface
from ..gpt import GPT, GPTConfig
from ..speculative import generate
from ..tools.prompt_lookup import TokenContext

VOCAB = 64              # the default tiny vocabulary; its last id is the drafter's mask token
MASK_ID = VOCAB - 1
SMALL_VOCAB = 4         # the enumerable vocabulary: 4 tokens, 4 new tokens -> 256 outputs


def tiny_target(seed=0, vocab=VOCAB, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, head_scale=1.0,
                max_seq_len=128):
    """A random GPT; head_scale > 1 makes its distributions peaked instead of nearly uniform."""
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd,
                    mlp_hidden=2 * n_embd, max_seq_len=max_seq_len)
    target = GPT(cfg).double().eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(head_scale)
    return target


def tiny_drafter(target, seed=1, block_size=16, n_layer=1, mask_id=None):
    """A random DFlash (1) drafter for `target`."""
    torch.manual_seed(seed)
    mask_id = target.config.vocab_size - 1 if mask_id is None else mask_id
    cfg = DrafterConfig.for_target(target.config, mask_id, n_layer=n_layer, block_size=block_size,
                                   n_target_layers=min(2, target.config.n_layer))
    return Drafter(cfg, target).double().eval()


def tiny_dflash2(target, seed=1, block_size=16, n_layer=1, top_k=8, rank=8, group=8, perturb=0.0):
    """A random DFlash 2 drafter; perturb > 0 moves the convolutions and the selector away from their
    identity start (at the start its tokens equal a DFlash drafter's with the same seed)."""
    torch.manual_seed(seed)
    cfg = DFlash2Config.for_target(target.config, target.config.vocab_size - 1, n_layer=n_layer,
                                   block_size=block_size, n_target_layers=min(2, target.config.n_layer),
                                   selector_top_k=top_k, selector_rank=rank, conv_group_size=group)
    d = DFlash2Drafter(cfg, target).double().eval()
    if perturb:
        with torch.no_grad():
            for name, p in d.named_parameters():
                if "conv" in name or "selector" in name:
                    p.add_(perturb * torch.randn_like(p))
    return d


def soft_pair(vocab=SMALL_VOCAB):
    """A one-layer target over `vocab` tokens with peaked distributions and a block-4 drafter softer than it
    (q != p, so sampled drafts get rejected): small enough to enumerate every sampled continuation."""
    target = small_target(vocab)
    drafter = tiny_drafter(target, seed=12, block_size=4, n_layer=1)
    with torch.no_grad():
        drafter.norm.weight.mul_(0.3)
    return target, drafter


def small_target(vocab=SMALL_VOCAB):
    """soft_pair's target: one layer, `vocab` tokens, peaked distributions."""
    return tiny_target(seed=11, vocab=vocab, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=60.0)


def small_drafters(target):
    """A DFlash and a DFlash 2 drafter of block size 4 for small_target (the DFlash 2 one with its selector
    and convolutions moved away from their start)."""
    return {"dflash": tiny_drafter(target, seed=12, block_size=4, n_layer=1),
            "dflash2": tiny_dflash2(target, seed=12, block_size=4, top_k=4, rank=4, group=8, perturb=0.5)}


def greedy_continuation(target, context, n, runs=None, lookahead=64):
    """`generate(target, context, n)`, served from an earlier, longer greedy run of `target` in `runs` (a list
    the caller keeps; each new run is added to it) when `context` lies on it.

    An oracle drafter drafts the target's own continuation at every step of a lossless decode, so each
    context extends the last one along the same greedy path: one run `lookahead` tokens long serves many
    steps, where a fresh `generate` per step would re-read the whole context each time."""
    if n == 0:
        return []
    runs = [] if runs is None else runs
    run = next((r for r in runs if len(r) >= len(context) + n and r[:len(context)] == context), None)
    if run is None:
        extra = max(0, min(lookahead, target.config.max_seq_len - len(context) - n))
        run = list(context) + generate(target, context, n + extra)
        runs.append(run)
    return run[len(context):len(context) + n]


class OracleDrafter(TokenContext):
    """A drafter double that drafts the target's own greedy continuation, then (optionally) breaks it.

    `n_right(rng, n)` says how many leading drafts of a block are correct (default: all of them); the rest
    are replaced by a wrong token. It sees token ids, never features: the decoding loop must not care.
    """

    block_size = None           # set per drafter
    target_layer_ids = (0,)     # the loop hands every drafter features; an oracle ignores them

    def __init__(self, target, block_size, n_right=None, seed=0):
        self.target, self.n_right, self.block_size = target, n_right, block_size
        self.rng = torch.Generator().manual_seed(seed)
        self.calls = 0
        self.greedy_runs = []                    # the target's greedy runs so far (greedy_continuation)

    def draft(self, cache, anchor, n_draft, choose):
        self.calls += 1
        if n_draft == 0:
            return choose(torch.zeros(0, self.target.config.vocab_size, dtype=torch.float64))
        right = greedy_continuation(self.target, cache + [anchor], n_draft, self.greedy_runs)
        k = n_draft if self.n_right is None else self.n_right(self.rng, n_draft)
        tokens = right[:k] + [(t + 1) % self.target.config.vocab_size for t in right[k:]]
        vocab = self.target.config.vocab_size
        logits = torch.nn.functional.one_hot(torch.tensor(tokens), vocab).double() * 30.0
        return choose(logits)


class OracleTreeDrafter(OracleDrafter):
    """A DFlash-1-style double for trees: slot j's logits put the target's true greedy token on top for the
    first n_right(rng, n) slots, and after those a wrong token on top with the true one pushed out of the
    top-K (trees read them through slot_logits)."""

    draft = DrafterInterface.draft                       # choose(slot_logits), not the oracle's one-hots

    def slot_logits(self, cache, anchor, n):
        vocab = self.target.config.vocab_size
        right = greedy_continuation(self.target, cache + [anchor], n, self.greedy_runs)
        k = n if self.n_right is None else self.n_right(self.rng, n)
        logits = torch.zeros(n, vocab, dtype=torch.float64)
        for j in range(n):
            if j < k:
                logits[j, right[j]] = 5.0
            else:
                logits[j, (right[j] + 1) % vocab] = 5.0
                logits[j, right[j]] = -50.0
        return logits


def random_prefix(rng, n):
    """An oracle's n_right: a uniformly random number of correct drafts, 0..n."""
    return int(torch.randint(0, n + 1, (1,), generator=rng))
