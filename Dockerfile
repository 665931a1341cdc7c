# Forge images, one target per role. Build: `docker build --target train -t forge-train .`
# (no Docker engine? buildah works: `buildah bud --target train -t forge-train .`).
# The serve-cpu (llama.cpp + Gradio, no torch) and serve-gpu (vLLM) targets come with issue #13.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 forge
WORKDIR /app

# train: data, tokenizer, pretrain, sft, eval, quantize (torch and the training stack).
FROM base AS train
ARG TORCH_SPEC="torch==2.13.0"
# A compiler for llama-cpp-python, built portable (not -march=native) so the image runs on any x86-64 CPU.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF"
COPY pyproject.toml README.md ./
COPY forge ./forge
COPY pretrain ./pretrain
COPY finetune ./finetune
COPY evaluation ./evaluation
COPY serve ./serve
COPY configs ./configs
RUN pip install "${TORCH_SPEC}" && pip install .
USER forge
VOLUME ["/app/runs"]
ENTRYPOINT ["forge"]
CMD ["--help"]
