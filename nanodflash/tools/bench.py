"""Side-by-side benchmark: plain decoding vs DFlash and its alternatives, on validation prompts, in one
process.

    python -m nanodflash.tools.bench --out out [--json bench.json]   # the headline rows (about 10 min at
    python -m nanodflash.tools.bench --out out --all_rows            # 64 prompts on 2 cores); every row
    python -m nanodflash.tools.bench --out out --prompts third_party  # on text no built-in corpus contains
    python -m nanodflash.tools.bench --out out --sampled_only --n_prompts 64   # the sampling drafter's rows
    python -m nanodflash.tools.bench --out out --compile     # + the DFlash rows, the drafter's pass compiled

All rows run on the same prompts, interleaved (each prompt: every row, the order rotated per prompt), after a
warm-up, in --repeats passes over the prompts, each row at the thread count the run's calibration chose for
its kind (plain or speculative; --threads N: N for all); progress goes to stderr (an estimate after the
warm-up, then prompt k of N with the ETA). Per row:
    threads      torch threads it decoded with
    tau          mean acceptance length = tokens emitted by draft/verify steps / steps (plain: 1)
    fwd/token    target forward passes per generated token (a hook on target.forward), about 1/tau
    tok/s        generated tokens / wall-clock seconds, over every prompt and pass
    speedup      the tokens of all prompts over their seconds, against plain decoding's at the same
                 temperature: the median of the passes [the least-the most] (the project's one speedup)
    predicted    the headline rows': the speedup the run folder's calibration predicts from the row's own
                 block sizes (ext/step_costs.predicted_speedup)
    prompts IQR  the interquartile range of each prompt's own speedup (its spread over prompts)
    draft+verify a step's draft and verify time in plain steps (plain's seconds per token), from the loop
Rows: by default bench_methods.headline_methods (plain and the drafter's own B and auto greedy; plain and
rejection B=4 and auto at T=0.7 top-p 0.95) and the peers (bench_peers.py: transformers' generate and the
official dflash_generate, when installed); with --all_rows bench_methods.default_methods (B=4/8/16/auto,
prompt lookup, baselines and other drafters, T=1, both verifiers, sampled trees, the main and the sampling
drafter).
After the table:
    ceiling      speedup <= tau * t_plain / (t_draft + t_verify), from in-loop costs (run_benchmark)
    step costs   one draft, one verify and one plain step timed in isolation (median of many calls), and
                 one draft step per DFlash-style drafter (e.g. "dflash2 draft step +2% vs dflash")
    slots        per draft slot of the T=0.7 rejection rows: sum min(p, q) = 1 - TV and acceptance
    oracle tau   (--all_rows) per DFlash-style drafter, the τ a perfect selector among its top-16
                 candidates per slot would reach (lost_tau.py)
    draft cost   one draft step vs drafted tokens, DFlash vs AR (the paper's Figure 3), when "ar" exists
    and a comparison of the DFlash row's tokens/s with the best AR and the best prompt lookup setting.

`run_benchmark(target, drafter, prompts, methods)` (bench_run.py, importable from here too) is the core; the
rows are in bench_methods.py.
"""

import argparse
import json
import os
import sys
import time

import torch

from ..ext.step_costs import calibration, costs_for, describe, predicted_speedup
from ..store.checkpoint import load, load_drafter
from ..store.run_folder import DRAFTER, SAMPLING_DRAFTER, TOY_RUN, is_toy_run, run_corpus
from . import bench_peers, bench_table, draft_costs, lost_tau
from .baselines import load_present
from .bench_methods import (
    SAMPLED,
    Method,
    compiled_methods,
    default_methods,
    dflash_method,
    dflash_style,
    headline_methods,
    kind_of,
    plain_method,
    prompt_lookup_method,
    sampling_drafters,
    with_threads,
)
from .bench_run import MAX_NEW_TOKENS, SEED, run_benchmark
from .cli import check_device, decode_threads, ints
from .measure import (
    bench_flags,
    bench_prompts,
    format_bands,
    machine,
)
from .progress import to_stderr

# the methods are importable from here too
__all__ = ["run_benchmark", "main", "Method", "default_methods", "plain_method", "dflash_method",
           "prompt_lookup_method"]

