#!/usr/bin/env bash
# serving_gpu.sh — issue 43's serving-throughput benchmark in one GPU call: comet W4AxKV4 and
# FP16 offline (`comet bench --throughput`), comet W4AxKV4 online (`comet serve` driven by
# bench/serve_load.py), and llama.cpp's CUDA build (bench/llamacpp_cuda.sh:
# llama-batched-bench, and llama-bench pp512/tg128) on the same LLaMA-3 shape, the same
# lengths and concurrencies, in one run; rows as JSON lines, a dated Markdown table and the
# plot, all in $OUT.
#
# Run THERE (the GPU machine), from the repo root:
#   bash bench/serving_gpu.sh [--model 8b|70b] [--lengths 128/128,1000/1000,2048/128]
#       [--concurrency 1,16,64,256] [--engines online,w4,fp16,llamacpp,llamabench[,ops]]
#       [--budget-s 540] [--min-requests 4] [--rates inf]
#
#   --model        the synthetic preset (llama3-8b or llama3-70b; default 8b); "tiny" (a
#                  2-layer GGUF for llama.cpp, with SERVE_ARGS for the online rows) tests this
#                  script on a CPU machine
#   --lengths      input/output token counts, comma-separated
#   --concurrency  sequences at once, comma-separated; "max" adds, per length, the most
#                  sequences the KV pool holds (comet: the online server's pool, sized from
#                  the GPU's memory, in whole pages per sequence, at most 1024 — the offline
#                  runs take it from the online rows, so put online first; llama.cpp: what its
#                  f16 KV fits, at most 256)
#   --engines      which to run, in this order: online (comet W4AxKV4 through `comet serve`,
#                  all requests at once), w4 (comet W4AxKV4 offline), fp16 (comet FP16
#                  offline; at 70B a "does not fit" row, not run: ~140 GB of FP16 weights),
#                  llamacpp (llama-batched-bench), llamabench (llama-bench -p 512 -n 128),
#                  ops (not by default: `comet bench --decode-batch B` at B in $OPS_BATCHES,
#                  default 1,64,256, W4AxKV4: one decode step's per-op table, in serving.log,
#                  its rows in ops.jsonl)
#   --budget-s     the whole script's time (default 540 s, inside a 10-minute call): a run
#                  is started only with at least 20 s left and is killed (timeout) at the
#                  budget; the runs not started get rows "skipped: time budget"
#   --min-requests N per run is max(C, this) (default 4): each run lasts seconds
#   --rates        the online runs' request rates, comma-separated: inf (all N at once) or
#                  requests/s of Poisson arrivals (default inf); C still caps what is in flight
#
# Choices: offline and online runs send N = max(C, --min-requests) requests of random token
# ids, all at once, greedy, ignoring EOS, so every request generates exactly the output length;
# comet's --max-seqs is C (offline) or the largest C (the one server of the online runs, 1024
# with "max"), --max-batch-tokens max(2048, C) in both;
# --gpu-memory-fraction $GPU_MEM_FRACTION (default 0.9) sizes comet's KV pool; llama.cpp runs
# with flash attention, all layers on the GPU, an f16 KV cache of max(C) * (I + O) tokens.
# Output tok/s is output tokens over the whole run's wall time (prefill included) for every
# engine; llama.cpp's own generation-only figure is kept in its rows as tg_tok_s.
#
# Needs: build-gpu/comet (built here with scripts/gpu/build.sh when missing: carry .deb, see
# that script), llama.cpp's tools (LLAMACPP_TAR / LLAMACPP_DIR / LLAMACPP_SRC, see
# bench/llamacpp_cuda.sh; only for the llamacpp and llamabench engines), python3 with numpy
# (the GGUF) and matplotlib (the plot; without it the PNG is skipped).
#
# Writes to $OUT (default ./gpu-out; at most 8 files come back from a call): serving.jsonl
# (the rows: SERVING_JSONL's, then this call's), serving.md (date, GPU,
# commit, commands, the table), serving.log (everything printed), serving_throughput.png,
# logs.tar.gz (the server's and the tools' raw outputs).
#
# Environment: OUT, COMET_BIN (default build-gpu/comet), COMET_COMMIT (the commit to name;
# default git rev-parse), GPU_MEM_FRACTION, SERVE_EXTRA (more
# `comet serve` arguments), SERVE_ARGS (instead of --synthetic ... --device cuda
# --gpu-memory-fraction F: another model or device, e.g. a CPU test), BENCH_ARGS (the same
# for the offline runs: instead of --synthetic ... [--fp16] --device cuda), BENCH_EXTRA (more
# `comet bench` arguments), OPS_BATCHES, SERVING_JSONL (rows of earlier calls, carried: copied into
# serving.jsonl first, so the table and the plot cover every call), LLAMACPP_*
# (bench/llamacpp_cuda.sh).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
T0=$SECONDS
STEP="start"
trap 'echo "serving_gpu.sh: FAILED in step: $STEP" >&2' ERR
die() { echo "serving_gpu.sh: $STEP: $*" >&2; exit 1; }

