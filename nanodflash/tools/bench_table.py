"""What `python -m nanodflash.tools.bench` prints besides its measurements: the table of rows, the ceiling
line of a speculative row, `block_size="auto"`'s costs as the run measured them (`policy_costs`) and the
comparison of a row with the best of some others (`compare`)."""

import statistics


def add_spread_and_step_cost(row, plain):
    """Against `plain`, the baseline row of its temperature (the first row at it: `speedup`'s too):
    row["by_prompt_speedup"] = [first quartile, median, third quartile] over prompts of each prompt's tok/s
    over plain's on the same prompt, and row["step_cost"] = [draft, verify] per step in plain steps (the
    loop's timers over plain's seconds per token; None for a plain row, or a row that took no step)."""
    ratios = [a["rate"] / b["rate"] for a, b in zip(row["by_prompt"], plain["by_prompt"])]
    row["by_prompt_speedup"] = (statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1
                                else ratios * 3)
    t_plain = plain["seconds"] / plain["tokens"]
    row["step_cost"] = (None if row["bound"] is None or not row["steps"] else
                        [row["draft_s"] / row["steps"] / t_plain, row["verify_s"] / row["steps"] / t_plain])


def format_table(rows):
    """A line per row; `threads`: torch threads it decoded with; `repeated`: the share of the row's output
    tokens that close a 4-gram seen before in their continuation (repetition.py), the text its τ was
    measured on; `speedup`: total tokens over total seconds against plain decoding's, the median of the
    repetitions with [the least-the most]; `predicted`: the calibration's (predicted_speedup);
    `prompts' IQR`: the interquartile range of each prompt's own speedup; `draft+verify`: a step's cost in
    plain steps. A column no row fills (threads or predictions not asked for) is left out, and so is the
    speedup's [spread] when every row was timed in one pass."""
    w = max([36] + [len(r["name"]) for r in rows])                    # the longest row name sets the column
    spread = any(lo != hi for lo, hi in (r["speedup_spread"] for r in rows))
    columns = [("method", -w, lambda r: r["name"]),
               ("threads", 7, lambda r: r["threads"] or ""),
               ("tau", 6, lambda r: "-" if r["tau"] is None else f"{r['tau']:.2f}"),  # a peer: not our loop
               ("repeated", 8, lambda r: f"{100 * r['repetition']:.0f}%"),
               ("fwd/token", 9, lambda r: "-" if r["tau"] is None else f"{r['forwards_per_token']:.3f}"),
               ("tok/s", 8, lambda r: f"{r['tokens_per_s']:.1f}"),
               ("speedup [spread]" if spread else "speedup", 20 if spread else 8,
                lambda r: f"{r['speedup']:.2f}x" + (" [{:.2f}-{:.2f}]".format(*r["speedup_spread"])
                                                     if spread else "")),
               ("predicted", 9, lambda r: "" if r.get("predicted") is None else f"{r['predicted']:.2f}x"),
               ("prompts IQR", 13, lambda r: "{:.2f}-{:.2f}".format(*r["by_prompt_speedup"][::2])),
               ("draft+verify", 12, lambda r: "" if r["step_cost"] is None else "{:.2f}+{:.2f}".format(
                   *r["step_cost"]))]
    cells = [[str(cell(r)) for r in rows] for _, _, cell in columns]
    kept = [(head, width, column) for (head, width, _), column in zip(columns, cells) if any(column)]
    align = lambda text, width: f"{text:<{-width}}" if width < 0 else f"{text:>{width}}"      # noqa: E731
    return "\n".join(" ".join(align(text, width) for text, width in line).rstrip()
                     for line in zip(*[[(head, width)] + [(c, width) for c in column]
                                       for head, width, column in kept]))


def format_terciles(rows):
    """Each greedy row's τ and speedup on the least, middle and most repetitive third of the prompts (by
    plain greedy's output: measure.tau_by_repetition)."""
    split = [r for r in rows if r.get("terciles")]
    if not split:
        return ""
    shares = " / ".join(f"{100 * t['repetition']:.0f}%" for t in split[0]["terciles"])
    lines = [f"greedy tau and speedup on the least / middle / most repetitive third of the prompts (plain "
             f"greedy's text there: {shares} repeated)"]
    for r in split:
        lines.append(f"  {r['name']:<34} " + " | ".join(f"tau {t['tau']:5.2f} {t['speedup']:5.2f}x"
                                                     for t in r["terciles"]))
    return "\n".join(lines)


def format_ceiling(row, plain):
    """The ceiling line of speculative row `row` against plain row `plain`, with its in-loop per-step
    costs."""
    b, t_plain = row["bound"], 1e3 / plain["tokens_per_s"]
    pooled = b["tau"] * t_plain / (1e3 * (b["draft_s"] + b["verify_s"]))
    return (f"ceiling: speedup <= tau * t_plain / (t_draft + t_verify) = {b['tau']:.2f} * {t_plain:.3f} / "
            f"({1e3 * b['draft_s']:.3f} + {1e3 * b['verify_s']:.3f}) = {pooled:.2f}x over every repetition, "
            f"{row['ceiling']:.2f}x the median repetition's (measured: {row['speedup']:.2f}x)\n"
            f"  in-loop ms: t_plain per token of '{plain['name']}' (1 / its tok/s); t_draft (draft + "
            f"extend), t_verify per step and tau (prefill's token included) of '{row['name']}', over every "
            "prompt: a bound by construction, no run is faster than its own draft + verify time")


def policy_costs(by_name, kind, B):
    """The costs block_policy weighs drafts by, as this run measured them in the loop: per-step time
    (draft + verify) of the greedy rows at B=4 and B, against plain greedy's time per token. None when a
    row is missing (or B <= 4)."""
    small, big = (by_name.get(f"{kind} greedy B={b}") for b in (4, B))
    plain = by_name.get("plain greedy")
    if B <= 4 or not (small and big and plain):
        return None
    per_step = lambda r: (r["draft_s"] + r["verify_s"]) / r["steps"]       # noqa: E731
    slot = (per_step(big) - per_step(small)) / (B - 4)                      # seconds per extra block slot
    one_draft = per_step(small) - 2 * slot                                  # a block of 2: anchor + 1 draft
    return dict(step_cost=one_draft * plain["tokens_per_s"], slot_cost=slot / one_draft)


def format_policy_costs(costs, table):
    """The in-loop costs next to the calibration block_size="auto" used (step_costs.py: `table`, cost(n) in
    steps without drafts)."""
    slot = (table[-1] - table[1]) / (len(table) - 2) / table[1]
    return (f"block_policy (B=auto) costs, in-loop from the greedy rows: a 1-draft step = "
            f"{costs['step_cost']:.2f} plain steps (calibrated: {table[1]:.2f} steps without drafts), one "
            f"more block slot = {costs['slot_cost']:.3f} of it (calibrated: {slot:.3f})")


def compare(row, others, what):
    """'<row> vs the best <what> setting (<name>, tau t): x the tokens/s', or None when either is missing."""
    if row is None or not others:
        return None
    best = max(others, key=lambda r: r["tokens_per_s"])
    return (f"{row['name']} vs the best {what} setting ({best['name']}, tau {best['tau']:.2f}): "
            f"{row['tokens_per_s'] / best['tokens_per_s']:.2f}x the tokens/s")
