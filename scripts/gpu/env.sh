# shellcheck shell=bash
# env.sh — source THERE (the GPU machine) after scripts/gpu/build.sh has unpacked the
# Debian libraries: `. scripts/gpu/env.sh`. Sets LD_LIBRARY_PATH (needed at run time for the
# libraries comet's libraries pull in: libgfortran, libblas.so.3, liblapack.so.3, libtmglib,
# maybe gnutls; the binaries also carry an RPATH to the prefix, so they run without it),
# PKG_CONFIG_PATH, CMAKE_PREFIX_PATH and PATH (the prefix's pkg-config wrapper), and
# COMET_DEPS_PREFIX. Safe to source twice. Returns 1 (no exit) when the prefix is missing.
#
# Environment: COMET_DEPS_PREFIX  where build.sh unpacked (default /opt/comet-deps)

COMET_DEPS_PREFIX="${COMET_DEPS_PREFIX:-/opt/comet-deps}"
export COMET_DEPS_PREFIX
if [ ! -f "$COMET_DEPS_PREFIX/.comet-deps" ]; then
    echo "env.sh: $COMET_DEPS_PREFIX holds no unpacked comet dependencies: run bash scripts/gpu/build.sh first" >&2
    return 1 2>/dev/null || exit 1
fi

_comet_lib="$COMET_DEPS_PREFIX/usr/lib/x86_64-linux-gnu"
# prepend (or append) a folder to a colon list once: _comet_add VAR DIR [append]
_comet_add() {
    local cur
    eval "cur=\${$1:-}"
    case ":$cur:" in *":$2:"*) return 0 ;; esac
    if [ -z "$cur" ]; then
        eval "export $1=\"\$2\""
    elif [ "${3:-}" = append ]; then
        eval "export $1=\"\$cur:\$2\""
    else
        eval "export $1=\"\$2:\$cur\""
    fi
}
_comet_add LD_LIBRARY_PATH "$_comet_lib/openblas-pthread"
_comet_add LD_LIBRARY_PATH "$_comet_lib"
# gnutls and its libraries, only those the system lacks (build.sh links them into
# fallback-lib); last, after the prefix.
if [ -n "$(ls -A "$COMET_DEPS_PREFIX/fallback-lib" 2>/dev/null)" ]; then
    _comet_add LD_LIBRARY_PATH "$COMET_DEPS_PREFIX/fallback-lib" append
fi
_comet_add PKG_CONFIG_PATH "$COMET_DEPS_PREFIX/usr/share/pkgconfig"
_comet_add PKG_CONFIG_PATH "$_comet_lib/pkgconfig"
_comet_add CMAKE_PREFIX_PATH "$COMET_DEPS_PREFIX/usr"
_comet_add PATH "$COMET_DEPS_PREFIX/bin"
# nvcc for CMake when it is installed but not on PATH
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    _comet_add PATH /usr/local/cuda/bin append
fi
unset _comet_lib
unset -f _comet_add
