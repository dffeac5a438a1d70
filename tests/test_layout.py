"""The repository's shape is a claim too: the core (nanodflash's top level) is a few small files that read
without their extensions, plumbing, tooling or train_tiny's pipeline; the tools read without the pipeline;
nothing keeps state at module level; and the README stays a guide."""

import ast
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORE = ROOT / "nanodflash"
README_BUDGET = 260          # lines: a guide in the size of nanoGPT's README, not a lab notebook
CORE_MODULES, CORE_CODE_LINES, MODULE_LINES, FUNCTION_LINES = 8, 1100, 450, 50    # the core's budget
SUBPACKAGES = ("ext", "store", "tools", "pipeline", "exercises")


def core_modules():
    """The core: nanodflash's own modules, __init__.py (which re-exports the public names) left out."""
    return [p for p in sorted(CORE.glob("*.py")) if p.name != "__init__.py"]


def lines_of_code(source):
    """Lines holding code: docstrings, comments and blank lines not counted."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER)
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            code.update(line for line in range(tok.start[0], tok.end[0] + 1) if line not in docstrings)
    return len(code)


def test_the_code_line_count_leaves_out_docstrings_comments_and_blank_lines():
    source = ('def f(x):\n    """Doc,\n    two lines."""\n\n    # a comment\n'
              '    return (x +\n            1)  # why\n')
    assert lines_of_code(source) == 3, "def, and a return over two lines: 3 lines of code"


def test_the_core_is_a_few_small_files():
    modules = core_modules()
    sizes = {p.name: lines_of_code(p.read_text()) for p in modules}
    assert len(modules) <= CORE_MODULES, \
        f"nanodflash/ has {len(modules)} modules at its top level, over {CORE_MODULES}: {sorted(sizes)}"
    total = sum(sizes.values())
    assert total <= CORE_CODE_LINES, \
        f"the core holds {total} lines of code, over {CORE_CODE_LINES}: {sizes}; move extensions to ext/"
    long = {p.name: n for p in modules if (n := len(p.read_text().splitlines())) > MODULE_LINES}
    assert not long, f"core modules over {MODULE_LINES} lines in all: {long}"


def long_functions(path, limit=FUNCTION_LINES):
    """(name, lines) of every function in `path` longer than `limit` lines, its docstring included."""
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_of_the_package_or_the_scripts_is_over_50_lines():
    files = [*sorted(CORE.rglob("*.py")), ROOT / "train_tiny.py", ROOT / "sample.py"]
    found = {str(p.relative_to(ROOT)): fns for p in files if (fns := long_functions(p))}
    assert not found, f"functions over {FUNCTION_LINES} lines (name, lines): {found}"


def test_the_drafters_training_loop_is_at_most_40_lines():
    fn = _function(CORE / "train.py", "train_drafter")
    loop = next(n for n in ast.walk(fn) if isinstance(n, ast.For))
    assert loop.end_lineno - loop.lineno + 1 <= 40, "train_drafter's loop is over 40 lines: move a part out"


def test_no_core_module_imports_a_subpackage():
    for path in core_modules():
        for sub in SUBPACKAGES:
            bad = _reaching(path, f"nanodflash.{sub}")
            assert not bad, (f"core module {path.name} imports {bad}: the core must never depend on "
                             f"nanodflash.{sub}; hand what it needs in as an argument")


EMPTY = ("{}", "[]", "set()", "dict()", "list()")     # a container made empty at import, to be filled later


def module_state(path):
    """(line, what) of module-level state in `path`: a `global` statement, a function cached across calls
    (functools.cache / lru_cache), or an empty dict, list or set made at import to be filled later."""
    tree = ast.parse(path.read_text())
    found = [(n.lineno, "global") for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:
        found += [(d.lineno, ast.unparse(d)) for d in getattr(node, "decorator_list", [])
                  if re.search(r"\b(cache|lru_cache)\b", ast.unparse(d))]
        value = getattr(node, "value", None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and ast.unparse(value or ast.Constant(0)) in EMPTY:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_of_the_package_keeps_state_at_module_level():
    found = {str(p.relative_to(ROOT)): s for p in sorted(CORE.rglob("*.py")) if (s := module_state(p))}
    assert not found, f"module-level state (line, what): {found}; pass it in, or keep it on an object"


def test_the_state_check_finds_a_global_a_cache_and_a_registry(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("import functools\nREGISTRY = {}\nSEEN = set()\n\n@functools.cache\ndef f():\n"
                    "    global X\n    return 1\nTABLE = {1: 2}\n")
    assert [what for _, what in module_state(fake)] == ["REGISTRY = {}", "SEEN = set()", "functools.cache",
                                                         "global"], f"the check missed: {module_state(fake)}"


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


def _reaching(path, package, root=ROOT):
    """The imports of `path` that name `package` or a module inside it."""
    return [m for m in _imports(path, root) if m == package or m.startswith(package + ".")]


def test_no_tool_imports_the_pipeline():
    for path in sorted((CORE / "tools").glob("*.py")):
        bad = _reaching(path, "nanodflash.pipeline")
        assert not bad, f"tools/{path.name} imports {bad}: the pipeline builds on the tools, not back"


def test_the_import_check_catches_imports_of_the_tools_and_the_pipeline(tmp_path):
    (tmp_path / "nanodflash" / "tools").mkdir(parents=True)
    core = tmp_path / "nanodflash" / "fake.py"
    core.write_text("from .tools.bench import main\nfrom .pipeline import flags\nfrom .gpt import GPT\n")
    assert "nanodflash.tools.bench" in _reaching(core, "nanodflash.tools", tmp_path), \
        "a relative import of a tool must be resolved and seen"
    assert "nanodflash.pipeline.flags" in _reaching(core, "nanodflash.pipeline", tmp_path), \
        "a relative import of the pipeline must be resolved and seen"
    assert not _reaching(core, "nanodflash.tool", tmp_path), "a package is matched by name, not by prefix"
    tool = tmp_path / "nanodflash" / "tools" / "fake.py"
    tool.write_text("from ..pipeline.record import reusable\nfrom .cli import ints\n")
    assert "nanodflash.pipeline.record" in _reaching(tool, "nanodflash.pipeline", tmp_path), \
        "a tool's relative import of the pipeline must be resolved and seen"


def _function(path, name):
    """The ast node of the top-level function `name` in `path`."""
    return next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == name)


def _body_lines(fn):
    """Lines of a function's body, its docstring left out."""
    body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
        else fn.body
    return body[-1].end_lineno - body[0].lineno + 1


