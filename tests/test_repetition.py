"""The repetition measure is its definition: token i (i >= 3) repeats when c[i-3..i] == c[j-3..j] for some
3 <= j < i, checked against that sentence written as a loop."""

import random

from nanodflash.repetition import repeats, repetition


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
