"""Claims about the road to real models: our target and drafters ARE Hugging Face Qwen3 and official
DFlash models.

Conformance is checked against the real code (test dependencies, installed by `make test`): transformers'
Qwen3ForCausalLM and the official `dflash` package (DFlashDraftModel, DFlash2DraftModel, dflash_generate).
Everything runs in float64. HF computes RMSNorm and RoPE angles in float32 even in a float64 model (and we
compute the angles as it does), so logits agree to ~1e-7, not to 1e-15; the tolerance below says so.
"""

import importlib.util
import json
import os
import random
import shutil
import time

import pytest
import torch

import nanodflash
from helpers import shared
from nanodflash.dflash2 import DFlash2Config, DFlash2Drafter
from nanodflash.drafter import Drafter, DrafterConfig
from nanodflash.sampling import DraftRule
from nanodflash.speculative import generate, speculative_generate
from nanodflash.store import checkpoint, run_folder
from nanodflash.store.tokenizer import ENDOFTEXT, special_ids, train_tokenizer
from nanodflash.tools import hf
from nanodflash.tools.baselines import ARDrafter
from nanodflash.train import DraftTraining, train_drafter

if not (importlib.util.find_spec("transformers") and importlib.util.find_spec("dflash")):
    pytest.skip("transformers and dflash are test dependencies: run the README's test command",
                allow_module_level=True)
transformers = dflash_model = None                  # the official code, imported by `official_code` below


@pytest.fixture(scope="module", autouse=True)
def official_code():
    """transformers and the official dflash package, imported when this file's first test runs rather than
    when pytest collects it (about 4.5 s on 2 cores, which an xdist worker running none of these tests need
    not pay)."""
    global transformers, dflash_model
    import dflash.model as dflash_model
    import transformers
    # its timer calls torch.cuda.synchronize(); we run on the CPU
    dflash_model._cuda_time = time.perf_counter


HF_FLOAT32_TOL = 1e-5                           # HF's float32 RMSNorm/RoPE inside a float64 model


@pytest.fixture(scope="session")
def pairs(tmp_path_factory):
    """A smoke-sized target trained long enough to say varied things (the --smoke one repeats one token),
    with a DFlash and a DFlash 2 drafter trained at block size 16, each in a run folder like train_tiny.py's,
    made once and shared by both xdist workers (conftest.shared; tests only read them). 100 drafter steps
    give the same spread of acceptance lengths (1 to 16 at B=16) as 200, in half the time."""
    root, lock = shared(tmp_path_factory, "hf_pairs")
    runs = {kind: root / f"hf_run_{kind}" for kind in ("dflash", "dflash2")}
    with lock:
        if not all((run / run_folder.DRAFTER).exists() for run in runs.values()):
            make_pairs(root / "hf_run_base", runs)
    return runs


def make_pairs(base, runs):
    import train_tiny
    train_tiny.main(["--smoke", "--out", str(base), "--target_steps", "400", "--n_seqs", "64",
                     "--draft_steps", "1", "--calibrate_calls", "0", "--no-sampling",
                     "--eval_prompts", "1", "--eval_long_tokens", "0"])   # a short summary: not used here
    tok, target, _ = nanodflash.load(str(base))
    data = checkpoint.read(str(base / run_folder.DATA), "data")
    for kind, cls, ccls in (("dflash", Drafter, DrafterConfig), ("dflash2", DFlash2Drafter, DFlash2Config)):
        out = runs[kind]
        out.mkdir()
        for f in (run_folder.TOKENIZER, run_folder.TARGET, run_folder.DATA):
            shutil.copy(base / f, out / f)
        torch.manual_seed(0)
        drafter = cls(ccls.for_target(target.config, special_ids(tok)[1], n_layer=2, block_size=16), target)
        how = DraftTraining(steps=100, batch_size=8, n_anchors=2, lr=3e-3, min_anchor=data["prompt_len"] - 1,
                            log_every=10**9)
        train_drafter(drafter, data["train"], how)
        checkpoint.save_drafter(str(out / run_folder.DRAFTER), drafter)


def official_pair(target_dir, drafter_dir):
    target = transformers.Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    arch = json.load(open(os.path.join(drafter_dir, "config.json")))["architectures"][0]
    drafter = getattr(dflash_model, arch).from_pretrained(drafter_dir, dtype=torch.float64).eval()
    return target, drafter


