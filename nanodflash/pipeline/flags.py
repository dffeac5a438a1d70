"""train_tiny.py's flags: their definitions (`parse_args`, defaults from recipe.py, the --smoke and --full
presets) and the rules that tie them together, checked right after parsing, before any work.

    args = flags.parse_args(["--smoke", "--out", "out_smoke"], description=__doc__)

`check_flag_combinations(args)` returns one line naming the flags and what is allowed, or None; single-flag
ranges are argparse's job (nanodflash/tools/cli.py). `parse_layer_ids("1,5,9", n_layer)` reads
--target_layer_ids.
"""

import argparse
import sys

from ..checkpoint import DRAFTER_KINDS
from ..dflash2 import DFlash2Config
from ..tools.cli import MAX_COUNT, MAX_SEED, check_device, floats, ints
from . import recipe


def context_window(seq_len):
    """The target's max_seq_len: room for the drafter's sequences and the summary's prompts."""
    return max(512, seq_len)


def check_flag_combinations(a):
    """The checks that involve two flags; one line naming them and what is allowed, or None."""
    heads = [h for h in range(1, a.n_embd + 1) if a.n_embd % h == 0 and (a.n_embd // h) % 2 == 0]
    window = context_window(a.seq_len)
    if a.n_head not in heads:
        return (f"--n_head {a.n_head} must divide --n_embd {a.n_embd} into an even head size (RoPE rotates "
                f"pairs); allowed: {', '.join(map(str, heads)) or 'none, make --n_embd even'}")
    if a.drafter == "dflash2" and a.n_embd % DFlash2Config.conv_group_size:
        return (f"--n_embd {a.n_embd} must be a multiple of {DFlash2Config.conv_group_size} for --drafter "
                "dflash2 (one convolution tap per group of that many channels)")
    for flag, n in (("--gen_len", a.gen_len), ("--eval_new_tokens", a.eval_new_tokens),
                    ("--long_gen_len", a.long_gen_len if a.long_seqs else 0),
                    ("--eval_long_tokens", a.eval_long_tokens)):
        if a.prompt_len + n > window:            # every sequence the run generates fits the target's window
            return (f"--prompt_len + {flag} = {a.prompt_len + n} must be at most the target's context "
                    f"window, max(512, --seq_len) = {window}")
    if a.long_seqs and a.block_size > a.long_gen_len + 1:
        return f"--block_size {a.block_size} must be at most --long_gen_len + 1 = {a.long_gen_len + 1}"
    if a.block_size > a.gen_len + 1:
        return (f"--block_size {a.block_size} must be at most --gen_len + 1 = {a.gen_len + 1}: a training "
                "block's labels are generated tokens")
    if a.drafter == "dflash2" and a.conv_kernel_size > a.block_size:
        return f"--conv_kernel_size {a.conv_kernel_size} must be at most --block_size {a.block_size}"
    if a.drafter == "dflash2" and a.selector_top_k > a.vocab_size:
        return f"--selector_top_k {a.selector_top_k} must be at most --vocab_size {a.vocab_size}"
    if a.target_layer_ids:
        try:
            parse_layer_ids(a.target_layer_ids, a.n_layer)
        except ValueError as e:
            return str(e)
    elif a.draft_layers > a.n_layer:
        return (f"--draft_layers {a.draft_layers} must be at most --n_layer {a.n_layer} when "
                "--target_layer_ids is empty (the paper's rule takes one target layer per drafter layer)")
    return None


def parse_layer_ids(text, n_layer):
    """--target_layer_ids "1,5,9" -> [1, 5, 9], each a layer of an n_layer-deep target, or a ValueError."""
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--target_layer_ids must be comma-separated integers, got {text!r}") from None
    if not ids or min(ids) < 0 or max(ids) >= n_layer:
        raise ValueError(f"--target_layer_ids {ids} must lie in 0..{n_layer - 1} (the target has {n_layer} "
                         "layers)")
    return ids


def parse_args(argv=None, description=None):
    """train_tiny.py's flags, parsed: their defaults are recipe.py's constants, a preset (--smoke:
    recipe.SMOKE, --full: recipe.FULL) sets every flag not given by name, then the checks above run.
    `description`: the --help text above the flags (train_tiny.py's docstring)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)            # a preset must see every flag given by name
    a = p.add_argument
    a("--out", default=None, help=f"run folder for tokenizer, checkpoints and data (default: {recipe.OUT}, "
      f"with --smoke {recipe.SMOKE_OUT})")
    a("--data", default=None, help="UTF-8 text file to train on, or a built-in corpus: stdlib (the default: "
      "Python's standard library source) or pydoc (Python's documentation prose)")
    a("--smoke", action="store_true", help="toy sizes: the whole pipeline in well under a minute")
    a("--full", action="store_true", help="the longer recipe (more target, data and drafter steps: "
      f"{', '.join(f'--{k} {v}' for k, v in recipe.FULL.items())}), for the best τ; writes "
      f"{recipe.FULL_OUT}/ by default")
    a("--fresh", action="store_true", help="delete existing checkpoints and resume files in --out and start "
      "over")
    a("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    a("--seed", type=ints(0, MAX_SEED), default=recipe.SEED, help="random seed (default: %(default)s)")
    a("--vocab_size", type=ints(258, 65536), default=recipe.VOCAB_SIZE,
      help="BPE vocabulary size incl. 2 special tokens")
    a("--n_layer", type=ints(1, 64), default=recipe.N_LAYER, help="target depth")
    a("--n_embd", type=ints(2, 4096), default=recipe.N_EMBD, help="target width (the drafter shares it)")
    a("--n_head", type=ints(1, 2048), default=recipe.N_HEAD, help="attention heads (target and drafter); "
      "must divide --n_embd into an even head size")
    a("--seq_len", type=ints(2, 4096), default=recipe.SEQ_LEN, help="target training window in tokens")
    a("--target_steps", type=ints(1, MAX_COUNT), default=recipe.TARGET_STEPS,
      help="target optimisation steps")
    a("--target_batch", type=ints(1, 4096), default=recipe.TARGET_BATCH, help="target batch size (sequences)")
    a("--target_lr", type=floats(0, 1, low_open=True), default=recipe.TARGET_LR,
      help="target peak learning rate")
    a("--n_seqs", type=ints(1, MAX_COUNT), default=recipe.N_SEQS,
      help="number of target-generated sequences for the drafter")
    a("--prompt_len", type=ints(1, 4096), default=recipe.PROMPT_LEN,
      help="prompt tokens taken from the corpus per sequence")
    a("--gen_len", type=ints(1, 4096), default=recipe.GEN_LEN,
      help="tokens the target generates per sequence")
    a("--long_seqs", type=ints(0, MAX_COUNT), default=recipe.LONG_SEQS, help="long target-generated "
      "sequences for the drafter, 0 = none (default: %(default)s)")
    a("--long_gen_len", type=ints(1, 4096), default=recipe.LONG_GEN_LEN,
      help="tokens the target generates per long sequence")
    a("--gen_temperature", type=floats(0), default=recipe.GEN_TEMPERATURE, help="0 = greedy continuations "
      "only, >0 = some sampled at this temperature (default: %(default)s)")
    a("--gen_greedy_frac", type=floats(0, 1), default=recipe.GEN_GREEDY_FRAC, help="with --gen_temperature "
      "> 0: fraction of the short sequences continued greedily all the same, a greedy/sampled mix; long ones "
      "are always greedy (default: %(default)s)")
    a("--soft_weight", type=floats(0, 1), default=recipe.SOFT_WEIGHT, help="weight of the cross-entropy "
      "against the target's next-token distribution in the drafter loss (the rest: the data token) "
      "(default: %(default)s)")
    a("--drafter", default=recipe.DRAFTER, choices=sorted(DRAFTER_KINDS), help="dflash2 (a candidate "
      "selector and in-block convolutions on top of DFlash) or dflash (default: %(default)s)")
    a("--draft_layers", type=ints(1, 64), default=recipe.DRAFT_LAYERS, help="drafter depth")
    a("--selector_top_k", type=ints(1, 1024), default=recipe.SELECTOR_TOP_K, help="DFlash 2: candidates per "
      "slot (default: %(default)s)")
    a("--selector_rank", type=ints(1, 4096), default=recipe.SELECTOR_RANK, help="DFlash 2: rank of the "
      "predecessor x candidate term (default: %(default)s)")
    a("--conv_kernel_size", type=ints(0, 256), default=recipe.CONV_KERNEL, help="DFlash 2: taps of the "
      "in-block convolutions, 1 = none mixing across slots, 0 = no convolutions: the selector alone "
      "(default: %(default)s)")
    a("--target_layer_ids", default=recipe.TARGET_LAYER_IDS, help="comma-separated target layers "
      "(0-indexed) feeding the drafter; empty = the paper's rule (default: %(default)s)")
    a("--gen_batch", type=ints(1, 4096), default=recipe.GEN_BATCH,
      help="sequences generated in parallel for the drafter data")
    a("--block_size", type=ints(2, 256), default=recipe.BLOCK_SIZE,
      help="DFlash draft block size B (anchor + B-1 masks)")
    a("--draft_steps", type=ints(1, MAX_COUNT), default=recipe.DRAFT_STEPS, help="drafter optimisation steps")
    a("--draft_batch", type=ints(1, 4096), default=recipe.DRAFT_BATCH, help="sequences per drafter step")
    a("--draft_anchors", type=ints(1, 256), default=recipe.DRAFT_ANCHORS,
      help="random anchors (blocks) per sequence per step")
    a("--draft_lr", type=floats(0, 1, low_open=True), default=recipe.DRAFT_LR,
      help="drafter peak learning rate")
    a("--gamma", type=floats(0, low_open=True), default=recipe.GAMMA, help="loss decay gamma, weights "
      "exp(-(k-1)/gamma) (default: %(default)s)")
    a("--sampling", action=argparse.BooleanOptionalAction, default=recipe.SAMPLING, help="train the "
      "sampling drafter too (drafter_sampling.pt: the drafter tuned on sampled continuations, which "
      "sample.py and the benchmark sample with); --no-sampling: greedy decoding only, a few minutes less (a "
      "later run without it adds just this stage) (default: %(default)s)")
    a("--sampling_steps", type=ints(1, MAX_COUNT), default=recipe.SAMPLING_STEPS, help="with --sampling: "
      "fine-tuning steps of the sampling drafter (default: %(default)s)")
    a("--sampling_seqs", type=ints(1, MAX_COUNT), default=recipe.SAMPLING_SEQS, help="with --sampling: "
      "continuations sampled at --sampling_temperature for the sampling drafter, in data_sampled.pt "
      "(default: %(default)s)")
    a("--sampling_temperature", type=floats(0, low_open=True), default=recipe.SAMPLING_TEMPERATURE,
      help="temperature the sampling drafter's continuations are sampled at (default: %(default)s)")
    a("--sampling_lr", type=floats(0, 1, low_open=True), default=recipe.SAMPLING_LR, help="sampling drafter "
      "peak learning rate (default: %(default)s)")
    a("--long_batch", type=ints(0, 4096), default=recipe.LONG_BATCH, help="long sequences per drafter step "
      "(default: %(default)s)")
    a("--long_anchors", type=ints(1, 256), default=recipe.LONG_ANCHORS,
      help="anchors per long sequence per step")
    a("--eval_long_prompts", type=ints(1, 10000), default=recipe.EVAL_LONG_PROMPTS, help="prompts for the "
      "summary's long generations")
    a("--eval_long_tokens", type=ints(0, 4096), default=recipe.EVAL_LONG_TOKENS, help="tokens per long "
      "summary generation, 0 = skip them (default: %(default)s)")
    a("--eval_prompts", type=ints(1, 10000), default=recipe.EVAL_PROMPTS,
      help="validation prompts for the summary")
    a("--eval_new_tokens", type=ints(2, 4096), default=recipe.EVAL_NEW_TOKENS,
      help="tokens generated per summary prompt")
    args = p.parse_args(argv)
    if args.smoke and args.full:
        p.error("--smoke and --full are two recipes: choose one")
    args.out = args.out or (recipe.SMOKE_OUT if args.smoke else recipe.FULL_OUT if args.full else recipe.OUT)
    given = {arg.split("=")[0][2:] for arg in (sys.argv[1:] if argv is None else argv)
             if arg.startswith("--")}
    for k, v in (recipe.SMOKE if args.smoke else recipe.FULL if args.full else {}).items():
        if k not in given:                      # a flag given on the command line wins, whatever its value
            setattr(args, k, v)
    problem = check_flag_combinations(args)
    if problem:
        p.error(problem)
    check_device(p, args.device)
    return args
