"""Measuring tools shared by the benchmark and its extras: wall-clock timing and forward-pass counting.

    sync(device)                 wait for queued GPU work (no-op on the CPU), so a timer sees it finish
    median_time(fn, device, n)   median seconds of n calls of fn() after one warm-up call
    ForwardCounter(module)       counts module's forward calls with a hook (a context manager)
    DraftForwardCounter(d)       counts drafter forward passes (ARDrafter: k per k drafted tokens; DFlash: 1)

This module imports nothing from nanodflash: drafters, benchmark and notebooks all depend on it, never
the other way round.
"""

import statistics
import time

import torch


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
