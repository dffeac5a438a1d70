"""The KV cache of a batch whose rows have different lengths (batch.py's layout: ragged rows, not padding).

Each row keeps its keys contiguous from column 0 of its cache row and has its own length. A forward of t new
tokens per row puts row r's at columns len_r ... len_r + t - 1, at RoPE positions len_r ..., and row r's
query i sees columns <= len_r + i. A finished row leaves the cache (`keep`), moving at most one other row
into its place.
"""

import torch

from ..gpt import KVCache


def compact(alive):
    """The rows to keep, as the new order of the batch: a live row stays where it is, unless it sits past the
    new end, where it moves into the place of a finished row. For example

        >>> compact([True, False, True, False, True])     # rows 1 and 3 finished: row 4 moves to place 1
        [0, 4, 2]
    """
    n = sum(alive)
    movers = iter(i for i in range(n, len(alive)) if alive[i])
    return [p if alive[p] else next(movers) for p in range(n)]


class RaggedKVCache(KVCache):
    """A KVCache whose rows have their own lengths (`lengths`, a list); `length` is the longest row.

    Before a forward of t tokens per row, `slots(t)` gives the positions (R, t) = len_r + i and the mask
    (R, 1, t, length + t): row r's query i sees columns <= len_r + i. `write` (called by GPT.forward with
    start = length) puts row r's new keys at those positions; `advance(counts)` keeps counts[r] of them."""

    def __init__(self, config, rows, max_len, device=None, dtype=torch.float32):
        super().__init__(config, rows, max_len, device, dtype)
        # unlike at batch 1, columns past a row's length ARE read (masked, weight 0): never-written memory
        # may hold NaN, and 0 * NaN is NaN
        self.k.zero_()
        self.v.zero_()
        self.lengths = [0] * rows
        self.made = (None, None)         # positions(t)'s last answer and what it was for: every layer asks

    def positions(self, t):
        """(R, t): row r's next t positions, len_r + i."""
        key = (t, tuple(self.lengths))
        if self.made[0] != key:
            lengths = torch.tensor(self.lengths, device=self.k.device)
            self.made = key, lengths[:, None] + torch.arange(t, device=self.k.device)
        return self.made[1]

    def slots(self, t):
        self.length = max(self.lengths)
        pos = self.positions(t)                                                              # (R, t)
        cols = torch.arange(self.length + t, device=self.k.device)
        return pos, (cols[None, None, :] <= pos[:, :, None])[:, None]                       # (R, 1, t, L+t)

    def write(self, layer, start, k, v):
        if min(self.lengths) == start:      # every row at the same length: a slice, as at batch 1
            return super().write(layer, start, k, v)
        index = self.positions(k.size(2))[:, None, :, None].expand_as(k)                    # (R, Hkv, t, hd)
        keys, values = self.by_layer[layer]
        keys.scatter_(2, index, k)
        values.scatter_(2, index, v)
        end = start + k.size(2)
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, counts):
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]
        self.length = max(self.lengths)

    def keep(self, order):
        """Keep the rows `order` (indices; new row p is old row order[p]): a finished row costs nothing from
        then on. Only rows that move are copied (moves come from past the new end, see `compact`); then
        the cache is a view of its first len(order) rows, so a step never copies the rows that stay."""
        for p, i in enumerate(order):
            if i != p:
                self.k[:, p, :, : self.lengths[i]] = self.k[:, i, :, : self.lengths[i]]
                self.v[:, p, :, : self.lengths[i]] = self.v[:, i, :, : self.lengths[i]]
        self.k, self.v = self.k[:, : len(order)], self.v[:, : len(order)]
        self.by_layer = self.layer_views()
        self.lengths = [self.lengths[i] for i in order]
        self.length = max(self.lengths)
