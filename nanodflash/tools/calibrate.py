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
of the run's text as the bench runs them (BatchSteps); from 2 rows on, `auto` weighs drafts by their ratio,
since a batch drafts only when that beats plain batched decoding. Each is the median of `calls` calls, every
step's calls interleaved with the others' by the benchmarks' one timing loop (measure.interleaved), each right
after an untimed call of the same step (in a decode a step follows a step of its kind). train_tiny.py
calibrates at its end; costs.json keeps one entry per machine key (device, dtype, threads, torch version,
compile mode), so a folder copied to another machine keeps its first machine's and gets one of its own.
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
from ..sampling import Sampling
from ..speculative import generate, prefill, speculative_generate, speculative_step, start_request
from ..store.checkpoint import fingerprint, load
from ..store.data import val_prompts
from ..store.run_folder import read_costs, run_corpus, write_costs
from .cli import check_device, ints, using_threads
from .measure import interleaved

CONTEXT = 64                      # tokens of context the timed steps attend to (a bench generation's middle)
PROMPT_LEN = 16                   # the timed request's prompt: the bench's prompts' length
BATCH_NEW_TOKENS = 96             # a timed batch's generations' tokens: the bench's (and its widths)
PLAIN_TOKENS = 16                 # plain decoding's token: (generate 1 + this many - generate 1) / this many
COST_TOKENS = (1, 2, 4, 8, 16)    # block sizes timed; the others are interpolated linearly
N_CALLS = 25                      # timed calls per block size (the median counts), each after an untimed
                                  # call of its own: how well two calibrations agree: docs/log.md
SAMPLED = (0.7, 0.95)             # sampled steps are timed at this temperature and top-p (the bench's)
MAX_THREADS = 8                   # thread counts tried: 1 .. min(this, the machine's CPUs)
SEED = 7                          # picks the run's text the steps are timed on
SAME_SPEED = 0.10                 # more threads must be this much faster to be chosen: on a shared 2-core
                                  # machine two threads' timings move by about this much between minutes
                                  # (docs/log.md), a gain a decode cannot count on


def median_seconds(steps, device, n=N_CALLS, warm=False):
    """{name: median wall-clock seconds of n calls of fn()} for steps {name: fn}, timed by the benchmarks'
    one loop (measure.interleaved: every step's call in turn, the order rotated call by call, so a slow
    moment of the machine weighs on all of them alike), after one untimed call of each. warm: each timed
    call right after an untimed one of its own, as in a decode, where a step follows a step of its kind
    (the calibration's steps; BatchSteps counts on those pairs)."""
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


def relative_costs(seconds, max_block_size):
    """[cost(n) for n in 0..B-1]: the seconds at t = n+1 (interpolated) over the seconds at t = 1.

    >>> relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5)
    [1.0, 1.25, 1.375, 1.5, 1.625]
    """
    return [s / seconds[1] for s in interpolated(seconds, max_block_size)]


def token_ids(target, n, text=None):
    """n token ids to time on: the first n of `text` (the run's own text: the drafts accepted, the kept
    positions projected and the sampler's nucleus are then the decoders'), else ids spread over the
    vocabulary."""
    if text is not None and len(text) >= n:
        return list(text[:n])
    return [(7 * i + 3) % target.config.vocab_size for i in range(n)]


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


def batch_prompts(target, rows, text=None):
    """`rows` prompts of PROMPT_LEN tokens for a timed batch: consecutive pieces of the run's text (the drafts
    the rows keep are then the decoders'), else ids spread over the vocabulary."""
    ids = token_ids(target, rows * PROMPT_LEN, text)
    return [ids[r * PROMPT_LEN: (r + 1) * PROMPT_LEN] for r in range(rows)]


def batch_sampling(sampled):
    """A timed batch's sampling arguments: SAMPLED's temperature and top-p with a seeded generator if
    sampled, else greedy."""
    return dict(temperature=SAMPLED[0] if sampled else 0.0, top_p=SAMPLED[1] if sampled else None,
                generator=torch.Generator().manual_seed(0))


