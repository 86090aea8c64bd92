# llmcomm: one command to regenerate every figure, one to run the tests.
# Both create .venv with the machine's python3 (3.11+) and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
HASH   := $(shell cat pyproject.toml | cksum | cut -d' ' -f1)
BASE   := $(VENV)/.installed-base-$(HASH)
STAMP  := $(VENV)/.installed-test-$(HASH)
# Third-party data: a local mirror of ../shared/external if present, else downloaded (checksummed) on demand.
ifneq ($(wildcard ../shared/external/SHA256SUMS),)
export LLMCOMM_EXTERNAL ?= $(abspath ../shared/external)
endif
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

.PHONY: figures figures-quick test test-fast lint bench traces calibration clean setup

setup: $(STAMP)

# the figures need no torch (they read committed traces), so their set-up leaves it out
$(BASE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	rm -f $(VENV)/.installed-base-* && touch $@

# the tests add the dev tools and torch (CPU build) for the real torch.distributed runs
$(STAMP): $(BASE)
	$(PY) -m pip install --quiet -e '.[dev,collect,scale]'
	rm -f $(VENV)/.installed-test-* && touch $@

figures: $(BASE)
	$(VENV)/bin/llmcomm reproduce --profile full

figures-quick: $(BASE)
	$(VENV)/bin/llmcomm reproduce --profile quick

test: $(STAMP)
	@command -v chromium >/dev/null 2>&1 || [ -n "$$LLMCOMM_CHROMIUM" ] || echo "note: no Chromium here, so \
	the explorer's browser tests skip; to run them: apt-get install -y chromium (or LLMCOMM_CHROMIUM=/path), \
	then $(PY) -m pytest -m slow tests/test_explore_browser.py"
	$(VENV)/bin/ruff check llmcomm tests benchmarks notebooks
	$(VENV)/bin/lint-imports
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check llmcomm tests benchmarks notebooks
	$(VENV)/bin/lint-imports
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench,scale]'
	for b in $(filter-out benchmarks/bench_h200_kernels.py,$(wildcard benchmarks/bench_*.py)); do echo "== $$b"; $(PY) $$b || exit 1; done  # the H200 kernel run needs a GPU: run it by hand

traces: $(STAMP)
	$(PY) -m llmcomm.collect.curated

# refit the shipped calibration (data/calibration/) on the real measurements in ../shared/external
calibration: $(BASE)
	$(PY) -c 'import sys; from llmcomm.overhead.bandwidth import main; sys.exit(main(["--calibrate"]))'
	$(PY) -m llmcomm.overhead.calibrate    # utilization: fitted with the bandwidth model just written

clean:
	rm -rf build .pytest_cache .ruff_cache
