/* cpu_prims.h — the fp32 primitives of the CPU backends: the building blocks their step ops
 * are made of (cpu_step.c), one table per backend (ref_ops.c: the scalar oracle; cpu_ops.c:
 * threaded and vectorized). Private to the CPU backends and their tests, which compare the
 * two tables op by op (tests/test_ops.c); the layer loop never sees them (backend.h).
 *
 * Every pointer is host memory, caller-owned. Shape letters as in backend.h: T tokens, C
 * hidden, F FFN, H/Hkv heads, D head dim, V vocab, K a linear's input width. The primitives
 * return COMET_OK or COMET_ERR_NOMEM (a temporary that does not fit); a shape outside the
 * limits of cpu_common.h asserts. */
#ifndef COMET_BACKEND_CPU_PRIMS_H
#define COMET_BACKEND_CPU_PRIMS_H

#include "backend/backend.h"

typedef struct comet_cpu_prims {
    /* x[t, :] = embd[tokens[t], :]. embd [V, C]; x [T, C]. */
    comet_status (*embed)(comet_backend *be, const float *embd, int C, const int32_t *tokens, int T,
                          float *x);

    /* out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w. x, out [T, C] (may alias). */
    comet_status (*rmsnorm)(comet_backend *be, const float *x, const float *w, int T, int C,
                            float eps, float *out);

    /* y[T, N] = x[T, K] · Wᵀ, W per lin->fmt (F32, or QSIM: x gathered by the group's
     * permutation and quantized->dequantized first, numerics/qlinear.h). */
    comet_status (*linear)(comet_backend *be, const comet_linear *lin, const float *x, int T,
                           float *y);

    /* Rotate q [T, H, D] and k [T, Hkv, D] in place by their positions [T]. */
    comet_status (*rope)(comet_backend *be, const comet_rope_params *rp, const int32_t *positions,
                         int T, float *q, int H, float *k, int Hkv);

    /* Write k, v [T, Hkv, D] of this step into the cache pages of `layer`, at each token's
     * position per the batch's page tables (comet_cpu_kv_append). */
    comet_status (*kv_append)(comet_backend *be, comet_kv_cache *kv, int layer,
                              const comet_batch *b, const float *k, const float *v);

    /* Causal GQA attention for every token of the batch over its sequence's cached
     * positions 0..positions[t] (this step's K/V already appended):
     * out[t, h, :] = softmax(q[t,h,:]·K[h/(H/Hkv)]ᵀ / sqrt(D)) · V. q, out [T, H, D]. The
     * KV rotation, if any, is undone inside (comet_cpu_attention_rotated). */
    comet_status (*attention)(comet_backend *be, const comet_kv_cache *kv, int layer,
                              const comet_batch *b, const float *q, int H, float *out);

    /* out[t, f] = silu(gate[t, f]) * up[t, f]; gate, up, out [T, F] (out may alias gate). */
    comet_status (*silu_mul)(comet_backend *be, const float *gate, const float *up, int T, int F,
                             float *out);

    /* x[T, C] += y[T, C]. */
    comet_status (*residual_add)(comet_backend *be, float *x, const float *y, int T, int C);

    /* logits[r, :] = x[rows[r], :] · lm_headᵀ for r < n_rows. x [T, C]; lm_head [V, C];
     * logits [n_rows, V]. */
    comet_status (*logits)(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                           const float *lm_head, int C, int V, float *logits);

    /* The INT8 lm_head (docs/numerics.md "lm_head"): logits[r, v] = s[v] * (x[rows[r], :] ·
     * q[v, :]) for r < n_rows; codes q [V, C], fp16 scale bits s [V]. */
    comet_status (*logits_q8)(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                              const int8_t *q, const uint16_t *s, int C, int V, float *logits);
} comet_cpu_prims;

/* The private state of a CPU backend (be->impl) begins with this. */
typedef struct comet_cpu_state {
    const comet_cpu_prims *prims;
} comet_cpu_state;

/* The primitives of CPU backend be (comet_backend_cpu_init or comet_backend_cpu_ref_init).
 * Asserts that be is one. */
static inline const comet_cpu_prims *comet_cpu_prims_of(const comet_backend *be) {
    COMET_ASSERT(be && be->ops->host_memory && be->impl);
    return ((const comet_cpu_state *)be->impl)->prims;
}

#endif
