"""Side-by-side benchmark: plain decoding vs DFlash, on validation prompts, in one process.

    python -m nanodflash.bench --out out                  # the table, the step costs, the ceiling
    python -m nanodflash.bench --out out --json bench.json

One row per method. All methods run on the same prompts, interleaved (prompt 1: every method, prompt 2:
every method, ... with the method order rotated per prompt), after a warm-up. Reported per row:
    tau          mean acceptance length = tokens emitted by draft/verify steps / steps
                 (plain decoding: 1 by definition, one token per target forward)
    fwd/token    target forward passes per generated token, counted by a hook on target.forward;
                 for DFlash it is (prefill + steps) / tokens, i.e. about 1/tau
    tok/s        median over prompts of (generated tokens / wall-clock seconds)
    speedup      tok/s over that of the first method at the same temperature (plain decoding)
Then the cost of one draft step, one verify step and one plain decoding step (median of many timed
calls), and the ceiling they imply: speedup <= tau * t_plain_step / (t_draft + t_verify).
When `python -m nanodflash.baselines --out DIR` has trained the baseline drafters, greedy rows for the
autoregressive drafter (ar k=3/7/15) and the no-feature DFlash drafter join the table, followed by the
draft-cost curve (one draft step vs drafted tokens, DFlash vs AR; baselines.py).

`run_benchmark(target, drafter, prompts, methods)` is the importable core; a method is
`Method(name, temperature, run)` with `run(target, drafter, prompt, max_new_tokens, generator)
-> (tokens, SpecStats or None)`, so another drafter is one more line in `default_methods`.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import namedtuple

import torch

from .checkpoint import load
from .data import load_corpus, split_train_val
from .sampling import DraftRule
from .speculative import generate, speculative_generate

N_PROMPTS, PROMPT_LEN, MAX_NEW_TOKENS, SEED = 10, 16, 96, 1337   # prompt + new tokens = the drafter's training length
N_TIMED_CALLS = 50      # calls per step-cost measurement (median reported)
AR_KS = (3, 7, 15)      # drafted tokens per step for the AR baseline rows (block_size k+1 in the loop)
THREADS = 1             # batch-1 decoding of tiny models is overhead-bound: extra threads only add sync cost

Method = namedtuple("Method", "name temperature run")


def val_prompts(tok, n, length, seed, data=None):
    """n prompts of `length` tokens from the validation split, each starting right after a newline when one is near."""
    ids = torch.tensor(tok.encode_ordinary(load_corpus(data)), dtype=torch.long)
    val = split_train_val(ids)[1]
    if val.numel() < 2 * length:
        raise ValueError(f"the validation split has {val.numel()} tokens, too few for {length}-token prompts")
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for s in torch.randint(0, val.numel() - 2 * length, (n,), generator=g).tolist():
        for j in range(s, s + length):                      # move to a line start if one is within reach
            if tok.decode([int(val[j])]).endswith("\n"):
                s = j + 1
                break
        prompts.append(val[s: s + length].tolist())
    return prompts


def plain_method(temperature=0.0):
    """Plain autoregressive decoding with the KV cache: one target forward per token."""
    def run(target, drafter, prompt, max_new_tokens, generator):
        return generate(target, prompt, max_new_tokens, temperature=temperature, generator=generator), None
    return run


def dflash_method(block_size, temperature=0.0, verifier="match", drafter=None):
    """DFlash speculative decoding; `drafter` overrides the benchmark's drafter (e.g. a baseline drafter)."""
    def run(target, default_drafter, prompt, max_new_tokens, generator):
        return speculative_generate(target, drafter or default_drafter, prompt, max_new_tokens,
                                    block_size=block_size, temperature=temperature, verifier=verifier,
                                    generator=generator)
    return run


def default_methods(drafter, baselines=None):
    """Plain greedy, DFlash greedy at B = 4/8/16 (capped at the drafter's B), then T=1 with each verifier.

    `baselines` ({"ar": ..., "nofeat": ...}, see baselines.py) adds greedy rows "ar k=3/7/15" (k drafted
    tokens: block_size k+1 in the loop) and "dflash no-features B=...", for the drafters it holds."""
    B, baselines = drafter.config.block_size, baselines or {}
    methods = [Method("plain greedy", 0.0, plain_method(0.0))]
    methods += [Method(f"dflash greedy B={b}", 0.0, dflash_method(b)) for b in sorted({min(b, B) for b in (4, 8, 16)})]
    if "ar" in baselines:
        ar = baselines["ar"]
        methods += [Method(f"ar k={k}", 0.0, dflash_method(k + 1, drafter=ar)) for k in AR_KS
                    if k < ar.config.block_size]
    if "nofeat" in baselines:
        nf = baselines["nofeat"]
        methods += [Method(f"dflash no-features B={nf.config.block_size}", 0.0,
                           dflash_method(nf.config.block_size, drafter=nf))]
    methods += [Method("plain T=1", 1.0, plain_method(1.0))]
    methods += [Method(f"dflash T=1 {v} B={B}", 1.0, dflash_method(B, 1.0, v)) for v in ("match", "rejection")]
    return methods


