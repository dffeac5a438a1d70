"""What every notebook does first: load a run's checkpoints, and pick code prompts.

    from _setup import load_run, code_prompt, held_out_prompts
    tok, target, drafter, data, OUT = load_run()

Checkpoints come from $NANODFLASH_OUT (what `python train_tiny.py --out DIR` wrote), default <repo>/out.
When that folder has none, smoke-sized ones are trained next to it (in DIR_smoke, never *into* DIR:
train_tiny.py skips stages whose checkpoints exist, so toy ones in out/ would stand in for a real run later),
by running `train_tiny.py --smoke`. nanodflash itself is imported as an installed package (`make notebooks`
installs it editable).

Prompts: the default corpus is Python standard-library *source*, so the target is a code model and every
prompt here is code, either hand-written (`code_prompt`, which refuses prose) or held-out from the
validation split (`held_out_prompts`: the corpus prompts of the generated held-out sequences in data.pt).
A run trained on another corpus (train_tiny.py --data, recorded in its run.json) gets prompts from that
corpus: `code_prompt` then returns a validation prompt of it instead of the hand-written code.
The example a notebook looks at closely (notebook 3's steps, notebook 6's block) is chosen by a rule, not
by hand: `by_repetition` orders held-out prompts by how much their plain greedy continuation repeats itself
(nanodflash/tools/repetition.py), least first, so an example is not a loop the drafter predicts trivially.
"""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import nanodflash
from nanodflash.store.checkpoint import read
from nanodflash.store.run_folder import TOY_RUN, is_toy_run, run_corpus
from nanodflash.store.data import DEFAULT_CORPUS, val_prompts
from nanodflash.speculative import prefill
from nanodflash.tools.repetition import pooled_repetition, repetition
from nanodflash.sampling import Sampling
from nanodflash.tools.cli import decode_threads

ROOT = Path(__file__).resolve().parents[1]        # the repository: out/ and train_tiny.py live there
TRAIN_THREADS = torch.get_num_threads()           # torch's own default (every core), as train_tiny.py trains

FILES = ("tokenizer.bpe", "target.pt", "data.pt", "drafter.pt")
CORPUS = DEFAULT_CORPUS     # the corpus of the run load_run() loaded (its run.json's), for code_prompt

# The hand-written prompt of notebooks 1-3: a method body the default target continues with more methods.
CODE_PROMPT = "    def __repr__(self):\n        return"

# A prompt "looks like code" if some line starts with a Python keyword or has code punctuation.
_CODE = re.compile(r"^\s*(def|class|import|from|return|if|elif|else|for|while|with|try|except|raise|yield|"
                   r"assert|pass|@\w+)\b|[()\[\]{}=]|\w\.\w|:\s*$", re.MULTILINE)


def looks_like_code(text):
    """True if `text` has a Python keyword at a line start or code punctuation; False for plain English."""
    return bool(_CODE.search(text))


def code_prompt(tok, text):
    """The ids of a hand-written code prompt; refuses prose (the default target only knows code). For a run
    trained on another corpus: a validation prompt of that corpus, as long as `text`, instead."""
    if CORPUS != DEFAULT_CORPUS:
        n = len(tok.encode_ordinary(text))
        print(f"this run was trained on {CORPUS}, not Python source: a {n}-token prompt from its validation "
              f"split stands in for {text!r}")
        return val_prompts(tok, 1, n, seed=0, data=CORPUS)[0]
    if not looks_like_code(text):
        raise ValueError(f"{text!r} reads like prose; the default target learned Python source: prompt it "
                         "with code")
    return tok.encode_ordinary(text)


def held_out_prompts(data, n, start=0):
    """n corpus prompts from the validation split (the first prompt_len tokens of data.pt's held-out
    sequences, which the drafter never trained on), from sequence `start` on."""
    val = data["val"][start: start + n]
    return [s[: data["prompt_len"]].tolist() for s in val]


def repeated(outputs):
    """'on text 66% repeated': the repetition (nanodflash/tools/repetition.py) of the outputs (token id
    lists) a τ was measured on, to print beside it: a τ on looping text says little about text that does not
    loop."""
    return f"on text {100 * pooled_repetition(outputs):.0f}% repeated"


