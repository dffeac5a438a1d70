"""Adaptive block size: draft as many tokens as pay, judged by the acceptance seen so far (block_size="auto").

Every block slot costs a little more drafter and target work per step, and when the target samples most of a
16-token block is rejected anyway. The rule estimates, for each draft slot k, the probability a_k that the
verifier accepts it given that it accepted the slots before it. A step that drafts n tokens then emits on
average

    E(n) = 1 + a_1 + a_1 a_2 + ... + a_1 a_2 ... a_n  tokens,  and costs  cost(n)

steps without drafts (cost(0) = 1), cost(n) measured on the machine and models that decode (step_costs.py).
For the batch-1 decoder: speculative_generate(..., block_size=auto).
It drafts the n in 1..B-1 that maximises E(n) / cost(n), or nothing at all (a plain step, block size 1) when
even that n does not pay: E(n) / cost(n) <= E(0) / cost(0) = 1.

a_k is counted per slot in this generation (accepted at slot k / steps whose verifier reached slot k), recent
steps weighing more (DECAY), starting from a prior of 0.75 (0.5 when sampling: a sampled draft is kept less
often). Per slot, because acceptance is not one coin per slot: a block whose first drafts were right is more
likely right further on, so one pooled rate would undercount the long blocks. A slot with little evidence
(the ones past the blocks drafted lately) borrows the rate of the slot before it (SHRINK). Plain steps
measure nothing, so during them the counts relax toward the prior and drafting is retried now and then. For
example, with a 1-draft step costing 1.3 steps without drafts and each more slot 2.5% of that
(`linear_costs`), and the same rate in every slot:

    >>> from nanodflash.ext.step_costs import linear_costs
    >>> costs = linear_costs(16, step_cost=1.3, slot_cost=0.025)
    >>> [AdaptiveBlockSize(16, costs, alpha=a).next() for a in (0.3, 0.55, 0.75, 0.9)]  # anchor + n drafts
    [3, 6, 9, 16]

Lossless whatever it picks: the block size of a step depends only on what the run emitted before it, and every
verifier is exact for any number of drafts (each step is a valid speculative step on its own).
"""

from ..speculative import fixed_block_size
from .step_costs import costs_for

DECAY = 0.9         # the weight of a step's counts falls by this factor per later step (~10 steps remembered)
PRIOR_ALPHA, PRIOR_WEIGHT = 0.75, 4.0     # the acceptance assumed before any step, worth 4 slots' evidence
SAMPLED_PRIOR_ALPHA = 0.5   # the same when sampling: the sampling drafter keeps 0.55 of its slots at T=0.7
SHRINK = 2.0        # a slot's rate is its counts plus the previous slot's rate worth this many slots


def expected_tokens(rates):
    """[E(0), E(1), ..., E(n)] for per-slot rates [a_1, ..., a_n]: E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ...
    a_k, the tokens a step with k drafts emits on average (bonus included); each E(k) is E(k-1) plus P(the
    first k drafts are all accepted).

    >>> expected_tokens([0.5, 0.5, 0.5])
    [1.0, 1.5, 1.75, 1.875]
    """
    tokens, survive = [1.0], 1.0
    for a in rates:
        survive *= a
        tokens.append(tokens[-1] + survive)
    return tokens


def prior(sampled):
    """The acceptance `auto` assumes before any step: PRIOR_ALPHA, SAMPLED_PRIOR_ALPHA when sampling."""
    return SAMPLED_PRIOR_ALPHA if sampled else PRIOR_ALPHA


def auto(drafter, sampling, costs=None):
    """The block-size policy `auto` for speculative_generate(block_size=auto): an AdaptiveBlockSize pricing
    drafts by `costs` ([cost(n) for n in 0..B-1]; partial(auto, costs=...) hands a table in), else by the
    drafter's step costs at batch 1 (step_costs.costs_for; a compiled drafter's own table)."""
    sampled = not sampling.greedy
    costs = costs if costs is not None else costs_for(drafter, 1, sampled, drafter.compiled)
    return AdaptiveBlockSize(drafter.block_size, costs, alpha=prior(sampled))


def block_sizes(block_size, max_block_size, costs=None, sampled=False):
    """The block size of every step, as one object: `next()` before a step,
    `update(n_drafts, n_accepted)` after.

    block_size: None = the drafter's own (max_block_size), an int in [1, max_block_size], or "auto" (or
    `auto` itself).
    costs: for "auto", a function that returns [cost(n) for n in 0..B-1] (step_costs.costs_for); sampled:
    whether the run samples (the prior)."""
    if block_size == "auto" or block_size is auto:
        return AdaptiveBlockSize(max_block_size, costs(), alpha=prior(sampled))
    return fixed_block_size(block_size, max_block_size)


