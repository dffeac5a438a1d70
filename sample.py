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
trained on (its run.json). The defaults and flags: nanodflash/tools/sample_cli.py.
"""

import os
import sys
from collections import Counter

import torch

from nanodflash.pipeline.summary import headline, recorded_headline
from nanodflash.speculative import generate
from nanodflash.store.run_folder import DRAFTER, TOY_RUN, drafter_path, is_toy_run
from nanodflash.tools.cli import decode_threads
from nanodflash.tools.measure import greedy_difference, side_by_side
from nanodflash.tools.origins import bars, origins, render, styled
from nanodflash.tools.race import race_command
from nanodflash.tools.repetition import repetition
from nanodflash.tools.sample_cli import (
    PROMPT_LEN,
    compile_drafter,
    decoder_for,
    default_prompt,
    load,
    parse_args,
)
from nanodflash.tools.trace import TraceRecorder
from nanodflash.tools.trace_page import write_page

__all__ = ["PROMPT_LEN", "default_prompt", "main"]    # the prompt rule, as the tests and notebooks read it
REPEATS = 3              # timed runs of each method, after one warm-up each
GREEDY_FAILED = ("greedy self-check FAILED: DFlash output differs from plain greedy decoding; the lossless "
                 "guarantee is broken")


def show(args, tok, target, drafter, prompt_ids, tokens, stats, chosen, style):
    """The run: the models and settings, the continuation with each token's origin, τ and its histograms."""
    B = args.block_size or drafter.block_size
    millions = {name: sum(p.numel() for p in m.parameters()) / 1e6 for name, m in (("target", target),
                                                                                 ("drafter", drafter))}
    source = " + ".join(args.hf) if args.hf else drafter_path(args.out, sampling=args.temperature > 0)
    verifier = args.verifier if args.tree is None else "recursive rejection on a sampled tree"
    print(f"nanodflash sample: {source} | target {millions['target']:.2f}M params, drafter "
          f"{millions['drafter']:.2f}M " + (f"| block_size {B}" if args.tree is None else
                                            f"| tree of <= {args.tree} nodes")
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
    kinds = origins(len(tokens), stats.acceptance_lengths, stats.accepted_drafts)
    print("-" * 80 + "\n" + render(tok, prompt_ids, tokens, kinds, style) + "\n" + "-" * 80)
    print(f"DFlash: {len(tokens)} tokens = 1 from the prefill + {len(stats.acceptance_lengths)} draft/verify "
          f"steps; τ (mean acceptance length) = {stats.tau:.2f} on text {100 * repetition(tokens):.0f}% "
          "repeated (tokens closing a 4-gram seen before in it)")
    print(f"target forward passes: {stats.target_forwards} (plain decoding: {len(tokens)})")
    print("acceptance length histogram (tokens emitted per step, bonus included):\n" + bars(stats.histogram))
    if args.block_size == "auto" and args.tree is None:
        print("block sizes chosen (auto: anchor + drafts per step):\n" + bars(Counter(stats.block_sizes)))
    return source


def check_and_time(args, target, drafter, prompt_ids, tokens, decoder, spec_kw):
    """Greedy: the run against plain greedy decoding (exit 1 if they differ beyond a rounding tie); then the
    same prompt REPEATS times, plain and DFlash interleaved after a warm-up, each at its threads."""
    first, ties, threads = None, [], decode_threads(drafter, args.threads)     # rounding-tie differences
    if args.temperature == 0:
        kw = {k: spec_kw[k] for k in ("temperature", "top_k", "top_p", "stop_token_ids") if k in spec_kw}
        plain = generate(target, prompt_ids, args.max_new_tokens, **kw)
        first = greedy_difference(target, prompt_ids, plain, tokens)
    if first is not None and not first.is_tie:
        sys.exit(f"{GREEDY_FAILED}: {first.describe()}")
    try:
        side_by_side(target, drafter, [prompt_ids], args.max_new_tokens, decoder=decoder, ties=ties,
                     threads=threads, **spec_kw)                                         # warm-up
        t_plain, t_spec, _ = side_by_side(target, drafter, [prompt_ids] * REPEATS, args.max_new_tokens,
                                          decoder=decoder, ties=ties, threads=threads, **spec_kw)
    except AssertionError as e:                     # a greedy speculative run differed from plain decoding
        sys.exit(f"{GREEDY_FAILED}: {e}")
    print(f"speed ({REPEATS} runs each, interleaved, warmed up; threads: plain {threads['plain']}, DFlash "
          f"{threads['speculative']}): plain {t_plain:.2f}s vs DFlash {t_spec:.2f}s -> {t_plain/t_spec:.2f}x")
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


def main(argv=None):
    args = parse_args(argv, __doc__)
    torch.manual_seed(args.seed)
    style = ("plain" if args.plain else "color" if sys.stdout.isatty() and not args.no_color
             and "NO_COLOR" not in os.environ else "markers")
    decoder, spec_kw = decoder_for(args)
    try:
        tok, target, drafter, prompt_ids, chosen = load(args)
        if args.race:
            return race_command(args, tok, target, drafter, prompt_ids, chosen)
        if args.compile:
            compile_drafter(decoder, target, drafter, prompt_ids, args.max_new_tokens, spec_kw)
        rule = args.verifier if args.tree is None else "recursive rejection (a sampled tree)"
        recorder = (TraceRecorder(tok, drafter, args.temperature, args.top_k, args.top_p, rule)
                    if args.html else None)
        tokens, stats = decoder(target, drafter, prompt_ids, args.max_new_tokens, on_step=recorder,
                                generator=torch.Generator().manual_seed(args.seed), **spec_kw)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    source = show(args, tok, target, drafter, prompt_ids, tokens, stats, chosen, style)
    if recorder is not None:
        size = ({"tree nodes": args.tree} if args.tree else
                {"block size": args.block_size or drafter.block_size})
        trace = recorder.trace(prompt_ids, tokens, dict(checkpoint=source, **size))
        print(f"wrote {write_page(trace, args.html)}: the run step by step (open it in a browser)")
    check_and_time(args, target, drafter, prompt_ids, tokens, decoder, spec_kw)
    rows = None if args.hf else recorded_headline(args.out)        # what one prompt cannot tell
    if rows:
        print("this run on held-out prompts, from train_tiny.py's summary:\n" + headline(rows))


if __name__ == "__main__":
    main()
