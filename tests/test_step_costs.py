"""block_size="auto" weighs drafts by a table of step costs measured once per machine (tools/calibrate.py,
kept in the run folder's costs.json) or fixed, never by a clock while decoding: the same seeded command on the
same run folder gives the same tokens and block sizes in every process, and a copied table reproduces them.
The costs choose block sizes only: greedy output never depends on them."""

import json
import os
import shutil
import subprocess
import sys
from functools import partial

import pytest
import torch

from helpers import ROOT, tiny_drafter
from nanodflash.ext.batch import batch_costs
from nanodflash.ext.block_policy import auto
from nanodflash.ext.step_costs import (
    cost_key,
    costs_for,
    default_costs,
    fix_costs,
    linear_costs,
    plain_token_prices,
    predicted_batch_speedup,
    predicted_speedup,
    use_table,
)
from nanodflash.speculative import generate, speculative_generate
from nanodflash.store.checkpoint import fingerprint
from nanodflash.store.run_folder import COSTS, read_costs, write_costs
from nanodflash.tools.calibrate import SAME_SPEED, calibrate, relative_costs
from nanodflash.tools.cli import decode_threads, using_threads

PROMPT = [3, 14, 15, 9, 26, 5]

# decode(folder) in a new process, printed as JSON
DECODE = """
import json, sys, torch
sys.path.insert(0, "tests")
torch.set_num_threads(1)
from test_step_costs import decode
from nanodflash import load, speculative_generate
from nanodflash.ext.block_policy import auto
models = load(sys.argv[1], sampling=True)
print(json.dumps(decode(sys.argv[1], models)))
tok, target, drafter = models                     # a second auto run of the loaded drafter: still one note
speculative_generate(target, drafter, tok.encode_ordinary("x = 1"), 8, block_size=auto, temperature=0.7)
"""


def decode(folder, models=None):
    """DECODE's generation, in this process (on `models`, or on the folder's, loaded now)."""
    import nanodflash
    tok, target, drafter = models or nanodflash.load(str(folder), sampling=True)
    prompt = tok.encode_ordinary("def f(x):\n    return")
    out, st = speculative_generate(target, drafter, prompt, 40, block_size=auto, temperature=0.7,
                                   top_p=0.95, generator=torch.Generator().manual_seed(7))
    return dict(tokens=out, sizes=st.block_sizes)


def with_costs(folder, step_cost, slot_cost):
    """Replace the tables of folder's costs.json (train_tiny.py timed them on a busy machine, in 3 calls: any
    shape) by linear_costs(B, step_cost, slot_cost) at every row count, so a test knows what auto weighs."""
    entry = read_costs(folder)[0]
    write_costs(folder, dict(entry, costs={kind: {r: linear_costs(len(t), step_cost, slot_cost)
                                                  for r, t in tables.items()}
                                           for kind, tables in entry["costs"].items()}))


