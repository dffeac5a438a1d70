"""What sampling acceptance is: under the rejection rule one slot accepts its draft d ~ q with probability
sum_x min(p(x), q(x)) = 1 - TV(p, q). Measured acceptance must match it, on hand-made distributions and on
slot 1 of real speculative steps; a rule that accepts with probability p(d) instead (the match rule's
acceptance, wrongly applied to sampled drafts) gives sum_x q(x) p(x) and must fail the same check.

Check: |accepted - expected| <= 5 standard deviations of the count (a correct rule fails with prob ~6e-7).
"""

import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.ext.batch import speculative_generate_batch
from nanodflash.sampling import sample
from nanodflash.verify import rejection_verify

P = torch.tensor([0.50, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)
Q = torch.tensor([0.20, 0.40, 0.05, 0.05, 0.30], dtype=torch.float64)


def accept_with_p(drafts, q, p, generator):
    """WRONG on purpose: accepts d with probability p(d), ignoring q; on rejection samples the target."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    if u < float(p[0, int(drafts[0])]):
        return 1, int(sample(p[1], generator))
    return 0, int(sample(p[0], generator))


def one_slot_rate(rule, p, q, n, seed=0):
    """Fraction of n single-draft steps (d ~ q) whose draft `rule` accepts."""
    g = torch.Generator().manual_seed(seed)
    target_rows = torch.stack([p, p])                                   # (2, V): slot 1, then the bonus
    accepted = 0
    for _ in range(n):
        d = sample(q, g).view(1)                                         # (1,)
        accepted += rule(d, q[None], target_rows, g)[0]
    return accepted / n


def within_5_sigma(rate, expected, n):
    return abs(rate - expected) <= 5 * (expected * (1 - expected) / n) ** 0.5


def test_one_slot_accepts_with_probability_sum_of_min_p_q():
    n, expected = 4000, float(torch.minimum(P, Q).sum())      # 5 sigma = 0.04, the wrong rule is 0.36 off
    rate = one_slot_rate(rejection_verify, P, Q, n)
    assert within_5_sigma(rate, expected, n), f"acceptance {rate:.4f}, sum min(p, q) = {expected:.4f}"
    tv = 0.5 * float((P - Q).abs().sum())
    assert abs(expected - (1 - tv)) < 1e-12, "sum min(p, q) must equal 1 - TV(p, q)"


def test_accepting_with_probability_p_of_the_draft_fails_the_same_check():
    n, expected = 4000, float(torch.minimum(P, Q).sum())      # 5 sigma = 0.04, the wrong rule is 0.36 off
    rate = one_slot_rate(accept_with_p, P, Q, n)
    assert not within_5_sigma(rate, expected, n), \
        f"the check cannot tell a wrong acceptance rule ({rate:.4f}) from sum min(p, q) ({expected:.4f})"


def slot1_acceptance_in_the_loop(rule, n_prompts=300):
    """Run rejection-style speculative decoding on a tiny pair, n_prompts rows of one batch; per step, record
    sum min(p_1, q_1) of the first draft slot and whether it was accepted. Returns (accepted count, expected
    count, variance)."""
    target = tiny_target(seed=11, vocab=8, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=20.0)
    drafter = tiny_drafter(target, seed=12, block_size=4, n_layer=1)
    got, want, var = 0, 0.0, 0.0

    def recording(drafts, q, p, generator):
        nonlocal got, want, var
        a = float(torch.minimum(p[0], q[0]).sum())
        n_acc, bonus = rule(drafts, q, p, generator)
        got, want, var = got + (n_acc > 0), want + a, var + a * (1 - a)
        return n_acc, bonus
    recording.sample_drafts = True
    g = torch.Generator().manual_seed(3)           # one batch: each row's steps verified one row at a time
    speculative_generate_batch(target, drafter, [[i % 8, 1] for i in range(n_prompts)], 6, block_size=4,
                               temperature=0.9, top_p=0.95, verifier=recording, generator=g)
    return got, want, var


def test_first_draft_slot_of_real_steps_accepts_at_sum_min_p_q_and_a_wrong_rule_does_not():
    got, want, var = slot1_acceptance_in_the_loop(rejection_verify)
    assert abs(got - want) <= 5 * var ** 0.5, \
        f"slot 1 accepted {got} times, sum min(p, q) predicts {want:.1f}"
    got, want, var = slot1_acceptance_in_the_loop(accept_with_p)
    assert abs(got - want) > 5 * var ** 0.5, \
        (f"a rule accepting with p(d) ({got}) is indistinguishable from sum min(p, q) ({want:.1f}): "
         "the check is weak")
