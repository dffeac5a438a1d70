"""A run folder knows what it holds: every stage checkpoint records what made it, a rerun reuses a stage
only when that record matches, the folder remembers its corpus and whether it is a toy (smoke) run, and
every command says in one line, never a traceback, what is wrong with a folder it was pointed at."""

import json
import os
import random
import shutil
import stat

import pytest
import torch

import sample
import train_tiny
from helpers import ROOT
from helpers import run_command as run  # `python ARGS...` (a script, or -m module), from cwd
from nanodflash.store import run_folder
from nanodflash.tools import bench, hf, measure

WORDS = ["zorblat", "quixle", "mervon", "plaskit", "drunel", "fovvy", "skrim", "talbor"]


def copy_run(smoke_out, tmp_path, name="run"):
    shutil.copytree(smoke_out, tmp_path / name)
    return tmp_path / name


def made_up_corpus(path, n_lines=2500):
    """A corpus no built-in one resembles: lines of made-up words."""
    rng = random.Random(0)
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
                              for _ in range(n_lines)) + "\n")
    return path


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory):
    """`train_tiny.py --smoke --data corpus.txt`, run without --out from a fresh working directory (and
    without timing the step costs, which no test here reads)."""
    cwd = tmp_path_factory.mktemp("cwd")
    corpus = made_up_corpus(cwd / "corpus.txt")
    r = run("train_tiny.py", "--smoke", "--data", corpus, "--calibrate_calls", "0", cwd=cwd)
    assert r.returncode == 0, f"the smoke run on a custom corpus failed:\n{r.stderr[-2000:]}"
    return cwd, corpus, r.stdout


# ------------------------------------------------------------------ stages are reused only when they match

@pytest.mark.parametrize("flags, difference, refused", [
    (["--n_layer", "3"], "n_layer (file: 2, now: 3)", "target.pt"),
    (["--draft_steps", "7"], "draft_steps (file: 30, now: 7)", "drafter.pt"),
    (["--gen_len", "30"], "gen_len (file: 40, now: 30)", "data.pt"),
])
def test_a_rerun_with_another_setting_is_refused_naming_the_difference_and_the_way_out(
        smoke_out, tmp_path, flags, difference, refused):
    out = copy_run(smoke_out, tmp_path)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    with pytest.raises(ValueError) as e:
        train_tiny.main(["--smoke", "--out", str(out), *flags])
    msg = str(e.value)
    assert f"{refused} was made by another run: {difference}" in msg, \
        f"the refusal should name {difference!r}: {msg}"
    assert "--fresh" in msg and "another --out" in msg, f"the refusal should say the way out: {msg}"
    assert "\n" not in msg, f"the refusal should be one line: {msg!r}"
    after = {f: (out / f).read_bytes() for f in os.listdir(out)}
    assert after == before, "a refused rerun must leave the run folder as it was"


def test_smoke_run_is_never_reused_by_a_default_run(smoke_out, tmp_path):
    out = copy_run(smoke_out, tmp_path)
    refusal = (r"tokenizer.bpe was made by another run: smoke \(file: True, now: False\); "
               r"vocab_size \(file: 300, now: 1024\)")
    with pytest.raises(ValueError, match=refusal):
        train_tiny.main(["--out", str(out)])


def test_a_run_on_another_corpus_is_refused_in_a_folder_made_on_the_default_one(smoke_out, tmp_path):
    out = copy_run(smoke_out, tmp_path)
    corpus = made_up_corpus(tmp_path / "corpus.txt")
    with pytest.raises(ValueError,
                       match=r"tokenizer.bpe was made by another run: corpus \(file: [0-9a-f]+, now: "):
        train_tiny.main(["--smoke", "--out", str(out), "--data", str(corpus)])


def test_a_matching_rerun_skips_every_stage(smoke_out, tmp_path, capsys):
    out = copy_run(smoke_out, tmp_path)
    train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    printed = capsys.readouterr().out
    for stage, f in (("tokenizer", "tokenizer.bpe"), ("target", "target.pt"), ("data", "data.pt"),
                     ("drafter", "drafter.pt"), ("sampled data", "data_sampled.pt"),
                     ("sampling drafter", "drafter_sampling.pt")):
        assert f"[{stage}] found {out / f}, skipping" in printed, f"the matching {stage} stage was not reused"
    assert "step" not in printed.split("=== summary")[0], "a matching rerun trained something"


