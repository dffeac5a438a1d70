"""The drafter interface: what the decoders ask of a drafter, and the answers of a drafter that has only its
slots' logits.

Every decoder (speculative.py, tree.py, sampled_tree.py, batch.py) and every tool speaks to a drafter through
these methods and never asks which kind it is. A new kind subclasses `DrafterInterface`, writes `new_cache`,
`extend` and `slot_logits`, and inherits the rest; it overrides a method where it knows better (DFlash 2's
selector scores its candidates after each predecessor; an autoregressive chain drafts one token at a time).

    block_size, target_layer_ids                B (the anchor and at most B-1 drafts a pass), and the target
                                                layers whose outputs the decoders hand to `extend`
    new_cache(max_len)                          its context for one sequence (compiled.new_cache: one whose
                                                passes run compiled, for a drafter whose `compiles` is True)
    extend(cache, features, tokens)             append verified positions: features (1, t, F), ids (1, t)
    context_length(cache)                       the verified positions it holds
    mark(cache), rewind(cache, mark)            forget what a step added (timing steps: step_costs.py)
    project_context(cache)                      do now what the next draft would do first (default: nothing)
    slot_logits(cache, anchor, n_draft)         the draft slots' logits (n, V), one pass
    draft(cache, anchor, n_draft, choose)       the path: (tokens (n,), q (n, V) or None), choose a DraftRule
    candidates(cache, anchor, n_draft, T)       top-K trees: cand (n, K), logp (n, K, K) after each parent
    draft_distribution(cache, anchor, n, T)     sampled trees: q(t, prev) -> (V,), the q a path draws from
    slot_scores(cache, anchor, drafts)          the trace page: per slot [[token, score], ...], or None
    new_rows(rows, max_len)                     the batched decoder's context for many rows (`RowByRow`)

The defaults read the slots' logits as independent marginals: slot t's distribution is the same whatever
was drafted before it (DFlash 1, docs/design.md §1.4).
"""

from .sampling import draft_temperature, probs_from_logits

TOP_K = 16          # candidates per slot of a drafter without a selector of its own (trees)


class DrafterInterface:
    """The defaults of the drafter interface (module docstring); a subclass writes new_cache, extend and
    slot_logits."""

    kind = "custom"         # a label for tables and checkpoints, never a switch (the methods answer)
    compiles = False        # whether its drafts run through the cache's `attend` (compiled.new_cache's)
    cost_book = None        # its step costs (step_costs.CostBook), made when first asked for

    @property
    def block_size(self):
        """B: the anchor and the drafts of one pass, at most (a model drafter's, from its config)."""
        return self.config.block_size

    @property
    def target_layer_ids(self):
        """The target layers whose outputs `extend` gets as features (a model drafter's, from its config)."""
        return self.config.target_layer_ids

    def context_length(self, cache):
        """How many verified positions the drafter's context holds."""
        return cache.length

    def project_context(self, cache):
        """Do the work the next draft would start with (a drafter that projects its context lazily)."""

    def mark(self, cache):
        """The state of the context, for `rewind` (timing a step again from the same context)."""
        return cache.length

    def rewind(self, cache, mark):
        """Forget what the context gained since `mark` was taken."""
        cache.length = mark

    def draft(self, cache, anchor, n_draft, choose):
        """n_draft drafts after `anchor` in one pass: choose(the slots' logits (n, V))."""
        return choose(self.slot_logits(cache, anchor, n_draft))

    def candidates(self, cache, anchor, n_draft, temperature):
        """One pass -> the top-K candidates cand (n, K) of slots 1..n and logp (n, K, K): the log-prob of
        candidate c at slot t+1 after candidate i of slot t, a softmax of the scores / temperature. Here the
        slot's own softmax over the whole vocabulary, the same row for every parent."""
        logits = self.slot_logits(cache, anchor, n_draft).detach().cpu()              # (n, V)
        k = min(TOP_K, logits.size(-1))
        logp, cand = (logits / temperature).log_softmax(-1).topk(k, dim=-1)         # (n, K) each
        return cand, logp[:, None, :].expand(-1, cand.size(1), -1)                  # any parent: one row

    def draft_distribution(self, cache, anchor, n_draft, temperature):
        """One pass -> q(t, prev): the distribution (V,) float64 a sampled path draws slot t+1 from after the
        token `prev` at slot t (t = 0: after the anchor), at sampling.draft_temperature(temperature). Here
        the slot's own softmax, whatever came before."""
        logits = self.slot_logits(cache, anchor, n_draft).detach().cpu()              # (n, V)
        q = probs_from_logits(logits, draft_temperature(temperature))                # (n, V)
        return lambda t, prev: q[t]

    def slot_scores(self, cache, anchor, drafts, top=4):
        """What each slot chose among, for the trace page: None for a drafter that picks by its logits."""
        return None

    def new_rows(self, rows, max_len):
        """The context of `rows` sequences decoded together (batch.py)."""
        return RowByRow(self, rows, max_len)


class TokenContext(DrafterInterface):
    """A drafter whose context is the verified token ids themselves, a plain list (prompt lookup, the
    exercises' oracles): it asks the target for one layer's features and ignores them."""

    def new_cache(self, max_len):
        """The verified token ids, oldest first (`max_len` is not needed)."""
        return []

    def extend(self, cache, features, tokens):
        """Append newly verified ids: tokens (1, t). `features` are unused."""
        cache.extend(tokens[0].tolist())

    def context_length(self, cache):
        return len(cache)

    def mark(self, cache):
        return len(cache)

    def rewind(self, cache, mark):
        del cache[mark:]


class RowByRow:
    """The batched decoder's drafter context for any drafter: one batch-1 cache per row, drafted row by row,
    so every row drafts exactly what it drafts alone. A drafter that can batch its rows returns its own
    (drafter_rows.RaggedRows) with the same methods."""

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

