"""τ by position band: does the drafter keep up as a generation gets longer?

    from nanodflash.tools.bands import tau_by_band, measure_bands, format_bands
    _, stats = speculative_generate(target, drafter, prompt, 480)
    tau_by_band([stats.acceptance_lengths])        # {(0, 96): 4.1, (96, 240): 3.3, (240, 480): 3.0}

Positions count the generated tokens from 1. Token 1 comes from the prefill (no draft), so the first
draft+verify step starts at position 2, and step i starts right after the tokens of the steps before
it. A step belongs to the band (lo, hi] in which its FIRST token lies, all of its tokens with it (a
step that crosses a boundary is not split: τ is a per-step quantity). τ of a band = tokens emitted by
its steps / its steps, pooled over prompts, as `train_drafter.measure_tau` pools.
"""

from ..speculative import speculative_generate

BANDS = ((0, 96), (96, 240), (240, 480))      # tokens 1-96, 97-240, 241-480


def step_starts(acceptance_lengths):
    """The position of each step's first token: 2, 2 + len_0, 2 + len_0 + len_1, ...

    >>> step_starts([3, 1, 4])
    [2, 5, 6]
    """
    starts, pos = [], 2                        # position 1 is the prefill's token
    for n in acceptance_lengths:
        starts.append(pos)
        pos += n
    return starts


def band_counts(acceptance_lengths, bands=BANDS):
    """[(tokens, steps)] per band for one generation; steps starting outside every band are left out."""
    counts = [[0, 0] for _ in bands]
    for start, n in zip(step_starts(acceptance_lengths), acceptance_lengths):
        for i, (lo, hi) in enumerate(bands):
            if lo < start <= hi:
                counts[i][0] += n
                counts[i][1] += 1
                break
    return [tuple(c) for c in counts]


def tau_by_band(runs, bands=BANDS):
    """{band: τ} pooled over `runs` (one list of acceptance lengths per generation); None for a band no
    step started in (a generation shorter than the band, or one that stopped early)."""
    if runs and isinstance(runs[0], int):
        raise TypeError("tau_by_band takes a list of runs (one list of acceptance lengths per generation)")
    totals = [[0, 0] for _ in bands]
    for lengths in runs:
        for total, (tokens, steps) in zip(totals, band_counts(lengths, bands)):
            total[0] += tokens
            total[1] += steps
    return {band: (tokens / steps if steps else None) for band, (tokens, steps) in zip(bands, totals)}


def measure_bands(drafter, prompts, max_new_tokens=None, bands=BANDS, **kw):
    """τ per band of real speculative decoding (greedy unless kw says otherwise) over `prompts`.
    max_new_tokens defaults to the end of the last band."""
    n = bands[-1][1] if max_new_tokens is None else max_new_tokens
    runs = [speculative_generate(drafter.target, drafter, p, n, **kw)[1].acceptance_lengths for p in prompts]
    return tau_by_band(runs, bands)


def format_bands(taus):
    """One line: 'tau by position: 1-96 4.10 | 97-240 3.31 | 241-480 2.98' ('-' for an empty band)."""
    return "tau by position: " + " | ".join(
        f"{lo + 1}-{hi} " + ("-" if t is None else f"{t:.2f}") for (lo, hi), t in taus.items())
