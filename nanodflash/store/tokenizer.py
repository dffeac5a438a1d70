"""A small byte-level BPE, trained locally and loaded into a real `tiktoken.Encoding`.

tiktoken's published encodings (gpt2, cl100k, ...) are downloaded on first use, which a CPU smoke
test often cannot do. So we train our own: split the text with a GPT-2 style regex, then merge the
most frequent adjacent pair of tokens, again and again, until the vocabulary is full. The merges are
stored in tiktoken's own rank-file format (one `base64(token_bytes) rank` line per token) and handed
to `tiktoken.Encoding`, so encoding runs in tiktoken's Rust core.

Worked example (vocab_size=260 means 256 bytes + 2 merges + 2 special tokens; "aa" is the most
frequent pair, then "ab" and "aa"+"a" tie at 2 and the smaller pair of ids wins):

    >>> enc = train_tokenizer("aaab aaab", vocab_size=260)
    >>> enc.n_vocab, enc.decode_single_token_bytes(256), enc.decode_single_token_bytes(257)
    (260, b'aa', b'ab')
    >>> enc.decode(enc.encode_ordinary("aaab")) == "aaab"
    True

Special tokens: `<|endoftext|>` (id vocab_size-2) separates documents, `<|mask|>` (id vocab_size-1)
is the drafter's MASK token. Both live in the target's embedding, as DFlash requires.
"""

import base64
import os
from collections import Counter

import regex
import tiktoken

# GPT-2's split pattern: contractions, letter runs, digit runs, punctuation runs, whitespace.
SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
ENDOFTEXT = "<|endoftext|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (ENDOFTEXT, MASK)


def _merge(word, pair, new_id):
    """Replace every occurrence of `pair` in the tuple `word` by `new_id`."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train_bpe(text, vocab_size):
    """Learn byte-level BPE merges; returns {token_bytes: rank}, ranks 0..vocab_size-3.

    Pair counts are updated incrementally (only words that contain the merged pair are touched),
    which is what makes a 1024-token vocabulary on ~460K characters take seconds, not minutes.
    """
    n_merges = vocab_size - 256 - len(SPECIAL_TOKENS)
    if n_merges < 0:
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (256 bytes + specials), "
                         f"got {vocab_size}")
    chunks = Counter(regex.findall(SPLIT_PATTERN, text))
    words = [tuple(c.encode("utf-8")) for c in chunks]          # each word: a tuple of token ids
    counts = list(chunks.values())
    vocab = {i: bytes([i]) for i in range(256)}
    pair_counts, where = Counter(), {}                        # pair -> count, pair -> word indices
    for w, (word, n) in enumerate(zip(words, counts)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += n
            where.setdefault(pair, set()).add(w)
    for new_id in range(256, 256 + n_merges):
        if not pair_counts:
            break                                             # text too small: nothing left to merge
        # most frequent pair; ties broken by the smallest pair, so training is deterministic
        pair = max(pair_counts.items(), key=lambda kv: (kv[1], -kv[0][0], -kv[0][1]))[0]
        vocab[new_id] = vocab[pair[0]] + vocab[pair[1]]
        for w in list(where.get(pair, ())):
            old, n = words[w], counts[w]
            new = _merge(old, pair, new_id)
            for p in zip(old, old[1:]):                       # forget the old word's pairs ...
                pair_counts[p] -= n
                if pair_counts[p] <= 0:
                    del pair_counts[p]
                where[p].discard(w)
            for p in zip(new, new[1:]):                       # ... and count the new word's
                pair_counts[p] += n
                where.setdefault(p, set()).add(w)
            words[w] = new
        pair_counts.pop(pair, None)
    return {b: rank for rank, b in vocab.items()}


def _encoding(ranks, name="nanodflash"):
    n = len(ranks)
    specials = {tok: n + i for i, tok in enumerate(SPECIAL_TOKENS)}
    return tiktoken.Encoding(name=name, pat_str=SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def train_tokenizer(text, vocab_size=1024, path=None):
    """Train a BPE on `text` and return a `tiktoken.Encoding` with n_vocab == vocab_size.

    If `path` is given, the ranks are also written there (tiktoken's rank-file format, atomically).
    """
    ranks = train_bpe(text, vocab_size)
    if len(ranks) + len(SPECIAL_TOKENS) != vocab_size:
        raise ValueError(f"text is too small to learn {vocab_size} tokens "
                         f"(got {len(ranks) + len(SPECIAL_TOKENS)}); use more text or a smaller vocab_size")
    if path is not None:
        save_ranks(ranks, path)
    return _encoding(ranks)


def save_ranks(ranks, path):
    """Write {token_bytes: rank} as tiktoken's `base64 rank` lines, via a temp file + rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for b, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(b).decode()} {rank}\n")
    os.replace(tmp, path)


def load_tokenizer(path):
    """Load a rank file written by `train_tokenizer` into a `tiktoken.Encoding`.

    We parse the file ourselves rather than with `tiktoken.load.load_tiktoken_bpe`, which caches by
    path in a temp folder and would serve a stale vocabulary when a path is retrained.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"tokenizer file not found: {path} (run train_tiny.py first)")
    ranks = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                token, rank = parts
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except Exception as e:
                raise ValueError(f"{path}:{lineno}: not a tiktoken rank line: {line!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256:
        raise ValueError(f"{path}: ranks are not 0..n-1 over at least the 256 bytes; the file is corrupt")
    return _encoding(ranks)


def special_ids(enc):
    """(endoftext_id, mask_id) of an encoding made here."""
    return enc.encode_single_token(ENDOFTEXT), enc.encode_single_token(MASK)
