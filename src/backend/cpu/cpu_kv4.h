/* cpu_kv4.h — the threaded CPU backend's quantized paged KV cache: K and V kept as INT4 (or
 * INT8) codes with an fp16 scale and zero per token, KV head and group of G channels, in the
 * CUDA backend's page layout (backend/cuda/cuda_kv.h, in host memory: kv->storage), and the
 * attention that dequantizes them as it reads. docs/numerics.md "KV cache" defines the codes
 * (comet_quant_kv_group); with the Hadamard rotation the stored vectors are H_D k and H_D v,
 * attention takes H_D q and rotates its output back.
 *
 * The fp32 simulation (cpu_common.h comet_cpu_kv_append: dequantized values in kv->k / kv->v)
 * stays the reference; this storage is used by the integer path (cpu_qstep.h) only.
 */
#ifndef COMET_BACKEND_CPU_KV4_H
#define COMET_BACKEND_CPU_KV4_H

#include "backend/backend.h"
#include "core/threads.h"

/* Storage for kv (fields n_layer .. kv set; kv.type INT4 or INT8): kv->storage, kv->storage_bytes,
 * zero-filled; kv->k and kv->v stay NULL. COMET_OK, COMET_ERR_INVALID_ARG (a group not
 * dividing D, a rotation with D not a power of two, D above 256 or odd), COMET_ERR_NOMEM. */
comet_status comet_cpu_kv4_init(comet_kv_cache *kv);
void comet_cpu_kv4_free(comet_kv_cache *kv);

/* Write this step's k, v [T, Hkv, D] (k after RoPE) into layer's pages at each token's
 * position: rotated when kv.rotation says, then quantized per group. COMET_OK. */
comet_status comet_cpu_kv4_append(comet_kv_cache *kv, int layer, const comet_batch *b,
                                  const float *k, const float *v);

/* Causal GQA attention of q [T, H, D] over each token's sequence, positions 0..positions[t],
 * from the codes: out [T, H, D] (the rotation undone). Threaded on tp (NULL: serial) over
 * (token, KV head, span of 128 keys at fixed positions) items, then a merge of each token's
 * spans in order; every output is one fixed sequence of operations, whatever the step and
 * the thread count. COMET_OK or COMET_ERR_NOMEM. */
comet_status comet_cpu_kv4_attention(comet_threadpool *tp, const comet_kv_cache *kv, int layer,
                                     const comet_batch *b, const float *q, int H, float *out);

#endif
