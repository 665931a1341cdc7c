#!/usr/bin/env bash
# The GPU check in one call (bench/gpu_check.py says what it measures): picks the python, then runs the check.
#
#   bash bench/gpu_check.sh --out $OUT/gpu_check.json                  # a GPU machine: about 5-7 minutes
#   bash bench/gpu_check.sh --wheels build/gpu-wheels --no-registry --no-vllm-install --out $OUT/gpu_check.json
#                                                                      # a GPU machine that reaches no registry
#   bash bench/gpu_check.sh --dry-run --out /tmp/gpu_check.json        # CPU rehearsal with the repo's .venv
#   bash bench/gpu_check.sh --download-wheels build/gpu-wheels         # where pip works: fills that folder
#
# The python: $FORGE_GPU_PYTHON, else the repo's .venv, else python3 (on a bare GPU machine, the one with torch).
# --download-wheels fetches the few packages a machine with torch, transformers and accelerate but no registry lacks
# (pydantic and its parts, typing-extensions, bitsandbytes: about 44 MB; build/ is git-ignored) as CPython 3.12
# manylinux wheels; `--download-wheels DIR --py-version 3.11` for another python.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "--download-wheels" ]]; then
    dest=${2:?--download-wheels needs a folder, e.g. build/gpu-wheels}
    pyver=3.12
    [[ "${3:-}" == "--py-version" ]] && pyver=${4:?--py-version needs a version, e.g. 3.12}
    platforms=()
    for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
    specs=$(python3 - <<'EOF'
import sys
sys.path.insert(0, "bench")
from gpu_check import ROOT, WHEELS, lock_versions
lock = lock_versions(ROOT / "requirements.lock")
print(" ".join(f"{name}=={lock[name]}" for name in WHEELS))
EOF
)
    # shellcheck disable=SC2086 # one word per spec
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d "$dest" $specs
    du -sh "$dest"
    exit 0
fi

if [[ -n "${FORGE_GPU_PYTHON:-}" ]]; then
    python=$FORGE_GPU_PYTHON
elif [[ -x .venv/bin/python ]]; then
    python=.venv/bin/python
else
    python=python3
fi
export PYTHONUNBUFFERED=1
exec "$python" bench/gpu_check.py "$@"
