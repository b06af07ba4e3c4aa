#!/bin/bash
# run.sh [OUT.md] — the attention benchmark of issue 41 on the GPU machine, end to end: comet's
# paged attention (bench_attention, built beforehand by scripts/gpu/build.sh: this script
# builds nothing) and PyTorch's scaled_dot_product_attention (sdpa_torch.py, the image's
# python3) on the same GPU, one after the other, then one Markdown report (table.py) with the
# date, GPU, commit and commands: decode at L 1K / 8K / 32K and B 1 / 16 / 64 / 256, prefill
# at T 512 / 2K / 8K, comet INT4 (groups of 16 and 128 channels; int4/16 decode also on the fp32
# decode kernel, int4/16-fp32dec, the A/B of the tensor-core one; int4/16 prefill also on the
# first tensor-core prefill kernel, int4/16-mma1, and on the pipelined one, int4/16-mma2, the
# A/Bs of the default: on sm_90 the two-CTAs-an-SM kernel where its CTAs outnumber the SMs)
# and FP16 KV against torch FP16.
#
# OUT.md defaults to $OUT/attention.md ($OUT, else ./out); the JSON lines and the logs of both
# runs go beside it (attention_comet.jsonl / .log, attention_torch.jsonl / .log).
# Environment:
#   COMET_BUILD_DIR  the CMake build holding bench/bench_attention (default build-gpu)
#   BENCH_ARGS       arguments for both programs (--model 70b, --ctx, --batch, --prefill,
#                    --peak-gbs, --peak-tflops, --reps)
#   COMET_ARGS       arguments for bench_attention only (--kv, --page, --rotate, --splits,
#                    --mixed B:L:T: steps of B decodes and one prefill chunk)
#   TORCH_ARGS       arguments for sdpa_torch.py only (--decode-gqa, --math)
#   COMET_COMMIT     the commit to name when this tree has no .git (default: git rev-parse)
#   PYTHON           the Python with torch (default python3)
# Exit status: 0 when both programs exited 0, else the first nonzero one (the report is
# written either way, with whatever rows came back).
set -u -o pipefail
cd "$(dirname "$0")/../.." || exit 2
build=${COMET_BUILD_DIR:-build-gpu}
bin=$build/bench/bench_attention
md=${1:-${OUT:-out}/attention.md}
dir=$(dirname "$md")
py=${PYTHON:-python3}
mkdir -p "$dir" || { echo "run.sh: cannot create $dir" >&2; exit 2; }
if [ ! -x "$bin" ]; then
    echo "run.sh: $bin not found: build it first (bash scripts/gpu/build.sh, or" \
         "COMET_TARGETS=bench_attention bash scripts/gpu/build.sh)" >&2
    exit 2
fi
commit=${COMET_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
if [ -z "${COMET_COMMIT:-}" ] && ! git diff --quiet HEAD -- src bench 2>/dev/null; then
    commit="$commit (+ uncommitted changes, or no git here)"
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem \
    --format=csv > "$dir/attention_env.txt" 2>&1 || true

c_cmd="$bin ${BENCH_ARGS:-} ${COMET_ARGS:-}"
t_cmd="$py bench/attention/sdpa_torch.py ${BENCH_ARGS:-} ${TORCH_ARGS:-}"
start=$(date +%s)
echo "==== $c_cmd" >&2
# shellcheck disable=SC2086
timeout 400 $c_cmd > "$dir/attention_comet.jsonl" 2> "$dir/attention_comet.log"
c_rc=$?
tail -n 80 "$dir/attention_comet.log" >&2
echo "==== $t_cmd" >&2
# shellcheck disable=SC2086
timeout 400 $t_cmd > "$dir/attention_torch.jsonl" 2> "$dir/attention_torch.log"
t_rc=$?
grep -v "Warning\|warn(" "$dir/attention_torch.log" | tail -n 60 >&2
echo "==== both ran in $(( $(date +%s) - start )) s (exit status: comet $c_rc, torch $t_rc)" >&2

"$py" bench/attention/table.py --comet "$dir/attention_comet.jsonl" \
    --torch "$dir/attention_torch.jsonl" --out "$md" --commit "$commit" \
    --cmd "$c_cmd" --cmd "$t_cmd" --comet-rc "$c_rc" --torch-rc "$t_rc" ||
    { echo "run.sh: table.py failed" >&2; exit 2; }
echo "run.sh: wrote $md" >&2
[ "$c_rc" -ne 0 ] && exit "$c_rc"
exit "$t_rc"
