"""Measure what a speculative step costs on this machine, once, and keep it in the run folder: the table
block_size="auto" weighs drafts by (nanodflash/ext/step_costs.py). Decoding itself never times anything.

    python -m nanodflash.tools.calibrate --out out               # writes out/costs.json: this machine's
    python -m nanodflash.tools.calibrate --out out --calls 31    # more calls per step, a steadier median
    python -m nanodflash.tools.calibrate --out out --compile     # batch 1 with the drafter's pass compiled

A step is timed as the loops run it, after a context of CONTEXT tokens, greedy and sampled. Batch 1 through
the path decoder's pieces: the newly verified positions projected into the drafter's context, one drafter
pass of n+1 slots (none when n = 0), one target forward of n+1 tokens (sampled: each draft drawn from q, the
target's p at every position, the rejection test). 2 to 32 rows: the batched decoder's whole step
(batch.SpecBatch.step: drafting, verifying, emitting, the rows' bookkeeping) over a plain batched step
(plain_batch.PlainBatch.plain_step), since a batch drafts only when that beats plain batched decoding. Each
is the median of `calls` calls at each of COST_TOKENS block sizes, the sizes interleaved call by call, linear
in between. train_tiny.py calibrates at its end; costs.json keeps one table per machine key (device, dtype,
threads, torch version, compile mode), so a folder copied to another machine keeps its first machine's table
and gets one of its own beside it.
"""

import argparse
import datetime
import os
import platform
import statistics
import time

import torch

from ..ext import compiled as compiled_pass
from ..ext.batch import SpecBatch
from ..ext.batch_policy import COST_ROWS
from ..ext.plain_batch import PlainBatch
from ..ext.step_costs import cost_key, describe
from ..sampling import DraftRule, probs_from_logits
from ..store.checkpoint import fingerprint, load
from ..store.run_folder import read_costs, write_costs
from ..verify import rejection_verify
from .cli import DECODE_THREADS, check_device, ints
from .measure import sync

CONTEXT = 64                      # tokens of context the timed steps attend to
COST_TOKENS = (1, 2, 4, 8, 16)    # block sizes timed; the others are interpolated linearly
N_CALLS = 61                      # timed calls per block size (the median counts), after one warm-up each:
                                  # how well two calibrations agree: docs/log.md
SAMPLED_T = 0.7                   # sampled steps are timed at this temperature (cost barely moves with it)


def median_seconds(steps, device, n=N_CALLS):
    """{name: median wall-clock seconds of n calls of fn()} for steps {name: fn}, the steps interleaved call
    by call (so a slow moment of the machine weighs on all of them alike), after one untimed warm-up call
    each (allocation, kernel setup)."""
    times = {name: [] for name in steps}
    for fn in steps.values():
        fn()
    for _ in range(n):
        for name, fn in steps.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def relative_costs(seconds, max_block_size):
    """{block size t: seconds} at some t (1 included) -> [cost(n) for n in 0..B-1], cost(n) = seconds at
    t = n+1 (linear between the timed sizes, the last segment extended) over the seconds at t = 1.

    >>> relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5)
    [1.0, 1.25, 1.375, 1.5, 1.625]
    """
    ts = sorted(seconds)
    out = []
    for t in range(1, max_block_size + 1):
        i = max(1, min(len(ts) - 1, sum(x < t for x in ts)))
        lo, hi = ts[i - 1], ts[i]
        out.append((seconds[lo] + (seconds[hi] - seconds[lo]) * (t - lo) / (hi - lo)) / seconds[1])
    return out



@torch.no_grad()
def time_single_steps(target, drafter, n_calls=N_CALLS, sampled=False, compiled=False):
    """{t: seconds of one batch-1 step with a block of t tokens} at the COST_TOKENS sizes up to the drafter's
    block size: project t verified positions, draft t-1 tokens (none at t = 1), verify t tokens; sampled:
    drafts drawn from q, and the target's p and the rejection test on every position (match's draw from p
    costs about as much). compiled: the drafter's pass compiled (compiled.py), its graphs made by the
    warm-up call of each size."""
    B, ids = drafter.block_size, drafter.target_layer_ids
    device = next(target.parameters()).device
    n = min(CONTEXT, target.config.max_seq_len - B)
    context = torch.arange(n, device=device)[None] % target.config.vocab_size               # (1, n) any ids
    cache = target.new_cache(1, n + B)
    dcache = compiled_pass.new_cache(drafter, n + B) if compiled else drafter.new_cache(n + B)
    _, feats = target(context, cache, layer_ids=ids)
    g = torch.Generator().manual_seed(0)
    rule = DraftRule(SAMPLED_T, True, g) if sampled else DraftRule(0.0, False, None)

    def step_of(t):
        def step():
            dcache.length = n - t                          # the last t context positions, verified anew
            drafter.extend(dcache, feats[:, n - t:], context[:, n - t:])
            if t > 1:
                drafts, q = drafter.draft(dcache, 0, t - 1, rule)   # projects them, then drafts
            else:
                drafter.project_context(dcache)            # what the next draft would project first
            logits, _ = target(context[:, :t], cache, layer_ids=ids)
            if sampled and t > 1:                          # the verifier's share of a sampled step
                rejection_verify(drafts, q, probs_from_logits(logits[0].cpu(), SAMPLED_T), g)
            cache.crop(n)
        return step
    return median_seconds({t: step_of(t) for t in COST_TOKENS if t <= B}, device, n_calls)