def test_a_checkpoint_without_a_record_is_refused_not_reused(smoke_out, tmp_path):
    out = copy_run(smoke_out, tmp_path)
    ck = torch.load(out / "drafter.pt", weights_only=False)
    del ck["made_by"]                                      # as an older train_tiny.py wrote it
    torch.save(ck, out / "drafter.pt")
    with pytest.raises(ValueError, match=r"drafter.pt was made by another run: it records no settings"):
        train_tiny.main(["--smoke", "--out", str(out)])


def test_smoke_without_out_writes_out_smoke_and_never_touches_out(custom_run):
    cwd, _, printed = custom_run
    assert (cwd / "out_smoke" / "drafter.pt").exists(), "--smoke without --out should write out_smoke/"
    assert not (cwd / "out").exists(), "--smoke without --out must not touch out/"
    assert "checkpoints in out_smoke/" in printed, "the run should say where its checkpoints are"


# ------------------------------------------------------------------ the folder remembers its corpus

def test_sample_takes_its_prompt_from_the_corpus_the_run_was_trained_on(custom_run):
    cwd, corpus, _ = custom_run
    r = run("sample.py", "--out", cwd / "out_smoke", "--max_new_tokens", 8, "--no-color")
    assert r.returncode == 0, r.stderr[-2000:]
    shown = r.stdout.split("-" * 80)[1].strip("\n")
    # the prompt: the text before the first target token
    prompt = shown.split("⟨")[0]
    assert prompt and prompt in corpus.read_text(), f"the prompt {prompt!r} is not from the run's corpus"


def test_the_benchmark_takes_its_prompts_from_the_corpus_the_run_was_trained_on(
        custom_run, monkeypatch, capsys):
    cwd, corpus, _ = custom_run
    asked = []

    def stop(tok, n, length, seed, data=None):
        asked.append(data)
        raise ValueError("stop here")
    monkeypatch.setattr(measure, "val_prompts", stop)          # bench_prompts looks it up there
    with pytest.raises(SystemExit):
        bench.main(["--out", str(cwd / "out_smoke")])
    assert asked == [str(corpus)], f"the benchmark's prompts should come from {corpus}, it asked for {asked}"


def test_the_notebooks_prompt_a_custom_corpus_run_with_its_own_text_not_python(
        custom_run, monkeypatch, capsys):
    cwd, corpus, _ = custom_run
    monkeypatch.setenv("NANODFLASH_OUT", str(cwd / "out_smoke"))
    monkeypatch.syspath_prepend(os.path.join(ROOT, "notebooks"))
    import _setup
    tok, *_ = _setup.load_run(verbose=False)
    try:
        prompt = tok.decode(_setup.code_prompt(tok, _setup.CODE_PROMPT))
    finally:
        _setup.CORPUS = _setup.DEFAULT_CORPUS                  # other tests import _setup too
    assert prompt and prompt in corpus.read_text(), \
        f"the notebooks' prompt {prompt!r} is not from the run's corpus"
    assert f"trained on {corpus}" in capsys.readouterr().out, \
        "the notebook should say why its prompt is not code"


def test_a_run_whose_corpus_file_is_gone_says_so(custom_run, tmp_path):
    cwd, corpus, _ = custom_run
    out = tmp_path / "run"
    shutil.copytree(cwd / "out_smoke", out)
    record = json.loads((out / "run.json").read_text())
    record["corpus"]["data"] = str(tmp_path / "moved.txt")
    (out / "run.json").write_text(json.dumps(record))
    r = run("sample.py", "--out", out, "--max_new_tokens", 8)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"was trained on {tmp_path / 'moved.txt'}, which is gone" in r.stderr, r.stderr


# ------------------------------------------------------------------ a toy run says it is one

def test_a_smoke_run_says_its_numbers_are_not_meaningful_and_a_default_sized_one_does_not(
        smoke_out, tmp_path, capsys):
    default = copy_run(smoke_out, tmp_path)
    record = json.loads((default / "run.json").read_text())
    record["made_by"]["smoke"] = False                     # what a default-sized run records
    (default / "run.json").write_text(json.dumps(record))
    for out, toy in ((smoke_out, True), (default, False)):
        sample.main(["--out", str(out), "--max_new_tokens", "8"])
        bench.main(["--out", str(out), "--greedy_only", "--n_prompts", "1", "--max_new_tokens", "8"])
        printed = capsys.readouterr().out
        assert printed.count(run_folder.TOY_RUN) == (2 if toy else 0), \
            f"{out}: sample.py and the bench should print the toy-run line {'once each' if toy else 'never'}"


