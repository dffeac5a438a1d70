"""What a step costs, timed in isolation, for the benchmark's cost sections.

1. `step_costs`: one draft, one verify and one plain step at one context length; `draft_step_seconds`: one
   draft step per drafter (e.g. DFlash 2's in-block convolutions and selector against DFlash).
2. The draft cost (the paper's Figure 3 in miniature): `draft_cost_curve` times ONE draft step against the
   number of drafted tokens and counts its drafter forward passes (flat for DFlash, linear for AR).
"""

import torch

from ..sampling import DraftRule
from ..speculative import generate
from .measure import DraftForwardCounter
from .step_timing import median_seconds

GREEDY = DraftRule(0.0)                                   # drafting as in the greedy loop


def realistic_context(target, prompt, context_len):
    """prompt continued by the target's greedy tokens up to context_len ids: what the loop drafts after."""
    return prompt + generate(target, prompt, context_len - len(prompt))


def drafter_context(target, drafter, context):
    """A drafter cache holding the target features of `context` (a list of ids)."""
    ids = torch.tensor([context], device=next(target.parameters()).device)              # (1, T)
    _, feats = target(ids, layer_ids=drafter.target_layer_ids)
    cache = drafter.new_cache(target.config.max_seq_len)
    drafter.extend(cache, feats, ids)
    return cache


# ----------------------------------------------------------------------------- step costs

@torch.no_grad()
def step_costs(target, drafter, prompt, context_len, block_size=16, n=50):
    """Median seconds of: one draft (B-1 tokens, one drafter pass), one verify (B tokens through the target
    with its cache, features captured) and one plain decoding step (1 token with the cache), all after
    the same `context_len` ids (prompt + the target's greedy continuation)."""
    device = next(target.parameters()).device
    B = min(block_size, drafter.block_size)
    context = realistic_context(target, prompt, context_len)
    ids = drafter.target_layer_ids
    cache, dcache = target.new_cache(1), drafter.new_cache(target.config.max_seq_len)
    ctx = torch.tensor([context], device=device)                                 # (1, context_len)
    _, feats = target(ctx, cache, layer_ids=ids)
    drafter.extend(dcache, feats, ctx)
    L = cache.length
    block = torch.tensor([context[-B:]], device=device)                          # (1, B): any B tokens

    def draft():
        drafter.draft(dcache, context[-1], B - 1, GREEDY)

    def verify():
        target(block, cache, layer_ids=ids)
        cache.crop(L)

    def plain():
        target(block[:, :1], cache)
        cache.crop(L)
    s = median_seconds(dict(draft_s=draft, verify_s=verify, plain_step_s=plain), device, n)
    return dict(block_size=B, context_len=L, **s)


def time_draft(drafter, cache, anchor, n_draft, device, n=50):
    """Median seconds of one greedy draft step of n_draft tokens from `cache`."""
    seconds = median_seconds({"draft": lambda: drafter.draft(cache, anchor, n_draft, GREEDY)}, device, n)
    return seconds["draft"]


@torch.no_grad()
def draft_step_seconds(target, drafters, context, n_draft, n=50):
    """{name: median seconds of one greedy draft step of min(n_draft, B-1) tokens} after `context` (ids)."""
    device = next(target.parameters()).device
    return {name: time_draft(d, drafter_context(target, d, context), context[-1],
                             min(n_draft, d.block_size - 1), device, n)
            for name, d in drafters.items()}


def format_draft_steps(seconds, drafters, n_draft, reference):
    """One line per drafter: its draft step in ms, and how much dearer `reference`'s (the main drafter's)
    is."""
    lines = []
    for name, s in seconds.items():
        k = min(n_draft, drafters[name].block_size - 1)
        more = 100 * (seconds[reference] / s - 1)
        vs = "" if name == reference else f"  ({reference} draft step {more:+.1f}% vs {name})"
        lines.append(f"  {f'draft  ({name}: {k} tokens, one pass)':<40} {1e3 * s:8.3f} ms{vs}")
    return lines


# ----------------------------------------------------------------------------- draft cost curve

@torch.no_grad()
def draft_cost_curve(target, drafters, prompt, context_len=None, n=20):
    """For n_draft = 1 .. B-1, the median seconds of ONE draft step and its number of drafter forward
    passes, per drafter, at one context length (default prompt + 48)."""
    device, context_len = next(target.parameters()).device, context_len or len(prompt) + 48
    context = realistic_context(target, prompt, context_len)
    n_max = min(d.block_size for d in drafters.values()) - 1
    curve = dict(context_len=context_len, n_draft=list(range(1, n_max + 1)), seconds={}, forwards={})
    for name, d in drafters.items():
        cache = drafter_context(target, d, context)
        curve["forwards"][name] = []
        for k in curve["n_draft"]:
            with DraftForwardCounter(d) as c:
                d.draft(cache, context[-1], k, GREEDY)
            curve["forwards"][name].append(c.n)
        curve["seconds"][name] = [time_draft(d, cache, context[-1], k, device, n) for k in curve["n_draft"]]
    return curve


def format_cost_curve(curve):
    names = list(curve["seconds"])
    lines = [f"draft cost: one draft step vs drafted tokens (median ms, context {curve['context_len']} "
             "tokens; forward passes in brackets)", f"{'tokens':>8}" + "".join(f"{n:>18}" for n in names)]
    for i, k in enumerate(curve["n_draft"]):
        cells = [f"{1e3 * curve['seconds'][n][i]:>12.3f} ({curve['forwards'][n][i]:>2})" for n in names]
        lines.append(f"{k:>8}" + "".join(cells))
    return "\n".join(lines)
