#!/usr/bin/env bash
# `make images`: build Dockerfile targets as <prefix>-<target>:<tag> (forge-train:latest, forge-serve-cpu:latest...).
#
#   docker/build.sh [TARGET...]        # default: train serve-cpu mlflow (serve-gpu needs a CUDA base and vLLM)
#
# Engine: docker when an engine answers `docker info`, else buildah with flags that need no daemon (--isolation
# chroot, --layers for the layer cache) on the storage driver docker/storage-driver.sh picks: overlay as root where
# the kernel mounts it, else vfs (rootless; every layer a full copy).
# Base image: $BASE_IMAGE, else python:3.11-slim-bookworm; when that cannot be pulled (no Docker Hub), a Debian
# bookworm + python3 image made by docker/base.sh (debootstrap) from the Debian mirror.
# llama.cpp: docker/llama-wheel.sh builds the portable wheel (train) and docker/llama-server.sh the llama-server binary
# (serve-cpu) once into ~/.cache/forge and copy them to docker/wheels/ and docker/llama-server/, so the image build
# skips the compiles (many minutes each on 2 cores); FORGE_COMPILE_IN_IMAGE=1 compiles in the image.
# Behind a TLS-intercepting proxy (pip's $PIP_CERT set) buildah bind-mounts that CA bundle for pip during RUN steps
# only (never into a layer); a $PIP_FIND_LINKS folder (a local torch wheel) is bind-mounted the same way.
# Prints one line per image: seconds to build and size; FORGE_IMAGE_REPORT=FILE also writes them as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(train serve-cpu mlflow)
prefix="${FORGE_IMAGE_PREFIX:-forge}"
tag="${FORGE_TAG:-latest}"
if [ -n "${ENGINE:-}" ]; then
    engine="$ENGINE"
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    engine=docker
elif command -v buildah >/dev/null; then
    engine=buildah
else
    echo "images: no Docker engine answers and buildah is missing (apt-get install buildah debootstrap)" >&2
    exit 2
fi
storage=docker
if [ "$engine" = buildah ]; then
    storage=$(docker/storage-driver.sh)
    export STORAGE_DRIVER="$storage"  # base.sh uses the same store
fi
buildah=(buildah --storage-driver "$storage")

have_image() {
    if [ "$engine" = docker ]; then docker image inspect "$1" >/dev/null 2>&1
    else "${buildah[@]}" inspect --type image "$1" >/dev/null 2>&1; fi
}
pull() {
    if [ "$engine" = docker ]; then docker pull -q "$1" >/dev/null 2>&1
    else timeout 300 "${buildah[@]}" pull -q "$1" >/dev/null 2>&1; fi
}

base="${BASE_IMAGE:-python:3.11-slim-bookworm}"
if ! have_image "$base" && ! pull "$base"; then
    if [ -n "${BASE_IMAGE:-}" ]; then
        echo "images: cannot pull BASE_IMAGE=$base" >&2
        exit 2
    fi
    echo "images: $base cannot be pulled; using a debootstrapped Debian bookworm base (docker/base.sh)" >&2
    base=$(ENGINE="$engine" docker/base.sh)
fi

# The portable llama-cpp-python wheel (train) and llama-server (serve-cpu): prebuilt on this host when its glibc is not
# newer than the base image's (bookworm: 2.36), else left to the image's `wheels` and `llama-server` stages.
rm -f docker/wheels/*.whl docker/wheels/BUILD-INFO docker/llama-server/llama-server docker/llama-server/lib*.so* \
    docker/llama-server/BUILD-INFO && rm -rf docker/llama-server/convert
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -z "${FORGE_COMPILE_IN_IMAGE:-}" ] && [ -n "$glibc" ] \
    && [ "$(printf '%s\n2.36\n' "$glibc" | sort -V | tail -1)" = 2.36 ]; then
    case " ${targets[*]} " in *" train "*) docker/llama-wheel.sh docker/wheels >/dev/null ;; esac
    # llama-server for serve-cpu, and llama.cpp's GGUF converter from the same source for train
    case " ${targets[*]} " in *" serve-cpu "* | *" train "*) docker/llama-server.sh docker/llama-server >/dev/null ;; esac
else
    echo "images: llama.cpp will be compiled inside the image (many minutes)" >&2
fi

args=(--build-arg "BASE_IMAGE=$base")
mounts=()
if [ "$engine" = buildah ]; then
    if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
        mounts+=(-v "$PIP_CERT:/etc/ssl/forge-build-ca.pem:ro")
        args+=(--build-arg PIP_CERT=/etc/ssl/forge-build-ca.pem)
    fi
    if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
        mounts+=(-v "$PIP_FIND_LINKS:/opt/forge-find-links:ro")
        args+=(--build-arg PIP_FIND_LINKS=/opt/forge-find-links)
    fi
fi

# An image's size: the sum of its layers' sizes from the storage's own index (instant), else `buildah images`
# (which measures every image in the store: minutes with vfs).
image_size() {
    local root="${CONTAINERS_STORAGE_ROOT:-/var/lib/containers/storage}"
    python3 - "$root/$storage-layers/layers.json" "$root/$storage-images/images.json" "$1" 2>/dev/null <<'PY' ||
import json
import sys

layers = {layer["id"]: layer for layer in json.load(open(sys.argv[1]))}
image = next(i for i in json.load(open(sys.argv[2])) if sys.argv[3] in i.get("names", []))
total, top = 0, image["layer"]
while top:
    total += layers[top].get("diff-size", 0)
    top = layers[top].get("parent")
print(f"{total / 1e6:.0f} MB")
PY
        "${buildah[@]}" images --format '{{.Size}}' --noheading "$1" | head -1
}

for target in "${targets[@]}"; do
    image="$prefix-$target:$tag"
    echo "== images: $image (target $target, base $base, $engine, storage $storage)" >&2
    start=$(date +%s)
    if [ "$engine" = docker ]; then
        docker build --target "$target" "${args[@]}" -t "$image" .
        size="$(( $(docker image inspect -f '{{.Size}}' "$image") / 1000000 )) MB"
    else
        "${buildah[@]}" bud --isolation chroot --layers --format docker --target "$target" "${args[@]}" "${mounts[@]}" \
            -t "$image" . >&2
        size=$(image_size "localhost/$image")
    fi
    seconds=$(( $(date +%s) - start ))
    echo "images: $image built in ${seconds}s, size $size"
    if [ -n "${FORGE_IMAGE_REPORT:-}" ]; then
        printf '{"image": "%s", "target": "%s", "engine": "%s", "storage": "%s", "base": "%s", "seconds": %s, "size": "%s"}\n' \
            "$image" "$target" "$engine" "$storage" "$base" "$seconds" "$size" >> "$FORGE_IMAGE_REPORT"
    fi
done
