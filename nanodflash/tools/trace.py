"""Recording a speculative run step by step, for the trace page (trace_page.py).

    recorder = TraceRecorder(tok, drafter, temperature=0.7, top_p=0.95, verifier="rejection")
    tokens, stats = watched_generate(target, drafter, prompt, 96, temperature=0.7, top_p=0.95,
                                     generator=g, on_step=recorder)               # tools/watch.py
    trace = recorder.trace(prompt, tokens, settings={"checkpoint": "out"})     # JSON-ready dict

The watched loops (tools/watch.py for a path, the tree decoder's own) call the recorder after each step
(WatchedStep, ext/timing.py). What the loop does not keep, the recorder recomputes from what it does: the
target's token at each position (its argmax), p(d) and q(d) of each draft, the verifier's uniforms (replayed
from the generator's state before verification, on a copy: the run's generator is never touched), and what
each slot chose among (the drafter's `slot_scores`, DFlash 2's selector scores: a second drafter pass on the
same context, which drafting leaves as it was). None of it runs inside the timed sections, and none of it
changes the run (tests/test_trace.py).
"""

import torch

from ..sampling import inverse_cdf, probs_from_logits
from .repetition import repetition

TOP_CANDIDATES = 4       # DFlash 2 candidates shown per slot


class TraceRecorder:
    """An on_step callback that keeps one JSON-ready dict per step; `trace` adds the run around them."""

    def __init__(self, tok, drafter, temperature=0.0, top_k=None, top_p=None, verifier="rejection"):
        self.tok, self.drafter = tok, drafter
        self.sampling = (temperature, top_k, top_p)
        self.verifier = verifier if temperature > 0 else "greedy"
        self.steps = []

    def __call__(self, rec):
        n = len(rec.drafts)
        kept = min(rec.accepted, len(rec.new))                  # a stop or the limit may cut drafts off
        step = dict(anchor=rec.anchor, block_size=n + 1, drafts=list(rec.drafts), accepted=rec.accepted,
                    accepted_tokens=rec.new[:kept], bonus=rec.new[kept] if len(rec.new) > kept else None,
                    target_cache=[rec.start, rec.end], draft_s=rec.draft_s, verify_s=rec.verify_s)
        length = self.drafter.context_length(rec.draft_cache)
        step["draft_cache"] = [length, length + len(rec.new)]
        if rec.tree is not None:
            step.update(parent=list(rec.tree.parent[1:]), path=list(rec.path))
        temperature = self.sampling[0]
        if temperature == 0:
            step["target_tokens"] = rec.target_logits.argmax(-1).tolist()
        elif rec.tree is None and n:
            step.update(self.sampled_verdict(rec))
            if self.verifier == "rejection" and rec.accepted < n and len(rec.new) > kept:
                step["residual_token"] = rec.new[kept]                  # drawn from normalize(max(0, p - q))
        if rec.tree is None and n:              # what each slot chose among, where the drafter says
            scores = self.drafter.slot_scores(rec.draft_cache, rec.anchor, rec.drafts, TOP_CANDIDATES)
            if scores is not None:
                step["candidates"] = scores
        self.steps.append(step)

    def sampled_verdict(self, rec):
        """p(d), q(d) and the verifier's uniforms u per draft (rejection: u < p/q keeps it), or the target's
        own draws y (match: keep while d == y); the residual's (or the last draw's) token is the bonus."""
        p = probs_from_logits(rec.target_logits, *self.sampling)                # (n+1, V)
        idx, d = torch.arange(len(rec.drafts)), torch.tensor(rec.drafts)
        g = torch.Generator()
        g.set_state(rec.rng_state)
        out = dict(p_d=p[idx, d].tolist())
        if self.verifier == "match":
            y = inverse_cdf(p, torch.rand(p.size(0), generator=g, dtype=torch.float64))
            return dict(out, target_tokens=y.tolist())
        u = torch.rand(len(rec.drafts), generator=g, dtype=torch.float64)     # rejection_verify's first draws
        return dict(out, q_d=rec.q[idx, d].tolist(), u=u.tolist())

    def trace(self, prompt_ids, output, settings=None):
        """The run as one dict: settings, prompt, output (its first token comes from the prefill), steps, and
        the text of every token id that appears."""
        ids = set(prompt_ids) | set(output)
        for s in self.steps:
            ids |= set(s["drafts"]) | {s["anchor"]}
            ids |= {c[0] for slot in s.get("candidates", []) for c in slot}
            ids |= set(s.get("target_tokens", []))
        texts = {str(i): self.tok.decode([i]) for i in sorted(ids)}
        temperature, top_k, top_p = self.sampling
        lengths = [len(s["accepted_tokens"]) + (s["bonus"] is not None) for s in self.steps]
        run = dict(tau=sum(lengths) / len(lengths) if lengths else 0.0, repetition=repetition(list(output)))
        return dict(settings=dict(settings or {}, temperature=temperature, top_k=top_k, top_p=top_p,
                                  verifier=self.verifier, drafter=self.drafter.kind),
                    prompt=list(prompt_ids), output=list(output), steps=self.steps, tokens=texts, run=run)


def replay(trace):
    """The output rebuilt from the steps: the prefill's token, then each step's kept drafts and bonus."""
    out = trace["output"][:1]
    for s in trace["steps"]:
        out += s["accepted_tokens"] + ([s["bonus"]] if s["bonus"] is not None else [])
    return out
