"""A DFlash drafter's context for many rows at once: one drafter pass drafts every row's block.

The batched decoder (batch.py) asks `new_rows(drafter, rows, max_len)`; a DFlash drafter (drafter.py,
dflash2.py: `uses_block_pass`) gets `RaggedRows`, the row-batched form of its batch-1 pieces: the context
projection (`Drafter.context_kv`), the block pass (`Drafter.block_pass`) and the choice of drafts
(`Drafter.pick`). Rows have their own lengths (ragged_cache.py): row r's block sits at its own positions and
sees its own context and only its first sizes[r] slots, so its drafts are those of a block of sizes[r] alone.
Any other drafter gets `RowByRow`: one batch-1 context per row, drafted row by row.
"""

import torch

from .ragged_cache import RaggedKVCache


def new_rows(drafter, rows, max_len):
    """The drafter's context for `rows` sequences decoded together: RaggedRows where the drafter drafts by
    its block pass, else RowByRow."""
    return (RaggedRows if drafter.uses_block_pass else RowByRow)(drafter, rows, max_len)


class RaggedRows:
    """The projected context K/V of every row in one ragged cache, and the positions not projected yet."""

    def __init__(self, drafter, rows, max_len):
        p = next(drafter.parameters())
        self.drafter = drafter
        B = drafter.block_size
        self.cache = RaggedKVCache(drafter.config, rows, max_len + B, p.device, p.dtype)
        self.pending = []       # features (R, 1, F) of plain steps' positions, projected at the next draft

    def keep(self, index):
        """Keep the rows `index` (new row p is old row index[p])."""
        self.cache.keep(index)
        self.pending = [f[index] for f in self.pending]

    def extend(self, feats, tokens, counts, lazy=False):
        """Append row r's first counts[r] positions of feats (R, t, F); `lazy` (a plain step, one position per
        row): queue them for the next draft, as batch 1's extend does. The ids `tokens` are not needed."""
        if lazy:
            self.pending.append(feats[:, :1])
            return
        positions, _ = self.cache.slots(max(counts))                     # (R, t): each row's next positions
        for i, (k, v) in enumerate(self.drafter.context_kv(feats[:, : max(counts)], positions)):
            self.cache.write(i, self.cache.length, k, v)
        self.cache.advance(counts)

    def project_context(self):
        """Project the plain steps' queued positions (one per row per step: the same count for every row)."""
        if self.pending:
            feats = torch.cat(self.pending, 1)
            self.pending.clear()
            self.extend(feats, None, [feats.size(1)] * feats.size(0))

    def mark(self):
        """The rows' lengths and queued positions, for `rewind` (timing a step again: batch.py)."""
        return list(self.cache.lengths), list(self.pending)

    def rewind(self, mark):
        self.cache.lengths, self.pending = list(mark[0]), list(mark[1])
        self.cache.length = max(self.cache.lengths)

    def hidden(self, anchors, T, sizes):
        """The block pass for every row's block [anchor, MASK x (T-1)] at the row's own positions, row r
        seeing its own context and its first sizes[r] slots -> the draft slots' hidden states (R, T-1, D)."""
        d, dev, L = self.drafter, anchors.device, self.cache.length
        masks = torch.full((len(anchors), T - 1), d.config.mask_token_id, device=dev)
        x = d.target.embed_tokens(torch.cat([anchors[:, None], masks], 1))           # (R, T, D)
        lens = torch.tensor(self.cache.lengths, device=dev)                          # (R,)
        cos, sin = d.rope_at(lens[:, None] + torch.arange(T, device=dev), x.dtype)   # (R, 1, T, hd)
        sees_context = torch.arange(L, device=dev) < lens[:, None]                   # (R, L)
        sees_slots = torch.arange(T, device=dev) < torch.tensor(sizes, device=dev)[:, None]   # (R, T)
        mask = torch.cat([sees_context, sees_slots], 1)[:, None, None]               # (R, 1, 1, L+T)
        return d.block_pass(x, cos, sin, self.cache.prefix(L), mask)[:, 1:]          # slot 0: the anchor

    def draft(self, anchors, T, sizes, choose):
        """One drafter pass for every row from its anchor (R,) -> per row its sizes[r]-1 drafts, and q (or
        None). Greedy: every row's choice at once; sampling: row by row, as at batch 1."""
        self.project_context()                        # the context the plain steps before this one queued
        hidden = self.hidden(anchors, T, sizes)                                      # (R, T-1, D)
        logits = self.drafter.target.lm_head(hidden)                                 # (R, T-1, V)
        if choose.temperature == 0:
            best, _ = self.drafter.pick(hidden, logits, anchors, choose)             # (R, T-1)
            return [t[: n - 1] for t, n in zip(best.cpu(), sizes)], [None] * len(sizes)
        out = [self.drafter.pick(hidden[r, : n - 1], logits[r, : n - 1], int(anchors[r]), choose)
               for r, n in enumerate(sizes)]
        return [t for t, _ in out], [q for _, q in out]


class RowByRow:
    """The batched decoder's drafter context for any drafter: one batch-1 cache per row, drafted row by row,
    so every row drafts exactly what it drafts alone. A drafter that can batch its rows returns its own
    (RaggedRows) with the same methods."""

    def __init__(self, drafter, rows, max_len):
        self.drafter = drafter
        self.caches = [drafter.new_cache(max_len) for _ in range(rows)]

    def keep(self, index):
        """Keep the rows `index` (new row p is old row index[p])."""
        self.caches = [self.caches[i] for i in index]

    def extend(self, feats, tokens, counts, lazy=False):
        """Append row r's first counts[r] positions: feats (R, t, F), tokens (R, t)."""
        for r, (cache, n) in enumerate(zip(self.caches, counts)):
            self.drafter.extend(cache, feats[r:r + 1, :n], tokens[r:r + 1, :n])

    def project_context(self):
        for cache in self.caches:
            self.drafter.project_context(cache)

    def mark(self):
        return [self.drafter.mark(c) for c in self.caches]

    def rewind(self, marks):
        for cache, mark in zip(self.caches, marks):
            self.drafter.rewind(cache, mark)

    def draft(self, anchors, T, sizes, choose):
        """Row r's sizes[r] - 1 drafts after anchors[r] -> (drafts per row, q per row or None)."""
        out = [self.drafter.draft(c, int(a), n - 1, choose) for c, a, n in zip(self.caches, anchors, sizes)]
        return [d for d, _ in out], [q for _, q in out]