ARGS=("$@")
MODEL=8b
LENGTHS=128/128,1000/1000,2048/128
CONCS=1,16,64,256
ENGINES=online,w4,fp16,llamacpp,llamabench
BUDGET=540
MIN_REQ=4
RATES=inf
while [ $# -gt 0 ]; do
    case "$1" in --model|--lengths|--concurrency|--engines|--budget-s|--min-requests|--rates)
        [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;;
    esac
    case "$1" in
        --model) MODEL="${2:-}"; shift 2 ;;
        --lengths) LENGTHS="${2:-}"; shift 2 ;;
        --concurrency) CONCS="${2:-}"; shift 2 ;;
        --engines) ENGINES="${2:-}"; shift 2 ;;
        --budget-s) BUDGET="${2:-}"; shift 2 ;;
        --min-requests) MIN_REQ="${2:-}"; shift 2 ;;
        --rates) RATES="${2:-}"; shift 2 ;;
        -h|--help) sed -n '2,/^set -E/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
case "$MODEL" in
    8b|llama3-8b) MODEL=8b ;;
    70b|llama3-70b) MODEL=70b ;;
    tiny) ;;
    *) die "--model wants 8b or 70b, got '$MODEL'" ;;
esac
[[ "$BUDGET" =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 30 ] || die "--budget-s wants seconds >= 30, got '$BUDGET'"
[[ "$MIN_REQ" =~ ^[0-9]+$ ]] && [ "$MIN_REQ" -ge 1 ] || die "--min-requests wants a positive integer, got '$MIN_REQ'"
IFS=',' read -r -a LENS <<<"$LENGTHS"
IFS=',' read -r -a CS <<<"$CONCS"
IFS=',' read -r -a ENGS <<<"$ENGINES"
for l in "${LENS[@]}"; do
    [[ "$l" =~ ^[1-9][0-9]*/[1-9][0-9]*$ ]] || die "bad length '$l': expected IN/OUT, as 128/128"
done
for c in "${CS[@]}"; do
    [[ "$c" =~ ^[1-9][0-9]*$ || "$c" == max ]] || die "bad concurrency '$c': a positive integer or max"
    [ "$c" = max ] || [ "$c" -le 1024 ] || die "concurrency $c is over comet's --max-seqs limit of 1024"
done
IFS=',' read -r -a RS <<<"$RATES"
for r in "${RS[@]}"; do  # what serve_load.py takes: inf, or requests/s above 0
    [ "$r" = inf ] || { [[ "$r" =~ ^[0-9]*\.?[0-9]+$ ]] && awk "BEGIN { exit !($r > 0) }"; } \
        || die "bad rate '$r': inf or requests/s above 0"
done
for e in "${ENGS[@]}"; do
    case "$e" in w4|fp16|online|llamacpp|llamabench|ops) ;; *) die "unknown engine '$e': online, w4, fp16, llamacpp, llamabench, ops" ;; esac
