"""The claims of the sampled verification exercises: match_verify, rejection_verify and residual_distribution
(greedy_verify's are in claims_greedy.py, multi_draft_verify's in claims_block.py, sampled trees' in
claims_tree.py). Each claim's docstring is the claim; it raises Failed with what went wrong (check.py).
References come from oracle.py and from the library's originals, imported here before any swap.
"""

import itertools

import torch

from ..sampling import sample
from ..verify import residual_distribution
from .check import BrokenContract, Failed
from .models import soft_pair
from .oracle import (
    ALPHA,
    N_SAMPLES,
    batched_counts,
    chi_square_p_value,
    exact_distribution,
)

# sampled claims: (temperature, top_k, top_p); top-k and top-p change the target's p, so a rule that samples
# the wrong distribution at the bonus or the residual shows
SAMPLED = [(0.7, None, None), (1.0, 2, None), (1.0, None, 0.8)]
# their block sizes: 3 fits a whole block and its bonus in the H new tokens, so the bonus after a fully
# accepted block is drawn; 4 drafts up to the last token
BLOCKS = (3, 4)


def two_ints(result, name):
    if not (isinstance(result, tuple) and len(result) == 2):
        raise BrokenContract(f"{name} must return a pair (n_accepted, next_token); yours returned {result!r}")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in result):
        raise BrokenContract(f"{name} must return two Python ints (int(x) of a tensor); yours returned "
                             f"{result!r}: the decoder puts the token in the list of ints it returns")
    return result


def exactly_p(student, verifier, configs=SAMPLED, n=N_SAMPLES, what="your rule"):
    """Sampled speculative decoding on the enumerable pair, with the student's piece in place, against the
    exact distribution; the message compares how many drafts it keeps with the library's rule."""
    target, drafter = soft_pair()
    exacts = {c: exact_distribution(target, *c) for c in configs}          # one per setting, not per block
    for (temperature, top_k, top_p), block in itertools.product(configs, BLOCKS):
        setting = (f"T={temperature}" + (f", top_k={top_k}" if top_k else "")
                   + (f", top_p={top_p}" if top_p else "") + f", block size {block}")
        exact = exacts[temperature, top_k, top_p]
        with student.installed():
            counts, lengths, _ = batched_counts(target, drafter, verifier, temperature, top_k, top_p,
                                                block_size=block, n=n)
        impossible = [s for s in counts if exact[s] == 0]
        if impossible:
            raise Failed(f"{what} produced {list(impossible[0])} at {setting}, an output the target gives "
                         "probability 0 (a token outside top-k/top-p, or one the target never draws)")
        value = chi_square_p_value(counts, exact, n)
        if not value >= ALPHA:                      # a NaN p-value fails too
            _, right, _ = batched_counts(target, drafter, verifier, temperature, top_k, top_p,
                                         block_size=block, n=n)
            mine, lib = sum(lengths) / len(lengths), sum(right) / len(right)
            how = ("it keeps more than the exact rule does: a rule that accepts too often fails exactly like "
                   "this"
                   if mine > lib * 1.05 else "it keeps about as many as the exact rule, so look at the token "
                   "it emits after a rejection (the residual) and at the end (the bonus)"
                   if mine > lib * 0.95 else "it keeps fewer than the exact rule")
            raise Failed(f"your samples do not follow the target's distribution: chi-square p = {value:.1e} "
                         f"over {n} runs at {setting} (a correct rule fails with probability 1e-4). Tokens "
                         f"per step: yours {mine:.2f}, the exact rule's {lib:.2f}: {how}.")
        if not any(a > 1 for a in lengths):
            raise Failed(f"{what} never keeps a draft at {setting}: exact, but nothing is gained")


def claim_match_decoding_has_exactly_the_targets_distribution(student):
    """sampled decoding with match_verify has exactly the target's distribution (T=0.7; T=1 with top-k,
    top-p; blocks of 3 and 4)"""
    exactly_p(student, "match")


def claim_rejection_decoding_has_exactly_the_targets_distribution(student):
    """sampled decoding with rejection_verify has exactly the target's distribution (T=0.7; T=1 with top-k,
    top-p; blocks of 3 and 4)"""
    exactly_p(student, "rejection")


