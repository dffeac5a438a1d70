"""What a speculative step costs here, with these models: the prices block_size="auto" weighs drafts by.

block_policy.py drafts the n that maximises E(n) / cost(n), cost(n) being the seconds of a step with n drafts
in units of a step without drafts. Those seconds depend on the machine, on the models (a deep target makes
every verified token dearer) and on the rows of a batch (a forward stops being bound by reading the weights
as rows x tokens grow), so they are measured where the decoder runs, the first time it needs them:

    costs = measured_costs(target, drafter)     # [cost(0) = 1, cost(1), ..., cost(B-1)] for one row
    fix_costs(drafter, costs)                   # or put a table in its place (tests, benchmarks)

A step is timed as the loop runs it: the newly verified positions projected into the drafter's context, one
drafter pass of n+1 slots (none when n = 0) and one target forward of n+1 tokens, after a context of
CONTEXT tokens; when sampling, also what sampling adds per slot (drawing each draft from q, the target's p
at every position, the rejection test), which makes a sampled slot dearer than a greedy one. The median of
N_CALLS calls at each of COST_TOKENS block sizes, linear in between (about a quarter of a second for the
default models on one CPU thread). The table is kept for the process, per drafter, row count, device, thread
count and kind of step (greedy or sampled), so every generation of a process weighs drafts alike, and a
fixed table makes a seeded sampled run repeat exactly. Costs choose block sizes only, and every block size
is exact: they never change the output's distribution (when greedy, its tokens).
"""

import statistics
import time
import weakref

import torch

from .sampling import DraftRule, probs_from_logits
from .verify import rejection_verify

CONTEXT = 64                      # tokens of context the timed steps attend to
COST_TOKENS = (1, 2, 4, 8, 16)    # block sizes timed; the others are interpolated linearly
N_CALLS = 5                       # timed calls per block size (the median counts), after one warm-up

_TABLES = weakref.WeakKeyDictionary()      # drafter -> {(rows, device, threads, sampled): [cost(n), ...]}
SAMPLED_T = 0.7                   # sampled steps are timed at this temperature (cost barely moves with it)


def sync(device):
    """Block until the device has run everything queued (CUDA kernels are asynchronous), so a timer sees
    it finish; nothing to wait for on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device, n=N_CALLS):
    """Median wall-clock seconds of n calls of fn(), after one untimed warm-up call (allocation, kernel
    setup)."""
    fn()
    times = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def relative_costs(seconds, max_block_size):
    """{block size t: seconds} at some t (1 included) -> [cost(n) for n in 0..B-1], cost(n) = seconds at
    t = n+1 (linear between the timed sizes, the last segment extended) over the seconds at t = 1.

    >>> relative_costs({1: 2.0, 2: 2.5, 4: 3.0}, 5)
    [1.0, 1.25, 1.375, 1.5, 1.625]
    """
    ts = sorted(seconds)
    out = []
    for t in range(1, max_block_size + 1):
        i = max(1, min(len(ts) - 1, sum(x < t for x in ts)))
        lo, hi = ts[i - 1], ts[i]
        out.append((seconds[lo] + (seconds[hi] - seconds[lo]) * (t - lo) / (hi - lo)) / seconds[1])
    return out


def _key(drafter, rows, sampled):
    return rows, str(next(drafter.target.parameters()).device), torch.get_num_threads(), bool(sampled)


def fix_costs(drafter, costs, rows=1, sampled=None):
    """Use `costs` ([cost(n) for n in 0..B-1], cost(0) = 1) for `drafter` at `rows` rows from now on, in
    place of a measurement: for greedy steps (sampled=False), sampled ones (True) or both (None)."""
    if len(costs) != drafter.config.block_size or costs[0] != 1:
        raise ValueError(f"costs must list cost(n) for n = 0..{drafter.config.block_size - 1} with "
                         f"cost(0) = 1, got {costs}")
    for kind in (False, True) if sampled is None else (sampled,):
        _TABLES.setdefault(drafter, {})[_key(drafter, rows, kind)] = list(costs)


def cached_costs(drafter, rows, measure, sampled=False):
    """The table for `drafter` at `rows` rows (of sampled steps or greedy ones): the fixed or already
    measured one, else measure() (seconds by block size), kept."""
    tables = _TABLES.setdefault(drafter, {})
    key = _key(drafter, rows, sampled)
    if key not in tables:
        tables[key] = relative_costs(measure(), drafter.config.block_size)
    return tables[key]


@torch.no_grad()
def time_single_steps(target, drafter, n_calls=N_CALLS, sampled=False):
    """{t: seconds of one batch-1 step with a block of t tokens} at the COST_TOKENS sizes up to the drafter's
    block size: project t verified positions, draft t-1 tokens (none at t = 1), verify t tokens; sampled:
    drafts drawn from q, and the target's p and the rejection test on every position (match's draw from p
    costs about as much)."""
    B, ids = drafter.config.block_size, drafter.config.target_layer_ids
    device = next(target.parameters()).device
    n = min(CONTEXT, target.config.max_seq_len - B)
    context = torch.arange(n, device=device)[None] % target.config.vocab_size               # (1, n) any ids
    cache, dcache = target.new_cache(1, n + B), drafter.new_cache(n + B)
    _, feats = target(context, cache, layer_ids=ids)
    g = torch.Generator().manual_seed(0)
    rule = DraftRule(SAMPLED_T, True, g) if sampled else DraftRule(0.0, False, None)
    seconds = {}
    for t in [t for t in COST_TOKENS if t <= B]:
        def step():
            dcache.length = n - t                          # the last t context positions, verified anew
            drafter.extend(dcache, feats[:, n - t:], context[:, n - t:])
            if t > 1:
                drafts, q = drafter.draft(dcache, 0, t - 1, rule)   # projects them, then drafts
            else:
                drafter.project_context(dcache)            # what the next draft would project first
            logits, _ = target(context[:, :t], cache, layer_ids=ids)
            if sampled and t > 1:                          # the verifier's share of a sampled step
                rejection_verify(drafts, q, probs_from_logits(logits[0].cpu(), SAMPLED_T), g)
            cache.crop(n)
        seconds[t] = median_seconds(step, device, n_calls)
    return seconds


def measured_costs(target, drafter, sampled=False):
    """[cost(n) for n in 0..B-1] of batch-1 steps (sampled ones, or greedy) on these models: fixed, already
    measured, or timed now."""
    return cached_costs(drafter, 1, lambda: time_single_steps(target, drafter, sampled=sampled), sampled)
