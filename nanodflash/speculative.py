"""Plain autoregressive decoding and DFlash speculative decoding (batch 1), side by side.

    tokens = generate(target, prompt_ids, max_new_tokens, temperature=0.0, ...)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, max_new_tokens, ...)

Both return the generated ids only (a list of ints). Greedy speculative output is token-identical to
greedy `generate`; sampled speculative output has exactly the target's distribution (verify.py).
block_size: None = the drafter's B; an int <= B; or a policy, `policy(drafter, sampling)` -> an object with
next() and update(n_drafts, n_accepted), such as ext/block_policy.py's `auto` (the block chosen each step from
the acceptance so far). The window rule: prompt + max_new_tokens must fit the target's max_seq_len, else
ValueError.

`speculative_step` is the whole step in one function: draft, verify, accept, roll back both caches;
`speculative_generate` is the loop over it. Nothing in either times, records or calls back: tools/watch.py
runs the same loop with stopwatches and a callback around the step. The tree and batched decoders (ext/)
share the helpers here (the request's checks, the prefill, what a step emits, the records), so that a
request, a stop token and the token limit mean the same in each. The step, and why each verifier is exact:
docs/design.md §1.5-1.6.
"""

from collections import Counter
from dataclasses import dataclass, field

import torch

from .sampling import DraftRule, Sampling, check_sampling_args, next_token
from .verify import greedy_verify, match_verify, rejection_verify

VERIFIERS = ("match", "rejection")


@dataclass
class SpecStats:
    acceptance_lengths: list = field(default_factory=list)  # tokens emitted per step (bonus included)
    accepted_drafts: list = field(default_factory=list)     # of those, how many were drafts (not the bonus)
    block_sizes: list = field(default_factory=list)         # anchor + drafts of each step
    target_forwards: int = 1                                # the prefill + one verify per step
    target_cache: object = field(default=None, repr=False)  # the caches as the run left them (for inspection)
    draft_cache: object = field(default=None, repr=False)

    def record(self, block_size, emitted, accepted_drafts):
        """Count one draft + verify step."""
        self.block_sizes.append(block_size)
        self.acceptance_lengths.append(emitted)
        self.accepted_drafts.append(accepted_drafts)
        self.target_forwards += 1

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


def finished(out, max_new_tokens, stops):
    """Is a generation done: max_new_tokens emitted, or the last one a stop token?"""
    return len(out) >= max_new_tokens or out[-1] in stops


def step_tokens(accepted, bonus, left, stops):
    """What one step emits: the accepted drafts and the bonus, cut at the `left` tokens still allowed or right
    after the first stop token (so a stop can cut the bonus, or drafts, off)."""
    new = list(accepted) + [bonus]
    stop = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))       # right after the first stop
    return new[: min(left, stop)]


def prefill(target, drafter, prompt, cache, dcache, sampling, generator):
    """The prompt (1, P) through the target in one pass; its features at the drafter's layers become the
    drafter's first context. -> the first generated token, drawn from the target's last position as
    `sampling` (a sampling.Sampling) says."""
    logits, feats = target(prompt, cache, layer_ids=drafter.target_layer_ids)
    drafter.extend(dcache, feats, prompt)                                    # the context: the whole prompt
    return int(sampling.next_token(logits[0, -1].cpu(), generator))


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


@dataclass
class StepRecord:
    """What one draft + verify step did: what speculative_step returns (ext/timing.py's WatchedStep adds what
    a watcher and a tree know). The target cache held `start` positions before the step and `end` after.
    Row i of target_logits is the target's view after the anchor and the first i drafts (a tree's: after
    node i's path)."""
    anchor: int
    drafts: list               # the drafts in order (a tree's: its nodes after the root)
    q: object                  # (n, V) the drafter's q when drafts were sampled, else None
    target_logits: object      # (n+1, V) the target's logits at the anchor and each draft (CPU)
    accepted: int              # how many drafts the verifier kept
    new: list                  # tokens emitted: kept drafts and the bonus, cut at the limit or a stop
    start: int
    end: int


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
                  stop_token_ids=None, generator=None):
    """Check a request and make its caches, sized to it -> (Request, prompt (1, P))."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, sampling.temperature, sampling.top_k,
                                  sampling.top_p, stop_token_ids)
    n_max = prompt.size(1) + max_new_tokens
    return Request(target=target, drafter=drafter, cache=target.new_cache(1, n_max),
                   dcache=drafter.new_cache(n_max),
                   sampling=sampling, verifier=verifier, choose=draft_rule(verifier, sampling.temperature,
                   generator), generator=generator, stops=frozenset(stops)), prompt


class FixedBlockSize:
    """The same block size every step: a block-size policy (next() before a step, update() after)."""

    def __init__(self, block_size):
        self.block_size = block_size

    def next(self):
        return self.block_size

    def update(self, n_drafts, n_accepted):
        pass


def fixed_block_size(block_size, B):
    """FixedBlockSize of block_size (None = B) for a drafter trained with B; ValueError out of range."""
    b = B if block_size is None else block_size
    if isinstance(b, (str, bool)) or int(b) != b or not 1 <= b <= B:
        raise ValueError(f"block_size must be \"auto\" or an integer in [1, {B}] (the drafter was trained "
                         f"with block_size={B}), got {block_size!r}")
    return FixedBlockSize(int(b))


def block_sizes(block_size, drafter, sampling):
    """The block size of each step, as one object: `next()` before a step, `update(n_drafts, n_accepted)`
    after. block_size: None = the drafter's B, an int in [1, B], or a policy `block_size(drafter, sampling)`
    (ext/block_policy.auto)."""
    if callable(block_size):
        return block_size(drafter, sampling)
    return fixed_block_size(block_size, drafter.block_size)


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
                         top_k=None, top_p=None, verifier="rejection", stop_token_ids=None, generator=None):
    """DFlash: draft a block in one drafter pass, verify it in one target pass, keep the agreed prefix.
    verifier (temperature > 0): "rejection" (the default: it accepts more drafts, docs/sampling.md)
    or "match". A compiled drafter pass: speculative_generate(target, compile_drafter(drafter), ...)
    (ext/compiled.py)."""
    sampling = Sampling(temperature, top_k, top_p)
    request, prompt = start_request(target, drafter, prompt_ids, max_new_tokens, sampling, verifier,
                                    stop_token_ids, generator)
    sizes = block_sizes(block_size, drafter, sampling)
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
