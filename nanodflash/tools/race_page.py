"""The race page: a recorded race (race.py) replayed lane by lane in one self-contained HTML file, with each
speculative lane's steps in the trace viewer (trace_page.py) and the what-if panel (whatif_panel.py).

    write_race_page(race, "race.html")       # open it in any browser, offline (file:// works)
    race_html(race, "r03-")                  # the same as an HTML fragment, for a notebook cell

Each lane's clock runs on its own recorded event times, slowed by one factor for every lane so that the plain
lane lasts PLAIN_SECONDS; a speed control multiplies it. Clicking a token of a speculative lane opens the step
that emitted it in that lane's viewer. The data sits in <script type="application/json"> elements, escaped as
the trace page's are; plain JavaScript and CSS inline, no network.
"""

import html

from .trace_page import embedded_json, script, viewer_html
from .whatif_panel import panel_html

PLAIN_SECONDS = 20.0      # the plain lane's length on the page at speed 1 (real time is too fast to watch)
SPEEDS = (0.25, 0.5, 1, 2, 4, 16, 256)

# At 1280x720 (a projector) the lanes and the what-if panel stand side by side, both above the fold; a
# narrower window wraps the panel under the lanes. No text under 18 px.
CSS = """
.race { font: 18px/1.4 system-ui, sans-serif; color: #222; max-width: 1264px; }
.race .stage { display: flex; flex-wrap: wrap; gap: 0 12px; align-items: flex-start; }
.race .lanes { flex: 1 1 620px; min-width: 0; }
.race .stage > .whatif { flex: 0 1 600px; min-width: 0; margin: 0; }
.race h2 { font-size: 22px; margin: 4px 0; }
.race .note { color: #555; font-size: 18px; margin: 4px 0; }
.race .controls { display: flex; gap: 4px 12px; flex-wrap: wrap; align-items: center; margin: 6px 0;
  font-size: 18px; }
.race .controls button, .race .controls select { font-size: 18px; padding: 2px 12px; }
.race .lane { border: 1px solid #bbb; border-radius: 6px; padding: 4px 10px; margin: 6px 0; }
.race .lanehead { display: flex; flex-wrap: wrap; gap: 0 16px; font-size: 18px; }
.race .lanehead b { font-size: 20px; white-space: nowrap; }
.race .clock { font-family: ui-monospace, monospace; white-space: nowrap; }
.race .text { font: 18px/1.35 ui-monospace, monospace; white-space: pre-wrap; height: 80px;
  overflow: auto; border-top: 1px solid #ddd; margin-top: 4px; padding-top: 4px; }
.race .tok { border-radius: 3px; padding: 0 1px; }
.race .prompt { color: #777; } .race .draft { background: #c8f0c8; cursor: pointer; }
.race .target { background: #ffd8a8; } .race .stepped { cursor: pointer; } .race .ws { color: #aaa; }
.race .result { font-weight: bold; color: #1b5e20; }
.race .viewer { display: none; border-top: 3px solid #1565c0; margin-top: 12px; padding-top: 6px; }
"""

SCRIPT = r"""
(function () {
  const P = "%(prefix)s";
  const $ = (name) => document.getElementById(P + name);
  const data = JSON.parse($("data").textContent);
  const T = data.tokens, lanes = data.lanes;
%(tokens)s
  const end = Math.max(...lanes.map((l) => l.seconds));
  let t = 0, last = null, playing = false;
  const shown = lanes.map(() => 0);

  function span(id, cls, lane, step) {
    const attrs = step === null ? "" : ' data-lane="' + lane + '" data-step="' + step + '"';
    return '<span class="tok ' + cls + (step === null ? "" : " stepped") + '"' + attrs + ">" +
      visible(show(id)) + "</span>";
  }

  function reset() {
    t = 0;
    lanes.forEach((lane, i) => {
      shown[i] = 0;
      $("text-" + lane.key).innerHTML = data.prompt.map((id) => span(id, "prompt", lane.key, null)).join("");
      $("result-" + lane.key).textContent = "";
    });
    $("root").dataset.done = "0";
    render();
  }

  function render() {
    lanes.forEach((lane, i) => {
      const box = $("text-" + lane.key);
      let html = "";
      while (shown[i] < lane.events.length && lane.events[shown[i]][0] <= t) {
        const [at, n, drafted] = lane.events[shown[i]];
        const first = lane.events.slice(0, shown[i]).reduce((a, e) => a + e[1], 0);
        const step = lane.key === "plain" || shown[i] === 0 ? null : shown[i] - 1;
        for (let j = 0; j < n; j++) {
          html += span(lane.output[first + j], j < drafted ? "draft" : "target", lane.key, step);
        }
        shown[i] += 1;
      }
      if (html) { box.insertAdjacentHTML("beforeend", html); box.scrollTop = box.scrollHeight; }
      const emitted = lane.events.slice(0, shown[i]).reduce((a, e) => a + e[1], 0);
      const clock = Math.min(t, lane.seconds);
      $("clock-" + lane.key).textContent = (1000 * clock).toFixed(1) + " ms · " + emitted + " tokens · " +
        shown[i] + " target forwards";
      $("lane-" + lane.key).dataset.tokens = emitted;
      $("lane-" + lane.key).dataset.forwards = shown[i];
      if (t >= lane.seconds && !$("result-" + lane.key).textContent) {
        const tau = lane.tau === null ? "" : " · τ " + lane.tau.toFixed(2);
        $("result-" + lane.key).textContent = "done: " + lane.speedup.toFixed(2) + "x plain" + tau +
          " on text " + Math.round(100 * lane.repetition) + "% repeated";
      }
    });
    if (t >= end) { $("root").dataset.done = "1"; pause(); }
  }

  function frame(now) {
    if (!playing) return;
    if (last !== null) t += (now - last) / 1000 * Number($("speed").value) / data.slow;
    last = now;
    render();
    if (playing) requestAnimationFrame(frame);
  }
  function pause() { playing = false; last = null; $("play").textContent = "play"; }
  $("play").onclick = () => {
    if (playing) { pause(); return; }
    if (t >= end) reset();
    playing = true; $("play").textContent = "pause"; requestAnimationFrame(frame);
  };
  $("restart").onclick = () => { pause(); reset(); };
  $("root").addEventListener("click", (e) => {
    const el = e.target.closest("[data-step]");
    if (!el) return;
    lanes.forEach((lane) => { const v = $("viewer-" + lane.key); if (v) v.style.display = "none"; });
    const box = $("viewer-" + el.dataset.lane);
    box.style.display = "block";
    document.getElementById(P + el.dataset.lane + "-root").goTo(Number(el.dataset.step));
    box.scrollIntoView();
  });
  reset();
})();
"""


