"""Adaptive block size: draft as many tokens as pay, judged by the acceptance seen so far (block_size="auto").

Every block slot costs a little more drafter and target work per step (on the reference CPU about 2.5% of a
1-draft step per slot: `SLOT_COST`), and when the target samples most of a 16-token block is rejected anyway.
The rule models each draft slot as accepted with one probability alpha (given that the slots before it were),
so a step that drafts n tokens emits on average

    E(n) = 1 + alpha + ... + alpha^n  tokens,  and costs  cost(n) = STEP_COST * (1 + SLOT_COST * (n - 1))

plain decoding steps (STEP_COST: a 1-draft step), and it drafts the n in 1..B-1 that maximises E(n) / cost(n), or
nothing at all (a plain step, block size 1) when even that n does not pay: a step without drafts costs PLAIN_COST
(the loop still captures features for the drafter), so drafting pays when E(n) / cost(n) > 1 / PLAIN_COST.
alpha is the acceptance rate measured so far in this generation (accepted drafts / drafts the verifier looked
at), recent steps weighing more (DECAY), starting from a prior of 0.75; plain steps measure nothing, so during
them the estimate relaxes toward the prior and drafting is retried now and then.
For example, with the CPU's costs below:

    >>> [AdaptiveBlockSize(16, alpha=a).next() for a in (0.3, 0.55, 0.75, 0.9)]     # block = anchor + n drafts
    [3, 6, 9, 16]

Lossless whatever it picks: the block size of a step depends only on what the run emitted before it, and every
verifier is exact for any number of drafts (each step is a valid speculative step on its own).
"""

# Costs on the reference CPU (1 thread, the default target); how they are measured: docs/experiments.md
SLOT_COST = 0.025   # one more block slot, as a fraction of a 1-draft step
STEP_COST = 1.3     # a 1-draft DFlash step (drafter pass + a 2-token verify), in plain decoding steps
PLAIN_COST = 1.0    # a step without drafts inside the speculative loop, in plain decoding steps
DECAY = 0.9         # the weight of a step's counts falls by this factor per later step (~10 steps remembered)
PRIOR_ALPHA, PRIOR_WEIGHT = 0.75, 4.0     # the acceptance assumed before any step, worth 4 slots' evidence


def block_sizes(block_size, max_block_size):
    """The block size of every step, as one object: `next()` before a step, `update(n_drafts, n_accepted)` after.

    block_size: None = the drafter's own (max_block_size), an int in [1, max_block_size], or "auto"."""
    if block_size == "auto":
        return AdaptiveBlockSize(max_block_size)
    B = max_block_size if block_size is None else block_size
    if isinstance(B, (str, bool)) or int(B) != B or not 1 <= B <= max_block_size:
        raise ValueError(f"block_size must be \"auto\" or an integer in [1, {max_block_size}] (the drafter was "
                         f"trained with block_size={max_block_size}), got {block_size!r}")
    return FixedBlockSize(int(B))


class FixedBlockSize:
    """The same block size every step."""

    def __init__(self, block_size):
        self.block_size = block_size

    def next(self):
        return self.block_size

    def update(self, n_drafts, n_accepted):
        pass


class AdaptiveBlockSize:
    """Block sizes for one generation: `next()` before each step, `update(n_drafts, n_accepted)` after it."""

    def __init__(self, max_block_size, slot_cost=None, step_cost=None, alpha=PRIOR_ALPHA):
        if max_block_size < 2:
            raise ValueError(f"an adaptive block needs a drafter with block_size >= 2, got {max_block_size}")
        self.max_block_size = max_block_size
        self.slot_cost = SLOT_COST if slot_cost is None else slot_cost      # the module's, as set at call time
        self.step_cost = STEP_COST if step_cost is None else step_cost
        self.accepted, self.reached = alpha * PRIOR_WEIGHT, PRIOR_WEIGHT    # decayed counts of draft slots

    @property
    def alpha(self):
        """The estimated probability that a draft slot the verifier reaches is accepted."""
        return self.accepted / self.reached

    def expected_tokens(self, n):
        """E(n) = 1 + alpha + ... + alpha^n: tokens emitted on average by a step with n drafts (bonus included)."""
        return sum(self.alpha ** i for i in range(n + 1))

    def cost(self, n):
        """A step with n >= 1 drafts, in plain decoding steps."""
        return self.step_cost * (1 + self.slot_cost * (n - 1))

    def next(self):
        """The next step's block size: 1 + the number of drafts n maximising E(n) / cost(n); 1 (no drafts) when
        that is at most 1 / PLAIN_COST, the tokens per cost of a step without drafts."""
        alpha, tokens, best, best_rate = self.alpha, 1.0, 0, 1 / PLAIN_COST
        for n in range(1, self.max_block_size):                 # E(n) = E(n-1) + alpha^n, one pass
            tokens += alpha ** n
            if tokens / self.cost(n) > best_rate:
                best, best_rate = n, tokens / self.cost(n)
        return best + 1

    def update(self, n_drafts, n_accepted):
        """Count a step's slots: the verifier looked at the accepted drafts and at the first rejected one. A step
        without drafts moves the counts toward the prior instead."""
        if n_drafts == 0:
            self.accepted = DECAY * self.accepted + (1 - DECAY) * PRIOR_ALPHA * PRIOR_WEIGHT
            self.reached = DECAY * self.reached + (1 - DECAY) * PRIOR_WEIGHT
            return
        reached = n_drafts if n_accepted >= n_drafts else n_accepted + 1
        self.accepted = DECAY * self.accepted + n_accepted
        self.reached = DECAY * self.reached + reached
