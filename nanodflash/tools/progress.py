"""Progress lines for long tool runs: what is running, how long it has run, how long it has left.

A benchmark of 64 prompts runs for many minutes; without these lines a user watching its log (often a pipe,
which buffers) sees nothing until the table. Each line goes to `log` (the tools pass one that prints to
stderr and flushes), at most one every `every` seconds, and the last unit of work always gets one.

    >>> clock = iter([0.0, 30.0, 35.0, 80.0]).__next__
    >>> p = Progress(print, "bench", every=10.0, clock=clock)
    >>> p.done(1, 4, "prompt 1/4")                       # 30 s for 1 of 4: 90 s left
    [bench] prompt 1/4 | elapsed 30s | eta 1m30s
    >>> p.done(2, 4, "prompt 2/4")                       # 5 s after the last line: quiet
    >>> p.done(4, 4, "prompt 4/4")                       # the last one always says so
    [bench] prompt 4/4 | elapsed 1m20s | eta 0s
"""

import sys
import time


def duration(seconds):
    """'42s', '3m05s', '1h02m': a duration as a person reads it.

    >>> duration(42.4), duration(185), duration(3725)
    ('42s', '3m05s', '1h02m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def to_stderr(line):
    """A progress line on stderr, flushed at once (a pipe would hold it back)."""
    print(line, file=sys.stderr, flush=True)


class Progress:
    """done(k, total, what) after the k-th of `total` equal-ish units of work; say(text) for one line now.
    The ETA assumes the units left cost what the units done cost on average."""

    def __init__(self, log, label, every=10.0, clock=time.perf_counter):
        self.log, self.label, self.every, self.clock = log, label, every, clock
        self.start = clock()
        self.last = None                      # when the last line was written

    def say(self, text):
        self.log(f"[{self.label}] {text}")

    def done(self, k, total, what):
        now = self.clock()
        if k < total and now - (self.start if self.last is None else self.last) < self.every:
            return
        self.last = now
        elapsed = now - self.start
        self.say(f"{what} | elapsed {duration(elapsed)} | eta {duration(elapsed / k * (total - k))}")
