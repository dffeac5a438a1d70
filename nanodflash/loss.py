"""The drafter's training loss, DFlash's and DFlash 2's (dflash2.py), per block slot: slot k of a block
anchored at a is labelled x_{a+k}, and the slots' cross-entropies are averaged with the decay weights w_k
(`loss_decay_weights`).

Distribution matching (the soft targets): optionally, the drafter also learns the target's next-token
*distribution*, not one token.

The rejection verifier accepts a draft d ~ q with probability min(1, p(d)/q(d)), so one slot accepts with
probability sum_x min(p(x), q(x)) = 1 - TV(p, q): what pays when sampling is q close to p, not q's argmax
right. Cross-entropy against the data's token makes q peaked on it; cross-entropy against the target's
distribution p (equivalently KL(p || q) up to a constant) makes q calibrated like p.

The target is frozen, so its distributions are computed once, in the same forward that gives the drafter's
features (`soft_targets`), and kept as the top m tokens of each position (m = 32 here; the rest of the mass
is small and renormalised away): probs (N, S, m) float32 and ids (N, S, m) int16, row j = p(x_{j+1} | x_<=j).
Temperature 1: training q ~ p at T=1 makes softmax(./T) of both match at any sampling temperature T.

- `mix_soft`: the DFlash slot loss (1 - beta) * CE(data token) + beta * CE(target's distribution).
- `candidate_soft_targets`: for the DFlash 2 selector, the target's probabilities of a slot's K candidates,
  renormalised over them (the selector's q lives on the candidates only).
"""

import torch
import torch.nn.functional as F

SOFT_TOP = 32           # tokens of the target's distribution kept per position


@torch.no_grad()
def soft_targets(logits, top=SOFT_TOP):
    """Target logits (N, S, V) -> (probs (N, S, m) float32, ids (N, S, m) int16): its top-m next-token
    probabilities at temperature 1 (not renormalised)."""
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(min(top, logits.size(-1)), dim=-1)
    return probs, ids.to(torch.int16)


def block_soft_targets(soft, anchors, block_size):
    """The target's distribution for every block slot k = 0..B-1 (the token at a+k, predicted at a+k-1;
    slot 0 has no loss and gets position a's): soft = (probs, ids), each (N, S, m) -> each (N, K, B, m)."""
    probs, ids = soft
    N, K = anchors.shape
    pos = (anchors[:, :, None]
           + torch.arange(block_size, device=anchors.device) - 1).clamp_min(0)  # (N, K, B)
    index = pos.flatten(1)[..., None].expand(-1, -1, probs.size(-1))            # (N, K*B, m)
    picked = [torch.gather(t.to(anchors.device), 1, index).view(N, K, block_size, -1)
              for t in (probs, ids.long())]                                     # (N, K*B, m) -> (N, K, B, m)
    return picked[0], picked[1]


def slot_mean(per_slot, weights, keep=None):
    """sum_k w_k x_k / sum_k w_k over the slots of per_slot (..., B), weights (B,): the decay-weighted mean
    every drafter loss takes; `keep` (bool (..., B)) leaves slots out."""
    w = weights.to(per_slot.device).expand_as(per_slot)
    if keep is not None:
        w = w * keep
    return (per_slot * w).sum() / w.sum().clamp_min(1e-12)


def soft_cross_entropy(scores, target_probs, weights, keep=None):
    """sum_k w_k * (-sum_c p_k(c) log softmax(scores_k)(c)) / sum_k w_k over the slots of (..., B, C).

    target_probs (..., B, C): each row a distribution over the C scores; `keep` (bool (..., B)) leaves slots
    out."""
    return slot_mean(-(target_probs * F.log_softmax(scores, dim=-1)).sum(-1),   # CE per slot (..., B)
                     weights, keep)


def mix_soft(hard, logits, soft, anchors, weights, soft_weight):
    """(1 - soft_weight) * hard + soft_weight * the cross-entropy of logits (N, K, B, V) against the target's
    top-m distribution (renormalised over its m tokens). Just `hard` when there are no soft targets."""
    if soft is None or soft_weight == 0:
        return hard
    probs, ids = block_soft_targets(soft, anchors, logits.size(2))                     # (N, K, B, m) each
    probs = (probs / probs.sum(-1, keepdim=True)).to(logits.dtype)
    logp = torch.gather(F.log_softmax(logits, dim=-1), -1, ids)                         # (N, K, B, m)
    # -(probs * logp).sum(-1): the cross-entropy per slot, (N, K, B)
    return (1 - soft_weight) * hard + soft_weight * slot_mean(-(probs * logp).sum(-1), weights)


def candidate_soft_targets(cand, probs, ids):
    """cand (..., K) candidate ids; the target's top-m (probs, ids) (..., m) of the same slots ->
    (the target's probability of each candidate renormalised over the K, (..., K); has_mass (...,) bool:
    some candidate is among the target's top m). Rows without mass are all zero."""
    same = cand[..., :, None] == ids[..., None, :]                                     # (..., K, m)
    p = (same * probs[..., None, :]).sum(-1)                                            # (..., K)
    total = p.sum(-1, keepdim=True)
    return p / total.clamp_min(1e-12), total[..., 0] > 0


def loss_decay_weights(block_size, gamma=None):
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1, and 0 for slot 0 (the anchor). Shape (B,).

    gamma defaults to the paper's choice: 7 for B=16, 5 for B=10, 4 for B=8 (else B/2, at least 1).
    """
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
    k = torch.arange(block_size, dtype=torch.float32)
    return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), torch.zeros(()))


def block_labels(input_ids, anchors, block_size):
    """x_{a+k} for every block slot k = 0..B-1: input_ids (N, S), anchors (N, K) -> (N, K, B)."""
    label_pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)  # (N, K, B)
    return torch.gather(input_ids, 1, label_pos.flatten(1)).view_as(label_pos)


def weighted_cross_entropy(logits, labels, weights, keep=None):
    """sum_k w_k CE(logits_k, labels_k) / sum_k w_k over slots (..., B).

    logits (..., B, C), labels (..., B), weights (B,); `keep` (bool, like labels) leaves slots out."""
    ce = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none").view_as(labels)
    return slot_mean(ce, weights, keep)
