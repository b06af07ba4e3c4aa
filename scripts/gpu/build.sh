#!/usr/bin/env bash
# build.sh — run THERE (the GPU machine: CUDA 13 image with nvcc, gcc, cmake, ninja, no apt,
# no network) from the repo root: build the full comet with the CUDA backend.
#
#   1. unpacks every .deb/*.deb (made here by scripts/gpu/fetch_debs.sh; git-ignored, so
#      carry it) with dpkg-deb -x into a prefix (default /opt/comet-deps, never /): the
#      libraries comet links (PCRE2, cJSON, libmicrohttpd, OpenBLAS, LAPACKE, cmocka) and
#      pkgconf. Skipped when the prefix already holds the same set of packages.
#   2. makes the prefix usable: .pc files' /usr paths rewritten to the prefix, the Debian
#      alternatives links (libopenblas.so*, libblas.so*, liblapack.so*, openblas.pc, blas.pc,
#      lapack.pc, which dpkg's update-alternatives would make) created inside it,
#      libmicrohttpd.pc's "Requires.private: gnutls" dropped (comet links it dynamically; no
#      gnutls .pc is shipped), a pkg-config wrapper in <prefix>/bin that always searches the
#      prefix (the image's pkg-config, or the unpacked pkgconf when it has none);
#   3. joins the model parts carried in .gpu-carry/model/ (scripts/gpu/join_model.sh);
#   4. cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release
#      -DCMAKE_CUDA_ARCHITECTURES=90a -DCOMET_CUDA=ON, then builds with all cores.
#      The executables get an RPATH to the prefix (run without LD_LIBRARY_PATH); for other
#      programs `. scripts/gpu/env.sh`.
#
# On the GPU machine (a call carries at most 64 MiB with the working tree: .deb and the model
# parts travel over two calls, see split_model.sh), from the repo root:
#   bash scripts/gpu/build.sh                      # unpack, join, configure, build
#   ctest --test-dir build-gpu -L cuda --output-on-failure
#   build-gpu/comet generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf --device cuda --prompt "Hi"
# A build longer than one call's limit can run on in its own session and be waited for:
#   mkdir -p build-gpu; setsid nohup bash scripts/gpu/build.sh > build-gpu/build.log 2>&1 < /dev/null &
#
# Usage: bash scripts/gpu/build.sh [extra cmake -D arguments...]
# Environment:
#   COMET_DEPS_PREFIX  where to unpack (default /opt/comet-deps)
#   COMET_DEB_DIR      the .deb folder (default .deb)
#   COMET_BUILD_DIR    build folder (default build-gpu)
#   COMET_BUILD_TYPE   default Release
#   COMET_CUDA_ARCHS   default 90a (H200)
#   COMET_JOBS         build jobs (default: all cores)
#   COMET_TARGETS      build only these targets (space-separated; default: all)
#   COMET_NO_BUILD=1   stop after unpacking, the model join and the configure
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

PREFIX="${COMET_DEPS_PREFIX:-/opt/comet-deps}"
DEB_DIR="${COMET_DEB_DIR:-.deb}"
BUILD_DIR="${COMET_BUILD_DIR:-build-gpu}"
STEP="start"
trap 'echo "build.sh: FAILED in step: $STEP (see the messages above)" >&2' ERR
die() { echo "build.sh: ERROR in step '$STEP': $*" >&2; exit 1; }
say() { printf '\n==> %s\n' "$*" >&2; }

ARCH_DIR=usr/lib/x86_64-linux-gnu

