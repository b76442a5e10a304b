# Set-up and entry points. Everything lives in .venv/ at the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0

.PHONY: install demo test test-fast lint clean

$(BIN)/neobert-embed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip setuptools wheel
	$(BIN)/pip install "$(TORCH_PIN)"
	$(BIN)/pip install -e ".[dev,pretrain,serve,inference]" "$(TORCH_PIN)"
	touch $@

install: $(BIN)/neobert-embed

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/neobert-embed demo

# CI: every test; the 15 slowest are printed
test: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q --durations=15

# Iteration: the tests not marked slow (by hand, or listed in tests/slow_tests.txt from measured durations)
test-fast: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m "not slow" --durations=15

lint: install
	$(BIN)/ruff check neobert_embed tests benchmarks

clean:
	rm -rf $(VENV) runs/demo
