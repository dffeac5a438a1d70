"""The claims of the training exercises: training_mask (what a block may see) and loss_decay_weights (the
paper's decay along the block)."""

import math

import torch

from ..loss import loss_decay_weights
from .check import BrokenContract, Failed
from .oracle import reference_mask

# (anchors (N, K), seq_len, block_size): an anchor at 0 (no context), overlapping and identical blocks
MASK_CASES = [([[0, 5, 9], [7, 7, 2]], 16, 4), ([[3, 11], [0, 8]], 20, 5), ([[6]], 12, 3)]


def describe_mask_error(anchors, seq_len, B, n, q, j, yours, row=None):
    """What it means that the student's mask says `yours` at row n, query q, key j; row: the student's whole
    mask row of that query (to tell another block's anchor from an off-by-one)."""
    b, i = divmod(q, B)
    a = anchors[n][b]
    who = f"slot {i} of block {b} (anchor at position {a}, sequence {n})"
    seen = None if row is None else [k for k in range(seq_len) if bool(row[k])]
    other = [b2 for b2, a2 in enumerate(anchors[n]) if a2 != a and seen == list(range(a2))]
    if j < seq_len and other:
        return (f"{who} sees the context of block {other[0]}'s anchor (positions < {anchors[n][other[0]]}) "
                f"instead of its own: each query takes the anchor of its own block, anchors[n, q // B]")
    if j < seq_len:
        if yours and j == a:
            return (f"{who} sees context position {a}, its own anchor's position: the anchor is the block's "
                    f"slot 0, already in the block; the context is the target's features at positions < {a}")
        if yours:
            return (f"{who} sees context position {j}, after its anchor: the features of tokens the block is "
                    "trained to predict leak into training")
        return f"{who} cannot see context position {j}, before its anchor: it must see all of positions < {a}"
    b2 = (j - seq_len) // B
    if b2 != b:
        return (f"{who} {'sees' if yours else 'cannot see'} the slots of block {b2}: a block sees every slot "
                "of its own block and none of the others (each block is drafted alone at inference)")
    return f"{who} cannot see slot {(j - seq_len) % B} of its own block: slots inside a block see each other"


def claim_training_mask_equals_the_plain_loop_reference(student):
    """equals the plain-loop reference: context before the anchor, and the block's own slots only"""
    for anchors, seq_len, B in MASK_CASES:
        a = torch.tensor(anchors)
        want = reference_mask(a, seq_len, B)
        got = student.fn(a, seq_len, B)
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise BrokenContract(f"for anchors of shape {tuple(a.shape)}, seq_len {seq_len}, block_size {B} "
                                 f"the mask must have shape {tuple(want.shape)} (N, K*B, S + K*B); yours has "
                                 f"{tuple(getattr(got, 'shape', ()))}")
        if got.dtype != torch.bool:
            raise BrokenContract(f"the mask must be a bool tensor (True = may see); yours is {got.dtype}")
        wrong = (got != want).nonzero()
        if len(wrong):
            n, q, j = (int(x) for x in wrong[0])
            raise Failed(describe_mask_error(anchors, seq_len, B, n, q, j, bool(got[n, q, j]), got[n, q]))


DECAY_CASES = [(16, None), (16, 7.0), (8, None), (10, None), (12, None), (5, None), (7, None), (4, 1.0),
               (16, 2.0)]


def claim_training_mask_is_made_on_the_anchors_device(student):
    """is made on the anchors' device (the meta device, shapes without data, stands in for a GPU)"""
    anchors = torch.tensor([[0, 5, 9]], device="meta")
    try:
        got = student.fn(anchors, 16, 4)
    except RuntimeError as e:
        raise Failed(f"with anchors on another device ('meta' here, as a GPU's would be) it raised: {e}. "
                     "Build every tensor on anchors.device (torch.arange(..., device=anchors.device)) and "
                     "read no anchor back into Python (.tolist(), int(), .item()): the meta device holds no "
                     "data"
                     ) from None
    if not isinstance(got, torch.Tensor) or got.device != anchors.device or got.shape != (1, 12, 28):
        raise BrokenContract(f"with anchors on the meta device the mask must be a (1, 12, 28) tensor there "
                             f"too; yours {getattr(got, 'shape', type(got).__name__)} on "
                             f"{getattr(got, 'device', None)}")


def claim_decay_weights_follow_the_papers_formula(student):
    """w_k = exp(-(k-1)/gamma) for slots k >= 1, 0 for the anchor; the paper's gamma by default"""
    for B, gamma in DECAY_CASES:
        want = loss_decay_weights(B, gamma)
        got = student.fn(B, gamma)
        setting = f"block_size={B}, gamma={gamma}"
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise BrokenContract(f"for {setting} it must return a tensor of shape ({B},), one weight per "
                                 f"slot; got {getattr(got, 'shape', type(got).__name__)}")
        got = got.double()
        if got[0] != 0:
            raise Failed(f"slot 0's weight is {float(got[0]):.3f} ({setting}): slot 0 is the anchor, a known "
                         "token, so it has no loss: weight 0")
        if torch.allclose(got, want.double(), atol=1e-6):
            continue
        g = gamma if gamma is not None else {16: 7.0, 10: 5.0, 8: 4.0}.get(B, max(1.0, B / 2))
        if abs(float(got[1]) - math.exp(-1 / g)) < 1e-6:
            raise Failed(f"slot 1's weight is exp(-1/gamma) = {float(got[1]):.3f} ({setting}): the decay "
                         "starts at 1 on slot 1, the first draft: exp(-(k-1)/gamma), not exp(-k/gamma)")
        if got.sum() > 0 and torch.allclose(got / got.sum(), want.double() / want.sum(), atol=1e-6):
            raise Failed(f"for {setting} yours are the paper's weights times {float(got[1]):.4f} (scaled?): "
                         "the loss is a weighted mean, so a constant factor does not change it, but the "
                         "contract is the weights themselves, w_k = exp(-(k-1)/gamma), 1 on slot 1")
        if abs(float(got[2]) - math.exp(-g)) < 1e-6:
            raise Failed(f"slot 2's weight is exp(-gamma) = {float(got[2]):.3g} ({setting}): gamma is the "
                         "decay length in slots, so divide by it, exp(-(k-1)/gamma), not multiply")
        if gamma is None:
            raise Failed(f"with gamma=None and block_size={B} the weights must use the paper's gamma = {g:g} "
                         f"(7 for B=16, 5 for 10, 4 for 8, else B/2); yours {got.tolist()}")
        raise Failed(f"for {setting}: yours {[round(x, 4) for x in got.tolist()]}, expected "
                     f"{[round(x, 4) for x in want.tolist()]}")
