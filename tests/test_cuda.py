"""The same claims on CUDA (skipped without a GPU): batch-1 and batched greedy decoding equal plain greedy
decoding, and batched sampling gives each row the target's distribution.

float64 models, as in helpers.py, so that a batched forward and a one-token forward agree to rounding and
greedy ties cannot flip an argmax; the sampling check reuses test_batch.py's chi-square against enumeration.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

from helpers import tiny_drafter, tiny_target  # noqa: E402
from nanodflash.ext.batch import generate_batch, speculative_generate_batch  # noqa: E402
from nanodflash.speculative import generate, speculative_generate  # noqa: E402
from test_batch import PROMPTS, SAMPLE_PROMPTS, H, N, V, assert_target_distribution  # noqa: E402
from test_dflash2 import tiny_dflash2  # noqa: E402

NEW = 30


@pytest.fixture(scope="module")
def gpu_models():
    target = tiny_target().cuda()
    return target, {"dflash": tiny_drafter(target).cuda(),
                    "dflash2": tiny_dflash2(target, perturb=0.3).cuda()}


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
@pytest.mark.parametrize("block_size", [1, 4, 16, "auto"])
def test_cuda_batch1_and_batched_greedy_equal_plain_greedy(gpu_models, kind, block_size):
    target, drafters = gpu_models
    refs = [generate(target, p, NEW) for p in PROMPTS]
    for i, p in enumerate(PROMPTS[:3]):
        out, _ = speculative_generate(target, drafters[kind], p, NEW, block_size=block_size)
        assert out == refs[i], f"CUDA batch-1 {kind} B={block_size}: prompt {i} diverged from greedy decoding"
    assert generate_batch(target, PROMPTS, NEW) == refs, \
        "CUDA generate_batch diverged from per-prompt generate"
    stops = [refs[1][6], refs[4][17]]
    out, _ = speculative_generate_batch(target, drafters[kind], PROMPTS, NEW, block_size=block_size,
                                        stop_token_ids=stops)
    want = [generate(target, p, NEW, stop_token_ids=stops) for p in PROMPTS]
    bad = [i for i in range(len(PROMPTS)) if out[i] != want[i]]
    assert not bad, f"CUDA batched {kind} B={block_size}: rows {bad} diverged from generate alone"


@pytest.mark.parametrize("verifier", ["match", "rejection"])
def test_cuda_batched_sampling_rows_have_exactly_the_targets_distribution(verifier):
    target = tiny_target(seed=11, vocab=V, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=60.0)
    drafter = tiny_drafter(target, seed=12, block_size=4, n_layer=1)
    with torch.no_grad():
        drafter.norm.weight.mul_(0.3)
    target_gpu, drafter_gpu = target.cuda(), drafter.cuda()      # (the same modules, moved)
    g = torch.Generator().manual_seed(0)                         # samplers draw on the CPU, as at batch 1
    counts = [dict() for _ in SAMPLE_PROMPTS]
    for _ in range(4):
        out, _ = speculative_generate_batch(target_gpu, drafter_gpu, SAMPLE_PROMPTS * (N // 4), H,
                                            block_size=4, temperature=1.0, verifier=verifier, generator=g)
        for i, o in enumerate(out):
            c = counts[i % len(SAMPLE_PROMPTS)]
            c[tuple(o)] = c.get(tuple(o), 0) + 1
    assert_target_distribution(counts, target_gpu, 1.0, None, f"CUDA {verifier}")
