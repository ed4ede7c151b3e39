# The two commands the README opens with: `make demo` and `make test`.
#
# Each starts with the system step (scripts/system-deps), then makes .venv: on a
# machine with only python3 and make, the system step installs the Python 3.11
# venv module the virtualenv is made with (and, for the tests, strace and
# PostgreSQL). `make -n demo` and `make -n test` show that order.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

# pipefail: a pip that fails fails the step, though its output is filtered.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec

# The system step must finish before the virtualenv starts, even under `make -j`.
.NOTPARALLEL:

.PHONY: demo test bench version-matrix system-demo system-test
system-demo:
	scripts/system-deps demo

system-test:
	scripts/system-deps test

# Each step says what it does first: the install takes a minute or more on a fresh
# machine, and a silent minute reads as a hang.
$(BIN)/durably: pyproject.toml
	@echo "[1/3] making the virtualenv $(VENV) with $(PY)"
	$(PY) -m venv $(VENV)
	@echo "[2/3] upgrading pip in $(VENV)"
	$(BIN)/pip install --quiet --upgrade pip
	@echo "[3/3] installing durably and its test dependencies into $(VENV) (a minute or two; pip's progress follows)"
	$(BIN)/pip install -e '.[dev]' | { grep --line-buffered -E '^(Collecting|Installing|Successfully)' || true; }
	touch $@

demo: system-demo $(BIN)/durably
	$(BIN)/durably triage --task m1-done-after-delete --state .durably-demo --approve off --model replay

test: system-test $(BIN)/durably
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -n auto
	$(MAKE) version-matrix

# The front ends' tests again at the oldest SDK versions their extras allow (.venv has
# the newest): scripts/version_matrix.py makes .venv-oldest with the pins (once) and
# prints the versions each environment tested.
version-matrix: $(BIN)/durably
	$(BIN)/python scripts/version_matrix.py --python $(PY)

bench: $(BIN)/durably
	$(BIN)/python benchmarks/save.py
