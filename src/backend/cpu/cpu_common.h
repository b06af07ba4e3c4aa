/* cpu_common.h — pieces shared by the CPU reference and fast backends: limits and the
 * RoPE frequency table (so both rotate by exactly the same angles), the KV append and the
 * KV rotation around attention. */
#ifndef COMET_BACKEND_CPU_COMMON_H
#define COMET_BACKEND_CPU_COMMON_H

#include "backend/backend.h"

#define COMET_CPU_MAX_HEAD_DIM 256 /* D */
#define COMET_CPU_MAX_GQA_GROUP 32 /* H / Hkv */

/* inv_freq[i] for i < D/2: theta^(-2i/D), then the model's scaling: LINEAR divides by
 * factor; LLAMA3 applies Llama-3.1's wavelength-dependent blend (HF
 * _compute_llama3_parameters). inv_freq has room for D/2 doubles. */
void comet_cpu_rope_inv_freq(const comet_rope_params *rp, double *inv_freq);

/* The kv_append op of both CPU backends (it is a copy, nothing to speed up): writes this
 * step's k, v [T, Hkv, D] into the pages of `layer`; with kv->kv_bits 4 or 8 each token's
 * K and V are quantized->dequantized per KV head group as stored (NUMERICS.md "KV cache",
 * simulated in fp32); with kv->kv_rotation hadamard each head is first multiplied by H_D
 * (comet_wht), so the cache holds the rotated (and quantized) K and V. */
comet_status comet_cpu_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                 const comet_batch *b, const float *k, const float *v);

/* A backend's attention over the cache as stored (the backend_ops attention signature). */
typedef comet_status (*comet_cpu_attention_fn)(comet_backend *be, const comet_kv_cache *kv,
                                               int layer, const comet_batch *b,
                                               const float *q, int H, float *out);

/* The attention op of both CPU backends around their own `attend`: with
 * kv->kv_rotation == none it is `attend` itself; with hadamard (the cache holds H_D·k and
 * H_D·v per KV head, see comet_cpu_kv_append) it runs `attend` on H_D·q and rotates each
 * output head back by H_D, so the result equals unrotated attention over an unquantized
 * cache up to fp32 rounding. Needs a [T, H, D] fp32 temporary (COMET_ERR_NOMEM). */
comet_status comet_cpu_attention_rotated(comet_backend *be, const comet_kv_cache *kv, int layer,
                                         const comet_batch *b, const float *q, int H,
                                         float *out, comet_cpu_attention_fn attend);

#endif
