"""One drafter interface: a new drafter kind is one class (nanodflash/drafter.py), and every decoder runs it.

The kind added here is a bigram table: slot t's scores are the table's row for the token drafted before it.
It has real top-K candidates (which differ by parent, so trees branch) and a real sampled q (the row after
the token actually drawn), and it batches row by row through the interface's default. Nothing in the
decoders changes for it; an AST check holds the decoders to asking the interface, never the kind.
"""

import ast
import pathlib
import types

import pytest
import torch

from helpers import MASK_ID, ROOT, tiny_target
from nanodflash.drafter import DrafterConfig
from nanodflash.exercises.models import small_target
from nanodflash.exercises.oracle import (
    ALPHA,
    N_OTHER_PATHS,
    PROMPT,
    H,
    chi_square_p_value,
    exact_distribution,
)
from nanodflash.ext.batch import speculative_generate_batch
from nanodflash.ext.sampled_tree import SampledDraws
from nanodflash.ext.tree import tree_speculative_generate
from nanodflash.sampling import draft_temperature
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.baselines import ARDrafter
from nanodflash.tools.prompt_lookup import TokenContext


class BigramDrafter(TokenContext):
    """Drafts a chain from a (V, V) table of next-token logits: slot t's logits are table[previous token]."""
    kind = "bigram"

    def __init__(self, table, block_size, top_k=4):
        self.table, self.top_k = table, top_k
        self.config = types.SimpleNamespace(block_size=block_size, target_layer_ids=[0], mask_token_id=-1)

    def chain(self, anchor, n):
        """The greedy chain after anchor: the predecessor of each of the n slots."""
        prev = [anchor]
        for _ in range(n - 1):
            prev.append(int(self.table[prev[-1]].argmax()))
        return prev

    def slot_logits(self, cache, anchor, n_draft):
        return self.table[self.chain(anchor, n_draft)] if n_draft else self.table[:0]

    def draft(self, cache, anchor, n_draft, choose):
        tokens, qs, prev = [], [], anchor
        for _ in range(n_draft):                    # each slot after the token drawn before it
            t, q = choose(self.table[prev][None])
            tokens.append(t)
            qs.append(q)
            prev = int(t[0])
        if not tokens:
            return choose(self.table[:0])
        return torch.cat(tokens), None if qs[0] is None else torch.cat(qs)

    def candidates(self, cache, anchor, n_draft, temperature):
        prev = self.chain(anchor, n_draft)
        cand = torch.stack([self.table[p].topk(self.top_k).indices for p in prev])     # (n, K)
        parents = torch.cat([torch.full((1, self.top_k), anchor), cand[:-1]])           # (n, K) ids
        logp = (self.table[parents] / temperature).log_softmax(-1)                     # (n, K, V)
        return cand, logp.gather(-1, cand[:, None, :].expand(-1, self.top_k, -1))       # (n, K, K)

    def draft_distribution(self, cache, anchor, n_draft, temperature):
        q = torch.softmax(self.table.double() / draft_temperature(temperature), -1)     # (V, V)
        return lambda t, prev: q[prev]


def bigram_of(target, prompts, n=48):
    """The table a bigram drafter learns from the target's greedy continuations: log counts, smoothed."""
    V = target.config.vocab_size
    counts = torch.full((V, V), 0.1, dtype=torch.float64)
    for p in prompts:
        seq = p + generate(target, p, n)
        for a, b in zip(seq, seq[1:]):
            counts[a, b] += 1
    return counts.log()


PROMPTS = [[3], [7, 1, 4, 1, 5], [60, 2], list(range(10, 30)), [11] * 6]


@pytest.fixture(scope="module")
def greedy_pair():
    target = tiny_target()
    return target, BigramDrafter(bigram_of(target, PROMPTS), block_size=8)


@pytest.fixture(scope="module")
def small_pair():
    target = small_target()
    return target, BigramDrafter(bigram_of(target, [PROMPT, [0], [3, 1]], n=16), block_size=4, top_k=3)


def test_a_bigram_drafter_decodes_greedy_exactly_through_the_path_the_tree_and_the_batch(greedy_pair):
    target, drafter = greedy_pair
    refs = [generate(target, p, 40) for p in PROMPTS]
    taus = []
    for p, ref in zip(PROMPTS, refs):
        out, stats = speculative_generate(target, drafter, p, 40)
        assert out == ref, f"path decoding with a bigram drafter changed the greedy output of {p}"
        taus.append(stats.tau)
        widths = []                                                     # each step's widest node
        out, stats = tree_speculative_generate(
            target, drafter, p, 40, tree_nodes=12,
            on_step=lambda rec: widths.append(max(map(len, rec.tree.children))))
        assert out == ref, f"tree decoding with a bigram drafter changed the greedy output of {p}"
        assert max(widths) >= 2, "no tree node had two children: the bigram's candidates never branched"
    outs, stats = speculative_generate_batch(target, drafter, PROMPTS, 40)
    assert outs == refs, "batched decoding with a bigram drafter changed a row's greedy output"
    assert sum(taus) / len(taus) > 1.2 and stats.tau > 1.2, \
        f"the bigram drafter barely drafts right (tau {taus}, batched {stats.tau:.2f}): a weak test"


