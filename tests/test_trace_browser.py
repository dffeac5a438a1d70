"""The trace page in a real browser: headless Chromium loads a smoke run's page from a file:// URL, steps
through every step with the controls, and what it shows is checked against the embedded data; a hand-made
step's page shows its tiny probabilities as numbers, not as 0.

Needs Debian's chromium and chromium-driver and the test extra's selenium. CI sets
NANODFLASH_BROWSER_REQUIRED=1 (.ci/run installs the browser), where a missing browser fails; elsewhere the
test skips, saying what to install.
"""

import json
import re

import pytest

from helpers import browser, run_command, visible
from nanodflash.tools.trace_page import write_page


@pytest.mark.parametrize("flags", [[], ["--temperature", "0.7"], ["--tree", "6"]],
                         ids=["greedy", "sampled", "tree"])
def test_the_page_steps_through_every_step_and_shows_what_the_run_did(smoke_out, tmp_path, flags):
    page = tmp_path / "trace.html"
    result = run_command("sample.py", "--out", smoke_out, "--max_new_tokens", "24", "--html", page, *flags)
    assert result.returncode == 0, result.stderr
    data = json.loads(re.search(r'id="nanodflash-trace">(.*?)</script>', page.read_text(encoding="utf-8"),
                                re.S).group(1))
    show = lambda i: visible(data["tokens"][str(i)])     # noqa: E731
    driver = browser()
    try:
        driver.get(page.as_uri())
        by_id = lambda name: driver.find_element("id", "nanodflash-" + name)   # noqa: E731
        text = [show(i) for i in data["prompt"] + data["output"][:1]]
        steps = data["steps"]
        for k, s in enumerate(steps):
            assert by_id("count").text == f"step {k + 1} of {len(steps)}", f"step {k}: the counter"
            kept = s["accepted_tokens"] + ([s["bonus"]] if s["bonus"] is not None else [])
            text += [show(i) for i in kept]
            shown = by_id("text").get_attribute("textContent")
            assert shown == "".join(text), f"step {k}: the text so far is not the run's"
            sentence = by_id("sentence").text
            if s["drafts"]:
                n = s["accepted"]
                said = f"{n} draft{'' if n == 1 else 's'} kept of {len(s['drafts'])}"
                assert sentence.startswith(said), f"step {k}: the sentence does not say {said!r}: {sentence}"
            if "parent" in s:
                nodes = by_id("block").find_elements("css selector", ".tree div")
                assert len(nodes) == len(s["drafts"]) + 1, f"step {k}: the tree shows other nodes"
                green = [d.text.split("]")[0].strip(" [") for d in nodes
                         if "kept" in d.get_attribute("class")]
                assert [int(x) for x in green] == s["path"], f"step {k}: another path is highlighted"
                if "target_tokens" in s:
                    why = by_id("block").find_element("css selector", "div.why").text
                    assert "never compared" in why, f"step {k}: the tree does not say what grey means: {why}"
            elif s["drafts"]:
                rows = by_id("block").find_elements("css selector", "tr.kept, tr.rejected, tr.unseen")
                whys = by_id("block").find_elements("css selector", "tr.why")
                unseen = len(s["drafts"]) - s["accepted"] - 1
                assert len(whys) == (unseen > 0), f"step {k}: {unseen} grey rows, {len(whys)} explanations"
                cells = [r.find_elements("css selector", "td")[1].get_attribute("textContent") for r in rows]
                assert cells == [show(d) for d in s["drafts"]], f"step {k}: the drafts shown are others"
                verdicts = [r.get_attribute("class") for r in rows]
                assert verdicts.count("kept") == s["accepted"], f"step {k}: kept rows"
            if k + 1 < len(steps):
                by_id("next").click()
        by_id("root").send_keys("\ue012")                            # ArrowLeft: one step back
        assert by_id("count").text == f"step {max(len(steps) - 1, 1)} of {len(steps)}", "the arrow key"
        driver.save_screenshot(str(tmp_path / "trace.png"))
    finally:
        driver.quit()


def test_the_page_shows_a_tiny_probability_as_a_tiny_number_and_only_an_exact_zero_as_0(tmp_path):
    # One sampled step, made by hand: draft 1 kept although p and q are tiny (u * q < p), draft 2 kept,
    # draft 3 rejected with p(d) exactly 0 (the target's top-p cut it)
    step = dict(anchor=1, block_size=4, drafts=[2, 3, 4], accepted=2, accepted_tokens=[2, 3], bonus=5,
                residual_token=5, target_cache=[2, 5], draft_cache=[2, 5], draft_s=0.001, verify_s=0.002,
                p_d=[7e-4, 0.5, 0.0], q_d=[3.2e-5, 0.25, 0.125], u=[0.3, 0.0004, 0.9])
    settings = dict(temperature=1.0, top_k=None, top_p=0.9, verifier="rejection", drafter="dflash")
    trace = dict(settings=settings, prompt=[0], output=[1, 2, 3, 5], steps=[step],
                 tokens={str(i): "abcdef"[i] for i in range(6)}, run=dict(tau=3.0, repetition=0.0))
    page = write_page(trace, tmp_path / "tiny.html")
    driver = browser()
    try:
        driver.get(page.as_uri())
        rows = driver.find_element("id", "nanodflash-block").find_elements("css selector", "tr")[2:]
        cells = [[td.text for td in r.find_elements("css selector", "td")[3:6]] for r in rows]
        shown = [["7.0e-4", "3.2e-5", "0.300"], ["0.500", "0.250", "4.0e-4"], ["0", "0.125", "0.900"]]
        assert cells == shown, f"p(d), q(d), u as the page shows them: {cells}"
        sentence = driver.find_element("id", "nanodflash-sentence").text
        assert "u = 0.90 ≥ p/q = 0;" in sentence, sentence
    finally:
        driver.quit()


def test_grey_rows_after_a_rejected_draft_say_they_were_not_checked_and_why(tmp_path):
    # One greedy step, made by hand: draft 1 kept, draft 2 rejected, drafts 3 and 4 never compared
    step = dict(anchor=1, block_size=5, drafts=[2, 3, 4, 5], accepted=1, accepted_tokens=[2], bonus=6,
                target_cache=[2, 4], draft_cache=[2, 4], draft_s=0.001, verify_s=0.002,
                target_tokens=[2, 6, 1, 0, 3])
    settings = dict(temperature=0.0, top_k=None, top_p=None, verifier="greedy", drafter="dflash")
    trace = dict(settings=settings, prompt=[0], output=[1, 2, 6], steps=[step],
                 tokens={str(i): "abcdefg"[i] for i in range(7)}, run=dict(tau=2.0, repetition=0.0))
    page = write_page(trace, tmp_path / "grey.html")
    driver = browser()
    try:
        driver.get(page.as_uri())
        rows = driver.find_element("id", "nanodflash-block").find_elements("css selector", "tr")[2:]
        kinds = [r.get_attribute("class") for r in rows]
        assert kinds == ["kept", "rejected", "why", "unseen", "unseen"], \
            f"the explanation is not the row between the rejected draft and the grey ones: {kinds}"
        why = rows[2].text
        for words in ("Not checked", "verify pass computed the target's token at every slot",
                      "after the rejected draft", "never compared"):
            assert words in why, f"the explanation beside the grey rows does not say {words!r}: {why}"
        assert rows[2].is_displayed(), "the explanation is not shown"
        legend = driver.find_element("css selector", ".settings").text
        assert "not checked (after a rejected draft)" in legend, f"the legend leaves grey out: {legend}"
    finally:
        driver.quit()
