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
                  warmup=True, log=None, repeats=1):
    """Run every method on every prompt (interleaved), `repeats` times over; return one row dict per method.
    A method with `threads` runs at that many torch threads (the count is put back at the end). log(line),
    when given, gets an estimate from a second, timed warm-up pass and progress lines (prompt, row,
    elapsed, ETA) as it goes.

    The speedup, here and everywhere in the project: the generated tokens of all prompts over their seconds,
    against plain decoding's at the same temperature; repeated, the median over the repetitions, each a
    pass over every prompt (`speedup_spread`: the least and the most). Row fields: name, temperature,
    threads, tau, forwards_per_token, tokens_per_s (over every repetition), speedup, speedup_spread, ceiling,
    plus the totals they come from (prompts, tokens, steps, forwards, seconds, draft_s, verify_s, each over
    every repetition), `by_prompt` (the first repetition's prompts), `blocks` (each prompt's block sizes
    per step, the prediction's input), by_prompt_speedup and step_cost (bench_table.add_spread_and_step_cost)
    and, for greedy rows, matches_plain (every output equal to the first greedy method's on that prompt);
    ceiling and bound: finish_rows."""
    methods = methods or default_methods(drafter)
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"method names must be unique: {[m.name for m in methods]}")
    before = torch.get_num_threads()
    progress = warm_up(target, drafter, prompts, methods, max_new_tokens, seed, log, repeats) if warmup else \
        (None if log is None else Progress(log, "bench"))
    acc = {m.name: new_totals(m, repeats) for m in methods}
    counter, outputs = ForwardCounter(target), [{} for _ in prompts]     # per prompt: method name -> tokens
    passes = [(r, i) for r in range(repeats) for i in range(len(prompts))]
    run = runner(target, drafter, prompts, max_new_tokens, seed, counter)
    try:
        runs = interleaved(methods, passes, run, next(target.parameters()).device)
        for calls, (k, m, (tokens, stats), dt) in enumerate(runs, 1):
            (r, i), total = passes[k], len(methods) * len(passes)
            if progress is not None:
                progress.done(calls, total, f"prompt {i + 1}/{len(prompts)} of pass {r + 1}/{repeats}, "
                              f"{m.name}")
            outputs[i][m.name] = tokens
            add_run(acc[m.name], r, tokens, stats, dt, counter.n)
    finally:
        counter.remove()
        torch.set_num_threads(before)
    greedy = [m.name for m in methods if m.temperature == 0]
    for out in outputs:                                     # lossless: every greedy output == the first one's
        for name in greedy:
            acc[name]["matches_plain"] &= out[name] == out[greedy[0]]
    return finish_rows(methods, acc, len(prompts))


def runner(target, drafter, prompts, max_new_tokens, seed, counter):
    """run(method, (repetition, prompt index), _) for the timing loop: the method on that prompt, seeded by
    it, at the method's threads, its target forwards counted afresh."""
    def run(m, item, _):
        counter.n = 0
        if m.threads:
            torch.set_num_threads(m.threads)
        i = item[1]
        return m.run(target, drafter, prompts[i], max_new_tokens, torch.Generator().manual_seed(seed + i))
    return run


def new_totals(m, repeats):
    """A method's empty totals: over every repetition, and per repetition (its seconds, tokens, loop)."""
    return dict(tokens=0, steps=0, forwards=0, seconds=0.0, draft_s=0.0, verify_s=0.0, runs=[], outs=[],
                by_prompt=[], blocks=[], threads=m.threads, passes=[[0, 0.0, 0.0] for _ in range(repeats)],
                matches_plain=True if m.temperature == 0 else None)


def warm_up(target, drafter, prompts, methods, max_new_tokens, seed, log, passes=1):
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
    guess = (time.perf_counter() - t1) * max_new_tokens / warm_tokens * len(prompts) * passes
    progress = Progress(log, "bench")           # its clock starts after the warm-up
    progress.say(f"{len(methods)} rows x {len(prompts)} prompts x {max_new_tokens} new tokens, {passes} "
                 f"pass(es); from the warm-up, expect about {duration(guess)} for the rows (the first "
                 f"warm-up pass took {duration(t1 - t0)}, compiling included)")
    return progress


