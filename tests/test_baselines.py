"""The baselines: an autoregressive feature drafter (lossless, one forward per drafted token, trainable
with the DFlash recipe) and the no-feature DFlash ablation (provably blind to the context). Sampled decoding
with either keeps the target's distribution: test_sampling_kinds.py."""

import shutil

import pytest
import torch

from helpers import tiny_dflash2, tiny_drafter, tiny_target
from nanodflash.ext.plain_batch import generate_sequences
from nanodflash.pipeline import recipe
from nanodflash.sampling import DraftRule
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools import baselines, bench, draft_costs
from nanodflash.tools.baselines import (
    ARDrafter,
    NoFeatureDFlash2Drafter,
    NoFeatureDrafter,
    causal_training_mask,
)
from nanodflash.tools.evaluate import measure_tau, slot_accuracy
from nanodflash.tools.measure import DraftForwardCounter
from nanodflash.train import DraftTraining, train_drafter

GREEDY = DraftRule(0.0)


def ar_drafter(target, seed=1, block_size=16, n_layer=1):
    d = tiny_drafter(target, seed=seed, block_size=block_size, n_layer=n_layer)
    torch.manual_seed(seed)
    return ARDrafter(d.config, target).double().eval()


@pytest.fixture(scope="module")
def trained():
    """A peaked target, its own greedy continuations, and an AR drafter trained briefly on them."""
    target = tiny_target(seed=4, head_scale=8.0)
    ids = torch.randint(0, 62, (2000,), generator=torch.Generator().manual_seed(1))
    seqs = generate_sequences(target, ids, n_seqs=72, prompt_len=4, gen_len=36, batch_size=72,
                              log=lambda *_: None)
    drafter = ar_drafter(target, seed=5, block_size=8)
    hist = train_drafter(drafter, seqs[:64], DraftTraining(steps=60, batch_size=8, n_anchors=8, lr=1e-2,
                                                           min_anchor=3, log_every=10**6))
    return target, seqs[64:], drafter, hist


# ----------------------------------------------------------------------------- the AR drafter

@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
def test_ar_drafter_is_lossless_in_the_loop_and_its_drafts_get_accepted(trained, block_size):
    target, held_out, drafter, _ = trained
    lengths = []
    for s in held_out[:3].tolist():
        ref = generate(target, s[:4], 30)
        out, stats = speculative_generate(target, drafter, s[:4], 30, block_size=block_size)
        assert out == ref, \
            f"AR drafter, block_size={block_size}: speculative output diverged from greedy decoding"
        assert len(out) == 1 + sum(stats.acceptance_lengths), "stats must account for every emitted token"
        lengths += stats.acceptance_lengths
    if block_size >= 4:   # a trained drafter: drafts are accepted, and partial acceptance is exercised
        assert max(lengths) > 1 and any(1 <= a < block_size for a in lengths), f"acceptance lengths {lengths}"


def test_untrained_ar_drafter_is_lossless_too(target):
    drafter = ar_drafter(target)
    for prompt in ([3], list(range(10, 40))):
        out, _ = speculative_generate(target, drafter, prompt, 40, block_size=16)
        assert out == generate(target, prompt, 40), "untrained AR drafter broke greedy equality"


def test_causal_training_mask_equals_plain_loops_reference():
    anchors = torch.tensor([[0, 7, 7, 9], [3, 12, 1, 5]])
    S, n = 20, 4
    ref = torch.zeros(2, 4 * n, S + 4 * n, dtype=torch.bool)
    for b in range(2):
        for k in range(4):
            for i in range(n):
                ref[b, k * n + i, :int(anchors[b, k])] = True             # context strictly before the anchor
                ref[b, k * n + i, S + k * n: S + k * n + i + 1] = True    # own chain, slots 0..i
    assert torch.equal(causal_training_mask(anchors, S, n), ref), "causal chain mask differs from plain loops"


