"""A cost model a student can read and check: the seconds of one forward from the model's shape, the rows x
tokens it reads and the context it attends to, with three constants fitted on this machine.

    seconds = overhead * (n_layer + 1)  +  flops / flop_rate  +  bytes / byte_rate

the roofline (arithmetic or memory, here summed: a small model overlaps them little) with a floor of
per-operation overhead, paid per layer (one more for the embedding, the final norm and the head):

    flops = 2 * matmul_params * rows * tokens  +  4 * n_layer * rows * tokens * (context + tokens) * n_embd
    bytes = dtype_bytes * (matmul_params + 2 * n_layer * rows * (context + tokens) * kv_dim)

matmul_params: the attention and MLP projections of every layer and the output head; bytes: each weight read
once, and every row's keys and values. The constants are fitted to the target's forwards at context 64 (1, 16
and 32 rows); the error is reported on points the fit never saw: contexts 256 and 448, 2 to 8 rows, and the
drafter's pass (2 layers, another shape). The same formula with datasheet constants prices a GPU step:

    python -m nanodflash.tools.cost_model --out out       # times, fits, prints the errors and the GPU table
"""

import argparse
import statistics

import torch

from ..sampling import DraftRule
from ..store.checkpoint import load
from .cli import DECODE_THREADS
from .step_timing import median_seconds

TOKENS = (1, 2, 4, 8, 16)           # tokens per row of the timed forwards
FIT = [(rows, 64) for rows in (1, 16, 32)]                          # (rows, context) the constants come from
HELD_OUT = [(1, 256), (1, 448), (2, 64), (4, 64), (8, 64)]          # ... and the ones that test them
N_CALLS = 31                        # timed calls per point (the median counts): fewer, and the held-out
                                    # error moves from run to run on a 2-core machine (docs/log.md)
# Datasheets (dense BF16 tensor-core FLOP/s, HBM bandwidth): NVIDIA H100 SXM5 989 TFLOP/s and 3.35 TB/s
# (H100 Tensor Core GPU datasheet); H200 SXM 989 TFLOP/s and 4.8 TB/s (H200 product page). The overhead per
# layer is an assumption, not a datasheet figure: about ten kernels a layer at about 2 µs a launch.
GPUS = {"H100 SXM": (989e12, 3.35e12), "H200 SXM": (989e12, 4.8e12)}
GPU_OVERHEAD = 20e-6                # seconds per layer of kernel launches
# Qwen3-8B (36 layers, width 4096, 32 query and 8 key/value heads of 128, MLP 12288, 151,936 tokens) and a
# 5-layer drafter of its width, as the paper's (about 1B parameters, the output head shared)
QWEN3_8B = dict(n_layer=36, n_embd=4096, attn=4096, kv=1024, mlp=12288, vocab=151936)
DRAFTER_1B = dict(QWEN3_8B, n_layer=5)
PAPER_TAU = 6.49                    # Qwen3-8B, B=16, greedy, H200


def shape(config, vocab):
    """The numbers the formula needs from a GPTConfig or a drafter's config (a drafter uses the target's
    output head: its vocabulary is the target's)."""
    return dict(n_layer=config.n_layer, n_embd=config.n_embd, attn=config.n_head * config.head_dim,
                kv=config.n_kv_head * config.head_dim, mlp=config.mlp_hidden, vocab=vocab)


def features(s, rows, tokens, context, dtype_bytes):
    """[n_layer + 1, flops, bytes] of one forward (see the module's docstring)."""
    d = s["n_embd"]
    matmul = s["n_layer"] * (d * (2 * s["attn"] + 2 * s["kv"]) + 3 * d * s["mlp"]) + d * s["vocab"]
    n = rows * tokens
    flops = 2 * matmul * n + 4 * s["n_layer"] * n * (context + tokens) * s["attn"]
    read = dtype_bytes * (matmul + 2 * s["n_layer"] * rows * (context + tokens) * s["kv"])
    return [s["n_layer"] + 1, flops, read]


def predict(constants, feats):
    """seconds = overhead * (n_layer + 1) + flops * seconds_per_flop + bytes * seconds_per_byte"""
    return sum(c * f for c, f in zip(constants, feats))


def fit(points):
    """Least squares on relative error ([(features, seconds)] -> the three constants, none negative: a
    negative one is dropped and the rest refitted)."""
    keep = [0, 1, 2]
    while True:
        X = torch.tensor([[f[i] / s for i in keep] for f, s in points], dtype=torch.float64)
        c = torch.linalg.lstsq(X, torch.ones(len(points), 1, dtype=torch.float64)).solution[:, 0]
        if (c >= 0).all():
            out = [0.0, 0.0, 0.0]
            for i, v in zip(keep, c.tolist()):
                out[i] = v
            return out
        keep = [k for k, v in zip(keep, c.tolist()) if v >= 0]


def target_forwards(target, rows, context):
    """{(rows, tokens, context): a call of one target forward of rows x tokens after `context` cached
    tokens} for every tokens in TOKENS."""
    device = next(target.parameters()).device
    cache = target.new_cache(rows, context + max(TOKENS))
    ids = torch.arange(context, device=device).repeat(rows, 1) % target.config.vocab_size   # (rows, context)
    target(ids, cache)

    def forward(t):
        def run():
            target(ids[:, :t], cache)
            cache.crop(context)
        return run
    return {(rows, t, context): forward(t) for t in TOKENS}


