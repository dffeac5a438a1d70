"""What a speculative step costs here, with these models: the prices block_size="auto" weighs drafts by, and
the one cost model every prediction of a speedup prices steps with (`predicted_speedup`).

block_policy.py drafts the n that maximises E(n) / cost(n), cost(n) being the seconds of a step with n drafts
in units of a step without drafts. Those seconds depend on the machine, on the models (a deep target makes
every verified token dearer) and on the rows of a batch (a forward stops being bound by reading the weights
as rows x tokens grow). They are measured once per machine, never while decoding:

    python -m nanodflash.tools.calibrate --out out    # times the steps, writes out/costs.json
    tok, target, drafter = nanodflash.load("out")     # reads the table: auto decides by it
    costs_for(drafter, rows=1, sampled=False)         # [cost(0) = 1, cost(1), ..., cost(B-1)]
    costs_for(drafter, compiled=True)                 # the compiled pass's (calibrate --compile)
    fix_costs(drafter, table)                         # or put a table in its place (tests, notebooks)
    predicted_speedup(calibration(drafter), [(tokens, stats.block_sizes), ...])   # over plain decoding

A calibration entry also holds the seconds behind the table: batch 1's step of t tokens (t = 1..B), a request
(the caches and the prefill) and plain decoding's token and request, each at the thread count the
calibration chose for its kind. A generation of steps of blocks b_1..b_k is priced at request + sum of
step(b_i), plain decoding of the same tokens at its request + one token per token after the first; the
predicted speedup is the second over the first, summed over the generations (the bench's speedup: total
tokens over total seconds). A batch is priced the same way by the batched decoder's own steps, at every row
count and block size, against plain batched steps of the same rows (`predicted_batch_speedup`).

A table is kept per machine key (device, dtype, thread count, torch version, compile mode: what changes a
step's cost). Without a table for the current key, auto uses DEFAULT_COSTS below and says so, once per
loaded drafter. The
tables travel with the drafter they were measured for, in its `cost_book` (a CostBook): two run folders
loaded in one process keep their own. So a
decision never depends on the clock of the moment: the same seeded command on the same run folder drafts the
same block sizes and emits the same tokens in every process. Costs choose block sizes only, and every block
size is exact: they never change the output's distribution (when greedy, its tokens).
"""

import sys
from dataclasses import dataclass, field

import torch

MODES = {False: "eager", True: "compiled"}     # the key's compile mode: the drafter's pass compiled or not
# The default costs, linear in the drafts per row: rows -> (cost of a step with one draft, the growth per
# further draft as a share of it), linear_costs. Fitted to a default run's table (make demo,
# then calibrate; the machine and the fit: docs/log.md); from 2 rows on, a batched step in plain batched
# steps (tools/calibrate.py).
DEFAULT_COSTS = {1: (1.57, 0.022), 2: (1.55, 0.027), 4: (1.53, 0.045), 8: (1.52, 0.099), 16: (1.78, 0.125),
                 32: (1.89, 0.184)}
DEFAULT_SAMPLED = (1.62, 0.039)    # one row, sampled steps: drawing drafts from q and the rejection test
COST_ROWS = (1, 2, 4, 8, 16, 32)    # row counts whose step costs are measured; past the last, the last's


@dataclass
class CostBook:
    """A drafter's step costs: its run folder's tables (costs.json's entries: use_table), tables fixed in
    their place (fix_costs), and the machine keys whose missing table was already reported."""
    entries: list = field(default_factory=list)
    fixed: dict = field(default_factory=dict)     # (key, rows, sampled) -> [cost(n) for n in 0..B-1]
    told: set = field(default_factory=set)


def book_of(drafter):
    """The drafter's CostBook: a new, empty one (the default costs) the first time it is asked for."""
    if drafter.cost_book is None:
        drafter.cost_book = CostBook()
    return drafter.cost_book


def cost_key(target, compiled=False):
    """What a step's cost depends on besides the models: {device, dtype, threads, torch, compile}; compiled:
    the drafter's pass compiled (compiled.py)."""
    p = next(target.parameters())
    return dict(device=p.device.type, dtype=str(p.dtype).removeprefix("torch."),
                threads=torch.get_num_threads(), torch=torch.__version__, compile=MODES[compiled])


def describe(key):
    """'cpu, float32, 1 thread, torch 2.13.0+cpu, eager'"""
    return (f"{key['device']}, {key['dtype']}, {key['threads']} thread{'s' if key['threads'] > 1 else ''}, "
            f"torch {key['torch']}, {key['compile']}")


