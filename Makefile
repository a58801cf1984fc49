# vllm-loadtest: `make test` runs the whole suite; every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv demo test test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# The demo: a real vLLM (CPU build, tiny generated model, small KV cache), a stepped load from 1 to 64 users,
# the batching-curve table. First run installs vLLM's CPU build (~3 min); then ~6 min.
demo: venv
	$(PY) -m embedded_vllm demo

lint: venv
	$(VENV)/bin/ruff check .

# Everything, including the integration tests against the embedded real vLLM (installed on first use).
test: venv lint
	$(PY) -m pytest

test-fast: venv lint
	$(PY) -m pytest -m "not vllm"

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
