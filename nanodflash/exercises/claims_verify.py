"""The claims of the verification exercises: greedy_verify, match_verify, rejection_verify and
residual_distribution (multi_draft_verify's are in claims_block.py, sampled trees' in claims_tree.py). Each
claim's docstring is the claim; it raises Failed with what went wrong (check.py). References come from
oracle.py and from the library's originals, imported here before any swap.
"""

import itertools

import torch

from ..ext.batch import speculative_generate_batch
from ..sampling import sample
from ..speculative import generate, speculative_generate
from ..verify import greedy_verify, residual_distribution
from .check import BrokenContract, Failed
from .models import (
    OracleDrafter,
    OracleTreeDrafter,
    random_prefix,
    soft_pair,
    tiny_dflash2,
    tiny_drafter,
    tiny_target,
)
from .oracle import (
    ALPHA,
    N_SAMPLES,
    batched_counts,
    chi_square_p_value,
    exact_distribution,
)

PROMPTS = [[3], [7, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))]   # the greedy claims' prompts
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


def greedy_blocks(seed, n_cases=40, V=16):
    """Hand-made verification cases: (drafts (n,), target logits (n+1, V)), drafts that agree with the
    target's argmax for a random number of slots, then a disagreement, then anything (agreeing again too);
    then two blocks of 15 drafts, all agreeing and all but the last."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_cases):
        n = int(torch.randint(0, 8, (1,), generator=g))
        logits = torch.randn(n + 1, V, generator=g, dtype=torch.float64)
        best = logits.argmax(-1)
        k = int(torch.randint(0, n + 1, (1,), generator=g))
        drafts = best[:n].clone()
        if k < n:
            drafts[k] = (best[k] + 1) % V
            drafts[k + 1:] = torch.where(torch.rand(n - k - 1, generator=g) < 0.5, best[k + 1:n],
                                         torch.randint(0, V, (n - k - 1,), generator=g))
        yield drafts, logits
    for k in (15, 14):              # a block of 16 (15 drafts): all kept, then all but the last
        logits = torch.randn(16, V, generator=g, dtype=torch.float64)
        drafts = logits.argmax(-1)[:15].clone()
        drafts[k:] = (drafts[k:] + 1) % V
        yield drafts, logits


def claim_greedy_verify_keeps_the_agreed_prefix_and_the_targets_next_token(student):
    """keeps the drafts up to the first the target disagrees with, then the target's own token"""
    for drafts, logits in greedy_blocks(0):
        best = logits.argmax(-1).tolist()
        want_n, want_bonus = greedy_verify(drafts, logits)
        n_acc, bonus = two_ints(student.fn(drafts, logits), "greedy_verify")
        d = drafts.tolist()
        case = f"drafts {d}, target's argmax per row {best}"
        if n_acc > want_n:
            if want_n == len(d):
                raise Failed(f"you kept {n_acc} drafts, but there are only {len(d)} ({case})")
            raise Failed(f"you kept {n_acc} drafts, but draft {want_n + 1} ({d[want_n]}) is not the target's "
                         f"token ({best[want_n]}): you accepted a draft the target disagreed with; after the "
                         f"first disagreement nothing is kept, the later drafts followed a wrong token "
                         f"({case})")
        if n_acc < want_n:
            raise Failed(f"you kept {n_acc} drafts, but the first {want_n} equal the target's argmax: draft "
                         f"{n_acc + 1} ({d[n_acc]}) should have been kept ({case})")
        if bonus != want_bonus:
            hint = (" You took it from row n_accepted - 1; row i of target_logits is the target's view after "
                    "the first i drafts, so the token after the kept ones is row n_accepted's."
                    if n_acc > 0 and bonus == best[n_acc - 1] else "")
            raise Failed(f"after {n_acc} kept drafts the next token must be the target's argmax at row "
                         f"{n_acc}, {want_bonus}; yours is {bonus} ({case}).{hint}")


