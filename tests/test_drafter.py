"""Ladder 3: the drafter's training mask and train/infer consistency; the loss weights; layer choice."""

import math

import pytest
import torch

from helpers import tiny_drafter
from nanodflash.drafter import default_target_layer_ids, training_mask
from nanodflash.exercises.oracle import reference_mask
from nanodflash.loss import loss_decay_weights


@pytest.mark.parametrize("seed", range(5))
def test_training_mask_equals_plain_loops_reference(seed):
    g = torch.Generator().manual_seed(seed)
    S, B = 24, 4
    anchors = torch.randint(0, S - B + 1, (2, 5), generator=g)
    anchors[0, 0] = 0                       # an anchor at position 0: the block sees no context
    anchors[1, 1] = anchors[1, 2] = 7       # overlapping (even identical) blocks
    anchors[1, 3] = 9                       # overlapping 7..10
    assert torch.equal(training_mask(anchors, S, B), reference_mask(anchors, S, B)), \
        f"fast training mask differs from the plain-loops reference for anchors {anchors.tolist()}"


@pytest.mark.parametrize("n_layer", [1, 2])
def test_training_forward_logits_equal_inference_logits_for_the_same_anchor(target, n_layer):
    drafter = tiny_drafter(target, block_size=8, n_layer=n_layer)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 62, (2, 40), generator=g)
    _, feats = target(x, layer_ids=drafter.config.target_layer_ids)
    anchors = torch.tensor([[0, 5, 5, 32], [17, 3, 30, 11]])
    train_logits = drafter(feats, x, anchors)                                  # (N, K, B, V)
    for n in range(2):
        for k in range(anchors.size(1)):
            a = int(anchors[n, k])
            cache = drafter.new_cache(64)
            if a > 0:
                drafter.extend(cache, feats[n: n + 1, :a])                      # context = features before a
            block = torch.full((1, 8), drafter.config.mask_token_id)
            block[0, 0] = x[n, a]
            infer = drafter.block_logits(cache, block)[0]                      # (B, V)
            torch.testing.assert_close(infer, train_logits[n, k], rtol=0, atol=1e-10,
                                       msg=f"train/infer mismatch for sequence {n}, anchor {a}")


def test_context_extended_in_pieces_equals_context_extended_at_once(target, drafter):
    x = torch.randint(0, 62, (1, 30))
    _, feats = target(x, layer_ids=drafter.config.target_layer_ids)
    whole, pieces, flushed = drafter.new_cache(64), drafter.new_cache(64), drafter.new_cache(64)
    drafter.extend(whole, feats)
    for a, b in [(0, 7), (7, 8), (8, 30)]:
        drafter.extend(pieces, feats[:, a:b])   # queued, projected by the draft pass
        drafter.extend(flushed, feats[:, a:b])
        drafter.project_context(flushed)                                                  # projected at once
    block = torch.tensor([[5] + [drafter.config.mask_token_id] * 15])
    ref = drafter.block_logits(whole, block)
    torch.testing.assert_close(drafter.block_logits(pieces, block), ref, rtol=0, atol=1e-12,
                               msg="context queued in pieces drafts differently from context given at once")
    torch.testing.assert_close(drafter.block_logits(flushed, block), ref, rtol=0, atol=1e-12,
                               msg="context projected before the draft pass drafts differently from "
                                   "context projected in it")
    assert whole.length == pieces.length == flushed.length == 30, \
        "the context length must count every verified position"


def test_drafting_leaves_the_context_cache_untouched(target, drafter):
    x = torch.randint(0, 62, (1, 10))
    _, feats = target(x, layer_ids=drafter.config.target_layer_ids)
    cache = drafter.new_cache(64)
    drafter.extend(cache, feats)
    drafter.project_context(cache)
    before = cache.k[:, :, :, :10].clone()
    drafter.block_logits(cache, torch.tensor([[3] + [drafter.config.mask_token_id] * 15]))
    assert cache.length == 10, \
        "drafting must not grow the context cache (block K/V are scratch past its length)"
    assert torch.equal(cache.k[:, :, :, :10], before), "drafting must not alter cached context keys"


def test_loss_decay_weights_match_the_formula_and_slot_zero_has_no_loss():
    for B, gamma in [(16, 7), (10, 5), (8, 4)]:
        w = loss_decay_weights(B)
        assert w[0] == 0, "slot 0 (the anchor) must carry no loss"
        for k in range(1, B):
            assert math.isclose(float(w[k]), math.exp(-(k - 1) / gamma), rel_tol=1e-6), \
                f"w_{k} wrong for B={B}"
    assert math.isclose(float(loss_decay_weights(6, gamma=2.0)[3]), math.exp(-1.0), rel_tol=1e-6)


def test_loss_is_the_decay_weighted_cross_entropy_against_x_a_to_x_a_plus_b(target, drafter):
    x = torch.randint(0, 62, (1, 40))
    _, feats = target(x, layer_ids=drafter.config.target_layer_ids)
    anchors = torch.tensor([[3, 20]])
    w_real = loss_decay_weights(16)
    loss, out = drafter.loss(feats, x, anchors, w_real)
    logits, labels = out["logits"], out["labels"]
    assert torch.equal(labels[0, 0], x[0, 3:19]) and torch.equal(labels[0, 1], x[0, 20:36]), \
        "labels must be x[a : a+B]"
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 2), labels.flatten(),
                                           reduction="none").view(1, 2, 16)
    manual = (ce * w_real).sum() / (2 * w_real.sum())
    torch.testing.assert_close(loss, manual.to(loss.dtype),
                               msg="loss is not the decay-weighted mean over slots 1..B-1")


@pytest.mark.parametrize("L,n,expected", [(36, 5, [1, 9, 17, 25, 33]), (6, 1, [3]), (8, 3, [1, 3, 5]),
                                          (4, 2, [0, 3]), (3, 2, [0, 2])])
def test_target_layer_ids_follow_the_paper_and_a_documented_rule_for_shallow_targets(L, n, expected):
    assert default_target_layer_ids(L, n) == expected
