"""Ladder 1: the locally trained BPE is a real tiktoken.Encoding and round-trips any text exactly."""

import pytest
import tiktoken

from nanodflash.store.data import load_corpus
from nanodflash.store.tokenizer import ENDOFTEXT, MASK, load_tokenizer, special_ids, train_tokenizer

HOSTILE = [
    "",
    "hello world",
    "emoji 🙂🚀 and a family 👨‍👩‍👧",
    "中文 日本語 한국어",
    "control \x00\x01\x07\x1b[31m chars \x7f",
    "   leading and trailing   ",
    "tabs\t\t\tand\n\n\n\nnewlines\r\n",
    " " * 300,
    "def f(x):\n        return x  # indented code\n",
    "literal <|endoftext|> and <|mask|> text",
    "\ud7ff\ue000\U0010ffff",
]


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.bpe"
    train_tokenizer(load_corpus()[:60000], vocab_size=400, path=str(path))
    return load_tokenizer(str(path))


def test_tokenizer_is_a_tiktoken_encoding_with_the_configured_vocab_size(enc):
    assert isinstance(enc, tiktoken.Encoding), "load_tokenizer must return a real tiktoken.Encoding"
    assert enc.n_vocab == 400, f"vocabulary size {enc.n_vocab} != configured 400"


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_tokenizer_round_trips_hostile_text_exactly(enc, text):
    ids = enc.encode_ordinary(text)
    assert enc.decode(ids) == text, f"round trip changed {text!r}"
    assert all(0 <= i < enc.n_vocab - 2 for i in ids), "ordinary text must never produce special-token ids"


def test_special_tokens_encode_to_single_ids_at_the_top_of_the_vocabulary(enc):
    eot, mask = special_ids(enc)
    assert enc.encode(ENDOFTEXT, allowed_special="all") == [eot], "<|endoftext|> must be a single id"
    assert enc.encode(MASK, allowed_special="all") == [mask], "<|mask|> must be a single id"
    assert (eot, mask) == (398, 399), f"special ids {(eot, mask)} should be the last two of the vocabulary"


def test_saved_and_reloaded_tokenizer_encodes_identically(tmp_path):
    text = load_corpus()[:30000]
    a = train_tokenizer(text, vocab_size=300, path=str(tmp_path / "t.bpe"))
    b = load_tokenizer(str(tmp_path / "t.bpe"))
    assert a.encode_ordinary(text) == b.encode_ordinary(text), "reloaded tokenizer encodes differently"


def test_bpe_compresses_the_corpus(enc):
    text = load_corpus()[60000:80000]
    assert len(enc.encode_ordinary(text)) < 0.6 * len(text.encode()), \
        "BPE should beat raw bytes by a wide margin"


def test_vocab_size_too_small_or_text_too_small_is_refused():
    with pytest.raises(ValueError, match="vocab_size must be at least"):
        train_tokenizer("abc", vocab_size=100)
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer("ab", vocab_size=1024)
