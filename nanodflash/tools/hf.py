"""From nanodflash to the real thing: export to, and import from, Hugging Face Qwen3 + official DFlash
folders, tokenizer included.

    python -m nanodflash.tools.hf export --out out --to out_hf   # out_hf/target/, drafter/, drafter_sampling/
    tok, target, drafter = nanodflash.tools.hf.load("out_hf/target", "out_hf/drafter")  # like nanodflash.load

`target/` is a Qwen3ForCausalLM folder (config.json, model.safetensors, generation_config.json, tokenizer.json
+ tokenizer_config.json); `drafter/` is an official DFlash / DFlash 2 drafter folder (config.json with
`dflash_config`, `block_size`, `num_target_layers`; model.safetensors), as the official `dflash` package, vLLM
and SGLang read them; `drafter_sampling/`, the same for the sampling drafter, where the run made one. Every
file is written readable by all (0644), as the rest of a run folder is. The map is one-to-one because our
layers use Qwen3's math and names (docs/design.md):
    ours (GPT)                      Hugging Face Qwen3              ours (Drafter)      official drafter
    embed_tokens.weight             model.embed_tokens.weight       fc, hidden_norm,    the same names
    layers.i.<...>, norm.weight     model.layers.i.<...>, ...       layers.i.<...>,
    lm_head.weight                  lm_head.weight (or tied)        norm, candidate_selector.*
Loading needs no transformers: config.json is plain JSON and the weights are safetensors. What we do not
model (biases, sliding windows, MoE, RoPE scaling, ...) is refused with the config field that says so.
The tokenizer goes through hf_tokenizer.py (tiktoken <-> tokenizer.json).
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

from ..dflash2 import DFlash2Drafter
from ..drafter import default_target_layer_ids
from ..gpt import GPT, GPTConfig
from ..store import checkpoint, run_folder
from ..store.checkpoint import DRAFTER_KINDS, qwen3_state_dict, stacked_state_dict
from ..store.tokenizer import ENDOFTEXT
from .hf_tokenizer import from_tokenizer_json, to_tokenizer_json

ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


# ------------------------------------------------------------------ export

def _qwen3_fields(c, vocab_size):
    """The Qwen3 config fields of a GPTConfig / DrafterConfig `c`."""
    return dict(model_type="qwen3", vocab_size=vocab_size, hidden_size=c.n_embd,
                intermediate_size=c.mlp_hidden, num_hidden_layers=c.n_layer, num_attention_heads=c.n_head,
                num_key_value_heads=c.n_kv_head, head_dim=c.head_dim, hidden_act="silu",
                rms_norm_eps=c.norm_eps, rope_theta=c.rope_theta,
                rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, attention_bias=False,
                attention_dropout=0.0, use_sliding_window=False, sliding_window=None,
                tie_word_embeddings=False, layer_types=["full_attention"] * c.n_layer, dtype="float32")


def _write_json(folder, name, obj, **kw):
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, **kw)
    return path


def _write(folder, config, tensors):
    """config.json and model.safetensors in `folder`; returns their paths."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file({k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}, path,
              metadata={"format": "pt"})
    os.chmod(path, 0o644)            # safetensors writes through a private (0600) temp file
    return [_write_json(folder, "config.json", config, indent=2), path]


def export_target(target, tok, folder):
    """Our GPT + tiktoken encoding -> a Hugging Face Qwen3ForCausalLM folder. Returns the files written."""
    c, eot = target.config, tok.encode_single_token(ENDOFTEXT)
    config = dict(architectures=["Qwen3ForCausalLM"], **_qwen3_fields(c, c.vocab_size),
                  max_position_embeddings=c.max_seq_len, bos_token_id=eot, eos_token_id=eot, use_cache=True)
    weights = {(k if k.startswith("lm_head.") else f"model.{k}"): v
               for k, v in qwen3_state_dict(target).items()}
    return _write(folder, config, weights) + [
        _write_json(folder, "generation_config.json",
                    dict(bos_token_id=eot, eos_token_id=eot, do_sample=False), indent=2),
        _write_json(folder, "tokenizer.json", to_tokenizer_json(tok), ensure_ascii=False),
        _write_json(folder, "tokenizer_config.json", dict(
            tokenizer_class="PreTrainedTokenizerFast", eos_token=ENDOFTEXT, bos_token=None,
            model_max_length=c.max_seq_len, clean_up_tokenization_spaces=False), indent=2)]


