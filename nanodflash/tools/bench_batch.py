"""Batched decoding benchmark: plain batched decoding vs batched DFlash, per batch size, side by side in one
run.

    python -m nanodflash.tools.bench_batch --out DIR --batch 1,2,4,8,16,32 [--n_prompts 64] [--json PATH]
    python -m nanodflash.tools.bench_batch --out DIR --temperature 0.7 --top_p 0.95    # sampled
    python -m nanodflash.tools.bench_batch --out DIR --costs_only     # only the step costs B=auto uses

For every batch size R the held-out prompts (nanodflash.store.data.val_prompts, as bench.py takes them) are
cut into batches of R; each batch runs every method, the order rotated per batch (interleaved), after a
warm-up, and where that makes fewer than MIN_RUNS timed runs per method, the batches run again (passes).
Methods: plain batched decoding (generate_batch), batched DFlash (speculative_generate_batch) at B = 4, 8, 16
and auto, greedy; at R = 1 also the batch-1 loop (speculative_generate) at B=16 and auto, for the batch-1
bar. With --temperature: the same sampled (the run's sampling drafter, the rejection verifier, B = 2, 4, 8
and auto; the batch-1 loop at B=4 and auto), every method drawing from a generator seeded by the batch.
Reported: total tokens/s (all generated tokens / all seconds of that method at that R) and its ratio to
plain at the same R, τ, the batch size at which each block size stops paying (its first R with tokens/s below
plain's), auto against the fixed block size that was fastest in the first pass, in the passes after it
(auto_over_best), and (greedy) whether every output equals plain's. Then the step costs block_size="auto"
weighed drafts by (the run folder's table, step_costs.py, at the batch_policy.COST_ROWS row counts).
"""

import argparse
import json
import os
import time

import torch

from ..ext.batch import batch_costs, generate_batch, speculative_generate_batch
from ..ext.batch_policy import COST_ROWS
from ..ext.step_costs import calibration, predicted_batch_speedup, prices_batches
from ..speculative import speculative_generate
from ..store.checkpoint import load
from ..store.run_folder import drafter_path, run_corpus
from .cli import decode_threads, floats, ints
from .measure import bench_flags, bench_prompts, interleaved, machine
from .repetition import pooled_repetition
from .watch import policy

N_PROMPTS, PROMPT_LEN, MAX_NEW_TOKENS, SEED = 64, 16, 96, 1337
GREEDY_B, SAMPLED_B = (4, 8, 16, "auto"), (2, 4, 8, "auto")    # the block sizes compared
MIN_RUNS = 4        # timed runs of each method at a batch size: with fewer batches than this, each batch runs
                    # again (a pass), the order rotated, so one slow moment of the machine does not decide


def methods(drafter, sampling):
    """[(name, fn(target, drafter, prompts, n, generator) -> (outputs, stats))]; sampling: dict(temperature,
    top_p), empty for greedy."""
    plain = ("plain", lambda t, d, ps, n, g: (generate_batch(t, ps, n, generator=g, **sampling), None))
    spec = [(f"dflash B={b}", lambda t, d, ps, n, g, b=b: speculative_generate_batch(
                t, d, ps, n, block_size=b, generator=g, **sampling))
            for b in (SAMPLED_B if sampling else GREEDY_B) if b == "auto" or b <= drafter.block_size]
    return [plain] + spec


def batch1_methods(drafter, sampling):
    """The batch-1 reference loop, one prompt at a time (R = 1 only), at the drafter's B (sampled: 4) and
    auto."""
    def run(b):
        return lambda t, d, ps, n, g: ([speculative_generate(t, d, ps[0], n, block_size=policy(b),
                                                             generator=g, **sampling)[0]], None)
    first = min(4, drafter.block_size) if sampling else drafter.block_size
    return [(f"batch-1 loop B={b}", run(b)) for b in (first, "auto")]


