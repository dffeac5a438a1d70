"""docs/errors.md, the common errors the README points to, quotes the messages the code really prints.

Each message is made here the way a user meets it (a missing folder, a mixed run, a bad flag, ...), in a
scratch folder entered as the working directory, so that paths read as in the README (`out/target.pt`).
A row matches when its quoted text, with `...` and the placeholders X, Y, N, M standing for anything, is
found in one real message (backticks aside: a table cell cannot hold them)."""

import argparse
import os
import re
import shutil

import pytest
import torch

import nanodflash
import train_tiny
from helpers import ROOT, tiny_drafter, tiny_target
from nanodflash.speculative import speculative_generate
from nanodflash.store.data import check_enough, load_corpus
from nanodflash.store.run_folder import run_corpus
from nanodflash.tools.cli import check_device

# the messages that tell a user what is wrong with a run folder: the table must quote each of them
RUN_FOLDER_MESSAGES = ("no run folder", "an unfinished run", "was made by another run", "which is gone")


def message(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except (OSError, ValueError) as e:
        return str(e)
    raise AssertionError(f"{fn.__name__}{args} raised nothing")


@pytest.fixture(scope="module")
def real_messages(smoke_out, tmp_path_factory):
    cwd, here = tmp_path_factory.mktemp("cwd"), os.getcwd()
    os.chdir(cwd)
    try:
        msgs = [message(nanodflash.load, "out")]                                     # no folder at all
        os.mkdir("empty")
        msgs.append(message(nanodflash.load, "empty"))                               # no tokenizer
        os.mkdir("out")
        shutil.copy(smoke_out / "tokenizer.bpe", "out/tokenizer.bpe")
        msgs.append(message(nanodflash.load, "out"))                                 # no target.pt
        shutil.rmtree("out")
        shutil.copytree(smoke_out, "out")
        data = open("out/drafter.pt", "rb").read()
        open("out/drafter.pt", "wb").write(data[: len(data) // 2])
        msgs.append(message(nanodflash.load, "out"))                                 # truncated
        shutil.copy(smoke_out / "drafter.pt", "out/drafter.pt")
        ck = torch.load("out/target.pt", weights_only=False)
        ck["model"]["lm_head.weight"] += 0.01
        torch.save(ck, "out/mixed_target.pt")
        os.replace("out/mixed_target.pt", "out/target.pt")
        # a drafter of another target
        msgs.append(message(nanodflash.load, "out"))
        shutil.rmtree("out")
        shutil.copytree(smoke_out, "out")
        # another setting
        msgs.append(message(train_tiny.main, ["--smoke", "--out", "out", "--n_layer", "3"]))
        tok, target, drafter = nanodflash.load("out")
        msgs.append(message(speculative_generate, target, drafter, [1] * 500, 100))
        sixteen = tiny_drafter(tiny_target(), block_size=16)                         # the default drafter's B
        msgs.append(message(speculative_generate, sixteen.target, sixteen, [1, 2], 5, block_size=99))
        for name, content in (("bad.txt", b"\xff\xfe bad"), ("empty.txt", b"")):
            open(name, "wb").write(content)
            msgs.append(message(load_corpus, name))
        msgs.append(message(check_enough, torch.zeros(10), 64, "train"))
        with open("out/run.json") as f:
            text = f.read()
        with open("out/run.json", "w") as f:
            f.write(text.replace('"stdlib"', '"gone.txt"', 1))
        msgs.append(message(run_corpus, "out"))                                      # the corpus file is gone
        if not torch.cuda.is_available():
            class Parser(argparse.ArgumentParser):
                def error(self, text):
                    raise ValueError(text)
            msgs.append(message(check_device, Parser(), "cuda"))
    finally:
        os.chdir(here)
    return [m.replace("`", "") for m in msgs]


def table_quotes():
    """The quoted messages of docs/errors.md: the code spans of each item's first line ("- `message` —")."""
    page = open(os.path.join(ROOT, "docs", "errors.md"), encoding="utf-8").read()
    rows = [line for line in page.splitlines() if line.startswith("- `")]
    return [q for row in rows for q in re.findall(r"`([^`]+)`", row)]


def as_pattern(quote):
    pattern = re.escape(quote).replace(r"\.\.\.", ".*")
    return re.sub(r"\b[XYNM]\b", r"\\S+", pattern)


def test_every_error_the_readme_quotes_is_one_the_code_prints(real_messages):
    stale = [q for q in table_quotes() if not any(re.search(as_pattern(q), m) for m in real_messages)]
    assert not stale, ("docs/errors.md quotes messages the code does not print:\n  "
                       + "\n  ".join(stale) + "\nthe real messages:\n  " + "\n  ".join(real_messages))


def test_the_readme_quotes_every_run_folder_error(real_messages):
    quotes = table_quotes()
    missing = [m for m in real_messages if any(k in m for k in RUN_FOLDER_MESSAGES)
               and not any(re.search(as_pattern(q), m) for q in quotes)]
    assert not missing, \
        "docs/errors.md should quote these run-folder messages:\n  " + "\n  ".join(missing)
