"""The trace page: one self-contained HTML file that replays a recorded run (trace.py) step by step.

    write_page(trace, "trace.html")          # open it in any browser, offline (file:// works)
    viewer_html(trace, "t07")                # the same viewer as an HTML fragment, for a notebook cell

The run's data sits in <script type="application/json" id="nanodflash-trace"> (ids prefixed per viewer, so
two viewers on one page do not collide), escaped so that no token can end the script element; plain
JavaScript and CSS inline, no network. Controls: PREV / NEXT, a step slider, play / pause, arrow keys.
"""

import html
import json

CSS = """
.ndf { font: 18px/1.45 system-ui, sans-serif; color: #222; max-width: 1100px; }
.ndf h2 { font-size: 22px; margin: 4px 0; }
.ndf .settings { color: #555; font-size: 18px; }
.ndf .controls { margin: 10px 0; display: flex; gap: 8px; align-items: center; }
.ndf .controls button { font-size: 18px; padding: 4px 14px; }
.ndf .controls input[type=range] { flex: 1; }
.ndf .sentence { font-size: 20px; background: #fff8dc; padding: 8px; border-radius: 6px; }
.ndf .text { font-family: ui-monospace, monospace; white-space: pre-wrap; border: 1px solid #ccc;
  padding: 8px; max-height: 320px; overflow: auto; font-size: 18px; }
.ndf .tok { border-radius: 3px; padding: 0 1px; }
.ndf .prompt { color: #777; } .ndf .draft { background: #c8f0c8; } .ndf .target { background: #ffd8a8; }
.ndf .anchor { outline: 2px solid #1565c0; } .ndf .new { text-decoration: underline; }
.ndf .ws { color: #aaa; }
.ndf table { border-collapse: collapse; margin: 8px 0; font-size: 18px; }
.ndf td, .ndf th { border: 1px solid #ccc; padding: 3px 8px; font-family: ui-monospace, monospace; }
.ndf .kept { background: #c8f0c8; } .ndf .rejected { background: #ffc9c9; } .ndf .unseen { color: #aaa; }
.ndf .chosen { font-weight: bold; text-decoration: underline; }
.ndf .why td { font-family: system-ui, sans-serif; color: #555; background: #f4f4f4; white-space: normal; }
.ndf div.why { color: #555; margin: 4px 0; }
.ndf .figures { display: flex; gap: 24px; flex-wrap: wrap; font-size: 18px; }
.ndf .tree div { font-family: ui-monospace, monospace; }
"""

# How both pages show a token id: its text from T (the page's {id: text}), HTML-escaped, whitespace drawn
TOKEN_JS = r"""
  const show = (id) => { const s = T[String(id)]; return s === undefined ? "#" + id : s; };
  const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  const visible = (s) => esc(s).replace(/ /g, '<span class="ws">·</span>')
      .replace(/\t/g, '<span class="ws">→</span>').replace(/\n/g, '<span class="ws">↵</span>\n');
"""

