#!/usr/bin/env bash
# check_fuzz_targets.sh — ctest guard `fuzz_targets_build` (tests/CMakeLists.txt): configure a
# fuzz build (COMET_FUZZ=ON, clang) in a scratch directory, build every fuzz target
# (comet_fuzz_all) and run each for a few seconds on its seeds, so that a fuzz target that
# no longer compiles, links or starts fails the normal test suite.
# Exits 77 (ctest: skipped) when clang or its libFuzzer runtime is missing.
#
# Usage: check_fuzz_targets.sh SOURCE_DIR SCRATCH_DIR [CJSON_SOURCE_DIR]
# Environment: COMET_FUZZ_CC (default clang), COMET_FUZZ_JOBS (build jobs, default 2),
#              COMET_FUZZ_SECONDS (per target, default 5).
set -euo pipefail
src="$1"
scratch="$2"
cjson="${3:-}"
cc="${COMET_FUZZ_CC:-clang}"
secs="${COMET_FUZZ_SECONDS:-5}"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "SKIP: $cc not found (install Debian's clang package to build the fuzz targets)"
    exit 77
fi
mkdir -p "$scratch"
probe="$scratch/probe"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' \
    >"$probe.c"
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" >/dev/null 2>&1; then
    echo "SKIP: $cc cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing)"
    exit 77
fi

t0=$SECONDS
cmake -S "$src" -B "$scratch/build" -DCOMET_FUZZ=ON -DCMAKE_C_COMPILER="$cc" -DCOMET_CUDA=OFF \
    -DCOMET_FUZZ_CJSON_DIR="$cjson" >"$scratch/configure.log" 2>&1 ||
    { cat "$scratch/configure.log"; echo "FAIL: configure"; exit 1; }
cmake --build "$scratch/build" --target comet_fuzz_all -j "${COMET_FUZZ_JOBS:-2}" \
    >"$scratch/build.log" 2>&1 ||
    { grep -E 'error|undefined reference' "$scratch/build.log" | head -40 || tail -40 "$scratch/build.log"
      echo "FAIL: building the fuzz targets (full log: $scratch/build.log)"; exit 1; }
echo "configure + build: $((SECONDS - t0)) s"

manifest="$scratch/build/tests/fuzz/fuzz_targets.txt"
[ -s "$manifest" ] || { echo "FAIL: no $manifest"; exit 1; }
fail=0
n=0
while read -r name exe dict seeds; do
    n=$((n + 1))
    out="$scratch/run/$name"
    rm -rf "$out"
    mkdir -p "$out/corpus"
    args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$out/")
    [ "$dict" != "-" ] && args+=(-dict="$dict")
    # New inputs go to the scratch corpus (first directory); the seed directories are read only.
    # shellcheck disable=SC2086
    if "$exe" "${args[@]}" "$out/corpus" $seeds >"$out/log" 2>&1; then
        echo "$name: ok ($(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$out/log" |
            grep -o '[0-9]*$') runs, $(grep -o 'cov: [0-9]*' "$out/log" | tail -1))"
    else
        tail -30 "$out/log"
        echo "FAIL: $name (log: $out/log; artifacts: $out/)"
        fail=1
    fi
done <"$manifest"
[ "$n" -gt 0 ] || { echo "FAIL: no fuzz target in $manifest"; exit 1; }
echo "$n fuzz targets built and run in $((SECONDS - t0)) s"
exit "$fail"
