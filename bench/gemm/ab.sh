#!/bin/bash
# ab.sh BASE_BIN NEW_BIN [bench_gemm args...] -- on the GPU machine: a same-run A/B of two
# bench_gemm binaries (e.g. build-gemm-dev/bench_gemm and a build_variant.sh build), run
# alternately twice (base, new, base, new) with the same arguments (default: the 8 LLaMA-3
# shapes, 12.5 % INT8, M = 256, 2048, 8192). Prints, per case, both medians of each binary
# and the ratio new/base of their means, then the geomean ratio. Logs go to $LOGS (default
# $OUT, or ./out).
#   bash bench/gemm/ab.sh build-gemm-dev/bench_gemm build-gemm-dev/cwg3/bench_gemm --ms 2048
set -o pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: ab.sh BASE_BIN NEW_BIN [bench_gemm args...]" >&2; exit 2; }
base=$1 new=$2; shift 2
[ $# -gt 0 ] || set -- --shapes 8 --fracs 0.125 --ms 256,2048,8192
logs=${LOGS:-${OUT:-out}}
mkdir -p "$logs"
i=0
for bin in "$base" "$new" "$base" "$new"; do
    timeout 300 "$bin" "$@" > "$logs/ab_$i.log" 2>&1 || { echo "ab.sh: $bin failed:"; tail -5 "$logs/ab_$i.log"; exit 1; }
    i=$((i + 1))
done
bash bench/gemm/ab_table.sh "$logs"/ab_0.log "$logs"/ab_1.log "$logs"/ab_2.log "$logs"/ab_3.log
