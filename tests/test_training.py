"""Ladder 7: training works -- losses fall, and a trained drafter drafts better than an untrained one."""

import re

import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.ext.plain_batch import generate_sequences
from nanodflash.tools.evaluate import measure_tau, slot_accuracy
from nanodflash.train import DraftTraining, sample_anchors, train_drafter


def test_sampled_anchors_stay_inside_the_sequence_and_after_min_anchor():
    a = sample_anchors(50, 20, seq_len=40, block_size=8, min_anchor=5,
                       generator=torch.Generator().manual_seed(0))
    assert a.min() >= 5 and a.max() <= 40 - 8, "anchors must leave room for a whole block of labels"


def test_generated_sequences_are_the_targets_own_greedy_continuations():
    target = tiny_target(seed=2)
    ids = torch.randint(0, 60, (500,), generator=torch.Generator().manual_seed(0))
    seqs = generate_sequences(target, ids, n_seqs=5, prompt_len=6, gen_len=12, batch_size=3,
                              log=lambda *_: None)
    from nanodflash.speculative import generate
    assert seqs.shape == (5, 18)
    for s in seqs.tolist():
        assert s[6:] == generate(target, s[:6], 12), \
            "batched generation must equal one-by-one greedy decoding"


def test_short_drafter_training_lowers_the_loss_and_beats_an_untrained_drafter():
    target = tiny_target(seed=4, head_scale=8.0)            # a peaked target: its continuations are learnable
    ids = torch.randint(0, 62, (2000,), generator=torch.Generator().manual_seed(1))
    seqs = generate_sequences(target, ids, n_seqs=96, prompt_len=4, gen_len=44, batch_size=48,
                              log=lambda *_: None)
    train, held_out = seqs[:80], seqs[80:]
    drafter = tiny_drafter(target, seed=5, block_size=8)
    untrained = tiny_drafter(target, seed=5, block_size=8)
    before = slot_accuracy(untrained, held_out, min_anchor=3)
    hist = train_drafter(drafter, train, DraftTraining(steps=150, batch_size=8, n_anchors=8, lr=1e-2,
                                                       min_anchor=3, log_every=10**6))
    after = slot_accuracy(drafter, held_out, min_anchor=3)
    first, last = sum(hist["loss"][:10]) / 10, sum(hist["loss"][-10:]) / 10
    assert last < first - 1.0, f"drafter loss did not fall: {first:.3f} -> {last:.3f}"
    assert after["slot_acc"][0] > before["slot_acc"][0] + 0.2, \
        f"slot-1 accuracy did not improve: {before['slot_acc'][0]:.2f} -> {after['slot_acc'][0]:.2f}"
    prompts = [s[:4] for s in held_out.tolist()[:6]]
    tau_trained, tau_untrained = measure_tau(drafter, prompts, 30), measure_tau(untrained, prompts, 30)
    assert tau_trained > tau_untrained + 0.3, \
        f"trained tau {tau_trained:.2f} should beat untrained {tau_untrained:.2f}"


def test_default_data_mixes_sampled_short_continuations_and_keeps_long_ones_greedy(smoke_out):
    import nanodflash
    from nanodflash.pipeline import recipe
    from nanodflash.speculative import generate
    from nanodflash.store.checkpoint import read
    _, target, _ = nanodflash.load(str(smoke_out))
    data, P = read(str(smoke_out / "data.pt"), "generated data"), 8                # smoke prompt_len
    mix = (recipe.GEN_TEMPERATURE.default, recipe.GEN_GREEDY_FRAC.default)
    assert 0 < mix[1] < 1 and (data["gen_temperature"], data["gen_greedy_frac"]) == mix, \
        "data.pt must record the mix"
    for s in data["train_long"][:3].tolist():
        assert s[P:] == generate(target, s[:P], len(s) - P), "long sequences must be greedy continuations"
    is_greedy = [s[P:] == generate(target, s[:P], len(s) - P) for s in data["train"].tolist()]
    k = round(len(is_greedy) * mix[1])                                         # the greedy part comes first
    assert all(is_greedy[:k]) and sum(is_greedy[k:]) <= 0.2 * (len(is_greedy) - k), \
        f"short sequences: {sum(is_greedy[:k])}/{k} greedy in the greedy part, {sum(is_greedy[k:])} in the " \
        "rest"


