"""Batched decoding: many prompts at once, one target pass per step for the whole batch.

    outs = generate_batch(target, prompts, max_new_tokens, temperature=0.0, ...)
    outs, stats = speculative_generate_batch(target, drafter, prompts, max_new_tokens, block_size=None, ...)

Every row is exactly what batch 1 gives for that prompt alone (speculative.py): token-identical when greedy,
the target's distribution when sampling (each row is verified with batch 1's rules, verify.py). The math is
batch 1's too: the drafter's context projection and block pass (drafter.py), DFlash 2's walk (dflash2.py) and
the greedy rule (verify.py) take the batch as a leading dimension. What lives here is only the batching.

The layout is RAGGED: each row keeps its own length, its keys contiguous from column 0 of its cache row, and
a step writes row r's new keys at columns len_r.. (a scatter), at RoPE positions len_r.., with a mask that
hides the columns a row has not filled. We chose this over right-aligning the rows behind padding because
rows accept different numbers of drafts every step: right-alignment would shift every row's whole cache
each step (or let the padding grow by the rejected drafts), while per-row lengths make rejecting a draft as
cheap as at batch 1 (a row's length simply does not move past it). The cache is ragged_cache.py; the rows,
their prefill and plain steps are plain_batch.py's. A row that is done (stop token or max_new_tokens) leaves
the batch at the next step, so it costs nothing from then on.
"""

from dataclasses import dataclass, field
from functools import partial

import torch

from ..speculative import SpecStats, draft_rule, step_tokens, verify_block
from ..verify import greedy_verify
from .batch_policy import BatchBlockSize
from .block_policy import block_sizes, prior
from .drafter_rows import new_rows
from .plain_batch import PlainBatch, generate_batch
from .step_costs import costs_for
from .timing import TimedStats

# generate_batch (plain batched decoding) lives in plain_batch.py; it is importable from here too
__all__ = ["BatchStats", "SpecBatch", "batch_costs", "generate_batch", "speculative_generate_batch"]


@dataclass
class BatchStats(TimedStats):
    """The batch's steps (block_sizes: each step's block; a row may use fewer slots), forwards, times and
    caches, plus `rows`: one SpecStats per prompt (its own acceptance lengths and τ), and the batch's size
    per step."""
    rows: list = field(default_factory=list)
    batch_rows: list = field(default_factory=list)

    @property
    def taus(self):
        return [s.tau for s in self.rows]

    @property
    def tau(self):
        """Mean acceptance length over every row's steps."""
        lengths = [a for s in self.rows for a in s.acceptance_lengths]
        return sum(lengths) / len(lengths) if lengths else 0.0


