"""nanodflash.tools.bench: its numbers are internally consistent and agree with independent runs of the loop;
its ceiling bounds the measured speedup; the oracle selector bounds the drafter's τ."""

import json
import math
import shutil

import pytest
import torch

import nanodflash
from helpers import tiny_drafter, tiny_target
from nanodflash.drafter import Drafter
from nanodflash.ext.block_policy import auto
from nanodflash.ext.sampled_tree import SampledDraws
from nanodflash.ext.tree import tree_speculative_generate
from nanodflash.speculative import generate, speculative_generate
from nanodflash.store.data import val_prompts
from nanodflash.tools import (
    bench,
    bench_batch,
    bench_methods,
    bench_peers,
    bench_table,
    bench_tree,
    draft_costs,
    lost_tau,
    measure,
)
from nanodflash.tools.prompt_lookup import PromptLookupDrafter
from nanodflash.tools.watch import policy

N_PROMPTS, NEW_TOKENS = 2, 20


@pytest.fixture(scope="module")
def setup(smoke_out):
    tok, target, drafter = nanodflash.load(str(smoke_out))
    prompts = val_prompts(tok, N_PROMPTS, bench.PROMPT_LEN, seed=0)
    rows = bench.run_benchmark(target, drafter, prompts, max_new_tokens=NEW_TOKENS, seed=0)
    return target, drafter, prompts, {r["name"]: r for r in rows}


def test_bench_has_one_row_per_method_with_block_sizes_capped_at_the_drafters(setup):
    _, drafter, _, rows = setup
    B, kind = drafter.config.block_size, bench.kind_of(drafter)    # B=8 in smoke mode: 4, 8 (16 capped to 8)
    sampled = [f"{v} B={b}" for b in bench_methods.sampled_sizes(B) for v in ("match", "rejection")]
    greedy = [*sorted({min(b, B) for b in (4, 8, 16)}), "auto"]
    trees = [f"sampled tree N={n}" for n in bench_methods.SAMPLED_TREE_NODES]
    expected = ["plain greedy"] + [f"{kind} greedy B={b}" for b in greedy] + \
               ["prompt lookup k=4", "prompt lookup k=10"] + \
               ["plain T=1"] + [f"{kind} T=1 {s}" for s in sampled + trees] + \
               ["plain T=0.7 p=0.95"] + [f"{kind} T=0.7 p=0.95 {s}" for s in sampled + trees]
    assert list(rows) == expected, f"rows {list(rows)} != {expected}"


def plain_row(rows, temperature):
    """The plain decoding row a row at `temperature` is compared with."""
    return next(r for name, r in rows.items() if name.startswith("plain") and r["temperature"] == temperature)


def test_bench_tau_equals_tokens_emitted_by_steps_over_verify_steps(setup):
    for name, r in setup[3].items():
        assert r["steps"] > 0, f"{name}: no verify step was counted"
        assert math.isclose(r["tau"], (r["tokens"] - r["prompts"]) / r["steps"]), \
            f"{name}: tau {r['tau']} != (tokens - prefill tokens) / steps"


def test_bench_forward_passes_are_prefill_plus_one_per_step(setup):
    for name, r in setup[3].items():
        assert r["forwards"] == r["prompts"] + r["steps"], \
            f"{name}: hook counted {r['forwards']} target forwards, the loop says {r['prompts']} + " \
            f"{r['steps']}"
        assert math.isclose(r["forwards_per_token"], r["forwards"] / r["tokens"]), f"{name}: forwards/token"
        # ≈ 1/τ up to the prefill: (P + steps) / (P + τ·steps)
        approx = (r["prompts"] + r["steps"]) / (r["prompts"] + r["tau"] * r["steps"])
        assert math.isclose(r["forwards_per_token"], approx), \
            f"{name}: forwards/token is not 1/τ up to the prefill"


def test_bench_plain_rows_have_tau_1_and_one_forward_per_token(setup):
    for name in ("plain greedy", "plain T=1", "plain T=0.7 p=0.95"):
        r = setup[3][name]
        assert r["tau"] == 1 and r["forwards_per_token"] == 1, \
            f"{name}: tau {r['tau']}, fwd/token {r['forwards_per_token']}"
        assert r["speedup"] == 1, f"{name} is its own baseline, speedup {r['speedup']}"


