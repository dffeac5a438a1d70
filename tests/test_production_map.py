"""docs/production.md maps nanodflash's pieces onto production code bases; its citations are checked by
nanodflash/tools/production_map.py. Here: every nanodflash name the page cites exists (the released
archives need the registry: their half runs by hand, its output in docs/log.md), and the checker reports
what does not exist, in nanodflash, in a wheel and in an sdist."""

import io
import re
import tarfile
import zipfile
from pathlib import Path

from nanodflash.tools.production_map import PAGE, check, citations

CODE_BASES = ("dflash", "vllm", "sglang", "specforge", "speculators")


def test_every_nanodflash_name_the_production_page_cites_exists():
    text = Path(PAGE).read_text(encoding="utf-8")
    lines = []
    assert check(text, log=lines.append) == 0, "the page cites nanodflash names that do not exist:\n" + \
        "\n".join(line for line in lines if line.startswith("MISSING"))


def test_the_page_maps_twelve_pieces_onto_the_five_code_bases_with_versions():
    text = Path(PAGE).read_text(encoding="utf-8")
    ours, theirs = citations(text)
    pieces = re.findall(r"^## ", text, re.M)
    bases = {package for package, _, _, _ in theirs}
    assert len(pieces) == 12 and len(ours) >= 12, f"{len(pieces)} pieces, {len(ours)} nanodflash names"
    assert bases == set(CODE_BASES), f"the page cites {sorted(bases)}, not {sorted(CODE_BASES)}"


def fake_archives(folder):
    """A wheel and an sdist of two made-up packages, each with one file defining A.f."""
    source = b"class A:\n    def f(self):\n        pass\n"
    with zipfile.ZipFile(folder / "wheely-1.0-py3-none-any.whl", "w") as z:
        z.writestr("wheely/mod.py", source)
    with tarfile.open(folder / "tarry-2.0.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("tarry-2.0/tarry/mod.py")
        info.size = len(source)
        t.addfile(info, io.BytesIO(source))


def test_a_citation_that_does_not_exist_is_reported_missing(tmp_path):
    fake_archives(tmp_path)
    good = ("`nanodflash/verify.py:rejection_verify` `nanodflash/ext/tree.py:Tree.__init__` "
            "`wheely==1.0:wheely/mod.py:A.f` `tarry==2.0:tarry/mod.py:A`")
    lines = []
    assert check(good, str(tmp_path), log=lines.append) == 0, "\n".join(lines)
    bad = ["`nanodflash/verify.py:no_such_rule`", "`nanodflash/nowhere.py:f`", "`tarry==2.0:tarry/mod.py:B`",
           "`wheely==1.0:wheely/mod.py:A.g`", "`wheely==1.0:wheely/other.py:A`"]
    for citation in bad:
        lines = []
        assert check(citation, str(tmp_path), log=lines.append) == 1, f"{citation} was not reported: {lines}"
        assert lines[-1].startswith("MISSING"), lines


# Lab 3 (docs/course.md): the serving engines' sampled rule for argmax drafts, ported into match_verify's
# answer file, is exact; the same rule with a lossy acceptance threshold is not. Written from the page's
# description of the rule (section 2), not copied.
ENGINE_RULE = """
import torch
from nanodflash.sampling import sample


def match_verify(draft_tokens, target_probs, generator=None):
    for i, d in enumerate(draft_tokens.tolist()):
        p = target_probs[i]
        if float(torch.rand((), generator=generator, dtype=torch.float64)) >= float(p[d]){lossy}:
            rest = p.clone()
            rest[d] = 0.0                               # the rejected draft cannot be the emitted token
            return i, int(sample(rest / rest.sum(), generator))
    n = draft_tokens.numel()
    return n, int(sample(target_probs[n], generator))
"""


def test_lab_3s_port_of_the_engines_rule_is_exact_and_a_lossy_threshold_is_not(tmp_path):
    from nanodflash.exercises import BY_NAME, load_function, run_checks
    exercise = BY_NAME["match_verify"]
    for lossy, exact in (("", True), (" and float(p[d]) < 0.3", False)):    # accept whenever p(d) >= 0.3
        path = tmp_path / f"port{len(lossy)}.py"
        path.write_text(ENGINE_RULE.replace("{lossy}", lossy))
        answer = load_function(str(path), "match_verify", exercise.original())
        results = run_checks(exercise, answer, str(path), until=lambda message: True)
        failed = [m for _, m in results if m is not None]
        assert (not failed) == exact, \
            f"the port{' with a threshold' if lossy else ''} should {'pass' if exact else 'fail'}: {failed}"
