#!/usr/bin/env bash
# Builds the peer, llama.cpp at full strength, from the llama.cpp tree vendored in the pinned llama-cpp-python sdist:
# llama-bench, llama-server, llama-speculative-simple and llama-completion, tuned for this CPU (GGML_NATIVE, CPU
# repacking on), once, into a cache folder outside the repository. Prints the folder holding the binaries.
#   benchmarks/peer/build_llamacpp.sh            # build (or reuse) and print the bin folder
#   CUCA_PEER_CACHE=/some/dir ...                # another cache folder (default ~/.cache/cuca-peer)
# cuca's benchmarks find the binaries there (or in $CUCA_LLAMA_BIN).
set -euo pipefail
PIN="${CUCA_PEER_PIN:-0.3.36}"
CACHE="${CUCA_PEER_CACHE:-$HOME/.cache/cuca-peer}"
ROOT="$CACHE/llama-cpp-python-$PIN"
BIN="$ROOT/build/bin"
TARGETS=(llama-bench llama-server llama-speculative-simple llama-completion)

have_all() { for t in "${TARGETS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
if have_all && [ -f "$ROOT/BUILD-INFO" ]; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"
if [ ! -d "$ROOT/vendor/llama.cpp" ]; then
    # pip download is the ordinary client for the pinned sdist (it vendors llama.cpp)
    python3 -m pip download -q --no-binary :all: --no-deps -d "$CACHE" "llama-cpp-python==$PIN" >&2
    tar -xzf "$CACHE/llama_cpp_python-$PIN.tar.gz" -C "$CACHE"
    mv "$CACHE/llama_cpp_python-$PIN" "$ROOT"
fi
# AMX tiles only where this kernel enables them (an AMX build dies with SIGILL otherwise)
AMX=OFF
if grep -qw amx_tile /proc/cpuinfo; then AMX=ON; fi
cmake -S "$ROOT/vendor/llama.cpp" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DGGML_CPU_REPACK=ON -DGGML_AMX_TILE=$AMX -DGGML_AMX_INT8=$AMX -DGGML_AMX_BF16=$AMX -DGGML_OPENMP=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$ROOT/build" -j "$(nproc)" --target "${TARGETS[@]}" >&2
have_all
{
    echo "llama-cpp-python $PIN"
    "$BIN/llama-bench" --version 2>&1 | head -n 2
    echo "GGML_NATIVE=ON GGML_CPU_REPACK=ON AMX=$AMX"
} > "$ROOT/BUILD-INFO"
echo "$BIN"
