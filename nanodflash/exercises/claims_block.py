"""Claims on one verification step, with the rule called directly on hand-made distributions: rows of p and q
that spread over several tokens, differ from row to row and give some tokens probability 0. Decoding the test
pair (claims_verify.py) checks a rule end to end, but that target is nearly deterministic: a token drawn from
the wrong row, or with a uniform used twice, barely moves its outputs. Here it does.

Why position by position: whatever the rule, the token a step emits after i kept drafts (a draft it keeps, a
residual draw or the bonus) must follow row i of p, given that the first i drafts were kept: row i is the
target's distribution after them. So the emitted tokens are counted per position, over the runs that reached
it, and each position is tested against its row (a chi-square, as oracle.py's). For a recursive rule over
several drafts of one position, the same idea one level down: once the first draft is rejected, what the rule
emits must follow the residual that rejection left.
"""

import inspect

import torch

from ..sampling import sample
from ..verify import residual_distribution
from .check import Failed
from .claims_tree import hand_made_tree
from .claims_verify import two_ints, verifier_args
from .oracle import ALPHA, far_apart, one_position_p_value, rule_counts

V = 6               # tokens of the hand-made rows
N_DRAFTS = 2        # drafts per block: rows 0 and 1 test kept drafts and rejections, row 2 the bonus
GLOBAL_SEEDS = 40   # torch.manual_seed(0..39): a rule given no generator must not return one result under all
N_RUNS = 3000       # steps per pair of rows (position 2 is reached in about a quarter of them)


def block_rows(seed):
    """(p (N_DRAFTS+1, V), q (N_DRAFTS, V)): each row a softmax of 1.5 x a standard normal; each row of p
    gives two tokens (other ones per row) probability 0, as top-k or top-p would."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(1.5 * torch.randn(N_DRAFTS + 1, V, generator=g, dtype=torch.float64), -1)
    for i in range(N_DRAFTS + 1):
        p[i, [(2 * i) % V, (2 * i + 1) % V]] = 0.0
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(1.5 * torch.randn(N_DRAFTS, V, generator=g, dtype=torch.float64), -1)
    return p, q


def unchanged(student, before, args):
    """Raise when a rule changed a tensor argument in place (the decoders reuse them after the call): before
    holds a copy of each tensor of args (None for the others), named by the library's parameters."""
    for what, a, b in zip(inspect.signature(student.original).parameters, before, args):
        if a is not None and not torch.equal(a, b):
            raise Failed(f"your {student.name} changed its argument {what} in place: the decoder reads it "
                         "again after the call; compute on a copy (x.clone(), or out-of-place operations)")


def copies(args):
    return [a.clone() if isinstance(a, torch.Tensor) else None for a in args]


def step_counts(student, name, p, q, generator):
    """(N_DRAFTS+1, V) counts of the token emitted at each position of N_RUNS steps, drafts drawn from q."""
    counts = torch.zeros(N_DRAFTS + 1, V)
    for run in range(N_RUNS):
        drafts = sample(q, generator)                                          # (N_DRAFTS,)
        args = verifier_args(name, drafts, q, p, generator)
        before = copies(args) if run < 20 else None
        n_acc, bonus = two_ints(student.fn(*args), name)
        if before is not None:
            unchanged(student, before, args)
        if not 0 <= n_acc <= N_DRAFTS or not 0 <= bonus < V:
            raise Failed(f"{name} returned ({n_acc}, {bonus}) for {N_DRAFTS} drafts over {V} tokens")
        for i, token in enumerate(drafts[:n_acc].tolist() + [bonus]):
            counts[i, token] += 1
    return counts


