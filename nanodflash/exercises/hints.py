"""What a student gets besides the claims: each exercise's contract (the skeleton's docstring: what goes in,
what comes out, what it guarantees and why the library needs it, never how) and three hints, asked for one
at a time (`python -m nanodflash.exercises hint NAME LEVEL`): 1 the idea, 2 the steps (the catalog's
`todo`), 3 the code: the function's body, which passes every claim as written.
"""

import textwrap

from .check import AGAINST_CONTRACT

CONTRACTS = {
    "greedy_verify": """
    Arguments: draft_tokens, a LongTensor of shape (n,) (n may be 0); target_logits, a tensor of shape
    (n + 1, V) whose row i holds the target's scores for the token after the anchor and the first i drafts.
    Returns two Python ints: how many drafts greedy decoding would have produced itself, and the token it
    produces next. The decoder keeps exactly that many drafts plus that token, so greedy speculative output
    equals plain greedy output token for token. The batched decoder calls it for R rows at once:
    draft_tokens (R, n), padded with -1 where a row has fewer drafts, and target_logits (R, n + 1, V), on the
    target's device (a GPU); then it returns two LongTensors of shape (R,) (a loop over the rows is fine). A
    tensor it makes must be on target_logits.device too: the check runs it on the meta device as a GPU's
    stand-in.""",
    "match_verify": """
    Arguments: draft_tokens (n,), drafted by argmax; target_probs (n + 1, V), the target's distribution at
    each of the n + 1 positions; generator, a torch.Generator for every random draw (None: torch's global
    random state). Returns (kept drafts, next token) as two ints. Guarantee: the tokens the decoder emits
    have exactly the distribution plain sampling from target_probs would give.""",
    "rejection_verify": """
    Arguments: draft_tokens (n,), each a sample of the matching row of draft_probs (n, V) (the drafter's
    q); target_probs (n + 1, V), the target's p at each position; generator for every random draw (None:
    torch's global random state). Returns (kept drafts, next token) as two ints. Guarantee: whatever q is,
    the emitted tokens follow p exactly; the closer q is to p, the more drafts are kept.""",
    "residual_distribution": """
    Arguments: p and q, probability tensors of the same shape (..., V), rows summing to 1; leave both as they
    were (the decoders read them again). Returns a tensor of that shape, in p's dtype: per row, the
    distribution a rejected draft is replaced from, so that accepted and replaced tokens together follow p.
    Where a row of p equals the row of q (no rejection can happen there, but rows are computed in batches),
    that row is p's row, finite.""",
    "probs_from_logits": """
    Arguments: logits (..., V); temperature (0 means greedy); top_k (None, or how many tokens stay);
    top_p (None, or the nucleus mass: a token stays when the mass of the likelier tokens ranked before it
    is below top_p; of two equally likely tokens the lower id ranks first, as in a stable sort, so that
    the nucleus is one set). Returns float64 probabilities of the same shape, each row the distribution plain
    sampling draws from, to float64's precision from the logits' values (float32 logits included: at a low
    temperature a near tie's odds sit in digits float32 does not keep). The verifiers compare the target's p
    with the drafter's q, so p must be exactly what plain sampling uses, or decoding is no longer
    lossless.""",
    "training_mask": """
    Arguments: anchors (N, K), the K anchor positions of each of N sequences; seq_len S, the context
    length; block_size B. Returns a bool tensor (N, K*B, S + K*B): True where a block's query may attend to
    a key. Keys are the S context positions, then the K blocks' slots. Training runs K blocks per sequence
    in one pass; each must see what it would see at inference and nothing more. Build it on anchors.device
    with tensor operations, reading no anchor back into Python (no .tolist(), int() or .item()): the check
    also runs it with anchors on the meta device, which has shapes and no data, as a GPU's stand-in.""",
    "loss_decay_weights": """
    Arguments: block_size B; gamma, the decay length in slots (None: the paper's choice, 7 for B = 16, 5 for
    10, 4 for 8, else max(1, B/2)). Returns a float tensor w of shape (B,): w_k, the weight of slot k's loss
    in training, which decays exponentially from the first draft on, with decay length gamma. Slot 0 is the
    anchor (known, never drafted). A draft after a wrong one is never kept, so errors early in the block
    cost more than late ones.""",
    "tree_mask": """
    Argument: parent, a list of N + 1 ints, parent[0] = -1 for the root and parent[i] < i otherwise.
    Returns a bool tensor (N + 1, N + 1) for the verify pass: row i says which nodes node i may attend to.
    One target pass then scores every node as if its own branch had been decoded alone.""",
    "accept_path": """
    Arguments: tree (a nanodflash.ext.tree.Tree: tokens, parent, children maps); logits (N + 1, V), the
    target's scores at every node, on the target's device (a GPU's: the generator draws on the CPU);
    temperature, top_k, top_p and generator (None: torch's global random state) as in sampling. Returns
    (the list of nodes kept, starting with the root; the next token as an int). Guarantee: greedy, the output
    equals plain greedy decoding, and nothing is drawn (the generator and torch's global random state stay
    as they were); sampled, it follows the target's distribution.""",
    "keep_path": """
    Arguments: cache, the target's KVCache after a tree pass (node i's keys and values at position
    start + i); start, the position of the root; path, the kept nodes, root first. Returns nothing: it
    leaves the cache exactly as a fresh prefill of the prompt and the kept tokens would, so the next step
    can run as if no tree had been tried.""",
    "greedy_walk": """
    Arguments: cand, an (n, K) LongTensor of candidate tokens per slot; table, an (n, K, K) tensor of scores:
    table[t][i][j] scores candidate j at slot t after candidate i at slot t - 1 (row 0 of table[0]: after the
    anchor). Returns the n chosen tokens as a LongTensor of shape (n,). R blocks at once, (R, n, K) and
    (R, n, K, K), return (R, n), each row walked on its own (the batched decoder walks every row in one call).
    Of equal scores the lower candidate index wins (argmax's first maximum), so the drafts are the library's;
    scores are compared in the table's dtype (float64 ones 1e-9 apart are not equal). Both come on the
    drafter's device (a GPU's): move what you hand to numpy to the CPU first. DFlash 2 drafts each slot given
    the slot before it, which independent per-slot choices cannot.""",
    "multi_draft_verify": """
    Arguments: draft_tokens (k,), k independent samples of q = draft_probs (V,); target_probs p (V,);
    generator for every draw (None: torch's global random state). Returns (the index of the draft that was
    accepted, or -1 when none was; the token emitted) as two ints. Guarantee: the emitted token follows p
    exactly, and more drafts make an accepted draft more likely (this is what a sampled tree does at each
    node).""",
}

