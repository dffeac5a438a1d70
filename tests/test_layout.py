"""The repository's shape is a claim too: the core reads without its tooling, and the README stays a guide."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ROOT / "nanodflash"
README_BUDGET = 260          # lines: a guide in the size of nanoGPT's README, not a lab notebook


def _imports(path, root=ROOT):
    """Every module a file imports, resolved to dotted names inside nanodflash where relative."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.append(module)
            found += [f"{module}.{a.name}" for a in node.names]
    return found


def test_no_core_module_imports_from_the_tools_subpackage():
    for path in sorted(CORE.glob("*.py")):
        bad = [m for m in _imports(path) if m == "nanodflash.tools" or m.startswith("nanodflash.tools.")]
        assert not bad, f"core module {path.name} imports {bad}: the core must never depend on nanodflash/tools/"


def test_the_import_check_catches_a_core_module_importing_a_tool(tmp_path):
    (tmp_path / "nanodflash").mkdir()
    fake = tmp_path / "nanodflash" / "fake.py"
    fake.write_text("from .tools.bench import main\nfrom .gpt import GPT\n")
    assert "nanodflash.tools.bench" in _imports(fake, tmp_path), "a relative import of a tool must be resolved and seen"


def _links(path):
    """Relative link targets in a markdown file (external links and anchors left out)."""
    text = path.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_readme_and_docs_link_only_to_files_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in _links(page):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_readme_stays_within_its_line_budget():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_BUDGET, (f"README.md has {n} lines, over its budget of {README_BUDGET}: move experiments and "
                                "long tables to docs/")