SCRIPT = r"""
(function () {
  const P = "%(prefix)s";
  const data = JSON.parse(document.getElementById(P + "trace").textContent);
  const $ = (name) => document.getElementById(P + name);
  const steps = data.steps, T = data.tokens;
%(tokens)s
  const tok = (id, cls) => '<span class="tok ' + cls + '">' + visible(show(id)) + "</span>";
  const quote = (id) => "'" + esc(show(id)).replace(/\n/g, "\\n") + "'";
  // a probability or a uniform with `digits` decimals; below 10^-digits in e-notation (3.2e-5), so that no
  // nonzero value reads 0 (a kept draft with q(d) = 0.000 would look impossible); an exact 0 as 0
  const num = (x, digits) => x === 0 ? "0" : Math.abs(x) < 10 ** -digits ? x.toExponential(1) :
    x.toFixed(digits);
  let k = 0, timer = null;
  $("slider").max = Math.max(steps.length - 1, 0);

  function sentence(s) {
    const n = s.drafts.length, a = s.accepted;
    if (n === 0) return "A plain step (no drafts): the target's token is " + quote(s.bonus) + ".";
    let t = (a === 1 ? "1 draft kept" : a + " drafts kept") + " of " + n;
    if (s.path && s.path.length > 1) t += " (the accepted path: nodes " + s.path.join(" → ") + ")";
    if (!s.path && a < n) {
      t += "; draft " + (a + 1) + " " + quote(s.drafts[a]) + " rejected";
      if (s.u) t += ": u = " + num(s.u[a], 2) + " ≥ p/q = " + num(s.p_d[a] / s.q_d[a], 2);
      else if (data.settings.verifier === "match") t += ": the target drew " + quote(s.target_tokens[a]);
      else t += ": the target's token is " + quote(s.target_tokens[a]);
    }
    if (s.bonus === null) t += "; no bonus (the token limit or a stop token)";
    else if (!s.path && a < n && s.u) t += "; the residual drew " + quote(s.bonus);
    else t += "; the bonus is " + quote(s.bonus);
    return t + ".";
  }

  function textSoFar(upto) {
    let html = data.prompt.map((id) => tok(id, "prompt")).join("");
    const cls = (j, c) => c + (j === upto ? " new" : "");
    html += tok(data.output[0], "target" + (upto === -1 ? " anchor" : ""));
    for (let j = 0; j <= upto; j++) {
      const s = steps[j];
      html += s.accepted_tokens.map((id) => tok(id, cls(j, "draft"))).join("");
      if (s.bonus !== null) html += tok(s.bonus, cls(j, "target") + (j === upto ? " anchor" : ""));
    }
    return html;
  }

  // why the grey rows (slots after the first rejected draft) say "not checked", in plain words
  function notChecked(s, columns) {
    const rule = data.settings.verifier;
    const what = rule === "rejection" ? "p(d) of every slot" : rule === "match" ?
      "the target's draw at every slot" : "the target's token at every slot";
    return "<tr class='why'><td colspan=" + columns + ">↓ Not checked (grey): the one verify pass computed " +
      what + ", but the slots below come after the rejected draft, in a text that is thrown away. The step " +
      "stops at its first rejection, so they are never compared" +
      (s.bonus === null ? "." : "; the next step drafts again from the bonus.") + "</td></tr>";
  }

  function blockTable(s) {
    const n = s.drafts.length, rows = [];
    const head = ["slot", "draft", "verdict"];
    if (s.target_tokens) head.push(data.settings.verifier === "match" ? "target drew" : "target's token");
    if (s.p_d) head.push("p(d)");
    if (s.q_d) head.push("q(d)", "u", "u < p/q");
    if (s.candidates) head.push("DFlash 2 candidates after the draft before (score; underlined: drafted)");
    rows.push("<tr>" + head.map((h) => "<th>" + h + "</th>").join("") + "</tr>");
    rows.push("<tr><td>0</td><td>" + tok(s.anchor, "anchor") + "</td><td>anchor</td>" +
      "<td colspan=" + (head.length - 3) + "></td></tr>");
    for (let i = 0; i < n; i++) {
      const v = i < s.accepted ? "kept" : i === s.accepted ? "rejected" : "unseen";
      let r = "<tr class='" + v + "'><td>" + (i + 1) + "</td><td>" + tok(s.drafts[i], "") + "</td><td>" +
        (v === "unseen" ? "not checked" : v) + "</td>";
      if (s.target_tokens) r += "<td>" + tok(s.target_tokens[i], "") + "</td>";
      if (s.p_d) r += "<td>" + num(s.p_d[i], 3) + "</td>";
      if (s.q_d) r += "<td>" + num(s.q_d[i], 3) + "</td><td>" + num(s.u[i], 3) + "</td><td>" +
        (s.u[i] * s.q_d[i] < s.p_d[i] ? "yes" : "no") + "</td>";
      if (s.candidates) r += "<td>" + s.candidates[i].map((c) => '<span class="' +
        (c[0] === s.drafts[i] ? "chosen" : "") + '">' + visible(show(c[0])) + " (" + c[1] + ")</span>")
        .join("  ") + "</td>";
      rows.push(r + "</tr>");
      if (v === "rejected" && i + 1 < n) rows.push(notChecked(s, head.length));
    }
    return "<table>" + rows.join("") + "</table>";
  }

  function treeView(s) {
    const children = {}, kept = new Set(s.path);
    s.parent.forEach((p, i) => (children[p] = children[p] || []).push(i + 1));
    const lines = [];
    const walk = (node, depth) => {
      const id = node === 0 ? s.anchor : s.drafts[node - 1];
      const mark = kept.has(node) ? "kept" : "";
      const next = s.target_tokens ? visible(show(s.target_tokens[node])) : null;
      const greedy = next === null ? "" : "  (the target's next: " + next + ")";
      lines.push('<div class="' + mark + '">' + "&nbsp;".repeat(4 * depth) + "[" + node + "] " +
        visible(show(id)) + '<span class="unseen">' + greedy + "</span></div>");
      (children[node] || []).forEach((c) => walk(c, depth + 1));
    };
    walk(0, 0);
    const why = !s.target_tokens ? "" : '<div class="why">Grey: the target\'s next token after each node, ' +
      "all from the one verify pass. The step walks down from the anchor, keeping a child whose token " +
      "equals its parent's grey one; grey tokens off that path are never compared (not checked).</div>";
    return '<div class="tree">' + lines.join("") + "</div>" + why;
  }

  function render() {
    const s = steps[k];
    $("slider").value = k;
    $("count").textContent = "step " + (k + 1) + " of " + steps.length;
    $("text").innerHTML = textSoFar(k);
    if (!s) { $("sentence").textContent = "no draft / verify step in this run"; return; }
    $("sentence").textContent = sentence(s);
    $("block").innerHTML = s.parent ? treeView(s) : blockTable(s);
    const lens = steps.slice(0, k + 1).map((x) => x.accepted_tokens.length + (x.bonus === null ? 0 : 1));
    const tau = lens.reduce((a, b) => a + b, 0) / lens.length;
    const hist = {};
    lens.forEach((l) => (hist[l] = (hist[l] || 0) + 1));
    const bars = Object.keys(hist).sort((a, b) => a - b).map((l) => l + " | " + "█".repeat(hist[l]) + " " +
      hist[l]).join("<br>");
    const plural = lens[k] === 1 ? "" : "s";
    $("figures").innerHTML = "<div>this step emitted <b>" + lens[k] + "</b> token" + plural +
      "<br>τ so far <b>" + tau.toFixed(2) + "</b><br>draft " + (1000 * s.draft_s).toFixed(1) +
      " ms, verify " + (1000 * s.verify_s).toFixed(1) + " ms</div><div>target cache " +
      s.target_cache.join(" → ") +
      (s.draft_cache ? "<br>drafter cache " + s.draft_cache.join(" → ") : "") +
      "<br>(positions before → after the step)</div><div>acceptance lengths so far:<br>" + bars + "</div>";
  }

  const go = (j) => { k = Math.min(Math.max(j, 0), Math.max(steps.length - 1, 0)); render(); };
  $("prev").onclick = () => go(k - 1);
  $("next").onclick = () => go(k + 1);
  $("slider").oninput = (e) => go(Number(e.target.value));
  $("play").onclick = () => {
    if (timer) { clearInterval(timer); timer = null; $("play").textContent = "play"; return; }
    $("play").textContent = "pause";
    timer = setInterval(() => { if (k >= steps.length - 1) $("play").click(); else go(k + 1); }, 900);
  };
  $("root").goTo = go;                                  // for a page that opens a step (race_page.py)
  $("root").addEventListener("keydown", (e) => {
    if (e.key === "ArrowRight") go(k + 1);
    if (e.key === "ArrowLeft") go(k - 1);
  });
  render();
})();
"""


