/* runner.c — the shared set-up of the forward pass, KV pool and batch builder (runner.h). */
#include "engine/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* listed ids (comet_sample_adj) the runner holds room for at first, per sequence:
 * llama.cpp's default repeat_last_n (64); grown on demand */
#define ADJ_PER_SEQ 64

comet_status comet_runner_init(comet_runner *r, const comet_model *m, comet_backend *be,
                               const comet_runner_params *p) {
    const comet_model_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    int n_pages = p->n_pages;
    if (p->max_batch_tokens <= 0 || p->max_seqs <= 0 || p->page_size <= 0 ||
        (n_pages <= 0 && (!p->size_pool || p->tensor_parallel > 0)))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "runner: max_batch_tokens, max_seqs, n_pages and page_size must "
                               "be positive (n_pages may be sized from memory on one device "
                               "only)");
    r->m = m;
    r->be = be;
    comet_status st;
    const comet_kv_format kv = p->kv ? *p->kv : m->kv;
    if (p->tensor_parallel < 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "runner: tensor_parallel %d; 0 or a rank "
                               "count",
                               p->tensor_parallel);
    if (p->tensor_parallel > 0) { /* the ranks hold the KV pages and the workspace */
        if ((st = comet_tp_init(m, be, p->tensor_parallel, p->max_batch_tokens, n_pages,
                                p->page_size, kv, &r->tp)) < 0)
            goto fail;
        r->fc = comet_tp_rank0(r->tp);
    } else {
        r->fc = comet_forward_init(m, be, p->max_batch_tokens);
        if (!r->fc) {
            st = comet_last_status();
            goto fail;
        }
        if (n_pages <= 0 && (st = p->size_pool(p->size_user, r->fc, &n_pages)) < 0)
            goto fail;
        COMET_ASSERT(n_pages > 0);
        if ((st = comet_kv_cache_init_on(be, &r->kv, c->n_layer, n_pages, p->page_size,
                                         c->n_head_kv, c->head_dim, kv)) < 0)
            goto fail;
    }
    if ((st = comet_kv_pool_init(&r->pool, n_pages, p->page_size)) < 0 ||
        (st = comet_batch_builder_init(&r->bb, p->max_batch_tokens, p->max_seqs, n_pages,
                                       p->page_size)) < 0)
        goto fail;
    st = comet_sampling_init(&r->sampling, p->max_batch_tokens, p->max_seqs * ADJ_PER_SEQ);
    if (st < 0)
        goto fail;
    return COMET_OK;
fail:
    comet_runner_free(r);
    return st < 0 ? st : COMET_ERR_INTERNAL;
}

void comet_runner_free(comet_runner *r) {
    if (!r)
        return;
    if (r->tp)
        comet_tp_free(r->tp); /* and rank 0's forward context */
    else
        comet_forward_free(r->fc);
    comet_sampling_free(&r->sampling);
    comet_batch_builder_free(&r->bb);
    comet_kv_pool_free(&r->pool);
    comet_kv_cache_free_on(r->be, &r->kv); /* unused with tensor parallelism: zeroed, no-op */
    memset(r, 0, sizeof *r);
}

/* One step of the batch b: on the one device, or on every rank. */
static comet_status forward(comet_runner *r, const comet_batch *b, float *logits) {
    return r->tp ? comet_tp_step(r->tp, b, logits) : comet_forward(r->fc, &r->kv, b, logits);
}

comet_status comet_runner_step(comet_runner *r, float *logits) {
    return forward(r, &r->bb.batch, logits);
}

comet_status comet_sampling_init(comet_sampling *s, int rows_cap, int adj_cap) {
    memset(s, 0, sizeof *s);
    s->rows = malloc((size_t)(rows_cap > 0 ? rows_cap : 1) * sizeof *s->rows);
    s->adj = malloc((size_t)(adj_cap > 0 ? adj_cap : 1) * sizeof *s->adj);
    if (!s->rows || !s->adj) {
        comet_sampling_free(s);
        return comet_set_error(COMET_ERR_NOMEM, "sampling: out of memory");
    }
    s->rows_cap = rows_cap;
    s->adj_cap = adj_cap;
    return COMET_OK;
}

