# The two quick-start commands: `make demo` (the traced demo service) and `make test` (every check).
# Each creates .venv on first use and installs the pinned requirements into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
INSTRUMENTATION := instrumentation/stoic-opentelemetry instrumentation/stoic-structlog

.PHONY: demo test lint typecheck pytest bench dashboards clean

$(STAMP): requirements-dev.txt pyproject.toml $(addsuffix /pyproject.toml,$(INSTRUMENTATION))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -e . $(addprefix -e ,$(INSTRUMENTATION))
	touch $@

demo: $(STAMP)
	$(BIN)/python -m examples.demo $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python -m benchmarks $(ARGS)

.PHONY: docs
docs: $(STAMP)
	$(BIN)/python docs/generate.py

dashboards: $(STAMP)
	$(BIN)/python -m dashboards.generate

clean:
	rm -rf $(VENV)
