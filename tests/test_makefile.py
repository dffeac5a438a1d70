"""The Makefile's install lines, as `make -n` prints them: where no wheel folder is configured uv picks
torch's build from the machine (the CPU build without an NVIDIA driver); where one is, its wheel."""

import os
import subprocess

from helpers import ROOT


def install_lines(env):
    out = subprocess.run(["make", "-n", "-B", ".venv/bin/.installed"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if "uv pip install" in line]


def test_without_a_wheel_folder_uv_chooses_torchs_build_for_the_machine():
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    env["PIP_CONFIG_FILE"] = os.devnull                      # no pip config: a student's laptop
    lines = install_lines(env)
    assert lines and all("--torch-backend=auto" in line and "--find-links" not in line
                         for line in lines), lines


def test_with_a_wheel_folder_its_wheels_are_used_and_no_backend_is_chosen(tmp_path):
    env = dict(os.environ, PIP_FIND_LINKS=str(tmp_path))
    lines = install_lines(env)
    assert lines and all(f"--find-links {tmp_path}" in line and "--torch-backend" not in line
                         for line in lines), lines
