/* w4ax_check.h — the argument checks of the W4Ax GEMM entry points that take plain-layout
 * weights (the CPU integer GEMM, backend/cpu/w4ax_cpu.h, and the CUDA backend's weight
 * load and launch, backend/cuda/cuda_internal.h), so that they refuse the same calls with
 * the same words. The GEMM itself: docs/numerics.md "The W4Ax GEMM". */
#ifndef COMET_BACKEND_W4AX_CHECK_H
#define COMET_BACKEND_W4AX_CHECK_H

#include <stdint.h>

#include "comet/status.h"

/* Largest M, N and K the checks accept (2^30): index arithmetic that rounds them up to tile
 * multiples in int cannot overflow. */
#define COMET_W4AX_MAX_DIM (1 << 30)

/* A weight load: N >= 1, K a positive multiple of 64, B 64 or 128 dividing K, every one at
 * most COMET_W4AX_MAX_DIM, non-NULL qw_plain [N, K/2], sw_plain [N, K/B] and out (where
 * the caller's weight goes; the caller sets *out = NULL first). `who` names the
 * entry point in the message ("w4ax_load (backend 'cuda')"). COMET_OK or
 * COMET_ERR_INVALID_ARG naming the problem. */
comet_status comet_w4ax_check_load(const char *who, int N, int K, int B, const void *qw_plain,
                                   const void *sw_plain, const void *out);

/* A GEMM call on a weight of K input channels and block size B: w, qa, sa and y non-NULL,
 * 1 <= M <= COMET_W4AX_MAX_DIM, 0 <= n8 <= K/B. COMET_OK or COMET_ERR_INVALID_ARG. */
comet_status comet_w4ax_check_gemm(const char *who, const void *w, int K, int B, int M, int n8,
                                   const int8_t *qa, const float *sa, const float *y);

#endif