def what_goes_wrong(name, i):
    if i == N_DRAFTS:
        return ("That token is the bonus after a fully accepted block: it follows the last row of "
                "target_probs, the target's view after every draft.")
    if name == "rejection_verify":
        return ("After i kept drafts it is draft i+1 when kept, else a draw from the residual, "
                "normalize(max(0, p_i - q_i)) (residual_distribution(p_i, q_i); not p, not p without the "
                "draft), with fresh randomness (the uniform that rejected the draft is known to be >= p/q, "
                "so it is no longer uniform), and each draft with its own uniform.")
    return "After i kept drafts it is draft i+1 when the target's own draw y_i equals it, else y_i."


def chain(student, name):
    g = torch.Generator().manual_seed(0)
    for seed in (0, 1):
        p, q = block_rows(seed)
        counts = step_counts(student, name, p, q, g)
        for i in range(N_DRAFTS + 1):
            impossible = ((p[i] == 0) & (counts[i] > 0)).nonzero().flatten().tolist()
            if impossible:
                raise Failed(f"after {i} kept drafts your rule emitted token {impossible[0]}, which row {i} "
                             f"of target_probs gives probability 0 (an output the target never produces). "
                             + what_goes_wrong(name, i))
            if counts[i].sum() == 0:
                raise Failed(f"in {N_RUNS} steps your rule never kept {i} drafts, where the exact rule does "
                             "often: lossless, perhaps, but it keeps too little (a loop that stops one draft "
                             "early never keeps the last one)")
            value = one_position_p_value(counts[i], p[i])
            if not value >= ALPHA:                      # a NaN p-value fails too
                got = (counts[i] / counts[i].sum()).tolist()
                raise Failed(f"the token emitted after {i} kept drafts does not follow row {i} of "
                             f"target_probs: chi-square p = {value:.1e} over {int(counts[i].sum())} steps "
                             f"that reached it (rows spread over {V} tokens; a correct rule fails with "
                             f"probability 1e-4); yours [{', '.join(f'{x:.2f}' for x in got)}], row {i} "
                             f"[{', '.join(f'{x:.2f}' for x in p[i].tolist())}]. " + what_goes_wrong(name, i))


def claim_match_step_emits_each_rows_distribution(student):
    """one step on hand-made rows: the token after i kept drafts follows row i of p (the bonus too)"""
    chain(student, "match_verify")


def claim_rejection_step_emits_each_rows_distribution(student):
    """one step on hand-made rows: the token after i kept drafts follows row i of p (residuals, the bonus)"""
    chain(student, "rejection_verify")


def after_first_rejection(rule, p, q, k, n, seed):
    """Counts (V,) of the token a one-position rule emits in the runs where it rejected its first draft."""
    return rule_counts(rule, p, q, k, n, seed, keep=lambda index: index != 0)


def claim_multi_draft_tests_the_drafts_in_the_order_given(student):
    """tests the drafts in the order given: a first draft that p keeps for sure (p(d) >= q(d)) is the one
    kept, whatever the drafts after it"""
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.2, 0.4, 0.2, 0.2], dtype=torch.float64)     # p / q: 2.5 and 1.25, both kept for sure
    g = torch.Generator().manual_seed(0)
    for drafts in ([0, 1], [1, 0], [0, 1, 1], [1, 3, 0]):
        got = two_ints(student.fn(torch.tensor(drafts), q, p, g), "multi_draft_verify")
        if got != (0, drafts[0]):
            raise Failed(f"drafts {drafts} with p = [0.5, 0.5, 0, 0] and q = [0.2, 0.4, 0.2, 0.2]: yours "
                         f"returned {got}, but the first draft, {drafts[0]}, is kept for sure (p/q >= 1), so "
                         f"the rule returns (0, {drafts[0]}). Test the drafts in the order given, the first "
                         "first: any other order (by q, by p) changes what the rule emits")


