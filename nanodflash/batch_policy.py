"""The block size of a batched speculative step (block_size="auto" in batch.py): block_policy's rule, with the
measured cost of a (rows x tokens) forward in place of batch 1's constants from 2 rows up (one row keeps batch
1's, so a batch of one prompt decodes as speculative_generate does). As the batch grows, a forward stops being
bound by reading the weights, every rejected draft is paid for, and the block that pays shrinks
(docs/batching.md)."""

from .block_policy import AdaptiveBlockSize

# The cost model of block_size="auto": one forward, in units of a (1 row, 1 token) target forward, linear in
# between. Measured by `python -m nanodflash.tools.bench_batch --costs_only` (CPU, 1 thread, context 64,
# median of 30 calls) on a 24 x 128 target with a 2-layer dflash2 drafter, deeper than the default run's
# 12 x 128 target; the command, machine and noise: docs/batching.md and docs/log.md.
COST_TOKENS = (1, 4, 8, 16)                     # tokens per row of the measured forwards
TARGET_COST = {1: (1.00, 1.24, 1.41, 1.33),    # target forward of R rows x t tokens (ragged mask), by R
               4: (1.26, 1.45, 1.66, 2.21),
               8: (1.43, 1.76, 2.22, 3.59),
               16: (1.75, 2.41, 3.18, 5.23),
               32: (2.19, 3.65, 5.43, 9.33)}
DRAFT_COST = {1: (0.04, 0.26, 0.39, 0.27),     # drafter pass of R rows x t slots + projecting t new positions
              4: (0.04, 0.27, 0.33, 0.42),     # per row (t = 1: the projection only)
              8: (0.05, 0.31, 0.58, 0.83),
              16: (0.05, 0.44, 0.55, 0.91),
              32: (0.05, 0.56, 0.86, 1.63)}


def _line(xs, ys, x):
    """Piecewise-linear y(x) through the points (xs, ys), the end segments extended past the ends."""
    i = max(1, min(len(xs) - 1, sum(xi < x for xi in xs)))
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def _interp(table, rows, t):
    """A cost table at `rows` rows x t tokens: linear in t for every measured row count,
    then linear in rows."""
    counts = sorted(table)
    return _line(counts, [_line(COST_TOKENS, table[r], t) for r in counts], rows)


def step_cost(rows, t):
    """A speculative step of `rows` rows with blocks of t tokens (t = 1: no drafts),
    in (1 row, 1 token) forwards."""
    return _interp(TARGET_COST, rows, t) + (_interp(DRAFT_COST, rows, t) if t > 1 else 0.0)


class BatchBlockSize(AdaptiveBlockSize):
    """block_policy's rule with a batch's costs: draft n tokens per row when E(n) tokens per row for a step of
    cost step_cost(rows, n + 1) beat one token per row for a plain batched step; the slot rates count every
    row."""

    def __init__(self, max_block_size):
        super().__init__(max_block_size)
        self.costs = {}                                     # rows -> [cost of n drafts for n in 0..B-1]

    def next_for(self, rows):
        if rows not in self.costs:
            # cost of n drafts, in plain batched steps of these rows; one row: batch 1's own model, so one
            # prompt gets the blocks speculative_generate's "auto" picks
            self.costs[rows] = [1.0] + [
                AdaptiveBlockSize.cost(self, n) if rows == 1 else step_cost(rows, n + 1) / step_cost(rows, 1)
                for n in range(1, self.max_block_size)]
        self.rows = rows
        return self.next()

    def cost(self, n):
        return self.costs[self.rows][n]
