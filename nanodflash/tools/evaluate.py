"""How well a trained drafter drafts: per-slot accuracy, top-k recall and the expected acceptance length on
held-out sequences (`slot_accuracy`, teacher-forced, one drafter forward), and τ of real speculative decoding
(`measure_tau`).
"""

import torch

from ..loss import loss_decay_weights
from ..speculative import speculative_generate
from ..train import sample_anchors, target_features
from .watch import policy


@torch.no_grad()
def slot_accuracy(drafter, seqs, n_anchors=16, min_anchor=0, seed=0, batch_size=16, top_k=16):
    """Per-slot accuracy (slots 1..B-1), top-k recall and the expected acceptance length, on held-out
    sequences.

    Accuracy: the drafted token (given the true tokens before it) is the target's. Recall: the target's
    token is among the drafter's top_k logits (a perfect top-k selector's accuracy). Expected τ counts,
    per block, 1 + the number of leading slots that are all correct.
    """
    g = torch.Generator().manual_seed(seed)
    c, device = drafter.config, next(drafter.parameters()).device
    weights = loss_decay_weights(c.block_size).to(device)
    correct, recall, prefix, blocks = torch.zeros(c.block_size - 1), torch.zeros(c.block_size - 1), 0.0, 0
    for b0 in range(0, seqs.size(0), batch_size):
        x = seqs[b0: b0 + batch_size].to(device)
        feats = target_features(drafter.target, x, c.target_layer_ids)
        anchors = sample_anchors(x.size(0), n_anchors, x.size(1), c.block_size, min_anchor, g).to(device)
        _, out = drafter.loss(feats, x, anchors, weights)
        labels = out["labels"]
        hit = (out["pred"] == labels)[..., 1:].float().cpu()                   # (N, K, B-1)
        top = out["logits"].topk(top_k, dim=-1).indices                        # (N, K, B, top_k)
        recall += (top == labels[..., None]).any(-1)[..., 1:].float().sum((0, 1)).cpu()
        correct += hit.sum((0, 1))
        prefix += hit.cumprod(-1).sum().item()
        blocks += hit.shape[0] * hit.shape[1]
    return {"slot_acc": (correct / blocks).tolist(), "slot_recall": (recall / blocks).tolist(),
            "expected_tau": 1 + prefix / blocks}


def measure_tau(drafter, prompts, max_new_tokens, block_size=None, outputs=None, **kw):
    """τ of real speculative decoding (greedy unless kw says otherwise) over `prompts`: total emitted
    tokens / total steps. `outputs`, a list, receives each prompt's tokens (the text τ was measured on)."""
    emitted, steps = 0, 0
    for p in prompts:
        out, st = speculative_generate(drafter.target, drafter, p, max_new_tokens,
                                       block_size=policy(block_size), **kw)
        if outputs is not None:
            outputs.append(out)
        emitted += sum(st.acceptance_lengths)
        steps += len(st.acceptance_lengths)
    return emitted / max(steps, 1)
