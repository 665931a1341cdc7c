# Forge images, one target per role (`make images` builds them; see docker/README.md):
#   train      data, tokenizer, pretrain, eval, sft, quantize, register/promote: torch and the training stack
#   serve-cpu  `forge serve` (llama.cpp's llama-server), `forge chat` (Gradio) and the registry client; no torch
#   serve-gpu  `forge serve --backend vllm` on a CUDA base image
#   mlflow     the tracking server and registry (sqlite in the runs volume, or Postgres + S3-compatible storage)
#
#   docker build --target serve-cpu -t forge-serve-cpu .
#   buildah --storage-driver overlay bud --isolation chroot --layers --target train -t forge-train .   # vfs rootless
#
# llama.cpp is compiled portable (GGML_NATIVE=OFF: not the build machine's CPU), twice from the same pinned source:
# - the llama-cpp-python bindings (quantize, eval; train image), libraries only (docker/llama-lib-only.cmake leaves
#   out llama.cpp's unused `common`): the `wheels` stage takes a prebuilt wheel from docker/wheels/ when one with the
#   same version and flags is there (docker/llama-wheel.sh builds it once into a wheelhouse outside the repo);
# - llama.cpp's own server, llama-server (serve-cpu image), from the llama.cpp that the same llama-cpp-python sdist
#   vendors, with every x86-64 CPU variant as a backend loaded at run time (LLAMA_SERVER_CMAKE_ARGS: one image runs
#   well on AVX2 and AVX-512 hosts): the `llama-server` stage takes it from docker/llama-server/ when its BUILD-INFO
#   matches (docker/llama-server.sh builds it once into ~/.cache/forge).
# Each compiles only otherwise (many minutes on 2 cores). The compiler never reaches the train or serve-cpu images.
# LLAMA_CPP_VERSION is the version pyproject.toml pins (tests/test_images.py checks that they agree).
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG GPU_BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
ARG LLAMA_CPP_VERSION=0.3.36
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF"
ARG LLAMA_SERVER_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_OPENMP=OFF"

# ---- base: python3 in a venv owned by root, an unprivileged user, /app as the working directory.
# Any Debian-like image with python3 >= 3.10 and its venv module will do (docker/base.sh makes one by debootstrap).
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin forge \
    && mkdir -p /app/runs && chown forge:forge /app/runs
WORKDIR /app

