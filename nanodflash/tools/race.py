"""A race: one prompt decoded by plain decoding, the DFlash path and a tree, each emission timed, for the race
page (race_page.py).

    race = record_race(tok, target, drafter, prompt_ids, 96)                          # greedy lanes
    race = record_race(tok, target, drafter, prompt_ids, 96, temperature=0.7, top_p=0.95, seed=1)
    write_race_page(race, "race.html")                                             # race_page.py

Each lane's clock is its own: the decoders call back as they emit (plain decoding after each token, the
speculative ones after each step's verification), the callback notes `time.perf_counter()`, and an event is
(seconds since the decode call began, tokens emitted, how many of them were accepted drafts). A lane ends at
the seconds its whole call took, timed by the benchmarks' loop (measure.interleaved): REPEATS runs of each
lane, interleaved, after a warm-up; the page shows each lane's run of median length (a seeded run emits the
same tokens every time). Then the speculative lanes run once more with a TraceRecorder, whose step records
the page's viewer opens; recording is never timed, and its tokens must equal the timed runs' (or this
raises).

Sampling (temperature > 0): plain sampling, the sampled path (rejection verifier) and a sampled tree; each is
its own exact sample of the target's distribution, so their texts differ from each other, not their law.
"""

import statistics
import sys
import time

import torch

from ..ext.sampled_tree import SampledDraws
from ..ext.step_costs import calibration, costs_for, plain_token_prices
from ..ext.tree import tree_speculative_generate
from ..speculative import generate
from .cli import decode_threads, using_threads
from .cost_model import gpu_costs
from .measure import interleaved
from .race_page import write_race_page
from .repetition import repetition
from .trace import TraceRecorder
from .watch import watched_generate

REPEATS = 5              # timed runs of each lane, interleaved, after one warm-up each; the median is shown
TREE_NODES = 16          # draft nodes a step of the greedy tree lane
SAMPLED_TREE_NODES = 8   # ... of the sampled tree lane
GPU = "H200 SXM"         # the what-if panel's GPU preset (cost_model.py: an 8B target, datasheet constants)


def lanes(drafter, temperature, block_size, tree_nodes):
    """[(key, label, decode)]: decode(target, drafter, prompt, n, generator, on_step) -> (tokens, stats)."""
    sampled = temperature > 0
    nodes = tree_nodes or (SAMPLED_TREE_NODES if sampled else TREE_NODES)
    block_size = block_size or ("auto" if sampled else None)          # sample.py's defaults
    kind = "sampled" if sampled else "DFlash"
    B = block_size or drafter.block_size
    return [("plain", "plain sampling" if sampled else "plain decoding", None),
            ("path", f"{kind} path, B {B}",
             lambda *a, **kw: watched_generate(*a, block_size=block_size, **kw)),
            ("tree", f"{kind} tree, ≤ {nodes} nodes",
             lambda *a, **kw: tree_speculative_generate(*a, tree_nodes=nodes,
                                                         draws=SampledDraws() if sampled else None, **kw))]


def marked_run(target, drafter, prompt_ids, n, decode, sampling, seed):
    """One decode, each emission's time noted -> (tokens, events, stats); events [(t, n_tokens, n_drafted)],
    t in seconds from the call."""
    marks = []
    kw = dict(zip(("temperature", "top_k", "top_p"), sampling), generator=torch.Generator().manual_seed(seed))
    t0 = time.perf_counter()
    if decode is None:
        tokens = generate(target, prompt_ids, n, **kw,
                          on_token=lambda token: marks.append((time.perf_counter(), 1, 0)))
        stats = None
    else:
        tokens, stats = decode(target, drafter, prompt_ids, n, **kw,
                               on_step=lambda r: marks.append((time.perf_counter(), len(r.new),
                                                               min(r.accepted, len(r.new)))))
        # the prefill's token, at the end of the prefill (the decoder's timer)
        marks.insert(0, (t0 + stats.prefill_time, 1, 0))
    return tokens, [(t - t0, k, d) for t, k, d in marks], stats


def device(target):
    return next(target.parameters()).device


def per_slot_rates(acceptance, block_size):
    """The path lane's per-slot acceptance [a_1, ..., a_{B-1}] (accepted at slot k / steps whose verifier
    reached it), from (drafts, accepted) per step; a slot never reached gets the rate of the one before."""
    rates = []
    for k in range(block_size - 1):
        reached = sum(1 for n, a in acceptance if n > k and a >= k)
        kept = sum(1 for n, a in acceptance if n > k and a > k)
        rates.append(kept / reached if reached else (rates[-1] if rates else 0.0))
    return rates