@pytest.mark.parametrize("n_layer", [1, 2])
def test_ar_training_form_logits_equal_drafting_logits_teacher_forcing_is_exact(target, n_layer):
    drafter = ar_drafter(target, block_size=6, n_layer=n_layer)
    x = torch.randint(0, 62, (1, 40), generator=torch.Generator().manual_seed(0))
    for a in (0, 5, 20):
        cache, logits = drafter.new_cache(64), []
        if a:
            _, feats = target(x[:, :a], layer_ids=drafter.config.target_layer_ids)
            drafter.extend(cache, feats, x[:, :a])

        def choose(lg):                       # record what the drafter saw, draft greedily
            logits.append(lg)
            return GREEDY(lg)
        drafts, _ = drafter.draft(cache, int(x[0, a]), 5, choose)
        assert cache.length == a, "drafting must leave only the verified context in the cache"
        # the sequence the drafter just drafted, fed back by teacher forcing
        seq = torch.cat([x[:, :a + 1], drafts[None], x[:, a + 6:]], dim=1)           # (1, 40)
        _, feats = target(seq, layer_ids=drafter.config.target_layer_ids)
        train = drafter(feats, seq, torch.tensor([[a]]))[0, 0]                  # (B, V), k predicts x_{a+k}
        torch.testing.assert_close(train[1:], torch.cat(logits), rtol=0, atol=1e-10,
                                   msg=f"AR train/draft mismatch at anchor {a}")


def test_drafter_forward_passes_per_draft_step_grow_with_k_for_ar_and_stay_one_for_dflash(target, drafter):
    ar = ar_drafter(target)
    counts = {}
    for name, d in (("dflash", drafter), ("ar", ar)):
        cache = d.new_cache(64)
        _, feats = target(torch.tensor([[1, 2, 3, 4, 5]]), layer_ids=d.config.target_layer_ids)
        with DraftForwardCounter(d) as c:
            d.extend(cache, feats, torch.tensor([[1, 2, 3, 4, 5]]))
            assert c.n == 0, f"{name}: extend must not count as a draft forward"
            counts[name] = []
            for k in range(1, 16):
                c.n = 0
                tokens, q = d.draft(cache, 6, k, GREEDY)
                assert tokens.shape == (k,), \
                    f"{name}: one token per drafted slot, got shape {tuple(tokens.shape)}"
                assert q is None, f"{name}: greedy drafting should build no distribution q (nothing reads it)"
                counts[name].append(c.n)
    assert counts["dflash"] == [1] * 15, f"DFlash drafts any block in one forward, counted {counts['dflash']}"
    assert counts["ar"] == list(range(1, 16)), \
        f"AR drafting takes one forward per token, counted {counts['ar']}"
    curve = draft_costs.draft_cost_curve(target, {"dflash": drafter, "ar": ar}, [1, 2, 3], context_len=8,
                                            n=1)
    assert curve["forwards"] == counts and len(curve["seconds"]["ar"]) == 15, \
        "the printed curve counts the same"


def test_training_the_ar_drafter_lowers_its_loss_and_beats_an_untrained_one(trained):
    target, held_out, drafter, hist = trained
    first, last = sum(hist["loss"][:5]) / 5, sum(hist["loss"][-5:]) / 5
    assert last < first - 1.0, f"AR drafter loss did not fall: {first:.3f} -> {last:.3f}"
    # An untrained AR drafter is not clueless here: it feeds real tokens through the target's own embedding
    # and head with near-identity layers, i.e. the target's skip path, which on this tiny random target is
    # most of the target (untrained: expected tau ~5.2 of 8). Training must still add clearly more.
    untrained = ar_drafter(target, seed=5, block_size=8)
    acc = slot_accuracy(drafter, held_out, min_anchor=3)
    acc0 = slot_accuracy(untrained, held_out, min_anchor=3)
    assert acc["expected_tau"] > acc0["expected_tau"] + 1.0, \
        f"expected tau (teacher forced) {acc0['expected_tau']:.2f} -> {acc['expected_tau']:.2f}"
    prompts = [s[:4] for s in held_out.tolist()]
    tau, tau0 = measure_tau(drafter, prompts, 24), measure_tau(untrained, prompts, 24)
    assert tau > tau0 + 0.3, \
        f"trained AR drafter's tau {tau:.2f} does not beat the untrained one's {tau0:.2f}"


# ----------------------------------------------------------------------------- the no-feature ablation

