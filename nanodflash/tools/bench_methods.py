"""The benchmark's methods (its rows): plain decoding, DFlash with a drafter, prompt lookup, at any
temperature.

A method is `Method(name, temperature, run)` with `run(target, drafter, prompt, max_new_tokens, generator)
-> (tokens, SpecStats or None)`; `default_methods` lists the rows `python -m nanodflash.tools.bench` runs.
"""

from collections import namedtuple

from ..speculative import generate, speculative_generate
from .baselines import AR_KS
from .prompt_lookup import PromptLookupDrafter

LOOKUP_KS = (4, 10)     # drafted tokens per step (at most) for the prompt lookup rows
NOT_DFLASH = ("ar", "nofeat")   # extra drafter kinds that are not DFlash-style (no block logits to pick from)
SAMPLED = (0.7, 0.95)   # temperature, top-p of the "as people sample" rows
SAMPLED_B = 4           # the small block size of the sampled rows (next to the drafter's B and "auto")

Method = namedtuple("Method", "name temperature run")


def plain_method(temperature=0.0, top_p=None):
    """Plain autoregressive decoding with the KV cache: one target forward per token."""
    def run(target, drafter, prompt, max_new_tokens, generator):
        tokens = generate(target, prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                          generator=generator)
        return tokens, None
    return run


def dflash_method(block_size, temperature=0.0, verifier="match", drafter=None, top_p=None):
    """DFlash speculative decoding; `drafter` overrides the benchmark's drafter (e.g. a baseline drafter)."""
    def run(target, default_drafter, prompt, max_new_tokens, generator):
        return speculative_generate(target, drafter or default_drafter, prompt, max_new_tokens,
                                    block_size=block_size, temperature=temperature, top_p=top_p,
                                    verifier=verifier, generator=generator)
    return run


def prompt_lookup_method(n_draft):
    """Greedy speculative decoding with prompt lookup drafts (up to n_draft copied tokens a step, no
    model)."""
    def run(target, drafter, prompt, max_new_tokens, generator):
        return speculative_generate(target, PromptLookupDrafter(target, n_draft), prompt, max_new_tokens,
                                    generator=generator)
    return run


def kind_of(drafter):
    """The row-name prefix of a DFlash-style drafter: "dflash" (kind None or "dflash") or e.g. "dflash2"."""
    return getattr(drafter, "kind", None) or "dflash"


def dflash_style(extra):
    """The extra drafters (by kind) that draft a block of logits in one pass: all but ar / nofeat."""
    return {k: d for k, d in (extra or {}).items() if k not in NOT_DFLASH}


def sampled_sizes(B):
    """Block sizes of the sampled rows: SAMPLED_B (small blocks pay when most drafts are rejected), the
    drafter's own B, and "auto" (block_policy.py)."""
    return [*sorted({min(SAMPLED_B, B), B}), "auto"]


def sampling_drafters(drafter, sampler):
    """{row-name prefix: drafter} of the drafters that get the T=1 and T=0.7 rows: the main one, and the
    sampling drafter (drafter_sampling.pt) as "K-sampling" when the run made one."""
    kind = kind_of(drafter)
    return {kind: drafter, **({f"{kind}-sampling": sampler} if sampler is not None else {})}


def default_methods(drafter, baselines=None, greedy_only=False, sampler=None):
    """Plain greedy; the drafter's greedy rows at B = 4/8/16 (capped at its B) and "auto" (block_policy.py);
    for each extra DFlash-style drafter of kind K, "K greedy B=8/16"; "ar k=3/7/15" and "dflash no-features"
    when `baselines` has "ar"/"nofeat"; "prompt lookup k=4/10"; then T=1 plain and the drafter with each
    verifier; then T=0.7 top-p 0.95 (SAMPLED) plain, and every DFlash-style drafter (main first) with each
    verifier; every sampled DFlash row at B=4, the drafter's B and B=auto (`sampled_sizes`). `sampler` (the
    run's drafter_sampling.pt) gets the main drafter's T=1 and T=0.7 rows too, named "K-sampling ...".

    `baselines`: {kind: drafter}, e.g. baselines.load_present(out) plus {"dflash2": ...}. greedy_only: plain
    greedy and the drafter's greedy rows only."""
    B, kind, extra = drafter.config.block_size, kind_of(drafter), baselines or {}
    if kind in extra:
        raise ValueError(f"an extra drafter has the main drafter's kind {kind!r}: their rows would share "
                         "names")
    methods = [Method("plain greedy", 0.0, plain_method(0.0))]
    sizes = [*sorted({min(b, B) for b in (4, 8, 16)}), "auto"]
    methods += [Method(f"{kind} greedy B={b}", 0.0, dflash_method(b)) for b in sizes]
    if greedy_only:
        return methods
    for k, d in dflash_style(extra).items():
        methods += [Method(f"{k} greedy B={b}", 0.0, dflash_method(b, drafter=d))
                    for b in sorted({min(b, d.config.block_size) for b in (8, 16)})]
    if "ar" in extra:
        ar = extra["ar"]
        methods += [Method(f"ar k={k}", 0.0, dflash_method(k + 1, drafter=ar)) for k in AR_KS
                    if k < ar.config.block_size]
    if "nofeat" in extra:
        nf = extra["nofeat"]
        methods += [Method(f"dflash no-features B={nf.config.block_size}", 0.0,
                           dflash_method(nf.config.block_size, drafter=nf))]
    methods += [Method(f"prompt lookup k={k}", 0.0, prompt_lookup_method(k)) for k in LOOKUP_KS]
    samplers = sampling_drafters(drafter, sampler)
    methods += [Method("plain T=1", 1.0, plain_method(1.0))]
    for k, d in samplers.items():
        methods += [Method(f"{k} T=1 {v} B={b}", 1.0, dflash_method(b, 1.0, v, None if d is drafter else d))
                    for b in sampled_sizes(d.config.block_size) for v in ("match", "rejection")]
    T, p = SAMPLED
    methods += [Method(f"plain T={T} p={p}", T, plain_method(T, p))]
    for k, d in {**samplers, **dflash_style(extra)}.items():
        own = None if d is drafter else d          # DFlash 2's rejection rows use its selector's q
        methods += [Method(f"{k} T={T} p={p} {v} B={b}", T, dflash_method(b, T, v, own, p))
                    for b in sampled_sizes(d.config.block_size) for v in ("match", "rejection")]
    return methods
