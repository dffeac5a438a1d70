"""Long generations: lossless for 300+ tokens up to the window, the window rule, and τ by position band."""

import pytest
import torch

from helpers import OracleDrafter, greedy_continuation, tiny_drafter, tiny_target
from nanodflash.dflash2 import DFlash2Config, DFlash2Drafter
from nanodflash.ext.plain_batch import generate_sequences
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.measure import BANDS, band_counts, format_bands, step_starts, tau_by_band
from nanodflash.train import DraftTraining, train_drafter

PROMPTS = [[7, 1, 4, 1, 5, 9, 2, 6], [5, 5, 20, 30, 40]]
WINDOW = 320                                 # max_seq_len of the long-generation target: > 300 new tokens fit
NEW = WINDOW - len(PROMPTS[0])               # 312: exactly fills the window after the first prompt

GREEDY_RUNS = []         # the long target's plain greedy runs, computed once for every kind and margin


def tiny_dflash2(target, seed=1, block_size=16):
    torch.manual_seed(seed)
    cfg = DFlash2Config.for_target(target.config, target.config.vocab_size - 1, n_layer=1,
                                   block_size=block_size, n_target_layers=2, selector_top_k=8,
                                   selector_rank=8, conv_group_size=8)
    return DFlash2Drafter(cfg, target).double().eval()


@pytest.fixture(scope="module")
def long_models():
    """A peaked tiny target with a 320-token window, and DFlash / DFlash 2 drafters trained briefly on its own
    64-token continuations (so they accept some blocks whole, some in part, some not at all, past position 64
    too)."""
    target = tiny_target(seed=3, head_scale=4.0, max_seq_len=WINDOW)
    ids = torch.randint(0, 62, (2000,), generator=torch.Generator().manual_seed(1))
    seqs = generate_sequences(target, ids, n_seqs=64, prompt_len=4, gen_len=60, batch_size=64,
                              log=lambda *_: None)
    drafters = {"dflash": tiny_drafter(target, block_size=16), "dflash2": tiny_dflash2(target)}
    for d in drafters.values():
        train_drafter(d, seqs, DraftTraining(steps=80, batch_size=8, n_anchors=8, lr=1e-2, min_anchor=3,
                                            log_every=10**6))
    return target, drafters


def random_prefix(rng, n):
    return int(torch.randint(0, n + 1, (1,), generator=rng))


@pytest.mark.parametrize("margin", [0, 1])               # the window filled exactly, and one spare position
@pytest.mark.parametrize("kind", ["dflash", "dflash2", "oracle_right_for_a_random_prefix"])
def test_greedy_speculative_equals_greedy_decoding_for_300_plus_tokens_up_to_the_window(long_models, kind,
                                                                                         margin):
    target, drafters = long_models
    drafter = drafters.get(kind) or OracleDrafter(target, 16, n_right=random_prefix)
    lengths = []
    for prompt in PROMPTS:
        n = WINDOW - len(prompt) - margin                       # >= 300 new tokens, `margin` spare positions
        ref = greedy_continuation(target, prompt, n, GREEDY_RUNS)     # plain greedy, shared by every kind
        for block_size in (4, 16):
            out, stats = speculative_generate(target, drafter, prompt, n, block_size=block_size)
            first = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
            assert out == ref, (f"{kind}, block_size={block_size}, window margin {margin}: speculative "
                                f"output diverged from greedy decoding at token {first}")
            assert len(out) == n == 1 + sum(stats.acceptance_lengths), \
                "stats must account for every emitted token"
            assert stats.target_cache.length == len(prompt) + n - 1, \
                "the target cache must end with the verified tokens"
            starts = step_starts(stats.acceptance_lengths)
            assert max(starts) > 240, "no step started past token 240"
            lengths += [(a, block_size) for a, start in zip(stats.acceptance_lengths, starts)
                        if start > 128]                          # steps past the old 128-token window
    assert any(1 < a < b for a, b in lengths), \
        f"partial acceptance past position 128 never exercised: {lengths}"
    assert any(a == 1 for a, _ in lengths), \
        f"zero-acceptance steps past position 128 never exercised: {lengths}"
    assert any(a == b for a, b in lengths), \
        f"whole-block acceptance past position 128 never exercised: {lengths}"


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_request_past_the_window_raises_the_window_error_for_both_decoders(long_models, kind):
    target, drafters = long_models
    drafter = drafters[kind]
    prompt = PROMPTS[0]
    for p, n in [(prompt, NEW + 1), (prompt * 40, 1), ([3] * (WINDOW - 1), 2), ([3] * WINDOW, 1)]:
        with pytest.raises(ValueError, match="exceeds the target's max_seq_len"):
            generate(target, p, n)
        with pytest.raises(ValueError, match="exceeds the target's max_seq_len"):
            speculative_generate(target, drafter, p, n)
    out, _ = speculative_generate(target, drafter, [3] * (WINDOW - 2), 2)
    assert len(out) == 2, "a request that exactly fills the window must still succeed"


