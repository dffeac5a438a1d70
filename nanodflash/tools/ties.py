"""Greedy equality checks that tell a float32 rounding tie from a broken decoder.

Speculative decoding verifies a block of tokens in one forward; plain decoding runs one forward per token.
The two sum the same products in different orders, so their float32 logits differ in the last bits. Where
the target's two best tokens are that close, the two paths may pick different ones: both are the target's
argmax to within rounding. A broken decoder differs where the target clearly prefers one token.

    d = greedy_difference(target, prompt, ref, out)     # None when ref == out
    d.position, d.tokens, d.gap, d.is_tie                # first differing new token, (ref's, out's), logit gap

`gap` is |logit(ref's token) - logit(out's token)| at that position, computed in float64 on the same
context, and `is_tie` says gap < TIE. For example, on one 12-layer target plain decoding took token 44 and the
verifier 41, at float32 logits 8.0191479 and 8.0191488 (6.6e-7 apart in float64, in the other order).
"""

import copy
from dataclasses import dataclass

import torch

TIE = 1e-4      # a logit gap (float64) below this is within the float32 rounding of the two paths' sums


@dataclass
class Difference:
    position: int       # index of the first differing new token
    tokens: tuple       # (plain decoding's token, the speculative decoder's token) there
    gap: float          # |difference of the target's float64 logits of the two tokens| on the shared context
    is_tie: bool        # gap < TIE: a float32 rounding tie, not a lossless failure

    def describe(self):
        kind = "a float32 rounding tie" if self.is_tie else "NOT a tie: the decoder is not lossless"
        if self.tokens == (None, None):
            return f"new token {self.position + 1}: one output ends there and the other does not ({kind})"
        return (f"new token {self.position + 1}: plain {self.tokens[0]} vs speculative {self.tokens[1]}, "
                f"target logits {self.gap:.1e} apart in float64 ({kind})")


@torch.no_grad()
def greedy_difference(target, prompt, ref, out):
    """None if the greedy outputs `ref` (plain) and `out` (speculative) of `prompt` are equal, else where and
    how they first differ (a Difference). A length difference without a differing token counts as gap inf."""
    if ref == out:
        return None
    shorter = min(len(ref), len(out))
    j = next((i for i in range(shorter) if ref[i] != out[i]), shorter)
    if j == shorter:                                                           # one output is a prefix of the other
        return Difference(j, (None, None), float("inf"), False)
    exact = copy.deepcopy(target).double()
    context = torch.tensor([list(prompt) + list(ref[:j])], device=next(target.parameters()).device)
    logits = exact(context)[0][0, -1]                                          # (V,) next-token logits
    gap = abs(float(logits[ref[j]] - logits[out[j]]))
    return Difference(j, (ref[j], out[j]), gap, gap < TIE)
