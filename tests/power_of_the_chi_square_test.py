"""How subtle a verifier fault the chi-square test of test_sampling_exact.py catches, by sample count.

    python tests/power_of_the_chi_square_test.py                 # the table in docs/log.md
    python tests/power_of_the_chi_square_test.py --samples 300,600 --seeds 20

Not a test: a measurement of the tests. Each fault is a rejection verifier that is wrong by a chosen amount;
for each amount and sample count it runs the test's own setting (soft_pair, prompt [1, 2], 4 new tokens,
block size 4, T=1.0) once per seed and counts how often the chi-square p-value falls below the suite's
threshold (1e-4).

- "hot": the verifier sees the target's distribution at temperature x instead of 1, so the output is the
  target's distribution at x (a temperature applied twice, or to the wrong side, is this kind of fault).
- "generous": a draft is accepted when u * q(d) < x * p(d), that is x times too often where q(d) > p(d).
"""

import argparse
import sys
import time
from pathlib import Path

import torch

# the repository: `python tests/...` finds nanodflash
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import test_sampling_exact as exact_test  # noqa: E402
from helpers import soft_pair  # noqa: E402
from nanodflash.sampling import sample  # noqa: E402
from nanodflash.verify import rejection_verify, residual_distribution  # noqa: E402


def hot_verifier(x):
    def verify(drafts, q, p, generator):
        hotter = p.pow(1 / x)
        return rejection_verify(drafts, q, hotter / hotter.sum(-1, keepdim=True), generator)
    verify.sample_drafts = True
    return verify


def generous_verifier(x):
    """rejection_verify with only its acceptance test changed (u * q < x * p); the residual and bonus stay
    right."""
    def verify(drafts, q, p, generator):
        n = drafts.numel()
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        idx = torch.arange(n)
        n_acc = int((u * q[idx, drafts] < x * p[idx, drafts]).long().cumprod(0).sum())
        if n_acc < n:
            return n_acc, int(sample(residual_distribution(p[n_acc], q[n_acc]), generator))
        return n, int(sample(p[n], generator))
    verify.sample_drafts = True
    return verify


FAULTS = {"hot": hot_verifier, "generous": generous_verifier}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", default="hot:1.2,1.3,1.4,1.5;generous:1.1,1.2,1.3",
                    help="fault:amounts;... (amount 1 = no fault)")
    ap.add_argument("--samples", default="400,600", help="sample counts to compare, comma-separated")
    ap.add_argument("--seeds", type=int, default=10,
                    help="runs of the test per fault, amount and sample count")
    args = ap.parse_args()
    torch.set_num_threads(1)
    target, drafter = soft_pair(exact_test.V)
    exact = exact_test.exact_distribution(target, 1.0, None, None)
    print(f"caught = p < {exact_test.ALPHA:g} in that many of {args.seeds} seeds "
          "(max p: the weakest of them)")
    for spec in args.faults.split(";"):
        name, amounts = spec.split(":")
        for x in (float(a) for a in amounts.split(",")):
            row = []
            for n in (int(s) for s in args.samples.split(",")):
                t0, ps = time.perf_counter(), []
                for seed in range(args.seeds):
                    counts, _ = exact_test.speculative_counts(target, drafter, FAULTS[name](x), 1.0, None,
                                                              None, seed=seed, n=n)
                    ps.append(exact_test.chi_square_p_value(counts, exact, n))
                caught = sum(p < exact_test.ALPHA for p in ps)
                row.append(f"N={n}: caught {caught:2d}/{args.seeds}, max p {max(ps):.0e} "
                           f"({time.perf_counter() - t0:.0f}s)")
            print(f"{name} x{x:g}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
