#!/bin/bash
# build.sh OUTDIR — build the W4Ax GEMM GPU tests (the kernel's, test_gemm_w4ax_cuda, and the
# CUDA backend's op table, test_backend_cuda), the benchmark and the decode floor (floor.cu)
# with nvcc/gcc alone (no CMake,
# none of comet_lib's other dependencies), for sm_90a. Used on the GPU machine, whose image
# lacks PCRE2/cJSON/OpenBLAS, and locally to check SASS and registers.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gemm-dev}
mkdir -p "$out"
# COMET_ARCH replaces the target (e.g. "-gencode=arch=compute_90,code=sm_90": a build without
# sm_90a code, for test_gemm_w4ax_cuda --no-sm90a); COMET_EXTRA_ARCH adds targets
arch="${COMET_ARCH:--gencode=arch=compute_90a,code=sm_90a} ${COMET_EXTRA_ARCH:-}"
inc="-Iinclude -Isrc"
nvcc -std=c++17 -O3 $inc $arch -lineinfo -Xptxas -v -c src/backend/cuda/gemm_w4ax.cu -o "$out/gemm_w4ax.o" \
    > "$out/ptxas.log" 2>&1 &
p1=$!
nvcc -std=c++17 -O3 $inc $arch -c bench/gemm/bench_gemm.cu -o "$out/bench_gemm.o" &
p2=$!
nvcc -std=c++17 -O3 $inc $arch -o "$out/floor" bench/gemm/floor.cu -lcublas &
p3=$!
nvcc -std=c++17 -O3 $inc $arch -c src/backend/cuda/model_ops.cu -o "$out/model_ops.o" &
p4=$!
for f in src/backend/cuda/gemm_w4ax_pack.c src/backend/cpu/ref_gemm_w4ax.c src/core/status.c \
         src/backend/backend.c src/backend/cuda/cuda_backend.c src/backend/cuda/cuda_weights.c \
         src/backend/rope.c src/core/log.c \
         tests/cuda/test_gemm_w4ax_cuda.c tests/cuda/test_backend_cuda.c; do
    gcc -std=gnu11 -O2 -Wall -Wextra -DCOMET_HAVE_CUDA=1 $inc -I/usr/local/cuda/include -c "$f" \
        -o "$out/$(basename "$f" .c).o"
done
wait $p1 || { cat "$out/ptxas.log"; exit 1; }
# the kernel file's compiler warnings land in ptxas.log with ptxas -v's report: show them
if grep -q "warning" "$out/ptxas.log"; then
    grep -A3 "warning" "$out/ptxas.log" >&2
    echo "build.sh: nvcc warned on gemm_w4ax.cu (above; the full output is in $out/ptxas.log)" >&2
fi
# ptxas serializing the wgmma of a production instance (no bsum, no ablation: C7509-C7516,
# "Potential Performance Loss") is a defect of the kernel source, not a warning to live with
if grep -E "C75[0-9][0-9].*w4ax_ws_kernelILi[12]ELi[0-9]+ELb0ELi0E" "$out/ptxas.log"; then
    echo "build.sh: ptxas serialized the wgmma of a production instance (above)" >&2
    exit 1
fi
wait $p2
wait $p3
wait $p4
common="$out/gemm_w4ax.o $out/gemm_w4ax_pack.o $out/ref_gemm_w4ax.o $out/status.o"
nvcc $arch -o "$out/test_gemm_w4ax_cuda" "$out/test_gemm_w4ax_cuda.o" $common -lpthread -lm
nvcc $arch -o "$out/test_backend_cuda" "$out/test_backend_cuda.o" "$out/cuda_backend.o" "$out/cuda_weights.o" \
    "$out/model_ops.o" "$out/backend.o" "$out/rope.o" "$out/log.o" $common -lcublas -lpthread -lm
nvcc $arch -o "$out/bench_gemm" "$out/bench_gemm.o" $common -lcublas -lcublasLt
# the source these binaries were built from (gpu_run.sh reports it: the GPU machine's own
# checkout may lag behind the files copied to it)
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } > "$out/COMMIT"
git diff --quiet HEAD -- src bench tests 2>/dev/null || echo "+ uncommitted changes" >> "$out/COMMIT"
echo "built $out/test_gemm_w4ax_cuda $out/test_backend_cuda $out/bench_gemm $out/floor"
