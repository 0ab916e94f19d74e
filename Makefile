# The two quick-start commands: `make demo` (the traced demo service) and `make test` (every check).
# Each creates .venv on first use and installs the pinned requirements into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
INSTRUMENTATION := instrumentation/stoic-opentelemetry instrumentation/stoic-structlog instrumentation/stoic-prometheus
# A second venv with the oldest OpenTelemetry the adapter declares (requirements-otel-floor.txt).
FLOOR := .venv-otel-floor
FLOOR_STAMP := $(FLOOR)/.installed-stamp
OTEL_TESTS := tests/test_otel_metrics.py tests/test_otel_logs.py tests/test_otel_spans.py tests/test_otel_global.py

.PHONY: demo figures test lint typecheck pytest bench dashboards clean otel-floor mutation test-pythons

$(STAMP): requirements-dev.txt pyproject.toml $(addsuffix /pyproject.toml,$(INSTRUMENTATION))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e . $(addprefix -e ,$(INSTRUMENTATION))
	touch $@

demo: $(STAMP)
	$(BIN)/python -m examples.demo $(ARGS)

# Redraw docs/figures/dashboard-*.png: the demo (and, for the fleet dashboard, shared policies on a
# Redis killed and restarted) scraped by a real Prometheus, every dashboard's
# panels plotted (tests/integration/test_prometheus.py, test_fleet_dashboard.py; `make test` draws
# them into a temp dir).
figures: $(STAMP)
	STOIC_WRITE_FIGURES=1 $(BIN)/python -m pytest tests/integration/test_prometheus.py tests/integration/test_fleet_dashboard.py

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

$(FLOOR_STAMP): requirements-otel-floor.txt $(addsuffix /pyproject.toml,$(INSTRUMENTATION))
	$(PYTHON) -m venv $(FLOOR)
	$(FLOOR)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR)/bin/python -m pip install --quiet -r requirements-otel-floor.txt
	$(FLOOR)/bin/python -m pip install --quiet --no-deps -e . -e instrumentation/stoic-opentelemetry \
		-e instrumentation/stoic-prometheus
	touch $@

# The OpenTelemetry adapter's tests at its declared floor (CI runs this after `make test`).
otel-floor: $(FLOOR_STAMP)
	$(FLOOR)/bin/python -m pytest $(OTEL_TESTS)

# The suite under the other CPython versions stoic supports (requires-python >= 3.11; `make test`
# runs the machine's python3), each in its own .venv-X.Y, then once more under the newest with
# every test's event loop starting tasks eagerly (asyncio.eager_task_factory, 3.12+: a task's
# first step runs inside create_task). CI runs this after `make test`.
OTHER_PYTHONS ?= 3.12 3.13
test-pythons:
	tools/test-pythons $(OTHER_PYTHONS)
	STOIC_EAGER_TASKS=1 tools/test-pythons $(lastword $(OTHER_PYTHONS))

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python -m benchmarks $(ARGS)

.PHONY: docs
docs: $(STAMP)
	$(BIN)/python docs/generate.py

# Mutation testing (not part of `make test`; docs/mutation.md). cosmic-ray lives in its own venv;
# the tests run under .venv as in `make test`. MODULES=a,b  SAMPLE=n  SEED=n  JOBS=n (modules at once).
MUTATION_VENV := .venv-mutation
MUTATION_STAMP := $(MUTATION_VENV)/.installed-stamp
JOBS ?= 2

$(MUTATION_STAMP): requirements-mutation.txt
	$(PYTHON) -m venv $(MUTATION_VENV)
	$(MUTATION_VENV)/bin/python -m pip install --quiet -r requirements-mutation.txt
	touch $@

mutation: $(STAMP) $(MUTATION_STAMP)
	$(MUTATION_VENV)/bin/python tools/mutation.py --python $(BIN)/python --jobs $(JOBS) \
		$(if $(MODULES),--modules $(MODULES)) $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(SEED),--seed $(SEED)) $(ARGS)

dashboards: $(STAMP)
	$(BIN)/python -m dashboards.generate

clean:
	rm -rf $(VENV) $(FLOOR) $(MUTATION_VENV) .mutation $(addprefix .venv-,$(OTHER_PYTHONS))
