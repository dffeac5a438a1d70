"""Claims about the race (nanodflash/tools/race.py) and its page: the lanes are real runs of the decoders,
their clocks are their own measured times, and the page, played in headless Chromium, shows what they did;
the what-if panel computes what block_policy's formulas do."""

import json
import re
import time

import pytest
import torch

from helpers import browser, run_command, visible
from nanodflash.ext.block_policy import auto, expected_tokens
from nanodflash.ext.step_costs import linear_costs
from nanodflash.speculative import generate, speculative_generate
from nanodflash.tools.cli import decode_threads
from nanodflash.tools.race import record_race
from nanodflash.tools.race_page import note, race_html, write_race_page
from nanodflash.tools.trace import replay


class Tok:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


@pytest.fixture(scope="module")
def greedy_race(target, drafter):
    return record_race(Tok(), target, drafter, [1, 2, 3], 16, repeats=2)



def projected(page):
    """A browser showing `page` in a 1280x720 viewport, a projector's."""
    driver = browser(1280, 720)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           dict(width=1280, height=720, deviceScaleFactor=1, mobile=False))
    driver.get(page.as_uri())
    return driver

def test_greedy_lanes_emit_plain_greedy_decodings_tokens(greedy_race, target):
    plain = generate(target, [1, 2, 3], 16)
    for lane in greedy_race["lanes"]:
        assert lane["output"] == plain, f"the {lane['label']} lane's tokens are not plain greedy decoding's"
        if lane["trace"] is not None:
            assert replay(lane["trace"]) == plain, f"the {lane['label']} lane's recorded steps rebuild others"


