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

import difflib
import json
import os
from dataclasses import asdict

import torch

from .data import BUILTIN_CORPORA, corpus_record, load_corpus
from .dflash2 import DFlash2Drafter
from .drafter import Drafter
from .gpt import GPT, GPTConfig
from .tokenizer import load_tokenizer

RUN, TOKENIZER, TARGET, DATA, DRAFTER = "run.json", "tokenizer.bpe", "target.pt", "data.pt", "drafter.pt"
# made by train_tiny.py unless --no-sampling
SAMPLED_DATA, SAMPLING_DRAFTER = "data_sampled.pt", "drafter_sampling.pt"
DRAFTER_KINDS = {"dflash": Drafter, "dflash2": DFlash2Drafter}   # what drafter.pt may hold
TOY_RUN = ("note: this is a smoke-sized run (train_tiny.py --smoke): its τ and speedups are not meaningful; "
           "`python train_tiny.py` trains a default-sized pair")


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
    """Load a drafter onto `target`; refuse if it was trained against a different target.

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
    return drafter.to(device).eval(), ck


def drafter_path(out_dir, sampling=False):
    """out_dir's drafter.pt; sampling=True: its drafter_sampling.pt if the run made one (else drafter.pt)."""
    path = os.path.join(out_dir, SAMPLING_DRAFTER)
    return path if sampling and os.path.exists(path) else os.path.join(out_dir, DRAFTER)


def is_run_folder(folder):
    return os.path.isfile(os.path.join(folder, TOKENIZER)) or os.path.isfile(os.path.join(folder, RUN))


def nearest_run_folder(folder):
    """The run folder next to `folder` whose name is closest to its name, or None."""
    parent = os.path.dirname(os.path.abspath(folder))
    try:
        runs = sorted(d for d in os.listdir(parent) if is_run_folder(os.path.join(parent, d)))
    except OSError:
        return None
    close = difflib.get_close_matches(os.path.basename(os.path.normpath(folder)), runs,
                                      n=1, cutoff=0) or [None]
    return close[0] and os.path.join(os.path.dirname(os.path.normpath(folder)), close[0])


def check_run_folder(folder, make="python train_tiny.py"):
    """Raise FileNotFoundError, one line, when `folder` is no run folder: missing (naming the nearest run
    folder, if any), not a folder, or without a tokenizer (a run that stopped before its first stage)."""
    if not os.path.exists(folder):
        near = nearest_run_folder(folder)
        raise FileNotFoundError(f"no run folder {folder}: it does not exist"
                                + (f"; the nearest run folder is {near}" if near else "")
                                + f" (train one with `{make} --out {folder}`)")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is a file, not a run folder")
    if not os.path.isfile(os.path.join(folder, TOKENIZER)):
        raise FileNotFoundError(f"{folder} has no {TOKENIZER}: an unfinished run (it stopped before its "
                                f"first stage ended); rerun `{make} --out {folder}` with the flags it was "
                                "started with")


def read_run(out_dir):
    """run.json of a run folder (see the module docstring), or None where there is none."""
    path = os.path.join(out_dir, RUN)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_run(out_dir, record):
    tmp = os.path.join(out_dir, RUN + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, RUN))


def is_toy_run(out_dir):
    """True when out_dir's run.json says train_tiny.py --smoke made it."""
    return bool(((read_run(out_dir) or {}).get("made_by") or {}).get("smoke"))


def run_corpus(out_dir):
    """The --data the run in out_dir was trained on (a built-in corpus' name or a file's path), from its
    run.json; None (the default corpus) without one. A corpus file that is gone or changed is refused."""
    run = read_run(out_dir)
    if run is None:
        return None
    data, sha = run["corpus"]["data"], run["corpus"]["sha256"]
    if data in BUILTIN_CORPORA:
        return data
    if not os.path.isfile(data):
        raise FileNotFoundError(f"{out_dir} was trained on {data}, which is gone: put it back, or pass "
                                "--data FILE to take prompts from another text")
    if corpus_record(data, load_corpus(data))["sha256"] != sha:
        raise ValueError(f"{data} changed since {out_dir} was trained on it: put the original back, "
                         "or pass --data FILE to take prompts from another text")
    return data


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