INSTRUMENTS = {"time", "perf_counter", "timer", "on_step", "rng_state", "get_state", "callback"}


def _instruments(fn):
    """The names of INSTRUMENTS a function uses: as a name, an attribute or an argument."""
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)} | \
            {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}
    return sorted(names & INSTRUMENTS)


def test_the_instrument_check_catches_a_timer_and_a_callback(tmp_path):
    fake = tmp_path / "speculative.py"
    fake.write_text("import time\ndef speculative_step(r, on_step=None):\n    t0 = time.perf_counter()\n")
    assert _instruments(_function(fake, "speculative_step")) == ["on_step", "perf_counter", "time"]


# the classes with methods speculative.py may have: none carries a step's phases
RECORDS_AND_POLICIES = {"SpecStats": "a run's record: record() appends a step's numbers, tau sums them",
                        "FixedBlockSize": "the fixed block-size policy: next() and update() of a constant"}


def test_the_speculative_step_is_one_function_and_the_loop_a_short_loop_over_it_with_nothing_around():
    path = CORE / "speculative.py"
    step, loop = _function(path, "speculative_step"), _function(path, "speculative_generate")
    assert step.end_lineno - step.lineno + 1 <= 50, "speculative_step is over 50 lines: one screen, one step"
    assert _body_lines(loop) <= 20, "speculative_generate's body is over 20 lines: a loop over the step"
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "speculative_step"
               for n in ast.walk(loop)), "speculative_generate must call speculative_step"
    for fn in (step, loop):
        assert not _instruments(fn), \
            f"{fn.name} times, records or calls back ({_instruments(fn)}): tools/watch.py does that"
    classes = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)
               and any(isinstance(m, ast.FunctionDef) for m in n.body) and n.name not in RECORDS_AND_POLICIES]
    assert not classes, f"speculative.py has classes with methods {classes}: the step is a function"


