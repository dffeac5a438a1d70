"""Prompt lookup: the n-gram match equals a plain-loops reference, its drafts are exactly the copied
tokens, and greedy speculative decoding with it is token-identical to plain greedy decoding (sampled: exact
with top-k and top-p, in test_sampling_kinds.py)."""

import random

import pytest
import torch

from helpers import tiny_target
from nanodflash.sampling import DraftRule
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.prompt_lookup import PromptLookupDrafter, lookup


def reference_lookup(tokens, n_draft, max_ngram):
    """Every (m, start) with tokens[start:start+m] == the last m tokens and start < len - m (an EARLIER
    occurrence), checked element by element; the winner has the largest m, then the largest start."""
    n, best = len(tokens), None
    for m in range(1, max_ngram + 1):
        for start in range(0, n - m):
            same = True
            for i in range(m):
                if tokens[start + i] != tokens[n - m + i]:
                    same = False
            if same and (best is None or (m, start) > best):
                best = (m, start)
    if best is None:
        return []
    m, start = best
    out = []
    for j in range(start + m, min(start + m + n_draft, n)):
        out.append(tokens[j])
    return out


HAND_MADE = [   # (tokens, n_draft, max_ngram, expected, what it shows)
    ([1, 2, 3, 4], 5, 3, [], "no earlier occurrence of even the last token: no drafts"),
    ([], 5, 3, [], "empty context: no drafts"),
    ([7], 5, 3, [], "one token has nothing before it: no drafts"),
    ([1, 5, 6, 1, 7, 8, 1], 2, 1, [7, 8], "the newest occurrence wins (1 at position 3, not 0)"),
    ([2, 3, 9, 4, 3, 8, 2, 3], 3, 2, [9, 4, 3], "a 2-gram match beats a newer 1-gram match"),
    ([2, 3, 9, 4, 3, 8, 2, 3], 3, 1, [8, 2, 3], "with max_ngram=1 the newest 1-gram match wins"),
    ([4, 1, 2, 3, 5, 1, 2, 3], 4, 3, [5, 1, 2, 3], "the longest n-gram (3) is tried first"),
    ([1, 2, 1], 10, 3, [2, 1], "fewer drafts than asked when the text ends"),
    ([6, 6, 6, 6], 10, 3, [6], "an occurrence may overlap the suffix: 6 6 6 at 0 is followed by one 6"),
    ([1, 2, 1, 2], 0, 3, [], "n_draft=0: no drafts"),
]


@pytest.mark.parametrize("tokens,n_draft,max_ngram,expected,what", HAND_MADE)
def test_lookup_on_hand_made_lists_matches_the_rule_and_the_plain_loops_reference(tokens, n_draft, max_ngram,
                                                                                   expected, what):
    assert reference_lookup(tokens, n_draft, max_ngram) == expected, \
        f"reference disagrees with the hand case: {what}"
    assert lookup(tokens, n_draft, max_ngram) == expected, \
        f"lookup({tokens}, {n_draft}, {max_ngram}) is off: {what}"


def test_lookup_equals_the_plain_loops_reference_on_random_lists():
    rng = random.Random(0)
    for _ in range(2000):
        tokens = [rng.randrange(rng.choice([2, 4, 8])) for _ in range(rng.randrange(0, 30))]
        n_draft, max_ngram = rng.randrange(0, 12), rng.randrange(1, 5)
        assert lookup(tokens, n_draft, max_ngram) == reference_lookup(tokens, n_draft, max_ngram), \
            f"lookup differs from the plain-loops reference on {tokens}, n_draft={n_draft}, " \
            f"max_ngram={max_ngram}"


def test_prompt_lookup_drafter_drafts_exactly_the_copied_tokens(target):
    pl = PromptLookupDrafter(target, n_draft=4, max_ngram=2)
    assert pl.block_size == 5 and list(pl.target_layer_ids) == [0], (pl.block_size, pl.target_layer_ids)
    cache = pl.new_cache(64)
    pl.extend(cache, None, torch.tensor([[3, 9, 4, 1, 2, 5, 9]]))
    seen = []

    def choose(logits):
        seen.append(logits)
        return DraftRule(0.0)(logits)
    tokens, q = pl.draft(cache, 4, 4, choose)                       # context ... 9 | 4: "9 4" occurred at 1
    assert tokens.tolist() == [1, 2, 5, 9] and q is None, \
        f"drafted {tokens.tolist()}, want the copy [1, 2, 5, 9]"
    assert seen[0].shape == (4, target.config.vocab_size), \
        f"choose got logits of shape {tuple(seen[0].shape)}"
    tokens, _ = pl.draft(cache, 60, 4, choose)                     # 60 never occurred
    assert tokens.numel() == 0 and seen[1].shape == (0, target.config.vocab_size), \
        "no match must draft nothing"
    assert cache == [3, 9, 4, 1, 2, 5, 9], "drafting must not change the verified context"


def test_greedy_speculative_decoding_with_prompt_lookup_is_token_identical_to_plain_greedy():
    target = tiny_target(seed=3, head_scale=4.0)
    prompts = [[5, 6, 7, 8] * 5, [1, 2, 3, 1, 2, 3, 9, 1, 2], [10, 20, 30, 40, 50]]
    accepted = []
    for n_draft in (1, 4, 10):
        for prompt in prompts:
            out, stats = speculative_generate(target, PromptLookupDrafter(target, n_draft), prompt, 60)
            assert out == generate(target, prompt, 60), \
                f"prompt lookup k={n_draft} broke greedy equality on {prompt}"
            assert len(out) == 1 + sum(stats.acceptance_lengths), "stats must account for every emitted token"
            accepted += stats.accepted_drafts
    assert max(accepted) > 0, "no lookup draft was ever accepted: the test does not exercise acceptance"
    assert min(accepted) == 0, \
        "every step accepted a draft: the test does not exercise misses and empty drafts"
