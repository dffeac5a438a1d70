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

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .block_policy import block_sizes
from .sampling import DraftRule, check_sampling_args, next_token, probs_from_logits
from .step_costs import measured_costs
from .verify import greedy_verify, match_verify, rejection_verify

VERIFIERS = ("match", "rejection")
# a step without drafts: a plain decoding step inside the loop
NO_DRAFTS = torch.zeros(0, dtype=torch.long)


@dataclass
class SpecStats:
    acceptance_lengths: list = field(default_factory=list)  # tokens emitted per step (bonus included)
    accepted_drafts: list = field(default_factory=list)     # of those, how many were drafts (not the bonus)
    block_sizes: list = field(default_factory=list)         # anchor + drafts of each step
    target_forwards: int = 1                                # the prefill + one verify per step
    draft_time: float = 0.0                                 # seconds in the drafter (extend + draft)
    verify_time: float = 0.0                                # seconds in the target (verify forwards)
    prefill_time: float = 0.0
    target_cache: object = field(default=None, repr=False)  # the caches as the run left them (for inspection)
    draft_cache: object = field(default=None, repr=False)

    def record(self, block_size, emitted, accepted_drafts):
        """Count one draft + verify step."""
        self.block_sizes.append(block_size)
        self.acceptance_lengths.append(emitted)
        self.accepted_drafts.append(accepted_drafts)
        self.target_forwards += 1

    @contextmanager
    def timer(self, name):
        """Add the seconds spent in the `with` body to the field `name` (draft_time, verify_time, ...)."""
        t0 = time.perf_counter()
        yield
        setattr(self, name, getattr(self, name) + time.perf_counter() - t0)

    @property
    def tau(self):
        """Mean acceptance length τ over the steps (0.0 when there was no step)."""
        n = len(self.acceptance_lengths)
        return sum(self.acceptance_lengths) / n if n else 0.0

    @property
    def histogram(self):
        return dict(sorted(Counter(self.acceptance_lengths).items()))


