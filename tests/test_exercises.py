"""The exercises (nanodflash/exercises/): the library's own functions pass every check, and so does each
hint 3 pasted into its skeleton; the mistakes people really make fail, each with a message that names its
symptom; the command line gives one clear line for a file it cannot check."""

import dataclasses
import re
import textwrap

import pytest
import torch

from helpers import run_command
from nanodflash.exercises import BY_NAME, EXERCISES, StudentFileError, load_function, run_checks, skeleton
from nanodflash.exercises import claims_block as cb
from nanodflash.exercises import claims_greedy as cg
from nanodflash.exercises import claims_sampling as cs
from nanodflash.exercises import claims_train as ct
from nanodflash.exercises import claims_tree as ctree
from nanodflash.exercises import claims_verify as cv
from nanodflash.exercises import claims_walk as cw
from nanodflash.exercises.check import Failed, Student, run_claim
from nanodflash.exercises.claims_verify import BLOCKS, SAMPLED
from nanodflash.exercises.models import soft_pair
from nanodflash.exercises.oracle import H, batched_counts

# claim -> its message (None: it holds) with the library's own functions in place. Several exercises share a
# claim (greedy tree decoding for tree_mask, accept_path and keep_path; exact rejection decoding for
# rejection_verify and residual_distribution); with the library's function in place of the library's, each
# runs the same computation whichever exercise names it, so each is run once per test process.
ORIGINAL_RESULTS = {}


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.name)
def test_the_librarys_own_function_passes_every_claim_of_its_exercise(exercise):
    student = Student(exercise.name, exercise.original(), exercise.original())
    for claim in exercise.claims:
        if claim not in ORIGINAL_RESULTS:
            ORIGINAL_RESULTS[claim] = run_claim(claim, student)
    failed = [(claim.__doc__, ORIGINAL_RESULTS[claim]) for claim in exercise.claims
              if ORIGINAL_RESULTS[claim] is not None]
    assert not failed, f"{exercise.name}: the library's own function fails its exercise: {failed}"


HEADER = "import numpy as np\nimport torch\n\nfrom nanodflash.sampling import probs_from_logits, sample\n" \
         "from nanodflash.verify import residual_distribution\n\n\n"

def probs_answer(cast="logits.double()", top_k=None, softmax="torch.softmax(logits, -1)",
                 keep="(p.cumsum(-1) - p) < top_p"):
    """A probs_from_logits answer with the library's steps (temperature, top-k, softmax, the nucleus), one of
    them written as a student might: `top_k` (lines), `cast`, `softmax` or `keep` (an expression)."""
    top_k = top_k or ["kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]",
                      'logits = logits.masked_fill(logits < kth, float("-inf"))']
    lines = ["def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):",
             f"    logits = {cast}",
             "    if temperature == 0:",
             "        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()",
             "    logits = logits / temperature",
             "    if top_k is not None and top_k < logits.size(-1):",
             *[f"        {line}" for line in top_k],
             f"    probs = {softmax}",
             "    if top_p is not None:",
             "        p, order = probs.sort(-1, descending=True)",
             f"        keep = {keep}",
             "        probs = probs * keep.scatter(-1, order, keep)",
             "        probs = probs / probs.sum(-1, keepdim=True)",
             "    return probs"]
    return "\n".join(lines) + "\n"


def accept_path_answer(draw=("y = int(sample(probs_from_logits(logits[node], temperature, top_k, top_p), "
                              "generator))",), before=None, greedy="int(logits[node].argmax())",
                       child=("child = tree.children[node].get(y)", "if child is None:")):
    """An accept_path answer with the library's walk, its sampled draw of y (lines; the library's draw, on the
    logits as given, by default), its `greedy` y (an expression) and how it finds the child of token y
    (`child`: lines that set child and end in the test that stops the walk) written as a student might;
    `before`: a line run once before the walk."""
    lines = ["def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):",
             "    node, path = 0, [0]",
             *([f"    {before}"] if before else []),
             "    while True:",
             "        if temperature == 0:",
             f"            y = {greedy}",
             "        else:",
             *[f"            {line}" for line in draw],
             *[f"        {line}" for line in child],
             "            return path, y",
             "        node = child",
             "        path.append(node)"]
    return "\n".join(lines) + "\n"


def greedy_answer(best="target_logits.argmax(-1)", kept=""):
    """A greedy_verify answer with the library's steps (the leading drafts equal to each row's best, the
    bonus from the row after them), its `best` tokens and a `kept` suffix on the count written as a student
    might."""
    lines = ["def greedy_verify(draft_tokens, target_logits):",
             f"    best = {best}",
             f"    n = (draft_tokens == best[..., :draft_tokens.size(-1)]).long().cumprod(-1).sum(-1){kept}",
             "    bonus = best.gather(-1, n[..., None])[..., 0]",
             "    return (int(n), int(bonus)) if draft_tokens.dim() == 1 else (n, bonus)"]
    return "\n".join(lines) + "\n"


def rejection_answer(test="not u[i] * draft_probs[i, d] < target_probs[i, d]",
                     reject=("return i, int(sample(residual_distribution(target_probs[i], draft_probs[i]), "
                             "generator))",), bonus="sample(target_probs[n], generator)"):
    """A rejection_verify answer with the library's loop (a uniform per draft, the first rejection ends the
    block), its `test` for a rejection, what it does on one (`reject`, lines) and its `bonus` draw written as
    a student might."""
    lines = ["def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):",
             "    n = draft_tokens.numel()",
             "    u = torch.rand(n, generator=generator, dtype=torch.float64)",
             "    for i, d in enumerate(draft_tokens.tolist()):",
             f"        if {test}:",
             *[f"            {line}" for line in reject],
             f"    return n, int({bonus})"]
    return "\n".join(lines) + "\n"


def multi_draft_answer(uniform="torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)",
                       test="u[i] * q[d] < r[d]", last="sample(r, generator)"):
    """A multi_draft_verify answer with the library's steps (a uniform per draft, each draft tested against
    what the rejections left, the last token drawn from it), one of them written as a student might: the
    `uniform` u, the acceptance `test`, the `last` draw (expressions)."""
    lines = ["def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):",
             "    r, q = target_probs, draft_probs",
             f"    u = {uniform}",
             "    for i, d in enumerate(draft_tokens.tolist()):",
             f"        if {test}:",
             "            return i, d",
             "        r = residual_distribution(r, q)",
             f"    return -1, int({last})"]
    return "\n".join(lines) + "\n"


def loop_walk_answer(scores="table.detach().cpu().numpy()", cand="cand.cpu().numpy()",
                     pick="int(s[r, t, i].argmax())"):
    """A greedy_walk answer that walks row by row, slot by slot: `scores` and `cand` (expressions of table
    and cand) are what it reads, and `pick` (an expression of s, r, t and i) the candidate it takes."""
    lines = ["def greedy_walk(cand, table):",
             "    lead, (n, K) = cand.shape[:-2], cand.shape[-2:]",
             f"    s, c = {scores}.reshape(-1, n, K, K), {cand}.reshape(-1, n, K)",
             "    out = np.zeros((len(s), n), dtype=np.int64)",
             "    for r in range(len(s)):",
             "        i = 0",
             "        for t in range(n):",
             f"            i = {pick}",
             "            out[r, t] = c[r, t, i]",
             "    return torch.from_numpy(out).reshape(*lead, n)"]
    return "\n".join(lines) + "\n"


def numpy_walk_answer(result):
    """A greedy_walk answer that walks every row at once in numpy and returns `result` (an expression of
    out, the chosen tokens per step, and lead, the leading dimensions)."""
    lines = ["def greedy_walk(cand, table):",
             "    lead, (n, K) = cand.shape[:-2], cand.shape[-2:]",
             "    scores = table.detach().cpu().reshape(-1, n, K, K).numpy()",
             "    c = cand.cpu().reshape(-1, n, K).numpy()",
             "    rows, i, out = np.arange(len(scores)), np.zeros(len(scores), dtype=np.int64), []",
             "    for t in range(n):",
             "        i = scores[rows, t, i].argmax(-1)",
             "        out.append(c[rows, t, i])",
             f"    return {result}"]
    return "\n".join(lines) + "\n"


