"""Claims about the cost model (nanodflash/tools/cost_model.py): its formula counts what the module says,
its fit recovers known constants, and with datasheet constants a GPU step is priced as the paper's regime
needs (a 16-token verify about one plain step)."""

import pytest

from nanodflash.tools import cost_model as cm

TINY = dict(n_layer=2, n_embd=4, attn=4, kv=2, mlp=8, vocab=10)


def test_the_features_count_layers_flops_and_bytes_as_the_docstring_says():
    layers, flops, read = cm.features(TINY, rows=3, tokens=2, context=5, dtype_bytes=4)
    matmul = 2 * (4 * (2 * 4 + 2 * 2) + 3 * 4 * 8) + 4 * 10                 # 2 layers' projections + the head
    assert layers == 3, "overhead is paid per layer and once more for the embedding and the head"
    assert flops == 2 * matmul * 6 + 4 * 2 * 6 * 7 * 4, "flops: the projections, then attention over context"
    assert read == 4 * (matmul + 2 * 2 * 3 * 7 * 2), "bytes: each weight once, every row's keys and values"


def test_the_fit_recovers_known_constants_and_never_returns_a_negative_one():
    truth = [1e-4, 2e-10, 3e-9]
    points = [(cm.features(TINY, r, t, c, 4), cm.predict(truth, cm.features(TINY, r, t, c, 4)))
              for r in (1, 4, 32) for t in (1, 16) for c in (64, 512)]
    fitted = cm.fit(points)
    assert fitted == pytest.approx(truth, rel=1e-6), "the fit does not recover the constants it was made with"
    no_bytes = [(f, s - truth[2] * f[2] * 2) for f, s in points]             # a negative per-byte term fits
    assert min(cm.fit(no_bytes)) >= 0, "a negative constant was kept"


def test_a_gpu_verify_of_16_tokens_costs_about_one_plain_step_and_the_papers_tau_gives_about_5x():
    for name, (flop_rate, byte_rate) in cm.GPUS.items():
        plain, verify, draft, speedup = cm.gpu_table(flop_rate, byte_rate)
        assert 1 < verify / plain < 1.2, f"{name}: an 8B verify of 16 tokens should read the weights once"
        assert draft / plain < 0.3, f"{name}: a 5-layer drafter pass should cost a fraction of a step"
        assert 4 < speedup < 6, f"{name}: τ 6.49 should give about the paper's 4.86x, got {speedup:.2f}x"
    costs = cm.gpu_costs("H200 SXM", 16)
    assert costs[0] == 1 and costs == sorted(costs), "GPU step costs grow with the drafts"


def test_measuring_a_tiny_pair_gives_every_point_a_positive_time(target, drafter):
    points = cm.measure(target, drafter, n_calls=1)
    kinds = {kind for (kind, _), _, _ in points}
    assert kinds == {"fit", "held out"}
    fits = [(rows, c) for rows, c in cm.FIT + cm.HELD_OUT if c + max(cm.TOKENS) <= target.config.max_seq_len]
    assert len(points) == len(cm.TOKENS) * len(fits) + 1, "a point that fits the window is missing"
    assert all(s > 0 for _, _, s in points)
    assert min(cm.fit([(f, s) for (k, _), f, s in points if k == "fit"])) >= 0
