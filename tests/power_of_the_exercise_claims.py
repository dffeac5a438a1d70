"""How small a shift of the emitted tokens' distribution the exercises' one-position claims catch.

    python tests/power_of_the_exercise_claims.py              # the table in docs/log.md
    python tests/power_of_the_exercise_claims.py --seeds 40

Not a test: a measurement of the checks (nanodflash/exercises/claims_block.py and claims_tree.py). Each of
those claims counts the tokens a rule emits at one place (a position of a block, a node of a tree, the runs
after a first rejection) and tests them against the right distribution p with a chi-square at the suite's
threshold (1e-4). The library's own rule gives the number of counts each place gets; for each place, a fault
is a distribution moved from p toward another w, p' = (1 - e) p + e w, whose total-variation distance from p
is e * TV(p, w). The table gives the smallest such distance caught in at least 90% of seeds, for two
directions: w uniform over p's support (a flatter rule) and w a point mass on p's likeliest token (a sharper
one). Both keep p's zeros: a token of probability 0 is caught by its own check, whatever its count.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))        # `python tests/...` finds nanodflash
from nanodflash.exercises import claims_block as cb  # noqa: E402
from nanodflash.exercises.claims_tree import hand_made_tree  # noqa: E402
from nanodflash.exercises.oracle import ALPHA, one_position_p_value  # noqa: E402
from nanodflash.ext.tree import accept_path  # noqa: E402
from nanodflash.sampling import probs_from_logits  # noqa: E402
from nanodflash.verify import (  # noqa: E402
    match_verify,
    multi_draft_verify,
    rejection_verify,
    residual_distribution,
)

AMOUNTS = [i / 100 for i in range(1, 41)]      # TV distances tried, 0.01 to 0.40


class Library:
    def __init__(self, fn):
        self.fn = fn


def places():
    """[(claim, place, p, counts it gets)] for the library's own rules."""
    out = []
    for name, fn in (("match_verify", match_verify), ("rejection_verify", rejection_verify)):
        p, q = cb.block_rows(0)
        counts = cb.step_counts(Library(fn), name, p, q, torch.Generator().manual_seed(0))
        out += [(f"{name} step", f"after {i} kept drafts", p[i], int(counts[i].sum()))
                for i in range(cb.N_DRAFTS + 1)]
    p = torch.tensor([0.30, 0.35, 0.35, 0.0], dtype=torch.float64)
    q = torch.tensor([0.55, 0.30, 0.10, 0.05], dtype=torch.float64)
    for k in (2, 4):
        n = int(cb.after_first_rejection(multi_draft_verify, p, q, k, 3000, seed=k).sum())
        out.append(("multi_draft_verify after a rejection", f"{k} drafts", residual_distribution(p, q), n))
    tree, logits = hand_made_tree()
    for setting in ((1.0, 4, 0.8), (0.7, None, None)):
        p = probs_from_logits(logits, *setting)
        reached = torch.zeros(len(tree))
        g = torch.Generator().manual_seed(0)
        for _ in range(3000):
            path, _ = accept_path(tree, logits, *setting, g)
            reached[path] += 1
        out += [(f"accept_path T={setting[0]} top-k {setting[1]} top-p {setting[2]}", f"node {i}", p[i],
                 int(reached[i])) for i in range(len(tree)) if reached[i] >= 100]
    return out


def smallest_caught(p, n, toward, seeds):
    """The smallest TV distance in AMOUNTS caught in >= 90% of `seeds` runs of n draws, or None."""
    support = p > 0
    w = support.double() / support.sum() if toward == "flat" else torch.nn.functional.one_hot(
        p.argmax(), p.numel()).double()
    tv_w = 0.5 * float((p - w).abs().sum())
    for tv in AMOUNTS:
        if tv > tv_w:
            return None
        shifted = (1 - tv / tv_w) * p + (tv / tv_w) * w
        caught = 0
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            counts = torch.bincount(torch.multinomial(shifted, n, replacement=True, generator=g),
                                    minlength=p.numel()).double()
            caught += one_position_p_value(counts, p) < ALPHA
        if caught >= 0.9 * seeds:
            return tv
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| claim | place | counts | flatter: TV caught | sharper: TV caught |\n|---|---|---|---|---|")
    for claim, place, p, n in places():
        flat, sharp = (smallest_caught(p, n, toward, args.seeds) for toward in ("flat", "sharp"))
        show = lambda x: "-" if x is None else f"{x:.2f}"       # noqa: E731
        print(f"| {claim} | {place} | {n} | {show(flat)} | {show(sharp)} |", flush=True)


if __name__ == "__main__":
    main()
