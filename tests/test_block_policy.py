"""block_size="auto" (block_policy.py): the block size follows the acceptance seen so far, and stays lossless.

The rule's model (a step with n drafts emits 1 + a_1 + a_1 a_2 + ... tokens on average, a_k the acceptance of
slot k given the slots before it) is checked against simulations, one with streaks of acceptance; its choices
against the obvious direction (more acceptance or cheaper slots -> longer blocks); and the loop with it
against the oracles of the other ladders: greedy output identical to greedy decoding, sampled output exactly
the target's distribution (chi-square against enumeration, as in test_sampling_exact.py), with block sizes
that really changed during the runs.
"""

import pytest
import torch

import nanodflash.ext.block_policy as block_policy
from helpers import OracleDrafter, soft_pair, tiny_drafter
from nanodflash.ext.block_policy import AdaptiveBlockSize, auto
from nanodflash.ext.step_costs import fix_costs, linear_costs
from nanodflash.speculative import generate, speculative_generate
from test_sampling_exact import (
    ALPHA,
    N_OTHER_PATHS,
    V,
    chi_square_p_value,
    exact_distribution,
    speculative_counts,
)
from test_speculative import PROMPTS, random_prefix

COSTS = linear_costs(16, step_cost=1.3, slot_cost=0.025)     # a 1-draft step: 1.3 steps; each more slot: 2.5%


@pytest.mark.parametrize("alpha,n", [(0.3, 1), (0.6, 4), (0.9, 9)])
def test_expected_tokens_per_step_matches_a_simulation_of_the_acceptance_model(alpha, n):
    g = torch.Generator().manual_seed(0)
    accepted = (torch.rand(200_000, n, generator=g) < alpha).long().cumprod(1).sum(1)   # drafts kept per step
    simulated = float((accepted + 1).double().mean())                                   # + the bonus
    model = AdaptiveBlockSize(16, COSTS, alpha=alpha).expected_tokens(n)
    assert abs(simulated - model) < 0.02, \
        f"alpha={alpha}, n={n}: E(n) {model:.3f} but a simulation gives {simulated:.3f}"


def test_a_sampled_run_assumes_fewer_kept_drafts_before_its_first_step():
    # at 0.75 per slot 3 drafts pay (E 2.73 for a cost of 2.2); at 0.5 no n does (1.5 / 1.6, 1.75 / 1.9,
    # 1.875 / 2.2): a sampled run, batched or not, starts with plain steps on this table
    from nanodflash.ext.batch_policy import BatchBlockSize
    costs = [1.0, 1.6, 1.9, 2.2]
    assert block_policy.block_sizes("auto", 4, lambda: costs).next() == 4, "greedy: the prior 0.75 drafts 3"
    assert block_policy.block_sizes("auto", 4, lambda: costs, sampled=True).next() == 1, \
        "sampled: the prior 0.5 should take a plain step"
    assert BatchBlockSize(4, {2: costs}.get, block_policy.prior(True)).next_for([0, 1]) == 1, \
        "a sampled batch starts from the same prior"
    assert BatchBlockSize(4, {2: costs}.get, block_policy.prior(False)).next_for([0, 1]) == 4


def every_step_decision(sizer, rows):
    """What BatchBlockSize.next_for decides without its idle shortcut: the mean over rows of E_r(n)."""
    by_row = [sizer.row(r).expected_tokens_by_drafts() for r in rows]
    return block_policy.best_block([sum(t) / len(rows) for t in zip(*by_row)], sizer.costs(len(rows)))