N_PROMPTS, PROMPT_LEN = 10, 16    # prompts of PROMPT_LEN tokens (MAX_NEW_TOKENS, SEED: bench_run.py)
REPEATS = 3             # passes over the prompts: the speedup's median and spread
N_TIMED_CALLS = 50      # calls per step-cost measurement (median reported)
ORACLE_TOP_K = 16

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_flags(p, N_PROMPTS, MAX_NEW_TOKENS, SEED)     # --out, --data, --prompts, ..., --threads
    p.add_argument("--repeats", type=ints(1, 100), default=REPEATS, help="passes over the prompts, "
                   "interleaved: the speedup is the median pass's, with the least and the most beside it "
                   "(default: %(default)s)")
    p.add_argument("--greedy_only", action="store_true", help="only plain greedy and the drafter's greedy "
                   "rows, no extra sections but the step costs: a quick check, e.g. of long generations "
                   "(--max_new_tokens 480)")
    p.add_argument("--sampled_only", action="store_true", help="only the sampled rows (T=1 and T=0.7 top-p "
                   "0.95) of the drafter sampling decodes with: drafter_sampling.pt where the run made one")
    p.add_argument("--drafters", nargs="+", default=[], metavar="DIR", help="more drafters to compare, each "
                   "DIR's drafter.pt, trained on the same target as --out's (e.g. another recipe): rows "
                   "named by the folder (implies --all_rows)")
    p.add_argument("--all_rows", action="store_true", help="every row (B=4/8/16/auto, both verifiers, "
                   "T=1, trees, prompt lookup, other drafters) and every section, not only the headline "
                   "rows: about ten times as long")
    p.add_argument("--no_peers", action="store_true", help="leave out the peer rows (transformers generate "
                   "and the official dflash_generate on the exported pair: tools/bench_peers.py), which the "
                   "headline and --all_rows run when those packages are installed")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the table, step costs and "
                   "settings as JSON")
    p.add_argument("--compile", action="store_true", help="also the headline's DFlash rows with the "
                   "drafter's block pass compiled (nanodflash/ext/compiled.py), each beside its eager row; "
                   "compiled by the warm-up (its time is printed)")
    args = p.parse_args(argv)
    args.all_rows = args.all_rows or bool(args.drafters)        # drafters asked for by name get their rows
    if args.greedy_only and args.sampled_only:
        p.error("--greedy_only and --sampled_only exclude each other")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        p.error(f"--json {args.json}: its folder does not exist")
    check_device(p, args.device)
    return args


def load_run(args, extra):
    """The run folder's models, its trained baselines with `extra` ({kind: drafter}) and --drafters, and the
    prompts -> (target, drafter, sampler or None, extra, prompts, which prompts)."""
    tok, target, drafter = load(args.out, args.device)
    extra = {**load_present(args.out, target, args.device, drafter.kind), **(extra or {})}
    for folder in args.drafters:           # other recipes on the same target (checked by fingerprint)
        name = os.path.basename(os.path.normpath(folder))
        if name in extra or name == kind_of(drafter):
            raise ValueError(f"--drafters {folder}: its row name {name!r} is taken; rename the folder")
        extra[name] = load_drafter(os.path.join(folder, DRAFTER), target, args.device)[0]
    sampling_path = os.path.join(args.out, SAMPLING_DRAFTER)
    sampler = (load_drafter(sampling_path, target, args.device)[0]
               if os.path.exists(sampling_path) and not args.greedy_only else None)
    prompts, which = bench_prompts(args.prompts, tok, args.n_prompts, PROMPT_LEN, args.seed,
                                   args.data or run_corpus(args.out))
    return target, drafter, sampler, extra, prompts, which


def chosen_methods(args, drafter, sampler, extra):
    """The rows the flags ask for -> (methods, the extra drafters among them)."""
    extra = {} if args.greedy_only or args.sampled_only else extra
    if args.all_rows or args.greedy_only or args.sampled_only:
        methods = default_methods(drafter, extra, greedy_only=args.greedy_only, sampler=sampler,
                                  sampled_only=args.sampled_only)
    else:
        methods, extra = headline_methods(drafter, sampler), {}
    if args.compile:
        methods += compiled_methods(drafter, sampler, not args.sampled_only, not args.greedy_only)
    if not (args.no_peers or args.sampled_only or args.greedy_only):         # the greedy question's peers
        methods += bench_peers.peer_methods(args.out, drafter, kind_of(drafter))
    return methods, extra


def print_rows(args, rows, prompts, which, wall, where):
    """The header, the table and the terciles -> the names of rows whose greedy output was not plain's."""
    print(f"nanodflash.tools.bench: {args.out} | {len(prompts)} {which} x {PROMPT_LEN} tokens, "
          f"{args.max_new_tokens} new tokens each | {where}")
    print(f"methods interleaved per prompt after a warm-up, {args.repeats} pass(es) over the prompts; the "
          f"speedup: total tokens over total seconds against plain decoding's; wall {wall:.1f}s")
    print((TOY_RUN + "\n") if is_toy_run(args.out) else "")
    print(bench_table.format_table(rows))
    print("speedup: over plain decoding at the same temperature (greedy rows vs 'plain greedy', T=1 rows vs "
          "'plain T=1', T=0.7 rows vs 'plain T=0.7 p=0.95')")
    print(bench_table.format_terciles(rows))
    print(bench_peers.format_peers(rows) or "(no peer rows: --no_peers, or transformers and dflash missing)")
    bad = [r["name"] for r in rows if r["matches_plain"] is False]
    print(f"greedy outputs identical to plain greedy on all {len(prompts)} prompts: "
          f"{'NO: ' + ', '.join(bad) if bad else 'yes'}")
    return bad


