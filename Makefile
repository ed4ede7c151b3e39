# The two commands the README opens with: `make demo` and `make test`.
#
# Each starts with the system step (scripts/system-deps), then makes .venv: on a
# machine with only python3 and make, the system step installs the Python 3.11
# venv module the virtualenv is made with (and, for the tests, strace and
# PostgreSQL). `make -n demo` and `make -n test` show that order.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

# The system step must finish before the virtualenv starts, even under `make -j`.
.NOTPARALLEL:

.PHONY: demo test bench system-demo system-test
system-demo:
	scripts/system-deps demo

system-test:
	scripts/system-deps test

$(BIN)/durably: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: system-demo $(BIN)/durably
	$(BIN)/durably triage --task m1-done-after-delete --state .durably-demo --approve off --model replay

test: system-test $(BIN)/durably
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/ruff format --check src tests benchmarks examples scripts
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest

bench: $(BIN)/durably
	$(BIN)/python benchmarks/save.py
