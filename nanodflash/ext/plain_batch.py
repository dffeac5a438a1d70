"""Plain batched decoding, and the rows machinery batched DFlash builds on (batch.py's SpecBatch).

    outs = generate_batch(target, prompts, max_new_tokens, temperature=0.0, ...)

The rows of a batch share one target forward per step. Each row keeps its own length in a ragged KV cache
(ragged_cache.py), and a row that is done (stop token or max_new_tokens) leaves the batch at the next step.
Every row is what plain decoding of its prompt alone gives (speculative.generate).
"""

import time

import torch

from ..sampling import Sampling
from ..speculative import check_request, finished
from .ragged_cache import RaggedKVCache, compact


class PlainBatch:
    """The rows of one batched generation: prompts, outputs, the target's ragged cache; plain steps."""

    def __init__(self, target, prompts, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
                 stop_token_ids=None, generator=None, layer_ids=None, slack=1):
        if len(prompts) == 0:
            raise ValueError("the batch is empty: give at least one prompt")
        request = (max_new_tokens, temperature, top_k, top_p, stop_token_ids)
        checked = []
        for i, p in enumerate(prompts):                     # batch 1's checks, the errors naming the row
            try:
                checked.append(check_request(target, p, *request))
            except ValueError as e:
                raise ValueError(f"prompt {i} of the batch: {e}") from None
        self.target, self.max_new, self.ids, self.generator = target, max_new_tokens, layer_ids, generator
        self.sampling, self.stops = Sampling(temperature, top_k, top_p), checked[0][1]
        self.device = checked[0][0].device
        self.prompts = [p[0].tolist() for p, _ in checked]
        self.outs = [[] for _ in prompts]
        self.rows = list(range(len(prompts)))           # the prompt index of every row still in the batch
        self.window = target.config.max_seq_len
        self.max_len = min(self.window, max(map(len, self.prompts)) + max_new_tokens + slack)
        dtype = next(target.parameters()).dtype
        self.cache = RaggedKVCache(target.config, len(prompts), self.max_len, self.device, dtype)

    def anchors(self):
        """The last token of every row still in the batch: (R,)."""
        return torch.tensor([self.outs[r][-1] for r in self.rows], device=self.device)

    def forward(self, tokens):
        """tokens (R, t), one row per batch row, at each row's next positions -> logits (R, t, V), feats."""
        positions, mask = self.cache.slots(tokens.size(1))
        return self.target(tokens, self.cache, layer_ids=self.ids, positions=positions, mask=mask)

    def prefill(self):
        """Every prompt in one forward, right-padded to the longest (the padding's keys are never seen)."""
        P = [len(p) for p in self.prompts]
        padded = torch.tensor([p + [0] * (max(P) - len(p)) for p in self.prompts], device=self.device)
        logits, feats = self.forward(padded)                                        # (R, P_max, V)
        self.cache.advance(P)                                                       # lengths = P_r
        ends = torch.tensor(P, device=self.device) - 1                              # each prompt's last
        last = logits[torch.arange(len(P), device=self.device), ends]               # (R, V)
        self.emit_one(last)
        return feats, padded, P

    def emit_one(self, logits):
        """Every row emits one token drawn from its logits (R, V)."""
        self.emit([[t] for t in self.sampling.next_token(logits.cpu(), self.generator).tolist()])

    def emit(self, new):
        """new[i]: the tokens row i emits this step."""
        for r, tokens in zip(self.rows, new):
            self.outs[r] += tokens

    def done(self, r):
        return finished(self.outs[r], self.max_new, self.stops)

    def drop_finished(self):
        """Remove the finished rows from the batch (and from its caches); False when none is left."""
        order = compact([not self.done(r) for r in self.rows])
        if len(order) < len(self.rows) and order:
            self.keep(order)
        self.rows = [self.rows[i] for i in order]
        return bool(self.rows)

    def keep(self, index):
        self.cache.keep(index)

    def plain_step(self):
        """Every row emits its next token. Returns the step's input (R, 1), each row's anchor (its last
        token), and the target's features there (what a drafter's context reads; None without layer_ids)."""
        tokens = self.anchors()[:, None]                                            # (R, 1)
        logits, feats = self.forward(tokens)                                        # (R, 1, V)
        self.cache.advance([1] * len(self.rows))
        self.emit_one(logits[:, -1])
        return tokens, feats


@torch.no_grad()
def generate_batch(target, prompts, max_new_tokens, temperature=0.0, top_k=None, top_p=None,
                   stop_token_ids=None, generator=None):
    """Plain batched decoding: one target forward per step for every unfinished row. Returns one list per
    prompt."""
    batch = PlainBatch(target, prompts, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                       stop_token_ids=stop_token_ids, generator=generator)
    batch.prefill()
    while batch.drop_finished():
        batch.plain_step()
    return batch.outs


@torch.no_grad()
def generate_sequences(target, ids, n_seqs, prompt_len, gen_len, temperature=0.0, top_k=None,
                       batch_size=64, seed=0, log=print):
    """(n_seqs, prompt_len + gen_len) LongTensor: random prompts from `ids`, continued by the target,
    batch_size rows at a time (plain batched decoding, plain_batch.generate_batch)."""
    g = torch.Generator().manual_seed(seed)
    out, t0 = [], time.perf_counter()
    for b0 in range(0, n_seqs, batch_size):
        n = min(batch_size, n_seqs - b0)
        starts = torch.randint(0, ids.numel() - prompt_len, (n,), generator=g)
        prompts = [ids[s: s + prompt_len].tolist() for s in starts]
        continued = generate_batch(target, prompts, gen_len, temperature, top_k, generator=g)
        out.append(torch.tensor([p + c for p, c in zip(prompts, continued)]))          # (n, prompt + gen)
        done = b0 + n
        log(f"[data] {done}/{n_seqs} sequences | "
            f"{done * gen_len / (time.perf_counter() - t0):.0f} generated tok/s")
    return torch.cat(out)


def generate_mix(target, ids, n, greedy_frac, seed, kw):
    """n target continuations (generate_sequences with keyword args kw): round(n * greedy_frac) greedy ones,
    the rest at kw["temperature"] (all greedy when that is 0). Without a greedy part: one plain call."""
    n_greedy = n if kw.get("temperature", 0) == 0 else round(n * greedy_frac)
    parts = ([generate_sequences(target, ids, n_greedy, seed=seed, **{**kw, "temperature": 0.0})]
             if n_greedy else [])
    if n_greedy < n:                                   # other prompts than the greedy part's (another seed)
        parts.append(generate_sequences(target, ids, n - n_greedy, seed=seed + 7919 if n_greedy else seed,
                                        **kw))
    return torch.cat(parts)