def default_costs(block_size, rows=1, sampled=False):
    """DEFAULT_COSTS as a table [cost(n) for n in 0..B-1]: at the nearest row count listed at or below
    `rows`; DEFAULT_SAMPLED for one sampled row.

    >>> [round(c, 3) for c in default_costs(4)]
    [1.0, 1.57, 1.605, 1.639]
    """
    listed = max(r for r in DEFAULT_COSTS if r <= max(rows, 1))
    step_cost, slot_cost = DEFAULT_SAMPLED if sampled and rows == 1 else DEFAULT_COSTS[listed]
    return linear_costs(block_size, step_cost, slot_cost)


def check_table(drafter, costs):
    if len(costs) != drafter.block_size or costs[0] != 1:
        raise ValueError(f"costs must list cost(n) for n = 0..{drafter.block_size - 1} with "
                         f"cost(0) = 1, got {costs}")


def fix_costs(drafter, costs, rows=1, sampled=None):
    """Use `costs` ([cost(n) for n in 0..B-1], cost(0) = 1) for `drafter` at `rows` rows on this machine from
    now on, in place of any table: for greedy steps (sampled=False), sampled ones (True) or both (None), the
    drafter's pass eager or compiled."""
    check_table(drafter, costs)
    for compiled in MODES:
        key = str(cost_key(drafter.target, compiled))
        for kind in (False, True) if sampled is None else (sampled,):
            book_of(drafter).fixed[key, rows, kind] = list(costs)


def linear_costs(max_block_size, step_cost, slot_cost):
    """A simple cost model: cost(0) = 1, cost(n) = step_cost * (1 + slot_cost * (n - 1)) for n >= 1."""
    return [1.0] + [step_cost * (1 + slot_cost * (n - 1)) for n in range(1, max_block_size)]


def use_table(drafter, entries):
    """The cost tables of the drafter's run folder (costs.json's entries, tools/calibrate.py), for
    `costs_for` to choose from by machine key."""
    book_of(drafter).entries = list(entries)


def table_for(drafter, key):
    """The costs.json entry measured for this machine key and block size, or None."""
    B = drafter.block_size
    return next((e for e in book_of(drafter).entries if e["key"] == key and e["block_size"] == B), None)


def costs_for(drafter, rows=1, sampled=False, compiled=False):
    """[cost(n) for n in 0..B-1] of a step of `rows` rows (sampled or greedy; compiled: the drafter's pass
    compiled): the fixed table, else the run folder's for this machine key (compiled without one: the eager
    key's; sampled steps of several rows: the greedy table of those rows, when it has no sampled one), else
    DEFAULT_COSTS, saying once which key has no table."""
    key = cost_key(drafter.target, compiled)
    fixed = book_of(drafter).fixed.get((str(key), rows, bool(sampled)))
    if fixed is not None:
        return fixed
    # compiled without a compiled table: this machine's eager one (a compiled draft costs a little less)
    entry = table_for(drafter, key) or (table_for(drafter, cost_key(drafter.target)) if compiled else None)
    if entry is not None:
        tables = entry["costs"]["sampled" if sampled else "greedy"]
        table = tables.get(str(rows)) or entry["costs"]["greedy"].get(str(rows))
        if table is not None:
            return table
    if str(key) not in book_of(drafter).told:
        book_of(drafter).told.add(str(key))
        print(f"note: no cost table for {describe(key)}: block_size=\"auto\" uses the default costs "
              "(nanodflash/ext/step_costs.py); `python -m nanodflash.tools.calibrate --out DIR"
              f"{' --compile' if compiled else ''}` measures this machine's", file=sys.stderr)
    return default_costs(drafter.block_size, rows, sampled)


def calibration(drafter, compiled=False):
    """The costs.json entry calibrated on this machine for this drafter's block size (its key but the
    thread count: the entry's own is the speculative count it chose), or None (no calibration, or one made
    before threads were chosen)."""
    key = dict(cost_key(drafter.target, compiled), threads=None)
    found = [e for e in book_of(drafter).entries if "threads" in e and e["block_size"] == drafter.block_size
             and dict(e["key"], threads=None) == key]
    return found[-1] if found else None


def table_kind(sampled):
    """"sampled" or "greedy": the name of a calibration's tables for that kind of step."""
    return "sampled" if sampled else "greedy"


def costs_for_rows(rows, costs_at):
    """[cost(n) for n in 0..B-1] at `rows` rows: costs_at(rows) where rows is measured, else linear between
    the measured row counts around it (costs_at(r): the table at a measured r).

    >>> tables = {2: [1.0, 1.5], 4: [1.0, 2.5]}
    >>> costs_for_rows(3, tables.get)
    [1.0, 2.0]
    """
    below = max(r for r in COST_ROWS if r <= rows)
    above = min((r for r in COST_ROWS if r >= rows), default=below)
    if below == above:
        return costs_at(below)
    w = (rows - below) / (above - below)
    return [lo + w * (hi - lo) for lo, hi in zip(costs_at(below), costs_at(above))]


