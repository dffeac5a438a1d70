"""Tree rows benchmark: DFlash 2's single path vs tree verification (tree.py), greedy, side by side in one
run.

    python -m nanodflash.tools.bench_tree --out out [--n_prompts 64] [--sizes 16 32 64] [--json tree.json]
    python -m nanodflash.tools.bench_tree --out out --sweep 1 0.5 0.25   # τ only: sizes x tree temperatures

Rows (all greedy, interleaved per prompt after a warm-up, by bench.run_benchmark): "plain greedy", the
drafter's single path "<kind> B=16" (speculative_generate), and "<kind> tree N=16/32/64"
(tree_speculative_generate with at most N draft nodes a step), in --repeats passes over the prompts. Per
row: τ (tokens per draft+verify step, the prefill's token not counted), tok/s (all tokens over all seconds),
the speedup over plain greedy (the project's one speedup, docs/design.md §3.4: the median of the passes, with
the least and the most), draft nodes
verified per step, the in-loop draft and verify milliseconds per step, and whether every output equals plain
greedy's.

After the table:
    per depth    P(a step accepts >= d drafts), d = 1..B-1, for each speculative row
    ceiling      at the anchors the single path visited: the fraction of slots d whose true token (plain
                 greedy's) is among the drafter's top-K candidates, and the fraction where every slot 1..d
                 holds its true token; 1 + the sum of the latter is the τ of a tree holding every path of
                 candidates (the best any tree from this drafter pass can do)
"""

import argparse
import json
import sys
import time

import torch

from ..ext.tree import TREE_TEMPERATURE, tree_speculative_generate
from ..speculative import generate, speculative_generate
from ..store.checkpoint import load
from ..store.run_folder import run_corpus
from .bench import PROMPT_LEN, REPEATS, SEED, run_benchmark
from .bench_methods import Method, kind_of, plain_method
from .cli import decode_threads, floats, ints
from .measure import bench_flags, bench_prompts, machine
from .watch import policy, watched_generate

N_PROMPTS, MAX_NEW_TOKENS, SIZES = 64, 96, (16, 32, 64)


def recorded(run, record):
    """Wrap a method's run so that each call's stats land in `record` (a list)."""
    def wrapped(target, drafter, prompt, max_new_tokens, generator):
        tokens, stats = run(target, drafter, prompt, max_new_tokens, generator)
        record.append(stats)
        return tokens, stats
    return wrapped


def tree_methods(drafter, sizes, block_size, branching=None, tree_temperature=TREE_TEMPERATURE):
    """(methods, records): plain greedy, the single path at block_size, one tree row per size."""
    kind, records = kind_of(drafter), {}

    def single(target, d, prompt, n, g):
        return watched_generate(target, d, prompt, n, block_size=block_size)      # timed: tools/watch.py

    def tree(N):
        def run(target, d, prompt, n, g):
            return tree_speculative_generate(target, d, prompt, n, tree_nodes=N, branching=branching,
                                             tree_temperature=tree_temperature)
        return run
    methods = [Method("plain greedy", 0.0, plain_method())]
    for name, run in [(f"{kind} B={block_size}", single)] + [(f"{kind} tree N={N}", tree(N)) for N in sizes]:
        records[name] = []
        methods.append(Method(name, 0.0, recorded(run, records[name])))
    return methods, records


def depth_profile(stats_list, n_depth):
    """P(a step accepts >= d drafts) for d = 1..n_depth, over every step of every run."""
    accepted = [a for s in stats_list for a in s.accepted_drafts]
    return [sum(a >= d for a in accepted) / max(len(accepted), 1) for d in range(1, n_depth + 1)]


@torch.no_grad()
def candidate_ceiling(target, drafter, prompts, references, single_runs):
    """At each anchor the single path visited: per slot d, is the true token a candidate (`recall`), and are
    the true tokens of slots 1..d all candidates (`prefix`)? -> dict(recall, prefix, tau_ceiling, anchors)."""
    n_depth = drafter.block_size - 1
    hits, prefix, count = [0] * n_depth, [0] * n_depth, [0] * n_depth
    anchors, device = 0, next(target.parameters()).device
    for prompt, ref, stats in zip(prompts, references, single_runs):
        truth = list(prompt) + list(ref)
        ids = torch.tensor([truth], device=device)
        _, feats = target(ids, layer_ids=drafter.target_layer_ids)      # (1, S, F) every position
        dcache, done, start = drafter.new_cache(len(truth)), 0, len(prompt)
        for a in stats.acceptance_lengths:                                 # the anchors of the single path
            n = min(n_depth, len(truth) - start - 1)
            if n < 1:
                break
            drafter.extend(dcache, feats[:, done:start], ids[:, done:start])    # the verified context
            done = start
            cand, _ = drafter.candidates(dcache, truth[start], n, TREE_TEMPERATURE)   # (n, K)
            whole, anchors = True, anchors + 1
            for d in range(n):
                hit = bool((cand[d] == truth[start + 1 + d]).any())
                whole &= hit
                hits[d], prefix[d], count[d] = hits[d] + hit, prefix[d] + whole, count[d] + 1
            start += a
    recall = [h / max(c, 1) for h, c in zip(hits, count)]
    deep = [p / max(c, 1) for p, c in zip(prefix, count)]
    return dict(recall=recall, prefix=deep, tau_ceiling=1 + sum(deep), anchors=anchors)


