#!/usr/bin/env bash
# split_model.sh — run HERE: cut the default model (git-ignored, ~93 MB, more than one
# 64 MiB transfer to the GPU machine) into parts under the git-ignored folder
# .gpu-carry/model/, for scripts/gpu/join_model.sh to put back together THERE.
#
# Writes .gpu-carry/model/<file>.partN-of-M (N = 1..M) and <file>.sha256 (the sha256 of the
# whole file, which join_model.sh checks). The 64 MiB a call carries counts the working
# tree too (~6 MiB), so the default cuts parts of 38 MiB (3 parts: 38 + 38 + 17.8 MiB),
# which lets .deb (18.3 MiB), the model and the texts the model stage reads (1.8 MiB) travel
# in two calls (scripts/gpu/prep.sh prints the lists and checks their sizes):
#   run 1: carry [".deb", ".gpu-carry/model/SmolLM2-135M-Instruct.Q4_1.gguf.sha256",
#                 ".gpu-carry/model/SmolLM2-135M-Instruct.Q4_1.gguf.part1-of-3"]
#   run 2: carry [".gpu-carry/model/SmolLM2-135M-Instruct.Q4_1.gguf.sha256",
#                 ".gpu-carry/model/SmolLM2-135M-Instruct.Q4_1.gguf.part2-of-3",
#                 ".gpu-carry/model/SmolLM2-135M-Instruct.Q4_1.gguf.part3-of-3",
#                 "data/austen/prideprejudice.txt", "data/mobydick.txt"]
# (ignored files already on the warm machine stay between calls; name the part files, not
# the folder, in carry, or each call replaces the folder and the earlier part is gone).
#
# Usage: bash scripts/gpu/split_model.sh [model-file] [parts]
#   model-file  default models/SmolLM2-135M-Instruct.Q4_1.gguf
#   parts       cut into this many equal parts instead (e.g. 2: ~47 MiB each)
# Environment: COMET_SPLIT_MIB  part size in MiB when parts is not given (default 38)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

MODEL="${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PARTS="${2:-}"
MIB="${COMET_SPLIT_MIB:-38}"
SHA_DEFAULT="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OUTDIR=.gpu-carry/model

die() { echo "split_model.sh: $*" >&2; exit 1; }

[ -f "$MODEL" ] || die "$MODEL not found (bash scripts/setup.sh fetches the default model)"
[ -z "$PARTS" ] || [[ "$PARTS" =~ ^[1-9][0-9]*$ ]] || die "parts must be a positive integer, got '$PARTS'"
[[ "$MIB" =~ ^[1-9][0-9]*$ ]] || die "COMET_SPLIT_MIB must be a positive integer, got '$MIB'"
name="$(basename "$MODEL")"
sha="$(sha256sum "$MODEL" | cut -d' ' -f1)"
if [ "$name" = "SmolLM2-135M-Instruct.Q4_1.gguf" ] && [ "$sha" != "$SHA_DEFAULT" ]; then
    die "$MODEL has sha256 $sha, want $SHA_DEFAULT (a damaged download? rerun scripts/setup.sh)"
fi

mkdir -p "$OUTDIR"
rm -f "$OUTDIR/$name".part* "$OUTDIR/$name.sha256"
size="$(stat -c %s "$MODEL")"
if [ -n "$PARTS" ]; then
    chunk=$(( (size + PARTS - 1) / PARTS ))
else
    chunk=$(( MIB * 1048576 ))
    PARTS=$(( (size + chunk - 1) / chunk ))
fi
for ((i = 0; i < PARTS; i++)); do
    dd if="$MODEL" of="$OUTDIR/$name.part$((i + 1))-of-$PARTS" bs=1M iflag=skip_bytes,count_bytes \
       skip=$((i * chunk)) count="$chunk" status=none
done
echo "$sha  $name" > "$OUTDIR/$name.sha256"
# check: the parts put together give the file back
got="$(for ((i = 1; i <= PARTS; i++)); do cat "$OUTDIR/$name.part$i-of-$PARTS"; done | sha256sum | cut -d' ' -f1)"
[ "$got" = "$sha" ] || die "the parts do not join back to $MODEL (sha256 $got)"
ls -l "$OUTDIR"
echo "split_model.sh: $MODEL -> $PARTS parts of <= $chunk bytes in $OUTDIR (sha256 $sha)"
