"""Batched decoding (batch.py): every row is what batch 1 gives for that prompt alone.

Greedy: token-identical to `generate` of the prompt alone, for batches of 1-8 prompts of 1-40 tokens, every
block size, DFlash and DFlash 2 and an oracle drafter (full, partial and zero acceptance in one step), with
rows that stop at different steps. Sampling: each row has exactly the target's distribution (chi-square
against enumeration, as in test_sampling_exact.py; a deliberately wrong verifier must fail the same test).
The ragged caches hold, row by row, what a fresh batch-1 cache of that row's tokens holds. Bad input
names the row.
"""

import copy

import pytest
import torch

from helpers import greedy_continuation, soft_pair, tiny_drafter
from nanodflash.ext.batch import SpecBatch, generate_batch, speculative_generate_batch
from nanodflash.ext.batch_policy import COST_ROWS, BatchBlockSize
from nanodflash.ext.block_policy import auto
from nanodflash.ext.step_costs import fix_costs, linear_costs
from nanodflash.sampling import DraftRule, sample
from nanodflash.speculative import generate
from test_dflash2 import tiny_dflash2
from test_sampling_exact import chi_square_p_value, exact_distribution

PROMPTS = [[3], list(range(10, 50)), [7, 1, 4, 1, 5, 9, 2, 6], [60, 2], list(range(30, 5, -1)), [11] * 13,
           [5, 8, 13, 21, 34], list(range(40, 60))]           # 1 to 40 tokens
NEW = 30
BLOCK_SIZES = [1, 2, 4, 8, 16, "auto"]
# (drafter, block size) of the greedy test: block 1 never drafts (one drafter covers it); the oracle where a
# step can mix full, partial and zero acceptance across its rows (8 and 16, and auto)
GREEDY_CASES = [("dflash", b) for b in BLOCK_SIZES] + [("dflash2", b) for b in BLOCK_SIZES if b != 1] \
    + [("oracle", b) for b in (8, 16, "auto")]


class OracleRows:
    """A batched drafter context that drafts the target's own greedy continuation of each row, right for a
    random prefix only (then wrong), so one step mixes full, partial and zero acceptance across its rows.
    The drafter's real context is kept beside it, row for row, for the cache checks."""

    def __init__(self, batch, seed):
        self.batch, self.rng, self.greedy_runs = batch, torch.Generator().manual_seed(seed), []
        self.real = batch.context             # the drafter's own context still follows the rows
        self.keep, self.extend, self.cache = self.real.keep, self.real.extend, self.real.cache

    def project_context(self):
        self.real.project_context()

    def draft(self, anchors, T, sizes, choose):
        self.real.project_context()                   # what a real draft does first
        b, drafts = self.batch, []
        for r, n in zip(b.rows, sizes):
            right = greedy_continuation(b.target, b.prompts[r] + b.outs[r], n - 1, self.greedy_runs)
            k = int(torch.randint(0, n, (1,), generator=self.rng))        # 0 .. n-1 right drafts
            if int(torch.randint(0, 3, (1,), generator=self.rng)) == 0:
                k = n - 1                                                   # a third of the blocks: all right
            drafts.append(torch.tensor(right[:k] + [(t + 1) % 64 for t in right[k:]], dtype=torch.long))
        return drafts, [None] * len(sizes)


