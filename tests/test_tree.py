"""Tree verification (tree.py): the tree mask, one target pass = every path alone, the compacted cache, the
single path as a special case, lossless greedy and sampled decoding, and clear errors."""


import pytest
import torch

import nanodflash.ext.tree as tree_mod
from helpers import tiny_drafter
from nanodflash.exercises.models import OracleTreeDrafter, random_prefix, tiny_dflash2
from nanodflash.exercises.oracle import ancestors, random_tree, tree_counts
from nanodflash.ext.tree import (
    accept_path,
    draft_tree,
    keep_path,
    tree_mask,
    tree_speculative_generate,
    verify_tree,
)
from nanodflash.sampling import probs_from_logits, sample
from nanodflash.speculative import generate, speculative_generate
from test_sampling_exact import ALPHA, N_OTHER_PATHS, chi_square_p_value, exact_distribution

PROMPTS = [[3], [7, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))]


@pytest.mark.parametrize("seed", range(5))
def test_tree_mask_lets_each_node_see_exactly_itself_and_its_ancestors(seed):
    tree = random_tree(seed, 20)
    mask = tree_mask(tree.parent)
    for i in range(len(tree)):
        for j in range(len(tree)):
            assert bool(mask[i, j]) == (j in ancestors(tree.parent, i)), \
                f"tree {seed}: mask[{i}, {j}] should be {j in ancestors(tree.parent, i)}"


def prefilled(target, tokens, extra=0):
    cache = target.new_cache(1, len(tokens) + extra)
    target(torch.tensor([tokens]), cache)
    return cache


@pytest.mark.parametrize("seed", range(3))
def test_every_node_gets_the_logits_and_features_of_its_own_path_decoded_alone(target, seed):
    prompt, tree, ids = PROMPTS[1], random_tree(seed, 24), [0, 2]
    cache = prefilled(target, prompt, len(tree))
    logits, feats = verify_tree(target, cache, tree, ids)
    assert cache.length == len(prompt) + len(tree), "the verify pass must append the anchor and every node"
    for node in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path(node)]
        alone = prefilled(target, prompt, len(path))
        ref, ref_feats = target(torch.tensor([path]), alone, layer_ids=ids)
        torch.testing.assert_close(logits[node], ref[0, -1], rtol=0, atol=1e-10,
                                   msg=f"node {node} (depth {tree.depth[node]}): tree logits differ from "
                                       "its path alone")
        torch.testing.assert_close(feats[0, node], ref_feats[0, -1], rtol=0, atol=1e-10,
                                   msg=f"node {node}: tree features differ from its path alone")


@pytest.mark.parametrize("which", ["anchor only", "partial", "full depth"])
def test_the_cache_after_keeping_a_path_equals_a_fresh_cache_of_the_same_tokens(target, which):
    prompt, tree = PROMPTS[2], random_tree(3, 30)
    deepest = max(range(len(tree)), key=lambda i: tree.depth[i])
    full = tree.path(deepest)
    path = {"anchor only": [0], "partial": full[: len(full) // 2 + 1], "full depth": full}[which]
    assert len(full) >= 4 and 1 < len(full) // 2 + 1 < len(full), \
        "the random tree is too shallow for this test"
    cache = prefilled(target, prompt, len(tree) + 1)
    start = cache.length
    verify_tree(target, cache, tree)
    keep_path(cache, start, path)
    kept = prompt + [tree.tokens[i] for i in path]
    fresh = prefilled(target, kept, 1)
    n = len(kept)
    assert cache.length == n, f"cache length {cache.length} != {n} tokens kept"
    torch.testing.assert_close(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], rtol=0, atol=1e-10,
                               msg=f"{which}: compacted keys differ from a fresh cache of the same tokens")
    torch.testing.assert_close(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], rtol=0, atol=1e-10,
                               msg=f"{which}: compacted values differ from a fresh cache of the same tokens")
    nxt = torch.tensor([[5]])
    torch.testing.assert_close(target(nxt, cache)[0], target(nxt, fresh)[0], rtol=0, atol=1e-10,
                               msg=f"{which}: the next step's logits differ after compaction")


