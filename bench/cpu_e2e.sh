#!/usr/bin/env bash
# cpu_e2e.sh — end-to-end CPU speed of comet next to llama.cpp on the same GGUF, same run.
#
# Measures prefill tokens/s (a 512-token prompt), decode tokens/s (128 generated tokens) and
# peak RSS with 2 threads for the default model, for
#   * comet:     build/comet generate --raw --stats, on each of COMET_MODELS (default: the GGUF
#                in FP32, the W4AxKV4 checkpoint on integers, and the same checkpoint with
#                --simulate, the FP32 simulation), and
#   * llama.cpp: llama-bench -m <gguf> -t 2 -p 512 -n 128 -r 1 on the GGUF,
# alternating RUNS times (so a busy machine slows both alike), medians of the RUNS runs; writes
# a dated markdown table to bench/results/<YYYY-MM-DD>-cpu-e2e.md (date, CPU, load, commit,
# exact commands, both engines' numbers and the ratio).
#
# llama.cpp is built from the llama-cpp-python source package on PyPI (which vendors llama.cpp)
# OUTSIDE the repository, in $COMET_LLAMACPP_CACHE (default ~/.cache/comet-llamacpp), once;
# later runs reuse that build. Nothing of llama.cpp is ever written into the repository.
#
# Usage: bench/cpu_e2e.sh            (after scripts/setup.sh has built comet and fetched the model)
# Environment: THREADS (2), RUNS (3), MODEL (models/SmolLM2-135M-Instruct.Q4_1.gguf, llama.cpp's
#   and the first comet row's), COMET_MODELS (space-separated "path[+simulate]" comet rows;
#   default "$MODEL models/smollm2-w4axkv4 models/smollm2-w4axkv4+simulate", rows whose path is
#   missing are left out), COMET_BUILD_DIR (comet's build folder, default build; a CPU-only
#   build, cmake -DCOMET_CUDA=OFF, is what a machine without the CUDA toolkit runs: a CUDA
#   build also maps the CUDA runtime and cuBLAS, which adds to comet's peak RSS),
#   COMET_LLAMACPP_CACHE, LLAMACPP_VERSION (pin a llama-cpp-python version; default: the newest
#   already built in the cache, else the newest on PyPI), OUT (results file).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
RUNS="${RUNS:-3}"
PROMPT_TOKENS=512
GEN_TOKENS=128
MODEL="${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
read -r -a COMET_ROWS <<<"${COMET_MODELS:-$MODEL models/smollm2-w4axkv4 models/smollm2-w4axkv4+simulate}"
CACHE="${COMET_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/comet-llamacpp}"
STEP="start"
trap 'echo "cpu_e2e.sh: FAILED in step: $STEP" >&2' ERR
die() { echo "cpu_e2e.sh: $STEP: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

[ -f "$MODEL" ] || die "model $MODEL missing: run bash scripts/setup.sh first"
command -v python3 >/dev/null || die "python3 is needed (scripts/setup.sh installs it)"

# ---- llama.cpp (cached build outside the repo) ---------------------------------------------
STEP="llama.cpp"
llama_bench=""
if [ -z "${LLAMACPP_VERSION:-}" ]; then
    for b in $(ls -d "$CACHE"/*/build/bin/llama-bench 2>/dev/null | sort -V -r); do
        llama_bench="$b"
        break
    done
    [ -n "$llama_bench" ] && LLAMACPP_VERSION="$(basename "$(dirname "$(dirname "$(dirname "$llama_bench")")")")"
fi
if [ -z "$llama_bench" ] || [ ! -x "$llama_bench" ]; then
    mkdir -p "$CACHE/sdist"
    spec="llama-cpp-python${LLAMACPP_VERSION:+==$LLAMACPP_VERSION}"
    say "llama.cpp: pip download --no-deps --no-binary :all: $spec"
    python3 -m pip download --no-deps --no-binary :all: --disable-pip-version-check \
        -d "$CACHE/sdist" "$spec" >&2 || die "pip download $spec failed"
    sdist="$(ls "$CACHE"/sdist/llama_cpp_python-${LLAMACPP_VERSION:-*}.tar.gz | sort -V | tail -n1)"
    LLAMACPP_VERSION="$(basename "$sdist" .tar.gz)"
    LLAMACPP_VERSION="${LLAMACPP_VERSION#llama_cpp_python-}"
    dir="$CACHE/$LLAMACPP_VERSION"
    if [ ! -f "$dir/src/CMakeLists.txt" ]; then
        rm -rf "$dir/src" "$dir/unpack"
        mkdir -p "$dir/unpack"
        tar -xzf "$sdist" -C "$dir/unpack" "llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp"
        mv "$dir/unpack/llama_cpp_python-$LLAMACPP_VERSION/vendor/llama.cpp" "$dir/src"
        rm -rf "$dir/unpack"
    fi
    say "llama.cpp: building llama-bench in $dir/build (CPU only, native; takes a while)"
    nice -n 10 cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    nice -n 10 cmake --build "$dir/build" --target llama-bench -j "$(nproc)" >&2
    llama_bench="$dir/build/bin/llama-bench"
fi
[ -x "$llama_bench" ] || die "llama-bench not found at $llama_bench"

# ---- comet ---------------------------------------------------------------------------------
STEP="comet build"
BUILD="${COMET_BUILD_DIR:-build}"
[ -d "$BUILD" ] || cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$BUILD" --target comet -j "$(nproc)" >&2
COMET="$BUILD/comet"

# A raw prompt of exactly PROMPT_TOKENS tokens: the opening of Pride and Prejudice, cut to
# length by the token count comet itself reports (so the prompt is real text, not random ids).
STEP="comet prompt"
[ -s data/austen/prideprejudice.txt ] || die "data/austen/prideprejudice.txt missing: run scripts/setup.sh"
# comet_stats PROMPT_FILE MAX_TOKENS -> "prompt_tokens prefill_tok_s decode_steps decode_tok_s"
# from the line `comet generate --stats` writes to stderr:
#   stats: prompt_tokens=N prefill_s=S prefill_tok_s=R gen_tokens=N decode_steps=N decode_s=S
#          decode_tok_s=R threads=N stop=...
# The first generated token comes out of the prefill pass, so MAX_TOKENS = GEN_TOKENS + 1 gives
# GEN_TOKENS decode steps (what llama-bench's tg<N> times); --ignore-eos keeps it from stopping.
comet_stats() {
    local err line spec="${3:-$MODEL}" extra=()
    local model="${spec%+simulate}"
    [ "$model" != "$spec" ] && extra=(--simulate)
    err="$(/usr/bin/time -f 'maxrss_kb=%M' "$COMET" generate --model "$model" "${extra[@]}" --raw \
        --prompt "$(cat "$1")" --max-tokens "$2" --temperature 0 --ignore-eos --threads "$THREADS" \
        --stats 2>&1 >/dev/null)" || die "comet generate ($spec) failed: $err"
    line="$(grep '^stats: ' <<<"$err" | tail -n1) $(grep '^maxrss_kb=' <<<"$err" | tail -n1)" ||
        die "no stats line in: $err"
    awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
           print v["prompt_tokens"], v["prefill_tok_s"], v["decode_steps"], v["decode_tok_s"],
                 v["maxrss_kb"] }' \
        <<<"$line"
}
prompt_file="$(mktemp)"
trap 'rm -f "$prompt_file"' EXIT
python3 - "$prompt_file" "$PROMPT_TOKENS" 1.0 <<'EOF'
import sys
path, want, scale = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
words = open("data/austen/prideprejudice.txt", encoding="utf-8").read().split(" ")
open(path, "w").write(" ".join(words[:int(want * 0.75 * scale)]))
EOF
for attempt in 1 2 3 4 5 6 7 8; do
    read -r n _ _ _ _ <<<"$(comet_stats "$prompt_file" 1)"
    [ "$n" -eq "$PROMPT_TOKENS" ] && break
    # scale the word count by the ratio, then fix the last few tokens by single words
    python3 - "$prompt_file" "$n" "$PROMPT_TOKENS" <<'EOF'
import sys
path, have, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = open("data/austen/prideprejudice.txt", encoding="utf-8").read().split(" ")
cur = len(open(path, encoding="utf-8").read().split(" "))
if abs(have - want) > 8:
    new = max(1, int(cur * want / have))
else:
    new = cur + (1 if have < want else -1)
open(path, "w").write(" ".join(words[:new]))
EOF
done
[ "$n" -eq "$PROMPT_TOKENS" ] || die "could not make a prompt of exactly $PROMPT_TOKENS tokens (got $n)"

# ---- measurements: the two engines alternate, run by run, so both see the same machine -----
STEP="runs"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
llama_cmd=("$llama_bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT_TOKENS" -n "$GEN_TOKENS" -r 1 -o json)
runs_dir="$(mktemp -d)"
trap 'rm -rf "$prompt_file" "$runs_dir"' EXIT
rows=()
for spec in "${COMET_ROWS[@]}"; do
    [ -e "${spec%+simulate}" ] && rows+=("$spec") || say "comet row $spec: ${spec%+simulate} missing, left out"
done
say "$RUNS rounds of: comet (${rows[*]}; prompt $PROMPT_TOKENS tokens, $GEN_TOKENS decode steps), then llama-bench; $THREADS threads"
for r in $(seq "$RUNS"); do
    for i in "${!rows[@]}"; do
        row="$(comet_stats "$prompt_file" $((GEN_TOKENS + 1)) "${rows[$i]}")"
        say "round $r comet ${rows[$i]}: prompt tokens, prefill tok/s, decode steps, decode tok/s, peak RSS KiB = $row"
        echo "$row" >>"$runs_dir/comet$i"
    done
    /usr/bin/time -f '%M' -o "$runs_dir/llama$r.rss" "${llama_cmd[@]}" >"$runs_dir/llama$r.json" \
        2>"$runs_dir/llama$r.err" || die "llama-bench failed: $(tail -n 5 "$runs_dir/llama$r.err")"
    say "round $r llama.cpp: $(python3 -c 'import json,sys; print(", ".join("%s %.2f tok/s" % ("pp%d" % t["n_prompt"] if t["n_prompt"] else "tg%d" % t["n_gen"], t["avg_ts"]) for t in json.load(open(sys.argv[1]))))' "$runs_dir/llama$r.json")"
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

# ---- results -------------------------------------------------------------------------------
STEP="results"
date_utc="$(date -u +%Y-%m-%d)"
OUT="${OUT:-bench/results/$date_utc-cpu-e2e.md}"
mkdir -p "$(dirname "$OUT")"
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit (+ uncommitted changes)"
fi
ggml_version="$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' \
    "$(dirname "$(dirname "$(dirname "$llama_bench")")")/src/ggml/CMakeLists.txt" 2>/dev/null | paste -sd.)"
export OUT RUNS THREADS PROMPT_TOKENS GEN_TOKENS MODEL LLAMACPP_VERSION commit ggml_version \
    load_start load_end
export comet_rows="${rows[*]}" COMET
export comet_cuda="$("$COMET" --version | grep -q 'CUDA backend: yes' && echo 'a CUDA build: the CUDA runtime and cuBLAS are mapped' || echo 'a CPU-only build')"
export cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -n1)"
export ncpu="$(nproc)"
export when="$(date -u '+%Y-%m-%d %H:%M UTC')"
export prompt_words="$(wc -w <"$prompt_file")"
export llama_shown="$(printf '%s ' "${llama_cmd[@]}" | sed "s|$HOME|~|g; s| $||")"
python3 - "$runs_dir" <<'PYEOF'
import glob, json, os, statistics, sys
e = os.environ
runs_dir = sys.argv[1]
specs = e["comet_rows"].split()
rows = [[list(map(float, l.split())) for l in open(os.path.join(runs_dir, f"comet{i}")) if l.strip()]
        for i in range(len(specs))]
l_pp, l_tg, l_rss, meta = [], [], [], {}
for path in sorted(glob.glob(os.path.join(runs_dir, "llama*.json"))):
    for t in json.load(open(path)):
        (l_pp if t["n_prompt"] and not t["n_gen"] else l_tg).extend(t["samples_ts"])
        meta = t
    l_rss.append(float(open(path[:-5] + ".rss").read().split()[-1]))
med = statistics.median
m_pp, m_tg, m_rss = med(l_pp), med(l_tg), med(l_rss) / 1024


def label(spec):
    path = spec[:-len("+simulate")] if spec.endswith("+simulate") else spec
    if path.endswith(".gguf"):
        return f"comet, `{os.path.basename(path)}` (weights -> FP32)"
    how = "FP32 simulation (`--simulate`)" if spec.endswith("+simulate") else "integer path"
    return f"comet, `{os.path.basename(path)}` W4AxKV4, {how}"


P, G, R = e["PROMPT_TOKENS"], e["GEN_TOKENS"], e["RUNS"]
text = f"""# CPU end-to-end speed: comet vs llama.cpp, {e['when'][:10]}

- Date: {e['when']}
- CPU: {e['cpu']} ({e['ncpu']} CPUs visible), {e['THREADS']} threads per engine
- Load average (1/5/15 min) at start: {e['load_start']}; at end: {e['load_end']}. The engines
  alternate run by run so both meet the same conditions.
- comet commit: {e['commit']}, binary `{e['COMET']}` ({e['comet_cuda']})
- llama.cpp: vendored in llama-cpp-python {e['LLAMACPP_VERSION']} (PyPI sdist), ggml {e['ggml_version'] or '?'},
  backend {meta.get('backends', '?')}, built with -DGGML_NATIVE=ON, CPU only
- Model: `{e['MODEL']}` (llama.cpp calls it "{meta.get('model_type', '?')}"); comet also runs
  its W4AxKV4 checkpoint made by `scripts/setup.sh` (`comet quantize`, 16 calibration windows)

| engine | prefill tok/s ({P}-token prompt) | decode tok/s ({G} tokens) | peak RSS MiB | prefill / llama.cpp | decode / llama.cpp | RSS / llama.cpp |
|---|---:|---:|---:|---:|---:|---:|
| llama.cpp, `{os.path.basename(e['MODEL'])}` | {m_pp:.1f} | {m_tg:.2f} | {m_rss:.0f} | 1.00 | 1.00 | 1.00 |
"""
for spec, rs in zip(specs, rows):
    c_pp, c_tg, c_rss = med(r[1] for r in rs), med(r[3] for r in rs), med(r[4] for r in rs) / 1024
    text += (f"| {label(spec)} | {c_pp:.1f} | {c_tg:.2f} | {c_rss:.0f} | {c_pp / m_pp:.2f} | "
             f"{c_tg / m_tg:.2f} | {c_rss / m_rss:.2f} |\n")
text += f"""
Medians of {R} runs per engine. comet's numbers are what `--stats` reports: prefill = prompt
tokens / time of the prompt's forward pass; decode = decode steps / their time, {G} decode
steps per run (`--max-tokens {int(G) + 1}`: the first new token comes out of the prefill pass;
`--ignore-eos`). Model loading is timed by neither engine. Peak RSS is GNU time's maximum
resident set of the whole process (comet: one generate run; llama.cpp: one llama-bench run of
both tests). llama-bench runs prefill (pp{P}) and decode (tg{G}) as separate tests on random
token ids, after a warm-up; comet's prompt is the first {e['prompt_words']} words of *Pride and
Prejudice* (exactly {P} tokens), raw, greedy.

Commands (one round; `bench/cpu_e2e.sh` runs {R} rounds, THREADS={e['THREADS']} RUNS={R}):

```
{e['COMET']} generate --model <row's model> [--simulate] --raw --temperature 0 --ignore-eos \\
    --prompt "<first {e['prompt_words']} words of data/austen/prideprejudice.txt>" \\
    --max-tokens {int(G) + 1} --threads {e['THREADS']} --stats
{e['llama_shown']}
```

Per run (prefill tok/s / decode tok/s):

| run | llama.cpp | """ + " | ".join(label(s) for s in specs) + " |\n|---:|---:|" + "---:|" * len(specs) + "\n"
for i in range(int(R)):
    cells = [f"{l_pp[i]:.1f} / {l_tg[i]:.2f}" if i < len(l_pp) and i < len(l_tg) else "-"]
    cells += [f"{rs[i][1]:.1f} / {rs[i][3]:.2f}" if i < len(rs) else "-" for rs in rows]
    text += f"| {i + 1} | " + " | ".join(cells) + " |\n"
open(e["OUT"], "w").write(text)
print(text)
PYEOF
say "wrote $OUT"