class OracleBatch(SpecBatch):
    """SpecBatch whose drafts come from OracleRows."""

    def __init__(self, *args, seed=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.context = OracleRows(self, seed)


@pytest.fixture(scope="module")
def refs(target):
    return [generate(target, p, NEW) for p in PROMPTS]


@pytest.fixture(scope="module")
def drafters(target):
    return {"dflash": tiny_drafter(target), "dflash2": tiny_dflash2(target, perturb=0.3)}


def stops_for(refs):
    """Two stop tokens that end some rows early, at different places (and leave others to max_new_tokens)."""
    return [refs[1][6], refs[4][17]]


def test_generate_batch_rows_equal_generate_of_each_prompt_alone(target, refs):
    for n in (1, 3, 8):
        assert generate_batch(target, PROMPTS[:n], NEW) == refs[:n], f"a row of a {n}-prompt batch diverged"
    stops = stops_for(refs)
    expected = [generate(target, p, NEW, stop_token_ids=stops) for p in PROMPTS]
    assert len({len(e) for e in expected}) > 2, "the stop tokens should end rows at different steps"
    assert generate_batch(target, PROMPTS, NEW, stop_token_ids=stops) == expected, \
        "rows with stop tokens diverged"


@pytest.mark.parametrize("kind,block_size", GREEDY_CASES, ids=[f"{k}-{b}" for k, b in GREEDY_CASES])
def test_greedy_speculative_batch_rows_equal_generate_of_each_prompt_alone(target, drafters, refs, kind,
                                                                           block_size):
    stops = stops_for(refs)
    stopped = [generate(target, p, NEW, stop_token_ids=stops) for p in PROMPTS]
    mixed = []                                                  # steps with full, partial and zero acceptance
    for n, stop in [(1, None), (8, None), (6, stops)]:
        args = (target, drafters["dflash2" if kind == "dflash2" else "dflash"], PROMPTS[:n], NEW)
        if kind == "oracle":
            out, stats = OracleBatch(*args, block_size=block_size, stop_token_ids=stop, seed=n).run()
        else:
            out, stats = speculative_generate_batch(*args, block_size=block_size, stop_token_ids=stop)
        want = (stopped if stop else refs)[:n]
        bad = [i for i in range(n) if out[i] != want[i]]
        assert not bad, \
            f"{kind} B={block_size}, {n} prompts, stops={stop}: rows {bad} differ from generate alone"
        for i, s in enumerate(stats.rows):
            assert len(out[i]) == 1 + sum(s.acceptance_lengths), f"row {i}: stats miss emitted tokens"
        # rows leave only when done: step k is row's k-th
        steps = [[(s.acceptance_lengths[k], s.block_sizes[k]) for s in stats.rows
                  if len(s.acceptance_lengths) > k]
                 for k in range(len(stats.batch_rows))]
        mixed += [st for st in steps if any(a == b for a, b in st) and any(1 < a < b for a, b in st)
                  and any(a == 1 < b for a, b in st)]
    if kind == "oracle" and block_size in (8, 16):
        assert mixed, "no step had full, partial and zero acceptance together"


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_each_rows_drafts_equal_the_batch1_drafters_for_that_rows_context(target, drafters, kind):
    drafter = drafters[kind]
    batch = SpecBatch(target, drafter, PROMPTS, NEW, block_size=4)
    batch.prefill()
    for _ in range(3):
        batch.step()
    sizes = [16, 3, 1, 16, 7, 2, 16, 9]  # rows using fewer slots than the block's 16
    drafts, _ = batch.context.draft(batch.anchors(), 16, sizes, DraftRule(0.0))
    for i, r in enumerate(batch.rows):
        context = batch.prompts[r] + batch.outs[r][:-1]
        cache = drafter.new_cache(128)
        _, feats = target(torch.tensor([context]), layer_ids=drafter.config.target_layer_ids)
        drafter.extend(cache, feats)
        alone, _ = drafter.draft(cache, batch.outs[r][-1], sizes[i] - 1, DraftRule(0.0))
        assert torch.equal(drafts[i], alone), \
            f"{kind} row {i}: batched drafts {drafts[i].tolist()} != {alone.tolist()}"


class Cycle:
    """A block-size schedule for tests: plain steps (1) between drafting ones, in a fixed cycle."""

    def __init__(self, sizes):
        self.sizes, self.i = sizes, 0

    def next(self):
        self.i += 1
        return self.sizes[(self.i - 1) % len(self.sizes)]

    def update(self, *args):
        pass


@pytest.mark.parametrize("schedule", ["B=8", "plain steps between drafts, rows stopping"])
def test_ragged_caches_after_steps_equal_fresh_batch1_caches_of_each_rows_tokens(target, drafters, refs,
                                                                                 schedule):
    drafter = drafters["dflash2"]
    if schedule == "B=8":
        batch, n_steps = OracleBatch(target, drafter, PROMPTS, NEW, block_size=8, seed=3), 3
    else:  # queued plain-step context, rows leaving meanwhile
        batch, n_steps = OracleBatch(target, drafter, PROMPTS, NEW, stop_token_ids=stops_for(refs), seed=4), 9
        batch.sizer = Cycle([1, 1, 6, 1, 1, 1, 3])
    batch.prefill()
    for _ in range(n_steps):
        if not batch.drop_finished():
            break
        batch.step()
    assert len(batch.rows) > 2, "too few rows left to compare"
    if schedule != "B=8":
        assert batch.rows != sorted(batch.rows), \
            "no live row moved into a finished row's place: compaction untested"
    batch.context.project_context()                             # (plain steps queue the drafter's context)
    for i, r in enumerate(batch.rows):
        tokens = batch.prompts[r] + batch.outs[r][:-1]          # verified; the last (bonus) is not fed yet
        n = len(tokens)
        assert batch.cache.lengths[i] == n, f"row {i}: target cache length {batch.cache.lengths[i]} != {n}"
        fresh = target.new_cache(1, 128)
        _, feats = target(torch.tensor([tokens]), fresh, layer_ids=drafter.config.target_layer_ids)
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(batch.cache, name)[:, i, :, :n],
                                       getattr(fresh, name)[:, 0, :, :n], rtol=0, atol=1e-10,
                                       msg=f"row {i}: target cache {name} != a fresh prefill's")
        dfresh = drafter.new_cache(128)
        drafter.extend(dfresh, feats)
        drafter.project_context(dfresh)
        assert batch.context.cache.lengths[i] == n, \
            f"row {i}: drafter context length {batch.context.cache.lengths[i]} != {n}"
        torch.testing.assert_close(batch.context.cache.k[:, i, :, :n], dfresh.k[:, 0, :, :n], rtol=0,
                                   atol=1e-10,
                                   msg=f"row {i}: drafter context K != projecting the row's features at once")


