"""Training: the target GPT (next-token prediction), then the DFlash drafter on the target's own text.

AdamW, linear warmup then cosine decay to 10% of the peak, gradient clipping, a progress line with
tokens/s and ETA, periodic validation loss. Given `resume` (store/resume.py's `resume_file(path)`), a loop
saves its whole state every ~45 s and at Ctrl-C, and a rerun continues from it.

The drafter (paper §4.2): target-generated data, random anchors, one-pass block mask.

1. The data: the drafter must learn what the *target* will say, so it trains on the target's own
   continuations of prompts from the training split (greedy or sampled, or a mix of both), made by the
   batched plain decoder and handed to `train_drafter` (ext/plain_batch.py: `generate_sequences`).
2. `train_drafter`: per step, a batch of sequences goes once through the frozen target (features at
   `target_layer_ids` for every position); K random anchors per sequence are drawn afresh; all K
   blocks [x_a, MASK, ...] go through the drafter in ONE forward with `training_mask`; the loss is
   cross-entropy of slots 1..B-1 against x_{a+1..a+B-1}, weighted by exp(-(k-1)/gamma); with
   soft_weight > 0, mixed with the cross-entropy against the target's own next-token distribution
   (loss.py; computed in the same one-time target pass as the features).
3. How well it drafts: tools/evaluate.py (per-slot accuracy, expected and measured τ).
"""

import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from .loss import loss_decay_weights, soft_targets

PARTS = ("dflash_loss", "selector_loss", "recall")    # extra numbers a drafter's loss() may report (DFlash 2)


def get_batch(ids, batch_size, seq_len, generator=None, device="cpu"):
    """Random windows of a 1-D token tensor: x (batch, seq_len) and targets y = x shifted by one."""
    starts = torch.randint(0, ids.numel() - seq_len, (batch_size,), generator=generator)
    x = torch.stack([ids[s: s + seq_len] for s in starts])
    y = torch.stack([ids[s + 1: s + 1 + seq_len] for s in starts])
    return x.to(device), y.to(device)


class Unsaved:
    """A training loop's state that nobody saves: what a loop uses when it is given no `resume`."""

    def __init__(self, stage, settings, **state):
        pass

    def restore(self, total_steps):
        return 0                                  # steps done before: none

    def step_done(self, step):
        pass

    def deferring_stop(self):
        return contextlib.nullcontext()


def lr_at(step, total_steps, peak_lr, warmup_frac=0.04, min_ratio=0.1):
    """Learning rate at `step` (0-based): linear warmup over warmup_frac of the steps, then cosine."""
    warmup = max(1, int(round(warmup_frac * total_steps)))
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return peak_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class Progress:
    """One line per report: step, loss, lr, tokens/s and ETA (over this run's steps: `start` were done
    before)."""

    def __init__(self, name, total_steps, every, stream=None, start=0):
        # stream None: sys.stdout when printing
        self.name, self.total, self.every, self.stream, self.start = name, total_steps, every, stream, start
        self.t0, self.tokens = time.perf_counter(), 0

    def step(self, step, loss, lr, tokens, extra=""):
        self.tokens += tokens
        if step % self.every and step != self.total - 1 and not extra:
            return
        dt = time.perf_counter() - self.t0
        eta = dt / (step + 1 - self.start) * (self.total - step - 1)
        print(f"[{self.name}] step {step + 1:5d}/{self.total} | loss {loss:.4f} | lr {lr:.2e} | "
              f"{self.tokens / max(dt, 1e-9):8.0f} tok/s | elapsed {dt:5.0f}s | eta {eta:4.0f}s{extra}",
              file=self.stream or sys.stdout, flush=True)


def make_optimizer(params, lr, weight_decay=0.1):
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if p.dim() == 2]          # matrices decay; norms' gains (1-D) and DFlash 2's
    no_decay = [p for p in params if p.dim() != 2]       # identity-initialised conv kernels (3-D) do not
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


