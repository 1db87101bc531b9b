# UlaCache: `make demo` runs the main job on the embedded default, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= out/demo

.DEFAULT_GOAL := help
.PHONY: help install demo test test-gpu bench lint clean browser

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,sim,sweep,report,torch]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install ulacache with the dev, sim, sweep, report and torch (CPU) extras

demo: $(STAMP)  ## generate a trace, replay sglang / hisparse / ulacache, write the HTML report
	$(BIN)/ulacache demo --out $(OUT)

test: $(STAMP)  ## run the test suite (GPU tests skip without a GPU)
	$(BIN)/python -m pytest

test-gpu: $(STAMP)  ## run only the GPU-marked tests (on a CUDA host)
	$(BIN)/python -m pytest -m gpu

bench: $(STAMP)  ## run the CPU benchmarks, JSON under bench/results/
	$(BIN)/python bench/policy_bench.py
	$(BIN)/python bench/trace_bench.py
	$(BIN)/python bench/sim_bench.py
	$(BIN)/python bench/sweep_bench.py

browser:  ## install Chromium from the OS packages (apt-get; for tests/test_report_browser.py)
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -q
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check ulacache traces sim hw reports ulacache_cli tests bench

clean:  ## remove the venv and outputs
	rm -rf $(VENV) out *.egg-info
