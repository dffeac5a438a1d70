# Two commands do everything, set-up included:
#   make demo   trains tokenizer -> target -> drafter on the embedded corpus, then samples with DFlash
#   make test   runs the test suite (unit tests, losslessness, scripts, notebooks)
# Both create a local virtual environment in .venv on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test smoke clean

$(BIN)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python train_tiny.py
	$(BIN)/python sample.py

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests

smoke: $(BIN)/.installed
	$(BIN)/python train_tiny.py --smoke --out out_smoke
	$(BIN)/python sample.py --out out_smoke

clean:
	rm -rf out out_smoke .pytest_cache
