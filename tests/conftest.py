"""The fixtures and hooks of the suite; the shared code is in helpers.py. Nothing here imports torch at
module level: pytest-xdist's controller loads this file before it starts the workers, and a torch import
there would delay both (about 2.5 s, more from a fresh clone, where it first compiles torch's bytecode)."""

import os
import sys

import pytest

# One CPU thread per test process, set as torch's default (the one_thread fixture sets only the calling
# thread's count): the suite runs on two workers (make test), one per core of a 2-core machine, so a second
# thread in any process (a notebook's inline training on "every core", a subprocess) would wait on a core the
# other worker holds, and slow both. Set before the workers start, so they and their subprocesses inherit it.
os.environ["OMP_NUM_THREADS"] = "1"

# jsonschema (which nbformat validates notebooks with) imports rfc3987_syntax for its "iri" format check, if
# installed, and that builds a grammar at import: 1.4-2.7 s per test process. No notebook schema asks for the
# format, so the suite's processes go without it.
sys.modules.setdefault("rfc3987_syntax", None)


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The test models are tiny: one thread avoids thread-pool overhead that dominates (and contends) on
    2 cores."""
    import torch
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def imports_out_of_the_collectors_reach(one_thread):
    """What importing torch and the library made (about 170,000 objects) lives as long as the test process:
    frozen, a full garbage collection no longer scans it again (a tenth of a second each; a notebook's
    reset collects once, the collector itself every so often)."""
    import gc

    import nanodflash  # noqa: F401
    gc.freeze()


@pytest.fixture(scope="session")
def target():
    from helpers import tiny_target
    return tiny_target()


@pytest.fixture(scope="session")
def drafter(target):
    from helpers import tiny_drafter
    return tiny_drafter(target)


@pytest.fixture(scope="session")
def small():
    """The sampled-tree tests' models: a peaked target on test_sampling_exact's tiny vocabulary, with a DFlash
    and a DFlash 2 drafter (selector and convolutions moved away from their start) of block size 4."""
    from nanodflash.exercises.models import small_drafters, small_target
    target = small_target()
    drafters = small_drafters(target)
    return target, drafters


@pytest.fixture(scope="session")
def smoke_out(tmp_path_factory):
    """Checkpoints from `train_tiny.py --smoke --sampling` (every stage, the sampling drafter's too), made
    once per test run and shared by every test file. Under xdist both workers share one folder: the first to
    need it trains it while the other waits on a file lock (tests only read it; they copy it to change
    anything)."""
    import train_tiny
    from helpers import shared
    root, lock = shared(tmp_path_factory, "smoke_checkpoints")
    out = root / "smoke_checkpoints"
    with lock:
        if not (out / "drafter_sampling.pt").exists():
            train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    return out


# The order the tests are handed out in, for two workers to finish together: the files that take longest
# (30 s or more of CPU in all) first, the quick ones (well under a second a test) last. pytest-xdist
# (--dist worksteal, as make test runs it) gives each worker half of the list in order, and a worker that runs
# out takes the last half of what the other has left: quick tests, so neither waits long at the end
# (docs/log.md).
SLOW_FILES = {"test_batch.py", "test_bench.py", "test_dflash2.py",
              "test_long_generation.py", "test_notebooks.py", "test_resume.py", "test_sampling_exact.py",
              "test_sampling_kinds.py", "test_tree.py"}
QUICK_FILES = {"test_data.py", "test_drafter.py", "test_flags.py", "test_gpt.py", "test_greedy_ties.py",
               "test_layout.py", "test_readme_errors.py", "test_sampling_transform.py", "test_tokenizer.py",
               "test_verify.py"}


# First of all, the files whose module fixtures cost seconds a second time: the official code's import
# (test_hf.py, about 4.5 s) and the compiled graphs (test_compiled.py, seconds of C++ each with an empty
# compile cache). The first worker starts on the first half of the list, so these files run whole on it,
# once.
ONCE_FILES = ("test_hf.py", "test_compiled.py")


def pytest_collection_modifyitems(items):
    def tier(item):
        name = item.path.name
        if name in ONCE_FILES:
            return ONCE_FILES.index(name)
        return 2 if name in SLOW_FILES else 4 if name in QUICK_FILES else 3
    items.sort(key=tier)                                             # stable: each file keeps its order

