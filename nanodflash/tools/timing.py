"""Measuring tools shared by the benchmark and its extras: wall-clock timing and forward-pass counting.

    sync(device)                 wait for queued GPU work (no-op on the CPU), so a timer sees it finish
    median_time(fn, device, n)   median seconds of n calls of fn() after one warm-up call
    ForwardCounter(module)       counts module's forward calls with a hook (a context manager)
    DraftForwardCounter(d)       counts drafter forward passes (ARDrafter: k per k drafted tokens; DFlash: 1)
    side_by_side(target, drafter, prompts, n, block_size)   plain vs speculative wall-clock, interleaved
    machine(device)              the machine a benchmark ran on, for its header line
"""

import os
import platform
import statistics
import time

import torch

from ..speculative import generate, speculative_generate
from .ties import greedy_difference


def machine(device):
    """'x86_64 Linux, torch 2.13.0+cpu, cpu (1 of 2 CPU threads)': what a benchmark's numbers were measured on."""
    where = (f"{torch.get_num_threads()} of {os.cpu_count()} CPU threads" if str(device) == "cpu"
             else torch.cuda.get_device_name())
    return f"{platform.machine()} {platform.system()}, torch {torch.__version__}, {device} ({where})"


def sync(device):
    """Block until the device has run everything queued (CUDA kernels are asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn, device, n=50):
    """Median wall-clock seconds of n calls of fn(), after one untimed warm-up call."""
    fn()                                                    # warm-up: allocation, kernel setup
    times = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class ForwardCounter:
    """Counts forward calls of `module` with a hook; usable as a context manager that removes the hook.

    The benchmark counts target.forward (the drafter borrows only the target's embedding and head)."""

    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.n += 1

    def remove(self):
        self.handle.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def DraftForwardCounter(drafter):
    """Counts drafter forward passes: each pass applies the drafter's final norm exactly once (extend never does)."""
    return ForwardCounter(drafter.norm)


def side_by_side(target, drafter, prompts, new_tokens, block_size=None, runs=None, verifier="rejection",
                 decoder=speculative_generate, ties=None, **kw):
    """Wall-clock of plain vs speculative greedy decoding on the same prompts, interleaved; checks equality.
    Returns (plain seconds, speculative seconds, τ of the speculative runs). `runs`, a list, receives each
    speculative run's acceptance lengths (for τ by position, bands.py). `kw`: generate's sampling arguments
    (temperature, top_k, top_p, stop_token_ids). temperature > 0: both sample (prompt i with seed i; the
    speculative side with `verifier`), and the outputs, samples, are not compared. `decoder`: the speculative
    decoder, speculative_generate or one called like it (e.g. a tree decoder with its tree size bound).
    A greedy output that differs raises AssertionError, unless it first differs at a float32 rounding tie
    (ties.py) and `ties`, a list, is given: it then receives (prompt index, Difference)."""
    t_plain = t_spec = 0.0
    emitted = steps = 0
    temperature = kw.get("temperature", 0.0)
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        ref = generate(target, p, new_tokens, generator=torch.Generator().manual_seed(i), **kw)
        t1 = time.perf_counter()
        out, stats = decoder(target, drafter, p, new_tokens, block_size=block_size, verifier=verifier,
                             generator=torch.Generator().manual_seed(i), **kw)
        t2 = time.perf_counter()
        emitted, steps = emitted + sum(stats.acceptance_lengths), steps + len(stats.acceptance_lengths)
        if runs is not None:
            runs.append(stats.acceptance_lengths)
        difference = greedy_difference(target, p, ref, out) if temperature == 0 else None
        if difference is not None:
            if ties is None or not difference.is_tie:
                raise AssertionError(f"speculative greedy output differs from plain greedy decoding on prompt {i}, "
                                     f"{difference.describe()}")
            ties.append((i, difference))
        t_plain, t_spec = t_plain + t1 - t0, t_spec + t2 - t1
    return t_plain, t_spec, emitted / max(steps, 1)
