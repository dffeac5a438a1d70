"""DFlash 2: the DFlash drafter plus two cheap pieces that make a block's drafts agree with each other.

A DFlash 1 slot drafts its argmax without knowing what the slots before it drafted, so a block can read
"x = x = x" even when the drafter "knows" the continuation. DFlash 2 keeps ONE drafter pass per step and adds:

1. In-block dynamic causal convolutions (`GroupedDynamicCausalConv`), around attention and around the MLP
   of every drafter layer. For a sublayer f with pre-norm input u (block slots only, never the context):
       u~_t = sum_{j<k} (base_in[j]  + delta_in[t, j])  * u_{t-j}         (zero before slot 0)
       y~_t = sum_{j<k} (base_out[j] + delta_out[t, j]) * f(u~)_{t-j}     and the residual adds y~
   base_* are per-channel kernels (k, D); delta_* come from one bias-free linear map of u_t, one value per
   tap and per group of `conv_group_size` channels. Causal inside the block, and in training the K blocks
   of a sequence never read each other. Initialised as the identity (base tap 0 = 1, the rest 0).

2. A top-K candidate selector (`CandidateSelector`) after the LM head. Slot t's candidates C_t are the
   top-K drafter logits, with unary scores U_t; walking left to right from the anchor,
       score_t(c) = U_t(c) + < A[prev] * P h_t , Bk[c] >       prev = the token chosen at slot t-1
   with codebooks A (predecessor), Bk (successor) of rank r and P: D -> r. Bk starts at 0, so a fresh
   selector drafts the plain argmax: a fresh DFlash 2 drafter drafts exactly what DFlash 1 drafts.

Everything that can be batched is: one pass gives every slot's candidates, and one small matmul gives the
score of every candidate after every possible predecessor (a (n, K, K) table). The walk that remains is
n lookups into that table (docs/design.md §2). Parameter names follow the official checkpoints (§3.1).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from .drafter import Drafter, DrafterConfig, DrafterLayer
from .loss import (
    block_labels,
    block_soft_targets,
    candidate_soft_targets,
    mix_soft,
    soft_cross_entropy,
    weighted_cross_entropy,
)
from .sampling import draft_temperature, inverse_cdf


@dataclass
class DFlash2Config(DrafterConfig):
    conv_kernel_size: int = 2       # taps of the in-block convolutions (2 in released models; 0 = none: the
                                    # selector alone, which exports as identity convolutions of kernel 1)
    conv_group_size: int = 16       # channels sharing one dynamic tap value
    selector_rank: int = 64         # rank r of the predecessor x candidate term
    selector_top_k: int = 16        # candidates per slot
    selector_weight: float = 1.0    # alpha: loss = DFlash loss + alpha * selector loss


class GroupedDynamicCausalConv(nn.Module):
    """The convolution pair around one sublayer: `prepare` mixes its input, `finish` its output."""

    def __init__(self, dim, kernel_size, group_size, block_size):
        super().__init__()
        if dim % group_size:
            raise ValueError(f"conv_group_size {group_size} must divide the width {dim}")
        self.kernel_size, self.group_size, self.block_size = kernel_size, group_size, block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, dim))    # [in, out] x taps x channels
        with torch.no_grad():
            self.base_kernel[:, 0] = 1.0                                     # identity: tap 0 passes through
        self.kernel_projection = nn.Linear(dim, 2 * kernel_size * (dim // group_size), bias=False)
        nn.init.zeros_(self.kernel_projection.weight)                        # no dynamic part at first

    def _convolve(self, x, w):
        """x (N, T, D) holding T/s blocks of s = min(T, block_size) slots; w (N*T/s, s, k, G, D/G), the taps
        (base + dynamic) of every slot: out_t = sum_j w[t, j] * x_{t-j}, zero before slot 0 of each block."""
        N, T, D = x.shape
        s = min(T, self.block_size)
        blocks = x.reshape(N * T // s, s, -1, self.group_size)               # (N, T, D) -> (N*T/s, s, G, D/G)
        out = w[:, :, 0] * blocks                                            # tap 0: the slot itself
        for j in range(1, min(self.kernel_size, s)):                         # tap j: the slot j to the left
            out[:, j:] += w[:, j:, j] * blocks[:, :-j]
        return out.reshape(N, T, D)                                          # (N*T/s, s, G, D/G) -> (N, T, D)

    def prepare(self, u):
        """u (N, T, D), the sublayer's pre-norm input -> (mixed input, the output taps for `finish`)."""
        N, T, D = u.shape
        s, k, G = min(T, self.block_size), self.kernel_size, D // self.group_size
        # (N, T, 2*k*G) -> per slot, in/out
        dynamic = self.kernel_projection(u).view(N * T // s, s, 2, k, G, 1)
        w = self.base_kernel.view(2, k, G, self.group_size) + dynamic          # (N*T/s, s, 2, k, G, D/G)
        return self._convolve(u, w[:, :, 0]), w[:, :, 1]

    def finish(self, y, w):
        return self._convolve(y, w)


def greedy_walk(cand, table):
    """DFlash 2's greedy walk: from the anchor, at each slot the best candidate after the one chosen before.

    cand (n, K) and table (n, K, K) from `CandidateSelector.transition_table` -> tokens (n,);
    R blocks at once: (R, n, K), (R, n, K, K) -> (R, n). The table holds every score, so the walk is
    n lookups (cheapest in numpy). Example: with K = 2, table[0] = [[1, 3], [1, 3]] (after the anchor)
    and table[1] = [[5, 0], [0, 5]], slot 1 takes candidate 1 (score 3), and slot 2 the best after it:
    candidate 1 again (score 5).
    """
    lead, (n, K) = cand.shape[:-2], cand.shape[-2:]
    scores = table.detach().cpu().reshape(-1, n, K, K).numpy()                   # (R, n, K, K)
    rows, i, path = np.arange(len(scores)), np.zeros(len(scores), dtype=np.int64), []
    # slot t: the best candidate after the one chosen before
    for t in range(n):
        i = scores[rows, t, i].argmax(-1)
        path.append(i)
    index = torch.from_numpy(np.stack(path, -1) if path else np.zeros((len(scores), 0), dtype=np.int64))
    return cand.cpu().reshape(-1, n, K).gather(-1, index[..., None])[..., 0].reshape(*lead, n)   # (..., n)


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size, dim, rank, top_k):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab_size, rank)
        self.successor_codebook = nn.Embedding(vocab_size, rank)
        self.hidden_projection = nn.Linear(dim, rank, bias=False)
        nn.init.normal_(self.predecessor_codebook.weight, std=1.0 / math.sqrt(rank))
        nn.init.zeros_(self.successor_codebook.weight)                         # starts as the plain argmax
        nn.init.normal_(self.hidden_projection.weight, std=0.02)

    def candidates(self, logits):
        """logits (..., V) -> unary scores and candidate ids (..., K), best first."""
        return logits.topk(min(self.top_k, logits.size(-1)), dim=-1)

    def scores(self, hidden, logits, prev):
        """Teacher-forced form: slot hidden (..., D), logits (..., V), predecessor ids (...)
        -> (candidates (..., K), scores (..., K))."""
        unary, cand = self.candidates(logits)
        query = self.predecessor_codebook(prev) * self.hidden_projection(hidden)   # (..., r)
        pair = (self.successor_codebook(cand) @ query.unsqueeze(-1)).squeeze(-1)   # (..., K, r) @ (..., r, 1)
        return cand, unary + pair

    def transition_table(self, hidden, logits, anchor):
        """Inference form for one block: hidden (n, D), logits (n, V) of slots 1..n, anchor id ->
        candidates (n, K) and table (n, K, K): table[t, i, c] = score of candidate c at slot t+1 when the
        token before it is candidate i of slot t (for the first slot, the anchor: every row i is the same).
        R blocks at once: hidden (R, n, D), logits (R, n, V), anchor (R,) ids -> (R, n, K), (R, n, K, K)."""
        unary, cand = self.candidates(logits)                                        # (..., n, K) each
        succ = self.successor_codebook(cand) * self.hidden_projection(hidden).unsqueeze(-2)   # (..., n, K, r)
        first = torch.as_tensor(anchor, device=cand.device)[..., None, None]          # (..., 1, 1)
        prev_ids = torch.cat([first.expand(*cand.shape[:-2], 1, cand.size(-1)), cand[..., :-1, :]], -2)
        prev = self.predecessor_codebook(prev_ids)                                   # (..., n, K, r): A[prev]
        return cand, unary.unsqueeze(-2) + prev @ succ.transpose(-1, -2)             # (..., n, K, K)

    def slot_distribution(self, t, prev, cand, table, hidden, logits, temperature):
        """q_t, the sampling drafter's distribution at slot t+1 after the token `prev` drafted before it
        (t = 0: after the anchor, `prev` unused): the selector's scores on the slot's K candidates, the
        drafter's logits on every other token, softmax at `temperature` -> (V,) float64. cand (n, K), table
        (n, K, K) on the CPU, from `transition_table`; hidden (n, D), logits (n, V) of the slots.

        At high temperature much of the target's mass lies outside the top K, and a q that covers it accepts
        more (docs/sampling.md). After a non-candidate predecessor the slot's candidates are scored after it
        all the same (`scores`)."""
        hit = (cand[t - 1] == prev).nonzero() if t > 0 else torch.zeros(1, 1, dtype=torch.long)
        if hit.numel():
            scores = table[t, int(hit[0, 0])]                              # (K,) a row of the table
        else:
            scores = self.scores(hidden[t], logits[t], torch.tensor(prev, device=hidden.device))[1]
        full = logits[t].detach().to("cpu", torch.float64, copy=True)     # (V,)
        full[cand[t]] = scores.detach().to("cpu", torch.float64)
        return torch.softmax(full / temperature, dim=-1)

    def walk(self, cand, table, rule, hidden, logits):
        """Choose one candidate per slot, left to right. rule: a sampling.DraftRule (or any callable: greedy).
        cand, table: from `transition_table`; hidden (n, D), logits (n, V): the slots' (for sampling).

        Greedy (T = 0, or drafts that are not sampled): the argmax after the chosen predecessor, q = None.
        Sampling (the rejection verifier): d_t ~ q_t = `slot_distribution` after the token drawn before it
        (which may be a non-candidate), at sampling.draft_temperature.
        Returns (tokens (n,), q (n, V) or None).
        """
        temperature = getattr(rule, "temperature", 0.0)
        if temperature == 0 or not getattr(rule, "sample_drafts", False):
            return greedy_walk(cand, table), None
        cand, table = cand.cpu(), table.detach().cpu()
        n = cand.size(0)
        u = torch.rand(n, generator=rule.generator, dtype=torch.float64)   # one uniform per slot
        q = torch.empty(n, logits.size(-1), dtype=torch.float64)
        tokens = []
        for t in range(n):
            q[t] = self.slot_distribution(t, tokens[-1] if t else None, cand, table, hidden, logits,
                                          draft_temperature(temperature))
            tokens.append(int(inverse_cdf(q[t], u[t:t + 1])))
        return torch.tensor(tokens), q


