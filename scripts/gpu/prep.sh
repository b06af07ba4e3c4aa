#!/usr/bin/env bash
# prep.sh — run HERE before a GPU session: put every git-ignored file the GPU calls carry in
# place and print the carry lists of the two calls that check.sh's stages need, each checked
# against the 64 MiB a call carries (the working tree counts too).
#
#   1. .deb/ (scripts/gpu/fetch_debs.sh) when it is missing;
#   2. the default model and the evaluation texts (scripts/setup.sh with COMET_NO_GENERATE=1:
#      no apt when the packages are installed, an incremental build) when either is missing;
#   3. the model cut into parts (scripts/gpu/split_model.sh, parts of COMET_SPLIT_MIB);
#   4. with --llamacpp, llama.cpp's source packed into .gpu-carry/llamacpp-src.tar.gz (for a
#      third call) by `bench/llamacpp_cuda.sh pack-src`, which fetches the sdist when missing.
#
# Prints the carry lists, as JSON arrays for the device tool's carry argument: .deb, the model
# parts (each call with a part also carries its .sha256) and the texts, packed in that order
# into as few calls as the 64 MiB a call carries allows, the working tree counted in each
# (today two calls: .deb and the first part, then the other parts and the texts). The first
# runs `bash scripts/gpu/check.sh build ops`, the last `bash scripts/gpu/check.sh model bench`,
# one right after the other (the machine goes back 30 s after a call).
#
# Usage: bash scripts/gpu/prep.sh [--llamacpp]
# Exit status: 0 when everything is in place; 1 otherwise (a message says what failed).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
die() { echo "prep.sh: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

LLAMACPP=0
for a in "$@"; do
    case "$a" in
    --llamacpp) LLAMACPP=1 ;;
    *) die "unknown argument '$a' (usage: prep.sh [--llamacpp])" ;;
    esac
done

. scripts/gpu/files.sh # MODEL and TEXTS, what check.sh's model stage reads
LIMIT=$((64 * 1048576))                                  # bytes a call carries, tree included

if ! compgen -G ".deb/*.deb" >/dev/null; then
    say "fetching the Debian packages into .deb/"
    bash scripts/gpu/fetch_debs.sh
fi
missing=0
[ -s "$MODEL" ] || missing=1
for f in "${TEXTS[@]}"; do [ -s "$f" ] || missing=1; done
if [ "$missing" = 1 ]; then
    say "fetching the model and the texts (scripts/setup.sh, no generation)"
    COMET_NO_GENERATE=1 bash scripts/setup.sh
fi
bash scripts/gpu/split_model.sh "$MODEL" >/dev/null

if [ "$LLAMACPP" = 1 ] && [ ! -s .gpu-carry/llamacpp-src.tar.gz ]; then
    bash bench/llamacpp_cuda.sh pack-src
fi

# the working tree as the device tool sends it: tracked files and untracked ones git does not
# ignore
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
    awk '{s += $1} END {print s + 0}')
name=$(basename "$MODEL")
parts=(.gpu-carry/model/"$name".part*-of-*)
[ -f "${parts[0]}" ] || die "no model parts in .gpu-carry/model"
sum=".gpu-carry/model/$name.sha256" # with every call that carries a part: join_model.sh reads it
# greedy, in this order, each call up to LIMIT with the tree: .deb first (the build needs it)
items=(.deb "${parts[@]}" "${TEXTS[@]}")
calls=() cur=() used=$tree
flush() {
    local json
    json=$(printf '"%s", ' "${cur[@]}")
    calls+=("[${json%, }] ($(awk -v b="$used" 'BEGIN {printf "%.1f", b / 1048576}') MiB with the tree)")
    cur=() used=$tree
}
for it in "${items[@]}"; do
    b=$(du -cb "$it" | tail -1 | cut -f1)
    [[ "$it" == *.part* ]] && b=$((b + $(stat -c %s "$sum")))
    [ $((tree + b)) -le "$LIMIT" ] || die "$it alone passes the $((LIMIT / 1048576)) MiB a call carries"
    [ $((used + b)) -le "$LIMIT" ] || flush
    if [[ "$it" == *.part* ]] && [[ " ${cur[*]} " != *" $sum "* ]]; then cur+=("$sum"); fi
    cur+=("$it") used=$((used + b))
done
flush
n=${#calls[@]}
for i in "${!calls[@]}"; do
    what="carries files only"
    [ "$i" = 0 ] && what="bash scripts/gpu/check.sh build ops"
    [ "$i" = $((n - 1)) ] && what="bash scripts/gpu/check.sh model bench"
    echo "call $((i + 1)) of $n ($what): ${calls[$i]}"
done
[ "$n" -le 2 ] || echo "prep.sh: $n calls, one after the other without a pause (the machine goes" \
    "back 30 s after a call); COMET_SPLIT_MIB sets the part size" >&2
if [ -s .gpu-carry/llamacpp-src.tar.gz ]; then
    echo "llama.cpp (bench/llamacpp_cuda.sh, a call of its own):" \
        "[\".gpu-carry/llamacpp-src.tar.gz\"] ($(du -m .gpu-carry/llamacpp-src.tar.gz | cut -f1) MiB)"
fi
