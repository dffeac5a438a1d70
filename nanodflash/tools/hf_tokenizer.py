"""Our tiktoken encoding <-> a Hugging Face `tokenizer.json` (byte-level BPE), encoding exactly alike.

Both are byte-level BPE over the same regex split, but they store the merges differently:
- tiktoken keeps one *rank* per token and, inside a piece of text, repeatedly merges the adjacent pair
  whose concatenation has the lowest rank (a piece that is itself a token is taken whole);
- Hugging Face keeps a vocabulary of byte-level *strings* (each byte drawn as a printable character, so
  b" " is "Ġ") and an ordered list of merges (pairs), and merges the adjacent pair listed first.
Listing, for every token in rank order, every split of it into two tokens makes the two rules agree;
`ignore_merges` makes HF take a piece that is a token whole, as tiktoken does. Example:

    >>> from nanodflash.store.tokenizer import train_tokenizer
    >>> spec = to_tokenizer_json(train_tokenizer("aaab aaab", vocab_size=260))
    >>> spec["model"]["merges"], spec["added_tokens"][1]["content"]
    ([['a', 'a'], ['a', 'b']], '<|mask|>')
"""

import json
import unicodedata

import tiktoken

from ..store.tokenizer import SPLIT_PATTERN


def byte_to_char():
    """The printable stand-in of every byte (GPT-2's table): printable Latin-1 bytes stand for themselves,
    the other 68 bytes map to chr(256), chr(257), ... in byte order. {byte value: one-character str}."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _special_tokens(enc):
    return sorted(((enc.encode_single_token(t), t) for t in enc.special_tokens_set))


def to_tokenizer_json(enc):
    """A tiktoken.Encoding (ours: byte-level BPE + special tokens) -> the tokenizer.json dict."""
    to_char = byte_to_char()
    specials = dict(_special_tokens(enc))
    ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i not in specials}
    text = {t: "".join(to_char[b] for b in t) for t in ranks}               # bytes -> byte-level string
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        for cut in range(1, len(token)):                                     # every split into two tokens,
            left, right = token[:cut], token[cut:]                           # both of lower rank
            if ranks.get(left, rank) < rank and ranks.get(right, rank) < rank:
                merges.append([text[left], text[right]])
    added = [dict(id=i, content=t, single_word=False, lstrip=False, rstrip=False, normalized=False,
                  special=True) for i, t in specials.items()]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": enc._pat_str}, "behavior": "Isolated", "invert": False},
            dict(byte_level)]},
        "post_processor": None,
        "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": {text[t]: r for t, r in ranks.items()}, "merges": merges},
    }


def _split_pattern(pre):
    """The regex a tokenizer.json splits text with, or a ValueError naming what we cannot reproduce."""
    parts = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True) and not parts[0].get("add_prefix_space"):
        return SPLIT_PATTERN                                   # HF's ByteLevel regex is GPT-2's, like ours
    if kinds == ["Split", "ByteLevel"] and "Regex" in parts[0].get("pattern", {}) \
            and parts[0].get("behavior") == "Isolated" and not parts[0].get("invert") \
            and not parts[1].get("use_regex", True) and not parts[1].get("add_prefix_space"):
        return parts[0]["pattern"]["Regex"]
    raise ValueError(f"tokenizer.json: pre_tokenizer {kinds} is not a byte-level regex split that tiktoken "
                     "can reproduce (need ByteLevel, or Split(Regex, Isolated) + ByteLevel(use_regex=false))")


def from_tokenizer_json(path, name="hf"):
    """A byte-level BPE tokenizer.json -> tiktoken.Encoding with the same ids (ranks = ids).

    tiktoken's rule equals HF's when the merges come in the order of the ids they make (true of
    tokenizers converted from tiktoken, like Qwen's); anything else is refused, never guessed.
    A tokenizer.json that NFC-normalizes (Qwen's does) is accepted: normalize text with
    `normalize(text)` before encoding. The encoding gets `.hf_normalizer` ("NFC" or None)."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    model = spec.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        raise ValueError(f"{path}: model must be a plain byte-level BPE, got {model.get('type')!r} with "
                         "options tiktoken cannot reproduce")
    normalizer = (spec.get("normalizer") or {}).get("type")
    if normalizer not in (None, "NFC"):
        raise ValueError(f"{path}: normalizer {normalizer!r} is not supported (only none or NFC)")
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    to_byte = {c: b for b, c in byte_to_char().items()}
    try:
        ranks = {bytes(to_byte[c] for c in s): i for s, i in model["vocab"].items()}
    except KeyError as e:
        raise ValueError(f"{path}: vocabulary entry with character {e} is not byte-level") from None
    if sorted(ranks.values()) != list(range(len(ranks))) or any(bytes([b]) not in ranks for b in range(256)):
        raise ValueError(f"{path}: vocabulary ids must be 0..{len(ranks) - 1} and include all 256 bytes")
    made = -1
    for pair in model.get("merges", []):
        a, b = pair.split(" ") if isinstance(pair, str) else pair
        rank = model["vocab"].get(a + b)
        if rank is None or rank < made:
            raise ValueError(f"{path}: merge {a!r} + {b!r} is out of id order; tiktoken cannot reproduce it")
        made = rank
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t["id"] >= len(ranks)}
    enc = tiktoken.Encoding(name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    enc.hf_normalizer = normalizer
    return enc


def normalize(enc, text):
    """Apply the normalizer of the tokenizer.json `enc` came from (NFC for Qwen's), as HF would."""
    return unicodedata.normalize("NFC", text) if getattr(enc, "hf_normalizer", None) == "NFC" else text
