#!/usr/bin/env bash
# ab_bench.sh — run THERE (the GPU machine), from the repo root: the same `comet bench` on a
# baseline commit and on this tree in one call, interleaved, so that a change's effect on
# prefill and decode speed is read from one machine in one run (a kept change needs a
# same-run A/B).
#
#   here:   git archive --format=tar.gz -o .gpu-carry/base.tar.gz <baseline commit>  (~1 MiB)
#   there:  bash scripts/gpu/ab_bench.sh .gpu-carry/base.tar.gz [bench args ...]
#
# Builds the baseline's `comet` into /tmp/comet-base/build-gpu and this tree's into build-gpu
# (scripts/gpu/build.sh, incremental where build-gpu exists), then runs
# `comet bench <args>` ROUNDS times on each, alternating B, A, B, A, ... and prints a table of
# the medians and the ratio this tree / baseline. Default args: --synthetic llama3-8b
# --device cuda --decode-tokens 256 --reps 3.
#
# Environment: COMET_AB_ROUNDS (default 3), COMET_AB_TARGETS (this tree's build targets;
# default comet), OUT (logs; default gpu-out/).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
die() { echo "ab_bench.sh: $*" >&2; exit 1; }

BASE_TAR="${1:-}"
[ -n "$BASE_TAR" ] && [ -f "$BASE_TAR" ] || die "usage: ab_bench.sh BASE.tar [bench args...] (BASE.tar from git archive)"
shift
ARGS=("$@")
[ "${#ARGS[@]}" -gt 0 ] || ARGS=(--synthetic llama3-8b --device cuda --decode-tokens 256 --reps 3)
ROUNDS="${COMET_AB_ROUNDS:-3}"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"

BASE_DIR=/tmp/comet-base
rm -rf "$BASE_DIR" && mkdir -p "$BASE_DIR"
tar -xf "$BASE_TAR" -C "$BASE_DIR"
ln -sfn "$ROOT/.deb" "$BASE_DIR/.deb"
( cd "$BASE_DIR" && COMET_TARGETS=comet bash scripts/gpu/build.sh ) >"$OUT/ab_build_base.log" 2>&1 ||
    { tail -30 "$OUT/ab_build_base.log"; die "baseline build failed ($OUT/ab_build_base.log)"; }
COMET_TARGETS="${COMET_AB_TARGETS:-comet}" bash scripts/gpu/build.sh >"$OUT/ab_build_new.log" 2>&1 ||
    { tail -30 "$OUT/ab_build_new.log"; die "build of this tree failed ($OUT/ab_build_new.log)"; }

# One bench run: its result row is the first table row after the header
# (| model | weights | device | prefill | decode | ms/step | ...).
run_one() {
    local bin="$1" log="$2"
    "$bin" bench "${ARGS[@]}" >"$log" 2>&1 || { tail -5 "$log"; die "$bin bench failed ($log)"; }
    awk -F'|' '/^\| model |^\|-/ {next} /^\|/ {gsub(/ /, "", $5); gsub(/ /, "", $6); print $5, $6; exit}' "$log"
}
: >"$OUT/ab_rows.txt"
for r in $(seq 1 "$ROUNDS"); do
    echo "base $(run_one "$BASE_DIR/build-gpu/comet" "$OUT/ab_base_$r.log")" >>"$OUT/ab_rows.txt"
    echo "new $(run_one build-gpu/comet "$OUT/ab_new_$r.log")" >>"$OUT/ab_rows.txt"
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
bp=$(awk '$1 == "base" {print $2}' "$OUT/ab_rows.txt" | median)
bd=$(awk '$1 == "base" {print $3}' "$OUT/ab_rows.txt" | median)
np=$(awk '$1 == "new" {print $2}' "$OUT/ab_rows.txt" | median)
nd=$(awk '$1 == "new" {print $3}' "$OUT/ab_rows.txt" | median)
echo "comet bench ${ARGS[*]}: $ROUNDS rounds each, interleaved; medians"
echo "| build | prefill tok/s | decode tok/s | runs (prefill, decode) |"
echo "|---|---|---|---|"
echo "| baseline | $bp | $bd | $(awk '$1 == "base" {printf "%s/%s ", $2, $3}' "$OUT/ab_rows.txt")|"
echo "| this tree | $np | $nd | $(awk '$1 == "new" {printf "%s/%s ", $2, $3}' "$OUT/ab_rows.txt")|"
awk -v bp="$bp" -v bd="$bd" -v np="$np" -v nd="$nd" \
    'BEGIN {printf "| ratio | %.3fx | %.3fx | |\n", np / bp, nd / bd}'