def test_bench_speedup_is_tokens_per_s_over_plain_at_the_same_temperature(setup):
    rows = setup[3]
    for name, r in rows.items():
        base = plain_row(rows, r["temperature"])
        assert math.isclose(r["speedup"], r["tokens_per_s"] / base["tokens_per_s"]), f"{name}: wrong baseline"
        assert r["tokens_per_s"] > 0 and r["seconds"] > 0, f"{name}: no time measured"


def test_bench_greedy_rows_agree_with_independent_runs_and_with_plain_decoding(setup):
    target, drafter, prompts, rows = setup
    for name, r in rows.items():
        if r["temperature"] != 0:
            continue
        assert r["matches_plain"] is True, f"{name}: greedy output differed from plain greedy decoding"
        if name.startswith(bench.kind_of(drafter) + " greedy B="):
            b = name.split("B=")[1]
            b = auto if b == "auto" else int(b)
            runs = [speculative_generate(target, drafter, p, NEW_TOKENS, block_size=b) for p in prompts]
            assert r["tokens"] == sum(len(t) for t, _ in runs), \
                f"{name}: token count differs from a fresh run"
            assert r["steps"] == sum(len(s.acceptance_lengths) for _, s in runs), \
                f"{name}: step count differs"
        elif name.startswith("prompt lookup k="):
            lookup = PromptLookupDrafter(target, int(name.split("k=")[1]))
            runs = [speculative_generate(target, lookup, p, NEW_TOKENS) for p in prompts]
            assert r["steps"] == sum(len(s.acceptance_lengths) for _, s in runs), \
                f"{name}: step count differs"
        else:
            plain = [generate(target, p, NEW_TOKENS) for p in prompts]
            assert r["tokens"] == sum(len(t) for t in plain), f"{name}: tokens"


def test_bench_sampled_rows_are_temperature_0_7_top_p_0_95_runs_with_the_benchmarks_seeds(setup):
    target, drafter, prompts, rows = setup
    for b in bench_methods.sampled_sizes(drafter.config.block_size):
        for v in ("match", "rejection"):
            r = rows[f"{bench.kind_of(drafter)} T=0.7 p=0.95 {v} B={b}"]
            runs = [speculative_generate(target, drafter, p, NEW_TOKENS, block_size=policy(b),
                                         temperature=0.7, top_p=0.95, verifier=v,
                                         generator=torch.Generator().manual_seed(i))
                    for i, p in enumerate(prompts)]
            steps = sum(len(s.acceptance_lengths) for _, s in runs)
            assert r["temperature"] == 0.7 and r["steps"] == steps, \
                f"{v} B={b}: the row's steps differ from fresh T=0.7 top-p 0.95 runs seeded like the " \
                "benchmark's"
    for n in bench_methods.SAMPLED_TREE_NODES:
        r = rows[f"{bench.kind_of(drafter)} T=0.7 p=0.95 sampled tree N={n}"]
        runs = [tree_speculative_generate(target, drafter, p, NEW_TOKENS, tree_nodes=n, temperature=0.7,
                                          top_p=0.95, generator=torch.Generator().manual_seed(i),
                                          draws=SampledDraws()) for i, p in enumerate(prompts)]
        assert r["steps"] == sum(len(s.acceptance_lengths) for _, s in runs), \
            f"sampled tree N={n}: the steps differ from fresh sampled-tree runs seeded as the bench seeds"


def test_bench_a_new_method_is_one_more_list_entry(setup):
    target, drafter, prompts, _ = setup
    methods = bench.default_methods(drafter)[:1] + [bench.Method("dflash greedy B=2", 0.0,
                                                                 bench.dflash_method(2))]
    rows = bench.run_benchmark(target, drafter, prompts[:1], methods, max_new_tokens=8, warmup=False)
    assert [r["name"] for r in rows] == ["plain greedy", "dflash greedy B=2"], "custom method row missing"
    assert rows[1]["matches_plain"] and 1 <= rows[1]["tau"] <= 2, f"B=2 row is off: {rows[1]}"


def test_bench_step_costs_are_measured_at_the_requested_block_size(setup):
    target, drafter, prompts, _ = setup
    c = draft_costs.step_costs(target, drafter, prompts[0], len(prompts[0]) + 40, block_size=16, n=3)
    assert c["block_size"] == min(16, drafter.config.block_size), f"block size not capped: {c}"
    assert all(c[k] > 0 for k in ("draft_s", "verify_s", "plain_step_s")), f"a cost was not measured: {c}"
    assert c["context_len"] == len(prompts[0]) + 40, "step costs measured at the wrong context"


