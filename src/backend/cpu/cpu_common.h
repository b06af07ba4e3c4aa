/* cpu_common.h — pieces shared by the CPU reference and fast backends: limits, the KV
 * append and the KV rotation around attention, and the step ops made of their primitives
 * (cpu_prims.h). */
#ifndef COMET_BACKEND_CPU_COMMON_H
#define COMET_BACKEND_CPU_COMMON_H

#include "backend/backend.h"

#define COMET_CPU_MAX_HEAD_DIM 256 /* D */
#define COMET_CPU_MAX_GQA_GROUP 32 /* H / Hkv */

/* The kv_append op of both CPU backends (it is a copy, nothing to speed up): writes this
 * step's k, v [T, Hkv, D] into the pages of `layer`; with kv->kv.type INT4 or INT8 each token's
 * K and V are quantized->dequantized per KV head group as stored (docs/numerics.md "KV cache",
 * simulated in fp32); with kv->kv.rotation hadamard each head is first multiplied by H_D
 * (comet_wht), so the cache holds the rotated (and quantized) K and V. */
comet_status comet_cpu_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                 const comet_batch *b, const float *k, const float *v);

/* A backend's attention over the cache as stored (the signature of comet_cpu_prims's
 * attention). */
typedef comet_status (*comet_cpu_attention_fn)(comet_backend *be, const comet_kv_cache *kv,
                                               int layer, const comet_batch *b, const float *q,
                                               int H, float *out);

/* The attention op of both CPU backends around their own `attend`: with
 * kv->kv.rotation == none it is `attend` itself; with hadamard (the cache holds H_D·k and
 * H_D·v per KV head, see comet_cpu_kv_append) it runs `attend` on H_D·q and rotates each
 * output head back by H_D, so the result equals unrotated attention over an unquantized
 * cache up to fp32 rounding. Needs a [T, H, D] fp32 temporary (COMET_ERR_NOMEM). */
comet_status comet_cpu_attention_rotated(comet_backend *be, const comet_kv_cache *kv, int layer,
                                         const comet_batch *b, const float *q, int H, float *out,
                                         comet_cpu_attention_fn attend);

/* The memory, weight, KV and step ops of both CPU backends (cpu_step.c, backend.h): made
 * of the calling backend's own fp32 primitives (cpu_prims.h). */
void *comet_cpu_alloc(comet_backend *be, size_t bytes);
void comet_cpu_free(comet_backend *be, void *p);
comet_status comet_cpu_copy(comet_backend *be, void *dst, const void *src, size_t bytes);
comet_status comet_cpu_sync(comet_backend *be);
comet_status comet_cpu_weights_load(comet_backend *be, const comet_model *m, comet_weights **out);
void comet_cpu_weights_free(comet_backend *be, comet_weights *w);
comet_status comet_cpu_kv_init(comet_backend *be, comet_kv_cache *kv);
void comet_cpu_kv_free(comet_backend *be, comet_kv_cache *kv);
comet_status comet_cpu_step_begin(comet_backend *be, const comet_batch *b, comet_step *st);
comet_status comet_cpu_embed_tokens(comet_backend *be, const comet_weights *w, const comet_step *st,
                                    float *x);
comet_status comet_cpu_rmsnorm_quant(comet_backend *be, const comet_weights *w, int layer,
                                     comet_group g, float *x, const float *residual, int T,
                                     void *act);
comet_status comet_cpu_act_quant(comet_backend *be, const comet_weights *w, int layer,
                                 comet_group g, const float *x, int T, void *act);
comet_status comet_cpu_silu_mul_quant(comet_backend *be, const comet_weights *w, int layer,
                                      const float *gate, const float *up, int T, void *act);
comet_status comet_cpu_matmul(comet_backend *be, const comet_weights *w, int layer, comet_role r,
                              const void *act, int T, float *y);
comet_status comet_cpu_matmul_group(comet_backend *be, const comet_weights *w, int layer,
                                    comet_group g, const void *act, int T, float *const *ys);
comet_status comet_cpu_rope_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                      const comet_step *st, const comet_rope_params *rp, float *q,
                                      int H, float *k, const float *v);
comet_status comet_cpu_paged_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                       const comet_step *st, const float *q, int H, float *out);
comet_status comet_cpu_lm_head(comet_backend *be, const comet_weights *w, const void *act,
                               const comet_step *st, float *logits);

/* Designated initializers of those ops, for a CPU backend's table. */
#define COMET_CPU_STEP_OPS                                                                         \
    .host_memory = 1, .alloc = comet_cpu_alloc, .free = comet_cpu_free, .upload = comet_cpu_copy,  \
    .download = comet_cpu_copy, .sync = comet_cpu_sync, .weights_load = comet_cpu_weights_load,    \
    .weights_free = comet_cpu_weights_free, .kv_init = comet_cpu_kv_init,                          \
    .kv_free = comet_cpu_kv_free, .step_begin = comet_cpu_step_begin,                              \
    .embed_tokens = comet_cpu_embed_tokens, .rmsnorm_quant = comet_cpu_rmsnorm_quant,              \
    .act_quant = comet_cpu_act_quant, .silu_mul_quant = comet_cpu_silu_mul_quant,                  \
    .matmul = comet_cpu_matmul, .matmul_group = comet_cpu_matmul_group,                           \
    .rope_kv_append = comet_cpu_rope_kv_append,                        \
    .paged_attention = comet_cpu_paged_attention, .lm_head = comet_cpu_lm_head

#endif
