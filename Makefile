# The two quick-start commands: `make demo` (the traced demo service) and `make test` (every check).
# Each creates .venv on first use and installs the pinned requirements into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NATIVE := $(VENV)/.native-stamp
# The C fast paths (docs/design.md): rebuilt in place whenever a C source changes.
C_SOURCES := $(wildcard src/stoic/*.c src/stoic/*.h) setup.py
INSTRUMENTATION := instrumentation/stoic-opentelemetry instrumentation/stoic-structlog

.PHONY: demo test lint typecheck pytest bench dashboards clean

$(STAMP): requirements-dev.txt pyproject.toml $(addsuffix /pyproject.toml,$(INSTRUMENTATION))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps $(addprefix -e ,$(INSTRUMENTATION))
	touch $@

$(NATIVE): $(STAMP) $(C_SOURCES)
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

demo: $(NATIVE)
	$(BIN)/python -m examples.demo $(ARGS)

lint: $(NATIVE)
	$(BIN)/ruff check .

typecheck: $(NATIVE)
	$(BIN)/mypy

# The suite runs twice: with the compiled fast paths, then on the pure-Python paths alone
# (STOIC_PURE_PYTHON=1; the Prometheus integration test is not repeated).
pytest: $(NATIVE)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	STOIC_PURE_PYTHON=1 $(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

test: lint typecheck pytest

bench: $(NATIVE)
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python -m benchmarks $(ARGS)

.PHONY: docs
docs: $(NATIVE)
	$(BIN)/python docs/generate.py

dashboards: $(NATIVE)
	$(BIN)/python -m dashboards.generate

clean:
	rm -rf $(VENV)
