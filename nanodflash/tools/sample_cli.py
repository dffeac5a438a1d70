"""sample.py's command line: its defaults and flags, the prompt it shows, the models it loads, and the
decoders its flags pick.

    args = parse_args(argv, description)             # every flag, checked
    tok, target, drafter, prompt_ids, chosen = load(args)
    decoder, spec_kw = decoder_for(args)             # the watched path (tools/watch.py) or a tree

--race (tools/race.py) and --html (tools/trace_page.py) write pages of their own; --hf loads Hugging Face
folders (tools/hf.py).
"""

import argparse
import sys
import time
from functools import partial

import torch

import nanodflash

from ..ext.sampled_tree import SampledDraws
from ..ext.tree import tree_speculative_generate
from ..speculative import VERIFIERS, generate
from ..store.data import val_prompts
from ..store.run_folder import run_corpus
from ..store.tokenizer import ENDOFTEXT
from . import hf
from .cli import MAX_COUNT, MAX_SEED, check_device, decode_threads, floats, ints, threads
from .hf_tokenizer import normalize
from .repetition import least_repetitive, repetition
from .watch import watched_generate

OUT = "out"              # folder written by `train_tiny.py --out`
PROMPT = None            # text to continue; None = a prompt from the corpus' validation split, picked by SEED
PROMPT_LEN = 24          # tokens of a validation prompt: with the new ones, within the target's window
CANDIDATES = 8           # ... of this many, the one whose plain greedy continuation repeats least
MAX_NEW_TOKENS = 100     # tokens to generate
BLOCK_SIZE = None        # draft block B or "auto" (block_policy.py); None: drafter's B greedy, auto sampling
TEMPERATURE = 0.0        # 0 = greedy, which also runs the lossless self-check
TOP_K = None             # keep only the k most likely tokens (T > 0)
TOP_P = None             # nucleus sampling (T > 0)
VERIFIER = "rejection"   # T > 0, the library's and dflash 0.1.0's rule: accepts more drafts than "match"
SEED = 1337              # picks the validation prompt and seeds sampling
DEVICE = "cpu"           # cpu or cuda


def model_flags(a):
    """Where the models and the prompt come from."""
    a("--out", default=OUT, help="folder written by train_tiny.py --out (default: %(default)s)")
    a("--hf", nargs=2, metavar=("TARGET_DIR", "DRAFTER_DIR"), default=None, help="instead of --out: a "
      "Hugging Face Qwen3 folder and an official DFlash / DFlash 2 drafter folder (nanodflash/tools/hf.py); "
      "stops at their EOS tokens")
    a("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights' dtype with "
      "--hf (bfloat16 halves the memory of a real model) (default: %(default)s)")
    a("--prompt", default=PROMPT, help=f"text to continue (default: of {CANDIDATES} validation prompts "
      "chosen by --seed, the one whose plain greedy continuation repeats itself least, so the first screen "
      "is not a loop; with --hf the first of them)")
    a("--data", default=None, help="corpus for the validation prompt (default: the one the run was trained "
      "on, from OUT/run.json; with --hf the built-in stdlib corpus)")
    a("--seed", type=ints(0, MAX_SEED), default=SEED, help="picks the validation prompt and seeds sampling "
      "(default: %(default)s)")
    a("--device", default=DEVICE, help="cpu or cuda (default: %(default)s)")
    a("--threads", type=threads, default=None, help="torch CPU threads, at most this machine's CPUs "
      "(default: the counts the run folder's calibration chose for plain and speculative decoding)")


def decoding_flags(a):
    """How the continuation is decoded."""
    a("--max_new_tokens", type=ints(1, MAX_COUNT), default=MAX_NEW_TOKENS, help="tokens to generate "
      "(default: %(default)s)")
    a("--block_size", default=BLOCK_SIZE, help="draft block size B: an integer from 1 to the drafter's "
      "(checked once the drafter is loaded), or auto: each step's size from the acceptance so far, smaller "
      "when sampling (default: the drafter's when greedy, auto when sampling)")
    a("--temperature", type=floats(0), default=TEMPERATURE, help="0 = greedy + lossless self-check "
      "(default: %(default)s)")
    a("--top_k", type=ints(1), default=TOP_K, help="top-k filtering for T > 0 (default: off)")
    a("--top_p", type=floats(0, 1, low_open=True), default=TOP_P, help="nucleus (top-p) filtering for T > 0 "
      "(default: off)")
    a("--verifier", default=VERIFIER, choices=VERIFIERS, help="T > 0 acceptance rule (default: %(default)s, "
      "as in the library and the official dflash 0.1.0: it accepts more drafts than match, the rule of an "
      "earlier official snapshot, and is faster at every temperature and block size the benchmark measures)")
    a("--tree", type=ints(1, MAX_COUNT), default=None, help="tree verification with at most N draft nodes a "
      "step (nanodflash/ext/tree.py): greedy, the drafter's top candidates; sampling, drafts sampled from "
      "the drafter and verified by recursive rejection (nanodflash/ext/sampled_tree.py); --block_size and "
      "--verifier do not apply (default: off, one draft path a step)")
    a("--compile", action="store_true", help="run the drafter's block pass compiled "
      "(nanodflash/ext/compiled.py; the target stays eager): its graphs are compiled first, the time "
      "printed; not with --tree or --race")