def path_runs(target, drafter, g, n):
    for _ in range(n):
        out, stats = speculative_generate(target, drafter, PROMPT, H, temperature=1.0, generator=g)
        yield out, stats.acceptance_lengths


def tree_runs(target, drafter, g, n, draws=None):
    for _ in range(n):
        out, stats = tree_speculative_generate(target, drafter, PROMPT, H, tree_nodes=6, temperature=1.0,
                                               generator=g, draws=draws)
        yield out, stats.acceptance_lengths


def batched_runs(target, drafter, g, n, rows=100):
    for k in range(0, n, rows):
        outs, stats = speculative_generate_batch(target, drafter, [PROMPT] * min(rows, n - k), H,
                                                 temperature=1.0, generator=g)
        yield from ((out, row.acceptance_lengths) for out, row in zip(outs, stats.rows))


DECODERS = {"path": path_runs, "top-K tree": tree_runs, "batched": batched_runs,
            "sampled tree": lambda t, d, g, n: tree_runs(t, d, g, n, draws=SampledDraws())}


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_bigram_drafter_samples_exactly_the_targets_distribution(small_pair, decoder):
    target, drafter = small_pair
    exact = exact_distribution(target, 1.0, None, None)
    counts, lengths = {}, []
    g = torch.Generator().manual_seed(0)
    for out, acceptance in DECODERS[decoder](target, drafter, g, N_OTHER_PATHS):
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        lengths += acceptance
    assert not [s for s in counts if exact[s] == 0], f"{decoder}: an output the target can never produce"
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), \
        f"{decoder}: both acceptance and rejection must occur"
    p = chi_square_p_value(counts, exact, N_OTHER_PATHS)
    assert p > ALPHA, f"{decoder}, bigram drafter: chi-square p={p:.2e} -- not the target's distribution"


# ----------------------------------------------------------------------------- decoders ask, never test

ASKING_FILES = ["speculative.py", "ext/tree.py", "ext/sampled_tree.py", "ext/batch.py", "ext/step_costs.py",
                "ext/block_policy.py", "ext/drafter_rows.py", "ext/timing.py", "tools/watch.py",
                "tools/trace.py",                "tools/lost_tau.py", "tools/draft_costs.py",
                "../notebooks/_setup.py"]


def kind_tests(path):
    """Calls and comparisons in `path` that tell drafters apart: hasattr anywhere, getattr / isinstance /
    type of anything drafter-like, and comparisons with a `.kind`."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = " ".join(ast.unparse(a) for a in node.args[:1])
            if node.func.id == "hasattr" or (node.func.id in ("getattr", "isinstance", "type")
                                             and ("drafter" in args or "cache" in args)):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and "kind" in ast.unparse(node):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_decoder_or_tool_tells_drafter_kinds_apart():
    package = pathlib.Path(ROOT) / "nanodflash"
    found = [f for name in ASKING_FILES for f in kind_tests(package / name)]
    assert not found, "these test a drafter's kind instead of asking the interface:\n" + "\n".join(found)


def test_the_kind_check_finds_a_kind_test(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(drafter):\n    if hasattr(drafter, 'candidate_selector'):\n        return 1\n"
                   "    return drafter.kind == 'dflash2'\n")
    assert len(kind_tests(bad)) == 2, "the AST check missed a hasattr or a .kind comparison"


def test_a_drafter_batched_row_by_row_takes_auto_block_sizes_and_stays_exact():
    # an autoregressive chain drafter batches row by row (ext/drafter_rows.RowByRow); "auto" times its batched
    # steps, rewinding the rows' contexts between timed calls
    target = tiny_target()
    cfg = DrafterConfig.for_target(target.config, MASK_ID, n_layer=1, block_size=8, n_target_layers=2)
    torch.manual_seed(3)
    ar = ARDrafter(cfg, target).double().eval()
    prompts = PROMPTS[:3]
    outs, stats = speculative_generate_batch(target, ar, prompts, 24, block_size="auto")
    assert outs == [generate(target, p, 24) for p in prompts], \
        "batched auto with a row-by-row drafter changed a row's greedy output"
    assert stats.block_sizes and all(1 <= b <= 8 for b in stats.block_sizes), \
        f"auto's block sizes must lie in 1..8: {stats.block_sizes}"
