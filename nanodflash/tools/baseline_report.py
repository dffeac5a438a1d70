"""What `python -m nanodflash.tools.baselines` prints after training: every drafter of a run folder side by
side, teacher-forced (expected τ, per-slot accuracy and top-16 recall) and in real greedy decoding (τ), and
what the target's features are worth (the no-features drafter against its like-for-like partner, DFlash 1).
"""

import torch

from .cli import DECODE_THREADS
from .evaluate import measure_tau, slot_accuracy


def report(out, drafter, models, data, eval_prompts, ar_ks):
    """Print the tables for `drafter` (out/drafter.pt) and the trained baselines `models` ({kind: drafter}),
    on `eval_prompts` held-out prompts; the AR drafter decodes chains of each k in `ar_ks`."""
    torch.set_num_threads(DECODE_THREADS)
    P, val = data["prompt_len"], data["val"]
    prompts, new = [s[:P].tolist() for s in val[:eval_prompts]], val.size(1) - P
    kind = drafter.kind                                          # "dflash" or "dflash2" (drafter.pt's kind)
    other = "dflash" if kind == "dflash2" else "dflash2"         # the other DFlash kind, trained the same way
    named = {other: other, "dflash no-features": "nofeat", "ar": "ar"}
    drafters = {kind: drafter, **{name: models[k] for name, k in named.items() if k in models}}
    print(f"\n=== teacher-forced, {val.size(0)} held-out sequences (slot_accuracy; the AR drafter's slot k "
          "is given the true tokens before it, so its accuracy does not fall with k) ===")
    for name, d in drafters.items():
        acc = slot_accuracy(d, val, min_anchor=P - 1)
        recall = acc.get("slot_recall")                      # top-16 recall, when slot_accuracy reports it
        recall = "" if recall is None else " | per-slot top-16 recall " + " ".join(f"{r:.2f}" for r in recall)
        print(f"{name:<20} expected tau {acc['expected_tau']:5.2f} | per-slot accuracy "
              + " ".join(f"{a:.2f}" for a in acc["slot_acc"]) + recall)
    B = drafter.block_size
    rows = [(f"{name} B={B}", d, B) for name, d in drafters.items() if name != "ar"]
    if "ar" in models:
        rows += [(f"ar k={k}", models["ar"], k + 1) for k in ar_ks if k < models["ar"].block_size]
    print(f"\n=== tau of greedy speculative decoding, {len(prompts)} held-out prompts x {new} new tokens ===")
    taus = {}
    for name, d, b in rows:
        taus[name] = measure_tau(d, prompts, new, block_size=b)
        print(f"{name:<26} tau {taus[name]:5.2f}")
    if "nofeat" in models:
        # the no-features drafter is DFlash 1 without the features: DFlash 1 is its like-for-like partner
        partner = "dflash" if f"dflash B={B}" in taus else kind
        full, nofeat = taus[f"{partner} B={B}"], taus[f"dflash no-features B={B}"]
        print(f"without target features: tau {full:.2f} ({partner}) -> {nofeat:.2f}, "
              f"{100 * (1 - nofeat / full):.0f}% lower (the paper: ~40% lower)"
              + ("" if partner == "dflash" else "; not like for like: no DFlash 1 drafter here"))
    print(f"speed side by side: python -m nanodflash.tools.bench --out {out}")
