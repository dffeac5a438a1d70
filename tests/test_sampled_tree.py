"""Sampled trees (sampled_tree.py) and the multi-draft rule (verify.multi_draft_verify): exact sampling, by
enumeration, with wrong rules that must fail the same test; the tree's shape and budget; clear errors.

The rule's own exactness at one position (1, 2 and 4 drafts, 4000 draws each) and that more drafts accept more
often are the multi_draft_verify exercise's claims, which test_exercises.py runs on the library's function
(test_the_librarys_own_function_passes_every_claim_of_its_exercise): the same draws, so not repeated here."""

import pytest
import torch

import nanodflash.ext.sampled_tree as sampled_mod
from nanodflash.exercises.oracle import far_apart, one_position_p_value, rule_counts, tree_counts
from nanodflash.ext.sampled_tree import SampledDraws, sample_tree
from nanodflash.ext.tree import tree_speculative_generate
from nanodflash.sampling import sample
from nanodflash.verify import multi_draft_verify, residual_distribution
from test_sampling_exact import ALPHA, N_OTHER_PATHS, PROMPT, H, chi_square_p_value, exact_distribution

N_RULE = 4000           # draws of the rule alone, on one position


def test_a_single_draft_is_accepted_with_probability_min_one_p_over_q():
    p, q = far_apart(0)
    d = int(q.argmax())
    g = torch.Generator().manual_seed(1)
    kept = sum(multi_draft_verify(torch.tensor([d]), q, p, g)[0] == 0 for _ in range(N_RULE)) / N_RULE
    want = min(1.0, float(p[d] / q[d]))
    assert abs(kept - want) < 0.03, f"draft {d} kept {kept:.3f} of the time; min(1, p/q) = {want:.3f}"


def test_each_draft_against_p_instead_of_the_residual_fails_the_same_test():
    def against_p(drafts, q, p, generator):
        """WRONG on purpose: every draft is tested against p itself; the residual only at the end."""
        u = torch.rand(drafts.numel(), generator=generator, dtype=torch.float64)
        for i, d in enumerate(drafts.tolist()):
            if u[i] * q[d] < p[d]:
                return i, d
        return -1, int(sample(residual_distribution(p, q), generator))

    p, q = far_apart(0)
    value = one_position_p_value(rule_counts(against_p, p, q, 3), p)
    assert value < ALPHA, f"the test cannot tell the no-residual rule from the right one (p={value:.2e})"


# --------------------------------------------------------------------------- the tree

def test_a_sampled_tree_keeps_its_budget_and_every_draw_is_a_child_of_its_node():
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(5, 8, generator=g, dtype=torch.float64), -1)     # (n, V) slot distributions
    for nodes in (1, 3, 7, 20):
        t = sample_tree(lambda d, prev: q[d], 0, n_draft=5, tree_nodes=nodes, widths=(3, 2), generator=g)
        assert len(t) - 1 <= nodes, f"{len(t) - 1} drafts in a tree of at most {nodes}"
        assert max(t.depth) <= 5, "no draft deeper than the block"
        for node, draws in enumerate(t.draws):
            assert all(t.parent[c] == node for c in draws), "a draw must be a child of the node that drew it"
            assert sorted(set(draws)) == sorted(t.children[node].values()), "children are exactly the draws"


def test_with_room_to_spare_every_node_makes_its_depths_number_of_draws():
    g = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(3, 8, generator=g, dtype=torch.float64), -1)
    t = sample_tree(lambda d, prev: q[d], 0, n_draft=3, tree_nodes=100, widths=(3, 2), generator=g)
    for node, draws in enumerate(t.draws):
        want = (3, 2, 1, 0)[t.depth[node]]
        assert len(draws) == want, f"a node at depth {t.depth[node]} made {len(draws)} draws, not {want}"


def test_each_node_keeps_the_q_of_its_own_token_and_depth():
    g = torch.Generator().manual_seed(2)
    table = torch.softmax(torch.randn(4, 8, 8, generator=g, dtype=torch.float64), -1)   # (n, prev, V)
    t = sample_tree(lambda d, prev: table[d, prev], 5, n_draft=4, tree_nodes=12, widths=(2, 2), generator=g)
    for node, draws in enumerate(t.draws):
        if draws:
            assert torch.equal(t.q[node], table[t.depth[node], t.tokens[node]]), \
                f"node {node}'s draws must come from q at its depth after its own token"


def test_widths_of_one_make_a_sampled_path():
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(6, 8, generator=g, dtype=torch.float64), -1)
    t = sample_tree(lambda d, prev: q[d], anchor=0, n_draft=6, tree_nodes=100, widths=(1,), generator=g)
    assert t.parent == [-1, 0, 1, 2, 3, 4, 5], f"widths (1,): one chain of 6 slots, got {t.parent}"


@pytest.mark.parametrize("kind,temperature,top_k,top_p,widths",
                         [("dflash", 0.7, None, None, (2, 2)), ("dflash", 1.0, 2, None, (3,)),
                          ("dflash", 1.0, None, 0.8, (2, 2)), ("dflash2", 1.0, None, None, (2, 2)),
                          ("dflash2", 0.7, None, 0.8, (3, 1, 2))])
def test_sampled_tree_decoding_has_exactly_the_targets_distribution(small, kind, temperature, top_k, top_p,
                                                                    widths):
    target, drafter = small[0], small[1][kind]
    exact = exact_distribution(target, temperature, top_k, top_p)
    counts, lengths = tree_counts(target, drafter, temperature, top_k, top_p, draws=SampledDraws(widths))
    impossible = [s for s in counts if exact[s] == 0]
    assert not impossible, f"produced outputs the target can never produce: {impossible[:3]}"
    assert any(a > 2 for a in lengths) and any(a == 1 for a in lengths), \
        "deep acceptance and misses must both occur"
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p > ALPHA, (f"{kind} T={temperature} top_k={top_k} top_p={top_p} widths={widths}: chi-square "
                       f"p={p:.2e} -- not the target's distribution")


def test_a_sampled_tree_that_always_accepts_its_first_draw_fails_the_same_test(small, monkeypatch):
    monkeypatch.setattr(sampled_mod, "multi_draft_verify", lambda drafts, q, p, g: (0, int(drafts[0])))
    target, drafter = small[0], small[1]["dflash"]
    counts, _ = tree_counts(target, drafter, 1.0, None, None, draws=SampledDraws())
    p = chi_square_p_value(counts, exact_distribution(target, 1.0, None, None), N_OTHER_PATHS)
    assert p < ALPHA, f"the test cannot tell an always-accepting tree from the right rule (p={p:.2e})"


def test_bad_widths_and_a_greedy_sampled_tree_are_clear_value_errors(small):
    for bad in [(), (0,), (2, -1), (1.5,)]:
        with pytest.raises(ValueError, match="widths"):
            SampledDraws(bad)
    with pytest.raises(ValueError, match="temperature > 0"):
        tree_speculative_generate(small[0], small[1]["dflash"], PROMPT, H, tree_nodes=4, draws=SampledDraws())