def test_best_first_tree_keeps_the_highest_scoring_paths_and_each_parent_first(target):
    d = tiny_dflash2(target, perturb=0.3)
    dcache = d.new_cache(64)
    _, feats = target(torch.tensor([PROMPTS[1]]), layer_ids=d.config.target_layer_ids)
    d.extend(dcache, feats)
    t = draft_tree(d, dcache, 5, 15, 40)
    assert len(t) == 41 and all(t.parent[i] < i for i in range(1, len(t))), \
        "parents must come before children"
    assert all(t.score[i] <= t.score[t.parent[i]] + 1e-12 for i in range(1, len(t))), \
        "a child outscored its parent"
    assert max(t.depth) > 1 and max(len(c) for c in t.children) > 1, "the tree is neither deep nor wide"
    # any extension left out scores no higher than the worst node kept (best-first is exact)
    cand, logp = d.candidates(dcache, 5, 15, tree_mod.TREE_TEMPERATURE)
    worst, index_of = min(t.score[1:]), {}
    for i in range(1, len(t)):
        index_of[i] = int((cand[t.depth[i] - 1] == t.tokens[i]).nonzero())
    for i in range(len(t)):
        if t.depth[i] < 15:
            row = logp[t.depth[i], 0 if i == 0 else index_of[i]]
            for c in range(cand.size(1)):
                if int(cand[t.depth[i], c]) not in t.children[i]:
                    assert t.score[i] + float(row[c]) <= worst + 1e-12, \
                        "a better path than a kept one was left out"


@pytest.fixture(scope="module")
def smoke(smoke_out):
    """The smoke run's trained DFlash 2 drafter (B=8) and its target, and held-out prompts:
    real acceptance."""
    import nanodflash
    from nanodflash.store.data import val_prompts
    tok, target, drafter = nanodflash.load(str(smoke_out))
    return target, drafter, val_prompts(tok, 3, 16, 0)


def test_one_child_per_node_and_B_minus_1_nodes_is_exactly_dflash2s_single_path(smoke):
    target, d, prompts = smoke
    lengths = []
    for prompt in prompts:
        ref, ref_stats = speculative_generate(target, d, prompt, 40)
        out, stats = tree_speculative_generate(target, d, prompt, 40, tree_nodes=7, branching=1)
        assert out == ref, "the one-path tree decoded other tokens than speculative_generate"
        assert stats.acceptance_lengths == ref_stats.acceptance_lengths, \
            "acceptance lengths differ from the single path"
        assert all(m <= 7 for m in stats.tree_nodes), "a one-path tree verified more than B-1 nodes"
        lengths += stats.acceptance_lengths
    assert any(a > 1 for a in lengths), "no draft was ever accepted: the comparison has no power"


def test_one_child_per_node_is_exactly_the_single_path_for_a_dflash1_style_drafter_too(target):
    lengths = []
    for prompt in PROMPTS:
        ref, ref_stats = speculative_generate(target, OracleTreeDrafter(target, 8, n_right=random_prefix),
                                              prompt, 40)
        out, stats = tree_speculative_generate(target, OracleTreeDrafter(target, 8, n_right=random_prefix),
                                               prompt, 40, tree_nodes=7, branching=1)
        assert out == ref and stats.acceptance_lengths == ref_stats.acceptance_lengths, \
            "the one-path tree of a DFlash 1 drafter differs from speculative_generate"
        lengths += stats.acceptance_lengths
    assert any(1 < a < 8 for a in lengths), "partial acceptance never happened: the comparison has no power"


@pytest.mark.parametrize("tree_nodes", [4, 16, 64])
def test_greedy_tree_decoding_with_a_trained_dflash2_drafter_is_plain_greedy(smoke, tree_nodes):
    target, d, prompts = smoke
    lengths = []
    for prompt in prompts:
        out, stats = tree_speculative_generate(target, d, prompt, 48, tree_nodes=tree_nodes)
        assert out == generate(target, prompt, 48), \
            f"tree_nodes={tree_nodes}: output diverged from plain greedy"
        lengths += stats.acceptance_lengths
    assert any(a > 2 for a in lengths), f"tree_nodes={tree_nodes}: deep paths were never accepted: {lengths}"


