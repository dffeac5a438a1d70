"""Baselines that show *why* DFlash drafts the way it does, trained exactly like the DFlash drafter (the
untrained baseline, prompt lookup, is prompt_lookup.py).

    python -m nanodflash.tools.baselines --out out     # trains them next to out/drafter.pt, prints their τ
    python -m nanodflash.tools.bench --out out         # then gains their rows and a draft-cost curve

Besides the two below, it trains the DFlash kind that out/drafter.pt is not (DFlash 1 beside a DFlash 2
drafter, or the other way round), with the same data, recipe and steps, so the two compare fairly.

This module only defines drafters and trains them; the benchmark (bench*.py) imports it, never the other
way round.

1. `ARDrafter`: an autoregressive drafter in the EAGLE spirit -- conditioned on the same fused target
   features, same width and depth, drafting a chain of k tokens ONE forward per token with its own small
   KV cache (a chain, no tree). Its cost grows linearly with k; DFlash's block costs one forward.
2. `NoFeatureDrafter` (and `NoFeatureDFlash2Drafter`): the DFlash (DFlash 2) drafter with the target's
   features removed (the paper's ablation: τ drops by about 40%). Its blocks attend to their own slots only.

Design choice for the AR drafter. EAGLE concatenates each token's embedding with the target feature that
predicted it and, past the verified context, feeds the drafter's *own* hidden state where no target
feature exists; trained with teacher forcing only, that is a train/test mismatch (EAGLE-3 adds
"training-time test" to fix it). Here the features enter exactly as in DFlash, by KV injection: every
drafter layer sees the verified positions' fused features as extra keys/values, and the draft chain is
ordinary causal self-attention over real tokens, [anchor, d_1, d_2, ...]:

    context (verified, target features as K/V)      chain (drafted now, one forward per token)
    pos: 0 .. start-1                               start    start+1  ...  start+k-1
                                                    [anchor] [d_1]    ...  [d_{k-1}]  -> predicts d_1 .. d_k
    slot j sees ALL context keys and chain slots 0..j (causal)

Why: (1) teacher forcing is then *exact* -- at drafting time every input is of the kind seen in training
(verified features, real tokens; a draft only matters if the ones before it were right, and then they
equal the training tokens), so the baseline is not handicapped by a mismatch; (2) the two drafters share
the architecture, parameter count, data, anchors, loss weights, optimizer and steps (`train_drafter`
trains both); the ONLY difference is the drafting mode -- causal over real tokens, k forwards, versus
bidirectional over MASKs, one forward. That is the variable the paper's DFlash-vs-EAGLE comparison is
about. The AR drafter even sees strictly more (its own earlier drafts), so its τ is an upper-ish bound
for an AR drafter of this size: the comparison is conservative for DFlash.

A module entry point, not a train_tiny.py flag, so that the trainer stays one screen of stages: it reads
DIR's target, drafter and data.pt and trains with the recipe drafter.pt was trained with, read from its
record (`run_recipe`): the comparison is like for like on a default, `--full` or `--smoke` run alike.
"""

import argparse
import os
import sys
import time
from dataclasses import fields

import torch

from ..dflash2 import DFlash2Drafter
from ..drafter import Drafter, training_mask
from ..store import checkpoint as ckpt
from ..store import run_folder
from ..store.resume import resume_file
from ..train import DraftTraining, train_drafter
from .baseline_report import report
from .cli import MAX_COUNT, check_device, ints
from .evaluate import slot_accuracy

AR, NOFEAT = "ar_drafter.pt", "drafter_nofeat.pt"
AR_KS = (3, 7, 15)      # drafted tokens per step for the AR drafter's rows (here and in the benchmark)
# DraftTraining's fields <- the flags of train_tiny.py that drafter.pt's record holds
RECIPE_FLAGS = dict(steps="draft_steps", batch_size="draft_batch", n_anchors="draft_anchors", lr="draft_lr",
                    gamma="gamma", seed="seed", soft_weight="soft_weight", long_batch="long_batch",
                    long_anchors="long_anchors")


