"""The report at the end of `train_tiny.py`: losses, per-slot accuracy, τ, speedups, sampling, long
generations.

    Summary(target=target, drafter=drafter, data=data, prompts=prompts, new_tokens=96, long_tokens=480,
            long_prompts=3, target_hist=target_hist, draft_hist=draft_hist,
            threads=dict(plain=1, speculative=1)).print()

Every speedup is measured side by side (plain and speculative decoding of the same prompts, interleaved, in
this process) and every greedy speculative output is checked against plain greedy decoding.
"""

import os
from dataclasses import dataclass, field

from torch import get_num_threads

from ..store import run_folder
from ..tools.bench_methods import SAMPLED
from ..tools.evaluate import slot_accuracy
from ..tools.measure import format_bands, side_by_side, tau_by_band
from ..tools.repetition import pooled_repetition
from .record import file_hash

SAMPLED_PROMPTS = 16    # prompts of the sampled line: a first look in seconds; the benchmark measures it


def identical(n, ties):
    """'all 64 prompts: yes', or how many were identical and where the others met a float32 tie
    (tools/measure.py)."""
    if not ties:
        return f"all {n} prompts: yes"
    return (f"{n - len(ties)} of {n} prompts; the others differ first at a float32 rounding tie, where plain "
            "decoding's one-token forwards and the verifier's block forward round to different argmaxes:"
            + "".join(f"\n  prompt {i}, {d.describe()}" for i, d in ties))


@dataclass(kw_only=True)
class Summary:
    """What the summary reports on: the run's models, data and histories, and how much to decode."""
    target: object
    drafter: object
    data: dict                    # data.pt: data["val"] (held-out sequences), data["prompt_len"]
    prompts: list                 # the held-out prompts (token id lists) every greedy line decodes
    new_tokens: int               # tokens decoded per prompt
    long_tokens: int = 0          # > 0: τ by position band and the speedup at that many new tokens
    long_prompts: int = 0         # ... on this many of the prompts
    target_hist: dict = field(default_factory=dict)     # train.py's history (losses)
    draft_hist: dict = field(default_factory=dict)      # train_drafter's history
    threads: dict = None          # {plain, speculative}: each side's threads (cli.decode_threads)
    sampler: object = None        # the sampling drafter (drafter_sampling.pt): adds the sampled line
    calibrate_seconds: float = None    # > 0: the seconds the step costs took to time (tools/calibrate.py)

    def print_training(self):
        """The losses at the end of training and the drafter's held-out accuracy per slot."""
        if self.target_hist.get("val_loss"):
            print(f"target:  train loss {self.target_hist['train_loss'][-1]:.3f} | val loss "
                  f"{self.target_hist['val_loss'][-1]:.3f}")
        if self.draft_hist.get("loss"):
            last = self.draft_hist["loss"][-20:]
            print(f"drafter: loss {self.draft_hist['loss'][0]:.3f} -> {sum(last) / len(last):.3f}")
        acc = slot_accuracy(self.drafter, self.data["val"], min_anchor=self.data["prompt_len"] - 1)
        print("drafter per-slot accuracy (held-out): " + " ".join(f"{a:.2f}" for a in acc["slot_acc"]))
        print("top-16 recall per slot (held-out):    " + " ".join(f"{a:.2f}" for a in acc["slot_recall"]))

    def print(self):
        """Print the summary and return its headline (`headline`'s rows). τ at other block sizes is the
        benchmark's (`python -m nanodflash.tools.bench`): each one re-decodes every prompt."""
        target, drafter, prompts = self.target, self.drafter, self.prompts
        threads = self.threads or dict(plain=get_num_threads(), speculative=get_num_threads())
        print(f"\n=== summary (decoding with {threads['plain']} thread(s) plain, {threads['speculative']} "
              "speculative) ===")
        self.print_training()
        B = drafter.block_size
        if self.calibrate_seconds:
            print(f"step costs for block_size=auto: timed in {self.calibrate_seconds:.0f}s into costs.json "
                  "(python -m nanodflash.tools.calibrate)")
        side_by_side(target, drafter, prompts[:2], self.new_tokens, None, ties=[], threads=threads)  # warm-up
        ties, outs = [], []
        t_plain, t_spec, tau = side_by_side(target, drafter, prompts, self.new_tokens, None, ties=ties,
                                            outputs=outs, threads=threads)
        rows = {"greedy": headline_row(f"B={B}", prompts, tau, outs, t_plain, t_spec)}
        print(f"tau (greedy, {len(prompts)} val prompts, block_size={B:2d}): {tau:.2f} on text "
              f"{100 * pooled_repetition(outs):.0f}% repeated (tokens closing a 4-gram seen before in it)")
        print(f"greedy speculative == plain greedy on {identical(len(prompts), ties)}")
        print(f"speedup (block_size={B}, {self.new_tokens} new tokens): plain {t_plain:.2f}s vs dflash "
              f"{t_spec:.2f}s -> {t_plain / t_spec:.2f}x")
        T, top_p = SAMPLED                                                              # as people sample
        if self.sampler is not None:                                   # sample.py's default: block_size auto
            few, outs = prompts[:SAMPLED_PROMPTS], []
            t_plain, t_spec, tau = side_by_side(target, self.sampler, few, self.new_tokens, "auto",
                                                temperature=T, top_p=top_p, verifier="rejection",
                                                outputs=outs, threads=threads)
            print(f"sampling (T={T} top-p {top_p}, rejection verifier, the sampling drafter, "
                  f"block_size=auto, {len(few)} val prompts): tau {tau:.2f} on text "
                  f"{100 * pooled_repetition(outs):.0f}% repeated | plain {t_plain:.2f}s vs "
                  f"dflash {t_spec:.2f}s -> {t_plain / t_spec:.2f}x (python -m nanodflash.tools.bench "
                  "--sampled_only: every sampled row)")
            rows["sampled"] = headline_row(f"T={T} top-p {top_p}, B=auto", few, tau, outs, t_plain, t_spec)
        if self.long_tokens:                                                        # does the speed hold?
            runs, ties = [], []
            t_plain, t_spec, _ = side_by_side(target, drafter, prompts[:self.long_prompts], self.long_tokens,
                                              None, runs, ties=ties, threads=threads)
            print(f"{format_bands(tau_by_band(runs))} ({len(runs)} val prompts, {self.long_tokens} new "
                  f"tokens; identical to plain greedy on {identical(len(runs), ties)})")
            print(f"speedup (block_size={B}, {self.long_tokens} new tokens): plain {t_plain:.2f}s vs dflash "
                  f"{t_spec:.2f}s -> {t_plain / t_spec:.2f}x")
        print(headline(rows))
        return rows


