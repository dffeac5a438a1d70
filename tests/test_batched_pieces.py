"""The batched decoder has no math of its own: DFlash 2's walk and the greedy rule take R blocks at once
and give, row for row, what they give for one block alone (batch.py calls them; test_batch.py checks its
output)."""

import torch

from nanodflash.dflash2 import CandidateSelector, greedy_walk
from nanodflash.verify import greedy_verify

# A hand-made table (docstring of greedy_walk): 2 slots, K = 2 candidates each
CAND = torch.tensor([[10, 11], [20, 21]])                       # (n, K) candidate ids
TABLE = torch.tensor([[[1.0, 3.0], [1.0, 3.0]],     # slot 1, after the anchor (every row the same)
                      [[5.0, 0.0], [0.0, 1.0]]])    # slot 2: row i = after slot 1's candidate i


def test_the_greedy_walk_takes_the_best_candidate_after_the_one_it_chose():
    assert greedy_walk(CAND, TABLE).tolist() == [11, 21], \
        "slot 1's best is candidate 1 (score 3); after it, slot 2's row 1 prefers candidate 1 (score 1)"


def test_a_walk_that_forgets_its_predecessor_is_told_apart():
    forgetful = [int(CAND[t, TABLE[t, 0].argmax()]) for t in range(2)]    # always row 0: the anchor's row
    assert forgetful != greedy_walk(CAND, TABLE).tolist(), "the table must tell the two walks apart"


def selector_inputs(R=5, n=7, D=12, V=40, seed=0):
    torch.manual_seed(seed)
    sel = CandidateSelector(V, D, rank=6, top_k=4)
    torch.nn.init.normal_(sel.successor_codebook.weight)       # a trained-looking selector, not the identity
    return sel, torch.randn(R, n, D), torch.randn(R, n, V), torch.randint(0, V, (R,))


@torch.no_grad()
def test_the_transition_table_of_r_blocks_is_each_blocks_own_table():
    sel, hidden, logits, anchors = selector_inputs()
    cand, table = sel.transition_table(hidden, logits, anchors)                  # (R, n, K), (R, n, K, K)
    for r in range(len(anchors)):
        c, t = sel.transition_table(hidden[r], logits[r], int(anchors[r]))
        assert torch.equal(cand[r], c), f"block {r}: the batched candidates differ from the block's own"
        assert torch.allclose(table[r], t, atol=1e-6), f"block {r}: the batched table differs from its own"


@torch.no_grad()
def test_the_greedy_walk_of_r_blocks_is_each_blocks_own_walk():
    sel, hidden, logits, anchors = selector_inputs(seed=1)
    walks = greedy_walk(*sel.transition_table(hidden, logits, anchors))          # (R, n)
    for r in range(len(anchors)):
        alone = greedy_walk(*sel.transition_table(hidden[r], logits[r], int(anchors[r])))
        assert walks[r].tolist() == alone.tolist(), f"block {r}: the batched walk differs from its own"
    assert not torch.equal(walks, logits.topk(4, -1).indices[..., 0]), \
        "with a non-zero successor codebook the walk should differ somewhere from each slot's argmax"


def test_greedy_verify_of_r_padded_rows_is_each_rows_own_verify():
    torch.manual_seed(2)
    logits = torch.randn(4, 6, 30)                                               # (R, n+1, V)
    pred = logits.argmax(-1)
    drafts = [pred[0, :5], pred[1, :2], torch.tensor([(pred[2, 0] + 1) % 30, 0, 0]),
              torch.cat([pred[3, :3], (pred[3, 3:4] + 1) % 30, pred[3, 4:5]])]  # all, short, none, 3 of 5
    padded = torch.full((4, 5), -1)
    for r, d in enumerate(drafts):
        padded[r, : d.numel()] = d
    n_acc, bonus = greedy_verify(padded, logits)
    for r, d in enumerate(drafts):
        alone = greedy_verify(d, logits[r, : d.numel() + 1])
        batched = (int(n_acc[r]), int(bonus[r]))
        assert batched == alone, f"row {r}: batched (n_accepted, bonus) {batched}, alone {alone}"
    assert n_acc.tolist() == [5, 2, 0, 3], "the rows were built to accept 5, 2, 0 and 3 drafts"
