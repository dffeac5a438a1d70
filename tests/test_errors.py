"""Bad input gets a clear error that names the problem; interrupted training resumes; nothing half-written."""

import os
import shutil

import pytest
import torch

import nanodflash
import train_tiny
from helpers import run_command, smoke_run_in_training, tiny_drafter
from nanodflash.speculative import generate, speculative_generate
from nanodflash.store import checkpoint


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt_ids=[]), "prompt is empty"),
    (dict(prompt_ids=list(range(60)) * 3), "exceeds the target's max_seq_len"),
    (dict(max_new_tokens=126), "exceeds the target's max_seq_len"),
    (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
    (dict(max_new_tokens=-3), "max_new_tokens must be a positive integer"),
    (dict(block_size=0), "block_size must be \"auto\" or an integer in"),
    (dict(block_size=17), "block_size must be \"auto\" or an integer in"),
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(temperature=float("nan")), "temperature must be >= 0 and finite"),
    (dict(temperature=1.0, top_p=0.0), "top_p must be in"),
    (dict(temperature=1.0, top_p=1.5), "top_p must be in"),
    (dict(temperature=1.0, top_k=0), "top_k must be a positive integer"),
    (dict(temperature=1.0, top_k=2.0), "top_k must be a positive integer"),
    (dict(verifier="typical"), "unknown verifier"),
    (dict(prompt_ids=[1, 2, 999]), "outside the target's vocabulary"),
])
def test_bad_generation_arguments_raise_value_error_naming_the_problem(target, drafter, kwargs, message):
    args = dict(prompt_ids=[1, 2, 3], max_new_tokens=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        speculative_generate(target, drafter, **args)
    if "block_size" not in kwargs and "verifier" not in kwargs:
        sampling = {k: v for k, v in kwargs.items() if k in ("temperature", "top_k", "top_p")}
        with pytest.raises(ValueError, match=message):
            generate(target, args["prompt_ids"], args["max_new_tokens"], **sampling)


def test_prompt_plus_new_tokens_exactly_filling_the_window_is_allowed(target, drafter):
    window = target.config.max_seq_len
    out, _ = speculative_generate(target, drafter, [1] * (window - 5), 5)
    assert len(out) == 5, "a request that exactly fills max_seq_len must succeed"


def test_missing_checkpoint_folder_names_the_path_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_tiny.py"):
        nanodflash.load(str(tmp_path / "nowhere"))


def test_truncated_checkpoint_is_reported_as_corrupt(smoke_out, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(smoke_out, bad)
    data = (bad / "drafter.pt").read_bytes()
    (bad / "drafter.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        nanodflash.load(str(bad))


def test_drafter_trained_against_another_target_is_refused(smoke_out, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(smoke_out, mixed)
    _, target, drafter = nanodflash.load(str(smoke_out))
    torch.manual_seed(7)
    other = type(target)(target.config)                            # same shape, other weights: another target
    checkpoint.save_drafter(str(mixed / "drafter.pt"), type(drafter)(drafter.config, other))
    with pytest.raises(ValueError, match="trained against target"):
        nanodflash.load(str(mixed))


def test_tokenizer_not_matching_the_model_is_refused(smoke_out, tmp_path):
    mixed = tmp_path / "vocab"
    shutil.copytree(smoke_out, mixed)
    from nanodflash.store.data import load_corpus
    from nanodflash.store.tokenizer import train_tokenizer
    train_tokenizer(load_corpus()[:20000], vocab_size=280, path=str(mixed / "tokenizer.bpe"))
    with pytest.raises(ValueError, match="tokenizer .* has 280 tokens but the target expects"):
        nanodflash.load(str(mixed))


def run_train_tiny(*args):
    return run_command("train_tiny.py", *args)


@pytest.mark.parametrize("content,message", [
    (None, "not found"),
    (b"", "is empty"),
    (b"\xff\xfe\x00bad bytes \xc3\x28", "not UTF-8"),
    (b"tiny text " * 40, "too small|fewer than one sequence"),
])
def test_bad_data_file_exits_nonzero_with_a_clear_message(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    r = run_train_tiny("--smoke", "--out", str(tmp_path / "o"), "--data", str(path))
    assert r.returncode == 1, f"expected exit 1, got {r.returncode}: {r.stderr[-500:]}"
    assert "Traceback" not in r.stderr, "users should get a message, not a stack trace"
    import re
    assert re.search(message, r.stderr), f"message should say {message!r}, got: {r.stderr.strip()[-300:]}"


def test_device_cuda_without_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the error path cannot happen here")
    r = run_train_tiny("--smoke", "--out", str(tmp_path / "o"), "--device", "cuda")
    assert r.returncode != 0 and "CUDA is not available" in r.stderr, r.stderr[-300:]


def test_interrupted_training_resumes_from_the_last_complete_stage(smoke_out, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(smoke_out, out)                                 # a finished --smoke run
    target_before = (out / "target.pt").read_bytes()
    os.remove(out / "drafter.pt")                                 # as if killed during the drafter stage ...
    (out / "drafter.pt.tmp").write_bytes(b"half a checkpoint")      # ... while writing its checkpoint
    r = run_train_tiny("--smoke", "--out", str(out))
    assert r.returncode == 0, r.stderr[-500:]
    for stage in ("tokenizer", "target", "data"):
        assert f"[{stage}] found" in r.stdout, \
            f"the finished {stage} stage should have been skipped on resume"
    assert "[drafter] step" in r.stdout, "the unfinished drafter stage should have been redone"
    assert (out / "target.pt").read_bytes() == target_before, "resuming must not retrain the target"
    nanodflash.load(str(out))                                       # everything loads


def test_killed_run_leaves_no_half_written_checkpoint(tmp_path):
    out = tmp_path / "killed"
    proc = smoke_run_in_training(out)
    proc.kill()
    proc.wait()
    assert not (out / "target.pt").exists(), "a killed target stage must not leave a target.pt behind"
    # a short rerun, with a short summary and none of the stages after the drafter's
    r = run_train_tiny("--smoke", "--out", str(out), "--target_steps", "2", "--draft_steps", "1",
                       "--eval_prompts", "1", "--eval_long_tokens", "0", "--no-sampling",
                       "--calibrate_calls", "0")
    assert r.returncode == 0 and "[target] step" in r.stdout, \
        "rerunning after a kill must redo the target stage"


def test_a_found_drafter_of_another_kind_than_asked_for_is_refused_with_what_to_do(smoke_out, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(smoke_out, run)
    kind = torch.load(run / "drafter.pt", weights_only=False)["kind"]
    other = "dflash" if kind == "dflash2" else "dflash2"
    message = (rf"drafter.pt was made by another run: drafter \(file: {kind}, now: {other}\)"
               r".*Rerun with --fresh to start over, or use another --out")
    with pytest.raises(ValueError, match=message):
        train_tiny.main(["--smoke", "--out", str(run), "--drafter", other])


@pytest.mark.parametrize("change,message", [
    (None, r"target_layer_ids \[\] must name at least one target layer, each in 0..2"),
    (dict(target_layer_ids=[0, 3]),
     r"target_layer_ids \[0, 3\] must name at least one target layer, each in 0..2"),
    (dict(block_size=1), "need block_size >= 2"),
])
def test_a_drafter_config_that_cannot_work_is_refused_when_the_drafter_is_built(target, change, message):
    """None: a DrafterConfig made by hand without target_layer_ids (which, unchecked, would build and then
    fail in torch.cat)."""
    from dataclasses import replace

    from nanodflash.drafter import Drafter, DrafterConfig
    c = target.config
    if change is None:
        config = DrafterConfig(mask_token_id=c.vocab_size - 1, n_embd=c.n_embd, n_head=c.n_head,
                               n_kv_head=c.n_kv_head)
    else:
        config = replace(tiny_drafter(target).config, **change)
    with pytest.raises(ValueError, match=message):
        Drafter(config, target)
