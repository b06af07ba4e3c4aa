/* norm_quant.h — the CUDA backend's fused input kernels of the linears (norm_quant.cu):
 * RMSNorm with the residual add, SwiGLU or a plain row, each fused with the group's
 * permutation gather and the per-token per-block activation quantization the GEMMs read.
 * The GEMMs themselves are not here: W4Ax goes through gemm_w4ax.h, FP16 through cuBLAS
 * (cuda_backend.c).
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer
 * is device memory owned by the caller unless marked "host". Launchers run on the current
 * device, queue their kernels on `stream` and return COMET_OK, COMET_ERR_INVALID_ARG /
 * COMET_ERR_UNSUPPORTED for shapes they do not take, or COMET_ERR_CUDA naming the op when
 * a launch fails; errors inside a kernel surface at the next synchronizing call.
 */
#ifndef COMET_BACKEND_CUDA_NORM_QUANT_H
#define COMET_BACKEND_CUDA_NORM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- activations as the GEMMs read them ----
 *
 * An activation buffer (comet_act_bytes(T, K) = 4 T K + 256 bytes, 256-byte aligned) holds
 * one of:
 *   COMET_CUDA_ACT_W4AX: int8 codes qa [T, K] at byte 0, then fp32 block scales sa
 *     [T, K/B] at byte comet_cuda_act_scales_offset(T, K) (the W4Ax GEMM's qa and sa);
 *   COMET_CUDA_ACT_F16: fp16 [T, K] at byte 0 (the cuBLAS GEMM's input). */
typedef enum comet_cuda_act_kind {
    COMET_CUDA_ACT_F16 = 1,
    COMET_CUDA_ACT_W4AX = 2,
} comet_cuda_act_kind;

static inline size_t comet_cuda_act_scales_offset(int T, int K) {
    return ((size_t)T * (size_t)K + 255) & ~(size_t)255;
}

/* How a group's linears read their input: kind, width K, and for W4AX the block size B
 * (64 or 128, dividing K) and the leading INT8 block count n8 (0 <= n8 <= K/B); perm [K]
 * gathers the input (act[t, k] = h[t, perm[k]]), NULL = identity. */
typedef struct comet_cuda_act_fmt {
    comet_cuda_act_kind kind;
    int K, B, n8;
    const int32_t *perm;
} comet_cuda_act_fmt;

/* When residual != NULL, x [T, C] += residual [T, C] (x keeps the sum); then
 * h = x * (1 / sqrtf(mean(x^2) + eps)) * norm [C], and act = h in format f (f->K == C),
 * quantized per token per block like comet_quant_act (bit for bit the same codes and
 * scales for the same h). */
comet_status comet_cuda_rmsnorm_quant(float *x, const float *residual, const float *norm, float eps,
                                      int T, const comet_cuda_act_fmt *f, void *act, void *stream);

/* Which form comet_cuda_rmsnorm_quant takes for T rows of K channels on the current device under
 * the environment of this moment (a static string): "cluster 2", "cluster 4" or "cluster 8"
 * (sm_90, up to 16 rows of up to 32768 channels: a thread-block cluster of that many CTAs a
 * row; COMET_CUDA_NORM_CLUSTER=0 turns it off, =2, 4 or 8 sets the CTAs, unset: 4), else
 * "row shared early", "row shared", "row global early" or "row global" (one CTA a row; the row
 * kept in shared memory up to 32768 channels, the gather's perm and norm loaded before the
 * reduction up to 64 rows; COMET_CUDA_NORM_SMEM=0: "row global"). Every form gives the same
 * bits. NULL with the error set for T < 1, K < 1 or a COMET_CUDA_NORM_CLUSTER that is not 0,
 * 2, 4 or 8 (which comet_cuda_rmsnorm_quant refuses with COMET_ERR_INVALID_ARG). */
const char *comet_cuda_rmsnorm_quant_form(int T, int K);

/* act = x [T, f->K] in format f (no norm). */
comet_status comet_cuda_act_quant(const float *x, int T, const comet_cuda_act_fmt *f, void *act,
                                  void *stream);

/* act = silu(gate) * up in format f: gate, up [T, f->K] fp32, v = g / (1 + expf(-g)) * u. */
comet_status comet_cuda_silu_mul_quant(const float *gate, const float *up, int T,
                                       const comet_cuda_act_fmt *f, void *act, void *stream);

#ifdef __cplusplus
}
#endif
#endif
