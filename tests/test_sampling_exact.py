"""Ladder 6: sampled speculative output has exactly the target's distribution, for both verifiers.

Setting: a target with a 4-token vocabulary and peaked distributions, prompt [1, 2], 4 new tokens,
block_size 4 (so a step drafts up to 3 tokens). The target's exact probability of each of the 4^4
possible outputs is computed by enumeration (product of its conditionals). N speculative samples
are compared to it with a chi-square goodness-of-fit test (bins with expected count < 5 pooled).

False-alarm rate: we fail when p < 1e-4, so a correct sampler fails a given configuration with
probability 1e-4 (under 1e-3 across the whole file) for a random seed; seeds are fixed, so the suite
is deterministic. Power: the negative controls (a verifier that always accepts, and one that on
rejection resamples from p instead of the residual) must get p < 1e-4 on the same test. With N = 600
samples they get p < 1e-100 here. Subtler faults are caught too: a verifier that sees the target at 1.4 times
its temperature, or accepts 1.2 times too often, fails in 10 seeds of 10
(tests/power_of_the_chi_square_test.py). The other files run the library's rules on other paths with
N_OTHER_PATHS = 200 samples, and their controls get p ~ 1e-22 at worst (test_sampling_kinds.py's uniform q
with top-k and top-p on).
"""

import pytest
import torch

from helpers import soft_pair
from nanodflash.exercises.models import SMALL_VOCAB
from nanodflash.exercises.oracle import (  # noqa: F401 (other files import them from here)
    ALPHA,
    N_OTHER_PATHS,
    N_SAMPLES,
    PROMPT,
    H,
    chi_square_p_value,
    exact_distribution,
    speculative_counts,
)
from nanodflash.sampling import sample
from nanodflash.verify import residual_distribution

V = SMALL_VOCAB


@pytest.fixture(scope="module")
def models():
    return soft_pair(V)


CONFIGS = [(0.7, None, None), (1.0, 2, None), (1.0, None, 0.8)]


@pytest.mark.parametrize("verifier", ["match", "rejection"])
@pytest.mark.parametrize("temperature,top_k,top_p", CONFIGS)
def test_sampled_speculative_output_has_exactly_the_targets_distribution(
        models, verifier, temperature, top_k, top_p):
    target, drafter = models
    exact = exact_distribution(target, temperature, top_k, top_p)
    counts, lengths = speculative_counts(target, drafter, verifier, temperature, top_k, top_p)
    impossible = [s for s in counts if exact[s] == 0]
    assert not impossible, f"{verifier}: produced outputs the target can never produce: {impossible[:3]}"
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), \
        "both acceptance and rejection must occur"
    p = chi_square_p_value(counts, exact, N_SAMPLES)
    assert p > ALPHA, (f"{verifier} T={temperature} top_k={top_k} top_p={top_p}: chi-square p={p:.2e} "
                       "-- not the target's distribution")


def always_accept(drafts, q, p, generator):
    """WRONG on purpose: keeps every draft, then samples the bonus from the target."""
    n = drafts.numel()
    return n, int(sample(p[n], generator))


def resample_from_p_on_reject(drafts, q, p, generator):
    """WRONG on purpose: the rejection rule, but on rejection it samples p instead of the residual."""
    n = drafts.numel()
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    for i in range(n):
        d = int(drafts[i])
        if not u[i] * q[i, d] < p[i, d]:
            return i, int(sample(p[i], generator))
    return n, int(sample(p[n], generator))


resample_from_p_on_reject.sample_drafts = True       # like the rejection rule, it needs drafts sampled from q


@pytest.mark.parametrize("wrong", [always_accept, resample_from_p_on_reject], ids=lambda f: f.__name__)
def test_a_deliberately_wrong_verifier_fails_the_same_test(models, wrong):
    target, drafter = models
    exact = exact_distribution(target, 1.0, None, None)
    counts, _ = speculative_counts(target, drafter, wrong, 1.0, None, None)
    p = chi_square_p_value(counts, exact, N_SAMPLES)
    assert p < ALPHA, \
        f"the test cannot tell {wrong.__name__} from a correct verifier (p={p:.2e}): it has no power"


def test_residual_is_what_makes_rejection_exact():
    """Exact one-position check of the negative control: resampling from p instead of the residual is
    biased."""
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.7, 0.1], dtype=torch.float64)
    acc = torch.minimum(torch.ones_like(p), p / q) * q
    right = acc + (1 - acc.sum()) * residual_distribution(p, q)
    wrong = acc + (1 - acc.sum()) * p
    assert torch.allclose(right, p) and not torch.allclose(wrong, p), \
        "residual resampling should be exact, p resampling not"
