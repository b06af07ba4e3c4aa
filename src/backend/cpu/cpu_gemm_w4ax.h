/* cpu_gemm_w4ax.h — the W4Ax GEMM on the CPU, threaded integer code, bit for bit the scalar
 * oracle comet_ref_gemm_w4ax (docs/numerics.md "The W4Ax GEMM"):
 *
 *   y[t, n] = sum_b (float)S[t, n, b] * (sa[t, b] * sw[n, b]),  b = 0, 1, ... K/B - 1
 *   S[t, n, b] = sum_{k in block b} qa[t, k] * qw[n, k]           (exact, int32)
 *
 * N output channels, K input channels (a multiple of 64), B the block size (64 or 128), n8
 * the number of leading blocks holding INT8 activation codes (blocks n8..K/B-1 hold INT4
 * codes in [-8, 7]). A standalone C API like the CUDA GEMM's (backend/cuda/gemm_w4ax.h):
 * the CPU backends' layer loop runs quantized linears as the fp32 simulation of
 * numerics/qlinear.h, not through this GEMM. */
#ifndef COMET_BACKEND_CPU_GEMM_W4AX_H
#define COMET_BACKEND_CPU_GEMM_W4AX_H

#include <stdint.h>

#include "comet/status.h"
#include "core/threads.h"

/* A weight as this GEMM reads it: host copies in the plain layout of numerics/w4_plain.h,
 * plus the scales converted to fp32 (exactly). Owned by its maker, comet_cpu_w4ax_load. */
typedef struct comet_cpu_w4ax_weight {
    int N, K, B;
    uint8_t *qw;   /* [N, K/2] INT4 codes, plain layout */
    uint16_t *sw;  /* [N, K/B] fp16 scale bits */
    float *sw_f32; /* [N, K/B] the same scales as fp32 */
} comet_cpu_w4ax_weight;

/* Copy host weights in the plain layout — qw_plain [N, K/2] INT4 codes, sw_plain [N, K/B]
 * fp16 scale bits, both borrowed for the call — into *out, owned by the caller and released
 * with comet_cpu_w4ax_free. COMET_OK; COMET_ERR_INVALID_ARG (N < 1, K not a positive
 * multiple of 64, B not 64 or 128, K % B != 0, N or K above COMET_W4AX_MAX_DIM, a NULL
 * pointer), with the problem named; COMET_ERR_NOMEM. *out is NULL on failure. */
comet_status comet_cpu_w4ax_load(int N, int K, int B, const uint8_t *qw_plain,
                                 const uint16_t *sw_plain, comet_cpu_w4ax_weight **out);

/* Release a weight of comet_cpu_w4ax_load. NULL is a no-op. */
void comet_cpu_w4ax_free(comet_cpu_w4ax_weight *w);

/* y = the GEMM above for M tokens, on tp's threads (the caller's thread takes part; returns
 * when y is written). Host memory, caller-owned: qa [M, K] int8 activation codes, sa
 * [M, K/B] fp32 activation scales, y [M, N] fp32 output (every element written); w's N, K,
 * B are those given to comet_cpu_w4ax_load. Scales are used as given: an inf or NaN scale
 * propagates into the outputs it touches. Returns COMET_OK, or COMET_ERR_INVALID_ARG (M < 1
 * or above COMET_W4AX_MAX_DIM, n8 outside [0, K/B], a NULL pointer, an INT4 block holding
 * a code outside [-8, 7]) with the problem named. */
comet_status comet_cpu_gemm_w4ax(comet_threadpool *tp, const comet_cpu_w4ax_weight *w, int M,
                                 int n8, const int8_t *qa, const float *sa, float *y);

#endif
