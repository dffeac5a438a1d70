"""No bad number gets past argparse: every numeric flag of every script, tried the way a new user would
(zero, negative, NaN, inf, too large), stops the script before any work with one error line that names
the flag and what is allowed."""

import argparse
import os

import pytest

import sample
import train_tiny
from nanodflash.tools import baselines, bench

MAIN = {"train_tiny.py": train_tiny.main, "sample.py": sample.main, "nanodflash.tools.bench": bench.main,
        "nanodflash.tools.baselines": baselines.main}
N_CPU = os.cpu_count() or 1

# (script, flags, what its error line must say); one row per numeric flag at least, several where the
# issue found a bug (--gen_temperature -1, --n_seqs 0, --eval_prompts 0, --n_head 3, --temperature nan)
CASES = [
    ("train_tiny.py", ["--seed", "-1"], "argument --seed: must be an integer in [0, 4294967295], got -1"),
    ("train_tiny.py", ["--vocab_size", "100"],
     "argument --vocab_size: must be an integer in [258, 65536], got 100"),
    ("train_tiny.py", ["--n_layer", "0"], "argument --n_layer: must be an integer in [1, 64], got 0"),
    ("train_tiny.py", ["--n_embd", "100000"],
     "argument --n_embd: must be an integer in [2, 4096], got 100000"),
    ("train_tiny.py", ["--n_head", "3"],
     "--n_head 3 must divide --n_embd 128 into an even head size (RoPE rotates pairs); "
     "allowed: 1, 2, 4, 8, 16, 32, 64"),
    ("train_tiny.py", ["--n_head", "0"], "argument --n_head: must be an integer in [1, 2048], got 0"),
    ("train_tiny.py", ["--n_embd", "40", "--n_head", "2"],
     "--n_embd 40 must be a multiple of 16 for --drafter dflash2"),
    ("train_tiny.py", ["--seq_len", "1"], "argument --seq_len: must be an integer in [2, 4096], got 1"),
    ("train_tiny.py", ["--target_steps", "0"],
     "argument --target_steps: must be an integer in [1, 1000000], got 0"),
    ("train_tiny.py", ["--target_steps", "10000000"],
     "argument --target_steps: must be an integer in [1, 1000000]"),
    ("train_tiny.py", ["--target_batch", "-4"],
     "argument --target_batch: must be an integer in [1, 4096], got -4"),
    ("train_tiny.py", ["--target_lr", "nan"],
     "argument --target_lr: must be a finite number in (0, 1], got nan"),
    ("train_tiny.py", ["--target_lr", "0"], "argument --target_lr: must be a finite number in (0, 1], got 0"),
    ("train_tiny.py", ["--target_lr", "3"], "argument --target_lr: must be a finite number in (0, 1], got 3"),
    ("train_tiny.py", ["--n_seqs", "0"], "argument --n_seqs: must be an integer in [1, 1000000], got 0"),
    ("train_tiny.py", ["--prompt_len", "0"], "argument --prompt_len: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--prompt_len", "500"],
     "--prompt_len + --gen_len = 596 must be at most the target's context window, max(512, --seq_len) = 512"),
    ("train_tiny.py", ["--gen_len", "0"], "argument --gen_len: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--gen_temperature", "-1"],
     "argument --gen_temperature: must be a finite number >= 0, got -1"),
    ("train_tiny.py", ["--gen_temperature", "nan"],
     "argument --gen_temperature: must be a finite number >= 0, got nan"),
    ("train_tiny.py", ["--gen_temperature", "inf"],
     "argument --gen_temperature: must be a finite number >= 0, got inf"),
    ("train_tiny.py", ["--gen_greedy_frac", "1.5"],
     "argument --gen_greedy_frac: must be a finite number in [0, 1], got 1.5"),
    ("train_tiny.py", ["--soft_weight", "-0.1"],
     "argument --soft_weight: must be a finite number in [0, 1], got -0.1"),
    ("train_tiny.py", ["--draft_layers", "0"],
     "argument --draft_layers: must be an integer in [1, 64], got 0"),
    ("train_tiny.py", ["--draft_layers", "3", "--n_layer", "2", "--target_layer_ids", ""],
     "--draft_layers 3 must be at most --n_layer 2 when --target_layer_ids is empty"),
    ("train_tiny.py", ["--n_layer", "12", "--target_layer_ids", "0,12"],
     "--target_layer_ids [0, 12] must lie in 0..11"),
    ("train_tiny.py", ["--selector_top_k", "0"],
     "argument --selector_top_k: must be an integer in [1, 1024], got 0"),
    ("train_tiny.py", ["--selector_top_k", "1000", "--vocab_size", "512"],
     "--selector_top_k 1000 must be at most --vocab_size 512"),
    ("train_tiny.py", ["--selector_rank", "0"],
     "argument --selector_rank: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--conv_kernel_size", "-1"],
     "argument --conv_kernel_size: must be an integer in [0, 256], got -1"),
    ("train_tiny.py", ["--conv_kernel_size", "17"], "--conv_kernel_size 17 must be at most --block_size 16"),
    ("train_tiny.py", ["--gen_batch", "0"], "argument --gen_batch: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--block_size", "1"], "argument --block_size: must be an integer in [2, 256], got 1"),
    ("train_tiny.py", ["--block_size", "200"], "--block_size 200 must be at most --gen_len + 1 = 97"),
    ("train_tiny.py", ["--draft_steps", "-5"],
     "argument --draft_steps: must be an integer in [1, 1000000], got -5"),
    ("train_tiny.py", ["--draft_batch", "0"],
     "argument --draft_batch: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--draft_anchors", "0"],
     "argument --draft_anchors: must be an integer in [1, 256], got 0"),
    ("train_tiny.py", ["--draft_lr", "-0.001"],
     "argument --draft_lr: must be a finite number in (0, 1], got -0.001"),
    ("train_tiny.py", ["--draft_lr", "inf"],
     "argument --draft_lr: must be a finite number in (0, 1], got inf"),
    ("train_tiny.py", ["--gamma", "0"], "argument --gamma: must be a finite number > 0, got 0"),
    ("train_tiny.py", ["--gamma", "nan"], "argument --gamma: must be a finite number > 0, got nan"),
    ("train_tiny.py", ["--eval_prompts", "0"],
     "argument --eval_prompts: must be an integer in [1, 10000], got 0"),
    ("train_tiny.py", ["--long_seqs", "-1"], "argument --long_seqs: must be an integer in [0, "),
    ("train_tiny.py", ["--long_gen_len", "0"],
     "argument --long_gen_len: must be an integer in [1, 4096], got 0"),
    ("train_tiny.py", ["--long_batch", "-2"],
     "argument --long_batch: must be an integer in [0, 4096], got -2"),
    ("train_tiny.py", ["--long_anchors", "0"],
     "argument --long_anchors: must be an integer in [1, 256], got 0"),
    ("train_tiny.py", ["--eval_long_prompts", "0"],
     "argument --eval_long_prompts: must be an integer in [1, 10000], got 0"),
    ("train_tiny.py", ["--eval_long_tokens", "5000"],
     "argument --eval_long_tokens: must be an integer in [0, 4096], got 5000"),
    ("train_tiny.py", ["--calibrate_calls", "-1"],
     "argument --calibrate_calls: must be an integer in [0, 1001], got -1"),
    ("train_tiny.py", ["--long_gen_len", "600"],
     "--prompt_len + --long_gen_len = 616 must be at most the target's context window, "
     "max(512, --seq_len) = 512"),
    ("train_tiny.py", ["--long_gen_len", "8"], "--block_size 16 must be at most --long_gen_len + 1 = 9"),
    ("train_tiny.py", ["--eval_new_tokens", "1"],
     "argument --eval_new_tokens: must be an integer in [2, 4096], got 1"),
    ("train_tiny.py", ["--eval_new_tokens", "600"],
     "--prompt_len + --eval_new_tokens = 616 must be at most the target's context window"),
    ("train_tiny.py", ["--smoke", "--full"], "--smoke and --full are two recipes: choose one"),
    ("train_tiny.py", ["--n_seqs", "two"],
     "argument --n_seqs: must be an integer in [1, 1000000], got 'two'"),
    ("train_tiny.py", ["--sampling_steps", "0"],
     "argument --sampling_steps: must be an integer in [1, 1000000], got 0"),
    ("train_tiny.py", ["--sampling_seqs", "0"],
     "argument --sampling_seqs: must be an integer in [1, 1000000], got 0"),
    ("train_tiny.py", ["--sampling_lr", "0"],
     "argument --sampling_lr: must be a finite number in (0, 1], got 0"),
    ("train_tiny.py", ["--sampling_temperature", "0"],
     "argument --sampling_temperature: must be a finite number > 0, got 0"),
    ("sample.py", ["--max_new_tokens", "0"],
     "argument --max_new_tokens: must be an integer in [1, 1000000], got 0"),
    ("sample.py", ["--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
    ("sample.py", ["--temperature", "-1"], "argument --temperature: must be a finite number >= 0, got -1"),
    ("sample.py", ["--temperature", "inf"], "argument --temperature: must be a finite number >= 0, got inf"),
    ("sample.py", ["--top_k", "0"], "argument --top_k: must be an integer >= 1, got 0"),
    ("sample.py", ["--tree", "0"], "argument --tree: must be an integer in [1, 1000000], got 0"),
    ("sample.py", ["--top_p", "0"], "argument --top_p: must be a finite number in (0, 1], got 0"),
    ("sample.py", ["--top_p", "1.5"], "argument --top_p: must be a finite number in (0, 1], got 1.5"),
    ("sample.py", ["--top_p", "nan"], "argument --top_p: must be a finite number in (0, 1], got nan"),
    ("sample.py", ["--seed", "4294967296"],
     "argument --seed: must be an integer in [0, 4294967295], got 4294967296"),
    ("sample.py", ["--threads", "0"], f"argument --threads: must be an integer in [1, {N_CPU}], got 0"),
    ("sample.py", ["--threads", str(N_CPU + 1)], f"argument --threads: must be an integer in [1, {N_CPU}]"),
    ("nanodflash.tools.bench", ["--n_prompts", "0"],
     "argument --n_prompts: must be an integer in [1, 10000], got 0"),
    ("nanodflash.tools.bench", ["--max_new_tokens", "1"],
     "argument --max_new_tokens: must be an integer in [2, 1000000], got 1"),
    ("nanodflash.tools.bench", ["--seed", "-3"],
     "argument --seed: must be an integer in [0, 4294967295], got -3"),
    ("nanodflash.tools.bench", ["--repeats", "0"],
     "argument --repeats: must be an integer in [1, 100], got 0"),
    ("nanodflash.tools.bench", ["--threads", "-1"],
     f"argument --threads: must be an integer in [1, {N_CPU}], got -1"),
    ("nanodflash.tools.baselines", ["--steps", "0"],
     "argument --steps: must be an integer in [1, 1000000], got 0"),
    ("nanodflash.tools.baselines", ["--eval_prompts", "0"],
     "argument --eval_prompts: must be an integer in [1, 10000], got 0"),
]


@pytest.mark.parametrize("script,flags,says", CASES, ids=[f"{s} {' '.join(f)}" for s, f, _ in CASES])
def test_a_bad_numeric_flag_stops_the_script_before_any_work_with_one_line_naming_flag_and_range(
        script, flags, says, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        MAIN[script](["--out", str(out), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2, f"{script} {flags}: expected argparse's exit status 2, got {e.value.code}"
    assert "error: " in err[-1] and says in err[-1], \
        f"{script} {flags}: the error line should say {says!r}, got {err}"
    assert not out.exists(), f"{script} {flags}: work started (it created {out}) before the flag was refused"


@pytest.mark.parametrize("script", sorted(MAIN))
def test_every_numeric_flag_of_every_script_is_in_the_sweep(script, monkeypatch):
    module = {"train_tiny.py": train_tiny, "sample.py": sample, "nanodflash.tools.bench": bench,
              "nanodflash.tools.baselines": baselines}[script]
    parsers = []

    def capture(parser, *args, **kwargs):               # keep the parser the script builds, run nothing
        parsers.append(parser)
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    with pytest.raises(SystemExit):
        module.parse_args([])
    numeric = {a.option_strings[0] for a in parsers[0]._actions if a.option_strings and a.type is not None}
    swept = {f for s, flags, _ in CASES if s == script for f in flags if f.startswith("--")}
    assert numeric, f"{script}: no typed flags found; did parse_args change shape?"
    assert numeric <= swept, f"{script}: numeric flags missing from the sweep: {sorted(numeric - swept)}"
