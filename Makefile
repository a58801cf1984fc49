# vllm-loadtest: `make test` runs the whole suite; every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv test lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check .

test: venv lint
	$(PY) -m pytest

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
