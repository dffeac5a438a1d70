"""The block size of a batched speculative step (block_size="auto" in batch.py): block_policy's rule with the
costs of a step of the batch's rows, judged by the tokens its rows emit on average.

Costs change when rows share a step: as the batch grows, a forward stops being bound by reading the weights,
every rejected draft is paid for by its row, and the block that pays shrinks (docs/batching.md). Each row
keeps its own acceptance counts (block_policy's AdaptiveBlockSize, one per row, each from batch 1's prior),
and the step drafts the n maximising mean over rows of E_r(n) / cost(rows, n): the tokens the batch emits
per second at this step. Rows that finish leave the batch, so a row that accepts little does not hold the
others back for long: once the rows that gained have left, the rows still in the batch decide alone.
During steps without drafts the counts relax toward the prior, and drafting is retried now and then.

The costs are measured on the decoding models (step_costs.py) at the COST_ROWS row counts, linear in rows in
between; one row takes batch 1's own table, so a batch of one prompt decodes as speculative_generate does.
"""

from .block_policy import PRIOR_ALPHA, AdaptiveBlockSize, best_block, relax_share
from .step_costs import COST_ROWS, costs_for_rows

__all__ = ["COST_ROWS", "BatchBlockSize", "costs_for_rows"]

class BatchBlockSize:
    """Block sizes for one batched generation: `next_for(rows)` before a step, `update(rows, pairs)` after it,
    rows being the ids of the rows in the step (batch.py: their prompts' indices). costs_at(R) gives the
    measured table at one of COST_ROWS; alpha: the acceptance assumed of a row before its first step
    (block_policy.prior), where its counts start and relax to.

    >>> costs = [1.0, 1.4, 1.6, 1.8]
    >>> sizer = BatchBlockSize(4, {1: costs, 2: costs, 4: costs}.get)
    >>> sizer.next_for([0, 1, 2, 3])                    # the prior: 75% of drafts kept, 3 drafts pay
    4
    >>> for _ in range(20):
    ...     sizer.update([0, 1, 2, 3], [(3, 3), (3, 0), (3, 0), (3, 0)])    # row 0 keeps all, the rest none
    >>> sizer.next_for([0, 1, 2, 3]), sizer.next_for([0, 1])     # 1.75 tokens a row for 1.8; 2.5 for 1.8
    (1, 4)
    """

    def __init__(self, max_block_size, costs_at, alpha=PRIOR_ALPHA):
        self.max_block_size, self.costs_at, self.alpha = max_block_size, costs_at, alpha
        self.by_rows = {}                # row count -> [cost(n) for n in 0..B-1]
        self.counts = {}                 # row id -> its acceptance counts (an AdaptiveBlockSize)
        self.idle = None                 # [rows, share of their counts kept]: steps that cannot draft

    def row(self, r):
        """Row r's counts (from the prior, the first time it is asked for)."""
        if r not in self.counts:
            self.counts[r] = AdaptiveBlockSize(self.max_block_size, costs=None, alpha=self.alpha)
        return self.counts[r]

    def costs(self, n_rows):
        if n_rows not in self.by_rows:
            self.by_rows[n_rows] = costs_for_rows(n_rows, self.costs_at)
        return self.by_rows[n_rows]

    def next_for(self, rows):
        """The next step's block size for a batch of these rows: best_block of the mean over rows of
        E_r(n), at each n. Where no block pays even at the most each row's E_r(n) can reach while its counts
        relax toward the prior (AdaptiveBlockSize.most_tokens_relaxing), none will while these rows take no
        drafts: the batch stays idle, deciding nothing and putting its relaxing off to one composed call
        (wake), until its rows change. The block sizes are the same as deciding at every step."""
        if self.idle is not None and self.idle[0] == rows:
            return 1
        self.wake()
        costs = self.costs(len(rows))
        most = [self.row(r).most_tokens_relaxing() for r in rows]
        if best_block([sum(tokens) / len(rows) for tokens in zip(*most)], costs) == 1:
            self.idle = [list(rows), 1.0]
            return 1
        by_row = [self.row(r).expected_tokens_by_drafts() for r in rows]
        return best_block([sum(tokens) / len(rows) for tokens in zip(*by_row)], costs)

    def wake(self):
        """Relax the idle rows' counts by every idle step at once (relaxing composes: block_policy.relax)."""
        if self.idle is not None:
            rows, kept = self.idle
            for r in rows:
                self.row(r).relax(1 - kept)
            self.idle = None

    def update(self, rows, pairs):
        """Count one step: pairs[i] = (drafts, accepted drafts) of row rows[i]. A step without drafts only
        relaxes every row's counts toward the prior, at 1 / rows of batch 1's pace (while idle, later)."""
        if self.idle is not None and self.idle[0] == rows:
            self.idle[1] *= 1 - relax_share(1 / len(rows))
            return
        for r, (n, a) in zip(rows, pairs):
            self.row(r).update(n, a, relax=1 / len(rows))