def no_feature_pair(target, kind):
    """(the DFlash drafter of `kind`, its no-feature partner with the same weights)."""
    if kind == "dflash":
        drafter, cls = tiny_drafter(target), NoFeatureDrafter
    else:
        drafter, cls = tiny_dflash2(target, perturb=0.3), NoFeatureDFlash2Drafter
    nofeat = cls(drafter.config, target).double().eval()
    nofeat.load_state_dict(drafter.state_dict())
    return drafter, nofeat


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_no_feature_drafter_logits_do_not_depend_on_the_context_features(target, kind):
    drafter, nofeat = no_feature_pair(target, kind)
    x = torch.randint(0, 62, (2, 40), generator=torch.Generator().manual_seed(3))
    _, feats = target(x, layer_ids=drafter.config.target_layer_ids)
    other = torch.randn_like(feats) * 5
    anchors = torch.tensor([[0, 9, 20], [14, 3, 24]])
    torch.testing.assert_close(nofeat(feats, x, anchors), nofeat(other, x, anchors), rtol=0, atol=0,
                               msg="no-feature drafter (training form) changed with the context features")
    assert not torch.allclose(drafter(feats, x, anchors), drafter(other, x, anchors)), \
        f"control: {kind} must depend"
    drafts, logits = [], []
    for f in (feats, other):
        cache = nofeat.new_cache(64)
        nofeat.extend(cache, f[:1, :20], x[:1, :20])
        assert cache.length == 20, "positions must still advance"
        logits.append(nofeat.slot_logits(cache, int(x[0, 20]), 15))
        drafts.append(nofeat.draft(cache, int(x[0, 20]), 15, GREEDY)[0])          # (tokens, q)
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0,
                               msg="no-feature drafter (drafting) saw features")
    assert torch.equal(drafts[0], drafts[1]), f"no-feature {kind} drafts changed with the features"
    train = nofeat(feats[:1], x[:1], torch.tensor([[20]]))[0, 0, 1:]
    torch.testing.assert_close(logits[0], train, rtol=0, atol=1e-10, msg="no-feature train/draft mismatch")


def test_no_feature_dflash2_drafter_starts_from_the_same_weights_as_dflash2():
    """The ablation's partner differs only in the injection: under one seed both classes build the same
    parameters with the same initial values."""
    target = tiny_target()
    d2 = tiny_dflash2(target, seed=7)
    torch.manual_seed(7)
    nofeat = NoFeatureDFlash2Drafter(d2.config, target).double()
    a, b = d2.state_dict(), nofeat.state_dict()
    assert a.keys() == b.keys(), "the no-feature DFlash 2 drafter has other parameters"
    assert all(torch.equal(a[k], b[k]) for k in a), "the same seed gave other initial weights"


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_no_feature_drafter_is_lossless_in_the_loop(target, kind):
    _, nofeat = no_feature_pair(target, kind)
    for b in (1, 4, 16):
        out, _ = speculative_generate(target, nofeat, [7, 1, 4, 1, 5], 30, block_size=b)
        assert out == generate(target, [7, 1, 4, 1, 5], 30), \
            f"no-feature {kind} drafter broke greedy equality (B={b})"


# ----------------------------------------------------------------------------- checkpoints, CLI, bench rows

def test_baselines_train_with_the_recipe_drafter_pt_was_trained_with(smoke_out):
    made_by = torch.load(smoke_out / "drafter.pt", weights_only=False)["made_by"]
    s = recipe.SMOKE
    assert baselines.run_recipe(made_by, "drafter.pt") == dict(
        steps=s["draft_steps"], batch_size=s["draft_batch"], n_anchors=s["draft_anchors"],
        lr=recipe.DRAFT_LR.default, gamma=recipe.GAMMA.default, seed=recipe.SEED.default,
        soft_weight=recipe.SOFT_WEIGHT.default,
        long_batch=s["long_batch"], long_anchors=s["long_anchors"]), "not the smoke run's drafter recipe"
    with pytest.raises(ValueError, match="records no drafter recipe"):
        baselines.run_recipe({}, "drafter.pt")