@torch.no_grad()
def sweep(target, drafter, prompts, max_new_tokens, sizes, temperatures, block_size, branching=None):
    """τ only (no timing): the single path, then every tree size at every tree_temperature; every output is
    checked equal to plain greedy. -> {(N or None, s or None): τ}."""
    refs = [generate(target, p, max_new_tokens) for p in prompts]

    def tau(run):
        lengths = []
        for p, ref in zip(prompts, refs):
            out, stats = run(p)
            if out != ref:
                raise ValueError("a greedy output differs from plain greedy: the decoder is not lossless")
            lengths += stats.acceptance_lengths
        return sum(lengths) / max(len(lengths), 1)
    taus = {(None, None): tau(lambda p: speculative_generate(target, drafter, p, max_new_tokens,
                                                             block_size=policy(block_size)))}
    for s in temperatures:
        for N in sizes:
            taus[N, s] = tau(lambda p: tree_speculative_generate(target, drafter, p, max_new_tokens,
                                                                tree_nodes=N, branching=branching,
                                                                tree_temperature=s))
    return taus


def format_sweep(taus, sizes, temperatures, name):
    lines = [f"tau, {name}: {taus[None, None]:.2f}",
             f"{'tree_temperature':>18}" + "".join(f"{'N=' + str(N):>8}" for N in sizes)]
    for s in temperatures:
        lines.append(f"{s:>18g}" + "".join(f"{taus[N, s]:>8.2f}" for N in sizes))
    return "\n".join(lines)


def format_rows(rows, records):
    lines = [f"{'method':<24} {'tau':>6} {'repeated':>8} {'tok/s':>8} {'speedup [passes]':>19} "
             f"{'nodes/step':>10} {'draft ms':>9} {'verify ms':>9}  = plain"]
    for r in rows:
        steps = max(r["steps"], 1)
        st = records.get(r["name"])
        nodes = (sum(sum(getattr(s, "tree_nodes", None) or [b - 1 for b in s.block_sizes]) for s in st) /
                 max(sum(len(s.acceptance_lengths) for s in st), 1)) if st else None
        per_step = (f"{nodes:>10.1f} {1e3 * r['draft_s'] / steps:>9.3f} {1e3 * r['verify_s'] / steps:>9.3f}"
                    if st else f"{'-':>10} {'-':>9} {'-':>9}")
        lo, hi = r["speedup_spread"]
        lines.append(f"{r['name']:<24} {r['tau']:>6.2f} {100 * r['repetition']:>7.0f}% "
                     f"{r['tokens_per_s']:>8.1f} {r['speedup']:>5.2f}x [{lo:.2f}-{hi:.2f}] " + per_step
                     + f"  {'yes' if r['matches_plain'] else 'NO'}")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_flags(p, N_PROMPTS, MAX_NEW_TOKENS, SEED)      # --out, --data, --prompts, --seed, ...
    p.add_argument("--sizes", type=ints(1, 4096), nargs="+", default=list(SIZES),
                   help="tree sizes N (draft nodes per step, at most) (default: %(default)s)")
    p.add_argument("--branching", type=ints(1, 4096), default=None, help="children per node at most "
                   "(default: K)")
    p.add_argument("--tree_temperature", type=floats(0, None, low_open=True), default=TREE_TEMPERATURE,
                   help="path scores = log-softmax(drafter scores / this) (default: %(default)s)")
    p.add_argument("--sweep", type=floats(0, None, low_open=True), nargs="+", default=None, metavar="S",
                   help="instead of the table: τ of every size at each of these tree temperatures (no "
                   "timing)")
    p.add_argument("--repeats", type=ints(1, 100), default=REPEATS, help="passes over the prompts; the "
                   "speedup is the median of the passes' (default: %(default)s)")
    p.add_argument("--no_ceiling", action="store_true", help="skip the candidate ceiling section")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the rows and sections as JSON")
    return p.parse_args(argv)


