"""The repetition measure is its definition: token i (i >= 3) repeats when c[i-3..i] == c[j-3..j] for some
3 <= j < i, checked against that sentence written as a loop."""

import os
import random
import sys

import torch

from helpers import ROOT
from nanodflash.tools.repetition import least_repetitive, repeats, repetition


def by_the_definition(c):
    return [i >= 3 and any(c[i - 3:i + 1] == c[j - 3:j + 1] for j in range(3, i)) for i in range(len(c))]


def test_repeats_match_the_definition_on_random_sequences():
    rng = random.Random(0)
    for _ in range(300):
        c = [rng.randrange(3) for _ in range(rng.randrange(0, 30))]       # 3 symbols: many repeats
        assert repeats(c) == by_the_definition(c), f"repeats({c}) disagrees with the definition"


def test_a_loop_repeats_and_text_without_a_recurring_4gram_does_not():
    assert repetition(list(range(50))) == 0.0, "distinct tokens cannot repeat a 4-gram"
    loop = [5, 6, 7] * 20
    assert repetition(loop) == (len(loop) - 6) / len(loop), "a 3-token loop repeats from its 7th token on"
    assert repetition([1, 2, 3, 1, 2, 3, 9]) == 0.0, "a 3-gram recurring is not a 4-gram recurring"



def continuations(target, prompts, n=40):
    from nanodflash import generate
    return [generate(target, p, n) for p in prompts]


def test_sample_py_default_prompt_is_the_least_repetitive_of_its_candidates(smoke_out):
    import sample
    from nanodflash import load
    from nanodflash.store.data import val_prompts

    tok, target, _ = load(smoke_out)
    candidates = val_prompts(tok, 6, sample.PROMPT_LEN, 3, None)
    shares = [repetition(c) for c in continuations(target, candidates)]
    chosen, line = sample.default_prompt(tok, target, 40, 3, None, candidates=6)
    assert chosen in candidates, "sample.py's default prompt is not one of its candidates"
    assert chosen == candidates[shares.index(min(shares))], \
        f"sample.py chose a prompt whose continuation repeats {shares[candidates.index(chosen)]:.2f}, not " \
        f"the lowest of its candidates' {shares}"
    assert f"{100 * min(shares):.0f}% repeated" in line, f"the line does not say the chosen share: {line}"
    assert sample.default_prompt(tok, target, 40, 3, None, candidates=1)[0] == candidates[0], \
        "with one candidate (--hf) the prompt is the seed's first"


def test_the_notebooks_examples_come_least_repetitive_first(smoke_out):
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    import _setup  # (notebooks/_setup.py: by_repetition orders the prompts notebooks 3 and 6 look at)

    from nanodflash import load

    _, target, _ = load(smoke_out)
    data = torch.load(f"{smoke_out}/data.pt")
    ordered, held = _setup.by_repetition(target, data, 6, new_tokens=40), _setup.held_out_prompts(data, 6)
    shares = [repetition(c) for c in continuations(target, held)]
    assert sorted(map(tuple, ordered)) == sorted(map(tuple, held)), "by_repetition lost or added prompts"
    got = [shares[held.index(p)] for p in ordered]
    assert got == sorted(shares), f"by_repetition is not ordered least repetitive first: {got}"
    assert least_repetitive(continuations(target, held)) == held.index(ordered[0]), \
        "by_repetition's first and repetition.least_repetitive disagree"
