#!/usr/bin/env bash
# fetch_cjson_source.sh — put the source of the installed cJSON (Debian's cjson source
# package, same version as libcjson-dev, Debian patches applied) into DEST, for the fuzz
# build: cmake ... -DCOMET_FUZZ=ON -DCOMET_FUZZ_CJSON_DIR=DEST (docs/fuzzing.md).
# Uses a private deb-src list under DEST, so the system's apt configuration is not touched.
# Usage: scripts/fetch_cjson_source.sh [DEST]   (default: build-fuzz-cjson)
set -euo pipefail
dest="$(mkdir -p "${1:-build-fuzz-cjson}" && cd "${1:-build-fuzz-cjson}" && pwd)"
if [ -f "$dest/cJSON.c" ]; then
    echo "$dest"
    exit 0
fi
ver="$(dpkg-query -W -f='${source:Version}' libcjson-dev 2>/dev/null || true)"
. /etc/os-release
apt="$dest/.apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
cat >"$apt/sources.list" <<SRC
deb-src http://deb.debian.org/debian ${VERSION_CODENAME} main
deb-src http://deb.debian.org/debian ${VERSION_CODENAME}-updates main
deb-src http://deb.debian.org/debian-security ${VERSION_CODENAME}-security main
SRC
opts=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
      -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o APT::Sandbox::User=root)
apt-get "${opts[@]}" update -q >&2
cd "$apt"
apt-get "${opts[@]}" source --download-only "cjson${ver:+=$ver}" >&2
rm -rf "$apt/src"
dpkg-source -x cjson_*.dsc "$apt/src" >&2
cp "$apt/src/cJSON.c" "$apt/src/cJSON.h" "$apt/src/LICENSE" "$dest/"
echo "$dest"
