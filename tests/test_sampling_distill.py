"""Distribution matching (loss.py): the soft targets are the target's own next-token distributions at
the right positions, the soft loss is smallest when q equals them, the selector's targets are the target's
probabilities of its candidates, and training with it brings q closer to p than training on tokens alone;
greedy/sampled data mixes come out in the asked proportion."""

import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.ext.plain_batch import generate_mix, generate_sequences
from nanodflash.loss import (
    block_soft_targets,
    candidate_soft_targets,
    loss_decay_weights,
    mix_soft,
    soft_targets,
)
from nanodflash.speculative import generate
from nanodflash.train import DraftTraining, sample_anchors, target_features, train_drafter


def test_soft_target_of_slot_k_is_the_targets_distribution_for_the_token_at_anchor_plus_k():
    target = tiny_target(seed=2)
    seqs = torch.randint(0, 60, (3, 20), generator=torch.Generator().manual_seed(0))
    _, (probs, ids) = target_features(target, seqs, [0, 2], soft=True)
    anchors = torch.tensor([[0, 5], [3, 12], [7, 1]])
    p, i = block_soft_targets((probs, ids), anchors, 8)                   # (3, 2, 8, m)
    logits, _ = target(seqs)
    for n in range(3):
        for b in range(2):
            for k in range(1, 8):
                full = torch.softmax(logits[n, anchors[n, b] + k - 1].float(), -1)    # p(x_{a+k} | x_<a+k)
                assert torch.allclose(p[n, b, k], full[i[n, b, k]]), f"slot {k} of block {b}: wrong position"
                assert torch.equal(i[n, b, k], full.topk(i.size(-1)).indices), f"slot {k}: not the top tokens"


def test_soft_loss_is_smallest_when_the_drafter_predicts_the_targets_distribution():
    torch.manual_seed(0)
    V, B = 6, 4
    logits_p = torch.randn(2, 7, V, dtype=torch.float64)                   # (N, S, V): a "target"
    soft = soft_targets(logits_p, top=V)                                   # keep all V: exact distributions
    anchors = torch.tensor([[1, 3], [0, 2]])
    weights = loss_decay_weights(B).double()
    p, ids = block_soft_targets(soft, anchors, B)                          # (N, K, B, V)
    exact = torch.zeros_like(p, dtype=torch.float64).scatter(-1, ids, p.double())
    best = mix_soft(torch.tensor(0.0), exact.log(), soft, anchors, weights, 1.0)
    for _ in range(5):
        other = exact.log() + 0.3 * torch.randn_like(exact)
        worse = mix_soft(torch.tensor(0.0), other, soft, anchors, weights, 1.0)
        assert worse > best, f"a drafter off the target's distribution scored {worse:.4f} <= {best:.4f}"
    assert mix_soft(torch.tensor(7.0), exact.log(), None, anchors, weights, 1.0) == 7.0, \
        "no soft targets: hard loss"


def test_selector_soft_target_is_the_targets_probability_of_each_candidate_renormalised():
    probs = torch.tensor([[0.5, 0.3, 0.1]])                                # the target's top 3 of one slot
    ids = torch.tensor([[4, 2, 9]])
    p, has = candidate_soft_targets(torch.tensor([[2, 7, 4]]), probs, ids)
    assert torch.allclose(p, torch.tensor([[0.3 / 0.8, 0.0, 0.5 / 0.8]])) and bool(has[0]), f"got {p}"
    p, has = candidate_soft_targets(torch.tensor([[1, 7, 8]]), probs, ids)
    assert not bool(has[0]) and p.sum() == 0, "candidates outside the target's top m carry no target"


def mean_overlap(drafter, seqs, n_anchors=8, min_anchor=3):
    """Mean over held-out slots of sum_x min(p(x), q(x)) at T=1: the rejection rule's acceptance per slot."""
    target, c = drafter.target, drafter.config
    g = torch.Generator().manual_seed(9)
    feats = target_features(target, seqs, c.target_layer_ids)
    anchors = sample_anchors(seqs.size(0), n_anchors, seqs.size(1), c.block_size, min_anchor, g)
    with torch.no_grad():
        q = torch.softmax(drafter(feats, seqs, anchors), -1)[:, :, 1:]     # (N, K, B-1, V)
        pos = anchors[:, :, None] + torch.arange(c.block_size - 1)         # slot k predicted at a+k-1
        # (N, K, B-1, V)
        p = torch.softmax(target(seqs)[0], -1)[torch.arange(seqs.size(0))[:, None, None], pos]
    return float(torch.minimum(p, q).sum(-1).mean())


def test_training_toward_the_targets_distribution_brings_q_closer_to_p_than_training_on_tokens():
    target = tiny_target(seed=4, head_scale=6.0)                           # peaked, yet a p to match
    ids = torch.randint(0, 62, (2000,), generator=torch.Generator().manual_seed(1))
    seqs = generate_sequences(target, ids, n_seqs=72, prompt_len=4, gen_len=28, temperature=1.0,
                              batch_size=36, log=lambda *_: None)
    train, held_out = seqs[:64], seqs[64:]
    overlap = {}
    for w in (0.0, 1.0):
        d = tiny_drafter(target, seed=5, block_size=4)
        train_drafter(d, train, DraftTraining(steps=80, batch_size=8, n_anchors=8, lr=1e-2, min_anchor=3,
                                              log_every=10**6, soft_weight=w))
        overlap[w] = mean_overlap(d, held_out)
    assert overlap[1.0] > overlap[0.0] + 0.02, f"sum min(p, q) per slot: tokens {overlap[0.0]:.3f}, " \
                                               f"distribution {overlap[1.0]:.3f}: the soft loss did not help"


def test_greedy_sampled_mix_has_the_asked_share_of_greedy_continuations():
    target = tiny_target(seed=2, head_scale=2.0)
    ids = torch.randint(0, 60, (500,), generator=torch.Generator().manual_seed(0))
    kw = dict(prompt_len=4, gen_len=10, temperature=1.0, batch_size=8, log=lambda *_: None)
    seqs = generate_mix(target, ids, 12, 0.25, seed=0, kw=kw)
    greedy = [s[4:] == generate(target, s[:4], 10) for s in seqs.tolist()]
    assert seqs.shape == (12, 14) and all(greedy[:3]), "the first quarter must be greedy continuations"
    assert sum(greedy[3:]) < 3, f"the sampled part looks greedy: {greedy}"
    assert torch.equal(generate_mix(target, ids, 5, 0.5, 0, {**kw, "temperature": 0.0}),
                       generate_sequences(target, ids, 5, seed=0, **{**kw, "temperature": 0.0})), \
        "temperature 0 must give the plain greedy data, whatever the fraction"
