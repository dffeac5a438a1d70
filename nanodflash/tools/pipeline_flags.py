"""The rules that tie train_tiny.py's flags together, checked right after parsing, before any work.

`check_flag_combinations(args)` returns one line naming the flags and what is allowed, or None; single-flag
ranges are argparse's job (cli.py). `parse_layer_ids("1,5,9", n_layer)` reads --target_layer_ids.
"""

from ..dflash2 import DFlash2Config


def context_window(seq_len):
    """The target's max_seq_len: room for the drafter's sequences and the summary's prompts."""
    return max(512, seq_len)


def check_flag_combinations(a):
    """The checks that involve two flags; one line naming them and what is allowed, or None."""
    heads = [h for h in range(1, a.n_embd + 1) if a.n_embd % h == 0 and (a.n_embd // h) % 2 == 0]
    window = context_window(a.seq_len)
    if a.n_head not in heads:
        return (f"--n_head {a.n_head} must divide --n_embd {a.n_embd} into an even head size (RoPE rotates pairs); "
                f"allowed: {', '.join(map(str, heads)) or 'none, make --n_embd even'}")
    if a.drafter == "dflash2" and a.n_embd % DFlash2Config.conv_group_size:
        return (f"--n_embd {a.n_embd} must be a multiple of {DFlash2Config.conv_group_size} for --drafter dflash2 "
                "(one convolution tap per group of that many channels)")
    for flag, n in (("--gen_len", a.gen_len), ("--eval_new_tokens", a.eval_new_tokens),
                    ("--long_gen_len", a.long_gen_len if a.long_seqs else 0), ("--eval_long_tokens", a.eval_long_tokens)):
        if a.prompt_len + n > window:                  # every sequence the run generates fits the target's window
            return (f"--prompt_len + {flag} = {a.prompt_len + n} must be at most the target's context window, "
                    f"max(512, --seq_len) = {window}")
    if a.long_seqs and a.block_size > a.long_gen_len + 1:
        return f"--block_size {a.block_size} must be at most --long_gen_len + 1 = {a.long_gen_len + 1}"
    if a.block_size > a.gen_len + 1:
        return (f"--block_size {a.block_size} must be at most --gen_len + 1 = {a.gen_len + 1}: a training block's "
                "labels are generated tokens")
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
        return (f"--draft_layers {a.draft_layers} must be at most --n_layer {a.n_layer} when --target_layer_ids is "
                "empty (the paper's rule takes one target layer per drafter layer)")
    return None


def parse_layer_ids(text, n_layer):
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--target_layer_ids must be comma-separated integers, got {text!r}") from None
    if not ids or min(ids) < 0 or max(ids) >= n_layer:
        raise ValueError(f"--target_layer_ids {ids} must lie in 0..{n_layer - 1} (the target has {n_layer} layers)")
    return ids
