"""Measure what decoding costs on this machine, once, and keep it in the run folder: the thread counts to
decode with and the step costs block_size="auto" weighs drafts by and the bench predicts from
(nanodflash/ext/step_costs.py). Decoding itself never times anything.

    python -m nanodflash.tools.calibrate --out out               # writes out/costs.json: this machine's
    python -m nanodflash.tools.calibrate --out out --calls 61    # more calls per step, a steadier median
    python -m nanodflash.tools.calibrate --out out --compile     # batch 1 with the drafter's pass compiled

Threads first: plain greedy decoding and a full-block speculative step are timed at 1, 2, ... threads (up to
this machine's CPUs, at most MAX_THREADS), and each gets the fewest threads within SAME_SPEED of its fastest
(verifying a block is parallel work a plain step lacks: the two may differ). Then, at the speculative count,
the library's own code is timed as the decoders run it: batch 1's `speculative_step` (the nano core's step:
draft n tokens in one pass, verify n+1, keep a prefix, roll both caches back) after CONTEXT tokens of the
run's own text (run_text: the drafts it keeps and the sampler's nucleus are then the decoders'), greedy and
sampled, at each of COST_TOKENS block sizes (linear in between), put back after each call; a request
(`speculative_generate` of one token: the caches and the prefill of a PROMPT_LEN-token prompt); plain
decoding's token and request (`generate`, at the plain count). 1 to 32 rows: the batched decoder's whole step
(batch.SpecBatch.step) and a plain batched step (plain_batch.PlainBatch.plain_step), each inside generations
of the run's text as the bench runs them (batch_timing.BatchSteps); from 2 rows on, `auto` weighs drafts by
their ratio, since a batch drafts only when that beats plain batched decoding. Each is the median of `calls`
calls (a batched step's: batch_timing.BATCH_SHARE of them), every step's calls interleaved with the others'
by the benchmarks' one timing loop (measure.interleaved), each right after an untimed call of the same step
(in a decode a step follows a step of its kind). train_tiny.py calibrates at its end; costs.json keeps one
entry per machine key (device, dtype, threads, torch version, compile mode), so a folder copied to another
machine keeps its first machine's and gets one of its own.
"""

import argparse
import datetime
import os
import platform
import time

import torch

from ..ext import compiled as compiled_pass
from ..ext.batch_policy import COST_ROWS
from ..ext.step_costs import cost_key, describe
from ..sampling import Sampling
from ..speculative import generate, prefill, speculative_generate, speculative_step, start_request
from ..store.checkpoint import fingerprint, load
from ..store.data import val_prompts
from ..store.run_folder import read_costs, run_corpus, write_costs
from .batch_timing import time_batch_tables
from .cli import check_device, ints, using_threads
from .step_timing import (
    CONTEXT,
    COST_TOKENS,
    N_CALLS,
    PROMPT_LEN,
    SAMPLED,
    interpolated,
    median_seconds,
    token_ids,
)

PLAIN_TOKENS = 16                 # plain decoding's token: (generate 1 + this many - generate 1) / this many
MAX_THREADS = 8                   # thread counts tried: 1 .. min(this, the machine's CPUs)
SEED = 7                          # picks the run's text the steps are timed on
SAME_SPEED = 0.10                 # more threads must be this much faster to be chosen: on a shared 2-core
                                  # machine two threads' timings move by about this much between minutes
                                  # (docs/log.md), a gain a decode cannot count on


def relative_costs(seconds, max_block_size):
    """[cost(n) for n in 0..B-1]: the seconds at t = n+1 (interpolated) over the seconds at t = 1.

    >>> relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5)
    [1.0, 1.25, 1.375, 1.5, 1.625]
    """
    return [s / seconds[1] for s in interpolated(seconds, max_block_size)]


def sampling_of(sampled):
    return Sampling(*SAMPLED[:1], None, SAMPLED[1]) if sampled else Sampling(0.0, None, None)


