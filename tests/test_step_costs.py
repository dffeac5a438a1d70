"""block_size="auto" weighs drafts by costs measured on the models that decode (step_costs.py): measured once
per process, or fixed; the costs choose block sizes only, and a fixed table makes a seeded run repeat."""

import pytest
import torch

from helpers import tiny_drafter
from nanodflash.batch import batch_costs
from nanodflash.block_policy import linear_costs
from nanodflash.speculative import generate, speculative_generate
from nanodflash.step_costs import fix_costs, measured_costs, relative_costs

PROMPT = [3, 14, 15, 9, 26, 5]


def test_relative_costs_divide_by_a_step_without_drafts_and_interpolate_between_timed_sizes():
    assert relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5) == [1.0, 1.25, 1.375, 1.5, 1.625], \
        "t = 3 lies halfway between t = 2 and 4, t = 5 on the last segment extended"


def test_the_measured_costs_list_every_draft_count_and_are_measured_once_per_process(target):
    drafter = tiny_drafter(target, seed=11, block_size=8)
    costs = measured_costs(target, drafter)
    assert len(costs) == 8 and costs[0] == 1.0 and all(c > 0 for c in costs), \
        f"cost(n) for n = 0..7 in steps without drafts, cost(0) = 1: got {costs}"
    assert measured_costs(target, drafter) is costs, "a second call must reuse the table, not time again"
    sampled = measured_costs(target, drafter, sampled=True)
    assert len(sampled) == 8 and sampled is not costs, "sampled steps have their own table"
    assert measured_costs(target, drafter, sampled=True) is sampled, "... measured once too"
    rows = batch_costs(target, drafter, 4)
    assert len(rows) == 8 and rows[0] == 1.0, f"the table of a 4-row step: {rows}"
    assert batch_costs(target, drafter, 1) is costs, "one row of a batch uses batch 1's own table"


def test_a_fixed_table_replaces_the_measurement_and_a_seeded_sampled_run_repeats(target):
    drafter = tiny_drafter(target, seed=12, block_size=8)
    cheap = linear_costs(8, step_cost=1.05, slot_cost=0.0)
    fix_costs(drafter, cheap)
    assert measured_costs(target, drafter) == cheap, "the fixed table stands in for a measurement"

    def run():
        g = torch.Generator().manual_seed(5)
        return speculative_generate(target, drafter, PROMPT, 30, block_size="auto", temperature=1.0,
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
        out, _ = speculative_generate(target, drafter, PROMPT, 30, block_size="auto")
        assert out == reference, f"costs {costs[:3]}...: greedy output changed with the costs"


def test_a_table_of_the_wrong_shape_is_refused(target):
    drafter = tiny_drafter(target, seed=14, block_size=8)
    with pytest.raises(ValueError, match="costs must list cost"):
        fix_costs(drafter, [1.0, 1.3])
