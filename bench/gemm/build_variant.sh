#!/bin/bash
# build_variant.sh OUTDIR [NVCC_FLAGS...] — bench_gemm and test_gemm_w4ax_cuda from the working
# tree's kernel file (an experiment on a branch, e.g. -DCOMET_PDL_NO_WAIT, the negative control
# of the pdl test); the other objects come from build-gemm-dev (bench/gemm/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1; shift   # relative to the repository root
b=build-gemm-dev
for f in bench_gemm.o test_gemm_w4ax_cuda.o gemm_w4ax_pack.o ref_gemm_w4ax.o status.o COMMIT; do
    [ -e "$b/$f" ] || { echo "build_variant.sh: $b/$f missing; run bench/gemm/build.sh first" >&2; exit 1; }
done
if [ "$(head -1 $b/COMMIT)" != "$(git rev-parse --short HEAD)" ]; then
    echo "build_variant.sh: $b was built from $(head -1 $b/COMMIT), HEAD is $(git rev-parse --short HEAD); rebuild it" >&2
    exit 1
fi
mkdir -p "$out"
arch="-gencode=arch=compute_90a,code=sm_90a"
nvcc -std=c++17 -O3 -Iinclude -Isrc $arch -lineinfo -Xptxas -v "$@" -c src/backend/cuda/gemm_w4ax.cu \
    -o "$out/gemm_w4ax.o" > "$out/ptxas.log" 2>&1 || { cat "$out/ptxas.log"; exit 1; }
nvcc $arch -o "$out/bench_gemm" $b/bench_gemm.o "$out/gemm_w4ax.o" $b/gemm_w4ax_pack.o $b/ref_gemm_w4ax.o \
    $b/status.o -lcublas -lcublasLt
nvcc $arch -o "$out/test_gemm_w4ax_cuda" $b/test_gemm_w4ax_cuda.o "$out/gemm_w4ax.o" $b/gemm_w4ax_pack.o \
    $b/ref_gemm_w4ax.o $b/status.o -lpthread -lm
echo "built $out/bench_gemm $out/test_gemm_w4ax_cuda ($*)"