@torch.no_grad()
def time_batch_steps(target, drafter, rows, n_calls=N_CALLS, sampled=False):
    """{t: seconds of one step of `rows` rows with blocks of t tokens}: at t = 1 a plain batched step
    (PlainBatch.plain_step: what plain batched decoding pays per token), at the other COST_TOKENS sizes up to
    the drafter's block size a batched speculative step as the loop runs it (SpecBatch.step: draft t-1
    tokens per row, verify t per row, emit, project into the drafter's context), each put back after it is
    timed. Row r's context is CONTEXT - r % 3 tokens long, so the ragged write and mask are the loop's.
    sampled: both at SAMPLED_T (drafts drawn from q and verified row by row, as the loop does)."""
    B = drafter.block_size
    n = min(CONTEXT, target.config.max_seq_len - 3 * B)
    context = [i % target.config.vocab_size for i in range(n)]
    prompts = [context[: n - r % 3] for r in range(rows)]

    def timed_step(batch, step):
        batch.prefill()
        outs, lens = [len(o) for o in batch.outs], list(batch.cache.lengths)
        mark = batch.context.mark() if isinstance(batch, SpecBatch) else None

        def call():
            step()
            for out, k in zip(batch.outs, outs):
                del out[k:]
            batch.cache.lengths, batch.cache.length = list(lens), max(lens)
            if mark is not None:
                batch.context.rewind(mark)
        return call

    T, g = (SAMPLED_T if sampled else 0.0), torch.Generator().manual_seed(0)
    plain = PlainBatch(target, prompts, 2 * B, temperature=T, generator=g)
    steps = {1: timed_step(plain, plain.plain_step)}
    for t in COST_TOKENS:
        if 1 < t <= B:
            spec = SpecBatch(target, drafter, prompts, 2 * B, block_size=t, temperature=T, generator=g)
            steps[t] = timed_step(spec, spec.step)
    return median_seconds(steps, plain.device, n_calls)


def processor():
    """The CPU's model name where the system says it (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def calibrate(target, drafter, n_calls=N_CALLS, rows=COST_ROWS, log=print, compiled=False):
    """Time the steps and return costs.json's entry for this machine: {key, machine, measured, seconds,
    block_size, target (the fingerprint of the target timed), costs: {"greedy": {rows: [cost(n)...]},
    "sampled": {rows: [...]}}}. compiled: batch 1's steps with the drafter's pass compiled, under the
    compiled key (the batched decoder has no compiled pass)."""
    rows = (1,) if compiled else rows
    t0, B = time.perf_counter(), drafter.block_size
    device = next(target.parameters()).device
    greedy, sampled = {}, {}
    for R in rows:
        for kind, table in (("greedy", greedy), ("sampled", sampled)):
            seconds = (time_single_steps(target, drafter, n_calls, kind == "sampled", compiled) if R == 1
                       else time_batch_steps(target, drafter, R, n_calls, kind == "sampled"))
            table[str(R)] = relative_costs(seconds, B)
            log(f"[calibrate] {R:2d} row{'s' if R > 1 else ' '}, {kind}: a step with {B - 1} drafts per row "
                f"costs {table[str(R)][-1]:.2f} steps without drafts")
    where = processor() if device.type == "cpu" else torch.cuda.get_device_name(device)
    return dict(key=cost_key(target, compiled), block_size=B, costs=dict(greedy=greedy, sampled=sampled),
                target=fingerprint(target),
                machine=f"{where}, {os.cpu_count()} CPUs, {platform.system()}",
                measured=datetime.date.today().isoformat(), seconds=round(time.perf_counter() - t0, 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="the run folder (train_tiny.py --out) (default: %(default)s)")
    p.add_argument("--calls", type=ints(3, 1001), default=N_CALLS, help="timed calls per block size and row "
                   "count, the median counts (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="the table of batch-1 steps with the drafter's "
                   "pass compiled (speculative_generate(compile=True)), kept beside the eager one")
    args = p.parse_args(argv)
    check_device(p, args.device)
    torch.set_num_threads(DECODE_THREADS)              # the threads the decoders run with
    try:
        _, target, drafter = load(args.out, args.device)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    entry = calibrate(target, drafter, args.calls, compiled=args.compile)
    path = write_costs(args.out, entry)
    print(f"wrote {path}: the step costs of {describe(entry['key'])} on {entry['machine']} "
          f"({entry['seconds']:.0f} s; {len(read_costs(args.out))} machine key(s) in the file)")


if __name__ == "__main__":
    main()
