#!/bin/bash
# ablate.sh — on the GPU machine: where the W4Ax GEMM's time goes. Runs bench_gemm with
# stages of the kernels left out (comet_cuda_w4ax_gemm.ablate; results are then wrong, only
# times matter) and prints one markdown table per regime. Logs go to $LOGS (default $OUT, or ./out).
#   prefill (wgmma kernel), LLaMA-3-8B shapes, M = 2048, 8192: 0 = full kernel, 1 = no
#     int32 -> fp32 promotion (the sums are XOR-folded so that the wgmma stay), 2 = no wgmma
#     (stand-in sums), 3 = neither, 4 = no activation-scale loads, 8 = half the token bytes,
#     16 = no token or weight copies (compute only), 17 = compute only without promotion,
#     32 = no int32 -> fp32 conversion, 64 = no scale product, 96 = neither of those two;
#   decode (the stream kernel, forced in every column: the automatic plan takes the pipe
#     kernel for all of these shapes, which has no ablations), LLaMA-3-8B shapes, M = 1, 16:
#     0 = full, 8 = no split-K reduction, 16 = no MMA/promotion (weights still streamed),
#     24 = neither.
# Plot of the prefill table: python3 bench/gemm/plot_ablate.py ABLATE.md docs/gemm_prefill_ablation.png
set -o pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-out}
bin=${BIN:-build-gemm-dev}
logs=${LOGS:-$out}
mkdir -p "$out" "$logs"
table() { # regime Ms "extra bench_gemm args" ablations...
    local regime=$1 ms=$2 extra=$3; shift 3
    echo "### $regime: µs (ratio vs the full kernel), 12.5 % INT8 blocks"
    echo
    local hdr="| shape | M |" sep="|---|---|"
    for a in "$@"; do hdr+=" ablate=$a |"; sep+="---|"; done
    echo "$hdr"; echo "$sep"
    for a in "$@"; do
        timeout 120 $bin/bench_gemm --shapes 4 --ms "$ms" --fracs 0.125 $extra --ablate "$a" > "$logs/ablate_${regime}_$a.log" 2>&1
    done
    awk '$1 ~ /^LLaMA/ {print $2, $5}' "$logs/ablate_${regime}_0.log" | while read -r layer m; do
        local row="| LLaMA-3-8B $layer | $m |" base=""
        for a in "$@"; do
            us=$(awk -v l="$layer" -v m="$m" '$1 ~ /LLaMA/ && $2 == l && $5 == m {print $7}' "$logs/ablate_${regime}_$a.log")
            [ -z "$base" ] && base=$us
            row+=" $us ($(awk -v u="$us" -v b="$base" 'BEGIN{printf "%.2f", u / b}')) |"
        done
        echo "$row"
    done
    echo
}
table prefill 2048,8192 "" 0 1 2 3 4 8 16 17 32 64 96
table decode 1,16 "--kernel 1" 0 8 16 24