def decode_in_a_new_process(folder):
    r = subprocess.run([sys.executable, "-c", DECODE, str(folder)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, f"the decoding process failed:\n{r.stderr}"
    return json.loads(r.stdout.splitlines()[0]), r.stderr


def test_calibrate_tries_no_more_threads_than_max_threads(smoke_out, tmp_path, capsys, monkeypatch):
    from nanodflash.tools import calibrate as calibrate_tool
    folder = tmp_path / "run"
    shutil.copytree(smoke_out, folder)
    # the thread choice comes first and alone decides the key; one row count of tables is enough after it
    monkeypatch.setattr(calibrate_tool, "calibrate", partial(calibrate_tool.calibrate, rows=(1,)))
    calibrate_tool.main(["--out", str(folder), "--calls", "3", "--max_threads", "1"])
    entry = read_costs(folder)[-1]
    assert set(entry["threads"]["by_count"]) == {"1"} and entry["key"]["threads"] == 1, \
        f"--max_threads 1 times one thread only (other jobs on the cores): {entry['threads']}"
    assert "wrote" in capsys.readouterr().out


def test_relative_costs_divide_by_a_step_without_drafts_and_interpolate_between_timed_sizes():
    assert relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5) == [1.0, 1.25, 1.375, 1.5, 1.625], \
        "t = 3 lies halfway between t = 2 and 4, t = 5 on the last segment extended"


def test_calibrate_times_every_row_count_and_costs_json_keeps_one_table_per_machine_key(target, tmp_path):
    drafter = tiny_drafter(target, seed=11, block_size=8)
    entry = calibrate(target, drafter, n_calls=3, rows=(1, 2), log=lambda line: None)
    with using_threads(entry["threads"]["speculative"]):    # the count it chose: 1 or 2, by its timing
        assert entry["key"] == cost_key(target) and entry["block_size"] == 8, entry["key"]
    assert entry["target"] == fingerprint(target), \
        "the table must name the target it timed: train_tiny.py keeps a table of its own target only"
    tables = entry["costs"]
    for table in [tables[kind][rows] for kind in ("greedy", "sampled") for rows in ("1", "2")]:
        assert len(table) == 8 and table[0] == 1.0 and all(c > 0 for c in table), \
            f"cost(n) for n = 0..7 in steps without drafts, cost(0) = 1: got {table}"
    threads = entry["threads"]
    assert set(threads["by_count"]) == {str(n) for n in range(1, min(os.cpu_count(), 8) + 1)}, \
        f"every thread count up to the machine's CPUs is timed: {threads}"
    for kind in ("plain", "speculative"):
        fastest = min(c[kind] for c in threads["by_count"].values())
        assert threads["by_count"][str(threads[kind])][kind] <= (1 + SAME_SPEED) * fastest, \
            f"{kind}: {threads[kind]} threads chosen, not within SAME_SPEED of the fastest count: {threads}"
    assert entry["key"]["threads"] == threads["speculative"], "the tables are timed at the speculative count"
    for kind in ("greedy", "sampled"):
        steps = entry["step_seconds"][kind]
        assert len(steps) == 8 and all(s > 0 for s in steps), f"{kind}: a step's seconds at t = 1..8: {steps}"
        assert tables[kind]["1"] == pytest.approx([s / steps[0] for s in steps]), \
            "batch 1's costs are its step seconds over a step without drafts: one table prices both"
        plain = entry["plain_seconds"][kind]
        assert plain["token"] > 0 and plain["request"] > 0 and entry["request_seconds"][kind] > 0, entry
        batched = entry["batch_step_seconds"][kind]
        assert set(batched) == {"1", "2"} and all(len(t) == 8 and min(t) > 0 for t in batched.values()), \
            f"{kind}: a batched step's seconds at t = 1..8 at every row count, which price a batch: {entry}"
        assert tables[kind]["2"] == pytest.approx([s / batched["2"][0] for s in batched["2"]]), \
            "from two rows on, the costs are the batched step's seconds over a plain batched step's"
    starts = entry["batch_start_seconds"]
    assert set(starts) == {"1", "2"} and all(min(s.values()) > 0 for s in starts.values()), \
        f"a batched generation's start (plain and speculative) at every row count: {starts}"
    write_costs(tmp_path, entry)
    write_costs(tmp_path, entry)
    other = dict(entry, key=dict(entry["key"], threads=entry["key"]["threads"] + 1))
    write_costs(tmp_path, other)
    assert [e["key"] for e in read_costs(tmp_path)] == [entry["key"], other["key"]], \
        "a table replaces the one of its own machine key and sits beside another key's"


def test_the_same_seeded_command_gives_the_same_tokens_and_block_sizes_in_two_processes(smoke_out, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(smoke_out, folder)
    assert read_costs(folder), "train_tiny.py should have timed the step costs into costs.json"
    with_costs(folder, 1.05, 0.0)                                                 # drafting pays
    first, err = decode_in_a_new_process(folder)
    assert decode(folder) == first, \
        "the same seeded auto run differed between a new process and this one: a decision read a clock"
    assert len(set(first["sizes"])) > 1 or first["sizes"][0] > 1, f"auto never drafted: {first['sizes']}"
    assert "no cost table" not in err, f"a folder with a table must not fall back to the default:\n{err}"


def test_a_copied_table_reproduces_the_choices_and_another_table_changes_them(smoke_out, tmp_path):
    runs = {}
    for name in ("a", "b"):
        shutil.copytree(smoke_out, tmp_path / name)
    with_costs(tmp_path / "a", 1.05, 0.0)                                         # drafting pays
    with_costs(tmp_path / "b", 3.0, 0.5)                                          # drafting never pays
    shutil.copytree(tmp_path / "a", tmp_path / "c", ignore=shutil.ignore_patterns(COSTS))
    shutil.copy(tmp_path / "a" / COSTS, tmp_path / "c" / COSTS)             # a table copied to a new folder
    for name in ("a", "b", "c"):
        runs[name] = decode(tmp_path / name)
    assert runs["c"] == runs["a"], "a copied table must reproduce the tokens and block sizes exactly"
    assert set(runs["b"]["sizes"]) == {1} and runs["b"] != runs["a"], \
        "control: with a table where drafting never pays, auto must never draft"


def test_a_folder_without_a_table_decodes_with_the_default_costs_and_says_so_once(smoke_out, tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(smoke_out, folder)
    os.remove(folder / COSTS)
    result, err = decode_in_a_new_process(folder)
    lines = [line for line in err.splitlines() if "no cost table for" in line]
    assert len(lines) == 1, f"one line, once per loaded run, should say that no table was found:\n{err}"
    assert "python -m nanodflash.tools.calibrate --out DIR" in lines[0], f"the way out is missing: {lines[0]}"
    assert decode(folder) == result, "the default costs are a table too: the same seeded run repeats"


def test_two_run_folders_with_other_tables_decode_interleaved_in_one_process_exactly_as_alone(smoke_out,
                                                                                                tmp_path):
    cheap, dear = tmp_path / "cheap", tmp_path / "dear"
    for folder, step_cost in ((cheap, 1.01), (dear, 3.0)):        # drafting pays / never pays
        shutil.copytree(smoke_out, folder)
        with_costs(folder, step_cost, 0.0)
    alone = {name: decode(folder) for name, folder in (("cheap", cheap), ("dear", dear))}
    both = {"cheap": nanodflash_load(cheap), "dear": nanodflash_load(dear)}
    for _ in range(2):                                             # interleaved: each run folder in turn
        for name, folder in (("cheap", cheap), ("dear", dear)):
            assert decode(folder, both[name]) == alone[name], \
                f"{name}: decoded beside another run folder, its auto block sizes or tokens changed"
    assert set(alone["dear"]["sizes"]) == {1} and set(alone["cheap"]["sizes"]) != {1}, \
        "control: the two tables must make auto decide differently"


def nanodflash_load(folder):
    import nanodflash
    return nanodflash.load(str(folder), sampling=True)


def test_a_cost_table_handed_to_auto_decides_its_block_sizes_and_the_output_stays_plain_greedy(target):
    drafter = tiny_drafter(target, seed=12, block_size=8)
    want = generate(target, PROMPT, 30)
    sizes = {}
    for name, costs in (("cheap", linear_costs(8, 1.01, 0.0)), ("dear", linear_costs(8, 3.0, 0.5))):
        out, stats = speculative_generate(target, drafter, PROMPT, 30, block_size=partial(auto, costs=costs))
        assert out == want, f"auto with the {name} table handed in changed the greedy output"
        sizes[name] = set(stats.block_sizes)
    assert sizes["dear"] == {1} and sizes["cheap"] != {1}, \
        f"the table handed in must decide: block sizes {sizes} (dear: never draft; cheap: draft)"


def test_a_fixed_table_replaces_the_folders_and_the_costs_drive_the_block_sizes(target):
    drafter = tiny_drafter(target, seed=12, block_size=8)
    assert costs_for(drafter) == default_costs(8), "a drafter without a folder's table takes the default"
    cheap = linear_costs(8, step_cost=1.05, slot_cost=0.0)
    fix_costs(drafter, cheap)
    assert costs_for(drafter) == cheap and batch_costs(drafter, 1) == cheap, "the fixed table stands in"

    def run():
        g = torch.Generator().manual_seed(5)
        return speculative_generate(target, drafter, PROMPT, 30, block_size=auto, temperature=1.0,
                                    generator=g)
    (out1, st1), (out2, st2) = run(), run()
    assert out1 == out2 and st1.block_sizes == st2.block_sizes, "same seed, same costs: the same run"
    fix_costs(drafter, linear_costs(8, step_cost=3.0, slot_cost=0.5))   # drafting can never pay
    _, dear = run()
    assert set(dear.block_sizes) == {1} and st1.block_sizes != dear.block_sizes, \
        "the costs must drive the block sizes (control: with steps this dear, auto never drafts)"


def test_greedy_output_does_not_depend_on_the_costs(target):
    drafter = tiny_drafter(target, seed=13, block_size=8)
    reference = generate(target, PROMPT, 30)
    for costs in (linear_costs(8, 1.0, 0.0), linear_costs(8, 1.6, 0.1), linear_costs(8, 9.0, 1.0)):
        fix_costs(drafter, costs)
        out, _ = speculative_generate(target, drafter, PROMPT, 30, block_size=auto)
        assert out == reference, f"costs {costs[:3]}...: greedy output changed with the costs"


def test_a_table_of_the_wrong_shape_is_refused(target):
    drafter = tiny_drafter(target, seed=14, block_size=8)
    with pytest.raises(ValueError, match="costs must list cost"):
        fix_costs(drafter, [1.0, 1.3])


def test_decode_threads_are_the_flags_else_the_calibrations_else_one(target):
    drafter = tiny_drafter(target, seed=11, block_size=4)
    assert decode_threads(drafter) == dict(plain=1, speculative=1), "no calibration: DECODE_THREADS"
    key = dict(cost_key(target), threads=2)
    use_table(drafter, [dict(key=key, block_size=4, threads=dict(plain=1, speculative=2, by_count={}))])
    assert decode_threads(drafter) == dict(plain=1, speculative=2), "the calibration's choice, by machine"
    assert decode_threads(drafter, override=3) == dict(plain=3, speculative=3), "--threads N: N for both"
    use_table(drafter, [dict(key=dict(key, torch="0.0"), block_size=4, threads=dict(plain=2, speculative=2))])
    assert decode_threads(drafter) == dict(plain=1, speculative=1), "another machine's choice is not ours"


def test_predicted_speedup_prices_each_step_by_its_block_and_plain_decoding_by_its_tokens():
    entry = dict(step_seconds=dict(greedy=[1.0, 1.2, 1.4, 1.6]), request_seconds=dict(greedy=3.0),
                 plain_seconds=dict(greedy=dict(token=0.5, request=2.0)))
    runs = [(9, [4, 4, 1]), (5, [2, 2, 2, 2])]           # two generations: 9 and 5 tokens
    plain = (2.0 + 8 * 0.5) + (2.0 + 4 * 0.5)
    spec = (3.0 + 1.6 + 1.6 + 1.0) + (3.0 + 4 * 1.2)
    assert predicted_speedup(entry, runs) == pytest.approx(plain / spec), \
        "plain: a request and a token per token after the first; speculative: a request and each step's price"


def test_a_batch_is_priced_until_its_slowest_row_is_done_at_the_rows_left_in_each_step():
    entry = dict(batch_step_seconds=dict(greedy={"1": [1.0, 2.0, 2.5], "2": [1.6, 2.4, 3.2],
                                                 "4": [2.0, 6.0, 8.0]}))
    lengths = [6, 2, 4]                           # plain: steps 1..5 at 3, 2, 2, 1, 1 rows left
    plain_3 = 1.6 + (2.0 - 1.6) / 2               # 3 rows: between the 2 and 4 rows measured
    plain = plain_3 + 2 * 1.6 + 2 * 1.0
    steps = [(3, 3), (2, 2), (3, 1)]               # (block size, rows in the step)
    spec = (3.2 + 8.0) / 2 + 2.4 + 2.5            # each step's own seconds, 3 rows between 2 and 4
    assert predicted_batch_speedup(entry, [(lengths, steps)]) == pytest.approx(plain / spec), \
        "each step at its own rows: a row that is done leaves the batch, the slowest row sets how many steps"
    assert predicted_batch_speedup(entry, [([5, 5], [(1, 2)] * 4)]) == pytest.approx(1.0), \
        "steps without drafts cost what plain batched steps do"
    entry["batch_start_seconds"] = {"2": dict(plain=0.5, speculative=1.5),
                                    "4": dict(plain=1.5, speculative=3.5)}
    started = predicted_batch_speedup(entry, [(lengths, steps)])
    assert started == pytest.approx((1.0 + plain) / (2.5 + spec)), \
        "each side starts its batch (3 rows: between the 2 and 4 rows measured)"


def test_the_what_if_panel_prices_a_step_in_the_tokens_plain_decoding_emits_in_its_time():
    plain = dict(greedy=dict(token=1.5, request=9.0), sampled=dict(token=2.0, request=9.0))
    entry = dict(step_seconds=dict(greedy=[3.0, 4.5, 6.0], sampled=[4.0, 5.0, 6.0]), plain_seconds=plain)
    assert plain_token_prices(entry) == [2.0, 3.0, 4.0], "greedy: each step's seconds over a plain token's"
    assert plain_token_prices(entry, sampled=True) == [2.0, 2.5, 3.0], "sampled: over a sampled plain token"
