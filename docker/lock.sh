#!/usr/bin/env bash
# The lock files: every package pip installs, pinned to one version with the sha256 of each of its files, so that
# `make install`, CI and each image install exactly what was resolved and tested, and a file that changed on the index
# is refused (`pip install --require-hashes`). Resolved by uv for Linux x86-64 and Python 3.11:
#
#   requirements.lock                   pyproject's dependencies and the dev extra (with ray, benchmarks, cjk): make install
#   docker/requirements-train.lock      the dependencies and ray, benchmarks, cjk: the train image
#   docker/requirements-serve-cpu.lock  requirements-serve.txt + requirements-chat.txt: the serve-cpu image
#   docker/requirements-mlflow.lock     requirements-mlflow.txt: the mlflow image
#   docker/requirements-serve-gpu.lock  requirements-serve-gpu.txt (vLLM) + requirements-serve.txt: the serve-gpu image,
#                                       for its Python 3.12, with vLLM's own CUDA torch (not the dev lock's versions)
#
#   bash docker/lock.sh            # after changing a requirement: the versions already locked are kept where they fit
#   UPGRADE=1 bash docker/lock.sh  # every package to its newest allowed version
#
# Left out of every lock, each installed on its own first: torch (`pip install torch==2.13.0`, the CPU build here, a
# CUDA build on GPU machines: which one is the machine's choice, not the lock's) and llama-cpp-python (the portable
# wheel docker/llama-wheel.sh compiles: PyPI has only its sdist). Resolving against the CPU torch wheel keeps CUDA's
# nvidia-* packages out: TORCH_WHEELS names a folder holding it (default /opt/wheels, where this machine keeps it).
# The image locks are resolved with the dev lock's versions as constraints, so every environment runs the same ones.
#
# mlflow >= 3.16 (pyproject.toml): each earlier release is affected by a published advisory, among them
# CVE-2026-2635 and CVE-2026-8147 (authorization; fixed by 3.13), CVE-2026-4137 / GHSA-f2m9-wcf4-cwwx (insecure temp
# permissions, model RCE; < 3.11.0), PYSEC-2026-93 and -94 (< 3.11.0rc0), CVE-2026-2651 (artifact multipart upload
# authorization; <= 3.10.1.dev0), CVE-2026-2652 and CVE-2026-0545 (basic-auth bypass of FastAPI routes; <= 3.9.0),
# CVE-2026-2614 / GHSA-42h5-h8qh-vv9v (path traversal file read; <= 3.9.0), GHSA-r23q-823p-vmf7 (command injection;
# < 3.8.1), and Chainguard's CGA-3hm7-fc7j-6g38, CGA-747f-x3rc-crrx (3.10.1 affected, fixed by moving to 3.16.0).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
uv="${UV:-$(dirname "$python")/uv}"
[ -x "$uv" ] || "$python" -m pip install --quiet uv
torch_wheels="${TORCH_WHEELS:-/opt/wheels}"
llama_wheel=$(PYTHON="$python" bash docker/llama-wheel.sh)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "torch==2.13.0+cpu" > "$tmp/torch.txt"

compile() {  # OUTPUT INPUT... [uv flags]: one lock, written under a temp name and renamed when complete
    local out="$1"
    shift
    [ -f "$out" ] && cp "$out" "$tmp/out"  # the versions locked now are uv's preferences
    "$uv" pip compile --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
        --find-links "$torch_wheels" --find-links "$(dirname "$llama_wheel")" -c "$tmp/torch.txt" \
        --no-emit-package torch --no-emit-package llama-cpp-python --no-header --annotation-style line \
        ${UPGRADE:+--upgrade} -o "$tmp/out" "$@"
    sed -i "s#$tmp/##g" "$tmp/out"  # annotations name the constraints file, not the temp directory it was in
    mv "$tmp/out" "$out"
    echo "$out: $(grep -c '^[A-Za-z0-9]' "$out") packages" >&2
}

compile requirements.lock pyproject.toml --extra dev
sed -n 's/^\([A-Za-z0-9][^ ]*==[^ ]*\).*/\1/p' requirements.lock > "$tmp/pins.txt"
compile docker/requirements-train.lock pyproject.toml --extra ray --extra benchmarks --extra cjk -c "$tmp/pins.txt"
compile docker/requirements-serve-cpu.lock docker/requirements-serve.txt docker/requirements-chat.txt -c "$tmp/pins.txt"
compile docker/requirements-mlflow.lock docker/requirements-mlflow.txt -c "$tmp/pins.txt"
gpu_lock() {  # vLLM pins its torch and transformers: resolved on its own, for the CUDA image's Python, torch included
    [ -f docker/requirements-serve-gpu.lock ] && cp docker/requirements-serve-gpu.lock "$tmp/gpu"
    "$uv" pip compile --quiet --generate-hashes --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
        --no-header --annotation-style line ${UPGRADE:+--upgrade} -o "$tmp/gpu" \
        docker/requirements-serve-gpu.txt docker/requirements-serve.txt
    mv "$tmp/gpu" docker/requirements-serve-gpu.lock
    echo "docker/requirements-serve-gpu.lock: $(grep -c '^[A-Za-z0-9]' docker/requirements-serve-gpu.lock) packages" >&2
}
gpu_lock
