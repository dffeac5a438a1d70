"""Checkpoints: written atomically (temp file + rename), read back with clear errors.

A run folder written by `train_tiny.py --out DIR` holds:
    run.json        {"corpus": {"data": its --data, "sha256"}, "made_by": the tokenizer's record,
                    with "smoke", "headline": the summary's greedy and sampled τ, repetition and
                    speedup, with the hashes of the checkpoints it measured}
    tokenizer.bpe   the BPE ranks, tiktoken's rank-file format
    target.pt       {"config", "model", "tokenizer", "history", "made_by"}
    data.pt         target-generated sequences the drafter trains on, and "made_by"
    drafter.pt      {"kind", "config", "model", "target_fingerprint", "history", "made_by"};
                    kind "dflash" or "dflash2"
    data_sampled.pt       unless --no-sampling: continuations sampled from the target, and "made_by"
    drafter_sampling.pt   unless --no-sampling: drafter.pt fine-tuned on data_sampled.pt (a drafter file)
"made_by" records what made the checkpoint: the stage's flags, and hashes of what it was made from (corpus,
tokenizer, target, data, drafter), e.g. {"n_layer": 24, ..., "corpus": "c6e3...", "tokenizer": "9a1f..."};
train_tiny.py reuses a stage only when its record equals the one it would write. While a training stage
runs, `<its checkpoint>.resume` holds its whole state (resume.py); writing the stage checkpoint deletes it.
"""

import hashlib
import os
from dataclasses import asdict

import torch

from ..dflash2 import DFlash2Drafter
from ..drafter import Drafter
from ..ext.step_costs import use_table
from ..gpt import GPT, GPTConfig
from .run_folder import TARGET, TOKENIZER, check_run_folder, drafter_path, read_costs
from .tokenizer import load_tokenizer

DRAFTER_KINDS = {"dflash": Drafter, "dflash2": DFlash2Drafter}   # what drafter.pt may hold