@pytest.mark.parametrize("seed", range(6))
def test_an_idle_batch_decides_the_block_sizes_deciding_every_step_would(seed):
    from nanodflash.ext.batch_policy import BatchBlockSize
    g = torch.Generator().manual_seed(seed)
    tables = {R: linear_costs(8, step_cost=1.2 + 0.15 * R, slot_cost=0.1) for R in (1, 2, 4, 8)}
    idle, reference = BatchBlockSize(8, tables.get), BatchBlockSize(8, tables.get)
    rows, took_idle = list(range(8)), 0
    for step in range(300):
        if step % 60 == 59:
            rows = rows[1:] or list(range(8, 16))               # a row leaves; a new batch after the last
        got = idle.next_for(rows)
        assert got == every_step_decision(reference, rows), f"step {step}: the idle shortcut decided {got}"
        took_idle += idle.idle is not None
        rates = torch.rand(len(rows), generator=g) ** 0.3       # each row keeps a draft with its own chance
        pairs = [(got - 1, int(sum(torch.rand(got - 1, generator=g).lt(a).cumprod(0)))) for a in rates]
        idle.update(rows, pairs)
        for r, (n, a) in zip(rows, pairs):                       # the reference relaxes at every step
            reference.row(r).update(n, a, relax=1 / len(rows))
    assert took_idle > 30, f"the costs here should leave the batch idle for a while, {took_idle} steps were"


def test_blocks_grow_with_acceptance_and_shrink_as_slots_cost_more():
    by_alpha = [AdaptiveBlockSize(16, COSTS, alpha=a).next() for a in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99)]
    assert by_alpha == sorted(by_alpha) and by_alpha[0] < by_alpha[-1] == 16, \
        f"block sizes by alpha: {by_alpha}"
    by_cost = [AdaptiveBlockSize(16, linear_costs(16, 1.3, c), alpha=0.7).next()
               for c in (0.0, 0.01, 0.03, 0.1, 1.0)]
    assert by_cost == sorted(by_cost, reverse=True) and by_cost[0] == 16 and by_cost[-1] == 2, \
        f"by slot cost: {by_cost}"
    by_step = [AdaptiveBlockSize(16, linear_costs(16, c, 0.025), alpha=0.4).next()
               for c in (1.0, 1.3, 1.6, 3.0)]
    assert by_step[0] > 1 and by_step[-1] == 1, \
        f"drafting must stop when a step costs more than it emits: {by_step}"


def test_the_estimate_counts_the_slots_the_verifier_reached():
    sizer = AdaptiveBlockSize(16, COSTS)
    prior_acc, prior_reached = 0.9 * 0.75 * 4, 0.9 * 4             # the prior's counts after one decay
    # d1, d2 accepted, d3 rejected: 3 slots reached, d4, d5 unseen
    sizer.update(n_drafts=5, n_accepted=2)
    assert sizer.accepted[:4] == pytest.approx([prior_acc + 1, prior_acc + 1, prior_acc, prior_acc]), \
        f"accepted counts of slots 1-4 after 2 accepted drafts: {sizer.accepted[:4]}"
    assert sizer.reached[:4] == pytest.approx([prior_reached + 1] * 3 + [prior_reached]), \
        f"reached counts of slots 1-4 after the verifier looked at 3 slots: {sizer.reached[:4]}"
    for _ in range(40):
        sizer.update(n_drafts=3, n_accepted=3)     # everything accepted: rates -> 1, the whole block
    assert min(sizer.rates()[:3]) > 0.95 and sizer.next() == 16, \
        f"after 40 fully accepted steps: {sizer.rates()}"
    for _ in range(40):
        sizer.update(n_drafts=15, n_accepted=0)    # the first draft always rejected: a_1 -> 0, no drafts
    assert sizer.rates()[0] < 0.05 and sizer.next() == 1, \
        f"after 40 rejected steps: a_1 = {sizer.rates()[0]:.3f}"
    plain_steps = 0
    while sizer.next() == 1 and plain_steps < 100:
        sizer.update(n_drafts=0, n_accepted=0)     # plain steps measure nothing: back toward the prior
        plain_steps += 1
    assert 1 < plain_steps < 50, \
        f"drafting was retried after {plain_steps} plain steps (want a few, not never)"


