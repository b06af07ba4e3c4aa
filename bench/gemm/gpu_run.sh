#!/bin/bash
# gpu_run.sh [tests|bench|all] — on the GPU machine: GPU tests of the W4Ax GEMM (the kernels,
# then the CUDA backend's op table), both (quick sets) under compute-sanitizer, then the
# benchmark and the decode floor (floor.md; plot: bench/gemm/plot.py gemm.md OUT.png floor.md).
# Logs go to $OUT (or ./out); a summary is printed last. The tests come from the CMake build
# (build-gpu, scripts/gpu/build.sh: the carried .deb files must be there), the benchmark and
# the floor from build-gemm-dev (bench/gemm/build.sh), each built here when missing.
set -o pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
out=${OUT:-out}
mkdir -p "$out"
bin=build-gemm-dev
tb=build-gpu/tests/cuda
if [ "$what" != tests ] && { [ ! -x $bin/bench_gemm ] || [ ! -x $bin/floor ] || ldd $bin/bench_gemm | grep -q "not found"; }; then
    echo "building the benchmark on this machine"
    bench/gemm/build.sh $bin > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
if [ "$what" != bench ] && { [ ! -x $tb/test_gemm_w4ax_cuda ] || ! $tb/test_gemm_w4ax_cuda --load-check; }; then
    echo "building the tests on this machine (CMake)"
    COMET_TARGETS="test_gemm_w4ax_cuda test_backend_cuda" bash scripts/gpu/build.sh > "$out/build_tests.log" 2>&1 ||
        { tail -30 "$out/build_tests.log"; exit 1; }
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv; \
  echo "binaries built from commit $(tr '\n' ' ' < $bin/COMMIT 2>/dev/null)"; date -u; } > "$out/env.txt" 2>&1
t_rc=- o_rc=- s_rc=- r_rc=- m_rc=- p_rc=- w_rc=- b_rc=- f_rc=- n_rc=-
if [ "$what" != bench ]; then
    timeout 240 $tb/test_gemm_w4ax_cuda > "$out/test.log" 2>&1; t_rc=$?
    timeout 240 $tb/test_backend_cuda > "$out/test_backend.log" 2>&1; o_rc=$?
    timeout 100 compute-sanitizer --error-exitcode 3 --tool memcheck $tb/test_gemm_w4ax_cuda --quick > "$out/sanitizer.log" 2>&1; s_rc=$?
    timeout 100 compute-sanitizer --error-exitcode 3 --tool racecheck $tb/test_gemm_w4ax_cuda --quick >> "$out/sanitizer.log" 2>&1; r_rc=$?
    timeout 100 compute-sanitizer --error-exitcode 3 --tool memcheck $tb/test_backend_cuda --quick >> "$out/sanitizer.log" 2>&1; m_rc=$?
    timeout 100 compute-sanitizer --error-exitcode 3 --tool memcheck $tb/test_gemm_w4ax_cuda --pdl >> "$out/sanitizer.log" 2>&1; p_rc=$?
    # the test of the test: kernels built without the programmatic-launch wait, when built
    # (COMET_BUILD_DIR=build-pdl-nowait COMET_TARGETS=test_gemm_w4ax_cuda bash scripts/gpu/build.sh
    # -DCMAKE_CUDA_FLAGS=-DCOMET_PDL_NO_WAIT), must fail
    if [ -x build-pdl-nowait/tests/cuda/test_gemm_w4ax_cuda ]; then
        timeout 100 build-pdl-nowait/tests/cuda/test_gemm_w4ax_cuda --pdl > "$out/test_pdl_nowait.log" 2>&1; w_rc=$?
    fi
    # a build without sm_90a code, when built (COMET_BUILD_DIR=build-gemm-sm90
    # COMET_CUDA_ARCHS=90 COMET_TARGETS=test_gemm_w4ax_cuda bash scripts/gpu/build.sh): plans
    # keep off the wgmma kernel, which is refused
    if [ -x build-gemm-sm90/tests/cuda/test_gemm_w4ax_cuda ]; then
        timeout 200 build-gemm-sm90/tests/cuda/test_gemm_w4ax_cuda --no-sm90a > "$out/test_no_sm90a.log" 2>&1; n_rc=$?
    fi
fi
if [ "$what" != tests ]; then
    timeout 300 $bin/bench_gemm --out "$out/gemm.md" $BENCH_ARGS > "$out/bench.log" 2>&1; b_rc=$?
    timeout 120 $bin/floor > "$out/floor.md" 2>&1; f_rc=$?
fi
echo "==== env"; cat "$out/env.txt"
if [ "$what" != bench ]; then
    echo "==== tests rc=$t_rc"; grep -E "FAIL|failed" "$out/test.log" | head -20
    echo "==== backend op table tests rc=$o_rc"
    grep -E "^FAIL|checks passed|^CUDA error|failed:" "$out/test_backend.log" | head -20
    grep -E "pdl chain" "$out/test.log" | head -20
    echo "==== sanitizer memcheck rc=$s_rc racecheck rc=$r_rc backend memcheck rc=$m_rc pdl memcheck rc=$p_rc"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks failed|checks passed" "$out/sanitizer.log"
    echo "==== build without sm_90a code (--no-sm90a) rc=$n_rc"
    [ -f "$out/test_no_sm90a.log" ] && grep -E "FAIL|line [0-9]+:|checks failed" "$out/test_no_sm90a.log" | head -10
    echo "==== without the pdl wait (must fail) rc=$w_rc"
    [ -f "$out/test_pdl_nowait.log" ] && grep -E "FAIL|ok|checks" "$out/test_pdl_nowait.log" | head -16
fi
if [ "$what" != tests ]; then
    echo "==== decode floor rc=$f_rc (bench/gemm/floor.cu)"; grep "geomean" "$out/floor.md" || tail -5 "$out/floor.md"
    echo "==== bench rc=$b_rc"; grep -A40 "^Summary" "$out/bench.log" || tail -20 "$out/bench.log"
fi
