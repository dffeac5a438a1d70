"""The sections of `python -m nanodflash.tools.bench` besides its rows: the table and ceiling lines, what each
step costs, and where τ is lost (how much a better selector could gain, and per-slot sampled acceptance).

0. The printed table (`format_table`), the ceiling line (`format_ceiling`), block_policy's costs as the
   run measured them (`policy_costs`) and the comparison with the best AR / prompt lookup row (`compare`).
1. Step costs, timed in isolation: `step_costs` (one draft, one verify, one plain step at one context
   length) and `draft_step_seconds` (one draft step per drafter, e.g. DFlash 2's in-block convolutions
   and selector against DFlash).
2. Draft cost (the paper's Figure 3 in miniature): `draft_cost_curve` times ONE draft step against the
   number of drafted tokens and counts its drafter forward passes (flat for DFlash, linear for AR).
3. Oracle-selector τ: a DFlash drafter's top-1 is often wrong while the target's token is among its
   top-16 candidates (docs/design.md). `oracle_selector_tau` measures the τ a *perfect* candidate selector
   would reach: per slot it drafts the true greedy token when it is among the drafter's top-K logits,
   else the drafter's argmax. It needs the answer (plain greedy output of the same prompt), so it is a
   ceiling to aim at, not a method; greedy speculative output equals plain greedy output, so every
   context the loop reaches is a prefix of that reference.
4. Per-slot acceptance when sampling (`slot_acceptance`): sum_x min(p, q) = 1 - TV(p, q) next to the
   measured acceptance rate, slot by slot, for the rejection rule.
"""

import torch

from ..drafting import DrafterInterface
from ..sampling import DraftRule
from ..speculative import generate, speculative_generate
from ..step_costs import median_seconds
from ..verify import rejection_verify
from .measure import DraftForwardCounter

GREEDY = DraftRule(0.0)                                   # drafting as in the greedy loop


def realistic_context(target, prompt, context_len):
    """prompt continued by the target's greedy tokens up to context_len ids: what the loop drafts after."""
    return prompt + generate(target, prompt, context_len - len(prompt))


def drafter_context(target, drafter, context):
    """A drafter cache holding the target features of `context` (a list of ids)."""
    ids = torch.tensor([context], device=next(target.parameters()).device)              # (1, T)
    _, feats = target(ids, layer_ids=drafter.config.target_layer_ids)
    cache = drafter.new_cache(target.config.max_seq_len)
    drafter.extend(cache, feats, ids)
    return cache


# ----------------------------------------------------------------------------- the table

def format_table(rows):
    lines = [f"{'method':<36} {'tau':>6} {'fwd/token':>9} {'tok/s':>8} {'speedup':>8}"]
    for r in rows:
        lines.append(f"{r['name']:<36} {r['tau']:>6.2f} {r['forwards_per_token']:>9.3f} "
                     f"{r['tokens_per_s']:>8.1f} {r['speedup']:>7.2f}x")
    return "\n".join(lines)


def format_ceiling(row, plain):
    """The ceiling line of speculative row `row` against plain row `plain`, with its in-loop per-step
    costs."""
    b, t_plain = row["bound"], 1e3 / plain["tokens_per_s"]
    return (f"ceiling: speedup <= tau * t_plain / (t_draft + t_verify) = {b['tau']:.2f} * {t_plain:.3f} / "
            f"({1e3 * b['draft_s']:.3f} + {1e3 * b['verify_s']:.3f}) = {row['ceiling']:.2f}x   "
            f"(measured: {row['speedup']:.2f}x)\n"
            f"  in-loop ms: t_plain per token of '{plain['name']}' (1 / its tok/s); t_draft (draft + "
            f"extend), t_verify per step and tau (prefill's token included) of '{row['name']}'\n"
            "  on its median prompt: a bound by construction, no run is faster than its own draft + verify "
            "time")


def policy_costs(by_name, kind, B):
    """The costs block_policy weighs drafts by, as this run measured them in the loop: per-step time
    (draft + verify) of the greedy rows at B=4 and B, against plain greedy's time per token. None when a
    row is missing (or B <= 4)."""
    small, big = (by_name.get(f"{kind} greedy B={b}") for b in (4, B))
    plain = by_name.get("plain greedy")
    if B <= 4 or not (small and big and plain):
        return None
    per_step = lambda r: (r["draft_s"] + r["verify_s"]) / r["steps"]       # noqa: E731
    slot = (per_step(big) - per_step(small)) / (B - 4)                      # seconds per extra block slot
    one_draft = per_step(small) - 2 * slot                                  # a block of 2: anchor + 1 draft
    return dict(step_cost=one_draft * plain["tokens_per_s"], slot_cost=slot / one_draft)