def claim_match_keeps_every_draft_the_target_is_sure_of(student):
    """keeps every draft, the last one too, when the target gives each probability 1 (blocks of up to 16),
    then samples the token after them"""
    for n in range(1, 7):
        drafts = torch.arange(n) % 5                                          # (n,) any tokens
        p = torch.nn.functional.one_hot(torch.cat([drafts, torch.tensor([6])]), 8).double()   # (n+1, 8)
        n_acc, bonus = two_ints(student.fn(drafts, p, torch.Generator().manual_seed(n)), "match_verify")
        if (n_acc, bonus) != (n, 6):
            raise Failed(f"the target is sure of each of {n} drafts (probability 1) and of token 6 after "
                         f"them, yet yours gives ({n_acc}, {bonus}), not ({n}, 6): lossless, perhaps, but "
                         "a rule that keeps fewer drafts than it must wastes the target's pass (check the "
                         "loop's last draft)")
    drafts = torch.arange(15) % 5                                              # a block of 16, all sure
    p = torch.nn.functional.one_hot(drafts, 8).double()
    p = torch.cat([p, torch.tensor([[0.0] * 6 + [0.5, 0.5]], dtype=torch.float64)])    # then 6 or 7, even
    g = torch.Generator().manual_seed(7)
    sevens = sum(two_ints(student.fn(drafts, p, g), "match_verify")[1] == 7 for _ in range(400)) / 400
    if abs(sevens - 0.5) > 0.1:                                                # 4 standard errors
        raise Failed(f"after 15 drafts the target is sure of, the token after them is 6 or 7 with 0.5 each; "
                     f"yours gave 7 in {sevens:.2f} of 400 steps: draw it from the last row of target_probs "
                     "(a sample, not its argmax)")


def verifier_args(name, drafts, q, p, generator):
    """The arguments of a call of the sampled verifier `name`: match_verify takes no q (its drafts are q's
    argmax)."""
    return (drafts, p, generator) if name == "match_verify" else (drafts, q, p, generator)


def whole_vocabulary(student, name):
    """2000 steps with the target's p uniform over 1024 tokens: how many distinct tokens the rule emits."""
    V, g = 1024, torch.Generator().manual_seed(3)
    p = torch.full((2, V), 1.0 / V, dtype=torch.float64)
    drafts = torch.tensor([0])
    seen = {two_ints(student.fn(*verifier_args(name, drafts, p[:1], p, g)), name)[1] for _ in range(2000)}
    if len(seen) < 600:
        raise Failed(f"with the target's p uniform over {V} tokens (a real model's vocabulary), 2000 steps "
                     f"of yours emitted {len(seen)} distinct tokens, where draws from p give about 880: draw "
                     "from all of p, not a part of it")


def claim_match_draws_from_the_whole_vocabulary(student):
    """emits tokens from the whole of p over a real model's vocabulary (1024 tokens), not a part of it"""
    whole_vocabulary(student, "match_verify")


def claim_rejection_draws_from_the_whole_vocabulary(student):
    """emits tokens from the whole of p over a real model's vocabulary (1024 tokens), not a part of it"""
    whole_vocabulary(student, "rejection_verify")


def claim_rejection_keeps_only_the_drafts_before_the_first_rejection(student):
    """keeps no draft after a rejected one: a first draft the target never draws ends the block, however
    sure the target is of the second"""
    g = torch.Generator().manual_seed(2)
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)   # p(0) = 0 at draft 1
    for _ in range(20):
        n_acc, token = two_ints(student.fn(torch.tensor([0, 1]), q, p, g), "rejection_verify")
        if (n_acc, token) != (0, 1):
            raise Failed(f"draft 1 is token 0, which the target gives probability 0 (always rejected), and "
                         f"draft 2 one it accepts for sure; yours gives ({n_acc}, {token}), the rule (0, 1): "
                         "count the drafts kept before the first rejection only (the drafts after it "
                         "followed a token the target did not emit), then draw from that position's residual")