IDEAS = {   # hint 1, the idea (hint 2, the steps, is the catalog's `todo`; hint 3, the code, is CODE)
    "greedy_verify":
        "Greedy decoding would have produced the target's argmax at every position. A draft survives only if"
        " it is that argmax, and so do all the drafts before it.",
    "match_verify":
        "Let the target sample its own token at every position; a draft is worth keeping only where the "
        "target's sample agrees with it. The first disagreement is the target's own sample, so keep it.",
    "rejection_verify":
        "Accept a draft with probability min(1, p/q): where q over-proposes a token, some of its draws are "
        "thrown away; the mass thrown away is redrawn from where p exceeds q.",
    "residual_distribution":
        "After rejection, the tokens accepted so far follow min(p, q); what is missing to make p is p - "
        "min(p, q) = max(0, p - q), normalised.",
    "probs_from_logits":
        "Plain sampling's distribution, in the order the library applies things: temperature first, then the"
        " two truncations, then renormalise. T = 0 is the argmax.",
    "training_mask":
        "Two questions per (query, key): for a context key, is it before this block's anchor? For a block "
        "key, is it in this query's own block?",
    "loss_decay_weights":
        "An exponential decay along the block, starting at 1 for the first drafted slot; the anchor is never"
        " drafted, so it weighs nothing.",
    "tree_mask":
        "A node's branch is the node and its ancestors; the mask is each node's branch, and a node's branch "
        "is its parent's plus itself.",
    "accept_path":
        "The target picks a token at each node; follow it down the tree as long as some child drafted "
        "exactly that token. Where none did, the target's token is the bonus.",
    "keep_path":
        "The kept nodes' keys and values are in the cache already, only at the wrong positions; move them to"
        " consecutive positions after start and forget the rest.",
    "greedy_walk":
        "A walk through a table: each slot's choice is a row index for the next slot's lookup.",
    "multi_draft_verify":
        "Test the drafts one after another, each against what the rejections so far left of p: the residual "
        "plays p's role for the next draft.",
}

