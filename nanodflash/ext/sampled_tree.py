"""Trees for sampling: several drafts per node, drawn from the drafter's q, verified by recursive rejection.

    tokens, stats = tree_speculative_generate(target, drafter, prompt_ids, n, tree_nodes=16, temperature=0.7,
                                              top_p=0.95, draws=SampledDraws())

When sampling, a top-K tree (tree.py) keeps the drafter's most likely children of each node and moves to
child c when the target's own draw y equals c: it goes on with probability p(children), the target's mass
on the children it happens to have. A path of drafts SAMPLED from the drafter's q and tested by rejection
goes on with sum min(p, q) at every slot, wherever p's mass lies, which is why the sampled path beats top-K
trees when sampling (docs/sampling.md). This tree keeps the sampled drafts and adds width:

1. Drafting (`sample_tree`): a node's children are independent draws from the drafter's q at the next
   slot, given the node's token: the same q the sampled path draws from (the drafter's
   `draft_distribution`). Equal draws share one child node. Nodes are expanded best first by their path's
   probability under q (were q the target's p, the chance that decoding walks through them), a node at
   depth d making `widths[d]` draws (1 past the tuple's end), until the tree holds `tree_nodes` draft nodes
   (equal draws share a node, so a tree may hold more draws than nodes).
2. Verification: one target pass over the whole tree, as for any tree (tree.verify_tree).
3. Acceptance (`accept_sampled`): from the root, a node's draws go in order through
   verify.multi_draft_verify against the target's p at that node; an accepted draw moves the walk to its
   child, and when every draw is rejected the residual's token is the bonus.

Why the output is exact: at the node the walk is at, its draws are independent draws of q, made before the
target ran and independent of the uniforms that led the walk there; how many draws a node makes depends on
draws elsewhere in the tree (the node budget), never on its own. So each step is multi_draft_verify's exact
test, and every emitted token is a draw from p after the tokens before it.
"""

import heapq
from dataclasses import dataclass, field

import torch

from ..sampling import probs_from_logits, sample
from ..verify import multi_draft_verify
from .tree import Tree

# draws per node by the node's depth (the anchor is depth 0): width near the root, where every later slot
# depends on the walk going on; 1 past the end (a sampled path)
WIDTHS = (2, 2)


@dataclass
class SampledTree(Tree):
    draws: list = field(default_factory=list)   # (N+1,) per node: its draws in order, as child node ids
    q: list = field(default_factory=list)       # (N+1,) per node: the q its draws came from ((V,), or None)

    @classmethod
    def root_fields(cls):
        return dict(draws=[[]], q=[None])             # the root's draws (none yet) and its q (not drawn yet)


def sample_tree(q_at, anchor, n_draft, tree_nodes, widths=WIDTHS, generator=None):
    """Best first by path probability under q: the node that scores best makes its draws (its children),
    until the tree holds tree_nodes draft nodes. q_at(t, prev) -> (V,) from the drafter's
    `draft_distribution` (drafter.py)."""
    tree = SampledTree.root(anchor)
    heap = [(-0.0, 0)] if n_draft and tree_nodes else []                         # (-path log q, node)
    while heap and len(tree) <= tree_nodes:
        _, node = heapq.heappop(heap)
        d = tree.depth[node]
        k = min(widths[d] if d < len(widths) else 1, tree_nodes + 1 - len(tree))   # never past the budget
        q = q_at(d, tree.tokens[node])                                           # (V,)
        tree.q[node] = q
        for token in sample(q.expand(k, -1), generator).tolist():                # k independent draws
            child = tree.children[node].get(token)
            if child is None:                                                    # a new child node
                child = tree.add(node, token, tree.score[node] + float(q[token].log()), draws=[], q=None)
                if d + 1 < n_draft:
                    heapq.heappush(heap, (-tree.score[child], child))
            tree.draws[node].append(child)
    return tree


def accept_sampled(tree, logits, temperature, top_k=None, top_p=None, generator=None):
    """Walk down from the root: the node's draws through multi_draft_verify against p at the node; go to the
    accepted draw's child, or stop with the residual's token.
    -> (accepted path: nodes from the root, bonus)."""
    p = probs_from_logits(logits.detach().cpu(), temperature, top_k, top_p)     # (N+1, V)
    node, path = 0, [0]
    while True:
        draws = tree.draws[node]
        if not draws:                                                            # a leaf: the bonus is p's
            return path, int(sample(p[node], generator))
        tokens = torch.tensor([tree.tokens[c] for c in draws])
        i, token = multi_draft_verify(tokens, tree.q[node], p[node], generator)
        if i < 0:
            return path, token
        node = draws[i]
        path.append(node)


class SampledDraws:
    """The drafting and acceptance of sampled trees, for tree.tree_speculative_generate(draws=...)."""

    def __init__(self, widths=WIDTHS):
        if not widths or any(int(w) != w or w < 1 for w in widths):
            raise ValueError(f"widths must be positive integers (draws per node by depth), got {widths!r}")
        self.widths = tuple(int(w) for w in widths)

    def draft(self, drafter, dcache, anchor, n_draft, tree_nodes, temperature, generator):
        q_at = drafter.draft_distribution(dcache, anchor, n_draft, temperature)
        return sample_tree(q_at, anchor, n_draft, tree_nodes, self.widths, generator)

    def accept(self, tree, logits, temperature, top_k, top_p, generator):
        return accept_sampled(tree, logits, temperature, top_k, top_p, generator)