def by_repetition(target, data, n, new_tokens=96):
    """The first n held-out prompts, ordered by the repetition of their plain greedy continuation of
    new_tokens tokens, least first (ties keep their order, so the first is repetition.least_repetitive's
    pick); prints each one's share."""
    prompts = held_out_prompts(data, n)
    shares = [repetition(nanodflash.generate(target, p, new_tokens)) for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: shares[i])
    print(f"the first {len(prompts)} held-out prompts, by the repetition of their plain greedy continuation "
          f"({new_tokens} tokens), least first: " + " ".join(f"{100 * shares[i]:.0f}%" for i in order))
    return [prompts[i] for i in order]


def has_checkpoints(folder):
    return all((Path(folder) / f).is_file() for f in FILES)


def find_out():
    """The checkpoint folder: $NANODFLASH_OUT (default <repo>/out), or smoke-sized ones trained next to it."""
    out = Path(os.environ.get("NANODFLASH_OUT", ROOT / "out"))
    if has_checkpoints(out):
        return out
    smoke = out.with_name(out.name + "_smoke")
    print(f"no checkpoints in {out}: using smoke-sized ones in {smoke} (the smoke target may just repeat one "
          "token)")
    if not has_checkpoints(smoke):
        train_smoke(smoke)
    return smoke


def train_smoke(folder):
    """`python train_tiny.py --smoke --out folder`, its output printed here (a notebook shows it in the
    cell)."""
    run = subprocess.run([sys.executable, str(ROOT / "train_tiny.py"), "--smoke", "--out", str(folder)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(run.stdout, end="")
    if run.returncode:
        raise RuntimeError(f"train_tiny.py --smoke --out {folder} failed (exit status {run.returncode})")


@contextlib.contextmanager
def training_threads():
    """Train inline on TRAIN_THREADS threads, as train_tiny.py trains; then back to the decoding cells'
    thread count (load_run sets it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def load_run(verbose=True, seed=0):
    """tok, target, drafter, data, OUT: the tokenizer, the target, the drafter (DFlash 2 by default; see
    drafter.kind), the generated data (data["train"], data["val"], data["prompt_len"]) and the folder."""
    global CORPUS
    out = find_out()
    tok, target, drafter = nanodflash.load(out)
    torch.set_num_threads(decode_threads(drafter)["speculative"])     # the run's calibration, else one
    data = read(str(out / "data.pt"), "generated data")
    CORPUS = run_corpus(out) or DEFAULT_CORPUS
    torch.manual_seed(seed)
    if verbose:
        print(f"checkpoints from {out} (corpus: {CORPUS})")
        if is_toy_run(out):
            print(TOY_RUN)
        print(f"target:  {n_params(target):>9,} parameters | {target.config}")
        print(f"drafter: {n_params(drafter):>9,} parameters | kind {drafter.kind!r} | {drafter.config}")
        print(f"data:    {tuple(data['train'].shape)} train / {tuple(data['val'].shape)} held-out sequences "
              f"= {data['prompt_len']} corpus tokens + the target's continuation")
    return tok, target, drafter, data, out


@contextlib.contextmanager
def selector_off(drafter):
    """Within the block, a DFlash 2 drafter's selector adds nothing: its successor codebook is zero, so the
    pair term vanishes and the walk drafts each slot's argmax (notebooks 6 and 7)."""
    w = drafter.candidate_selector.successor_codebook.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.zero_()
    try:
        yield drafter
    finally:
        with torch.no_grad():
            w.copy_(saved)


@torch.no_grad()
def first_block(target, drafter, prompt):
    """The first speculative step on `prompt` (ids): the drafter's hidden states and logits for slots
    1..B-1, its cache, the anchor, and the target's greedy continuation after the anchor (notebooks 6, 7)."""
    B = drafter.config.block_size
    cache = drafter.new_cache(target.config.max_seq_len)
    # step 1, the library's own: the prompt through the target, its features into the drafter's context, and
    # the target's greedy next token, the anchor
    anchor = prefill(target, drafter, torch.tensor([prompt]), target.new_cache(1), cache, Sampling(), None)
    hidden = drafter.slot_hidden(cache, anchor, B - 1)          # (B-1, D): one pass over [anchor, MASK...]
    slot_logits = target.lm_head(hidden)                                # (B-1, V)
    truth = torch.tensor(nanodflash.generate(target, prompt + [anchor], B - 1))   # what each slot should be
    return dict(prompt=prompt, anchor=anchor, cache=cache, hidden=hidden, logits=slot_logits, truth=truth)
