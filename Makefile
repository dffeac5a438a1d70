# Two commands do everything, set-up included:
#   make demo        trains tokenizer -> target -> drafter on the embedded corpus, then samples with DFlash
#   make test        runs the test suite on both cores (unit tests, losslessness, scripts, notebooks,
#                    conformance with transformers + the official dflash package, which only the tests
#                    install)
#   make install     the student install: the package, Jupyter and the plots (notebooks and exercises)
#   make notebooks   opens the notebooks in Jupyter (after make demo: they read out/)
#   make course      the notebooks executed on out/'s checkpoints, as HTML handouts in out/course/
# Each creates a local virtual environment in .venv on first use and installs the package into it, editable
# (pyproject.toml holds the dependencies: demo installs only what it needs, test and notebooks their extras).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# uv installs into the venv, a few times faster than pip. It reads no pip config, so the wheel folders pip is
# pointed at (where some machines keep a CPU build of torch) are passed on. The venv's own pip installs uv,
# so no system pip is needed; `.venv/bin/uv pip install --python .venv/bin/python PKG` adds a package. (`=`:
# pip is asked only when a recipe installs something, not on every make.)
FIND_LINKS  = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
# torch for the machine: without a wheel folder, uv picks the build from the machine (--torch-backend=auto:
# the CPU build where no NVIDIA driver is found, so a laptop does not download a multi-GB CUDA build); with
# one, the wheel there (the CPU build these machines keep).
TORCH_BUILD = $(if $(strip $(FIND_LINKS)),,--torch-backend=auto)
UV     = $(BIN)/uv pip install --quiet --python $(BIN)/python $(foreach d,$(FIND_LINKS),--find-links $(d)) \
         $(TORCH_BUILD)

# Bytecode is compiled as modules are first imported, into .venv/pycache, not for every file at install: the
# demo and the tests import a fraction of torch and transformers (docs/log.md).
# Where the environment sets PYTHONDONTWRITEBYTECODE (containers often do), every process would otherwise
# recompile what it imports.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CURDIR)/$(VENV)/pycache

.PHONY: demo test notebooks install course smoke clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv==0.13.9
	$(UV) -e .
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python train_tiny.py
	$(BIN)/python sample.py

# The official dflash package, for the conformance tests only, without its pinned dependencies: its model code
# needs only torch and transformers (the test extra's)
$(BIN)/.test-installed: $(BIN)/.installed
	$(UV) -e '.[test]'
	$(UV) --no-deps dflash==0.1.0
	touch $@

# The linter first (seconds), then the suite on both cores; a worker that runs out of tests takes some of the
# other's (worksteal), so both finish together
test: $(BIN)/.test-installed
	$(BIN)/ruff check
	$(BIN)/python -m pytest -q -n 2 --dist worksteal tests

# The student install: the package with Jupyter and the plots, without the test extras (transformers, the
# browser driver). Enough for the notebooks and the exercises; make notebooks then opens them.
$(BIN)/.notebooks-installed: $(BIN)/.installed
	$(UV) -e '.[notebooks]'
	touch $@

install: $(BIN)/.notebooks-installed

notebooks: $(BIN)/.notebooks-installed
	$(BIN)/jupyter notebook notebooks/

# Handouts: every notebook executed on a run's checkpoints, as HTML in OUT/course/ (OUT=out_smoke for toys)
course: $(BIN)/.notebooks-installed
	$(BIN)/python -m nanodflash.tools.course --out $(or $(OUT),out)

smoke: $(BIN)/.installed
	$(BIN)/python train_tiny.py --smoke --out out_smoke
	$(BIN)/python sample.py --out out_smoke

clean:
	rm -rf out out_smoke .pytest_cache nanodflash.egg-info
