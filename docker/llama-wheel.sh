#!/usr/bin/env bash
# Build the portable llama-cpp-python wheel once and keep it in a wheelhouse outside the repo, so image builds
# copy a wheel instead of compiling llama.cpp (10-25 min on 2 cores) every time.
#
#   docker/llama-wheel.sh [DEST]   # prints the wheel's path; DEST gets a copy (e.g. docker/wheels/)
#
# The version and CMake flags are read from the Dockerfile (ARG LLAMA_CPP_VERSION / ARG LLAMA_CMAKE_ARGS), the one
# place they are set; docker/llama-lib-only.cmake (CMAKE_PROJECT_INCLUDE) keeps llama.cpp's unused `common` library
# out. The wheelhouse is keyed on all three, so changing any builds a new wheel.
# --no-cache-dir: pip's own wheel cache may hold a -march=native build of the same version (what `make install`
# compiled for this machine); that one must never end up in an image.
# The wheel is tagged py3-none-linux_x86_64 (ctypes, no CPython ABI), but its libraries link against the build
# host's glibc: build it on Debian bookworm (glibc 2.36) or older, as here, or let the Dockerfile compile it.
set -euo pipefail
cd "$(dirname "$0")/.."
arg() { sed -n "s/^ARG $1=\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" Dockerfile | head -1; }
version=$(arg LLAMA_CPP_VERSION)
cmake_args=$(arg LLAMA_CMAKE_ARGS)
[ -n "$version" ] && [ -n "$cmake_args" ] || { echo "llama-wheel: ARGs not found in Dockerfile" >&2; exit 2; }
lib_only="$PWD/docker/llama-lib-only.cmake"
key=$(printf '%s|%s|%s' "$version" "$cmake_args" "$(sha256sum < "$lib_only")" | sha256sum | cut -c1-12)
house="${FORGE_WHEELHOUSE:-$HOME/.cache/forge/wheelhouse}/llama-cpp-python-$version-$key"
python="${PYTHON:-python3}"
wheel=$(ls "$house"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    echo "llama-wheel: compiling llama-cpp-python $version with CMAKE_ARGS=\"$cmake_args\" (10-25 min)" >&2
    tmp="$house.tmp.$$"
    rm -rf "$tmp" && mkdir -p "$tmp"
    start=$(date +%s)
    CMAKE_ARGS="$cmake_args -DCMAKE_PROJECT_INCLUDE=$lib_only" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$python" -m pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python \
        -w "$tmp" "llama-cpp-python==$version" >&2
    printf 'version=%s\ncmake_args=%s\nproject_include=%s\nbuilt=%s\nseconds=%s\ncpu_seconds=%s\nhost=%s\n' \
        "$version" "$cmake_args" "$(basename "$lib_only")" "$(date -u +%FT%TZ)" "$(( $(date +%s) - start ))" \
        "$(awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15 + $16 + $17) / hz)}' /proc/$$/stat)" \
        "$(. /etc/os-release && echo "$PRETTY_NAME")" > "$tmp/BUILD-INFO"
    rm -rf "$house" && mv "$tmp" "$house"
    wheel=$(ls "$house"/llama_cpp_python-"$version"-*.whl | head -1)
    echo "llama-wheel: built in $(( $(date +%s) - start ))s" >&2
fi
if [ $# -ge 1 ]; then
    mkdir -p "$1"
    rm -f "$1"/llama_cpp_python-*.whl "$1"/BUILD-INFO
    # -p: the same bytes and times every build, so the COPY of docker/wheels/ (and all after it) stays cached.
    # BUILD-INFO: the Dockerfile checks the flags before using the wheel.
    cp -p "$wheel" "$house/BUILD-INFO" "$1/"
fi
echo "$wheel"
