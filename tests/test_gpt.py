"""Ladder 2: the target with its explicit KV cache computes exactly what it computes without one."""

import torch
import torch.nn.functional as F

from helpers import tiny_target
from nanodflash.gpt import GPT, AttentionProjections, GPTConfig, RopeTable, apply_rope, rope_cos_sin
from nanodflash.speculative import generate
from nanodflash.store.data import load_corpus, split_train_val
from nanodflash.train import estimate_loss, train_target


def test_logits_with_kv_cache_equal_logits_without(target):
    x = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    full, feats = target(x, layer_ids=[0, 2])
    cache = target.new_cache(2)
    # prefill 13 tokens, then one at a time
    parts = [target(x[:, :13], cache, layer_ids=[0, 2])]
    parts += [target(x[:, t:t + 1], cache, layer_ids=[0, 2]) for t in range(13, 40)]
    torch.testing.assert_close(torch.cat([p[0] for p in parts], 1), full, rtol=0, atol=1e-12,
                               msg="cached logits differ from the no-cache forward")
    torch.testing.assert_close(torch.cat([p[1] for p in parts], 1), feats, rtol=0, atol=1e-12,
                               msg="cached features differ from the no-cache forward")
    assert cache.length == 40, f"cache length {cache.length} != tokens fed (40)"


def test_crop_then_extend_equals_a_fresh_run():
    target = tiny_target(seed=3)
    g = torch.Generator().manual_seed(1)
    x, junk = torch.randint(0, 64, (1, 30), generator=g), torch.randint(0, 64, (1, 9), generator=g)
    cache = target.new_cache(1)
    target(x[:, :20], cache)
    target(junk, cache)                      # tokens that get rejected ...
    cache.crop(20)                           # ... and rolled back
    extended, _ = target(x[:, 20:], cache)
    fresh, _ = target(x)
    torch.testing.assert_close(extended, fresh[:, 20:], rtol=0, atol=1e-12,
                               msg="after crop, extending does not match a fresh run: "
                                   "stale cache entries leak")


def test_features_are_the_outputs_of_the_requested_layers_in_order(target):
    x = torch.randint(0, 64, (1, 7))
    _, f = target(x, layer_ids=[2, 0])
    _, f2 = target(x, layer_ids=[2])
    _, f0 = target(x, layer_ids=[0])
    D = target.config.n_embd
    assert f.shape == (1, 7, 2 * D), f"features shape {tuple(f.shape)} != (1, 7, 2*D)"
    torch.testing.assert_close(f[..., :D], f2, msg="first feature block should be layer 2's output")
    torch.testing.assert_close(f[..., D:], f0, msg="second feature block should be layer 0's output")


def test_greedy_generate_with_cache_equals_a_no_cache_argmax_loop(target):
    prompt = [5, 9, 2]
    seq = list(prompt)
    for _ in range(25):
        logits, _ = target(torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    assert generate(target, prompt, 25) == seq[3:], "cached greedy generate diverged from the argmax loop"


def test_grouped_query_attention_runs_and_caches_fewer_heads():
    target = tiny_target(n_head=4, n_kv_head=1)
    cache = target.new_cache(1)
    target(torch.tensor([[1, 2, 3]]), cache)
    assert cache.k.shape[2] == 1, "with n_kv_head=1 the cache should hold one key head per layer"


def test_smoke_training_lowers_the_loss():
    from nanodflash.store.tokenizer import train_tokenizer
    text = load_corpus()[:40000]
    enc = train_tokenizer(text, vocab_size=300)
    tr, va = split_train_val(torch.tensor(enc.encode_ordinary(text)), chunk_len=256)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=300, n_layer=2, n_head=2, n_kv_head=2, n_embd=32, mlp_hidden=64,
                          max_seq_len=64))
    before = estimate_loss(model, va, 8, 32, 4)
    hist = train_target(model, tr, va, steps=60, batch_size=8, seq_len=32, lr=3e-3, eval_every=60,
                        log_every=1000)
    assert hist["val_loss"][-1] < before - 0.5, \
        f"val loss {before:.3f} -> {hist['val_loss'][-1]:.3f}: no learning"


