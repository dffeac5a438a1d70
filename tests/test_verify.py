"""Ladder 4: the verification rules, on hand-made logits and distributions."""

import pytest
import torch

from nanodflash.sampling import probs_from_logits
from nanodflash.verify import greedy_verify, match_verify, rejection_verify, residual_distribution

V = 5


def onehot_logits(tokens):
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).double() * 10.0


def test_greedy_verify_accepts_everything_when_drafts_match_the_target():
    n, bonus = greedy_verify(torch.tensor([1, 2, 3]), onehot_logits([1, 2, 3, 4]))
    assert (n, bonus) == (3, 4), \
        f"expected all 3 accepted and bonus 4 (the target's token after the block), got {(n, bonus)}"


def test_greedy_verify_accepts_nothing_when_the_first_draft_is_wrong():
    n, bonus = greedy_verify(torch.tensor([0, 2, 3]), onehot_logits([1, 2, 3, 4]))
    assert (n, bonus) == (0, 1), f"expected 0 accepted and the target's correction 1, got {(n, bonus)}"


def test_greedy_verify_stops_at_the_first_mismatch_even_if_later_drafts_match():
    n, bonus = greedy_verify(torch.tensor([1, 2, 0, 4]), onehot_logits([1, 2, 3, 4, 0]))
    assert (n, bonus) == (2, 3), f"expected 2 accepted then correction 3, got {(n, bonus)}"


def test_greedy_verify_with_no_drafts_is_plain_decoding():
    assert greedy_verify(torch.tensor([], dtype=torch.long), onehot_logits([3])) == (0, 3)


def test_match_verify_with_one_hot_target_behaves_like_greedy():
    p = probs_from_logits(onehot_logits([1, 2, 3, 4]), temperature=1.0)
    p = (p > 0.5).double()                                # exactly one-hot distributions
    assert match_verify(torch.tensor([1, 2, 0]), p) == (2, 3), "match verify should stop at the mismatch"
    assert match_verify(torch.tensor([1, 2, 3]), p) == (3, 4), \
        "match verify should accept all and sample the bonus"


def test_rejection_verify_accepts_all_when_draft_distribution_equals_the_target():
    p = torch.softmax(torch.randn(4, V, dtype=torch.float64), -1)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        d = torch.multinomial(p[:3], 1, generator=g).squeeze(-1)
        n, _ = rejection_verify(d, p[:3], p, g)
        assert n == 3, "with q == p, min(1, p/q) = 1: every draft must be accepted"


def test_rejection_verify_rejects_a_draft_the_target_gives_zero_probability():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]] * 2, dtype=torch.float64)
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    for seed in range(20):
        n, bonus = rejection_verify(torch.tensor([0]), q, p, torch.Generator().manual_seed(seed))
        assert n == 0 and bonus in (1, 2), \
            f"draft with p=0 must be rejected and replaced from the residual, got {(n, bonus)}"


def test_residual_distribution_is_normalized_positive_part_of_p_minus_q():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.1, 0.2], dtype=torch.float64)
    expected = torch.tensor([0.3, 0.0, 0.1, 0.0], dtype=torch.float64) / 0.4
    torch.testing.assert_close(residual_distribution(p, q), expected,
                               msg="residual != normalize(max(0, p - q))")


def test_residual_distribution_of_identical_distributions_falls_back_to_p():
    p = torch.tensor([0.25, 0.75], dtype=torch.float64)
    torch.testing.assert_close(residual_distribution(p, p), p)


def test_rejection_step_marginal_equals_the_target_exactly():
    """One rejection step at one position, computed exactly:
    P(out=x) = q(x)min(1,p/q) + P(reject) r(x) = p(x)."""
    p = torch.tensor([0.1, 0.4, 0.2, 0.3, 0.0], dtype=torch.float64)
    q = torch.tensor([0.3, 0.1, 0.2, 0.1, 0.3], dtype=torch.float64)
    accept = torch.minimum(torch.ones_like(p), p / q)
    out = q * accept + (1 - (q * accept).sum()) * residual_distribution(p, q)
    torch.testing.assert_close(out, p, msg="the rejection rule's output distribution is not p")


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, None, None), (1.0, 2, None), (1.0, None, 0.6)])
def test_sampling_transform_is_a_distribution_respecting_top_k_and_top_p(temperature, top_k, top_p):
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    p = probs_from_logits(logits, temperature, top_k, top_p)
    assert abs(float(p.sum()) - 1) < 1e-12, "probabilities must sum to 1"
    if top_k:
        assert int((p > 0).sum()) == top_k, f"top_k={top_k} should leave exactly {top_k} tokens"
    if top_p:
        kept = p > 0
        full = torch.softmax(logits.double(), -1)
        assert float(full[kept].sum()) >= top_p, "the nucleus must hold at least top_p of the mass"
        assert float(full[kept].sum() - full[kept].min()) < top_p, "the nucleus must be the smallest such set"