def print_ceiling(args, by_name, drafter):
    """The ceiling from in-loop costs, and the costs block_size="auto" weighs -> (main row, policy costs)."""
    kind, main_B = kind_of(drafter), min(16, drafter.block_size)
    main_row = by_name.get(f"{kind} greedy B={main_B}")
    policy = bench_table.policy_costs(by_name, kind, main_B)          # block_policy's constants, measured
    if main_row is not None:
        print(bench_table.format_ceiling(main_row, by_name["plain greedy"]))
        if policy:
            print(bench_table.format_policy_costs(policy, costs_for(drafter)))
        if args.max_new_tokens > 96:                       # long generations: does τ hold late in them?
            print(f"{main_row['name']}: " + format_bands({(lo, hi): t for lo, hi, t in main_row["bands"]}))
    return main_row, policy


def print_acceptance(args, target, drafter, sampler, family, prompts, by_name):
    """Sampling: where each sampling drafter's rejection rows lose tokens, slot by slot (sum min(p, q) =
    1 - TV); with --all_rows, the τ a perfect selector among the top-16 would reach
    -> (acceptance, oracles)."""
    acceptance = oracles = None
    if not args.greedy_only:
        T, p = SAMPLED
        acceptance = {}
        samplers = sampling_drafters(drafter, sampler)
        for name, d in samplers.items() if args.all_rows else list(samplers.items())[-1:]:
            to_stderr(f"[bench] slot acceptance of {name}: {len(prompts)} more sampled decodes")
            acceptance[name] = lost_tau.slot_acceptance(target, d, prompts, args.max_new_tokens, T, p,
                                                        args.seed)
            print("\n" + lost_tau.format_slot_acceptance(acceptance[name], f"{name} T={T} p={p} rejection"))
    if args.all_rows:
        to_stderr(f"[bench] oracle selector τ of {', '.join(family)}: {len(prompts)} prompts each")
        text, oracles = lost_tau.oracle_section(target, family, prompts, args.max_new_tokens, by_name,
                                                ORACLE_TOP_K)
        print("\n" + text)
    return acceptance, oracles


def print_step_costs(args, target, drafter, prompts):
    """Step costs in isolation: a draft, a verify and a plain step (and late in a long generation)."""
    to_stderr(f"[bench] step costs: {N_TIMED_CALLS} timed calls per step")
    costs = draft_costs.step_costs(target, drafter, prompts[0], len(prompts[0]) + MAX_NEW_TOKENS // 2,
                                   n=N_TIMED_CALLS)
    B, ms = costs["block_size"], {k: 1e3 * v for k, v in costs.items() if k.endswith("_s")}
    print(f"\nstep costs (median of {N_TIMED_CALLS} calls, context {costs['context_len']} tokens, B={B}):")
    for label, key in ((f"draft  (drafter: {B - 1} tokens, one pass)", "draft_s"),
                       (f"verify (target: {B} tokens, with cache)", "verify_s"),
                       ("plain  (target: 1 token, with cache)", "plain_step_s")):
        print(f"  {label:<40} {ms[key]:8.3f} ms")
    if args.max_new_tokens > 96:                           # the same steps late in a long generation
        late = draft_costs.step_costs(target, drafter, prompts[0], len(prompts[0]) + args.max_new_tokens - B,
                                      n=N_TIMED_CALLS)
        costs["late"] = late
        print(f"  at context {late['context_len']}: " + ", ".join(
            f"{k.split('_')[0]} {1e3 * late[k]:.3f} ms ({late[k] / costs[k]:.2f}x)"
            for k in ("draft_s", "verify_s", "plain_step_s")))
    return costs


def print_draft_costs(target, drafter, family, extra, prompts, costs, main_row, rows):
    """One draft step per DFlash-style drafter, the draft-cost curve against AR (the paper's Figure 3: flat
    for DFlash, linear for AR) and the comparisons with AR and prompt lookup -> (draft steps, curve)."""
    draft_steps = curve = None
    kind, B = kind_of(drafter), costs["block_size"]
    if len(family) > 1:                                    # e.g. DFlash 2 vs DFlash, same context and B
        context = draft_costs.realistic_context(target, prompts[0], costs["context_len"])
        draft_steps = draft_costs.draft_step_seconds(target, family, context, B - 1, N_TIMED_CALLS)
        print("\n".join(draft_costs.format_draft_steps(draft_steps, family, B - 1, kind)))
    if "ar" in extra:
        curve = draft_costs.draft_cost_curve(target, {kind: drafter, "ar": extra["ar"]}, prompts[0])
        print("\n" + draft_costs.format_cost_curve(curve))
    lines = [bench_table.compare(main_row, [r for r in rows if r["name"].startswith(prefix)], what)
             for prefix, what in (("ar ", "AR"), ("prompt lookup", "prompt lookup"))]
    print("\n".join([""] + [line for line in lines if line]))
    return draft_steps, curve