def format_policy_costs(costs, table):
    """The in-loop costs next to the calibration block_size="auto" used (step_costs.py: `table`, cost(n) in
    steps without drafts)."""
    slot = (table[-1] - table[1]) / (len(table) - 2) / table[1]
    return (f"block_policy (B=auto) costs, in-loop from the greedy rows: a 1-draft step = "
            f"{costs['step_cost']:.2f} plain steps (calibrated: {table[1]:.2f} steps without drafts), one "
            f"more block slot = {costs['slot_cost']:.3f} of it (calibrated: {slot:.3f})")


# ----------------------------------------------------------------------------- step costs

@torch.no_grad()
def step_costs(target, drafter, prompt, context_len, block_size=16, n=50):
    """Median seconds of: one draft (B-1 tokens, one drafter pass), one verify (B tokens through the target
    with its cache, features captured) and one plain decoding step (1 token with the cache), all after
    the same `context_len` ids (prompt + the target's greedy continuation)."""
    device = next(target.parameters()).device
    B = min(block_size, drafter.config.block_size)
    context = realistic_context(target, prompt, context_len)
    ids = drafter.config.target_layer_ids
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
    return dict(block_size=B, context_len=L, draft_s=median_seconds(draft, device, n),
                verify_s=median_seconds(verify, device, n), plain_step_s=median_seconds(plain, device, n))


def time_draft(drafter, cache, anchor, n_draft, device, n=50):
    """Median seconds of one greedy draft step of n_draft tokens from `cache`."""
    return median_seconds(lambda: drafter.draft(cache, anchor, n_draft, GREEDY), device, n)


@torch.no_grad()
def draft_step_seconds(target, drafters, context, n_draft, n=50):
    """{name: median seconds of one greedy draft step of min(n_draft, B-1) tokens} after `context` (ids)."""
    device = next(target.parameters()).device
    return {name: time_draft(d, drafter_context(target, d, context), context[-1],
                             min(n_draft, d.config.block_size - 1), device, n)
            for name, d in drafters.items()}


def format_draft_steps(seconds, drafters, n_draft, reference):
    """One line per drafter: its draft step in ms, and how much dearer `reference`'s (the main drafter's)
    is."""
    lines = []
    for name, s in seconds.items():
        k = min(n_draft, drafters[name].config.block_size - 1)
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
    n_max = min(d.config.block_size for d in drafters.values()) - 1
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


# ----------------------------------------------------------------------------- oracle selector

class OracleSelector(DrafterInterface):
    """Wraps a DFlash-style drafter: drafts the true token wherever it is among the top_k candidates.

    `truth` is the whole greedy sequence, prompt + plain greedy output. The wrapped drafter's cache
    length is the number of verified positions, so the anchor sits at truth[cache.length] and slot j
    of the block predicts truth[cache.length + j]. Everything but the choice of token is the drafter's.
    """

    def __init__(self, drafter, truth, top_k=16):
        self.drafter, self.truth, self.top_k = drafter, list(truth), top_k
        self.config = drafter.config
        self.hits = self.slots = 0          # drafted slots whose true token was among the candidates / all

    def new_cache(self, max_len):
        return self.drafter.new_cache(max_len)

    def extend(self, cache, features, tokens):
        self.drafter.extend(cache, features, tokens)

    def context_length(self, cache):
        return self.drafter.context_length(cache)

    def draft(self, cache, anchor, n_draft, choose):
        start = cache.length                                                     # the anchor's position
        logits = self.drafter.slot_logits(cache, anchor, n_draft).detach().cpu()   # (n_draft, V)
        candidates = logits.topk(min(self.top_k, logits.size(-1)), dim=-1).indices   # (n_draft, K)
        picked = logits.argmax(-1)                                     # (n_draft,) the drafter's top-1
        for j in range(n_draft):
            pos = start + 1 + j                                        # the position slot j+1 predicts
            if pos < len(self.truth):
                self.slots += 1
                if bool((candidates[j] == self.truth[pos]).any()):
                    self.hits += 1
                    picked[j] = self.truth[pos]
        return choose(torch.nn.functional.one_hot(picked, logits.size(-1)).to(logits.dtype))  # (n_draft, V)


def oracle_selector_tau(drafter, prompts, references, block_size, top_k=16):
    """τ of greedy speculative decoding when a perfect selector picks among the drafter's top_k
    candidates per slot; references[i] = plain greedy output for prompts[i] (its length = new tokens)."""
    return oracle_selector_stats(drafter, prompts, references, block_size, top_k)["tau"]


