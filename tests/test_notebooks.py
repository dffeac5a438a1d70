"""The notebooks are product: each one executes top to bottom on a CPU (against smoke checkpoints,
made once per session), and each is committed with its outputs stripped."""

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
ipykernel_kernelspec = pytest.importorskip("ipykernel.kernelspec")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def notebook_env(smoke_out, tmp_path_factory):
    """Point the notebooks at the smoke checkpoints, and make kernel "python3" this very interpreter.

    A kernelspec named python3 elsewhere on the machine (e.g. ~/.local/share/jupyter) could start a
    Python without torch; a spec written here, first on JUPYTER_PATH, wins over all of them.
    Kernels get one OpenMP thread: these models are tiny, and when the test run shares the CPU with
    other work, several spinning threads per process make one-token forwards ~50x slower.
    """
    jupyter_dir = tmp_path_factory.mktemp("jupyter")
    ipykernel_kernelspec.write_kernel_spec(jupyter_dir / "kernels" / "python3")   # argv[0] = sys.executable
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NANODFLASH_OUT", str(smoke_out))
        mp.setenv("JUPYTER_PATH", os.pathsep.join([str(jupyter_dir), os.environ.get("JUPYTER_PATH", "")]))
        mp.setenv("MPLBACKEND", "agg")
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


GUIDED_TOURS = ["01_target_and_kv_cache", "02_the_drafter", "03_one_speculative_step", "04_why_lossless",
                "05_training_what_matters", "06_dflash2", "07_trees",
                "08_batching"]


def test_every_guided_tour_is_there_and_no_other():
    found = [p.stem for p in NOTEBOOKS]
    assert found == GUIDED_TOURS, f"notebooks/ holds {found}, the README's tours are {GUIDED_TOURS}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_top_to_bottom(path, notebook_env):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})   # cwd = notebooks/
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_have_outputs_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_opens_by_saying_what_it_teaches(path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{path.name}: start with a markdown title"


# ----------------------------------------------------------------------------- what the notebooks teach with

sys.path.insert(0, str(NOTEBOOK_DIR))
import _setup  # noqa: E402  (notebooks/_setup.py: the shared setup every notebook starts with)

PROMPT_CALLS = {"encode_ordinary", "encode", "code_prompt"}


def string_prompts(path):
    """Every string literal a notebook hands to the tokenizer (tok.encode_ordinary / encode) or to code_prompt."""
    import ast
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in PROMPT_CALLS:
                    found += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return found


def test_the_code_check_tells_code_from_prose():
    for prose in ["The for statement is used to iterate over", "If the exception is raised", " a different continuation"]:
        assert not _setup.looks_like_code(prose), prose
    for code in [_setup.CODE_PROMPT, "import os\n", "        self.name = name", "    for item in items:\n"]:
        assert _setup.looks_like_code(code), code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_notebook_prompts_the_code_model_with_prose(path):
    """The default target learned Python source: hand-written prompts must be code (held-out ones come from
    the validation split via _setup.held_out_prompts, which has no literal to check)."""
    prose = [s for s in string_prompts(path) if not _setup.looks_like_code(s)]
    assert not prose, f"{path.name}: prose prompts {prose}; use code (code_prompt) or held_out_prompts(data, n)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_use_the_shared_setup(path):
    sources = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert "from _setup import" in sources[0], f"{path.name}: the first code cell should use notebooks/_setup.py"
    assert not any("ROOT = next(" in s for s in sources), f"{path.name}: a copy of the old setup cell is left"


TOURS = [p for p in NOTEBOOKS if p.name[:2] in {"01", "02", "03", "04", "05", "06"}]


@pytest.mark.parametrize("path", TOURS, ids=[p.stem for p in TOURS])
def test_tours_end_with_exercises_and_solutions_that_run(path):
    """2-4 exercises, then a Solutions section of code cells (executed by test_notebook_executes_top_to_bottom)."""
    import re
    cells = nbformat.read(path, as_version=4).cells
    ex = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source]
    sol = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Solutions")]
    assert ex and sol and ex[0] < sol[0], f"{path.name}: needs '## Exercises' and then '## Solutions'"
    n_ex = len(re.findall(r"^\d+\. \*\*", cells[ex[0]].source.split("## Exercises")[1], re.MULTILINE))
    assert 2 <= n_ex <= 4, f"{path.name}: {n_ex} exercises, want 2-4"
    solutions = [c for c in cells[sol[0] + 1:] if c.cell_type == "code"]
    assert len(solutions) >= n_ex, f"{path.name}: {n_ex} exercises but {len(solutions)} solution cells"
