"""Tree verification: draft a TREE of candidates in one drafter pass, verify all of it in one target pass.

    tokens, stats = tree_speculative_generate(target, drafter, prompt_ids, max_new_tokens, tree_nodes=32, ...)

A DFlash step verifies one path of B-1 drafts. But the drafter's single pass already scores the top-K
candidates of every slot, and DFlash 2's selector even scores every candidate after every candidate of the
slot before (the (n, K, K) transition table). A tree spends the same one target pass on many paths at once:

    anchor ── the ── cat ── sat          node:   0    1    2    3    4    5    6
          │      └─ dog                  token:  anc  the  cat  a    sat  dog  cat
          └─ a ─── cat                   parent: -    0    1    0    2    1    3
                                         depth:  0    1    2    1    3    2    2

1. Drafting (`draft_tree`): slot t's children of a node are slot t's top-K candidates, scored by
   log-softmax of the selector's transition row after that node's token (DFlash 2), or of the slot's own
   logits, the same for every parent (DFlash 1), the scores divided by `tree_temperature` first. A path's
   score is the sum along it (it ranks paths; it is not the drafter's probability of the text), and the
   tree keeps the `tree_nodes` best path prefixes, found best-first. Those form a tree (a prefix never
   scores below its extensions), the one of largest expected accepted length if the scores were
   calibrated. One child per node and tree_nodes = B-1 give exactly DFlash's single path.
2. Verification (`verify_tree`): anchor + nodes go through the target together. Node i sits at RoPE
   position start + depth[i] and sees the context and its own ancestors only (`tree_mask`): its logits are
   those of its root-to-node path decoded alone.
3. Acceptance (`accept_path`): from the root, draw y from the target's p at the node (argmax when greedy)
   and go to the child whose token is y; when there is none, y is the bonus. Every emitted token is a
   draw from p after the tokens before it, so the output has exactly the target's distribution.
4. Bookkeeping (`keep_path`): the accepted nodes' keys/values move to positions start+1, start+2, ...
   and the rest is cropped: the cache holds exactly what plain decoding would have cached. The drafter's
   context gets the accepted path's target features.
"""

import heapq
from dataclasses import dataclass, field

import torch

from ..sampling import Sampling, probs_from_logits, sample
from ..speculative import check_request, finished, prefill, step_tokens
from .timing import TimedStats, WatchedStep, rng_state

# path scores = log-softmax(drafter scores / this): sharpens a soft-label drafter's scores
TREE_TEMPERATURE = 0.5


@dataclass
class Tree:
    """Node 0 is the anchor (the root); nodes 1..N are drafts, every parent before its children."""
    tokens: list            # (N+1,) token ids, tokens[0] = anchor
    parent: list            # (N+1,) parent node, parent[0] = -1
    depth: list             # (N+1,) depth[0] = 0; a node at depth d drafts the d-th token after the anchor
    score: list             # (N+1,) the root-to-node path's score: the sum of its nodes' tempered log-softmax
    children: list = field(default_factory=list)   # (N+1,) {token: child node}

    @classmethod
    def root(cls, anchor):
        """A tree of the anchor alone: node 0, no parent, depth 0, score 0 (a subclass's per-node fields get
        their root entries from its `root_fields`)."""
        return cls(tokens=[anchor], parent=[-1], depth=[0], score=[0.0], children=[{}], **cls.root_fields())

    @classmethod
    def root_fields(cls):
        return {}

    def __len__(self):
        return len(self.tokens)

    def add(self, parent, token, score, **more):
        """Append a child of `parent` with `token` and path score `score` -> its node id. `more`: the values
        of a subclass's per-node fields (lists, one entry per node)."""
        node = len(self.tokens)
        self.tokens.append(token)
        self.parent.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.score.append(score)
        self.children.append({})
        self.children[parent][token] = node
        for name, value in more.items():
            getattr(self, name).append(value)
        return node

    def path(self, node):
        """Nodes from the root to `node`, both included."""
        out = [node]
        while self.parent[out[-1]] >= 0:
            out.append(self.parent[out[-1]])
        return out[::-1]


@dataclass
class TreeStats(TimedStats):
    tree_nodes: list = field(default_factory=list)   # draft nodes verified per step (the anchor not counted)


