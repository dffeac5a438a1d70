"""The notebooks are product: each one executes top to bottom on a CPU (against smoke checkpoints,
made once per session), and each is committed with its outputs stripped.

They run in ipykernel's in-process kernel: the IPython shell a Jupyter kernel runs, magics and inline plots
included, inside the test process, which has torch imported already (a kernel process per notebook would
import it again, about 4 s each on 2 cores)."""

import contextlib
import signal
import sys
from pathlib import Path

import pytest

from helpers import in_process

nbformat = pytest.importorskip("nbformat")
inprocess = pytest.importorskip("ipykernel.inprocess.ipkernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def shell(smoke_out):
    """The in-process kernel's shell, with the notebooks pointed at the smoke checkpoints, plots off
    screen."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANODFLASH_OUT", str(smoke_out))
        mp.setenv("MPLBACKEND", "agg")
        kernel = inprocess.InProcessKernel()
        kernel.shell.colors = "nocolor"
        yield kernel.shell
        kernel.iopub_thread.stop()


@contextlib.contextmanager
def cell_timeout(seconds):
    """Raise TimeoutError inside a cell that runs longer than `seconds` (a hung cell fails, it does not
    hang)."""
    def expire(signum, frame):
        raise TimeoutError(f"cell still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_notebook(shell, path, timeout_s=CELL_TIMEOUT_S):
    """Every code cell of `path` in order, in the notebooks' folder (`in_process` puts the test process's
    working directory, thread count and random state back); afterwards the shell's namespace is cleared
    (one shell serves every notebook)."""
    try:
        with in_process(NOTEBOOK_DIR):
            for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
                if cell.cell_type != "code":
                    continue
                with cell_timeout(timeout_s):
                    result = shell.run_cell(cell.source, store_history=False)
                if not result.success:
                    error = result.error_in_exec or result.error_before_exec
                    pytest.fail(f"{path.name}, code cell {i}, raised {error!r}:\n{cell.source}",
                                pytrace=False)
    finally:
        shell.reset(new_session=True)
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")     # the figures the notebook drew


GUIDED_TOURS = ["01_target_and_kv_cache", "02_the_drafter", "03_one_speculative_step", "04_why_lossless",
                "05_training_what_matters", "06_dflash2_selector", "07_dflash2_convolutions", "08_trees",
                "09_batching"]


def test_every_guided_tour_is_there_and_no_other():
    found = [p.stem for p in NOTEBOOKS]
    assert found == GUIDED_TOURS, f"notebooks/ holds {found}, the README's tours are {GUIDED_TOURS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_top_to_bottom(path, shell):
    run_notebook(shell, path)


def test_a_cell_that_raises_or_hangs_fails_the_notebook_test(shell, tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("x / 0")])
    nbformat.write(nb, tmp_path / "raises.ipynb")
    with pytest.raises(pytest.fail.Exception, match="code cell 1, raised ZeroDivisionError"):
        run_notebook(shell, tmp_path / "raises.ipynb")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(30)")]),
                   tmp_path / "hangs.ipynb")
    with pytest.raises(pytest.fail.Exception, match="TimeoutError"):
        run_notebook(shell, tmp_path / "hangs.ipynb", timeout_s=1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_have_outputs_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, \
        f"{path.name}: cells {dirty} have outputs or execution counts; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_opens_by_saying_what_it_teaches(path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), \
        f"{path.name}: start with a markdown title"


# ----------------------------------------------------------------------------- what the notebooks teach with

sys.path.insert(0, str(NOTEBOOK_DIR))
import _setup  # noqa: E402  (notebooks/_setup.py: the shared setup every notebook starts with)

PROMPT_CALLS = {"encode_ordinary", "encode", "code_prompt"}


def string_prompts(path):
    """Every string literal a notebook hands to the tokenizer (tok.encode_ordinary / encode) or to
    code_prompt."""
    import ast
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in PROMPT_CALLS:
                    found += [a.value for a in node.args
                              if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return found


def test_the_code_check_tells_code_from_prose():
    for prose in ["The for statement is used to iterate over", "If the exception is raised",
                  " a different continuation"]:
        assert not _setup.looks_like_code(prose), prose
    for code in [_setup.CODE_PROMPT, "import os\n", "        self.name = name", "    for item in items:\n"]:
        assert _setup.looks_like_code(code), code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_notebook_prompts_the_code_model_with_prose(path):
    """The default target learned Python source: hand-written prompts must be code (held-out ones come from
    the validation split via _setup.held_out_prompts, which has no literal to check)."""
    prose = [s for s in string_prompts(path) if not _setup.looks_like_code(s)]
    assert not prose, \
        f"{path.name}: prose prompts {prose}; use code (code_prompt) or held_out_prompts(data, n)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_use_the_shared_setup(path):
    sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert "from _setup import" in sources[0], \
        f"{path.name}: the first code cell should use notebooks/_setup.py"
    assert not any("ROOT = next(" in s for s in sources), f"{path.name}: a copy of the old setup cell is left"


TOURS = NOTEBOOKS                     # every notebook ends with exercises and worked solutions


@pytest.mark.parametrize("path", TOURS, ids=[p.stem for p in TOURS])
def test_tours_end_with_exercises_and_solutions_that_run(path):
    """2-4 exercises, then a Solutions section of code cells (executed by
    test_notebook_executes_top_to_bottom)."""
    import re
    cells = nbformat.read(path, as_version=4).cells
    ex = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source]
    sol = [i for i, c in enumerate(cells)
           if c.cell_type == "markdown" and c.source.startswith("## Solutions")]
    assert ex and sol and ex[0] < sol[0], f"{path.name}: needs '## Exercises' and then '## Solutions'"
    n_ex = len(re.findall(r"^\d+\. \*\*", cells[ex[0]].source.split("## Exercises")[1], re.MULTILINE))
    assert 2 <= n_ex <= 4, f"{path.name}: {n_ex} exercises, want 2-4"
    solutions = [c for c in cells[sol[0] + 1:] if c.cell_type == "code"]
    assert len(solutions) >= n_ex, f"{path.name}: {n_ex} exercises but {len(solutions)} solution cells"
