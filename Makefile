# vllm-loadtest: `make test` runs the whole suite; every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv vllm-install browser compose demo test test-stress test-fast coverage lint bench docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# Debian's chromium for the browser tests (tests/browser.py drives it with Playwright, whose own browsers are never
# downloaded). A no-op when it is installed; apt-get update only if the install fails (no package lists yet).
# `make test` runs this and `compose` side by side: apt-get takes one at a time (flock), and waits for the dpkg lock
# another apt holds rather than failing at once.
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_GET := flock /tmp/vllm-loadtest-apt.lock $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	apt-get -o DPkg::Lock::Timeout=600
APT_INSTALL := $(APT_GET) install -y --no-install-recommends chromium

browser:
	@test -x $(CHROMIUM) || { \
		echo "$(CHROMIUM) is missing: installing Debian's chromium"; \
		$(APT_INSTALL) || { $(APT_GET) update && $(APT_INSTALL); }; \
	}
	@test -x $(CHROMIUM) || { echo "$(CHROMIUM) still missing after installing chromium" >&2; exit 1; }

# A Compose client for tests/test_compose.py, which validates docker-compose.yml (`config`, both profiles). Debian's
# docker-compose package (v1.29: profiles and GPU reservations, and `config` needs no Docker engine) when neither
# `docker compose` nor `docker-compose` answers; Docker's own `docker compose` plugin is not in Debian. Without root
# or sudo it only says so, and the test skips its `config` check with the same reason.
APT_COMPOSE := $(APT_GET) install -y --no-install-recommends docker-compose

compose:
	@docker compose version >/dev/null 2>&1 || docker-compose version >/dev/null 2>&1 || { \
		if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
			echo "no Compose client, and neither root nor sudo to install Debian's docker-compose:" \
				"tests/test_compose.py skips its config check" >&2; \
		else \
			echo "no Compose client: installing Debian's docker-compose"; \
			$(APT_COMPOSE) || { $(APT_GET) update && $(APT_COMPOSE); }; \
			docker-compose version >/dev/null || { echo "docker-compose still missing after installing it" >&2; exit 1; }; \
		fi; \
	}

# The demo: a real vLLM (CPU build, tiny generated model, small KV cache), a stepped load from 1 to 64 users,
# the batching-curve table. First run installs vLLM's CPU build (~3 min); then ~6 min.
demo: venv
	$(PY) -m embedded_vllm demo

lint: venv
	$(VENV)/bin/ruff check .

# vLLM's CPU build in its own venv and the tiny model, for the `vllm` tier (a no-op once installed). The installer
# needs only the standard library, so it runs beside `venv` instead of after it (both are a few minutes of pip).
vllm-install:
	$(PYTHON) -m embedded_vllm install

# Everything: the four tiers of tests/README.md in one pytest, side by side (pytest-xdist, TEST_WORKERS processes).
# The `vllm` tests run in two xdist groups, each on one worker with its own servers (tests/helpers/fleet.py), so each
# embedded server starts once per session; the set-up targets run side by side first. --durations keeps the slowest
# tests in view (none may take over 60 s).
TEST_WORKERS ?= 4
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30

test:
	$(MAKE) -j4 --output-sync=target venv lint browser compose vllm-install
	$(PYTEST)

# The same while another process keeps one core busy from the start, installs included: the suite must not notice
# (tests/README.md). The burner needs only the standard library.
test-stress:
	$(PYTHON) -m tests.helpers.burner -- $(MAKE) test

# Without root, Chromium or vLLM: the unit and contract tiers only.
test-fast: venv lint
	$(PYTEST) -m "not vllm and not browser"

# Line coverage of analysis/, locustfiles/ and embedded_vllm/ over the whole suite, Locust's subprocesses included
# (pyproject.toml's [tool.coverage]); the table is written to coverage.txt.
coverage:
	$(MAKE) -j4 --output-sync=target venv lint browser compose vllm-install
	rm -f .coverage .coverage.*
	$(PYTEST) $(foreach d,analysis locustfiles embedded_vllm,--cov=$(CURDIR)/$(d)) --cov-report=term:skip-covered \
		| tee coverage.txt

# The generated reference pages (options, metrics, the command line) and every example block of README.md and docs/,
# from runs against the fake server (tests/docs_examples.py; about 2 minutes).
docs: venv
	$(PY) -m vllm_loadtest.locustfiles.options_reference --write docs/reference/options.md
	$(PY) -m vllm_loadtest.analysis glossary --write docs/reference/metrics.md
	$(PY) -m vllm_loadtest.usage --write docs/reference/cli.md
	$(PY) -m tests.docs_examples --write

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy
	$(PY) -m tests.benchmarks.bench_analysis
	$(PY) -m tests.benchmarks.bench_generator
	$(PY) -m tests.benchmarks.bench_last_records
	$(PY) -m tests.benchmarks.bench_embeddings
	$(PY) -m tests.benchmarks.bench_images
	$(PY) -m tests.benchmarks.bench_master_intake
	$(PY) -m tests.benchmarks.bench_spawn_message

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
