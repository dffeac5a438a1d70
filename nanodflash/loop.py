"""What the speculative decoders share: checking a request, the prefill, what a step emits, and the records
a run keeps.

The batch-1 path decoder (speculative.py) is one loop over one step function; the tree decoder (tree.py)
keeps its own step and loop; the batched decoder (batch.py) its own. They share the helpers here, so that a
request, a stop token and the token limit mean the same in each.
"""

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .sampling import check_sampling_args


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


@dataclass
class TimedStats(SpecStats):
    """SpecStats with the seconds a run spent in the drafter and the target, for the decoders and tools that
    time their steps (the tree and batched decoders; tools/watch.py for the path decoder)."""
    draft_time: float = 0.0                                 # seconds in the drafter (extend + draft)
    verify_time: float = 0.0                                # seconds in the target (verify forwards)
    prefill_time: float = 0.0

    @contextmanager
    def timer(self, name):
        """Add the seconds spent in the `with` body to the field `name` (draft_time, verify_time, ...)."""
        t0 = time.perf_counter()
        yield
        setattr(self, name, getattr(self, name) + time.perf_counter() - t0)


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
    drafter's first context. -> the first generated token, drawn from the target's last position as
    `sampling` (a sampling.Sampling) says."""
    logits, feats = target(prompt, cache, layer_ids=drafter.target_layer_ids)
    drafter.extend(dcache, feats, prompt)                                    # the context: the whole prompt
    return int(sampling.next_token(logits[0, -1].cpu(), generator))


@dataclass
class StepRecord:
    """What one draft + verify step did: what speculative.speculative_step returns, and what an on_step
    callback gets (tools/watch.py for a path, tree.py's own loop for a tree). The target cache held `start`
    positions before the step and `end` after. Row i of target_logits is the target's view after the anchor
    and the first i drafts (a tree's: after node i's path). The last four fields are a watcher's, filled in
    for a callback only: a step times nothing."""
    anchor: int
    drafts: list               # the drafts in order (a tree's: its nodes after the root)
    q: object                  # (n, V) the drafter's q when drafts were sampled, else None
    target_logits: object      # (n+1, V) the target's logits at the anchor and each draft (CPU)
    accepted: int              # how many drafts the verifier kept
    new: list                  # tokens emitted: kept drafts and the bonus, cut at the limit or a stop
    start: int
    end: int
    tree: object = None        # tree decoding: the Tree (tree.py) ...
    path: list = None          # ... and the accepted path's nodes, root first
    draft_cache: object = None  # the drafter's cache as it was before the step's extend (during a callback)
    draft_s: float = None      # seconds of this step's drafter work
    verify_s: float = None     # seconds of its target pass and verification
    rng_state: object = None   # the generator's state before verification


def rng_state(generator):
    """The state of `generator` (None: torch's default generator), to replay the draws that follow."""
    return (generator if generator is not None else torch.default_generator).get_state()