def assert_same_steps(target, drafter, official_target, official_drafter, prompts, block_size, stops,
                      n_new=40):
    """Our loop and the official one give the same tokens and the same acceptance length at every step."""
    stopped, multi = 0, 0
    for p in prompts:
        ours, stats = speculative_generate(target, drafter, p, n_new, block_size=block_size,
                                           stop_token_ids=stops)
        theirs = dflash_model.dflash_generate(official_drafter, official_target, torch.tensor([p]), n_new,
                                              stops, block_size=block_size, return_stats=True)
        assert theirs.output_ids[0, len(p):].tolist() == ours, \
            f"tokens differ from the official loop (B={block_size})"
        assert theirs.acceptance_lengths == stats.acceptance_lengths, \
            f"acceptance lengths differ (B={block_size}): official {theirs.acceptance_lengths}, " \
            f"ours {stats.acceptance_lengths}"
        stopped += len(ours) < n_new
        multi += max(stats.acceptance_lengths, default=0) > 1
    return stopped, multi


def exported_target(run, folder):
    """Our target from a run folder and its export loaded by transformers, both in float64."""
    tok, target, _ = nanodflash.load(str(run))
    hf.export_target(target, tok, str(folder))
    official = transformers.Qwen3ForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()
    return target.double(), official


def test_last_layer_feature_is_hugging_faces_hidden_state_after_the_final_norm(pairs, tmp_path):
    target, official = exported_target(pairs["dflash"], tmp_path / "t")
    ids = torch.randint(0, target.config.vocab_size, (2, 30), generator=torch.Generator().manual_seed(0))
    L = target.config.n_layer
    _, feats = target(ids, layer_ids=[0, L - 1])                                   # (2, 30, 2*D)
    states = official(ids, output_hidden_states=True).hidden_states
    D = target.config.n_embd
    for j, i in enumerate([0, L - 1]):
        err = (feats[..., j * D:(j + 1) * D] - states[i + 1]).abs().max().item()
        assert err < HF_FLOAT32_TOL, f"feature of layer {i} differs from HF hidden_states[{i + 1}] by {err}"


def test_exported_target_gives_our_logits_in_transformers(pairs, tmp_path):
    target, official = exported_target(pairs["dflash"], tmp_path / "t")
    ids = torch.randint(0, target.config.vocab_size, (2, 50), generator=torch.Generator().manual_seed(1))
    ours, theirs = target(ids)[0], official(ids).logits
    err = (ours - theirs).abs().max().item()
    assert err < HF_FLOAT32_TOL, f"exported target's logits differ from ours by {err}"
    worse = (ours - theirs * 1.001).abs().max().item()
    assert worse > HF_FLOAT32_TOL, \
        "the tolerance cannot tell a 0.1% change of the logits apart: test is too loose"


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_official_dflash_generate_on_an_exported_pair_matches_our_loop_step_for_step(pairs, kind, tmp_path):
    t_dir, d_dir = hf.export(str(pairs[kind]), str(tmp_path / "hf"))
    tok, target, drafter = nanodflash.load(str(pairs[kind]))
    target.double(), drafter.double()
    official_target, official_drafter = official_pair(t_dir, d_dir)
    assert type(official_drafter).__name__ == hf.ARCHITECTURES[kind]
    data = checkpoint.read(str(pairs[kind] / run_folder.DATA), "data")
    prompts = [row[: data["prompt_len"]].tolist() for row in torch.cat([data["val"], data["train"][:4]])]
    said = [t for p in prompts for t in generate(target, p, 40)[3:]]
    frequent = max(set(said), key=said.count)                                  # a stop token that does occur
    for B in (4, 16):
        stopped, multi = assert_same_steps(target, drafter, official_target, official_drafter, prompts, B,
                                           [tok.encode_single_token(ENDOFTEXT), frequent])
        assert stopped > 0, "no generation hit a stop token: the stop rule went untested"
        assert multi > 0, f"no step accepted a draft at B={B}: acceptance went untested"


def tiny_tokenizer_json(folder, vocab_size):
    """A tokenizer.json with `vocab_size` tokens (a real HF folder always has one)."""
    enc = train_tokenizer(open(os.path.abspath(hf.__file__)).read() * 3, vocab_size)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(hf.to_tokenizer_json(enc), f)


def random_official_pair(folder, tied, kind, seed=0):
    """A tiny random Qwen3ForCausalLM and a random official drafter, saved the way Hugging Face saves them."""
    torch.manual_seed(seed)
    V, L = 300, 4
    cfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=L,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, tie_word_embeddings=tied)
    target = transformers.Qwen3ForCausalLM(cfg).double()
    with torch.no_grad():
        target.lm_head.weight.mul_(30.0)                     # peaked distributions: drafts sometimes accepted
    target.save_pretrained(os.path.join(folder, "target"))
    tiny_tokenizer_json(os.path.join(folder, "target"), V)
    dcfg = transformers.Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=256, block_size=8, num_target_layers=L,
                                    dflash_config=dict(mask_token_id=V - 1, target_layer_ids=[1, 2],
                                                       conv_kernel_size=2, conv_group_size=8, selector_rank=8,
                                                       selector_top_k=4),
                                    architectures=[hf.ARCHITECTURES[kind]])
    drafter = getattr(dflash_model, hf.ARCHITECTURES[kind])(dcfg).double()
    with torch.no_grad():
        # every parameter random (incl. convs and codebooks)
        for p in drafter.parameters():
            p.normal_(0.0, 0.3)
    drafter.save_pretrained(os.path.join(folder, "drafter"))
    return target.eval(), drafter.eval()