def lane_html(lane, prefix):
    p, key = prefix, lane["key"]
    return (f'<div class="lane" id="{p}lane-{key}"><div class="lanehead"><b>{html.escape(lane["label"])}</b>'
            f'<span class="result" id="{p}result-{key}"></span></div><div class="clock" id="{p}clock-{key}">'
            f'</div><div class="text" id="{p}text-{key}"></div></div>\n')


def note(race):
    s = race["settings"]
    if s["temperature"] > 0:
        return ("Each lane is its own exact sample of the target's distribution (temperature "
                f"{s['temperature']:g}): the decoders draw their random numbers differently, so their texts "
                "differ from plain sampling's and from each other, but not their law.")
    return "Greedy: every lane emits exactly plain decoding's tokens; only their clocks differ."


def race_html(race, prefix="race-"):
    """The race as an HTML fragment (style, controls, lanes, viewers, what-if panel, data, script)."""
    if not prefix or not all(c.isalnum() or c in "-_" for c in prefix):
        raise ValueError(f"prefix must be letters, digits, - or _, got {prefix!r}")
    p, s = prefix, race["settings"]
    plain = race["lanes"][0]["seconds"]
    slow = PLAIN_SECONDS / plain
    data = dict(race, lanes=[{k: v for k, v in lane.items() if k != "trace"} for lane in race["lanes"]],
                slow=slow)
    shown = ", ".join(f"{k} {v}" for k, v in s.items() if v is not None and k != "repeats")
    options = "".join(f'<option value="{v}"{" selected" if v == 1 else ""}>×{v}</option>' for v in SPEEDS)
    viewers = "".join(f'<div class="viewer" id="{p}viewer-{key}">{viewer_html(trace, p + key + "-")}</div>\n'
                      for key, trace in ((lane["key"], lane["trace"]) for lane in race["lanes"])
                      if trace is not None)
    return (f"<style>{CSS}</style>\n"
            f'<div class="race" id="{p}root">\n<div class="stage"><div class="lanes">\n'
            '<h2>nanodflash: plain and speculative decoding, racing</h2>\n'
            f'<div class="controls"><button id="{p}play">play</button>'
            f'<button id="{p}restart">restart</button>'
            f'<span>speed <select id="{p}speed">{options}</select></span><span>time {slow:,.0f}x slower '
            f'than real: plain lasts {PLAIN_SECONDS:g} s at ×1</span><span class="tok draft">accepted drafts'
            '</span><span class="tok target">target tokens</span></div>\n'
            + "".join(lane_html(lane, p) for lane in race["lanes"]) + "</div>\n"
            + panel_html(race["whatif"], f"{p}wi-") + "</div>\n" +
            f'<div class="note">{html.escape(shown)}. Each lane replays its own recorded run (the median of '
            f'{s["repeats"]} timed runs): tokens appear when that decoder emitted them; its clock is that '
            'run\'s, from the start of its call. Click a token to open the step that emitted it. '
            f'{html.escape(note(race))}</div>\n' + viewers +
            f'<script type="application/json" id="{p}data">{embedded_json(data)}</script>\n'
            f"<script>{script(SCRIPT, p)}</script>\n</div>\n")


def write_race_page(race, path):
    """A whole HTML page with the race; ids start with `race-`."""
    with open(path, "w", encoding="utf-8") as f:
        f.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>nanodflash race</title></head>\n<body>\n{race_html(race)}</body></html>\n")
    return path
