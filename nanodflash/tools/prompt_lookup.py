"""Prompt lookup: the speculative drafter a user can pick without training anything (a baseline: it drafts
by copying from the prompt and the text so far, with no model at all). The benchmark's "prompt lookup" rows.

    drafter = PromptLookupDrafter(target, n_draft=10)
    tokens, stats = speculative_generate(target, drafter, prompt_ids, 200)
"""


import torch

from ..drafter import DrafterInterface

ONE_HOT_SCALE = 1e4     # logits of a copied token: exp(-1e4) underflows to 0, so q is exactly one-hot


def lookup(tokens, n_draft, max_ngram=3):
    """The tokens that followed the most recent earlier occurrence of tokens' last m tokens, for the
    largest m <= max_ngram that has one; at most n_draft of them; [] when there is no occurrence.

    >>> lookup([5, 1, 2, 7, 8, 9, 1, 2], n_draft=2)       # "1 2" occurred at 1..2, then 7 8 followed
    [7, 8]
    """
    n = len(tokens)
    for m in range(min(max_ngram, n - 1), 0, -1):          # longer n-grams first: more specific matches
        suffix = tokens[n - m:]
        for start in range(n - m - 1, -1, -1):             # newest first; may overlap the suffix itself
            if tokens[start: start + m] == suffix:
                return tokens[start + m: start + m + n_draft]
    return []


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


class PromptLookupDrafter(TokenContext):
    """Draft up to `n_draft` tokens per step by n-gram lookup in the prompt and the text generated so far.

    It drafts by copying. Take the last m tokens of the text so far (context + the anchor), find their most
    recent earlier occurrence, and propose the tokens that followed it there; try m = max_ngram first, then
    shorter n-grams, and draft nothing when even the last token never occurred before. Hugging Face
    transformers ships this trick as `generate(..., prompt_lookup_num_tokens=k)`. It pays off when the output
    repeats its input or itself (code edits, quoting, extraction, loops of a small greedy model) and costs
    no model at all: one list scan per step.

        context: ... a b c X Y Z ... a b c | anchor = c      last 3 tokens "a b c" occurred before,
                           ^^^^^ drafts: X Y Z (up to n_draft)  followed by X Y Z: draft those

    It speaks the drafter interface (drafter.py, a TokenContext): it asks for one target layer's
    features (the loop hands every drafter features) and ignores them, its cache is the list of verified
    token ids, and `draft` hands `choose` one-hot logits, so the greedy and match rules pick exactly the
    copied tokens and the rejection rule sees a one-hot q (exact). Drafts may be fewer than asked, or none;
    the verify step then checks fewer tokens. Greedy output stays token-identical to plain greedy decoding.
    """

    kind = "prompt lookup"
    block_size = None           # set per drafter: n_draft + 1
    target_layer_ids = (0,)     # the loop hands every drafter features; these are ignored

    def __init__(self, target, n_draft=10, max_ngram=3):
        if n_draft < 0 or max_ngram < 1:
            raise ValueError(f"need n_draft >= 0 and max_ngram >= 1, got {n_draft} and {max_ngram}")
        self.target, self.max_ngram, self.block_size = target, max_ngram, n_draft + 1

    def draft(self, cache, anchor, n_draft, choose):
        """Copy up to n_draft tokens by lookup; return choose(one-hot logits (n, V)), n <= n_draft (maybe
        0)."""
        copied = lookup(cache + [anchor], n_draft, self.max_ngram)
        V = self.target.config.vocab_size
        logits = torch.zeros(len(copied), V)                                       # (n, V)
        logits[torch.arange(len(copied)), torch.tensor(copied, dtype=torch.long)] = ONE_HOT_SCALE
        return choose(logits)