def claim_greedy_verify_breaks_a_tie_as_plain_greedy_decoding(student):
    """where tokens tie for the target's top logit (two of 8, 40 of 64), takes the lowest id, as plain greedy
    decoding does"""
    logits = torch.zeros(3, 8, dtype=torch.float64)
    logits[:, 2] = logits[:, 5] = 1.0                                       # ids 2 and 5 tie in every row
    near = torch.zeros(2, 8, dtype=torch.float64)
    near[:, 4], near[:, 6] = 1.0, 1.0 + 1e-9                               # id 6 above id 4 by 1e-9
    got = two_ints(student.fn(torch.tensor([6]), near), "greedy_verify")
    if got != (1, 6):
        raise Failed(f"with id 6's logit 1e-9 above id 4's in float64, yours gives {got} for draft 6, the "
                     "argmax (1, 6): take the argmax of the logits as they come (a float32 cast or a softmax "
                     "in float32 rounds them into a tie)")
    for drafts, want in ((torch.tensor([2, 2]), (2, 2)), (torch.tensor([5, 2]), (0, 2))):
        got = two_ints(student.fn(drafts, logits), "greedy_verify")
        if got != want:
            raise Failed(f"with ids 2 and 5 tied for the top logit in every row and drafts "
                         f"{drafts.tolist()}, yours gives {got}, plain greedy decoding's argmax {want}: a "
                         "tie goes to the lower id (torch's argmax takes the first maximum), or the output "
                         "is no longer plain greedy decoding's")
    many = torch.zeros(2, 64, dtype=torch.float64)
    many[:, 10:50] = 1.0                                                    # ids 10 to 49 tie in both rows
    got = two_ints(student.fn(torch.tensor([10]), many), "greedy_verify")
    if got != (1, 10):
        raise Failed(f"with ids 10 to 49 tied for the top logit (64 tokens) and draft 10, yours gives {got}, "
                     "plain greedy decoding's argmax (1, 10): a tie goes to the lowest id. torch's argmax "
                     "takes the first maximum; a sort, even descending, need not keep tied ids in order "
                     "(stable=True does)")


def greedy_drafters(target, block_size, tree=False):
    """Drafters that are right on part of each block: an oracle right on a random prefix, a random DFlash
    drafter (rarely right) and, for trees, a DFlash 2 drafter with a selector that changes choices."""
    oracle = (OracleTreeDrafter if tree else OracleDrafter)(target, block_size, n_right=random_prefix)
    drafters = [("an oracle right on a random prefix of each block", oracle),
                ("a random DFlash drafter", tiny_drafter(target, block_size=block_size))]
    if tree:
        dflash2 = tiny_dflash2(target, block_size=block_size, perturb=0.3)
        drafters.append(("a random DFlash 2 drafter", dflash2))
    return drafters


def compare_with_greedy(student, decode, what, tree=False):
    """decode(target, drafter, prompt, n) -> tokens, with the student's piece in place, against plain greedy
    decoding, for every prompt and drafter of greedy_drafters."""
    target = tiny_target()
    wants = [generate(target, prompt, 40) for prompt in PROMPTS]
    for block_size in (4, 16):
        for label, drafter in greedy_drafters(target, block_size, tree):
            for i, (prompt, want) in enumerate(zip(PROMPTS, wants)):
                with student.installed():
                    got = decode(target, drafter, prompt, 40)
                if got != want:
                    j = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                             min(len(got), len(want)))
                    raise Failed(f"{what} differs from plain greedy decoding at token {j} of prompt {i} "
                                 f"(block size {block_size}, {label}): plain greedy gives "
                                 f"{want[j] if j < len(want) else 'nothing'}, yours "
                                 f"{got[j] if j < len(got) else 'nothing'}; {len(got)} tokens for "
                                 f"{len(want)}")


def claim_greedy_speculative_equals_greedy_decoding(student):
    """greedy speculative decoding with it is token-identical to plain greedy decoding"""
    compare_with_greedy(student, lambda t, d, p, n: speculative_generate(t, d, p, n)[0],
                        "your speculative output")


