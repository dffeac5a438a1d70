"""The greedy equality check used by the summary and sample.py excuses a float32 rounding tie, and only that:
a difference where the target clearly prefers plain decoding's token is still a lossless failure."""

import pytest
import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.pipeline.summary import identical
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.measure import TIE, greedy_difference, side_by_side

PROMPT, NEW = [3, 7, 1, 9], 12


def target_with_a_twin(position=4):
    """A tiny target, its plain greedy output, and a token `twin` whose logits equal (float32: to rounding)
    those of the token plain decoding emits at `position`: a tie the target cannot break."""
    target = tiny_target(seed=5).float()
    ref = generate(target, PROMPT, NEW)
    twin = next(t for t in range(ref[position] + 1, target.config.vocab_size) if t not in ref)
    with torch.no_grad():                      # same head row: same logit; argmax keeps the smaller id
        target.lm_head.weight[twin] = target.lm_head.weight[ref[position]]
    assert generate(target, PROMPT, NEW) == ref, "the twin changed plain decoding"
    return target, ref, twin


def test_a_difference_at_two_tokens_with_equal_logits_is_a_tie_and_a_clear_preference_is_not():
    target, ref, twin = target_with_a_twin(position=4)
    tied = greedy_difference(target, PROMPT, ref, ref[:4] + [twin] + ref[5:])
    assert tied.position == 4 and tied.tokens == (ref[4], twin)
    assert tied.is_tie and tied.gap < TIE, f"equal logits must count as a tie: {tied.describe()}"
    with torch.no_grad():
        logits = target.double()(torch.tensor([PROMPT + ref[:4]]))[0][0, -1]
    target.float()
    worst = int(logits.argmin())                               # a token the target clearly does not want
    wrong = greedy_difference(target, PROMPT, ref, ref[:4] + [worst] + ref[5:])
    assert not wrong.is_tie and wrong.gap > 100 * TIE, f"a clear preference was excused: {wrong.describe()}"
    assert "NOT a tie" in wrong.describe()
    short = greedy_difference(target, PROMPT, ref, ref[:-1])
    assert not short.is_tie and "ends there" in short.describe(), "an output that stops early is not a tie"
    assert greedy_difference(target, PROMPT, ref, list(ref)) is None


def decoder_that_swaps(position, token):
    """The real speculative decoder, with its output's token at `position` replaced."""
    def decode(target, drafter, prompt, n, **kw):
        out, stats = speculative_generate(target, drafter, prompt, n, **kw)
        return out[:position] + [token] + out[position + 1:], stats
    return decode


def test_side_by_side_reports_a_tie_only_when_asked_and_always_raises_on_a_real_difference():
    target, ref, twin = target_with_a_twin(position=4)
    drafter = tiny_drafter(target, block_size=4).float()
    ties = []
    side_by_side(target, drafter, [PROMPT], NEW, decoder=decoder_that_swaps(4, twin), ties=ties)
    assert [(i, d.tokens) for i, d in ties] == [(0, (ref[4], twin))], "the tie was not reported"
    assert "1 of 2 prompts" in identical(2, ties) and "rounding tie" in identical(2, ties)
    with pytest.raises(AssertionError, match="a float32 rounding tie"):     # not asked to excuse ties
        side_by_side(target, drafter, [PROMPT], NEW, decoder=decoder_that_swaps(4, twin))
    with torch.no_grad():
        worst = int(target(torch.tensor([PROMPT + ref[:4]]))[0][0, -1].argmin())
    with pytest.raises(AssertionError, match="NOT a tie"):
        side_by_side(target, drafter, [PROMPT], NEW, decoder=decoder_that_swaps(4, worst), ties=[])
    assert identical(3, []) == "all 3 prompts: yes"
