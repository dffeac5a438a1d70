"""DFlash 2 (dflash2.py): identity start, causal in-block convolutions, a selector walk equal to its
reference, train/infer consistency, the selector loss's left-out rule, and lossless decoding (greedy
and sampled)."""

import pytest
import torch

from helpers import tiny_drafter, tiny_target
from nanodflash.dflash2 import CandidateSelector, DFlash2Drafter, GroupedDynamicCausalConv
from nanodflash.exercises.models import tiny_dflash2
from nanodflash.exercises.oracle import reference_walk
from nanodflash.ext.plain_batch import generate_sequences
from nanodflash.loss import loss_decay_weights
from nanodflash.sampling import DraftRule, draft_temperature
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.evaluate import measure_tau, slot_accuracy
from nanodflash.train import DraftTraining, train_drafter
from test_sampling_exact import N_OTHER_PATHS, chi_square_p_value, exact_distribution, speculative_counts

PROMPTS = [[3], [7, 1, 4, 1, 5, 9, 2, 6], list(range(10, 40))]


def test_fresh_dflash2_drafter_drafts_exactly_the_dflash_drafters_tokens(target):
    d1, d2 = tiny_drafter(target, seed=3), tiny_dflash2(target, seed=3)      # same seed: same DFlash weights
    for prompt in PROMPTS:
        o1, s1 = speculative_generate(target, d1, prompt, 40)
        o2, s2 = speculative_generate(target, d2, prompt, 40)
        assert o1 == o2 and s1.accepted_drafts == s2.accepted_drafts, \
            "identity-initialised DFlash 2 drafted differently"
        c1, c2 = d1.new_cache(64), d2.new_cache(64)
        _, feats = target(torch.tensor([prompt]), layer_ids=d1.config.target_layer_ids)
        d1.extend(c1, feats)
        d2.extend(c2, feats)
        t1, _ = d1.draft(c1, 5, 15, DraftRule(0.0))
        t2, _ = d2.draft(c2, 5, 15, DraftRule(0.0))
        assert torch.equal(t1, t2), f"fresh DFlash 2 drafts {t2.tolist()} != DFlash drafts {t1.tolist()}"


def test_convolution_is_causal_within_a_block_and_never_mixes_two_blocks():
    torch.manual_seed(0)
    conv = GroupedDynamicCausalConv(dim=16, kernel_size=3, group_size=4, block_size=6).double()
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn_like(p))
    u = torch.randn(2, 3 * 6, 16, dtype=torch.float64)                       # 3 blocks of 6 slots
    out, taps = conv.prepare(u)
    for j in range(18):
        u2 = u.clone()
        u2[1, j] += 1.0
        out2, _ = conv.prepare(u2)
        changed = (out2[1] - out[1]).abs().amax(-1) > 0                        # (18,)
        blk, slot = divmod(j, 6)
        expect = torch.zeros(18, dtype=torch.bool)
        # slots j..j+k-1 of the same block
        expect[j: min(j + 3, (blk + 1) * 6)] = True
        assert torch.equal(changed, expect), f"changing slot {slot} of block {blk} changed slots " \
                                             f"{changed.nonzero().flatten().tolist()}"
        assert torch.equal(out2[0], out[0]), "one sequence's blocks leaked into another's"


def test_identity_convolution_passes_its_input_through():
    conv = GroupedDynamicCausalConv(dim=16, kernel_size=2, group_size=8, block_size=4)
    u = torch.randn(1, 8, 16)
    out, taps = conv.prepare(u)
    assert torch.equal(out, u) and torch.equal(conv.finish(u, taps), u), \
        "a fresh convolution must be the identity"


