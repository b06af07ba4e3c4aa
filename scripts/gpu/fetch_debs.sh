#!/usr/bin/env bash
# fetch_debs.sh — run HERE (Debian 12 bookworm, amd64, with apt package lists): download
# the Debian packages comet links (and their runtime dependencies beyond a base system)
# into the git-ignored folder .deb/, for scripts/gpu/build.sh to unpack on the GPU machine
# (CUDA 13 image: nvcc, gcc, cmake, ninja, python3; no network, no apt).
#
# Nothing is installed: `apt-get download` only fetches .deb files into the current
# directory. The list is explicit (below); the script then checks it against
# `apt-cache depends --recurse` of the development packages and stops when a dependency
# is neither listed nor assumed present on any Ubuntu/Debian base image, and checks with
# `dpkg-deb -c` that every header, library and .pc file the build needs is inside.
#
# Usage: bash scripts/gpu/fetch_debs.sh            (from anywhere; writes <repo>/.deb/)
# Environment: COMET_DEB_DIR  output folder (default <repo>/.deb)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${COMET_DEB_DIR:-$ROOT/.deb}"

die() { echo "fetch_debs.sh: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

# ---- the packages --------------------------------------------------------------------------
# Headers, .so links and .pc files (what CMakeLists.txt's pkg_check_modules / find_library use).
DEV=(libpcre2-dev libcjson-dev libmicrohttpd-dev libopenblas-dev libopenblas-pthread-dev
     liblapacke-dev libcmocka-dev)
# Shared libraries those link to or load at run time. libopenblas0-pthread provides
# libopenblas.so.0 and the libblas.so.3 / liblapack.so.3 that liblapacke needs (the Debian
# alternatives this machine uses too); libtmglib3 is a NEEDED of liblapacke; libgfortran5 and
# libquadmath0 are NEEDED by OpenBLAS's LAPACK.
RUNTIME=(libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libcjson1 libmicrohttpd12
         libopenblas0 libopenblas0-pthread liblapacke libtmglib3 libgfortran5 libquadmath0
         libcmocka0)
# pkg-config (pkgconf) for an image without one: build.sh uses it only when `pkg-config` is
# not on PATH.
PKGCONF=(pkgconf pkgconf-bin libpkgconf3)
# libmicrohttpd12 needs libgnutls.so.30, which Ubuntu base images have (apt links it; on 24.04
# as package libgnutls30t64, same soname). These are a fallback: build.sh unpacks them into a
# separate folder and puts it on the library path only when the system has no libgnutls.so.30.
FALLBACK=(libgnutls30 libgmp10 libhogweed6 libidn2-0 libnettle8 libp11-kit0 libtasn1-6
          libunistring2 libffi8)
# Dependencies that every Debian/Ubuntu system has (the C library and the GCC runtime):
# never downloaded. Virtual packages / alternatives (<libblas.so.3>, ...) are resolved
# by the explicit choices above.
BASE=(libc6 libc6-dev libc-dev libgcc-s1 gcc-12-base libstdc++6 libcrypt1 libcrypt-dev
      linux-libc-dev libnsl-dev libtirpc-dev libtirpc3 libnsl2 libgssapi-krb5-2 libkrb5-3
      libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1 libssl3 rpcsvc-proto debconf
      libselinux1 libpcre2-dev)

ALL=("${DEV[@]}" "${RUNTIME[@]}" "${PKGCONF[@]}" "${FALLBACK[@]}")

command -v apt-get >/dev/null || die "apt-get not found: run this on the Debian 12 machine"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
if ! [[ "$(apt-cache policy "${ALL[0]}" 2>/dev/null)" =~ Candidate:\ [0-9] ]]; then
    die "apt has no package lists (run: apt-get update)"
fi

# ---- check the list against the real dependency closure ------------------------------------
# Depends and PreDepends only, recursively, from the development packages and the runtime
# libraries; alternatives (lines starting with '|' or virtual <names>) are skipped: the
# explicit list picks the OpenBLAS pthread variant.
say "checking the package list against apt-cache depends --recurse"
known=" ${ALL[*]} ${BASE[*]} "
# Alternatives the explicit list deliberately does not take (other BLAS/LAPACK providers,
# the gnutls development package: libmicrohttpd.pc's "Requires.private: gnutls" is removed
# by build.sh since comet links libmicrohttpd dynamically).
# What those pull in is skipped too: the gnutls development closure (gmp, idn2, p11-kit,
# tasn1, nettle -dev, DANE / unbound / libevent), libgomp1 (OpenMP variant), the C library's
# development tools (libc-dev-bin, libtirpc-common: the image's gcc has its own).
skip_re='^(libblas3|liblapack3|libblas-dev|liblapack-dev|libtmglib-dev|libopenblas0-openmp|libopenblas0-serial|libopenblas-openmp-dev|libopenblas-serial-dev|libatlas.*|libblis.*|libgnutls28-dev|pkg-config|libgmp-dev|libgmpxx4ldbl|libgnutls-dane0|libgnutls-openssl27|libgnutlsxx30|libidn2-dev|libp11-kit-dev|libtasn1-6-dev|nettle-dev|libunbound8|libevent-2.1-7|libgomp1|libc-dev-bin|libtirpc-common)$'
unexpected=()
while read -r dep; do
    [ -n "$dep" ] || continue
    case "$known" in *" $dep "*) continue ;; esac
    [[ "$dep" =~ $skip_re ]] && continue
    unexpected+=("$dep")
done < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "${DEV[@]}" libmicrohttpd12 liblapacke pkgconf 2>/dev/null |
         awk '/^ *(PreDepends|Depends):/ && $2 !~ /^</ {print $2}
              /^[a-z0-9]/ {print $1}' | sed 's/:any$//' | sort -u)
# The recursion follows every alternative of an "A | B" dependency: what it reaches only
# through the alternatives skipped above is reported, not fatal.
if [ "${#unexpected[@]}" -gt 0 ]; then
    echo "fetch_debs.sh: note: dependencies not in the explicit list (reached through" >&2
    echo "  alternatives or development packages skipped above; check they are not needed):" >&2
    printf '    %s\n' "${unexpected[@]}" >&2
fi

# ---- download -----------------------------------------------------------------------------
mkdir -p "$OUT"
cd "$OUT"
say "downloading ${#ALL[@]} packages into $OUT"
# remove older versions of the same packages (a rerun after an apt upgrade)
for p in "${ALL[@]}"; do
    want="$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')"
    [ -n "$want" ] && [ "$want" != "(none)" ] || die "package $p has no candidate version"
    for f in "${p}"_*.deb; do
        [ -e "$f" ] || continue
        v="$(dpkg-deb -f "$f" Version)"
        [ "$v" = "$want" ] || { echo "  removing old $f ($v)" >&2; rm -f "$f"; }
    done
done
need=()
for p in "${ALL[@]}"; do
    ls "${p}"_*.deb >/dev/null 2>&1 || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    # apt-get download runs as the _apt user when root: the folder must be writable by it
    if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then chmod 0777 "$OUT"; fi
    apt-get download "${need[@]}" || die "apt-get download failed for: ${need[*]}"
    chmod 0755 "$OUT" 2>/dev/null || true
fi

# one .deb per package, named as expected
for p in "${ALL[@]}"; do
    n="$(ls "${p}"_*.deb 2>/dev/null | wc -l)"
    [ "$n" -eq 1 ] || die "expected one ${p}_*.deb in $OUT, found $n"
done
# the fallback list, for build.sh
printf '%s\n' "${FALLBACK[@]}" > FALLBACK.list

# ---- check contents -----------------------------------------------------------------------
say "checking contents with dpkg-deb -c"
listing="$(for f in *.deb; do dpkg-deb -c "$f" | awk -v f="$f" '{print f, $6}'; done)"
need_paths=(
    ./usr/include/pcre2.h
    ./usr/lib/x86_64-linux-gnu/pkgconfig/libpcre2-8.pc
    ./usr/lib/x86_64-linux-gnu/libpcre2-8.so
    ./usr/lib/x86_64-linux-gnu/libpcre2-8.so.0
    ./usr/include/cjson/cJSON.h
    ./usr/lib/x86_64-linux-gnu/pkgconfig/libcjson.pc
    ./usr/lib/x86_64-linux-gnu/libcjson.so
    ./usr/lib/x86_64-linux-gnu/libcjson.so.1
    ./usr/include/microhttpd.h
    ./usr/lib/x86_64-linux-gnu/pkgconfig/libmicrohttpd.pc
    ./usr/lib/x86_64-linux-gnu/libmicrohttpd.so
    ./usr/lib/x86_64-linux-gnu/libmicrohttpd.so.12
    ./usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h
    ./usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig/openblas.pc
    ./usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so
    ./usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
    ./usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
    ./usr/lib/x86_64-linux-gnu/openblas-pthread/liblapack.so.3
    ./usr/include/lapacke.h
    ./usr/lib/x86_64-linux-gnu/liblapacke.so
    ./usr/lib/x86_64-linux-gnu/liblapacke.so.3
    ./usr/lib/x86_64-linux-gnu/libtmglib.so.3
    ./usr/lib/x86_64-linux-gnu/libgfortran.so.5
    ./usr/lib/x86_64-linux-gnu/libquadmath.so.0
    ./usr/include/cmocka.h
    ./usr/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc
    ./usr/lib/x86_64-linux-gnu/libcmocka.so
    ./usr/lib/x86_64-linux-gnu/libcmocka.so.0
    ./usr/bin/pkgconf
    ./usr/lib/x86_64-linux-gnu/libpkgconf.so.3
    ./usr/lib/x86_64-linux-gnu/libgnutls.so.30
)
missing=0
for p in "${need_paths[@]}"; do
    hit="$(printf '%s\n' "$listing" | awk -v p="$p" '$2 == p {print $1; exit}')"
    if [ -z "$hit" ]; then
        echo "  MISSING $p" >&2
        missing=1
    else
        printf '  ok %-62s %s\n' "$p" "$hit" >&2
    fi
done
[ "$missing" -eq 0 ] || die "some files the build needs are in none of the downloaded packages"

# The newest glibc symbol version the libraries need (the GPU image's glibc must be at least
# that; Debian 12 has 2.36, Ubuntu 22.04 2.35, 24.04 2.39).
if command -v objdump >/dev/null; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    for f in *.deb; do dpkg-deb -x "$f" "$tmp"; done
    maxv="$(find "$tmp" -type f -name '*.so*' -o -type f -path '*/bin/*' | while read -r so; do
                objdump -T "$so" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' ; done | sort -uV | tail -1)"
    say "newest glibc symbol version needed: ${maxv:-unknown}"
    printf '%s\n' "${maxv:-unknown}" > GLIBC_NEEDED
fi

n="$(ls *.deb | wc -l)"
size="$(du -ch *.deb | tail -1 | cut -f1)"
say "$n packages in $OUT, $size (carry .deb to the GPU machine; there: bash scripts/gpu/build.sh)"
