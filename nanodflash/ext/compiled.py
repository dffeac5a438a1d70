"""The drafter's pass compiled (torch.compile, gpt-fast style): the same modules, in shapes a compiler keeps.

    tokens, stats = speculative_generate(target, compile_drafter(drafter), prompt, n)
    python -m nanodflash.tools.calibrate --out out --compile    # the step costs "auto" reads when compiled

A drafter pass is many small tensor operations (2 layers, a block of 2-16 slots), so on a CPU much of its
time is the cost of launching each one; a compiled graph fuses them. What the eager pass does that a
compiler cannot keep, and what this module does instead:

- The eager pass attends to the first `cache.length` context positions, a shape that grows every step. The
  compiled one attends to the cache's WHOLE buffer with a mask that hides the positions not filled yet: the
  same softmax weights (a hidden key gets weight exactly 0). The buffer's context length is rounded up to a
  power of two (`buffer_length`; the buffer holds a block more), so that requests share a few shapes, and a
  request's shape never changes. A cache made for it is zeroed, since 0 * NaN is NaN: a hidden key must
  hold a finite number.
- The block's length b changes from step to step. torch compiles a graph for the first b it meets, and at
  the second b one where b is a symbol, which serves every later b but those a layer's Python branches on
  (a DFlash 2 convolution at b = 2 gets its own): two or three graphs for a DFlash 2 drafter and a buffer
  length, and a decode that meets no new kind of size compiles none (`graphs_compiled` counts them).

Only the block pass is compiled: the context's projection (a varying number of new positions), the selector
and the walk that picks the drafts stay eager, and so does the target: where a small operation costs little,
a compiled target layer runs no faster than an eager one (docs/log.md has the measurements, and a CPU where a
compiled target forward did pay). A compiled run's drafts can differ from the eager
run's where two logits are within rounding of each other (a fused kernel adds in another order); the
verifier decides what is kept, so the output is the target's either way (tests/test_compiled.py).
"""

import torch

from ..drafter import ContextCache

GRAPHS_PER_PASS = 64    # graphs torch may keep for the pass (it counts them for every drafter together)


def buffer_length(max_len, window):
    """The compiled cache's positions for a request of max_len: the next power of two, at least 128 (a short
    request and the benchmark's 112 positions share one), at most the target's window unless max_len is more.

    >>> buffer_length(112, 512), buffer_length(300, 512), buffer_length(20, 512), buffer_length(300, 256)
    (128, 512, 128, 300)
    """
    return max(max_len, min(window, max(128, 1 << (max_len - 1).bit_length())))


def context_mask(n, max_len, b, device):
    """Bool (1, 1, b, max_len + b): every slot may see context positions 0..n-1 of a max_len buffer and the
    whole block, nothing else (the eager pass's keys: the first n positions, then the block)."""
    keys = torch.arange(max_len + b, device=device)
    sees = (keys < n) | (keys >= max_len)                                       # (max_len + b,)
    return sees.expand(b, -1)[None, None]                                       # (1, 1, b, max_len + b)


def run_pass(drafter, x, cos, sin, context, mask):
    """What is compiled: the drafter's own `block_pass`, the drafter an argument (one function for every
    drafter; torch keeps a graph per kind of drafter and size, and holds no drafter alive)."""
    return drafter.block_pass(x, cos, sin, context, mask)


class CompiledCache(ContextCache):
    """A drafter's context whose block passes run compiled, over its whole zeroed buffer with a mask."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.k.zero_()                            # a hidden key must hold a finite number (0 * NaN is NaN)
        self.v.zero_()
        # run_pass compiled: torch keeps the graphs with run_pass's code, so every cache shares them, and the
        # first calls for a drafter compile its graphs, seconds each
        self.run_pass = torch.compile(run_pass, fullgraph=True)

    def attend(self, drafter, x, cos, sin):
        """The drafter's layers over the embedded block x (1, b, D) at RoPE cos, sin (1, b, hd), attending to
        the whole buffer, the positions not verified yet masked -> final hidden states (1, b, D): what
        ContextCache.attend gives, to rounding."""
        mask = context_mask(self.length, self.max_len, x.size(1), x.device)
        with torch.compiler.config.patch(recompile_limit=GRAPHS_PER_PASS):
            return self.run_pass(drafter, x, cos, sin, self.by_layer, mask)


def require_block_pass(drafter):
    """Refuse a drafter whose drafts do not run through Drafter.block_pass: it has nothing to compile."""
    if not drafter.uses_block_pass:
        raise ValueError(f"a {drafter.kind} drafter has no pass to compile; decode it as it is")


def new_cache(drafter, max_len):
    """A CompiledCache for `drafter` (one whose `uses_block_pass` is True) and a request of `max_len`
    positions: a buffer of one of a few lengths (buffer_length), so that requests of many lengths share a
    graph."""
    require_block_pass(drafter)
    p = next(drafter.parameters())
    length = buffer_length(max_len, drafter.target.config.max_seq_len) + drafter.block_size
    return CompiledCache(drafter.config, 1, length, p.device, p.dtype)


class CompiledDrafter:
    """`drafter` with its block pass compiled: its caches are CompiledCaches, every other method and
    attribute is the drafter's own. What the decoders see is a drafter; nothing in them knows it is
    compiled, except `compiled`, which picks the compiled pass's step costs (step_costs.costs_for)."""

    compiled = True

    def __init__(self, drafter):
        require_block_pass(drafter)
        self.drafter = drafter

    def new_cache(self, max_len):
        return new_cache(self.drafter, max_len)

    def __getattr__(self, name):
        return getattr(self.drafter, name)


def compile_drafter(drafter):
    """`drafter` decoded with its block pass compiled (the first decode compiles it, seconds to a minute):
    speculative_generate(target, compile_drafter(drafter), ...)."""
    return CompiledDrafter(drafter)


def graphs_compiled():
    """How many graphs torch has compiled in this process so far (torch._dynamo's counter)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]
