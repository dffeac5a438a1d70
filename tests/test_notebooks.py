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


def test_all_five_guided_tours_are_there():
    assert len(NOTEBOOKS) >= 5, f"expected the five guided tours in {NOTEBOOK_DIR}, found {[p.name for p in NOTEBOOKS]}"


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
