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


def save_target(path, target, tokenizer_path, history=None, made_by=None):
    with open(tokenizer_path) as f:
        tok_text = f.read()
    atomic_save({"config": asdict(target.config), "model": target.state_dict(), "tokenizer": tok_text,
                 "history": history or {}, "made_by": made_by or {}}, path)
    discard_resume(path)


def load_target(path, device="cpu"):
    ck = read(path, "target")
    target = GPT(GPTConfig(**ck["config"]))
    target.load_state_dict(ck["model"])
    return target.to(device).eval(), ck


def save_drafter(path, drafter, history=None, made_by=None):
    """Write a drafter with the fingerprint of its target and its kind: "dflash", "dflash2", or a
    baseline's."""
    atomic_save({"kind": drafter.kind, "config": asdict(drafter.config), "model": drafter.state_dict(),
                 "target_fingerprint": drafter.target.fingerprint(), "history": history or {},
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
    fp = target.fingerprint()
    if ck["target_fingerprint"] != fp:
        raise ValueError(f"{what} {path} was trained against target {ck['target_fingerprint']}, "
                         f"but this target is {fp}; retrain it ({retrain})")
    drafter = cls(cls.config_class(**ck["config"]), target)
    drafter.load_state_dict(ck["model"])
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