def test_bench_cli_prints_the_table_ceiling_oracle_and_comparisons_and_writes_json(smoke_out, tmp_path,
                                                                                    capsys):
    _, target, drafter = nanodflash.load(str(smoke_out))
    kind = bench.kind_of(drafter)                          # "dflash" or "dflash2", whichever train_tiny made
    other = "dflash" if kind == "dflash2" else "dflash2"
    torch.manual_seed(0)
    stand_in = Drafter(drafter.config, target).eval()     # any DFlash-style drafter stands in for the other
    path = tmp_path / "bench.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--all_rows",
                "--repeats", "2", "--json", str(path)], extra={other: stand_in})
    captured = capsys.readouterr()
    out = captured.out
    rows = len(json.loads(path.read_text())["rows"])
    for needed in (f"[bench] {rows} rows x 1 prompts x 8 new tokens, 2 pass(es); from the warm-up, expect ",
                   "[bench] prompt 1/1 of pass 2/2, ", " | elapsed ", " | eta 0s", "[bench] step costs: "):
        assert needed in captured.err, f"the progress lines on stderr lack {needed!r}:\n{captured.err}"
    assert "[bench]" not in out, "progress lines belong on stderr, apart from the table"
    B = min(16, drafter.config.block_size)
    for needed in ("the speedup: total tokens over total seconds against plain decoding's",
                   "threads: plain rows ",
                   "greedy outputs identical to plain greedy on all 1 prompts: yes",
                   "ceiling: speedup <= tau * t_plain / (t_draft + t_verify)", f"{other} greedy B={B}",
                   "oracle-selector tau (ceiling of a perfect top-16 selector", f"({kind} draft step ",
                   f"% vs {other})", "prompt lookup k=10",
                   "vs the best prompt lookup setting (prompt lookup k=",
                   "plain T=0.7 p=0.95", f"{kind} T=0.7 p=0.95 rejection B=",
                   f"{other} T=0.7 p=0.95 rejection B=",
                   f"per-slot acceptance of '{kind} T=0.7 p=0.95 rejection'", "  sum min(p, q) ",
                   f"{kind}-sampling T=1 rejection B=", f"{kind}-sampling T=0.7 p=0.95 rejection B=auto",
                   f"per-slot acceptance of '{kind}-sampling T=0.7 p=0.95 rejection'",
                   "block_policy (B=auto) costs, in-loop"):
        assert needed in out, f"output lacks {needed!r}:\n{out}"
    data = json.loads(path.read_text())
    assert [r["name"] for r in data["rows"]][0] == "plain greedy" and data["step_costs"]["draft_s"] > 0, \
        "bad JSON"
    assert set(data["oracle_selector"]) == {f"{kind} greedy B={B}", f"{other} greedy B={B}"}, \
        data["oracle_selector"]
    assert set(data["draft_step_s"]) == {kind, other}, f"draft step costs: {data['draft_step_s']}"
    assert data["policy_costs"]["step_cost"] > 0, f"block policy costs: {data['policy_costs']}"
    assert set(data["slot_acceptance"]) == {kind, f"{kind}-sampling"}, \
        "slot acceptance of both sampling drafters"
    slots = data["slot_acceptance"][f"{kind}-sampling"]
    assert slots["reached"][0] > 0 and all(0 <= x <= 1 for x in slots["overlap"] + slots["accepted"]), \
        f"per-slot acceptance is not a set of rates: {slots}"
    main_row = next(r for r in data["rows"] if r["name"] == f"{kind} greedy B={B}")
    assert data["ceiling"] == main_row["ceiling"] >= main_row["speedup"], \
        "the printed ceiling is not the row's bound"
    headline = {m.name for m in bench.headline_methods(drafter, drafter)}
    for r in data["rows"]:
        priced = r["name"] in headline and not r["name"].startswith("plain")
        assert (r["predicted"] is not None and r["predicted"] > 0) == priced, \
            f"{r['name']}: predicted {r['predicted']}; the headline's speculative rows are predicted from " \
            "the calibration, the rows it did not time (other drafters, trees, prompt lookup) are not"


def test_bench_cli_exits_1_with_a_clear_message_when_checkpoints_are_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path / "nothing")])
    assert e.value.code == 1 and "no run folder" in capsys.readouterr().err, \
        "missing checkpoints: no clear error"


