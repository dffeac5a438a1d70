"""The corpus ships with Python: the default needs no download, and built-in names and files both load."""

import torch

from nanodflash.store.data import (
    STDLIB_CHARS,
    load_corpus,
    split_train_val,
    stdlib_corpus,
    third_party_prompts,
    val_prompts,
)
from nanodflash.store.tokenizer import train_tokenizer


def test_default_corpus_is_the_standard_library_source_and_is_deterministic():
    text = load_corpus()
    assert text == stdlib_corpus() == load_corpus("stdlib"), \
        "the default corpus should be the stdlib one, every time"
    assert len(text) >= STDLIB_CHARS, \
        f"the stdlib corpus should reach {STDLIB_CHARS:,} characters, got {len(text):,}"
    assert "def " in text and "import " in text, "the stdlib corpus should be Python source"


def test_pydoc_corpus_is_available_by_name():
    text = load_corpus("pydoc")
    assert len(text) > 100_000 and "def " not in text[:200], \
        "the pydoc corpus should be the documentation prose"
    assert text != load_corpus(), "pydoc and stdlib are different corpora"


def test_a_file_named_like_a_builtin_corpus_is_read_as_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pydoc").write_text("my own text\n", encoding="utf-8")
    assert load_corpus("pydoc") == "my own text\n", "an existing file wins over the built-in name"


def test_split_sends_every_tenth_chunk_to_validation():
    tr, va = split_train_val(torch.arange(100), val_every=10, chunk_len=5)
    assert va.tolist() == list(range(45, 50)) + list(range(95, 100)), "chunks 9 and 19 should be validation"
    assert tr.numel() + va.numel() == 100 and not set(tr.tolist()) & set(va.tolist()), "a clean partition"


def test_third_party_prompts_are_text_the_corpus_does_not_contain_and_the_same_every_time():
    text = load_corpus()
    tok = train_tokenizer(text[:200_000], vocab_size=1024)   # the default run's vocabulary size
    prompts = third_party_prompts(tok, 64, 16)
    assert len(prompts) == 64 and all(len(p) == 16 for p in prompts), "64 prompts of 16 tokens each"
    assert third_party_prompts(tok, 64, 16) == prompts, "the same package gives the same prompts"
    seen = [tok.decode(p) for p in prompts if tok.decode(p) in text]
    assert not seen, f"third-party prompts must be text the default corpus does not contain: {seen[:3]}"
    held_out = [p for p in val_prompts(tok, 64, 16, seed=0) if tok.decode(p) in text]
    assert len(held_out) >= 60, "control: held-out prompts come from the corpus, so the check can see them"
