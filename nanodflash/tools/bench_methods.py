"""The benchmark's methods (its rows): plain decoding, DFlash with a drafter, prompt lookup, at any
temperature.

A method is `Method(name, temperature, run)` with `run(target, drafter, prompt, max_new_tokens, generator)
-> (tokens, TimedStats or None)`: path rows decode with tools/watch.py's loop, which times each step's
drafter and target work (the table's step cost). `headline_methods` lists the rows `python -m
nanodflash.tools.bench` runs by default, `default_methods` every row (`--all_rows`).
"""

from collections import namedtuple
from functools import partial

from ..ext.sampled_tree import SampledDraws
from ..ext.tree import tree_speculative_generate
from ..speculative import generate
from .baselines import AR_KS
from .prompt_lookup import PromptLookupDrafter
from .watch import watched_generate

LOOKUP_KS = (4, 10)     # drafted tokens per step (at most) for the prompt lookup rows
SAMPLED = (0.7, 0.95)   # temperature, top-p of the "as people sample" rows
SAMPLED_B = 4           # the small block size of the sampled rows (next to the drafter's B and "auto")
SAMPLED_TREE_NODES = (4, 8)   # draft nodes a step of the sampled-tree rows (sampled_tree.py)

Method = namedtuple("Method", "name temperature run threads", defaults=(None,))   # threads: None = as set


def plain_method(temperature=0.0, top_p=None):
    """Plain autoregressive decoding with the KV cache: one target forward per token."""
    def run(target, drafter, prompt, max_new_tokens, generator):
        tokens = generate(target, prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                          generator=generator)
        return tokens, None
    return run


def dflash_method(block_size, temperature=0.0, verifier="match", drafter=None, top_p=None):
    """DFlash speculative decoding; `drafter` overrides the benchmark's drafter (e.g. a baseline drafter); its
    run takes compile=True too (the drafter's pass compiled: compiled.py)."""
    def run(target, default_drafter, prompt, max_new_tokens, generator, compile=False):
        return watched_generate(target, drafter or default_drafter, prompt, max_new_tokens,
                                block_size=block_size, temperature=temperature, top_p=top_p,
                                verifier=verifier, generator=generator, compile=compile)
    return run


def sampled_tree_method(tree_nodes, temperature, drafter=None, top_p=None):
    """Tree verification of drafts sampled from the drafter (sampled_tree.py), at most tree_nodes a step."""
    def run(target, default_drafter, prompt, max_new_tokens, generator):
        return tree_speculative_generate(target, drafter or default_drafter, prompt, max_new_tokens,
                                         tree_nodes=tree_nodes, temperature=temperature, top_p=top_p,
                                         generator=generator, draws=SampledDraws())
    return run


def prompt_lookup_method(n_draft):
    """Greedy speculative decoding with prompt lookup drafts (up to n_draft copied tokens a step, no
    model)."""
    def run(target, drafter, prompt, max_new_tokens, generator):
        return watched_generate(target, PromptLookupDrafter(target, n_draft), prompt, max_new_tokens,
                                generator=generator)
    return run


def kind_of(drafter):
    """The row-name prefix of a DFlash-style drafter: "dflash" (kind None or "dflash") or e.g. "dflash2"."""
    return getattr(drafter, "kind", None) or "dflash"


def dflash_style(extra):
    """The extra drafters that draft a block by the block pass over their context (`uses_block_pass`): the
    DFlash kinds, not the AR chain or the no-feature ablation."""
    return {k: d for k, d in (extra or {}).items() if d.uses_block_pass}


def sampled_sizes(B):
    """Block sizes of the sampled rows: SAMPLED_B (small blocks pay when most drafts are rejected), the
    drafter's own B, and "auto" (block_policy.py)."""
    return [*sorted({min(SAMPLED_B, B), B}), "auto"]


def sampling_drafters(drafter, sampler):
    """{row-name prefix: drafter} of the drafters that get the T=1 and T=0.7 rows: the main one, and the
    sampling drafter (drafter_sampling.pt) as "K-sampling" when the run made one."""
    kind = kind_of(drafter)
    return {kind: drafter, **({f"{kind}-sampling": sampler} if sampler is not None else {})}


