# The two entry points of the README. Each does its own set-up (idempotent) first.
PY := .venv/bin/python

.PHONY: setup test demo lint
setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	.venv/bin/zeps demo

lint: setup
	.venv/bin/ruff check gateway netlab tests
	.venv/bin/ruff format --check gateway netlab tests