# (exercise, a wrong answer, a phrase its failure message must contain)
WRONG = {
    "greedy_verify: keeps every draft": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            n = draft_tokens.numel()
            return n, int(target_logits[n].argmax())
        """, "you accepted a draft the target disagreed with"),
    "greedy_verify: two 0-d tensors where ints are due": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            best = target_logits.argmax(-1)
            n = (draft_tokens == best[..., :draft_tokens.size(-1)]).long().cumprod(-1).sum(-1)
            return n, best.gather(-1, n[..., None])[..., 0]
        """, "two Python ints"),
    "greedy_verify: the -1 padding clamped to token 0": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            d, best = draft_tokens.clamp(min=0), target_logits.argmax(-1)
            n = (d == best[..., :d.size(-1)]).long().cumprod(-1).sum(-1)
            bonus = best.gather(-1, n[..., None])[..., 0]
            return (int(n), int(bonus)) if d.dim() == 1 else (n, bonus)
        """, "padding matches no token"),
    "greedy_verify: the argmax of a float32 softmax": ("greedy_verify", greedy_answer(
        best="torch.softmax(target_logits.float(), -1).argmax(-1)"), "rounds them into a tie"),
    "rejection_verify: the bonus after a fully kept block from the global generator": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if not u[i] < target_probs[i, d] / draft_probs[i, d]:
                    r = residual_distribution(target_probs[i], draft_probs[i])
                    return i, int(sample(r, generator))
            return n, int(sample(target_probs[n]))
        """, "global random state"),
    "multi_draft_verify: the last draw, every draft rejected, from the global generator": (
        "multi_draft_verify", multi_draft_answer(last="sample(r)"), "global random state"),
    "residual_distribution: a threshold on the residual mass": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp_min(0)
            s = r.sum(-1, keepdim=True)
            return torch.where(s > 1e-6, r / s.clamp_min(1e-300), p)
        """, "so no threshold"),
    "probs_from_logits: at T=0 one flat argmax for the whole batch": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library


        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(), logits.size(-1)).double()
            return library(logits, temperature, top_k, top_p)
        """, "one-hot rows"),
    "probs_from_logits: at T=0 float32 one-hot rows": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library


        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
            return library(logits, temperature, top_k, top_p)
        """, "at T=0.0 too"),
    "probs_from_logits: at T=0 the tied tokens share the mass": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if temperature == 0:
                m = (logits == logits.max(-1, keepdim=True).values).double()
                return m / m.sum(-1, keepdim=True)
            return torch.softmax(logits.double() / temperature, -1)
        """, "a tie goes to the lower id"),
    "probs_from_logits: exp / sum in float64, the largest logit not subtracted": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
            e = torch.exp(logits.double() / temperature)
            return e / e.sum(-1, keepdim=True)
        """, "overflows float64 too"),
    "probs_from_logits: top-k masks the caller's logits in place": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.size(-1)), -1).values[..., -1:]
                logits.masked_fill_(logits < kth, float("-inf"))
            p = torch.softmax(logits.double() / temperature, -1)
            if top_p is not None:
                s, i = p.sort(dim=-1, descending=True, stable=True)
                p = torch.zeros_like(p).scatter(-1, i, s * ((s.cumsum(-1) - s) < top_p))
            return p / p.sum(-1, keepdim=True)
        """, "work on a copy"),
    "match_verify: a draft kept only where it is also the target's argmax": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            y, best = sample(target_probs, generator).tolist(), target_probs.argmax(-1).tolist()
            for i, d in enumerate(draft_tokens.tolist()):
                if d != y[i] or d != best[i]:
                    return i, y[i]
            n = draft_tokens.numel()
            return n, y[n]
        """, "whatever its rank"),
    "multi_draft_verify: the accepted token returned as a tensor": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q = target_probs, draft_probs
            u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)
            for i in range(draft_tokens.numel()):
                d = draft_tokens[i]
                if u[i] * q[d] < r[d]:
                    return i, d
                r = residual_distribution(r, q)
            return -1, int(sample(r, generator))
        """, "two Python ints"),
    "rejection_verify: every draft kept where q is p, else none (lossless but wasteful)": (
        "rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            if torch.equal(draft_probs, target_probs[:n]):
                return n, int(sample(target_probs[n], generator))
            return 0, int(sample(target_probs[0], generator))
        """, "lossless, perhaps, but wasteful"),
    "greedy_verify: one block only, never the batched decoder's rows": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            best = target_logits.argmax(-1).tolist()
            n = 0
            while n < draft_tokens.numel() and int(draft_tokens[n]) == best[n]:
                n += 1
            return n, best[n]
        """, "draft_tokens (R, n)"),
    "greedy_verify: counts every agreeing draft, not the leading ones": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            best = target_logits.argmax(-1)
            n = int((draft_tokens == best[:draft_tokens.numel()]).sum())
            return n, int(best[n])
        """, "after the first disagreement nothing is kept"),
    "greedy_verify: the bonus from the row before": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            best = target_logits.argmax(-1)
            n = 0
            while n < draft_tokens.numel() and draft_tokens[n] == best[n]:
                n += 1
            return n, int(best[max(n - 1, 0)])
        """, "row n_accepted - 1"),
    "greedy_verify: a tie broken toward the highest id": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            V = target_logits.size(-1)
            best = V - 1 - target_logits.flip(-1).argmax(-1)      # the last maximum, not the first
            n = 0
            while n < draft_tokens.numel() and draft_tokens[n] == best[n]:
                n += 1
            return n, int(best[n])
        """, "a tie goes to the lower id"),
    "match_verify: the last draft is never kept (a loop to n - 1)": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            y = sample(target_probs, generator)
            n = 0
            while n < draft_tokens.numel() - 1 and int(draft_tokens[n]) == int(y[n]):
                n += 1
            return n, int(y[n])
        """, "keeps fewer drafts than it must"),
    "match_verify: keeps every draft": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            n = draft_tokens.numel()
            return n, int(sample(target_probs[n], generator))
        """, "a rule that accepts too often fails exactly like this"),
    "match_verify: a fresh draw from p after a mismatch": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            y = sample(target_probs, generator)
            for i, d in enumerate(draft_tokens.tolist()):
                if d != int(y[i]):
                    return i, int(sample(target_probs[i], generator))
            return draft_tokens.numel(), int(y[-1])
        """, "do not follow the target's distribution"),
    "rejection_verify: p instead of the residual on a rejection": ("rejection_verify", rejection_answer(
        reject=["return i, int(sample(target_probs[i], generator))"]),
        "look at the token it emits after a rejection"),
    "rejection_verify: accepts whenever p >= q, no coin": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            for i, d in enumerate(draft_tokens.tolist()):
                if target_probs[i, d] < draft_probs[i, d]:
                    return i, int(sample(residual_distribution(target_probs[i], draft_probs[i]), generator))
            return n, int(sample(target_probs[n], generator))
        """, "do not follow the target's distribution"),
    "rejection_verify: q / p instead of p / q": ("rejection_verify", rejection_answer(
        test="not u[i] < draft_probs[i, d] / target_probs[i, d]"),
        "a rule that accepts too often fails exactly like this"),
    # caught at block size 3 only: there the bonus after a full block fits in the H new tokens
    "rejection_verify: the bonus after a full block from the last draft's row": ("rejection_verify",
        rejection_answer(bonus="sample(target_probs[max(n - 1, 0)], generator)"),
        "an output the target gives probability 0"),
    "tree_mask: an integer mask, not a boolean one": ("tree_mask", """
        def tree_mask(parent):
            n = len(parent)
            m = torch.eye(n, dtype=torch.long)
            for i in range(1, n):
                m[i] |= m[parent[i]]
            return m
        """, "refuses an integer one"),
    "residual_distribution: the ratio form p (1 - min(1, q / p)), NaN where p = q = 0": (
        "residual_distribution", """
        def residual_distribution(p, q):
            r = p * (1 - torch.clamp(q / p, max=1.0))
            s = r.sum(-1, keepdim=True)
            return torch.where(s > 0, r / s, p)
        """, "makes no NaN"),
    "residual_distribution: only on q's support": ("residual_distribution", """
        def residual_distribution(p, q):
            r = torch.where(q > 0, (p - q).clamp_min(0), torch.zeros_like(p))
            s = r.sum(-1, keepdim=True)
            return torch.where(s > 0, r / s.clamp_min(1e-300), p)
        """, "keeps its share"),
    "probs_from_logits: top_k = 1 as the one-hot argmax": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library

        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            if top_k == 1 and temperature > 0:
                return library(logits, 0.0)
            return library(logits, temperature, top_k, top_p)
        """, "A logit that ties the k-th largest stays in"),
    "probs_from_logits: a very low temperature taken as greedy": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library

        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            return library(logits, 0.0 if temperature < 0.01 else temperature, top_k, top_p)
        """, "never switch to greedy below some T"),
    "residual_distribution: no clamp at 0": ("residual_distribution", """
        def residual_distribution(p, q):
            r = p - q
            return r / r.sum(-1, keepdim=True)
        """, "negative entries"),
    "residual_distribution: 0 / 0 when p == q": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp_min(0)
            return r / r.sum(-1, keepdim=True)
        """, "must give p back"),
    "probs_from_logits: top-p before the temperature": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            logits = logits.double()
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
            if top_k is not None:
                kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            if top_p is not None:
                p, order = torch.softmax(logits, -1).sort(-1, descending=True)
                out = (p.cumsum(-1) - p) >= top_p
                logits = logits.masked_fill(out.scatter(-1, order, out), float("-inf"))
            return torch.softmax(logits / temperature, -1)
        """, "top-p before the temperature"),
    "probs_from_logits: the nucleus without the token that crosses top_p": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            logits = logits.double()
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, -1)
            if top_p is not None:
                p, order = probs.sort(-1, descending=True)
                keep = p.cumsum(-1) <= top_p
                keep[..., 0] = True
                probs = probs * keep.scatter(-1, order, keep)
                probs = probs / probs.sum(-1, keepdim=True)
            return probs
        """, "dropped the token that carries the mass across top_p"),
    "probs_from_logits: exactly k tokens kept when another ties the k-th": ("probs_from_logits", probs_answer(
        top_k=["idx = torch.topk(logits, top_k, dim=-1).indices",
               "k_best = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, idx, True)",
               'logits = logits.masked_fill(~k_best, float("-inf"))']), "ties the k-th largest stays in"),
    "probs_from_logits: <= at the top-p boundary": ("probs_from_logits", probs_answer(
        keep="(p.cumsum(-1) - p) <= top_p"), "kept one token too many"),
    "probs_from_logits: exp / sum in float32": ("probs_from_logits", probs_answer(
        cast="logits", softmax="(torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)).double()"),
        "overflows float32"),
    "residual_distribution: p back whenever the residual mass is small": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp_min(0)
            total = r.sum(-1, keepdim=True)
            return torch.where(total > 0.1, r / total.clamp_min(1e-300), p)
        """, "within 0.01 in total variation"),
    "training_mask: a block sees its own anchor's position as context": ("training_mask", """
        def training_mask(anchors, seq_len, block_size):
            N, K = anchors.shape
            ctx = torch.arange(seq_len)[None, None, :] <= anchors.repeat_interleave(block_size, 1)[:, :, None]
            blk = torch.arange(K).repeat_interleave(block_size)
            same = (blk[:, None] == blk[None, :]).expand(N, -1, -1)
            return torch.cat([ctx, same], -1)
        """, "its own anchor's position"),
    "training_mask: blocks see each other": ("training_mask", """
        def training_mask(anchors, seq_len, block_size):
            N, K = anchors.shape
            ctx = torch.arange(seq_len)[None, None, :] < anchors.repeat_interleave(block_size, 1)[:, :, None]
            return torch.cat([ctx, torch.ones(N, K * block_size, K * block_size, dtype=torch.bool)], -1)
        """, "none of the others"),
    "loss_decay_weights: exp(-k/gamma)": ("loss_decay_weights", """
        def loss_decay_weights(block_size, gamma=None):
            gamma = gamma or {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
            k = torch.arange(block_size, dtype=torch.float32)
            return torch.where(k >= 1, torch.exp(-k / gamma), torch.zeros(()))
        """, "not exp(-k/gamma)"),
    "loss_decay_weights: the anchor weighted too": ("loss_decay_weights", """
        def loss_decay_weights(block_size, gamma=None):
            gamma = gamma or 7.0
            return torch.exp(-(torch.arange(block_size, dtype=torch.float32) - 1).clamp_min(0) / gamma)
        """, "slot 0 is the anchor"),
    "tree_mask: each node sees its parent only": ("tree_mask", """
        def tree_mask(parent):
            n = len(parent)
            mask = torch.eye(n, dtype=torch.bool)
            for i in range(n):
                if parent[i] >= 0:
                    mask[i, parent[i]] = True
            return mask
        """, "itself and its ancestors"),
    "tree_mask: squaring the parent matrix too few times for a deep tree": ("tree_mask", """
        def tree_mask(parent):
            n = len(parent)
            m = torch.eye(n, dtype=torch.bool)
            for i in range(1, n):
                m[i, parent[i]] = True
            for _ in range(3):                       # reaches 8 levels up: enough for random trees
                m = (m.int() @ m.int()) > 0
            return m
        """, "(parent 8, depth 9)"),
    "training_mask: every block takes the first block's anchor": ("training_mask", """
        def training_mask(anchors, seq_len, block_size):
            N, K = anchors.shape
            B = block_size
            first = anchors[:, :1].expand(N, K * B)                                 # block 0's anchor for all
            ctx = torch.arange(seq_len, device=anchors.device)[None, None, :] < first[:, :, None]
            blocks = torch.arange(K * B, device=anchors.device) // B
            own = (blocks[:, None] == blocks[None, :]).expand(N, -1, -1)
            return torch.cat([ctx, own], dim=-1)
        """, "instead of its own"),
    "loss_decay_weights: the paper's weights, normalised to sum to 1": ("loss_decay_weights", """
        def loss_decay_weights(block_size, gamma=None):
            g = gamma or {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
            k = torch.arange(block_size, dtype=torch.float64)
            w = torch.exp(-(k - 1) / g)
            w[0] = 0
            return (w / w.sum()).float()
        """, "a constant factor does not change it"),
    "multi_draft_verify: a repeated draft skips the residual step": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q = target_probs, draft_probs
            u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)
            tested = set()
            for i, d in enumerate(draft_tokens.tolist()):
                if u[i] * q[d] < r[d]:
                    return i, d
                if d not in tested:
                    r = residual_distribution(r, q)
                tested.add(d)
            return -1, int(sample(r, generator))
        """, "a repeated draft's too"),
    "accept_path: follows the drafter's first child": ("accept_path", """
        def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
            node, path = 0, [0]
            while tree.children[node]:
                node = next(iter(tree.children[node].values()))
                path.append(node)
            return path, int(logits[node].argmax())
        """, "Follow the target's token"),
    "keep_path: crops without moving the kept nodes": ("keep_path", """
        def keep_path(cache, start, path):
            cache.crop(start + len(path))
        """, "move each kept node's keys/values"),
    "greedy_walk: each slot's best candidate on its own": ("greedy_walk", """
        def greedy_walk(cand, table):
            best = table.max(-2).values.argmax(-1)
            return cand.gather(-1, best[..., None])[..., 0]
        """, "not the best of the slot on its own"),
    "multi_draft_verify: every draft tested against p": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if u[i] * draft_probs[d] < target_probs[d]:
                    return i, d
            return -1, int(sample(residual_distribution(target_probs, draft_probs), generator))
        """, "before the next test"),
    "match_verify: the bonus after a full block from the last draft's row": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            n = draft_tokens.numel()
            y = sample(target_probs[:n], generator)
            for i in range(n):
                if int(draft_tokens[i]) != int(y[i]):
                    return i, int(y[i])
            return n, int(sample(target_probs[n - 1], generator))
        """, "the bonus after a fully accepted block"),
    "match_verify: one uniform for every draft": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            for i, d in enumerate(draft_tokens.tolist()):
                if u >= target_probs[i, d]:
                    rest = target_probs[i].clone()
                    rest[d] = 0
                    return i, int(sample(rest / rest.sum(), generator))
            return draft_tokens.numel(), int(sample(target_probs[-1], generator))
        """, "kept drafts does not follow row"),
    "rejection_verify: the residual drawn with the uniform that rejected the draft": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if u[i] * draft_probs[i, d] >= target_probs[i, d]:
                    r = residual_distribution(target_probs[i], draft_probs[i])
                    return i, min(int(torch.searchsorted(r.cumsum(0), u[i])), r.numel() - 1)
            return n, int(sample(target_probs[n], generator))
        """, "with fresh randomness (the uniform that rejected"),
    "rejection_verify: one uniform for every draft": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            for i, d in enumerate(draft_tokens.tolist()):
                if u * draft_probs[i, d] >= target_probs[i, d]:
                    return i, int(sample(residual_distribution(target_probs[i], draft_probs[i]), generator))
            return n, int(sample(target_probs[n], generator))
        """, "one uniform for the whole block?"),
    "residual_distribution: normalised over the whole batch, not row by row": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp_min(0)
            total = r.sum()
            return r / total if total > 0 else p
        """, "normalise each row"),
    "probs_from_logits: top-p before top-k": ("probs_from_logits", """
        def probs_from_logits(logits, temperature, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
            probs = torch.softmax(logits / temperature, -1)
            if top_p is not None:
                s, i = probs.sort(-1, descending=True)
                before = s.cumsum(-1) - s
                s = torch.where(before < top_p, s, torch.zeros_like(s))
                probs = torch.zeros_like(probs).scatter(-1, i, s)
                probs = probs / probs.sum(-1, keepdim=True)
            if top_k is not None:
                kth = probs.topk(min(top_k, probs.size(-1)), -1).values[..., -1:]
                probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
                probs = probs / probs.sum(-1, keepdim=True)
            return probs
        """, "You applied top-p before top-k"),
    "probs_from_logits: top-k dropped when top-p is given": ("probs_from_logits", """
        def probs_from_logits(logits, temperature, top_k=None, top_p=None):
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
            z = logits / temperature
            if top_k is not None and top_p is None:
                kth = z.topk(min(top_k, z.size(-1)), -1).values[..., -1:]
                z = torch.where(z >= kth, z, torch.full_like(z, float('-inf')))
            probs = torch.softmax(z, -1)
            if top_p is not None:
                s, i = probs.sort(-1, descending=True)
                before = s.cumsum(-1) - s
                s = torch.where(before < top_p, s, torch.zeros_like(s))
                probs = torch.zeros_like(probs).scatter(-1, i, s)
                probs = probs / probs.sum(-1, keepdim=True)
            return probs
        """, "You dropped top-k when top-p is given"),
    "loss_decay_weights: the default gamma B // 2 at odd block sizes": ("loss_decay_weights", """
        def loss_decay_weights(block_size, gamma=None):
            gamma = gamma or {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1, block_size // 2))
            k = torch.arange(block_size, dtype=torch.float32)
            return torch.where(k >= 1, torch.exp(-(k - 1) / gamma), torch.zeros(()))
        """, "gamma = 2.5"),
    "accept_path: top-p ignored": ("accept_path", accept_path_answer(
        ["y = int(sample(probs_from_logits(logits[node], temperature, top_k, None), generator))"]),
        "outside top-k or top-p"),
    "accept_path: the drawn token kept as a tensor, so no child is ever found": ("accept_path",
        accept_path_answer(
            ["y = sample(probs_from_logits(logits[node], temperature, top_k, top_p), generator)"]),
        "a tensor key is never found"),
    "accept_path: one uniform for the whole path": ("accept_path", accept_path_answer(
        ["c = probs_from_logits(logits[node], temperature, top_k, top_p).cumsum(0)",
         "y = min(int(torch.searchsorted(c, torch.tensor(u, dtype=c.dtype))), c.numel() - 1)"],
        before="u = float(torch.rand(1, generator=generator, dtype=torch.float64))"),
        "does not follow the target's p at that node"),
    "multi_draft_verify: the count of distinct drafts seen, not the index": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q = target_probs, draft_probs
            u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)
            seen = []
            for i, d in enumerate(draft_tokens.tolist()):
                if d not in seen:
                    seen.append(d)
                if u[i] * q[d] < r[d]:
                    return len(seen) - 1, d
                r = residual_distribution(r, q)
            return -1, int(sample(r, generator))
        """, "repeated drafts counted"),
    "multi_draft_verify: one uniform for every draft": ("multi_draft_verify", multi_draft_answer(
        uniform="float(torch.rand(1, generator=generator, dtype=torch.float64))", test="u * q[d] < r[d]"),
        "with a fresh uniform"),
    "multi_draft_verify: the last residual from p, not what the rejections left": ("multi_draft_verify",
        multi_draft_answer(last="sample(residual_distribution(target_probs, q), generator)"),
        "the emitted tokens do not follow p"),
    "greedy_walk: the first block's walk for every block": ("greedy_walk", """
        def greedy_walk(cand, table):
            n, K = cand.shape[-2:]
            t, c = table.reshape(-1, n, K, K)[0], cand.reshape(-1, n, K)[0]
            i, path = 0, []
            for s in range(n):
                i = int(t[s, i].argmax())
                path.append(int(c[s, i]))
            return torch.tensor(path).expand(cand.shape[:-1]).clone()
        """, "its own walk"),
    "greedy_walk: the previous choice read as a column": ("greedy_walk", """
        def greedy_walk(cand, table):
            lead, (n, K) = cand.shape[:-2], cand.shape[-2:]
            t = table.reshape(-1, n, K, K)
            c = cand.reshape(-1, n, K)
            out = []
            for r in range(t.size(0)):
                i, path = 0, []
                for s in range(n):
                    i = int(t[r, s, :, i].argmax())
                    path.append(int(c[r, s, i]))
                out.append(path)
            return torch.tensor(out).reshape(*lead, n)
        """, "Yours follows table[t][:, i], a column"),
    "tree_mask: transposed, ancestors see their descendants": ("tree_mask", """
        def tree_mask(parent):
            n = len(parent)
            m = torch.eye(n, dtype=torch.bool)
            for i in range(n):
                j = parent[i]
                while j >= 0:
                    m[j, i] = True
                    j = parent[j]
            return m
        """, "itself and its ancestors"),
    "keep_path: the keys moved, the values left": ("keep_path", """
        def keep_path(cache, start, path):
            nodes = torch.tensor(path) + start
            cache.k[:, :, :, start:start + len(path)] = cache.k[:, :, :, nodes]
            cache.crop(start + len(path))
        """, "something else in the values of layer(s)"),
    "keep_path: crops one position short": ("keep_path", """
        def keep_path(cache, start, path):
            nodes = torch.tensor(path) + start
            cache.k[:, :, :, start:start + len(path)] = cache.k[:, :, :, nodes]
            cache.v[:, :, :, start:start + len(path)] = cache.v[:, :, :, nodes]
            cache.crop(start + len(path) - 1)
        """, "crop after the kept nodes"),
    "training_mask: the position before the anchor hidden from its block": ("training_mask", """
        def training_mask(anchors, seq_len, block_size):
            N, K = anchors.shape
            before = (anchors - 1).repeat_interleave(block_size, 1)[:, :, None]
            ctx = torch.arange(seq_len)[None, None, :] < before
            blk = torch.arange(K).repeat_interleave(block_size)
            same = (blk[:, None] == blk[None, :]).expand(N, -1, -1)
            return torch.cat([ctx, same], -1)
        """, "it must see all of positions <"),
    "greedy_verify: keeps a draft in the target's top two": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            top2 = target_logits.topk(2, -1).indices
            n = 0
            while n < draft_tokens.numel() and int(draft_tokens[n]) in top2[n].tolist():
                n += 1
            return n, int(target_logits[n].argmax())
        """, "differs from plain greedy decoding"),
    "match_verify: draws from torch's global generator": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            y = torch.multinomial(target_probs, 1)[:, 0]      # no generator: not reproducible from a seed
            n = 0
            while n < draft_tokens.numel() and int(draft_tokens[n]) == int(y[n]):
                n += 1
            return n, int(y[n])
        """, "draws from torch's global random state"),
    "accept_path: draws from torch's global generator": ("accept_path", accept_path_answer(
        ["p = probs_from_logits(logits[node], temperature, top_k, top_p)",
         "y = int(torch.multinomial(p, 1))            # no generator"]),
        "draws from torch's global random state"),
    "multi_draft_verify: draws from torch's global generator": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q = target_probs, draft_probs
            for i, d in enumerate(draft_tokens.tolist()):
                if float(torch.rand(())) * q[d] < r[d]:          # the global RNG, not the generator
                    return i, d
                r = residual_distribution(r, q)
            return -1, int(torch.multinomial(r, 1))
        """, "draws from torch's global random state"),
    "rejection_verify: a fresh generator when none is given": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            generator = generator or torch.Generator()       # its fixed seed: every run decodes alike
            n = draft_tokens.numel()
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if not u[i] * draft_probs[i, d] < target_probs[i, d]:
                    return i, int(sample(residual_distribution(target_probs[i], draft_probs[i]), generator))
            return n, int(sample(target_probs[n], generator))
        """, "a fresh torch.Generator() replays one fixed seed"),
    "multi_draft_verify: a fresh generator when none is given": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            generator = generator if generator is not None else torch.Generator().manual_seed(0)
            r, q = target_probs, draft_probs
            for i, d in enumerate(draft_tokens.tolist()):
                if float(torch.rand((), generator=generator, dtype=torch.float64)) * q[d] < r[d]:
                    return i, d
                r = residual_distribution(r, q)
            return -1, int(sample(r, generator))
        """, "a fresh torch.Generator() replays one fixed seed"),
    "greedy_walk: numpy on the drafter's device, never moved to the CPU": ("greedy_walk", loop_walk_answer(
        scores="table.detach().numpy()", cand="cand.numpy()"), ".cpu() before .numpy()"),
    "accept_path: the logits left on the target's device": ("accept_path", accept_path_answer(),
        "move them to the CPU first"),
    "greedy_walk: the table moved to the CPU, the candidates not": ("greedy_walk", loop_walk_answer(
        cand="cand.numpy()"), "with cand on another device"),
    "greedy_walk: the best candidate by topk(1), its own order of ties": ("greedy_walk", loop_walk_answer(
        scores="table.detach().cpu()", pick="int(s[r, t, i].topk(1).indices[0])"),
        "torch.topk and sorts order ties"),
    "match_verify: the draft zeroed in the target's row, in place": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            for i, d in enumerate(draft_tokens.tolist()):
                if float(torch.rand((), generator=generator, dtype=torch.float64)) < target_probs[i, d]:
                    continue
                row = target_probs[i]
                row[d] = 0.0                               # p without d, in the decoder's own tensor
                return i, int(sample(row, generator))
            n = draft_tokens.numel()
            return n, int(sample(target_probs[n], generator))
        """, "changed its argument target_probs in place"),
    "residual_distribution: p - q computed in p's own memory": ("residual_distribution", """
        def residual_distribution(p, q):
            r = p.sub_(q).clamp_(min=0)
            total = r.sum(-1, keepdim=True)
            return torch.where(total > 0, r / total, p)
        """, "it changed p in place"),
    "residual_distribution: computed in float32": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p.float() - q.float()).clamp_min(0)
            total = r.sum(-1, keepdim=True)
            return torch.where(total > 0, r / total, p.float())
        """, "of that shape and dtype"),
    "multi_draft_verify: the drafts tested most likely under q first": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q, tokens = target_probs, draft_probs, draft_tokens.tolist()
            order = sorted(range(len(tokens)), key=lambda i: -float(q[tokens[i]]))
            u = torch.rand(len(tokens), generator=generator, dtype=torch.float64)
            for j, i in enumerate(order):
                if u[j] * q[tokens[i]] < r[tokens[i]]:
                    return i, tokens[i]
                r = residual_distribution(r, q)
            return -1, int(sample(r, generator))
        """, "Test the drafts in the order given"),
    "multi_draft_verify: a repeated draft skipped, no residual step": ("multi_draft_verify", """
        def multi_draft_verify(draft_tokens, draft_probs, target_probs, generator=None):
            r, q, seen = target_probs, draft_probs, set()
            u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if d in seen:                                  # "it would be rejected again"
                    continue
                if u[i] * q[d] < r[d]:
                    return i, d
                seen.add(d)
                r = residual_distribution(r, q)
            return -1, int(sample(r, generator))
        """, "one rejection fewer"),
    "probs_from_logits: top_k larger than the vocabulary not clamped": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            logits = logits.double()
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
            logits = logits / temperature
            if top_k is not None:                                # top_k > V: torch.topk raises
                kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, -1)
            if top_p is not None and top_p < 1:
                s, order = probs.sort(-1, descending=True)
                keep = (s.cumsum(-1) - s) < top_p
                probs = probs * keep.scatter(-1, order, keep)
                probs = probs / probs.sum(-1, keepdim=True)
            return probs
        """, "is more than the 4 tokens: keep them all then"),
    "probs_from_logits: float32 probabilities from float32 logits": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            # never converts to float64: a float32 model's logits give float32 probabilities
            if temperature == 0:
                return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, -1)
            if top_p is not None and top_p < 1:
                s, order = probs.sort(-1, descending=True)
                keep = (s.cumsum(-1) - s) < top_p
                probs = probs * keep.scatter(-1, order, keep)
                probs = probs / probs.sum(-1, keepdim=True)
            return probs
        """, "must come back as float64"),
    "residual_distribution: p only when every row of the batch has p == q": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp_min(0)
            total = r.sum(-1, keepdim=True)
            if bool((total == 0).all()):            # only when EVERY row has p == q
                return p.clone()
            return r / total
        """, "decide row by row"),
    "training_mask: built on the CPU whatever the anchors' device": ("training_mask", """
        def training_mask(anchors, seq_len, block_size):
            N, K = anchors.shape
            ctx = torch.arange(seq_len)[None, None, :] < anchors.repeat_interleave(block_size, 1)[:, :, None]
            blk = torch.arange(K).repeat_interleave(block_size)      # CPU tensors: anchors may be on the GPU
            same = (blk[:, None] == blk[None, :]).expand(N, -1, -1)
            return torch.cat([ctx, same], -1)
        """, "Build every tensor on anchors.device"),
    "rejection_verify: the residual computed in place in target_probs": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            for i, d in enumerate(draft_tokens.tolist()):
                if not u[i] * draft_probs[i, d] < target_probs[i, d]:
                    r = target_probs[i]                         # a view: the caller's p is changed
                    r -= draft_probs[i]
                    r.clamp_(min=0)
                    return i, int(sample(r, generator))
            return n, int(sample(target_probs[n], generator))
        """, "changed its argument target_probs in place"),
    "greedy_walk: a final squeeze(0), which drops a batch of one": ("greedy_walk", numpy_walk_answer(
        "torch.from_numpy(np.stack(out, -1)).reshape(*lead, n).squeeze(0)"), "keep the leading dimension"),
    "greedy_walk: a numpy array instead of a LongTensor": ("greedy_walk", numpy_walk_answer(
        "np.stack(out, -1).reshape(*lead, n)          # a numpy array, not a LongTensor"),
        "must return a LongTensor"),
    "tree_mask: a float 0/1 mask": ("tree_mask", """
        def tree_mask(parent):
            n = len(parent)
            mask = torch.eye(n)                                  # float 0/1, not bool
            for i in range(1, n):
                mask[i] = torch.maximum(mask[i], mask[parent[i]])
            return mask
        """, "adds a float mask to its scores as a bias"),
    "greedy_verify: index tensors made on the CPU, whatever the logits' device": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            pred = target_logits.argmax(-1)
            n = draft_tokens.size(-1)
            miss = draft_tokens != pred[..., :n]
            pos = torch.where(miss, torch.arange(n), torch.full((n,), n))      # CPU tensors
            n_acc = pos.min(-1).values if n else torch.zeros(miss.shape[:-1], dtype=torch.long)
            bonus = pred.gather(-1, n_acc[..., None])[..., 0]
            return (int(n_acc), int(bonus)) if draft_tokens.dim() == 1 else (n_acc, bonus)
        """, "make every tensor you build on target_logits.device"),
    "greedy_verify: the top token from a descending sort, ties in its own order": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            pred = target_logits.sort(-1, descending=True).indices[..., 0]
            n = draft_tokens.size(-1)
            n_acc = (draft_tokens == pred[..., :n]).long().cumprod(-1).sum(-1)
            bonus = pred.gather(-1, n_acc[..., None])[..., 0]
            return (int(n_acc), int(bonus)) if draft_tokens.dim() == 1 else (n_acc, bonus)
        """, "need not keep tied ids in order"),
    "probs_from_logits: the nucleus ranked by a sort that orders ties its own way": ("probs_from_logits",
        probs_answer(), "the contract ranks a tie by id"),
    "accept_path: the greedy token from a float32 copy of the logits": ("accept_path", accept_path_answer(
        greedy="int(logits[node].float().argmax())"), "a float32 cast rounds them into a tie"),
    "accept_path: greedy, the bonus returned as a 0-d tensor": ("accept_path", """
        def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
            node, path = 0, [0]
            while True:
                if temperature == 0:
                    y = logits[node].argmax()
                else:
                    y = int(sample(probs_from_logits(logits[node], temperature, top_k, top_p), generator))
                child = tree.children[node].get(int(y))
                if child is None:
                    return path, y
                node = child
                path.append(node)
        """, "the next token as a Python int"),
    "accept_path: greedy draws too, from a one-hot p": ("accept_path", """
        def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
            node, path = 0, [0]
            while True:
                y = int(sample(probs_from_logits(logits[node], temperature, top_k, top_p), generator))
                child = tree.children[node].get(y)
                if child is None:
                    return path, y
                node = child
                path.append(node)
        """, "at temperature 0 your accept_path draws from"),
    "multi_draft_verify: every draft rejected, the last residual's residual": ("multi_draft_verify",
        multi_draft_answer(last="sample(residual_distribution(r, q), generator)"),
        "the residual of r once more"),
    "greedy_walk: a tie to the higher candidate index (the last of an ascending argsort)": ("greedy_walk",
        loop_walk_answer(pick='int(np.argsort(s[r, t, i], kind="stable")[-1])'),
        "a tie goes to the lower candidate index"),
    "greedy_walk: the scores cast to float32": ("greedy_walk",
        loop_walk_answer(scores="table.detach().cpu().float().numpy()"), "best scores lead the next by 1e-9"),
    "probs_from_logits: divided by T in the logits' float32": ("probs_from_logits", probs_answer(
        cast="logits", softmax="torch.softmax(logits.double(), -1)"), "convert to float64 first"),
    "accept_path: the greedy token kept as a tensor, so no child is ever found": ("accept_path",
        accept_path_answer(greedy="logits[node].argmax()",
                           child=["child = tree.children[node].get(y)", "y = int(y)", "if child is None:"]),
        "Your walk stopped where a child holds"),
    "accept_path: the bonus drawn again where no child holds the first draw": ("accept_path", """
        def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
            def draw(node):
                if temperature == 0:
                    return int(logits[node].argmax())
                return int(sample(probs_from_logits(logits[node], temperature, top_k, top_p), generator))
            node, path = 0, [0]
            while True:
                child = tree.children[node].get(draw(node))
                if child is None:
                    return path, draw(node)
                node = child
                path.append(node)
        """, "at each node draw ONE y"),
    "residual_distribution: 0 / 0 where p == q": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp(min=0)
            return r / r.sum(-1, keepdim=True)
        """, "NaN for such a row even alone"),
    "residual_distribution: a uniform row where p == q": ("residual_distribution", """
        def residual_distribution(p, q):
            r = (p - q).clamp(min=0)
            total = r.sum(-1, keepdim=True)
            return torch.where(total > 0, r / total.clamp_min(1e-300), torch.full_like(p, 1 / p.size(-1)))
        """, "not p's row"),
    "accept_path: no deeper than 8 drafts": ("accept_path", accept_path_answer(
        child=["child = tree.children[node].get(y)", "if child is None or len(path) > 8:"]),
        "no cap on the depth"),
    "accept_path: a greedy tie to the higher id": ("accept_path", accept_path_answer(
        greedy="logits.size(-1) - 1 - int(logits[node].flip(-1).argmax())"), "a tie goes to the lower id"),
    "accept_path: only a node's first child looked at": ("accept_path", accept_path_answer(
        child=["child = next(iter(tree.children[node].items()), (None, None))",
               "child = child[1] if child[0] == y else None", "if child is None:"]),
        "look among all of a node's children"),
    "rejection_verify: every accepted test counted, not the leading run": ("rejection_verify", """
        def rejection_verify(draft_tokens, draft_probs, target_probs, generator=None):
            n = draft_tokens.numel()
            u = torch.rand(n, generator=generator, dtype=torch.float64)
            idx = torch.arange(n)
            n_acc = int((u * draft_probs[idx, draft_tokens] < target_probs[idx, draft_tokens]).sum())
            if n_acc < n:
                return n_acc, int(sample(residual_distribution(target_probs[n_acc], draft_probs[n_acc]),
                                         generator))
            return n, int(sample(target_probs[n], generator))
        """, "before the first rejection only"),
    "keep_path: copied back to front over the positions still to read": ("keep_path", """
        def keep_path(cache, start, path):
            for i in reversed(range(len(path))):
                cache.k[:, :, :, start + i] = cache.k[:, :, :, start + path[i]]
                cache.v[:, :, :, start + i] = cache.v[:, :, :, start + path[i]]
            cache.crop(start + len(path))
        """, "The new positions overlap the old ones"),
    "loss_decay_weights: gamma as a rate, exp(-(k-1) * gamma)": ("loss_decay_weights", """
        def loss_decay_weights(block_size, gamma=None):
            gamma = gamma or {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
            k = torch.arange(block_size, dtype=torch.float64)
            return torch.where(k >= 1, torch.exp(-(k - 1) * gamma), torch.zeros(()))
        """, "divide by it"),
    "greedy_verify: never more than 12 drafts kept": ("greedy_verify", greedy_answer(kept=".clamp_max(12)"),
        "should have been kept"),
    "rejection_verify: the last of 12 or more drafts never kept": ("rejection_verify", rejection_answer(
        test="not u[i] * draft_probs[i, d] < target_probs[i, d] or (n >= 12 and i == n - 1)"),
        "so all 15 must be kept"),
    "rejection_verify: p without the rejected draft in place of the residual": ("rejection_verify",
        rejection_answer(reject=["rest = target_probs[i].clone()", "rest[d] = 0.0",
                                 "return i, int(sample(rest / rest.sum(), generator))"]),
        "normalize(max(0, p_i - q_i))"),
    "match_verify: the argmax after a long fully kept block": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            n = draft_tokens.numel()
            y = sample(target_probs, generator)
            for i, d in enumerate(draft_tokens.tolist()):
                if d != int(y[i]):
                    return i, int(y[i])
            return n, int(target_probs[n].argmax()) if n >= 12 else int(y[n])
        """, "a sample, not its argmax"),
    "probs_from_logits: top_p of 0.99 or more taken as no nucleus": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library

        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            return library(logits, temperature, top_k, None if top_p is not None and top_p >= 0.99 else top_p)
        """, "however close to 1 it is"),
    "probs_from_logits: results kept by the logits' address": ("probs_from_logits", """
        from nanodflash.sampling import probs_from_logits as library
        SEEN = {}

        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            key = (logits.data_ptr(), tuple(logits.shape), logits.dtype, temperature, top_k, top_p)
            if key not in SEEN:
                SEEN[key] = library(logits, temperature, top_k, top_p)
            return SEEN[key].clone()
        """, "keep nothing between calls"),
    "multi_draft_verify: no more than 4 drafts tested": ("multi_draft_verify",
        multi_draft_answer(test="i < 4 and u[i] * q[d] < r[d]"), "every draft tested"),
    "keep_path: only the first 8 kept nodes moved": ("keep_path", """
        def keep_path(cache, start, path):
            for i, node in enumerate(path[:8]):
                cache.k[:, :, :, start + i] = cache.k[:, :, :, start + node]
                cache.v[:, :, :, start + i] = cache.v[:, :, :, start + node]
            cache.crop(start + len(path))
        """, "must hold the keys/values of the path's node"),
    "greedy_walk: slot 1 read from the last row of table[0]": ("greedy_walk",
        loop_walk_answer(pick="int(s[r, t, K - 1 if t == 0 else i].argmax())"),
        "starts from another row of table[0]"),
    "match_verify: p cut to its top 256 tokens for a large vocabulary": ("match_verify", """
        def match_verify(draft_tokens, target_probs, generator=None):
            p = target_probs
            if p.size(-1) >= 1000:                          # only the likeliest tokens matter, surely
                top = p.topk(256, -1)
                p = torch.zeros_like(p).scatter(-1, top.indices, top.values)
            y = sample(p, generator)
            n = int((draft_tokens == y[:draft_tokens.numel()]).long().cumprod(0).sum())
            return n, int(y[n])
        """, "draw from all of p, not a part of it"),
    "keep_path: layer 0 moved, the other layers left": ("keep_path", """
        def keep_path(cache, start, path):
            nodes = torch.tensor(path) + start
            cache.k[0, :, :, start:start + len(path)] = cache.k[0, :, :, nodes]
            cache.v[0, :, :, start:start + len(path)] = cache.v[0, :, :, nodes]
            cache.crop(start + len(path))
        """, "the keys of layer(s) [1, 2] and the values of layer(s) [1, 2]"),
}


