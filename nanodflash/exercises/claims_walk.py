"""The claims of DFlash 2's greedy walk (greedy_walk): the best candidate after the one before, row by row
of a batch, on the drafter's device, and DFlash 2 decoding with it equal to plain greedy decoding."""

import torch

from ..dflash2 import CandidateSelector
from ..ext.batch import speculative_generate_batch
from ..speculative import speculative_generate
from .check import BrokenContract, Failed
from .claims_greedy import PROMPTS
from .models import tiny_dflash2, tiny_target
from .oracle import reference_walk


def walk_cases():
    """Selectors whose pair term changes choices (a fresh one scores only the drafter's logits)."""
    for seed in range(4):
        torch.manual_seed(seed)
        sel = CandidateSelector(vocab_size=50, dim=12, rank=6, top_k=5).double()
        with torch.no_grad():
            sel.successor_codebook.weight.normal_(std=2.0)
            sel.hidden_projection.weight.normal_(std=1.0)
        hidden, logits = torch.randn(9, 12, dtype=torch.float64), torch.randn(9, 50, dtype=torch.float64)
        yield sel, hidden, logits


def claim_walk_takes_the_best_candidate_after_the_one_before(student):
    """at each slot takes the best candidate after the one chosen at the slot before (of equal scores, the
    lower index)"""
    for sel, hidden, logits in walk_cases():
        with torch.no_grad():                                # as the decoders call it
            cand, table = sel.transition_table(hidden, logits, anchor=7)
        want = reference_walk(sel, hidden, logits, 7)
        got = student.fn(cand, table)
        if not isinstance(got, torch.Tensor) or got.dtype != torch.long:
            raise BrokenContract(f"it must return a LongTensor of tokens (the decoders index and concatenate "
                                 f"with it); yours is {type(got).__name__} of {getattr(got, 'dtype', '?')}")
        got = got.tolist()
        if got != want:
            t = next(t for t, (a, b) in enumerate(zip(got, want + [None] * len(got))) if a != b)
            row = 0 if t == 0 else cand[t - 1].tolist().index(want[t - 1])
            raise Failed(f"slot {t + 1}: yours {got[t]}, the walk's {want[t]}, the best candidate after "
                         f"{'the anchor' if t == 0 else want[t - 1]} (row {row} of table[{t}]). "
                         + walk_fault(cand, table, got))
    for cand, table, want, ties in tied_tables():
        got = student.fn(cand, table)
        got = got.tolist() if isinstance(got, torch.Tensor) else got
        if got != want and any(got == walk_from(cand, table, r) for r in range(1, cand.size(1))):
            raise Failed(f"on a table with ties ({ties}) yours drafts {got}, the walk {want}: yours starts "
                         "from another row of table[0] than row 0; slot 1 reads row 0, the scores after the "
                         "anchor")
        if got != want:
            raise Failed(f"on a table with ties ({ties}) yours drafts {got}, the walk {want}: a tie goes to "
                         "the lower candidate index, the first maximum (as argmax takes it; torch.topk and "
                         "sorts order ties their own way once a row is long), or DFlash 2 drafts other "
                         "tokens than the library's")
    near_tie_walk(student)


def walk_from(cand, table, row=0, column=False):
    """The greedy walk's tokens, its first slot read from `row` of table[0] (the walk's: row 0); column:
    each slot read from the column of the candidate before, as a walk that swaps table[t][i][j]'s indices
    does."""
    i, tokens = row, []
    for t in range(cand.size(0)):
        i = int((table[t, :, i] if column else table[t, i]).argmax())
        tokens.append(int(cand[t, i]))
    return tokens


def walk_fault(cand, table, got):
    """What a wrong walk did, where it is one a student writes: the predecessor's column read for its row."""
    if got == walk_from(cand, table, column=True):
        return ("Yours follows table[t][:, i], a column: row i, table[t][i], holds the scores after "
                "candidate i (table[t][i][j]: candidate j after candidate i).")
    return ("Take each slot's best candidate given the one chosen before it, not the best of the slot on its "
            "own.")


def near_tie_walk(student):
    """Two slots of three candidates whose best scores are 1e-9 above the next, in float64."""
    table = torch.zeros(2, 3, 3, dtype=torch.float64)
    table[0, 0] = torch.tensor([1.0, 3.0, 3.0 + 1e-9], dtype=torch.float64)    # after the anchor: 2, by 1e-9
    table[1, 2] = torch.tensor([5.0, 5.0 + 1e-9, 0.0], dtype=torch.float64)    # after 2: candidate 1, by 1e-9
    cand = torch.tensor([[11, 12, 13], [21, 22, 23]])
    got, want = student.fn(cand, table), walk_from(cand, table)                 # want: [13, 22]
    got = got.tolist() if isinstance(got, torch.Tensor) else got
    if got != want:
        raise Failed(f"on a float64 table whose best scores lead the next by 1e-9 yours drafts {got}, the "
                     f"walk {want}: compare the scores as they come (a float32 cast rounds them into a tie, "
                     "and a tie goes to the lower index), or DFlash 2 drafts other tokens than the library's")


