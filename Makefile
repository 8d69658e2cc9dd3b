# django-tombstone-guard: developer entry points.
#
#   make demo                 SQLite demo: admin + django-q2 cluster on http://127.0.0.1:8000/
#                             (DEMO_ADDR=127.0.0.1:8001 for another address)
#                             (its own .venv-demo: the app, django-q2 and the [demo] extra only)
#   make demo-reset           delete the demo database and .mail/, migrate and seed again
#                             (refused while the demo runs, on whatever address)
#   make test                 the test suite on SQLite (4 processes, then the serial tests)
#   make test DATABASE_URL=postgres://postgres@127.0.0.1:5432/test   ... on PostgreSQL
#   make test TEST_MARKS="not walkthrough and not browser" PYTEST_ARGS="-x"   ... a part of it
#   make test TEST_WORKERS=0  in one process
#   make lint                 ruff check, ruff format --check, mypy
#   make docs                 the docs site into site/, warnings as errors (its own .venv-docs)
#   make docs-serve           the docs site on http://127.0.0.1:8008/, rebuilt on every change
#   make wheel                build dist/*.whl
#   make soak                 the chaos soak, long form (~1 h on 2 cores; bench/README.md)
#   make soak SOAK_ARGS=--short                  ... its CI form (under 4 minutes)
#
# A second environment (used by CI for Django 6 on Python 3.12):
#   make test VENV=.venv-dj6 PYTHON=python3.12 DJANGO_SPEC="django>=6,<7"

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev
DJANGO_SPEC ?=
PYTEST_ARGS ?=
# make test: processes for the parallel part, and a marker expression narrowing the run.
TEST_WORKERS ?= 4
TEST_MARKS ?=

# The demo's environment: what the demo needs, none of the dev tools (Playwright, mypy, ...).
DEMO_VENV ?= .venv-demo
# Where the demo serves (its CRM jobs post there too); an environment variable works as well.
DEMO_ADDR ?= 127.0.0.1:8000

# The docs' environment: MkDocs, Material and mkdocstrings only (the [docs] extra).
DOCS_VENV ?= .venv-docs
DOCS_ADDR ?= 127.0.0.1:8008

BIN := $(VENV)/bin
VPY := $(BIN)/python
STAMP := $(VENV)/.installed
SPEC_FILE := $(VENV)/.install-spec
INSTALL_SPEC := extras=$(EXTRAS) django=$(DJANGO_SPEC)

export PIP_DISABLE_PIP_VERSION_CHECK := 1

.DEFAULT_GOAL := help
.PHONY: help venv demo demo-venv demo-reset seed test lint format wheel clean docs docs-venv docs-serve FORCE

help:
	@echo "make venv | demo | demo-reset | test | lint | docs | docs-serve | wheel | clean | bench | soak"
	@echo "  variables: VENV=$(VENV) PYTHON=$(PYTHON) DJANGO_SPEC='$(DJANGO_SPEC)' PYTEST_ARGS='$(PYTEST_ARGS)'"
	@echo "             TEST_WORKERS=$(TEST_WORKERS) TEST_MARKS='$(TEST_MARKS)'"

# --- environment -----------------------------------------------------------------------------

