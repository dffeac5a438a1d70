"""The trace (tools/trace.py, tools/trace_page.py): recording a run never changes it, the steps rebuild the
output, each step's recorded verdict is the rule's own, and the page embeds the run safely."""

import json
import re

import pytest
import torch

from helpers import run_command
from nanodflash.exercises.models import small_drafters, small_target, tiny_dflash2, tiny_drafter, tiny_target
from nanodflash.ext.sampled_tree import SampledDraws
from nanodflash.ext.tree import tree_speculative_generate
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.prompt_lookup import PromptLookupDrafter
from nanodflash.tools.repetition import repetition
from nanodflash.tools.trace import TraceRecorder, replay
from nanodflash.tools.trace_page import embedded_json, viewer_html, write_page
from nanodflash.tools.watch import policy, watched_generate

PROMPT = [7, 1, 4, 1, 5, 9, 2, 6]


class Letters:
    """A stand-in tokenizer: id i is a letter, and id 3 is a token that would end a <script> element."""

    def decode(self, ids):
        return "".join("</script>" if i == 3 else chr(97 + i % 26) for i in ids)


def run(decode, drafter, record, **kw):
    rule = kw.pop("rule", "rejection")
    sampling = (kw.get("temperature", 0.0), kw.get("top_k"), kw.get("top_p"))
    recorder = TraceRecorder(Letters(), drafter, *sampling, rule) if record else None
    gen = torch.Generator().manual_seed(3)
    out, stats = decode(drafter, generator=gen, on_step=recorder, **kw)
    return out, stats, recorder


def cases():
    """(name, decode(drafter, **kw), drafter, kw): greedy and sampled paths, both verifiers, both trees."""
    big, small = tiny_target(), small_target()
    d1, d2 = tiny_drafter(big, block_size=8), tiny_dflash2(big, block_size=8, perturb=0.3)
    sd = small_drafters(small)

    def path(target, n):
        prompt = PROMPT[:2] if target is big else [1, 2]
        return lambda d, **kw: watched_generate(target, d, prompt, n, **kw)

    def tree(target, n, nodes, sampled=False):
        prompt = PROMPT[:2] if target is big else [1, 2]
        draws = SampledDraws() if sampled else None
        return lambda d, **kw: tree_speculative_generate(target, d, prompt, n, tree_nodes=nodes, draws=draws,
                                                         **kw)
    return [("greedy DFlash", path(big, 40), d1, {}),
            ("greedy DFlash 2", path(big, 40), d2, {}),
            ("rejection T=0.7 top-p", path(small, 12), sd["dflash2"], dict(temperature=0.7, top_p=0.9)),
            ("match T=1", path(small, 12), sd["dflash"],
             dict(temperature=1.0, verifier="match", rule="match")),
            ("greedy tree", tree(big, 40, 8), d2, {}),
            ("sampled tree", tree(small, 12, 6, True), sd["dflash"], dict(temperature=1.0))]


def watched_cases():
    """The path cases, and prompt lookup on text that repeats (a drafter whose context is a token list)."""
    big = tiny_target()
    lookup = ("prompt lookup", None, PromptLookupDrafter(big, 8), {})
    return [c for c in cases()[:4]] + [lookup]


@pytest.mark.parametrize("case", watched_cases(), ids=lambda c: c[0])
def test_the_watched_loop_decodes_exactly_as_speculative_generate_with_or_without_a_callback(case):
    name, _, drafter, kw = case
    kw = {k: v for k, v in kw.items() if k != "rule"}
    target, n = drafter.target, 40 if kw == {} else 12
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2] if name == "prompt lookup" else [1, 2]
    for block_size in (None, 3, "auto"):
        want, want_stats = speculative_generate(target, drafter, prompt, n, block_size=policy(block_size),
                                                generator=torch.Generator().manual_seed(3), **kw)
        for on_step in (None, lambda record: None):
            got, stats = watched_generate(target, drafter, prompt, n, block_size=block_size, on_step=on_step,
                                          generator=torch.Generator().manual_seed(3), **kw)
            assert got == want, f"{name}, B={block_size}: the watched loop emitted other tokens"
            assert stats.acceptance_lengths == want_stats.acceptance_lengths, \
                f"{name}, B={block_size}, callback {on_step is not None}: the watched loop took other steps"
            assert stats.verify_time > 0, f"{name}: the watched loop timed nothing"
    assert max(want_stats.acceptance_lengths) > 1, f"{name}: no draft was ever kept: the check saw nothing"


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_recording_a_run_changes_neither_its_tokens_nor_its_acceptance_lengths(case):
    name, decode, drafter, kw = case
    plain_kw = {k: v for k, v in kw.items() if k != "rule"}
    out, stats, _ = run(decode, drafter, False, **dict(plain_kw))
    rec_out, rec_stats, recorder = run(decode, drafter, True, **dict(kw))
    assert rec_out == out, f"{name}: recording changed the tokens"
    assert rec_stats.acceptance_lengths == stats.acceptance_lengths, f"{name}: recording changed the steps"
    assert len(recorder.steps) == len(stats.acceptance_lengths), f"{name}: one record per step"


