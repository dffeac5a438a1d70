"""nanodflash.bench: its numbers are internally consistent and agree with independent runs of the loop."""

import json
import math

import pytest

import nanodflash
from nanodflash import bench
from nanodflash.speculative import generate, speculative_generate

N_PROMPTS, NEW_TOKENS = 2, 20


@pytest.fixture(scope="module")
def setup(smoke_out):
    tok, target, drafter = nanodflash.load(str(smoke_out))
    prompts = bench.val_prompts(tok, N_PROMPTS, bench.PROMPT_LEN, seed=0)
    rows = bench.run_benchmark(target, drafter, prompts, max_new_tokens=NEW_TOKENS, seed=0)
    return target, drafter, prompts, {r["name"]: r for r in rows}


def test_bench_has_one_row_per_method_with_block_sizes_capped_at_the_drafters(setup):
    _, drafter, _, rows = setup
    B = drafter.config.block_size                          # 8 in smoke mode: 4, 8 (16 capped to 8)
    expected = ["plain greedy"] + [f"dflash greedy B={b}" for b in sorted({min(b, B) for b in (4, 8, 16)})] + \
               ["plain T=1", f"dflash T=1 match B={B}", f"dflash T=1 rejection B={B}"]
    assert list(rows) == expected, f"rows {list(rows)} != {expected}"


def test_bench_tau_equals_tokens_emitted_by_steps_over_verify_steps(setup):
    for name, r in setup[3].items():
        assert r["steps"] > 0, f"{name}: no verify step was counted"
        assert math.isclose(r["tau"], (r["tokens"] - r["prompts"]) / r["steps"]), \
            f"{name}: tau {r['tau']} != (tokens - prefill tokens) / steps"


def test_bench_forward_passes_are_prefill_plus_one_per_step(setup):
    for name, r in setup[3].items():
        assert r["forwards"] == r["prompts"] + r["steps"], \
            f"{name}: hook counted {r['forwards']} target forwards, the loop says {r['prompts']} + {r['steps']}"
        assert math.isclose(r["forwards_per_token"], r["forwards"] / r["tokens"]), f"{name}: forwards/token"
        # ≈ 1/τ up to the prefill: (P + steps) / (P + τ·steps)
        approx = (r["prompts"] + r["steps"]) / (r["prompts"] + r["tau"] * r["steps"])
        assert math.isclose(r["forwards_per_token"], approx), f"{name}: forwards/token is not 1/τ up to the prefill"


def test_bench_plain_rows_have_tau_1_and_one_forward_per_token(setup):
    for name in ("plain greedy", "plain T=1"):
        r = setup[3][name]
        assert r["tau"] == 1 and r["forwards_per_token"] == 1, f"{name}: tau {r['tau']}, fwd/token {r['forwards_per_token']}"
        assert r["speedup"] == 1, f"{name} is its own baseline, speedup {r['speedup']}"


def test_bench_speedup_is_tokens_per_s_over_plain_at_the_same_temperature(setup):
    rows = setup[3]
    for name, r in rows.items():
        base = rows["plain greedy" if r["temperature"] == 0 else "plain T=1"]
        assert math.isclose(r["speedup"], r["tokens_per_s"] / base["tokens_per_s"]), f"{name}: wrong baseline"
        assert r["tokens_per_s"] > 0 and r["seconds"] > 0, f"{name}: no time measured"


def test_bench_greedy_rows_agree_with_independent_runs_and_with_plain_decoding(setup):
    target, drafter, prompts, rows = setup
    for name, r in rows.items():
        if r["temperature"] != 0:
            continue
        assert r["matches_plain"] is True, f"{name}: greedy output differed from plain greedy decoding"
        if name.startswith("dflash"):
            b = int(name.split("B=")[1])
            runs = [speculative_generate(target, drafter, p, NEW_TOKENS, block_size=b) for p in prompts]
            assert r["tokens"] == sum(len(t) for t, _ in runs), f"{name}: token count differs from a fresh run"
            assert r["steps"] == sum(len(s.acceptance_lengths) for _, s in runs), f"{name}: step count differs"
        else:
            assert r["tokens"] == sum(len(generate(target, p, NEW_TOKENS)) for p in prompts), f"{name}: tokens"


def test_bench_a_new_method_is_one_more_list_entry(setup):
    target, drafter, prompts, _ = setup
    methods = bench.default_methods(drafter)[:1] + [bench.Method("dflash greedy B=2", 0.0, bench.dflash_method(2))]
    rows = bench.run_benchmark(target, drafter, prompts[:1], methods, max_new_tokens=8, warmup=False)
    assert [r["name"] for r in rows] == ["plain greedy", "dflash greedy B=2"], "custom method row missing"
    assert rows[1]["matches_plain"] and 1 <= rows[1]["tau"] <= 2, f"B=2 row is off: {rows[1]}"


def test_bench_step_costs_are_measured_at_the_requested_block_size(setup):
    target, drafter, prompts, _ = setup
    c = bench.step_costs(target, drafter, prompts[0], block_size=16, n=3)
    assert c["block_size"] == min(16, drafter.config.block_size), f"block size not capped: {c}"
    assert all(c[k] > 0 for k in ("draft_s", "verify_s", "plain_step_s")), f"a cost was not measured: {c}"
    assert c["context_len"] == len(prompts[0]) + bench.MAX_NEW_TOKENS // 2, "step costs measured at the wrong context"


def test_bench_cli_prints_the_table_and_writes_json(smoke_out, tmp_path, capsys):
    path = tmp_path / "bench.json"
    bench.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--json", str(path)])
    out = capsys.readouterr().out
    for needed in ("tok/s = median over prompts", "greedy outputs identical to plain greedy on all 1 prompts: yes",
                   "ceiling: speedup <= tau * t_plain / (t_draft + t_verify)"):
        assert needed in out, f"output lacks {needed!r}:\n{out}"
    data = json.loads(path.read_text())
    assert [r["name"] for r in data["rows"]][0] == "plain greedy" and data["step_costs"]["draft_s"] > 0, "bad JSON"


def test_bench_cli_exits_1_with_a_clear_message_when_checkpoints_are_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path / "nothing")])
    assert e.value.code == 1 and "not found" in capsys.readouterr().err, "missing checkpoints: no clear error"


def test_bench_baseline_rows_are_greedy_and_capped_at_each_drafters_block_size(setup):
    from nanodflash.baselines import ARDrafter, NoFeatureDrafter
    target, drafter, _, _ = setup
    extra = {"ar": ARDrafter(drafter.config, target), "nofeat": NoFeatureDrafter(drafter.config, target)}
    methods = bench.default_methods(drafter, extra)
    B = drafter.config.block_size                          # 8 in smoke mode: ar k=15 does not fit
    names = [m.name for m in methods if m.temperature == 0]
    assert names[-3:] == ["ar k=3", "ar k=7", f"dflash no-features B={B}"], f"baseline rows: {names}"
    assert [m.name for m in methods] == [m.name for m in bench.default_methods(drafter)][:len(names) - 3] + \
        names[-3:] + [m.name for m in bench.default_methods(drafter) if m.temperature != 0], "default rows moved"
