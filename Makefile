# The two commands the README opens with: `make demo` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/durably: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: demo test lint bench
demo: $(BIN)/durably
	$(BIN)/durably triage --task m1-done-after-delete --state .durably-demo --approve off --model replay

test: $(BIN)/durably
	scripts/system-deps
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest

bench: $(BIN)/durably
	$(BIN)/python benchmarks/save.py
