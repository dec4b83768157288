# The two commands a fresh machine needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch: installed first so no requirement pulls a CUDA wheel.
TORCH ?= torch==2.13.0

.PHONY: demo test install dev lint typecheck docs tools services services-down unit soak fuzz bench chaos clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Every feature extra: the demo needs none (tests/test_extras.py runs the core without them), but the README's
# next steps after it (the dashboard, sweeps, the quality loop) do.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[all]"
	touch $@

# Every feature extra (the tests cover them all) and the dev tools.
$(VENV)/.dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[all,dev]"
	touch $@

install: $(VENV)/.installed

dev: $(VENV)/.dev

demo: install
	$(BIN)/gpufleet demo

SCRIPTS := scripts/dev-slurm scripts/dev-prometheus scripts/dev-ray scripts/check-python-floor

lint: dev
	$(BIN)/ruff check . $(SCRIPTS)
	$(BIN)/ruff format --check . $(SCRIPTS)
	$(BIN)/python scripts/check-python-floor

typecheck: dev
	$(BIN)/mypy

# The docs site (mkdocs.yml), built strictly: a broken link or anchor, or a page left out of the nav, fails it, as
# does a generated reference page (docs/reference/) that the code no longer gives. Not --quiet: it hides the
# warnings that --strict counts, and the build passes.
docs: dev
	$(BIN)/python -m gpufleet.cli.docsref --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# fio and iperf3 (Debian) for `gpufleet bench disk|net`, Chromium for the browser tests of `gpufleet serve`;
# installed once, as root.
tools:
	@command -v fio >/dev/null && command -v iperf3 >/dev/null && command -v chromium >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
	    --no-install-recommends fio iperf3 chromium fonts-dejavu-core >/dev/null; }

# Real services the integration tests need (a single-node Slurm, Prometheus, Ray); they stay up for the next run.
services: dev tools
	scripts/dev-slurm up
	scripts/dev-prometheus up
	scripts/dev-ray up

services-down:
	scripts/dev-ray down
	scripts/dev-prometheus down
	scripts/dev-slurm down

# Two workers (pytest-xdist): the tests of the shared services run on one of them, one at a time (tests/conftest.py).
TEST_WORKERS ?= 2

unit: dev services
	$(BIN)/pytest -q -m "not slow" -n $(TEST_WORKERS) --durations=30

test: lint typecheck docs unit

soak: dev services
	$(BIN)/pytest -q -m slow
	GPUFLEET_KILL_TRIALS=200 $(BIN)/pytest -q tests/runtime/test_kill9.py
	GPUFLEET_SOAK=1 $(BIN)/pytest -q tests/backends/test_crash_injection.py
	GPUFLEET_SOAK=1 $(BIN)/pytest -q tests/runtime/test_distributed_session.py -k any_rank_at_any_moment
	GPUFLEET_SOAK=1 $(BIN)/pytest -q tests/runtime/test_port_exit.py -k ported
	GPUFLEET_SOAK=1 $(BIN)/pytest -q tests/cost/test_cache_differential.py

# The long fuzz run: 10,000 hostile inputs over every command that reads a file or a number, and the HTTP API
# (`make test` runs ~400, seeded by the commit). FUZZ_ARGS narrows it, e.g. FUZZ_ARGS="--surface serve-http".
FUZZ_CASES ?= 10000
FUZZ_SEED ?= 1
FUZZ_ARGS ?=
fuzz: dev
	$(BIN)/python tests/fuzz/fuzz_runner.py --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) --jobs 2 --report fuzz-report.json \
	  $(FUZZ_ARGS)

bench: dev tools
	$(BIN)/python bench/run_all.py

# The fault table: ten faults (SIGTERM, kill -9 or SIGSTOP of a rank, a NaN, corrupt RAM and disk copies, the
# scheduler or the memory keeper killed, a lost node) against a 2-rank DDP job, each row bit-exact against an
# uninterrupted run. CHAOS_ARGS narrows it, e.g. CHAOS_ARGS="--short" or "--recovery requeue --no-memory".
CHAOS_ARGS ?=
chaos: dev
	$(BIN)/python bench/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
