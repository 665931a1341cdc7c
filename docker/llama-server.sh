#!/usr/bin/env bash
# llama.cpp's own OpenAI server (`llama-server`: parallel slots, continuous batching, /health, /metrics), compiled
# once from the llama.cpp that the pinned llama-cpp-python sdist vendors (vendor/llama.cpp), so the bindings that
# quantize and evaluate and the server that serves are the same llama.cpp.
#
#   docker/llama-server.sh [DEST]   # prints the binary's path; DEST gets a copy of it and its libraries
#
# The version and the CPU flags are the Dockerfile's ARG LLAMA_CPP_VERSION (the version pyproject.toml pins:
# tests/test_images.py checks that they agree) and ARG LLAMA_SERVER_CMAKE_ARGS; the environment variables of the same
# names override them (the Dockerfile's llama-server stage, which has no Dockerfile to read, runs this script so).
# GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS: the CPU code is compiled once per x86-64 level (SSE4.2 ... AVX2, AVX-512,
# AMX) into libggml-cpu-*.so beside the binary, and the best one the host supports is loaded at start, so one build
# runs well on AVX2 and AVX-512 hosts alike.
# The cache, $FORGE_LLAMA_SERVER_CACHE (default ~/.cache/forge), holds one directory per version and flags
# (llama-server-VERSION-KEY/: llama-server, lib*.so, BUILD-INFO); changing either builds a new one.
# The binary links against the build host's glibc: build on Debian bookworm (glibc 2.36) or older for the images, as
# docker/build.sh checks.
set -euo pipefail
cd "$(dirname "$0")/.."
arg() { sed -n "s/^ARG $1=\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" Dockerfile 2>/dev/null | head -1; }
version="${LLAMA_CPP_VERSION:-$(arg LLAMA_CPP_VERSION)}"
cpu_args="${LLAMA_SERVER_CMAKE_ARGS:-$(arg LLAMA_SERVER_CMAKE_ARGS)}"
[ -n "$version" ] && [ -n "$cpu_args" ] || { echo "llama-server: LLAMA_CPP_VERSION/LLAMA_SERVER_CMAKE_ARGS not found" >&2; exit 2; }
# The server and what it links, nothing else: no tests, examples, web UI (it would be downloaded: nothing may be),
# HTTPS (TLS ends at a proxy in front of it) or the unified `llama` app. libcurl is gone from this llama.cpp.
# $ORIGIN: the binary finds its libraries, and ggml its CPU variants, in its own directory wherever it is copied.
switches=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN')
read -r -a cpu <<< "$cpu_args"
key=$(printf '%s|%s|%s' "$version" "${switches[*]}" "${cpu[*]}" | sha256sum | cut -c1-12)
house="${FORGE_LLAMA_SERVER_CACHE:-$HOME/.cache/forge}/llama-server-$version-$key"
python="${PYTHON:-python3}"
# The sdist itself (pip's own client and index settings), never a git checkout: exactly what the bindings built.
fetch_sdist() {
    [ -f "$1"/llama_cpp_python-"$version".tar.gz ] \
        || "$python" -m pip download --quiet --no-deps --no-binary :all: -d "$1" "llama-cpp-python==$version" >&2
}
# llama.cpp's own HF -> GGUF converter from the same sdist (convert_hf_to_gguf.py, its conversion/ package and the
# gguf-py it needs: newer than PyPI's gguf of the same version number), a few MB of Python beside the server, for the
# families Forge did not train (serve/gguf_convert.py; FORGE_LLAMA_CONVERT points elsewhere, as in an image).
# Extracted first, into the compile's directory, so a cold build downloads the sdist once for both.
convert="${FORGE_LLAMA_SERVER_CACHE:-$HOME/.cache/forge}/llama-convert-$version"
if [ ! -f "$convert/convert_hf_to_gguf.py" ]; then
    mkdir -p "$house.build" && rm -rf "$convert.tmp" && mkdir -p "$convert.tmp"
    fetch_sdist "$house.build"
    tar -xzf "$house.build"/llama_cpp_python-"$version".tar.gz -C "$convert.tmp" --strip-components=3 \
        "llama_cpp_python-$version/vendor/llama.cpp/"{convert_hf_to_gguf.py,conversion,gguf-py,LICENSE}
    rm -rf "$convert" && mv "$convert.tmp" "$convert"
    [ ! -x "$house/llama-server" ] || rm -rf "$house.build"  # the server is built: the sdist served the converter only
fi
if [ ! -x "$house/llama-server" ]; then
    echo "llama-server: compiling llama.cpp of llama-cpp-python $version with $cpu_args (cold: many minutes)" >&2
    # One build directory per cache entry, kept when a step fails: running again resumes the compile.
    tmp="$house.build"
    mkdir -p "$tmp/src"
    start=$(date +%s)
    fetch_sdist "$tmp"
    tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp/src" --strip-components=1 \
        "llama_cpp_python-$version/vendor/llama.cpp"
    cmake -S "$tmp/src/vendor/llama.cpp" -B "$tmp/build" "${switches[@]}" "${cpu[@]}" >&2
    cmake --build "$tmp/build" --target llama-server -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >&2
    rm -rf "$tmp/out" && mkdir -p "$tmp/out"
    cp -p "$tmp/build/bin/llama-server" "$tmp/out/"
    # Plain files only: each shared library under the versioned name the loader asks for (libllama.so.0), and ggml's
    # CPU variants (modules, unversioned: libggml-cpu-haswell.so...); not the development symlinks.
    for lib in "$tmp"/build/bin/lib*.so*; do
        case "$(basename "$lib")" in
            *.so) [ -L "$lib" ] || cp -p "$lib" "$tmp/out/" ;;
            *.so.[0-9] | *.so.[0-9][0-9]) cp -pL "$lib" "$tmp/out/" ;;
        esac
    done
    printf 'version=%s\ncmake_args=%s\nbuilt=%s\nseconds=%s\ncpu_seconds=%s\nhost=%s\n' \
        "$version" "$cpu_args" "$(date -u +%FT%TZ)" "$(( $(date +%s) - start ))" \
        "$(awk -v hz="$(getconf CLK_TCK)" '{print int(($14 + $15 + $16 + $17) / hz)}' /proc/$$/stat)" \
        "$(. /etc/os-release && echo "$PRETTY_NAME")" > "$tmp/out/BUILD-INFO"
    "$tmp/out/llama-server" --version >&2
    rm -rf "$house" && mv "$tmp/out" "$house" && rm -rf "$tmp"
    echo "llama-server: built in $(( $(date +%s) - start ))s into $house" >&2
fi
# Not the Sapphire Rapids variant (AVX512-FP16 and AMX): ggml picks it from CPUID alone, and a kernel or sandbox that
# does not grant the AMX tile state (measured here: a Xeon whose CPUID lists amx_tile, under this machine's kernel)
# then kills the server with SIGILL on its first matrix product. The Ice Lake / Zen 4 AVX-512 variants serve such a
# host instead; removed from a cache built before this rule too.
rm -f "$house"/libggml-cpu-sapphirerapids.so
if [ $# -ge 1 ]; then
    mkdir -p "$1"
    rm -f "$1"/llama-server "$1"/lib*.so* "$1"/BUILD-INFO
    # -p: the same bytes and times every build, so the image's COPY of it (and all after it) stays cached.
    cp -p "$house"/llama-server "$house"/lib*.so* "$house"/BUILD-INFO "$1/"
    rm -rf "$1/convert" && cp -rp "$convert" "$1/convert"  # the converter travels with the server (the train image)
fi
echo "$house/llama-server"
