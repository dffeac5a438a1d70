"""A training stage interrupted mid-way resumes where it stopped and ends with exactly the weights of a run
that was never interrupted; a resume file from other settings is refused, a corrupt one is redone.

The reference is the session's uninterrupted `train_tiny.py --smoke` run (conftest's smoke_out, default
drafter kind: dflash2). Runs here copy its finished stages they do not test, so only the stage under test
trains. `interrupt` wraps `Resume.step_done` to interrupt a run at a chosen step: with a real SIGINT (Ctrl-C,
which saves at the end of the step), or with an exception (a kill: nothing is saved at that moment).
"""

import shutil
import signal

import pytest
import torch

import train_tiny
from helpers import smoke_run_in_training
from nanodflash.store import resume


class Killed(Exception):
    """Stands for a kill -9 / closed lid: the process stops with no chance to save."""


def copy_stages(src, dst, files):
    """The finished stages `files` of run folder src, with its run.json (the tokenizer's record) and its step
    costs (costs.json: no stage here resumes the calibration, and timing the machine again would only cost
    the seconds of each rerun)."""
    dst.mkdir()
    for f in ("run.json", "costs.json", *files):
        shutil.copy(src / f, dst / f)
    return dst


SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sighup": signal.SIGHUP}


STEP_DONE = resume.Resume.step_done         # the real one, put back by `rerun`


def interrupt(monkeypatch, stage, at, how):
    """From now on, the stage `stage` is interrupted when `at` steps are done (before the save check)."""
    def hooked(self, step):
        if (self.stage, step) == (stage, at):
            if how in SIGNALS:
                signal.raise_signal(SIGNALS[how])
            else:
                raise Killed
        return STEP_DONE(self, step)
    monkeypatch.setattr(resume.Resume, "step_done", hooked)


def rerun(out, monkeypatch, capsys, *flags):
    """Take the interrupting hook away, run the same command again and return what it printed."""
    monkeypatch.setattr(resume.Resume, "step_done", STEP_DONE)
    train_tiny.main(["--smoke", *flags, "--out", str(out)])
    return capsys.readouterr().out


def assert_same_as_uninterrupted(out, ref, files=("target.pt", "drafter.pt")):
    for f in files:
        a, b = torch.load(out / f, weights_only=False), torch.load(ref / f, weights_only=False)
        assert a["model"].keys() == b["model"].keys(), f"{f}: the resumed run saved other tensors"
        differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
        assert not differ, \
            f"{f}: weights differ from the uninterrupted run's in {len(differ)} tensors, e.g. {differ[:3]}"
        assert a["history"] == b["history"], \
            f"{f}: the history (losses, evals) differs from the uninterrupted run's"


