"""train_tiny.py's flags: their definitions (`parse_args`, defaults from recipe.py, the --smoke and --full
presets) and the rules that tie them together, checked right after parsing, before any work.

    args = flags.parse_args(["--smoke", "--out", "out_smoke"], description=__doc__)

`check_flag_combinations(args)` returns one line naming the flags and what is allowed, or None; single-flag
ranges are argparse's job (nanodflash/tools/cli.py). `parse_layer_ids("1,5,9", n_layer)` reads
--target_layer_ids.
"""

import argparse
import sys

from ..dflash2 import DFlash2Config
from ..tools.cli import check_device
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
    """train_tiny.py's flags, parsed: the run's own (--out, --data, --smoke, --full, --fresh, --device) and
    the recipe's (recipe.flags(): each flag's default, range and help), a preset (--smoke:
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
    for name, f in recipe.flags().items():                       # the recipe's flags, each described there
        text = f"{f.help} (default: %(default)s)"
        if isinstance(f.default, bool):
            a(f"--{name}", action=argparse.BooleanOptionalAction, default=f.default, help=text)
        else:
            a(f"--{name}", type=f.check, default=f.default, choices=f.choices, help=text)
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
