#!/usr/bin/env bash
# Builds llama.cpp's command-line tools from the llama-cpp-python 0.3.36 sdist, for the
# side-by-side benchmarks in BENCHMARKS.md (never for tests, never a runtime dependency):
#   llama-server, llama-bench, llama-speculative, llama-speculative-simple, llama-cli,
#   rpc-server (target ggml-rpc-server)
# statically linked (-DBUILD_SHARED_LIBS=OFF: no .so files to carry) into
# ~/.cache/pyggml/llamacpp-0.3.36/bin/. Cached: a second run with every binary present does
# nothing.
#
# Build flags: GGML_RPC=ON (llama-bench --rpc), LLAMA_CURL=OFF, GGML_NATIVE=ON (-march=native:
# the tools run on this machine only) but with AMX switched off (-mno-amx-*): the CPU reports
# amx_tile/amx_int8, yet llama.cpp's AMX extra buffer type raises SIGILL on this VM (the
# hypervisor does not grant the AMX tile state). The AVX-512 repack path stays on.
#
# LLAMACPP_ISA=avx2: llama-bench alone, built for what an AVX2-only laptop runs (Intel before
# Ice Lake / Alder Lake, AMD Zen 2/3): GGML_NATIVE=OFF with SSE4.2, AVX, AVX2, FMA, F16C, BMI2 and
# nothing newer (no AVX-VNNI, no AVX-512), into ~/.cache/pyggml/llamacpp-0.3.36-avx2/bin/ — the
# reference for pyggml's forced avx2 path (PYGGML_CPU_PATH=avx2) on a machine that has more.
#
# Usage: tools/build_llamacpp_tools.sh [PYTHON]   (PYTHON: a python with pip; default
#        .venv/bin/python, else python3; used only to download the sdist when it is absent)
# Env:   PYGGML_LLAMACPP_SDIST_DIR  an unpacked sdist to build from (default
#                                   /work/ref/llama-cpp-python-0.3.36 when it is there, else
#                                   build/llama-cpp-python-0.3.36, downloaded and unpacked)
#        LLAMACPP_BUILD_JOBS        parallel compile jobs (default 2)
#        PYGGML_CACHE_DIR           cache root (default ~/.cache/pyggml)
#        LLAMACPP_ISA               native (default) or avx2 (see above)
set -eu
VERSION=0.3.36
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
JOBS=${LLAMACPP_BUILD_JOBS:-2}
ISA=${LLAMACPP_ISA:-native}
DL=$ROOT/build/downloads
case $ISA in
native)
    CACHE=${PYGGML_CACHE_DIR:-$HOME/.cache/pyggml}/llamacpp-$VERSION
    SCRATCH=$ROOT/build/llamacpp-tools
    TOOLS="llama-server llama-bench llama-speculative llama-speculative-simple llama-cli rpc-server"
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    ISA_FLAGS="-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    ;;
avx2)
    CACHE=${PYGGML_CACHE_DIR:-$HOME/.cache/pyggml}/llamacpp-$VERSION-avx2
    SCRATCH=$ROOT/build/llamacpp-tools-avx2
    TOOLS="llama-bench"
    NOAMX=""
    ISA_FLAGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
        -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF
        -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
        -DGGML_AMX_BF16=OFF"
    ;;
*)
    echo "llamacpp-tools: LLAMACPP_ISA=$ISA: expected native or avx2"
    exit 1
    ;;
esac
BIN=$CACHE/bin

missing=""
for t in $TOOLS; do [ -x "$BIN/$t" ] || missing="$missing $t"; done
if [ -z "$missing" ]; then
    echo "llamacpp-tools: present ($BIN)"
    exit 0
fi
command -v cmake >/dev/null || { echo "llamacpp-tools: cmake missing (setup_system.sh)"; exit 1; }
command -v g++ >/dev/null || { echo "llamacpp-tools: g++ missing (tools/setup_system.sh)"; exit 1; }

SRC=${PYGGML_LLAMACPP_SDIST_DIR:-}
if [ -z "$SRC" ] && [ -d /work/ref/llama-cpp-python-$VERSION/vendor/llama.cpp ]; then
    SRC=/work/ref/llama-cpp-python-$VERSION
fi
if [ -z "$SRC" ] || [ ! -d "$SRC/vendor/llama.cpp" ]; then
    SRC=$ROOT/build/llama-cpp-python-$VERSION
    if [ ! -d "$SRC/vendor/llama.cpp" ]; then
        mkdir -p "$DL"
        tarball=$(ls "$DL"/llama_cpp_python-$VERSION.tar.gz 2>/dev/null || true)
        if [ -z "$tarball" ]; then
            echo "llamacpp-tools: downloading the llama-cpp-python $VERSION sdist"
            "$PY" -m pip download -q --no-deps --no-binary :all: -d "$DL" \
                "llama-cpp-python==$VERSION"
            tarball=$(ls "$DL"/llama_cpp_python-$VERSION.tar.gz)
        fi
        rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
        tar -xzf "$tarball" -C "$SRC.tmp" --strip-components=1
        mv "$SRC.tmp" "$SRC"
    fi
fi
LLAMA=$SRC/vendor/llama.cpp
echo "llamacpp-tools: building$missing from $LLAMA with $JOBS jobs (log: $SCRATCH.build.log)"
mkdir -p "$SCRATCH"
# shellcheck disable=SC2086  # ISA_FLAGS: one word per cmake option
cmake -S "$LLAMA" -B "$SCRATCH" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_RPC=ON $ISA_FLAGS \
    -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON \
    -DGGML_RPC_RDMA=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >"$SCRATCH.cmake.log" 2>&1 \
    || { tail -30 "$SCRATCH.cmake.log"; exit 1; }
TARGETS=$(echo "$TOOLS" | sed 's/\brpc-server\b/ggml-rpc-server/')
# shellcheck disable=SC2086
cmake --build "$SCRATCH" -j "$JOBS" --target $TARGETS >"$SCRATCH.build.log" 2>&1 \
    || { tail -30 "$SCRATCH.build.log"; exit 1; }
mkdir -p "$BIN"
for t in $TOOLS; do
    name=$t
    [ "$t" = rpc-server ] && name=ggml-rpc-server
    built=$(find "$SCRATCH/bin" -maxdepth 1 -type f -name "$name" -perm -u+x | head -1)
    [ -n "$built" ] || { echo "llamacpp-tools: $name missing in $SCRATCH/bin"; exit 1; }
    cp "$built" "$BIN/$t.tmp" && mv "$BIN/$t.tmp" "$BIN/$t"
done
# Smoke check: each binary starts (a SIGILL here would mean the AMX guard did not hold).
for t in $TOOLS; do
    [ "$t" = rpc-server ] && continue
    "$BIN/$t" --help >/dev/null 2>&1 || { echo "llamacpp-tools: $BIN/$t --help failed"; exit 1; }
done
echo "llamacpp-tools: built into $BIN"