def headline_row(decoding, prompts, tau, outputs, t_plain, t_spec):
    """One line of the headline, as `headline` prints it and run.json keeps it."""
    return dict(decoding=decoding, prompts=len(prompts), tau=round(tau, 2),
                repetition=round(pooled_repetition(outputs), 2), speedup=round(t_plain / t_spec, 2))


def headline(rows):
    """Greedy and sampled side by side, each τ with the repetition of its text, and which to trust for what.
    rows: {"greedy": {decoding, prompts, tau, repetition, speedup}, "sampled": the same, when measured}.

    >>> print(headline({"greedy": dict(decoding="B=16", prompts=64, tau=5.06, repetition=0.66,
    ...                                speedup=2.62)}))     # doctest: +NORMALIZE_WHITESPACE
    headline (held-out prompts; speedup: their tokens over their seconds, against plain decoding's):
      greedy  B=16                     tau 5.06 | text 66% repeated | 2.62x | 64 prompts
      sampled: not measured: this run has no drafter tuned for sampled text (train_tiny.py adds it)
    greedy is what the exactness tests decode, and its loops lift tau; sampled is what users decode
    """
    lines = ["headline (held-out prompts; speedup: their tokens over their seconds, against plain "
             "decoding's):"]
    for name, r in rows.items():
        share = f"{100 * r['repetition']:2.0f}%"
        lines.append(f"  {name:7} {r['decoding']:24} tau {r['tau']:4.2f} | text {share} repeated | "
                     f"{r['speedup']:.2f}x | {r['prompts']} prompts")
    if "sampled" not in rows:
        lines.append("  sampled: not measured: this run has no drafter tuned for sampled text (train_tiny.py "
                     "adds it)")
    lines.append("greedy is what the exactness tests decode, and its loops lift tau; sampled is what users "
                 "decode" + (": its speedup is the one to expect" if "sampled" in rows else ""))
    return "\n".join(lines)


def model_files(out_dir):
    """{checkpoint file: its hash} of the models a headline measured (those in out_dir)."""
    names = (run_folder.TARGET, run_folder.DRAFTER, run_folder.SAMPLING_DRAFTER)
    return {n: file_hash(os.path.join(out_dir, n)) for n in names if os.path.exists(os.path.join(out_dir, n))}


def record_headline(out_dir, rows):
    """Keep the headline in out_dir's run.json, with the hashes of the checkpoints it measured."""
    saved = dict(rows=rows, files=model_files(out_dir))
    run_folder.write_run(out_dir, dict(run_folder.read_run(out_dir), headline=saved))


def recorded_headline(out_dir):
    """The headline train_tiny.py recorded for out_dir, or None where it has none or a checkpoint it measured
    has changed since (a later run stopped before its summary)."""
    saved = (run_folder.read_run(out_dir) or {}).get("headline")
    return saved["rows"] if saved and saved["files"] == model_files(out_dir) else None