def test_bench_baseline_rows_are_greedy_and_capped_at_each_drafters_block_size(setup):
    from nanodflash.tools.baselines import ARDrafter, NoFeatureDrafter
    target, drafter, _, _ = setup
    extra = {"ar": ARDrafter(drafter.config, target), "nofeat": NoFeatureDrafter(drafter.config, target)}
    methods = bench.default_methods(drafter, extra)
    B = drafter.config.block_size                          # 8 in smoke mode: ar k=15 does not fit
    names = [m.name for m in methods if m.temperature == 0]
    assert names[-5:-2] == ["ar k=3", "ar k=7", f"dflash no-features B={B}"], f"baseline rows: {names}"
    default = [m.name for m in bench.default_methods(drafter)]
    assert [m.name for m in methods] == default[:len(names) - 5] + names[-5:-2] + default[len(names) - 5:], \
        "default rows moved"


def test_bench_ceiling_is_at_least_the_measured_speedup_on_every_speculative_row(setup):
    # A bound by construction, not by luck: inside one timed run the loop's draft and verify timers cover
    # disjoint stretches of it, so tokens / wall <= tokens / (draft + verify) for every prompt; sums over
    # the prompts keep the inequality, and so does the median over repetitions (order statistics are
    # monotone); ceiling and speedup divide by the same plain tok/s. Isolated step costs would leave the
    # loop's overhead out.
    for name, r in setup[3].items():
        if name.startswith("plain"):
            assert r["ceiling"] is None, f"{name}: plain decoding has no draft/verify split, no ceiling"
            continue
        assert r["bound"]["tokens_per_s"] >= r["tokens_per_s"], f"{name}: bound {r['bound']} < tok/s"
        assert r["ceiling"] >= r["speedup"], \
            f"{name}: ceiling {r['ceiling']:.3f}x < measured {r['speedup']:.3f}x"
        b, plain = r["bound"], plain_row(setup[3], r["temperature"])
        formula = b["tau"] * (1 / plain["tokens_per_s"]) / (b["draft_s"] + b["verify_s"])
        assert math.isclose(r["ceiling"], formula), f"{name}: printed factors {b} do not give the ceiling"


def test_bench_rows_are_named_by_the_main_drafters_kind_and_extra_dflash_style_drafters_get_greedy_rows(
        target):
    main, other = tiny_drafter(target, block_size=16), tiny_drafter(target, block_size=8)
    main.kind = "dflash2"
    names = [m.name for m in bench.default_methods(main, {"dflash": other})]
    sampled = lambda B: [f"{v} B={b}" for b in (4, B, "auto") for v in ("match", "rejection")]   # noqa: E731
    trees = ["sampled tree N=4", "sampled tree N=8"]
    assert [n for n in names if n.startswith("dflash2")] == \
        ["dflash2 greedy B=4", "dflash2 greedy B=8", "dflash2 greedy B=16", "dflash2 greedy B=auto"] + \
        [f"dflash2 T=1 {s}" for s in sampled(16) + trees] + \
        [f"dflash2 T=0.7 p=0.95 {s}" for s in sampled(16) + trees], f"main rows: {names}"
    assert [n for n in names if n.startswith("dflash ")] == \
        ["dflash greedy B=8"] + [f"dflash T=0.7 p=0.95 {s}" for s in sampled(8)], \
        f"extra rows: greedy B=8/16 capped at 8, then the sampled rows with each verifier: {names}"
    assert "prompt lookup k=10" in names, "prompt lookup rows need no training: always present"
    with pytest.raises(ValueError, match="main drafter's kind"):
        bench.default_methods(main, {"dflash2": other})


# ----------------------------------------------------------------------------- the oracle selector

@pytest.fixture(scope="module")
def oracle_setup():
    """A peaked tiny target, an untrained drafter, prompts and their plain greedy outputs."""
    target = tiny_target(seed=4, head_scale=8.0)
    drafter = tiny_drafter(target, seed=5, block_size=8)
    prompts = [[3, 14, 15, 9, 26], [1, 2, 3, 4, 5, 6, 7], [40, 41]]
    return target, drafter, prompts, [generate(target, p, 30) for p in prompts]


def test_oracle_selector_tau_is_at_least_the_drafters_greedy_tau(oracle_setup):
    # From the same context a perfect selector accepts at least as many drafts as the argmax: wherever the
    # argmax is right, the true token is a candidate and gets drafted. (Over a run, step boundaries differ,
    # so this is the claim on these seeds, not a theorem.)
    target, drafter, prompts, refs = oracle_setup
    taus = {}
    for b in (4, 8):
        real = [speculative_generate(target, drafter, p, 30, block_size=b)[1] for p in prompts]
        lengths = [a for s in real for a in s.acceptance_lengths]
        greedy_tau = sum(lengths) / len(lengths)
        taus[b] = (greedy_tau, lost_tau.oracle_selector_tau(drafter, prompts, refs, b, top_k=16))
        assert taus[b][1] >= taus[b][0], \
            f"B={b}: oracle tau {taus[b][1]:.2f} < the drafter's greedy tau {taus[b][0]:.2f}"
    assert taus[8][1] > taus[8][0], f"the top-16 oracle never helped: {taus} (the test exercises nothing)"