# ---- 0. checks ------------------------------------------------------------------------------
STEP="checks"
[ "$(uname -m)" = x86_64 ] || die "these Debian packages are amd64; this machine is $(uname -m)"
case "$PREFIX" in
    /*) ;;
    *) die "COMET_DEPS_PREFIX must be an absolute path, got '$PREFIX'" ;;
esac
PREFIX="$(printf '%s' "$PREFIX" | sed -E 's#/+$##')"
case "$PREFIX" in
    "" | / | /usr | /usr/local | /opt | /bin | /lib | /etc | /home | /root | /tmp)
        die "refusing COMET_DEPS_PREFIX='${PREFIX:-/}': unpack into a folder of its own (default /opt/comet-deps)" ;;
esac
[ "$BUILD_DIR" != build ] || die "COMET_BUILD_DIR=build is the CPU build's folder: use another (default build-gpu)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (needed to unpack .deb files)"
command -v cmake >/dev/null || die "cmake not found"
[ -f CMakeLists.txt ] && [ -d src/backend ] || die "run from the comet repo root (no CMakeLists.txt in $ROOT)"

# ---- 1. unpack ------------------------------------------------------------------------------
STEP="unpack"
shopt -s nullglob
debs=("$DEB_DIR"/*.deb)
stamp=""
if [ "${#debs[@]}" -gt 0 ]; then
    stamp="$(for f in "${debs[@]}"; do printf '%s %s\n' "$(basename "$f")" "$(stat -c %s "$f")"; done |
             sha256sum | cut -d' ' -f1)"
fi
if [ -f "$PREFIX/.comet-deps" ] && { [ -z "$stamp" ] || [ "$(cat "$PREFIX/.comet-deps")" = "$stamp" ]; }; then
    say "unpack: $PREFIX already holds the packages (stamp ok)"
else
    [ "${#debs[@]}" -gt 0 ] || die "no $DEB_DIR/*.deb and no unpacked $PREFIX: run scripts/gpu/fetch_debs.sh on the Debian machine and carry .deb"
    if [ -e "$PREFIX" ] && [ ! -f "$PREFIX/.comet-deps" ] && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
        die "$PREFIX exists, is not empty and was not made by build.sh: choose another COMET_DEPS_PREFIX"
    fi
    mkdir -p "$PREFIX" 2>/dev/null || die "cannot create $PREFIX (not root? set COMET_DEPS_PREFIX=\$HOME/comet-deps)"
    [ -w "$PREFIX" ] || die "$PREFIX is not writable (set COMET_DEPS_PREFIX=\$HOME/comet-deps)"
    # a fresh unpack: only what an earlier build.sh put there (it has the marker)
    rm -rf "${PREFIX:?}/usr" "${PREFIX:?}/fallback" "${PREFIX:?}/fallback-lib" "${PREFIX:?}/bin" "${PREFIX:?}/.comet-deps"
    fallback_list=()
    if [ -f "$DEB_DIR/FALLBACK.list" ]; then
        mapfile -t fallback_list < "$DEB_DIR/FALLBACK.list"
    fi
    n_main=0 n_fb=0
    for f in "${debs[@]}"; do
        pkg="$(dpkg-deb -f "$f" Package)" || die "$f is not a readable .deb"
        dest="$PREFIX"
        for fb in "${fallback_list[@]+"${fallback_list[@]}"}"; do
            [ "$pkg" = "$fb" ] && dest="$PREFIX/fallback"
        done
        mkdir -p "$dest"
        dpkg-deb -x "$f" "$dest" || die "dpkg-deb -x $f failed"
        if [ "$dest" = "$PREFIX" ]; then n_main=$((n_main + 1)); else n_fb=$((n_fb + 1)); fi
    done
    rm -rf "$PREFIX/usr/share/doc" "$PREFIX/usr/share/man" "$PREFIX/usr/share/info" \
           "$PREFIX/usr/share/lintian" "$PREFIX/fallback/usr/share"
    say "unpack: $n_main packages into $PREFIX, $n_fb (gnutls closure) into $PREFIX/fallback"

    # ---- 2. alternatives links, .pc files, pkg-config wrapper -------------------------------
    STEP="alternatives"
    lib="$PREFIX/$ARCH_DIR"
    ob="$lib/openblas-pthread"
    [ -d "$ob" ] || die "no $ARCH_DIR/openblas-pthread in the unpacked packages (libopenblas0-pthread missing from $DEB_DIR?)"
    # what update-alternatives makes on Debian (libblas.so.3-x86_64-linux-gnu etc.), relative
    for l in libopenblas.so.0 libopenblas.so libblas.so.3 libblas.so liblapack.so.3 liblapack.so; do
        [ -e "$ob/$l" ] || die "missing $ob/$l (libopenblas0-pthread / libopenblas-pthread-dev)"
        ln -sfn "openblas-pthread/$l" "$lib/$l"
    done
    mkdir -p "$lib/pkgconfig"
    ln -sfn ../openblas-pthread/pkgconfig/openblas.pc "$lib/pkgconfig/openblas.pc"
    ln -sfn ../openblas-pthread/pkgconfig/blas-openblas.pc "$lib/pkgconfig/blas.pc"
    ln -sfn ../openblas-pthread/pkgconfig/lapack-openblas.pc "$lib/pkgconfig/lapack.pc"
    # the unversioned dev link of liblapacke / libcmocka / ... come with the -dev packages;
    # check every link in the prefix resolves
    while IFS= read -r -d '' l; do
        [ -e "$l" ] || die "dangling link $l -> $(readlink "$l")"
    done < <(find "$PREFIX" -type l -print0)

    STEP="pc files"
    # /usr paths -> the prefix, in every .pc file (openblas.pc and cmocka.pc have absolute
    # paths without ${prefix}): after '=', a blank, -I or -L.
    while IFS= read -r -d '' pc; do
        sed -i -E "s#(^|[=[:space:]]|-I|-L)/usr(/|[[:space:]]|\$)#\\1${PREFIX}/usr\\2#g" "$pc"
    done < <(find "$PREFIX" -type f -name '*.pc' -print0)
    # comet links libmicrohttpd dynamically; the gnutls .pc it names privately is not shipped
    sed -i -E '/^Requires\.private:[[:space:]]*gnutls[[:space:]]*$/d' "$lib/pkgconfig/libmicrohttpd.pc"
    bad="$(find "$PREFIX" -type f -name '*.pc' -print0 | xargs -0 grep -HnE '(^|[=[:space:]]|-I|-L)/usr(/|[[:space:]]|$)' || true)"
    [ -z "$bad" ] || die "a .pc file still points at /usr: $bad"

    STEP="gnutls"
    # libmicrohttpd.so.12 needs libgnutls.so.30 and its libraries: the system's where it has
    # them (Ubuntu images do: apt links gnutls), else the Debian copies unpacked into
    # fallback/. fallback-lib gets a link for each of those sonames the system lacks (all of
    # them with COMET_FALLBACK_ALL=1), so the copies never shadow a library the system has.
    mkdir -p "$PREFIX/fallback-lib"
    ldcache="$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) || true)"
    sys_has() {
        grep -qE "^[[:space:]]+${1//./\\.} .*x86-64" <<<"$ldcache" && return 0
        local d
        for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
            [ -e "$d/$1" ] && return 0
        done
        return 1
    }
    used=()
    for so in "$PREFIX/fallback/$ARCH_DIR"/*.so.*; do
        [ -L "$so" ] || continue          # the soname links (libgnutls.so.30 -> ...)
        name="$(basename "$so")"
        [[ "$name" =~ \.so\.[0-9]+$ ]] || continue
        if [ "${COMET_FALLBACK_ALL:-0}" = 1 ] || ! sys_has "$name"; then
            ln -sfn "../fallback/$ARCH_DIR/$name" "$PREFIX/fallback-lib/$name"
            used+=("$name")
        fi
    done
    if [ "${#used[@]}" -eq 0 ]; then
        say "gnutls: the system has libgnutls.so.30 and its libraries; the fallback copies stay unused"
    else
        say "gnutls: using the fallback copies of: ${used[*]}"
    fi

    STEP="pkg-config"
    mkdir -p "$PREFIX/bin"
    real_pc=""
    for c in pkg-config pkgconf; do
        p="$(command -v "$c" 2>/dev/null || true)"
        # never our own wrapper (a second run with env.sh sourced)
        if [ -n "$p" ] && [ "$p" != "$PREFIX/bin/pkg-config" ]; then real_pc="$p"; break; fi
    done
    if [ -n "$real_pc" ]; then
        say "pkg-config: the image's $real_pc (wrapped to search $PREFIX first)"
        ld_pc=""
    else
        real_pc="$PREFIX/usr/bin/pkgconf"
        [ -x "$real_pc" ] || die "the image has no pkg-config and $DEB_DIR has no pkgconf-bin"
        say "pkg-config: the image has none; using the unpacked $real_pc"
        ld_pc="$lib"
    fi
    cat > "$PREFIX/bin/pkg-config" <<WRAP
#!/bin/sh
# made by scripts/gpu/build.sh: pkg-config searching $PREFIX first
PKG_CONFIG_PATH="$lib/pkgconfig:$PREFIX/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
${ld_pc:+LD_LIBRARY_PATH="$ld_pc\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH}
exec "$real_pc" "\$@"
WRAP
    chmod +x "$PREFIX/bin/pkg-config"
    printf '%s\n' "$stamp" > "$PREFIX/.comet-deps"
fi

# shellcheck source=env.sh
. "$ROOT/scripts/gpu/env.sh" || die "sourcing scripts/gpu/env.sh failed"
lib="$PREFIX/$ARCH_DIR"
PKG_CONFIG="$PREFIX/bin/pkg-config"

STEP="pkg-config check"
for mod in libpcre2-8 libcjson openblas libmicrohttpd cmocka; do
    "$PKG_CONFIG" --exists --print-errors "$mod" || die "pkg-config cannot find $mod in $PREFIX"
done
say "pkg-config: $("$PKG_CONFIG" --cflags --libs libpcre2-8 libcjson openblas libmicrohttpd cmocka | tr -s ' ')"
for f in "$lib/liblapacke.so" "$PREFIX/usr/include/lapacke.h" "$PREFIX/usr/include/cmocka.h"; do
    [ -e "$f" ] || die "missing $f"
done

# ---- 3. model -------------------------------------------------------------------------------
STEP="model"
bash "$ROOT/scripts/gpu/join_model.sh" || die "joining the model parts failed"

# ---- 4. configure and build -------------------------------------------------------------------
STEP="configure"
command -v nvcc >/dev/null || die "nvcc not found on PATH nor in /usr/local/cuda/bin"
gen=()
if command -v ninja >/dev/null; then
    gen=(-G Ninja)
    if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$BUILD_DIR/CMakeCache.txt"; then
        die "$BUILD_DIR was configured with another generator: remove it or set COMET_BUILD_DIR"
    fi
else
    say "configure: ninja not found, using Unix Makefiles"
fi
rpath="$lib:$lib/openblas-pthread"
[ -z "$(ls -A "$PREFIX/fallback-lib" 2>/dev/null)" ] || rpath="$rpath:$PREFIX/fallback-lib"
# DT_RPATH (not RUNPATH): also used for the libraries' own dependencies (libgfortran of
# OpenBLAS, libblas.so.3 / libtmglib of LAPACKE), so the binaries and ctest run without
# LD_LIBRARY_PATH; -rpath-link lets ld resolve those at link time.
link_flags="-Wl,--disable-new-dtags -Wl,-rpath,$rpath -Wl,-rpath-link,$rpath"
say "configure: cmake -S . -B $BUILD_DIR ${gen[*]} (CUDA archs ${COMET_CUDA_ARCHS:-90a})"
cmake -S . -B "$BUILD_DIR" "${gen[@]}" \
    -DCMAKE_BUILD_TYPE="${COMET_BUILD_TYPE:-Release}" \
    -DCMAKE_CUDA_ARCHITECTURES="${COMET_CUDA_ARCHS:-90a}" \
    -DCOMET_CUDA=ON \
    -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" \
    -DCMAKE_PREFIX_PATH="$PREFIX/usr" \
    -DLAPACKE_LIB="$lib/liblapacke.so" \
    -DCMAKE_EXE_LINKER_FLAGS="$link_flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$link_flags" \
    "$@" || die "cmake configure failed"
grep -q '^MHD_FOUND:INTERNAL=1' "$BUILD_DIR/CMakeCache.txt" ||
    say "WARNING: libmicrohttpd not found by CMake: 'comet serve' will be missing"
grep -q '^CMOCKA_FOUND:INTERNAL=1' "$BUILD_DIR/CMakeCache.txt" || die "cmocka not found by CMake"

if [ "${COMET_NO_BUILD:-0}" = 1 ]; then
    say "configured $BUILD_DIR (COMET_NO_BUILD=1: not building)"
    exit 0
fi
STEP="build"
jobs="${COMET_JOBS:-$(nproc 2>/dev/null || echo 4)}"
targets=()
for t in ${COMET_TARGETS:-}; do targets+=(--target "$t"); done
say "build: cmake --build $BUILD_DIR -j $jobs ${targets[*]}"
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "$jobs" "${targets[@]}" || die "the build failed"
STEP="done"
say "built $BUILD_DIR in $(( $(date +%s) - start )) s. Tests: ctest --test-dir $BUILD_DIR -L cuda --output-on-failure"
