"""The corpus: an embedded default that needs no download, or any UTF-8 text file.

Two corpora ship with CPython itself, so nothing is downloaded:
- "stdlib" (the default): the source of the standard library's top-level modules, taken in name order
  (`__future__.py`, `_aix_support.py`, ... `argparse.py`, ...) until about a million characters.
  Code is where speculative decoding pays most (a code model's next tokens are often nearly certain):
  at our tiny sizes it gives a higher τ than the prose corpus (docs/log.md).
- "pydoc": Python's documentation topics (`pydoc_data.topics`, ~465K characters of English prose).
Train/validation split is by interleaved chunks of tokens (every 10th chunk is validation), so
validation covers every part of the corpus rather than the last module.
"""

import glob
import hashlib
import importlib.util
import os
import sysconfig

import torch

# the stdlib corpus stops after the first module that reaches this many characters
STDLIB_CHARS = 1_000_000
# third-party Python source, installed with nanodflash and in no built-in corpus: prompts no run trained on
THIRD_PARTY_PACKAGE = "numpy"


def stdlib_corpus(max_chars=STDLIB_CHARS):
    """The standard library's top-level modules, concatenated in name order until `max_chars` is reached."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    parts, n = [], 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            parts.append(fh.read())
        n += len(parts[-1])
        if n >= max_chars:
            break
    if n < max_chars // 2:
        raise RuntimeError(f"this Python's standard library sources are missing or small ({n:,} characters "
                           "of .py files): the default corpus needs them; pass a UTF-8 text file with "
                           "--data PATH")
    return "\n\n".join(parts)


def pydoc_corpus():
    """Python's documentation topics (English prose with code examples)."""
    try:
        from pydoc_data.topics import topics
    except ImportError as e:
        raise RuntimeError("this Python has no pydoc_data (a stripped-down build?): the pydoc corpus is "
                           "missing; pass a UTF-8 text file with --data PATH instead") from e
    return "\n\n".join(topics[k] for k in sorted(topics))


BUILTIN_CORPORA = {"stdlib": stdlib_corpus, "pydoc": pydoc_corpus}     # --data NAME
DEFAULT_CORPUS = "stdlib"


def load_corpus(path=None):
    """The corpus text: the embedded default ("stdlib") when path is None, a built-in corpus by name
    ("stdlib" or "pydoc"), or the UTF-8 file at `path`."""
    # by name, not via the lookup below: a local file called "stdlib" never wins
    if path is None:
        return BUILTIN_CORPORA[DEFAULT_CORPUS]()
    if path in BUILTIN_CORPORA and not os.path.exists(path):
        return BUILTIN_CORPORA[path]()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--data file not found: {path} "
                                f"(or use a built-in corpus: {', '.join(BUILTIN_CORPORA)})")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"--data file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from e
    if not text.strip():
        raise ValueError(f"--data file {path} is empty")
    return text


def corpus_record(data, text):
    """What a run folder's run.json says of its corpus: `data` as --data named it (a built-in corpus by name,
    a file by its absolute path) and a hash of its text."""
    name = DEFAULT_CORPUS if data is None else data if data in BUILTIN_CORPORA and not os.path.exists(data) \
        else os.path.abspath(data)
    return {"data": name, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


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
        raise ValueError(f"the {name} split has {ids.numel()} tokens, fewer than one sequence of "
                         f"{seq_len + 1}; use a larger --data file (or a smaller --seq_len)")


def get_batch(ids, batch_size, seq_len, generator=None, device="cpu"):
    """Random windows of a 1-D token tensor: x (batch, seq_len) and targets y = x shifted by one."""
    starts = torch.randint(0, ids.numel() - seq_len, (batch_size,), generator=generator)
    x = torch.stack([ids[s: s + seq_len] for s in starts])
    y = torch.stack([ids[s + 1: s + 1 + seq_len] for s in starts])
    return x.to(device), y.to(device)


def window_prompts(val_ids, n, length, seed):
    """n prompts of `length` tokens at random places of the validation ids (what train_tiny's summary
    uses)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, val_ids.numel() - length, (n,), generator=g)
    return [val_ids[s: s + length].tolist() for s in starts]


def val_prompts(tok, n, length, seed, data=None):
    """n prompts of `length` tokens from the validation split, each starting right after a newline when one
    is near."""
    ids = torch.tensor(tok.encode_ordinary(load_corpus(data)), dtype=torch.long)
    val = split_train_val(ids)[1]
    if val.numel() < 2 * length:
        raise ValueError(f"the validation split has {val.numel()} tokens, too few for {length}-token prompts")
    g = torch.Generator().manual_seed(seed)
    prompts = []
    for s in torch.randint(0, val.numel() - 2 * length, (n,), generator=g).tolist():
        for j in range(s, s + length):                      # move to a line start if one is within reach
            if tok.decode([int(val[j])]).endswith("\n"):
                s = j + 1
                break
        prompts.append(val[s: s + length].tolist())
    return prompts


def third_party_prompts(tok, n, length, package=THIRD_PARTY_PACKAGE):
    """n prompts of `length` tokens from text no built-in corpus contains: the opening tokens of the Python
    files of an installed package, its files in sorted path order, those shorter than `length` tokens
    skipped. The same package version gives the same prompts on every machine."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"third-party prompts need the package {package!r} installed")
    root = list(spec.submodule_search_locations)[0]
    prompts = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            ids = tok.encode_ordinary(f.read(20 * length))       # its first lines: enough characters
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == n:
            return prompts
    raise ValueError(f"{package} has {len(prompts)} Python files of {length} tokens or more, fewer than {n}")
