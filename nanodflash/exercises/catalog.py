"""The exercises: which library function a student writes, where it is taught, and the claims it must meet.

Each exercise is the library's own function: `check` swaps the student's version in wherever the library
holds it, so the decoders run it. A skeleton is written from the function's real signature and its contract
(hints.py: what goes in and out and what it guarantees, not how); the steps are hint 2, asked for.
"""

import importlib
import inspect
import textwrap
from dataclasses import dataclass

from . import claims_block as cb
from . import claims_greedy as cg
from . import claims_sampling as cs
from . import claims_train as ct
from . import claims_tree as ctree
from . import claims_verify as cv
from . import claims_walk as cw
from .hints import CONTRACTS


@dataclass
class Exercise:
    name: str              # the library's function
    module: str            # where it lives
    notebook: str          # the notebook and section that teach it
    minutes: int           # a fair time for a first attempt
    what: str              # what you write, in one line
    todo: str              # hint 2: the steps, not the code (hints.py holds hints 1 and 3)
    claims: tuple          # claim functions (claims_*.py)
    imports: str = "import torch"   # the skeleton's imports

    def original(self):
        return getattr(importlib.import_module(self.module), self.name)


EXERCISES = [
    Exercise("greedy_verify", "nanodflash.verify", "one speculative step: 'Steps 2–5: draft, verify, "
             "accept, roll back'", 15, "keep the drafts the target agrees with, and the target's next token",
             "argmax of each row of target_logits; count the leading drafts equal to it; the bonus is the "
             "argmax of the row right after them. With R blocks at once, the same for each row (a loop is "
             "fine), where a padding -1 equals no token; make any tensor you build on target_logits.device.",
             (cg.claim_greedy_verify_keeps_the_agreed_prefix_and_the_targets_next_token,
              cg.claim_greedy_verify_breaks_a_tie_as_plain_greedy_decoding,
              cg.claim_batched_greedy_decoding_with_it_equals_greedy_decoding,
              cg.claim_greedy_verify_makes_its_tensors_on_the_logits_device,
              cg.claim_greedy_speculative_equals_greedy_decoding)),
    Exercise("match_verify", "nanodflash.verify", "why lossless: 'Sampling: the argument'", 15,
             "sampling, drafts from the drafter's argmax: keep d_i while the target's own sample equals it",
             "draw one token y_i from each row of target_probs with the generator you are given "
             "(nanodflash.sampling.sample takes it); keep draft i while d_i == y_i; the token after the kept "
             "drafts is y at the first mismatch.",
             (cb.claim_sampled_rules_draw_only_from_their_generator,
              cv.claim_match_keeps_every_draft_the_target_is_sure_of,
              cv.claim_match_keeps_a_draft_as_often_as_the_target_draws_it,
              cv.claim_match_draws_from_the_whole_vocabulary,
              cb.claim_match_step_emits_each_rows_distribution,
              cv.claim_match_decoding_has_exactly_the_targets_distribution),
             "import torch\n\nfrom nanodflash.sampling import sample"),
    Exercise("rejection_verify", "nanodflash.verify",
             "why lossless: 'A whole toy generation, sampled with the library's verifiers'", 30,
             "sampling, drafts drawn from q: keep as many as possible, exactly the target's distribution",
             "every draw from the generator you are given: one uniform u_i per draft; accept draft i while "
             "u_i < p_i(d_i) / q_i(d_i); at the first rejection draw from residual_distribution(p_i, q_i); "
             "when all are kept, draw the bonus from the last row of target_probs.",
             (cb.claim_sampled_rules_draw_only_from_their_generator,
              cv.claim_rejection_accepts_every_draft_when_q_equals_p,
              cv.claim_rejection_keeps_only_the_drafts_before_the_first_rejection,
              cv.claim_rejection_keeps_a_draft_as_often_as_the_rule_must,
              cv.claim_rejection_draws_from_the_whole_vocabulary,
              cb.claim_rejection_step_emits_each_rows_distribution,
              cv.claim_rejection_decoding_has_exactly_the_targets_distribution),
             "import torch\n\nfrom nanodflash.sampling import sample\nfrom nanodflash.verify import "
             "residual_distribution"),
    Exercise("residual_distribution", "nanodflash.verify",
             "why lossless: 'One position, computed exactly'", 10,
             "the distribution a rejected draft is replaced from",
             "take, token by token, what p has beyond q (nothing where q has more); scale each row to sum "
             "to 1; where nothing is left (p equals q), the row is p's own.",
             (cv.claim_residual_is_the_normalized_positive_part_of_p_minus_q,
              cv.claim_rejection_decoding_has_exactly_the_targets_distribution)),
    Exercise("probs_from_logits", "nanodflash.sampling", "why lossless: 'The real models, sampling'", 25,
             "logits to the distribution plain sampling draws from: temperature, then top-k, then top-p",
             "T = 0: one-hot on the argmax. Else divide by T; keep the top_k largest logits (-inf "
             "elsewhere; all of them when top_k >= V); softmax; keep the smallest set of most likely tokens "
             "whose mass reaches top_p (of equal ones, the lower id first); renormalise. Work along the "
             "last dimension, in float64, leaving the logits you are given as they were.",
             (cs.claim_probs_agree_with_a_plain_reference,
              cs.claim_probs_stay_finite_for_large_logits_at_a_low_temperature,
              cs.claim_probs_work_on_a_batch_of_rows, cs.claim_sampled_decoding_stays_exact_with_it)),
    Exercise("training_mask", "nanodflash.drafter", "the drafter: 'Training: many anchors, one pass'", 20,
             "what each training block may see: context before its anchor, and its own slots",
             "build (N, K*B, S) 'context position j < the block's anchor' and (K*B, K*B) 'same block', "
             "broadcast, and concatenate along the last dimension; make every tensor on anchors.device.",
             (ct.claim_training_mask_equals_the_plain_loop_reference,
              ct.claim_training_mask_is_made_on_the_anchors_device)),
    Exercise("loss_decay_weights", "nanodflash.loss",
             "training what matters: '1. Loss-decay weights'", 10,
             "the paper's loss weight per slot: early slots matter most",
             "one weight per slot 0..B-1: slot 0, the anchor, weighs 0; from slot 1 on the weights fall "
             "exponentially, 1 at slot 1 and a factor e lower every gamma slots; gamma None is the paper's "
             "value for the block size: 7 for B=16, 5 for 10, 4 for 8, else max(1, B/2).",
             (ct.claim_decay_weights_follow_the_papers_formula,)),
    Exercise("tree_mask", "nanodflash.ext.tree", "trees: '2. The tree mask'", 10,
             "which tree nodes each node may attend to in the verify pass",
             "parent[i] is node i's parent (-1 for the root; parents come before their children): start "
             "from a mask where every node sees only itself, then go through the nodes in order and give "
             "each one everything its parent already sees (an (N+1, N+1) bool tensor).",
             (ctree.claim_tree_mask_lets_each_node_see_exactly_its_ancestors,
              ctree.claim_greedy_tree_decoding_equals_greedy_decoding)),
    Exercise("accept_path", "nanodflash.ext.tree",
             "trees: '3. Verify in one pass, and the path the target took'",
             25, "walk down the tree while the target's token is a child",
             "at each node take y = the target's token as an int (greedy: the argmax of the logits as given, "
             "drawing nothing; else a draw with the generator from probs_from_logits at the temperature); go "
             "to the child whose token is y (tree.children[node]); stop when there is none and return (the "
             "nodes walked, root first; y). The logits come on the target's device: .cpu() them first.",
             (cb.claim_sampled_rules_draw_only_from_their_generator,
              cb.claim_greedy_accept_path_draws_nothing,
              ctree.claim_accept_path_takes_the_logits_on_the_targets_device,
              ctree.claim_accept_path_follows_the_targets_token_down_the_tree,
              ctree.claim_accept_path_emits_each_nodes_distribution,
              ctree.claim_greedy_tree_decoding_equals_greedy_decoding,
              ctree.claim_sampled_tree_decoding_with_it_has_exactly_the_targets_distribution),
             "import torch\n\nfrom nanodflash.sampling import probs_from_logits, sample"),
    Exercise("keep_path", "nanodflash.ext.tree",
             "trees: '3. Verify in one pass, and the path the target took'", 15,
             "after a tree pass, move the kept nodes' keys/values into place and drop the rest",
             "node i of the tree sits at position start + i; copy the keys and values of the path's nodes to "
             "start, start + 1, ... (cache.k and cache.v are (L, 1, H, max_len, hd)), then cache.crop.",
             (ctree.claim_keep_path_leaves_the_cache_of_a_fresh_prefill,
              ctree.claim_greedy_tree_decoding_equals_greedy_decoding)),
    Exercise("greedy_walk", "nanodflash.dflash2",
             "DFlash 2, the selector: '4. The selector's walk, step by step'", 20,
             "DFlash 2's greedy walk through the candidates, one predecessor at a time",
             "start at row 0 of table[0] (after the anchor); at slot t take the candidate with the best "
             "score (a tie: the lower index) in the row of the candidate chosen at slot t-1; return the "
             "chosen tokens. With R blocks at once, the same walk for each row (a loop over the rows is "
             "fine). Tensors come on the drafter's device: .cpu() before any .numpy().",
             (cw.claim_walk_takes_the_best_candidate_after_the_one_before,
              cw.claim_walk_takes_each_row_of_a_batch_on_its_own,
              cw.claim_walk_takes_tensors_on_the_drafters_device,
              cw.claim_dflash2_greedy_decoding_with_it_equals_greedy_decoding,
              cw.claim_batched_dflash2_decoding_with_it_equals_greedy_decoding),
             "import numpy as np\nimport torch"),
    Exercise("multi_draft_verify", "nanodflash.verify", "why lossless: 'Winning acceptance back: a flatter "
             "q, and several drafts for one slot'", 30,
             "several drafts for one position, tested one after another (recursive rejection)",
             "keep a distribution r, p at first; test the drafts in their order, each with its own uniform "
             "from the generator, against r(d) / q(d); a rejected draft, a repeat too, turns r into its "
             "residual against q before the next test; accepted: its position in draft_tokens and its "
             "token; none accepted: -1 and a draw, from the generator too, from the last r.",
             (cb.claim_sampled_rules_draw_only_from_their_generator,
              cb.claim_multi_draft_tests_the_drafts_in_the_order_given,
              cb.claim_multi_draft_with_every_draft_rejected_emits_the_last_residual,
              cb.claim_multi_draft_accepts_more_with_more_drafts,
              cb.claim_multi_draft_after_a_rejection_emits_the_residual, cb.claim_multi_draft_emits_exactly_p,
              ctree.claim_sampled_tree_decoding_has_exactly_the_targets_distribution),
             "import torch\n\nfrom nanodflash.sampling import sample\nfrom nanodflash.verify import "
             "residual_distribution"),
]
BY_NAME = {e.name: e for e in EXERCISES}


def skeleton(exercise):
    """The starting file: imports, the real signature, the contract (what, not how), a TODO that says where
    the hints are, and NotImplementedError."""
    fn = exercise.original()
    contract = textwrap.dedent(CONTRACTS[exercise.name]).strip()
    body = "\n".join(("    " + line).rstrip() for line in contract.splitlines())
    header = (f'"""Exercise {exercise.name}: {exercise.what}.\n\nTaught in: {exercise.notebook}.\n'
              f'Check it with: python -m nanodflash.exercises check {exercise.name} THIS_FILE\n"""\n')
    signature = f"def {exercise.name}{inspect.signature(fn)}:"
    todo = (f"    # TODO: write it. Stuck? python -m nanodflash.exercises hint {exercise.name} 1 (the "
            f"idea),\n    # then 2 (the steps), then 3 (the code)\n")
    return (f'{header}\n{exercise.imports}\n\n\n{signature}\n    """\n{body}\n    """\n{todo}'
            f'    raise NotImplementedError\n')