def same(a, b):
    """Equal, tensors bit for bit, through the dicts and lists of a resume file."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_signal_in_the_target_stage_saves_it_and_the_rerun_ends_with_the_same_weights(
        smoke_out, tmp_path, monkeypatch, capsys):
    saved = {}
    for how in SIGNALS:                         # each signal in its own run, stopped at the same step
        out = copy_stages(smoke_out, tmp_path / how, ["tokenizer.bpe"])
        interrupt(monkeypatch, "target", 12, how)
        with pytest.raises(SystemExit) as e:
            train_tiny.cli(["--smoke", "--out", str(out)])
        assert e.value.code == 130 and "interrupted" in capsys.readouterr().err, \
            f"{how} should end with the resume hint"
        assert (out / "target.pt.resume").exists() and not (out / "target.pt").exists(), \
            f"{how} inside the target stage should leave its resume file, and no target.pt"
        saved[how] = torch.load(out / "target.pt.resume", weights_only=False)
    for how in ("sigterm", "sighup"):           # the same handler saved the same state: one rerun covers all
        assert same(saved[how], saved["ctrl-c"]), f"{how} saved another state than ctrl-c at the same step"
    printed = rerun(out, monkeypatch, capsys)
    assert "resuming target at step 12 of 30" in printed, \
        f"the rerun should say where it resumes:\n{printed[:600]}"
    assert not (out / "target.pt.resume").exists(), "the resume file should go once target.pt is written"
    assert_same_as_uninterrupted(out, smoke_out)


def test_a_killed_drafter_stage_resumes_from_its_last_periodic_save_with_the_same_weights(
        smoke_out, tmp_path, monkeypatch, capsys):
    out = copy_stages(smoke_out, tmp_path / "run", ["tokenizer.bpe", "target.pt", "data.pt"])
    monkeypatch.setattr(resume, "RESUME_EVERY_S", 0.0)            # a periodic save after every step
    interrupt(monkeypatch, "drafter", 20, "kill")
    with pytest.raises(Killed):
        train_tiny.main(["--smoke", "--out", str(out)])
    saved = torch.load(out / "drafter.pt.resume", weights_only=False)["step"]
    assert saved == 19, \
        f"the last periodic save before the kill at step 20 should hold 19 steps, holds {saved}"
    printed = rerun(out, monkeypatch, capsys)
    assert "resuming drafter at step 19 of 30" in printed, \
        f"the rerun should say where it resumes:\n{printed[-900:]}"
    assert not (out / "drafter.pt.resume").exists(), "the resume file should go once drafter.pt is written"
    assert_same_as_uninterrupted(out, smoke_out, files=("drafter.pt",))


def test_a_killed_sampling_drafter_stage_resumes_with_the_same_final_weights(
        smoke_out, tmp_path, monkeypatch, capsys):
    out = copy_stages(smoke_out, tmp_path / "run", ["tokenizer.bpe", "target.pt", "data.pt", "drafter.pt",
                                                    "data_sampled.pt"])
    monkeypatch.setattr(resume, "RESUME_EVERY_S", 0.0)
    interrupt(monkeypatch, "sampling drafter", 12, "kill")
    with pytest.raises(Killed):
        train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    assert (out / "drafter_sampling.pt.resume").exists() and not (out / "drafter_sampling.pt").exists(), \
        "a kill inside the sampling drafter stage should leave its resume file, and no drafter_sampling.pt"
    printed = rerun(out, monkeypatch, capsys, "--sampling")
    assert "resuming sampling drafter at step 11 of 20" in printed, \
        f"the rerun should say where it resumes:\n{printed[-900:]}"
    assert_same_as_uninterrupted(out, smoke_out, files=("drafter_sampling.pt",))


def test_a_resume_file_from_other_settings_is_refused_naming_the_difference_and_fresh_starts_over(
        smoke_out, tmp_path, monkeypatch, capsys):
    out = copy_stages(smoke_out, tmp_path / "run", ["tokenizer.bpe", "target.pt", "data.pt"])
    interrupt(monkeypatch, "drafter", 3, "ctrl-c")
    with pytest.raises(KeyboardInterrupt):
        train_tiny.main(["--smoke", "--out", str(out), "--draft_steps", "40"])
    monkeypatch.setattr(resume.Resume, "step_done", STEP_DONE)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        train_tiny.cli(["--smoke", "--out", str(out)])                # the smoke default: 30 drafter steps
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1, \
        f"expected one error line and status 1, got:\n{err}"
    assert "steps (file: 40, now: 30)" in err and "--fresh" in err, \
        f"the message should name the difference and --fresh: {err}"
    interrupt(monkeypatch, "target", 1, "kill")                      # --fresh: stop it as soon as it trains
    with pytest.raises(Killed):
        train_tiny.main(["--smoke", "--out", str(out), "--fresh"])
    assert not (out / "drafter.pt.resume").exists(), "--fresh should delete the old resume file"


def test_a_resume_file_of_an_earlier_weight_layout_is_reported_and_the_stage_starts_over(tmp_path):
    from helpers import tiny_target
    path, said = tmp_path / "target.pt.resume", []
    model = tiny_target(seed=1)
    opt = torch.optim.AdamW(model.parameters())
    resume.Resume(str(path), "target", {"lr": 1}, model=model, optimizer=opt).save(3)
    saved = torch.load(path, weights_only=False)
    saved["state"]["model"] = {k.replace("qkv_proj", "q_proj"): v for k, v in saved["state"]["model"].items()}
    torch.save(saved, path)                                      # names as an earlier layout wrote them
    fresh = tiny_target(seed=2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    step = resume.Resume(str(path), "target", {"lr": 1}, log=said.append, model=fresh,
                         optimizer=torch.optim.AdamW(fresh.parameters())).restore(10)
    assert step == 0 and not path.exists(), "a file of another weight layout must be dropped"
    assert said and "earlier layout" in said[0], f"the stage must say why it starts over: {said}"
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items()), \
        "nothing of the stale file may reach the model"


def test_a_truncated_resume_file_is_reported_in_one_line_and_the_stage_restarts_cleanly(
        smoke_out, tmp_path, monkeypatch, capsys):
    out = copy_stages(smoke_out, tmp_path / "run", ["tokenizer.bpe", "target.pt", "data.pt"])
    interrupt(monkeypatch, "drafter", 5, "ctrl-c")
    with pytest.raises(KeyboardInterrupt):
        train_tiny.main(["--smoke", "--out", str(out)])
    path = out / "drafter.pt.resume"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    capsys.readouterr()                                              # only the rerun's lines
    lines = [line for line in rerun(out, monkeypatch, capsys).splitlines() if "corrupt" in line]
    assert (len(lines) == 1 and "drafter.pt.resume is corrupt or truncated" in lines[0]
            and "over" in lines[0]), f"expected one line reporting the corrupt resume file, got {lines}"
    assert_same_as_uninterrupted(out, smoke_out, files=("drafter.pt",))


def test_a_sigterm_from_another_process_finishes_the_step_saves_and_exits_130_with_the_resume_hint(
        smoke_out, tmp_path):
    """`kill PID` on a real run. Ctrl-C and SIGHUP go to the same handler:
    test_a_signal_in_the_target_stage_saves_it_and_the_rerun_ends_with_the_same_weights
    sends each of the three to its own process; one subprocess per signal here would add an interpreter and
    torch's import."""
    out = copy_stages(smoke_out, tmp_path / "run", ["tokenizer.bpe"])
    proc = smoke_run_in_training(out)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, \
        f"expected exit status 130 after SIGTERM, got {proc.returncode}: {err[-500:]}"
    assert b"Traceback" not in err and b"rerun the same command to resume" in err, \
        f"unclear message: {err[-500:]}"
    saved = torch.load(out / "target.pt.resume", weights_only=False)
    assert saved["step"] >= 1 and saved["settings"]["steps"] == 100000, \
        "the SIGTERM save should hold the steps done"


