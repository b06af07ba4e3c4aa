#!/usr/bin/env bash
# check.sh — run THERE (the GPU machine), from the repo root, after the carried files are in
# place: build, test and benchmark comet on the GPU in one call, logs into $OUT (or gpu-out/),
# a summary last.
#
#   bash scripts/gpu/check.sh [stage ...]      stages, in order (default: all)
#     build   scripts/gpu/build.sh (unpack the carried .deb files, CMake + Ninja, sm_90a)
#     ops     ctest -L cuda (the GEMM, the backend and every step op against the CPU) and
#             compute-sanitizer memcheck on the step-op and attention tests; with
#             COMET_RACECHECK=1 also racecheck on their quick sets (COMET_CUDA_TEST_QUICK=1),
#             one process per test case; each sanitizer run stops after COMET_SANITIZER_TIMEOUT
#             seconds (default 1200; its summary line then says exit 124)
#
# The machine goes back 30 s after a call: chain the calls that carry the model parts
# without a pause, or its parts and build are gone.
#     model   join the carried model parts, quantize the W4AxKV4 checkpoint if missing (as
#             scripts/setup.sh does), the model-level GPU test (greedy tokens and perplexity
#             against the CPU), and comet generate / perplexity with --device cuda
#     tp      tensor parallelism: test_tp_cuda (one rank == one device bit for bit; two ranks
#             over NCCL where the machine has two GPUs), comet bench of synthetic
#             LLaMA-3-70B and -8B (and -8B FP16) with and without --tensor-parallel 1, the refusal of more
#             ranks than GPUs; tables into $OUT/tp_bench.md
#     bench   comet bench: the default model (FP16 and W4AxKV4) and synthetic LLaMA-3-8B
#             (W4AxKV4 and FP16; prefill of 512 and 4096 tokens, also with
#             COMET_CUDA_ATTN_MMA=0 and with COMET_CUDA_ATTN_PLAN_WAVES=0), tables into
#             $OUT/bench.md
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
BUILD="${COMET_BUILD_DIR:-build-gpu}"
BIN="$BUILD/comet"
export NCCL_NVLS_ENABLE=0
stages=("$@")
[ "${#stages[@]}" -gt 0 ] || stages=(build ops model tp bench)
summary=()
note() { summary+=("$*"); echo "== $*"; }
has() { for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# seconds each compute-sanitizer run may take; a device call runs 600 s at most, so a call
# that also builds passes a smaller one to get its summary back
SAN_T="${COMET_SANITIZER_TIMEOUT:-1200}"

if has build; then
    if bash scripts/gpu/build.sh >"$OUT/build.log" 2>&1; then
        note "build: ok ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    else
        tail -40 "$OUT/build.log"
        note "build: FAILED (build.log)"
        printf '%s\n' "${summary[@]}"
        exit 1
    fi
fi
[ -f scripts/gpu/env.sh ] && . scripts/gpu/env.sh

if has ops; then
    # the sanitizer runs go in the background, alongside ctest
    pids=() logs=()
    for t in test_step_ops_cuda test_attention_cuda test_attention_forms_cuda \
        test_attention_prefill_cuda; do
        command -v compute-sanitizer >/dev/null && [ -x "$BUILD/tests/cuda/$t" ] || continue
        log="$OUT/sanitizer_memcheck_$t.log"
        timeout "$SAN_T" compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/cuda/$t" \
            >"$log" 2>&1 &
        pids+=($!) logs+=("$log")
    done
    if command -v compute-sanitizer >/dev/null && [ -x "$BUILD/tests/test_backend_ops" ]; then
        log="$OUT/sanitizer_memcheck_test_backend_ops.log" # the op-test table's CUDA rows
        timeout "$SAN_T" compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$BUILD/tests/test_backend_ops" --cuda >"$log" 2>&1 &
        pids+=($!) logs+=("$log")
    fi
    if [ "${COMET_RACECHECK:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
        # racecheck on the quick set (COMET_CUDA_TEST_QUICK=1), one process per test case
        for tc in test_step_ops_cuda:test_op_table test_step_ops_cuda:test_act_ops \
            test_step_ops_cuda:test_matmul test_step_ops_cuda:test_norm_cluster_forms \
            test_attention_cuda:test_kv_codes_position0 \
            test_attention_cuda:test_attention_decode \
            test_attention_cuda:test_attention_batch_invariant \
            test_attention_forms_cuda:test_rope_attention_forms \
            test_attention_prefill_cuda:test_attention_prefill_chunks; do
            t=${tc%%:*} f=${tc#*:}
            log="$OUT/sanitizer_racecheck_$f.log"
            COMET_CUDA_TEST_QUICK=1 COMET_TEST_FILTER=$f timeout "$SAN_T" compute-sanitizer \
                --tool racecheck --error-exitcode 9 "$BUILD/tests/cuda/$t" >"$log" 2>&1 &
            pids+=($!) logs+=("$log")
        done
    fi
    ctest --test-dir "$BUILD" -L cuda --output-on-failure -E test_model_cuda \
        >"$OUT/ctest_cuda.log" 2>&1
    note "ctest -L cuda (ops): $(grep -E 'tests passed|tests failed' "$OUT/ctest_cuda.log" | tail -1)"
    grep -E "Failed|\*\*\*" "$OUT/ctest_cuda.log" | head -20
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}"
        note "compute-sanitizer $(basename "${logs[$i]}" .log): exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "${logs[$i]}" | tail -1); $(grep -E '^\[  (PASSED|FAILED)' "${logs[$i]}" | tail -1))"
    done
fi

. scripts/gpu/files.sh # MODEL, QMODEL, TEXTS: git-ignored, carried, not in the tree
if has model; then
    missing=()
    for f in "${TEXTS[@]}"; do [ -f "$f" ] || missing+=("$f"); done
    if [ "${#missing[@]}" -gt 0 ]; then
        note "model: NOT RUN, missing ${missing[*]} (carry them: test_model_cuda and perplexity" \
            "read the first, quantize the second)"
    else
        [ -f "$MODEL" ] || bash scripts/gpu/join_model.sh >"$OUT/join.log" 2>&1
        if [ -f "$MODEL" ] && [ ! -f "$QMODEL/config.json" ]; then
            "$BIN" quantize --model "$MODEL" --calib data/mobydick.txt --calib-windows 16 \
                --out "$QMODEL" >"$OUT/quantize.log" 2>&1
            note "quantize: exit $? ($(tail -1 "$OUT/quantize.log"))"
        fi
        ctest --test-dir "$BUILD" -R test_model_cuda --output-on-failure -V >"$OUT/model_test.log" 2>&1
        note "test_model_cuda: $(grep -E 'tests passed|tests failed' "$OUT/model_test.log" | tail -1)" \
            "$(grep -om1 'SKIP: .*' "$OUT/model_test.log" | sed 's/^/-- SKIPPED, /')"
        grep -E "^\s*[0-9]+: \[" "$OUT/model_test.log" | sed 's/^ *[0-9]*: //' | head -20
        P="What are three good reasons to learn a second language? Answer briefly."
        for m in "$MODEL" "$QMODEL"; do
            for dev in cpu cuda; do
                "$BIN" generate --model "$m" --device "$dev" --prompt "$P" --max-tokens 128 \
                    --seed 42 --stats >"$OUT/gen_$(basename "$m")_$dev.txt" 2>"$OUT/gen_$(basename "$m")_$dev.err"
                note "generate $(basename "$m") $dev: exit $? $(grep -o 'decode_tok_s=[0-9.]*' "$OUT/gen_$(basename "$m")_$dev.err")"
            done
            "$BIN" perplexity --model "$m" --device cuda --text data/austen/prideprejudice.txt \
                --ctx 512 --max-windows 16 >"$OUT/ppl_$(basename "$m").txt" 2>&1
            note "perplexity cuda $(basename "$m"): $(tail -1 "$OUT/ppl_$(basename "$m").txt")"
        done
    fi
fi

if has tp; then
    note "NCCL: $(grep -m1 "^COMET_NCCL_LIB" "$BUILD/CMakeCache.txt")"
    ctest --test-dir "$BUILD" -R test_tp_cuda --output-on-failure -V >"$OUT/tp_test.log" 2>&1
    note "test_tp_cuda: $(grep -E 'tests passed|tests failed' "$OUT/tp_test.log" | tail -1)"
    grep -E "tensor parallel|NOT RUN" "$OUT/tp_test.log" | sed 's/^ *[0-9]*: //'
    : >"$OUT/tp_bench.md"
    for args in "--synthetic llama3-70b" "--synthetic llama3-70b --tensor-parallel 1" \
        "--synthetic llama3-8b" "--synthetic llama3-8b --tensor-parallel 1" \
        "--synthetic llama3-8b --fp16" "--synthetic llama3-8b --fp16 --tensor-parallel 1"; do
        echo "\$ comet bench $args --device cuda --decode-tokens 128 --reps 3" >>"$OUT/tp_bench.md"
        # shellcheck disable=SC2086
        "$BIN" bench $args --device cuda --decode-tokens 128 --reps 3 >>"$OUT/tp_bench.md" 2>>"$OUT/tp_bench.err"
        note "bench $args: exit $?"
    done
    grep -E "^\| llama" "$OUT/tp_bench.md"
    "$BIN" bench --synthetic llama3-8b --device cuda --tensor-parallel 2 >"$OUT/tp_refuse.txt" 2>&1
    rc=$?
    note "bench --tensor-parallel 2 on $(nvidia-smi -L | wc -l) GPU(s): exit $rc ($(tail -1 "$OUT/tp_refuse.txt"))"
fi

if has bench; then
    : >"$OUT/bench.md"
    run_bench() {
        local env="${COMET_CUDA_ATTN_MMA:+COMET_CUDA_ATTN_MMA=$COMET_CUDA_ATTN_MMA }"
        env+="${COMET_CUDA_ATTN_PLAN_WAVES:+COMET_CUDA_ATTN_PLAN_WAVES=$COMET_CUDA_ATTN_PLAN_WAVES }"
        echo "\$ ${env}comet bench $*" >>"$OUT/bench.md"
        "$BIN" bench "$@" >>"$OUT/bench.md" 2>>"$OUT/bench.err"
        note "bench ${env}$*: exit $?"
        echo >>"$OUT/bench.md"
    }
    [ -f "$MODEL" ] && run_bench --model "$MODEL" --device cuda
    [ -f "$QMODEL/config.json" ] && run_bench --model "$QMODEL" --device cuda
    run_bench --synthetic llama3-8b --device cuda --decode-tokens 256
    run_bench --synthetic llama3-8b --fp16 --device cuda --decode-tokens 256
    # prefill attention on tensor cores (default) against the fp32 kernel, and the plan's
    # whole-wave splits against the fp32 grid's (COMET_CUDA_ATTN_PLAN_WAVES=0), same build
    for n in 512 4096; do
        run_bench --synthetic llama3-8b --device cuda --prompt-tokens "$n" --decode-tokens 16
        COMET_CUDA_ATTN_MMA=0 run_bench --synthetic llama3-8b --device cuda --prompt-tokens "$n" \
            --decode-tokens 16
        COMET_CUDA_ATTN_PLAN_WAVES=0 run_bench --synthetic llama3-8b --device cuda \
            --prompt-tokens "$n" --decode-tokens 16
    done
    grep -E "^\| (llama|Smol|smol|models)" "$OUT/bench.md"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$OUT/gpu.txt" 2>&1
echo
echo "==== summary ($(cat "$OUT/gpu.txt" 2>/dev/null))"
printf '%s\n' "${summary[@]}"