def script(source, prefix):
    """A page script with its element-id prefix and the token helpers filled in."""
    return source.replace("%(prefix)s", prefix).replace("%(tokens)s", TOKEN_JS.strip("\n"))


def embedded_json(trace):
    """JSON that is safe inside a <script> element: <, > and & as \\u escapes, so no token text (the corpus
    has `</script>`) can end the element; JSON.parse reads them back unchanged."""
    text = json.dumps(trace, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def header(trace):
    """The settings, then the run's τ beside the repetition of the text it was measured on."""
    shown = ", ".join(f"{k} {v}" for k, v in trace["settings"].items() if v is not None)
    run = trace.get("run")
    if run:
        shown += (f". τ {run['tau']:.2f} on text {100 * run['repetition']:.0f}% repeated (tokens closing a "
                  "4-gram seen before in it)")
    return html.escape(shown)


def viewer_html(trace, prefix="ndf-"):
    """The viewer as an HTML fragment (style, controls, data, script); `prefix` (letters, digits, - and _)
    starts every element id."""
    if not prefix or not all(c.isalnum() or c in "-_" for c in prefix):
        raise ValueError(f"prefix must be letters, digits, - or _, got {prefix!r}")
    p = prefix
    return (f"<style>{CSS}</style>\n"
            f'<div class="ndf" id="{p}root" tabindex="0">\n'
            f'<h2>nanodflash: a speculative run, step by step</h2>\n'
            f'<div class="settings">{header(trace)}. Colours: <span class="tok prompt">prompt'
            '</span> <span class="tok draft">accepted draft</span> <span class="tok target">target token '
            '(prefill, bonus)</span> <span class="tok anchor">the newest token</span>, '
            '<span class="new">this step\'s tokens</span>, <span class="unseen">not checked (after a '
            'rejected draft)</span>; · is a space, ↵ a newline. Arrow keys step; a '
            'tree lists each node under its parent, the accepted path in green.</div>\n'
            f'<div class="controls"><button id="{p}prev">PREV</button><button id="{p}next">NEXT</button>'
            f'<button id="{p}play">play</button><input type="range" id="{p}slider" min="0" value="0">'
            f'<span id="{p}count"></span></div>\n'
            f'<div class="sentence" id="{p}sentence"></div>\n'
            f'<div id="{p}block"></div>\n<div class="figures" id="{p}figures"></div>\n'
            f'<div class="text" id="{p}text"></div>\n</div>\n'
            f'<script type="application/json" id="{p}trace">{embedded_json(trace)}</script>\n'
            f"<script>{script(SCRIPT, prefix)}</script>\n")


def write_page(trace, path):
    """A whole HTML page with one viewer, its data under the id `nanodflash-trace`."""
    body = viewer_html(trace, prefix="nanodflash-")
    with open(path, "w", encoding="utf-8") as f:
        f.write('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>nanodflash trace</title></head>\n<body>\n{body}</body></html>\n")
    return path
