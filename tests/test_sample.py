"""sample.py: runs end to end on smoke checkpoints, passes its greedy self-check, shows token origins
faithfully, and fails with a clear message (exit status 1, no traceback) on bad checkpoints or flags."""

import re
import shutil

import pytest
import torch

import sample
from helpers import run_command
from nanodflash.store.tokenizer import load_tokenizer


def run_sample(*args):
    return run_command("sample.py", *args)


def exit_message(argv, capsys):
    """Run sample.main in-process; return the message it exits with (it must exit, not raise)."""
    with pytest.raises(SystemExit) as e:
        sample.main(argv)
    code = e.value.code
    return code if isinstance(code, str) else f"exit status {code}: {capsys.readouterr().err}"


def test_sample_smoke_run_exits_0_and_its_greedy_self_check_passes(smoke_out):
    r = run_sample("--out", smoke_out, "--max_new_tokens", 30)
    assert r.returncode == 0, f"sample.py failed (status {r.returncode}):\n{r.stderr}"
    assert re.search(r"greedy self-check: .*token-identical.*: PASS", r.stdout), \
        f"the greedy self-check line is missing:\n{r.stdout}"
    assert "τ (mean acceptance length)" in r.stdout and "plain decoding" in r.stdout, \
        f"τ or speed missing:\n{r.stdout}"
    assert re.search(r"τ \(mean acceptance length\) = [0-9.]+ on text [0-9]+% repeated", r.stdout), \
        f"τ without the repetition of the text it was measured on:\n{r.stdout}"
    assert re.search(r"plain [0-9.]+s vs DFlash [0-9.]+s -> [0-9.]+x", r.stdout), \
        f"no side-by-side speed:\n{r.stdout}"
    assert "\033[" not in r.stdout, "ANSI colour codes were written to a pipe (not a terminal)"
    assert "legend: prompt  ⟦accepted drafts⟧  ⟨target tokens" in r.stdout, "the marker legend is missing"
    assert re.search(r"prompt: the least repetitive of 8 validation prompts .* [0-9]+% repeated", r.stdout), \
        f"the default prompt should say how the rule chose it:\n{r.stdout}"
    for mode in ("greedy", "sampled"):            # the run's summary, greedy and sampled side by side
        assert re.search(rf"\n  {mode} .* tau [0-9.]+ \| text +[0-9]+% repeated \| [0-9.]+x", r.stdout), \
            f"the run's {mode} headline (tau with its repetition) is missing:\n{r.stdout}"


def test_a_headline_is_shown_only_for_the_checkpoints_it_measured(smoke_out, tmp_path):
    from nanodflash.pipeline.summary import recorded_headline
    out = tmp_path / "run"
    shutil.copytree(smoke_out, out)
    rows = recorded_headline(out)
    assert rows and set(rows) == {"greedy", "sampled"}, f"train_tiny.py recorded no full headline: {rows}"
    assert all(0 <= r["repetition"] <= 1 and r["tau"] >= 1 for r in rows.values()), rows
    with open(out / "drafter.pt", "ab") as f:           # a later run replaced the drafter, then stopped
        f.write(b"changed")
    assert recorded_headline(out) is None, "a headline of a replaced drafter is still shown"


def test_tree_mode_shows_the_accepted_path_and_its_greedy_self_check_passes(smoke_out):
    r = run_sample("--out", smoke_out, "--max_new_tokens", 30, "--tree", 12)
    assert r.returncode == 0, f"sample.py --tree failed (status {r.returncode}):\n{r.stderr}"
    assert "tree of <= 12 nodes" in r.stdout, f"the header should name the tree size:\n{r.stdout}"
    assert "⟦" in r.stdout or "⟨" in r.stdout, f"the accepted path should be marked by origin:\n{r.stdout}"
    assert re.search(r"greedy self-check: .*token-identical.*: PASS", r.stdout), f"no PASS line:\n{r.stdout}"


def test_plain_prints_the_continuation_without_markers_or_legend(smoke_out):
    r = run_sample("--out", smoke_out, "--max_new_tokens", 20, "--plain", "--prompt", "def f(x):")
    assert r.returncode == 0, r.stderr
    text = r.stdout.split("-" * 80)[1]
    assert "legend" not in r.stdout and not set("⟦⟧⟨⟩") & set(text), f"--plain printed markers:\n{r.stdout}"
    assert text.startswith("\ndef f(x):"), \
        f"--plain should print the prompt and continuation as text:\n{text!r}"


def test_sample_runs_sampled_mode_with_the_rejection_verifier(smoke_out):
    r = run_sample("--out", smoke_out, "--max_new_tokens", 20, "--temperature", 1, "--verifier", "rejection",
                   "--top_k", 50, "--prompt", "    def __init__(self")
    assert r.returncode == 0, f"sample.py at T=1 failed:\n{r.stderr}"
    assert "self-check" not in r.stdout, "a token-by-token check makes no sense at T>0 and must not run"