def run_recipe(made_by, path):
    """The drafter recipe of a run, from drafter.pt's record `made_by` (the train_tiny.py flags that made
    it)."""
    missing = [f for f in RECIPE_FLAGS.values() if f not in (made_by or {})]
    if missing:
        raise ValueError(f"{path} records no drafter recipe ({', '.join(missing)} missing): the baselines "
                         "train with the recipe of a drafter made by train_tiny.py")
    return {k: made_by[f] for k, f in RECIPE_FLAGS.items()}


def causal_training_mask(anchors, seq_len, n_slots):
    """training_mask with causal attention inside each chain: slot i of a chain sees its slots 0..i only."""
    m = training_mask(anchors, seq_len, n_slots)                                 # (N, K*n, S + K*n)
    slot = torch.arange(anchors.size(1) * n_slots, device=anchors.device) % n_slots   # (K*n,) index in chain
    m[..., seq_len:] &= slot[None, :] <= slot[:, None]                           # same chain and not later
    return m


class ARDrafter(Drafter):
    """Autoregressive feature drafter: the Drafter's layers and context cache, drafting a causal chain.

    `config.block_size` is the longest chain + 1 (k <= block_size - 1). `mask_token_id` is unused.
    """
    kind = "ar"
    uses_block_pass = False  # its chain drafts one slot a forward: batched row by row, never compiled

    def draft(self, cache, anchor, n_draft, choose):
        """n_draft tokens, one forward each. The first forward also projects the queued context (as
        DFlash's one pass does); each writes its chain slot's K/V past cache.length, as scratch that
        later chain slots attend to and the next verified context overwrites."""
        device = cache.k.device
        tokens, probs, token = [], [], anchor
        self.project_context(cache)
        for j in range(n_draft):
            pos = cache.length + j                                                # chain slot j's position
            x = self.target.embed_tokens(torch.tensor([[token]], device=device))     # (1, 1, D)
            cos, sin = self.rope_at(torch.arange(pos, pos + 1, device=device), x.dtype)
            for i, layer in enumerate(self.layers):                               # sees context + slots 0..j
                x, k, v = layer(x, cache.k[i, :, :, :pos], cache.v[i, :, :, :pos], cos, sin, None)
                cache.write(i, pos, k, v)
            t, q = choose(self.target.lm_head(self.norm(x))[0])                   # (1, V) -> (1,), (1, V)
            tokens.append(t)
            probs.append(q)
            token = int(t[0])                            # fed back: the next forward conditions on it
        if not tokens:
            return choose(torch.zeros(0, self.target.config.vocab_size, device=device))
        return torch.cat(tokens), None if probs[0] is None else torch.cat(probs)   # (n,), (n, V) or None

    def forward(self, features, input_ids, anchors):
        """Teacher forcing, K chains per sequence in one pass -> logits (N, K, B, V) in Drafter.loss's layout:
        index k holds the prediction of x_{a+k} (made by chain slot k-1); index 0 (the anchor) is zeros."""
        N, S, _ = features.shape
        K, n = anchors.size(1), self.config.block_size - 1
        context = self.context_kv(features, torch.arange(S, device=features.device))   # every position
        pos = anchors[:, :, None] + torch.arange(n, device=anchors.device)   # (N, K, n): x_a .. x_{a+n-1}
        x = self.target.embed_tokens(torch.gather(input_ids, 1, pos.flatten(1)))       # (N, K*n, D)
        cos, sin = self.rope_at(pos.flatten(1), x.dtype)                               # (N, 1, K*n, hd)
        mask = causal_training_mask(anchors, S, n).unsqueeze(1)                        # (N, 1, K*n, S+K*n)
        hidden = self.block_pass(x, cos, sin, context, mask)                           # (N, K*n, D)
        logits = self.target.lm_head(hidden).view(N, K, n, -1)                        # -> (N, K, n, V)
        return torch.cat([torch.zeros_like(logits[:, :, :1]), logits], dim=2)         # (N, K, B, V)