def test_sample_py_reads_in_one_sitting():
    path = ROOT / "sample.py"
    assert len(path.read_text().splitlines()) <= 150, "sample.py is over 150 lines: move its tools to tools/"
    main = _function(path, "main")
    assert main.end_lineno - main.lineno + 1 <= 50, "sample.py's main is over 50 lines"


def _links(path):
    """Relative link targets in a markdown file (external links and anchors left out)."""
    text = path.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_readme_and_docs_link_only_to_files_that_exist():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in _links(page):
            assert (page.parent / target).exists(), \
                f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_readme_stays_within_its_line_budget():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_BUDGET, (f"README.md has {n} lines, over its budget of {README_BUDGET}: move "
                                "experiments and long tables to docs/")


# Private names of other libraries the code must read, each with the reason it has no public form
FOREIGN_PRIVATE = {"_pat_str": "tiktoken's Encoding keeps its split pattern only there (hf_tokenizer.py)"}


def _private_uses(path):
    """(line, name) of every private name a file takes from elsewhere: `from m import _x`, or `obj._x`
    where obj is not self, cls or super() (dunders are public)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                continue
            found.append((node.lineno, node.attr))
    return [(line, name) for line, name in found if name not in FOREIGN_PRIVATE]


def test_no_module_uses_another_modules_private_names():
    files = [*sorted(CORE.rglob("*.py")), ROOT / "train_tiny.py", ROOT / "sample.py"]
    for path in files:
        uses = _private_uses(path)
        assert not uses, (f"{path.relative_to(ROOT)} uses private names of other modules at (line, name) "
                          f"{uses}: make the name public where it is defined, or keep the call inside")


def test_the_private_name_check_catches_an_import_and_an_attribute(tmp_path):
    fake = tmp_path / "fake.py"
    fake.write_text("from .drafter import _helper\nx = drafter._rope(p)\n"
                    "y = self._mine()\nz = super()._up()\n")
    assert [name for _, name in _private_uses(fake)] == ["_helper", "_rope"], \
        "an imported private name and a private attribute of another object must be caught, self's must not"


def test_notebooks_import_the_installed_package_without_editing_sys_path():
    for path in [ROOT / "notebooks" / "_setup.py", *sorted((ROOT / "notebooks").glob("*.ipynb"))]:
        assert "sys.path" not in path.read_text(), \
            f"{path.relative_to(ROOT)} edits sys.path: the package is installed (make), import it as it is"


def test_the_tools_index_names_every_tool_module():
    import nanodflash.tools
    index, folder = nanodflash.tools.__doc__, ROOT / "nanodflash" / "tools"
    missing = [p.name for p in sorted(folder.glob("*.py"))
               if p.name != "__init__.py" and not re.search(rf"\b{re.escape(p.name)}\b", index)]
    assert not missing, f"nanodflash/tools/__init__.py's index does not name {missing}: say what each is for"


def test_the_readme_lists_exactly_the_core_files_with_their_true_sizes():
    rows = re.findall(r"^\| `(\w+\.py)` \| (\d+) \((\d+)\) \|", (ROOT / "README.md").read_text(), re.M)
    listed = {name: (int(total), int(code)) for name, total, code in rows}
    true = {p.name: (len(p.read_text().splitlines()), lines_of_code(p.read_text())) for p in core_modules()}
    assert listed == true, f"README's reading table says (lines, code) {listed}; the files have {true}"


def long_markdown_lines(path):
    """Lines over 110 characters, but for a line that is one citation of third-party code (a code span that
    cannot wrap)."""
    return [i for i, line in enumerate(path.read_text().splitlines(), 1)
            if len(line) > 110 and not re.fullmatch(r"\s*(- )?`[^`\s]+`[.,;:]?( and| or)?", line)]


def test_the_readme_and_the_docs_keep_to_110_characters_a_line():
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "log.md")]
    found = {p.name: lines for p in pages if (lines := long_markdown_lines(p))}
    assert not found, f"lines over 110 characters (file: line numbers): {found}"
