"""Verification: which draft tokens does the target accept, and what token comes next?

Each rule gets n draft tokens and the target's view of n+1 positions: row i of `target_probs` is the
target's distribution for the token *after* the anchor and the first i drafts. It returns
(n_accepted, next_token): the drafts d_1..d_n_accepted are kept and `next_token` (the "bonus") is
emitted after them. Acceptance length for the step is n_accepted + 1.

- greedy_verify:    keep the longest prefix with d_i == argmax(target); bonus = the target's argmax there.
- match_verify:     sample y_i ~ p_i for every position; keep d_i while d_i == y_i; bonus = y at the
                    first mismatch. This is speculative sampling with a one-hot draft distribution
                    q = onehot(d_i): accept with prob min(1, p(d)/1) = p(d), and the residual
                    normalize(max(0, p - onehot(d))) is p with d removed, exactly what "sample y, and if
                    y != d emit y" produces. So the output has exactly the target's distribution.
- rejection_verify: the classic rule for drafts sampled from q_i: accept d_i with prob
                    min(1, p_i(d_i) / q_i(d_i)); on rejection emit a sample of normalize(max(0, p_i - q_i));
                    if all n are accepted, the bonus is a sample of p_n.
- multi_draft_verify: k drafts for ONE position, drawn independently from the same q (a node of a sampled
                    tree, sampled_tree.py): test them in turn, each against the residual the rejected ones
                    left (recursive rejection, as in SpecInfer); if all are rejected, sample the last
                    residual. With k = 1 it is rejection_verify's test at one position.
"""

import torch

from .sampling import sample


def accepted_prefix_length(draft_tokens, target_tokens):
    """Number of leading positions where draft_tokens[i] == target_tokens[i]: (n,) -> a 0-d tensor, or R rows
    at once, (R, n) -> (R,)."""
    n = draft_tokens.size(-1)
    same = (draft_tokens == target_tokens[..., :n]).long()
    return same.cumprod(-1).sum(-1)


def greedy_verify(draft_tokens, target_logits):
    """draft_tokens (n,), target_logits (n+1, V) -> (n_accepted, next_token), two ints.

    R blocks at once (ext/batch.py): draft_tokens (R, n), padded with -1 (which matches nothing) where a row
    has fewer drafts, and target_logits (R, n+1, V) -> (n_accepted (R,), next_token (R,)), two tensors."""
    pred = target_logits.argmax(-1)                                   # (..., n+1)
    n_acc = accepted_prefix_length(draft_tokens, pred)               # (...)
    bonus = pred.gather(-1, n_acc[..., None])[..., 0]                # (...): the target's token after them
    return (int(n_acc), int(bonus)) if draft_tokens.dim() == 1 else (n_acc, bonus)


def match_verify(draft_tokens, target_probs, generator=None):
    """draft_tokens (n,), target_probs (n+1, V) -> (n_accepted, next_token)."""
    y = sample(target_probs, generator)                                # (n+1,) one target sample per position
    n_acc = int(accepted_prefix_length(draft_tokens, y))
    return n_acc, int(y[n_acc])


def residual_distribution(p, q):
    """normalize(max(0, p - q)). If p == q there is no residual mass (and no rejection can happen)."""
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-300), p)


def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
    """draft_tokens (n,) drawn from draft_probs (n, V); target_probs (n+1, V) -> (n_accepted, next_token)."""
    n = draft_tokens.numel()
    u = torch.rand(n, generator=generator, dtype=torch.float64)         # one uniform per draft
    idx = torch.arange(n)
    p_d, q_d = target_probs[idx, draft_tokens], draft_probs[idx, draft_tokens]  # (n,), (n,)
    accept = u * q_d < p_d                                             # u < p/q without dividing
    n_acc = int(accept.long().cumprod(0).sum())
    if n_acc < n:
        return n_acc, int(sample(residual_distribution(target_probs[n_acc], draft_probs[n_acc]), generator))
    return n, int(sample(target_probs[n], generator))


def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
    """draft_tokens (k,), each drawn independently from draft_probs (V,); target_probs (V,)
    -> (index of the accepted draft, or -1 when all were rejected; the token emitted).

    r starts as p. Draft i is accepted with prob min(1, r(d_i) / q(d_i)); on rejection r becomes
    normalize(max(0, r - q)). Why the token has exactly p's distribution, by induction on k: for one
    draft, it is rejection_verify's argument with r in place of p (accepted tokens contribute min(r, q),
    rejections the remaining mass times the residual, and the two sum to r); with k drafts, the first test
    emits min(r, q) and passes the rest of r's mass on as the residual, which the k-1 drafts after it
    reproduce exactly. A repeated draft that was rejected before has r(d) = 0 by then (it was rejected, so
    r(d) < q(d)) and is rejected again: duplicates waste a test, never bias one.

    >>> p, q = torch.tensor([0.5, 0.5, 0.0]).double(), torch.tensor([0.0, 0.5, 0.5]).double()
    >>> multi_draft_verify(torch.tensor([1]), q, p)          # p(1) = q(1): always accepted
    (0, 1)
    >>> multi_draft_verify(torch.tensor([2, 1]), q, p)       # p(2) = 0: rejected, r = [1, 0, 0]; then 1 too
    (-1, 0)
    """
    r, q = target_probs, draft_probs
    u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)   # one uniform per draft
    for i, d in enumerate(draft_tokens.tolist()):
        if u[i] * q[d] < r[d]:                                              # u < r/q without dividing
            return i, d
        r = residual_distribution(r, q)
    return -1, int(sample(r, generator))
