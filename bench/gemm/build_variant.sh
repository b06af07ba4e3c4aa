#!/bin/bash
# build_variant.sh OUTDIR [NVCC_FLAGS...] — bench_gemm from the working tree's kernel file with
# extra compile flags (an experiment on a branch), linked with the other objects of
# build-gemm-dev (bench/gemm/build.sh at the same commit), for a same-run A/B (ab.sh). Its
# tests: the CMake build of that branch (scripts/gpu/build.sh; for the pdl negative control,
# COMET_BUILD_DIR=build-pdl-nowait COMET_TARGETS=test_gemm_w4ax_cuda bash scripts/gpu/build.sh
# -DCMAKE_CUDA_FLAGS=-DCOMET_PDL_NO_WAIT).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
shift # relative to the repository root
b=build-gemm-dev
for f in bench_gemm.o gemm_w4ax_pack.o ref_gemm_w4ax.o status.o COMMIT; do
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
echo "built $out/bench_gemm ($*)"
