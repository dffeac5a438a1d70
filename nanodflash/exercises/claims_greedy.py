"""The claims of the greedy verification exercise (greedy_verify): the agreed prefix and the target's next
token, ties as plain greedy decoding breaks them, the batched form and the logits' device, and greedy
decoding with it equal to plain greedy decoding (compare_with_greedy, which the tree claims use too)."""

import torch

from ..ext.batch import speculative_generate_batch
from ..speculative import generate, speculative_generate
from ..verify import greedy_verify
from .check import Failed
from .claims_verify import two_ints
from .models import OracleDrafter, OracleTreeDrafter, random_prefix, tiny_dflash2, tiny_drafter, tiny_target

PROMPTS = [[3], [7, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))]   # the greedy claims' prompts


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
