"""The peers beside nanodflash in the bench: the run's pair exported (tools/hf.py) and decoded by Hugging
Face transformers' `generate` and by the official DFlash loop (`dflash_generate`, the `dflash` package), on
the same prompts, interleaved with the bench's other rows, each at the thread count of its kind.

    make test                                      # installs the test extras: transformers and dflash
    python -m nanodflash.tools.bench --out out     # + the two peer rows, when both packages import

Rows: "plain greedy (transformers generate)": greedy, `use_cache=True`, float32 as ours, exactly
max_new_tokens tokens (no stop token, as the bench's own rows), at the plain count; "<kind> greedy B=<B>
(official dflash_generate)": the drafter at its own block size (up to 16), at the speculative count. Their
outputs must equal plain greedy decoding's, as every greedy row's; their speedup is over nanodflash's plain
row, and the bench prints nanodflash's speed over each. Their τ is not shown: the peers' loops are not ours
to count (tests/test_hf.py checks the official loop step for step).
"""

import importlib.util
import tempfile

import torch

from . import hf
from .bench_methods import Method

HF_ROW, OFFICIAL_ROW = "plain greedy (transformers generate)", "greedy B={B} (official dflash_generate)"
PACKAGES = ("transformers", "dflash")


def available():
    """Whether the peers' packages import here (the test extras)."""
    return all(importlib.util.find_spec(name) is not None for name in PACKAGES)


def peer_methods(out_dir, drafter, kind):
    """The two peer rows for run folder `out_dir` (its pair exported to a temporary folder and loaded in
    float32), or [] when the packages are missing. kind: the drafter's row-name prefix."""
    if not available():
        return []
    import dflash.model as official
    from transformers import GenerationConfig, Qwen3ForCausalLM
    with tempfile.TemporaryDirectory() as folder:
        t_dir, d_dir = hf.export(out_dir, folder)
        target = Qwen3ForCausalLM.from_pretrained(t_dir, dtype=torch.float32).eval()
        their_drafter = getattr(official, hf.ARCHITECTURES[drafter.kind]).from_pretrained(
            d_dir, dtype=torch.float32).eval()
    B = min(16, drafter.block_size)

    @torch.no_grad()
    def hf_generate(_target, _drafter, prompt, max_new_tokens, _generator):
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                  eos_token_id=None, pad_token_id=0)
        out = target.generate(torch.tensor([prompt]), generation_config=config)
        return out[0, len(prompt):].tolist(), None

    @torch.no_grad()
    def official_generate(_target, _drafter, prompt, max_new_tokens, _generator):
        out = official.dflash_generate(their_drafter, target, torch.tensor([prompt]), max_new_tokens, None,
                                       block_size=B)
        return out[0, len(prompt):].tolist(), None
    return [Method(HF_ROW, 0.0, hf_generate), Method(f"{kind} {OFFICIAL_ROW.format(B=B)}", 0.0,
                                                     official_generate)]


def format_peers(rows):
    """'nanodflash over the peers: plain decoding 1.52x transformers generate; DFlash 1.20x the official
    dflash_generate' (total tokens over total seconds each, the same prompts), or '' without peer rows."""
    by_name = {r["name"]: r for r in rows}
    ours_plain, hf_row = by_name.get("plain greedy"), by_name.get(HF_ROW)
    official = next((r for r in rows if r["name"].endswith("(official dflash_generate)")), None)
    if hf_row is None or official is None:
        return ""
    ours_spec = by_name[official["name"].removesuffix(" (official dflash_generate)")]
    return (f"nanodflash over the peers (same weights, prompts and threads, interleaved): plain decoding "
            f"{ours_plain['tokens_per_s'] / hf_row['tokens_per_s']:.2f}x transformers generate; "
            f"{ours_spec['name']} {ours_spec['tokens_per_s'] / official['tokens_per_s']:.2f}x the official "
            "dflash_generate")
