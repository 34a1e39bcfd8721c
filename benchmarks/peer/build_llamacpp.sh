#!/usr/bin/env bash
# Builds the peer, llama.cpp at full strength, from the llama.cpp tree vendored in the pinned llama-cpp-python sdist:
# llama-bench, llama-server, llama-speculative-simple and llama-completion, tuned for this CPU (GGML_NATIVE, CPU
# repacking on), once, into a cache folder outside the repository. Prints the folder holding the binaries.
#   benchmarks/peer/build_llamacpp.sh            # build (or reuse) and print the bin folder
#   CUCA_PEER_CACHE=/some/dir ...                # another cache folder (default ~/.cache/cuca-peer)
#   CUCA_PEER_ISA=avx2 ...                       # an AVX2-only build (no AVX-512: what a Zen 3 machine runs) into
#                                                # build-avx2/, the peer of cuca's CUCA_ISA=avx2 build
# cuca's benchmarks find the binaries there (or in $CUCA_LLAMA_BIN); an avx2 build of cuca uses build-avx2/ if built.
set -euo pipefail
PIN="${CUCA_PEER_PIN:-0.3.36}"
CACHE="${CUCA_PEER_CACHE:-$HOME/.cache/cuca-peer}"
ROOT="$CACHE/llama-cpp-python-$PIN"
ISA="${CUCA_PEER_ISA:-native}"
case "$ISA" in
    native) BUILD="$ROOT/build"; FLAGS=(-DGGML_NATIVE=ON) ;;
    avx2) BUILD="$ROOT/build-avx2"
          FLAGS=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
                 -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
                 -DGGML_AVX512_BF16=OFF) ;;
    *) echo "build_llamacpp.sh: CUCA_PEER_ISA must be native or avx2, not $ISA" >&2; exit 2 ;;
esac
BIN="$BUILD/bin"
TARGETS=(llama-bench llama-server llama-speculative-simple llama-completion)

have_all() { for t in "${TARGETS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
# the native build keeps its BUILD-INFO beside the sources (where earlier builds put it), an ISA build in its folder
INFO="$ROOT/BUILD-INFO"
if [ "$ISA" != native ]; then INFO="$BUILD/BUILD-INFO"; fi
if have_all && [ -f "$INFO" ]; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"
if [ ! -d "$ROOT/vendor/llama.cpp" ]; then
    # pip download is the ordinary client for the pinned sdist (it vendors llama.cpp)
    python3 -m pip download -q --no-binary :all: --no-deps -d "$CACHE" "llama-cpp-python==$PIN" >&2
    tar -xzf "$CACHE/llama_cpp_python-$PIN.tar.gz" -C "$CACHE"
    mv "$CACHE/llama_cpp_python-$PIN" "$ROOT"
fi
# AMX tiles only where this kernel enables them and the build then runs: the pinned llama.cpp's AMX path can die
# with SIGILL on its first tile instruction even so (its tile config is dropped by the compiler; seen with GCC 12 on
# a Sapphire Rapids VM), so an AMX build must pass a smoke test (an 8-row pass on a tiny Q8_0 file), else it is
# rebuilt without AMX and BUILD-INFO says why
AMX=OFF
if [ "$ISA" = native ] && grep -qw amx_tile /proc/cpuinfo; then AMX=ON; fi
configure_and_build() {
    # GGML_NATIVE compiles with -march=native, which turns AMX on whatever GGML_AMX_* say: AMX off takes -mno-amx-*
    local cflags=""
    if [ "$AMX" = OFF ] && grep -qw amx_tile /proc/cpuinfo; then cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
    cmake -S "$ROOT/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${FLAGS[@]}" \
        -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
        -DGGML_CPU_REPACK=ON -DGGML_AMX_TILE=$AMX -DGGML_AMX_INT8=$AMX -DGGML_AMX_BF16=$AMX -DGGML_OPENMP=ON \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
    cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" >&2
}
configure_and_build
have_all
AMX_NOTE=""
if [ "$AMX" = ON ]; then
    SMOKE="$BUILD/amx-smoke.gguf"
    HERE="$(cd "$(dirname "$0")" && pwd)"
    if ! python3 "$HERE/../../tools/synth_dense.py" --smoke "$SMOKE" >&2; then
        AMX_NOTE=" (the AMX smoke file could not be written: python3 needs numpy and gguf)"
    elif ! "$BIN/llama-bench" -m "$SMOKE" -t 2 -p 8 -n 0 -r 1 >/dev/null 2>&1; then
        AMX_NOTE=" (the AMX build died on the smoke test, an 8-row pass on a tiny Q8_0 file)"
    fi
    if [ -n "$AMX_NOTE" ]; then
        echo "build_llamacpp.sh: AMX off$AMX_NOTE; rebuilding without it" >&2
        AMX=OFF
        configure_and_build
        have_all
    else
        AMX_NOTE=" (passed the smoke test: an 8-row pass on a tiny Q8_0 file)"
    fi
fi
{
    echo "llama-cpp-python $PIN"
    "$BIN/llama-bench" --version 2>&1 | head -n 2
    echo "ISA=$ISA ${FLAGS[*]} GGML_CPU_REPACK=ON AMX=$AMX$AMX_NOTE"
} > "$INFO"
echo "$BIN"