class NoFeatureDrafter(Drafter):
    """The DFlash drafter with the target's features removed: every block attends to its own slots only.

    Nothing is injected (not zeros: zero keys would still take attention mass); `fc` and `hidden_norm`
    stay in the state dict, unused, so the layout matches the DFlash drafter's.
    """
    kind = "nofeat"
    uses_block_pass = False  # its blocks skip the context: batched row by row, never compiled

    def extend(self, cache, features, tokens=None):
        cache.length += features.size(1)      # positions still advance (RoPE); no context is kept

    def block_hidden(self, cache, block):
        """The block attends to its own slots only, at the positions after the context -> (1, b, D)."""
        x = self.target.embed_tokens(block)                                               # (1, b, D)
        positions = torch.arange(cache.length, cache.length + block.size(1), device=x.device)
        cos, sin = self.rope_at(positions, x.dtype)
        return self.block_pass(x, cos, sin, self._no_context(x))

    def hidden(self, features, input_ids, anchors):
        """Drafter.hidden with no context keys: each block sees its own slots (the training mask's block
        part)."""
        N, S, _ = features.shape
        K, B = anchors.size(1), self.config.block_size
        x, cos, sin = self.training_blocks(input_ids, anchors)              # (N, K*B, D), (N, 1, K*B, hd)
        mask = training_mask(anchors, S, B).unsqueeze(1)[..., S:]                # (N, 1, K*B, K*B)
        return self.block_pass(x, cos, sin, self._no_context(x), mask).view(N, K, B, -1)   # (N, K, B, D)

    def _no_context(self, x):
        """Every layer's empty context keys/values, (N, Hkv, 0, hd) each, for x (N, T, D)."""
        none = x.new_zeros(x.size(0), self.config.n_kv_head, 0, self.config.head_dim)
        return [(none, none)] * self.config.n_layer


class NoFeatureDFlash2Drafter(NoFeatureDrafter, DFlash2Drafter):
    """The DFlash 2 drafter (convolutions and selector) with the target's features removed, as
    NoFeatureDrafter removes them from DFlash 1: the like-for-like partner of a DFlash 2 drafter."""
    kind = "nofeat2"


def without_features(cls):
    """The no-feature class that partners the DFlash drafter class `cls`: its layers, nothing injected."""
    return NoFeatureDFlash2Drafter if issubclass(cls, DFlash2Drafter) else NoFeatureDrafter


# every baseline kind: its class and checkpoint; the DFlash kind that drafter.pt is not is one of them
KINDS = {"ar": (ARDrafter, AR), "nofeat": (NoFeatureDrafter, NOFEAT),
         "dflash": (Drafter, "drafter_dflash.pt"), "dflash2": (DFlash2Drafter, "drafter_dflash2.pt")}


def base_config(config, cls=Drafter):
    """A `cls.config_class` with the fields it shares with `config`: every baseline takes the main drafter's
    size and features; a DFlash 2 one adds its defaults, the others drop DFlash 2's extra fields."""
    shared = [f.name for f in fields(cls.config_class) if hasattr(config, f.name)]
    return cls.config_class(**{name: getattr(config, name) for name in shared})


save_baseline = ckpt.save_drafter          # the checkpoint records drafter.kind ("ar" / "nofeat")


def load_baseline(path, target, kind, device="cpu"):
    """Load a baseline drafter of `kind` ("ar" or "nofeat") onto `target`, with checkpoint.load_drafter's
    checks."""
    make = "python -m nanodflash.tools.baselines"
    return ckpt.load_drafter(path, target, device, cls=KINDS[kind][0], kind=kind, make=make,
                             retrain=f"{make} --out DIR --fresh")