class DFlash2Layer(DrafterLayer):
    """A DFlash drafter layer with a convolution pair around attention and around the MLP
    (block slots only; the injected context is never convolved). Both drafters' passes, training and
    inference, call this forward."""

    def add_convolutions(self, c):
        """Attach the two convolutions (identity at first). DFlash2Drafter calls this after the drafter's
        random init, which would otherwise overwrite their identity kernels. Names as in the official
        checkpoints."""
        self.attention_conv = GroupedDynamicCausalConv(c.n_embd, c.conv_kernel_size, c.conv_group_size,
                                                       c.block_size)
        self.mlp_conv = GroupedDynamicCausalConv(c.n_embd, c.conv_kernel_size, c.conv_group_size,
                                                 c.block_size)

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask):
        u, taps = self.attention_conv.prepare(self.input_layernorm(x))           # mix the block's slots in
        q, k, v = self.self_attn.project(u, cos, sin)                             # k, v (N, Hkv, T, hd)
        keys, values = torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)  # (N, Hkv, S+T, hd)
        y = self.self_attn.attend(q, keys, values, mask)
        x = x + self.attention_conv.finish(y, taps)                               # ... and attention's output
        u, taps = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(u), taps), k, v


class DFlash2Drafter(Drafter):
    """The DFlash drafter with DFlash2Layers (plain DrafterLayers when conv_kernel_size is 0) and a candidate
    selector on top."""
    kind = "dflash2"
    config_class = DFlash2Config

    def new_layer(self, c):
        return DFlash2Layer(c) if c.conv_kernel_size else DrafterLayer(c)

    def __init__(self, config, target):
        super().__init__(config, target)
        c = config
        for layer in self.layers if c.conv_kernel_size else []:
            layer.add_convolutions(c)
        self.candidate_selector = CandidateSelector(target.config.vocab_size, c.n_embd, c.selector_rank,
                                                    c.selector_top_k)

    def block_candidates(self, cache, anchor, n_draft):
        """One drafter pass over [anchor, MASK x n_draft] -> the slots' hidden (n, D) and logits (n, V), and
        the selector's candidates (n, K) and transition table (n, K, K) (None when n_draft is 0). The path's
        walk, both kinds of tree and the trace page start from it."""
        hidden = self.slot_hidden(cache, anchor, n_draft)                        # (n_draft, D)
        logits = self.target.lm_head(hidden)                                     # (n_draft, V)
        if n_draft == 0:
            return hidden, logits, None, None
        return (hidden, logits, *self.candidate_selector.transition_table(hidden, logits, anchor))

    # ---------------- the drafter interface (drafter.py), answered by the selector ----------------

    def draft(self, cache, anchor, n_draft, choose):
        """One drafter pass for every slot's candidates, then the selector's walk. `choose` is a DraftRule."""
        hidden = self.slot_hidden(cache, anchor, n_draft)                        # (n_draft, D)
        return self.pick(hidden, self.target.lm_head(hidden), anchor, choose)

    def pick(self, hidden, logits, anchor, choose):
        """The selector's walk over the slots' candidates: hidden (..., n, D), logits (..., n, V), anchor
        an id (or (R,) ids: R blocks at once, greedy only)."""
        if hidden.size(-2) == 0:
            return choose(logits)
        cand, table = self.candidate_selector.transition_table(hidden, logits, anchor)
        return self.candidate_selector.walk(cand, table, choose, hidden, logits)

    def candidates(self, cache, anchor, n_draft, temperature):
        """The tree's candidates: the selector's (n, K), and logp (n, K, K) = log-softmax over them of the
        transition table / temperature, after each candidate of the slot before."""
        _, _, cand, table = self.block_candidates(cache, anchor, n_draft)
        return cand.cpu(), (table.detach().cpu() / temperature).log_softmax(-1)

    def draft_distribution(self, cache, anchor, n_draft, temperature):
        """q(t, prev): the selector's q after `prev` (CandidateSelector.slot_distribution), the one the
        sampled walk draws from."""
        hidden, logits, cand, table = self.block_candidates(cache, anchor, n_draft)
        cand, table, T = cand.cpu(), table.detach().cpu(), draft_temperature(temperature)
        selector = self.candidate_selector
        return lambda t, prev: selector.slot_distribution(t, prev, cand, table, hidden, logits, T)

    def slot_scores(self, cache, anchor, drafts, top=4):
        """Per slot: the selector's `top` candidates after the token drafted before it, [[token, score], ...],
        best first."""
        hidden, logits, _, _ = self.block_candidates(cache, anchor, len(drafts))
        prev, out = [anchor] + list(drafts[:-1]), []
        for t in range(len(drafts)):
            cand, scores = self.candidate_selector.scores(hidden[t], logits[t], torch.tensor(prev[t]))
            best = scores.argsort(descending=True)[:top]
            out.append([[int(cand[i]), round(float(scores[i]), 3)] for i in best])
        return out

    def loss(self, features, input_ids, anchors, weights, soft=None, soft_weight=0.0):
        """DFlash loss + alpha * selector loss. The selector's predecessor is teacher-forced (the true token
        before the slot) and its label is the true token's index among the slot's candidates; slots whose
        true token is not a candidate are left out (out["recall"]: the fraction kept). With `soft` targets
        (loss.py) both parts mix in, by soft_weight, the cross-entropy against the target's distribution:
        for the selector, the target's probabilities of the candidates renormalised over them."""
        hidden = self.hidden(features, input_ids, anchors)                       # (N, K, B, D)
        logits = self.target.lm_head(hidden)                                     # (N, K, B, V)
        labels = block_labels(input_ids, anchors, self.config.block_size)        # (N, K, B)
        ce = weighted_cross_entropy(logits, labels, weights)
        dflash = mix_soft(ce, logits, soft, anchors, weights, soft_weight)
        cand, scores = self.candidate_selector.scores(hidden[:, :, 1:], logits[:, :, 1:], labels[:, :, :-1])
        is_true = cand == labels[:, :, 1:, None]                                 # (N, K, B-1, top_k)
        found = is_true.any(-1)                                                  # (N, K, B-1)
        index = is_true.float().argmax(-1)                                       # index of the true candidate
        selector = weighted_cross_entropy(scores, index, weights[1:], keep=found)
        if soft is not None and soft_weight:
            probs, ids = block_soft_targets(soft, anchors, self.config.block_size)   # (N, K, B, m) each
            p_cand, has = candidate_soft_targets(cand, probs[:, :, 1:], ids[:, :, 1:])   # (N, K, B-1, top_k)
            soft_sel = soft_cross_entropy(scores, p_cand.to(scores.dtype), weights[1:], keep=has)
            selector = (1 - soft_weight) * selector + soft_weight * soft_sel
        chosen = cand.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
        pred = torch.cat([labels[:, :, :1], chosen], dim=2)
        loss = dflash + self.config.selector_weight * selector
        return loss, dict(logits=logits, labels=labels, pred=pred, loss=loss.detach(),
                          dflash_loss=dflash.detach(), selector_loss=selector.detach(),
                          recall=found.float().mean())
