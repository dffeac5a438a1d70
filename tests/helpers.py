"""What the tests share: tiny seeded models, float64 everywhere, so that batched and one-token forwards
agree to ~1e-15 and greedy ties cannot flip an argmax by accident; oracle drafters; and ways to run the
scripts (in this process, or as a subprocess to signal or kill). The fixtures and hooks are in conftest.py."""

import contextlib
import io
import os
import runpy
import subprocess
import sys
import traceback
import types
import warnings
import weakref

import torch

from nanodflash.drafter import Drafter, DrafterConfig
from nanodflash.gpt import GPT, GPTConfig
from nanodflash.speculative import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
VOCAB, MASK_ID = 64, 63


def tiny_target(seed=0, vocab=VOCAB, n_layer=3, n_embd=32, n_head=4, n_kv_head=2, head_scale=1.0,
                max_seq_len=128):
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd,
                    mlp_hidden=2 * n_embd, max_seq_len=max_seq_len)
    target = GPT(cfg).double().eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(head_scale)       # >1 makes the target's distributions peaked, not uniform
    return target


def tiny_drafter(target, seed=1, block_size=16, n_layer=1, mask_id=None):
    torch.manual_seed(seed)
    mask_id = target.config.vocab_size - 1 if mask_id is None else mask_id
    cfg = DrafterConfig.for_target(target.config, mask_id, n_layer=n_layer, block_size=block_size,
                                   n_target_layers=min(2, target.config.n_layer))
    return Drafter(cfg, target).double().eval()


def soft_pair(vocab=4):
    """A one-layer target over `vocab` tokens with peaked distributions and a block-4 drafter softer than it
    (q != p, so sampled drafts get rejected): small enough to enumerate every sampled continuation."""
    target = tiny_target(seed=11, vocab=vocab, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=60.0)
    drafter = tiny_drafter(target, seed=12, block_size=4, n_layer=1)
    with torch.no_grad():
        drafter.norm.weight.mul_(0.3)
    return target, drafter


_GREEDY_RUNS = weakref.WeakKeyDictionary()     # target -> the greedy token sequences computed so far


def greedy_continuation(target, context, n, lookahead=64):
    """`generate(target, context, n)`, served from an earlier, longer greedy run when `context` lies on it.

    The oracle test doubles draft the target's own continuation at every step of a lossless decode, so each
    context extends the last one along the same greedy path: one run `lookahead` tokens long serves many
    steps, where a fresh `generate` per step would re-read the whole context each time."""
    if n == 0:
        return []
    runs = _GREEDY_RUNS.setdefault(target, [])
    run = next((r for r in runs if len(r) >= len(context) + n and r[:len(context)] == context), None)
    if run is None:
        extra = max(0, min(lookahead, target.config.max_seq_len - len(context) - n))
        run = list(context) + generate(target, context, n + extra)
        runs.append(run)
    return run[len(context):len(context) + n]


class OracleDrafter:
    """A test double that drafts the target's own greedy continuation, then (optionally) breaks it.

    `n_right(rng, n)` says how many leading drafts of a block are correct (default: all of them);
    the rest are replaced by a wrong token. It sees token ids, never features -- the loop must not care.
    """

    def __init__(self, target, block_size, n_right=None, seed=0):
        self.target, self.n_right = target, n_right
        self.config = types.SimpleNamespace(block_size=block_size, target_layer_ids=[0],
                                            mask_token_id=MASK_ID)
        self.rng = torch.Generator().manual_seed(seed)
        self.calls = 0

    def new_cache(self, max_len):
        return []

    def extend(self, cache, features, tokens):
        cache.extend(tokens[0].tolist())

    def draft(self, cache, anchor, n_draft, choose):
        self.calls += 1
        if n_draft == 0:
            return choose(torch.zeros(0, self.target.config.vocab_size, dtype=torch.float64))
        right = greedy_continuation(self.target, cache + [anchor], n_draft)
        k = n_draft if self.n_right is None else self.n_right(self.rng, n_draft)
        tokens = right[:k] + [(t + 1) % self.target.config.vocab_size for t in right[k:]]
        vocab = self.target.config.vocab_size
        logits = torch.nn.functional.one_hot(torch.tensor(tokens), vocab).double() * 30.0
        return choose(logits)


@contextlib.contextmanager
def in_process(cwd):
    """Run something in this test process as if it were its own: in `cwd`, with this process's working
    directory, thread count and random state put back afterwards."""
    saved_cwd, saved_threads = os.getcwd(), torch.get_num_threads()
    try:
        os.chdir(cwd)
        with torch.random.fork_rng():
            yield
    finally:
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)


def run_command(*argv, cwd=None):
    """`python ARGV...` run inside this test process (a script of the repository, or `-m module`), returned
    as a subprocess.CompletedProcess would be: exit status, stdout, stderr. As the interpreter does, an
    uncaught exception prints its traceback to stderr and exits 1, and SystemExit(message) prints the message
    and exits 1. In-process, a call costs its work only, not an interpreter start and torch's import (about
    2.5 s on 2 cores); tests that kill or signal a run use a real subprocess (`smoke_run_in_training`)."""
    argv = [str(a) for a in argv]
    out, err, status = io.StringIO(), io.StringIO(), 0
    saved_argv = sys.argv
    try:
        with in_process(cwd or ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)   # runpy: -m of an
            try:                                                                            # imported module
                if argv[0] == "-m":
                    sys.argv = argv[1:]
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = [os.path.join(ROOT, argv[0]), *argv[1:]]
                    runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    status = 1
            except Exception:                                       # what the interpreter prints, then exit 1
                traceback.print_exc()
                status = 1
    finally:
        sys.argv = saved_argv
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


def smoke_run_in_training(out):
    """`train_tiny.py --smoke` (with a target stage too long to finish) as a subprocess, returned once the
    target is training; the caller stops it (kill, or a signal)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_tiny.py"), "--smoke",
                             "--out", str(out), "--target_steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    for line in proc.stdout:                                          # wait until the target is training
        if b"[target] step" in line:
            break
    return proc
