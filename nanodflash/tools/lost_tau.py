"""Where τ is lost, for the benchmark: what a better selector could gain, and per-slot sampled acceptance.

1. Oracle-selector τ: a DFlash drafter's top-1 is often wrong while the target's token is among its
   top-16 candidates (docs/design.md). `oracle_selector_tau` measures the τ a *perfect* candidate selector
   would reach: per slot it drafts the true greedy token when it is among the drafter's top-K logits,
   else the drafter's argmax. It needs the answer (plain greedy output of the same prompt), so it is a
   ceiling to aim at, not a method; greedy speculative output equals plain greedy output, so every
   context the loop reaches is a prefix of that reference.
2. Per-slot acceptance when sampling (`slot_acceptance`): sum_x min(p, q) = 1 - TV(p, q) next to the
   measured acceptance rate, slot by slot, for the rejection rule.
"""

import torch

from ..drafter import DrafterInterface
from ..speculative import generate, speculative_generate
from ..verify import rejection_verify
from .watch import policy

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
        out, stats = speculative_generate(drafter.target, oracle, prompt, len(ref),
                                          block_size=policy(block_size))
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
        b = min(16, d.block_size)
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
    n = drafter.block_size - 1
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
