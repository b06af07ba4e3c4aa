/* attention.h — paged attention over the CUDA KV pool (attention.cu and its kernel
 * family: attention_plan.cuh, attention_prefill.cuh, attention_decode.cuh,
 * attention_combine.cuh, attention_quant.cuh): the step ops paged_attention,
 * paged_attention_quant and rope_attention_quant of backend.h, their plan (the tile list,
 * the key splits, the workspace) and their launch.
 *
 * Plain C header, no CUDA types: streams travel as void * (a cudaStream_t). Every pointer
 * is device memory owned by the caller unless marked "host". Launchers run on the current
 * device, queue their kernels on `stream` and return COMET_OK, COMET_ERR_INVALID_ARG /
 * COMET_ERR_UNSUPPORTED for shapes they do not take, or COMET_ERR_CUDA naming the op when
 * a launch fails; errors inside a kernel surface at the next synchronizing call.
 */
#ifndef COMET_BACKEND_CUDA_ATTENTION_H
#define COMET_BACKEND_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda_kv.h"
#include "backend/cuda/norm_quant.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The step's attention tiles (host memory): each run of up to COMET_CUDA_ATTN_TILE
 * consecutive tokens of one sequence, in sequence order, as (first token, sequence) pairs
 * into tiles [n_tiles, 2] when tiles is not NULL (comet_cuda_step_view.tiles once on the
 * device). token_indptr [n_seqs + 1] host, non-decreasing from 0. Returns n_tiles. */
int comet_cuda_attention_tiles(const int32_t *token_indptr, int n_seqs, int32_t *tiles);

/* Number of key splits the attention launch uses for this step (1 = no split) on a GPU
 * with n_sm multiprocessors (0: never split), and the bytes of workspace it then needs (0
 * for 1 split). Batch-invariant steps split only at fixed spans of keys (attention_common.cuh
 * ATT_SPAN), so any split count gives the same bits. */
int comet_cuda_attention_splits(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                int H, int n_sm);
size_t comet_cuda_attention_workspace_bytes(const comet_cuda_kv_layout *L,
                                            const comet_cuda_step_view *st, int H, int n_splits);

/* The kernel that comet_cuda_paged_attention runs for the prefill chunks (sequences with at
 * least 16 tokens in the step) of step st with H query heads over layout L, given q and out
 * 16-byte aligned: 3 the two-CTAs-an-SM tensor-core kernel of INT4 caches (attention_mma3.cuh,
 * st->attn_mma 3 only), 2 the pipelined tensor-core kernel (attention_mma2.cuh), 1 the first
 * tensor-core kernel (attention_mma.cuh), 0 the fp32 kernel (also for a decode step, a
 * batch-invariant one, a head dim other than 64 and 128, st->attn_mma 0, or H not a multiple
 * of L->Hkv). Host only: for tests and benchmarks that name the kernel they measure. */
int comet_cuda_attention_prefill_kernel(const comet_cuda_kv_layout *L,
                                        const comet_cuda_step_view *st, int H);

/* Bytes of dynamic shared memory a CTA of attn_mma3_kernel (attention_mma3.cuh) takes at head
 * dim 128, whatever the INT4 layout it reads (103,424: two CTAs fit an SM's 228 KB on sm_90,
 * one the 164 KB of sm_80). Host only: for a backend that weighs it against the device's
 * shared memory, and for benchmarks. */
size_t comet_cuda_attention_mma3_cta_bytes(void);

/* CTAs of attn_mma3_kernel at head dim 128 that one SM of the current device holds at once
 * (the occupancy calculator over its registers and shared memory, with the carveout its launch
 * asks for: 2 on sm_90), or 0 when the device refuses its attributes. Host only: for tests,
 * benchmarks and a backend's choice of kernel. */
int comet_cuda_attention_mma3_ctas_per_sm(void);

/* Causal GQA attention of q [T, H, D] over the pages of `layer` in storage (layout L):
 * token t attends to positions 0..positions[t] of its own sequence, scale 1/sqrtf(D),
 * softmax in fp32, K/V dequantized in registers; out [T, H, D]. The prefill chunks (a
 * sequence with at least 16 tokens in the step) at D 64 and 128 run on tensor cores with
 * q, V and the softmax weights rounded to fp16 (K an fp16 hi + lo pair; fp32 accumulation
 * and softmax), except in batch-invariant steps (attention_mma.cuh; with st->attn_mma 2 and
 * H / Hkv <= 8 its pipelined form attention_mma2.cuh, with st->attn_mma 3 over an INT4 cache
 * of groups up to D / 4 channels its two-CTAs-an-SM form attention_mma3.cuh, each the same
 * bits with one key split: comet_cuda_attention_prefill_kernel says which). Decode steps over an
 * INT4 cache at D 64 and 128 (KV groups of 16, 32, 64 or 128 channels, H / Hkv <= 8) run on
 * tensor cores with q and the softmax weights as fp16 hi + lo pairs, the codes exact
 * (attention_decode_mma.cuh; COMET_CUDA_ATTN_DECODE_MMA=0: the fp32 decode kernel). With
 * `rotate` the cache
 * holds H_D k and H_D v: q is rotated by H_D first and each output head rotated back.
 * n_splits > 1 splits each tile's keys over that many CTAs whose partial max / sum /
 * output go to workspace (comet_cuda_attention_workspace_bytes) and are combined by a
 * second kernel. COMET_ERR_UNSUPPORTED: D above 256 or not a multiple of 8, P above 256,
 * H / Hkv above the tile's rows. */