def claim_multi_draft_after_a_rejection_emits_the_residual(student):
    """once its first draft is rejected, what it emits follows the residual that rejection left"""
    # q puts most mass where p has little, and the residual's ratio r/q at token 1 lies between 0 and 1:
    # the second test is a real coin, not a sure accept or reject
    p = torch.tensor([0.30, 0.35, 0.35, 0.0], dtype=torch.float64)
    q = torch.tensor([0.55, 0.30, 0.10, 0.05], dtype=torch.float64)
    r = residual_distribution(p, q)
    for k in (2, 4):
        counts = after_first_rejection(student.fn, p, q, k, 3000, seed=k)
        value = one_position_p_value(counts, r)
        if not value >= ALPHA:                      # a NaN p-value fails too
            raise Failed(f"with {k} drafts, in the runs whose first draft was rejected, the emitted tokens "
                         f"do not follow the residual normalize(max(0, p - q)): chi-square p = {value:.1e} "
                         f"over {int(counts.sum())} runs. After a rejection the rest is recursive rejection "
                         "against that residual: test the next draft with a fresh uniform against r = "
                         "normalize(max(0, r - q)), and return the index of the draft you keep (0-based).")


def fmt(xs):
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


def follows(counts, r):
    """Do token counts follow r: none where r is 0, and a chi-square p-value >= ALPHA?"""
    return not ((r == 0) & (counts > 0)).any() and one_position_p_value(counts, r) >= ALPHA


def claim_multi_draft_with_every_draft_rejected_emits_the_last_residual(student):
    """when the target gives every draft probability 0, it rejects them all (index -1) and the token it emits
    follows the last residual"""
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.05, 0.2, 0.0, 0.75], dtype=torch.float64)
    g, n, r = torch.Generator().manual_seed(0), 600, p
    for k in (1, 2):                                  # k drafts of token 3: each rejection leaves another r
        before, r = r, residual_distribution(r, q)    # the last residual: [0.6, 0.4, 0, 0], then [0.733, ...]
        counts = torch.zeros(p.numel())
        for _ in range(n):
            index, token = two_ints(student.fn(torch.full((k,), 3), q, p, g), "multi_draft_verify")
            if index != -1:
                raise Failed(f"drafts {[3] * k}: you returned index {index}, but p gives token 3 probability "
                             "0, so every draft is rejected: return -1 and a draw from the last residual")
            counts[token] += 1
        if not follows(counts, r):
            raise Failed(f"with {k} draft(s) of token 3, which p = [0.5, 0.5, 0, 0] gives probability 0 (q = "
                         f"[0.05, 0.2, 0, 0.75]), every draft is rejected and the token must follow the last "
                         f"residual r = {fmt(r.tolist())}; yours {fmt((counts / n).tolist())} over {n} runs"
                         + last_residual_fault(counts, before, r, q, k))


def last_residual_fault(counts, before, r, q, k):
    """What a rule whose last draw does not follow r (the residual after k rejections) did instead."""
    if follows(counts, residual_distribution(r, q)):
        return (". That is the residual of r once more: after the last rejection r is what is left, so draw "
                "from r itself")
    if k > 1 and follows(counts, before):
        return (". That is the residual after one rejection fewer: every rejection, a repeated draft's too, "
                "takes a residual step, r = residual_distribution(r, q), before the next test")
    return (": after each rejection, a repeated draft's too, r = residual_distribution(r, q), with q as "
            "given (the drafts are independent draws of q, so q stays the same for each); when every draft "
            "is rejected, draw from that last r")


def claim_greedy_accept_path_draws_nothing(student):
    """greedy (T=0), it draws no random number: the generator it is given and torch's global random state
    stay as they were"""
    tree, logits = hand_made_tree()
    g = torch.Generator().manual_seed(5)
    before = [g.get_state(), torch.get_rng_state()]
    student.fn(tree, logits, 0.0, None, None, g)
    student.fn(tree, logits, 0.0, None, None, None)
    after = [g.get_state(), torch.get_rng_state()]
    names = ("the generator it is given", "torch's global random state")
    drew = [what for what, a, b in zip(names, before, after) if not torch.equal(a, b)]
    if drew:
        raise Failed(f"at temperature 0 your accept_path draws from {' and '.join(drew)}: greedy takes the "
                     "argmax at each node and draws nothing, so a greedy step leaves the random state of the "
                     "sampled steps around it as it was")