class ForwardCounter:
    """Counts forward calls of `module` with a hook; usable as a context manager that removes the hook.

    The benchmark counts target.forward (the drafter borrows only the target's embedding and head)."""

    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_benchmark(target, drafter, prompts, methods=None, max_new_tokens=MAX_NEW_TOKENS, seed=SEED, warmup=True):
    """Run every method on every prompt (interleaved); return one row dict per method.

    Row fields: name, temperature, tau, forwards_per_token, tokens_per_s, speedup, plus the totals they
    come from (prompts, tokens, steps, forwards, seconds, draft_s, verify_s) and, for greedy rows,
    matches_plain (every output equal to the first greedy method's output on that prompt).
    """
    methods = methods or default_methods(drafter)
    device = next(target.parameters()).device
    if warmup:                                              # first calls pay for allocation and kernel setup
        for m in methods:
            m.run(target, drafter, prompts[0], min(16, max_new_tokens), torch.Generator().manual_seed(seed))
    acc = {m.name: dict(tokens=0, steps=0, forwards=0, seconds=0.0, draft_s=0.0, verify_s=0.0, rates=[],
                        matches_plain=True if m.temperature == 0 else None) for m in methods}
    counter = ForwardCounter(target)
    try:
        for i, prompt in enumerate(prompts):
            outputs = {}
            for m in methods[i % len(methods):] + methods[: i % len(methods)]:   # rotated: no method always first
                a, gen = acc[m.name], torch.Generator().manual_seed(seed + i)
                counter.n = 0
                _sync(device)
                t0 = time.perf_counter()
                tokens, stats = m.run(target, drafter, prompt, max_new_tokens, gen)
                _sync(device)
                dt = time.perf_counter() - t0
                outputs[m.name] = tokens
                a["tokens"] += len(tokens)
                a["steps"] += len(tokens) - 1 if stats is None else len(stats.acceptance_lengths)
                a["forwards"] += counter.n
                a["seconds"] += dt
                a["rates"].append(len(tokens) / dt)
                if stats is not None:
                    a["draft_s"] += stats.draft_time
                    a["verify_s"] += stats.verify_time
            greedy = [m.name for m in methods if m.temperature == 0]
            for name in greedy:                             # lossless: every greedy output == the first one's
                acc[name]["matches_plain"] &= outputs[name] == outputs[greedy[0]]
    finally:
        counter.handle.remove()
    rows, n = [], len(prompts)
    for m in methods:
        a = acc[m.name]
        rate = statistics.median(a.pop("rates"))
        rows.append(dict(name=m.name, temperature=m.temperature, prompts=n,
                         tau=(a["tokens"] - n) / a["steps"] if a["steps"] else float("nan"),
                         forwards_per_token=a["forwards"] / a["tokens"], tokens_per_s=rate, **a))
    for r in rows:
        base = next(b for b in rows if b["temperature"] == r["temperature"])
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
    return rows


def _median_time(fn, device, n=N_TIMED_CALLS):
    fn()                                                    # warm-up
    times = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def step_costs(target, drafter, prompt, context_len=None, block_size=16, n=N_TIMED_CALLS):
    """Median seconds of: one draft (B-1 tokens, one drafter pass), one verify (B tokens through the target
    with its cache, features captured) and one plain decoding step (1 token with the cache), all at the
    same context length (default: prompt + half of MAX_NEW_TOKENS)."""
    device = next(target.parameters()).device
    B = min(block_size, drafter.config.block_size)
    context_len = context_len or len(prompt) + MAX_NEW_TOKENS // 2
    context = prompt + generate(target, prompt, context_len - len(prompt))      # a realistic context
    ids = drafter.config.target_layer_ids
    cache, dcache = target.new_cache(1), drafter.new_cache(target.config.max_seq_len)
    ctx = torch.tensor([context], device=device)                                 # (1, context_len)
    _, feats = target(ctx, cache, layer_ids=ids)
    drafter.extend(dcache, feats, ctx)
    L, choose = cache.length, DraftRule(0.0)             # greedy, as in the loop
    block = torch.tensor([context[-B:]], device=device)                          # (1, B): any B tokens

    def draft():
        drafter.draft(dcache, context[-1], B - 1, choose)

    def verify():
        target(block, cache, layer_ids=ids)
        cache.crop(L)

    def plain():
        target(block[:, :1], cache)
        cache.crop(L)
    return dict(block_size=B, context_len=L, draft_s=_median_time(draft, device, n),
                verify_s=_median_time(verify, device, n), plain_step_s=_median_time(plain, device, n))