def test_finished_rows_leave_the_batch(target, drafters, refs):
    stops = [refs[0][0]]                                              # row 0 stops at its first token
    batch = SpecBatch(target, drafters["dflash"], PROMPTS[:3], NEW, block_size=4, stop_token_ids=stops)
    out, stats = batch.run()
    assert out[0] == [refs[0][0]] and stats.rows[0].acceptance_lengths == [], \
        "row 0 should stop at the prefill"
    assert stats.batch_rows[0] == 3 - sum(refs[i][0] in stops for i in range(3)), \
        "a finished row stayed in the batch"
    assert stats.batch_rows == sorted(stats.batch_rows, reverse=True), "the batch never grows back"


# ----------------------------------------------------------------------- sampling: exact distributions

V, H, N = 4, 4, 1000
SAMPLE_PROMPTS = [[1, 2], [3], [0, 3, 1]]                             # rows that differ


@pytest.fixture(scope="module")
def small():
    return soft_pair(V)


EXACT = {}


def exact(target, prompt, temperature, top_p):
    """{output: probability} under plain sampling from the target, by enumerating all V^H outputs
    (memoised)."""
    key = (id(target), tuple(prompt), temperature, top_p)
    if key not in EXACT:
        EXACT[key] = exact_distribution(target, temperature, None, top_p, prompt)
    return EXACT[key]