@pytest.mark.parametrize("tree_nodes", [2, 8, 32])
@pytest.mark.parametrize("kind", ["dflash", "dflash2", "oracle_random_prefix", "oracle_always_right"])
def test_greedy_tree_decoding_is_token_identical_to_plain_greedy(target, kind, tree_nodes):
    d = {"dflash": lambda: tiny_drafter(target, block_size=8),
         "dflash2": lambda: tiny_dflash2(target, block_size=8, perturb=0.3),
         "oracle_random_prefix": lambda: OracleTreeDrafter(target, 8, n_right=random_prefix),
         "oracle_always_right": lambda: OracleTreeDrafter(target, 8)}[kind]()
    window = target.config.max_seq_len
    long_prompt = list(range(1, 61)) * 2
    requests = [(PROMPTS[0], 40, None), (PROMPTS[1], 40, None),
                (long_prompt[:100], window - 100, None)]        # window
    stop = generate(target, PROMPTS[2], 40)[12]
    requests.append((PROMPTS[2], 40, [stop]))                   # a stop token
    lengths = []
    for prompt, n, stops in requests:
        ref = generate(target, prompt, n, stop_token_ids=stops)
        out, stats = tree_speculative_generate(target, d, prompt, n,
                                               tree_nodes=min(tree_nodes, window - len(prompt) - 1),
                                               stop_token_ids=stops)
        assert out == ref, \
            f"{kind}, tree_nodes={tree_nodes}, prompt of {len(prompt)}: output diverged from greedy"
        assert len(out) == 1 + sum(stats.acceptance_lengths), "stats must account for every emitted token"
        assert all(0 <= m <= tree_nodes for m in stats.tree_nodes), "a step verified more nodes than allowed"
        lengths += stats.acceptance_lengths
    if kind.startswith("oracle") and tree_nodes >= 8:
        assert any(a == 8 for a in lengths), f"{kind}: full-depth acceptance never happened: {lengths}"
    if kind == "oracle_random_prefix" and tree_nodes >= 8:
        assert any(a == 1 for a in lengths) and any(1 < a < 8 for a in lengths), \
            f"zero or partial acceptance never happened: {lengths}"


def test_the_caches_after_a_tree_run_continue_like_a_fresh_prefill(target):
    d = OracleTreeDrafter(target, 8, n_right=random_prefix)
    for drafter in (d, tiny_dflash2(target, block_size=8, perturb=0.3)):
        out, stats = tree_speculative_generate(target, drafter, PROMPTS[1], 33, tree_nodes=16)
        cache = stats.target_cache
        assert cache.length == len(PROMPTS[1]) + len(out) - 1, \
            "the target cache must hold exactly the verified tokens"
        nxt = torch.tensor([[out[-1]]])
        fresh, _ = target(torch.tensor([PROMPTS[1] + out]))
        torch.testing.assert_close(target(nxt, cache)[0][0, -1], fresh[0, -1], rtol=0, atol=1e-10,
                                   msg="continuing from the tree run's cache differs from a fresh prefill")
    assert stats.draft_cache.length == len(PROMPTS[1]) + len(out) - 1, \
        "drafter context: one entry per verified token"
    assert d.new_cache(0) == [] and OracleTreeDrafter(target, 8).new_cache(0) == []


# --------------------------------------------------------------------------- sampling: exactly the target's p

# DFlash at T=0.7 and at T=1 with top-k 2: the accept_path exercise's claim (the same runs, twice as many),
# which test_exercises.py runs on the library's function
@pytest.mark.parametrize("kind,temperature,top_k,top_p",
                         [("dflash", 1.0, None, 0.8), ("dflash2", 1.0, None, None)])
def test_sampled_tree_decoding_has_exactly_the_targets_distribution(small, kind, temperature, top_k, top_p):
    target, drafter = small[0], small[1][kind]
    exact = exact_distribution(target, temperature, top_k, top_p)
    counts, lengths = tree_counts(target, drafter, temperature, top_k, top_p)
    impossible = [s for s in counts if exact[s] == 0]
    assert not impossible, f"produced outputs the target can never produce: {impossible[:3]}"
    assert any(a > 2 for a in lengths) and any(a == 1 for a in lengths), \
        "deep acceptance and misses must both occur"
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p > ALPHA, (f"{kind} T={temperature} top_k={top_k} top_p={top_p}: chi-square p={p:.2e} -- "
                       "not the target's distribution")


