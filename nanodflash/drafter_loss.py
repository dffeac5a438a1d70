"""The drafter's training loss per block slot: slot k of a block anchored at a is labelled x_{a+k}, and the
slots' cross-entropies are averaged with the decay weights w_k (`loss_decay_weights`). DFlash's loss
and DFlash 2's (dflash2.py) both use it.
"""

import torch
import torch.nn.functional as F

from .distill import slot_mean


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
