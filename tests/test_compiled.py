"""The compiled drafter pass (compiled.py): lossless greedy and sampled decoding through it, the same hidden
states as the eager pass, and no compilation once every size it meets has its graph.

The smoke run's models compile once for the whole file (each graph takes seconds); the file runs on one
worker (conftest.SLOW_FILES hands it out early).
"""

from functools import partial

import pytest
import torch

import nanodflash
from nanodflash.exercises.models import small_drafters, small_target
from nanodflash.exercises.oracle import (
    ALPHA,
    N_OTHER_PATHS,
    PROMPT,
    H,
    chi_square_p_value,
    exact_distribution,
)
from nanodflash.ext import compiled
from nanodflash.ext.block_policy import auto
from nanodflash.ext.compiled import compile_drafter
from nanodflash.ext.step_costs import cost_key, costs_for, linear_costs, use_table
from nanodflash.speculative import generate, speculative_generate
from nanodflash.store.run_folder import read_costs
from nanodflash.tools.baselines import NoFeatureDrafter
from nanodflash.tools.calibrate import calibrate
from nanodflash.tools.prompt_lookup import PromptLookupDrafter

WARM_TOKENS = 12        # new tokens of the warm-up's decodes
TEXTS = ["def f(x):\n    return", "import os\n", "class Point:\n    def __init__(self, x, y):"]


@pytest.fixture(scope="module")
def smoke(smoke_out):
    """The smoke run's target and DFlash 2 drafter (block size 8), and token ids of three code prompts."""
    tok, target, drafter = nanodflash.load(str(smoke_out))
    return target, drafter, [tok.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def warmed(smoke):
    """The smoke models after one compiled decode at every block size (2 to 8): each graph the pass needs
    exists. Also how many graphs the warm-up compiled (no other file compiles, so at least one)."""
    target, drafter, prompts = smoke
    before = compiled.graphs_compiled()
    for b in range(2, 9):
        speculative_generate(target, compile_drafter(drafter), prompts[0], WARM_TOKENS, block_size=b)
    return target, drafter, prompts, compiled.graphs_compiled() - before


def context_cache(target, drafter, ids, compiled_pass):
    ids = torch.tensor([ids])
    _, feats = target(ids, layer_ids=drafter.config.target_layer_ids)
    cache = compiled.new_cache(drafter, 64) if compiled_pass else drafter.new_cache(64)
    drafter.extend(cache, feats, ids)
    drafter.project_context(cache)
    return cache


# auto with costs at which drafting pays (the smoke run's own table is timed in 3 calls: any shape)
@pytest.mark.parametrize("block_size", [8, 3, partial(auto, costs=linear_costs(8, 1.05, 0.0))],
                         ids=["8", "3", "auto"])
def test_compiled_greedy_speculative_equals_greedy_decoding(warmed, block_size):
    target, drafter, prompts, _ = warmed
    accepted = 0
    for prompt in prompts:
        plain = generate(target, prompt, 24)
        out, stats = speculative_generate(target, compile_drafter(drafter), prompt, 24, block_size=block_size)
        assert out == plain, f"compiled B={block_size}, prompt {prompt}: the output is not plain greedy's"
        accepted += sum(a - 1 for a in stats.acceptance_lengths)
    assert accepted > 20, f"compiled B={block_size}: {accepted} drafts kept, too few to test the verify"


@torch.no_grad()                                   # as the decoders run the pass
def test_the_compiled_pass_gives_the_eager_pass_hidden_states(warmed):
    target, drafter, prompts, _ = warmed
    ids = prompts[2] + prompts[1]
    eager = drafter.slot_hidden(context_cache(target, drafter, ids, False), ids[-1], 6)
    fast = drafter.slot_hidden(context_cache(target, drafter, ids, True), ids[-1], 6)
    assert torch.allclose(fast, eager, atol=1e-5), \
        f"compiled and eager hidden states differ by {(fast - eager).abs().max():.2e}"


@torch.no_grad()
def test_the_mask_hides_the_positions_the_cache_has_not_filled(warmed):
    target, drafter, prompts, _ = warmed
    ids = prompts[2]
    clean = context_cache(target, drafter, ids, True)
    junk = context_cache(target, drafter, ids, True)
    junk.k[:, :, :, len(ids):] = 3.0                     # what an earlier, longer context could leave behind
    junk.v[:, :, :, len(ids):] = -2.0
    hidden = drafter.slot_hidden(clean, ids[-1], 5)
    assert torch.allclose(drafter.slot_hidden(junk, ids[-1], 5), hidden, atol=1e-5), \
        "the compiled pass read cache positions past the context"
    x = target.embed_tokens(drafter.mask_block(junk, ids[-1], 5))                  # the control: no mask
    cos, sin = drafter.rope_at(torch.arange(len(ids), len(ids) + 6), x.dtype)
    seen = drafter.block_pass(x, cos, sin, junk.by_layer)[0, 1:]
    assert not torch.allclose(seen, hidden, atol=1e-3), "the junk should change a pass that sees all of it"


def test_a_compiled_decode_that_meets_no_new_size_compiles_nothing(warmed):
    target, drafter, prompts, warm_up_graphs = warmed
    assert warm_up_graphs > 0, "the warm-up's first compiled decodes compiled no graph: the count is blind"
    before, window = compiled.graphs_compiled(), target.config.max_seq_len
    for prompt, n in zip(prompts, (30, 21, 20)):        # other prompts and lengths, in the warm-up's buffer
        warm = len(prompts[0]) + WARM_TOKENS
        assert compiled.buffer_length(len(prompt) + n, window) == compiled.buffer_length(warm, window)
        for b in (8, 5, 2, auto):
            speculative_generate(target, compile_drafter(drafter), prompt, n, block_size=b)
    assert compiled.graphs_compiled() == before, \
        f"{compiled.graphs_compiled() - before} graphs compiled after the warm-up"


def test_compiled_sampled_output_has_exactly_the_targets_distribution():
    # a one-layer DFlash drafter of the enumerable float64 pair: its pass compiles in seconds (a DFlash 2 one
    # takes a graph more for its convolution at b = 2); DFlash 2's compiled pass is the greedy tests', and
    # what sampling adds to it, the selector and the walk, runs eager either way
    target = small_target()
    drafter = small_drafters(target)["dflash"]
    exact = exact_distribution(target, 1.0, None, None)
    g, counts, lengths, before = torch.Generator().manual_seed(3), {}, [], compiled.graphs_compiled()
    for _ in range(N_OTHER_PATHS):
        out, stats = speculative_generate(target, compile_drafter(drafter), PROMPT, H, block_size=4,
                                          temperature=1.0, verifier="rejection", generator=g)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        lengths += stats.acceptance_lengths
    assert compiled.graphs_compiled() > before, "the float64 drafter ran no compiled graph of its own"
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), "both outcomes must occur"
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p > ALPHA, f"compiled rejection sampling: chi-square p={p:.2e}, not the target's distribution"


