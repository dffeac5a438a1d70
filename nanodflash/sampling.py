"""Turning logits into a distribution: temperature, top-k, top-p (in that order), and drawing from it.

The target's p is the transformed distribution (what plain sampling draws from). A drafter's q, for the
rejection verifier, is its own softmax at a slightly higher temperature (`draft_temperature`), untruncated
(DraftRule): the verifier makes the output exact for ANY q that the drafts are really drawn from, so q is
free to be whatever accepts most. The drafters are sharper than the target, and a flatter q accepts more;
truncating q did not bring it closer to p (per-slot sum min(p, q), docs/log.md).
temperature == 0 means greedy: the distribution is one-hot on the argmax.
"""

from dataclasses import dataclass

import torch


def check_sampling_args(temperature, top_k, top_p):
    """Raise ValueError with a clear message for settings that make no distribution."""
    if temperature is None or not 0 <= temperature < float("inf"):           # `not ... <=` also catches NaN
        raise ValueError(f"temperature must be >= 0 and finite (0 = greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, float) or int(top_k) != top_k or top_k < 1):   # 2.0 too
        raise ValueError(f"top_k must be a positive integer or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


@dataclass(frozen=True)
class Sampling:
    """How the target's next token is drawn: temperature 0 = greedy (the argmax); else from
    probs_from_logits(logits, temperature, top_k, top_p). Checked when made.

    >>> Sampling(0.7, top_p=0.95).greedy
    False
    """
    temperature: float = 0.0
    top_k: int = None
    top_p: float = None

    def __post_init__(self):
        check_sampling_args(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self):
        return self.temperature == 0

    def probs(self, logits):
        """The target's distribution p (..., V), float64, at these settings."""
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)

    def next_token(self, logits, generator=None):
        """next_token at these settings: logits (..., V) on the CPU -> token ids (...,)."""
        return next_token(logits, self.temperature, self.top_k, self.top_p, generator)


def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """logits (..., V) -> probabilities (..., V) in float64.

    Top-p keeps the smallest set of most likely tokens (of equal ones the lower id first) whose mass reaches
    top_p. Only those tokens need ranking: `_nucleus` takes the top 64 of each row (torch.topk), and more only
    for the rows where those do not reach top_p, instead of sorting the whole vocabulary of every row.

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
        probs = _nucleus(probs, top_p, min(int(top_k or NUCLEUS_START), NUCLEUS_START))
    return probs


# candidates per row for top-p; doubled, for the rows that need more, until they hold top_p
NUCLEUS_START = 64


def _nucleus(probs, top_p, k):
    """probs (..., V) -> the top-p nucleus of each row, renormalised: the tokens ranked (most likely first; of
    equal ones the lower id first, as a stable sort ranks them) while the mass ranked before them is < top_p.
    The sorted probabilities say how many tokens that is, the smallest kept and their mass, and the top k of
    a row hold them once they reach top_p. torch.topk gives those values but orders equal ones its own way,
    so the tokens are chosen by value: all above the smallest kept, and of those equal to it (usually it
    alone), the lowest ids. Rows whose top k hold less than top_p (flat distributions) are redone with 2k,
    4k, ... tokens; only those rows."""
    flat = probs.reshape(-1, probs.size(-1))                                 # (N, V)
    V = flat.size(-1)
    k, rows = max(1, min(k, V)), torch.arange(flat.size(0))
    size = torch.zeros(flat.size(0), 1, dtype=torch.long)                   # tokens in each row's nucleus,
    smallest = torch.zeros(flat.size(0), 1, dtype=flat.dtype)               # the least likely kept,
    mass = torch.zeros_like(smallest)                                        # and the nucleus's mass
    while rows.numel():                                                      # rows not placed yet
        top = flat[rows].topk(k, dim=-1).values                              # (n, k), largest first
        total = top.cumsum(-1)
        kept = total - top < top_p               # in while the mass ranked before it is < top_p: a prefix
        size[rows] = kept.sum(-1, keepdim=True)
        smallest[rows] = top.gather(-1, size[rows] - 1)
        mass[rows] = (top * kept).sum(-1, keepdim=True)
        rows, k = rows[(total[:, -1] < top_p) & (k < V)], min(2 * k, V)   # their top k fall short: wider
    # the nucleus by value: every token as likely as its smallest or more, less ties beyond its size
    keep = flat >= smallest                                                  # (N, V)
    if bool((keep.sum(-1, keepdim=True) > size).any()):          # a tie across its edge: the lowest ids stay
        above, tied = flat > smallest, flat == smallest
        keep = above | (tied & (tied.cumsum(-1) <= size - above.sum(-1, keepdim=True)))
    return (flat * keep / mass).view_as(probs)                               # (N, V) -> (..., V)


def next_token(logits, temperature=0.0, top_k=None, top_p=None, generator=None):
    """logits (..., V) on the CPU -> token ids (...,): the argmax at temperature 0 (no distribution is
    built on that hot path), else a sample of the transformed distribution."""
    if temperature == 0:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, temperature, top_k, top_p), generator)


def sample(probs, generator=None):
    """Draw one token id per row of probs (..., V) -> (...,) LongTensor, by inverse CDF: one uniform u per
    row, and the first token whose cumulative mass exceeds u * (the row's total). A token of probability 0
    adds nothing to the cumulative mass, so it is never drawn. (Cheaper than torch.multinomial here.)"""
    flat = probs.reshape(-1, probs.size(-1))                                 # (N, V)
    return inverse_cdf(probs, torch.rand(flat.size(0), generator=generator, dtype=flat.dtype))


def inverse_cdf(probs, u):
    """`sample` with the uniforms given: probs (..., V), u (N,) one per row of probs -> token ids (...,)."""
    flat = probs.reshape(-1, probs.size(-1))                                 # (N, V)
    cdf = flat.cumsum(-1)
    idx = torch.searchsorted(cdf, u.view(-1, 1).to(cdf.dtype) * cdf[:, -1:], right=True)   # (N, 1)
    past = idx == flat.size(-1)                          # u * total rounded up to the total: take the last
    if bool(past.any()):                                 # token of nonzero probability, never a zero one
        last = flat.size(-1) - 1 - (flat.flip(-1) > 0).long().argmax(-1, keepdim=True)   # (N, 1)
        idx = torch.where(past, last, idx)
    return idx.view(probs.shape[:-1])                                        # (N, 1) -> (...,)


# a drafter's q is its softmax at this multiple of the sampling temperature (docs/sampling.md)
Q_FLATTEN = 1.2


def draft_temperature(temperature):
    """The temperature of a drafter's q when decoding samples at `temperature`: Q_FLATTEN times it."""
    return temperature * Q_FLATTEN


@dataclass
class DraftRule:
    """How a drafter turns its scores into draft tokens, and the distribution q they were drawn from.

    Greedy (temperature 0): the argmax, and no q (the greedy verifier never looks at q, so none is built
    on that hot path). Sampling: q = softmax(logits / draft_temperature(temperature)), no top-k / top-p
    (those shape the target's p only); the drafts are samples of q when `sample_drafts` (the rejection
    verifier), else q's argmax (match).

    >>> tokens, q = DraftRule(0.0)(torch.tensor([[0.0, 3.0, 1.0]]))
    >>> tokens, q
    (tensor([1]), None)
    """
    temperature: float = 0.0
    sample_drafts: bool = False
    generator: torch.Generator = None

    def __call__(self, logits):
        """logits (n, V) -> (tokens (n,), q (n, V) float64 or None)."""
        logits = logits.detach().cpu()                                       # one copy off the device
        if self.temperature == 0:
            return logits.argmax(-1), None
        q = probs_from_logits(logits, draft_temperature(self.temperature))  # (n, V)
        return (sample(q, self.generator) if self.sample_drafts else logits.argmax(-1)), q