@torch.no_grad()
def oracle_selector_stats(drafter, prompts, references, block_size, top_k=16):
    """oracle_selector_tau's run in full: dict(tau, candidate_recall, acceptance_lengths), where recall is
    the fraction of drafted slots whose true token was among the candidates."""
    lengths, hits, slots = [], 0, 0
    for prompt, ref in zip(prompts, references):
        oracle = OracleSelector(drafter, list(prompt) + list(ref), top_k)
        out, stats = speculative_generate(drafter.target, oracle, prompt, len(ref), block_size=block_size)
        if out != list(ref):
            raise ValueError("a reference is not the plain greedy output of its prompt: greedy speculative "
                             "decoding (lossless) produced something else")
        lengths += stats.acceptance_lengths
        hits, slots = hits + oracle.hits, slots + oracle.slots
    return dict(tau=sum(lengths) / max(len(lengths), 1), candidate_recall=hits / max(slots, 1),
                acceptance_lengths=lengths)


def oracle_section(target, family, prompts, max_new_tokens, rows_by_name, top_k=16):
    """For each DFlash-style drafter in family ({kind: drafter}), at B = min(16, its B): its greedy row's
    τ next to the oracle selector's. Returns (text, {row name: oracle_selector_stats(...)})."""
    references = [generate(target, p, max_new_tokens) for p in prompts]        # == every greedy row's output
    oracles = {}
    lines = [f"oracle-selector tau (ceiling of a perfect top-{top_k} selector; same prompts and B):",
             f"  {'drafter row':<26} {'tau':>6} {'oracle':>7} {'recall':>7}"]
    for kind, d in family.items():
        b = min(16, d.config.block_size)
        name = f"{kind} greedy B={b}"
        o = oracles[name] = oracle_selector_stats(d, prompts, references, b, top_k)
        tau = rows_by_name[name]["tau"] if name in rows_by_name else float("nan")
        lines.append(f"  {name:<26} {tau:>6.2f} {o['tau']:>7.2f} {o['candidate_recall']:>7.3f}")
    lines.append(f"  recall: fraction of drafted slots whose true token is among the drafter's top-{top_k} "
                 "logits")
    return "\n".join(lines), oracles


@torch.no_grad()
def slot_acceptance(target, drafter, prompts, max_new_tokens, temperature=0.7, top_p=0.95, seed=0):
    """Where sampled drafting loses tokens, slot by slot. Runs rejection-verified speculative sampling and, at
    every draft slot i the verifier reaches, records sum_x min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i) (the rule's
    acceptance probability there, given the drafts before it) and whether d_i was accepted.
    Returns dict(overlap=[mean sum min(p, q) per slot], accepted=[acceptance rate per slot],
    reached=[counts])."""
    n = drafter.config.block_size - 1
    overlap, accepted, reached = [0.0] * n, [0] * n, [0] * n

    def recording(drafts, q, p, generator):
        n_acc, bonus = rejection_verify(drafts, q, p, generator)
        for i in range(min(n_acc + 1, drafts.numel())):         # slots up to the first rejection
            overlap[i] += float(torch.minimum(p[i], q[i]).sum())
            accepted[i] += i < n_acc
            reached[i] += 1
        return n_acc, bonus
    recording.sample_drafts = True
    g = torch.Generator().manual_seed(seed)
    for prompt in prompts:
        speculative_generate(target, drafter, prompt, max_new_tokens, temperature=temperature, top_p=top_p,
                             verifier=recording, generator=g)
    return dict(overlap=[o / max(r, 1) for o, r in zip(overlap, reached)],
                accepted=[a / max(r, 1) for a, r in zip(accepted, reached)], reached=reached)


def format_slot_acceptance(result, name):
    return "\n".join([f"per-slot acceptance of '{name}' (slots 1..{len(result['reached'])}):",
                      "  sum min(p, q) " + " ".join(f"{x:.2f}" for x in result["overlap"]),
                      "  accepted      " + " ".join(f"{x:.2f}" for x in result["accepted"]),
                      "  sum min(p, q) = 1 - TV(p, q), the rejection rule's acceptance probability at a slot "
                      "it reaches; q close to p is what pays"])


def compare(row, others, what):
    """'<row> vs the best <what> setting (<name>, tau t): x the tokens/s', or None when either is missing."""
    if row is None or not others:
        return None
    best = max(others, key=lambda r: r["tokens_per_s"])
    return (f"{row['name']} vs the best {what} setting ({best['name']}, tau {best['tau']:.2f}): "
            f"{row['tokens_per_s'] / best['tokens_per_s']:.2f}x the tokens/s")