@pytest.mark.parametrize("case", cases(), ids=lambda c: c[0])
def test_the_steps_rebuild_the_output_and_greedy_traces_rebuild_plain_greedy_decoding(case):
    name, decode, drafter, kw = case
    out, stats, recorder = run(decode, drafter, True, **dict(kw))
    trace = recorder.trace(PROMPT[:2], out)
    assert replay(trace) == out, \
        f"{name}: the prefill token, then each step's kept drafts and bonus, is not the output"
    assert trace["run"] == dict(tau=stats.tau, repetition=repetition(out)), \
        f"{name}: the page's header must show the run's τ beside its output's repetition: {trace['run']}"
    if not kw:
        target = tiny_target()
        assert replay(trace) == generate(target, PROMPT[:2], len(out)), f"{name}: not plain greedy decoding"
        for s in trace["steps"]:
            if "path" not in s:
                kept = s["accepted"]
                assert s["drafts"][:kept] == s["target_tokens"][:kept], "kept draft != target token"
                assert kept == len(s["drafts"]) or s["drafts"][kept] != s["target_tokens"][kept], \
                    "a draft equal to the target's token was recorded as rejected"


def test_the_recorded_uniforms_are_the_ones_the_rejection_rule_used():
    name, decode, drafter, kw = cases()[2]
    out, _, recorder = run(decode, drafter, True, **dict(kw))
    rejected = 0
    for s in recorder.steps:
        ok = [u * q < p for u, q, p in zip(s["u"], s["q_d"], s["p_d"])]
        n = s["accepted"]
        assert all(ok[:n]), f"a kept draft fails u < p/q with the recorded u: {s}"
        if n < len(ok):
            assert not ok[n], f"the rejected draft passes u < p/q with the recorded u: {s}"
            rejected += 1
    assert rejected, "no rejection happened: the check saw nothing"


def test_dflash2_steps_record_each_slots_candidates_with_the_chosen_draft_among_them():
    name, decode, drafter, kw = cases()[1]
    _, _, recorder = run(decode, drafter, True, **dict(kw))
    for s in recorder.steps:
        assert len(s["candidates"]) == len(s["drafts"])
        for slot, d in zip(s["candidates"], s["drafts"]):
            assert slot[0][0] == d, f"the greedy walk takes the best-scored candidate: {slot} for draft {d}"


def test_the_page_embeds_the_trace_so_that_no_token_can_end_its_script_element(tmp_path):
    name, decode, drafter, kw = cases()[0]
    out, _, recorder = run(decode, drafter, True, **dict(kw))
    trace = recorder.trace([3] + PROMPT[:2], out, {"checkpoint": "tiny"})     # id 3 reads "</script>"
    assert "</script>" in json.dumps(trace), "the trace must hold the dangerous token for this test"
    page = open(write_page(trace, tmp_path / "t.html"), encoding="utf-8").read()
    block = re.search(r'<script type="application/json" id="nanodflash-trace">(.*?)</script>', page, re.S)
    assert block is not None, "the page has no trace data element"
    assert json.loads(block.group(1)) == json.loads(json.dumps(trace)), "the embedded JSON is not the trace"
    assert "</script>" not in embedded_json(trace)
    for part in ("prev", "next", "play", "slider", "sentence", "block", "text", "figures"):
        assert f'id="nanodflash-{part}"' in page, f"the page lacks its {part} element"
    assert "http://" not in page and "https://" not in page, "the page must load nothing from the network"


def test_two_viewers_on_one_page_have_their_own_element_ids():
    name, decode, drafter, kw = cases()[0]
    out, _, recorder = run(decode, drafter, True, **dict(kw))
    trace = recorder.trace(PROMPT[:2], out)
    a, b = viewer_html(trace, "one-"), viewer_html(trace, "two-")
    ids = lambda h: set(re.findall(r'id="([^"]+)"', h))    # noqa: E731
    assert not ids(a) & ids(b), f"shared element ids: {ids(a) & ids(b)}"
    with pytest.raises(ValueError, match="prefix"):
        viewer_html(trace, 'x" onload="')


@pytest.mark.parametrize("flags", [[], ["--temperature", "0.7", "--top_p", "0.95"],
                                   ["--temperature", "1", "--verifier", "match"], ["--tree", "8"]],
                         ids=["greedy", "rejection", "match", "tree"])
def test_sample_py_writes_the_trace_page(smoke_out, tmp_path, flags):
    page = tmp_path / "trace.html"
    result = run_command("sample.py", "--out", smoke_out, "--max_new_tokens", "24", "--html", page, *flags)
    assert result.returncode == 0, result.stderr
    assert page.exists() and "wrote" in result.stdout, result.stdout
    text = page.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="nanodflash-trace">(.*?)</script>', text, re.S).group(1))
    assert replay(data) == data["output"] and data["steps"], "the page's trace does not rebuild its output"
