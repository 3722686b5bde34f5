# The two entry points of the README. Each does its own set-up (idempotent) first.
PY := .venv/bin/python

.PHONY: setup test demo lint docs fuzz
setup:
	@bash scripts/setup.sh

# Lint, format and types first: any error fails the target before a test runs (CI runs `make test`).
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	.venv/bin/zeps demo

# The API reference (gateway.__all__ and its docstrings) into build/api/ (not committed): open build/api/gateway.html.
docs: setup
	$(PY) -m pdoc gateway -o build/api

# mypy through the venv's python: a copied venv's bin/mypy may name another venv's interpreter.
lint: setup
	.venv/bin/ruff check gateway netlab tests
	.venv/bin/ruff format --check gateway netlab tests
	$(PY) -m mypy

# Coverage-guided fuzzing of every decoder (tests/fuzz/run.py): the targets one after the other, each bounded in
# executions and in seconds; prints the executions per target and fails on a crash (its input: build/fuzz/crashes).
FUZZ_RUNS ?= 1000000
FUZZ_MAX_S ?= 900
fuzz: setup
	$(PY) tests/fuzz/run.py all --runs $(FUZZ_RUNS) --max-time $(FUZZ_MAX_S)