def test_oracle_selector_with_top_1_is_the_drafter_itself(oracle_setup):
    target, drafter, prompts, refs = oracle_setup
    runs = [speculative_generate(target, drafter, p, 30, block_size=8)[1] for p in prompts]
    lengths = [a for stats in runs for a in stats.acceptance_lengths]
    oracle = lost_tau.oracle_selector_stats(drafter, prompts, refs, 8, top_k=1)
    assert oracle["acceptance_lengths"] == lengths, \
        "a top-1 'selector' must draft exactly the drafter's argmax"


def test_oracle_selector_with_top_k_the_vocabulary_drafts_everything_right(oracle_setup):
    target, drafter, prompts, refs = oracle_setup
    V, B, new = target.config.vocab_size, 8, 30
    oracle = lost_tau.oracle_selector_stats(drafter, prompts, refs, B, top_k=V)
    assert oracle["candidate_recall"] == 1.0, \
        f"every true token is among all V candidates: {oracle['candidate_recall']}"
    expected = []
    for _ in prompts:                   # after the prefill's token, full blocks until the end of generation
        done = 1
        while done < new:
            expected.append(min(B, new - done))
            done += expected[-1]
    assert oracle["acceptance_lengths"] == expected, \
        f"acceptance lengths {oracle['acceptance_lengths']} != {expected}"


def test_oracle_selector_refuses_a_reference_that_is_not_the_greedy_output(oracle_setup):
    target, drafter, prompts, refs = oracle_setup
    wrong = [refs[0][:5] + [(refs[0][5] + 1) % target.config.vocab_size] + refs[0][6:]]
    with pytest.raises(ValueError, match="not the plain greedy output"):
        lost_tau.oracle_selector_stats(drafter, prompts[:1], wrong, 8)


def test_bench_greedy_only_on_long_generations_reports_tau_by_position_band_and_late_step_costs(
        smoke_out, tmp_path, capsys):
    path = tmp_path / "long.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "120", "--greedy_only",
                "--repeats", "1",
                "--json", str(path)])
    out = capsys.readouterr().out
    rows = json.load(open(path))["rows"]
    assert all(r["temperature"] == 0 for r in rows) and not any("lookup" in r["name"] for r in rows), \
        f"--greedy_only should keep plain and the drafter's greedy rows only, got {[r['name'] for r in rows]}"
    assert "tau by position: 1-96 " in out and "97-240 " in out, f"no τ by position band in:\n{out}"
    spec = [r for r in rows if r["name"] != "plain greedy"]
    assert all(r["bands"][0][:2] == [0, 96] and r["bands"][1][2] is not None for r in spec), \
        "every speculative row should carry τ per band, with steps past token 96"
    assert next(r for r in rows if r["name"] == "plain greedy")["bands"] is None, \
        "plain decoding has no steps"
    assert "at context " in out, "the step costs late in a long generation are missing"


def test_bench_sampled_only_runs_the_sampling_drafters_sampled_rows_and_trees(smoke_out, tmp_path, capsys):
    path = tmp_path / "sampled.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--sampled_only",
                "--repeats", "1",
                "--json", str(path)])
    names = [r["name"] for r in json.load(open(path))["rows"]]
    kind = bench.kind_of(nanodflash.load(str(smoke_out))[2])
    assert names[0] == "plain T=1" and "plain T=0.7 p=0.95" in names, f"the plain sampled rows: {names}"
    assert all(n.startswith("plain") or n.startswith(f"{kind}-sampling ") for n in names), \
        f"--sampled_only keeps the sampling drafter's rows (drafter_sampling.pt) only: {names}"
    assert f"{kind}-sampling T=0.7 p=0.95 sampled tree N=8" in names, f"no sampled-tree row: {names}"
    with pytest.raises(SystemExit):
        bench.main(["--out", str(smoke_out), "--greedy_only", "--sampled_only"])
    assert "exclude each other" in capsys.readouterr().err


