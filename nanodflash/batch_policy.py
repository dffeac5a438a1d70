"""The block size of a batched speculative step (block_size="auto" in batch.py): block_policy's rule with the
costs of a step of the batch's rows. As the batch grows, a forward stops being bound by reading the weights,
every rejected draft is paid for, and the block that pays shrinks (docs/batching.md).

The costs are measured on the decoding models (step_costs.py) at the COST_ROWS row counts, linear in rows in
between; one row takes batch 1's own table, so a batch of one prompt decodes as speculative_generate does.
"""

from .block_policy import AdaptiveBlockSize

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


class BatchBlockSize(AdaptiveBlockSize):
    """block_policy's rule with a batch's costs: draft n tokens per row when E(n) tokens per row for a step
    of cost(n) beat one token per row for a plain batched step; the slot rates count every row.
    costs_at(rows) gives the measured table at one of COST_ROWS."""

    def __init__(self, max_block_size, costs_at):
        super().__init__(max_block_size, costs=None)
        self.costs_at, self.by_rows = costs_at, {}          # rows -> [cost(n) for n in 0..B-1]

    def next_for(self, rows):
        """The next step's block size for a batch of `rows` rows."""
        if rows not in self.by_rows:
            self.by_rows[rows] = costs_for_rows(rows, self.costs_at)
        self.costs = self.by_rows[rows]
        return self.next()
