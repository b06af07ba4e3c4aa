/* cuda_skip.h — the GPU tests' "no GPU here" exit: ctest registers every tests/cuda test
 * with SKIP_RETURN_CODE 77 and LABELS cuda, so `ctest -L cuda` on the GPU machine runs them
 * and a machine without a usable CUDA device (CI) reports them skipped, not failed.
 *
 * cuda_test_skip_if_no_device() asks the runtime for its device count (this creates no
 * context on any device, so the tests' own context checks start from a clean thread) and,
 * when that fails or finds none, prints "SKIP: no CUDA device: <reason>" and exits 77.
 * With COMET_CUDA_TEST_REQUIRE=1 in the environment (the GPU machine, where a missing
 * device is an error) it exits 1 instead. */
#ifndef COMET_TESTS_CUDA_SKIP_H
#define COMET_TESTS_CUDA_SKIP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define CUDA_TEST_SKIP_CODE 77

static void cuda_test_skip_if_no_device(void) {
    int n = 0;
    char why[256];
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, sizeof why, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        cudaGetLastError();
    } else if (n < 1) {
        snprintf(why, sizeof why, "cudaGetDeviceCount found 0 devices");
    } else {
        return;
    }
    const char *req = getenv("COMET_CUDA_TEST_REQUIRE");
    if (req && *req && strcmp(req, "0")) {
        printf("FAIL: no CUDA device: %s (COMET_CUDA_TEST_REQUIRE is set)\n", why);
        fflush(stdout);
        exit(1);
    }
    printf("SKIP: no CUDA device: %s\n", why);
    fflush(stdout);
    exit(CUDA_TEST_SKIP_CODE);
}

#endif
