"""The claims of the tree exercises (tree_mask, accept_path, keep_path), and tree decoding against the exact
distribution (trees_exactly_p), sampled trees' included. DFlash 2's greedy walk: claims_walk.py."""

import torch

from ..ext.sampled_tree import SampledDraws
from ..ext.tree import Tree, tree_speculative_generate, verify_tree
from ..sampling import probs_from_logits
from .check import BrokenContract, Failed, describe
from .claims_greedy import PROMPTS, compare_with_greedy, mixes_devices
from .models import small_drafters, small_target, tiny_target
from .oracle import (
    ALPHA,
    N_TREE_CHECKS,
    ancestors,
    chi_square_p_value,
    exact_distribution,
    one_position_p_value,
    random_tree,
    tree_counts,
)


def claim_tree_mask_lets_each_node_see_exactly_its_ancestors(student):
    """every node sees exactly itself and its ancestors, in random trees and in deep ones (a chain of 20
    nodes, a chain of 12 with a fan at its end)"""
    chain, broom = [-1] + list(range(20)), [-1] + list(range(12)) + [12] * 6
    for parent in [random_tree(seed, 20).parent for seed in range(5)] + [chain, broom]:
        got = student.fn(parent)
        n = len(parent)
        if not isinstance(got, torch.Tensor) or got.shape != (n, n):
            raise BrokenContract(f"for {n} nodes (the root included) the mask must be ({n}, {n}); yours is "
                                 f"{tuple(getattr(got, 'shape', ()))}")
        if got.dtype != torch.bool:
            raise BrokenContract(f"your mask is {got.dtype}: attention takes a bool mask (True = may "
                                 "attend); it adds a float mask to its scores as a bias, and refuses an "
                                 "integer one. Return a bool tensor")
        for i in range(n):
            want = ancestors(parent, i)
            sees = {j for j in range(n) if bool(got[i, j])}
            if sees != want:
                raise Failed(f"node {i} (parent {parent[i]}, depth {len(want) - 1}) must see {sorted(want)}, "
                             f"itself and its ancestors; yours lets it see {sorted(sees)} (parents {parent})")


def tree_decode(nodes):
    return lambda t, d, p, n: tree_speculative_generate(t, d, p, n, tree_nodes=nodes)[0]


def claim_greedy_tree_decoding_equals_greedy_decoding(student):
    """greedy tree decoding with it is token-identical to plain greedy decoding"""
    compare_with_greedy(student, tree_decode(8), "your tree decoding's output", tree=True)


