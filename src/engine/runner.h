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
#include "engine/sampler.h"
#include "engine/tp.h"
#include "model/forward.h"

/* One token to pick from a step's logits row (comet_runner_step_sample). */
typedef struct comet_runner_draw {
    comet_sampler *smp;     /* the sequence's sampler: its parameters and random stream */
    const int32_t *history; /* the penalties' history, oldest first; NULL when n_history is 0 */
    int n_history;
} comet_runner_draw;

/* Host scratch for sampling where the logits are: a comet_sample_row per logits row (up to
 * rows_cap) and the rows' listed ids (backend.h comet_sample_adj; grown when a step's
 * histories and logit biases need more). */
typedef struct comet_sampling {
    comet_sample_row *rows;
    int rows_cap;
    comet_sample_adj *adj;
    int adj_cap;
} comet_sampling;

/* COMET_OK or COMET_ERR_NOMEM (s zeroed). comet_sampling_free of a zeroed s: no-op. */
comet_status comet_sampling_init(comet_sampling *s, int rows_cap, int adj_cap);
void comet_sampling_free(comet_sampling *s);

/* Pick ids[i] for the rows i < n (<= rows_cap) of dev_logits [n, V], in the memory of be,
 * whose op `sample` must exist, by draws[i] (see comet_runner_step_sample; logits: host
 * [n, V] scratch for the rows picked on the host or not finite). The rows are modified
 * (logit_bias and penalties applied). COMET_OK, COMET_ERR_NOMEM, or the backend's failure. */
comet_status comet_sampling_run(comet_sampling *s, comet_backend *be, const float *dev_logits,
                                int V, const comet_runner_draw *draws, int n, float *logits,
                                int32_t *ids);

typedef struct comet_runner_params {
    int max_batch_tokens;      /* tokens per step (> 0) */
    int max_seqs;              /* sequences per step (> 0) */
    int n_pages;               /* KV pool pages (> 0) */
    int page_size;             /* P tokens per page (> 0) */
    int tensor_parallel;       /* 0: the model on `be` alone; N >= 1: split over N ranks
                                * (engine/tp.h), `be` rank 0 and peers of its kind */
    const comet_kv_format *kv; /* the KV cache's format (checked by the KV pool); NULL: the
                                * model's m->kv */
    /* With n_pages <= 0 (one device only): called once the weights and workspace are on the
     * backend, before the KV pool exists, to choose the pool's pages (> 0) into *n_pages;
     * a negative status fails the init with it. */
    comet_status (*size_pool)(void *user, const comet_forward_ctx *fc, int *n_pages);
    void *size_user;
} comet_runner_params;

typedef struct comet_runner {
    const comet_model *m;    /* borrowed */
    comet_backend *be;       /* borrowed */
    comet_forward_ctx *fc;   /* the model on be (with tensor parallelism: rank 0's shard) */
    comet_kv_cache kv;       /* in be's memory, in p->kv's format (default: the model's)
                              * (with tensor parallelism: unused, each rank holds its own) */
    comet_tp *tp;            /* the ranks (tensor_parallel > 0), or NULL */
    comet_kv_pool pool;      /* page allocator over kv */
    comet_batch_builder bb;  /* the step being built */
    comet_sampling sampling; /* comet_runner_step_sample's host scratch */
} comet_runner;

/* Set up r for model m on backend be (both borrowed; they must outlive r): the weights and
 * workspace first, then the KV pool (sized by p->size_pool when p->n_pages <= 0) and the
 * batch builder. The KV cache takes p->kv's format, or the model's (m->kv) when that is NULL. COMET_OK, or the
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

/* Run the step built in r->bb and pick the next token of each of its n_logits rows: ids[i]
 * from row i by draws[i], exactly as comet_sampler_sample(draws[i].smp, row i,
 * draws[i].history, draws[i].n_history) would on the host (up to the rounding of double
 * sums: sampler.h). On a backend with the op `sample` (CUDA) the logits stay in its memory
 * and only the ids come back; a row whose candidates the device cannot sort is downloaded
 * and picked on the host (backend.h COMET_SAMPLE_ON_HOST). Elsewhere the rows land in
 * `logits` and are sampled there.
 * logits: host [n_logits, V] scratch. ids[i] == COMET_SAMPLE_NONFINITE when row i holds a
 * NaN or an infinity; row i of `logits` then holds it, and comet_logits_check names it;
 * the other rows are picked. Returns COMET_OK or the step's failure (comet_runner_step);
 * COMET_ERR_NOMEM when the listed ids do not fit. */
comet_status comet_runner_step_sample(comet_runner *r, const comet_runner_draw *draws,
                                      float *logits, int32_t *ids);

/* COMET_OK when the logits row [V] holds only finite values; else COMET_ERR_NUMERIC naming
 * the first value that is not (a NaN or infinity arose in the forward pass: an input or a
 * weight overflowed, or a quantized block held one, docs/numerics.md "Degenerate inputs"). */
comet_status comet_logits_check(const float *row, int V);

#endif