def print_profiles(records, n_depth):
    """P(a step accepts >= d drafts) for d = 1..n_depth, per method -> {name: profile}."""
    profiles = {name: depth_profile(st, n_depth) for name, st in records.items()}
    print("\nP(step accepts >= d drafts), d = " + " ".join(f"{d:>4}" for d in range(1, n_depth + 1)))
    for name, prof in profiles.items():
        print(f"  {name:<22}" + " ".join(f"{x:>4.2f}" for x in prof))
    return profiles


def print_ceiling(target, drafter, prompts, references, single):
    """The candidate ceiling at the single path's anchors (candidate_ceiling), printed -> its numbers."""
    ceiling = candidate_ceiling(target, drafter, prompts, references, single)
    print(f"\ncandidate ceiling at the single path's {ceiling['anchors']} anchors (slot d = "
          f"1..{drafter.block_size - 1}):")
    print("  true token in top-K      " + " ".join(f"{x:>4.2f}" for x in ceiling["recall"]))
    print("  slots 1..d all in top-K  " + " ".join(f"{x:>4.2f}" for x in ceiling["prefix"]))
    print(f"  tau of a tree of every candidate path (the ceiling of any tree from this pass): "
          f"{ceiling['tau_ceiling']:.2f}")
    return ceiling


def main(argv=None):
    args = parse_args(argv)
    try:
        tok, target, drafter = load(args.out, args.device)
        torch.set_num_threads(decode_threads(drafter, args.threads)["speculative"])     # every row
        prompts, which = bench_prompts(args.prompts, tok, args.n_prompts, PROMPT_LEN, args.seed,
                                       args.data or run_corpus(args.out))
        B = min(16, drafter.block_size)
        if args.sweep:
            t0 = time.perf_counter()
            taus = sweep(target, drafter, prompts, args.max_new_tokens, args.sizes, args.sweep, B,
                         args.branching)
            print(f"nanodflash.tools.bench_tree --sweep: {args.out} | {len(prompts)} {which} x "
                  f"{PROMPT_LEN} tokens, {args.max_new_tokens} new tokens each, greedy, all outputs = plain "
                  f"greedy | {time.perf_counter() - t0:.0f}s")
            print(format_sweep(taus, args.sizes, args.sweep, f"{kind_of(drafter)} B={B} single path"))
            return
        methods, records = tree_methods(drafter, args.sizes, B, args.branching, args.tree_temperature)
        for m in methods:                                   # warm-up (not recorded): allocation, kernel setup
            m.run(target, drafter, prompts[0], min(16, args.max_new_tokens), None)
        for r in records.values():
            r.clear()
        t0 = time.perf_counter()
        rows = run_benchmark(target, drafter, prompts, methods, args.max_new_tokens, args.seed, warmup=False,
                             repeats=args.repeats)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    wall = time.perf_counter() - t0
    where = machine(args.device)
    print(f"nanodflash.tools.bench_tree: {args.out} | {len(prompts)} {which} x {PROMPT_LEN} "
          f"tokens, {args.max_new_tokens} new tokens each, greedy, tree_temperature "
          f"{args.tree_temperature} | {where}")
    print(f"methods interleaved per prompt after a warm-up, {args.repeats} pass(es) over the prompts; tok/s: "
          f"all tokens over all seconds; wall {wall:.1f}s\n")
    print(format_rows(rows, records))
    print("speedup: over plain greedy; nodes/step: draft tokens verified per step (the anchor not counted); "
          "draft/verify ms: in-loop, per step")
    profiles = print_profiles(records, drafter.block_size - 1)
    ceiling = None
    if not args.no_ceiling:
        references = [generate(target, p, args.max_new_tokens) for p in prompts]
        ceiling = print_ceiling(target, drafter, prompts, references, records[f"{kind_of(drafter)} B={B}"])
    if args.json:
        write_json(args, where, len(prompts), rows, profiles, ceiling)


def write_json(args, where, n_prompts, rows, profiles, ceiling):
    """The table's rows and the sections after it, to args.json."""
    keep = ("name", "tau", "repetition", "tokens_per_s", "speedup", "speedup_spread", "steps", "tokens",
            "draft_s", "verify_s", "matches_plain")
    with open(args.json, "w") as f:
        json.dump(dict(out=args.out, machine=where, tree_temperature=args.tree_temperature,
                       prompts=n_prompts, prompt_set=args.prompts, max_new_tokens=args.max_new_tokens,
                       rows=[{k: r[k] for k in keep} for r in rows], depth_profiles=profiles,
                       ceiling=ceiling), f, indent=1)


if __name__ == "__main__":
    main()