def test_sampling_by_default_drafts_with_the_sampling_drafter_rejection_and_auto_blocks(smoke_out):
    r = run_sample("--out", smoke_out, "--max_new_tokens", 20, "--temperature", 0.7, "--top_p", 0.95)
    assert r.returncode == 0, f"sample.py at T=0.7 failed:\n{r.stderr}"
    header = r.stdout.splitlines()[0]
    for part in ("drafter_sampling.pt", "block_size auto", "(rejection verifier)"):
        assert part in header, f"sampling should default to {part!r}; the header says: {header}"
    assert "block sizes chosen (auto" in r.stdout, f"auto blocks print the sizes they chose:\n{r.stdout}"
    greedy = run_sample("--out", smoke_out, "--max_new_tokens", 20).stdout.splitlines()[0]
    assert "drafter.pt" in greedy and "block_size 8" in greedy, f"greedy keeps drafter.pt and its B: {greedy}"


def test_origins_split_each_step_into_accepted_drafts_then_one_target_token():
    assert sample.origins(1, []) == ["target"], "the prefill token comes from the target"
    assert sample.origins(6, [1, 4]) == ["target", "target", "draft", "draft", "draft", "target"], \
        "a step of acceptance length n is n-1 accepted drafts then the bonus"
    with pytest.raises(AssertionError):
        # lengths that do not add up are a bug, not a display
        sample.origins(5, [1, 1])


def test_render_marks_runs_by_origin_and_loses_no_text(smoke_out):
    tok = load_tokenizer(str(smoke_out / "tokenizer.bpe"))
    prompt, gen = tok.encode_ordinary("def f"), tok.encode_ordinary("(x): return x")
    kinds = sample.origins(len(gen), [len(gen) - 1])      # prefill token, then one step
    marked = sample.render(tok, prompt, gen, kinds, "markers")
    first = tok.decode(gen[:1])
    drafts, bonus = tok.decode(gen[1:-1]), tok.decode(gen[-1:])
    expected = f"def f⟨{first}⟩" + (f"⟦{drafts}⟧" if drafts else "") + f"⟨{bonus}⟩"
    assert marked == expected, f"origin markers wrong: {marked!r} != {expected!r}"
    colored = sample.render(tok, prompt, gen, kinds, "color")
    assert re.sub(r"\033\[[0-9;]*m", "", colored) == "def f(x): return x", "colour mode changed the text"
    assert sample.render(tok, prompt, gen, kinds, "plain") == "def f(x): return x", \
        "plain mode changed the text"


def test_sample_exits_1_with_a_clear_message_when_checkpoints_are_missing(tmp_path):
    r = run_sample("--out", tmp_path / "nothing_here")
    assert r.returncode == 1, f"expected exit status 1, got {r.returncode}"
    assert "no run folder" in r.stderr and "train_tiny.py" in r.stderr, \
        f"message does not say what to do:\n{r.stderr}"
    assert "Traceback" not in r.stderr, f"a stack trace instead of a message:\n{r.stderr}"


def test_sample_refuses_a_drafter_trained_for_another_target(smoke_out, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(smoke_out, other)
    ck = torch.load(other / "target.pt", weights_only=False)
    ck["model"]["lm_head.weight"] += 0.01                  # a different target, same shapes
    torch.save(ck, other / "target.pt")
    msg = exit_message(["--out", str(other)], capsys)
    assert msg.startswith("error:") and "trained against target" in msg, f"unclear message: {msg}"


@pytest.mark.parametrize("flags, says", [
    (["--block_size", "99"], "block_size must be \"auto\" or an integer in [1, "),
    (["--max_new_tokens", "100000"], "exceeds the target's max_seq_len"),
    (["--prompt", ""], "the prompt is empty"),
])
def test_sample_rejects_bad_flags_with_the_library_message(smoke_out, capsys, flags, says):
    msg = exit_message(["--out", str(smoke_out), *flags], capsys)
    assert msg.startswith("error:") and says in msg, \
        f"{flags}: expected a message containing {says!r}, got {msg!r}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_sample_device_cuda_without_cuda_is_a_clear_error(smoke_out, capsys):
    with pytest.raises(SystemExit) as e:
        sample.main(["--out", str(smoke_out), "--device", "cuda"])
    assert e.value.code != 0 and "CUDA is not available" in capsys.readouterr().err, "no clear CUDA message"


@pytest.mark.parametrize("other", [["--tree", "4"], ["--race", "race.html"]], ids=["tree", "race"])
def test_sample_compile_with_a_tree_or_a_race_is_a_clear_error(smoke_out, capsys, other):
    message = exit_message(["--out", str(smoke_out), "--compile", *other], capsys)
    assert "--compile runs the path decoder only" in message, f"unclear message: {message}"


def test_race_with_html_is_refused_before_any_work(capsys):
    import sample
    with pytest.raises(SystemExit):
        sample.main(["--out", "no_such_run", "--race", "r.html", "--html", "t.html"])
    assert "--race writes its own page" in capsys.readouterr().err, "--race with --html must say why not"
