# The two entry points of the README. Each does its own set-up (idempotent) first.
PY := .venv/bin/python

.PHONY: setup test demo lint docs
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