def plain_calls(target, sampled, text=None):
    """Plain decoding, timed through `generate`: {"request": a PROMPT_LEN-token prompt and its first token,
    "short"/"long": 1 and 1 + PLAIN_TOKENS tokens after CONTEXT - PLAIN_TOKENS // 2 tokens} (the plain
    tokens' contexts centred on CONTEXT)."""
    s, context = sampling_of(sampled), token_ids(target, CONTEXT - PLAIN_TOKENS // 2, text)

    def call(prompt, n):
        return lambda: generate(target, prompt, n, s.temperature, s.top_k, s.top_p,
                                generator=torch.Generator().manual_seed(0))
    return {"request": call(context[:PROMPT_LEN], 1), "short": call(context, 1),
            "long": call(context, 1 + PLAIN_TOKENS)}


def plain_figures(seconds):
    """The seconds of plain_calls -> {token: seconds per plain token, request: a request's seconds}. Where
    noise swamps the difference (a few calls on a busy machine: "long" no slower than "short"), the token is
    the long generation's seconds per token, its prefill included.

    >>> plain_figures(dict(request=1.0, short=2.0, long=18.0))
    {'token': 1.0, 'request': 1.0}
    >>> round(plain_figures(dict(request=1.0, short=2.0, long=1.7))["token"], 6)     # 1.7 s over 17 tokens
    0.1
    """
    token = (seconds["long"] - seconds["short"]) / PLAIN_TOKENS
    if token <= 0:
        token = seconds["long"] / (1 + PLAIN_TOKENS)
    return dict(token=token, request=seconds["request"])


def step_calls(target, drafter, sampled, sizes, text=None):
    """{t: one `speculative_step` with a block of t tokens (t-1 drafts) after CONTEXT tokens, put back after
    each call} for t in sizes, and {"request": `speculative_generate` of one token after a PROMPT_LEN-token
    prompt}. The caches are set as the loop leaves them: one full-block step after the prefill, so a step
    projects what the step before it kept."""
    s, B = sampling_of(sampled), drafter.block_size
    n = min(CONTEXT, target.config.max_seq_len - 3 * B)
    g = torch.Generator().manual_seed(0)
    request, prompt = start_request(target, drafter, token_ids(target, n, text), 3 * B, s, generator=g)
    first = prefill(target, drafter, prompt, request.cache, request.dcache, s, g)
    anchor = speculative_step(request, first, B, 2 * B).new[-1]
    length, mark = request.cache.length, drafter.mark(request.dcache)

    def step_of(t):
        def call():
            speculative_step(request, anchor, t, B)
            request.cache.crop(length)
            drafter.rewind(request.dcache, mark)
        return call

    def one_token():
        speculative_generate(target, drafter, token_ids(target, PROMPT_LEN, text), 1, block_size=B,
                             temperature=s.temperature, top_p=s.top_p, generator=g)
    return {**{t: step_of(t) for t in sizes}, "request": one_token}


def fewest_fast(seconds):
    """The fewest threads within SAME_SPEED of the fastest: {threads: seconds} -> threads.

    >>> fewest_fast({1: 1.0, 2: 0.95, 4: 0.8})
    4
    >>> fewest_fast({1: 1.0, 2: 0.95})
    1
    """
    fastest = min(seconds.values())
    return min(n for n, s in seconds.items() if s <= fastest * (1 + SAME_SPEED))


def choose_threads(target, drafter, n_calls=N_CALLS, log=print, text=None, max_threads=MAX_THREADS):
    """Time plain greedy decoding's token and a full-block greedy speculative step at 1, 2, ... threads, all
    in one interleaved loop -> {plain: threads, speculative: threads, by_count: {threads: {plain: s,
    speculative: s}}}; the thread count is left as it was."""
    before, B = torch.get_num_threads(), drafter.block_size
    counts = range(1, min(os.cpu_count() or 1, max_threads) + 1)
    plain = {k: fn for k, fn in plain_calls(target, False, text).items() if k != "request"}
    calls = {**plain, "spec": step_calls(target, drafter, False, [B], text)[B]}
    try:
        s = median_seconds({(n, k): at_threads(n, fn) for n in counts for k, fn in calls.items()},
                           next(target.parameters()).device, n_calls, warm=True)
    finally:
        torch.set_num_threads(before)
    by_count = {str(n): dict(plain=plain_figures({k: s[n, k] for k in plain} | {"request": 0.0})["token"],
                             speculative=s[n, "spec"]) for n in counts}
    choice = {kind: fewest_fast({int(n): c[kind] for n, c in by_count.items()})
              for kind in ("plain", "speculative")}
    log(f"[calibrate] threads: plain {choice['plain']}, speculative {choice['speculative']} (plain token / "
        f"{B}-token step: " + ", ".join(f"{n} thread{'s' if n != '1' else ''} {1e3 * c['plain']:.2f} / "
                                       f"{1e3 * c['speculative']:.2f} ms" for n, c in by_count.items()) + ")")
    return dict(choice, by_count=by_count)


def at_threads(n, fn):
    """fn, called at n torch threads."""
    def call():
        torch.set_num_threads(n)
        return fn()
    return call


def time_single_steps(target, drafter, threads, n_calls=N_CALLS, text=None):
    """Batch 1 and plain decoding, greedy and sampled, every call in one interleaved loop, each at its own
    thread count ({plain, speculative}) -> {kind: dict(steps=[seconds of a step of t tokens for t in 1..B],
    request=a speculative request's seconds, plain={token, request})}, kind "greedy" or "sampled"."""
    B, calls = drafter.block_size, {}
    for kind in ("greedy", "sampled"):
        steps = step_calls(target, drafter, kind == "sampled", [t for t in COST_TOKENS if t <= B], text)
        calls.update({(kind, "step", k): at_threads(threads["speculative"], fn) for k, fn in steps.items()})
        plain = plain_calls(target, kind == "sampled", text)
        calls.update({(kind, "plain", k): at_threads(threads["plain"], fn) for k, fn in plain.items()})
    before = torch.get_num_threads()
    try:
        s = median_seconds(calls, next(target.parameters()).device, n_calls, warm=True)
    finally:
        torch.set_num_threads(before)
    out = {}
    for kind in ("greedy", "sampled"):
        steps = {k: v for (x, what, k), v in s.items() if x == kind and what == "step"}
        out[kind] = dict(request=steps.pop("request"), steps=interpolated(steps, B),
                         plain=plain_figures({k: v for (x, what, k), v in s.items()
                                              if x == kind and what == "plain"}))
    return out


def run_text(tok, out_dir):
    """Token ids of the run's validation text: enough for a batch of max(COST_ROWS) prompts of PROMPT_LEN
    tokens, else (a small corpus) CONTEXT of them (the batches then time prompts spread over the
    vocabulary)."""
    try:
        return val_prompts(tok, 1, max(CONTEXT, max(COST_ROWS) * PROMPT_LEN), SEED, run_corpus(out_dir))[0]
    except ValueError:
        return val_prompts(tok, 1, CONTEXT, SEED, run_corpus(out_dir))[0]


def processor():
    """The CPU's model name where the system says it (Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def step_tables(target, drafter, threads, rows, n_calls=N_CALLS, log=print, text=None):
    """Greedy and sampled, at the `threads` {plain, speculative} -> (costs {kind: {rows: [cost(n) for n in
    0..B-1]}}, batch 1's figures {kind: {steps, request, plain}} (time_single_steps), the batched steps' and
    starts' seconds (time_batch_tables), which price a batch). One row's costs are
    batch 1's (a one-prompt batch decides as speculative_generate does); from two rows on, a batched step
    over a plain batched step of the same rows."""
    single = time_single_steps(target, drafter, threads, n_calls, text)
    costs = {kind: {"1": [s / t["steps"][0] for s in t["steps"]]} for kind, t in single.items()}
    with using_threads(threads["speculative"]):
        batch, starts = time_batch_tables(target, drafter, rows, n_calls, text) if rows else ({}, {})
    for R in sorted({1, *rows}):
        for kind in costs:
            if R > 1:
                costs[kind][str(R)] = [s / batch[kind][str(R)][0] for s in batch[kind][str(R)]]
            log(f"[calibrate] {R:2d} row{'s' if R > 1 else ' '}, {kind}: a step with "
                f"{drafter.block_size - 1} drafts per row costs {costs[kind][str(R)][-1]:.2f} steps without "
                "drafts")
    return costs, single, (batch, starts)


def calibrate(target, drafter, n_calls=N_CALLS, rows=COST_ROWS, log=print, compiled=False, text=None,
              max_threads=MAX_THREADS):
    """Time decoding and return costs.json's entry for this machine: {key (its threads: the speculative
    count), threads: {plain, speculative, by_count} (choose_threads), costs: {kind: {rows: [cost(n) for n
    in 0..B-1]}}, step_seconds: {kind: [batch 1's step of t tokens for t in 1..B]}, request_seconds:
    {kind: s}, plain_seconds: {kind: {token, request}} (at the plain count), batch_step_seconds: {kind:
    {rows: [seconds of a batched step of t tokens per row for t in 1..B]}} and batch_start_seconds: {rows:
    {plain, speculative}: a batched generation's construction and prefill} (both at the speculative
    count), block_size, target (the fingerprint of the target timed), machine, measured, seconds}, kind
    "greedy" or "sampled". compiled: batch 1's steps with the drafter's pass compiled, under the compiled
    key (the batched decoder has no compiled pass). text: token ids of the run's text to time on
    (run_text), CONTEXT of them at least; max_threads: the most threads tried."""
    t0, B = time.perf_counter(), drafter.block_size
    device = next(target.parameters()).device
    drafter = compiled_pass.compile_drafter(drafter) if compiled else drafter
    threads = choose_threads(target, drafter, n_calls, log, text, max_threads)
    costs, single, (batch, starts) = step_tables(target, drafter, threads, () if compiled else rows, n_calls,
                                                 log, text)
    with using_threads(threads["speculative"]):
        key = cost_key(target, compiled)
    where = processor() if device.type == "cpu" else torch.cuda.get_device_name(device)
    return dict(key=key, block_size=B, threads=threads, costs=costs,
                step_seconds={k: t["steps"] for k, t in single.items()},
                request_seconds={k: t["request"] for k, t in single.items()},
                plain_seconds={k: t["plain"] for k, t in single.items()}, batch_step_seconds=batch,
                batch_start_seconds=starts, target=fingerprint(target),
                machine=f"{where}, {os.cpu_count()} CPUs, {platform.system()}",
                measured=datetime.date.today().isoformat(), seconds=round(time.perf_counter() - t0, 1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="the run folder (train_tiny.py --out) (default: %(default)s)")
    p.add_argument("--calls", type=ints(3, 1001), default=N_CALLS, help="timed calls per block size, the "
                   "median counts; a batched step's: 0.6 of them (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="the table of batch-1 steps with the drafter's "
                   "pass compiled (ext/compiled.compile_drafter), kept beside the eager one")
    p.add_argument("--max_threads", type=ints(1, 256), default=MAX_THREADS, help="the most threads tried: 1 "
                   "where other jobs share the cores (default: %(default)s, or the CPUs if fewer)")
    args = p.parse_args(argv)
    check_device(p, args.device)
    try:
        tok, target, drafter = load(args.out, args.device)
        text = run_text(tok, args.out)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    entry = calibrate(target, drafter, args.calls, compiled=args.compile, text=text,
                      max_threads=args.max_threads)
    path = write_costs(args.out, entry)
    print(f"wrote {path}: the threads and step costs of {describe(entry['key'])} on {entry['machine']} "
          f"({entry['seconds']:.0f} s; {len(read_costs(args.out))} machine key(s) in the file)")


if __name__ == "__main__":
    main()
