"""The corpus: an embedded default that needs no download, or any UTF-8 text file.

Default: Python's own documentation text (`pydoc_data.topics`, ~465K characters of English prose
and code examples), which ships with CPython. Train/validation split is by interleaved chunks of
tokens (every 10th chunk is validation), so validation covers every topic rather than the last one.
"""

import os

import torch


def load_corpus(path=None):
    """Return the corpus text: the file at `path` (UTF-8), or the embedded default when path is None."""
    if path is None:
        try:
            from pydoc_data.topics import topics
        except ImportError as e:
            raise RuntimeError("this Python has no pydoc_data (a stripped-down build?): the default corpus is "
                               "missing; pass a UTF-8 text file with --data PATH instead") from e
        return "\n\n".join(topics[k] for k in sorted(topics))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--data file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"--data file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    if not text.strip():
        raise ValueError(f"--data file {path} is empty")
    return text


def split_train_val(ids, val_every=10, chunk_len=512):
    """Interleaved split of a 1-D token tensor: chunk i goes to validation iff i % val_every == val_every-1.

    >>> tr, va = split_train_val(torch.arange(40), val_every=4, chunk_len=5)
    >>> va.tolist()
    [15, 16, 17, 18, 19, 35, 36, 37, 38, 39]
    """
    chunks = torch.split(ids, chunk_len)
    train = [c for i, c in enumerate(chunks) if i % val_every != val_every - 1]
    val = [c for i, c in enumerate(chunks) if i % val_every == val_every - 1]
    return torch.cat(train), torch.cat(val) if val else ids[:0]


def check_enough(ids, seq_len, name):
    """Raise a clear error if `ids` cannot hold one training sequence of seq_len + 1 tokens."""
    if ids.numel() < seq_len + 1:
        raise ValueError(f"the {name} split has {ids.numel()} tokens, fewer than one sequence of {seq_len + 1}; "
                         "use a larger --data file (or a smaller --seq_len)")


def get_batch(ids, batch_size, seq_len, generator=None, device="cpu"):
    """Random windows of a 1-D token tensor: x (batch, seq_len) and targets y = x shifted by one."""
    starts = torch.randint(0, ids.numel() - seq_len, (batch_size,), generator=generator)
    x = torch.stack([ids[s: s + seq_len] for s in starts])
    y = torch.stack([ids[s + 1: s + 1 + seq_len] for s in starts])
    return x.to(device), y.to(device)
