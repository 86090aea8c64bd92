# llmcomm: one command to regenerate every figure, one to run the tests.
# Both create .venv with the machine's python3 (3.11+) and install what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# Third-party data: a local mirror of ../shared/external if present, else downloaded (checksummed) on demand.
ifneq ($(wildcard ../shared/external/SHA256SUMS),)
export LLMCOMM_EXTERNAL ?= $(abspath ../shared/external)
endif
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0

.PHONY: figures figures-quick test test-fast lint bench traces clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,collect]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	rm -f $(VENV)/.installed-* && touch $@

# figures do not need torch: they read committed traces; the set-up is shared with the tests anyway
figures: $(STAMP)
	$(VENV)/bin/llmcomm reproduce --profile full

figures-quick: $(STAMP)
	$(VENV)/bin/llmcomm reproduce --profile quick

test: $(STAMP)
	$(VENV)/bin/ruff check llmcomm tests benchmarks
	$(PY) -m pytest -q --durations=15

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check llmcomm tests benchmarks

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

traces: $(STAMP)
	$(PY) -m llmcomm.collect.curated

clean:
	rm -rf build .pytest_cache .ruff_cache
