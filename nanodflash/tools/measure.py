"""What the benchmarks, the training summary and sample.py measure with: timers, forward counters, greedy
equality checks that tell a float32 rounding tie from a broken decoder, and τ by position band.

    ForwardCounter(module)       counts module's forward calls with a hook (a context manager)
    DraftForwardCounter(d)       counts drafter forward passes (ARDrafter: k per k drafted tokens; DFlash: 1)
    interleaved(methods, items, run, device)   every method on every item, timed, the order rotated
    side_by_side(target, drafter, prompts, n, block_size)   plain vs speculative wall-clock, interleaved
    machine(device)              the machine a benchmark ran on, for its header line
    bench_prompts(which, ...)    the prompt set of a benchmark (--prompts): held-out, or third-party text
    greedy_difference(target, prompt, ref, out)   None when ref == out, else where and how they differ
    tau_by_band(runs)            τ per position band: does the drafter keep up as a generation gets longer?

Ties. Speculative decoding verifies a block of tokens in one forward; plain decoding runs one forward per
token. The two sum the same products in different orders, so their float32 logits differ in the last bits.
Where the target's two best tokens are that close, the two paths may pick different ones: both are the
target's argmax to within rounding. A broken decoder differs where the target clearly prefers one token.
`Difference.gap` is |logit(ref's token) - logit(out's token)| at the first differing position, computed in
float64 on the same context, and `is_tie` says gap < TIE. For example, on one 12-layer target plain decoding
took token 44 and the verifier 41, at float32 logits 8.0191479 and 8.0191488 (6.6e-7 apart in float64, in
the other order).

Bands. Positions count the generated tokens from 1. Token 1 comes from the prefill (no draft), so the first
draft+verify step starts at position 2, and step i starts right after the tokens of the steps before it. A
step belongs to the band (lo, hi] in which its FIRST token lies, all of its tokens with it (a step that
crosses a boundary is not split: τ is a per-step quantity). τ of a band = tokens emitted by its steps / its
steps, pooled over prompts, as `evaluate.measure_tau` pools.

    _, stats = speculative_generate(target, drafter, prompt, 480)
    tau_by_band([stats.acceptance_lengths])        # {(0, 96): 4.1, (96, 240): 3.3, (240, 480): 3.0}
"""

import copy
import os
import platform
import time
from dataclasses import dataclass

import torch

from ..speculative import generate, speculative_generate
from ..store.data import THIRD_PARTY_PACKAGE, third_party_prompts, val_prompts
from .cli import MAX_COUNT, MAX_SEED, ints, threads
from .watch import policy

PROMPT_SETS = ("held_out", "third_party")     # the benchmarks' --prompts

TIE = 1e-4      # a logit gap (float64) below this is within the float32 rounding of the two paths' sums
BANDS = ((0, 96), (96, 240), (240, 480))      # tokens 1-96, 97-240, 241-480


# ----------------------------------------------------------------------------- timing and counting

def bench_prompts(which, tok, n, length, seed, data):
    """A benchmark's n prompts of `length` tokens and what to call them: "held_out", from the validation split
    of `data` (the run's corpus), or "third_party", the opening tokens of the Python files of a package no
    built-in corpus contains (nanodflash.store.data.third_party_prompts; `seed` and `data` unused)."""
    if which == "third_party":
        return third_party_prompts(tok, n, length), f"third-party prompts ({THIRD_PARTY_PACKAGE} source)"
    return val_prompts(tok, n, length, seed, data), "validation prompts"


def bench_flags(p, n_prompts, max_new_tokens, seed):
    """The flags every benchmark takes (bench, bench_batch, bench_tree), added to argparse parser `p`: the
    run folder, the prompts (how many, which set, from which corpus), tokens per prompt, seed, device,
    threads."""
    p.add_argument("--out", default="out", help="folder written by train_tiny.py --out "
                   "(default: %(default)s)")
    p.add_argument("--data", default=None, help="corpus the prompts come from (default: the one the run was "
                   "trained on, from OUT/run.json)")
    p.add_argument("--n_prompts", type=ints(1, 10000), default=n_prompts,
                   help="prompts (default: %(default)s)")
    p.add_argument("--prompts", choices=PROMPT_SETS, default="held_out", help="held_out: the run's "
                   "validation prompts; third_party: the opening tokens of numpy's Python files, text no "
                   "built-in corpus contains (default: %(default)s)")
    p.add_argument("--max_new_tokens", type=ints(2, MAX_COUNT), default=max_new_tokens,
                   help="tokens generated per prompt, 2 at least: one token makes no draft/verify step "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=ints(0, MAX_SEED), default=seed,
                   help="picks the prompts and seeds the samplers (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--threads", type=threads, default=None,
                   help="torch CPU threads for every row, at most this machine's CPUs (default: the counts "
                   "the run folder's calibration chose, tools/calibrate.py)")


