"""Running an exercise's claims against a function: each claim prints PASS or FAIL, and on a failure what went
wrong, in words.

    results = run_checks(exercise, fn)          # [(claim text, None or the failure message), ...]

A claim is a function claim(student) that returns when the claim holds and raises Failed(message) when it
does not. `student.installed()` puts the function in place of the library's for a `with` block; outside it
the library is itself, which is where the claims compute their references.
"""

import contextlib
import functools
import os
import signal
import time
import traceback
from dataclasses import dataclass

import torch

from .swap import swapped

CLAIM_SECONDS = 60       # a claim running longer fails (an endless loop, or a very slow answer)
TOO_LONG = "took longer than"   # how a timed-out claim's message starts: the check ends there


class Failed(AssertionError):
    """A claim that does not hold; the message says how, for a student."""


AGAINST_CONTRACT = "against the contract: "     # how a BrokenContract's message starts


class BrokenContract(Failed):
    """A claim that does not hold because the function returns another kind of value (a type, dtype or shape)
    than its contract states: the contract in the skeleton's docstring addresses it, not a hint's steps."""

    def __init__(self, message):
        super().__init__(AGAINST_CONTRACT + message)


class TimeLimit(Exception):
    pass


@dataclass
class Student:
    """The function being checked (a student's, or the library's own) and the library's original."""
    name: str
    fn: object
    original: object

    def installed(self):
        """A `with` block in which the library calls `fn` wherever it calls the original."""
        if self.fn is self.original:
            return contextlib.nullcontext()
        return swapped(self.original, self.fn)


@contextlib.contextmanager
def time_limit(seconds):
    """Raise TimeLimit in the block after `seconds` (on the main thread, where signals arrive; elsewhere, no
    limit)."""
    def stop(signum, frame):
        raise TimeLimit()
    try:
        previous = signal.signal(signal.SIGALRM, stop)
    except ValueError:                                   # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def where_it_broke(error, path):
    """' (my_file.py, line 12)' for the deepest traceback line in the student's file, else ''."""
    if path is None:
        return ""
    lines = [f for f in traceback.extract_tb(error.__traceback__)
             if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f" ({os.path.basename(path)}, line {lines[-1].lineno})" if lines else ""


def describe(value):
    """What a returned value is, for a message: 'a tensor of shape (3, 3), dtype torch.int64', '(2, ...)'.

    >>> describe((2, torch.tensor(5)))
    '(2, a tensor of shape (), dtype torch.int64)'
    """
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}, dtype {value.dtype}"
    if isinstance(value, tuple):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__module__.split('.')[0]} {type(value).__name__} of shape {value.shape}, " \
               f"dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def recording(fn):
    """fn, keeping the value of its last call in .returned (a message can say what it gave the code that
    then failed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        wrapper.returned = fn(*args, **kwargs)
        return wrapper.returned
    wrapper.returned = NOTHING
    return wrapper


NOTHING = object()      # .returned before any call


def outside_message(student, error):
    """'after your NAME returned <value>, <where> failed: <error>' for an error raised in other code than the
    student's, after their function returned."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if os.sep + "nanodflash" + os.sep in f.filename]
    frame = (ours or frames)[-1]                          # the library's line, not torch's internals
    where = f"{frame.name} ({os.path.basename(frame.filename)}, line {frame.lineno})"
    gave = getattr(student.fn, "returned", NOTHING)
    what = "" if gave is NOTHING else f" {describe(gave)}"
    return f"after your {student.name} returned{what}, {where} failed: {type(error).__name__}: {error}"


def run_claim(claim, student, path=None, seconds=CLAIM_SECONDS):
    """None when the claim holds, else the message that says why not."""
    if hasattr(student.fn, "returned"):
        student.fn.returned = NOTHING                    # a message names this claim's value, no other's
    try:
        with time_limit(seconds):
            claim(student)
        return None
    except Failed as e:
        return str(e)
    except TimeLimit:
        return f"{TOO_LONG} {seconds} s: does your function loop forever?"
    except Exception as e:
        where = where_it_broke(e, path)
        if path is not None and not where:               # raised after the student's function returned
            return outside_message(student, e)
        return f"your {student.name} raised {type(e).__name__}: {e}{where}"


def run_checks(exercise, fn, path=None, out=None, until=None, seconds=CLAIM_SECONDS):
    """Every claim of `exercise` against `fn`; prints one line per claim to `out` (a file, or None for
    silence) -> [(claim text, None or the failure message)]. until(message): stop after the first failed
    claim whose message it accepts (`check --first`: any failure), skipping the claims after it. A claim
    that runs past `seconds` ends the check: the claims after it would call the same function."""
    original = exercise.original()
    student = Student(exercise.name, fn if fn is original else recording(fn), original)
    results = []
    for claim in exercise.claims:
        t0 = time.perf_counter()
        message = run_claim(claim, student, path, seconds)
        results.append((claim.__doc__, message))
        if out is not None:
            verdict = "PASS" if message is None else "FAIL"
            print(f"{verdict}  {claim.__doc__}  ({time.perf_counter() - t0:.1f} s)", file=out)
            if message is not None:
                print("      " + message.replace("\n", "\n      "), file=out)
        if message is not None and (message.startswith(TOO_LONG) or until is not None and until(message)):
            break
    if out is not None:
        failed = sum(m is not None for _, m in results)
        if failed:
            skipped = len(exercise.claims) - len(results)
            last = results[-1][1]
            after = " after the time-out" if last is not None and last.startswith(TOO_LONG) else ""
            print(f"\n{failed} of {len(results)} claims failed"
                  + (f" ({skipped} not run{after})" if skipped else "") + f". Reread: {exercise.notebook}.",
                  file=out)
        else:
            print(f"\nAll {len(results)} claims hold: {exercise.name} is right.", file=out)
    return results
