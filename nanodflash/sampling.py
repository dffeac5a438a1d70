"""Turning logits into a distribution: temperature, top-k, top-p (in that order), and drawing from it.

The same transform is applied to the target's logits and, for the rejection verifier, to the
drafter's, so that p and q in the acceptance rule are the distributions actually sampled from.
temperature == 0 means greedy: the distribution is one-hot on the argmax.
"""

from dataclasses import dataclass

import torch


def check_sampling_args(temperature, top_k, top_p):
    """Raise ValueError with a clear message for settings that make no distribution."""
    if temperature is None or not 0 <= temperature < float("inf"):           # `not ... <=` also catches NaN
        raise ValueError(f"temperature must be >= 0 and finite (0 = greedy), got {temperature}")
    if top_k is not None and (int(top_k) != top_k or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """logits (..., V) -> probabilities (..., V) in float64.

    >>> probs_from_logits(torch.tensor([2.0, 1.0, 0.0]), temperature=0)
    tensor([1., 0., 0.], dtype=torch.float64)
    >>> probs_from_logits(torch.tensor([0.0, 0.0, -9.0]), top_k=2).round(decimals=3)
    tensor([0.5000, 0.5000, 0.0000], dtype=torch.float64)
    """
    logits = logits.to(torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(torch.float64)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, int(top_k), dim=-1).values[..., -1:]       # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p                             # mass strictly before each token
        sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)                # keep the smallest nucleus >= top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def next_token(logits, temperature=0.0, top_k=None, top_p=None, generator=None):
    """logits (..., V) on the CPU -> token ids (...,): the argmax at temperature 0 (no distribution is
    built on that hot path), else a sample of the transformed distribution."""
    if temperature == 0:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, temperature, top_k, top_p), generator)


def sample(probs, generator=None):
    """Draw one token id per row of probs (..., V) -> (...,) LongTensor."""
    flat = probs.reshape(-1, probs.size(-1))                                 # (N, V)
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


@dataclass
class DraftRule:
    """How a drafter turns its scores into draft tokens, and the distribution q they were drawn from.

    Greedy (temperature 0): the argmax, and no q (the greedy verifier never looks at q, so none is built
    on that hot path). Sampling: q = the same temperature/top-k/top-p transform as the target's p; the
    drafts are samples of q when `sample_drafts` (the rejection verifier), else q's argmax (match).

    >>> tokens, q = DraftRule(0.0)(torch.tensor([[0.0, 3.0, 1.0]]))
    >>> tokens, q
    (tensor([1]), None)
    """
    temperature: float = 0.0
    top_k: int = None
    top_p: float = None
    sample_drafts: bool = False
    generator: torch.Generator = None

    def __call__(self, logits):
        """logits (n, V) -> (tokens (n,), q (n, V) float64 or None)."""
        logits = logits.detach().cpu()                                       # one copy off the device
        if self.temperature == 0:
            return logits.argmax(-1), None
        q = probs_from_logits(logits, self.temperature, self.top_k, self.top_p)    # (n, V)
        return (sample(q, self.generator) if self.sample_drafts else logits.argmax(-1)), q