def format_table(rows):
    lines = [f"{'method':<26} {'tau':>6} {'fwd/token':>9} {'tok/s':>8} {'speedup':>8}"]
    for r in rows:
        lines.append(f"{r['name']:<26} {r['tau']:>6.2f} {r['forwards_per_token']:>9.3f} "
                     f"{r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="folder written by train_tiny.py --out (default: %(default)s)")
    p.add_argument("--data", default=None, help="corpus the prompts come from; use train_tiny.py's --data "
                   "(default: the built-in stdlib corpus)")
    p.add_argument("--n_prompts", type=int, default=N_PROMPTS, help="validation prompts (default: %(default)s)")
    p.add_argument("--max_new_tokens", type=int, default=MAX_NEW_TOKENS, help="tokens generated per prompt (default: %(default)s)")
    p.add_argument("--seed", type=int, default=SEED, help="picks the prompts and seeds the T=1 samplers (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--threads", type=int, default=THREADS,
                   help="torch CPU threads (default: %(default)s, like train_tiny.py's summary)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the table, step costs and settings as JSON")
    args = p.parse_args(argv)
    if args.n_prompts < 1 or args.max_new_tokens < 2:
        p.error("need --n_prompts >= 1 and --max_new_tokens >= 2 (one token makes no draft/verify step)")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda was asked for but CUDA is not available on this machine; use --device cpu")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        tok, target, drafter = load(args.out, args.device)
        from .baselines import load_present                 # (baselines.py imports this module)
        extra = load_present(args.out, target, args.device)  # baseline drafters, when trained
        prompts = val_prompts(tok, args.n_prompts, PROMPT_LEN, args.seed, args.data)
        t0 = time.perf_counter()
        rows = run_benchmark(target, drafter, prompts, default_methods(drafter, extra), args.max_new_tokens, args.seed)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    wall = time.perf_counter() - t0
    costs = step_costs(target, drafter, prompts[0])
    where = (f"{torch.get_num_threads()} of {os.cpu_count()} CPU threads" if args.device == "cpu"
             else torch.cuda.get_device_name())
    machine = f"{platform.machine()} {platform.system()}, torch {torch.__version__}, {args.device} ({where})"
    print(f"nanodflash.bench: {args.out} | {len(prompts)} validation prompts x {PROMPT_LEN} tokens, "
          f"{args.max_new_tokens} new tokens each | {machine}")
    print(f"methods interleaved per prompt after a warm-up; tok/s = median over prompts; wall {wall:.1f}s\n")
    print(format_table(rows))
    print("speedup: over plain decoding at the same temperature (greedy rows vs 'plain greedy', T=1 rows vs 'plain T=1')")
    bad = [r["name"] for r in rows if r["matches_plain"] is False]
    print(f"greedy outputs identical to plain greedy on all {len(prompts)} prompts: {'NO: ' + ', '.join(bad) if bad else 'yes'}")
    print(f"\nstep costs (median of {N_TIMED_CALLS} calls, context {costs['context_len']} tokens, B={costs['block_size']}):")
    ms = {k: 1e3 * v for k, v in costs.items() if k.endswith("_s")}
    B = costs["block_size"]
    for label, key in ((f"draft  (drafter: {B - 1} tokens, one pass)", "draft_s"),
                       (f"verify (target: {B} tokens, with cache)", "verify_s"),
                       ("plain  (target: 1 token, with cache)", "plain_step_s")):
        print(f"  {label:<40} {ms[key]:8.3f} ms")
    best, ceiling = next((r for r in rows if r["name"] == f"dflash greedy B={costs['block_size']}"), None), None
    if best is not None:
        ceiling = best["tau"] * costs["plain_step_s"] / (costs["draft_s"] + costs["verify_s"])
        print(f"  in the loop ({best['name']}): draft+extend {1e3 * best['draft_s'] / best['steps']:.3f} ms/step, "
              f"verify {1e3 * best['verify_s'] / best['steps']:.3f} ms/step")
        print(f"ceiling: speedup <= tau * t_plain / (t_draft + t_verify) = {best['tau']:.2f} * {ms['plain_step_s']:.3f}"
              f" / ({ms['draft_s']:.3f} + {ms['verify_s']:.3f}) = {ceiling:.2f}x   (measured: {best['speedup']:.2f}x)")
    curve = None
    if "ar" in extra:                                      # the paper's Figure 3: flat for DFlash, linear for AR
        from .baselines import draft_cost_curve, format_cost_curve
        curve = draft_cost_curve(target, {"dflash": drafter, "ar": extra["ar"]}, prompts[0])
        print("\n" + format_cost_curve(curve))
        ar_rows = [r for r in rows if r["name"].startswith("ar ")]
        if best is not None and ar_rows:
            ar_best = max(ar_rows, key=lambda r: r["tokens_per_s"])
            print(f"{best['name']} vs the best AR setting ({ar_best['name']}, tau {ar_best['tau']:.2f}): "
                  f"{best['tokens_per_s'] / ar_best['tokens_per_s']:.2f}x the tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, step_costs=costs, ceiling=ceiling, draft_cost_curve=curve, machine=machine,
                           out=args.out, n_prompts=len(prompts), prompt_len=PROMPT_LEN,
                           max_new_tokens=args.max_new_tokens, seed=args.seed), f, indent=2)
        print(f"wrote {args.json}")
    if bad:
        print(f"error: greedy speculative output differs from plain greedy decoding ({', '.join(bad)}): "
              "the lossless guarantee is broken", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
