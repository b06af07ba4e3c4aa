/* ref_gemm_w4ax.h — scalar reference (the oracle) of the W4Ax GEMM, docs/numerics.md
 * "The W4Ax GEMM":
 *
 *   y[t, n] = sum_b  sa[t, b] * sw[n, b] * S[t, n, b],
 *   S[t, n, b] = sum_{k in block b} qa[t, k] * qw[n, k]      (exact, int32)
 *
 * Plain layouts only (numerics/w4_plain.h); fast paths are tested against this.
 */
#ifndef COMET_BACKEND_CPU_REF_GEMM_W4AX_H
#define COMET_BACKEND_CPU_REF_GEMM_W4AX_H

#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compute the W4Ax GEMM on the CPU, one scalar loop nest.
 *   M tokens, N output channels, K input channels, B block size (K % B == 0, B even),
 *   n8: blocks 0..n8-1 carry INT8 activation codes, blocks n8..K/B-1 INT4 codes.
 *   qw   [N, K/2]  plain INT4 weight codes (w4_plain.h)
 *   sw   [N, K/B]  fp16 weight scales (IEEE binary16 bits)
 *   qa   [M, K]    activation codes, one int8 each; INT4 blocks must hold codes in [-8, 7]
 *   sa   [M, K/B]  fp32 activation scales
 *   y    [M, N]    fp32 output, or NULL
 *   bsum [M, N, K/B] int32 block sums S, or NULL (for bit-exact comparison)
 * All host memory, owned by the caller. The fp32 outer sum runs over b in increasing order,
 * one fused multiply-add per block: acc = fmaf((float)S, sa * sw, acc) (sa * sw rounded to
 * fp32 first), so every compiler and fast path gets the same bits. Returns COMET_OK, or COMET_ERR_INVALID_ARG for bad shapes
 * or an INT4 block holding a code outside [-8, 7]. */
comet_status comet_ref_gemm_w4ax(int M, int N, int K, int B, int n8, const uint8_t *qw,
                                 const uint16_t *sw, const int8_t *qa, const float *sa, float *y,
                                 int32_t *bsum);

/* IEEE binary16 bits to float (exact; subnormals, inf and NaN included). */
float comet_ref_f16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif
#endif
