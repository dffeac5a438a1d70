"""The claims of the sampling-transform exercise, probs_from_logits: temperature, then top-k, then top-p,
against a plain reference, and sampled decoding exact with it in place."""

import math

import torch

from .check import BrokenContract, Failed
from .claims_verify import exactly_p

# (logits, temperature, top_k, top_p): the nucleus cases put the top_p boundary exactly between two tokens'
# masses, where "keep while the mass BEFORE the token is < top_p" and "... including the token" differ
CASES = [
    ([2.0, 1.0, 0.0, -1.0], 0, None, None),
    ([2.0, 1.0, 0.0, -1.0], 1.0, None, None),
    ([2.0, 1.0, 0.0, -1.0], 0.5, None, None),
    ([2.0, 1.0, 0.0, -1.0], 2.0, 2, None),
    ([0.3, -1.2, 2.5, 0.0, 1.1], 0.7, 3, None),
    ([math.log(0.5), math.log(0.3), math.log(0.2)], 1.0, None, 0.7),
    ([math.log(0.5), math.log(0.3), math.log(0.2)], 1.0, None, 0.85),
    ([math.log(0.5), math.log(0.3), math.log(0.2)], 1.0, None, 0.45),
    ([3.0, 2.0, 1.0, 0.0, -1.0], 0.5, None, 0.9),
    ([3.0, 2.0, 1.0, 0.0, -1.0], 2.0, None, 0.9),
    ([1.0, 3.0, 2.0, 0.5, 2.5, -1.0], 0.7, 4, 0.8),
    ([1.0, 3.0, 2.0, 0.5, 2.5, -1.0], 1.3, 5, 0.95),
    # a flat row where the order matters: top-3, then the nucleus, keeps 2 tokens; the nucleus of the whole
    # row, then top-3, keeps 3; the nucleus alone 4
    ([2.0, 1.9, 1.8, 1.7, 1.6, 1.5], 1.0, 3, 0.65),
    ([2.0, 1.0, 0.0, -1.0], 1.0, 10, None),                  # top_k above the vocabulary: no truncation
    ([2.0, 1.0, 1.0, 0.0], 1.0, 2, None),                    # a tie with the 2nd largest logit: both kept
    # top_p exactly at a cumulative mass (0.5, 0.75 are exact in binary): the token that reaches it is kept,
    # the next is not
    ([math.log(0.5), math.log(0.25), math.log(0.25)], 1.0, None, 0.5),
    ([math.log(0.5), math.log(0.25), math.log(0.25)], 1.0, None, 0.75),
    # many equally likely tokens, more than torch's sort and topk keep in id order: the nucleus takes the
    # lowest ids (ids 0 to 19 of 40; then three levels of 64 tokens, cut by top-k and top-p)
    ([0.0] * 40, 1.0, None, 0.49),
    ([float((7 * i) % 3) for i in range(64)], 0.7, 40, 0.6),
    ([2.0, 2.0, 0.0], 1.0, 1, None),                        # top_k = 1 with a tie at the top: both kept
    ([1.0, 1.005, 0.0], 0.005, None, None),                  # a near tie at a very low temperature: sampled
    ([math.log(0.9), math.log(0.095), math.log(0.005)], 1.0, None, 0.99),   # top_p near 1: the tail goes
]


def reference_probs(logits, temperature, top_k, top_p):
    """Plain Python, one row: the one-hot argmax at T = 0; else divide by T, keep the top_k largest logits,
    softmax, then keep each token (largest first) while the mass of the tokens before it is < top_p, and
    renormalise."""
    V = len(logits)
    if temperature == 0:
        best = max(range(V), key=lambda i: logits[i])
        return [1.0 if i == best else 0.0 for i in range(V)]
    z = [x / temperature for x in logits]
    if top_k is not None and top_k < V:
        kth = sorted(z, reverse=True)[top_k - 1]
        z = [x if x >= kth else -math.inf for x in z]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    probs = [x / sum(e) for x in e]
    if top_p is not None and top_p < 1:
        kept, before = [0.0] * V, 0.0
        for i in sorted(range(V), key=lambda i: -probs[i]):
            if before < top_p:
                kept[i] = probs[i]
            before += probs[i]
        probs = [x / sum(kept) for x in kept]
    return probs


def fmt(xs, probs=False, digits=3):
    """A row for a message; a long one by its first values and, for probabilities, the ids they keep."""
    if len(xs) <= 12:
        return "[" + ", ".join(f"{x:.{digits}f}" for x in xs) + "]"
    kept = f", nonzero at ids {[i for i, x in enumerate(xs) if x > 1e-12]}" if probs else ""
    return "[" + ", ".join(f"{x:.{digits}f}" for x in xs[:6]) + f", ... ({len(xs)} in all){kept}]"


def top_p_first(logits, temperature, top_k, top_p):
    """A known mistake: the nucleus chosen at temperature 1, the temperature applied after."""
    kept = reference_probs(logits, 1.0, top_k, top_p)
    return reference_probs([x / temperature if p > 0 else -math.inf for x, p in zip(logits, kept)], 1.0, None,
                           None)