@pytest.mark.parametrize("n_layer", [1, 2])
def test_training_form_logits_and_selector_scores_equal_the_inference_path(target, n_layer):
    d = tiny_dflash2(target, block_size=8, n_layer=n_layer, perturb=0.3)
    x = torch.randint(0, 62, (2, 40), generator=torch.Generator().manual_seed(0))
    _, feats = target(x, layer_ids=d.config.target_layer_ids)
    anchors = torch.tensor([[0, 5, 5, 32], [17, 3, 30, 11]])
    hidden = d.hidden(feats, x, anchors)                                   # (N, K, B, D)
    for n in range(2):
        for k in range(anchors.size(1)):
            a = int(anchors[n, k])
            cache = d.new_cache(64)
            if a > 0:
                d.extend(cache, feats[n: n + 1, :a])
            block = torch.full((1, 8), d.config.mask_token_id)
            block[0, 0] = x[n, a]
            h_inf = d.block_hidden(cache, block)[0]                        # (B, D)
            torch.testing.assert_close(h_inf, hidden[n, k], rtol=0, atol=1e-10,
                                       msg=f"train/infer hidden states differ for sequence {n}, anchor {a}")
            logits = d.target.lm_head(h_inf[1:])
            cand, table = d.candidate_selector.transition_table(h_inf[1:], logits, int(x[n, a]))
            prev = x[n, a: a + 7]                                          # teacher-forced predecessors
            cand_t, scores_t = d.candidate_selector.scores(hidden[n, k, 1:],
                                                           d.target.lm_head(hidden[n, k, 1:]), prev)
            assert torch.equal(cand, cand_t), "candidates differ between the training and inference forms"
            for t in range(7):                                             # the row of the true predecessor
                i = 0 if t == 0 else (cand[t - 1] == prev[t]).nonzero().flatten()
                if t > 0 and i.numel() == 0:
                    continue                                               # true predecessor not a candidate
                torch.testing.assert_close(table[t, int(i)], scores_t[t], rtol=0, atol=1e-10,
                                           msg=f"selector scores differ at slot {t + 1} "
                                               f"(sequence {n}, anchor {a})")


@pytest.mark.parametrize("seed", range(4))
def test_selector_walk_equals_plain_loops_reference(seed):
    torch.manual_seed(seed)
    sel = CandidateSelector(vocab_size=50, dim=12, rank=6, top_k=5).double()
    with torch.no_grad():
        sel.successor_codebook.weight.normal_(std=2.0)                          # the pair term matters
        sel.hidden_projection.weight.normal_(std=1.0)
    hidden, logits = torch.randn(9, 12, dtype=torch.float64), torch.randn(9, 50, dtype=torch.float64)
    cand, table = sel.transition_table(hidden, logits, anchor=7)
    tokens, q = sel.walk(cand, table, DraftRule(0.0), hidden, logits)
    ref = reference_walk(sel, hidden, logits, 7)
    assert tokens.tolist() == ref, f"walk {tokens.tolist()} != reference {ref}"
    assert tokens.tolist() != logits.argmax(-1).tolist(), "the pair term never changed a choice: no power"
    assert q is None, "a greedy walk builds no q"


def test_sampled_walk_returns_q_over_the_vocabulary_with_selector_scores_after_the_drawn_predecessor():
    torch.manual_seed(0)
    sel = CandidateSelector(vocab_size=30, dim=8, rank=4, top_k=4).double()
    with torch.no_grad():
        sel.successor_codebook.weight.normal_(std=2.0)
        sel.hidden_projection.weight.normal_(std=1.0)
    hidden, logits = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 30, dtype=torch.float64)
    cand, table = sel.transition_table(hidden, logits, anchor=3)
    drawn = {"candidate": 0, "other": 0}
    for seed in range(8):
        rule = DraftRule(0.8, sample_drafts=True, generator=torch.Generator().manual_seed(seed))
        tokens, q = sel.walk(cand, table, rule, hidden, logits)
        assert q.shape == (5, 30) and torch.allclose(q.sum(-1), torch.ones(5, dtype=torch.float64)), \
            "q rows must sum to 1"
        prev = 3
        # plain loop: the selector's scores after the drawn token on the candidates, logits elsewhere
        for t in range(5):
            c, s = sel.scores(hidden[t], logits[t], torch.tensor(prev))
            row = logits[t].clone()
            row[c] = s.detach()
            torch.testing.assert_close(q[t], torch.softmax(row / draft_temperature(0.8), -1),
                                       msg=f"q at slot {t + 1}: not softmax(selector scores | logits / T_q)")
            prev = int(tokens[t])
            drawn["candidate" if prev in c.tolist() else "other"] += 1
    assert drawn["candidate"] and drawn["other"], \
        f"both kinds of draft must occur for the test to mean anything: {drawn}"