def add_predictions(rows, names, drafter):
    """row["predicted"]: for the speculative rows named in `names`, the speedup the run folder's calibration
    predicts from the row's own block sizes (step_costs.predicted_speedup; a compiled row by the compiled
    pass's calibration); None for the others, or without a calibration."""
    entries = {False: calibration(drafter), True: calibration(drafter, compiled=True)}
    for r in rows:
        entry = entries[r["name"].endswith(" compiled")]
        priced = r["name"] in names and entry is not None and r["blocks"][0] is not None
        runs = [(p["tokens"], b) for p, b in zip(r["by_prompt"], r["blocks"])]
        r["predicted"] = predicted_speedup(entry, runs, r["temperature"] > 0) if priced else None


def calibration_record(drafter):
    """What the predictions and the thread counts came from: the calibration's key, machine and date."""
    entry = calibration(drafter)
    return None if entry is None else {k: entry[k] for k in ("key", "machine", "measured", "threads")}


def threads_line(args, drafter, threads):
    """Where the thread counts came from, and the calibration's timings at each count."""
    if args.threads:
        return f"threads: {args.threads} for every row (--threads)"
    entry = calibration(drafter)
    if entry is None:
        return (f"threads: {threads['plain']} (no calibration on this machine: `python -m "
                f"nanodflash.tools.calibrate --out {args.out}` chooses them and makes predictions)")
    timed = ", ".join(f"{n}: {1e3 * c['plain']:.2f} / {1e3 * c['speculative']:.2f} ms"
                      for n, c in entry["threads"]["by_count"].items())
    return (f"threads: plain rows {threads['plain']}, speculative rows {threads['speculative']}, as "
            f"calibrated ({describe(entry['key'])}, {entry['measured']}: a plain token / a "
            f"{drafter.block_size}-token step at {timed}); predicted: from that calibration and each row's "
            "own block sizes")


def main(argv=None, extra=None):
    """The CLI. `extra` ({kind: drafter}) adds drafters to those found in --out (e.g. {"dflash2": ...})."""
    args = parse_args(argv)
    try:
        target, drafter, sampler, extra, prompts, which = load_run(args, extra)
        threads = decode_threads(drafter, args.threads)
        torch.set_num_threads(threads["speculative"])
        t0 = time.perf_counter()
        methods, extra = chosen_methods(args, drafter, sampler, extra)
        predicted = {m.name for m in headline_methods(drafter, sampler)} | {
            m.name for m in methods if m.name.endswith(" compiled")}
        rows = run_benchmark(target, drafter, prompts, with_threads(methods, threads), args.max_new_tokens,
                             args.seed, log=to_stderr, repeats=args.repeats)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    add_predictions(rows, predicted, drafter)
    wall, by_name, where = time.perf_counter() - t0, {r["name"]: r for r in rows}, machine(args.device)
    bad = print_rows(args, rows, prompts, which, wall, where)
    print(threads_line(args, drafter, threads))
    main_row, policy = print_ceiling(args, by_name, drafter)
    family = {kind_of(drafter): drafter, **dflash_style(extra)}
    acceptance, oracles = print_acceptance(args, target, drafter, sampler, family, prompts, by_name)
    costs = print_step_costs(args, target, drafter, prompts)
    draft_steps, curve = print_draft_costs(target, drafter, family, extra, prompts, costs, main_row, rows)
    ceiling = None if main_row is None else main_row["ceiling"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, step_costs=costs, ceiling=ceiling,
                           oracle_selector=oracles, slot_acceptance=acceptance, draft_step_s=draft_steps,
                           draft_cost_curve=curve, policy_costs=policy, machine=where, out=args.out,
                           n_prompts=len(prompts), prompts=args.prompts, prompt_len=PROMPT_LEN,
                           max_new_tokens=args.max_new_tokens, seed=args.seed, repeats=args.repeats,
                           threads=threads, calibration=calibration_record(drafter)), f, indent=2)
        print(f"wrote {args.json}")
    if bad:
        print(f"error: greedy speculative output differs from plain greedy decoding ({', '.join(bad)}): "
              "the lossless guarantee is broken", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