# correct answers written otherwise than the library's (loops, numpy, plain Python): every claim must hold
RIGHT = {
    "greedy_verify: a loop, the batched form row by row": ("greedy_verify", """
        def greedy_verify(draft_tokens, target_logits):
            if draft_tokens.dim() == 2:
                rows = [greedy_verify(d[d >= 0], l[: int((d >= 0).sum()) + 1])
                        for d, l in zip(draft_tokens, target_logits)]
                return torch.tensor([n for n, _ in rows]), torch.tensor([b for _, b in rows])
            best = target_logits.argmax(-1).tolist()
            n = 0
            for d in draft_tokens.tolist():
                if d != best[n]:
                    break
                n += 1
            return n, best[n]
        """),
    "greedy_walk: numpy, without detaching": ("greedy_walk", loop_walk_answer(scores="table.cpu().numpy()")),
    "probs_from_logits: top-k from a sort, the nucleus counted along a stable sort": ("probs_from_logits", """
        def probs_from_logits(logits, temperature=1.0, top_k=None, top_p=None):
            x = logits.to(torch.float64)
            V = x.size(-1)
            if temperature == 0:
                return torch.zeros_like(x).scatter(-1, x.argmax(-1, keepdim=True), 1.0)
            if top_k is not None and int(top_k) < V:               # dividing by T > 0 keeps the order
                kth = torch.sort(x, -1, descending=True).values[..., int(top_k) - 1: int(top_k)]
                x = torch.where(x >= kth, x, torch.full_like(x, float("-inf")))
            p = torch.softmax(x / temperature, -1)
            if top_p is not None and top_p < 1:
                sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
                n_keep = (sp.cumsum(-1) - sp < top_p).sum(-1, keepdim=True)    # a prefix of the ranking
                kept = torch.where(torch.arange(V).expand_as(sp) < n_keep, sp, torch.zeros_like(sp))
                p = torch.empty_like(p).scatter(-1, order, kept)
                p = p / p.sum(-1, keepdim=True)
            return p
        """),
    "loss_decay_weights: plain Python": ("loss_decay_weights", """
        import math


        def loss_decay_weights(block_size, gamma=None):
            if gamma is None:
                gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
            return torch.tensor([0.0] + [math.exp(-(k - 1) / gamma) for k in range(1, block_size)])
        """),
}