def claim_rejection_keeps_a_draft_as_often_as_the_rule_must(student):
    """keeps a draft drawn from q with probability sum_x min(p(x), q(x)), where q differs from p: no less (a
    rule that keeps less can stay lossless, and wastes the target's pass); two drafts, each on its own test"""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    must, n = float(torch.minimum(p[0], q[0]).sum()), 3000                 # 0.2 + 0.3 + 0.2 = 0.7
    kept = sum(two_ints(student.fn(sample(q, g), q, p, g), "rejection_verify")[0] for _ in range(n)) / n
    if kept < must - 4 * (must * (1 - must) / n) ** 0.5:                   # one-sided, 4 standard errors
        raise Failed(f"a draft from q = [0.2, 0.3, 0.5] against p = [0.5, 0.3, 0.2] was kept in {kept:.3f} "
                     f"of the steps; the rule keeps {must:.1f} (sum of min(p, q)): lossless, perhaps, but "
                     "wasteful. Keep draft d when u < p(d) / q(d), for every d")
    # two drafts: each is kept with probability 0.1 + 0.9 * 0.5 = 0.55 on its own test, so both with 0.55^2
    p = torch.tensor([[0.55, 0.45]] * 3, dtype=torch.float64)
    q = torch.tensor([[0.1, 0.9]] * 2, dtype=torch.float64)
    pair = float(torch.minimum(p[0], q[0]).sum()) ** 2
    both = sum(two_ints(student.fn(sample(q, g), q, p, g), "rejection_verify")[0] == 2 for _ in range(n)) / n
    if abs(both - pair) > 4 * (pair * (1 - pair) / n) ** 0.5:         # 4 standard errors
        raise Failed(f"two drafts from q = [0.1, 0.9] against p = [0.55, 0.45] (each kept with probability "
                     f"0.55) were both kept in {both:.3f} of the steps, not 0.55^2 = {pair:.4f}: "
                     + ("more means the second test is not independent of the first, and the output is no "
                        "longer p (one uniform for the whole block?): draw a uniform for each draft"
                        if both > pair else "lossless, perhaps, but wasteful: test each draft against its "
                        "own u < p(d) / q(d)"))


def claim_match_keeps_a_draft_as_often_as_the_target_draws_it(student):
    """keeps a draft the target is not sure of with the probability p gives it, where it is not the target's
    most likely token too"""
    p = torch.tensor([[0.4, 0.3, 0.3], [0.2, 0.5, 0.3]], dtype=torch.float64)
    g, n = torch.Generator().manual_seed(0), 3000
    kept = sum(two_ints(student.fn(torch.tensor([1]), p, g), "match_verify")[0] for _ in range(n)) / n
    if abs(kept - 0.3) > 4 * (0.3 * 0.7 / n) ** 0.5:                     # 4 standard errors
        raise Failed(f"draft 1, which the target draws with p = 0.3 (its argmax is 0), was kept in "
                     f"{kept:.3f} of the steps, not 0.3: keep a draft whenever the target's own sample "
                     "equals it, whatever its rank")


def claim_rejection_accepts_every_draft_when_q_equals_p(student):
    """accepts every draft when the drafter's q equals the target's p"""
    g = torch.Generator().manual_seed(0)
    for n in [4] * 20 + [15] * 5:                                   # 15: a block of 16's drafts
        p = torch.softmax(2 * torch.randn(n + 1, 8, generator=g, dtype=torch.float64), -1)
        drafts = torch.multinomial(p[:n], 1, generator=g)[:, 0]
        n_acc, _ = two_ints(student.fn(drafts, p[:n], p, g), "rejection_verify")
        if n_acc != n:
            raise Failed(f"with q equal to p, p/q = 1 at every draft, so all {n} must be kept; you kept "
                         f"{n_acc}")


def residual_as_contracted(fn, p, q):
    """fn(p, q), checked to leave p and q as they were and to return a tensor of p's shape and dtype."""
    given = (p.clone(), q.clone())
    r = fn(p, q)
    for name, before, now in zip("pq", given, (p, q)):
        if not torch.equal(before, now):
            raise Failed(f"it changed {name} in place: the decoders read p and q again after the call (a "
                         "multi-draft rule takes a residual of the residual); compute on a copy "
                         "(out-of-place operations: p - q, not p.sub_(q))")
    if not isinstance(r, torch.Tensor) or r.shape != p.shape or r.dtype != p.dtype:
        raise BrokenContract(f"for p and q of shape {tuple(p.shape)} in {p.dtype} it must return a tensor of "
                             f"that shape and dtype; got {getattr(r, 'shape', type(r).__name__)} in "
                             f"{getattr(r, 'dtype', '-')}")
    return r