def test_the_summary_reports_greedy_speed_and_with_a_sampling_drafter_sampled_speed_side_by_side(smoke_out,
                                                                                                    capsys):
    import nanodflash
    from nanodflash.pipeline.summary import Summary
    from nanodflash.store.checkpoint import read
    _, target, drafter = nanodflash.load(str(smoke_out))
    data = read(str(smoke_out / "data.pt"), "generated data")
    prompts = [s[:8] for s in data["val"][:3].tolist()]
    _, _, sampler = nanodflash.load(str(smoke_out), sampling=True)
    greedy = ("greedy speculative == plain greedy on all 3 prompts: yes",
              "speedup (block_size=8, 24 new tokens)")
    sampled = ("sampling (T=0.7 top-p 0.95, rejection verifier, the sampling drafter, block_size=auto, 3 val "
               "prompts): tau ",)
    Summary(target=target, drafter=drafter, data=data, prompts=prompts, new_tokens=24).print()
    out = capsys.readouterr().out
    assert all(line in out for line in greedy), f"the summary lacks a greedy line:\n{out}"
    assert "sampling (" not in out, \
        f"without a sampling drafter the summary times no sampled decoding:\n{out}"
    Summary(target=target, drafter=drafter, data=data, prompts=prompts, new_tokens=24,
            sampler=sampler).print()
    out = capsys.readouterr().out
    for line in greedy + sampled:
        assert line in out, f"the summary lacks {line!r}:\n{out}"
    beside = re.findall(r"\d+\.\d\d on text (\d+)% repeated", out)
    assert len(beside) == 2, f"the greedy and the sampled tau each need their text's repetition:\n{out}"


def test_the_sampling_drafter_is_the_drafter_fine_tuned_on_sampled_continuations(smoke_out):
    import nanodflash
    from nanodflash.pipeline import recipe
    from nanodflash.speculative import generate
    from nanodflash.store.checkpoint import read
    _, target, drafter = nanodflash.load(str(smoke_out))
    _, _, sampler = nanodflash.load(str(smoke_out), sampling=True)
    assert (smoke_out / "drafter_sampling.pt").exists(), \
        "a run with --sampling must write drafter_sampling.pt"
    assert sampler.kind == drafter.kind and sampler.config == drafter.config, \
        "a copy of the drafter, same config"
    changed = [k for k, v in drafter.state_dict().items() if not torch.equal(v, sampler.state_dict()[k])]
    assert changed, "the sampling drafter's weights must differ from the drafter's (it was fine-tuned)"
    hist = read(str(smoke_out / "drafter_sampling.pt"), "sampling drafter")["history"]
    assert len(hist["loss"]) == recipe.SMOKE["sampling_steps"], f"{len(hist['loss'])} fine-tuning steps"
    data, P = read(str(smoke_out / "data_sampled.pt"), "sampled data"), 8          # smoke prompt_len
    sampled = data["train_sampled"]
    assert len(sampled) == recipe.SMOKE["sampling_seqs"], \
        "the sampling drafter's data: --sampling_seqs sequences"
    greedy = sum(s[P:] == generate(target, s[:P], len(s) - P) for s in sampled.tolist())
    assert greedy <= 0.2 * len(sampled), \
        f"its data must be sampled continuations, {greedy}/{len(sampled)} are greedy"


def test_without_a_sampling_drafter_sampling_loads_the_drafter(smoke_out, tmp_path):
    import shutil

    import nanodflash
    for f in ("tokenizer.bpe", "target.pt", "drafter.pt"):
        shutil.copy(smoke_out / f, tmp_path / f)
    _, _, drafter = nanodflash.load(str(smoke_out))
    _, _, fallback = nanodflash.load(str(tmp_path), sampling=True)
    assert all(torch.equal(v, fallback.state_dict()[k]) for k, v in drafter.state_dict().items()), \
        "with no drafter_sampling.pt, load(sampling=True) must give drafter.pt"