def output_flags(a):
    """What is shown, and the pages written."""
    a("--no-color", action="store_true", help="markers ⟦drafted⟧ ⟨target⟩ instead of ANSI colours "
      "(automatic when not a terminal, or with NO_COLOR set)")
    a("--plain", action="store_true", help="the text alone: no colours, no markers")
    a("--html", metavar="FILE", default=None, help="also write the run as a page that replays it step by "
      "step (nanodflash/tools/trace_page.py; open it in any browser, offline)")
    a("--race", metavar="FILE", default=None, help="instead: race plain decoding, the DFlash path and a tree "
      "(sampled ones with --temperature) on the prompt, each step timed, and write the page that replays "
      "them side by side, with a what-if panel (nanodflash/tools/race_page.py; --tree sets the tree's nodes)")


def parse_args(argv=None, description=None):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flags in (model_flags, decoding_flags, output_flags):
        flags(p.add_argument)
    args = p.parse_args(argv)
    check_device(p, args.device)
    if args.compile and (args.tree or args.race):
        p.error("--compile runs the path decoder only: leave out --tree and --race")
    if args.race and args.html:
        p.error("--race writes its own page, with each lane's steps: leave out --html")
    if args.block_size is None and args.temperature > 0:
        args.block_size = "auto"
    elif args.block_size not in (None, "auto") and args.block_size.lstrip("-").isdigit():
        args.block_size = int(args.block_size)     # anything else: the library's one message says the range
    return args


def default_prompt(tok, target, max_new_tokens, seed, data, candidates=CANDIDATES):
    """The prompt shown without --prompt: of `candidates` validation prompts picked by `seed`, the one whose
    plain greedy continuation repeats least (repetition.least_repetitive). -> (its ids, a line saying how it
    was chosen)"""
    prompts = val_prompts(tok, candidates, PROMPT_LEN, seed, data)
    if candidates == 1:
        return prompts[0], f"prompt: a validation prompt chosen by --seed {seed}"
    continuations = [generate(target, p, max_new_tokens) for p in prompts]
    i, shares = least_repetitive(continuations), [repetition(c) for c in continuations]
    others = shares[:i] + shares[i + 1:]
    return prompts[i], (f"prompt: the least repetitive of {candidates} validation prompts (--seed {seed}): "
                        f"its plain greedy continuation {100 * shares[i]:.0f}% repeated, the others' "
                        f"{100 * min(others):.0f}-{100 * max(others):.0f}%")


def load(args):
    """The models (a run folder's, or --hf's) and the prompt -> (tok, target, drafter, prompt ids, a line
    saying how the prompt was chosen, or None). torch then decodes with the threads the run's calibration
    chose for speculative decoding, or --threads (cli.decode_threads)."""
    if args.hf:
        tok, target, drafter = hf.load(*args.hf, device=args.device, dtype=getattr(torch, args.dtype))
    else:                             # T > 0: drafter_sampling.pt, where the run made one (train_tiny.py)
        tok, target, drafter = nanodflash.load(args.out, args.device, sampling=args.temperature > 0)
    torch.set_num_threads(decode_threads(drafter, args.threads)["speculative"])
    if args.prompt is None:                      # from the corpus the run was trained on, unless --data says
        data = args.data or (None if args.hf else run_corpus(args.out))
        return (tok, target, drafter, *default_prompt(tok, target, args.max_new_tokens, args.seed, data,
                                                      1 if args.hf else CANDIDATES))  # a real model: minutes
    text = normalize(tok, args.prompt)                                # NFC, where a tokenizer.json says so
    ids = tok.encode(text, allowed_special={ENDOFTEXT} & tok.special_tokens_set, disallowed_special=())
    return tok, target, drafter, ids, None


def tree_decoder(tree_nodes):
    """tree_speculative_generate with its tree size bound, called like speculative_generate (whose block size
    and verifier it does not take: a tree's size is its node budget, and it has its own rules). Sampling
    builds sampled trees: top-K trees accept less than one sampled path (docs/sampling.md)."""
    def decode(target, drafter, prompt_ids, max_new_tokens, block_size=None, verifier=None, **kw):
        draws = SampledDraws() if kw.get("temperature", 0) > 0 else None
        return tree_speculative_generate(target, drafter, prompt_ids, max_new_tokens, tree_nodes=tree_nodes,
                                         draws=draws, **kw)
    return decode


def decoder_for(args):
    """(decode(target, drafter, prompt, n, **spec_kw) -> (tokens, stats), spec_kw): the path decoder,
    watched (tools/watch.py: the same loop, its steps recorded for --html), compiled with --compile; or a
    tree with --tree. spec_kw: the sampling settings, block size and verifier, and --hf's stop tokens."""
    spec_kw = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   block_size=args.block_size, verifier=args.verifier)
    if args.hf:
        spec_kw["stop_token_ids"] = hf.eos_token_ids(args.hf[0])
    if args.tree is not None:
        return tree_decoder(args.tree), spec_kw
    return (partial(watched_generate, compile=True) if args.compile else watched_generate), spec_kw


def compile_drafter(decoder, target, drafter, prompt_ids, max_new_tokens, spec_kw):
    """--compile: one decode of the prompt first, which compiles the drafter's pass; its time printed."""
    print("compiling the drafter's block pass (nanodflash/ext/compiled.py) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    decoder(target, drafter, prompt_ids, max_new_tokens, **spec_kw)
    print(f"compiled and ran once in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
