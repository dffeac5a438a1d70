"""How the calibration times a decoding step: the median of calls interleaved by the benchmarks' one timing
loop, each right after an untimed call of its own, at a few block sizes, linear in between (calibrate.py
uses it for batch 1's steps, batch_timing.py for the batched decoder's)."""

import statistics

from .measure import interleaved

CONTEXT = 64                      # tokens of context the timed steps attend to (a bench generation's middle)
PROMPT_LEN = 16                   # the timed request's prompt: the bench's prompts' length
COST_TOKENS = (1, 2, 4, 8, 16)    # block sizes timed; the others are interpolated linearly
N_CALLS = 25                      # timed calls per block size (the median counts), each after an untimed
                                  # call of its own: how well two calibrations agree: docs/log.md
SAMPLED = (0.7, 0.95)             # sampled steps are timed at this temperature and top-p (the bench's)


def median_seconds(steps, device, n=N_CALLS, warm=False):
    """{name: median wall-clock seconds of n calls of fn()} for steps {name: fn}, timed by the benchmarks'
    one loop (measure.interleaved: every step's call in turn, the order rotated call by call, so a slow
    moment of the machine weighs on all of them alike), after one untimed call of each, or (warm) each timed
    call right after an untimed one of its own, as in a decode, where a step follows a step of its kind
    (the calibration's steps; BatchSteps counts on those pairs)."""
    if not warm:                    # warm: every timed call has its untimed one (BatchSteps counts the pairs)
        for fn in steps.values():
            fn()
    times = {name: [] for name in steps}
    loop = interleaved(list(steps), range(n), lambda name, _, i: steps[name](), device, warm=warm)
    for _, name, _, seconds in loop:
        times[name].append(seconds)
    return {name: statistics.median(ts) for name, ts in times.items()}


def interpolated(seconds, max_block_size):
    """{block size t: seconds} at some t (1 included) -> [seconds at t for t in 1..B], linear between the
    timed sizes, the last segment extended.

    >>> interpolated({1: 2.0, 2: 2.5, 4: 3.0}, 5)
    [2.0, 2.5, 2.75, 3.0, 3.25]
    """
    ts = sorted(seconds)
    out = []
    for t in range(1, max_block_size + 1):
        i = max(1, min(len(ts) - 1, sum(x < t for x in ts)))
        lo, hi = ts[i - 1], ts[i]
        out.append(seconds[lo] + (seconds[hi] - seconds[lo]) * (t - lo) / (hi - lo))
    return out


def token_ids(target, n, text=None):
    """n token ids to time on: the first n of `text` (the run's own text: the drafts accepted, the kept
    positions projected and the sampler's nucleus are then the decoders'), else ids spread over the
    vocabulary."""
    if text is not None and len(text) >= n:
        return list(text[:n])
    return [(7 * i + 3) % target.config.vocab_size for i in range(n)]