@pytest.mark.parametrize("kind", ["prompt lookup", "nofeat"])
def test_a_drafter_without_the_compiled_pass_refuses_to_compile(smoke, kind):
    target, drafter, prompts = smoke
    other = (PromptLookupDrafter(target, 4) if kind == "prompt lookup"
             else NoFeatureDrafter(drafter.config, target))
    with pytest.raises(ValueError, match="no pass to compile"):
        speculative_generate(target, compile_drafter(other), prompts[0], 8)


def test_calibrate_compile_writes_a_batch_1_table_that_only_compiled_decoding_reads(warmed, smoke_out):
    target, drafter, _, _ = warmed
    # one thread tried: the key is then the suite's own (calibration picks the faster count of the moment)
    entry = calibrate(target, drafter, n_calls=3, log=lambda line: None, compiled=True, max_threads=1)
    assert entry["key"] == cost_key(target, compiled=True) != cost_key(target), entry["key"]
    assert set(entry["costs"]["greedy"]) == {"1"}, "the batched decoder has no compiled pass to time"
    use_table(drafter, [entry])
    try:
        assert costs_for(drafter, compiled=True) == entry["costs"]["greedy"]["1"], "compiled: its own table"
        assert costs_for(drafter) != entry["costs"]["greedy"]["1"], "eager decoding read the compiled table"
    finally:
        use_table(drafter, read_costs(str(smoke_out)))                   # what nanodflash.load gave it


def test_compiled_auto_decides_by_the_compiled_table_and_eager_auto_by_the_eager_one(warmed, smoke_out):
    target, drafter, prompts, _ = warmed
    B = drafter.config.block_size
    dear = [1.0] + [100.0] * (B - 1)                         # in the compiled table no draft ever pays
    cheap = linear_costs(B, 1.01, 0.0)                       # in the eager one every draft does
    entries = [dict(key=cost_key(target, compiled=compiled), block_size=B,
                    costs=dict(greedy={"1": table}, sampled={"1": table}))
               for compiled, table in ((False, cheap), (True, dear))]
    use_table(drafter, entries)
    try:
        _, fast = speculative_generate(target, compile_drafter(drafter), prompts[0], 20, block_size=auto)
        _, eager = speculative_generate(target, drafter, prompts[0], 20, block_size=auto)
    finally:
        use_table(drafter, read_costs(str(smoke_out)))
    assert set(fast.block_sizes) == {1}, f"compiled auto drafted against its table: {fast.block_sizes}"
    assert max(eager.block_sizes) > 1, f"eager auto read the compiled table: {eager.block_sizes}"
