"""Plain autoregressive decoding and DFlash speculative decoding (batch 1), side by side.

    tokens = generate(target, prompt_ids, max_new_tokens, temperature=0.0, ...)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens, ...)

Both return the generated ids only (a list of ints). Greedy speculative output is token-identical to
greedy `generate`; sampled speculative output has exactly the target's distribution (verify.py).
block_size: None = the drafter's B; an int <= B; "auto" = chosen each step from the acceptance so far
(block_policy.py: smaller blocks when sampling, and a plain step when no draft would pay).
The window rule: prompt + max_new_tokens must fit the target's max_seq_len, else ValueError.
The step, and why each verifier is exact: docs/design.md §1.5-1.6.
"""

from dataclasses import dataclass
from functools import partial

import torch

from .block_policy import block_sizes
from .loop import Drafted, Instruments, SpecStats, Step, Verdict, check_request, decode
from .sampling import DraftRule, next_token, probs_from_logits
from .step_costs import costs_for
from .verify import greedy_verify, match_verify, rejection_verify

VERIFIERS = ("match", "rejection")
DECODE_THREADS = 1      # CPU threads the scripts, benchmarks and notebooks decode with: batch-1 decoding of
                        # these small models is bound by per-operation overhead, and more threads add sync


@torch.no_grad()
def generate(target, prompt_ids, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
             stop_token_ids=None, generator=None, on_token=None):
    """Plain decoding with the KV cache: one target forward per generated token. on_token: None, or a callable
    given each token as soon as it is chosen (tools/race.py notes the time of each)."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                  stop_token_ids)
    cache = target.new_cache(1, prompt.size(1) + max_new_tokens)     # only what this request needs
    logits, _ = target(prompt, cache)
    out = []
    while True:
        token = int(next_token(logits[0, -1].cpu(), temperature, top_k, top_p, generator))
        out.append(token)
        if on_token is not None:
            on_token(token)
        if len(out) == max_new_tokens or token in stops:
            return out
        logits, _ = target(torch.tensor([[token]], device=prompt.device), cache)


def verify_block(verifier, drafts, q, target_logits, temperature, top_k, top_p, generator):
    """The accept rule (verify.py): greedy at T=0, else match, rejection, or a custom callable. With no drafts
    every rule reduces to a plain decoding step: the next token of the target's first row."""
    if drafts.numel() == 0:
        return 0, int(next_token(target_logits[0], temperature, top_k, top_p, generator))
    if temperature == 0:
        return greedy_verify(drafts, target_logits)
    p = probs_from_logits(target_logits, temperature, top_k, top_p)    # (b, V) the target's distributions
    if callable(verifier):
        return verifier(drafts, q, p, generator)
    if verifier == "match":
        return match_verify(drafts, p, generator)
    return rejection_verify(drafts, q, p, generator)


def draft_rule(verifier, temperature, generator):
    """How the drafter picks each slot's token: its argmax, or a sample of q for a verifier that needs sampled
    drafts ("rejection", or a custom verifier callable with the attribute `sample_drafts = True`)."""
    if verifier not in VERIFIERS and not callable(verifier):
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")
    sample_drafts = temperature > 0 and getattr(verifier, "sample_drafts", verifier == "rejection")
    return DraftRule(temperature, sample_drafts, generator)


@dataclass(kw_only=True)
class PathStep(Step):
    """DFlash's step (loop.decode runs it): draft a block of b-1 tokens after the anchor in one drafter pass,
    verify [anchor, drafts] in one target pass, keep the agreed prefix and the bonus."""
    sizer: object                 # the block size of each step (block_policy.py)
    choose: DraftRule             # how the drafter picks its drafts
    verifier: object              # "match", "rejection" or a callable (verify_block)

    def draft(self, anchor, left):
        # Drafts may reach the last allowed token, as the official loop does (so the same blocks and the same
        # acceptance lengths); a bonus past the limit is dropped by loop.step_tokens.
        self.b = min(self.sizer.next(), left + 1)
        # b-1 drafts in one drafter pass; with none (b = 1) the step is a plain decoding step
        if self.b == 1:
            return Drafted(anchor, [])
        drafts, q = self.drafter.draft(self.dcache, anchor, self.b - 1, self.choose)
        return Drafted(anchor, drafts.tolist(), q)

    def verify(self, d):
        self.start = self.cache.length
        self.block = torch.tensor([[d.anchor] + d.drafts], device=self.cache.k.device)     # (1, b)
        logits, feats = self.target(self.block, self.cache, layer_ids=self.drafter.config.target_layer_ids)
        logits = logits[0].cpu()                                                 # (b, V), all in one pass
        drafts = torch.tensor(d.drafts, dtype=torch.long)
        n_acc, bonus = verify_block(self.verifier, drafts, d.q, logits, *self.sampling, self.generator)
        return Verdict(logits, feats, d.drafts[:n_acc], bonus)

    def keep(self, d, verdict, new):
        self.cache.crop(self.start + len(new))      # the anchor and every new token but the last stay cached

    def extend(self, d, verdict, new):
        self.drafter.extend(self.dcache, verdict.feats[:, : len(new)], self.block[:, : len(new)])

    def record(self, d, verdict, new):
        n_acc = len(verdict.accepted)
        self.sizer.update(self.b - 1, n_acc)
        self.stats.record(self.b, len(new), min(n_acc, len(new)))          # a stop may cut the bonus off


@torch.no_grad()
def speculative_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                         top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None,
                         on_step=None, compile=False):
    """DFlash: draft a block in one drafter pass, verify it in one target pass, keep the agreed prefix.
    verifier (temperature > 0): "rejection" (the default: it accepts more drafts, docs/sampling.md)
    or "match".
    on_step: None, or a callable that gets a loop.StepRecord after each step's verification, before the
    drafter's context is extended (tools/trace.py records a run with it); it runs outside the timed sections
    and must not touch the caches or the generator.
    compile: True runs the drafter's block pass compiled (compiled.py; the first call with a drafter compiles
    it, seconds to a minute; a drafter whose `compiles` is True). The target runs eager either way."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                  stop_token_ids)
    if compile and not drafter.compiles:
        raise ValueError(f"a {drafter.kind} drafter has no pass to compile; decode it with compile=False")
    sampled = temperature > 0
    sizer = block_sizes(block_size, drafter.config.block_size,                 # "auto": block_policy.py
                        costs=partial(costs_for, drafter, 1, sampled, compile), sampled=sampled)
    n_max = prompt.size(1) + max_new_tokens                                     # caches sized to the request
    cache = target.new_cache(1, n_max)
    dcache = drafter.new_cache(n_max, compiled=True) if compile else drafter.new_cache(n_max)
    stats = SpecStats(target_cache=cache, draft_cache=dcache)
    sampling = (temperature, top_k, top_p)
    step = PathStep(target=target, drafter=drafter, cache=cache, dcache=dcache, stats=stats, sizer=sizer,
                    choose=draft_rule(verifier, temperature, generator), verifier=verifier, sampling=sampling,
                    generator=generator)
    return decode(Instruments(step, stats, generator, on_step), prompt, max_new_tokens, stops), stats