def tied_tables():
    """(cand, table, the walk's tokens, where the ties are) for two slots with ties: 3 candidates a slot,
    and the drafter's 16."""
    small = torch.zeros(2, 3, 3, dtype=torch.float64)
    small[0, 0] = torch.tensor([1.0, 3.0, 3.0])               # after the anchor, candidates 1 and 2 tie
    small[1, 1] = torch.tensor([5.0, 0.0, 5.0])               # after candidate 1, candidates 0 and 2 tie
    large = torch.zeros(2, 16, 16, dtype=torch.float64)       # after candidate 5: all 16 tie at 0
    large[0, 0, [5, 11]] = 3.0                                 # after the anchor, candidates 5 and 11 tie
    return [(torch.tensor([[11, 12, 13], [21, 22, 23]]), small, [12, 21],
             "after the anchor candidates 1 and 2 score 3, after candidate 1 candidates 0 and 2 score 5"),
            (torch.arange(100, 132).view(2, 16), large, [105, 116],
             "16 candidates a slot: after the anchor candidates 5 and 11 score 3, after candidate 5 all 16 "
             "score 0")]


def claim_walk_takes_each_row_of_a_batch_on_its_own(student):
    """R blocks at once, (R, n, K) and (R, n, K, K): each row walks as it would alone"""
    with torch.no_grad():                                    # as the decoders call it
        cases = [sel.transition_table(hidden, logits, anchor=7) for sel, hidden, logits in walk_cases()]
    cand, table = torch.stack([c for c, _ in cases]), torch.stack([t for _, t in cases])   # (R, n, K), ...
    want = [reference_walk(sel, hidden, logits, 7) for sel, hidden, logits in walk_cases()]
    got = student.fn(cand, table)
    got = got.tolist() if isinstance(got, torch.Tensor) else [list(row) for row in got]
    if len(got) != len(want):
        raise BrokenContract(f"for {len(want)} blocks at once it must return {len(want)} rows of tokens; "
                             f"yours has {len(got)}")
    for r, (mine, walk) in enumerate(zip(got, want)):
        if mine != walk:
            raise Failed(f"row {r} of a batch of {len(want)} blocks: yours {mine}, its own walk {walk}. The "
                         "decoders walk every row of a batch at once: each row's walk uses its own table "
                         "only (work along the leading dimensions)")


def claim_dflash2_greedy_decoding_with_it_equals_greedy_decoding(student):
    """DFlash 2 greedy decoding with it is token-identical to plain greedy decoding, drafting the library's
    tokens"""
    target = tiny_target()
    drafter = tiny_dflash2(target, block_size=8, perturb=0.5)
    for i, prompt in enumerate(PROMPTS):
        want, stats = speculative_generate(target, drafter, prompt, 40)
        with student.installed():
            got, mine = speculative_generate(target, drafter, prompt, 40)
        if got != want:
            raise Failed(f"DFlash 2 greedy decoding with your walk differs from plain greedy decoding on "
                         f"prompt {i}")
        if mine.acceptance_lengths != stats.acceptance_lengths:
            raise Failed(f"lossless, but your walk drafts other tokens than the library's on prompt {i}: "
                         f"acceptance lengths {mine.acceptance_lengths[:8]}... for "
                         f"{stats.acceptance_lengths[:8]}...")


def claim_walk_takes_tensors_on_the_drafters_device(student):
    """takes cand and table on the drafter's device, as the decoders pass them (the meta device, shapes
    without data, stands in for a GPU): what it hands to numpy it moves to the CPU first"""
    cand, table = torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 3, 3, dtype=torch.float64)
    for moved in ("cand and table", "cand", "table"):    # each alone too: a .cpu() of one raises first
        args = [x.to("meta") if name in moved.split(" and ") else x
                for name, x in (("cand", cand), ("table", table))]
        try:
            student.fn(*args)
        except Exception as e:              # .cpu() of a meta tensor raises too: there a GPU would copy
            if "numpy" in str(e):
                raise Failed(f"with {moved} on another device ('meta' here, as a GPU's would be) it raised: "
                             f"{str(e).rstrip('.!')}. The decoders pass the drafter's tensors: .cpu() before "
                             ".numpy() (on the CPU it costs nothing)") from None


def claim_batched_dflash2_decoding_with_it_equals_greedy_decoding(student):
    """the batched decoder (one row, and three) with it gives each row plain greedy decoding's tokens"""
    target = tiny_target()
    drafter = tiny_dflash2(target, block_size=8, perturb=0.5)
    for prompts in (PROMPTS[:1], PROMPTS):
        want, _ = speculative_generate_batch(target, drafter, prompts, 24, block_size=4)
        try:
            with student.installed():
                got, _ = speculative_generate_batch(target, drafter, prompts, 24, block_size=4)
        except (IndexError, RuntimeError, ValueError) as e:
            raise Failed(f"the batched decoder failed with your walk on {len(prompts)} row(s): "
                         f"{type(e).__name__}: {str(e).rstrip('.')}. It calls the walk with (R, n, K) and "
                         "(R, n, K, K) and reads (R, n) back, for R = 1 too: keep the leading dimension (no "
                         "squeeze)") from None
        if got != want:
            raise Failed(f"the batched decoder with your walk, {len(prompts)} row(s): not plain greedy "
                         "decoding's tokens")