def build_tree(anchor, cand, logp, tree_nodes, branching=None):
    """Best-first: the tree_nodes highest-scoring path prefixes (at most `branching` children per node).

    cand (n, K), logp (n, K, K) from the drafter's `candidates` (drafter.py). Lazy expansion keeps the heap
    small: a node enters the heap when its previous sibling (or, for a first child, its parent) is taken, so
    each step pushes <= 2."""
    n, K = cand.shape
    branching = min(branching or K, K)
    order = logp.argsort(-1, descending=True)                                 # (n, K, K) children, best first
    ranked = logp.gather(-1, order).tolist()                                  # their log-probs, same order
    order, cand = order.tolist(), cand.tolist()
    tree = Tree.root(anchor)
    # heap entries: (-path score, parent node, slot, parent's row, rank)
    heap = [(-ranked[0][0][0], 0, 0, 0, 0)] if n else []
    while heap and len(tree) <= tree_nodes:
        neg, parent, t, row, r = heapq.heappop(heap)
        c = order[t][row][r]                                                  # the candidate index in slot t
        node = tree.add(parent, cand[t][c], -neg)                             # at depth t + 1
        if r + 1 < branching:                                                 # the next sibling
            heapq.heappush(heap, (-(tree.score[parent] + ranked[t][row][r + 1]), parent, t, row, r + 1))
        if t + 1 < n:                                                         # the first child
            heapq.heappush(heap, (-(tree.score[node] + ranked[t + 1][c][0]), node, t + 1, c, 0))
    return tree


def draft_tree(drafter, dcache, anchor, n_draft, tree_nodes, branching=None,
               tree_temperature=TREE_TEMPERATURE):
    """A tree of at most tree_nodes drafts, at most n_draft deep, from one drafter pass."""
    if n_draft == 0 or tree_nodes == 0:
        return Tree.root(anchor)
    cand, logp = drafter.candidates(dcache, anchor, n_draft, tree_temperature)   # (n, K), (n, K, K)
    return build_tree(anchor, cand, logp, tree_nodes, branching)


def tree_mask(parent):
    """parent (N+1,) -> bool (N+1, N+1): mask[i, j] = node j is node i or one of its ancestors."""
    n = len(parent)
    mask = torch.zeros(n, n, dtype=torch.bool)
    # parents come first: copy their row, add the node itself
    for i in range(n):
        if parent[i] >= 0:
            mask[i] = mask[parent[i]]
        mask[i, i] = True
    return mask


def verify_tree(target, cache, tree, layer_ids=None):
    """Anchor + nodes through the target in ONE pass, appended to `cache` (start = cache.length) -> logits
    (N+1, V) and features (1, N+1, F) or None. Row i: the target's next-token logits after node i's path."""
    device, start = cache.k.device, cache.length
    idx = torch.tensor([tree.tokens], device=device)                             # (1, N+1)
    positions = start + torch.tensor(tree.depth, device=device)                  # (N+1,) RoPE by depth
    mask = torch.cat([torch.ones(len(tree), start, dtype=torch.bool), tree_mask(tree.parent)], dim=1)
    logits, feats = target(idx, cache, layer_ids=layer_ids, positions=positions, mask=mask.to(device))
    return logits[0], feats                                                      # (N+1, V), (1, N+1, F)


def accept_path(tree, logits, temperature=0.0, top_k=None, top_p=None, generator=None):
    """Walk down from the root: y = the target's token at the node (argmax, or a draw from p); go to the child
    with token y while there is one. -> (accepted path: nodes from the root, bonus token y at its end)."""
    logits = logits.detach().cpu()                                               # (N+1, V)
    greedy = logits.argmax(-1).tolist() if temperature == 0 else None
    node, path = 0, [0]
    while True:
        if greedy is not None:
            y = greedy[node]
        else:
            y = int(sample(probs_from_logits(logits[node], temperature, top_k, top_p), generator))
        child = tree.children[node].get(y)
        if child is None:
            return path, y
        node = child
        path.append(node)


def keep_path(cache, start, path):
    """Move the K/V of the path's nodes (positions start + node) to start + 0, 1, ..., crop after them."""
    nodes = torch.tensor(path, device=cache.k.device) + start
    cache.k[:, :, :, start:start + len(path)] = cache.k[:, :, :, nodes]   # (L, 1, Hkv, len(path), hd); the
    cache.v[:, :, :, start:start + len(path)] = cache.v[:, :, :, nodes]   # index copies before it writes
    cache.crop(start + len(path))