def machine(device):
    """'x86_64 Linux, torch 2.13.0+cpu, cpu (1 of 2 CPU threads)': what a benchmark's numbers were measured
    on."""
    where = (f"{torch.get_num_threads()} of {os.cpu_count()} CPU threads" if str(device) == "cpu"
             else torch.cuda.get_device_name())
    return f"{platform.machine()} {platform.system()}, torch {torch.__version__}, {device} ({where})"


class ForwardCounter:
    """Counts forward calls of `module` with a hook; usable as a context manager that removes the hook.

    The benchmark counts target.forward (the drafter borrows only the target's embedding and head)."""

    def __init__(self, module):
        self.n = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        self.n += 1

    def remove(self):
        self.handle.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def DraftForwardCounter(drafter):
    """Counts drafter forward passes: each pass applies the drafter's final norm exactly once (extend never
    does)."""
    return ForwardCounter(drafter.norm)


def sync(device):
    """Block until the device has run everything queued (CUDA kernels are asynchronous), so a timer sees
    it finish; nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(methods, items, run, device="cpu", warm=False):
    """The one timing loop of the benchmarks: for item i, every method once, the order rotated by i so that no
    method always runs first (and none always pays for, or profits from, what another left in the caches).
    run(method, item, i) -> result; yields (i, method, result, seconds), the device synchronised around each
    timed call. Every measured speedup in the project comes out of this loop. warm: each timed call right
    after an untimed one of the same method and item, for calls as short as one decoding step: in a decode a
    step follows a step of its own kind, and a step timed after a much larger one (32 rows) would pay for
    reading the weights back into the CPU's caches (5-10% of a one-row step here).

    >>> [(i, m) for i, m, _, _ in interleaved(["a", "b"], ["x", "y"], lambda m, item, i: None)]
    [(0, 'a'), (0, 'b'), (1, 'b'), (1, 'a')]
    """
    for i, item in enumerate(items):
        for m in methods[i % len(methods):] + methods[: i % len(methods)]:
            if warm:
                run(m, item, i)
            sync(device)
            t0 = time.perf_counter()
            result = run(m, item, i)
            sync(device)
            yield i, m, result, time.perf_counter() - t0


def side_by_side(target, drafter, prompts, new_tokens, block_size=None, runs=None, verifier="rejection",
                 decoder=speculative_generate, ties=None, outputs=None, threads=None, **kw):
    """Wall-clock of plain vs speculative greedy decoding on the same prompts, interleaved; checks equality.
    Returns (plain seconds, speculative seconds, τ of the speculative runs). `runs`, a list, receives each
    speculative run's acceptance lengths (for τ by position, `tau_by_band`), `outputs`, a list, its tokens
    (for their repetition, repetition.py). `kw`: generate's sampling
    arguments (temperature, top_k, top_p, stop_token_ids). temperature > 0: both sample (prompt i with seed i;
    the speculative side with `verifier`), and the outputs, samples, are not compared. `decoder`: the
    speculative decoder, speculative_generate or one called like it (e.g. a tree decoder with its tree size
    bound). A greedy output that differs raises AssertionError, unless it first differs at a float32 rounding
    tie (`greedy_difference`) and `ties`, a list, is given: it then receives (prompt index, Difference).
    threads: {plain, speculative}, the torch threads of each side (cli.decode_threads), else as set."""
    def run(method, p, i):
        if threads is not None:
            torch.set_num_threads(threads[method])
        g = torch.Generator().manual_seed(i)
        if method == "plain":
            return generate(target, p, new_tokens, generator=g, **kw), None
        return decoder(target, drafter, p, new_tokens, block_size=policy(block_size), verifier=verifier,
                       generator=g, **kw)

    seconds, emitted, steps, pair = {"plain": 0.0, "speculative": 0.0}, 0, 0, {}
    device = next(target.parameters()).device
    for i, method, (out, stats), dt in interleaved(["plain", "speculative"], prompts, run, device):
        seconds[method] += dt
        pair[method] = out
        if stats is not None:
            emitted, steps = emitted + sum(stats.acceptance_lengths), steps + len(stats.acceptance_lengths)
            if runs is not None:
                runs.append(stats.acceptance_lengths)
            if outputs is not None:
                outputs.append(out)
        if len(pair) < 2:
            continue
        ref, out = pair.pop("plain"), pair.pop("speculative")
        greedy = kw.get("temperature", 0) == 0                            # samples are not compared
        difference = greedy_difference(target, prompts[i], ref, out) if greedy else None
        if difference is not None:
            if ties is None or not difference.is_tie:
                raise AssertionError(f"speculative greedy output differs from plain greedy decoding on "
                                     f"prompt {i}, {difference.describe()}")
            ties.append((i, difference))
    return seconds["plain"], seconds["speculative"], emitted / max(steps, 1)


# ----------------------------------------------------------------------------- greedy equality and ties

@dataclass
class Difference:
    position: int       # index of the first differing new token
    tokens: tuple       # (plain decoding's token, the speculative decoder's token) there
    gap: float          # |difference of the target's float64 logits of the two tokens| on the shared context
    is_tie: bool        # gap < TIE: a float32 rounding tie, not a lossless failure

    def describe(self):
        kind = "a float32 rounding tie" if self.is_tie else "NOT a tie: the decoder is not lossless"
        if self.tokens == (None, None):
            return f"new token {self.position + 1}: one output ends there and the other does not ({kind})"
        return (f"new token {self.position + 1}: plain {self.tokens[0]} vs speculative {self.tokens[1]}, "
                f"target logits {self.gap:.1e} apart in float64 ({kind})")


@torch.no_grad()
def greedy_difference(target, prompt, ref, out):
    """None if the greedy outputs `ref` (plain) and `out` (speculative) of `prompt` are equal, else where and
    how they first differ (a Difference). A length difference without a differing token counts as gap inf."""
    if ref == out:
        return None
    shorter = min(len(ref), len(out))
    j = next((i for i in range(shorter) if ref[i] != out[i]), shorter)
    if j == shorter:                                                   # one output is a prefix of the other
        return Difference(j, (None, None), float("inf"), False)
    exact = copy.deepcopy(target).double()
    context = torch.tensor([list(prompt) + list(ref[:j])], device=next(target.parameters()).device)
    logits = exact(context)[0][0, -1]                                      # (V,) next-token logits
    gap = abs(float(logits[ref[j]] - logits[out[j]]))
    return Difference(j, (ref[j], out[j]), gap, gap < TIE)


# ----------------------------------------------------------------------------- τ by position band

def step_starts(acceptance_lengths):
    """The position of each step's first token: 2, 2 + len_0, 2 + len_0 + len_1, ...

    >>> step_starts([3, 1, 4])
    [2, 5, 6]
    """
    starts, pos = [], 2                        # position 1 is the prefill's token
    for n in acceptance_lengths:
        starts.append(pos)
        pos += n
    return starts


def band_counts(acceptance_lengths, bands=BANDS):
    """[(tokens, steps)] per band for one generation; steps starting outside every band are left out."""
    counts = [[0, 0] for _ in bands]
    for start, n in zip(step_starts(acceptance_lengths), acceptance_lengths):
        for i, (lo, hi) in enumerate(bands):
            if lo < start <= hi:
                counts[i][0] += n
                counts[i][1] += 1
                break
    return [tuple(c) for c in counts]


def tau_by_band(runs, bands=BANDS):
    """{band: τ} pooled over `runs` (one list of acceptance lengths per generation); None for a band no
    step started in (a generation shorter than the band, or one that stopped early)."""
    if runs and isinstance(runs[0], int):
        raise TypeError("tau_by_band takes a list of runs (one list of acceptance lengths per generation)")
    totals = [[0, 0] for _ in bands]
    for lengths in runs:
        for total, (tokens, steps) in zip(totals, band_counts(lengths, bands)):
            total[0] += tokens
            total[1] += steps
    return {band: (tokens / steps if steps else None) for band, (tokens, steps) in zip(bands, totals)}


def tau_by_repetition(rows, parts=3):
    """Split every greedy row by prompt terciles of repetition: the prompts sorted by the repetition of plain
    greedy decoding's output on them (repetition.py; never by step, since long accepted steps hold more
    repeats), then cut into `parts` groups, least repetitive first. Adds to each greedy row
    `terciles`: [dict(repetition, tau, speedup)], where repetition is the plain outputs' mean share in the
    group, tau counts the group's tokens (the prefill's excluded) over its steps, and speedup is the group's
    tokens over its seconds, against plain greedy's on the same prompts (the bench's speedup). Rows need
    `by_prompt` (run_benchmark)."""
    plain = next((r for r in rows if r["name"] == "plain greedy"), None)
    if plain is None:
        return
    n = len(plain["by_prompt"])
    order = sorted(range(n), key=lambda i: plain["by_prompt"][i]["repetition"])
    groups = [order[k * n // parts:(k + 1) * n // parts] for k in range(parts)]
    for r in rows:
        if r["temperature"] != 0 or r.get("tau", 1) is None:          # sampled, or a peer's loop (uncounted)
            continue
        r["terciles"] = []
        for g in groups:
            mine, base = [r["by_prompt"][i] for i in g], [plain["by_prompt"][i] for i in g]
            steps = sum(p["steps"] for p in mine)
            r["terciles"].append(dict(
                repetition=sum(p["repetition"] for p in base) / max(len(base), 1),
                tau=(sum(p["tokens"] for p in mine) - len(mine)) / steps if steps else float("nan"),
                speedup=pooled_rate(mine) / pooled_rate(base) if g else float("nan")))


def pooled_rate(runs):
    """Tokens per second of runs [dict(tokens, rate)]: their tokens over their seconds."""
    return sum(r["tokens"] for r in runs) / sum(r["tokens"] / r["rate"] for r in runs)


def format_bands(taus):
    """One line: 'tau by position: 1-96 4.10 | 97-240 3.31 | 241-480 2.98' ('-' for an empty band)."""
    return "tau by position: " + " | ".join(
        f"{lo + 1}-{hi} " + ("-" if t is None else f"{t:.2f}") for (lo, hi), t in taus.items())