def default_methods(drafter, baselines=None, greedy_only=False, sampler=None, sampled_only=False):
    """Plain greedy; the drafter's greedy rows at B = 4/8/16 (capped at its B) and "auto" (block_policy.py);
    for each extra DFlash-style drafter of kind K, "K greedy B=8/16"; "ar k=3/7/15" and "dflash no-features"
    when `baselines` has "ar"/"nofeat"; "prompt lookup k=4/10"; then the sampled rows (`sampled_methods`).
    `sampler` (the run's drafter_sampling.pt) gets the main drafter's sampled rows too, named
    "K-sampling ...".

    `baselines`: {kind: drafter}, e.g. baselines.load_present(out) plus {"dflash2": ...}. greedy_only: plain
    greedy and the drafter's greedy rows only. sampled_only: the sampled rows of the drafter sampling decodes
    with (the sampler where there is one) only."""
    B, kind, extra = drafter.block_size, kind_of(drafter), baselines or {}
    if kind in extra:
        raise ValueError(f"an extra drafter has the main drafter's kind {kind!r}: their rows would share "
                         "names")
    samplers = sampling_drafters(drafter, sampler)
    if sampled_only:
        name = list(samplers)[-1]                  # the sampling drafter where the run made one
        return sampled_methods(drafter, {name: samplers[name]})
    methods = [Method("plain greedy", 0.0, plain_method(0.0))]
    sizes = [*sorted({min(b, B) for b in (4, 8, 16)}), "auto"]
    methods += [Method(f"{kind} greedy B={b}", 0.0, dflash_method(b)) for b in sizes]
    if greedy_only:
        return methods
    for k, d in dflash_style(extra).items():
        methods += [Method(f"{k} greedy B={b}", 0.0, dflash_method(b, drafter=d))
                    for b in sorted({min(b, d.block_size) for b in (8, 16)})]
    if "ar" in extra:
        ar = extra["ar"]
        methods += [Method(f"ar k={k}", 0.0, dflash_method(k + 1, drafter=ar)) for k in AR_KS
                    if k < ar.block_size]
    if "nofeat" in extra:
        nf = extra["nofeat"]
        methods += [Method(f"dflash no-features B={nf.block_size}", 0.0,
                           dflash_method(nf.block_size, drafter=nf))]
    methods += [Method(f"prompt lookup k={k}", 0.0, prompt_lookup_method(k)) for k in LOOKUP_KS]
    return methods + sampled_methods(drafter, samplers, dflash_style(extra))


def sampled_methods(drafter, samplers, extra=None):
    """T=1 plain, and each of `samplers` ({row-name prefix: drafter}) with each verifier and as sampled trees
    of SAMPLED_TREE_NODES nodes; then T=0.7 top-p 0.95 (SAMPLED) plain, the same rows, and each `extra`
    DFlash-style drafter with each verifier. Every sampled DFlash row at B=4, the drafter's B and B=auto
    (`sampled_sizes`). `drafter`: the benchmark's own (rows of other drafters pass theirs)."""
    methods = []
    for T, p in ((1.0, None), SAMPLED):
        label = "T=1" if p is None else f"T={T} p={p}"
        methods += [Method(f"plain {label}", T, plain_method(T, p))]
        for k, d in {**samplers, **(extra or {})}.items():
            own = None if d is drafter else d      # DFlash 2's rejection rows use its selector's q
            if T == 1.0 and k not in samplers:
                continue
            methods += [Method(f"{k} {label} {v} B={b}", T, dflash_method(b, T, v, own, p))
                        for b in sampled_sizes(d.block_size) for v in ("match", "rejection")]
            if k in samplers:
                methods += [Method(f"{k} {label} sampled tree N={n}", T, sampled_tree_method(n, T, own, p))
                            for n in SAMPLED_TREE_NODES]
    return methods


def headline_methods(drafter, sampler=None):
    """The rows the bench runs by default, each answering one question: plain greedy and the drafter at its
    own block size (up to 16) and at B=auto: what greedy decoding gains; plain T=0.7 top-p 0.95 and the
    rejection rows at B=4 and B=auto of the drafter sampling decodes with (the sampling drafter where the run
    made one): what sampling, as people sample, gains: picked from `default_methods` by name; every row
    takes about ten times as long at 64 prompts (`--all_rows`)."""
    B, kind = drafter.block_size, kind_of(drafter)
    name = list(sampling_drafters(drafter, sampler))[-1]
    label = f"{name} T={SAMPLED[0]} p={SAMPLED[1]} rejection"
    wanted = {"plain greedy", f"{kind} greedy B={min(16, B)}", f"{kind} greedy B=auto",
              f"plain T={SAMPLED[0]} p={SAMPLED[1]}",
              f"{label} B={min(SAMPLED_B, B)}", f"{label} B=auto"}
    return [m for m in default_methods(drafter, sampler=sampler) if m.name in wanted]


def compiled_methods(drafter, sampler=None, greedy=True, sampled=True):
    """The headline's DFlash rows (greedy, sampled or both) again with the drafter's pass compiled
    (compiled.py), each named "<its eager row> compiled". The target runs eager in both, so the plain rows
    serve both modes; the bench's warm-up compiles their graphs."""
    rows = [m for m in headline_methods(drafter, sampler)
            if not m.name.startswith("plain") and (sampled if m.temperature > 0 else greedy)]
    return [Method(f"{m.name} compiled", m.temperature, partial(m.run, compile=True)) for m in rows]


def with_threads(methods, threads):
    """The methods, each to run at its own thread count: threads["plain"] for plain decoding (the rows named
    "plain ..."), threads["speculative"] for the others ({plain, speculative}: cli.decode_threads)."""
    kind = lambda m: "plain" if m.name.startswith("plain") else "speculative"         # noqa: E731
    return [Method(m.name, m.temperature, m.run, threads[kind(m)]) for m in methods]