def top_p_before_top_k(logits, temperature, top_k, top_p):
    """Another: the nucleus of the whole row, then top-k of what it kept."""
    kept = reference_probs(logits, temperature, None, top_p)
    return reference_probs([x if p > 0 else -math.inf for x, p in zip(logits, kept)], temperature, top_k,
                           None)


def close(a, b):
    return all(abs(x - y) <= 1e-6 for x, y in zip(a, b))


def diagnose(logits, temperature, top_k, top_p, got):
    """A sentence naming the likely mistake, when `got` has its symptom; '' otherwise."""
    if top_p is not None and temperature not in (0, 1) and close(got, top_p_first(logits, temperature, top_k,
                                                                                     top_p)):
        return " You applied top-p before the temperature: divide the logits by T first, then truncate."
    if top_k is not None and top_p is not None:
        if close(got, reference_probs(logits, temperature, None, top_p)):
            return " You dropped top-k when top-p is given: apply both, top-k first."
        if close(got, top_p_before_top_k(logits, temperature, top_k, top_p)):
            return (" You applied top-p before top-k: keep the top_k largest first, renormalise, then take "
                    "the nucleus of what is left.")
    want = reference_probs(logits, temperature, top_k, top_p)
    if (top_k or top_p) and close(got, reference_probs(logits, temperature, None, None)):
        return (f" Yours is the softmax at T={temperature} with no truncation: top-k and top-p apply at "
                "every temperature, 1 included, and top_p cuts the tail however close to 1 it is.")
    n_want = sum(p > 1e-12 for p in want)
    if top_p is not None and sorted(round(p, 9) for p in got) == sorted(round(p, 9) for p in want):
        return (" You kept other tokens of equally likely ones: the contract ranks a tie by id, the lower "
                "first (a stable sort, descending: stable=True), so that the nucleus is one set.")
    if top_k is not None and top_p is None and sum(p > 1e-12 for p in got) == top_k < n_want:
        return (" A logit that ties the k-th largest stays in: keep every logit >= the k-th (as the library "
                "and Hugging Face's top-k do), not exactly k tokens.")
    if top_p is not None:
        n_got = sum(p > 1e-12 for p in got)
        n_want = sum(p > 1e-12 for p in reference_probs(logits, temperature, top_k, top_p))
        if n_got == n_want - 1:
            return (" You dropped the token that carries the mass across top_p: the nucleus keeps a token "
                    "while the mass of the tokens BEFORE it is < top_p (the smallest set whose mass reaches "
                    "top_p).")
        if n_got == n_want + 1:
            return " You kept one token too many: stop once the tokens kept hold at least top_p of the mass."
    if 0 < temperature < 0.05 and max(got) > 1 - 1e-12 > max(want):
        return (" At a very low temperature a near tie is still sampled: divide by T however small (in "
                "float64, or subtract the largest logit first), never switch to greedy below some T.")
    if abs(sum(got) - 1) > 1e-6:
        return f" Your probabilities sum to {sum(got):.4f}: renormalise after truncating."
    return ""


def call_on_case(student, logits, temperature, top_k, top_p):
    """student.fn on one case; an exception it raises becomes a failure that names the case."""
    try:
        return student.fn(logits, temperature, top_k, top_p)
    except (IndexError, RuntimeError, ValueError) as e:
        beyond = (f" top_k = {top_k} is more than the {logits.size(-1)} tokens: keep them all then"
                  if top_k is not None and top_k > logits.size(-1) else "")
        raise Failed(f"for logits {fmt(logits.tolist())} with temperature={temperature}, top_k={top_k}, "
                     f"top_p={top_p} yours raised {type(e).__name__}: {str(e).rstrip('.')}.{beyond}"
                     ) from None


def claim_probs_agree_with_a_plain_reference(student):
    """agrees with a plain reference: temperature, then top-k, then top-p (the nucleus exactly), leaving the
    logits it is given as they were"""
    for logits, temperature, top_k, top_p in CASES:
        given = torch.tensor(logits, dtype=torch.float64)
        got = call_on_case(student, given, temperature, top_k, top_p)
        if not torch.equal(given, torch.tensor(logits, dtype=torch.float64)):
            raise Failed(f"your function changed the logits it was given ({fmt(logits)} became "
                         f"{fmt(given.tolist())}): the decoders read them again; work on a copy")
        if not isinstance(got, torch.Tensor) or got.shape != (len(logits),):
            raise BrokenContract(f"for logits of shape ({len(logits)},) it must return probabilities of that "
                                 f"shape; got {getattr(got, 'shape', type(got).__name__)}")
        got = got.double().tolist()
        want = reference_probs(logits, temperature, top_k, top_p)
        if any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
            setting = f"temperature={temperature}, top_k={top_k}, top_p={top_p}"
            raise Failed(f"for logits {fmt(logits)} with {setting}: yours {fmt(got, True)}, expected "
                         f"{fmt(want, True)}."
                         + diagnose(logits, temperature, top_k, top_p, got))
    buffer = torch.tensor(CASES[1][0], dtype=torch.float64)          # a buffer the decoders fill again
    first = student.fn(buffer, 1.0, None, None).tolist()
    buffer.copy_(buffer.flip(0))
    if not close(student.fn(buffer, 1.0, None, None).tolist(), first[::-1]):
        raise Failed("called again on the same tensor with new values (the decoders refill their buffers), "
                     "yours gave what it gave for the old values: compute from the values every call, "
                     "keep nothing between calls")