def plain_token_prices(entry, sampled=False):
    """[a batch-1 step with n drafts, in plain decoding's tokens, for n in 0..B-1], from a calibration entry:
    the price of a step against the token plain decoding would emit in its time (the what-if panel's)."""
    token = entry["plain_seconds"][table_kind(sampled)]["token"]
    return [s / token for s in entry["step_seconds"][table_kind(sampled)]]


def predicted_seconds(entry, blocks, sampled=False):
    """The seconds of a batch-1 speculative generation whose steps had these block sizes, priced by a
    calibration `entry`: a request (the caches, the prefill, the first token) + each step's seconds."""
    steps = entry["step_seconds"][table_kind(sampled)]
    return entry["request_seconds"][table_kind(sampled)] + sum(steps[b - 1] for b in blocks)


def plain_seconds(entry, n_tokens, sampled=False):
    """The seconds of plain decoding of n_tokens, priced by a calibration `entry` (at the plain count)."""
    plain = entry["plain_seconds"][table_kind(sampled)]
    return plain["request"] + (n_tokens - 1) * plain["token"]


def predicted_speedup(entry, runs, sampled=False):
    """The speedup the calibration predicts for generations [(tokens generated, [block size of each step])]:
    their plain decoding's seconds over their own, both summed over the runs (the bench's speedup: total
    tokens over total seconds, against plain decoding's).

    >>> entry = dict(step_seconds=dict(greedy=[1.0, 1.5, 2.0]), request_seconds=dict(greedy=2.0),
    ...              plain_seconds=dict(greedy=dict(token=1.0, request=2.0)))
    >>> predicted_speedup(entry, [(7, [3, 3, 1])])      # plain: 2 + 6 x 1.0; speculative: 2 + 2 + 2 + 1
    1.1428571428571428
    """
    plain = sum(plain_seconds(entry, n, sampled) for n, _ in runs)
    return plain / sum(predicted_seconds(entry, blocks, sampled) for _, blocks in runs)


def prices_batches(entry):
    """Whether a calibration entry can price a batch: it holds the batched steps' seconds at every block size
    ({kind: {rows: [s at t = 1..B]}})."""
    tables = (entry or {}).get("batch_step_seconds", {}).get("greedy", {})
    return bool(tables) and all(isinstance(t, list) for t in tables.values())


def batch_step_seconds(entry, rows, n_drafts, sampled=False):
    """The seconds of one batched step of `rows` rows with n_drafts drafts per row (0: a plain batched step),
    priced by a calibration `entry`: its batched step of n_drafts + 1 tokens per row, linear between the
    measured row counts (costs_for_rows)."""
    tables = entry["batch_step_seconds"][table_kind(sampled)]
    return costs_for_rows(rows, lambda r: tables[str(r)])[n_drafts]


def batch_start_seconds(entry, rows):
    """(plain, speculative): the seconds of starting a batched generation of `rows` rows (its caches and its
    prefill; a speculative one projects the prompts into the drafter's context too), priced by a calibration
    `entry`, linear between the measured row counts; (0, 0) for an entry without them."""
    starts = entry.get("batch_start_seconds")              # greedy starts: a sampled one differs by a draw
    if not starts:
        return 0.0, 0.0
    return tuple(costs_for_rows(rows, lambda r: [starts[str(r)]["plain"], starts[str(r)]["speculative"]]))


def predicted_batch_speedup(entry, batches, sampled=False):
    """The speedup the calibration predicts for batched generations over plain batched decoding of the same
    prompts. batches: [(plain's row lengths, [(block size, rows in the step) for each speculative step])].
    Each side starts its batch (batch_start_seconds: the caches, the prefill, the first token); then a batch
    steps until its slowest row is done, and a row that is done leaves it, so each step is priced at the rows
    still in it: plain decoding's k-th step at the rows longer than k tokens, a speculative step at its own
    block and rows.

    >>> entry = dict(batch_step_seconds=dict(greedy={"1": [1.0, 2.0], "2": [1.5, 4.5]}),
    ...              batch_start_seconds={"1": dict(plain=1.0, speculative=1.5),
    ...                                   "2": dict(plain=1.0, speculative=1.5)})
    >>> predicted_batch_speedup(entry, [([5, 3], [(2, 2), (2, 1)])])   # (1 + 3 + 2) / (1.5 + 4.5 + 2)
    0.75
    """
    plain = spec = 0.0
    for lengths, steps in batches:
        start_plain, start_spec = batch_start_seconds(entry, len(lengths))
        plain += start_plain + sum(batch_step_seconds(entry, sum(n > k for n in lengths), 0, sampled)
                                   for k in range(1, max(lengths)))
        spec += start_spec + sum(batch_step_seconds(entry, rows, block - 1, sampled) for block, rows in steps)
    return plain / spec
