#!/usr/bin/env bash
# llamacpp_cuda.sh — llama.cpp's CUDA build as the peer in comet's GPU benchmarks: its tools
# made available on the GPU machine, random-weight Q4_0 GGUFs of the LLaMA-3-8B and -70B
# shapes, and the runs of issue 41 (llama-bench pp512/tg128) and issue 43
# (llama-batched-bench over lengths and parallel sequence counts), parsed into the JSON rows
# the serving benchmarks share (bench/llamacpp_rows.py). Nothing of llama.cpp is ever written
# into the repository: its files live in $LLAMACPP_WORK (default /tmp/comet-llamacpp).
#
# Subcommands:
#   here (a machine with the llama.cpp build and source; nothing travels over 64 MiB):
#     pack [BUILD_DIR] [TAR]   bin/llama-bench, bin/llama-batched-bench, the shared libraries
#                              (bin/*.so*) and the gguf-py folder of the source the build
#                              came from, into TAR (default .gpu-carry/llamacpp-cuda.tar.gz;
#                              BUILD_DIR default ~/.cache/comet-llamacpp/0.3.36/build-cuda).
#     pack-src [SRC] [TAR]     the llama.cpp source (SRC: the vendored tree, or the
#                              llama-cpp-python sdist .tar.gz; default
#                              ~/.cache/comet-llamacpp/0.3.36/src, else that cache's sdist,
#                              downloaded from PyPI when missing) without models/, docs/ and
#                              other parts no build needs, into TAR (default
#                              .gpu-carry/llamacpp-src.tar.gz, about 10 MB): the sdist itself
#                              (76 MB) is over a call's 64 MiB.
#   there (the GPU machine; each prints progress to stderr):
#     setup                    makes llama-bench and llama-batched-bench runnable and prints
#                              the bin folder. In order: $LLAMACPP_DIR (a folder with bin/ and
#                              the .so files), $LLAMACPP_TAR (a `pack` tarball, unpacked into
#                              $LLAMACPP_WORK/prebuilt), an earlier setup's folder, or a build
#                              of $LLAMACPP_SRC (a `pack-src` tarball or the sdist) with
#                              -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF,
#                              targets llama-bench llama-batched-bench, all cores, into
#                              $LLAMACPP_WORK/build-cuda (minutes: ggml-cuda is large).
#     gguf 8b|70b|tiny         writes llama3-<M>-q4_0.gguf (kept when present) with
#                              bench/make_q4_0_gguf.py into $LLAMACPP_MODELS, else /dev/shm
#                              when it has room (RAM: 40 GB at memory speed), else
#                              $LLAMACPP_WORK/models; prints its path.
#     bench 8b|70b             llama-bench -p 512 -n 128 -fa 1 -ngl 99 -r 3 -o json (issue 41).
#     batched 8b|70b [LENGTHS] [PARALLELS]
#                              llama-batched-bench -fa 1 -ngl 99 -npp PP -ntg TG -npl ... -c
#                              max(npl)*(PP+TG), one run per length pair over the parallel
#                              counts whose f16 KV cache fits the GPU (the others get a row
#                              with status "does not fit"). LENGTHS: comma-separated PP/TG
#                              (default 128/128,1000/1000,2048/128); PARALLELS: comma-separated
#                              counts, "max" for the most that fit, at most llama.cpp's 256
#                              (default 1,16,64,256).
#     all [8b|70b]             setup, gguf, bench, batched with the defaults.
#
# Rows (JSON lines) are appended to $LLAMACPP_JSON (default $OUT/serving.jsonl, or
# ./llamacpp.jsonl without OUT), Markdown lines go to stdout, raw outputs to
# $LLAMACPP_LOG_DIR/llamacpp-*.txt (default $OUT, else $LLAMACPP_WORK/logs).
#
# Each batched row carries device_used_peak: the GPU memory in use at its run's peak
# (nvidia-smi, every 250 ms; one number for the rows of one llama-batched-bench run).
#
# Fit: weights (the GGUF's size) + KV (c * n_layer * 2 * 1024 * 2 bytes: K and V, 8 KV heads
# of 128, f16) + LLAMACPP_RESERVE_MIB (default 4096: compute buffers, CUDA context) must be at
# most 95% of the GPU's memory (nvidia-smi). LLAMACPP_TIMEOUT_S bounds each run (default 540 s)
# with `timeout`, and LLAMACPP_DEADLINE (seconds since the epoch) the batched runs together:
# each gets at most what is left, none starts with less than 15 s; a run cut off leaves rows
# with status "timed out", one not started "skipped: time budget".
#
# Environment: LLAMACPP_DIR, LLAMACPP_TAR, LLAMACPP_SRC, LLAMACPP_WORK, LLAMACPP_MODELS,
#   LLAMACPP_JSON, LLAMACPP_LOG_DIR, LLAMACPP_DEADLINE,
#   LLAMACPP_TIMEOUT_S, LLAMACPP_RESERVE_MIB, LLAMACPP_GPU_MIB (the GPU's memory, instead of
#   asking nvidia-smi), GGUF_PY (a gguf-py folder), OUT, and the tags written into each row:
#   GPU_NAME, COMET_COMMIT.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${LLAMACPP_WORK:-/tmp/comet-llamacpp}"
STEP="start"
trap 'echo "llamacpp_cuda.sh: FAILED in step: $STEP" >&2' ERR
die() { echo "llamacpp_cuda.sh: $STEP: $*" >&2; exit 1; }
say() { printf '==> [llama.cpp %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

TOOLS=(llama-bench llama-batched-bench)
MAX_SEQ=256  # llama.cpp's LLAMA_MAX_SEQ: a context holds at most 256 sequences
LCP_VERSION=0.3.36 # the llama-cpp-python release whose vendored llama.cpp is measured
CACHE="${COMET_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/comet-llamacpp}" # cpu_e2e.sh's
DEFAULT_BUILD="$CACHE/$LCP_VERSION/build-cuda"
DEFAULT_SRC="$CACHE/$LCP_VERSION/src"
# source parts no build of the two tools needs (models/ alone is 75 MB)
SRC_EXCLUDES=(models docs media benches tests tools/server/public tools/server/webui
              examples/llama.android examples/llama.swiftui gguf-py/tests .github)

model_shape() { # n_layer of a model name
    case "$1" in
        8b) echo 32 ;;
        70b) echo 80 ;;
        tiny) echo 2 ;;
        *) die "unknown model '$1': expected 8b, 70b (or tiny, for tests)" ;;
    esac
}

