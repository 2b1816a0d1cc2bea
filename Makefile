# Developer entry points. `make test` is also what CI runs (.ci/run).
VENV ?= .venv
PYTHON ?= python3
EXTRAS ?= test,spark,metrics,embedded,bench
PYTEST_ARGS ?=
DEMO_ARGS ?=

BIN := $(VENV)/bin
# Keyed on the content (not the mtime) of the packaging files: a fresh checkout of the same
# setup.cfg reuses the venv, an edited one reinstalls.
DEPS_HASH := $(shell cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.stamp-$(DEPS_HASH)

.PHONY: venv test lint format demo bench system-deps clean

venv: $(STAMP)

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.stamp-*
	touch $@

system-deps:
	bash .ci/install-system-deps

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: venv system-deps lint
	$(BIN)/pytest $(PYTEST_ARGS)

demo: venv
	$(BIN)/python demo_project/run_demo.py $(DEMO_ARGS)

bench: venv
	@if [ -f bench/__main__.py ]; then $(BIN)/python -m bench $(BENCH_ARGS); \
	else echo "bench: no benchmark yet (bench/__main__.py)"; fi

clean:
	rm -rf build dist *.egg-info .ruff_cache .pytest_cache spark-warehouse metastore_db derby.log
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