def test_baseline_checkpoints_round_trip_and_refuse_the_wrong_kind_or_target(tmp_path, target):
    ar = ar_drafter(target)
    path = str(tmp_path / "ar.pt")
    baselines.save_baseline(path, ar)
    loaded, _ = baselines.load_baseline(path, target, "ar")
    assert isinstance(loaded, ARDrafter) and all(torch.equal(a, b) for a, b in
                                                 zip(ar.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(ValueError, match="not a 'nofeat' baseline"):
        baselines.load_baseline(path, target, "nofeat")
    with pytest.raises(ValueError, match="trained against target"):
        baselines.load_baseline(path, tiny_target(seed=9), "ar")
    with pytest.raises(FileNotFoundError, match="nanodflash.tools.baselines"):
        baselines.load_baseline(str(tmp_path / "none.pt"), target, "ar")


def test_bench_skips_a_stale_baseline_with_a_warning_instead_of_failing(tmp_path, target, capsys):
    baselines.save_baseline(str(tmp_path / baselines.AR), ar_drafter(tiny_target(seed=9)))   # another target
    nofeat = NoFeatureDrafter(tiny_drafter(target).config, target).double()
    baselines.save_baseline(str(tmp_path / baselines.NOFEAT), nofeat)
    found = baselines.load_present(str(tmp_path), target)
    assert list(found) == ["nofeat"], f"the stale AR baseline must be skipped, got {list(found)}"
    assert "skipping the ar baseline" in capsys.readouterr().err, "no warning for the stale baseline"


@pytest.fixture(scope="module")
def baseline_out(smoke_out, tmp_path_factory):
    """A copy of the session's smoke checkpoints (conftest.py), for the baselines to be trained into."""
    out = tmp_path_factory.mktemp("baselines")
    for f in ("tokenizer.bpe", "target.pt", "data.pt", "drafter.pt"):
        shutil.copy(smoke_out / f, out / f)
    return out


def test_baselines_cli_trains_all_three_prints_tau_and_skips_what_exists(baseline_out, capsys):
    main_kind = torch.load(baseline_out / "drafter.pt", weights_only=False)["kind"]
    other = "dflash" if main_kind == "dflash2" else "dflash2"        # the DFlash kind drafter.pt is not
    baselines.main(["--out", str(baseline_out), "--steps", "3", "--eval_prompts", "2"])
    out = capsys.readouterr().out
    for needed in ("dflash no-features B=8", "ar k=3", "ar k=7", f"{other} B=8", "without target features",
                   "(dflash) ->",                    # its like-for-like partner, whatever drafter.pt is
                   "expected tau", "per-slot top-16 recall"):
        assert needed in out, f"baselines output lacks {needed!r}:\n{out}"
    for kind in ("ar", "nofeat", other):
        assert (baseline_out / baselines.KINDS[kind][1]).exists(), f"the {kind} drafter was not written"
    assert not (baseline_out / baselines.KINDS[main_kind][1]).exists(), \
        "drafter.pt's own kind was trained again"
    baselines.main(["--out", str(baseline_out), "--eval_prompts", "1"])
    assert out.count("skipping") == 0 and capsys.readouterr().out.count("skipping") == 3, \
        "existing ones retrained"


def test_bench_gains_baseline_rows_and_the_draft_cost_curve_when_they_exist(baseline_out, capsys, tmp_path):
    if not (baseline_out / baselines.AR).exists():
        baselines.main(["--out", str(baseline_out), "--steps", "3", "--eval_prompts", "1"])
    path = tmp_path / "bench.json"
    bench.main(["--out", str(baseline_out), "--n_prompts", "1", "--max_new_tokens", "12", "--all_rows",
               "--repeats", "1",
                "--json", str(path)])
    out = capsys.readouterr().out
    for needed in ("ar k=3 ", "ar k=7 ", "dflash no-features B=8",
                   "draft cost: one draft step vs drafted tokens",
                   "vs the best AR setting", "vs the best prompt lookup setting",
                   "greedy outputs identical to plain greedy on all 1 prompts: yes"):
        assert needed in out, f"bench output lacks {needed!r}:\n{out}"
    assert "ar k=15" not in out, "smoke drafters have B=8: k=15 does not fit"
    import json
    curve = json.loads(path.read_text())["draft_cost_curve"]
    (kind,) = set(curve["forwards"]) - {"ar"}                 # the main drafter's: "dflash" or "dflash2"
    assert curve["forwards"]["ar"] == list(range(1, 8)) and curve["forwards"][kind] == [1] * 7, \
        curve["forwards"]


def test_baselines_kinds_flag_names_the_allowed_kinds_when_given_an_unknown_one(capsys):
    with pytest.raises(SystemExit):
        baselines.parse_args(["--kinds", "ar,eagle"])
    assert "--kinds must name some of ar, nofeat, dflash, dflash2" in capsys.readouterr().err
