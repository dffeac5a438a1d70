"""Flag checks shared by the scripts (train_tiny.py, sample.py, the tools): argparse `type=` functions that
refuse bad numbers before any work.

    a("--n_seqs", type=ints(1, MAX_COUNT))
    # error: argument --n_seqs: must be an integer in [1, 1000000], got 0
    a("--top_p", type=floats(0, 1, low_open=True))
    # error: argument --top_p: must be a finite number in (0, 1], got nan

argparse prints the usage line, then one error line naming the flag ("argument --n_seqs: ") and the allowed
range. Every float flag refuses NaN and ±inf (NaN passes every `x < 0` test). Checks that involve two flags
(--n_head must divide --n_embd) run after parsing (train_tiny's: nanodflash/pipeline/flags.py);
`check_device` refuses --device cuda on a machine without CUDA.
"""

import argparse
import math
import os
from contextlib import contextmanager

import torch

from ..ext.step_costs import calibration

MAX_COUNT = 10**6       # bound on steps, sequences, prompts, tokens: a typo must not start a run of days
MAX_SEED = 2**32 - 1    # seeds are 32-bit unsigned integers
DECODE_THREADS = 1      # CPU threads to decode with where no calibration chose (decode_threads): batch-1
                        # decoding of these small models is bound by per-operation overhead


def _range(low, high, low_open=False):
    left = f"({low}" if low_open else f"[{low}"
    if high is None:
        return f"> {low}" if low_open else f">= {low}"
    return f"in {left}, {high}]"


def ints(low, high=None):
    """type= for an integer flag in [low, high] (high=None: no upper bound)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer {_range(low, high)}, got {text!r}") \
                from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {_range(low, high)}, got {value}")
        return value
    return parse


def floats(low, high=None, low_open=False):
    """type= for a finite float flag in [low, high], or (low, high] with low_open (high=None: no upper
    bound)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a finite number {_range(low, high, low_open)}, "
                                             f"got {text!r}") from None
        too_low = value <= low if low_open else value < low
        if not math.isfinite(value) or too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a finite number {_range(low, high, low_open)}, "
                                             f"got {text}")
        return value
    return parse


def threads(text):
    """type= for --threads: 1 up to this machine's CPU count (more only adds contention)."""
    return ints(1, os.cpu_count() or 1)(text)


def check_device(parser, device):
    """parser.error (usage + one line, exit 2) when `device` asks for CUDA and this machine has none."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device} was asked for but CUDA is not available on this machine; use "
                     "--device cpu")


def decode_threads(drafter, override=None):
    """{plain: threads, speculative: threads} to decode with: `override` (--threads N) for both, else the
    counts the run folder's calibration chose on this machine (tools/calibrate.py), else DECODE_THREADS."""
    if override:
        return dict(plain=override, speculative=override)
    entry = calibration(drafter)
    chosen = entry["threads"] if entry else dict(plain=DECODE_THREADS, speculative=DECODE_THREADS)
    return dict(plain=chosen["plain"], speculative=chosen["speculative"])


@contextmanager
def using_threads(n):
    """torch decodes with n CPU threads inside the block, with the count it had after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
