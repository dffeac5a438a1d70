"""Which generated tokens the drafter wrote: each token's origin, and the continuation shown with it
(sample.py prints it).

    kinds = origins(len(tokens), stats.acceptance_lengths, stats.accepted_drafts)   # "target" / "draft"
    print(render(tok, prompt_ids, tokens, kinds, "markers"))    # ⟦accepted drafts⟧ ⟨target tokens⟩
"""

STYLE = {"prompt": "\033[2m", "draft": "\033[32m", "target": "\033[35m"}   # dim, green, magenta
# brackets never in code, unlike [] and {}
MARK = {"prompt": ("", ""), "draft": ("⟦", "⟧"), "target": ("⟨", "⟩")}
RESET = "\033[0m"


def origins(n_tokens, acceptance_lengths, accepted_drafts=None):
    """Per generated token: "target" (prefill or bonus) or "draft" (accepted draft).

    `accepted_drafts` (SpecStats.accepted_drafts) says how many of each step's tokens were drafts; without
    it every step is taken to end with its bonus token, which holds when no stop token cut a step short.

    >>> origins(5, [3, 1])                     # prefill, then step 1: 2 drafts + bonus, step 2: bonus only
    ['target', 'draft', 'draft', 'target', 'target']
    >>> origins(3, [2], accepted_drafts=[2])   # a stop token among the drafts: no bonus in that step
    ['target', 'draft', 'draft']
    """
    accepted_drafts = accepted_drafts or [n - 1 for n in acceptance_lengths]
    out = ["target"]
    for n, d in zip(acceptance_lengths, accepted_drafts):
        out += ["draft"] * d + ["target"] * (n - d)
    if len(out) != n_tokens:
        raise AssertionError(f"acceptance lengths account for {len(out)} tokens, but {n_tokens} were "
                             "generated")
    return out


def render(tok, prompt_ids, tokens, kinds, style):
    """The prompt and the continuation; style "color": each run of same-origin tokens coloured, "markers":
    marked ⟦drafted⟧ ⟨target⟩ (MARK), "plain": the text alone.

    Runs are decoded separately, so a multi-byte character split across two runs shows as U+FFFD.
    """
    ids, kinds = prompt_ids + tokens, ["prompt"] * len(prompt_ids) + kinds
    if style == "plain":
        return tok.decode_bytes(ids).decode("utf-8", errors="replace")
    runs, start = [], 0
    for i in range(1, len(ids) + 1):                    # a target token is a run of its own (one per step)
        if i == len(ids) or kinds[i] != kinds[i - 1] or kinds[i] == "target":
            runs.append((kinds[start], tok.decode_bytes(ids[start:i]).decode("utf-8", errors="replace")))
            start = i
    return "".join(styled(k, s, style) for k, s in runs)


def styled(kind, text, style):
    """text in the colour (style "color") or between the markers ("markers") of its origin `kind`."""
    return f"{STYLE[kind]}{text}{RESET}" if style == "color" else f"{MARK[kind][0]}{text}{MARK[kind][1]}"


def bars(counts, width=40):
    """A bar per value 1..max of {small positive int: count} (SpecStats.histogram, block sizes)."""
    top = max(counts.values(), default=0) or 1
    return "\n".join(f"  {n:3d} | {'#' * round(width * counts.get(n, 0) / top):<{width}} {counts.get(n, 0)}"
                     for n in range(1, max(counts, default=1) + 1))
