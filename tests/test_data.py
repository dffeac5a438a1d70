"""The corpus ships with Python: the default needs no download, and built-in names and files both load."""

import torch

from nanodflash.data import STDLIB_CHARS, load_corpus, split_train_val, stdlib_corpus


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