def test_the_sampling_drafter_is_trained_on_demand_once_and_a_greedy_run_never_pays_for_it(
        smoke_out, tmp_path, capsys):
    import shutil

    import train_tiny
    out = tmp_path / "run"
    out.mkdir()
    for f in ("run.json", "tokenizer.bpe", "target.pt", "data.pt", "drafter.pt", "costs.json"):
        shutil.copy(smoke_out / f, out / f)           # (the step costs too: a rerun would only time again)
    earlier = [f"[{stage}] found {out / f}, skipping" for stage, f in
               (("tokenizer", "tokenizer.bpe"), ("target", "target.pt"), ("data", "data.pt"),
                ("drafter", "drafter.pt"))]
    train_tiny.main(["--smoke", "--no-sampling", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "sampled data" not in printed and "sampling drafter" not in printed, \
        f"a run with --no-sampling generated sampled data or tuned a sampling drafter:\n{printed}"
    assert not (out / "data_sampled.pt").exists() and not (out / "drafter_sampling.pt").exists(), \
        "a run with --no-sampling wrote the sampling drafter's files"
    train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    printed = capsys.readouterr().out
    assert all(line in printed for line in earlier), f"--sampling retrained an earlier stage:\n{printed}"
    assert "[sampled data] generated" in printed and "[sampling drafter] found" not in printed \
        and (out / "drafter_sampling.pt").exists(), \
        f"the first --sampling run should generate its data and train the sampling drafter:\n{printed}"
    a, b = (torch.load(d / "drafter_sampling.pt", weights_only=False)["model"] for d in (out, smoke_out))
    assert all(torch.equal(a[k], b[k]) for k in a), \
        "added later, the sampling drafter must equal a one-go run's"
    train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    printed = capsys.readouterr().out
    for stage, f in (("sampled data", "data_sampled.pt"), ("sampling drafter", "drafter_sampling.pt")):
        assert f"[{stage}] found {out / f}, skipping" in printed, f"a second --sampling run redid the {stage}"
    assert "step" not in printed.split("=== summary")[0], \
        f"a second --sampling run trained something:\n{printed}"


def test_full_sets_the_longer_recipe_and_its_own_folder_but_explicit_flags_win():
    from nanodflash.pipeline import flags, recipe
    args = flags.parse_args(["--full"])
    assert args.out == recipe.FULL_OUT, "--full must write its own run folder, not the default run's"
    for k, v in recipe.FULL.items():
        assert getattr(args, k) == v, f"--full should set --{k} {v}, got {getattr(args, k)}"
        assert getattr(flags.parse_args([]), k) != v, \
            f"--{k} {v} is already the default: FULL should only hold what the longer recipe changes"
    explicit = flags.parse_args(["--full", "--draft_steps", "123", "--out", "elsewhere"])
    assert (explicit.draft_steps, explicit.out) == (123, "elsewhere"), "a flag given with --full must win"
    same = flags.parse_args(["--smoke", f"--target_steps={recipe.TARGET_STEPS.default}"])
    assert same.target_steps == recipe.TARGET_STEPS.default, \
        "a flag given at its default value must win over a preset"


def test_the_drafter_stage_evaluates_draft_evals_times_evenly_and_last_at_its_final_step(smoke_out):
    from nanodflash.pipeline import recipe
    from nanodflash.store.checkpoint import read
    steps, n = recipe.SMOKE["draft_steps"], recipe.DRAFT_EVALS
    evals = read(str(smoke_out / "drafter.pt"), "drafter")["history"]["eval"]
    assert [e["step"] for e in evals] == [steps * (i + 1) // n for i in range(n)], \
        f"held-out evaluations at steps {[e['step'] for e in evals]}, expected {n} evenly spaced, the last " \
        f"at {steps}"
    assert all({"expected_tau", "tau"} <= set(e) for e in evals), \
        "each evaluation reports expected τ and measured τ"
