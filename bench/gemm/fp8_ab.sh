#!/bin/bash
# fp8_ab.sh — on the GPU machine, from the repository root, after scripts/gpu/build.sh has built
# build-gpu: the wgmma kernel's FP8 path (comet_cuda_w4ax_gemm.fp8 = 1, docs/gemm.md) against its
# INT8 path (fp8 = -1) in one bench_gemm process (--fp8 ab: both in every case, the order
# alternating from case to case), inside CUDA graphs with pdl, the 8 LLaMA-3 shapes at 12.5 %
# INT8 blocks, M = 64, 128, 256, 512, 2048, 8192 (FP8_AB_MS to change them). Writes
# $OUT/fp8_ab.md (per shape: both times, speedup off / on, x cuBLAS FP16 both ways; geomeans per
# M) and the raw log $OUT/fp8_ab.log ($OUT defaults to ./out). About 1.5 minutes on an H200.
#   bash bench/gemm/fp8_ab.sh
set -o pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
mkdir -p "$out"
bin=${BENCH_GEMM:-build-gpu/bench/bench_gemm}
[ -x "$bin" ] || { echo "fp8_ab.sh: $bin missing; build it with scripts/gpu/build.sh" >&2; exit 1; }
ms=${FP8_AB_MS:-64,128,256,512,2048,8192}
log="$out/fp8_ab.log"
timeout 175 "$bin" --graph --pdl --shapes 8 --fracs 0.125 --ms "$ms" --fp8 ab > "$log" 2>&1 ||
    { echo "fp8_ab.sh: bench_gemm failed or timed out:" >&2; tail -20 "$log" >&2; exit 1; }
{
    echo "# FP8 wgmma (INT4 blocks) on vs off, same process"
    echo
    echo "GPU: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>/dev/null), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo "\`$bin --graph --pdl --shapes 8 --fracs 0.125 --ms $ms --fp8 ab\`: per-call time in CUDA"
    echo "graphs of 20 calls with pdl; FP8 on includes its prep kernel (the codes' e4m3 copy)."
    echo
    echo "| model | layer | N | K | M | INT8 path µs | FP8 µs | speedup off/on | × FP16 off | × FP16 on | plan (on) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    awk '$1 ~ /^LLaMA/ { plan = ""; for (i = 15; i <= NF; i++) plan = plan (i > 15 ? " " : "") $i }
         $1 == "fp8ab" { printf "| %s | %s | %s | %s | %s | %.2f | %.2f | %.3f | %.2f | %.2f | %s |\n",
                         $2, $3, $4, $5, $6, $9, $11, $9 / $11, $13 / $9, $13 / $11, plan }' "$log"
    echo
    sed -n '/^Summary/,$p' "$log"
} > "$out/fp8_ab.md"
cat "$out/fp8_ab.md"
