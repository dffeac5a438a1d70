"""The report at the end of `train_tiny.py`: losses, per-slot accuracy, τ, speedups, sampling, long
generations.

    Summary(target=target, drafter=drafter, data=data, prompts=prompts, new_tokens=96, long_tokens=480,
            long_prompts=3, target_hist=target_hist, draft_hist=draft_hist, threads=1).print()

Every speedup is measured side by side (plain and speculative decoding of the same prompts, interleaved, in
this process) and every greedy speculative output is checked against plain greedy decoding.
"""

from dataclasses import dataclass, field

from ..repetition import pooled_repetition
from ..tools.bench_methods import SAMPLED
from ..tools.measure import format_bands, side_by_side, tau_by_band
from ..train_drafter import slot_accuracy

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
    threads: int = 1              # decoding threads, as printed
    sampler: object = None        # the sampling drafter (drafter_sampling.pt): adds the sampled line

    def print(self):
        """Print the summary. τ at other block sizes is the benchmark's (`python -m nanodflash.tools.bench`):
        each one re-decodes every prompt."""
        target, drafter, data, prompts = self.target, self.drafter, self.data, self.prompts
        print(f"\n=== summary (decoding with {self.threads} thread) ===")
        if self.target_hist.get("val_loss"):
            print(f"target:  train loss {self.target_hist['train_loss'][-1]:.3f} | val loss "
                  f"{self.target_hist['val_loss'][-1]:.3f}")
        if self.draft_hist.get("loss"):
            last = self.draft_hist["loss"][-20:]
            print(f"drafter: loss {self.draft_hist['loss'][0]:.3f} -> {sum(last) / len(last):.3f}")
        acc = slot_accuracy(drafter, data["val"], min_anchor=data["prompt_len"] - 1)
        print("drafter per-slot accuracy (held-out): " + " ".join(f"{a:.2f}" for a in acc["slot_acc"]))
        print("top-16 recall per slot (held-out):    " + " ".join(f"{a:.2f}" for a in acc["slot_recall"]))
        B = drafter.config.block_size
        side_by_side(target, drafter, prompts[:2], self.new_tokens, None, ties=[])          # warm-up
        ties, outs = [], []
        t_plain, t_spec, tau = side_by_side(target, drafter, prompts, self.new_tokens, None, ties=ties,
                                            outputs=outs)
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
                                                outputs=outs)
            print(f"sampling (T={T} top-p {top_p}, rejection verifier, the sampling drafter, "
                  f"block_size=auto, {len(few)} val prompts): tau {tau:.2f} on text "
                  f"{100 * pooled_repetition(outs):.0f}% repeated | plain {t_plain:.2f}s vs "
                  f"dflash {t_spec:.2f}s -> {t_plain / t_spec:.2f}x (python -m nanodflash.tools.bench "
                  "--sampled_only: every sampled row)")
        if self.long_tokens:                                                        # does the speed hold?
            runs, ties = [], []
            t_plain, t_spec, _ = side_by_side(target, drafter, prompts[:self.long_prompts], self.long_tokens,
                                              None, runs, ties=ties)
            print(f"{format_bands(tau_by_band(runs))} ({len(runs)} val prompts, {self.long_tokens} new "
                  f"tokens; identical to plain greedy on {identical(len(runs), ties)})")
            print(f"speedup (block_size={B}, {self.long_tokens} new tokens): plain {t_plain:.2f}s vs dflash "
                  f"{t_spec:.2f}s -> {t_plain / t_spec:.2f}x")