@pytest.mark.parametrize("tied,kind", [(True, "dflash"), (False, "dflash"),
                                       (True, "dflash2"), (False, "dflash2")])
def test_imported_hugging_face_checkpoints_reproduce_the_official_loop(tmp_path, tied, kind):
    official_target, official_drafter = random_official_pair(str(tmp_path), tied, kind)
    tok, target, drafter = hf.load(str(tmp_path / "target"), str(tmp_path / "drafter"), dtype=torch.float64)
    assert type(drafter).kind == kind and drafter.config.target_layer_ids == [1, 2]
    assert (target.lm_head.weight is target.embed_tokens.weight) == tied, "tied embeddings must stay tied"
    rng = random.Random(1)
    prompts = [[rng.randrange(290) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
    # random drafts are rarely accepted, so first compare whole blocks of drafts directly
    for p in prompts:
        context, anchor = load_context(target, drafter, p), generate(target, p, 1)[0]
        ours = drafter.draft(context, anchor, 7, DraftRule(0.0))[0]
        assert ours.tolist() == official_block_drafts(official_target, official_drafter, p, 8), \
            f"imported {kind} drafter drafts another block than the official one"
    assert_same_steps(target, drafter, official_target, official_drafter, prompts, 8, [])


def load_context(target, drafter, prompt):
    """Our drafter's cache holding the prompt as context."""
    cache = drafter.new_cache(len(prompt) + drafter.config.block_size)
    drafter.extend(cache, target(torch.tensor([prompt]), layer_ids=drafter.config.target_layer_ids)[1], None)
    return cache


@torch.no_grad()
def official_block_drafts(official_target, official_drafter, prompt, block_size):
    """The official drafter's greedy drafts for the first block after `prompt`, called as dflash_generate
    does."""
    out = official_target(torch.tensor([prompt]), output_hidden_states=True)
    context = dflash_model.extract_context_feature(out.hidden_states, official_drafter.target_layer_ids)
    block = torch.full((1, block_size), official_drafter.mask_token_id)
    block[0, 0] = out.logits[0, -1].argmax()
    noise = official_target.get_input_embeddings()(block)
    hidden = official_drafter(target_hidden=context, noise_embedding=noise,
                              position_ids=torch.arange(len(prompt) + block_size)[None])[:, 1 - block_size:]
    head = official_target.lm_head
    if isinstance(official_drafter, dflash_model.DFlash2DraftModel):
        return official_drafter.propose(hidden, block[:, 0], head, 0.0)[0][0].tolist()
    return official_drafter.compute_logits(hidden, head).argmax(-1)[0].tolist()


def test_import_of_an_export_is_bitwise_the_same_pair(pairs, tmp_path, capsys):
    hf.main(["export", "--out", str(pairs["dflash2"]), "--to", str(tmp_path / "hf")])
    assert "model.safetensors" in capsys.readouterr().out, "the export command should say what it wrote"
    tok, target, drafter = nanodflash.load(str(pairs["dflash2"]))
    tok2, target2, drafter2 = hf.load(str(tmp_path / "hf" / "target"), str(tmp_path / "hf" / "drafter"))
    assert target2.config == target.config and drafter2.config == drafter.config, "configs changed on the way"
    assert checkpoint.fingerprint(target2) == checkpoint.fingerprint(target), \
        "target weights changed on the way"
    for name, t in drafter.state_dict().items():
        assert torch.equal(t, drafter2.state_dict()[name]), f"drafter weight {name} changed on the way"
    text = "def f(x):\n    return x  # é <|endoftext|>"
    assert tok2.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all"), \
        "tokenizer changed"


HOSTILE = ["héllo wörld 日本語 🙂 Ωmega", "\x00\x01\x07\x1b[31m\t\r\n\x7f", " " * 60 + "x" + "\t" * 9,
           "\n\n\n   \n\t ", "<|endoftext|>", "<|endoftext |>", "<|mask", "a<|mask|>b<|endoftext|>c",
           "<|<|endoftext|>|>", "\u00a0\u2003\u200b nbsp", "ﬁ e\u0301 é", "'s 're'll don't",
           "12345678901234567890", "💩" * 7]


def test_exported_tokenizer_json_encodes_and_decodes_hostile_text_like_ours(pairs, tmp_path):
    tok, target, _ = nanodflash.load(str(pairs["dflash"]))
    hf.export_target(target, tok, str(tmp_path / "t"))
    fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t"))
    rng = random.Random(0)
    texts = HOSTILE + ["".join(chr(rng.choice([rng.randrange(1, 128), rng.randrange(128, 0x3000),
                                               0x1F600 + rng.randrange(80)]))
                               for _ in range(rng.randrange(1, 60)))
                       for _ in range(300)]
    for text in texts:
        ours = tok.encode(text, allowed_special="all")
        assert fast.encode(text, add_special_tokens=False) == ours, f"HF encodes {text!r} differently"
        assert fast.decode(ours) == tok.decode(ours), f"HF decodes the ids of {text!r} differently"
    wrong = hf.to_tokenizer_json(tok)                                       # negative control: GPT-2's
    wrong["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True    # add_prefix_space, not ours
    with open(tmp_path / "wrong.json", "w", encoding="utf-8") as f:
        json.dump(wrong, f)
    from tokenizers import Tokenizer
    other = Tokenizer.from_file(str(tmp_path / "wrong.json"))
    assert any(other.encode(t).ids != tok.encode(t, allowed_special="all") for t in texts), \
        "a tokenizer that adds a prefix space should differ somewhere; the comparison cannot tell them apart"


def edit_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    cfg = json.load(open(path))
    for k, v in changes.items():
        if v is None:
            cfg.get("dflash_config", {}).pop(k, None)
        elif k in cfg.get("dflash_config", {}) or k in ("output_multiplier",):
            cfg["dflash_config"][k] = v
        else:
            cfg[k] = v
    json.dump(cfg, open(path, "w"))


REFUSALS = [
    ("target", dict(attention_bias=True), "attention_bias=True: attention biases are not modelled"),
    ("target", dict(use_sliding_window=True), "use_sliding_window=True: sliding-window attention"),
    ("target", dict(layer_types=["sliding_attention"] * 2), "layer_types=['sliding_attention'"),
    ("target", dict(model_type="qwen3_moe"), "model_type='qwen3_moe': only dense Qwen3"),
    ("target", dict(num_experts=8), "num_experts=8: mixture-of-experts"),
    ("target", dict(architectures=["LlamaForCausalLM"]),
     "architectures=['LlamaForCausalLM']: need Qwen3ForCausalLM"),
    ("target", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling="),
    ("drafter", dict(mask_token_id=None), "dflash_config.mask_token_id is missing"),
    ("drafter", dict(architectures=["EagleDraftModel"]), "architectures=['EagleDraftModel']: need one of"),
    ("drafter", dict(output_multiplier=2.0), "output_multiplier=2.0 is not modelled"),
    ("drafter", dict(is_causal=True), "is_causal=True: a causal drafter block"),
]


@pytest.mark.parametrize("which,changes,message", REFUSALS, ids=[str(list(c)[0]) for _, c, _ in REFUSALS])
def test_import_refuses_what_nanodflash_does_not_model_naming_the_field(
        pairs, tmp_path, which, changes, message):
    t_dir, d_dir = hf.export(str(pairs["dflash2"]), str(tmp_path / "hf"))
    edit_config(t_dir if which == "target" else d_dir, **changes)
    with pytest.raises(ValueError, match=None) as err:
        hf.load(t_dir, d_dir)
    assert message in str(err.value), f"refusal should say {message!r}, said {err.value}"


def test_export_refuses_drafters_the_official_code_cannot_run(pairs, tmp_path):
    tok, target, _ = nanodflash.load(str(pairs["dflash"]))
    config = DrafterConfig.for_target(target.config, special_ids(tok)[1], n_layer=1, block_size=4)
    ar = ARDrafter(config, target)
    with pytest.raises(ValueError, match="only DFlash and DFlash 2 drafters have an official layout"):
        hf.export_drafter(ar, str(tmp_path / "ar"))


def test_a_tokenizer_json_tiktoken_cannot_reproduce_is_refused(pairs, tmp_path):
    tok, _, _ = nanodflash.load(str(pairs["dflash"]))
    spec = hf.to_tokenizer_json(tok)
    spec["model"]["merges"] = spec["model"]["merges"][::-1]                  # merges out of id order
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(spec, f)
    with pytest.raises(ValueError, match="out of id order"):
        hf.from_tokenizer_json(str(tmp_path / "tokenizer.json"))


def test_sample_py_runs_the_demo_on_an_exported_pair_and_stays_lossless(pairs, tmp_path, capsys):
    import sample
    t_dir, d_dir = hf.export(str(pairs["dflash2"]), str(tmp_path / "hf"))
    sample.main(["--hf", t_dir, d_dir, "--prompt", "def main(", "--max_new_tokens", "30", "--no-color"])
    out = capsys.readouterr().out
    assert f"{t_dir} + {d_dir}" in out, "the header should name the Hugging Face folders"
    assert "token-identical to plain greedy decoding" in out and "PASS" in out, \
        f"no lossless self-check:\n{out}"