@dataclass
class Drafted:
    """What a tree step drafted: its nodes' tokens after the root `anchor`, and the Tree."""
    anchor: int
    drafts: list
    tree: object
    q: object = None


@dataclass
class Verdict:
    """What verification decided: the target's logits (N+1, V) on the CPU (row i: node i's), its features,
    the accepted drafts, the bonus, and the accepted path of nodes, root first."""
    logits: object
    feats: object
    accepted: list
    bonus: int
    path: list = None


@dataclass(kw_only=True)
class Step:
    """What a tree step holds: the models, their caches, the stats, the sampling settings (TreeStep adds
    draft, verify, keep, extend and record)."""
    target: object
    drafter: object
    cache: object                 # the target's KV cache
    dcache: object                # the drafter's context
    stats: TimedStats
    sampling: Sampling
    generator: object = None

    def prefill(self, prompt):
        return prefill(self.target, self.drafter, prompt, self.cache, self.dcache, self.sampling,
                       self.generator)


def decode(step, prompt, max_new_tokens, stops):
    """The tree decoder's loop: the prompt (1, P) through the target, then steps until max_new_tokens or a
    stop token."""
    out = [step.prefill(prompt)]                                # the first token: the target's own
    while not finished(out, max_new_tokens, stops):
        left = max_new_tokens - len(out)
        drafted = step.draft(out[-1], left)                     # one drafter pass: a block or a tree
        verdict = step.verify(drafted)                          # one target pass, then the accept rule
        new = step_tokens(verdict.accepted, verdict.bonus, left, stops)
        step.keep(drafted, verdict, new)                        # the target cache: what plain decoding holds
        step.extend(drafted, verdict, new)                      # the kept positions: the drafter's context
        out += new
        step.record(drafted, verdict, new)
    return out


class Instruments:
    """A tree step, watched: its drafter work (draft, extend) and target work (verify, keep) timed into
    `stats`, and, with an on_step callback, the generator's state captured before verification and a
    WatchedStep handed over after keep, before the drafter's context is extended. The step never sees any of
    it."""

    def __init__(self, step, stats, generator=None, on_step=None):
        self.step, self.stats, self.generator, self.on_step = step, stats, generator, on_step

    def prefill(self, prompt):
        with self.stats.timer("prefill_time"):
            return self.step.prefill(prompt)

    def draft(self, anchor, left):
        self.start, self.timed = self.step.cache.length, (self.stats.draft_time, self.stats.verify_time)
        with self.stats.timer("draft_time"):
            return self.step.draft(anchor, left)

    def verify(self, drafted):
        self.rng = rng_state(self.generator) if self.on_step else None     # the verifier's draws, replayable
        with self.stats.timer("verify_time"):
            return self.step.verify(drafted)

    def keep(self, drafted, verdict, new):
        with self.stats.timer("verify_time"):
            self.step.keep(drafted, verdict, new)
        if self.on_step:
            s, (d0, v0) = self.stats, self.timed
            self.on_step(WatchedStep(
                anchor=drafted.anchor, drafts=drafted.drafts, q=drafted.q, target_logits=verdict.logits,
                accepted=len(verdict.accepted), new=new, start=self.start, end=self.step.cache.length,
                draft_cache=self.step.dcache, draft_s=s.draft_time - d0, verify_s=s.verify_time - v0,
                rng_state=self.rng, tree=drafted.tree, path=verdict.path))

    def extend(self, drafted, verdict, new):
        with self.stats.timer("draft_time"):
            self.step.extend(drafted, verdict, new)

    def record(self, drafted, verdict, new):
        self.step.record(drafted, verdict, new)


