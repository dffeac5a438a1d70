"""The references the checks (and the test suite) compare with, written the plain way: the exact output
distribution by enumeration, a chi-square test against it, and plain-loop versions of the masks and the walk.

Every reference here uses the library's functions as imported when this module loads, before any swap
(swap.py never touches nanodflash.exercises), so a student's piece can never grade itself.

Chi-square false alarms: a check fails at p < ALPHA = 1e-4, so a correct sampler fails one configuration
with probability 1e-4 for a random seed; the seeds are fixed, so a check is deterministic. Power: a
verifier that always accepts, or that resamples p instead of the residual on a rejection, gets p < 1e-50
at 400-600 samples (p < 1e-20 at 200); a verifier that sees the target at 1.4 times its temperature fails
in 10 seeds of 10 at 600 (tests/power_of_the_chi_square_test.py).
"""

import itertools

import torch

from ..ext.batch import speculative_generate_batch
from ..ext.tree import Tree, tree_speculative_generate
from ..sampling import probs_from_logits, sample
from ..speculative import speculative_generate

PROMPT = [1, 2]         # the enumerated runs' prompt
H = 4                   # their new tokens: V^H outputs, 256 for the 4-token vocabulary
ALPHA = 1e-4            # a chi-square p below this fails
N_SAMPLES = 600         # runs per configuration for the verifiers' own checks
N_TREE_CHECKS = 400     # runs per configuration of an exercise's tree decoding, the student's rule in place
N_OTHER_PATHS = 200     # runs per configuration of the library's rules on other paths (drafter kinds, trees,
                        # auto block sizes, the compiled pass): their faults fail by far (docs/log.md)


@torch.no_grad()
def exact_distribution(target, temperature, top_k, top_p, prompt=PROMPT, n_new=H):
    """{output tuple: probability under plain sampling from the target}, by enumeration: the product of the
    target's conditionals along each of the V^n_new outputs, all from one forward."""
    V = target.config.vocab_size
    outputs = list(itertools.product(range(V), repeat=n_new))
    seqs = torch.tensor([prompt + list(o) for o in outputs])           # (V^H, len(prompt) + H)
    device = next(target.parameters()).device                          # (test_cuda.py passes a CUDA target)
    logits, _ = target(seqs.to(device))
    probs = probs_from_logits(logits[:, len(prompt) - 1: -1].cpu(), temperature, top_k, top_p)  # (V^H, H, V)
    chosen = probs.gather(-1, seqs[:, len(prompt):, None])[..., 0]     # (V^H, H)
    return dict(zip(outputs, chosen.prod(-1).tolist()))


def chi_square_p_value(counts, exact, n):
    """p-value of the counts {outcome: count} of n draws against {outcome: probability}; bins with an
    expected count under 5 are pooled into one. With a single bin left there is nothing to test: 1.0 for a
    few draws, NaN for none (the claims fail on NaN)."""
    bins, pooled_obs, pooled_exp, stat = 0, 0.0, 0.0, 0.0
    for seq, p in exact.items():
        obs, exp = counts.get(seq, 0), n * p
        if exp >= 5:
            stat += (obs - exp) ** 2 / exp
            bins += 1
        else:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-12)
        bins += 1
    df = bins - 1
    if df < 1:         # one bin: with no draws, NaN (a claim fails on it); with a few, nothing to tell apart
        return 1.0 if n else float("nan")
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def speculative_counts(target, drafter, verifier, temperature, top_k, top_p, seed=0, block_size=4, sizes=None,
                       n=N_SAMPLES):
    """{output: count} and the acceptance lengths of n speculative runs from PROMPT; `sizes` (a set) collects
    the block sizes."""
    g = torch.Generator().manual_seed(seed)
    counts, lengths = {}, []
    for _ in range(n):
        out, stats = speculative_generate(target, drafter, PROMPT, H, block_size=block_size,
                                          temperature=temperature, top_k=top_k, top_p=top_p,
                                          verifier=verifier, generator=g)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        lengths += stats.acceptance_lengths
        if sizes is not None:
            sizes.update(stats.block_sizes)
    return counts, lengths


