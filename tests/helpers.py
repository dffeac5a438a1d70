"""What the tests share: the tiny seeded models and oracle drafters (they live with the exercises, which
check students' code on them: nanodflash/exercises/models.py), and ways to run the scripts (in this process,
or as a subprocess to signal or kill). The fixtures and hooks are in conftest.py."""

import contextlib
import io
import os
import runpy
import shutil
import subprocess
import sys
import traceback
import warnings

import pytest
import torch

from nanodflash.exercises.models import (  # noqa: F401 (the suite's models live with the exercises)
    MASK_ID,
    VOCAB,
    OracleDrafter,
    greedy_continuation,
    soft_pair,
    tiny_dflash2,
    tiny_drafter,
    tiny_target,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository


@contextlib.contextmanager
def in_process(cwd):
    """Run something in this test process as if it were its own: in `cwd`, with this process's working
    directory, thread count and random state put back afterwards."""
    saved_cwd, saved_threads = os.getcwd(), torch.get_num_threads()
    try:
        os.chdir(cwd)
        with torch.random.fork_rng():
            yield
    finally:
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)


def run_command(*argv, cwd=None):
    """`python ARGV...` run inside this test process (a script of the repository, or `-m module`), returned
    as a subprocess.CompletedProcess would be: exit status, stdout, stderr. As the interpreter does, an
    uncaught exception prints its traceback to stderr and exits 1, and SystemExit(message) prints the message
    and exits 1. In-process, a call costs its work only, not an interpreter start and torch's import (about
    2.5 s on 2 cores); tests that kill or signal a run use a real subprocess (`smoke_run_in_training`)."""
    argv = [str(a) for a in argv]
    out, err, status = io.StringIO(), io.StringIO(), 0
    saved_argv = sys.argv
    try:
        with in_process(cwd or ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)   # runpy: -m of an
            try:                                                                            # imported module
                if argv[0] == "-m":
                    sys.argv = argv[1:]
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = [os.path.join(ROOT, argv[0]), *argv[1:]]
                    runpy.run_path(sys.argv[0], run_name="__main__")
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    status = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    status = 1
            except Exception:                                       # what the interpreter prints, then exit 1
                traceback.print_exc()
                status = 1
    finally:
        sys.argv = saved_argv
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


def smoke_run_in_training(out):
    """`train_tiny.py --smoke` (with a target stage too long to finish) as a subprocess, returned once the
    target is training; the caller stops it (kill, or a signal)."""
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_tiny.py"), "--smoke",
                             "--out", str(out), "--target_steps", "100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    for line in proc.stdout:                                          # wait until the target is training
        if b"[target] step" in line:
            break
    return proc


def shared(tmp_path_factory, name):
    """(the folder both xdist workers share, a file lock named `name` in it): what a session fixture builds
    there once, under the lock, the other worker waits for and reads (tests copy it to change anything)."""
    from filelock import FileLock
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                                   # the run's folder, above each worker's own
    return root, FileLock(str(root / f"{name}.lock"))


HOW = ("no headless browser: `apt-get install chromium chromium-driver` (Debian) and the test extra's "
       "selenium run the trace and race pages' browser tests")


def browser(width=1200, height=1300):
    """A headless Chromium driven by selenium, or a skip (a failure where the browser is required)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        selenium = None
    else:
        selenium = webdriver
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if selenium is None or chrome is None or driver is None:
        if os.environ.get("NANODFLASH_BROWSER_REQUIRED"):
            pytest.fail(HOW)
        pytest.skip(HOW)
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)


def visible(text):
    """The page's way of showing a token: spaces, tabs and newlines drawn."""
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n")
