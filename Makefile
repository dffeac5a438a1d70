# Two commands do everything, set-up included:
#   make demo        trains tokenizer -> target -> drafter on the embedded corpus, then samples with DFlash
#   make test        runs the test suite on both cores (unit tests, losslessness, scripts, notebooks, conformance
#                    with transformers + the official dflash package, which only the tests install)
#   make notebooks   opens the notebooks in Jupyter (after make demo: they read out/)
# Each creates a local virtual environment in .venv on first use; demo installs only what it needs.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test notebooks smoke clean

$(BIN)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python train_tiny.py
	$(BIN)/python sample.py

$(BIN)/.test-installed: $(BIN)/.installed requirements-test.txt
	$(BIN)/python -m pip install --quiet -r requirements-test.txt
	$(BIN)/python -m pip install --quiet --no-deps dflash==0.1.0
	touch $@

test: $(BIN)/.test-installed
	$(BIN)/python -m pytest -q -n 2 tests

notebooks: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet notebook matplotlib==3.11.2
	$(BIN)/jupyter notebook notebooks/

smoke: $(BIN)/.installed
	$(BIN)/python train_tiny.py --smoke --out out_smoke
	$(BIN)/python sample.py --out out_smoke

clean:
	rm -rf out out_smoke .pytest_cache
