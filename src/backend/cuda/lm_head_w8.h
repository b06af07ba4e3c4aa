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

/* Above this many rows the W8 kernel (mma.sync) is slower than cuBLAS FP16 (wgmma): the
 * CUDA backend then multiplies the codes as fp16 (exact) through cuBLAS and scales the rows
 * after. At 64 rows the kernel takes 329 us against cuBLAS's 399, at 128 rows 550 against
 * 413 (H100, V 128256, C 4096; bench/results/2026-12-06-h100-lm-head.md). */
#define COMET_CUDA_LM_HEAD_W8_MAX_ROWS 64

/* out [n] fp16 bit patterns = the int8 codes q [n] as fp16 (exact): the cuBLAS form of the
 * INT8 lm_head. Device pointers; queued on `stream`. COMET_OK, COMET_ERR_INVALID_ARG for a
 * NULL pointer, COMET_ERR_CUDA when the launch fails. */
comet_status comet_cuda_lm_head_codes_f16(const int8_t *q, size_t n, uint16_t *out, void *stream);

/* logits [n, V] fp32 (row stride V) *= s[v] per column v, s [V] fp16 bit patterns: the row
 * scales after cuBLAS's sum over the fp16 codes. Device pointers; queued on `stream`.
 * COMET_OK, COMET_ERR_INVALID_ARG (a shape below 1 or a NULL pointer), COMET_ERR_CUDA. */
comet_status comet_cuda_lm_head_scale(float *logits, const uint16_t *s, int V, int n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