def load_present(out_dir, target, device="cpu", main_kind=None):
    """{"ar": ARDrafter, "nofeat": NoFeatureDrafter, "dflash2"/"dflash": ...} for those whose checkpoints
    exist in out_dir, leaving out `main_kind` (the kind of out_dir's drafter.pt).

    A stale one (trained against another target, e.g. after `train_tiny.py --fresh`) or a corrupt one
    is skipped with a warning on stderr: the baselines are optional extras, never a reason to fail."""
    found = {}
    for kind, (_, fname) in KINDS.items():
        if kind != main_kind and os.path.exists(os.path.join(out_dir, fname)):
            try:
                found[kind] = load_baseline(os.path.join(out_dir, fname), target, kind, device)[0]
            except ValueError as e:
                print(f"warning: skipping the {kind} baseline: {e}", file=sys.stderr)
    return found


# ----------------------------------------------------------------------------- training entry point

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="folder written by train_tiny.py --out "
                   "(default: %(default)s)")
    p.add_argument("--steps", type=ints(1, MAX_COUNT), default=None, help="optimisation steps (default: "
                   "train_tiny's drafter steps)")
    p.add_argument("--fresh", action="store_true", help="retrain baselines whose checkpoints or resume files "
                   "exist")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--eval_prompts", type=ints(1, 10000), default=16, help="held-out prompts for τ "
                   "(default: %(default)s)")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds to train, of "
                   f"{', '.join(KINDS)}; drafter.pt's own kind is never retrained (default: all)")
    args = p.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or set(args.kinds) - set(KINDS):
        p.error(f"--kinds must name some of {', '.join(KINDS)}, got {','.join(args.kinds) or 'none'}")
    check_device(p, args.device)
    return args


def train_baselines(out, target, drafter, data, recipe, fresh=False, device="cpu", log=print,
                    kinds=tuple(KINDS)):
    """Train (or load) the baseline `kinds` but `drafter`'s own, with its config and `recipe`; return
    {kind: drafter}."""
    models, min_anchor = {}, data["prompt_len"] - 1                  # as train_tiny: labels are target tokens
    for kind, (cls, fname) in KINDS.items():
        if kind == drafter.kind or kind not in kinds:
            continue
        path = os.path.join(out, fname)
        if os.path.exists(path) and not fresh:
            log(f"[{kind}] found {path}, skipping")
            models[kind] = load_baseline(path, target, kind, device)[0]
            continue
        if fresh:
            ckpt.discard_resume(path)
        torch.manual_seed(recipe["seed"])
        d = cls(base_config(drafter.config, cls), target).to(device)
        log(f"[{kind}] {cls.__name__}: {sum(p.numel() for p in d.parameters()) / 1e6:.2f}M parameters, "
            f"{recipe['steps']} steps, same recipe and data as {run_folder.DRAFTER}")

        def eval_fn(m):
            return {"expected_tau": slot_accuracy(m, data["val"], min_anchor=min_anchor)["expected_tau"]}
        how = DraftTraining(**recipe, min_anchor=min_anchor, eval_every=max(1, recipe["steps"] // 4))
        hist = train_drafter(d, data["train"], how, long_seqs=data.get("train_long"), eval_fn=eval_fn,
                             resume=resume_file(ckpt.resume_path(path)))
        save_baseline(path, d, hist)
        models[kind] = d
    return models


def main(argv=None):
    args = parse_args(argv)
    try:
        run_folder.check_run_folder(args.out)
        target, _ = ckpt.load_target(os.path.join(args.out, run_folder.TARGET), args.device)
        path = os.path.join(args.out, run_folder.DRAFTER)
        drafter, ck = ckpt.load_drafter(path, target, args.device)
        recipe = run_recipe(ck.get("made_by"), path)
        recipe["steps"] = args.steps or recipe["steps"]
        data = ckpt.read(os.path.join(args.out, run_folder.DATA), "generated data")
        t0 = time.perf_counter()
        models = train_baselines(args.out, target, drafter, data, recipe, args.fresh, args.device,
                                 kinds=args.kinds)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted: finished baselines are saved, and the one in progress as of its last step; "
              "rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    print(f"training: {time.perf_counter() - t0:.0f}s")
    report(args.out, drafter, models, data, args.eval_prompts, AR_KS)

if __name__ == "__main__":
    main()
