# fsbus — every target installs what it needs (virtualenv, Python packages, npm peers).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NODE_PEER := tests/interop/node_modules/qlobber-fsq/package.json
SYS_STAMP := $(VENV)/.system-packages

.PHONY: demo test test-long lint typecheck pytest bench bench-quick docs spark-demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,spark,docs,ui]'
	touch $(STAMP)

# Debian packages the tests drive for real (FUSE layers, sshd, zsh, CephFS, GlusterFS,
# RabbitMQ, Redis): installed with apt when root, else the tests needing them skip
$(SYS_STAMP): tests/system-packages.sh $(STAMP)
	sh tests/system-packages.sh
	touch $(SYS_STAMP)

$(NODE_PEER): tests/interop/package.json
	cd tests/interop && npm install --no-audit --no-fund --loglevel=error
	touch $(NODE_PEER)

## demo: several processes publish and subscribe, and workers share a queue, on a local directory
demo: $(STAMP)
	$(PY) -m fsbus.demo

## spark-demo: service processes publish events; a Spark streaming job (its own process) counts them per window into Parquet and publishes alerts a subscriber receives; the job is killed with SIGKILL midway and restarted, and every event and alert is counted exactly once (needs Java 17; 2-4 minutes)
spark-demo: $(STAMP)
	@java -version >/dev/null 2>&1 || { echo "Java 17 is needed: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	$(PY) docs/examples/spark_pipeline.py $(ARGS)

## test: lint, type-check, then the whole suite (unit, multi-process, interop, stress smoke, Spark,
##       CephFS and GlusterFS, power cuts) in two processes; the 25 slowest tests are listed
test: $(STAMP) $(NODE_PEER) $(SYS_STAMP)
	@java -version >/dev/null 2>&1 || { echo "Java 17 is needed for the Spark tests: apt-get install -y openjdk-17-jre-headless"; exit 1; }
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

## test-long: the same with the long runs too (tests marked long: the kill tests on local[2])
test-long: $(STAMP) $(NODE_PEER) $(SYS_STAMP)
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25 --long

## docs: build the documentation site into site/ (strict: any warning fails the build)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

pytest: $(STAMP) $(NODE_PEER) $(SYS_STAMP)
	$(PY) -m pytest $(ARGS)

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) bench/requirements.txt
	$(PY) -m pip install -q -r bench/requirements.txt
	touch $(BENCH_STAMP)

## bench: fsbus and its peers side by side, every scenario and filesystem, several rounds
##        (installs the peers: pip, npm, apt when root); writes bench/results/
bench: $(STAMP) $(BENCH_STAMP)
	$(PY) -m bench.run $(ARGS)

## bench-quick: the same with small sizes, in under 3 minutes; writes bench/results/quick/
bench-quick: $(STAMP) $(BENCH_STAMP)
	$(PY) -m bench.run --quick $(ARGS)

clean:
	rm -rf $(VENV) tests/interop/node_modules .pytest_cache .mypy_cache .ruff_cache