def test_the_rope_table_looks_up_exactly_what_rope_cos_sin_computes():
    """Bit for bit, for single positions, ranges, the (rows, T) positions of ragged batches, and float64."""
    table = RopeTable(512, 16, 10000.0)
    for positions in (torch.tensor([0]), torch.tensor([511]), torch.arange(37, 101),
                      torch.tensor([[3, 4, 5], [200, 201, 202]])):
        for dtype in (torch.float32, torch.float64):
            for got, want in zip(table(positions, dtype), rope_cos_sin(positions, 16, 10000.0, dtype)):
                assert got.dtype == dtype and torch.equal(got, want), f"table differs at {positions.tolist()}"


def separate_projections(attn, x, cos, sin):
    """The projection equations one weight at a time, as docs/design.md writes them: q = RoPE(q_norm(W_q x)),
    k = RoPE(k_norm(W_k x)), v = W_v x, each (B, heads, T, hd)."""
    B, T, _ = x.shape
    def heads(y):
        return y.view(B, T, -1, attn.head_dim).transpose(1, 2)             # (B, T, n*hd) -> (B, n, T, hd)
    hd = attn.head_dim
    W_q, W_k, W_v = attn.qkv_proj.weight.split([attn.n_head * hd, attn.n_kv_head * hd, attn.n_kv_head * hd])
    q = apply_rope(attn.q_norm(heads(F.linear(x, W_q))), cos, sin)
    k = apply_rope(attn.k_norm(heads(F.linear(x, W_k))), cos, sin)
    return q, k, heads(F.linear(x, W_v))


def test_one_stacked_projection_gives_the_numbers_of_three_separate_ones():
    """In float32 bit for bit (each output column is the same dot product); queries and keys of grouped
    attention (4 query heads, 2 key heads) normed with their own weights."""
    torch.manual_seed(0)
    attn = AttentionProjections(64, n_head=4, n_kv_head=2, head_dim=16)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)                # norm weights of their own, not ones
        attn.k_norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(3, 9, 64)
        cos, sin = RopeTable(32, 16, 10000.0)(torch.arange(9), torch.float32)
        for got, want, name in zip(attn.project(x, cos, sin), separate_projections(attn, x, cos, sin), "qkv"):
            assert torch.equal(got, want), f"stacked {name} differs from the separate projection's"
        for got, want, name in zip(attn.key_value(x, cos, sin), separate_projections(attn, x, cos, sin)[1:],
                                   "kv"):
            assert torch.equal(got, want), f"{name} without the queries differs from the separate one's"


def test_a_checkpoint_under_qwen3s_names_loads_into_the_stacked_weights_and_saves_back_the_same():
    """On disk the weights keep Qwen3's names (q_proj, k_proj, v_proj, gate_proj, up_proj), as run folders
    has them: split from the stacked weights on save, stacked again on load, to the same numbers."""
    from nanodflash.store.checkpoint import qwen3_state_dict, stacked_state_dict
    target = tiny_target(seed=7)
    on_disk = qwen3_state_dict(target)
    assert "layers.0.self_attn.k_proj.weight" in on_disk and "layers.0.mlp.up_proj.weight" in on_disk, \
        f"the names on disk are not Qwen3's: {sorted(on_disk)[:8]}"
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in on_disk), "a stacked name reached the disk"
    copy = GPT(target.config).double()
    copy.load_state_dict(stacked_state_dict(on_disk))
    x = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(copy(x)[0], target(x)[0]), "weights loaded from Qwen3's names: other logits"
    swapped = dict(on_disk)                                  # the control: k and v exchanged on disk
    swapped["layers.0.self_attn.k_proj.weight"], swapped["layers.0.self_attn.v_proj.weight"] = \
        on_disk["layers.0.self_attn.v_proj.weight"], on_disk["layers.0.self_attn.k_proj.weight"]
    copy.load_state_dict(stacked_state_dict(swapped))
    with torch.no_grad():
        assert not torch.equal(copy(x)[0], target(x)[0]), "exchanging k and v changed nothing: a blind check"