@pytest.mark.parametrize("answer", list(RIGHT))
def test_a_correct_answer_written_otherwise_than_the_librarys_passes_every_claim(tmp_path, answer):
    name, source = RIGHT[answer]
    path = write(tmp_path, source)
    results = run_checks(BY_NAME[name], load_function(path, name, BY_NAME[name].original()), path)
    failed = [m for _, m in results if m is not None]
    assert not failed, f"{answer}: a correct answer fails: {failed}"


def write(tmp_path, source):
    path = tmp_path / "answer.py"
    path.write_text(HEADER + textwrap.dedent(source))
    return str(path)


@pytest.mark.parametrize("mistake", list(WRONG))
def test_a_realistic_wrong_answer_fails_with_a_message_that_names_its_symptom(tmp_path, mistake):
    name, source, symptom = WRONG[mistake]
    path = write(tmp_path, source)
    results = run_checks(BY_NAME[name], load_function(path, name, BY_NAME[name].original()), path,
                         until=lambda message: symptom in message)            # the claims after it: unneeded
    messages = [m for _, m in results if m is not None]
    assert messages, f"{mistake}: the wrong answer passes every claim of {name}"
    assert any(symptom in m for m in messages), \
        f"{mistake}: no failure names the symptom {symptom!r}; the messages were {messages}"