def test_per_slot_rates_predict_tokens_per_step_when_acceptance_runs_in_streaks(monkeypatch):
    """Acceptance comes in streaks: half the blocks are easy (each draft right with 0.97), half hard (0.3).
    Counted per slot, E(n) matches a simulation of that process; one pooled rate would not."""
    monkeypatch.setattr(block_policy, "DECAY", 1.0)     # remember every step: the estimate converges
    g = torch.Generator().manual_seed(0)
    easy = torch.rand(4000, 1, generator=g) < 0.5
    right = torch.rand(4000, 15, generator=g) < torch.where(easy, 0.97, 0.3)
    accepted = right.long().cumprod(1).sum(1)                       # drafts kept per step with 15 drafts
    sizer = AdaptiveBlockSize(16, COSTS)
    for a in accepted.tolist():
        sizer.update(n_drafts=15, n_accepted=a)
    reached = sum(min(a + 1, 15) for a in accepted.tolist())
    pooled = AdaptiveBlockSize(16, COSTS, alpha=float(accepted.sum()) / reached)   # one rate, every slot
    for n in (2, 8, 15):
        simulated = float((accepted.clamp(max=n) + 1).double().mean())
        assert abs(sizer.expected_tokens(n) - simulated) < 0.05 * simulated, \
            f"n={n}: per-slot E(n) {sizer.expected_tokens(n):.2f}, simulated {simulated:.2f}"
    simulated = float((accepted + 1).double().mean())
    assert abs(pooled.expected_tokens(15) - simulated) > 0.1 * simulated, \
        f"the negative control: one pooled rate should miss a 15-draft step's {simulated:.2f} tokens by > 10%"


@pytest.mark.parametrize("kind", ["untrained", "right_for_a_random_prefix"])
def test_greedy_speculative_with_auto_block_size_equals_greedy_decoding(target, kind):
    drafter = (tiny_drafter(target, block_size=16) if kind == "untrained"
               else OracleDrafter(target, 16, n_right=random_prefix))
    fix_costs(drafter, COSTS)                    # the example costs: the test double cannot be timed
    sizes = set()
    for prompt in PROMPTS:
        out, stats = speculative_generate(target, drafter, prompt, 40, block_size=auto)
        assert out == generate(target, prompt, 40), \
            f"{kind} drafter, block_size='auto': output diverged from greedy"
        assert all(a <= b for a, b in zip(stats.acceptance_lengths, stats.block_sizes)), \
            "a step emitted past its block"
        sizes.update(stats.block_sizes)
    assert len(sizes) > 2, f"{kind}: the block size never adapted (sizes used: {sorted(sizes)})"


@pytest.fixture(scope="module")
def models():
    """test_sampling_exact.py's setting: a target over V tokens and a softer block-4 drafter."""
    return soft_pair(V)


@pytest.mark.parametrize("verifier", ["match", "rejection"])
def test_sampled_output_with_auto_block_size_has_exactly_the_targets_distribution(models, monkeypatch,
                                                                                   verifier):
    # B = 4, 4 new tokens: a weak prior and dear steps make the sizes jump around
    target, drafter = models
    monkeypatch.setattr(block_policy, "PRIOR_WEIGHT", 0.5)
    fix_costs(drafter, linear_costs(4, step_cost=1.3, slot_cost=0.1))
    exact, sizes = exact_distribution(target, 1.0, None, 0.9), set()
    counts, _ = speculative_counts(target, drafter, verifier, 1.0, None, 0.9, block_size=auto, sizes=sizes,
                                   n=N_OTHER_PATHS)
    assert 1 in sizes and len(sizes) >= 3, \
        f"{verifier}: the block size did not vary enough to test: {sorted(sizes)}"
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p > ALPHA, \
        f"{verifier} with block_size='auto': chi-square p={p:.2e} -- not the target's distribution"


def test_a_bad_block_size_is_refused_with_a_clear_message(target, drafter):
    for bad in ("big", 0, 17, 2.5):
        with pytest.raises(ValueError, match="block_size must be"):
            speculative_generate(target, drafter, [1, 2], 4, block_size=bad)
