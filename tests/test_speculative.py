"""Ladder 5: greedy speculative decoding is token-identical to greedy decoding, whoever drafts."""

import pytest
import torch

from helpers import OracleDrafter, tiny_drafter, tiny_target
from nanodflash.speculative import generate, speculative_generate

BLOCK_SIZES = [1, 2, 4, 8, 16]
PROMPTS = [[3], [7, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))]


def random_prefix(rng, n):
    return int(torch.randint(0, n + 1, (1,), generator=rng))


def drafters(target, block_size):
    return {
        "untrained": tiny_drafter(target, block_size=16),
        "always_right": OracleDrafter(target, 16),
        "right_for_a_random_prefix": OracleDrafter(target, 16, n_right=random_prefix),
    }


# block 1 never drafts: one drafter covers it
CASES = [(kind, b) for kind in ("untrained", "always_right", "right_for_a_random_prefix") for b in BLOCK_SIZES
         if b > 1 or kind == "untrained"]


@pytest.mark.parametrize("kind,block_size", CASES, ids=[f"{k}-{b}" for k, b in CASES])
def test_greedy_speculative_equals_greedy_decoding(target, block_size, kind):
    drafter = drafters(target, block_size)[kind]
    taus = []
    for prompt in PROMPTS:
        ref = generate(target, prompt, 40)
        out, stats = speculative_generate(target, drafter, prompt, 40, block_size=block_size)
        assert out == ref, \
            f"{kind} drafter, block_size={block_size}: speculative output diverged from greedy decoding"
        assert len(out) == 1 + sum(stats.acceptance_lengths), "stats must account for every emitted token"
        assert all(1 <= a <= block_size for a in stats.acceptance_lengths), \
            "a step emits 1..block_size tokens"
        taus += stats.acceptance_lengths
    if kind == "always_right":   # every step but the (shrunken) last accepts the whole block
        assert sum(a == block_size for a in taus) >= len(taus) - len(PROMPTS), \
            f"oracle drafts were rejected: {taus}"
    if kind == "right_for_a_random_prefix" and block_size >= 4:
        assert any(1 < a < block_size for a in taus), "partial acceptance was never exercised"
        assert any(a == 1 for a in taus), "zero-acceptance steps were never exercised"


def test_untrained_drafter_accepts_almost_nothing(target, drafter):
    _, stats = speculative_generate(target, drafter, PROMPTS[1], 60)
    assert stats.tau < 1.5, f"an untrained drafter should get tau ~1, got {stats.tau:.2f}"


def test_caches_after_a_run_hold_exactly_the_verified_tokens_and_continue_like_a_fresh_prefill(
        target, drafter):
    prompt = PROMPTS[1]
    oracle = OracleDrafter(target, 8, n_right=random_prefix)
    for d in (drafter, oracle):
        out, stats = speculative_generate(target, d, prompt, 33, block_size=8)
        cache = stats.target_cache
        # every emitted token but the last (the pending bonus, not yet fed) is in the target cache
        assert cache.length == len(prompt) + len(out) - 1, \
            f"target cache length {cache.length} != verified tokens"
        logits, _ = target(torch.tensor([[out[-1]]]), cache)
        fresh, _ = target(torch.tensor([prompt + out]))
        torch.testing.assert_close(logits[0, -1], fresh[0, -1], rtol=0, atol=1e-10,
                                   msg="continuing from the speculative cache differs from a fresh prefill")
    assert stats.draft_cache == prompt + out[:-1], "the drafter's context must be exactly the verified tokens"
    _, stats = speculative_generate(target, drafter, prompt, 33, block_size=8)
    assert stats.draft_cache.length == len(prompt) + 33 - 1, \
        "drafter context cache must hold one entry per verified token"


def test_drafter_context_cache_matches_a_fresh_extend(target, drafter):
    prompt = PROMPTS[2]
    out, stats = speculative_generate(target, drafter, prompt, 20, block_size=4)
    seq = prompt + out[:-1]
    _, feats = target(torch.tensor([seq]), layer_ids=drafter.config.target_layer_ids)
    fresh = drafter.new_cache(128)
    drafter.extend(fresh, feats)
    drafter.project_context(fresh)
    drafter.project_context(stats.draft_cache)      # the last verified positions are still queued
    n = len(seq)
    torch.testing.assert_close(stats.draft_cache.k[:, :, :, :n], fresh.k[:, :, :, :n], rtol=0, atol=1e-10,
                               msg="incremental drafter context K differs from projecting the whole "
                                   "context at once")


@pytest.mark.parametrize("block_size", [4, 16])
def test_max_new_tokens_is_honoured_exactly_even_when_whole_blocks_are_accepted(target, block_size):
    oracle = OracleDrafter(target, 16)
    for n in [1, 2, 5, 16, 17, 23]:
        out, _ = speculative_generate(target, oracle, PROMPTS[1], n, block_size=block_size)
        assert len(out) == n, f"asked for {n} tokens, got {len(out)}"


def test_stop_token_ends_generation_right_after_it(target):
    oracle = OracleDrafter(target, 16)
    ref = generate(target, PROMPTS[1], 40)
    stop = ref[9]
    expected = ref[: ref.index(stop) + 1]
    out, stats = speculative_generate(target, oracle, PROMPTS[1], 40, block_size=16, stop_token_ids=[stop])
    assert out == expected, f"expected generation to end right after the first stop token {stop}"
    assert stats.accepted_drafts == [len(out) - 1], \
        "the stop fell among the first block's drafts: that step emitted drafts only, no bonus"
    assert generate(target, PROMPTS[1], 40, stop_token_ids=[stop]) == expected, \
        "plain generate must stop the same way"


def test_stop_token_as_the_first_token_stops_immediately(target, drafter):
    first = generate(target, PROMPTS[0], 1)[0]
    out, stats = speculative_generate(target, drafter, PROMPTS[0], 10, stop_token_ids=[first])
    assert out == [first] and stats.acceptance_lengths == [], "a stop token from the prefill must end the run"


def test_a_deeper_target_with_gqa_is_lossless_too():
    target = tiny_target(seed=5, n_layer=5, n_head=4, n_kv_head=1)
    drafter = tiny_drafter(target, block_size=8, n_layer=2)
    for prompt in PROMPTS:
        assert speculative_generate(target, drafter, prompt, 30)[0] == generate(target, prompt, 30)