def test_every_benchmark_runs_on_third_party_prompts_when_asked(smoke_out, tmp_path, capsys):
    path = tmp_path / "third_party.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "8", "--greedy_only",
                "--repeats", "1",
                "--prompts", "third_party", "--json", str(path)])
    assert "2 third-party prompts (numpy source)" in capsys.readouterr().out, "the header names the set"
    assert json.load(open(path))["prompts"] == "third_party", "the JSON records the prompt set"
    bench_batch.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "8", "--batch", "2",
                      "--prompts", "third_party"])
    bench_tree.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "8", "--sizes", "8",
                     "--repeats", "1", "--prompts", "third_party"])
    out = capsys.readouterr().out
    assert out.count("2 third-party prompts (numpy source)") == 2, f"bench_batch and bench_tree:\n{out}"


def test_bench_batch_samples_with_the_sampling_drafter_at_small_blocks_and_its_sampled_costs(
        smoke_out, tmp_path, capsys):
    path = tmp_path / "batch.json"
    bench_batch.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "8", "--batch", "1,2",
                      "--temperature", "0.7", "--top_p", "0.95", "--json", str(path)])
    out = capsys.readouterr().out
    assert "drafter_sampling.pt" in out and "T=0.7 top-p 0.95" in out, f"the header names what ran:\n{out}"
    assert 'step costs of block_size="auto", sampled' in out, f"the sampled cost table:\n{out}"
    assert "greedy outputs identical" not in out, "sampled outputs are not compared with plain's"
    rows = json.load(open(path))["batch"]
    assert list(rows["2"]) == ["plain", "dflash B=2", "dflash B=4", "dflash B=8", "dflash B=auto"], \
        f"the sampled block sizes: {list(rows['2'])}"
    assert {"batch-1 loop B=4", "batch-1 loop B=auto"} <= set(rows["1"]), f"batch 1's loop: {list(rows['1'])}"
    runs = bench_batch.MIN_RUNS                          # one batch of both prompts, run MIN_RUNS times
    assert all(a["matches_plain"] is None and a["tokens"] == runs * 2 * 8 for a in rows["2"].values()), \
        f"every method samples every token of both prompts in every pass: {rows['2']}"
    auto = rows["2"]["dflash B=auto"]
    assert rows["2"]["plain"]["pass_ratios"] == [1.0] * runs and len(auto["pass_ratios"]) == runs, \
        f"each pass's ratio to plain: {auto}"
    assert all(a["predicted"] > 0 for name, a in rows["2"].items() if name.startswith("dflash")), \
        f"every batched row carries the speedup its calibration predicts from its own steps: {rows['2']}"
    assert "measured [least-most pass] / predicted by the calibration" in out, f"the predictions:\n{out}"


def test_bench_batch_passes_gives_every_batch_size_at_least_that_many_passes(smoke_out, tmp_path, capsys):
    """Where the batches already make MIN_RUNS runs in one pass, --passes 2 runs them twice, so the row's
    spread is measured."""
    path = tmp_path / "batch.json"
    bench_batch.main(["--out", str(smoke_out), "--n_prompts", "8", "--max_new_tokens", "4", "--batch", "2",
                      "--passes", "2", "--json", str(path)])
    rows = json.load(open(path))["batch"]["2"]
    assert all(len(a["pass_ratios"]) == 2 for a in rows.values()), f"each method in two passes: {rows}"
    assert all(a["tokens"] == 2 * 8 * 4 for a in rows.values()), f"both passes decode every prompt: {rows}"
    out = capsys.readouterr().out
    assert "in 2 passes]" in out, "auto's line gives the spread of its passes"
    best = rows["dflash B=auto"]["over_best"]
    assert best["passes"] == [2] and best["best"] in ("dflash B=4", "dflash B=8", "dflash B=16"), \
        f"auto against the block fastest in pass 1, in the pass after it: {best}"
    assert "the fastest in pass 1" in out and "in pass 2" in out, f"auto's line says how it chose:\n{out}"


def test_bench_compares_drafters_of_other_runs_on_the_same_target_by_folder_name(smoke_out, tmp_path, capsys):
    _, _, drafter = nanodflash.load(str(smoke_out))
    other = tmp_path / "recipe_b"
    other.mkdir()
    shutil.copy(smoke_out / "drafter.pt", other / "drafter.pt")       # the same drafter, as another recipe's
    bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--repeats", "1",
                "--drafters", str(other)])
    out = capsys.readouterr().out
    B = drafter.config.block_size
    for row in (f"recipe_b greedy B={B}", "recipe_b T=0.7 p=0.95 rejection B=4",
                "recipe_b T=0.7 p=0.95 match B=auto"):
        assert row in out, f"--drafters: no row {row!r} in\n{out}"
    taken = tmp_path / bench.kind_of(drafter)
    taken.mkdir()
    shutil.copy(smoke_out / "drafter.pt", taken / "drafter.pt")
    with pytest.raises(SystemExit):
        bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8",
                    "--drafters", str(taken)])
    assert "is taken; rename the folder" in capsys.readouterr().err, \
        "a folder named like the main drafter's kind"


