"""The fast sampling transform and draw (sampling.py) are the slow, obvious ones: top-p from each row's top
tokens keeps exactly the nucleus a full stable sort keeps (rows with long nuclei, and equally likely tokens,
included), and the inverse-CDF draw gives each token its probability and never a token of probability
zero."""

from unittest import mock

import pytest
import torch

from nanodflash.sampling import probs_from_logits, sample


def full_sort_reference(logits, temperature, top_k, top_p):
    """The rule written the slow way: sort the whole vocabulary (of equal probabilities, the lower id first),
    keep tokens whose mass before them < top_p."""
    logits = logits.double() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)
    out = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("scale", [0.05, 1.0, 10.0], ids=["flat rows: nuclei of hundreds", "mixed", "peaked"])
@pytest.mark.parametrize("top_k,top_p", [(None, 0.5), (None, 0.95), (None, 0.999), (100, 0.95)])
def test_top_p_from_the_top_tokens_keeps_exactly_the_full_sort_nucleus(scale, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 1024) * scale                        # (3, 5, V): batch dims are kept
    fast, slow = probs_from_logits(logits, 0.7, top_k, top_p), full_sort_reference(logits, 0.7, top_k, top_p)
    assert torch.equal(fast > 0, slow > 0), f"scale {scale} top_p {top_p}: a different nucleus"
    assert torch.allclose(fast, slow, rtol=0, atol=1e-15), \
        f"scale {scale} top_p {top_p}: different probabilities"


@pytest.mark.parametrize("top_k,top_p", [(None, 0.3), (None, 0.9), (100, 0.5)])
def test_of_equally_likely_tokens_the_nucleus_keeps_the_lower_ids_as_the_full_stable_sort_does(top_k, top_p):
    logits = torch.randint(0, 3, (3, 5, 1024), generator=torch.Generator().manual_seed(0)).double()
    logits[0, 0] = 0.0                                              # a row of 1024 equally likely tokens
    fast, slow = probs_from_logits(logits, 0.7, top_k, top_p), full_sort_reference(logits, 0.7, top_k, top_p)
    assert torch.equal(fast > 0, slow > 0), f"top_k {top_k} top_p {top_p}: a different nucleus"
    assert torch.allclose(fast, slow, rtol=0, atol=1e-15), f"top_k {top_k} top_p {top_p}: other probabilities"


def test_inverse_cdf_draw_gives_each_token_its_probability():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0], dtype=torch.float64)
    n = 40000
    draws = sample(probs.expand(n, -1), torch.Generator().manual_seed(0))        # (n,)
    freq = torch.bincount(draws, minlength=5).double() / n
    assert freq[1] == 0 and freq[4] == 0, f"tokens of probability 0 were drawn: {freq}"
    sigma = (probs * (1 - probs) / n).sqrt()
    assert bool(((freq - probs).abs() <= 5 * sigma + 1e-12).all()), \
        f"frequencies {freq} vs probabilities {probs}"


def test_a_uniform_rounding_up_to_the_total_still_draws_a_possible_token():
    probs = torch.tensor([[0.25, 0.75, 0.0, 0.0]], dtype=torch.float64)   # the last tokens are impossible
    with mock.patch("torch.rand", lambda *a, **k: torch.ones(1, 1, dtype=torch.float64)):
        assert int(sample(probs)) == 1, "u * total == total must pick the last possible token, not token 3"


def test_top_p_works_outside_no_grad_as_calibration_calls_it():
    logits = torch.randn(3, 64)
    with torch.enable_grad():
        probs = probs_from_logits(logits, temperature=0.7, top_p=0.9)
    assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=torch.float64)), \
        f"top-p under grad mode must give distributions (calibration times steps with grad on): {probs}"
