/* lm_head_w8.h — the CUDA lm_head over INT8 per-row weights (W8A16, lm_head_w8.cu):
 *
 *   logits[r, v] = s[v] * sum_k x[r, k] * q[v, k]
 *
 * with int8 codes q [V, C] (values in [-127, 127]; -128 also computes exactly), one fp16
 * scale per vocabulary row s [V], fp16 activations x [n, C] and fp32 logits [n, V]. Every
 * product x * q is exact in fp32 and the sum over k is fp32 in an order the kernel chooses,
 * so results differ from an exact sum by fp32 rounding of the sum only; the scale multiplies
 * the sum once. A NaN or infinity in x or s reaches the logits it touches (no special cases).
 * No cuBLAS, no workspace, no allocation.
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer is
 * device memory owned by the caller; nothing is kept after the call returns.
 */
#ifndef COMET_BACKEND_CUDA_LM_HEAD_W8_H
#define COMET_BACKEND_CUDA_LM_HEAD_W8_H

#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* logits [n, V] fp32 (row r at logits + r * V) = the product above for q [V, C] int8 codes
 * (row v at q + v * C), s [V] fp16 scales as bit patterns, x [n, C] fp16 bit patterns (row r
 * at x + r * C). Shapes: V, C, n >= 1 (the grid, at most INT_MAX CTAs, bounds V x n far past
 * any vocabulary). The tensor-core kernel runs when C % 16 == 0 and q and x are 16-byte
 * aligned (cudaMalloc gives 256); it is fastest for C % 64 == 0. Any other C or alignment
 * takes a plain kernel (a warp per row, scalar loads) that is correct and several times
 * slower. logits must not overlap q, s or x.
 * Queued on `stream` (a cudaStream_t) on the current device; no synchronization. Returns
 * COMET_OK, COMET_ERR_INVALID_ARG (the message names the argument) for a shape below 1, a NULL
 * pointer or a grid past the limit, or COMET_ERR_CUDA when the launch fails; errors inside
 * the kernel surface at the next synchronizing call. */
comet_status comet_cuda_lm_head_w8(const int8_t *q, const uint16_t *s, int V, int C,
                                   const uint16_t *x, int n, float *logits, void *stream);

/* The kernel form comet_cuda_lm_head_w8 takes for these arguments (a static string, for
 * benchmarks and logs): "mma t<tokens per CTA> r<rows per CTA> k<k per stage>" or "plain". */
const char *comet_cuda_lm_head_w8_form(const int8_t *q, int C, const uint16_t *x, int n);

#ifdef __cplusplus
}
#endif
#endif