def test_each_lane_clock_is_its_own_runs_events_ending_at_the_runs_seconds(greedy_race):
    for lane in greedy_race["lanes"]:
        times = [e[0] for e in lane["events"]]
        assert times == sorted(times) and 0 < times[0] and times[-1] <= lane["seconds"], \
            f"the {lane['label']} lane's events are not in order within its run"
        assert sum(e[1] for e in lane["events"]) == len(lane["output"]), f"{lane['label']}: tokens lost"
        assert lane["seconds"] in lane["all_seconds"] and \
            sorted(lane["all_seconds"])[len(lane["all_seconds"]) // 2] == lane["seconds"], \
            f"{lane['label']}: the lane shown is not the median of its timed runs"
        assert len(lane["events"]) == lane["forwards"], f"{lane['label']}: one event per target forward"
        assert lane["speedup"] == greedy_race["lanes"][0]["seconds"] / lane["seconds"]


def test_the_race_page_names_the_thread_counts_its_lanes_ran_at(greedy_race, drafter):
    counts = decode_threads(drafter)
    said = f"threads {counts['plain']} plain, {counts['speculative']} speculative"
    assert said in race_html(greedy_race), f"the page does not say {said!r}: a lane's clock depends on it"


def test_sampled_lanes_are_the_decoders_own_seeded_samples(small):
    target, drafters = small
    drafter = drafters["dflash"]
    race = record_race(Tok(), target, drafter, [1, 2], 12, temperature=0.9, seed=7, repeats=1)
    g = torch.Generator().manual_seed(7)
    assert race["lanes"][0]["output"] == generate(target, [1, 2], 12, temperature=0.9, generator=g), \
        "the plain sampling lane is not plain sampling with the race's seed"
    g = torch.Generator().manual_seed(7)
    path, _ = speculative_generate(target, drafter, [1, 2], 12, block_size=auto, temperature=0.9,
                                   generator=g)
    assert race["lanes"][1]["output"] == path, "the sampled path lane is not the decoder's seeded sample"
    assert "exact sample" in note(race), "a sampled race does not say why its texts differ"


def page_data(page, element):
    return json.loads(re.search(rf'id="{element}">(.*?)</script>', page.read_text(encoding="utf-8"),
                                re.S).group(1))


@pytest.mark.parametrize("flags", [[], ["--temperature", "0.8"]], ids=["greedy", "sampled"])
def test_the_race_page_plays_to_the_end_opens_steps_and_computes_the_panel_as_python(smoke_out, tmp_path,
                                                                                    flags):
    page = tmp_path / "race.html"
    result = run_command("sample.py", "--out", smoke_out, "--max_new_tokens", "24", "--race", page, *flags)
    assert result.returncode == 0, result.stderr
    data, whatif = page_data(page, "race-data"), page_data(page, "race-wi-data")
    show = lambda i: visible(data["tokens"][str(i)])     # noqa: E731
    driver = projected(page)
    try:
        by_id = lambda name: driver.find_element("id", "race-" + name)   # noqa: E731
        js = driver.execute_script
        boxes = [by_id("lane-" + lane["key"]).rect for lane in data["lanes"]]
        for a, b in zip(boxes, boxes[1:]):
            assert a["y"] + a["height"] <= b["y"], "two lanes overlap"
        assert boxes[-1]["y"] + boxes[-1]["height"] <= 720, "the lanes do not fit a 1280x720 projector"
        small = js("return [...document.querySelectorAll('.race *, .whatif *')].filter(e => e.textContent "
                   "&& parseFloat(getComputedStyle(e).fontSize) < 18).map(e => e.tagName + e.className)")
        assert not small, f"text under 18 px: {small[:5]}"
        js("document.getElementById('race-speed').value = '256'")
        by_id("play").click()
        for _ in range(300):
            if by_id("root").get_attribute("data-done") == "1":
                break
            time.sleep(0.1)
        assert by_id("root").get_attribute("data-done") == "1", "the race did not end"
        for lane in data["lanes"]:
            text = by_id("text-" + lane["key"]).get_attribute("textContent")
            assert text == "".join(show(i) for i in data["prompt"] + lane["output"]), \
                f"the {lane['label']} lane's text is not its run's"
            box = by_id("lane-" + lane["key"])
            assert int(box.get_attribute("data-tokens")) == len(lane["output"])
            assert int(box.get_attribute("data-forwards")) == lane["forwards"]
            assert f"{lane['speedup']:.2f}x plain" in by_id("result-" + lane["key"]).text
        if data["settings"]["temperature"] > 0:
            assert "exact sample" in by_id("root").text, "a sampled race does not say why its texts differ"
        step = driver.find_elements("css selector", "#race-text-path [data-step]")[-1]
        js("arguments[0].click()", step)
        k = int(step.get_attribute("data-step"))
        assert by_id("viewer-path").is_displayed(), "clicking a token did not open its lane's viewer"
        assert by_id("path-count").text.startswith(f"step {k + 1} of "), "the viewer is at another step"

        def panel(name):
            return float(by_id("wi-" + name).get_attribute("data-value"))

        def check(what):
            B, n = whatif["max_block_size"], int(by_id("wi-block").get_attribute("value")) - 1
            step_cost, slot = (float(by_id("wi-" + s).get_attribute("value")) for s in ("step", "slot"))
            rates = (whatif["rates"] if by_id("wi-curve").is_selected()
                     else [float(by_id("wi-alpha").get_attribute("value"))] * (B - 1))
            tau, cost = expected_tokens(rates[:n])[n], linear_costs(B, step_cost, slot)[n]
            for name, value in (("tau", tau), ("cost", cost), ("speedup", tau / cost)):
                assert abs(panel(name) - value) < 1e-9, f"after {what}: the panel's {name} is not Python's"

        def move(name, value, event="input"):
            js(f"const e = document.getElementById('race-wi-{name}'); e.value = '{value}'; "
               f"e.dispatchEvent(new Event('{event}'))")
            check(f"{name} = {value}")

        check("loading")
        if by_id("wi-curve").is_selected():
            by_id("wi-curve").click()
            check("unticking the run's rates")
        for name, value in (("alpha", 0.63), ("block", 3), ("step", 1.37), ("slot", 0.061)):
            move(name, value)
        by_id("wi-curve").click()
        check("ticking the run's rates")
        for preset in ("measured", "gpu"):
            move("preset", preset, "change")
            assert abs(float(by_id("wi-step").get_attribute("value")) - whatif[preset][0]) < 1e-9, \
                f"the {preset} preset did not set the step cost"
    finally:
        driver.quit()


def test_at_1280x720_the_what_if_panel_stays_in_view_beside_the_lanes_and_opens_on_the_calibration(
        greedy_race, tmp_path):
    page = write_race_page(greedy_race, tmp_path / "race.html")
    whatif = greedy_race["whatif"]
    driver = projected(page)
    try:
        by_id = lambda name: driver.find_element("id", "race-" + name)   # noqa: E731
        js = driver.execute_script

        def in_view(when):
            width, height, scrolled = js("return [innerWidth, innerHeight, scrollY]")
            assert (width, height, scrolled) == (1280, 720, 0), f"{when}: the window is {width}x{height}, " \
                f"scrolled {scrolled}"
            for name in ["wi-root"] + ["lane-" + lane["key"] for lane in greedy_race["lanes"]]:
                r = by_id(name).rect
                assert r["x"] >= 0 and r["y"] >= 0 and r["x"] + r["width"] <= width and \
                    r["y"] + r["height"] <= height, f"{when}: {name}'s box {r} leaves the 1280x720 window"

        in_view("at load")
        assert by_id("wi-preset").get_attribute("value") == "calibrated", "the panel opens on another preset"
        assert float(by_id("wi-step").get_attribute("value")) == whatif["calibrated"][0], \
            "the panel's step cost is not the calibration's"
        assert int(by_id("wi-block").get_attribute("value")) == whatif["measured_drafts"] + 1, \
            "the panel opens on another block size than the path lane's"
        by_id("play").click()
        time.sleep(0.3)
        assert by_id("root").get_attribute("data-done") == "0", "the race ended before it could be looked at"
        in_view("mid-race")
        js("document.getElementById('race-speed').value = '256'")
        for _ in range(100):
            if by_id("root").get_attribute("data-done") == "1":
                break
            time.sleep(0.05)
        in_view("at the end, every lane's result shown")
    finally:
        driver.quit()
