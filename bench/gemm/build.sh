#!/bin/bash
# build.sh OUTDIR — the GEMM lab's quick build: the W4Ax GEMM (gemm_w4ax.cu, with ptxas's
# register and spill report in OUTDIR/ptxas.log), the benchmark bench_gemm and the decode
# floor (floor.cu), with nvcc/gcc alone (no CMake, none of comet_lib's other dependencies),
# for sm_90a. The tests are built by the one CMake build (scripts/gpu/build.sh, ctest -L cuda).
# Fails when ptxas serializes the wgmma of a production instance (warning C7510-C7599).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gemm-dev}
mkdir -p "$out"
# COMET_ARCH replaces the target; COMET_EXTRA_ARCH adds targets
arch="${COMET_ARCH:--gencode=arch=compute_90a,code=sm_90a} ${COMET_EXTRA_ARCH:-}"
inc="-Iinclude -Isrc"
nvcc -std=c++17 -O3 $inc $arch -lineinfo -Xptxas -v -c src/backend/cuda/gemm_w4ax.cu -o "$out/gemm_w4ax.o" \
    > "$out/ptxas.log" 2>&1 &
p1=$!
nvcc -std=c++17 -O3 $inc $arch -c bench/gemm/bench_gemm.cu -o "$out/bench_gemm.o" &
p2=$!
nvcc -std=c++17 -O3 $inc $arch -o "$out/floor" bench/gemm/floor.cu -lcublas &
p3=$!
for f in src/backend/cuda/gemm_w4ax_pack.c src/backend/cpu/ref_gemm_w4ax.c src/core/status.c; do
    gcc -std=gnu11 -O2 -Wall -Wextra -DCOMET_HAVE_CUDA=1 $inc -I/usr/local/cuda/include -c "$f" \
        -o "$out/$(basename "$f" .c).o"
done
wait $p1 || { cat "$out/ptxas.log"; exit 1; }
if grep -q "warning" "$out/ptxas.log"; then
    grep -A3 "warning" "$out/ptxas.log" >&2
    echo "build.sh: nvcc warned on gemm_w4ax.cu (above; the full output is in $out/ptxas.log)" >&2
fi
if grep -E "C75[0-9][0-9].*w4ax_ws_kernelILi[12]ELi[0-9]+ELb0E" "$out/ptxas.log"; then
    echo "build.sh: ptxas serialized the wgmma of a production instance (above)" >&2
    exit 1
fi
wait $p2
wait $p3
nvcc $arch -o "$out/bench_gemm" "$out/bench_gemm.o" "$out/gemm_w4ax.o" "$out/gemm_w4ax_pack.o" \
    "$out/ref_gemm_w4ax.o" "$out/status.o" -lcublas -lcublasLt
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } > "$out/COMMIT"
git diff --quiet HEAD -- src bench 2>/dev/null || echo "+ uncommitted changes" >> "$out/COMMIT"
echo "built $out/bench_gemm $out/floor"