def export_drafter(drafter, folder):
    """A DFlash / DFlash 2 drafter -> an official drafter folder; returns the files written. Anything else is
    refused."""
    kind, c = getattr(drafter, "kind", None), drafter.config
    if kind not in ARCHITECTURES:
        raise ValueError(f"only DFlash and DFlash 2 drafters have an official layout, not a {kind!r} drafter")
    L = drafter.target.config.n_layer
    config = dict(architectures=[ARCHITECTURES[kind]], **_qwen3_fields(c, drafter.target.config.vocab_size),
                  max_position_embeddings=drafter.target.config.max_seq_len, block_size=c.block_size,
                  num_target_layers=L, dflash_config=dict(mask_token_id=c.mask_token_id,
                                                          target_layer_ids=list(c.target_layer_ids)))
    weights = qwen3_state_dict(drafter)
    if kind == "dflash2":
        config["dflash_config"].update({k: getattr(c, k) for k in DFLASH2_KEYS})
        if c.conv_kernel_size == 0:                  # no convolutions here = identity convolutions of one tap
            config["dflash_config"]["conv_kernel_size"] = 1
            G = c.n_embd // c.conv_group_size
            for i in range(c.n_layer):
                for conv in ("attention_conv", "mlp_conv"):
                    weights[f"layers.{i}.{conv}.base_kernel"] = torch.ones(2, 1, c.n_embd)
                    weights[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(2 * G, c.n_embd)
        for name in CODEBOOKS:                 # official checkpoints store the codebooks without ".weight"
            weights[name] = weights.pop(f"{name}.weight")
    return _write(folder, config, weights)


def export(out_dir, to_dir, written=None):
    """What `train_tiny.py --out out_dir` wrote -> to_dir/target, to_dir/drafter and, where the run made a
    sampling drafter, to_dir/drafter_sampling. Returns the target's and the drafter's paths; `written`, a
    list, receives every file written."""
    tok, target, drafter = checkpoint.load(out_dir)
    paths = os.path.join(to_dir, "target"), os.path.join(to_dir, "drafter")
    files = export_target(target, tok, paths[0]) + export_drafter(drafter, paths[1])
    sampling = os.path.join(out_dir, run_folder.SAMPLING_DRAFTER)
    if os.path.exists(sampling):
        sampler = checkpoint.load_drafter(sampling, target)[0]
        files += export_drafter(sampler, os.path.join(to_dir, "drafter_sampling"))
    if written is not None:
        written.extend(files)
    return paths


# ------------------------------------------------------------------ import

def _read_config(folder):
    path = os.path.join(folder, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config.json in {folder}: not a Hugging Face model folder")
    with open(path) as f:
        return json.load(f)


def _refuse_unmodelled(cfg, folder):
    """Raise ValueError naming the first config field that asks for something nanodflash does not model."""
    rope = cfg.get("rope_parameters") or {}
    checks = [
        ("model_type", cfg.get("model_type") == "qwen3", "only dense Qwen3 ('qwen3') is modelled"),
        ("num_experts", not cfg.get("num_experts"), "mixture-of-experts layers are not modelled"),
        ("attention_bias", not cfg.get("attention_bias"), "attention biases are not modelled"),
        ("use_sliding_window", not cfg.get("use_sliding_window"), "sliding-window attention is not modelled"),
        ("layer_types", all(t == "full_attention" for t in cfg.get("layer_types") or []),
         "only full-attention layers are modelled"),
        ("is_causal", not cfg.get("is_causal"), "a causal drafter block is not modelled"),
        ("hidden_act", cfg.get("hidden_act", "silu") == "silu", "only SwiGLU (silu) MLPs are modelled"),
        ("rope_scaling", not cfg.get("rope_scaling") and rope.get("rope_type", "default") == "default",
         "only plain RoPE is modelled (no scaling)"),
    ]
    for field, ok, why in checks:
        if not ok:
            raise ValueError(f"{folder}/config.json: {field}={cfg.get(field)!r}: {why}")


def _read_weights(folder, dtype):
    """model.safetensors, or the shards a model.safetensors.index.json lists -> {name: tensor in dtype}."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(load_file(os.path.join(folder, name)))
    return {k: v.to(dtype) for k, v in weights.items()}


def _fill(model, weights, folder):
    """Load `weights` into a model built on the meta device (no random init for billions of parameters)."""
    want = set(qwen3_state_dict(model))
    missing, extra = sorted(want - set(weights)), sorted(set(weights) - want)
    if missing or extra:
        raise ValueError(f"{folder}: weights do not match the config: missing {missing[:5]}, unexpected "
                         f"{extra[:5]}")
    model.load_state_dict(stacked_state_dict(weights), assign=True)
    return model.eval()


def _common(cfg):
    rope = cfg.get("rope_parameters") or {}
    return dict(n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                n_kv_head=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                n_embd=cfg["hidden_size"],
                mlp_hidden=cfg["intermediate_size"], head_dim=cfg.get("head_dim") or 0,
                rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-6)))


def load_target(folder, device="cpu", dtype=torch.float32):
    """A Qwen3ForCausalLM folder -> our GPT (tied embeddings become one shared tensor)."""
    cfg = _read_config(folder)
    _refuse_unmodelled(cfg, folder)
    if "Qwen3ForCausalLM" not in cfg.get("architectures", ["Qwen3ForCausalLM"]):
        raise ValueError(f"{folder}/config.json: architectures={cfg['architectures']}: need Qwen3ForCausalLM")
    config = GPTConfig(vocab_size=cfg["vocab_size"], max_seq_len=cfg.get("max_position_embeddings", 40960),
                       **_common(cfg))
    weights = {k.removeprefix("model."): v for k, v in _read_weights(folder, dtype).items()}
    if "lm_head.weight" not in weights and cfg.get("tie_word_embeddings"):
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    with torch.device("meta"):
        target = GPT(config)
    target = _fill(target, weights, folder)
    if cfg.get("tie_word_embeddings"):
        target.lm_head.weight = target.embed_tokens.weight
    return target.to(device)


def load_drafter(folder, target, device="cpu", dtype=torch.float32):
    """An official DFlash / DFlash 2 drafter folder -> our drafter on `target` (ours or imported)."""
    cfg = _read_config(folder)
    _refuse_unmodelled(cfg, folder)
    arch = (cfg.get("architectures") or [None])[0]
    kinds = {a: k for k, a in ARCHITECTURES.items()}
    if arch not in kinds:
        raise ValueError(f"{folder}/config.json: architectures={cfg.get('architectures')}: need one of "
                         f"{sorted(kinds)}")
    dcfg = {**cfg, **(cfg.get("dflash_config") or {})}                 # official lookup: dflash_config first
    for field, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                           ("final_logit_softcapping", 0)):
        if float(dcfg.get(field) or neutral) != neutral:
            raise ValueError(f"{folder}/config.json: {field}={dcfg[field]!r} is not modelled")
    if dcfg.get("mask_token_id") is None:
        raise ValueError(f"{folder}/config.json: dflash_config.mask_token_id is missing: DFlash needs a mask "
                         "token")
    n_target_layers = dcfg.get("num_target_layers", target.config.n_layer)
    ids = dcfg.get("target_layer_ids") or default_target_layer_ids(n_target_layers, cfg["num_hidden_layers"])
    cls = DRAFTER_KINDS[kinds[arch]]
    extra = {k: int(dcfg[k]) for k in DFLASH2_KEYS} if cls is DFlash2Drafter else {}
    config = cls.config_class(block_size=int(dcfg.get("block_size", 16)), target_layer_ids=list(ids),
                              mask_token_id=int(dcfg["mask_token_id"]), **_common(cfg), **extra)
    weights = _read_weights(folder, dtype)
    for name in CODEBOOKS:
        if name in weights:
            weights[f"{name}.weight"] = weights.pop(name)
    with torch.device("meta"):
        drafter = cls(config, target)
    return _fill(drafter, weights, folder).to(device)


def load(target_dir, drafter_dir=None, device="cpu", dtype=torch.float32):
    """tok, target, drafter from Hugging Face folders (drafter None without drafter_dir)."""
    for folder in (target_dir, drafter_dir or target_dir):
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"no Hugging Face folder {folder}: it does not exist (`python -m "
                                    "nanodflash.tools.hf export --out RUN --to DIR` makes DIR/target and "
                                    "DIR/drafter)")
    tok = from_tokenizer_json(os.path.join(target_dir, "tokenizer.json"))
    target = load_target(target_dir, device, dtype)
    drafter = load_drafter(drafter_dir, target, device, dtype) if drafter_dir else None
    return tok, target, drafter


def eos_token_ids(target_dir):
    """The stop tokens of a Hugging Face folder: generation_config.json's eos_token_id, else config.json's."""
    ids = None
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(target_dir, name)
        if ids is None and os.path.exists(path):
            with open(path) as f:
                ids = json.load(f).get("eos_token_id")
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def main(argv=None):
    p = argparse.ArgumentParser(description="Export a train_tiny.py run to Hugging Face Qwen3 + official "
                                "DFlash folders.")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write TO/target (Qwen3ForCausalLM), TO/drafter (official DFlash "
                       "layout) and TO/drafter_sampling (the sampling drafter, where the run made one)")
    e.add_argument("--out", default="out", help="folder written by train_tiny.py --out "
                   "(default: %(default)s)")
    e.add_argument("--to", default="out_hf", help="folder to write (default: %(default)s)")
    args = p.parse_args(argv)
    written = []
    try:
        export(args.out, args.to, written)
    except (OSError, ValueError) as err:
        sys.exit(f"error: {err}")
    for path in written:
        print(f"wrote {path}")
    if not os.path.exists(os.path.join(args.out, run_folder.SAMPLING_DRAFTER)):
        print(f"no sampling drafter exported: {args.out} has no {run_folder.SAMPLING_DRAFTER} "
              "(`train_tiny.py` adds it to a run made with --no-sampling)")


if __name__ == "__main__":
    main()