json_out() {
    if [ -n "${LLAMACPP_JSON:-}" ]; then echo "$LLAMACPP_JSON"
    elif [ -n "${OUT:-}" ]; then echo "$OUT/serving.jsonl"
    else echo "$PWD/llamacpp.jsonl"; fi
}
log_dir() {
    local d="${LLAMACPP_LOG_DIR:-${OUT:-$WORK/logs}}"
    mkdir -p "$d"
    echo "$d"
}

# ---- here: pack ------------------------------------------------------------------------------
cmd_pack() {
    STEP="pack"
    local build="${1:-$DEFAULT_BUILD}" tar="${2:-$ROOT/.gpu-carry/llamacpp-cuda.tar.gz}"
    for t in "${TOOLS[@]}"; do
        [ -x "$build/bin/$t" ] || die "$build/bin/$t missing: build it (cmake --build $build --target ${TOOLS[*]})"
    done
    local src
    src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
    [ -d "$src/gguf-py/gguf" ] || die "no gguf-py beside the build's source ($src)"
    local stage
    stage="$(mktemp -d)"
    mkdir -p "$stage/llamacpp/bin"
    cp -a "$build/bin/llama-bench" "$build/bin/llama-batched-bench" "$stage/llamacpp/bin/"
    cp -a "$build"/bin/*.so* "$stage/llamacpp/bin/" 2>/dev/null || true
    cp -a "$src/gguf-py" "$stage/llamacpp/gguf-py"
    rm -rf "$stage/llamacpp/gguf-py/tests"
    mkdir -p "$(dirname "$tar")"
    tar -C "$stage" -czf "$tar" llamacpp
    rm -rf "$stage"
    say "packed $(du -h "$tar" | cut -f1) into $tar (carry its folder; there: LLAMACPP_TAR=$tar)"
}

cmd_pack_src() {
    STEP="pack-src"
    local src="${1:-$DEFAULT_SRC}" tar="${2:-$ROOT/.gpu-carry/llamacpp-src.tar.gz}"
    local stage
    if [ -z "${1:-}" ] && [ ! -e "$src" ]; then # the sdist, in the cache cpu_e2e.sh shares
        src="$CACHE/sdist/llama_cpp_python-$LCP_VERSION.tar.gz"
        if [ ! -s "$src" ]; then
            say "pip download --no-deps --no-binary :all: llama-cpp-python==$LCP_VERSION"
            python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
                -d "$CACHE/sdist" "llama-cpp-python==$LCP_VERSION" >&2 ||
                die "pip download llama-cpp-python==$LCP_VERSION failed"
        fi
    fi
    stage="$(mktemp -d)"
    if [ -f "$src" ]; then
        tar -xzf "$src" -C "$stage" --wildcards '*/vendor/llama.cpp' ||
            die "$src holds no vendor/llama.cpp (not a llama-cpp-python sdist?)"
        mv "$stage"/*/vendor/llama.cpp "$stage/llama.cpp"
    else
        [ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || die "$src is no llama.cpp source tree"
        cp -a "$src" "$stage/llama.cpp"
    fi
    for e in "${SRC_EXCLUDES[@]}"; do rm -rf "${stage:?}/llama.cpp/$e"; done
    mkdir -p "$(dirname "$tar")"
    tar -C "$stage" -czf "$tar" llama.cpp
    rm -rf "$stage"
    say "packed the source, $(du -h "$tar" | cut -f1), into $tar (there: LLAMACPP_SRC=$tar)"
}

# ---- there: setup ----------------------------------------------------------------------------
usable() { # a folder whose bin/ runs both tools
    local d="$1"
    for t in "${TOOLS[@]}"; do [ -x "$d/bin/$t" ] || return 1; done
    return 0
}

check_libs() {
    local bin="$1" missing
    missing="$(LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin/llama-batched-bench" 2>/dev/null |
               grep 'not found' || true)"
    [ -z "$missing" ] || die "$bin/llama-batched-bench needs libraries this machine lacks: $missing"
}

build_from_src() {
    STEP="build"
    local src_tar="$1" dir="$WORK/src"
    command -v cmake >/dev/null || die "cmake not found"
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found"
    command -v nvcc >/dev/null || export PATH="$PATH:/usr/local/cuda/bin"
    if [ ! -f "$dir/CMakeLists.txt" ]; then
        rm -rf "$dir" "$WORK/unpack" && mkdir -p "$WORK/unpack"
        if tar -tzf "$src_tar" llama.cpp/CMakeLists.txt >/dev/null 2>&1; then
            tar -xzf "$src_tar" -C "$WORK/unpack"
            mv "$WORK/unpack/llama.cpp" "$dir"
        else
            tar -xzf "$src_tar" -C "$WORK/unpack" --wildcards '*/vendor/llama.cpp' ||
                die "$src_tar is neither a pack-src tarball nor a llama-cpp-python sdist"
            mv "$WORK/unpack"/*/vendor/llama.cpp "$dir"
        fi
        rm -rf "$WORK/unpack"
    fi
    say "building ${TOOLS[*]} with CUDA (sm_90) in $WORK/build-cuda, $(nproc) jobs"
    local t0=$SECONDS gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$dir" -B "$WORK/build-cuda" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_OPENSSL=OFF >"$WORK/cmake.log" 2>&1 ||
        { tail -20 "$WORK/cmake.log" >&2; die "cmake configure failed ($WORK/cmake.log)"; }
    cmake --build "$WORK/build-cuda" -j "$(nproc)" --target "${TOOLS[@]}" >"$WORK/build.log" 2>&1 ||
        { tail -30 "$WORK/build.log" >&2; die "the build failed ($WORK/build.log)"; }
    say "built in $((SECONDS - t0)) s"
}

# prints the folder holding bin/; sets GGUF_PY when it finds one
setup_dir() {
    STEP="setup"
    mkdir -p "$WORK"
    local d=""
    if [ -n "${LLAMACPP_DIR:-}" ]; then
        usable "$LLAMACPP_DIR" || die "LLAMACPP_DIR=$LLAMACPP_DIR has no bin/${TOOLS[0]} and bin/${TOOLS[1]}"
        d="$LLAMACPP_DIR"
    elif [ -n "${LLAMACPP_TAR:-}" ]; then
        [ -f "$LLAMACPP_TAR" ] || die "LLAMACPP_TAR=$LLAMACPP_TAR is no file"
        if ! usable "$WORK/prebuilt/llamacpp"; then
            rm -rf "$WORK/prebuilt" && mkdir -p "$WORK/prebuilt"
            tar -xzf "$LLAMACPP_TAR" -C "$WORK/prebuilt" || die "cannot unpack $LLAMACPP_TAR"
        fi
        usable "$WORK/prebuilt/llamacpp" || die "$LLAMACPP_TAR holds no llamacpp/bin/${TOOLS[*]} (make it with: llamacpp_cuda.sh pack)"
        d="$WORK/prebuilt/llamacpp"
    elif usable "$WORK/prebuilt/llamacpp"; then
        d="$WORK/prebuilt/llamacpp"
    elif usable "$WORK/build-cuda"; then
        d="$WORK/build-cuda"
    elif [ -n "${LLAMACPP_SRC:-}" ]; then
        [ -f "$LLAMACPP_SRC" ] || die "LLAMACPP_SRC=$LLAMACPP_SRC is no file"
        build_from_src "$LLAMACPP_SRC"
        d="$WORK/build-cuda"
    elif usable "$DEFAULT_BUILD"; then
        d="$DEFAULT_BUILD"
    else
        die "no llama.cpp build: set LLAMACPP_DIR (a folder with bin/), LLAMACPP_TAR (from 'pack') or LLAMACPP_SRC (from 'pack-src', or the sdist)"
    fi
    check_libs "$d/bin"
    echo "$d"
}

find_gguf_py() {
    local d="$1" c
    for c in "${GGUF_PY:-}" "$d/gguf-py" "$WORK/src/gguf-py" "$(dirname "$d")/src/gguf-py" \
             "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$d/CMakeCache.txt" 2>/dev/null)/gguf-py"; do
        [ -n "$c" ] && [ -d "$c/gguf" ] && { echo "$c"; return 0; }
    done
    return 1
}

# ---- there: the GGUF ---------------------------------------------------------------------------
# Where the GGUFs go: $LLAMACPP_MODELS, else /dev/shm (RAM: the 70B file's 40 GB are written at
# memory speed, not the disk's) when it has room for the file and 8 GiB to spare, else
# $LLAMACPP_WORK/models.
models_dir() { # model
    local need_gb
    case "$1" in 8b) need_gb=5 ;; 70b) need_gb=40 ;; *) need_gb=1 ;; esac
    if [ -n "${LLAMACPP_MODELS:-}" ]; then echo "$LLAMACPP_MODELS"; return; fi
    local shm_kb
    shm_kb="$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')"
    if [ -n "$shm_kb" ] && [ "$shm_kb" -gt $(( (need_gb + 8) * 1024 * 1024 )) ]; then
        echo /dev/shm/comet-llamacpp
    else
        echo "$WORK/models"
    fi
}

cmd_gguf() {
    STEP="gguf"
    local m="${1:-}" d gp
    model_shape "$m" >/dev/null
    d="$(setup_dir)"
    local name="llama3-$m-q4_0.gguf" f
    [ "$m" = tiny ] && name="tiny-q4_0.gguf"
    for f in "${LLAMACPP_MODELS:-/nonexistent}/$name" "/dev/shm/comet-llamacpp/$name" "$WORK/models/$name"; do
        if [ -s "$f" ]; then
            say "GGUF $f exists ($(du -h "$f" | cut -f1))"
            echo "$f"
            return 0
        fi
    done
    f="$(models_dir "$m")/$name"
    mkdir -p "$(dirname "$f")"
    local pp=""
    if ! python3 -c 'import gguf' 2>/dev/null; then
        gp="$(find_gguf_py "$d")" || die "no gguf package and no gguf-py folder (set GGUF_PY)"
        pp="$gp"
    fi
    local preset="llama3-$m"
    [ "$m" = tiny ] && preset=tiny
    say "writing $f (random Q4_0, $preset)"
    PYTHONPATH="$pp${PYTHONPATH:+:$PYTHONPATH}" python3 "$ROOT/bench/make_q4_0_gguf.py" \
        --preset "$preset" -o "$f.part" --force || { rm -f "$f.part"; die "make_q4_0_gguf.py failed"; }
    mv "$f.part" "$f"
    echo "$f"
}

# gpu_watch_start / gpu_watch_stop: the GPU memory in use at a run's peak
. "$ROOT/bench/gpu_watch.sh"

gpu_mib() {
    if [ -n "${LLAMACPP_GPU_MIB:-}" ]; then echo "$LLAMACPP_GPU_MIB"; return; fi
    { nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null || true; } |
        head -1 | tr -dc '0-9'

}

gpu_name() {
    if [ -n "${GPU_NAME:-}" ]; then echo "$GPU_NAME"; return; fi
    { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo unknown; } | head -1
}

tags() {
    local m="$1"
    printf '%s\n' --tag "model=llama3-$m" --tag variant=Q4_0 --tag "kv=f16" --tag "gpu=$(gpu_name)" \
        --tag "commit=${COMET_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
        --tag "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}

# a row without measurements (does not fit, timed out, failed)
status_row() { # model pp tg npl status note
    python3 - "$@" "$(json_out)" "$(gpu_name)" <<'EOF'
import json, sys, datetime
m, pp, tg, npl, status, note, out, gpu = sys.argv[1:9]
r = {"engine": "llama.cpp", "variant": "Q4_0", "kv": "f16", "mode": "batched",
     "model": "llama3-" + m, "input_len": int(pp), "output_len": int(tg),
     "concurrency": int(npl), "status": status, "note": note, "gpu": gpu,
     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
with open(out, "a") as f:
    f.write(json.dumps(r, sort_keys=True) + "\n")
print("| llama.cpp Q4_0 | %s | %s/%s | %s | %s |" % (r["model"], pp, tg, npl, status))
EOF
}

cmd_bench() {
    STEP="bench"
    local m="${1:-}" d f
    model_shape "$m" >/dev/null
    d="$(setup_dir)"
    f="$(cmd_gguf "$m")"
    local log
    log="$(log_dir)/llamacpp-bench-$m.json"
    local cmd=("$d/bin/llama-bench" -m "$f" -p 512 -n 128 -fa 1 -ngl 99 -r 3 -o json)
    say "${cmd[*]}"
    STEP="bench (llama-bench)"
    local rc=0
    LD_LIBRARY_PATH="$d/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        timeout "${LLAMACPP_TIMEOUT_S:-540}" "${cmd[@]}" >"$log" 2>"$log.err" || rc=$?
    [ "$rc" -ne 124 ] || die "llama-bench timed out after ${LLAMACPP_TIMEOUT_S:-540} s"
    [ "$rc" -eq 0 ] || { tail -5 "$log.err" >&2; die "llama-bench failed, exit $rc ($log.err)"; }
    mapfile -t tg < <(tags "$m")
    python3 "$ROOT/bench/llamacpp_rows.py" bench "$log" --json "$(json_out)" "${tg[@]}" \
        --tag "command=llama-bench -m llama3-$m-q4_0.gguf -p 512 -n 128 -fa 1 -ngl 99 -r 3"
}

cmd_batched() {
    STEP="batched"
    local m="${1:-}" lengths="${2:-128/128,1000/1000,2048/128}" pars="${3:-1,16,64,256}" d f
    local n_layer
    n_layer="$(model_shape "$m")"
    d="$(setup_dir)"
    f="$(cmd_gguf "$m")"
    local mib weights_b reserve_b kv_per_tok budget_b
    mib="$(gpu_mib)"
    [ -n "$mib" ] || die "cannot read the GPU's memory (nvidia-smi); set LLAMACPP_GPU_MIB"
    weights_b="$(stat -c %s "$f")"
    reserve_b=$(( ${LLAMACPP_RESERVE_MIB:-4096} * 1024 * 1024 ))
    kv_per_tok=$(( n_layer * 2 * 1024 * 2 ))
    budget_b=$(( mib * 1024 * 1024 * 95 / 100 - weights_b - reserve_b ))
    mapfile -t tg < <(tags "$m")
    local IFS_OLD="$IFS" len
    IFS=',' read -r -a lens <<<"$lengths"
    IFS=',' read -r -a npls <<<"$pars"
    IFS="$IFS_OLD"
    for len in "${lens[@]}"; do
        [[ "$len" =~ ^([0-9]+)/([0-9]+)$ ]] || die "bad length '$len': expected PP/TG, as 128/128"
        local pp="${BASH_REMATCH[1]}" tgn="${BASH_REMATCH[2]}"
        [ "$pp" -gt 0 ] && [ "$tgn" -gt 0 ] || die "bad length '$len': both must be positive"
        local per_seq=$(( (pp + tgn) * kv_per_tok )) max_fit=0 fit=() n
        [ "$budget_b" -gt 0 ] && max_fit=$(( budget_b / per_seq ))
        [ "$max_fit" -le "$MAX_SEQ" ] || max_fit="$MAX_SEQ"
        for n in "${npls[@]}"; do
            if [ "$n" = max ]; then
                n="$max_fit"
                [ "$n" -gt 0 ] || continue
            fi
            [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || die "bad parallel count '$n': a positive integer or max"
            if [ "$n" -gt "$MAX_SEQ" ]; then
                say "$len at $n sequences: over llama.cpp's limit of $MAX_SEQ sequences"
                status_row "$m" "$pp" "$tgn" "$n" "over llama.cpp's $MAX_SEQ sequences" \
                    "llama.cpp's LLAMA_MAX_SEQ is $MAX_SEQ"
            elif [ "$n" -le "$max_fit" ]; then
                fit+=("$n")
            else
                local why="f16 KV $(( n * per_seq >> 20 )) MiB > $(( budget_b >> 20 )) MiB left of 95% of $mib MiB after weights and reserve"
                say "$len at $n sequences does not fit: $why"
                status_row "$m" "$pp" "$tgn" "$n" "does not fit" "$why"
            fi
        done
        [ "${#fit[@]}" -gt 0 ] || continue
        mapfile -t fit < <(printf '%s\n' "${fit[@]}" | sort -n -u)
        local tmo="${LLAMACPP_TIMEOUT_S:-540}"
        if [ -n "${LLAMACPP_DEADLINE:-}" ]; then
            local rest=$(( LLAMACPP_DEADLINE - $(date +%s) ))
            if [ "$rest" -lt 15 ]; then
                say "$len: skipped: time budget"
                for n in "${fit[@]}"; do
                    status_row "$m" "$pp" "$tgn" "$n" "skipped: time budget" "LLAMACPP_DEADLINE passed"
                done
                continue
            fi
            [ "$rest" -ge "$tmo" ] || tmo="$rest"
        fi
        local top="${fit[-1]}" npl_arg
        npl_arg="$(IFS=,; echo "${fit[*]}")"
        local c=$(( top * (pp + tgn) ))
        local cmd=("$d/bin/llama-batched-bench" -m "$f" -fa 1 -ngl 99 -c "$c" -npp "$pp"
                   -ntg "$tgn" -npl "$npl_arg" --output-format jsonl)
        local log
        log="$(log_dir)/llamacpp-batched-$m-$pp-$tgn.txt"
        say "${cmd[*]}"
        STEP="batched (llama-batched-bench $len)"
        local rc=0
        gpu_watch_start "$log.smi"
        LD_LIBRARY_PATH="$d/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            timeout "$tmo" "${cmd[@]}" >"$log" 2>"$log.err" || rc=$?
        local peak
        peak="$(gpu_watch_stop "$log.smi")"
        local short="llama-batched-bench -m llama3-$m-q4_0.gguf -fa 1 -ngl 99 -c $c -npp $pp -ntg $tgn -npl $npl_arg"
        if grep -q '"speed_tg"' "$log"; then
            python3 "$ROOT/bench/llamacpp_rows.py" batched "$log" --json "$(json_out)" "${tg[@]}" \
                --tag "command=$short" ${peak:+--tag "device_used_peak=$peak"}
        fi
        if [ "$rc" -ne 0 ]; then
            local st="failed (exit $rc)"
            [ "$rc" -eq 124 ] && st="timed out"
            say "llama-batched-bench $len: $st; $(tail -3 "$log.err" | tr '\n' ' ')"
            for n in "${fit[@]}"; do
                python3 - "$log" "$n" <<'EOF' || status_row "$m" "$pp" "$tgn" "$n" "$st" "$short"
import json, sys
done = {json.loads(l)["pl"] for l in open(sys.argv[1]) if '"speed_tg"' in l}
sys.exit(0 if int(sys.argv[2]) in done else 1)
EOF
            done
        fi
    done
}

cmd_all() {
    local m="${1:-8b}"
    cmd_bench "$m"
    cmd_batched "$m"
}

sub="${1:-}"
[ $# -gt 0 ] && shift
case "$sub" in
    pack) cmd_pack "$@" ;;
    pack-src) cmd_pack_src "$@" ;;
    setup) d="$(setup_dir)"; echo "$d/bin" ;;
    gguf) cmd_gguf "$@" ;;
    bench) cmd_bench "$@" ;;
    batched) cmd_batched "$@" ;;
    all) cmd_all "$@" ;;
    *) echo "usage: $0 pack [BUILD_DIR] [TAR] | pack-src [SRC] [TAR] | setup | gguf 8b|70b | bench 8b|70b | batched 8b|70b [LENGTHS] [PARALLELS] | all [8b|70b]" >&2
       exit 2 ;;
esac