@torch.no_grad()
def estimate_loss(model, ids, batch_size, seq_len, n_batches, seed=1234):
    """Mean next-token cross-entropy of `model` on n_batches fixed random windows of `ids`."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    losses = []
    for _ in range(n_batches):
        x, y = get_batch(ids, batch_size, seq_len, g, device)
        logits, _ = model(x)
        losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


def train_target(model, train_ids, val_ids, steps, batch_size, seq_len, lr, eval_every=100,
                 eval_batches=8, grad_clip=1.0, seed=0, log_every=20, resume=None):
    """Train the target on random windows; returns history {"step", "train_loss", "val_loss"}.
    `resume`: None, or `resume(stage, settings, **state)` -> the object that saves and restores the loop
    (store/resume.py's `resume_file(path)`: continued from the file if it exists)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model.parameters(), lr)
    history = {"step": [], "train_loss": [], "val_loss": []}
    settings = dict(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, eval_every=eval_every,
                    eval_batches=eval_batches, grad_clip=grad_clip, seed=seed, config=asdict(model.config),
                    data=(train_ids, val_ids))
    state = (resume or Unsaved)("target", settings, model=model, optimizer=opt, data_order=g, history=history)
    first = state.restore(steps)
    progress = Progress("target", steps, log_every, start=first)
    model.train()
    with state.deferring_stop():
        for step in range(first, steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr)
            x, y = get_batch(train_ids, batch_size, seq_len, g, device)
            logits, _ = model(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            extra = ""
            if (step + 1) % eval_every == 0 or step == steps - 1:
                tr = estimate_loss(model, train_ids, batch_size, seq_len, eval_batches)
                va = estimate_loss(model, val_ids, batch_size, seq_len, eval_batches)
                history["step"].append(step + 1)
                history["train_loss"].append(tr)
                history["val_loss"].append(va)
                extra = f" | train {tr:.3f} val {va:.3f}"
            progress.step(step, loss.item(), lr_at(step, steps, lr), x.numel(), extra)
            state.step_done(step + 1)                   # saves every ~45 s, and at Ctrl-C (then stops)
    model.eval()
    return history


# ---------------- the drafter ----------------


def sample_anchors(n_seqs, n_anchors, seq_len, block_size, min_anchor=0, generator=None):
    """(n_seqs, n_anchors) anchor positions, uniform in [min_anchor, seq_len - block_size] (repeats
    allowed)."""
    hi = seq_len - block_size
    if hi < min_anchor:
        raise ValueError(f"sequences of {seq_len} tokens are too short for blocks of {block_size} "
                         f"after position {min_anchor}")
    return torch.randint(min_anchor, hi + 1, (n_seqs, n_anchors), generator=generator)


@torch.no_grad()
def target_features(target, seqs, layer_ids, batch_size=64, soft=False):
    """Features at `layer_ids` for every position of seqs (N, S) -> (N, S, n_feat*D), in batches.
    soft=True: also the target's top-m next-token distributions from the same forwards (loss.soft_targets),
    returned as (features, (probs, ids))."""
    device = next(target.parameters()).device
    feats, probs, ids = [], [], []
    for i in range(0, len(seqs), batch_size):
        logits, f = target(seqs[i: i + batch_size].to(device), layer_ids=layer_ids)
        feats.append(f)
        if soft:
            p, t = soft_targets(logits)
            probs.append(p)
            ids.append(t)
    return (torch.cat(feats), (torch.cat(probs), torch.cat(ids))) if soft else torch.cat(feats)


def _features_and_soft(target, seqs, layer_ids, soft):
    """(features, soft targets) of seqs; soft targets None unless `soft`."""
    out = target_features(target, seqs, layer_ids, soft=soft)
    return out if soft else (out, None)


@dataclass(kw_only=True)
class DraftTraining:
    """How a drafter trains (train_drafter): the recipe, apart from the data it trains on."""
    steps: int
    batch_size: int                 # sequences per step
    n_anchors: int                  # blocks drawn from each sequence
    lr: float                       # peak learning rate (warmup, then cosine: train.lr_at)
    min_anchor: int = 0             # the earliest anchor position
    gamma: float = None             # the loss decay (None: the paper's for the block size)
    grad_clip: float = 1.0
    seed: int = 0                   # the data order's and the anchors' generator
    soft_weight: float = 0.0        # > 0: that share of the loss against the target's distribution
    long_batch: int = 0             # long sequences per step ...
    long_anchors: int = 0           # ... and blocks drawn from each (with train_drafter's long_seqs)
    log_every: int = 20             # steps between progress lines
    eval_every: int = None          # steps between eval_fn calls
    log_name: str = "drafter"       # the progress lines' prefix
    precompute_limit: int = 2 * 2**30   # bytes of target features computed once up front, at most


RESUME_KEYS = ("steps", "batch_size", "n_anchors", "lr", "min_anchor", "gamma", "grad_clip", "seed",
               "eval_every", "soft_weight")


def data_parts(seqs, long_seqs, how):
    """Where each step's blocks come from: [{seqs, n sequences, k anchors each}], the long sequences second
    when `how` draws from them."""
    parts = [dict(seqs=seqs, n=how.batch_size, k=how.n_anchors)]
    if long_seqs is not None and how.long_batch and how.long_anchors:
        parts.append(dict(seqs=long_seqs, n=how.long_batch, k=how.long_anchors))
    return parts


def add_features(parts, target, config, how):
    """The frozen target reads each sequence once, ever: every part's features (and soft targets) computed up
    front, when they fit in how.precompute_limit bytes (else None: one target forward per step)."""
    n_bytes = sum(p["seqs"].numel() for p in parts) * len(config.target_layer_ids) * config.n_embd * 4
    for p in parts:
        p["feats"], p["soft"] = None, None
        if n_bytes < how.precompute_limit:
            p["feats"], p["soft"] = _features_and_soft(target, p["seqs"], config.target_layer_ids,
                                                       how.soft_weight > 0)
            p["feats"] = p["feats"].cpu()


def blocks_loss(drafter, parts, weights, g, how, device):
    """One step's loss: from each part, n random sequences x k random anchors (drawn from g), through the
    drafter's loss; the parts weighed by their share of the blocks. -> (loss, {PARTS name: value})."""
    blocks = sum(p["n"] * p["k"] for p in parts)
    loss, parts_out, c = 0.0, {}, drafter.config
    for p in parts:
        rows = torch.randint(0, p["seqs"].size(0), (p["n"],), generator=g)
        x = p["seqs"][rows].to(device)                                         # (N, S)
        if p["feats"] is not None:
            feats = p["feats"][rows].to(device)
            soft = p["soft"] and tuple(t[rows].to(device) for t in p["soft"])
        else:                                                                  # one target forward per step
            feats, soft = _features_and_soft(drafter.target, x, c.target_layer_ids, how.soft_weight > 0)
        anchors = sample_anchors(p["n"], p["k"], x.size(1), c.block_size, how.min_anchor, g)
        part_loss, out = drafter.loss(feats, x, anchors.to(device), weights, soft=soft,
                                      soft_weight=how.soft_weight)
        share = p["n"] * p["k"] / blocks                                       # this part's share of blocks
        loss = loss + share * part_loss
        for k in PARTS:
            if k in out:
                parts_out[k] = parts_out.get(k, 0.0) + share * float(out[k])
    return loss, parts_out


def evaluate(drafter, eval_fn, step, how, history):
    """eval_fn's numbers every how.eval_every steps and at the last, kept in history -> a progress suffix."""
    every = how.eval_every
    if eval_fn is None or not every or not ((step + 1) % every == 0 or step == how.steps - 1):
        return ""
    drafter.eval()
    result = eval_fn(drafter)
    drafter.train()
    history["eval"].append({"step": step + 1, **result})
    return " | " + " ".join(f"{k} {v:.3f}" for k, v in result.items() if isinstance(v, float))


def resume_settings(drafter, seqs, long_seqs, how, parts):
    """What a resume file must have been trained with to be continued (the data and the target as they are:
    the resume file keeps a hash of each)."""
    recipe = {k: getattr(how, k) for k in RESUME_KEYS}
    long = {"long": [long_seqs, how.long_batch, how.long_anchors]} if len(parts) > 1 else {}
    return dict(kind=drafter.kind, config=asdict(drafter.config), target=drafter.target,
                data=seqs, **recipe, **long)


def train_drafter(drafter, seqs, how, long_seqs=None, eval_fn=None, resume=None):
    """Train `drafter` on target-generated `seqs` (N, S) as `how` (a DraftTraining) says; the target stays
    frozen. Returns a history dict.
    `long_seqs` (N', S' > S): longer sequences, of which each step also draws how.long_batch x
    how.long_anchors blocks, so that the drafter sees late positions too; the loss is the mean over all the
    step's blocks. `eval_fn(drafter) -> {name: value}` runs every how.eval_every steps. `resume`: as for
    train_target."""
    device = next(drafter.parameters()).device
    drafter.target.requires_grad_(False)
    g = torch.Generator().manual_seed(how.seed)
    weights = loss_decay_weights(drafter.config.block_size, how.gamma).to(device)
    opt = make_optimizer(drafter.parameters(), how.lr)
    history = {"step": [], "loss": [], "eval": []}
    parts = data_parts(seqs, long_seqs, how)
    state = (resume or Unsaved)(how.log_name, resume_settings(drafter, seqs, long_seqs, how, parts),
                                model=drafter, optimizer=opt, data_order=g, history=history)
    first = state.restore(how.steps)
    progress = Progress(how.log_name, how.steps, how.log_every, start=first)
    add_features(parts, drafter.target, drafter.config, how)
    tokens = sum(p["n"] * p["k"] for p in parts) * drafter.config.block_size        # per step, for tok/s
    drafter.train()
    with state.deferring_stop():
        for step in range(first, how.steps):
            lr = lr_at(step, how.steps, how.lr)
            for group in opt.param_groups:
                group["lr"] = lr
            loss, parts_out = blocks_loss(drafter, parts, weights, g, how, device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), how.grad_clip)
            opt.step()
            history["step"].append(step + 1)
            history["loss"].append(loss.item())
            for k, v in parts_out.items():      # DFlash 2: its two losses, recall
                history.setdefault(k, []).append(v)
            logged = step % how.log_every == 0
            extra = "".join(f" | {k} {v:.3f}" for k, v in parts_out.items()) if logged else ""
            extra += evaluate(drafter, eval_fn, step, how, history)
            progress.step(step, loss.item(), lr, tokens, extra)
            state.step_done(step + 1)                   # saves every ~45 s, and at Ctrl-C (then stops)
    drafter.eval()
    return history