def test_every_exercise_has_a_wrong_answer_in_this_file():
    covered = {name for name, _, _ in WRONG.values()}
    assert covered == set(BY_NAME), f"exercises without a wrong answer tested: {set(BY_NAME) - covered}"


def test_list_start_and_check_work_from_any_folder(tmp_path):
    listing = run_command("-m", "nanodflash.exercises", cwd=tmp_path)
    assert listing.returncode == 0 and all(e.name in listing.stdout for e in EXERCISES), listing.stdout
    started = run_command("-m", "nanodflash.exercises", "start", "tree_mask", cwd=tmp_path)
    assert started.returncode == 0 and (tmp_path / "tree_mask.py").exists(), started.stderr
    again = run_command("-m", "nanodflash.exercises", "start", "tree_mask", cwd=tmp_path)
    assert again.returncode == 1 and "exists already" in again.stderr, "start must never overwrite a file"
    skeleton_check = run_command("-m", "nanodflash.exercises", "check", "tree_mask", "tree_mask.py",
                                 cwd=tmp_path)
    assert skeleton_check.returncode == 1 and "FAIL" in skeleton_check.stdout \
        and "NotImplementedError" in skeleton_check.stdout, skeleton_check.stdout
    said, which = skeleton_check.stdout, "hint 1 (the idea) addresses this failure"
    assert f"{which}: python -m nanodflash.exercises hint tree_mask 1" in said, \
        f"a failed check should say which hint addresses it:\n{said}"
    first = run_command("-m", "nanodflash.exercises", "check", "tree_mask", "tree_mask.py", "--first",
                        cwd=tmp_path)
    n_claims = len(BY_NAME["tree_mask"].claims)
    assert first.returncode == 1 and first.stdout.count("FAIL  ") == 1 and "PASS" not in first.stdout \
        and f"({n_claims - 1} not run)" in first.stdout, \
        f"--first should stop at the first failure:\n{first.stdout}"
    (tmp_path / "right.py").write_text("from nanodflash.ext.tree import tree_mask\n")
    right = run_command("-m", "nanodflash.exercises", "check", "tree_mask", "right.py", cwd=tmp_path)
    assert right.returncode == 0 and "FAIL" not in right.stdout and "hint" not in right.stdout, right.stdout


