"""The fixtures and hooks of the suite; the shared code is in helpers.py. Nothing here imports torch at
module level: pytest-xdist's controller loads this file before it starts the workers, and a torch import
there would delay both (about 2.5 s, more from a fresh clone, where it first compiles torch's bytecode)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """The test models are tiny: one thread avoids thread-pool overhead that dominates (and contends) on 2 cores."""
    import torch
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def target():
    from helpers import tiny_target
    return tiny_target()


@pytest.fixture(scope="session")
def drafter(target):
    from helpers import tiny_drafter
    return tiny_drafter(target)


@pytest.fixture(scope="session")
def smoke_out(tmp_path_factory):
    """Checkpoints from `train_tiny.py --smoke --sampling` (every stage, the sampling drafter's too), made once
    per test run and shared by every test file. Under xdist both workers share one folder: the first to need it
    trains it while the other waits on a file lock (tests only read it; they copy it to change anything)."""
    import os
    import train_tiny
    from filelock import FileLock
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                                   # the run's folder, above each worker's own
    out = root / "smoke_checkpoints"
    with FileLock(str(root / "smoke_checkpoints.lock")):
        if not (out / "drafter_sampling.pt").exists():
            train_tiny.main(["--smoke", "--sampling", "--out", str(out)])
    return out


# Files whose tests take well under a second each run last: the long tests start first, and under xdist the quick
# ones fill the end, so neither core sits idle while the other finishes a long test (docs/experiments.md).
QUICK_FILES = {"test_data.py", "test_drafter.py", "test_flags.py", "test_gpt.py", "test_greedy_ties.py",
               "test_layout.py", "test_readme_errors.py", "test_sampling_transform.py", "test_tokenizer.py",
               "test_verify.py"}


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name in QUICK_FILES)       # stable: each group keeps its order
