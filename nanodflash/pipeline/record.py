"""What makes each stage checkpoint of train_tiny.py: its flags and hashes of what it was built on, and the
one rule for reusing it (the record must match, else one line naming each difference and the way out).

    made_by = stage_record("target", args, corpus=corpus["sha256"], tokenizer=file_hash(path))
    if not reusable("target", path, checkpoint, made_by): ...train the stage, save it with made_by...
"""

import hashlib
import os

from ..store.resume import differences

# The flags each stage's checkpoint depends on: its record holds them and hashes of what it was built on,
# and a rerun reuses the stage only when they all match (--device and the summary's flags change no
# checkpoint)
STAGE_FLAGS = {
    "tokenizer": ("smoke", "vocab_size"),
    "target": ("n_layer", "n_embd", "n_head", "seq_len", "target_steps", "target_batch", "target_lr", "seed"),
    "data": ("n_seqs", "prompt_len", "gen_len", "long_seqs", "long_gen_len", "gen_temperature",
             "gen_greedy_frac", "gen_batch", "seed"),
    "sampled data": ("sampling_seqs", "sampling_temperature", "prompt_len", "gen_len", "gen_batch", "seed"),
    "drafter": ("drafter", "draft_layers", "selector_top_k", "selector_rank", "conv_kernel_size",
                "target_layer_ids", "block_size", "draft_steps", "draft_batch", "draft_anchors", "draft_lr",
                "gamma", "soft_weight", "long_batch", "long_anchors", "seed"),
    "sampling drafter": ("sampling_steps", "sampling_lr", "draft_batch", "draft_anchors", "gamma", "seed"),
}


def stage_record(stage, args, **built_on):
    """What makes a stage's checkpoint: its flags, and hashes of what it is built on (corpus, target, data,
    ...)."""
    return {**{k: getattr(args, k) for k in STAGE_FLAGS[stage]}, **built_on}


def reusable(stage, path, saved, now):
    """True when `path` exists and the record of `saved` (its checkpoint, or run.json for the tokenizer)
    equals `now`, saying that the stage is skipped; False when it does not exist. A record that differs is
    refused in one line naming each difference and the way out."""
    if not os.path.exists(path):
        return False
    saved = (saved or {}).get("made_by")
    if saved != now:
        diff = ("; ".join(differences(saved or {}, now)) if saved
                else "it records no settings (an older train_tiny.py)")
        raise ValueError(f"{path} was made by another run: {diff}. Rerun with --fresh to start over, or use "
                         "another --out")
    print(f"[{stage}] found {path}, skipping")
    return True


def file_hash(path):
    """The first 16 hex digits of the file's SHA-256: enough to tell two tokenizers apart."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]