# ---- wheels: llama-cpp-python, portable. Prebuilt from docker/wheels/ when its BUILD-INFO matches, else compiled.
FROM base AS wheels
ARG LLAMA_CPP_VERSION
ARG LLAMA_CMAKE_ARGS
ARG PIP_CERT
COPY docker/wheels/ /wheels/
COPY docker/llama-lib-only.cmake /tmp/llama-lib-only.cmake
# The compiler lives only in this stage; any current Debian version of it will do.
# hadolint ignore=DL3008
RUN if grep -qxF "cmake_args=${LLAMA_CMAKE_ARGS}" /wheels/BUILD-INFO 2>/dev/null \
        && ls /wheels/llama_cpp_python-"${LLAMA_CPP_VERSION}"-*.whl >/dev/null 2>&1; then \
        echo "wheels: prebuilt llama-cpp-python ${LLAMA_CPP_VERSION} ($(grep ^built= /wheels/BUILD-INFO))"; \
    else \
        echo "wheels: compiling llama-cpp-python ${LLAMA_CPP_VERSION} with CMAKE_ARGS=${LLAMA_CMAKE_ARGS}" \
        && rm -f /wheels/*.whl /wheels/BUILD-INFO \
        && apt-get update \
        && apt-get install -y --no-install-recommends build-essential cmake \
        && rm -rf /var/lib/apt/lists/* \
        && CMAKE_ARGS="${LLAMA_CMAKE_ARGS} -DCMAKE_PROJECT_INCLUDE=/tmp/llama-lib-only.cmake" pip wheel --no-deps --no-binary llama-cpp-python -w /wheels \
            "llama-cpp-python==${LLAMA_CPP_VERSION}"; \
    fi

# ---- llama-server: llama.cpp's OpenAI server and its libraries in /opt/llama-server. Prebuilt from
# docker/llama-server/ when its BUILD-INFO matches, else compiled here by the same script.
FROM base AS llama-server
ARG LLAMA_CPP_VERSION
ARG LLAMA_SERVER_CMAKE_ARGS
ARG PIP_CERT
COPY docker/llama-server/ /opt/llama-server/
COPY docker/llama-server.sh /tmp/llama-server.sh
# The compiler lives only in this stage; any current Debian version of it will do.
# hadolint ignore=DL3008
RUN if grep -qxF "cmake_args=${LLAMA_SERVER_CMAKE_ARGS}" /opt/llama-server/BUILD-INFO 2>/dev/null \
        && grep -qxF "version=${LLAMA_CPP_VERSION}" /opt/llama-server/BUILD-INFO \
        && [ -x /opt/llama-server/llama-server ] && [ -f /opt/llama-server/convert/convert_hf_to_gguf.py ]; then \
        echo "llama-server: prebuilt ($(grep ^built= /opt/llama-server/BUILD-INFO))"; \
    else \
        rm -rf /opt/llama-server && apt-get update \
        && apt-get install -y --no-install-recommends build-essential cmake \
        && rm -rf /var/lib/apt/lists/* \
        && FORGE_LLAMA_SERVER_CACHE=/tmp/llama-cache bash /tmp/llama-server.sh /opt/llama-server \
        && rm -rf /tmp/llama-cache; \
    fi \
    && rm -f /opt/llama-server/.gitignore \
    && mv /opt/llama-server/convert /opt/llama-convert

# ---- src: the package sources, configs and container scripts, gathered once so that each image takes them in one
# COPY and one RUN.
FROM base AS src
COPY pyproject.toml README.md /src/
COPY forge /src/forge
COPY models /src/models
COPY pretrain /src/pretrain
COPY finetune /src/finetune
COPY evaluation /src/evaluation
COPY registry /src/registry
COPY serve /src/serve
COPY configs /src/configs
COPY docker/entrypoint.sh docker/healthcheck.py docker/mlflow-server.sh /src/bin/

# ---- train: every stage but serving; `forge pipeline --no-serve` runs the lot.
# Metadata instructions come first in each image: with buildah's vfs driver every instruction copies the whole root
# file system, which is cheap before the install and not after it.
FROM base AS train
ARG LLAMA_CPP_VERSION
ARG LLAMA_CMAKE_ARGS
# torch first, as everywhere in Forge: PyPI's default Linux torch is the CUDA build (GPUs and CPUs, several GB);
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes the CPU build instead.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=""
ARG PIP_CERT
ARG PIP_FIND_LINKS
VOLUME ["/app/runs"]
ENTRYPOINT ["forge"]
CMD ["--help"]
# llama.cpp's HF -> GGUF converter, from the llama.cpp the bindings and llama-server are built from (serve/gguf_convert.py)
ENV FORGE_LLAMA_CONVERT=/opt/llama-convert
COPY --from=llama-server /opt/llama-convert /opt/llama-convert
COPY docker/requirements-train.lock /tmp/requirements-train.lock
# The dependencies alone first (their layer survives code changes), then the code without them; the training image
# carries the optional parts too (Ray Data for `forge data --executor ray`, lm-eval for benchmarks, the Chinese and
# Japanese word segmenters). torch and the llama-cpp-python wheel go in first, then every other package from the lock
# (docker/lock.sh), each file checked against its sha256. --no-deps: the lock holds every dependency already, and the
# base image's pip (23.0, Debian's) would otherwise resolve an extra (typepy[datetime]) as an unpinned requirement. TORCH_SPEC is pinned (torch==2.13.0); hadolint cannot see
# through the variable.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    echo "llama.cpp: ${LLAMA_CPP_VERSION} ${LLAMA_CMAKE_ARGS}" \
    && export PIP_FIND_LINKS="/wheels ${PIP_FIND_LINKS:-}" \
    && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "${TORCH_SPEC}" \
    && pip install --no-deps --only-binary llama-cpp-python "llama-cpp-python==${LLAMA_CPP_VERSION}" \
    && pip install --no-deps --require-hashes -r /tmp/requirements-train.lock \
    && rm /tmp/requirements-train.lock
COPY --from=src /src /tmp/forge-src
RUN pip install --no-deps /tmp/forge-src && mv /tmp/forge-src/configs /app/configs && rm -rf /tmp/forge-src
USER 10001

# ---- serve-cpu: llama.cpp's llama-server, the Gradio chat UI, the registry client. No torch, no compiler, no
# llama-cpp-python (serving needs only the server binary).
FROM base AS serve-cpu
ARG LLAMA_CPP_VERSION
ARG LLAMA_SERVER_CMAKE_ARGS
ARG PIP_CERT
ARG PIP_FIND_LINKS
VOLUME ["/app/runs"]
EXPOSE 8080 7860
# Healthy once llama-server has loaded the model (its /health answers 503 while loading, and needs no API key); the
# chat service in compose.yaml points FORGE_HEALTH_URL at the UI instead.
ENV FORGE_HEALTH_URL=http://127.0.0.1:8080/health \
    FORGE_LLAMA_SERVER=/opt/llama-server/llama-server
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "/usr/local/bin/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["serve"]
COPY --from=llama-server /opt/llama-server /opt/llama-server
# requirements-serve.txt + requirements-chat.txt, locked (docker/lock.sh)
COPY docker/requirements-serve-cpu.lock /tmp/
RUN echo "llama-server: llama.cpp of llama-cpp-python ${LLAMA_CPP_VERSION}, ${LLAMA_SERVER_CMAKE_ARGS}" \
    && /opt/llama-server/llama-server --version \
    && pip install --no-deps --require-hashes -r /tmp/requirements-serve-cpu.lock \
    && rm /tmp/requirements-serve-cpu.lock
# --no-deps: forge's own requirements are the training stack; the serve verbs import only the packages above.
COPY --from=src /src /tmp/forge-src
RUN pip install --no-deps /tmp/forge-src && mv /tmp/forge-src/configs /app/configs \
    && mv /tmp/forge-src/bin/entrypoint.sh /tmp/forge-src/bin/healthcheck.py /usr/local/bin/ && rm -rf /tmp/forge-src
USER 10001

# ---- mlflow: the tracking server of compose.yaml (docker/mlflow-server.sh picks the stores).
FROM base AS mlflow
ARG PIP_CERT
ARG PIP_FIND_LINKS
VOLUME ["/app/runs"]
EXPOSE 5000
ENV FORGE_HEALTH_URL=http://127.0.0.1:5000/health
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 CMD ["python3", "/usr/local/bin/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/mlflow-server.sh"]
# requirements-mlflow.txt, locked (docker/lock.sh)
COPY docker/requirements-mlflow.lock /tmp/requirements-mlflow.lock
RUN pip install --no-deps --require-hashes -r /tmp/requirements-mlflow.lock && rm /tmp/requirements-mlflow.lock
COPY docker/mlflow-server.sh docker/healthcheck.py /usr/local/bin/
USER 10001

# ---- serve-gpu: vLLM on a CUDA base image (torch comes with vLLM, pinned by it) and the registry client. No chat UI
# (gradio and vLLM pin incompatible pillows): serve-cpu's `forge chat` fronts this server over HTTP.
FROM ${GPU_BASE_IMAGE} AS serve-gpu
ARG PIP_CERT
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    FORGE_HEALTH_URL=http://127.0.0.1:8080/health
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 CMD ["python3", "/usr/local/bin/healthcheck.py"]
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["serve", "--backend", "vllm"]
# gcc and the Python headers: Triton compiles its CUDA launcher stubs at run time.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin forge \
    && mkdir -p /app/runs && chown forge:forge /app/runs
WORKDIR /app
# vLLM (docker/requirements-serve-gpu.txt), its CUDA torch and the rest, each file checked against its sha256
COPY docker/requirements-serve-gpu.lock /tmp/requirements-serve-gpu.lock
RUN pip install --no-deps --require-hashes -r /tmp/requirements-serve-gpu.lock && rm /tmp/requirements-serve-gpu.lock
COPY --from=src /src /tmp/forge-src
RUN pip install --no-deps /tmp/forge-src && mv /tmp/forge-src/configs /app/configs \
    && mv /tmp/forge-src/bin/entrypoint.sh /tmp/forge-src/bin/healthcheck.py /usr/local/bin/ && rm -rf /tmp/forge-src
VOLUME ["/app/runs"]
USER 10001
