"""Plain autoregressive decoding and DFlash speculative decoding (batch 1), side by side.

    tokens = generate(target, prompt_ids, max_new_tokens, temperature=0.0, ...)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens, ...)

Both return the generated ids only (a list of ints). Greedy speculative output is token-identical to
greedy `generate`; sampled speculative output has exactly the target's distribution (verify.py).
block_size: None = the drafter's B; an int <= B; "auto" = chosen each step from the acceptance so far
(block_policy.py: smaller blocks when sampling, and a plain step when no draft would pay).
The window rule: prompt + max_new_tokens must fit the target's max_seq_len, else ValueError.
"""

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from .block_policy import AdaptiveBlockSize
from .sampling import DraftRule, check_sampling_args, next_token, probs_from_logits
from .verify import greedy_verify, match_verify, rejection_verify

VERIFIERS = ("match", "rejection")


@dataclass
class SpecStats:
    acceptance_lengths: list = field(default_factory=list)  # tokens emitted per draft+verify step (bonus included)
    accepted_drafts: list = field(default_factory=list)     # of those, how many were drafts (the rest: the bonus)
    block_sizes: list = field(default_factory=list)         # anchor + drafts of each step
    target_forwards: int = 0                                # prefill + one verify per step
    draft_time: float = 0.0                                 # seconds in the drafter (extend + draft)
    verify_time: float = 0.0                                # seconds in the target (verify forwards)
    prefill_time: float = 0.0
    target_cache: object = field(default=None, repr=False)  # the caches as the run left them (for inspection)
    draft_cache: object = field(default=None, repr=False)

    @property
    def tau(self):
        """Mean acceptance length τ over the steps (0.0 when there was no step)."""
        n = len(self.acceptance_lengths)
        return sum(self.acceptance_lengths) / n if n else 0.0

    @property
    def histogram(self):
        return dict(sorted(Counter(self.acceptance_lengths).items()))


def _check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p, stop_token_ids):
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


def _first_stop(tokens, stops):
    """Length of `tokens` kept when stopping right after the first stop token (len(tokens) if none)."""
    for i, t in enumerate(tokens):
        if t in stops:
            return i + 1
    return len(tokens)


@torch.no_grad()
def generate(target, prompt_ids, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
             stop_token_ids=None, generator=None):
    """Plain decoding with the KV cache: one target forward per generated token."""
    prompt, stops = _check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p, stop_token_ids)
    cache = target.new_cache(1, prompt.size(1) + max_new_tokens)     # only what this request needs
    logits, _ = target(prompt, cache)
    out = []
    while True:
        token = int(next_token(logits[0, -1].cpu(), temperature, top_k, top_p, generator))
        out.append(token)
        if len(out) == max_new_tokens or token in stops:
            return out
        logits, _ = target(torch.tensor([[token]], device=prompt.device), cache)


def _verify(verifier, drafts, q, target_logits, temperature, top_k, top_p, generator):
    """The accept rule (verify.py): greedy at T=0, else match, rejection, or a custom callable. With no drafts
    every rule reduces to a plain decoding step: the next token of the target's first row."""
    if drafts.numel() == 0:
        return 0, int(next_token(target_logits[0], temperature, top_k, top_p, generator))
    if temperature == 0:
        return greedy_verify(drafts, target_logits)
    p = probs_from_logits(target_logits, temperature, top_k, top_p)          # (b, V) the target's distributions
    if callable(verifier):
        return verifier(drafts, q, p, generator)
    if verifier == "match":
        return match_verify(drafts, p, generator)
    return rejection_verify(drafts, q, p, generator)


@torch.no_grad()
def speculative_generate(target, drafter, prompt_ids, max_new_tokens, block_size=None, temperature=0.0,
                         top_k=None, top_p=None, verifier="match", stop_token_ids=None, generator=None):
    """DFlash: draft a block in one drafter pass, verify it in one target pass, keep the agreed prefix."""
    prompt, stops = _check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p, stop_token_ids)
    auto = block_size == "auto"                                                 # chosen per step (block_policy.py)
    B = drafter.config.block_size if block_size is None or auto else block_size
    if isinstance(B, str) or int(B) != B or not 1 <= B <= drafter.config.block_size:
        raise ValueError(f"block_size must be \"auto\" or an integer in [1, {drafter.config.block_size}] "
                         f"(the drafter was trained with block_size={drafter.config.block_size}), got {block_size!r}")
    sizer = AdaptiveBlockSize(B) if auto else None
    if verifier not in VERIFIERS and not callable(verifier):
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")
    greedy, ids = temperature == 0, drafter.config.target_layer_ids
    # drafts are the drafter's argmax, except for rejection sampling (a custom verifier callable may
    # ask for sampled drafts with an attribute `samples_drafts = True`)
    sample_drafts = getattr(verifier, "samples_drafts", verifier == "rejection") and not greedy
    choose = DraftRule(temperature, sample_drafts, generator)
    n_max = prompt.size(1) + max_new_tokens                                     # caches sized to the request
    cache, dcache = target.new_cache(1, n_max), drafter.new_cache(n_max)
    stats, t0 = SpecStats(target_forwards=1, target_cache=cache, draft_cache=dcache), time.perf_counter()
    logits, feats = target(prompt, cache, layer_ids=ids)                        # prefill, with features
    drafter.extend(dcache, feats, prompt)                                        # context = the whole prompt
    out = [int(next_token(logits[0, -1].cpu(), temperature, top_k, top_p, generator))]  # first bonus token
    stats.prefill_time = time.perf_counter() - t0
    while len(out) < max_new_tokens and out[-1] not in stops:
        left = max_new_tokens - len(out)                                         # drafts may reach the last
        anchor, start = out[-1], cache.length                                    # allowed token (as the official
        b = min(sizer.next() if auto else B, left + 1)                           # loop does: same blocks, so the
        # same acceptance lengths); the bonus past the limit is dropped below
        t0 = time.perf_counter()
        if b > 1:
            drafts, q = drafter.draft(dcache, anchor, b - 1, choose)             # b-1 tokens, one drafter pass
        else:                           # no drafts: a plain step, no drafter pass (its context stays queued)
            drafts, q = torch.zeros(0, dtype=torch.long), None
        t1 = time.perf_counter()
        block = torch.tensor([[anchor] + drafts.tolist()], device=prompt.device)  # (1, b)
        logits, feats = target(block, cache, layer_ids=ids)                      # verify all b in one pass
        target_logits = logits[0].cpu()                                          # (b, V): after anchor, d_1, ...
        n_acc, bonus = _verify(verifier, drafts, q, target_logits, temperature, top_k, top_p, generator)
        new = drafts[:n_acc].tolist() + [bonus]
        new = new[: min(left, _first_stop(new, stops))]                         # cut at the limit, or right
        cache.crop(start + len(new))                                             # after a stop token; keep the
        t2 = time.perf_counter()                                                 # anchor + new tokens but the last
        drafter.extend(dcache, feats if feats is None else feats[:, : len(new)], block[:, : len(new)])  # -> context
        out += new
        if auto:
            sizer.update(b - 1, n_acc)
        stats.block_sizes.append(b)
        stats.acceptance_lengths.append(len(new))
        stats.accepted_drafts.append(min(n_acc, len(new)))                      # a stop token may cut the bonus off
        stats.target_forwards += 1
        stats.verify_time += t2 - t1
        stats.draft_time += (t1 - t0) + (time.perf_counter() - t2)
    return out, stats