def record_race(tok, target, drafter, prompt_ids, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
                block_size=None, tree_nodes=None, seed=1337, repeats=REPEATS, settings=None, threads=None):
    """The race as one JSON-ready dict: settings (the thread counts the lanes ran at among them), prompt,
    lanes (each: label, output, events, seconds, speedup over plain, target forwards, τ and repetition, and
    for a speculative lane its trace) and the what-if panel's starting point (per-slot rates and costs).
    `threads`: one count for every lane (sample.py --threads), else the calibration's (cli.decode_threads)."""
    sampling = (temperature, top_k, top_p)
    spec = lanes(drafter, temperature, block_size, tree_nodes)
    counts = decode_threads(drafter, threads)
    runs = timed_runs(target, drafter, prompt_ids, max_new_tokens, spec, sampling, seed, repeats, counts)
    out = []
    for key, label, decode in spec:
        ordered = sorted(runs[key], key=lambda run: run[-1])
        tokens, events, stats, seconds = ordered[len(ordered) // 2]
        lane = dict(key=key, label=label, output=tokens, events=events, seconds=seconds,
                    all_seconds=[run[-1] for run in runs[key]], repetition=repetition(tokens),
                    forwards=len(tokens) if stats is None else stats.target_forwards,
                    tau=None if stats is None else stats.tau, trace=None)
        if decode is not None:
            rule = ("greedy" if temperature == 0 else "recursive rejection (a sampled tree)" if key == "tree"
                    else "rejection")
            recorder = TraceRecorder(tok, drafter, *sampling, verifier=rule)
            traced, _ = decode(target, drafter, prompt_ids, max_new_tokens, temperature=temperature,
                               top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(seed),
                               on_step=recorder)
            if traced != tokens:
                raise RuntimeError(f"the {label} lane emitted other tokens when recorded than when timed")
            lane["trace"] = recorder.trace(prompt_ids, tokens, dict(settings or {}, lane=label))
            lane["steps"] = [(len(s["drafts"]), s["accepted"]) for s in lane["trace"]["steps"]]
        out.append(lane)
    plain = out[0]["seconds"]
    for lane in out:
        lane["speedup"] = plain / lane["seconds"]
    return dict(settings=dict(settings or {}, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                              max_new_tokens=max_new_tokens, repeats=repeats,
                              threads=f"{counts['plain']} plain, {counts['speculative']} speculative"),
                prompt=list(prompt_ids), tokens=texts(tok, prompt_ids, out), lanes=out,
                whatif=whatif_start(drafter, out, temperature > 0))


def timed_runs(target, drafter, prompt_ids, max_new_tokens, spec, sampling, seed, repeats, threads):
    """{lane key: [(tokens, events, stats, seconds)] of its timed runs}: the lanes interleaved, after a
    warm-up run each, every lane at its kind's thread count (`threads`: {plain: n, speculative: n}), the
    count put back after."""
    decoders = {key: decode for key, _, decode in spec}
    runs = {key: [] for key in decoders}

    def run(key, r, i):
        torch.set_num_threads(threads["plain" if key == "plain" else "speculative"])
        return marked_run(target, drafter, prompt_ids, max_new_tokens, decoders[key], sampling, seed)
    with using_threads(torch.get_num_threads()):
        for r, key, result, seconds in interleaved(list(runs), range(repeats + 1), run, device(target)):
            if r:                                                   # run 0: the warm-up, not kept
                runs[key].append((*result, seconds))
    return runs


def texts(tok, prompt_ids, lanes_):
    ids = set(prompt_ids)
    for lane in lanes_:
        ids |= set(lane["output"])
    return {str(i): tok.decode([i]) for i in sorted(ids)}


def fit_linear(costs):
    """(step_cost, slot_cost) of step_costs.linear_costs through a table's cost(1) and its last entry."""
    step = costs[1]
    slot = (costs[-1] / step - 1) / (len(costs) - 2) if len(costs) > 2 else 0.0
    return step, slot


def whatif_start(drafter, lanes_, sampled):
    """The what-if panel's presets: the calibration's prices of a step in plain decoding's tokens
    (step_costs.plain_token_prices; without a calibration, the table block_size="auto" weighs, in steps
    without drafts), fitted to linear_costs; the path lane's own step cost in plain steps (its mean step
    against plain decoding's mean token, both measured here) with the same growth per draft; the cost
    model's GPU step (an 8B target and its drafter on GPU, cost_model.gpu_costs); its per-slot rates."""
    B, entry = drafter.block_size, calibration(drafter)
    table = plain_token_prices(entry, sampled) if entry else costs_for(drafter, 1, sampled=sampled)
    step, slot = fit_linear(table)
    plain, path = lanes_[0], lanes_[1]
    drafts = [n for n, _ in path["steps"]]
    n = round(statistics.mean(drafts)) if drafts else 1
    per_step = (path["seconds"] - path["events"][0][0]) / max(len(path["steps"]), 1)
    per_token = (plain["seconds"] - plain["events"][0][0]) / max(len(plain["output"]) - 1, 1)
    measured = per_step / per_token
    return dict(max_block_size=B, table=table, calibrated=[step, slot],
                measured=[measured / (1 + slot * (max(n, 1) - 1)), slot], measured_drafts=n,
                gpu=list(fit_linear(gpu_costs(GPU, B))) if B > 1 else [1.0, 0.0],
                rates=per_slot_rates(path["steps"], B), path_tau=path["tau"], path_speedup=path["speedup"])


def summary(race):
    """One line per lane: seconds, speedup, target forwards, τ and repetition."""
    lines = []
    for lane in race["lanes"]:
        tau = "" if lane["tau"] is None else f", τ {lane['tau']:.2f}"
        lines.append(f"  {lane['label']:<36} {lane['seconds']:.3f} s  {lane['speedup']:.2f}x  "
                     f"{lane['forwards']:3d} target forwards{tau} on text {100 * lane['repetition']:.0f}% "
                     "repeated")
    return "\n".join(lines)


def race_command(args, tok, target, drafter, prompt_ids, chosen=None):
    """sample.py --race FILE: the lanes timed and recorded, their summary printed, the page written."""
    if chosen:
        print(chosen)
    print(f"racing plain decoding, the path and a tree: {REPEATS} timed runs each after a warm-up, then one "
          "recorded ...", file=sys.stderr)
    recorded = record_race(tok, target, drafter, prompt_ids, args.max_new_tokens, args.temperature,
                           args.top_k, args.top_p, block_size=args.block_size, tree_nodes=args.tree,
                           seed=args.seed, settings=dict(checkpoint=args.out), threads=args.threads)
    print(summary(recorded))
    print(f"wrote {write_race_page(recorded, args.race)}: the race, replayed (open it in a browser)")