def global_seed(seed):
    """torch.manual_seed(seed) for the CPU alone: the same global random state, without torch also queueing
    a seed, with a record of the call stack, for each accelerator it was built for (0.2-1 ms a call; the
    claims seed thousands of times)."""
    torch.default_generator.manual_seed(seed)


def reproducible(call, name):
    """Raise unless call(generator) draws its randomness from `generator` only: two calls with generators
    seeded alike return the same, and torch's global random state is left as it was."""
    global_seed(1234)
    state = torch.get_rng_state()
    first = call(torch.Generator().manual_seed(5))
    second = call(torch.Generator().manual_seed(5))
    if not torch.equal(torch.get_rng_state(), state):
        raise Failed(f"your {name} draws from torch's global random state: every draw must come from the "
                     "generator it is given (sample(p, generator), torch.rand(..., generator=generator)), or "
                     "a seeded run does not repeat")
    if repr(first) != repr(second):
        raise Failed(f"your {name} returned {first!r}, then {second!r}, for generators seeded alike: every "
                     "draw must come from the generator it is given, and the arguments must stay as they "
                     "were (a call that changes them changes the next call's result)")


def generator_arguments(name):
    """Arguments (all but the generator) of a sampled rule's calls that reach each of its draws: a block cut
    short and, for the block rules, one fully accepted (the bonus drawn from the last row); for
    multi_draft_verify, one draft accepted, every draft rejected, and a draft in doubt."""
    p, q = block_rows(0)
    if name == "accept_path":
        return [(*hand_made_tree(), 1.0, None, None)]
    if name == "multi_draft_verify":
        drafts = sample(q[0].expand(3, -1), torch.Generator().manual_seed(0))
        zero = (p[0] == 0).nonzero().flatten()[:1].repeat(3)                   # p gives them nothing
        doubtful = (p[0] / q[0]).masked_fill(p[0] == 0, 2.0).argmin().repeat(3)  # p/q least, not 0
        return [(drafts, q[0], p[0]), (zero, q[0], p[0]), (doubtful, q[0], p[0])]
    drafts = sample(q, torch.Generator().manual_seed(0))
    if name == "match_verify":
        sure = torch.nn.functional.one_hot(drafts, p.size(-1)).double()  # the target sure of each
        return [(drafts, p), (drafts, torch.cat([sure, p[-1:]]))]
    return [(drafts, q, p), (drafts, q, torch.cat([q, p[-1:]]))]                      # p = q


def spread_arguments(name):
    """Arguments of a call of the sampled rule whose result is spread, no result with probability over 0.7
    (drafts that p gives less than q does, so a rejection and a residual draw are likely)."""
    p, q = block_rows(0)
    doubtful = (p[:-1] / q).masked_fill(p[:-1] == 0, 2.0).argmin(-1)    # (N_DRAFTS,): p/q least, not 0
    if name == "multi_draft_verify":            # one draft, kept with probability 1/7, then a residual draw
        return (torch.tensor([0]), torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=torch.float64),
                torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64))
    if name == "rejection_verify":
        return doubtful, q, p
    return generator_arguments(name)[0]


def left_as_they_were(student, args):
    """fn(*args, generator) with a check that no tensor argument changed in place."""
    def call(generator):
        before = copies(args)
        result = student.fn(*args, generator)
        unchanged(student, before, args)
        return result
    return call


def claim_sampled_rules_draw_only_from_their_generator(student):
    """draws every random number from the generator it is given, on every path through it (a block cut
    short, a block fully accepted, every draft rejected), leaving its arguments as they were: a seeded run
    repeats; given none, it draws from torch's global random state, as the decoders at their default
    generator=None expect"""
    for args in generator_arguments(student.name):
        call = left_as_they_were(student, args)
        for _ in range(3):
            reproducible(call, student.name)
    follows_the_global_seed(left_as_they_were(student, spread_arguments(student.name)), student.name)