done

OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
# everything printed also goes to $OUT/serving.log: the script runs again under tee, which
# it waits for (an exec > >(tee) could lose the log's end when the call returns)
if [ -z "${SERVING_GPU_TEED:-}" ]; then
    set +e
    trap - ERR
    SERVING_GPU_TEED=1 OUT="$OUT" bash "$0" "${ARGS[@]}" 2>&1 | tee -a "$OUT/serving.log"
    exit "${PIPESTATUS[0]}"
fi
WORKDIR=/tmp/comet-serving
LOGS="$WORKDIR/logs"
mkdir -p "$LOGS"
JSONL="$OUT/serving.jsonl"
if [ -n "${SERVING_JSONL:-}" ] && [ -f "$SERVING_JSONL" ] && [ "$SERVING_JSONL" != "$JSONL" ]; then
    cat "$SERVING_JSONL" >>"$JSONL"
fi
touch "$JSONL"
say() { printf '==> [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
left() { echo $((BUDGET - (SECONDS - T0))); }

COMET_BIN="${COMET_BIN:-build-gpu/comet}"
FRACTION="${GPU_MEM_FRACTION:-0.9}"
GPU_NAME="$( { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo unknown; } | head -1)"
GPU_MIB="$( { nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null || true; } | head -1 | tr -dc 0-9)"
# COMET_COMMIT names the tree when its copy has no .git of its own (the GPU machine's)
if [ -n "${COMET_COMMIT:-}" ]; then
    COMMIT="$COMET_COMMIT"
else
    COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"
fi
export GPU_NAME COMET_COMMIT="$COMMIT"
say "serving_gpu.sh on $GPU_NAME (${GPU_MIB:-?} MiB), commit $COMMIT: model $MODEL, lengths $LENGTHS, concurrency $CONCS, engines $ENGINES, budget ${BUDGET}s"

# one row for a run that did not run (engine variant mode in out C status note)
status_row() {
    python3 - "$JSONL" "$MODEL" "$GPU_NAME" "$COMMIT" "$@" <<'EOF'
import datetime, json, sys
path, model, gpu, commit, engine, variant, mode, il, ol, c, status, note = sys.argv[1:13]
r = {"engine": engine, "variant": variant, "mode": mode, "model": "llama3-" + model,
     "input_len": int(il), "output_len": int(ol), "concurrency": int(c) if c.isdigit() else c,
     "status": status, "note": note, "gpu": gpu, "commit": commit,
     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
with open(path, "a") as f:
    f.write(json.dumps(r, sort_keys=True) + "\n")
print("| %s %s %s | %s | %s/%s | %s | %s |" % (engine, variant, mode, r["model"], il, ol, c, status))
EOF
}

# ---- comet build -------------------------------------------------------------------------------
need_comet=0
for e in "${ENGS[@]}"; do case "$e" in w4|fp16|online|ops) need_comet=1 ;; esac; done
if [ "$need_comet" = 1 ] && [ ! -x "$COMET_BIN" ]; then
    STEP="build comet"
    say "building comet (scripts/gpu/build.sh, target comet)"
    COMET_TARGETS=comet bash scripts/gpu/build.sh >"$LOGS/build.log" 2>&1 ||
        { tail -30 "$LOGS/build.log"; die "the comet build failed"; }
    say "built $COMET_BIN"
fi

# the most sequences of a length comet's pool holds, from the online server's pool (pages of 16)
comet_max() { # in out
    python3 - "$JSONL" "$MODEL" "$1" "$2" <<'EOF'
import json, sys
path, model, il, ol = sys.argv[1], "llama3-" + sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cap = None
for line in open(path):
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("engine") == "comet" and r.get("mode") == "online" and r.get("model") == model \
            and r.get("kv_pool_tokens") and r.get("variant") != "FP16":
        cap = int(r["kv_pool_tokens"])
if cap:
    seq_pages = (il + ol + 15) // 16
    print(max(1, min(1024, cap // 16 // seq_pages)))
EOF
}

# the concurrency list of one length for comet, "max" resolved (empty when it cannot be)
comet_concs() { # in out
    local c out=()
    for c in "${CS[@]}"; do
        if [ "$c" = max ]; then
            c="$(comet_max "$1" "$2")"
            [ -n "$c" ] && [ "$c" -gt 0 ] || { say "max sequences at $1/$2 unknown (no online row with kv_pool_tokens: run online first)" >&2; continue; }
        fi
        out+=("$c")
    done
    printf '%s\n' "${out[@]}" | sort -n -u
}

# gpu_watch_start / gpu_watch_stop: the GPU memory in use at a run's peak (comet bench's
# own device_used_peak, when it reports one, wins)
. "$ROOT/bench/gpu_watch.sh"

# ---- comet offline -------------------------------------------------------------------------------
run_offline() { # variant (W4AxKV4 | FP16)
    local variant="$1" flag=() l il ol c
    [ "$variant" = FP16 ] && flag=(--fp16)
    # a comet bench that sizes its pool from memory takes the same fraction as the server
    if "$COMET_BIN" bench --help 2>&1 | grep -q -- --gpu-memory-fraction; then
        flag+=(--gpu-memory-fraction "$FRACTION")
    fi
    for l in "${LENS[@]}"; do
        il="${l%/*}" ol="${l#*/}"
        if [ "$variant" = FP16 ] && [ "$MODEL" = 70b ]; then
            for c in "${CS[@]}"; do
                status_row comet FP16 offline "$il" "$ol" "$c" "does not fit" \
                    "70B in FP16 is ~141 GB of weights: more than one GPU holds"
            done
            continue
        fi
        while read -r c; do
            [ -n "$c" ] || continue
            local n=$(( c > MIN_REQ ? c : MIN_REQ ))
            if [ "$(left)" -lt 20 ]; then
                status_row comet "$variant" offline "$il" "$ol" "$c" "skipped: time budget" ""
                continue
            fi
            local tmp="$WORKDIR/offline.jsonl"
            rm -f "$tmp"
            local what=(--synthetic "llama3-$MODEL" "${flag[@]}" --device cuda)
            [ -z "${BENCH_ARGS:-}" ] || read -r -a what <<<"$BENCH_ARGS"
            local cmd=("$COMET_BIN" bench "${what[@]}" --throughput --input-len "$il" --output-len "$ol" --requests "$n"
                       --max-seqs "$c" --json "$tmp"
                       ${BENCH_EXTRA:-})
            STEP="comet offline $variant $l C=$c"
            say "${cmd[*]}"
            local rc=0 log="$LOGS/offline-$variant-$il-$ol-$c.log" peak
            gpu_watch_start "$log.smi"
            timeout "$(left)" "${cmd[@]}" >"$log" 2>&1 || rc=$?
            peak="$(gpu_watch_stop "$log.smi")"
            tail -n 3 "$log"
            if [ "$rc" -ne 0 ] || [ ! -s "$tmp" ]; then
                local st="failed (exit $rc)"
                [ "$rc" -eq 124 ] && st="timed out"
                status_row comet "$variant" offline "$il" "$ol" "$c" "$st" "$(tail -n 2 "$log" | tr '\n' ' ' | cut -c1-300)"
                continue
            fi
            python3 - "$tmp" "$JSONL" "$variant" "$MODEL" "$il" "$ol" "$c" "$n" "$GPU_NAME" "$COMMIT" \
                "comet ${cmd[*]:1}" "${peak:-}" <<'EOF'
import datetime, json, sys
src, dst, variant, model, il, ol, c, n, gpu, commit, cmd, peak = sys.argv[1:13]
with open(dst, "a") as f:
    for line in open(src):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        # the fields every row shares; comet bench's own values win where it has them
        for k, v in (("engine", "comet"), ("mode", "offline"), ("variant", variant),
                     ("model", "llama3-" + model), ("input_len", int(il)), ("output_len", int(ol)),
                     ("concurrency", int(c)), ("requests", int(n)), ("rate", "inf"),
                     ("status", "ok"), ("gpu", gpu), ("commit", commit), ("command", cmd),
                     ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))):
            r.setdefault(k, v)
        # one model name for every engine's rows (comet bench writes the model's own name)
        r["model_name"] = r.get("model")
        r["engine"], r["mode"], r["variant"] = "comet", "offline", variant
        r["model"] = "llama3-" + model
        # comet bench's names for the shared fields
        if r.get("mean_batch") is None and r.get("mean_batch_seqs") is not None:
            r["mean_batch"] = r["mean_batch_seqs"]
        if r.get("device_used_peak") is None and r.get("device_used_peak_bytes") is not None:
            r["device_used_peak"] = r["device_used_peak_bytes"]
        if peak and r.get("device_used_peak") is None:
            r["device_used_peak"] = int(peak)
        f.write(json.dumps(r, sort_keys=True) + "\n")
        print("| comet %s offline | %s | %s/%s | %s | out %s tok/s | total %s tok/s | mean batch %s | KV %s tokens |" % (
            variant, r["model"], il, ol, c, r.get("output_tok_s"), r.get("total_tok_s"),
            r.get("mean_batch"), r.get("kv_pool_tokens")))
EOF
        done < <(comet_concs "$il" "$ol")
    done
}

# ---- comet online --------------------------------------------------------------------------------
run_online() {
    local l c top=1
    for c in "${CS[@]}"; do
        if [ "$c" = max ]; then top=1024; elif [ "$c" -gt "$top" ]; then top="$c"; fi
    done
    if [ "$(left)" -lt 30 ]; then
        for l in "${LENS[@]}"; do
            for c in "${CS[@]}"; do status_row comet W4AxKV4 online "${l%/*}" "${l#*/}" "$c" "skipped: time budget" ""; done
        done
        return
    fi
    STEP="comet online"
    local concs="$CONCS" mbt=$(( top > 2048 ? top : 2048 ))
    # tokens a step as comet bench --throughput's default, max(2048, C): the same batches
    local serve="--synthetic llama3-$MODEL --device cuda --max-seqs $top --max-batch-tokens $mbt --gpu-memory-fraction $FRACTION --max-waiting 4096 ${SERVE_EXTRA:-}"
    [ -z "${SERVE_ARGS:-}" ] || serve="$SERVE_ARGS --max-seqs $top --max-batch-tokens $mbt --max-waiting 4096"
    say "online: comet serve $serve; lengths $LENGTHS, concurrency $concs"
    local rc=0
    timeout -k 20 "$(left)" python3 bench/serve_load.py --comet "$COMET_BIN" --serve="$serve" \
        --serve-log "$LOGS/serve.log" --lengths "$LENGTHS" --concurrency "$concs" --rates "$RATES" --max-concurrency "$top" \
        --min-requests "$MIN_REQ" --deadline-s "$(( $(left) - 20 ))" --json "$JSONL" \
        --tag "model=llama3-$MODEL" --tag variant=W4AxKV4 --tag "gpu=$GPU_NAME" \
        --tag "commit=$COMMIT" || rc=$?
    [ "$rc" -eq 0 ] || say "online: serve_load.py exited $rc (the rows it wrote are kept; server log in logs.tar.gz)"
}

# ---- llama.cpp --------------------------------------------------------------------------------
run_llamacpp() { # batched | bench
    if [ "$(left)" -lt 30 ]; then
        say "llama.cpp $1: skipped: time budget"
        if [ "$1" = batched ]; then
            for l in "${LENS[@]}"; do
                for c in "${CS[@]}"; do status_row llama.cpp Q4_0 batched "${l%/*}" "${l#*/}" "$c" "skipped: time budget" ""; done
            done
        fi
        return
    fi
    STEP="llama.cpp $1"
    local rc=0
    LLAMACPP_JSON="$JSONL" LLAMACPP_LOG_DIR="$LOGS" LLAMACPP_TIMEOUT_S="$(( $(left) - 10 ))" \
        LLAMACPP_DEADLINE="$(( $(date +%s) + $(left) - 10 ))" \
        timeout "$(left)" bash bench/llamacpp_cuda.sh "$1" "$MODEL" \
        $([ "$1" = batched ] && echo "$LENGTHS $CONCS") || rc=$?
    [ "$rc" -eq 0 ] || say "llama.cpp $1: exited $rc"
}

# ---- per-op tables of one decode step ----------------------------------------------------------
run_ops() {
    local b
    IFS=',' read -r -a bs <<<"${OPS_BATCHES:-1,64,256}"
    for b in "${bs[@]}"; do
        [[ "$b" =~ ^[1-9][0-9]*$ ]] || die "bad OPS_BATCHES entry '$b'"
        if [ "$(left)" -lt 20 ]; then
            say "ops: decode batch $b skipped: time budget"
            continue
        fi
        local what=(--synthetic "llama3-$MODEL" --device cuda)
        [ -z "${BENCH_ARGS:-}" ] || read -r -a what <<<"$BENCH_ARGS"
        local cmd=("$COMET_BIN" bench "${what[@]}" --decode-batch "$b" --reps 3 --json "$OUT/ops.jsonl")
        STEP="ops B=$b"
        say "${cmd[*]}"
        local rc=0
        timeout "$(left)" "${cmd[@]}" 2>&1 || rc=$?
        [ "$rc" -eq 0 ] || say "ops: decode batch $b: exit $rc"
    done
}

for e in "${ENGS[@]}"; do
    case "$e" in
        ops) run_ops ;;
        w4) run_offline W4AxKV4 ;;
        fp16) run_offline FP16 ;;
        online) run_online ;;
        llamacpp) run_llamacpp batched ;;
        llamabench) run_llamacpp bench ;;
    esac