def test_the_smoke_summary_says_its_numbers_are_not_meaningful(custom_run):
    assert run_folder.TOY_RUN in custom_run[2], "the smoke run's summary should say it is a toy run"


# ------------------------------------------------------------------ messages that point the right way

def cases(tmp_path, smoke_out):
    near = tmp_path / "run_a"
    near.mkdir()
    (near / "tokenizer.bpe").write_text("")                # a run folder next to the missing one
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "a_file").write_text("")
    missing, unfinished = tmp_path / "run_b", tmp_path / "unfinished"
    no_folder = f"no run folder {missing}: it does not exist; the nearest run folder is {near}"
    no_tokenizer = f"{unfinished} has no tokenizer.bpe: an unfinished run"
    block = ('block_size must be "auto" or an integer in [1, 8] '
             '(the drafter was trained with block_size=8), got ')
    return [
        (("sample.py", "--out", missing), no_folder),
        (("sample.py", "--out", unfinished), no_tokenizer),
        (("-m", "nanodflash.tools.bench", "--out", missing), no_folder),
        (("-m", "nanodflash.tools.bench", "--out", unfinished), no_tokenizer),
        (("-m", "nanodflash.tools.baselines", "--out", missing), no_folder),
        (("-m", "nanodflash.tools.hf", "export", "--out", missing), no_folder),
        (("-m", "nanodflash.tools.hf", "export", "--out", unfinished), no_tokenizer),
        (("train_tiny.py", "--smoke", "--out", tmp_path / "a_file"),
         f"--out {tmp_path / 'a_file'} is a file, not a run folder"),
        (("sample.py", "--hf", missing, missing), f"no Hugging Face folder {missing}: it does not exist"),
        (("sample.py", "--out", smoke_out, "--block_size", "four"), block + "'four'"),
        (("sample.py", "--out", smoke_out, "--block_size", "32"), block + "32"),
    ]


CASES = ["sample-missing", "sample-unfinished", "bench-missing", "bench-unfinished", "baselines-missing",
         "hf-export-missing", "hf-export-unfinished", "train_tiny-out-is-a-file", "sample-hf-missing",
         "sample-block-size-word", "sample-block-size-too-big"]          # the order of cases(), one test each


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_every_command_reports_a_missing_or_wrong_path_in_one_line_without_a_traceback(
        smoke_out, tmp_path, case):
    argv, says = cases(tmp_path, smoke_out)[case]
    r = run(*argv)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    command = " ".join(map(str, argv))
    assert (r.returncode == 1 and "Traceback" not in r.stderr and says in last
            and last.startswith("error: ")), \
        f"{command}: exit {r.returncode}, said {r.stderr.strip()[-400:]!r}, should say {says!r}"


# ------------------------------------------------------------------ export says what it wrote

def test_export_names_every_file_it_wrote_includes_the_sampling_drafter_and_leaves_them_readable(
        smoke_out, tmp_path, capsys):
    to = tmp_path / "hf"
    hf.main(["export", "--out", str(smoke_out), "--to", str(to)])
    printed = capsys.readouterr().out
    written = sorted(str(p) for p in to.rglob("*") if p.is_file())
    assert sorted(line.removeprefix("wrote ") for line in printed.splitlines()) == written, \
        f"export should print one 'wrote PATH' per file it wrote:\n{printed}"
    assert (to / "drafter_sampling" / "model.safetensors").exists(), "the sampling drafter was not exported"
    for p in written:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o644, f"{p} is not readable like the rest (0644)"


def test_the_in_process_runner_reports_what_the_interpreter_would(tmp_path):
    """The command tests above run scripts in-process (helpers.run_command): a traceback, an exit message and
    an exit status must come out as they would from `python script.py`, or the claims above prove nothing."""
    script = tmp_path / "script.py"
    for body, status, says in (("raise ValueError('boom')", 1, "Traceback"),
                               ("raise SystemExit('error: no')", 1, "error: no"),
                               ("import sys; print('hi'); sys.exit(3)", 3, "")):
        script.write_text(body + "\n")
        r = run(script)
        assert r.returncode == status and says in r.stderr, \
            f"{body}: exit {r.returncode}, stderr {r.stderr!r}"
    assert r.stdout == "hi\n", f"stdout of the script was not captured: {r.stdout!r}"
