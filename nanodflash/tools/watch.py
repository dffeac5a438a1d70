"""The path decoder's loop, watched from outside: each step timed and, with a callback, recorded (for the
benchmark, the race and the trace page).

    tokens, stats = watched_generate(target, drafter, prompt_ids, 96, on_step=recorder)    # stats: TimedStats

`speculative.speculative_generate` is the loop with nothing around its step. This runs the same loop (the
same request, block sizes and step function: the same tokens from the same seed) with the two models behind
stopwatches. Draft time: the drafter's `draft` and `extend`. Verify time: from the start of the target's
verify forward to the step's extend, so the verification and the roll-back count too (and, on a GPU, the wait
for the forward, which the verifier's first read of the logits does). Prefill time: the prefill. The drafter's
stopwatch holds the step's extend back until the watcher has told `on_step` (the context is then as it was
during the step's draft, as a trace needs it) and applies it right after; the target's notes the generator's
state before its verify forward (the draws the verifier makes next, which the trace page replays). The run
goes on as if nobody had watched.
"""

import time
from dataclasses import replace

import torch

from ..ext.block_policy import auto
from ..ext.compiled import compile_drafter
from ..ext.timing import TimedStats, WatchedStep, rng_state
from ..sampling import Sampling
from ..speculative import block_sizes, finished, prefill, speculative_step, start_request


class TimedTarget:
    """The target, the start of each forward noted (`started`); with `capture`, the generator's state too."""

    def __init__(self, target, generator=None, capture=False):
        self.target, self.generator, self.capture = target, generator, capture
        self.rng, self.started = None, None

    def __call__(self, *args, **kwargs):
        if self.capture:
            self.rng = rng_state(self.generator)
        self.started = time.perf_counter()
        return self.target(*args, **kwargs)


class TimedDrafter:
    """The drafter, its drafting timed as draft time; its `extend` held back (`apply` does it, timed as draft
    time), and the time since the target's verify forward began added to verify time when the step asks for
    it."""

    def __init__(self, drafter, stats, target):
        self.drafter, self.stats, self.target, self.held = drafter, stats, target, None

    @property
    def target_layer_ids(self):                   # what the step asks of the drafter besides its calls
        return self.drafter.target_layer_ids

    def draft(self, cache, *args):
        with self.stats.timer("draft_time"):
            return self.drafter.draft(cache, *args)

    def extend(self, cache, *args):
        self.stats.verify_time += time.perf_counter() - self.target.started    # forward, verify, roll back
        self.held = (cache, args)

    def apply(self):
        """The held-back extend of the step's kept positions."""
        cache, args = self.held
        with self.stats.timer("draft_time"):
            self.drafter.extend(cache, *args)


def policy(block_size):
    """A block size as the tools spell it (None, an int or "auto") as speculative_generate takes it."""
    return auto if block_size == "auto" else block_size


@torch.no_grad()
def watched_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                     top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None,
                     compile=False, on_step=None):
    """speculative_generate's arguments and tokens (block_size may be "auto": ext/block_policy.auto; compile:
    the drafter's pass compiled, ext/compiled.py); its stats a TimedStats; on_step: None, or a callable
    given each step's WatchedStep (it must not touch the caches or the generator)."""
    drafter = compile_drafter(drafter) if compile else drafter
    sampling = Sampling(temperature, top_k, top_p)
    request, prompt = start_request(target, drafter, prompt_ids, max_new_tokens, sampling, verifier,
                                    stop_token_ids, generator)
    sizes = block_sizes(policy(block_size), drafter, sampling)
    stats = TimedStats(target_cache=request.cache, draft_cache=request.dcache)
    with stats.timer("prefill_time"):
        out = [prefill(target, drafter, prompt, request.cache, request.dcache, sampling, generator)]
    target_watch = TimedTarget(target, generator, capture=on_step is not None)
    drafter_watch = TimedDrafter(drafter, stats, target_watch)
    watched = replace(request, target=target_watch, drafter=drafter_watch)
    while not finished(out, max_new_tokens, request.stops):
        left = max_new_tokens - len(out)
        b = min(sizes.next(), left + 1)
        d0, v0 = stats.draft_time, stats.verify_time
        step = speculative_step(watched, out[-1], b, left)
        sizes.update(b - 1, step.accepted)
        stats.record(b, len(step.new), min(step.accepted, len(step.new)))
        out += step.new
        if on_step is not None:                       # the drafter's context: as during this step's draft
            on_step(WatchedStep(**vars(step), draft_cache=request.dcache, draft_s=stats.draft_time - d0,
                                verify_s=stats.verify_time - v0, rng_state=target_watch.rng))
        drafter_watch.apply()
    return out, stats