def test_an_interrupted_baseline_resumes_with_the_same_final_weights(smoke_out, tmp_path, monkeypatch):
    from nanodflash.store import checkpoint as ckpt
    from nanodflash.tools import baselines
    target, _ = ckpt.load_target(str(smoke_out / "target.pt"))
    drafter, ck = ckpt.load_drafter(str(smoke_out / "drafter.pt"), target)
    data = ckpt.read(str(smoke_out / "data.pt"), "generated data")
    recipe, quiet = dict(baselines.run_recipe(ck["made_by"], "drafter.pt"), steps=8), (lambda *_: None)

    def train(out):
        trained = baselines.train_baselines(str(out), target, drafter, data, recipe, kinds=("nofeat",),
                                            log=quiet)
        return trained["nofeat"]
    reference = train(tmp_path / "ref").state_dict()
    interrupt(monkeypatch, "drafter", 4, "ctrl-c")
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "run")
    assert (tmp_path / "run" / f"{baselines.NOFEAT}.resume").exists(), "the baseline's Ctrl-C save is missing"
    monkeypatch.setattr(resume.Resume, "step_done", STEP_DONE)
    resumed = train(tmp_path / "run").state_dict()
    differ = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    assert not differ, f"the resumed baseline differs from the uninterrupted one in {differ[:3]}"
