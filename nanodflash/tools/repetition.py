"""How much of a continuation repeats itself: the share of its tokens that close a 4-gram seen before in it.

A small model decoded greedily falls into loops, and a drafter predicts a loop easily, so a τ measured on
looping text says little about text that does not loop. Every τ the project prints can carry this share
of the text it was measured on.

Token i of a continuation c (i >= 3; the prompt is not part of c) is a repeat when the 4-gram ending at it,
c[i-3..i], equals c[j-3..j] for some 3 <= j < i. The share is repeats / len(c).
"""

N = 4                   # the n-gram whose recurrence makes a repeat


def repeats(tokens, n=N):
    """Which tokens close an n-gram that ended earlier in `tokens`: a list of bools, one per token.

    >>> repeats([1, 2, 3, 4, 1, 2, 3, 4, 5])
    [False, False, False, False, False, False, False, True, False]
    """
    seen, out = set(), []
    for i in range(len(tokens)):
        gram = tuple(tokens[i - n + 1: i + 1]) if i >= n - 1 else None
        out.append(gram in seen)
        if gram is not None:
            seen.add(gram)
    return out


def repetition(tokens, n=N):
    """The share of `tokens` that are repeats (0.0 for an empty list).

    >>> repetition([1, 2, 3, 4, 1, 2, 3, 4, 5])          # one repeat (the second 4) in 9 tokens
    0.1111111111111111
    >>> repetition([7] * 10)                              # every token from the fifth on
    0.6
    """
    return sum(repeats(tokens, n)) / len(tokens) if tokens else 0.0


def pooled_repetition(continuations, n=N):
    """The repetition of several continuations together: all their repeats over all their tokens.

    >>> pooled_repetition([[1, 2, 3, 4, 1, 2, 3, 4, 5], [6] * 5])      # 1 + 1 repeats in 9 + 5 tokens
    0.14285714285714285
    """
    tokens = sum(len(c) for c in continuations)
    return sum(sum(repeats(c, n)) for c in continuations) / tokens if tokens else 0.0


def least_repetitive(continuations, n=N):
    """The index of the continuation that repeats least (the first of equals): the rule that picks the example
    prompts sample.py and the notebooks show, so that a first example is not a loop the drafter predicts
    trivially.

    >>> least_repetitive([[7] * 10, [1, 2, 3, 4, 1, 2, 3, 4, 5], [1, 2, 3]])
    2
    """
    shares = [repetition(c, n) for c in continuations]
    return shares.index(min(shares))
