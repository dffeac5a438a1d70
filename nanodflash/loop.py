"""The speculative loop the path and tree decoders share, and what it records.

    out = decode(step, prompt, max_new_tokens, stops)

A step has four parts, supplied by the decoder: draft (a block, speculative.PathStep; or a tree,
tree.TreeStep) in one drafter pass; verify it in one target pass and apply the accept rule; keep (roll the
target's cache back to what plain decoding would hold); extend (the kept positions become the drafter's
context). The loop around them is the same for both, and so is everything that watches a step without
taking part: the timers, the generator's state for replaying verification, and the on_step callback live in
`Instruments`, which wraps a step and is never called by it.
"""

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .sampling import check_sampling_args, next_token


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


def prefill(target, drafter, prompt, cache, dcache, sampling, generator):
    """The prompt (1, P) through the target in one pass; its features at the drafter's layers become the
    drafter's first context. -> the first generated token, drawn from the target's last position
    (sampling = (temperature, top_k, top_p))."""
    logits, feats = target(prompt, cache, layer_ids=drafter.config.target_layer_ids)
    drafter.extend(dcache, feats, prompt)                                    # the context: the whole prompt
    return int(next_token(logits[0, -1].cpu(), *sampling, generator))


@dataclass
class Drafted:
    """What a step drafted: the drafts after `anchor` (a tree's: its nodes after the root), q when they were
    sampled, and the tree (None for a path)."""
    anchor: int
    drafts: list
    q: object = None
    tree: object = None


@dataclass
class Verdict:
    """What verification decided: the target's logits (n+1, V) on the CPU (row i: after the anchor and the
    first i drafts, or a tree's node i), its features, the accepted drafts, the bonus, and a tree's accepted
    path of nodes (None for a path)."""
    logits: object
    feats: object
    accepted: list
    bonus: int
    path: list = None


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
    rng_state: object = None   # the generator's state before verification
    tree: object = None        # tree decoding: the Tree (tree.py) ...
    path: list = None          # ... and the accepted path's nodes, root first


def rng_state(generator):
    """The state of `generator` (None: torch's default generator), to replay the draws that follow."""
    return (generator if generator is not None else torch.default_generator).get_state()


@dataclass(kw_only=True)
class Step:
    """What every decoder's step holds: the models, their caches, the stats, the sampling settings. A decoder
    adds draft, verify, keep, extend and record (speculative.PathStep, tree.TreeStep)."""
    target: object
    drafter: object
    cache: object                 # the target's KV cache
    dcache: object                # the drafter's context
    stats: SpecStats
    sampling: tuple               # (temperature, top_k, top_p)
    generator: object = None

    def prefill(self, prompt):
        return prefill(self.target, self.drafter, prompt, self.cache, self.dcache, self.sampling,
                       self.generator)


def decode(step, prompt, max_new_tokens, stops):
    """The loop: the prompt (1, P) through the target, then steps until max_new_tokens or a stop token."""
    out = [step.prefill(prompt)]                                # the first token: the target's own
    while not finished(out, max_new_tokens, stops):
        left = max_new_tokens - len(out)
        drafted = step.draft(out[-1], left)                     # one drafter pass: a block or a tree
        verdict = step.verify(drafted)                          # one target pass, then the accept rule
        new = step_tokens(verdict.accepted, verdict.bonus, left, stops)
        step.keep(drafted, verdict, new)                        # the target cache: what plain decoding holds
        step.extend(drafted, verdict, new)                      # the kept positions: the drafter's context
        out += new
        step.record(drafted, verdict, new)
    return out


class Instruments:
    """A step, watched: its drafter work (draft, extend) and target work (verify, keep) timed into `stats`,
    and, with an on_step callback, the generator's state captured before verification and a StepRecord
    handed over after keep, before the drafter's context is extended. The step never sees any of it."""

    def __init__(self, step, stats, generator=None, on_step=None):
        self.step, self.stats, self.generator, self.on_step = step, stats, generator, on_step

    def prefill(self, prompt):
        with self.stats.timer("prefill_time"):
            return self.step.prefill(prompt)

    def draft(self, anchor, left):
        self.start, self.timed = self.step.cache.length, (self.stats.draft_time, self.stats.verify_time)
        with self.stats.timer("draft_time"):
            return self.step.draft(anchor, left)

    def verify(self, drafted):
        self.rng = rng_state(self.generator) if self.on_step else None     # the verifier's draws, replayable
        with self.stats.timer("verify_time"):
            return self.step.verify(drafted)

    def keep(self, drafted, verdict, new):
        with self.stats.timer("verify_time"):
            self.step.keep(drafted, verdict, new)
        if self.on_step:
            s, (d0, v0) = self.stats, self.timed
            self.on_step(StepRecord(
                anchor=drafted.anchor, drafts=drafted.drafts, q=drafted.q, target_logits=verdict.logits,
                accepted=len(verdict.accepted), new=new, start=self.start, end=self.step.cache.length,
                draft_cache=self.step.dcache, draft_s=s.draft_time - d0, verify_s=s.verify_time - v0,
                rng_state=self.rng, tree=drafted.tree, path=verdict.path))

    def extend(self, drafted, verdict, new):
        with self.stats.timer("draft_time"):
            self.step.extend(drafted, verdict, new)

    def record(self, drafted, verdict, new):
        self.step.record(drafted, verdict, new)
