# UlaCache: `make demo` runs the main job on the embedded default, `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OUT ?= out/demo

.DEFAULT_GOAL := help
.PHONY: help install demo test test-gpu bench bench-fidelity bench-paper docs lint clean browser

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

# The maintained benchmark suite (docs/performance.md shows their results): each writes one JSON under bench/results/. `make bench` runs the
# CPU benchmarks (longer than the demo: several replay grids); `make bench BENCH="policy trace"` runs some of them.
BENCH ?= policy pool_scale dedup trace sim sweep footprint pblru scale
bench: $(STAMP)  ## run the CPU benchmarks (BENCH="policy ..." for some), JSON under bench/results/
	@for b in $(BENCH); do case $$b in \
	  policy) cmd="bench/policy_bench.py";; \
	  pool_scale) cmd="bench/pool_scale_bench.py";; \
	  dedup) cmd="bench/dedup_crossover.py bench/results/dedup_crossover.json";; \
	  trace) cmd="bench/trace_bench.py";; \
	  sim) cmd="bench/sim_bench.py";; \
	  sweep) cmd="bench/sweep_bench.py";; \
	  footprint) cmd="bench/footprint_accuracy.py --tag current";; \
	  pblru) cmd="bench/pblru_gap.py --label current";; \
	  scale) cmd="bench/scale_bench.py --only pinned,batch1,paper";; \
	  *) echo "unknown benchmark $$b"; exit 2;; esac; \
	  echo "== $$cmd"; $(BIN)/python $$cmd || exit 1; done

bench-fidelity: $(STAMP)  ## sampling error of default fidelity, 8 paper configs at reduced scale (about an hour on 2 cores)
	$(BIN)/python bench/fidelity_error.py --cap 64 --steps-on 160 --steps-off 320 --jobs 2

bench-paper: $(STAMP)  ## the paper-config peaks (108 replays, ~6 min on 2 cores): bench/results/paper_configs_<label>.json
	$(BIN)/python bench/paper_configs.py --label $(or $(LABEL),current) --model glm-5.2 --b300-extra-caps 512

docs: $(STAMP)  ## regenerate docs/cli.md, docs/config.md and docs/performance.md from the code and bench/results
	$(BIN)/python docs/gen_cli_reference.py
	$(BIN)/python docs/gen_config_reference.py
	$(BIN)/python docs/gen_performance.py

browser:  ## install Chromium from the OS packages (apt-get; for tests/test_report_browser.py)
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get update -q
	$(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

lint: $(STAMP)  ## ruff
	$(BIN)/ruff check ulacache traces sim hw reports ulacache_cli tests bench docs

clean:  ## remove the venv and outputs
	rm -rf $(VENV) out *.egg-info