def relax_share(relax):
    """The prior's share of a slot's counts after one step without drafts, at `relax` times batch 1's pace
    (at batch 1, 1 - DECAY: the weight a step's own counts get)."""
    return relax * (1 - DECAY)


def best_block(tokens, costs):
    """1 + the number of drafts n maximising tokens[n] / costs[n] (E(n) / cost(n)); 1 (no drafts) when that
    is at most E(0) / cost(0) = 1, the tokens per cost of a step without drafts.

    >>> best_block([1.0, 1.9, 2.7, 3.2], [1.0, 1.4, 1.6, 2.4])       # 1.36, 1.69, 1.33 per step's cost
    3
    """
    best, best_rate = 0, 1.0
    for n in range(1, len(tokens)):
        rate = tokens[n] / costs[n]
        if rate > best_rate:
            best, best_rate = n, rate
    return best + 1


class AdaptiveBlockSize:
    """Block sizes for one generation: `next()` before each step, `update(n_drafts, n_accepted)` after it."""

    def __init__(self, max_block_size, costs, alpha=PRIOR_ALPHA):
        if max_block_size < 2:
            raise ValueError(f"an adaptive block needs a drafter with block_size >= 2, got {max_block_size}")
        self.max_block_size, self.prior = max_block_size, alpha
        self.costs = costs                          # [cost(n) for n in 0..B-1], in steps without drafts
        slots = max_block_size - 1
        # decayed counts per draft slot 1..B-1: accepted there, and reached (the verifier looked at it)
        self.accepted = [alpha * PRIOR_WEIGHT] * slots
        self.reached = [PRIOR_WEIGHT] * slots

    def rates(self):
        """[a_1, ..., a_{B-1}]: each slot's acceptance given the slots before it were accepted. Slot 1 is
        reached by every drafting step: its counts alone; a later slot's counts plus SHRINK slots at the
        previous slot's rate."""
        rates = [self.accepted[0] / self.reached[0]]
        for accepted, reached in zip(self.accepted[1:], self.reached[1:]):
            rates.append((accepted + SHRINK * rates[-1]) / (reached + SHRINK))
        return rates

    def expected_tokens_by_drafts(self):
        """[E(0), E(1), ..., E(B-1)] at this generation's rates (expected_tokens)."""
        return expected_tokens(self.rates())

    def most_tokens_relaxing(self):
        """[E(0), ..., E(B-1)] at rates no relaxing of the counts toward the prior can exceed: a slot's rate
        averages its counts' ratio (accepted / reached, which relaxing moves straight toward the prior's
        alpha) with the previous slot's rate, so it stays at most the running max of those ratios and
        alpha."""
        rates, most = [], self.prior
        for accepted, reached in zip(self.accepted, self.reached):
            most = max(most, accepted / reached)
            rates.append(most)
        return expected_tokens(rates)

    def expected_tokens(self, n):
        """E(n): tokens emitted on average by a step with n drafts (bonus included)."""
        return self.expected_tokens_by_drafts()[n]

    def next(self):
        """The next step's block size (best_block at this generation's rates and costs)."""
        return best_block(self.expected_tokens_by_drafts(), self.costs)

    def update(self, n_drafts, n_accepted, relax=1.0):
        """Count one step's slots: every count decays once, then the verifier's reached slots (the accepted
        drafts and the first rejected one) and accepted ones are added. A step without drafts measured
        nothing: the counts relax toward the prior instead, at `relax` times batch 1's pace (batch_policy.py
        waits longer before a retry)."""
        if n_drafts == 0:
            self.relax(relax_share(relax))
            return
        for k in range(len(self.reached)):                      # slot k + 1
            self.accepted[k] *= DECAY
            self.reached[k] *= DECAY
        for k in range(min(n_accepted + 1, n_drafts)):
            self.reached[k] += 1
            self.accepted[k] += k < n_accepted

    def relax(self, fresh):
        """Move every slot's counts toward the prior's: the prior's counts take this share of them. Several
        steps without drafts compose into one call: 1 - fresh is the product of their 1 - fresh."""
        for k in range(len(self.reached)):
            self.accepted[k] = (1 - fresh) * self.accepted[k] + fresh * self.prior * PRIOR_WEIGHT
            self.reached[k] = (1 - fresh) * self.reached[k] + fresh * PRIOR_WEIGHT