# Hint 3: the function's body, which passes every claim as written: it goes in place of the skeleton's
# `raise NotImplementedError`, under the skeleton's imports. Each sampled rule draws every random number from
# the generator it is given, as its claims check.
CODE = {
    "greedy_verify": """
        if draft_tokens.dim() == 2:                  # R blocks at once: each row verified on its own
            rows = [greedy_verify(drafts, logits) for drafts, logits in zip(draft_tokens, target_logits)]
            return torch.tensor([n for n, _ in rows]), torch.tensor([token for _, token in rows])
        best = target_logits.argmax(-1).tolist()     # greedy decoding's token at each position
        n = 0
        for d in draft_tokens.tolist():              # a padding -1 equals no token, so it stops the count
            if d != best[n]:
                break
            n += 1
        return n, best[n]                            # best[n]: the target's token after the n kept drafts
        """,
    "match_verify": """
        y = sample(target_probs, generator).tolist()   # the target's own draw at each of the n + 1 positions
        n = 0
        for d in draft_tokens.tolist():
            if d != y[n]:
                break
            n += 1
        return n, y[n]                                 # the target's draw where the first draft differed
        """,
    "rejection_verify": """
        n = draft_tokens.numel()
        u = torch.rand(n, generator=generator, dtype=torch.float64)      # one uniform per draft
        for i, d in enumerate(draft_tokens.tolist()):
            if not u[i] < target_probs[i, d] / draft_probs[i, d]:      # kept with probability min(1, p/q)
                residual = residual_distribution(target_probs[i], draft_probs[i])
                return i, int(sample(residual, generator))            # rejected: redraw where p exceeds q
        return n, int(sample(target_probs[n], generator))            # all kept: the bonus from the last row
        """,
    "residual_distribution": """
        r = (p - q).clamp_min(0)                     # what p has beyond q, token by token
        total = r.sum(-1, keepdim=True)
        return torch.where(total > 0, r / total, p)  # a row with nothing left (p == q) is p's own
        """,
    "probs_from_logits": """
        logits = logits.double()            # float64; each step below makes a new tensor: the caller's stay
        if temperature == 0:                # greedy: one-hot on the argmax (a tie: the lower id)
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).double()
        logits = logits / temperature
        if top_k is not None and top_k < logits.size(-1):
            kth = logits.topk(top_k, dim=-1).values[..., -1:]               # each row's k-th largest logit
            logits = logits.masked_fill(logits < kth, float("-inf"))      # a tie with it stays in
        probs = torch.softmax(logits, dim=-1)       # subtracts each row's largest logit: no overflow
        if top_p is not None and top_p < 1:
            ranked, order = probs.sort(dim=-1, descending=True, stable=True)   # a tie: the lower id first
            before = ranked.cumsum(-1) - ranked                                # the mass ranked before each
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
            probs = probs * keep
            probs = probs / probs.sum(-1, keepdim=True)
        return probs
        """,
    "training_mask": """
        N, K = anchors.shape
        B, device = block_size, anchors.device
        block_of = torch.arange(K * B, device=device) // B     # the block of each query, and of each slot key
        query_anchor = anchors[:, block_of]                      # (N, K*B): the anchor of each query's block
        sees_context = torch.arange(seq_len, device=device) < query_anchor[:, :, None]    # (N, K*B, S)
        sees_slot = block_of[:, None] == block_of[None, :]      # (K*B, K*B): the same block
        return torch.cat([sees_context, sees_slot.expand(N, -1, -1)], dim=-1)
        """,
    "loss_decay_weights": """
        if gamma is None:                            # the paper's decay length for its block sizes
            gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
        k = torch.arange(block_size, dtype=torch.float32)
        w = torch.exp(-(k - 1) / gamma)              # 1 at slot 1, a factor e lower every gamma slots
        w[0] = 0.0                                   # slot 0 is the anchor: known, never drafted
        return w
        """,
    "tree_mask": """
        n = len(parent)
        mask = torch.eye(n, dtype=torch.bool)        # every node sees itself
        for i in range(1, n):                        # a parent comes first, so its row is complete already
            mask[i] |= mask[parent[i]]               # and everything its parent sees
        return mask
        """,
    "accept_path": """
        logits = logits.detach().cpu()       # the target's device (a GPU's) -> the CPU the generator draws on
        node, path = 0, [0]
        while True:
            if temperature == 0:
                y = int(logits[node].argmax())                     # greedy: the target's argmax here
            else:                                                  # sampled: one draw from the target's p
                p = probs_from_logits(logits[node], temperature, top_k, top_p)
                y = int(sample(p, generator))
            child = tree.children[node].get(y)                     # children are keyed by int tokens
            if child is None:
                return path, y                                     # no child drafted y: y is the bonus
            node = child
            path.append(node)
        """,
    "keep_path": """
        # The path's i-th node moves from start + node to start + i. A node's index is at least its depth i
        # on the path, so moving in path order never overwrites a node still to be moved.
        for i, node in enumerate(path):
            cache.k[:, :, :, start + i] = cache.k[:, :, :, start + node]   # (L, 1, H, hd) at that position
            cache.v[:, :, :, start + i] = cache.v[:, :, :, start + node]
        cache.crop(start + len(path))                                      # forget everything after them
        """,
    "greedy_walk": """
        if cand.dim() == 3:                          # R blocks at once: each row walked on its own
            return torch.stack([greedy_walk(c, t) for c, t in zip(cand, table)])
        chosen, i = [], 0                            # i: the row of the table to read (0: after the anchor)
        for t in range(cand.size(0)):
            i = int(table[t, i].argmax())            # the best candidate after the one chosen at slot t - 1
            chosen.append(int(cand[t, i]))
        return torch.tensor(chosen, dtype=torch.long)
        """,
    "multi_draft_verify": """
        r, q = target_probs, draft_probs             # r: what the rejections so far left of p
        u = torch.rand(draft_tokens.numel(), generator=generator, dtype=torch.float64)   # one per draft
        for i, d in enumerate(draft_tokens.tolist()):
            if u[i] < r[d] / q[d]:                   # kept with probability min(1, r(d) / q(d))
                return i, d
            r = residual_distribution(r, q)          # rejected (a repeat too): the next test is against this
        return -1, int(sample(r, generator))         # every draft rejected: draw from what is left
        """,
}