done

# ---- the report --------------------------------------------------------------------------------
STEP="report"
say "report: $OUT/serving.md"
date_s="$(date -u '+%Y-%m-%d %H:%M UTC')"
python3 bench/plot_serving.py "$JSONL" --md "$OUT/serving.md" \
    --title "Serving throughput, $GPU_NAME, LLaMA-3 shapes ($(date -u +%Y-%m-%d))" \
    --meta "date: $date_s" --meta "GPU: $GPU_NAME (${GPU_MIB:-?} MiB)" --meta "commit: $COMMIT" \
    --meta "command: bash bench/serving_gpu.sh --model $MODEL --lengths $LENGTHS --concurrency $CONCS --engines $ENGINES --budget-s $BUDGET --min-requests $MIN_REQ --rates $RATES" \
    --meta "comet: synthetic random weights (W4AxKV4, or FP16), --gpu-memory-fraction $FRACTION; llama.cpp: random Q4_0 GGUF of the same shape (bench/make_q4_0_gguf.py; output.weight Q6_K), f16 KV, flash attention" \
    --meta "N = max(C, $MIN_REQ) requests a run, all at once, random token-id prompts, greedy, EOS ignored; output tok/s = output tokens / wall time including prefill, every engine" ||
    say "report: plot_serving.py --md failed"
if python3 -c 'import matplotlib' 2>/dev/null; then
    python3 bench/plot_serving.py "$JSONL" --png "$OUT/serving_throughput.png" \
        --title "Output tok/s, $GPU_NAME ($(date -u +%Y-%m-%d), $COMMIT)" || say "report: the plot failed"
else
    say "report: no matplotlib here: run bench/plot_serving.py on serving.jsonl elsewhere"
fi
tar -C "$WORKDIR" -czf "$OUT/logs.tar.gz" logs 2>/dev/null || true
say "done in $((SECONDS - T0)) s; in $OUT: $(ls "$OUT" | tr "\n" " ")"