comet_status comet_cuda_paged_attention(const comet_cuda_kv_layout *L, const void *storage,
                                        int layer, const comet_cuda_step_view *st, const float *q,
                                        int H, float *out, int rotate, int n_splits,
                                        void *workspace, void *stream);

/* comet_cuda_paged_attention, then comet_cuda_act_quant(out, T, f, act) of its output (the
 * input of o_proj): out [T, H, D] and act (format f, f->K = H * D) the same bits as those two
 * calls give. A decode step whose keys are split (n_splits > 1) with a W4Ax format f, head dim
 * 64 or 128 and out 16-byte aligned (comet_cuda_attention_quant_fused) replaces the combine
 * kernel and the quantization kernel by one (attention_quant.cuh: per token one CTA merges
 * the splits, rotates back, keeps the row in shared memory and quantizes it);
 * COMET_CUDA_ATTN_QUANT_FUSED=0 (read at every call) runs the two kernels. Statuses as
 * comet_cuda_paged_attention and comet_cuda_act_quant. */
comet_status comet_cuda_paged_attention_quant(const comet_cuda_kv_layout *L, const void *storage,
                                              int layer, const comet_cuda_step_view *st,
                                              const float *q, int H, float *out, int rotate,
                                              int n_splits, void *workspace,
                                              const comet_cuda_act_fmt *f, void *act, void *stream);

/* 1 when comet_cuda_paged_attention_quant runs its fused kernel for these arguments (st's
 * host fields n_tokens, n_tiles and batch_invariant are read), else 0; reads
 * COMET_CUDA_ATTN_QUANT_FUSED as the launch does. Host only: for tests and benchmarks that
 * name the path they measure. */
int comet_cuda_attention_quant_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                     int H, int n_splits, const comet_cuda_act_fmt *f,
                                     const void *out);

/* comet_cuda_rope_kv_append(L, storage, layer, st, inv_freq, q, H, k, v, rotate), then
 * comet_cuda_paged_attention_quant(L, storage, layer, st, q, H, out, rotate, n_splits,
 * workspace, f, act), in one call: the pool, out [T, H, D] and act the same bits as those two
 * calls give. A decode step that attn_decode_mma_kernel takes (one token a sequence, an INT4
 * cache at head dim 64 or 128 with KV groups of 16 .. 128 channels, H / Hkv <= 8, not
 * batch-invariant: comet_cuda_rope_attention_fused) runs the step's RoPE and KV append inside
 * that kernel (attention_decode_mma.cuh, its ROPE form: every CTA RoPEs its query
 * heads in shared memory; the CTA whose key split holds the token's own key appends it
 * first), one kernel launch fewer; q and k are then left as given, while the two calls'
 * path (every other step, or COMET_CUDA_ROPE_ATTN_FUSED=0, read at every call) leaves them
 * RoPE'd: their contents after the call are unspecified. Statuses as the two calls. */
comet_status comet_cuda_rope_attention_quant(const comet_cuda_kv_layout *L, void *storage,
                                             int layer, const comet_cuda_step_view *st,
                                             const double *inv_freq, float *q, int H, float *k,
                                             const float *v, float *out, int rotate, int n_splits,
                                             void *workspace, const comet_cuda_act_fmt *f,
                                             void *act, void *stream);

/* 1 when comet_cuda_rope_attention_quant runs its fused kernel for these arguments (st's host
 * fields n_tokens, n_tiles and batch_invariant are read), else 0; reads
 * COMET_CUDA_ROPE_ATTN_FUSED (and COMET_CUDA_ATTN_DECODE_MMA) as the launch does. Host only:
 * for tests and benchmarks that name the path they measure. */
int comet_cuda_rope_attention_fused(const comet_cuda_kv_layout *L, const comet_cuda_step_view *st,
                                    int layer, int H);

#ifdef __cplusplus
}
#endif
#endif
