"""Sample with DFlash and see which tokens the drafter got right; compare with plain decoding.

    python sample.py                                   # out/, a validation prompt, greedy
    python sample.py --prompt "    def __init__(self" --temperature 0.7 --top_p 0.95
    python sample.py --out out_smoke --plain
    python sample.py --hf out_hf/target out_hf/drafter   # Hugging Face folders (nanodflash.tools.hf export)

Sampling (--temperature > 0) drafts with out/drafter_sampling.pt when the run made one (the drafter
fine-tuned on sampled continuations; train_tiny.py makes it unless --no-sampling), else with
out/drafter.pt. Every draft/verify step emits the drafter's accepted tokens, then one token from the target
(the "bonus": the target's own choice at the first disagreement, or after the last draft). The first
generated token comes from the target's prefill. The continuation is printed with that origin shown: in
colour on a terminal (green drafted, magenta target), else (piped, or --no-color) with markers no code
uses, ⟦accepted drafts⟧ ⟨target token⟩; --plain prints the text alone. Then τ, the acceptance-length
histogram, and the time of DFlash vs plain decoding on the same prompt in this process. At temperature 0
the two outputs must be token-identical: the script says so, and exits with status 1 if they ever differ.
Bad checkpoints or flags also exit 1 with a message. The validation prompt comes from the corpus the run was
trained on (its run.json).
"""

import argparse
import os
import sys
import time
from collections import Counter
from functools import partial

import torch

import nanodflash
from nanodflash.data import val_prompts
from nanodflash.pipeline.summary import headline, recorded_headline
from nanodflash.repetition import least_repetitive, repetition
from nanodflash.run_folder import DRAFTER, TOY_RUN, drafter_path, is_toy_run, run_corpus
from nanodflash.sampled_tree import SampledDraws
from nanodflash.speculative import DECODE_THREADS, VERIFIERS, generate
from nanodflash.tokenizer import ENDOFTEXT
from nanodflash.tools import hf
from nanodflash.tools import race as race_lanes
from nanodflash.tools.cli import MAX_COUNT, MAX_SEED, check_device, floats, ints, threads
from nanodflash.tools.hf_tokenizer import normalize
from nanodflash.tools.measure import greedy_difference, side_by_side
from nanodflash.tools.origins import bars, origins, render, styled
from nanodflash.tools.race_page import write_race_page
from nanodflash.tools.trace import TraceRecorder
from nanodflash.tools.trace_page import write_page
from nanodflash.tools.watch import watched_generate
from nanodflash.tree import tree_speculative_generate

# -----------------------------------------------------------------------------
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
REPEATS = 3              # timed runs of each method, after one warm-up each
GREEDY_FAILED = ("greedy self-check FAILED: DFlash output differs from plain greedy decoding; the lossless "
                 "guarantee is broken")
# -----------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
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
    a("--seed", type=ints(0, MAX_SEED), default=SEED, help="picks the validation prompt and seeds sampling "
      "(default: %(default)s)")
    a("--device", default=DEVICE, help="cpu or cuda (default: %(default)s)")
    a("--threads", type=threads, default=DECODE_THREADS, help="torch CPU threads, at most this machine's "
      "CPUs (default: %(default)s)")
    a("--tree", type=ints(1, MAX_COUNT), default=None, help="tree verification with at most N draft nodes a "
      "step (nanodflash/tree.py): greedy, the drafter's top candidates; sampling, drafts sampled from the "
      "drafter and verified by recursive rejection (nanodflash/sampled_tree.py); --block_size and "
      "--verifier do not apply (default: off, one draft path a step)")
    a("--compile", action="store_true", help="run the drafter's block pass compiled (nanodflash/compiled.py; "
      "the target stays eager): its graphs are compiled first, the time printed; not with --tree or --race")
    a("--no-color", action="store_true", help="markers ⟦drafted⟧ ⟨target⟩ instead of ANSI colours "
      "(automatic when not a terminal, or with NO_COLOR set)")
    a("--plain", action="store_true", help="the text alone: no colours, no markers")
    a("--html", metavar="FILE", default=None, help="also write the run as a page that replays it step by "
      "step (nanodflash/tools/trace_page.py; open it in any browser, offline)")
    a("--race", metavar="FILE", default=None, help="instead: race plain decoding, the DFlash path and a tree "
      "(sampled ones with --temperature) on the prompt, each step timed, and write the page that replays "
      "them side by side, with a what-if panel (nanodflash/tools/race_page.py; --tree sets the tree's nodes)")
    args = p.parse_args(argv)
    check_device(p, args.device)
    if args.compile and (args.tree or args.race):
        p.error("--compile runs the path decoder only: leave out --tree and --race")
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