def claim_probs_stay_finite_for_large_logits_at_a_low_temperature(student):
    """float32 logits as large as a sure model's, at T=0.3, and float64 ones at T=0.05: finite
    probabilities, the reference's; float32 logits of a near tie at T=0.001: its odds, to 1e-6"""
    logits = [30.0, 28.0, 10.0, 0.0]
    got = student.fn(torch.tensor(logits), 0.3, None, None)                  # float32, as the models give
    if not isinstance(got, torch.Tensor) or not torch.isfinite(got).all():
        raise Failed(f"float32 logits {fmt(logits)} at T=0.3 gave {got}: exp(30 / 0.3) overflows float32 "
                     "(inf / inf is NaN). Subtract the row's largest logit before exp (torch.softmax "
                     "does), in float64.")
    want = reference_probs(logits, 0.3, None, None)
    if any(abs(a - b) > 1e-6 for a, b in zip(got.double().tolist(), want)):
        raise Failed(f"float32 logits {fmt(logits)} at T=0.3: yours {fmt(got.tolist())}, expected "
                     f"{fmt(want)}")
    sharp = student.fn(torch.tensor([40.0, 38.0, 0.0], dtype=torch.float64), 0.05, None, None)
    if not isinstance(sharp, torch.Tensor) or not torch.isfinite(sharp).all():
        raise Failed(f"float64 logits [40, 38, 0] at T=0.05 gave {sharp}: exp(800) overflows float64 too. "
                     "Subtract the row's largest logit before exp (torch.softmax does).")
    near = torch.tensor([30.0, 29.999, 0.0])                # float32, a near tie: 1 apart at T = 0.001
    got = torch.as_tensor(student.fn(near, 0.001, None, None)).double().tolist()
    want = reference_probs(near.double().tolist(), 0.001, None, None)
    if any(abs(a - b) > 1e-6 for a, b in zip(got, want)):
        raise Failed(f"float32 logits [30, 29.999, 0] at T=0.001: yours {fmt(got, digits=6)}, expected "
                     f"{fmt(want, digits=6)}. In float32, logits divided by T (30,000 here) keep only about "
                     "3 digits after the point, and those set a near tie's odds: convert to float64 first, "
                     "then divide and take the softmax there")


def claim_probs_work_on_a_batch_of_rows(student):
    """works on a batch of rows (..., V) at once, each row as on its own, in float64 from float32 logits,
    at T=0 too (one-hot rows, a tie to the lower id)"""
    logits = torch.tensor([c[0] for c in CASES if len(c[0]) == 5], dtype=torch.float64)   # (2, 5)
    got = student.fn(logits, 0.7, 3, 0.9)
    rows = torch.stack([student.fn(row, 0.7, 3, 0.9) for row in logits])
    if not isinstance(got, torch.Tensor) or got.shape != logits.shape or not torch.allclose(got, rows):
        raise Failed("a (2, V) batch of logits must give, row by row, what each row gives alone (the "
                     "decoders transform every position of a block at once): work along the last dimension")
    try:
        greedy = student.fn(torch.tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]], dtype=torch.float64), 0.0)
        greedy = greedy.tolist() if isinstance(greedy, torch.Tensor) else greedy
    except (IndexError, RuntimeError, ValueError) as e:
        greedy = f"{type(e).__name__}: {e}"
    if greedy != [[0, 1, 0], [1, 0, 0]]:
        raise Failed(f"at T=0 the rows [1, 3, 3] and [2, 0, 1] must give one-hot rows on their argmax, "
                     f"[[0, 1, 0], [1, 0, 0]] (a tie goes to the lower id, as greedy decoding's argmax); "
                     f"yours {greedy}")
    for temperature in (0.7, 0.0):
        probs = student.fn(logits.float(), temperature, 3, 0.9)
        if not isinstance(probs, torch.Tensor) or probs.dtype != torch.float64:
            raise Failed(f"float32 logits (what the models give) must come back as float64 probabilities, at "
                         f"T={temperature} too; yours {getattr(probs, 'dtype', type(probs).__name__)}: the "
                         "verifiers compare p with q in float64")


def claim_sampled_decoding_stays_exact_with_it(student):
    """sampled speculative decoding with it in place has exactly the target's distribution"""
    exactly_p(student, "rejection", n=400, what="decoding with your transform")