def atomic_save(obj, path):
    """torch.save to `path.tmp`, then rename: a reader never sees a half-written file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resume_path(path):
    """Where the stage that writes `path` keeps its resume file while it trains."""
    return f"{path}.resume"


def discard_resume(path):
    """The stage that writes `path` is done (or starts over): its resume file goes."""
    if os.path.exists(resume_path(path)):
        os.remove(resume_path(path))


def read(path, what, make="python train_tiny.py"):
    """torch.load with messages that say what is wrong and what to do (`make`: the command that writes it)."""
    folder = os.path.dirname(path) or "."
    if not os.path.exists(folder):
        check_run_folder(folder)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} checkpoint not found: {path} (run `{make} --out {folder}` first)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"{what} checkpoint {path} is corrupt or truncated ({type(e).__name__}); "
                         "delete it and rerun train_tiny.py, which redoes that stage") from e


# the weights a layer keeps stacked (one matmul), and Qwen3's own names for their parts, in row order
STACKED = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight"),
           "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


def qwen3_state_dict(model):
    """model.state_dict() under Qwen3's names, the names on disk: each stacked weight split into its parts
    (q, k, v by the layer's head counts; gate and up in halves)."""
    out = {}
    for name, t in model.state_dict().items():
        stacked = next((s for s in STACKED if name.endswith(s)), None)
        if stacked is None:
            out[name] = t
            continue
        prefix = name[: -len(stacked)]
        if stacked.startswith("self_attn"):
            a = model.get_submodule(prefix + "self_attn")
            parts = t.split([a.n_head * a.head_dim, a.n_kv_head * a.head_dim, a.n_kv_head * a.head_dim])
        else:
            parts = t.chunk(2)
        out.update({prefix + part: piece.clone() for part, piece in zip(STACKED[stacked], parts)})
    return out


def stacked_state_dict(weights):
    """The reverse of qwen3_state_dict: Qwen3-named weights -> the names a model's load_state_dict takes."""
    out = dict(weights)
    for stacked, parts in STACKED.items():
        for name in [k for k in weights if k.endswith(parts[0])]:
            prefix = name[: -len(parts[0])]
            out[prefix + stacked] = torch.cat([out.pop(prefix + part) for part in parts])
    return out


def fingerprint(target):
    """A short hash of a target's config and weights (under their Qwen3 names), so that a drafter can check
    which target it was trained on."""
    config = asdict(target.config)
    if config["head_dim"] == target.config.n_embd // target.config.n_head:
        del config["head_dim"]                          # a derived head_dim is not a setting of its own
    h = hashlib.sha256(repr(sorted(config.items())).encode())
    for name, t in sorted(qwen3_state_dict(target).items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def save_target(path, target, tokenizer_path, history=None, made_by=None):
    with open(tokenizer_path) as f:
        tok_text = f.read()
    atomic_save({"config": asdict(target.config), "model": qwen3_state_dict(target), "tokenizer": tok_text,
                 "history": history or {}, "made_by": made_by or {}}, path)
    discard_resume(path)


def load_target(path, device="cpu"):
    ck = read(path, "target")
    target = GPT(GPTConfig(**ck["config"]))
    target.load_state_dict(stacked_state_dict(ck["model"]))
    return target.to(device).eval(), ck


def save_drafter(path, drafter, history=None, made_by=None):
    """Write a drafter with the fingerprint of its target and its kind: "dflash", "dflash2", or a
    baseline's."""
    atomic_save({"kind": drafter.kind, "config": asdict(drafter.config), "model": qwen3_state_dict(drafter),
                 "target_fingerprint": fingerprint(drafter.target), "history": history or {},
                 "made_by": made_by or {}}, path)
    discard_resume(path)


def load_drafter(path, target, device="cpu", cls=None, kind=None, make="python train_tiny.py",
                 retrain="rerun train_tiny.py with --fresh"):
    """Load a drafter onto `target`; refuse if it was trained against a different target. The step costs of
    its folder (costs.json) come with it: block_size="auto" decides by them (step_costs.py).

    Without `cls`, the checkpoint's kind picks the class (DFlash or DFlash 2, DRAFTER_KINDS). Baseline
    drafters (nanodflash.tools.baselines) pass their class, the `kind` their checkpoint must record, and the
    commands that make and retrain them."""
    what = f"{kind} baseline drafter" if kind else "drafter"
    ck = read(path, what, make)
    if ck.get("kind") is None:
        raise ValueError(f"{what} {path} records no drafter kind, so nothing says which class reads it; "
                         f"retrain it ({retrain})")
    if cls is None and ck.get("kind") not in DRAFTER_KINDS:
        raise ValueError(f"{path} holds a {ck.get('kind')!r} baseline drafter, "
                         "not a DFlash or DFlash 2 drafter")
    if kind is not None and ck.get("kind") != kind:
        raise ValueError(f"{path} holds a {ck.get('kind')!r} drafter, not a {kind!r} baseline")
    cls = cls or DRAFTER_KINDS[ck["kind"]]
    fp = fingerprint(target)
    if ck["target_fingerprint"] != fp:
        raise ValueError(f"{what} {path} was trained against target {ck['target_fingerprint']}, "
                         f"but this target is {fp}; retrain it ({retrain})")
    drafter = cls(cls.config_class(**ck["config"]), target)
    drafter.load_state_dict(stacked_state_dict(ck["model"]))
    use_table(drafter, read_costs(os.path.dirname(path) or "."))       # its run folder's step costs
    return drafter.to(device).eval(), ck


def load(out_dir="out", device="cpu", sampling=False):
    """tok, target, drafter = nanodflash.load(out_dir): what train_tiny.py --out DIR wrote. sampling=True: the
    drafter to sample with (temperature > 0), drafter_sampling.pt where the run made one."""
    check_run_folder(out_dir)
    tok = load_tokenizer(os.path.join(out_dir, TOKENIZER))
    target, _ = load_target(os.path.join(out_dir, TARGET), device)
    if tok.n_vocab != target.config.vocab_size:
        raise ValueError(f"tokenizer in {out_dir} has {tok.n_vocab} tokens but the target expects "
                         f"{target.config.vocab_size}; the folder mixes runs, rerun train_tiny.py --fresh")
    drafter, _ = load_drafter(drafter_path(out_dir, sampling), target, device)
    return tok, target, drafter
