/* backend.h — the op table: the one seam between the model's layer loop and hardware.
 *
 * The forward pass (src/model/forward.c) is written once as a loop over layers calling
 * these function pointers; the CPU backend (scalar reference + threaded fast paths) and
 * the CUDA backend each fill one table. Tests run every op on two implementations and
 * compare (ARCHITECTURE.md "The op table"). Pointers passed to ops live in the backend's
 * memory space (host for CPU, device for CUDA). Ops return COMET_OK or a negative status
 * (never abort on a runtime failure); shape violations are bugs and assert.
 *
 * Shape letters: T tokens in the step, C hidden, F FFN, H/Hkv heads, D head dim, V vocab.
 * Activations are row-major [T, width] fp32.
 */
#ifndef COMET_BACKEND_H
#define COMET_BACKEND_H

#include <stdint.h>

#include "comet/model.h"
#include "model/batch.h"

typedef struct comet_backend comet_backend;

typedef struct comet_rope_params {
    int head_dim;        /* D (rotary over all D channels, rotate-half / NeoX pairing) */
    float theta;
    comet_rope_scaling scaling;
    float factor, low_freq_factor, high_freq_factor;
    int orig_ctx;
} comet_rope_params;

typedef struct comet_backend_ops {
    const char *name;

    /* x[t, :] = embd[tokens[t], :]. embd [V, C]; x [T, C]. */
    comet_status (*embed)(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                          int T, float *x);

    /* out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w. x, out [T, C] (may alias). */
    comet_status (*rmsnorm)(comet_backend *be, const float *x, const float *w, int T, int C,
                            float eps, float *out);

    /* y[T, N] = x[T, K] · Wᵀ, W per lin->fmt. */
    comet_status (*linear)(comet_backend *be, const comet_linear *lin, const float *x, int T,
                           float *y);

    /* Rotate q [T, H, D] and k [T, Hkv, D] in place by their positions [T]. */
    comet_status (*rope)(comet_backend *be, const comet_rope_params *rp, const int32_t *positions,
                         int T, float *q, int H, float *k, int Hkv);

    /* Write k, v [T, Hkv, D] of this step into the cache pages of `layer`, at each token's
     * position per the batch's page tables. */
    comet_status (*kv_append)(comet_backend *be, comet_kv_cache *kv, int layer,
                              const comet_batch *b, const float *k, const float *v);

    /* Causal GQA attention for every token of the batch over its sequence's cached
     * positions 0..positions[t] (this step's K/V already appended):
     * out[t, h, :] = softmax(q[t,h,:]·K[h/(H/Hkv)]ᵀ / sqrt(D)) · V. q, out [T, H, D]. */
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

    /* Release the backend's private state (be->impl) and be itself. */
    void (*destroy)(comet_backend *be);
} comet_backend_ops;

struct comet_backend {
    const comet_backend_ops *ops;
    int n_threads; /* CPU: worker threads */
    void *impl;    /* backend-private state */
};

/* The CPU backends. `ref` is the scalar single-threaded oracle; the default one uses
 * threads and OpenBLAS. n_threads <= 0 means all cores. comet_backend_cpu_init sets
 * OpenBLAS to one thread, process-wide (it threads around BLAS calls itself): code that
 * wants a threaded BLAS call afterwards sets openblas_set_num_threads() around it.
 * A backend is driven by one thread at a time (ops keep per-thread scratch). */
comet_backend *comet_backend_cpu_ref_init(void);
comet_backend *comet_backend_cpu_init(int n_threads);
/* Release a backend through its ops->destroy. NULL is a no-op. */
void comet_backend_free(comet_backend *be);

#endif
