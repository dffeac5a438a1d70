"""The path decoder's loop, watched from outside: each step timed and, with a callback, recorded (for the
benchmark, the race and the trace page).

    tokens, stats = watched_generate(target, drafter, prompt_ids, 96, on_step=recorder)    # stats: TimedStats

`speculative.speculative_generate` is the loop with nothing around its step. This runs the same loop (the
same request, block sizes and step function: the same tokens from the same seed) with the two models behind
stopwatches: the drafter's `draft` and `extend` count as draft time, the target's verify forwards as verify
time, the prefill as prefill time. The target's stopwatch also notes the generator's state before each
verify forward (the draws the verifier makes next, which the trace page replays), and the drafter's notes
its context before the step's extend. `on_step` gets each step's StepRecord with those filled in, while the
drafter's context is as it was before the step's extend; the run goes on as if nobody had watched.
"""

from dataclasses import replace

import torch

from ..loop import StepRecord, TimedStats, finished, prefill, rng_state
from ..sampling import Sampling
from ..speculative import block_policy, speculative_step, start_request


class TimedTarget:
    """The target, its forwards timed as verify time; with `capture`, the generator's state noted before
    each."""

    def __init__(self, target, stats, generator=None, capture=False):
        self.target, self.stats = target, stats
        self.generator, self.capture, self.rng = generator, capture, None

    def __call__(self, *args, **kwargs):
        if self.capture:
            self.rng = rng_state(self.generator)
        with self.stats.timer("verify_time"):
            return self.target(*args, **kwargs)


class TimedDrafter:
    """The drafter, its drafting and its context's extension timed as draft time; its context noted
    (`drafter.mark`) before each extension."""

    def __init__(self, drafter, stats):
        self.drafter, self.stats, self.before = drafter, stats, None
        self.block_size, self.target_layer_ids = drafter.block_size, drafter.target_layer_ids

    def draft(self, cache, *args):
        with self.stats.timer("draft_time"):
            return self.drafter.draft(cache, *args)

    def extend(self, cache, *args):
        self.before = self.drafter.mark(cache)
        with self.stats.timer("draft_time"):
            return self.drafter.extend(cache, *args)


def tell(on_step, step: StepRecord, watched, draft_s, verify_s):
    """Hand `step` to on_step with the watcher's fields, the drafter's context put back as it was before the
    step's extend for the call, and restored after it."""
    drafter, dcache = watched.drafter.drafter, watched.dcache
    after = drafter.mark(dcache)
    drafter.rewind(dcache, watched.drafter.before)
    try:
        on_step(replace(step, draft_cache=dcache, draft_s=draft_s, verify_s=verify_s,
                        rng_state=watched.target.rng))
    finally:
        drafter.rewind(dcache, after)


@torch.no_grad()
def watched_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                     top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None,
                     compile=False, on_step=None):
    """speculative_generate's arguments and tokens; its stats a TimedStats; on_step: None, or a callable
    given each step's StepRecord (it must not touch the caches or the generator)."""
    sampling = Sampling(temperature, top_k, top_p)
    request, prompt = start_request(target, drafter, prompt_ids, max_new_tokens, sampling, verifier,
                                    stop_token_ids, generator, compile)
    sizes = block_policy(request, block_size, compile)
    stats = TimedStats(target_cache=request.cache, draft_cache=request.dcache)
    with stats.timer("prefill_time"):
        out = [prefill(target, drafter, prompt, request.cache, request.dcache, sampling, generator)]
    watched = replace(request, target=TimedTarget(target, stats, generator, capture=on_step is not None),
                      drafter=TimedDrafter(drafter, stats))
    while not finished(out, max_new_tokens, request.stops):
        left = max_new_tokens - len(out)
        b = min(sizes.next(), left + 1)
        d0, v0 = stats.draft_time, stats.verify_time
        step = speculative_step(watched, out[-1], b, left)
        sizes.update(b - 1, step.accepted)
        stats.record(b, len(step.new), min(step.accepted, len(step.new)))
        out += step.new
        if on_step is not None:
            tell(on_step, step, watched, stats.draft_time - d0, stats.verify_time - v0)
    return out, stats
