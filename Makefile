# MemX — `make plan` runs the main job (the whole pipeline on the embedded defaults), `make test` the
# tests. Both create .venv and install first: the pinned versions of requirements.lock (every package,
# transitive ones included), installed by uv (pip installs uv into .venv first; plain pip where uv cannot
# be had; bytecode compiled at install, as pip does, so that every later import and subprocess — the
# tests, the Prefect and MLflow servers — loads .pyc instead of compiling source), then MemX itself without
# dependencies, and empty Prefect and MLflow databases migrated once for this environment (a first run copies
# them into $MEMX_HOME; memx.cli.orchestration.build_prefect_template, memx.pipeline.registry.build_mlflow_template). `make lock` re-resolves pyproject.toml into the lock.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.memx-installed
LOCK    = requirements.lock
UV_VERSION = 0.13.9

.PHONY: install lock plan test test-all browser bench clean

$(STAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; assert sys.version_info >= (3, 11), "MemX needs Python >= 3.11"'
	@if $(BIN)/python -m pip install -q "uv==$(UV_VERSION)" 2>/dev/null; then \
	  $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -r $(LOCK) && \
	  $(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .; \
	else \
	  $(BIN)/python -m pip install -q -r $(LOCK) && $(BIN)/python -m pip install -q --no-deps -e .; \
	fi
	@$(BIN)/python -c 'from memx.cli.orchestration import build_prefect_template as b; b()' || \
	  echo "no migrated Prefect database template: a first run migrates its own (about 9 s more)"
	@$(BIN)/python -c 'from memx.pipeline.registry import build_mlflow_template as b; b()' || \
	  echo "no migrated MLflow database template: each new SQLite store migrates its own (about 3 s more)"
	@touch $(STAMP)

install: $(STAMP)

# Re-resolve pyproject.toml (with the test extra) for Python 3.11 on Linux x86-64 into requirements.lock.
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "uv==$(UV_VERSION)"
	$(BIN)/uv pip compile pyproject.toml --extra test --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  --custom-compile-command "make lock" -q -o $(LOCK)

plan: install
	$(BIN)/memx plan --backend simulated

# pytest's own exit status fails the target, 5 ("no tests ran") included; PYTEST_ARGS narrows a run.
# Tests run on TEST_WORKERS processes (pytest-xdist; 2 = CI's cores), a whole file per worker so that module
# and session fixtures (profiles, the Prefect API server) are built once. TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
# Bytecode for the test run goes to $(VENV)/pycache (Python's PYTHONPYCACHEPREFIX), never into the source tree.
# Where the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), every worker and every
# subprocess of the tests otherwise compiled MemX from source and pytest rewrote every test module again:
# 19 s of collection per worker, about 40 s of a 3.5 min run (docs/benchmarks.md §Test time, session 17).
PYCACHE = env PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

test: install
	$(PYCACHE) $(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-all: install browser
	$(PYCACHE) $(BIN)/python -m pytest -m "slow or not slow" $(XDIST) $(PYTEST_ARGS)

# Headless Chromium for the report's browser test (Debian's package; skipped quietly where apt is absent).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser test will be skipped"

bench: install
	$(BIN)/python bench/search_throughput.py
	$(BIN)/python bench/simulator_speed.py
	$(BIN)/python bench/profile_cost.py
	$(BIN)/python bench/accuracy.py
	$(BIN)/python bench/cache_growth.py
	$(BIN)/python bench/dask_search.py --max-pp 8  # the max_pp 16 case takes over 30 min on 2 cores (docs/benchmarks.md)

clean:
	rm -rf $(VENV) .memx .pytest_cache
