"""Training loops: the target GPT (next-token prediction) and the shared pieces both loops use.

AdamW, linear warmup then cosine decay to 10% of the peak, gradient clipping, a progress line with
tokens/s and ETA, periodic validation loss. Given `resume=PATH`, a loop saves its whole state there
every ~45 s and at Ctrl-C, and a rerun continues from it (resume.py). Drafter training lives in
train_drafter.py.
"""

import math
import sys
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from .store.data import get_batch
from .store.resume import Resume, data_hash


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
    `resume`: path of a resume file (resume.py), continued from if it exists."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    opt = make_optimizer(model.parameters(), lr)
    history = {"step": [], "train_loss": [], "val_loss": []}
    settings = dict(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, eval_every=eval_every,
                    eval_batches=eval_batches, grad_clip=grad_clip, seed=seed, config=asdict(model.config),
                    data=data_hash(train_ids, val_ids))
    state = Resume(resume, "target", settings, model=model, optimizer=opt, data_order=g, history=history)
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