def hint(exercise, level):
    """Hint `level` (1-3) for `exercise` (a catalog.Exercise); hint 3 is the body's lines, indented to paste
    in place of the skeleton's `raise NotImplementedError`."""
    if level not in (1, 2, 3):
        raise ValueError(f"hint levels are 1 (the idea), 2 (the steps) and 3 (the code), not {level}")
    if level == 3:
        return textwrap.indent(textwrap.dedent(CODE[exercise.name]).strip("\n") + "\n", "    ")
    return IDEAS[exercise.name] if level == 1 else exercise.todo


def which_hint(claim_text, message):
    """The hint level that addresses a failed claim, and a line that says so: a function not written yet
    wants the idea (1); a written one that fails a claim, on hand-made cases or in a whole decoding, has the
    idea and misses a step (2). A value of another kind than the contract states (a BrokenContract's
    message), or an error raised after the function returned, is about what it returns: the contract at the
    top of the file states that, so no hint level is named (None). Hint 3, the code, addresses every failure;
    it is never the one named, as a level before it always addresses the failure.

    >>> which_hint("greedy tree decoding with it is token-identical to plain greedy decoding", "differs")[0]
    2
    >>> which_hint("every node sees exactly itself and its ancestors", "raised NotImplementedError")[0]
    1
    >>> which_hint("walks down the child whose token is the target's", AGAINST_CONTRACT + "a pair")[0] is None
    True
    """
    if message.startswith(AGAINST_CONTRACT):
        return None, "what your function returns is not of the kind its contract states: reread the " \
                     "contract in its docstring"
    if message.startswith("after your "):
        return None, "what your function returns broke the code after it: reread the contract in its " \
                     "docstring"
    if "raised NotImplementedError" in message:
        return 1, "hint 1 (the idea) addresses this failure"
    return 2, "hint 2 (the steps) addresses this failure"
