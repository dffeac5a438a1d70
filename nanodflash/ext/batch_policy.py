"""The block size of a batched speculative step (block_size="auto" in batch.py): block_policy's rule with the
costs of a step of the batch's rows, judged by the row that accepts least.

Two things change when rows share a step. Costs: as the batch grows, a forward stops being bound by reading
the weights, every rejected draft is paid for, and the block that pays shrinks (docs/batching.md). And the
end: a batch runs until its last row is done, and while a forward is mostly fixed cost, a step of the few rows
left costs nearly what a full one does. So the batch finishes when the row that accepts least does, and
drafting pays only if it pays for that row. Each row keeps its own acceptance counts (block_policy's
AdaptiveBlockSize, one per row), and the step drafts the n maximising min over rows of E_r(n) / cost(rows, n).
Before any row has shown what it accepts, that least row is expected to be the least of R draws from the
prior (least_of): the more rows, the lower it sits. Rows start there and relax back there during plain
steps, so a batch whose costs would not pay even at that prior takes plain steps to its end.

The costs are measured on the decoding models (step_costs.py) at the COST_ROWS row counts, linear in rows in
between; one row takes batch 1's own table, so a batch of one prompt decodes as speculative_generate does.
"""

import torch

from .block_policy import PRIOR_ALPHA, PRIOR_WEIGHT, AdaptiveBlockSize, best_block, relax_share

COST_ROWS = (1, 2, 4, 8, 16, 32)    # row counts whose step costs are measured; past the last, the last's


def costs_for_rows(rows, costs_at):
    """[cost(n) for n in 0..B-1] at `rows` rows: costs_at(rows) where rows is measured, else linear between
    the measured row counts around it (costs_at(r): the table at a measured r).

    >>> tables = {2: [1.0, 1.5], 4: [1.0, 2.5]}
    >>> costs_for_rows(3, tables.get)
    [1.0, 2.0]
    """
    below = max(r for r in COST_ROWS if r <= rows)
    above = min((r for r in COST_ROWS if r >= rows), default=below)
    if below == above:
        return costs_at(below)
    w = (rows - below) / (above - below)
    return [lo + w * (hi - lo) for lo, hi in zip(costs_at(below), costs_at(above))]


def least_of(rows, alpha, weight=PRIOR_WEIGHT, points=10_000):
    """The expected acceptance of the least of `rows` rows, each drawn from the prior: a Beta distribution of
    mean alpha worth `weight` slots of evidence (the counts AdaptiveBlockSize starts from). E[min] is the
    integral of P(all rows > x) = (1 - F(x))^rows over [0, 1], F the prior's CDF (a sum over small cells).

    >>> least_of(1, 0.75), round(least_of(2, 0.75), 2), round(least_of(32, 0.75), 2)
    (0.75, 0.64, 0.28)
    """
    if rows == 1:
        return alpha
    x = (torch.arange(points, dtype=torch.float64) + 0.5) / points          # the cells' midpoints
    density = x ** (alpha * weight - 1) * (1 - x) ** ((1 - alpha) * weight - 1)
    cdf = density.cumsum(0) / density.sum()
    return float(((1 - cdf) ** rows).mean())


class BatchBlockSize:
    """Block sizes for one batched generation: `next_for(rows)` before a step, `update(rows, pairs)` after it,
    rows being the ids of the rows in the step (batch.py: their prompts' indices). costs_at(R) gives the
    measured table at one of COST_ROWS; alpha: the acceptance assumed of one row before its first step
    (block_policy.prior); rows: how many rows the batch starts with (each row starts from least_of(rows,
    alpha)).

    >>> sizer = BatchBlockSize(4, {1: [1.0, 1.4, 1.6, 1.8], 2: [1.0, 1.4, 1.6, 1.8]}.get)
    >>> sizer.next_for([0, 1])                          # the prior: 75% of drafts accepted, 3 drafts pay
    4
    >>> for _ in range(20):
    ...     sizer.update([0, 1], [(3, 3), (3, 0)])      # row 0 keeps every draft, row 1 none
    >>> sizer.next_for([0, 1]), sizer.next_for([0])     # with row 1: no drafts; row 0 alone: 3
    (1, 4)
    """

    def __init__(self, max_block_size, costs_at, alpha=PRIOR_ALPHA, rows=1):
        self.max_block_size, self.costs_at = max_block_size, costs_at
        self.alpha = least_of(rows, alpha)                  # where each row's counts start, and relax to
        self.by_rows = {}                # row count -> [cost(n) for n in 0..B-1]
        self.counts = {}                 # row id -> its acceptance counts (an AdaptiveBlockSize)
        self.least = None                # the row with the fewest expected tokens at the last full look
        self.unapplied = {}              # row id -> share of its counts kept by relaxations not yet applied

    def row(self, r):
        """Row r's counts, with the relaxations of the steps without drafts since it was last read."""
        if r not in self.counts:
            self.counts[r] = AdaptiveBlockSize(self.max_block_size, costs=None, alpha=self.alpha)
        if self.unapplied.get(r, 1.0) != 1.0:
            self.counts[r].relax(1 - self.unapplied.pop(r))
        return self.counts[r]

    def costs(self, n_rows):
        if n_rows not in self.by_rows:
            self.by_rows[n_rows] = costs_for_rows(n_rows, self.costs_at)
        return self.by_rows[n_rows]

    def next_for(self, rows):
        """The next step's block size for a batch of these rows: best_block of the least E_r(n) of each n.
        The row that accepted least at the last full look is asked first: when drafting does not pay even for
        it, it pays for no minimum over rows (min_r E_r(n) <= its E(n) at every n): the rest are skipped."""
        costs = self.costs(len(rows))
        if self.least in rows and best_block(self.row(self.least).expected_tokens_by_drafts(), costs) == 1:
            return 1
        by_row = {r: self.row(r).expected_tokens_by_drafts() for r in rows}
        self.least = min(by_row, key=lambda r: by_row[r][-1])        # the fewest tokens from a full block
        return best_block([min(tokens) for tokens in zip(*by_row.values())], costs)

    def update(self, rows, pairs):
        """Count one step: pairs[i] = (drafts, accepted drafts) of row rows[i]. A step without drafts only
        relaxes every row's counts, at 1 / rows of batch 1's pace: noted per row, applied when the row is read
        (next_for mostly reads one row)."""
        if all(n == 0 for n, _ in pairs):
            keep = 1 - relax_share(1 / len(rows))
            for r in rows:
                self.unapplied[r] = self.unapplied.get(r, 1.0) * keep
            return
        for r, (n, a) in zip(rows, pairs):
            self.row(r).update(n, a, relax=1 / len(rows))