def add_run(a, rep, tokens, stats, dt, forwards):
    """Add one timed run of repetition `rep` (its tokens, stats or None for plain decoding, seconds, target
    forwards) to a method's totals `a`; the first repetition's runs are kept prompt by prompt."""
    steps = len(tokens) - 1 if stats is None else len(stats.acceptance_lengths)
    loop = dt if stats is None else stats.draft_time + stats.verify_time
    for key, value in (("tokens", len(tokens)), ("steps", steps), ("forwards", forwards), ("seconds", dt)):
        a[key] += value
    a["passes"][rep] = [x + y for x, y in zip(a["passes"][rep], (len(tokens), dt, loop))]
    if stats is not None:
        a["draft_s"] += stats.draft_time
        a["verify_s"] += stats.verify_time
    if rep > 0:
        return
    a["outs"].append(tokens)
    a["by_prompt"].append(dict(tokens=len(tokens), steps=steps, rate=len(tokens) / dt,
                               repetition=repetition(tokens)))
    a["blocks"].append(None if stats is None else list(stats.block_sizes))
    if stats is not None:
        a["runs"].append(stats.acceptance_lengths)                         # for τ by position band


def finish_rows(methods, acc, n):
    """One row per method from its totals over n prompts: τ, tok/s, speedup and ceiling over the plain row
    at the same temperature (the median over repetitions, and its spread), spread over prompts, step cost,
    τ by repetition.

    ceiling (speculative rows; None for plain ones) is an upper bound on speedup BY CONSTRUCTION: within
    one timed run the loop's draft and verify timers cover disjoint parts of it, so a repetition's tokens
    over its draft and verify seconds is at least its tokens over its seconds; each repetition's bound over
    plain's rate is at least its speedup, and so is the median of them (each order statistic keeps it).
    `bound` holds the numbers per step over every repetition: tau * t_plain / (t_draft + t_verify), t_plain
    = 1 / plain tok/s, tau counting the prefill's token. Unlike isolated step costs, in-loop costs include
    everything the loop does."""
    rows = []
    for m in methods:
        a = acc[m.name]
        runs, passes = a.pop("runs"), a.pop("passes")
        a["repetition"] = pooled_repetition(a.pop("outs"))          # of the text this row's τ came from
        a["bands"] = [[lo, hi, t] for (lo, hi), t in tau_by_band(runs).items()] if runs else None   # for JSON
        steps = a["steps"]
        bound = None if not a["draft_s"] + a["verify_s"] else dict(                   # plain: no step timers
            tokens_per_s=a["tokens"] / (a["draft_s"] + a["verify_s"]), tau=a["tokens"] / steps,
            draft_s=a["draft_s"] / steps, verify_s=a["verify_s"] / steps)
        rows.append(dict(name=m.name, temperature=m.temperature, prompts=n,
                         tau=(a["tokens"] - n * len(passes)) / steps if steps and a["forwards"] else None,
                         forwards_per_token=a["forwards"] / a["tokens"],
                         tokens_per_s=a["tokens"] / a["seconds"], bound=bound, pass_totals=passes, **a))
    for r in rows:
        base = next(b for b in rows if b["temperature"] == r["temperature"])
        pairs = list(zip(r["pass_totals"], base["pass_totals"]))         # per repetition: (row's, plain's)
        ratios = [(t / s) / (bt / bs) for (t, s, _), (bt, bs, _) in pairs]
        r["speedup"], r["speedup_spread"] = statistics.median(ratios), [min(ratios), max(ratios)]
        r["ceiling"] = None if r["bound"] is None else statistics.median(
            (t / loop) / (bt / bs) for (t, _, loop), (bt, bs, _) in pairs)
        bench_table.add_spread_and_step_cost(r, base)
    tau_by_repetition(rows)
    return rows
