"""Ladder 6 for every drafter kind that can sample: sampled speculative output has exactly the target's
distribution with DFlash 2's selector q (softmax of its candidate scores at T; top-k and top-p on the target's
side), the AR feature
drafter (q of each token depends on the drawn token before it), the no-feature drafter and prompt lookup;
DFlash itself, under both verifiers, is covered in test_sampling_exact.py. Same chi-square test against
enumeration (p > 1e-4 required), same negative controls there and in test_dflash2.py.
"""

import pytest
import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.tools.baselines import ARDrafter, NoFeatureDrafter
from nanodflash.tools.prompt_lookup import PromptLookupDrafter
from test_dflash2 import tiny_dflash2, uniform_q
from test_sampling_exact import (
    ALPHA,
    N_OTHER_PATHS,
    V,
    chi_square_p_value,
    exact_distribution,
    speculative_counts,
)


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=11, vocab=V, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=60.0)


SELECTOR = "dflash2 top-3 candidates"       # its selector keeps 3 of the 4 tokens


def soft(drafter):
    """A softer drafter than the target (q != p), so that rejections happen."""
    with torch.no_grad():
        drafter.norm.weight.mul_(0.3)
    return drafter


def make(kind, target):
    if kind == SELECTOR:
        return soft(tiny_dflash2(target, seed=12, block_size=4, top_k=3, rank=4, group=8, perturb=0.5))
    base = tiny_drafter(target, seed=12, block_size=4, n_layer=1)
    if kind == "ar":
        torch.manual_seed(12)
        return soft(ARDrafter(base.config, target).double().eval())
    if kind == "nofeat":
        torch.manual_seed(12)
        return soft(NoFeatureDrafter(base.config, target).double().eval())
    return PromptLookupDrafter(target, n_draft=3, max_ngram=1)      # copies: q = softmax(one-hot logits / T)


# rejection is where q matters: the selector's q with top-k, and with top-k and top-p together (top-p alone:
# test_dflash2.py); one setting per other kind. match drafts without q, and test_sampling_exact.py covers its
# transforms; one run here.
CASES = ([(SELECTOR, "rejection", *c) for c in [(0.7, 2, None), (1.0, 2, 0.9)]]
         + [(SELECTOR, "match", 1.0, 2, 0.9)]
         + [(k, "rejection", 0.8, 2, 0.9) for k in ("ar", "nofeat", "prompt lookup")])


@pytest.mark.parametrize("kind,verifier,temperature,top_k,top_p", CASES)
def test_sampled_output_has_exactly_the_targets_distribution_for_every_drafter_kind(target, kind, verifier,
                                                                                    temperature, top_k,
                                                                                    top_p):
    drafter = make(kind, target)
    exact = exact_distribution(target, temperature, top_k, top_p)
    counts, lengths = speculative_counts(target, drafter, verifier, temperature, top_k, top_p,
                                         n=N_OTHER_PATHS)
    impossible = [s for s in counts if exact[s] == 0]
    assert not impossible, f"{kind} {verifier}: outputs the target can never produce: {impossible[:3]}"
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), \
        f"{kind} {verifier}: both acceptance and rejection must occur for the test to mean anything"
    p = chi_square_p_value(counts, exact, sum(counts.values()))
    assert p > ALPHA, (f"{kind} {verifier} T={temperature} top_k={top_k} top_p={top_p}: chi-square "
                       f"p={p:.2e}, not the target's distribution")


def test_a_wrong_selector_q_fails_the_same_test_with_top_k_and_top_p_on(target):
    """Negative control with top-k and top-p on: the rejection rule fed a uniform q."""
    drafter = make(SELECTOR, target)
    exact = exact_distribution(target, 1.0, 2, 0.9)
    counts, _ = speculative_counts(target, drafter, uniform_q, 1.0, 2, 0.9, n=N_OTHER_PATHS)
    p = chi_square_p_value(counts, exact, sum(counts.values()))
    assert p < ALPHA, f"the test cannot tell a wrong q from the selector's (p={p:.2e}): it has no power here"