@dataclass(kw_only=True)
class TreeStep(Step):
    """The tree's step (decode runs it): draft a tree of <= tree_nodes drafts in one drafter pass, verify
    it in one target pass, keep the longest path the target agrees with. Its cache has room for a tree."""
    tree_nodes: int
    shape: tuple                  # (branching, tree_temperature) of a top-K tree
    draws: object                 # None: a top-K tree; sampled_tree.SampledDraws: a sampled one

    def draft(self, anchor, left):
        self.start = self.cache.length
        n_nodes = min(self.tree_nodes, self.cache.max_len - self.start - 1)  # near the window: a smaller tree
        n_draft = min(self.drafter.block_size - 1, left)
        if self.draws is None:
            tree = draft_tree(self.drafter, self.dcache, anchor, n_draft, n_nodes, *self.shape)
        else:
            tree = self.draws.draft(self.drafter, self.dcache, anchor, n_draft, n_nodes,
                                    self.sampling.temperature, self.generator)
        return Drafted(anchor, tree.tokens[1:], tree)

    def verify(self, d):
        logits, feats = verify_tree(self.target, self.cache, d.tree, self.drafter.target_layer_ids)
        accept = accept_path if self.draws is None else self.draws.accept
        s = self.sampling
        path, bonus = accept(d.tree, logits, s.temperature, s.top_k, s.top_p, self.generator)   # (N+1, V)
        return Verdict(logits.detach().cpu(), feats, [d.tree.tokens[i] for i in path[1:]], bonus, path)

    def keep(self, d, verdict, new):
        keep_path(self.cache, self.start, verdict.path[: len(new)])     # the anchor, accepted drafts: moved

    def extend(self, d, verdict, new):
        keep = verdict.path[: len(new)]
        kept = torch.tensor([[d.tree.tokens[i] for i in keep]], device=self.cache.k.device)   # (1, len(keep))
        self.drafter.extend(self.dcache, verdict.feats[:, keep], kept)

    def record(self, d, verdict, new):
        self.stats.tree_nodes.append(len(d.tree) - 1)
        self.stats.record(len(d.tree), len(new), min(len(verdict.path) - 1, len(new)))


@torch.no_grad()
def tree_speculative_generate(target, drafter, prompt_ids, max_new_tokens, tree_nodes=32, temperature=0.0,
                              top_k=None, top_p=None, stop_token_ids=None, generator=None, branching=None,
                              tree_temperature=TREE_TEMPERATURE, draws=None, on_step=None):
    """DFlash with tree verification: one drafter pass builds a tree of <= tree_nodes drafts, one target pass
    verifies it, the longest path the target agrees with is kept. Lossless (greedy and sampled).
    branching: at most this many children per node (None: the candidates per slot, K).
    tree_temperature: the drafter's scores are divided by it before the softmax that ranks paths
    (shapes the tree, never the output).
    draws (temperature > 0): None, the top-K tree above; sampled_tree.SampledDraws(widths), a tree of drafts
    sampled from the drafter, verified by recursive rejection (sampled_tree.py), which takes no branching
    or tree_temperature (those shape top-K trees).
    on_step: as for speculative_generate; its WatchedStep carries the tree and the accepted path."""
    prompt, stops = check_request(target, prompt_ids, max_new_tokens, temperature, top_k, top_p,
                                  stop_token_ids)
    window = target.config.max_seq_len
    room = max(1, window - prompt.size(1) - 1)                  # the first verify: prompt + anchor + tree
    if isinstance(tree_nodes, bool) or int(tree_nodes) != tree_nodes or not 1 <= tree_nodes <= room:
        raise ValueError(f"tree_nodes must be an integer in [1, {room}]: the first verify pass holds the "
                         f"{prompt.size(1)}-token prompt, the anchor and the tree in the target's window "
                         f"(max_seq_len={window}), got {tree_nodes!r}")
    if branching is not None and (int(branching) != branching or branching < 1):
        raise ValueError(f"branching must be a positive integer or None, got {branching!r}")
    if not 0 < tree_temperature < float("inf"):
        raise ValueError(f"tree_temperature must be > 0 and finite, got {tree_temperature!r}")
    if draws is not None and temperature == 0:
        raise ValueError("a sampled tree (draws=...) needs temperature > 0; greedy trees are top-K trees")
    n_max = prompt.size(1) + max_new_tokens
    cache = target.new_cache(1, min(window, n_max + tree_nodes))             # room for the tree's scratch
    dcache = drafter.new_cache(n_max)
    stats = TreeStats(target_cache=cache, draft_cache=dcache)
    sampling = Sampling(temperature, top_k, top_p)
    step = TreeStep(target=target, drafter=drafter, cache=cache, dcache=dcache, stats=stats,
                    tree_nodes=tree_nodes, shape=(branching, tree_temperature), draws=draws,
                    sampling=sampling, generator=generator)
    return decode(Instruments(step, stats, generator, on_step), prompt, max_new_tokens, stops), stats