void comet_sampling_free(comet_sampling *s) {
    free(s->rows);
    free(s->adj);
    memset(s, 0, sizeof *s);
}

/* Room for `need` listed ids. */
static comet_status adj_reserve(comet_sampling *s, int need) {
    if (need <= s->adj_cap)
        return COMET_OK;
    int cap = need > 2 * s->adj_cap ? need : 2 * s->adj_cap;
    comet_sample_adj *adj = realloc(s->adj, (size_t)cap * sizeof *adj);
    if (!adj)
        return comet_set_error(COMET_ERR_NOMEM, "sampling: out of memory for %d listed ids", need);
    s->adj = adj;
    s->adj_cap = cap;
    return COMET_OK;
}

comet_status comet_sampling_run(comet_sampling *s, comet_backend *be, const float *dev_logits,
                                int V, const comet_runner_draw *draws, int n, float *logits,
                                int32_t *ids) {
    if (n < 1)
        return COMET_OK;
    if (n > s->rows_cap || !be->ops->sample)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "sampling: %d rows on backend '%s' (room "
                               "for %d; op sample %s)",
                               n, be->ops->name, s->rows_cap,
                               be->ops->sample ? "present" : "missing");
    int n_adj = 0;
    for (int i = 0; i < n; i++) {
        comet_sampler *smp = draws[i].smp;
        COMET_TRY(adj_reserve(s, n_adj + comet_sampler_adjust_cap(smp, draws[i].n_history)));
        int k =
            comet_sampler_adjust_list(smp, draws[i].history, draws[i].n_history, s->adj + n_adj);
        s->rows[i] = comet_sampler_row(smp, i, n_adj, k);
        n_adj += k;
    }
    COMET_TRY(be->ops->sample(be, dev_logits, V, s->rows, n, s->adj, n_adj, ids));
    for (int i = 0; i < n; i++) {
        if (ids[i] >= 0)
            continue;
        float *row = logits + (size_t)i * V;
        COMET_TRY(
            be->ops->download(be, row, dev_logits + (size_t)i * V, (size_t)V * sizeof(float)));
        if (ids[i] == COMET_SAMPLE_ON_HOST) /* the listed ids are adjusted there already */
            ids[i] = comet_sampler_pick(draws[i].smp, row, s->rows[i].u);
    }
    return COMET_OK;
}

comet_status comet_runner_step_sample(comet_runner *r, const comet_runner_draw *draws,
                                      float *logits, int32_t *ids) {
    const comet_batch *b = &r->bb.batch;
    const int n = b->n_logits, V = r->m->cfg.n_vocab;
    comet_backend *be = r->be;
    if (!be->ops->sample || be->ops->host_memory) {
        COMET_TRY(forward(r, b, logits));
        for (int i = 0; i < n; i++) {
            float *row = logits + (size_t)i * V;
            ids[i] =
                comet_logits_check(row, V) < 0
                    ? COMET_SAMPLE_NONFINITE
                    : comet_sampler_sample(draws[i].smp, row, draws[i].history, draws[i].n_history);
        }
        return COMET_OK;
    }
    COMET_TRY(forward(r, b, NULL));
    return comet_sampling_run(&r->sampling, be, comet_forward_logits(r->fc), V, draws, n, logits,
                              ids);
}

comet_status comet_logits_check(const float *row, int V) {
    for (int i = 0; i < V; i++)
        if (!isfinite(row[i]))
            return comet_set_error(COMET_ERR_NUMERIC,
                                   "the logits are not finite (logit %d is %g): a NaN or "
                                   "infinity arose in the forward pass, from the input or from "
                                   "weights or activations that overflow",
                                   i, (double)row[i]);
    return COMET_OK;
}