def check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p, stop_token_ids):
    """Validate the common arguments; return the prompt as a (1, P) LongTensor on the target's device."""
    check_sampling_args(temperature, top_k, top_p)
    device = next(target.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).flatten()
    if prompt.numel() == 0:
        raise ValueError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens}")
    vocab, window = target.config.vocab_size, target.config.max_seq_len
    if int(prompt.min()) < 0 or int(prompt.max()) >= vocab:
        raise ValueError(f"prompt has token ids outside the target's vocabulary [0, {vocab})")
    if prompt.numel() + max_new_tokens > window:
        raise ValueError(f"prompt ({prompt.numel()} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"target's max_seq_len ({window}); shorten the prompt or ask for fewer tokens")
    return prompt[None], set(stop_token_ids or ())


def first_stop(tokens, stops):
    """Length of `tokens` kept when stopping right after the first stop token (len(tokens) if none)."""
    for i, t in enumerate(tokens):
        if t in stops:
            return i + 1
    return len(tokens)


def finished(out, max_new_tokens, stops):
    """Is a generation done: max_new_tokens emitted, or the last one a stop token?"""
    return len(out) >= max_new_tokens or out[-1] in stops


def step_tokens(accepted, bonus, left, stops):
    """What one step emits: the accepted drafts and the bonus, cut at the `left` tokens still allowed or right
    after the first stop token (so a stop can cut the bonus, or drafts, off)."""
    new = list(accepted) + [bonus]
    return new[: min(left, first_stop(new, stops))]


@dataclass
class StepRecord:
    """What one draft + verify step did, for an on_step callback (tools/trace.py). The target cache held
    `start` positions before the step and `end` after; the drafter's context is extended by len(new) right
    after the callback. Row i of target_logits is the target's view after the anchor and the first i drafts
    (a tree's: after node i's path)."""
    anchor: int
    drafts: list               # the drafts in order (a tree's: its nodes after the root)
    q: object                  # (n, V) the drafter's q when drafts were sampled, else None
    target_logits: object      # (n+1, V) the target's logits at the anchor and each draft (CPU)
    accepted: int              # how many drafts the verifier kept
    new: list                  # tokens emitted: kept drafts and the bonus, cut at the limit or a stop
    start: int
    end: int
    draft_cache: object        # the drafter's cache, before the step's extend
    draft_s: float             # seconds of this step's drafter pass
    verify_s: float            # seconds of its target pass and verification
    rng_state: object          # the generator's state before verification
    tree: object = None        # tree decoding: the Tree (tree.py) ...
    path: list = None          # ... and the accepted path's nodes, root first


def rng_state(generator):
    """The state of `generator` (None: torch's default generator), to replay the draws that follow."""
    return (generator if generator is not None else torch.default_generator).get_state()


def prefill(target, drafter, prompt, cache, dcache, sampling, generator):
    """The prompt (1, P) through the target in one pass; its features at the drafter's layers become the
    drafter's first context. -> the first generated token, drawn from the target's last position
    (sampling = (temperature, top_k, top_p))."""
    logits, feats = target(prompt, cache, layer_ids=drafter.config.target_layer_ids)
    drafter.extend(dcache, feats, prompt)                                    # the context: the whole prompt
    return int(next_token(logits[0, -1].cpu(), *sampling, generator))


@torch.no_grad()
def generate(target, prompt_ids, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
             stop_token_ids=None, generator=None):
    """Plain decoding with the KV cache: one target forward per generated token."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                  stop_token_ids)
    cache = target.new_cache(1, prompt.size(1) + max_new_tokens)     # only what this request needs
    logits, _ = target(prompt, cache)
    out = []
    while True:
        token = int(next_token(logits[0, -1].cpu(), temperature, top_k, top_p, generator))
        out.append(token)
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


@torch.no_grad()
def speculative_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                         top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None,
                         on_step=None):
    """DFlash: draft a block in one drafter pass, verify it in one target pass, keep the agreed prefix.
    verifier (temperature > 0): "rejection" (the default: it accepts more drafts, docs/sampling.md)
    or "match".
    on_step: None, or a callable that gets a StepRecord after each step's verification, before the drafter's
    context is extended (tools/trace.py records a run with it); it runs outside the timed sections and must
    not touch the caches or the generator."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                  stop_token_ids)
    # the block size: fixed, or "auto" (block_policy.py)
    sizer = block_sizes(block_size, drafter.config.block_size,                 # "auto": block_policy.py
                        costs=lambda: measured_costs(target, drafter, sampled=temperature > 0))
    choose, ids = draft_rule(verifier, temperature, generator), drafter.config.target_layer_ids
    n_max = prompt.size(1) + max_new_tokens                                     # caches sized to the request
    cache, dcache = target.new_cache(1, n_max), drafter.new_cache(n_max)
    stats = SpecStats(target_cache=cache, draft_cache=dcache)
    with stats.timer("prefill_time"):
        out = [prefill(target, drafter, prompt, cache, dcache, (temperature, top_k, top_p), generator)]
    while not finished(out, max_new_tokens, stops):
        # Drafts may reach the last allowed token, as the official loop does (so the same blocks and the same
        # acceptance lengths); a bonus past the limit is dropped below.
        left, anchor, start = max_new_tokens - len(out), out[-1], cache.length
        b = min(sizer.next(), left + 1)
        # b-1 drafts in one drafter pass; with none (b = 1) the step is a plain decoding step
        timed = (stats.draft_time, stats.verify_time)                             # (for on_step)
        with stats.timer("draft_time"):
            drafts, q = drafter.draft(dcache, anchor, b - 1, choose) if b > 1 else (NO_DRAFTS, None)
        block = torch.tensor([[anchor] + drafts.tolist()], device=prompt.device)  # (1, b)
        rng = rng_state(generator) if on_step else None                    # the verifier's draws, replayable
        with stats.timer("verify_time"):
            logits, feats = target(block, cache, layer_ids=ids)                  # all b in one target pass
            n_acc, bonus = verify_block(verifier, drafts, q, logits[0].cpu(), temperature, top_k, top_p,
                                        generator)
            # The target cache keeps the anchor and every new token but the last, the next step's anchor
            new = step_tokens(drafts[:n_acc].tolist(), bonus, left, stops)
            cache.crop(start + len(new))
        if on_step:
            on_step(StepRecord(anchor, drafts.tolist(), q, logits[0].cpu(), n_acc, new, start, cache.length,
                               dcache, stats.draft_time - timed[0], stats.verify_time - timed[1], rng))
        with stats.timer("draft_time"):
            # verified positions -> context
            drafter.extend(dcache, feats[:, : len(new)], block[:, : len(new)])
        out += new
        sizer.update(b - 1, n_acc)
        stats.record(b, len(new), min(n_acc, len(new)))                        # a stop may cut the bonus off
    return out, stats
