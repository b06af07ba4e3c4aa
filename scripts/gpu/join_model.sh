#!/usr/bin/env bash
# join_model.sh — run THERE (the GPU machine) from the repo root, or through build.sh: put
# the model parts made by scripts/gpu/split_model.sh (.gpu-carry/model/<file>.partN-of-M +
# <file>.sha256) back together into models/<file> and check its sha256.
#
# Skips a model already in models/ with the right sha256. When some parts have not arrived
# yet (they come one per call), says which and exits 0 with models/ untouched: a later call
# that carries the rest joins them. Exits 1 when the joined file's sha256 is wrong.
# Once joined, the parts are deleted (COMET_KEEP_PARTS=1 keeps them).
#
# Usage: bash scripts/gpu/join_model.sh
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DIR=.gpu-carry/model

say() { echo "join_model.sh: $*" >&2; }

shopt -s nullglob
sums=("$DIR"/*.sha256)
if [ "${#sums[@]}" -eq 0 ]; then
    say "no $DIR/*.sha256: nothing to join"
    exit 0
fi
rc=0
mkdir -p models
for sumf in "${sums[@]}"; do
    read -r want name < "$sumf"
    [ -n "$name" ] && [ "${#want}" -eq 64 ] || { say "bad checksum file $sumf"; rc=1; continue; }
    dst="models/$name"
    if [ -f "$dst" ] && [ "$(sha256sum "$dst" | cut -d' ' -f1)" = "$want" ]; then
        say "$dst present, sha256 ok"
        [ "${COMET_KEEP_PARTS:-0}" = 1 ] || rm -f "$DIR/$name".part*
        continue
    fi
    parts=("$DIR/$name".part*-of-*)
    if [ "${#parts[@]}" -eq 0 ]; then
        say "$dst: no parts in $DIR yet"
        continue
    fi
    # the split whose parts have all arrived (parts of an older split with another M may
    # linger on a warm machine)
    m=""
    missing=()
    for mm in $(for f in "${parts[@]}"; do echo "${f##*-of-}"; done | sort -un); do
        miss=()
        for ((i = 1; i <= mm; i++)); do
            [ -f "$DIR/$name.part$i-of-$mm" ] || miss+=("part$i-of-$mm")
        done
        if [ "${#miss[@]}" -eq 0 ]; then m="$mm"; break; fi
        missing+=("${miss[@]}")
    done
    if [ -z "$m" ]; then
        say "$dst: waiting for ${missing[*]}; not joined yet"
        continue
    fi
    tmp="$dst.joining.$$"
    for ((i = 1; i <= m; i++)); do cat "$DIR/$name.part$i-of-$m"; done > "$tmp"
    got="$(sha256sum "$tmp" | cut -d' ' -f1)"
    if [ "$got" != "$want" ]; then
        rm -f "$tmp"
        say "ERROR: $dst joined from $m parts has sha256 $got, want $want (a part is damaged: split again and carry it again)"
        rc=1
        continue
    fi
    mv -f "$tmp" "$dst"
    [ "${COMET_KEEP_PARTS:-0}" = 1 ] || rm -f "$DIR/$name".part*
    say "$dst joined from $m parts, sha256 ok ($(stat -c %s "$dst") bytes)"
done
exit "$rc"