def seeded_results(call, seeds=range(GLOBAL_SEEDS)):
    """[repr(call(None)) under torch.manual_seed(s)] for each seed s."""
    results = []
    for seed in seeds:
        global_seed(seed)
        results.append(repr(call(None)))
    return results


def follows_the_global_seed(call, name, seeds=range(GLOBAL_SEEDS)):
    """Raise unless call(None) gives the same under one global seed and not the same under every seed (a
    call whose most likely result has probability 0.7 returns it under all 40 seeds with probability 6e-7)."""
    results = seeded_results(call, seeds)
    global_seed(seeds[0])
    if repr(call(None)) != results[0]:
        raise Failed(f"with generator=None your {name} gave two results under one torch.manual_seed: "
                     "without a generator, draw from torch's global random state (sample(p, None), "
                     "torch.rand(...) with generator=None)")
    if len(set(results)) == 1:
        raise Failed(f"with generator=None your {name} returned {results[0]} under each of {len(results)} "
                     "global seeds: a fresh torch.Generator() replays one fixed seed, so every run decodes "
                     "alike. Pass generator=None on (sample(p, None), torch.rand(..., generator=None)): "
                     "torch then draws from its global random state")


def claim_multi_draft_emits_exactly_p(student):
    """one position, 1, 2 and 4 drafts from q: the emitted token has exactly the target's p"""
    for seed in (0, 1):
        p, q = far_apart(seed)
        for k in (1, 2, 4):
            value = one_position_p_value(rule_counts(student.fn, p, q, k), p)
            if not value >= ALPHA:                      # a NaN p-value fails too
                raise Failed(f"with {k} drafts the emitted tokens do not follow p: chi-square p = "
                             f"{value:.1e} over 4000 draws (a correct rule fails with probability 1e-4). "
                             "Test the drafts in the order given, one uniform each, against r (p at first); "
                             "after every rejection, a repeated draft's too, r = residual_distribution(r, q) "
                             "before the next test; when all are rejected, draw from the last r.")


def claim_multi_draft_accepts_more_with_more_drafts(student):
    """accepts a draft more often with more drafts (2 beat 1, 4 beat 2, 8 beat 4), and the index it returns is
    the accepted draft's, repeated drafts counted"""
    p, q = far_apart(0)
    g = torch.Generator().manual_seed(2)
    rates = []
    for k, runs in ((1, 2000), (2, 2000), (4, 2000), (8, 500)):     # the exact rule: 0.21, 0.37, 0.60, 0.83
        hits = 0
        for _ in range(runs):
            drafts = torch.multinomial(q, k, replacement=True, generator=g)
            i, token = two_ints(student.fn(drafts, q, p, g), "multi_draft_verify")
            if i >= 0 and int(drafts[i]) != token:
                raise Failed(f"drafts {drafts.tolist()}: you returned index {i} and token {token}, but draft "
                             f"{i} is {int(drafts[i])}: return the position of the accepted draft in "
                             "draft_tokens, repeated drafts counted (a sampled tree moves to child i)")
            hits += i >= 0
        rates.append(hits / runs)
    rest, r = 1.0, p                              # the chance that recursive rejection rejects 8 drafts
    for _ in range(8):
        rest, r = rest * (1 - float(torch.minimum(r, q).sum())), residual_distribution(r, q)
    if not rates[0] < rates[1] < rates[2] or rates[3] < 1 - rest - 4 * (rest * (1 - rest) / 500) ** 0.5:
        raise Failed(f"it accepts a draft {' / '.join(f'{r:.2f}' for r in rates)} of the time with 1 / 2 / 4 "
                     f"/ 8 drafts (the rule: {1 - rest:.2f} with 8): width must pay, every draft tested "
                     "(return the index of the accepted draft, -1 when none is)")
