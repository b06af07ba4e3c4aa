/* convert.h — the CUDA backend's copies and conversions (convert.cu): the embedding
 * and lm_head row gathers, the fp32 -> fp16 weight conversion, synthetic weights and the
 * split of a stacked GEMM output.
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer
 * is device memory owned by the caller unless marked "host". Launchers run on the current
 * device, queue their kernels on `stream` and return COMET_OK, COMET_ERR_INVALID_ARG /
 * COMET_ERR_UNSUPPORTED for shapes they do not take, or COMET_ERR_CUDA naming the op when
 * a launch fails; errors inside a kernel surface at the next synchronizing call.
 */
#ifndef COMET_BACKEND_CUDA_CONVERT_H
#define COMET_BACKEND_CUDA_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x[t, :] = embd[tokens[t] - row0, :] where that row is in [0, V), else zeros (a
 * tensor-parallel shard's table holds vocabulary rows row0 .. row0 + V - 1): embd [V, C]
 * fp32, tokens [T] (ids of the whole vocabulary, checked by the caller), x [T, C] fp32. */
comet_status comet_cuda_embed(const float *embd, int C, int row0, int V, const int32_t *tokens,
                              int T, float *x, void *stream);

/* dst [n_rows, C] = src [rows[r], :] for fp16 rows (uint16_t bits); rows [n_rows] device. */
comet_status comet_cuda_gather_rows_f16(const uint16_t *src, int C, const int32_t *rows, int n_rows,
                                        uint16_t *dst, void *stream);

/* dst[i] = fp16(src[i]) (round to nearest even) for i < n. */
comet_status comet_cuda_f32_to_f16(const float *src, uint16_t *dst, size_t n, void *stream);

/* Synthetic weights (benchmarks): dst [n] filled from a hash of (seed, index), the same for
 * any launch shape. kind COMET_CUDA_FILL_BYTES: uniform random bytes (uint8); F16 / F32:
 * uniform in [lo, hi) as fp16 bits / fp32. */
enum {
    COMET_CUDA_FILL_BYTES = 0,
    COMET_CUDA_FILL_F16 = 1,
    COMET_CUDA_FILL_F32 = 2
};
comet_status comet_cuda_fill_random(void *dst, size_t n, int kind, float lo, float hi,
                                    uint64_t seed, void *stream);

/* ys split of a stacked GEMM output: outs[i] [T, widths[i]] = the columns of part i of y
 * [T, N] (parts side by side, N = their sum; n_parts <= 3); a NULL outs[i] is skipped.
 * Queued on stream. COMET_OK, COMET_ERR_INVALID_ARG, COMET_ERR_CUDA (launch). */
comet_status comet_cuda_unstack(const float *y, int T, int N, int n_parts, const int *widths,
                                float *const *outs, void *stream);

#ifdef __cplusplus
}
#endif
#endif