def test_selector_loss_leaves_out_slots_whose_true_token_is_not_a_candidate(target):
    d = tiny_dflash2(target, block_size=8, top_k=2, perturb=0.3)
    x = torch.randint(0, 62, (2, 30), generator=torch.Generator().manual_seed(2))
    _, feats = target(x, layer_ids=d.config.target_layer_ids)
    anchors = torch.tensor([[1, 9, 20], [4, 4, 15]])
    w = loss_decay_weights(8)
    loss, out = d.loss(feats, x, anchors, w)
    hidden = d.hidden(feats, x, anchors)
    labels = out["labels"]
    num = den = 0.0
    kept = total = 0
    for n in range(2):                                                         # plain loops over slots
        for k in range(3):
            for t in range(1, 8):
                cand, s = d.candidate_selector.scores(hidden[n, k, t], d.target.lm_head(hidden[n, k, t]),
                                                      labels[n, k, t - 1])
                total += 1
                hit = (cand == labels[n, k, t]).nonzero().flatten()
                if hit.numel():
                    kept += 1
                    num += float(w[t]) * float(-torch.log_softmax(s.detach(), -1)[int(hit)])
                    den += float(w[t])
    assert 0 < kept < total, f"the left-out rule was not exercised ({kept} of {total} slots kept)"
    assert abs(float(out["recall"]) - kept / total) < 1e-6, "recall must be the fraction of slots kept"
    assert abs(float(out["selector_loss"]) - num / den) < 1e-9, \
        "selector loss is not the weighted CE over kept slots"
    assert abs(float(loss.detach()) - float(out["dflash_loss"]) - num / den) < 1e-9, \
        "total loss != DFlash loss + selector loss"


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])      # block 1 never drafts: test_speculative.py has it
def test_greedy_speculative_with_dflash2_equals_greedy_decoding(trained, block_size):
    target, d = trained["target"], trained["drafter"]
    lengths = []
    for prompt in trained["prompts"]:
        ref = generate(target, prompt, 40)
        out, stats = speculative_generate(target, d, prompt, 40, block_size=block_size)
        assert out == ref, \
            f"DFlash 2, block_size={block_size}: speculative output diverged from greedy decoding"
        lengths += stats.acceptance_lengths
    if block_size >= 4:
        assert any(1 < a < block_size for a in lengths), f"partial acceptance never exercised: {lengths}"
        assert any(a == 1 for a in lengths), f"zero-acceptance steps never exercised: {lengths}"


@pytest.fixture(scope="module")
def trained():
    """A DFlash 2 drafter trained briefly on a peaked tiny target's own continuations,
    and an untrained twin."""
    target = tiny_target(seed=4, head_scale=8.0)
    ids = torch.randint(0, 62, (2000,), generator=torch.Generator().manual_seed(1))
    seqs = generate_sequences(target, ids, n_seqs=96, prompt_len=4, gen_len=44, batch_size=48,
                              log=lambda *_: None)
    d = tiny_dflash2(target, seed=5, block_size=16, top_k=8)
    how = DraftTraining(steps=80, batch_size=8, n_anchors=8, lr=1e-2, min_anchor=3, log_every=10**6)
    hist = train_drafter(d, seqs[:80], how)
    return dict(target=target, drafter=d, untrained=tiny_dflash2(target, seed=5, block_size=16, top_k=8),
                hist=hist, held_out=seqs[80:], prompts=[s[:4] for s in seqs[80:].tolist()[:6]])


def test_short_dflash2_training_lowers_both_losses_and_beats_an_untrained_drafter(trained):
    h = trained["hist"]
    for key in ("dflash_loss", "selector_loss"):
        first, last = sum(h[key][:10]) / 10, sum(h[key][-10:]) / 10
        assert last < first - 0.3, f"{key} did not fall: {first:.3f} -> {last:.3f}"
    acc = slot_accuracy(trained["drafter"], trained["held_out"], min_anchor=3)
    assert all(a <= r + 1e-9 for a, r in zip(acc["slot_acc"], acc["slot_recall"])), \
        "the selector drafts a candidate, so its accuracy can never exceed the candidates' recall"
    tau, tau0 = (measure_tau(trained[k], trained["prompts"], 30) for k in ("drafter", "untrained"))
    assert tau > tau0 + 0.3, f"trained DFlash 2 tau {tau:.2f} should beat untrained {tau0:.2f}"