def test_policy_costs_recover_the_step_and_slot_costs_the_rows_were_made_with():
    plain_s, step_s, slot_s = 0.002, 0.0034, 0.0001     # seconds: plain token, 1-draft step, one more slot
    row = lambda b, steps: dict(steps=steps, draft_s=0.3 * steps * (step_s + slot_s * (b - 2)),   # noqa: E731
                                verify_s=0.7 * steps * (step_s + slot_s * (b - 2)))
    rows = {"plain greedy": dict(tokens_per_s=1 / plain_s), "dflash2 greedy B=4": row(4, 50),
            "dflash2 greedy B=16": row(16, 20)}
    c = bench_table.policy_costs(rows, "dflash2", 16)
    assert c["step_cost"] == pytest.approx(step_s / plain_s), f"policy costs {c}: step {step_s / plain_s:.3f}"
    assert c["slot_cost"] == pytest.approx(slot_s / step_s), f"policy costs {c}: slot {slot_s / step_s:.4f}"
    assert bench_table.policy_costs(rows, "dflash2", 4) is None, \
        "B <= 4 leaves nothing to measure a slot by"


def test_bench_rows_carry_the_repetition_of_their_own_output(setup):
    rows = setup[3]
    for name, r in rows.items():
        assert 0 <= r["repetition"] <= 1, f"{name}: repetition {r['repetition']} is not a share"
        assert len(r["by_prompt"]) == N_PROMPTS, f"{name}: one record per prompt"
        if r["temperature"] == 0:          # greedy outputs equal plain greedy's, and so does their repetition
            assert r["repetition"] == rows["plain greedy"]["repetition"], \
                f"{name}: greedy output's repetition differs from plain greedy's"


def test_terciles_sort_prompts_by_plain_greedy_repetition_and_count_tau_as_the_row_does():
    plain = dict(name="plain greedy", temperature=0.0, by_prompt=[
        dict(tokens=9, steps=8, rate=10.0, repetition=r) for r in (0.9, 0.1, 0.5, 0.3, 0.7, 0.2)])
    spec = dict(name="dflash2 greedy B=8", temperature=0.0, by_prompt=[
        dict(tokens=9, steps=s, rate=10.0 * (9 / s) / 2, repetition=0.0) for s in (1, 8, 4, 4, 2, 8)])
    sampled = dict(name="plain T=1", temperature=1.0, by_prompt=[])
    measure.tau_by_repetition([plain, spec, sampled])
    assert "terciles" not in sampled, "a sampled row was split by greedy repetition"
    t = spec["terciles"]
    assert [round(x["repetition"], 3) for x in t] == [0.15, 0.4, 0.8], f"not sorted by repetition: {t}"
    # each group: 2 prompts x 9 tokens, the prefill's 2 excluded, over the group's steps
    assert all(math.isclose(x["tau"], want) for x, want in zip(t, [16 / 16, 16 / 8, 16 / 3])), \
        f"tau per tercile: {t}"
    seconds = 9 / (45 / 2) + 9 / (45 / 1)                    # the group's two prompts at 22.5 and 45 tok/s
    assert math.isclose(t[2]["speedup"], 18 / seconds / 10.0), f"speedup: the group's tokens over its " \
        f"seconds, over plain greedy's (10 tok/s): {t}"
    assert plain["terciles"][0]["tau"] == 1.0, "plain greedy's own tercile tau must be one token per step"


