/* runner.h — what every driver of the forward pass sets up the same way: a model bound to a
 * backend (its weights and workspace, model/forward.h), that backend's KV page storage and
 * the page allocator over it, and a batch builder. The engine (continuous batching),
 * comet_generate and comet_perplexity each own one; everything is sized once here, so their
 * step loops allocate nothing.
 */
#ifndef COMET_ENGINE_RUNNER_H
#define COMET_ENGINE_RUNNER_H

#include "backend/backend.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "model/forward.h"

typedef struct comet_runner_params {
    int max_batch_tokens; /* tokens per step (> 0) */
    int max_seqs;         /* sequences per step (> 0) */
    int n_pages;          /* KV pool pages (> 0) */
    int page_size;        /* P tokens per page (> 0) */
} comet_runner_params;

typedef struct comet_runner {
    const comet_model *m;   /* borrowed */
    comet_backend *be;      /* borrowed */
    comet_forward_ctx *fc;  /* the model on be */
    comet_kv_cache kv;      /* in be's memory: the model's kv_bits, kv_group, kv_rotation */
    comet_kv_pool pool;     /* page allocator over kv */
    comet_batch_builder bb; /* the step being built */
} comet_runner;

/* Set up r for model m on backend be (both borrowed; they must outlive r). The KV cache
 * takes the model's KV settings (m->kv_bits, kv_group, kv_rotation). COMET_OK, or the
 * first failure with comet_last_error() naming it (COMET_ERR_INVALID_ARG for sizes,
 * COMET_ERR_NOMEM, COMET_ERR_UNSUPPORTED for a backend that cannot run the model,
 * COMET_ERR_CUDA); r is then zeroed and owns nothing. */
comet_status comet_runner_init(comet_runner *r, const comet_model *m, comet_backend *be,
                               const comet_runner_params *p);

/* Release what r owns (not m or be). A zeroed r: no-op. */
void comet_runner_free(comet_runner *r);

/* Run the step built in r->bb; logits [n_logits, V] land in host `logits` (see
 * comet_forward). */
comet_status comet_runner_step(comet_runner *r, float *logits);

/* COMET_OK when the logits row [V] holds only finite values; else COMET_ERR_NUMERIC naming
 * the first value that is not (a NaN or infinity arose in the forward pass: an input or a
 * weight overflowed, or a quantized block held one, docs/numerics.md "Degenerate inputs"). */
comet_status comet_logits_check(const float *row, int V);

#endif
