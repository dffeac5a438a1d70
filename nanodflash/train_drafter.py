"""Training the DFlash drafter (paper §4.2): target-generated data, random anchors, one-pass block mask.

1. `generate_sequences`: the drafter must learn what the *target* will say, so its data is the
   target's own continuations of prompts from the training split (greedy or sampled, or a mix of both:
   `generate_mix`), batched with the KV cache.
2. `train_drafter`: per step, a batch of sequences goes once through the frozen target (features at
   `target_layer_ids` for every position); K random anchors per sequence are drawn afresh; all K
   blocks [x_a, MASK, ...] go through the drafter in ONE forward with `training_mask`; the loss is
   cross-entropy of slots 1..B-1 against x_{a+1..a+B-1}, weighted by exp(-(k-1)/gamma); with
   soft_weight > 0, mixed with the cross-entropy against the target's own next-token distribution
   (distill.py; computed in the same one-time target pass as the features).
3. `slot_accuracy`: per-slot accuracy and top-k recall on held-out sequences; `measure_tau`: τ of real
   greedy speculative decoding.
"""

import time
from dataclasses import asdict, dataclass

import torch

from .distill import soft_targets
from .drafter_loss import loss_decay_weights
from .ext.plain_batch import generate_batch
from .speculative import speculative_generate
from .store.resume import Resume, data_hash
from .train import Progress, lr_at, make_optimizer

PARTS = ("dflash_loss", "selector_loss", "recall")    # extra numbers a drafter's loss() may report (DFlash 2)


@torch.no_grad()
def generate_sequences(target, ids, n_seqs, prompt_len, gen_len, temperature=0.0, top_k=None,
                       batch_size=64, seed=0, log=print):
    """(n_seqs, prompt_len + gen_len) LongTensor: random prompts from `ids`, continued by the target,
    batch_size rows at a time (plain batched decoding, plain_batch.generate_batch)."""
    g = torch.Generator().manual_seed(seed)
    out, t0 = [], time.perf_counter()
    for b0 in range(0, n_seqs, batch_size):
        n = min(batch_size, n_seqs - b0)
        starts = torch.randint(0, ids.numel() - prompt_len, (n,), generator=g)
        prompts = [ids[s: s + prompt_len].tolist() for s in starts]
        continued = generate_batch(target, prompts, gen_len, temperature, top_k, generator=g)
        out.append(torch.tensor([p + c for p, c in zip(prompts, continued)]))          # (n, prompt + gen)
        done = b0 + n
        log(f"[data] {done}/{n_seqs} sequences | "
            f"{done * gen_len / (time.perf_counter() - t0):.0f} generated tok/s")
    return torch.cat(out)


def generate_mix(target, ids, n, greedy_frac, seed, kw):
    """n target continuations (generate_sequences with keyword args kw): round(n * greedy_frac) greedy ones,
    the rest at kw["temperature"] (all greedy when that is 0). Without a greedy part: one plain call."""
    n_greedy = n if kw.get("temperature", 0) == 0 else round(n * greedy_frac)
    parts = ([generate_sequences(target, ids, n_greedy, seed=seed, **{**kw, "temperature": 0.0})]
             if n_greedy else [])
    if n_greedy < n:                                   # other prompts than the greedy part's (another seed)
        parts.append(generate_sequences(target, ids, n - n_greedy, seed=seed + 7919 if n_greedy else seed,
                                        **kw))
    return torch.cat(parts)


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
    soft=True: also the target's top-m next-token distributions from the same forwards (distill.soft_targets),
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
    """What a resume file must have been trained with to be continued."""
    recipe = {k: getattr(how, k) for k in RESUME_KEYS}
    long = {"long": [data_hash(long_seqs), how.long_batch, how.long_anchors]} if len(parts) > 1 else {}
    return dict(kind=drafter.kind, config=asdict(drafter.config), target=drafter.target.fingerprint(),
                data=data_hash(seqs), **recipe, **long)


def train_drafter(drafter, seqs, how, long_seqs=None, eval_fn=None, resume=None):
    """Train `drafter` on target-generated `seqs` (N, S) as `how` (a DraftTraining) says; the target stays
    frozen. Returns a history dict.
    `long_seqs` (N', S' > S): longer sequences, of which each step also draws how.long_batch x
    how.long_anchors blocks, so that the drafter sees late positions too; the loss is the mean over all the
    step's blocks. `eval_fn(drafter) -> {name: value}` runs every how.eval_every steps. `resume`: path of a
    resume file (resume.py), continued from if it exists."""
    device = next(drafter.parameters()).device
    drafter.target.requires_grad_(False)
    g = torch.Generator().manual_seed(how.seed)
    weights = loss_decay_weights(drafter.config.block_size, how.gamma).to(device)
    opt = make_optimizer(drafter.parameters(), how.lr)
    history = {"step": [], "loss": [], "eval": []}
    parts = data_parts(seqs, long_seqs, how)
    state = Resume(resume, how.log_name, resume_settings(drafter, seqs, long_seqs, how, parts), model=drafter,
                   optimizer=opt, data_order=g, history=history)
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


@torch.no_grad()
def slot_accuracy(drafter, seqs, n_anchors=16, min_anchor=0, seed=0, batch_size=16, top_k=16):
    """Per-slot accuracy (slots 1..B-1), top-k recall and the expected acceptance length, on held-out
    sequences.

    Accuracy: the drafted token (given the true tokens before it) is the target's. Recall: the target's
    token is among the drafter's top_k logits (a perfect top-k selector's accuracy). Expected τ counts,
    per block, 1 + the number of leading slots that are all correct.
    """
    g = torch.Generator().manual_seed(seed)
    c, device = drafter.config, next(drafter.parameters()).device
    weights = loss_decay_weights(c.block_size).to(device)
    correct, recall, prefix, blocks = torch.zeros(c.block_size - 1), torch.zeros(c.block_size - 1), 0.0, 0
    for b0 in range(0, seqs.size(0), batch_size):
        x = seqs[b0: b0 + batch_size].to(device)
        feats = target_features(drafter.target, x, c.target_layer_ids)
        anchors = sample_anchors(x.size(0), n_anchors, x.size(1), c.block_size, min_anchor, g).to(device)
        _, out = drafter.loss(feats, x, anchors, weights)
        labels = out["labels"]
        hit = (out["pred"] == labels)[..., 1:].float().cpu()                   # (N, K, B-1)
        top = out["logits"].topk(top_k, dim=-1).indices                        # (N, K, B, top_k)
        recall += (top == labels[..., None]).any(-1)[..., 1:].float().sum((0, 1)).cpu()
        correct += hit.sum((0, 1))
        prefix += hit.cumprod(-1).sum().item()
        blocks += hit.shape[0] * hit.shape[1]
    return {"slot_acc": (correct / blocks).tolist(), "slot_recall": (recall / blocks).tolist(),
            "expected_tau": 1 + prefix / blocks}


def measure_tau(drafter, prompts, max_new_tokens, block_size=None, outputs=None, **kw):
    """τ of real speculative decoding (greedy unless kw says otherwise) over `prompts`: total emitted
    tokens / total steps. `outputs`, a list, receives each prompt's tokens (the text τ was measured on)."""
    emitted, steps = 0, 0
    for p in prompts:
        out, st = speculative_generate(drafter.target, drafter, p, max_new_tokens, block_size=block_size,
                                       **kw)
        if outputs is not None:
            outputs.append(out)
        emitted += sum(st.acceptance_lengths)
        steps += len(st.acceptance_lengths)
    return emitted / max(steps, 1)