def batched_counts(target, drafter, verifier, temperature, top_k, top_p, seed=0, block_size=4, n=N_SAMPLES):
    """speculative_counts' test in one batch of n rows, all from PROMPT: the batched decoder verifies each
    row with the same rules (speculative.verify_block), so n runs cost a few batched passes instead of n
    runs' passes. For the exercises, which check a rule, not the path decoder's loop. Also returns how many
    steps kept every draft AND emitted the bonus after them (only a block that fits before the H-th new
    token, block_size <= H - 1, can: at block_size = H the bonus falls past the last token)."""
    g = torch.Generator().manual_seed(seed)
    outs, stats = speculative_generate_batch(target, drafter, [PROMPT] * n, H, block_size=block_size,
                                             temperature=temperature, top_k=top_k, top_p=top_p,
                                             verifier=verifier, generator=g)
    counts = {}
    for out in outs:
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    full = sum(size > 1 and kept == size - 1 and emitted == size for row in stats.rows
               for size, emitted, kept in zip(row.block_sizes, row.acceptance_lengths, row.accepted_drafts))
    return counts, [a for row in stats.rows for a in row.acceptance_lengths], full


def tree_counts(target, drafter, temperature, top_k, top_p, seed=0, n=N_OTHER_PATHS, draws=None):
    """{output: count} and the acceptance lengths of n tree runs of 6 nodes (draws: a sampled tree's)."""
    g = torch.Generator().manual_seed(seed)
    counts, lengths = {}, []
    for _ in range(n):
        out, stats = tree_speculative_generate(target, drafter, PROMPT, H, tree_nodes=6,
                                               temperature=temperature, top_k=top_k, top_p=top_p, generator=g,
                                               draws=draws)
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        lengths += stats.acceptance_lengths
    return counts, lengths


def rule_counts(rule, p, q, k, n=4000, seed=0, keep=None):
    """Counts of the token a one-position rule `rule(drafts, q, p, generator) -> (index, token)` emits, n
    times, each with k fresh drafts drawn from q; with `keep`, only the runs whose index keep(index) accepts
    (keep=lambda index: index != 0: the runs that rejected their first draft)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.numel())
    for _ in range(n):
        drafts = sample(q.expand(k, -1), g)
        index, token = rule(drafts, q, p, g)
        if keep is None or keep(index):
            counts[token] += 1
    return counts


def one_position_p_value(counts, p):
    """chi_square_p_value of token counts (V,) against one distribution p (V,)."""
    exact = {(i,): float(x) for i, x in enumerate(p)}
    return chi_square_p_value({(i,): int(c) for i, c in enumerate(counts)}, exact, int(counts.sum()))


def far_apart(seed, V=6):
    """A target p and a draft q that disagree a lot (so rejections, residuals and repeats all happen)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(3 * torch.randn(V, generator=g, dtype=torch.float64), -1)
    return p, q


def reference_mask(anchors, seq_len, block_size):
    """Plain loops: query (block b, slot i) may see context j iff j < a_b, and block keys of block b only."""
    N, K = anchors.shape
    m = torch.zeros(N, K * block_size, seq_len + K * block_size, dtype=torch.bool)
    for n in range(N):
        for b in range(K):
            for i in range(block_size):
                q = b * block_size + i
                for j in range(seq_len):
                    m[n, q, j] = j < int(anchors[n, b])
                for b2 in range(K):
                    for i2 in range(block_size):
                        m[n, q, seq_len + b2 * block_size + i2] = b2 == b
    return m


def reference_walk(selector, hidden, logits, anchor):
    """Plain loops: at each slot, score the candidates given the previous choice and take the best."""
    prev, out = anchor, []
    for t in range(hidden.size(0)):
        cand, scores = selector.scores(hidden[t], logits[t], torch.tensor(prev))
        prev = int(cand[int(scores.argmax())])
        out.append(prev)
    return out


def random_tree(seed, n, vocab=60):
    """A Tree of n random nodes after the root: each node's parent is any earlier node."""
    g = torch.Generator().manual_seed(seed)
    parent, depth = [-1], [0]
    for i in range(1, n + 1):
        p = int(torch.randint(0, i, (1,), generator=g))
        parent.append(p)
        depth.append(depth[p] + 1)
    tokens = [int(t) for t in torch.randint(0, vocab, (n + 1,), generator=g)]
    children = [{} for _ in range(n + 1)]
    for i in range(1, n + 1):
        children[parent[i]].setdefault(tokens[i], i)
    return Tree(tokens=tokens, parent=parent, depth=depth, score=[0.0] * (n + 1), children=children)


def ancestors(parent, i):
    """The set of node i and its ancestors, by following parent links."""
    out = {i}
    while parent[i] >= 0:
        i = parent[i]
        out.add(i)
    return out
