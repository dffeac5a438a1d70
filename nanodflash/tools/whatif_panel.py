"""The what-if panel: expected τ and speedup of a speculative step as the acceptance, the block size and the
step's cost move, computed in the page with the formulas block_size="auto" decides by (block_policy.py):

    E(n) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_n       tokens a step with n drafts emits (expected_tokens)
    cost(n) = step_cost * (1 + slot_cost * (n - 1))     in plain steps (linear_costs)
    speedup(n) = E(n) / cost(n)

The acceptance is one rate for every slot (a slider) or the race's own per-slot rates; the costs start from
a preset: the calibration's prices on this machine (the run folder's costs.json: a step in plain decoding's
tokens; without one, the default table auto weighs, in steps without drafts), the race's
own path lane (its mean step against plain decoding's mean token), or the cost model's GPU step
(cost_model.py: an 8B target and a 5-layer drafter on an H200, from datasheet constants). The run's measured
point is marked on the curve. Every number the panel shows is also in its element's data-value, at full
precision, for the tests to compare with Python's (tests/test_race.py).
"""

import html
import math

from .trace_page import embedded_json, script

SCRIPT = r"""
(function () {
  const P = "%(prefix)s";
  const $ = (name) => document.getElementById(P + name);
  const W = JSON.parse($("data").textContent), B = W.max_block_size;

  function expectedTokens(rates) {                    // block_policy.expected_tokens
    const tokens = [1.0];
    let survive = 1.0;
    for (const a of rates) { survive *= a; tokens.push(tokens[tokens.length - 1] + survive); }
    return tokens;
  }
  function linearCosts(step, slot) {                  // step_costs.linear_costs
    const costs = [1.0];
    for (let n = 1; n < B; n++) costs.push(step * (1 + slot * (n - 1)));
    return costs;
  }
  function rates() {
    if ($("curve").checked) return W.rates.slice();
    return Array(B - 1).fill(Number($("alpha").value));
  }
  function put(name, value, text) { $(name).dataset.value = String(value); $(name).textContent = text; }

  function preset() {
    const [step, slot] = W[$("preset").value];
    $("step").value = String(step); $("slot").value = String(slot);
    update();
  }

  function update() {
    const E = expectedTokens(rates());
    const cost = linearCosts(Number($("step").value), Number($("slot").value));
    const b = Number($("block").value), n = b - 1;
    const speed = E.map((e, k) => e / cost[k]);
    put("tau", E[n], E[n].toFixed(2));
    put("cost", cost[n], cost[n].toFixed(2));
    put("speedup", speed[n], speed[n].toFixed(2) + "x");
    let best = 0;
    speed.forEach((s, k) => { if (s > speed[best]) best = k; });
    put("best", best + 1, "block size " + (best + 1) + " (" + speed[best].toFixed(2) + "x)");
    $("alpha-shown").textContent = Number($("alpha").value).toFixed(2);
    $("block-shown").textContent = b;
    $("step-shown").textContent = Number($("step").value).toFixed(2);
    $("slot-shown").textContent = Number($("slot").value).toPrecision(2);  // 2 digits even for a GPU (0.0041)
    plot(speed, b);
  }

  function plot(speed, b) {
    const w = 560, h = 170, top = Math.max(2, ...speed, W.path_speedup) * 1.1;
    const x = (k) => 40 + (w - 60) * (k - 1) / Math.max(B - 1, 1);
    const y = (s) => h - 20 - (h - 40) * s / top;
    const pts = speed.map((s, k) => x(k + 1).toFixed(1) + "," + y(s).toFixed(1)).join(" ");
    const run = W.measured_drafts + 1;
    $("plot").innerHTML =
      '<line x1="40" x2="' + (w - 20) + '" y1="' + y(1) + '" y2="' + y(1) + '" stroke="#aaa" />' +
      '<text x="2" y="' + (y(1) + 5) + '" font-size="18">1x</text>' +
      '<polyline fill="none" stroke="#1565c0" stroke-width="2" points="' + pts + '" />' +
      '<circle cx="' + x(b) + '" cy="' + y(speed[b - 1]) + '" r="6" fill="#1565c0" />' +
      '<circle cx="' + x(run) + '" cy="' + y(W.path_speedup) + '" r="7" fill="#c62828" />' +
      '<text x="' + (w / 2 - 40) + '" y="' + (h - 2) + '" font-size="18">block size 1..' + B + "</text>";
  }

  for (const name of ["alpha", "curve", "block", "step", "slot"]) $(name).oninput = update;
  $("curve").onchange = update;
  $("preset").onchange = preset;
  preset();
})();
"""