def resample_on_miss(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
    """WRONG on purpose: when the draw y has no child, it emits a NEW draw from p instead of y."""
    path, node = [0], 0
    while True:
        p = probs_from_logits(logits[node].detach(), temperature, top_k, top_p)
        child = tree.children[node].get(int(sample(p, generator)))
        if child is None:
            return path, int(sample(p, generator))
        node = child
        path.append(node)


def test_a_deliberately_wrong_acceptance_rule_fails_the_same_test(small, monkeypatch):
    target, drafter = small[0], small[1]["dflash"]
    monkeypatch.setattr(tree_mod, "accept_path", resample_on_miss)
    exact = exact_distribution(target, 1.0, None, None)
    counts, _ = tree_counts(target, drafter, 1.0, None, None)
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p < ALPHA, \
        f"the test cannot tell resample_on_miss from the right rule (p={p:.2e}): it has no power"


def test_greedy_acceptance_follows_the_targets_argmax_down_the_tree():
    t = random_tree(0, 10)
    logits = torch.zeros(len(t), 64)
    node, expect = 0, [0]
    while t.children[node]:
        token, child = next(iter(t.children[node].items()))
        logits[node, token] = 1.0
        node = child
        expect.append(node)
    logits[node, 63] = 1.0
    assert accept_path(t, logits) == (expect, 63), \
        "greedy acceptance must follow the argmax child, then the bonus"


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("bad", [0, -3, 2.5, True, 128, 10**6])
def test_tree_nodes_outside_what_the_window_allows_is_a_clear_value_error(target, drafter, bad):
    with pytest.raises(ValueError, match="tree_nodes"):
        tree_speculative_generate(target, drafter, PROMPTS[1], 10, tree_nodes=bad)


def test_the_largest_tree_the_window_allows_is_accepted_and_branching_and_tree_temperature_are_checked(
        target, drafter):
    room = target.config.max_seq_len - len(PROMPTS[1]) - 1
    out, _ = tree_speculative_generate(target, drafter, PROMPTS[1], 10, tree_nodes=room)
    assert out == generate(target, PROMPTS[1], 10), "the largest allowed tree decoded something else"
    with pytest.raises(ValueError, match="tree_nodes"):
        tree_speculative_generate(target, drafter, PROMPTS[1], 10, tree_nodes=room + 1)
    with pytest.raises(ValueError, match="branching"):
        tree_speculative_generate(target, drafter, PROMPTS[1], 10, branching=0)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tree_temperature"):
            tree_speculative_generate(target, drafter, PROMPTS[1], 10, tree_temperature=bad)


# --------------------------------------------------------------------------- the tree rows benchmark

def test_bench_tree_prints_single_path_and_tree_rows_all_equal_to_plain_greedy(smoke_out, tmp_path, capsys):
    import json

    from nanodflash.tools import bench_tree
    path = tmp_path / "tree.json"
    bench_tree.main(["--out", str(smoke_out), "--n_prompts", "2", "--max_new_tokens", "12",
                     "--sizes", "4", "16", "--repeats", "2", "--json", str(path)])
    text = capsys.readouterr().out
    for row in ("plain greedy", "dflash2 B=8", "dflash2 tree N=4", "dflash2 tree N=16"):
        assert row in text, f"the table has no row {row!r}:\n{text}"
    assert " NO" not in text and "candidate ceiling" in text, \
        f"a row differs from plain greedy, or no ceiling:\n{text}"
    rows = json.loads(path.read_text())["rows"]
    assert all(r["matches_plain"] for r in rows), "the JSON says a greedy row differs from plain greedy"
    assert all(lo <= r["speedup"] <= hi for r in rows for lo, hi in [r["speedup_spread"]]), \
        f"each speedup is the median of its passes, between the least and the most: {rows}"
    bench_tree.main(["--out", str(smoke_out), "--n_prompts", "1", "--max_new_tokens", "8", "--sizes", "4",
                     "--sweep", "1", "0.5"])
    assert "tree_temperature" in capsys.readouterr().out, "--sweep printed no table"
