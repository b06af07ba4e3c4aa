/* model_ops.h — the CUDA backend's model kernels (model_ops.cu, attention.cu) behind the
 * step ops of backend.h: embedding, fused RMSNorm / SwiGLU + activation quantization,
 * RoPE + paged KV append, paged attention, the lm_head row gather and the fp32 -> fp16
 * weight conversion.
 * The GEMMs are not here: W4Ax goes through gemm_w4ax.h, FP16 through cuBLAS
 * (cuda_backend.c).
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer
 * is device memory owned by the caller unless marked "host". Launchers run on the current
 * device, queue their kernels on `stream` and return COMET_OK, COMET_ERR_INVALID_ARG /
 * COMET_ERR_UNSUPPORTED for shapes they do not take, or COMET_ERR_CUDA naming the op when
 * a launch fails; errors inside a kernel surface at the next synchronizing call.
 */
#ifndef COMET_BACKEND_CUDA_MODEL_OPS_H
#define COMET_BACKEND_CUDA_MODEL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_kv.h"
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

/* x[t, :] = embd[tokens[t] - row0, :] where that row is in [0, V), else zeros (a
 * tensor-parallel shard's table holds vocabulary rows row0 .. row0 + V - 1): embd [V, C]
 * fp32, tokens [T] (ids of the whole vocabulary, checked by the caller), x [T, C] fp32. */
comet_status comet_cuda_embed(const float *embd, int C, int row0, int V, const int32_t *tokens,
                              int T, float *x, void *stream);

/* When residual != NULL, x [T, C] += residual [T, C] (x keeps the sum); then
 * h = x * (1 / sqrtf(mean(x^2) + eps)) * norm [C], and act = h in format f (f->K == C),
 * quantized per token per block like comet_quant_act (bit for bit the same codes and
 * scales for the same h). */
comet_status comet_cuda_rmsnorm_quant(float *x, const float *residual, const float *norm, float eps,
                                      int T, const comet_cuda_act_fmt *f, void *act, void *stream);

/* act = x [T, f->K] in format f (no norm). */
comet_status comet_cuda_act_quant(const float *x, int T, const comet_cuda_act_fmt *f, void *act,
                                  void *stream);

/* act = silu(gate) * up in format f: gate, up [T, f->K] fp32, v = g / (1 + expf(-g)) * u. */
comet_status comet_cuda_silu_mul_quant(const float *gate, const float *up, int T,
                                       const comet_cuda_act_fmt *f, void *act, void *stream);

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

/* ---- the step's batch on the device, as the RoPE / KV / attention kernels read it ---- */

/* Tokens per attention tile (a tile never spans two sequences; see tiles below). */
#define COMET_CUDA_ATTN_TILE 16

typedef struct comet_cuda_step_view {
    int n_tokens, n_seqs;        /* T, S */
    const int32_t *positions;    /* [T] */
    const int32_t *token_indptr; /* [S + 1] */
    const int32_t *page_indptr;  /* [S + 1] */
    const int32_t *page_indices; /* [page_indptr[S]] */
    const int32_t *tiles;        /* [n_tiles, 2]: (first token, sequence) of each run of up
                                    * to COMET_CUDA_ATTN_TILE consecutive tokens of one
                                    * sequence, covering every token once */
    int n_tiles;
    int max_kv_len;      /* the longest sequence after the append (host value) */
    int batch_invariant; /* the backend's batch_invariant (backend.h): attention
                                    * then takes the tile kernel over fixed key spans */
} comet_cuda_step_view;

/* RoPE (rotate-half pairs (f, f + D/2), angle positions[t] * inv_freq[f] in double, cos
 * and sin rounded to float) on q [T, H, D] and k [T, Hkv, D] in place, then k and v
 * [T, Hkv, D] of every token written into `layer`'s pages of storage (layout L, cuda_kv.h)
 * at the token's position: rotated by the normalized Walsh-Hadamard transform when
 * `rotate` (comet_wht's butterfly order, D a power of two), then quantized per group like
 * comet_quant_kv_group (bit for bit the same codes, scales and zeros for the same input)
 * or stored as fp16. inv_freq [D/2] doubles. One kernel. */
comet_status comet_cuda_rope_kv_append(const comet_cuda_kv_layout *L, void *storage, int layer,
                                       const comet_cuda_step_view *st, const double *inv_freq,
                                       float *q, int H, float *k, const float *v, int rotate,
                                       void *stream);

/* Number of key splits the attention launch uses for this step (1 = no split) on a GPU
 * with n_sm multiprocessors (0: never split), and the bytes of workspace it then needs (0
 * for 1 split). Batch-invariant steps split only at fixed spans of keys (attention.cu
 * ATT_SPAN), so any split count gives the same bits. */
int comet_cuda_attention_splits(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                int H, int n_sm);
size_t comet_cuda_attention_workspace_bytes(const comet_cuda_kv_layout *L,
                                            const comet_cuda_step_view *st, int H, int n_splits);

/* Causal GQA attention of q [T, H, D] over the pages of `layer` in storage (layout L):
 * token t attends to positions 0..positions[t] of its own sequence, scale 1/sqrtf(D),
 * softmax in fp32, K/V dequantized in registers; out [T, H, D]. With `rotate` the cache
 * holds H_D k and H_D v: q is rotated by H_D first and each output head rotated back.
 * n_splits > 1 splits each tile's keys over that many CTAs whose partial max / sum /
 * output go to workspace (comet_cuda_attention_workspace_bytes) and are combined by a
 * second kernel. COMET_ERR_UNSUPPORTED: D above 256 or not a multiple of 8, P above 256,
 * H / Hkv above the tile's rows. */
comet_status comet_cuda_paged_attention(const comet_cuda_kv_layout *L, const void *storage,
                                        int layer, const comet_cuda_step_view *st, const float *q,
                                        int H, float *out, int rotate, int n_splits,
                                        void *workspace, void *stream);

/* ys split of a stacked GEMM output: outs[i] [T, widths[i]] = the columns of part i of y
 * [T, N] (parts side by side, N = their sum; n_parts <= 3); a NULL outs[i] is skipped.
 * Queued on stream. COMET_OK, COMET_ERR_INVALID_ARG, COMET_ERR_CUDA (launch). */
comet_status comet_cuda_unstack(const float *y, int T, int N, int n_parts, const int *widths,
                                float *const *outs, void *stream);

#ifdef __cplusplus
}
#endif
#endif