class BatchSteps:
    """The steps of batched generations, one step per call, as the loop runs them (drop_finished, then the
    step): the rows grow apart as they keep different numbers of drafts, and a step attends as wide as the
    longest row, as the decoders' steps do. Every timed step has all its rows: calls come in pairs
    (median_seconds with warm: an untimed call, then the timed one), and the first of a pair starts a new
    generation (construction and prefill) where the running one could lose a row within the pair; any call
    does where it could lose one in this step (calls out of pairs: that call then pays for the start).
    new_batch() -> a PlainBatch (t = 1: its plain_step) or a SpecBatch at block size t (its step).

    >>> class Batch:        # each step emits t tokens per row, 10 to generate: a new batch after 4 steps
    ...     def __init__(self): self.max_new, self.rows, self.outs = 10, [0], [[0]]
    ...     def prefill(self): pass
    ...     def drop_finished(self): pass
    ...     def step(self): self.outs[0] += [0, 0]
    >>> starts = []
    >>> steps = BatchSteps(lambda: starts.append(1) or Batch(), 2)
    >>> for _ in range(8):
    ...     steps()
    >>> len(starts)         # at calls 1 and 5: the first of a pair, with 4 <= 2 * 2 tokens left
    2
    """

    def __init__(self, new_batch, t):
        self.new_batch, self.t, self.calls, self.batch = new_batch, t, 0, None

    def tokens_left(self):
        """The fewest tokens any row has left to generate (inf before the first generation)."""
        b = self.batch
        return min(b.max_new - len(b.outs[r]) for r in b.rows) if b is not None else float("inf")

    def __call__(self):
        reach = 2 * self.t if self.calls % 2 == 0 else self.t          # this pair's steps, or this step
        if self.batch is None or self.tokens_left() <= reach:
            self.batch = self.new_batch()
            self.batch.prefill()
        self.calls += 1
        self.batch.drop_finished()
        if self.t == 1:
            self.batch.plain_step()
        else:
            self.batch.step()


def new_batch_of(target, drafter, rows, t, sampled, text=None):
    """() -> a new batched generation of `rows` prompts of the run's text, BATCH_NEW_TOKENS tokens (fewer
    where the target's window is short): a PlainBatch (t = 1) or a SpecBatch at block size t, sampled as
    batch_sampling says."""
    n = min(BATCH_NEW_TOKENS, target.config.max_seq_len - PROMPT_LEN - drafter.block_size)

    def new_batch():
        prompts, how = batch_prompts(target, rows, text), batch_sampling(sampled)
        if t == 1:
            return PlainBatch(target, prompts, n, **how)
        return SpecBatch(target, drafter, prompts, n, block_size=t, **how)
    return new_batch


def prefill_call(new_batch):
    """A batched generation's start, as a call: its construction (the caches) and its prefill."""
    return lambda: new_batch().prefill()


@torch.no_grad()
def time_batch_tables(target, drafter, rows, n_calls=N_CALLS, text=None):
    """({kind: {rows: [seconds of a step of t tokens per row for t in 1..B]}}, {rows: {plain, speculative}:
    seconds of a generation's start}), kind "greedy" or "sampled", for every row count: at t = 1 a plain
    batched step (PlainBatch.plain_step, what plain batched decoding pays per token), at the other
    COST_TOKENS sizes up to the drafter's block size a batched speculative step (SpecBatch.step: draft t-1
    tokens per row, verify t per row, emit, project into the drafter's context; sampled: drafts drawn from
    q and verified row by row at SAMPLED's temperature and top-p), each inside generations of the run's
    text (BatchSteps), linear in between; a start is a batch's construction and prefill (a SpecBatch's
    projects the prompts into the drafter's context too), greedy (a sampled start differs by one draw).
    Every row count and kind in one interleaved loop: a batch is priced by these seconds at the rows it
    has left, so a slow moment of the machine must weigh on every row count alike, not shift one of them."""
    B, device = drafter.block_size, next(target.parameters()).device
    sizes, kinds = [t for t in COST_TOKENS if t <= B], ("greedy", "sampled")
    steps = {(kind, R, t): BatchSteps(new_batch_of(target, drafter, R, t, kind == "sampled", text), t)
             for kind in kinds for R in rows for t in sizes}
    starts = {(R, side): prefill_call(new_batch_of(target, drafter, R, t, False, text))
              for R in rows for side, t in (("plain", 1), ("speculative", B))}
    s = median_seconds(steps | starts, device, n_calls, warm=True)
    return ({kind: {str(R): interpolated({t: s[kind, R, t] for t in sizes}, B) for R in rows}
             for kind in kinds},
            {str(R): {side: s[R, side] for side in ("plain", "speculative")} for R in rows})


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
    p.add_argument("--calls", type=ints(3, 1001), default=N_CALLS, help="timed calls per block size and row "
                   "count, the median counts (default: %(default)s)")
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
