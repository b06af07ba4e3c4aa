/* cpu_fast.h — the private state of the fast CPU backend (be->impl of
 * comet_backend_cpu_init), shared by its files: cpu_ops.c (the table, the linear layers,
 * norms, RoPE, elementwise ops, lm_head) and cpu_attention.c (attention over the pages). */
#ifndef COMET_BACKEND_CPU_FAST_H
#define COMET_BACKEND_CPU_FAST_H

#include "backend/cpu/cpu_prims.h"
#include "core/threads.h"

typedef struct comet_cpu_fast {
    comet_cpu_state base; /* first: comet_cpu_prims_of */
    comet_threadpool *tp;
    int n_threads;
    float **scratch;     /* [n_threads] per-thread attention scratch */
    size_t *scratch_cap; /* [n_threads] floats allocated */
} comet_cpu_fast;

/* Attention of the fast backend over the cache as stored (no KV rotation undone: that is
 * comet_cpu_attention_rotated's, around it), threaded on be's pool, batch-invariant
 * (cpu_attention.c). The signature of comet_cpu_attention_fn. COMET_OK, or COMET_ERR_NOMEM
 * when the per-thread scratch cannot grow. */
comet_status comet_cpu_fast_attention_stored(comet_backend *be, const comet_kv_cache *kv, int layer,
                                             const comet_batch *b, const float *q, int H,
                                             float *out);

#endif
