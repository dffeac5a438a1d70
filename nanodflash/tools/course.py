"""Handouts for a class: every notebook executed on a run's checkpoints, as readable HTML.

    python -m nanodflash.tools.course --out out          # (what `make course` runs)

For each notebook in notebooks/: runs it top to bottom with NANODFLASH_OUT=OUT (nbclient, a fresh kernel),
prints its seconds, and writes OUT/course/NAME.html (with outputs and solutions) and
OUT/course/NAME.student.html (the same outputs, without the solution cells: everything from a '## Solutions'
heading to the next '## ' heading, replaced by a note that says where they are). The notebooks in git stay
output-free; nothing is written into them.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]      # the repository
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 600                              # seconds a cell may run before the notebook fails


LEFT_OUT = ("## Solutions\n\nLeft out of this student copy: the worked solutions are in the lecturer's copy "
            "(the same name without `.student`).")


def without_solutions(nb):
    """A copy of `nb` with the cells from a '## Solutions' heading up to the next '## ' heading replaced by
    one note that says so."""
    out, skipping = nbformat.from_dict(nb), False
    kept = []
    for cell in nb.cells:
        heading = cell.cell_type == "markdown" and cell.source.lstrip().startswith("## ")
        if heading:
            skipping = cell.source.lstrip().startswith("## Solutions")
            if skipping:
                kept.append(nbformat.v4.new_markdown_cell(LEFT_OUT))
        if not skipping:
            kept.append(cell)
    out.cells = kept
    return out


def execute(path, run_folder):
    """The notebook at `path`, executed in notebooks/ on the checkpoints in `run_folder`."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    saved = os.environ.get("NANODFLASH_OUT")
    os.environ["NANODFLASH_OUT"] = str(Path(run_folder).resolve())          # the kernel's environment
    try:
        NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                       # the kernel's own log only from errors up: it warns of its local TCP on every start
                       extra_arguments=["--IPKernelApp.log_level=ERROR"],
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:                                                                 # this process's, as it was
        if saved is None:
            os.environ.pop("NANODFLASH_OUT")
        else:
            os.environ["NANODFLASH_OUT"] = saved
    return nb


def write_html(nb, path):
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    path.write_text(body, encoding="utf-8")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out", help="the run folder whose checkpoints the notebooks load, and "
                   "where course/ is written (default: %(default)s)")
    args = p.parse_args(argv)
    if not (Path(args.out) / "target.pt").is_file():
        sys.exit(f"no run in {args.out}: `make demo` trains one (or `make smoke` for toy checkpoints, then "
                 "OUT=out_smoke)")
    dest = Path(args.out) / "course"
    dest.mkdir(exist_ok=True)
    total = time.perf_counter()
    for path in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")):
        t0 = time.perf_counter()
        nb = execute(path, args.out)
        write_html(nb, dest / f"{path.stem}.html")
        write_html(without_solutions(nb), dest / f"{path.stem}.student.html")
        print(f"{path.stem}: {time.perf_counter() - t0:.0f} s -> {dest / path.stem}.html, .student.html",
              flush=True)
    print(f"all notebooks in {time.perf_counter() - total:.0f} s; open {dest}/ in a browser")


if __name__ == "__main__":
    main()