$(VPY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
		echo "error: $(PYTHON) is Python <3.11; pass PYTHON=/path/to/python3.11+" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Rewritten only when its content changes, so a different DJANGO_SPEC/EXTRAS re-installs.
$(SPEC_FILE): FORCE | $(VPY)
	@echo '$(INSTALL_SPEC)' | cmp -s - $@ || echo '$(INSTALL_SPEC)' > $@

# Re-installs only when pyproject.toml (or the install spec) is newer than the stamp.
$(STAMP): pyproject.toml $(SPEC_FILE) | $(VPY)
	$(VPY) -m pip install --quiet -e ".[$(EXTRAS)]" $(if $(DJANGO_SPEC),"$(DJANGO_SPEC)")
	@$(VPY) -c 'import django, sys; print(f"$(VENV): Python {sys.version.split()[0]}, Django {django.__version__}")'
	@touch $@

venv: $(STAMP)

# --- demo ------------------------------------------------------------------------------------

# A second make run, so the venv rules above build $(DEMO_VENV) with EXTRAS=demo.
demo-venv:
	@$(MAKE) --no-print-directory venv VENV=$(DEMO_VENV) EXTRAS=demo DJANGO_SPEC= PYTHON=$(PYTHON)

demo: demo-venv
	VENV=$(DEMO_VENV) DEMO_ADDR=$(DEMO_ADDR) bash scripts/demo.sh

demo-reset: demo-venv
	VENV=$(DEMO_VENV) DEMO_ADDR=$(DEMO_ADDR) bash scripts/demo.sh --reset

seed: demo-venv
	$(DEMO_VENV)/bin/python manage.py migrate --noinput
	$(DEMO_VENV)/bin/python manage.py seed_demo

# --- checks ----------------------------------------------------------------------------------

# The independent tests on TEST_WORKERS processes (pytest-xdist), then those marked serial alone
# (scripts/test.sh). pytest's exit code 5 ("no tests collected") is a failure: a green run must
# have run tests.
test: $(STAMP)
	@if [ -n "$$DATABASE_URL" ]; then echo "database: $${DATABASE_URL%%://*}"; else echo "database: sqlite"; fi
	@TEST_WORKERS="$(TEST_WORKERS)" TEST_MARKS="$(TEST_MARKS)" bash scripts/test.sh $(VPY) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# --- docs (mkdocs.yml) ------------------------------------------------------------------------

# A second make run, as for the demo: the venv rules build $(DOCS_VENV) with EXTRAS=docs.
docs-venv:
	@$(MAKE) --no-print-directory venv VENV=$(DOCS_VENV) EXTRAS=docs DJANGO_SPEC= PYTHON=$(PYTHON)

# --strict: any warning (a broken link or anchor, a page outside the nav, a docstring griffe
# cannot read) fails the build. NO_MKDOCS_2_WARNING: Material's banner about its successor.
docs: docs-venv
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/python -m mkdocs build --strict --site-dir site

docs-serve: docs-venv
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/python -m mkdocs serve --strict --dev-addr $(DOCS_ADDR)

wheel: $(STAMP)
	rm -rf dist/
	$(VPY) -m build --wheel --outdir dist/ .

clean:
	rm -rf dist/ build/ site/ *.egg-info .test-db*.sqlite3*

# --- benchmark (bench/README.md) -------------------------------------------------------------
#   make bench                                  the full matrix (PostgreSQL+Redis, SQLite+ORM)
#   make bench BENCH_ARGS="--db sqlite --jobs 500 --reps 1"
#   make bench BENCH_ARGS="--db postgres --backlog --jobs 2000 --workers 2 --reps 1 --pgbench no \
#     --mix many --variants ordered,tasks,tasks-db,baseline-fast"   Django's tasks: ours, tasks-db
#   make bench-blocked                          a due job behind 100/1,000/10,000 blocked lanes
#   make bench-blocked BLOCKED_ARGS="--db sqlite --lanes 100,1000 --kind retry"

BENCH_ARGS ?=
BLOCKED_ARGS ?=

.PHONY: bench bench-blocked
bench: $(STAMP)
	@$(VPY) -c 'import psutil, django_tasks_db' 2>/dev/null || $(VPY) -m pip install --quiet -e ".[bench]"
	$(VPY) bench/run.py --json bench/results/bench.json $(BENCH_ARGS)

# Starvation and the claim's cost behind blocked lanes (issue 32), ~7 minutes.
bench-blocked: $(STAMP)
	$(VPY) bench/blocked_lanes.py --json bench/results/blocked.json $(BLOCKED_ARGS)

# --- chaos soak (bench/README.md#the-chaos-soak-issue-32) ----------------------------------------
#   make soak                                   long form: 100,000 jobs, 110 kills, 3+3 restarts
#   make soak SOAK_ARGS=--short                 the CI form: 8,000 jobs, 16 kills, 1+1 restarts
#   make soak SOAK_ARGS="--jobs 20000 --kills 25 --redis-restarts 1 --pg-restarts 1"
# Its own PostgreSQL and Redis (never the shared ones); the report in bench/results/soak.json.

SOAK_ARGS ?=

.PHONY: soak
soak: $(STAMP)
	$(VPY) bench/soak.py --json bench/results/soak.json $(SOAK_ARGS)