def run_batch_size(target, drafter, prompts, R, max_new_tokens, sampling=None, seed=SEED, entry=None,
                   min_passes=1):
    """{method name: dict(tokens, seconds, tau, repetition, matches_plain, pass_ratios, predicted)} over the
    prompts in batches of R, interleaved, in enough passes over the batches that each method is timed
    MIN_RUNS times, and in at least `min_passes` passes (each pass's ratio to plain is kept, so a row's spread
    shows); `repetition`: of the method's outputs, the text its τ was measured on (repetition.py);
    pass_ratios: its tokens/s over plain's in each pass; predicted: the speedup over plain the calibration
    `entry` predicts from the method's own steps (None without an entry, and for the batch-1 loop).
    sampling: dict(temperature, top_p) to sample (the j-th batch run draws from a generator seeded seed + j,
    the same for every method; matches_plain is then None), None for greedy."""
    sampling = sampling or {}
    ms = methods(drafter, sampling) + (batch1_methods(drafter, sampling) if R == 1 else [])
    device = next(target.parameters()).device
    chunks = [prompts[i: i + R] for i in range(0, len(prompts), R)]
    passes = max(min_passes, -(-MIN_RUNS // len(chunks)))          # ceil(MIN_RUNS / batches) at least

    def generator(j):
        return torch.Generator().manual_seed(seed + j) if sampling else None

    for _, fn in ms:                                               # warm-up: allocation, first-call costs
        fn(target, drafter, chunks[0], 8, generator(0))
    acc = {name: dict(steps=0, emitted=0, outs=[], matches_plain=True, pass_seconds=[0.0] * passes,
                      pass_tokens=[0] * passes, priced={}) for name, _ in ms}
    outputs = [{} for _ in chunks * passes]                        # per batch run: method -> rows' tokens

    def run(method, chunk, j):
        return method[1](target, drafter, chunk, max_new_tokens, generator(j))

    for j, (name, _), (out, stats), dt in interleaved(ms, chunks * passes, run, device):
        a = acc[name]
        a["pass_seconds"][j // len(chunks)] += dt
        a["pass_tokens"][j // len(chunks)] += sum(map(len, out))
        if stats is not None:
            a["priced"][j] = list(zip(stats.block_sizes, stats.batch_rows))      # each step: (block, rows)
            a["steps"] += sum(len(s.acceptance_lengths) for s in stats.rows)
            a["emitted"] += sum(sum(s.acceptance_lengths) for s in stats.rows)
        outputs[j][name] = out
        a["outs"] += out
    for outs in outputs:
        for name in outs:
            acc[name]["matches_plain"] &= outs[name] == outs["plain"]
    if sampling:                                   # sampled outputs differ from plain's by design
        for a in acc.values():
            a["matches_plain"] = None
    plain_lengths = {j: [len(row) for row in outs["plain"]] for j, outs in enumerate(outputs)}
    for a in acc.values():
        priced = [(plain_lengths[j], steps) for j, steps in a.pop("priced").items()]
        a["predicted"] = predicted_batch_speedup(entry, priced, bool(sampling)) if entry and priced else None
    return summarised(acc)


def summarised(acc):
    """Each method's pooled figures from its per-pass sums (pass_tokens, pass_seconds): tokens, seconds,
    tokens/s, pass_ratios (to plain in the same pass), τ and the repetition of its text; auto's over_best."""
    plain_rates = [t / s for t, s in zip(acc["plain"]["pass_tokens"], acc["plain"]["pass_seconds"])]
    for a in acc.values():
        tokens, seconds = a["pass_tokens"], a["pass_seconds"]
        a["pass_ratios"] = [t / s / p for t, s, p in zip(tokens, seconds, plain_rates)]
        a["tokens"], a["seconds"] = sum(tokens), sum(seconds)
        a["tokens_per_s"] = a["tokens"] / a["seconds"]
        a["tau"] = a.pop("emitted") / a["steps"] if a["steps"] else None
        a["repetition"] = pooled_repetition(a.pop("outs"))
        del a["steps"]
    acc["dflash B=auto"]["over_best"] = auto_over_best(acc)
    return acc


def auto_over_best(result):
    """Auto against the best fixed block size: the best is the fastest in the first pass, and the two are
    compared in the passes after it, fresh interleaved runs (the fastest of several noisy rates, compared on
    the runs that made it the fastest, is flattered by its luck); with one pass, chosen and compared in it.
    -> dict(best, ratio: auto's tokens/s over the best's in those passes, pass_ratios: per pass, passes:
    their numbers, from 1).

    >>> run = lambda *rates: dict(pass_tokens=[10] * len(rates), pass_seconds=[10 / r for r in rates])
    >>> result = {"plain": run(1, 1, 1), "dflash B=4": run(3, 2, 2), "dflash B=8": run(2, 2.5, 2.5),
    ...           "dflash B=auto": run(2, 2.4, 2.6)}
    >>> auto_over_best(result)      # B=4 won pass 1 by luck; passes 2 and 3 compare auto with it afresh
    ...                             # (ratio: 20 tokens in 8.01 s against 20 in 10 s)
    {'best': 'dflash B=4', 'ratio': 1.248, 'pass_ratios': [1.2, 1.3], 'passes': [2, 3]}
    """
    fixed = [n for n in result if n.startswith("dflash") and n != "dflash B=auto"]
    n_passes = len(result["dflash B=auto"]["pass_tokens"])
    passes = list(range(1, n_passes)) if n_passes > 1 else [0]

    def rate(name, ps):
        a = result[name]
        return sum(a["pass_tokens"][p] for p in ps) / sum(a["pass_seconds"][p] for p in ps)
    best = max(fixed, key=lambda n: rate(n, [0]))
    return dict(best=best, ratio=round(rate("dflash B=auto", passes) / rate(best, passes), 6),
                pass_ratios=[round(rate("dflash B=auto", [p]) / rate(best, [p]), 6) for p in passes],
                passes=[p + 1 for p in passes])


def describe_sampling(sampling):
    if sampling is None:
        return "greedy"
    return f"T={sampling['temperature']:g}" + (f" top-p {sampling['top_p']:g}" if sampling["top_p"] else "")


def cost_tables(target, drafter, sampled=False):
    """{rows: [cost(n) for n in 0..B-1]}: the step costs block_size="auto" weighs drafts by (the run folder's
    table, step_costs.py), greedy or sampled, at every row count it lists (batch_policy.COST_ROWS)."""
    return {R: batch_costs(drafter, R, sampled) for R in COST_ROWS}


def format_costs(tables, how="greedy"):
    B = len(next(iter(tables.values())))
    shown = [n for n in (0, 1, 3, 7, 15, 31) if n < B]
    lines = [f"step costs of block_size=\"auto\", {how} (cost(n): a step with n drafts per row, in plain "
             "batched steps of the same rows; at 1 row, in steps without drafts):",
             "  rows " + "".join(f"  n={n:<4}" for n in shown)]
    for R, costs in tables.items():
        lines.append(f"  {R:>4} " + "".join(f"  {costs[n]:6.2f}" for n in shown))
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_flags(p, N_PROMPTS, MAX_NEW_TOKENS, SEED)      # --out, --data, --prompts, --seed, ...
    p.add_argument("--batch", default="1,2,4,8,16,32", help="batch sizes, comma-separated "
                   "(default: %(default)s)")
    p.add_argument("--costs_only", action="store_true", help="only print the step costs batch.py's auto "
                   "decides by (the run folder's costs.json, python -m nanodflash.tools.calibrate)")
    p.add_argument("--temperature", type=floats(0), default=0.0, help="0 (default): greedy; > 0: sampled "
                   "with the run's sampling drafter and the rejection verifier")
    p.add_argument("--top_p", type=floats(0, 1, low_open=True), default=None, help="with --temperature: "
                   "nucleus sampling")
    p.add_argument("--passes", type=ints(1, 100), default=1, help="passes over the prompts at least, at "
                   "every batch size: from 2 on, each row prints the spread of its passes (default: "
                   f"%(default)s; large batches make at least {MIN_RUNS} timed runs anyway)")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    if args.top_p is not None and args.temperature == 0:
        p.error("--top_p samples: give it with --temperature > 0")
    try:
        args.batch = [int(b) for b in args.batch.split(",")]
    except ValueError:
        p.error(f"--batch must be comma-separated integers, got {args.batch!r}")
    if any(b < 1 for b in args.batch):
        p.error(f"--batch sizes must be >= 1, got {args.batch}")
    return args


def print_table(result, batch_sizes):
    """tokens/s of every method at every batch size, with its ratio to plain batched decoding and its τ."""
    names = list(next(iter(result.values())))
    print("\ntotal tokens/s (ratio to plain batched decoding at the same batch size); τ and the "
          "repetition of the text it was measured on in brackets")
    print(f"{'method':<22}" + "".join(f"{'batch ' + str(R):>28}" for R in batch_sizes))
    for name in names + [n for n in result.get(1, {}) if n not in names]:
        cells = []
        for R in batch_sizes:
            a, plain = result[R].get(name), result[R]["plain"]
            if a is None:
                cells.append(f"{'':>28}")
                continue
            tau = f" [{a['tau']:.2f} {100 * a['repetition']:.0f}%]" if a["tau"] else ""
            ratio = a["tokens_per_s"] / plain["tokens_per_s"]
            cells.append(f"{a['tokens_per_s']:8.1f} ({ratio:4.2f}x){tau:>12}")
        print(f"{name:<22}" + "".join(f"{c:>28}" for c in cells))


def print_where_it_pays(result, batch_sizes, greedy):
    """The batch size where each block size stops paying, auto against plain and the best fixed block, the
    batched code at one row against the batch-1 loop, and (greedy) whether every output was plain's."""
    spec = [n for n in next(iter(result.values())) if n.startswith("dflash")]
    print("\nbatch size at which each block size stops paying (tokens/s below plain):")
    for name in spec:
        worse = [R for R in batch_sizes
                 if result[R][name]["tokens_per_s"] < result[R]["plain"]["tokens_per_s"]]
        print(f"  {name:<14} {f'batch {worse[0]}' if worse else f'never, up to batch {batch_sizes[-1]}'}")
    print("\nauto against plain and against the best fixed block size, per batch size:")
    for R in batch_sizes:
        auto = result[R]["dflash B=auto"]
        rate, ratios, best = auto["tokens_per_s"], auto["pass_ratios"], auto["over_best"]
        spread = f" [{min(ratios):.2f}-{max(ratios):.2f} in {len(ratios)} passes]" * (len(ratios) > 1)
        b, p = best["pass_ratios"], best["passes"]
        where = ("in the pass that chose it" if p == [1] else f"in pass {p[0]}" if len(p) == 1 else
                 f"[{min(b):.2f}-{max(b):.2f}] in passes {p[0]}-{p[-1]}")
        print(f"  batch {R:>3}: auto / plain {rate / result[R]['plain']['tokens_per_s']:.2f}x{spread}, "
              f"auto / best fixed ({best['best']}, the fastest in pass 1) {best['ratio']:.2f}x {where}")
    for loop in [n for n in result.get(1, {}) if n.startswith("batch-1 loop")]:
        same = "dflash " + loop.split()[-1]
        print(f"  batch 1: {same} (batched code) / {loop}: "
              f"{result[1][same]['tokens_per_s'] / result[1][loop]['tokens_per_s']:.2f}x")
    if greedy:
        bad = [(R, n) for R in batch_sizes for n, a in result[R].items() if not a["matches_plain"]]
        print("greedy outputs identical to plain batched decoding everywhere: "
              f"{'NO: ' + str(bad) if bad else 'yes'}")


def print_predictions(result, batch_sizes):
    """Each batched method's speedup over plain batched decoding beside the one the calibration predicts
    from the method's own steps (step_costs.predicted_batch_speedup: a batch priced until its slowest row is
    done)."""
    spec = [n for n in next(iter(result.values())) if n.startswith("dflash")]
    if all(result[R][n]["predicted"] is None for R in batch_sizes for n in spec):
        print("\nno predictions: the run folder's calibration has no batched step seconds "
              "(python -m nanodflash.tools.calibrate --out DIR)")
        return
    print("\nspeedup over plain batched decoding, measured [least-most pass] / predicted by the calibration:")
    print(f"{'method':<16}" + "".join(f"{'batch ' + str(R):>26}" for R in batch_sizes))
    for name in spec:
        cells = []
        for R in batch_sizes:
            a = result[R][name]
            measured = a["tokens_per_s"] / result[R]["plain"]["tokens_per_s"]
            spread = f"[{min(a['pass_ratios']):.2f}-{max(a['pass_ratios']):.2f}]"
            predicted = "-" if a["predicted"] is None else f"{a['predicted']:.2f}x"
            cells.append(f"{measured:.2f}x {spread} / {predicted}")
        print(f"{name:<16}" + "".join(f"{c:>26}" for c in cells))


def main(argv=None):
    args = parse_args(argv)
    sampling = dict(temperature=args.temperature, top_p=args.top_p) if args.temperature > 0 else None
    tok, target, drafter = load(args.out, args.device, sampling=sampling is not None)
    torch.set_num_threads(decode_threads(drafter, args.threads)["speculative"])     # every row, both kinds
    prompts, which = bench_prompts(args.prompts, tok, args.n_prompts, PROMPT_LEN, args.seed,
                                   args.data or run_corpus(args.out))
    which_drafter = os.path.basename(drafter_path(args.out, sampling is not None))
    print(f"nanodflash.tools.bench_batch: {args.out} ({drafter.kind} {which_drafter}, "
          f"B={drafter.block_size}) | {len(prompts)} {which} x {PROMPT_LEN} tokens, "
          f"{args.max_new_tokens} new tokens, {describe_sampling(sampling)} | {machine(args.device)}")
    result = dict(args={k: v for k, v in vars(args).items()}, batch={})
    entry = calibration(drafter)
    entry = entry if prices_batches(entry) else None     # none: no batched steps' seconds to price with
    if not args.costs_only:
        t0 = time.perf_counter()
        for R in args.batch:
            result["batch"][R] = run_batch_size(target, drafter, prompts, R, args.max_new_tokens, sampling,
                                                args.seed, entry, args.passes)
            print(f"  batch {R} done ({time.perf_counter() - t0:.0f}s)", flush=True)
        print_table(result["batch"], args.batch)
        print_where_it_pays(result["batch"], args.batch, greedy=sampling is None)
        print_predictions(result["batch"], args.batch)
    tables = cost_tables(target, drafter, sampled=sampling is not None)
    print("\n" + format_costs(tables, "greedy" if sampling is None else "sampled"))
    result.update(step_costs=tables)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