def test_bench_runs_the_headline_rows_by_default_and_every_row_with_all_rows(smoke_out, tmp_path, capsys):
    _, _, drafter = nanodflash.load(str(smoke_out))
    path = tmp_path / "bench.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--json", str(path)])
    out = capsys.readouterr().out
    kind, B = bench.kind_of(drafter), min(16, drafter.config.block_size)
    rows = json.loads(path.read_text())["rows"]
    names = [r["name"] for r in rows]
    sampled = f"{kind}-sampling T=0.7 p=0.95 rejection"
    peers = ([bench_peers.HF_ROW, f"{kind} {bench_peers.OFFICIAL_ROW.format(B=B)}"] if bench_peers.available()
             else [])
    assert names == ["plain greedy", f"{kind} greedy B={B}", f"{kind} greedy B=auto", "plain T=0.7 p=0.95",
                     f"{sampled} B=4", f"{sampled} B=auto", *peers], \
        f"the default rows should answer the greedy and the sampled question, and the peers: {names}"
    for r in rows[len(names) - len(peers):]:
        own = rows[0 if "plain" in r["name"] else 1]                 # ours of the same kind
        assert r["matches_plain"] is True and r["threads"] == own["threads"], \
            f"{r['name']}: a peer's output must equal plain greedy's, at its kind's thread count"
    assert ("nanodflash over the peers" in out) == bool(peers), "the peers' line: our speed over each"
    assert "oracle-selector tau" not in out and f"per-slot acceptance of '{kind} T=0.7" not in out, \
        "the oracle and the main drafter's slot section belong to --all_rows"
    assert f"per-slot acceptance of '{kind}-sampling T=0.7 p=0.95 rejection'" in out, out
    every = [m.name for m in bench.default_methods(drafter, sampler=drafter)]
    assert set(names) - set(peers) < set(every), "each headline row is one of --all_rows' rows, by name"


def test_the_compiled_rows_are_the_headline_dflash_rows_each_named_compiled(smoke_out):
    _, _, drafter = nanodflash.load(str(smoke_out))
    _, _, sampler = nanodflash.load(str(smoke_out), sampling=True)
    headline = [m.name for m in bench.headline_methods(drafter, sampler) if not m.name.startswith("plain")]
    compiled = [m.name for m in bench_methods.compiled_methods(drafter, sampler)]
    assert compiled == [f"{name} compiled" for name in headline], f"{compiled} are not twins of {headline}"
    greedy = [m.temperature for m in bench_methods.compiled_methods(drafter, sampler, sampled=False)]
    assert greedy == [0.0, 0.0], f"greedy only should keep the greedy twins (B and auto), got {greedy}"


def test_a_rows_spread_is_over_each_prompts_own_ratio_and_its_step_cost_is_in_plain_steps():
    plain = dict(by_prompt=[dict(rate=r) for r in (100.0, 200.0, 50.0)], seconds=3.0, tokens=300, bound=None)
    spec = dict(by_prompt=[dict(rate=r) for r in (150.0, 200.0, 100.0)], draft_s=0.5, verify_s=1.5, steps=100,
                bound=dict(tokens_per_s=1.0))
    bench_table.add_spread_and_step_cost(spec, plain)
    assert spec["by_prompt_speedup"] == [1.25, 1.5, 1.75], \
        f"per-prompt ratios 1.5, 1.0, 2.0 have quartiles 1.25 / 1.5 / 1.75, got {spec['by_prompt_speedup']}"
    assert spec["step_cost"] == pytest.approx([0.5, 1.5]), \
        f"5 ms of draft and 15 ms of verify a step against 10 ms a plain token: {spec['step_cost']}"
    bench_table.add_spread_and_step_cost(plain, plain)
    assert plain["step_cost"] is None and plain["by_prompt_speedup"] == [1.0, 1.0, 1.0]
    idle = dict(spec, steps=0)                                               # a run that took no step
    bench_table.add_spread_and_step_cost(idle, plain)
    assert idle["step_cost"] is None, "a row without steps has no step cost (and must not divide by 0)"


def test_each_row_decodes_at_its_own_thread_count_and_the_count_is_put_back(setup):
    target, drafter, prompts, _ = setup
    seen = {}

    def recording(name):
        def run(target, drafter, prompt, max_new_tokens, generator):
            seen.setdefault(name, set()).add(torch.get_num_threads())
            return [1, 2], None
        return run
    methods = [bench.Method("plain greedy", 0.0, recording("plain greedy"), threads=1),
               bench.Method("other", 0.0, recording("other"), threads=2)]
    before = torch.get_num_threads()
    rows = bench.run_benchmark(target, drafter, prompts[:2], methods, max_new_tokens=2, warmup=False,
                               repeats=2)
    assert seen == {"plain greedy": {1}, "other": {2}}, f"threads each row ran at: {seen}"
    assert torch.get_num_threads() == before, "the bench must put the thread count back"
    assert [r["threads"] for r in rows] == [1, 2] and all(len(r["speedup_spread"]) == 2 for r in rows)
