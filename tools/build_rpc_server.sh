#!/usr/bin/env bash
# Builds llama.cpp's unmodified rpc-server (tools/rpc, target ggml-rpc-server) from the
# llama-cpp-python 0.3.36 sdist: ggml's CPU backend + the RPC backend only, into
# build/rpc-server/. Idempotent: the sdist download and the build are cached; a second run
# with build/rpc-server/bin/rpc-server present does nothing.
#
# Usage: tools/build_rpc_server.sh [PYTHON]   (PYTHON: a python with pip; default .venv/bin/python)
# Env:   PYGGML_LLAMACPP_SDIST_DIR  an already unpacked sdist to build from (skips the download)
#        RPC_BUILD_JOBS             parallel compile jobs (default 2)
#        PYGGML_CACHE_DIR           where the built server is kept for the next clone on this
#                                   machine (default ~/.cache/pyggml): the build runs once
# Also copies the tree's ggml.h beside the binary (tests check the op/type table against it).
set -eu
VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$ROOT/.venv/bin/python}
OUT=$ROOT/build/rpc-server
DL=$ROOT/build/downloads
SRC=$ROOT/build/llama-cpp-python-$VERSION
JOBS=${RPC_BUILD_JOBS:-2}

CACHE=${PYGGML_CACHE_DIR:-$HOME/.cache/pyggml}/rpc-server-$VERSION

if [ -x "$OUT/bin/rpc-server" ] && [ -f "$OUT/ggml.h" ]; then
    echo "rpc-server: present ($OUT/bin/rpc-server)"
    exit 0
fi
if [ -x "$CACHE/rpc-server" ] && [ -f "$CACHE/ggml.h" ]; then
    mkdir -p "$OUT/bin"
    cp "$CACHE/rpc-server" "$OUT/bin/rpc-server" && cp "$CACHE/ggml.h" "$OUT/ggml.h"
    echo "rpc-server: from the cache ($CACHE)"
    exit 0
fi
command -v cmake >/dev/null || { echo "rpc-server: cmake missing (tools/setup_system.sh installs it)"; exit 1; }
command -v g++ >/dev/null || { echo "rpc-server: g++ missing (tools/setup_system.sh installs it)"; exit 1; }

if [ -n "${PYGGML_LLAMACPP_SDIST_DIR:-}" ] && [ -d "$PYGGML_LLAMACPP_SDIST_DIR/vendor/llama.cpp" ]; then
    SRC=$PYGGML_LLAMACPP_SDIST_DIR
else
    if [ ! -d "$SRC/vendor/llama.cpp" ]; then
        mkdir -p "$DL"
        tarball=$(ls "$DL"/llama_cpp_python-$VERSION.tar.gz 2>/dev/null || true)
        if [ -z "$tarball" ]; then
            echo "rpc-server: downloading the llama-cpp-python $VERSION sdist"
            "$PY" -m pip download -q --no-deps --no-binary :all: -d "$DL" "llama-cpp-python==$VERSION"
            tarball=$(ls "$DL"/llama_cpp_python-$VERSION.tar.gz)
        fi
        rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
        tar -xzf "$tarball" -C "$SRC.tmp" --strip-components=1
        mv "$SRC.tmp" "$SRC"
    fi
fi
LLAMA=$SRC/vendor/llama.cpp
echo "rpc-server: building from $LLAMA with $JOBS jobs"
# CPU backend only, no llama library beyond what tools/rpc needs, no tests/examples/server.
# GGML_NATIVE=ON: the server runs on this machine only (tests, benchmarks).
cmake -S "$LLAMA" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_RPC=ON -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF \
    -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_RPC_RDMA=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$OUT.cmake.log" 2>&1 \
    || { tail -30 "$OUT.cmake.log"; exit 1; }
cmake --build "$OUT/cmake" --target ggml-rpc-server -j "$JOBS" >"$OUT.build.log" 2>&1 \
    || { tail -30 "$OUT.build.log"; exit 1; }
bin=$(find "$OUT/cmake" -type f \( -name ggml-rpc-server -o -name rpc-server \) -perm -u+x | head -1)
[ -n "$bin" ] || { echo "rpc-server: built, but no ggml-rpc-server binary found"; exit 1; }
mkdir -p "$OUT/bin"
cp "$bin" "$OUT/bin/rpc-server.tmp" && mv "$OUT/bin/rpc-server.tmp" "$OUT/bin/rpc-server"
cp "$LLAMA/ggml/include/ggml.h" "$OUT/ggml.h"
if mkdir -p "$CACHE" 2>/dev/null; then
    cp "$OUT/bin/rpc-server" "$CACHE/rpc-server.tmp" && mv "$CACHE/rpc-server.tmp" "$CACHE/rpc-server"
    cp "$OUT/ggml.h" "$CACHE/ggml.h"
fi
echo "rpc-server: built $OUT/bin/rpc-server"