# ---------------------------------------------------------------- sampling exactness with the selector's q

V = 4


@pytest.fixture(scope="module")
def sampling_models():
    target = tiny_target(seed=11, vocab=V, n_layer=1, n_embd=16, n_head=2, n_kv_head=2, head_scale=60.0)
    d = tiny_dflash2(target, seed=12, block_size=4, top_k=2, rank=4, group=8, perturb=0.5)
    with torch.no_grad():
        d.norm.weight.mul_(0.3)                    # a soft drafter: q != p, so rejections happen
    return target, d


# match drafts the selector's walk and never reads q: one plain case here, one with top-k and top-p in
# test_sampling_kinds.py; rejection reads q: plain, and with top-p here, with top-k (and both) there.
@pytest.mark.parametrize("temperature,top_k,top_p,verifier", [(1.0, None, None, "match"),
                                                              (1.0, None, None, "rejection"),
                                                              (0.7, None, 0.9, "rejection")])
def test_sampled_speculative_with_the_selectors_q_has_exactly_the_targets_distribution(
        sampling_models, verifier, temperature, top_k, top_p):
    target, d = sampling_models  # top_k = 2 of 4 tokens: the target often wants a non-candidate
    exact = exact_distribution(target, temperature, top_k, top_p)
    counts, lengths = speculative_counts(target, d, verifier, temperature, top_k, top_p, n=N_OTHER_PATHS)
    assert any(a > 1 for a in lengths) and any(a == 1 for a in lengths), \
        "both acceptance and rejection must occur"
    p = chi_square_p_value(counts, exact, sum(counts.values()))
    assert p > 1e-4, (f"DFlash 2 {verifier} T={temperature} top_p={top_p}: chi-square p={p:.2e}, "
                      "not the target's distribution")


def uniform_q(drafts, q, p, generator):
    """WRONG on purpose: the rejection rule with q replaced by a uniform distribution, i.e. it ignores how the
    selector actually weighted the tokens (and what it drew before)."""
    from nanodflash.verify import rejection_verify
    return rejection_verify(drafts, torch.full_like(q, 1.0 / q.size(-1)), p, generator)


uniform_q.sample_drafts = True


def test_a_deliberately_wrong_verifier_fails_with_the_selectors_q(sampling_models):
    # (a verifier that ignores q altogether, always_accept, fails the same test in test_sampling_exact.py)
    target, d = sampling_models
    exact = exact_distribution(target, 1.0, None, None)
    counts, _ = speculative_counts(target, d, uniform_q, 1.0, None, None, n=N_OTHER_PATHS)
    p = chi_square_p_value(counts, exact, sum(counts.values()))
    assert p < 1e-4, f"the test cannot tell uniform_q from a correct verifier (p={p:.2e}): it has no power"


def test_without_convolutions_dflash2_is_the_dflash_drafter_plus_the_selector(target):
    d1 = tiny_drafter(target, seed=3)
    d0 = tiny_dflash2(target, seed=3)
    d0.config.conv_kernel_size = 0  # what DFlash2Config(conv_kernel_size=0) builds
    torch.manual_seed(3)
    d0 = DFlash2Drafter(d0.config, target).double().eval()
    assert not any("conv" in n for n, _ in d0.named_parameters()), \
        "conv_kernel_size 0 must build no convolutions"
    for prompt in PROMPTS:
        o1, s1 = speculative_generate(target, d1, prompt, 40)
        o0, s0 = speculative_generate(target, d0, prompt, 40)
        assert o0 == o1 == generate(target, prompt, 40) and s0.accepted_drafts == s1.accepted_drafts, \
            "a fresh selector-only drafter must draft what DFlash drafts"