# Compact enough to stand beside the race's lanes at 1280x720 (race_page.py): labels beside their sliders,
# the select as wide as its row allows; no text under 18 px.
CSS = """
.whatif { font: 18px/1.35 system-ui, sans-serif; border: 1px solid #bbb; border-radius: 6px;
  padding: 4px 12px; margin: 12px 0; max-width: 1240px; box-sizing: border-box; }
.whatif h3 { font-size: 22px; margin: 2px 0 4px; }
.whatif .row { display: flex; gap: 10px; align-items: center; margin: 3px 0; }
.whatif .row label { flex: 0 0 290px; } .whatif .row label.short { flex: 0 0 auto; }
.whatif input[type=range] { flex: 1 1 150px; min-width: 100px; }
.whatif .row span { flex: 0 0 56px; }
.whatif select { font-size: 18px; flex: 1 1 0; min-width: 0; } .whatif .out b { font-size: 22px; }
.whatif .out { display: block; } .whatif svg { display: block; }
.whatif .legend { color: #555; font-size: 18px; }
"""


def slider(p, name, label, low, high, step, value):
    return (f'<div class="row"><label for="{p}{name}">{label}</label><input type="range" id="{p}{name}" '
            f'min="{low}" max="{high}" step="{step}" value="{value}">'
            f'<span id="{p}{name}-shown"></span></div>')


def panel_html(whatif, prefix="wi-"):
    """The panel as an HTML fragment; `whatif` as race.whatif_start returns it."""
    p, w, B = prefix, whatif, whatif["max_block_size"]
    measured = (f"this race's path lane: a step of {w['measured_drafts']} drafts cost "
                f"{w['measured'][0] * (1 + w['measured'][1] * (max(w['measured_drafts'], 1) - 1)):.2f} plain "
                "steps")
    curve = "checked" if any(w["rates"]) else ""
    top_step = max(w["calibrated"][0], w["measured"][0], w["gpu"][0])      # the sliders hold every preset
    low_slot = min(w["calibrated"][1], w["measured"][1], w["gpu"][1])
    lane_block = min(max(w["measured_drafts"] + 1, 2), B)     # the path lane's block: the panel opens on it
    return (f"<style>{CSS}</style>\n"
            f'<div class="whatif" id="{p}root"><h3>What if: expected τ and speedup of one step</h3>\n'
            '<div class="legend">E(n) = 1 + a₁ + a₁a₂ + … + a₁…aₙ: the tokens a step with n = B - 1 drafts '
            "emits; cost(n) = step cost × (1 + growth × (n - 1)) plain steps; speedup = E(n) / cost(n) "
            "(nanodflash/ext/block_policy.py). Blue: the curve and your block size; red: this race's path "
            "lane as measured.</div>\n"
            f'<div class="row"><label class="short" for="{p}preset">costs from</label><select id="{p}preset">'
            '<option value="calibrated" selected>the calibration here (plain decoding\'s tokens)</option>'
            f'<option value="measured">{html.escape(measured)}</option>'
            '<option value="gpu">the cost model: Qwen3-8B and a 5-layer drafter on an H200 (bf16)</option>'
            '</select></div>\n'
            f'<div class="row"><label for="{p}curve">this race\'s per-slot acceptance</label>'
            f'<input type="checkbox" id="{p}curve" {curve}></div>\n'
            + slider(p, "alpha", "or one acceptance a for all", 0, 1, 0.01, 0.7)
            + slider(p, "block", "block size B (anchor + drafts)", 2, B, 1, lane_block)
            + slider(p, "step", "step cost (one draft)", 0.5, max(8, math.ceil(top_step)),
                     "any", 1.5)
            + slider(p, "slot", "growth per further draft", min(0, low_slot), 0.3, "any", 0.02) +
            f'<div class="row out">expected τ <b id="{p}tau"></b> · a step costs '
            f'<b id="{p}cost"></b> plain '
            f'steps · speedup <b id="{p}speedup"></b> · best: <span id="{p}best"></span></div>\n'
            f'<svg id="{p}plot" width="560" height="170"></svg>\n'
            f'<script type="application/json" id="{p}data">{embedded_json(whatif)}</script>\n'
            f"<script>{script(SCRIPT, p)}</script>\n</div>\n")