def claim_accept_path_follows_the_targets_token_down_the_tree(student):
    """walks down the child whose token is the target's (the argmax of the logits as given), then returns
    that token, an int, as the bonus"""
    for seed in range(5):
        t = random_tree(seed, 12, vocab=64)
        logits = torch.randn(len(t), 64, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        node, expect = 0, [0]
        while t.children[node]:                       # the target agrees with the LAST child (not the first)
            token, child = list(t.children[node].items())[-1]
            logits[node, token] = 10.0
            node = child
            expect.append(node)
        path, bonus = path_and_token(student.fn(t, logits))
        want_bonus = int(logits[node].argmax())
        if path != expect:
            j = next((j for j, (a, b) in enumerate(zip(path, expect)) if a != b), min(len(path), len(expect)))
            at = expect[j - 1]
            stopped = j == len(path) < len(expect)              # stopped where a child holds the token
            raise Failed(f"at node {at} the target's token is {int(logits[at].argmax())}"
                         + (f", the token of its child {expect[j]}: go there" if j < len(expect) else
                            ", which no child of it has: stop there")
                         + f"; your path {path}, the target's {expect}. "
                         + (stop_fault(student) if stopped else
                            "Follow the target's token, not the drafter's order or scores."))
        if bonus != want_bonus:
            raise Failed(f"the bonus is the target's token at the last accepted node ({want_bonus}); yours "
                         f"{bonus}")
    deep_chain(student)
    near_tie(student)


def stop_fault(student):
    """Why a greedy walk stopped above a child holding the target's token: a tensor key, or only the first
    child looked at (a root with one child tells them apart)."""
    tree = Tree.root(5)
    tree.add(0, 4, 0.0)
    logits = torch.zeros(2, 8, dtype=torch.float64)
    logits[0, 4] = 1.0
    if path_and_token(student.fn(tree, logits))[0] == [0, 1]:
        return ("Your walk stopped where a child other than the first holds the target's token: look among "
                "all of a node's children (tree.children[node] maps each child's token to the child)")
    return ("Your walk stopped where a child holds the target's token: look the child up by the token as an "
            "int (int(y)), since a tensor key is never found in a dict")


def deep_chain(student):
    """Greedy, down a chain of 20 drafts the target agrees with (a tree as deep as a block of 21)."""
    tree = Tree.root(5)
    for i in range(20):
        tree.add(i, i % 7, 0.0)                                             # node i + 1 holds token i % 7
    logits = torch.zeros(21, 8, dtype=torch.float64)
    logits[torch.arange(21), torch.tensor([(i % 7) for i in range(20)] + [7])] = 1.0
    path, bonus = path_and_token(student.fn(tree, logits))
    if (path, bonus) != (list(range(21)), 7):
        raise Failed(f"down a chain of 20 nodes whose every token the target agrees with, yours keeps "
                     f"{len(path) - 1} and emits {bonus}, the walk keeps 20 and emits 7: go down as deep as "
                     "the tree is (no cap on the depth)")


def path_and_token(result):
    """accept_path's result as (list of nodes, token), or BrokenContract when it is of another kind."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise BrokenContract(f"accept_path must return (path, bonus); yours returned {result!r}")
    if not isinstance(result[1], int) or isinstance(result[1], bool):
        raise BrokenContract(f"accept_path must return the next token as a Python int (int(x) of a tensor); "
                             f"yours returned {describe(result[1])}: the decoder puts it in the list of ints "
                             "it returns")
    return list(result[0]), result[1]


def near_tie(student):
    """Greedy, at a root whose children hold tokens 4 and 6, token 6's logit 1e-9 above token 4's, then
    equal to it."""
    tree = Tree.root(5)
    tree.add(0, 4, 0.0)                                                     # node 1
    tree.add(0, 6, 0.0)                                                     # node 2
    logits = torch.zeros(3, 8, dtype=torch.float64)
    logits[0, 4], logits[0, 6] = 1.0, 1.0 + 1e-9
    logits[2, 3] = 1.0                                                      # after node 2: token 3
    got = path_and_token(student.fn(tree, logits))
    if got != ([0, 2], 3):
        raise Failed(f"at a root whose children hold tokens 4 (node 1) and 6 (node 2), with token 6's logit "
                     f"1e-9 above token 4's in float64, yours gives {got}, the target's walk ([0, 2], 3): "
                     "take the argmax of the logits as they come (a float32 cast rounds them into a tie, "
                     "and a tie goes to the lower id)")
    logits[0, 6], logits[1, 2] = 1.0, 1.0                                   # a tie; after node 1: token 2
    got = path_and_token(student.fn(tree, logits))
    if got != ([0, 1], 2):
        raise Failed(f"at a root whose children hold tokens 4 and 6 with equal logits, yours gives {got}, "
                     "plain greedy decoding's walk ([0, 1], 2): a tie goes to the lower id, as argmax "
                     "takes it")


def hand_made_tree():
    """A root with children for tokens 0, 1, 2; node 1 (token 0) with children for 1 and 3; node 2 (token 1)
    with a child for 0: paths of one to three tokens over 6 tokens, and logits that spread over them."""
    tree = Tree.root(5)
    for parent, token in ((0, 0), (0, 1), (0, 2), (1, 1), (1, 3), (2, 0)):
        tree.add(parent, token, 0.0)
    logits = 1.5 * torch.randn(len(tree), 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return tree, logits


def claim_accept_path_takes_the_logits_on_the_targets_device(student):
    """takes the logits on the target's device, as the tree decoders pass them (the meta device, shapes
    without data, stands in for a GPU): what it draws on the CPU's generator it moves to the CPU first"""
    tree, logits = hand_made_tree()
    for temperature in (1.0, 0.0):
        try:
            student.fn(tree, logits.to("meta"), temperature, None, None, torch.Generator().manual_seed(0))
        except Exception as e:              # .cpu() of a meta tensor raises too: there a GPU would copy
            if mixes_devices(e):
                raise Failed(f"at T={temperature:g}, with the logits on another device ('meta' here, as a "
                             f"GPU's would be) it raised: {str(e).rstrip('.!')}. The tree decoders pass the "
                             "target's logits: move them to the CPU first (logits.detach().cpu()), where the "
                             "generator draws") from None


def claim_accept_path_emits_each_nodes_distribution(student):
    """sampled, on a hand-made tree: the token after each node it reaches follows that node's p (top-k and
    top-p together)"""
    tree, logits = hand_made_tree()
    g = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in ((1.0, 4, 0.8), (0.7, None, None)):
        p = probs_from_logits(logits, temperature, top_k, top_p)                  # (nodes, 6)
        counts = torch.zeros_like(p)
        setting = f"T={temperature}" + (f", top_k={top_k}, top_p={top_p}" if top_k else "")
        for _ in range(3000):
            path, bonus = student.fn(tree, logits, temperature, top_k, top_p, g)
            stuck = tree.children[path[-1]].get(int(bonus))
            if stuck is not None:
                raise Failed(f"at {setting}, your walk stopped at node {path[-1]} and emitted token "
                             f"{int(bonus)}, which its child {stuck} holds: at each node draw ONE y, go to "
                             "the child holding y, and emit that same y only where no child holds it (a "
                             "second draw for the bonus, or a child chosen by another rule, emits such "
                             "tokens; so does a lookup by a tensor: a tensor key is never found in a dict)")
            after = [tree.tokens[n] for n in path[1:]] + [int(bonus)]
            for node, token in zip(path, after):
                counts[node, token] += 1
        for node in range(len(tree)):
            impossible = ((p[node] == 0) & (counts[node] > 0)).nonzero().flatten().tolist()
            if impossible:
                raise Failed(f"at {setting}, after node {node} your walk emitted token {impossible[0]}, "
                             "which the target's p there gives probability 0 (outside top-k or top-p): draw "
                             "y from probs_from_logits(logits[node], temperature, top_k, top_p)")
            if counts[node].sum() and one_position_p_value(counts[node], p[node]) < ALPHA:
                raise Failed(f"at {setting}, the token after node {node} does not follow the target's p at "
                             "that node: draw one y from p at each node you reach, go to the child with "
                             "token y, and emit y when there is none")


