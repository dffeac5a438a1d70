"""A run folder: what `train_tiny.py --out DIR` writes, where each file lives, and the messages that say
what is wrong with a folder and what to do.

    DIR/run.json, tokenizer.bpe, target.pt, data.pt, drafter.pt, [data_sampled.pt, drafter_sampling.pt],
        costs.json

(checkpoint.py says what each file holds; `nanodflash.load(DIR)` reads them.) A folder that does not exist
is refused naming the nearest run folder, a folder without a tokenizer as an unfinished run; run.json records
the corpus the run was trained on (`run_corpus`), whether it is a smoke run (`is_toy_run`) and the summary's
headline.
"""

import difflib
import json
import os

from .data import BUILTIN_CORPORA, corpus_record, load_corpus

RUN, TOKENIZER, TARGET, DATA, DRAFTER = "run.json", "tokenizer.bpe", "target.pt", "data.pt", "drafter.pt"
# made by train_tiny.py unless --no-sampling
SAMPLED_DATA, SAMPLING_DRAFTER = "data_sampled.pt", "drafter_sampling.pt"
COSTS = "costs.json"     # the step costs block_size="auto" weighs drafts by, per machine (step_costs.py)
TOY_RUN = ("note: this is a smoke-sized run (train_tiny.py --smoke): its τ and speedups are not meaningful; "
           "`python train_tiny.py` trains a default-sized pair")


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


def write_json(path, obj, indent=2):
    """Write `obj` as JSON to `path.tmp`, then rename: a reader never sees a half-written file."""
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=indent)
    os.replace(path + ".tmp", path)


def write_run(out_dir, record):
    write_json(os.path.join(out_dir, RUN), record)


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


def read_costs(out_dir):
    """The entries of out_dir's costs.json (tools/calibrate.py: one per machine key), [] without one."""
    path = os.path.join(out_dir, COSTS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)["tables"]


def write_costs(out_dir, entry):
    """Keep `entry` in out_dir's costs.json, in place of an entry of the same machine key. -> the path."""
    entries = [e for e in read_costs(out_dir) if e["key"] != entry["key"]] + [entry]
    path = os.path.join(out_dir, COSTS)
    write_json(path, {"tables": entries}, indent=1)
    return path