def claim_batched_greedy_decoding_with_it_equals_greedy_decoding(student):
    """R blocks at once: a padded draft (-1) matches nothing; the batched decoder (one row, and three) with it
    gives each row plain greedy decoding's tokens"""
    logits = torch.zeros(2, 3, 8, dtype=torch.float64)
    logits[:, [0, 1, 2], [5, 0, 7]] = 1.0                                   # argmax per row: 5, 0, 7
    try:
        n_acc, bonus = student.fn(torch.tensor([[5, -1], [5, 0]]), logits)
        got = (torch.as_tensor(n_acc).tolist(), torch.as_tensor(bonus).tolist())
    except (IndexError, RuntimeError, TypeError, ValueError) as e:
        got = f"{type(e).__name__}: {e}"
    if got != ([1, 2], [0, 7]):
        raise Failed(f"drafts [[5, -1], [5, 0]] (row 0 padded with -1), argmax 5, 0, 7 per position: yours "
                     f"gives {got}, the rule ([1, 2], [0, 7]): padding matches no token, not even 0; with "
                     "draft_tokens (R, n) return two LongTensors (R,)")
    target = tiny_target()
    drafter = greedy_drafters(target, 8, False)[0][1]
    wants = [generate(target, prompt, 24) for prompt in PROMPTS]
    for n_rows in (1, 3):
        try:
            with student.installed():
                got, _ = speculative_generate_batch(target, drafter, PROMPTS[:n_rows], 24, block_size=4)
        except (IndexError, RuntimeError, TypeError, ValueError) as e:
            raise Failed(f"the batched decoder failed with your greedy_verify on {n_rows} row(s): "
                         f"{type(e).__name__}: {e}. It calls it with draft_tokens (R, n), padded with -1, "
                         "and target_logits (R, n+1, V), and reads two (R,) tensors back (a loop over the "
                         "rows is fine)") from None
        if got != wants[:n_rows]:
            raise Failed(f"the batched decoder with your greedy_verify, {n_rows} row(s): not plain greedy "
                         "decoding's tokens (a padded draft, -1, matches no token)")


def mixes_devices(error):
    """Does an error say that tensors on two devices met (the meta device and the CPU)?"""
    text = str(error).lower()
    return "device" in text and "cpu" in text and "meta" in text


def claim_greedy_verify_makes_its_tensors_on_the_logits_device(student):
    """R blocks at once on the target's device: any tensor it makes is made there (the meta device, shapes
    without data, stands in for a GPU)"""
    drafts = torch.tensor([[5, -1], [5, 0]], device="meta")                 # as the batched decoder passes
    logits = torch.zeros(2, 3, 8, dtype=torch.float64, device="meta")     # them: on the target's device
    try:
        student.fn(drafts, logits)
    except RuntimeError as e:
        if not mixes_devices(e):
            if "meta" in str(e):        # it needs the values (a loop reads them): a GPU has them, meta not
                return
            raise
        raise Failed(f"with the logits on another device ('meta' here, as a GPU's would be) it raised: {e}. "
                     "The batched decoder passes tensors on the target's device: make every tensor you build "
                     "on target_logits.device (torch.arange(n, device=target_logits.device)), or the "
                     "decoder fails on a GPU") from None


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


def whole_vocabulary(student, name):
    """2000 steps with the target's p uniform over 1024 tokens: how many distinct tokens the rule emits."""
    V, g = 1024, torch.Generator().manual_seed(3)
    p = torch.full((2, V), 1.0 / V, dtype=torch.float64)
    drafts = torch.tensor([0])
    args = (drafts, p, g) if name == "match_verify" else (drafts, p[:1], p, g)
    seen = {two_ints(student.fn(*args), name)[1] for _ in range(2000)}
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
    both = sum(two_ints(student.fn(sample(q, g), q, p, g), "rejection_verify")[0] == 2 for _ in range(n)) / n
    if abs(both - 0.55 ** 2) > 4 * (0.3025 * 0.6975 / n) ** 0.5:         # 4 standard errors
        raise Failed(f"two drafts from q = [0.1, 0.9] against p = [0.55, 0.45] (each kept with probability "
                     f"0.55) were both kept in {both:.3f} of the steps, not 0.55^2 = 0.3025: "
                     + ("more means the second test is not independent of the first, and the output is no "
                        "longer p (one uniform for the whole block?): draw a uniform for each draft"
                        if both > 0.3025 else "lossless, perhaps, but wasteful: test each draft against its "
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
