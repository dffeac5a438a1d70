"""What the decoders and tools that time their steps add to the core's records: the seconds of a run
(TimedStats), what a watcher or a tree knows of a step (WatchedStep), and the generator's state before a
step's draws (rng_state, to replay them).
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..speculative import SpecStats, StepRecord


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


@dataclass
class WatchedStep(StepRecord):
    """A StepRecord with what an on_step callback gets besides (tools/watch.py for a path, tree.py's own loop
    for a tree)."""
    tree: object = None        # tree decoding: the Tree (tree.py) ...
    path: list = None          # ... and the accepted path's nodes, root first
    draft_cache: object = None  # the drafter's cache as it was before the step's extend (during a callback)
    draft_s: float = None      # seconds of this step's drafter work
    verify_s: float = None     # seconds of its target pass and verification
    rng_state: object = None   # the generator's state before verification


def rng_state(generator):
    """The state of `generator` (None: torch's default generator), to replay the draws that follow."""
    return (generator if generator is not None else torch.default_generator).get_state()
