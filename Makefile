# Two commands for a new user:  `make demo`  (the main job)  and  `make test`  (the test suite).
# Both create the virtualenv in .venv and install what is missing by themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch is pinned here only: 2.13.0 is the CPU wheel the set-up path installs; the package
# itself accepts any torch>=2.2.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-unit lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,h5,ann]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/bigembed demo

# The test command CI runs (.ci/run): lint, format and type checks first, then the suite.
# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on processes
# they start (ranks, servers, deadlines), so two overlap well even on 2 cores. The files go in
# tests/conftest.py's order (slow files first, quick unit files last to even out the workers' ends).
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The inner loop while changing code: the tests that start no process (not marked
# `integration`: no CLI subprocess, ranks, servers, Hogwild workers or forkserver), no lint.
test-unit: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not integration"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/import_bench.py

clean:
	rm -rf $(VENV) demo_out