class SpecBatch(PlainBatch):
    """A batched DFlash generation: `prefill()`, then `step()` while `drop_finished()` says rows are left."""

    def __init__(self, target, drafter, prompts, max_new_tokens, block_size=None, temperature=0.0,
                 top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None):
        B = drafter.block_size
        super().__init__(target, prompts, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                         stop_token_ids=stop_token_ids, generator=generator,
                         layer_ids=drafter.target_layer_ids, slack=B)
        self.auto = block_size == "auto"          # fixed sizes are checked as at batch 1 (block_policy.py)
        costs_at = partial(batch_costs, drafter, sampled=temperature > 0)   # rows -> costs
        self.sizer = BatchBlockSize(B, costs_at, prior(temperature > 0)) if self.auto else \
            block_sizes(block_size, B)
        self.choose = draft_rule(verifier, temperature, generator)            # argmax, or samples of q
        self.drafter, self.verifier, self.temperature = drafter, verifier, temperature
        self.context = new_rows(drafter, len(prompts), self.max_len)   # the drafter's context, row by row
        self.stats = BatchStats(rows=[SpecStats() for _ in prompts], target_cache=self.cache,
                                draft_cache=self.context)

    def keep(self, index):
        self.cache.keep(index)
        self.context.keep(index)

    def prefill(self):
        with self.stats.timer("prefill_time"):
            self.context.extend(*super().prefill())

    def verify(self, drafted, drafts, qs, logits, sizes):
        """(n_accepted, bonus) per row from the target's logits (R, T, V) of [anchor, drafts...]; drafted:
        (R, T-1) every row's drafts, -1 past them."""
        if self.temperature == 0:                                   # greedy: every row at once
            n_acc, bonus = greedy_verify(drafted.to(logits.device), logits)          # (R,) each
            return list(zip(n_acc.tolist(), bonus.tolist()))
        logits = logits.cpu()
        return [verify_block(self.verifier, drafts[r], qs[r], logits[r, :n], self.sampling, self.generator)
                for r, n in enumerate(sizes)]

    def block_size(self, left):
        """This step's block size T, the same for every row (row r uses min(T, left[r] + 1) of it)."""
        chosen = self.sizer.next_for(self.rows) if self.auto else self.sizer.next()
        return min(chosen, max(left) + 1, self.window - self.cache.length)

    def step(self):
        """One speculative step for every row: draft, verify in one target pass, keep each row's agreed
        prefix. A step of block size 1 is a plain step."""
        R, st = len(self.rows), self.stats
        left = [self.max_new - len(self.outs[r]) for r in self.rows]
        T = self.block_size(left)
        if T == 1:                  # no drafts: a plain step, its position handed to the drafter's context
            with st.timer("verify_time"):
                tokens, feats = self.plain_step()
            with st.timer("draft_time"):             # (a DFlash drafter queues it until its next draft)
                self.context.extend(feats, tokens.cpu(), [1] * R, lazy=True)
            self.count(T, [(1, 1, 0)] * R, [(0, 0)] * R)
            return
        sizes = [min(T, n + 1) for n in left]                      # drafts may reach the row's limit
        with st.timer("draft_time"):
            anchors = self.anchors()                                                 # (R,)
            drafts, qs = self.context.draft(anchors, T, sizes, self.choose)
        drafted = torch.full((R, T - 1), -1)        # (R, T-1): each row's drafts; -1 (no token) past them
        for r, dr in enumerate(drafts):
            if dr.numel():                 # a copy per row costs a few tensor operations even when empty
                drafted[r, : dr.numel()] = dr
        block = torch.cat([anchors.cpu()[:, None], drafted.clamp(min=0)], 1)     # (R, T): anchor, drafts, 0s
        with st.timer("verify_time"):
            logits, feats = self.forward(block.to(self.device))                      # verify every block
            results = self.verify(drafted, drafts, qs, logits, sizes)
        new = [step_tokens(dr[:n_acc].tolist(), bonus, n, self.stops)
               for dr, (n_acc, bonus), n in zip(drafts, results, left)]
        counts = [len(t) for t in new]           # the anchor and every new token but the last stay cached ...
        self.cache.advance(counts)
        with st.timer("draft_time"):             # ... and become drafter context
            self.context.extend(feats, block, counts)
        self.emit(new)
        self.count(T, [(n, len(t), min(a, len(t))) for n, t, (a, _) in zip(sizes, new, results)],
                   [(n - 1, min(a, n - 1)) for n, (a, _) in zip(sizes, results)])

    def count(self, T, records, slots):
        """The step's statistics: per row (records[i]: its block, tokens emitted, drafts kept) and for the
        batch; for auto, each row's drafts and accepted drafts (slots[i])."""
        for r, record in zip(self.rows, records):
            self.stats.rows[r].record(*record)
        if self.auto:
            self.sizer.update(self.rows, slots)
        self.stats.batch_rows.append(len(self.rows))
        self.stats.block_sizes.append(T)
        self.stats.target_forwards += 1

    def run(self):
        self.prefill()
        while self.drop_finished():
            self.step()
        return self.outs, self.stats


@torch.no_grad()
def speculative_generate_batch(target, drafter, prompts, max_new_tokens, block_size=None, temperature=0.0,
                               top_k=None, top_p=None, verifier="rejection", stop_token_ids=None,
                               generator=None):
    """Batched DFlash (or DFlash 2): one drafter pass and one target pass per step for the whole batch.
    Returns (one token list per prompt, BatchStats with per-row acceptance lengths and τ)."""
    return SpecBatch(target, drafter, prompts, max_new_tokens, block_size=block_size, temperature=temperature,
                     top_k=top_k, top_p=top_p, verifier=verifier, stop_token_ids=stop_token_ids,
                     generator=generator).run()


def batch_costs(drafter, rows, sampled=False):
    """[cost(n) for n in 0..B-1] of a step of `rows` rows (step_costs.py), sampled or greedy: batch 1's table
    for one row."""
    return costs_for(drafter, rows, sampled)