def batch_counts(run, seed=0):
    """{prompt index: {output: count}} from N rows per prompt, all prompts interleaved in the same batches."""
    g = torch.Generator().manual_seed(seed)
    counts = [dict() for _ in SAMPLE_PROMPTS]
    prompts = SAMPLE_PROMPTS * (N // 4)
    for _ in range(4):
        for i, o in enumerate(run(prompts, g)):
            c = counts[i % len(SAMPLE_PROMPTS)]
            c[tuple(o)] = c.get(tuple(o), 0) + 1
    return counts


def assert_target_distribution(counts, target, temperature, top_p, what):
    for i, c in enumerate(counts):
        p = chi_square_p_value(c, exact(target, SAMPLE_PROMPTS[i], temperature, top_p), N)
        assert p > 1e-4, f"{what}, prompt {i}: chi-square p={p:.2e} -- not the target's distribution"


def test_sampled_generate_batch_rows_have_exactly_the_targets_distribution(small):
    target, _ = small
    counts = batch_counts(lambda ps, g: generate_batch(target, ps, H, temperature=0.8, top_p=0.9,
                                                       generator=g))
    assert_target_distribution(counts, target, 0.8, 0.9, "generate_batch T=0.8 top_p=0.9")


@pytest.mark.parametrize("verifier,block_size", [("match", 4), ("rejection", 4), ("rejection", "auto")])
def test_sampled_speculative_batch_rows_have_exactly_the_targets_distribution(small, verifier, block_size):
    target, drafter = small
    lengths = []
    # auto's costs fixed, not timed: the test must not depend on the machine. Nearly free drafts, so that
    # the rows draft whatever they accept and the test sees acceptance. With every slot priced alike the rule
    # drafts a full block or none; the token limit cuts later blocks (sizes 2-4 are decoded)
    for R in COST_ROWS:
        fix_costs(drafter, linear_costs(drafter.config.block_size, 1.005, 0.0), rows=R)

    def run(prompts, g):
        out, stats = speculative_generate_batch(target, drafter, prompts, H, block_size=block_size,
                                                temperature=1.0, verifier=verifier, generator=g)
        lengths.extend(a for s in stats.rows for a in s.acceptance_lengths)
        return out
    counts = batch_counts(run)
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), \
        "both acceptance and rejection must occur"
    assert_target_distribution(counts, target, 1.0, None, f"{verifier} B={block_size}")


def always_accept(drafts, q, p, generator):
    """WRONG on purpose: keeps every draft, then samples the bonus from the target."""
    n = drafts.numel()
    return n, int(sample(p[n], generator))


def test_a_deliberately_wrong_verifier_fails_the_same_batched_test(small):
    target, drafter = small
    counts = batch_counts(lambda ps, g: speculative_generate_batch(target, drafter, ps, H, block_size=4,
                                                                   temperature=1.0, verifier=always_accept,
                                                                   generator=g)[0])
    with pytest.raises(AssertionError, match="not the target's distribution"):
        assert_target_distribution(counts, target, 1.0, None, "always_accept")


# ----------------------------------------------------------------------- the batch block size, bad input

def test_auto_block_size_drafts_less_as_the_batch_grows_and_not_at_all_when_drafts_fail():
    # costs whose slots grow dearer with the rows, as measured ones do
    tables = {R: linear_costs(16, step_cost=1.3, slot_cost=0.025 * R) for R in COST_ROWS}
    sizer = BatchBlockSize(16, tables.get)
    for _ in range(30):                                      # a drafter right 90% of the time on every row
        sizer.update(range(32), [(15, 13)] * 32)
    by_rows = [sizer.next_for(range(r)) for r in (1, 4, 16, 32)]
    assert by_rows == sorted(by_rows, reverse=True) and by_rows[0] > by_rows[-1], \
        f"blocks by batch size: {by_rows}"
    assert sizer.by_rows[4] == pytest.approx(linear_costs(16, 1.3, 0.1)), "a measured row count's own table"
    for _ in range(30):
        sizer.update(range(32), [(15, 0)] * 32)
    assert [sizer.next_for(range(r)) for r in (1, 32)] == [1, 1], \
        "drafts that are never accepted should not be drafted"


def test_a_batch_drafts_for_the_tokens_its_rows_emit_on_average_and_a_row_left_alone_decides_alone():
    """The rule weighs the tokens of the whole step: rows that keep every draft pay for one that keeps none,
    and when that row is left alone (the others finished), it stops drafting."""
    tables = {R: linear_costs(16, step_cost=1.3, slot_cost=0.025) for R in COST_ROWS}
    sizer = BatchBlockSize(16, tables.get)
    for _ in range(30):
        sizer.update(range(8), [(15, 15)] * 7 + [(15, 0)])
    assert sizer.next_for(range(8)) == 16, "7 rows of 8 emit 16 tokens a step: the batch should draft"
    assert sizer.next_for([7]) == 1, "the row that accepts nothing, alone, should not draft"