def claim_sampled_tree_decoding_with_it_has_exactly_the_targets_distribution(student):
    """sampled top-K tree decoding with it has exactly the target's distribution (T=0.7; T=1 with top-k)"""
    trees_exactly_p(student, [(0.7, None, None), (1.0, 2, None)],
                    hint=" Draw ONE token y from p at each node, go to the child with token y, and emit that "
                         "same y when there is none.")


def prefilled(target, tokens, extra=0):
    cache = target.new_cache(1, len(tokens) + extra)
    target(torch.tensor([tokens]), cache)
    return cache


def two_chains(n):
    """A tree of two chains of n drafts each, their nodes interleaved (odd nodes one chain, even the
    other): a kept path of n + 1 nodes whose every node but the root moves."""
    tree = Tree.root(5)
    for k in range(2 * n):
        tree.add(max(k - 1, 0), 1 + k % 40, 0.0)           # node k + 1: its parent node k - 1, or the root
    return tree


def claim_keep_path_leaves_the_cache_of_a_fresh_prefill(student):
    """after a tree pass, the cache equals a fresh prefill of the prompt and the kept path (paths of 1 to 13
    nodes)"""
    target, prompt, tree = tiny_target(), PROMPTS[2], random_tree(3, 30)
    deepest = max(range(len(tree)), key=lambda i: tree.depth[i])
    full = tree.path(deepest)
    two = two_chains(12)
    for tree, path in ((tree, [0]), (tree, full[: len(full) // 2 + 1]), (tree, full), (two, two.path(23))):
        cache = prefilled(target, prompt, len(tree) + 1)
        start = cache.length
        verify_tree(target, cache, tree)
        student.fn(cache, start, path)
        kept = prompt + [tree.tokens[i] for i in path]
        fresh, n = prefilled(target, kept, 1), len(kept)
        if cache.length != n:
            raise Failed(f"after keeping a path of {len(path)} nodes (the root included) the cache holds {n} "
                         f"tokens; yours says {cache.length}: crop after the kept nodes")
        for pos in range(start, n):
            wrong = {name: [layer for layer in range(mine.size(0)) if not torch.allclose(
                        mine[layer, :, :, pos], want[layer, :, :, pos], atol=1e-10)]
                     for name, mine, want in (("keys", cache.k, fresh.k), ("values", cache.v, fresh.v))}
            if any(wrong.values()):
                node = path[pos - start]
                where = " and ".join(f"the {name} of layer(s) {layers}" for name, layers in wrong.items()
                                     if layers)
                every = all(len(layers) == cache.k.size(0) for layers in wrong.values())
                raise Failed(f"position {pos} must hold the keys/values of the path's node {node} (the tree "
                             f"wrote them at {start + node}); yours holds something else in {where} (of "
                             f"{cache.k.size(0)} layers): move each kept node's keys/values, in every layer, "
                             "to start + its index on the path"
                             + (". The new positions overlap the old ones: a copy that writes a position "
                                "before another node's keys/values there are read loses them (copy front "
                                "to back, or read them all first)" if every else ""))


def trees_exactly_p(student, configs, draws=None, hint=""):
    """Tree decoding (6 nodes) on the enumerable pair, with the student's piece in place, against the exact
    distribution, for each (temperature, top_k, top_p) of configs; draws: a sampled tree's (SampledDraws)."""
    target = small_target()
    drafter = small_drafters(target)["dflash"]
    for temperature, top_k, top_p in configs:
        exact = exact_distribution(target, temperature, top_k, top_p)
        with student.installed():
            counts, _ = tree_counts(target, drafter, temperature, top_k, top_p, draws=draws, n=N_TREE_CHECKS)
        value = chi_square_p_value(counts, exact, N_TREE_CHECKS)
        if not value >= ALPHA:                      # a NaN p-value fails too
            raise Failed(f"tree decoding with your function does not follow the target's distribution at "
                         f"T={temperature}: chi-square p = {value:.1e} over {N_TREE_CHECKS} runs (a correct "
                         "rule fails with probability 1e-4)." + hint)


def claim_sampled_tree_decoding_has_exactly_the_targets_distribution(student):
    """sampled-tree decoding with it has exactly the target's distribution (T=1; T=0.7 with top-p 0.8)"""
    trees_exactly_p(student, [(1.0, None, None), (0.7, None, 0.8)], draws=SampledDraws())
