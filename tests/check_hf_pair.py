"""Conformance of a trained pair with the official code, on held-out prompts (uses the test dependencies).

    python tests/check_hf_pair.py out 16      # export out/ -> out_hf/, then compare in float64

Prints the largest logit difference between our target and the exported one in transformers, and on how many
prompts the official `dflash_generate` gives the same tokens and the same acceptance length at every step as
`speculative_generate` (B=16, 96 new tokens, train_tiny's summary prompts). tests/test_hf.py asserts the same
on smoke-sized pairs; this script is for a real run's checkpoints.
"""

import sys
import time
from pathlib import Path

import dflash.model as official
import torch
from transformers import Qwen3ForCausalLM

# the repository: `python tests/...` finds nanodflash
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import nanodflash  # noqa: E402
from nanodflash.speculative import speculative_generate  # noqa: E402
from nanodflash.store import data
from nanodflash.tools import hf  # noqa: E402

official._cuda_time = time.perf_counter          # its timer calls torch.cuda.synchronize(); we run on the CPU


def main(run, n):
    torch.set_num_threads(1)
    t_dir, d_dir = hf.export(run, run.rstrip("/") + "_hf")
    tok, target, drafter = nanodflash.load(run)
    target.double(), drafter.double()
    hf_target = Qwen3ForCausalLM.from_pretrained(t_dir, dtype=torch.float64).eval()
    drafter_class = getattr(official, hf.ARCHITECTURES[drafter.kind])
    hf_drafter = drafter_class.from_pretrained(d_dir, dtype=torch.float64).eval()
    ids = torch.tensor(tok.encode_ordinary(data.load_corpus(None)), dtype=torch.long)
    prompts = [list(map(int, p)) for p in data.window_prompts(data.split_train_val(ids)[1], n, 16, 1337 + 2)]
    with torch.no_grad():
        x = torch.tensor(prompts[:8])
        difference = (target(x)[0] - hf_target(x).logits).abs().max()
        print(f"max |logit difference|, float64, 8 x 16 tokens: {difference:.2e}")
    same_tokens = same_steps = 0
    for p in prompts:
        ours, stats = speculative_generate(target, drafter, p, 96, block_size=16)
        theirs = official.dflash_generate(hf_drafter, hf_target, torch.tensor([p]), 96, None, block_size=16,
                                          return_stats=True)
        same_tokens += theirs.output_ids[0, len(p):].tolist() == ours
        same_steps += theirs.acceptance_lengths == stats.acceptance_lengths
    print(f"{n} prompts x 96 tokens, B=16: same tokens on {same_tokens}/{n}, "
          f"the same acceptance length at every step on {same_steps}/{n}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out", int(sys.argv[2]) if len(sys.argv) > 2 else 16)
