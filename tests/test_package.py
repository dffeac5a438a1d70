"""nanodflash is a package like any other: installed (make installs it editable into .venv), it imports and
its tools run from any folder, not only from the repository's root."""

import os
import subprocess
import sys


def test_the_benchmark_runs_from_a_folder_outside_the_repository(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}        # only the installed package
    run = subprocess.run([sys.executable, "-m", "nanodflash.tools.bench", "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"python -m nanodflash.tools.bench --help failed outside the repository:\n" \
                                f"{run.stderr[-2000:]}\n(is the package installed? make test installs it)"
    assert "--out" in run.stdout, "the benchmark's help should list its --out flag"