@pytest.mark.parametrize("source,phrase", [
    ("def tree_mask(parent)\n    return None\n", "syntax error"),
    ("def other(parent):\n    return None\n", "defines no function named 'tree_mask'"),
    ("def tree_mask(parents, n):\n    return None\n", "should take (parent)"),
    ("import not_a_module\n", "fails when it is loaded"),
])
def test_a_file_that_cannot_be_checked_gets_one_clear_line(tmp_path, source, phrase):
    (tmp_path / "bad.py").write_text(source)
    result = run_command("-m", "nanodflash.exercises", "check", "tree_mask", "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and phrase in result.stderr and "Traceback" not in result.stderr, \
        f"expected one line naming {phrase!r}, got: {result.stderr}"
    assert result.stderr.strip().count("\n") == 0, f"more than one line: {result.stderr}"


def copied(e, text):
    """The sentences (20 characters or more) of e's library docstring that `text` repeats."""
    flat, doc = " ".join(text.split()), " ".join(e.original().__doc__.split())
    return [x for x in re.split(r"(?<=[.:;])\s+", doc) if len(x) >= 20 and x in flat]


def test_a_skeleton_states_the_contract_and_where_the_hints_are_not_the_librarys_docstring(tmp_path):
    for e in EXERCISES:
        text = skeleton(e)
        path = tmp_path / f"{e.name}.py"
        path.write_text(text)
        fn = load_function(str(path), e.name, e.original())          # loads, with the library's signature
        assert "TODO" in text and f"python -m nanodflash.exercises hint {e.name} 1" in text, e.name
        assert not copied(e, text), f"{e.name}'s skeleton repeats the library's docstring: {copied(e, text)}"
        assert e.todo not in text, f"{e.name}'s skeleton spells out the steps (hint 2)"
        with pytest.raises(NotImplementedError):
            fn(*[None] * fn.__code__.co_argcount)
        # control: a skeleton that carried the library's docstring would be caught
        assert copied(e, text + e.original().__doc__), f"{e.name}: the copy check cannot see its docstring"


def test_every_exercise_has_three_hint_levels_from_the_command_line():
    for e in EXERCISES:
        said = [run_command("-m", "nanodflash.exercises", "hint", e.name, str(level)).stdout
                for level in (1, 2, 3)]
        assert all(f"{e.name}, hint {level} of 3: " in out for level, out in zip((1, 2, 3), said)), said
        assert len({out.split(": ", 1)[1] for out in said}) == 3, f"{e.name}: the three hints must differ"
    refused = run_command("-m", "nanodflash.exercises", "hint", "tree_mask", "4")
    assert refused.returncode != 0 and "invalid choice: 4" in refused.stderr, refused.stderr


def test_hint_2_gives_the_steps_in_words_and_hint_3_the_code_with_every_argument_the_claims_check():
    from difflib import SequenceMatcher

    from nanodflash.exercises.hints import hint
    for e in EXERCISES:
        steps, code = hint(e, 2), hint(e, 3)
        assert SequenceMatcher(None, steps, code).ratio() < 0.5, \
            f"{e.name}: hint 2 says what hint 3 says; give the steps in words there\n{steps}\n{code}"
        if any(c.__name__ == "claim_sampled_rules_draw_only_from_their_generator" for c in e.claims):
            assert "generator" in code, f"{e.name}: hint 3 must draw from the generator its claims check"
            assert "generator" in steps, f"{e.name}: a failure of the generator claim points to hint 2, " \
                                         "whose steps must then say where the draws come from"


# The claims the hint-3 test below leaves to the full checker (each costs seconds): a decoding with the
# function in place, a statistical test over thousands of calls, or the meta device (its first use in a
# process sets torch up for it, about 5 s). greedy_verify's batched claim stays in, though it decodes: it
# holds that function's only batched cases, and takes under half a second.
SLOW_CLAIMS = {
    # decodings
    cg.claim_greedy_speculative_equals_greedy_decoding,
    cv.claim_match_decoding_has_exactly_the_targets_distribution,
    cv.claim_rejection_decoding_has_exactly_the_targets_distribution,
    ctree.claim_sampled_tree_decoding_has_exactly_the_targets_distribution,
    cs.claim_sampled_decoding_stays_exact_with_it,
    ctree.claim_greedy_tree_decoding_equals_greedy_decoding,
    ctree.claim_sampled_tree_decoding_with_it_has_exactly_the_targets_distribution,
    cw.claim_dflash2_greedy_decoding_with_it_equals_greedy_decoding,
    cw.claim_batched_dflash2_decoding_with_it_equals_greedy_decoding,
    # statistical tests
    cv.claim_match_keeps_a_draft_as_often_as_the_target_draws_it,
    cv.claim_rejection_keeps_a_draft_as_often_as_the_rule_must,
    cb.claim_multi_draft_accepts_more_with_more_drafts,
    cb.claim_multi_draft_emits_exactly_p,
    cb.claim_match_step_emits_each_rows_distribution,
    cb.claim_rejection_step_emits_each_rows_distribution,
    cb.claim_multi_draft_after_a_rejection_emits_the_residual,
    ctree.claim_accept_path_emits_each_nodes_distribution,
    # the meta device
    ct.claim_training_mask_is_made_on_the_anchors_device,
    cg.claim_greedy_verify_makes_its_tensors_on_the_logits_device,
}


def filled_with_hint_3(tmp_path, name):
    """NAME.py as a student fills it in: the skeleton `start` writes, its `raise NotImplementedError` replaced
    by the code `hint NAME 3` prints (everything after the blank line under its first line)."""
    started = run_command("-m", "nanodflash.exercises", "start", name, cwd=tmp_path)
    assert started.returncode == 0, f"start {name} failed: {started.stderr}"
    said = run_command("-m", "nanodflash.exercises", "hint", name, "3").stdout
    assert "\n\n" in said, f"hint {name} 3 prints no code under its first line: {said}"
    path = tmp_path / f"{name}.py"
    text = path.read_text()
    assert text.count("    raise NotImplementedError\n") == 1, f"{name}'s skeleton has no one line to replace"
    path.write_text(text.replace("    raise NotImplementedError\n", said.split("\n\n", 1)[1]))
    return str(path)


def same_draws(name, fn, seeds=range(20)):
    """None when fn returns what the library's rule `name` returns on every path of the generator claim's
    calls, with generators seeded alike, and leaves its generator in the same state; else what differs."""
    for args in cb.generator_arguments(name):
        for seed in seeds:
            g, h = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            got, want = fn(*args, g), BY_NAME[name].original()(*args, h)
            if repr(got) != repr(want):
                return f"generator seeded {seed}: it returned {got!r}, the library's rule {want!r}"
            if not torch.equal(g.get_state(), h.get_state()):
                return f"generator seeded {seed}: it returned {got!r} as the library's rule does, after " \
                       "drawing other numbers from the generator"
    return None


@pytest.mark.parametrize("name", ["match_verify", "rejection_verify", "multi_draft_verify", "accept_path"])
def test_the_global_seed_claim_calls_each_rule_where_its_result_is_spread(name):
    """The claim fails a rule that returns one result under all 40 global seeds: for a correct rule that
    must be nearly impossible, so no result of the call it makes may have probability near 1 (under 0.7 in
    40 seeds: a correct rule then fails with probability below 1e-6)."""
    args, rule = cb.spread_arguments(name), BY_NAME[name].original()
    results = cb.seeded_results(lambda g: rule(*args, g))
    share = max(results.count(r) for r in results) / len(results)
    assert share <= 0.7, f"{name}: one result in {share:.0%} of 40 seeds; the claim could fail a right rule"


def test_hint_3_filled_into_the_skeleton_passes_the_checker(tmp_path):
    """Every hint 3, pasted into its skeleton as the command line prints it, passes the checker's claims that
    call the function directly (hand-made cases, ties, batches and padding, the generator on every path).
    The full checker takes 3 to 19 s an exercise, past the suite's budget; the claims left out (SLOW_CLAIMS)
    hold too, for these reasons. A sampled rule's hint 3 returns the library's outputs and draws the same
    numbers from the same generator (checked here on the generator claim's calls, every path), so the
    statistical and decoding claims see what they see with the library's own rule, which passes them (the
    first test of this file). A deterministic function's direct claims compare it with the library's
    references case by case, on inputs of the kinds the decoders give it. training_mask's hint 3 makes every
    tensor with device=anchors.device and reads no anchor into Python, all the meta-device claim asks;
    greedy_verify's reads the logits into Python (a loop over the rows), which its device claim accepts."""
    failed = {}
    for e in EXERCISES:
        path = filled_with_hint_3(tmp_path, e.name)
        fn = load_function(path, e.name, e.original())
        direct = dataclasses.replace(e, claims=tuple(c for c in e.claims if c not in SLOW_CLAIMS))
        failed[e.name] = [(claim, m) for claim, m in run_checks(direct, fn, path) if m is not None]
        differs = cb.claim_sampled_rules_draw_only_from_their_generator in e.claims and same_draws(e.name, fn)
        if differs:
            failed[e.name].append(("returns the library's outputs from the same draws", differs))
    failed = {name: f for name, f in failed.items() if f}
    assert not failed, f"hint 3, filled in as written, fails: {failed}"


def test_a_failure_of_a_written_function_points_to_the_steps_and_an_unwritten_one_to_the_idea():
    from nanodflash.exercises.hints import which_hint
    claim = "greedy speculative decoding with it is token-identical to plain greedy decoding"
    assert which_hint(claim, "your speculative output differs at token 3")[0] == 2, \
        "a written function that fails a whole decoding misses a step: hint 2"
    assert which_hint(claim, "raised NotImplementedError")[0] == 1, "an unwritten function wants the idea"


@pytest.mark.parametrize("mistake,claim", [
    ("greedy_verify: two 0-d tensors where ints are due",
     cg.claim_greedy_verify_keeps_the_agreed_prefix_and_the_targets_next_token),
    ("greedy_walk: a numpy array instead of a LongTensor",
     cw.claim_walk_takes_the_best_candidate_after_the_one_before),
    ("accept_path: greedy, the bonus returned as a 0-d tensor",
     ctree.claim_accept_path_follows_the_targets_token_down_the_tree),
])
def test_a_value_of_another_kind_than_the_contract_states_points_to_the_contract(tmp_path, mistake, claim):
    from nanodflash.exercises.hints import which_hint
    name, source, _ = WRONG[mistake]
    path = write(tmp_path, source)
    student = Student(name, load_function(path, name, BY_NAME[name].original()), BY_NAME[name].original())
    message = run_claim(claim, student, path)
    level, why = which_hint(claim.__doc__, message)
    assert level is None and "contract" in why, \
        f"{mistake}: the contract states the kind of value, not a hint's steps; pointed to {level}: {why}"


@pytest.mark.parametrize("mistake,step", [
    ("greedy_verify: index tensors made on the CPU, whatever the logits' device", "on target_logits.device"),
    ("greedy_verify: the top token from a descending sort, ties in its own order", "argmax of each row"),
    ("probs_from_logits: the nucleus ranked by a sort that orders ties its own way", "the lower id first"),
    ("accept_path: the greedy token from a float32 copy of the logits", "the argmax of the logits as given"),
    ("accept_path: greedy draws too, from a one-hot p", "drawing nothing"),
    ("multi_draft_verify: every draft rejected, the last residual's residual", "from the last r"),
    ("greedy_walk: a tie to the higher candidate index (the last of an ascending argsort)",
     "a tie: the lower index"),
])
def test_the_hint_a_failure_points_to_states_the_step_it_misses(mistake, step):
    """These mistakes fail a claim on what the function computes (a Failed, not a BrokenContract), and
    which_hint names hint 2 for it: hint 2 must then state the step."""
    from nanodflash.exercises.hints import hint
    name = WRONG[mistake][0]
    assert step in " ".join(hint(BY_NAME[name], 2).split()), f"{name}'s hint 2 does not say {step!r}"


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(StudentFileError, match="start greedy_verify"):
        load_function(str(tmp_path / "none.py"), "greedy_verify", BY_NAME["greedy_verify"].original())


def test_a_default_other_than_the_librarys_is_refused_by_name(tmp_path):
    """The decoders call probs_from_logits without top_k and top_p: a student's own defaults (a common
    library's top_k=50, top_p=0.9) would silently change the drafter's q."""
    path = tmp_path / "probs_from_logits.py"
    path.write_text("def probs_from_logits(logits, temperature=1, top_k=50, top_p=None):\n"
                    "    return logits\n")
    with pytest.raises(StudentFileError, match="top_k defaults to 50, the library's to None"):
        load_function(str(path), "probs_from_logits", BY_NAME["probs_from_logits"].original())


def test_the_swap_reaches_every_module_that_imported_the_function_and_is_undone_after():
    import nanodflash.ext.batch as batch
    import nanodflash.speculative as speculative
    import nanodflash.verify as verify
    from nanodflash.exercises.swap import swapped

    original = verify.greedy_verify

    def mine(draft_tokens, target_logits):
        return 0, 0

    with swapped(original, mine):
        held = [verify.greedy_verify, speculative.greedy_verify, batch.greedy_verify]
        assert all(f is mine for f in held), \
            "a module that imported greedy_verify by name still holds the original"
    after = [verify.greedy_verify, speculative.greedy_verify, batch.greedy_verify]
    assert all(f is original for f in after), "the library's function must be put back after a check"


def test_the_references_never_run_the_students_code():
    import torch

    from nanodflash.exercises.models import soft_pair
    from nanodflash.exercises.oracle import exact_distribution
    from nanodflash.exercises.swap import swapped
    from nanodflash.sampling import probs_from_logits

    target = soft_pair()[0]
    before = exact_distribution(target, 0.7, None, 0.8)
    with swapped(probs_from_logits, lambda logits, temperature=1.0, top_k=None, top_p=None:
                 torch.full_like(logits, 1.0 / logits.size(-1), dtype=torch.float64)):
        during = exact_distribution(target, 0.7, None, 0.8)
    assert during == before, "the exact distribution changed with a student's probs_from_logits swapped in"


def test_a_claim_that_runs_past_its_time_limit_fails_with_a_clear_message():
    import time

    from nanodflash.exercises.check import Student, run_claim

    def endless(student):
        """never ends"""
        while True:
            time.sleep(0.01)

    message = run_claim(endless, Student("greedy_verify", None, None), seconds=0.5)
    assert message is not None and "took longer than 0.5 s" in message, message


def test_a_claim_that_times_out_ends_the_check_and_says_what_was_not_run():
    import dataclasses
    import io
    import time

    def endless(student):
        """never ends"""
        while True:
            time.sleep(0.01)

    ran = []

    def after(student):
        """would call the same endless function again"""
        ran.append(True)

    exercise = dataclasses.replace(BY_NAME["tree_mask"], claims=(endless, after, after))
    out = io.StringIO()
    results = run_checks(exercise, BY_NAME["tree_mask"].original(), out=out, seconds=0.3)
    assert len(results) == 1 and not ran, "the claims after a time-out must not run"
    assert "(2 not run after the time-out)" in out.getvalue(), out.getvalue()


def test_a_check_whose_last_claim_holds_after_an_earlier_failure_prints_its_summary():
    import dataclasses
    import io

    def fails(student):
        """fails"""
        raise Failed("wrong on purpose")

    def holds(student):
        """holds"""

    exercise = dataclasses.replace(BY_NAME["tree_mask"], claims=(fails, holds))
    out = io.StringIO()
    run_checks(exercise, BY_NAME["tree_mask"].original(), out=out)
    assert "1 of 2 claims failed" in out.getvalue(), out.getvalue()


def test_every_exercise_names_a_section_heading_that_exists_in_a_notebook():
    import json
    import re
    from pathlib import Path

    headings = set()
    for path in (Path(__file__).parents[1] / "notebooks").glob("[0-9]*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                headings |= {line.lstrip("#").strip() for line in "".join(cell["source"]).splitlines()
                             if line.startswith("#")}
    for e in EXERCISES:
        section = re.search(r"'(.+)'", e.notebook).group(1)
        assert section in headings, f"{e.name}: the section {section!r} is no heading of any notebook"


def test_the_sampled_block_claims_emit_the_bonus_after_a_fully_accepted_block():
    target, drafter = soft_pair()
    for verifier in ("rejection", "match"):
        for setting in SAMPLED:
            full = batched_counts(target, drafter, verifier, *setting, block_size=min(BLOCKS), n=200)[2]
            assert full > 20, f"{verifier} at {setting}: the bonus after a full block of {min(BLOCKS)} was " \
                              f"drawn {full} times in 200 runs; the claims would hardly test it"
        full = batched_counts(target, drafter, verifier, *SAMPLED[0], block_size=H, n=200)[2]
        assert full == 0, f"{verifier}: a block of {H} cannot emit that bonus within {H} tokens, yet " \
                          f"{full} were counted: the count is wrong"
