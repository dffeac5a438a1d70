"""The batched decoder's steps and starts, timed as the bench runs them (calibrate.py keeps what they give in
costs.json): every row count and block size in one interleaved loop, each step inside a generation of the
run's text, where the rows grow apart and a step attends as wide as its longest row."""

import torch

from ..ext.batch import SpecBatch
from ..ext.plain_batch import PlainBatch
from .step_timing import COST_TOKENS, N_CALLS, PROMPT_LEN, SAMPLED, interpolated, median_seconds, token_ids

BATCH_NEW_TOKENS = 96             # a timed batch's generations' tokens: the bench's (and its widths)

BATCH_SHARE = 0.6                 # the batched steps' timed calls, as a share of a batch-1 step's: each is
                                  # a step of a real generation, up to tens of batch-1 steps' cost, and they
                                  # take most of the calibration's time (docs/log.md)


def batch_calls(n_calls):
    """The timed calls of each batched step for n_calls of a batch-1 step (3 at least).

    >>> batch_calls(25), batch_calls(3)
    (15, 3)
    """
    return max(3, round(n_calls * BATCH_SHARE))


def batch_prompts(target, rows, text=None):
    """`rows` prompts of PROMPT_LEN tokens for a timed batch: consecutive pieces of the run's text (the drafts
    the rows keep are then the decoders'), else ids spread over the vocabulary."""
    ids = token_ids(target, rows * PROMPT_LEN, text)
    return [ids[r * PROMPT_LEN: (r + 1) * PROMPT_LEN] for r in range(rows)]


def batch_sampling(sampled):
    """A timed batch's sampling arguments: SAMPLED's temperature and top-p with a seeded generator if
    sampled, else greedy."""
    return dict(temperature=SAMPLED[0] if sampled else 0.0, top_p=SAMPLED[1] if sampled else None,
                generator=torch.Generator().manual_seed(0))


class BatchSteps:
    """The steps of batched generations, one step per call, as the loop runs them (drop_finished, then the
    step): the rows grow apart as they keep different numbers of drafts, and a step attends as wide as the
    longest row, as the decoders' steps do. Every timed step has all its rows: calls come in pairs
    (median_seconds with warm: an untimed call, then the timed one), and the first of a pair starts a new
    generation (construction and prefill) where the running one could lose a row within the pair; any call
    does where it could lose one in this step (calls out of pairs: that call then pays for the start).
    new_batch() -> a PlainBatch (t = 1: its plain_step) or a SpecBatch at block size t (its step). timed:
    the timed calls to come, each after its untimed one (plain steps emit one token a call, so a plain
    generation first takes untimed steps that put the pairs' steps in its middle, at the context of the
    bench's average plain step; from its start, they would attend to shorter contexts than the bench's).

    >>> class Batch:        # each step emits t tokens per row, 10 to generate: a new batch after 4 steps
    ...     def __init__(self): self.max_new, self.rows, self.outs = 10, [0], [[0]]
    ...     def prefill(self): pass
    ...     def drop_finished(self): pass
    ...     def step(self): self.outs[0] += [0, 0]
    >>> starts = []
    >>> steps = BatchSteps(lambda: starts.append(1) or Batch(), 2)
    >>> for _ in range(8):
    ...     steps()
    >>> len(starts)         # at calls 1 and 5: the first of a pair, with 4 <= 2 * 2 tokens left
    2
    >>> class Plain(Batch):
    ...     def plain_step(self): self.outs[0] += [0]
    >>> plain = BatchSteps(Plain, 1, timed=2)
    >>> plain(); len(plain.batch.outs[0])     # (9 left - 4 calls) // 2 = 2 untimed steps, then this one
    4
    """

    def __init__(self, new_batch, t, timed=0):
        self.new_batch, self.t, self.calls, self.batch, self.total = new_batch, t, 0, None, 2 * timed

    def tokens_left(self):
        """The fewest tokens any row has left to generate (inf before the first generation)."""
        b = self.batch
        return min(b.max_new - len(b.outs[r]) for r in b.rows) if b is not None else float("inf")

    def advance(self):
        """One step of the running generation, as the loop runs it: drop_finished, then the step."""
        self.batch.drop_finished()
        if self.t == 1:
            self.batch.plain_step()
        else:
            self.batch.step()

    def __call__(self):
        reach = 2 * self.t if self.calls % 2 == 0 else self.t          # this pair's steps, or this step
        if self.batch is None or self.tokens_left() <= reach:
            self.batch = self.new_batch()
            self.batch.prefill()
            if self.t == 1:                       # to the middle: (tokens left - calls to come) // 2 steps
                for _ in range(max(0, (self.tokens_left() - (self.total - self.calls)) // 2)):
                    self.advance()
        self.calls += 1
        self.advance()


def new_batch_of(target, drafter, rows, t, sampled, text=None):
    """() -> a new batched generation of `rows` prompts of the run's text, BATCH_NEW_TOKENS tokens (fewer
    where the target's window is short): a PlainBatch (t = 1) or a SpecBatch at block size t, sampled as
    batch_sampling says."""
    n = min(BATCH_NEW_TOKENS, target.config.max_seq_len - PROMPT_LEN - drafter.block_size)

    def new_batch():
        prompts, how = batch_prompts(target, rows, text), batch_sampling(sampled)
        if t == 1:
            return PlainBatch(target, prompts, n, **how)
        return SpecBatch(target, drafter, prompts, n, block_size=t, **how)
    return new_batch


def prefill_call(new_batch):
    """A batched generation's start, as a call: its construction (the caches) and its prefill."""
    return lambda: new_batch().prefill()


@torch.no_grad()
def time_batch_tables(target, drafter, rows, n_calls=N_CALLS, text=None):
    """({kind: {rows: [seconds of a step of t tokens per row for t in 1..B]}}, {rows: {plain, speculative}:
    seconds of a generation's start}), kind "greedy" or "sampled", for every row count: at t = 1 a plain
    batched step (PlainBatch.plain_step, what plain batched decoding pays per token), at the other
    COST_TOKENS sizes up to the drafter's block size a batched speculative step (SpecBatch.step: draft t-1
    tokens per row, verify t per row, emit, project into the drafter's context; sampled: drafts drawn from
    q and verified row by row at SAMPLED's temperature and top-p), each inside generations of the run's
    text (BatchSteps), linear in between; a start is a batch's construction and prefill (a SpecBatch's
    projects the prompts into the drafter's context too), greedy (a sampled start differs by one draw).
    Every row count and kind in one interleaved loop: a batch is priced by these seconds at the rows it
    has left, so a slow moment of the machine must weigh on every row count alike, not shift one of them.
    n_calls: the timed calls of a batch-1 step; each batched step and start takes batch_calls of them."""
    B, device = drafter.block_size, next(target.parameters()).device
    sizes, kinds = [t for t in COST_TOKENS if t <= B], ("greedy", "sampled")
    n_calls = batch_calls(n_calls)
    steps = {(kind, R, t): BatchSteps(new_batch_of(target, drafter, R, t, kind == "sampled", text), t,
                                      timed=n_calls)
             for kind in kinds for R in rows for t in sizes}
    starts = {(R, side): prefill_call(new_batch_of(target, drafter, R, t, False, text))
              for R in rows for side, t in (("plain", 1), ("speculative", B))}
    s = median_seconds(steps | starts, device, n_calls, warm=True)
    return ({kind: {str(R): interpolated({t: s[kind, R, t] for t in sizes}, B) for R in rows}
             for kind in kinds},
            {str(R): {side: s[R, side] for side in ("plain", "speculative")} for R in rows})