def test_the_batch_rule_chooses_what_every_row_counted_at_every_step_would_choose():
    """The block sizes must be those of the rule written out: every row's AdaptiveBlockSize updated at every
    step, and best_block of the mean E_r(n) over the rows in the step. Random steps, rows leaving, retries
    after plain steps."""
    from nanodflash.ext.block_policy import AdaptiveBlockSize, best_block
    tables = {R: linear_costs(16, step_cost=1.1, slot_cost=0.01 * R) for R in COST_ROWS}
    sizer, rows = BatchBlockSize(16, tables.get), list(range(12))
    eager = {r: AdaptiveBlockSize(16, costs=None) for r in rows}
    g = torch.Generator().manual_seed(0)
    chosen = []
    for step in range(150):
        if step % 15 == 14:
            rows = rows[1:]                                    # a row leaves the batch
        expected = [sum(t) / len(rows) for t in zip(*(eager[r].expected_tokens_by_drafts() for r in rows))]
        T = sizer.next_for(rows)
        assert T == best_block(expected, sizer.costs(len(rows))), f"step {step}: the rule chose otherwise"
        chosen.append(T)
        bad = 30 <= step < 80                                   # a spell where drafts fail
        pairs = [(T - 1, 0 if bad else int(torch.randint(0, T, (1,), generator=g))) for _ in rows]
        sizer.update(rows, pairs)
        for r, (n, a) in zip(rows, pairs):
            eager[r].update(n, a, relax=1 / len(rows))
    assert 1 in chosen and len(set(chosen)) > 2, f"blocks {sorted(set(chosen))}: too few cases compared"


def test_every_row_of_a_batch_starts_from_batch_1s_prior():
    """Before any evidence a row is assumed to accept what a batch-1 run assumes: at prices that pay at that
    prior, a batch of any size drafts at its first step; at prices that do not, none does."""
    for step_cost, drafts in ((1.5, True), (3.5, False)):
        tables = {R: linear_costs(16, step_cost=step_cost, slot_cost=0.03) for R in COST_ROWS}
        for rows in (1, 4, 32):
            assert (BatchBlockSize(16, tables.get).next_for(range(rows)) > 1) == drafts, \
                f"{rows} rows at a step cost of {step_cost}: should {'' if drafts else 'not '}draft"


def test_bad_input_raises_a_value_error_naming_the_row(target, drafters):
    d = drafters["dflash"]
    for fn in (lambda ps, n: generate_batch(target, ps, n),
               lambda ps, n: speculative_generate_batch(target, d, ps, n)):
        with pytest.raises(ValueError, match="batch is empty"):
            fn([], 5)
        with pytest.raises(ValueError, match="prompt 1 of the batch: the prompt is empty"):
            fn([[1, 2], [], [3]], 5)
        with pytest.raises(ValueError,
                           match=r"prompt 2 of the batch: prompt \(100 tokens\) \+ max_new_tokens \(30\)"):
            fn([[1], [2] * 10, [3] * 100], 30)
    with pytest.raises(ValueError, match="block_size must be"):
        speculative_generate_batch(target, d, [[1]], 5, block_size=17)


def test_a_batch_of_one_prompt_chooses_the_auto_block_sizes_of_the_batch1_loop(target, drafters):
    """At one row the batch's auto keeps batch 1's cost model, so one prompt decodes step for step as
    speculative_generate(block_size=auto) does; from two rows on, the batch's cost tables decide. The
    one-row table is fixed: two timings of it may differ by noise, and the claim is about which table is
    used."""
    from nanodflash.speculative import speculative_generate
    drafter, sizes = copy.deepcopy(drafters["dflash"]), set()
    fix_costs(drafter, linear_costs(drafter.config.block_size, 1.3, 0.025), rows=1)
    for prompt in PROMPTS:
        _, alone = speculative_generate(target, drafter, prompt, NEW, block_size=auto)
        _, batch = speculative_generate_batch(target, drafter, [prompt], NEW, block_size="auto")
        assert batch.block_sizes == alone.block_sizes, \
            f"prompt {prompt[:5]}: batch of one chose {batch.block_sizes}, batch 1 chose {alone.block_sizes}"
        sizes.update(alone.block_sizes)
    assert len(sizes) > 2, f"the block size never adapted (sizes used: {sorted(sizes)}): nothing was compared"
