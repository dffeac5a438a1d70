"""Plain autoregressive decoding and DFlash speculative decoding (batch 1), side by side.

    tokens = generate(target, prompt_ids, max_new_tokens, temperature=0.0, ...)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens, ...)

Both return the generated ids only (a list of ints). Greedy speculative output is token-identical to
greedy `generate`; sampled speculative output has exactly the target's distribution (verify.py).
block_size: None = the drafter's B; an int <= B; "auto" = chosen each step from the acceptance so far
(block_policy.py: smaller blocks when sampling, and a plain step when no draft would pay).
The window rule: prompt + max_new_tokens must fit the target's max_seq_len, else ValueError.

`speculative_step` is the whole step in one function: draft, verify, accept, roll back both caches;
`speculative_generate` is the loop over it. Nothing in either times, records or calls back: tools/watch.py
runs the same loop with stopwatches and a callback around the step. The step, and why each verifier is
exact: docs/design.md §1.5-1.6.
"""

from dataclasses import dataclass
from functools import partial

import torch

from .ext import compiled
from .ext.block_policy import block_sizes
from .ext.step_costs import costs_for
from .loop import SpecStats, StepRecord, check_request, finished, prefill, step_tokens
from .sampling import DraftRule, Sampling, next_token
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


def verify_block(verifier, drafts, q, target_logits, sampling, generator):
    """The accept rule (verify.py): greedy at T=0, else match, rejection, or a custom callable. With no drafts
    every rule reduces to a plain decoding step: the next token of the target's first row."""
    if drafts.numel() == 0:
        return 0, int(sampling.next_token(target_logits[0], generator))
    if sampling.greedy:
        return greedy_verify(drafts, target_logits)
    p = sampling.probs(target_logits)                                   # (b, V) the target's distributions
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
class Request:
    """One generation's models, caches and rules: everything a step reads. The caches change step by step;
    the rest stays as it was made."""
    target: object
    drafter: object
    cache: object                 # the target's KV cache
    dcache: object                # the drafter's context
    sampling: Sampling            # how the target's tokens are drawn
    verifier: object              # "match", "rejection" or a callable (verify_block)
    choose: DraftRule             # how the drafter picks its drafts
    generator: object = None
    stops: frozenset = frozenset()


def start_request(target, drafter, prompt_ids, max_new_tokens, sampling, verifier="rejection",
                  stop_token_ids=None, generator=None, compile=False):
    """Check a request and make its caches, sized to it -> (Request, prompt (1, P)). compile: the drafter's
    block pass compiled (compiled.py)."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, sampling.temperature, sampling.top_k,
                                  sampling.top_p, stop_token_ids)
    n_max = prompt.size(1) + max_new_tokens
    dcache = compiled.new_cache(drafter, n_max) if compile else drafter.new_cache(n_max)
    return Request(target=target, drafter=drafter, cache=target.new_cache(1, n_max), dcache=dcache,
                   sampling=sampling, verifier=verifier, choose=draft_rule(verifier, sampling.temperature,
                   generator), generator=generator, stops=frozenset(stops)), prompt


def block_policy(request, block_size, compile=False):
    """The block size of each step (block_policy.py; "auto" prices drafts by the run folder's step costs)."""
    drafter, sampled = request.drafter, not request.sampling.greedy
    return block_sizes(block_size, drafter.block_size, sampled=sampled,
                       costs=partial(costs_for, drafter, 1, sampled, compile))


@torch.no_grad()
def speculative_step(request, anchor, b, left):
    """One DFlash step after `anchor` (the last emitted token, not yet run through the target): b-1 drafts in
    one drafter pass (none when b = 1: a plain step), [anchor, drafts] verified in one target pass, the
    verifier's prefix kept with its bonus, cut at the `left` tokens still allowed or at a stop token; both
    caches rolled to what was kept. -> its StepRecord."""
    r = request
    drafts, q = [], None
    if b > 1:
        tokens, q = r.drafter.draft(r.dcache, anchor, b - 1, r.choose)            # one drafter pass
        drafts = tokens.tolist()
    start = r.cache.length
    block = torch.tensor([[anchor] + drafts], device=r.cache.k.device)             # (1, b)
    logits, feats = r.target(block, r.cache, layer_ids=r.drafter.target_layer_ids)
    logits = logits[0].cpu()                                                       # (b, V), one target pass
    n_acc, bonus = verify_block(r.verifier, torch.tensor(drafts, dtype=torch.long), q, logits, r.sampling,
                                r.generator)
    new = step_tokens(drafts[:n_acc], bonus, left, r.stops)                        # a stop may cut it short
    r.cache.crop(start + len(new))          # the anchor and every new token but the last stay cached
    r.drafter.extend(r.dcache, feats[:, : len(new)], block[:, : len(new)])        # the kept positions
    return StepRecord(anchor=anchor, drafts=drafts, q=q, target_logits=logits, accepted=n_acc, new=new,
                      start=start, end=r.cache.length)


@torch.no_grad()
def speculative_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                         top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None,
                         compile=False):
    """DFlash: draft a block in one drafter pass, verify it in one target pass, keep the agreed prefix.
    verifier (temperature > 0): "rejection" (the default: it accepts more drafts, docs/sampling.md)
    or "match". compile: True runs the drafter's block pass compiled (compiled.py; the first call with a
    drafter compiles it, seconds to a minute; a drafter whose `compiles` is True). The target runs eager."""
    request, prompt = start_request(target, drafter, prompt_ids, max_new_tokens, Sampling(temperature, top_k,
                                    top_p), verifier, stop_token_ids, generator, compile)
    sizes = block_policy(request, block_size, compile)
    stats = SpecStats(target_cache=request.cache, draft_cache=request.dcache)
    out = [prefill(target, drafter, prompt, request.cache, request.dcache, request.sampling, generator)]
    while not finished(out, max_new_tokens, request.stops):
        left = max_new_tokens - len(out)
        # drafts may reach the last allowed token, as the official loop's do (a bonus past it is dropped)
        b = min(sizes.next(), left + 1)
        step = speculative_step(request, out[-1], b, left)
        sizes.update(b - 1, step.accepted)
        stats.record(b, len(step.new), min(step.accepted, len(step.new)))
        out += step.new
    return out, stats