def drafter_pass(target, drafter, context):
    """A call of one greedy drafter pass of its whole block after `context` positions."""
    device, B = next(target.parameters()).device, drafter.block_size
    ids = torch.arange(context, device=device)[None] % target.config.vocab_size           # (1, context)
    _, feats = target(ids, target.new_cache(1, context), layer_ids=drafter.target_layer_ids)
    dcache = drafter.new_cache(context + B)
    drafter.extend(dcache, feats, ids)
    rule = DraftRule(0.0, False, None)
    return lambda: drafter.draft(dcache, 0, B - 1, rule)


@torch.no_grad()
def measure(target, drafter, n_calls=N_CALLS):
    """[((fit or held out, what), features, median seconds)] at FIT and HELD_OUT points and the drafter's
    passes, every point's calls interleaved with the others' (a slow moment weighs on all alike)."""
    dtype_bytes = next(target.parameters()).element_size()
    V, B = target.config.vocab_size, drafter.block_size
    t_shape, d_shape = shape(target.config, V), shape(drafter.config, V)
    steps, window = {}, target.config.max_seq_len
    for rows, context in FIT + HELD_OUT:
        if context + max(TOKENS) <= window:                      # a small model's window skips the longest
            steps.update(target_forwards(target, rows, context))
    for context in (64, 256):
        if context + B <= window:
            steps["drafter", B, context] = drafter_pass(target, drafter, context)
    out = []
    for (rows, t, context), s in median_seconds(steps, next(target.parameters()).device, n_calls).items():
        if rows == "drafter":
            out.append((("held out", f"drafter pass of {B} at {context}"),
                        features(d_shape, 1, B, context, dtype_bytes), s))
        else:
            kind = "fit" if (rows, context) in FIT else "held out"
            out.append(((kind, f"target {rows}x{t} at {context}"),
                        features(t_shape, rows, t, context, dtype_bytes), s))
    return out


def gpu_step(flop_rate, byte_rate, tokens, context=1024):
    """(plain step, verify of `tokens`, drafter pass of `tokens` slots) in seconds: the Qwen3-8B target and
    its 5-layer drafter in bf16, with a GPU's constants."""
    constants = [GPU_OVERHEAD, 1 / flop_rate, 1 / byte_rate]
    return tuple(predict(constants, features(s, 1, t, context, 2))
                 for s, t in ((QWEN3_8B, 1), (QWEN3_8B, tokens), (DRAFTER_1B, tokens)))


def gpu_costs(name, max_block_size):
    """[cost(n) for n in 0..B-1] on GPU `name` (GPUS): a verify of n+1 tokens plus a drafter pass of n+1
    slots, in plain steps (block_policy's units)."""
    steps = [gpu_step(*GPUS[name], n + 1) for n in range(1, max_block_size)]
    return [1.0] + [(verify + draft) / plain for plain, verify, draft in steps]


def gpu_table(flop_rate, byte_rate, tau=PAPER_TAU, block=16):
    """(plain step, 16-token verify, drafter pass, speedup at τ) in seconds, bf16, with GPU constants."""
    plain, verify, draft = gpu_step(flop_rate, byte_rate, block)
    return plain, verify, draft, tau * plain / (verify + draft)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="run folder (default: %(default)s)")
    p.add_argument("--calls", type=int, default=N_CALLS, help="timed calls per point (default: %(default)s)")
    args = p.parse_args(argv)
    torch.set_num_threads(DECODE_THREADS)
    tok, target, drafter = load(args.out)
    points = measure(target, drafter, args.calls)
    constants = fit([(f, s) for (kind, _), f, s in points if kind == "fit"])
    print(f"fitted on {sum(k == 'fit' for (k, _), _, _ in points)} target forwards at context 64: overhead "
          f"{1e6 * constants[0]:.1f} µs per layer, {constants[1] and 1e-9 / constants[1]:.1f} GFLOP/s, "
          f"{constants[2] and 1e-9 / constants[2]:.1f} GB/s")
    errors = {}
    for (kind, what), f, s in points:
        err = predict(constants, f) / s - 1
        errors.setdefault(kind, []).append(abs(err))
        print(f"  {kind:<8} {what:<32} measured {1e3 * s:7.3f} ms  predicted "
              f"{1e3 * predict(constants, f):7.3f} ms  ({100 * err:+.0f}%)")
    for kind, errs in errors.items():
        print(f"median |error|, {kind}: {100 * statistics.median(errs):.0f}% over {len(errs)} points")
    print(f"\nthe same formula, bf16 Qwen3-8B target and a 5-layer drafter of its width, context 1024, τ "
          f"{PAPER_TAU} (the paper's, H200), overhead {1e6 * GPU_OVERHEAD:.0f} µs per layer (assumed):")
    for name, (flop_rate, byte_rate) in GPUS.items():
        plain, verify, draft, speedup = gpu_table(flop_rate, byte_rate)
        print(f"  {name}: plain step {1e3 * plain:.2f} ms, 16-token verify {1e3 * verify:.2f} ms "
              f"({verify / plain:.2f} plain steps), drafter pass {1e3 * draft:.2f} ms ({draft / plain:.2f}) "
              f"-> {speedup:.2f}x at τ {PAPER_TAU}")
    V = target.config.vocab_size
    plain, verify, draft = (predict(constants, features(shape(m.config, V), 1, t, 64, 4))
                            for m, t in ((target, 1), (target, drafter.block_size),
                                         (drafter, drafter.block_size)))
    print(f"  this CPU, this run: plain step {1e3 * plain:.2f} ms, verify {verify / plain:.2f} plain steps, "
          f"drafter pass {draft / plain:.2f}: a step costs {(verify + draft) / plain:.2f} plain steps here")


if __name__ == "__main__":
    main()