def compile_drafter(decoder, target, drafter, prompt_ids, max_new_tokens, spec_kw):
    """--compile: one decode of the prompt first, which compiles the drafter's pass; its time printed."""
    print("compiling the drafter's block pass (nanodflash/compiled.py) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    decoder(target, drafter, prompt_ids, max_new_tokens, **spec_kw)
    print(f"compiled and ran once in {time.perf_counter() - t0:.1f}s", file=sys.stderr)


def tree_decoder(tree_nodes):
    """tree_speculative_generate with its tree size bound, called like speculative_generate (whose block size
    and verifier it does not take: a tree's size is its node budget, and it has its own rules). Sampling
    builds sampled trees: top-K trees accept less than one sampled path (docs/sampling.md)."""
    def decode(target, drafter, prompt_ids, max_new_tokens, block_size=None, verifier=None, **kw):
        draws = SampledDraws() if kw.get("temperature", 0) > 0 else None
        return tree_speculative_generate(target, drafter, prompt_ids, max_new_tokens, tree_nodes=tree_nodes,
                                         draws=draws, **kw)
    return decode


def race(args, tok, target, drafter, prompt_ids, chosen):
    """--race: the lanes timed and recorded (tools/race.py), their summary printed, the page written."""
    if chosen:
        print(chosen)
    print(f"racing plain decoding, the path and a tree: {race_lanes.REPEATS} timed runs each after a "
          "warm-up, then one recorded ...", file=sys.stderr)
    recorded = race_lanes.record_race(tok, target, drafter, prompt_ids, args.max_new_tokens,
                                      args.temperature, args.top_k, args.top_p, block_size=args.block_size,
                                      tree_nodes=args.tree, seed=args.seed,
                                      settings=dict(checkpoint=args.out))
    print(race_lanes.summary(recorded))
    print(f"wrote {write_race_page(recorded, args.race)}: the race, replayed (open it in a browser)")


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    style = ("plain" if args.plain else "color" if sys.stdout.isatty() and not args.no_color
             and "NO_COLOR" not in os.environ else "markers")
    kw = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.block_size is None and args.temperature > 0:
        args.block_size = "auto"
    elif args.block_size not in (None, "auto") and args.block_size.lstrip("-").isdigit():
        args.block_size = int(args.block_size)     # anything else: the library's one message says the range
    spec_kw = dict(kw, block_size=args.block_size, verifier=args.verifier)
    # the path decoder, watched (tools/watch.py: the same loop, its steps recorded for --html)
    decoder = watched_generate if args.tree is None else tree_decoder(args.tree)
    if args.compile:                                                  # the path decoder, its pass compiled
        decoder = partial(watched_generate, compile=True)
    try:
        if args.hf:
            tok, target, drafter = hf.load(*args.hf, device=args.device, dtype=getattr(torch, args.dtype))
            kw["stop_token_ids"] = spec_kw["stop_token_ids"] = hf.eos_token_ids(args.hf[0])
        else:                         # T > 0: drafter_sampling.pt, where the run made one (train_tiny.py)
            tok, target, drafter = nanodflash.load(args.out, args.device, sampling=args.temperature > 0)
        if args.prompt is None:                  # from the corpus the run was trained on, unless --data says
            data = args.data or (None if args.hf else run_corpus(args.out))
            prompt_ids, chosen = default_prompt(tok, target, args.max_new_tokens, args.seed, data,
                                                1 if args.hf else CANDIDATES)     # a real model: minutes each
        else:
            chosen, text = None, normalize(tok, args.prompt)          # NFC, where a tokenizer.json says so
            prompt_ids = tok.encode(text, allowed_special={ENDOFTEXT} & tok.special_tokens_set,
                                    disallowed_special=())
        if args.race:
            return race(args, tok, target, drafter, prompt_ids, chosen)
        if args.compile:
            compile_drafter(decoder, target, drafter, prompt_ids, args.max_new_tokens, spec_kw)
        rule = args.verifier if args.tree is None else "recursive rejection (a sampled tree)"
        recorder = (TraceRecorder(tok, drafter, args.temperature, args.top_k, args.top_p, rule)
                    if args.html else None)
        tokens, stats = decoder(target, drafter, prompt_ids, args.max_new_tokens, on_step=recorder,
                                generator=torch.Generator().manual_seed(args.seed), **spec_kw)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    B = args.block_size or drafter.block_size
    millions = {name: sum(p.numel() for p in m.parameters()) / 1e6            # parameters
                for name, m in (("target", target), ("drafter", drafter))}
    source = " + ".join(args.hf) if args.hf else drafter_path(args.out, sampling=args.temperature > 0)
    verifier = args.verifier if args.tree is None else "recursive rejection on a sampled tree"
    print(f"nanodflash sample: {source} | target {millions['target']:.2f}M params, drafter "
          f"{millions['drafter']:.2f}M "
          + (f"| block_size {B}" if args.tree is None else f"| tree of <= {args.tree} nodes")
          + f" | T={args.temperature:g}" + (f" ({verifier} verifier)" if args.temperature > 0 else "")
          + f" | {args.device}, {torch.get_num_threads()} thread(s)")
    if not args.hf and is_toy_run(args.out):
        print(TOY_RUN)
    if not args.hf and args.temperature > 0 and source.endswith(DRAFTER):
        print(f"(no sampling drafter in {args.out}: `python train_tiny.py` without --no-sampling adds one, "
              "which accepts more sampled drafts; add the run's other flags if it was made with any)")
    if chosen:
        print(chosen)
    if style != "plain":
        legend = [("prompt", "prompt"), ("draft", "accepted drafts"),
                  ("target", "target tokens (prefill / bonus)")]
        print("legend: " + "  ".join(styled(k, s, style) for k, s in legend) + "   (--plain: the text alone)")
    print("-" * 80)
    kinds = origins(len(tokens), stats.acceptance_lengths, stats.accepted_drafts)
    print(render(tok, prompt_ids, tokens, kinds, style))
    print("-" * 80)
    steps = len(stats.acceptance_lengths)
    print(f"DFlash: {len(tokens)} tokens = 1 from the prefill + {steps} draft/verify steps; "
          f"τ (mean acceptance length) = {stats.tau:.2f} on text {100 * repetition(tokens):.0f}% repeated "
          "(tokens closing a 4-gram seen before in it)")
    print(f"target forward passes: {stats.target_forwards} (plain decoding: {len(tokens)})")
    print("acceptance length histogram (tokens emitted per step, bonus included):")
    print(bars(stats.histogram))
    if args.block_size == "auto" and args.tree is None:
        print("block sizes chosen (auto: anchor + drafts per step):")
        print(bars(Counter(stats.block_sizes)))
    if recorder is not None:
        size = {"tree nodes": args.tree} if args.tree else {"block size": args.block_size or B}
        trace = recorder.trace(prompt_ids, tokens, dict(checkpoint=source, **size))
        print(f"wrote {write_page(trace, args.html)}: the run step by step (open it in a browser)")

    # speed: the same prompt REPEATS times, plain and DFlash interleaved, after a warm-up (tools/measure.py)
    first, ties = None, []                              # differences at a float32 rounding tie
    if args.temperature == 0:                           # the run shown above, against plain greedy decoding
        plain = generate(target, prompt_ids, args.max_new_tokens, **kw)
        first = greedy_difference(target, prompt_ids, plain, tokens)
    if first is not None and not first.is_tie:
        sys.exit(f"{GREEDY_FAILED}: {first.describe()}")
    try:
        side_by_side(target, drafter, [prompt_ids], args.max_new_tokens, decoder=decoder, ties=ties,
                     **spec_kw)                                                          # warm-up
        t_plain, t_spec, _ = side_by_side(target, drafter, [prompt_ids] * REPEATS, args.max_new_tokens,
                                          decoder=decoder, ties=ties, **spec_kw)
    except AssertionError as e:                     # a greedy speculative run differed from plain decoding
        sys.exit(f"{GREEDY_FAILED}: {e}")
    print(f"speed ({REPEATS} runs of this prompt each, plain and DFlash interleaved, after a warm-up; same "
          f"process): plain {t_plain:.2f}s vs DFlash {t_spec:.2f}s -> {t_plain / t_spec:.2f}x")
    if args.temperature > 0:
        print("T > 0: the outputs are samples; lossless means the same distribution (checked by the tests), "
              "not the same tokens")
    elif first is None and not ties:
        print(f"greedy self-check: DFlash output is token-identical to plain greedy decoding "
              f"({len(tokens)} tokens, {2 + REPEATS} runs): PASS")
    else:                                               # plain and block forwards rounded a tie apart
        print(f"greedy self-check: DFlash output equals plain greedy decoding up to a float32 rounding tie, "
              f"at {(first or ties[0][1]).describe()} (docs/design.md §1.6, lossless in floating point): "
              "PASS")
    rows = None if args.hf else recorded_headline(args.out)        # what one prompt cannot tell
    if rows:
        print("this run on held-out prompts, from train_tiny.py's summary:\n" + headline(rows))


if __name__ == "__main__":
    main()
