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

    R blocks at once (batch.py): draft_tokens (R, n), padded with -1 (which matches nothing) where a row has
    fewer drafts, and target_logits (R, n+1, V) -> (n_accepted (R,), next_token (R,)), two tensors."""
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