# ----------------------------------------------------------------------------- τ by position band

def reference_tau_by_band(runs, bands):
    """Plain loops: lay every emitted token out with the step that emitted it, then read each step's first
    position."""
    tokens, steps = [0] * len(bands), [0] * len(bands)
    for lengths in runs:
        owner = [None]                                          # position 1: the prefill's token, no step
        for i, n in enumerate(lengths):
            owner += [i] * n
        for i, n in enumerate(lengths):
            first = owner.index(i) + 1                          # 1-based position of the step's first token
            for b, (lo, hi) in enumerate(bands):
                if lo < first <= hi:
                    tokens[b] += n
                    steps[b] += 1
    return {band: (tokens[b] / steps[b] if steps[b] else None) for b, band in enumerate(bands)}


@pytest.mark.parametrize("seed", range(5))
def test_tau_by_band_equals_a_plain_loops_reference(seed):
    g = torch.Generator().manual_seed(seed)
    runs = []
    for _ in range(4):
        lengths, total = [], 1
        limit = int(torch.randint(50, 600, (1,), generator=g))    # some runs end inside a band, some past 480
        while total < limit:
            lengths.append(int(torch.randint(1, 17, (1,), generator=g)))
            total += lengths[-1]
        runs.append(lengths)
    bands = BANDS if seed % 2 else ((0, 10), (10, 50), (50, 1000))
    got, want = tau_by_band(runs, bands), reference_tau_by_band(runs, bands)
    assert got.keys() == want.keys()
    for band in bands:
        assert (got[band] is None) == (want[band] is None), f"band {band}: {got[band]} vs {want[band]}"
        if got[band] is not None:
            assert abs(got[band] - want[band]) < 1e-12, \
                f"band {band}: {got[band]} vs the reference {want[band]}"


def test_a_step_belongs_to_the_band_of_its_first_token():
    # starts: 2, 97 (crosses nothing: 97 is band 2), 98, 99; the 200-token step starts at 99, stays in band 2
    assert step_starts([95, 1, 1, 200]) == [2, 97, 98, 99]
    assert band_counts([95, 1, 1, 200]) == [(95, 1), (202, 3), (0, 0)]
    # a step starting at 96 belongs to tokens 1-96 even though it runs past them
    assert band_counts([94, 10]) == [(104, 2), (0, 0), (0, 0)]
    assert tau_by_band([[94, 10]])[(96, 240)] is None
    assert format_bands(tau_by_band([[94, 10]])) == "tau by position: 1-96 52.00 | 97-240 - | 241-480 -"
    with pytest.raises(TypeError, match="list of runs"):
        tau_by_band([3, 1, 4])


def test_tau_by_band_of_an_always_right_drafter_is_the_block_size_in_every_band(long_models):
    target, _ = long_models
    _, stats = speculative_generate(target, OracleDrafter(target, 8), PROMPTS[0], NEW)
    taus = tau_by_band([stats.acceptance_lengths], bands=((0, 96), (96, 240), (240, 300)))
    assert all(t == 8 for t in taus.values()), f"an oracle accepts every block (8 tokens per step): {taus}"