def equal_row_fault(student, p):
    """What a residual that fails on a batch with one row of p == q does with such a row on its own."""
    alone = student.fn(p[:1], p[:1].clone())
    if not torch.isfinite(alone).all():
        return "yours gives NaN for such a row even alone; where a row's residual mass is 0, give p's row"
    if not torch.allclose(alone, p[:1], atol=1e-9):
        return (f"yours gives {[round(x, 3) for x in alone[0].tolist()]} for such a row, not p's row: where "
                "the residual mass is 0, give p's row itself")
    return "decide row by row, not once for the batch"


def claim_residual_is_the_normalized_positive_part_of_p_minus_q(student):
    """is normalize(max(0, p - q)) row by row, and p itself when p == q"""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(2 * torch.randn(6, 7, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(6, 7, generator=g, dtype=torch.float64), -1)
    want, r = residual_distribution(p, q), residual_as_contracted(student.fn, p, q)
    if (r < 0).any():
        raise Failed("it has negative entries: clamp p - q at 0 before normalising")
    if not torch.allclose(r.sum(-1), torch.ones(6, dtype=r.dtype), atol=1e-9):
        raise Failed(f"its rows sum to {r.sum(-1).tolist()}, not 1: normalise each row")
    if not torch.allclose(r, want, atol=1e-9):
        raise Failed("it differs from normalize(max(0, p - q)) on random rows")
    mixed = torch.cat([p[:1], q[1:]])                 # row 0 equals p's row: no residual there; the rest have
    r = student.fn(p, mixed)
    if not torch.isfinite(r).all() or not torch.allclose(r[0], p[0], atol=1e-9) or \
            not torch.allclose(r[1:], residual_distribution(p[1:], q[1:]), atol=1e-9):
        raise Failed("in a batch where only row 0 has p == q, that row has no residual mass (0 / 0) and must "
                     "give p back, finite, and the others their residuals: " + equal_row_fault(student, p))
    near = p + 0.004 * (q - p)                 # within 0.01 in total variation: a well-trained drafter's q
    r = student.fn(p, near)
    if not torch.allclose(r, residual_distribution(p, near), atol=1e-9):
        raise Failed("for p and q within 0.01 in total variation (a well-trained drafter's regime) it is not "
                     "normalize(max(0, p - q)): the residual mass is small there, not zero; only p == q "
                     "(no mass at all) may give p back")
    tiny = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    r = student.fn(tiny, tiny + torch.tensor([[-4e-7, 4e-7]], dtype=torch.float64))
    if not torch.allclose(r, torch.tensor([[1.0, 0.0]], dtype=torch.float64), atol=1e-6):
        raise Failed(f"for p = [0.5, 0.5] and q = [0.5 - 4e-7, 0.5 + 4e-7] yours gives {r.tolist()}, the "
                     "residual [1, 0]: any mass left, however small, is the residual; only none at all (an "
                     "exact 0 sum) gives p back, so no threshold")
    zero_p = torch.tensor([[0.6, 0.4, 0.0, 0.0]] * 2, dtype=torch.float64)
    zero_q = torch.tensor([[0.9, 0.1, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    r = student.fn(zero_p, zero_q)
    if not torch.allclose(r, torch.tensor([[0.0, 1.0, 0.0, 0.0]] * 2, dtype=torch.float64), atol=1e-9):
        raise Failed(f"for p = [0.6, 0.4, 0, 0] with q = [0.9, 0.1, 0, 0], then q = [1, 0, 0, 0], yours "
                     f"gives {r.tolist()}, the residual [0, 1, 0, 0] both times: a token p and q both give "
                     "0 (a low temperature makes many) takes none of it and makes no NaN, and a token q "
                     "gives 0 but p does not keeps its share")
    same = student.fn(p, p)
    if not torch.allclose(same, p, atol=1e-9):
        raise Failed("with p == q there is no residual mass (0 / 0); it must give p back (no NaN): "
                     "a rejection cannot happen then, but the function is still called on batches")
