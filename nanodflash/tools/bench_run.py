"""The benchmark's core: every method on every prompt, interleaved, timed, one row per method.

    rows = run_benchmark(target, drafter, prompts, methods)     # methods: bench_methods.py

`python -m nanodflash.tools.bench` (bench.py) prints these rows and the sections after them; bench_tree.py and
the notebooks call it too.
"""

import statistics
import time

import torch

from . import bench_table
from .bench_methods import default_methods
from .measure import ForwardCounter, interleaved, tau_by_band, tau_by_repetition
from .progress import Progress, duration
from .repetition import pooled_repetition, repetition

MAX_NEW_TOKENS, SEED = 96, 1337     # new tokens per prompt (480: long generations), the seed of prompt 0


def run_benchmark(target, drafter, prompts, methods=None, max_new_tokens=MAX_NEW_TOKENS, seed=SEED,
                  warmup=True, log=None):
    """Run every method on every prompt (interleaved); return one row dict per method. log(line), when
    given, gets an estimate from a second, timed warm-up pass and progress lines (prompt, row, elapsed,
    ETA) as it goes.

    Row fields: name, temperature, tau, forwards_per_token, tokens_per_s, speedup, ceiling, plus the totals
    they come from (prompts, tokens, steps, forwards, seconds, draft_s, verify_s), by_prompt_speedup and
    step_cost (bench_table.add_spread_and_step_cost) and, for greedy rows, matches_plain (every output equal
    to the first greedy method's output on that prompt).

    ceiling (speculative rows; None for plain ones) is an upper bound on speedup BY CONSTRUCTION: within
    one timed run the loop's draft and verify timers cover disjoint parts of it, so its tokens/s is at
    most tokens / (draft_time + verify_time); that holds prompt by prompt, the median keeps it (each order
    statistic of the rates is <= the same one of the bounds; for an even count we take the upper median),
    and speedup and ceiling divide by the same plain tok/s. `bound` holds that median prompt's numbers per
    step: ceiling = tau * t_plain / (t_draft + t_verify) with t_plain = 1 / plain tok/s, tau counting the
    prefill's token. Unlike isolated step costs, in-loop costs include everything the loop does.
    """
    methods = methods or default_methods(drafter)
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"method names must be unique: {[m.name for m in methods]}")
    progress = warm_up(target, drafter, prompts, methods, max_new_tokens, seed, log) if warmup else \
        (None if log is None else Progress(log, "bench"))
    acc = {m.name: dict(tokens=0, steps=0, forwards=0, seconds=0.0, draft_s=0.0, verify_s=0.0, rates=[],
                        bounds=[], runs=[], outs=[], by_prompt=[],
                        matches_plain=True if m.temperature == 0 else None)
           for m in methods}
    counter, outputs = ForwardCounter(target), [{} for _ in prompts]     # per prompt: method name -> tokens

    def run(m, prompt, i):
        counter.n = 0
        return m.run(target, drafter, prompt, max_new_tokens, torch.Generator().manual_seed(seed + i))
    try:
        runs = interleaved(methods, prompts, run, next(target.parameters()).device)
        for calls, (i, m, (tokens, stats), dt) in enumerate(runs, 1):
            if progress is not None:
                progress.done(calls, len(methods) * len(prompts), f"prompt {i + 1}/{len(prompts)}, {m.name}")
            outputs[i][m.name] = tokens
            add_run(acc[m.name], tokens, stats, dt, counter.n)
    finally:
        counter.remove()
    greedy = [m.name for m in methods if m.temperature == 0]
    for out in outputs:                                     # lossless: every greedy output == the first one's
        for name in greedy:
            acc[name]["matches_plain"] &= out[name] == out[greedy[0]]
    return finish_rows(methods, acc, len(prompts))


def warm_up(target, drafter, prompts, methods, max_new_tokens, seed, log):
    """Every method once on the first prompt (first calls pay for allocation, kernel setup and any
    compiling); with `log`, a second, timed pass scaled up to an estimate of the rows' time -> a Progress,
    or None without `log`."""
    warm_tokens, t0 = min(16, max_new_tokens), time.perf_counter()

    def one_pass():
        for m in methods:
            m.run(target, drafter, prompts[0], warm_tokens, torch.Generator().manual_seed(seed))
    one_pass()
    if log is None:
        return None
    t1 = time.perf_counter()                    # a rough scale-up of a second, warm pass: a prompt costs
    one_pass()                                  # about its new tokens
    guess = (time.perf_counter() - t1) * max_new_tokens / warm_tokens * len(prompts)
    progress = Progress(log, "bench")           # its clock starts after the warm-up
    progress.say(f"{len(methods)} rows x {len(prompts)} prompts x {max_new_tokens} new tokens; from the "
                 f"warm-up, expect about {duration(guess)} for the rows (the first warm-up pass took "
                 f"{duration(t1 - t0)}, compiling included)")
    return progress


def add_run(a, tokens, stats, dt, forwards):
    """Add one timed run (its tokens, stats or None for plain decoding, seconds, target forwards) to a
    method's totals `a`."""
    steps = len(tokens) - 1 if stats is None else len(stats.acceptance_lengths)
    a["outs"].append(tokens)
    a["tokens"] += len(tokens)
    a["steps"] += steps
    a["forwards"] += forwards
    a["seconds"] += dt
    a["rates"].append(len(tokens) / dt)
    a["by_prompt"].append(dict(tokens=len(tokens), steps=steps, rate=len(tokens) / dt,
                               repetition=repetition(tokens)))
    if stats is not None:
        a["runs"].append(stats.acceptance_lengths)                         # for τ by position band
        a["draft_s"] += stats.draft_time
        a["verify_s"] += stats.verify_time
        loop = stats.draft_time + stats.verify_time
        a["bounds"].append(dict(                                           # loop <= dt (run_benchmark)
            tokens_per_s=len(tokens) / loop if loop > 0 else float("inf"),
            tau=len(tokens) / max(steps, 1), draft_s=stats.draft_time / max(steps, 1),
            verify_s=stats.verify_time / max(steps, 1)))


def finish_rows(methods, acc, n):
    """One row per method from its totals over n prompts: τ, tok/s (the median over prompts), speedup and
    ceiling over the plain row at the same temperature, spread, step cost, τ by repetition."""
    rows = []
    for m in methods:
        a = acc[m.name]
        rate = statistics.median(a.pop("rates"))
        bounds = sorted(a.pop("bounds"), key=lambda b: b["tokens_per_s"])
        runs = a.pop("runs")
        a["repetition"] = pooled_repetition(a.pop("outs"))          # of the text this row's τ came from
        a["bands"] = [[lo, hi, t] for (lo, hi), t in tau_by_band(runs).items()] if runs else None   # for JSON
        rows.append(dict(name=m.name, temperature=m.temperature, prompts=n,
                         tau=(a["tokens"] - n) / a["steps"] if a["steps"] else float("nan"),
                         forwards_per_token=a["forwards"] / a["tokens"], tokens_per_s=rate,
                         bound=bounds[len(bounds) // 2] if bounds else None, **a))   # median (upper if even)
    for r in rows:
        base = next(b for b in rows if b["temperature"] == r["temperature"])
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["ceiling"] = None if r["bound"] is None else r["bound"]["tokens_per_s"] / base["tokens_per_s"]
        bench_table.add_spread_and_step_cost(r, base)
    tau_by_repetition(rows)
    return rows
