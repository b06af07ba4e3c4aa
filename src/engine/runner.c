/* runner.c — the shared set-up of the forward pass, KV pool and batch builder (runner.h). */
#include "engine/runner.h"

#include <math.h>

#include <string.h>

comet_status comet_runner_init(comet_runner *r, const comet_model *m, comet_backend *be,
                               const comet_runner_params *p) {
    const comet_model_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    if (p->max_batch_tokens <= 0 || p->max_seqs <= 0 || p->n_pages <= 0 || p->page_size <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "runner: max_batch_tokens, max_seqs, n_pages and page_size must "
                               "be positive");
    r->m = m;
    r->be = be;
    comet_status st;
    if ((st = comet_kv_cache_init_on(be, &r->kv, c->n_layer, p->n_pages, p->page_size,
                                     c->n_head_kv, c->head_dim, m->kv_bits, m->kv_group,
                                     m->kv_rotation)) < 0 ||
        (st = comet_kv_pool_init(&r->pool, p->n_pages, p->page_size)) < 0 ||
        (st = comet_batch_builder_init(&r->bb, p->max_batch_tokens, p->max_seqs, p->n_pages,
                                       p->page_size)) < 0)
        goto fail;
    r->fc = comet_forward_init(m, be, p->max_batch_tokens);
    if (!r->fc) {
        st = comet_last_status();
        goto fail;
    }
    return COMET_OK;
fail:
    comet_runner_free(r);
    return st < 0 ? st : COMET_ERR_INTERNAL;
}

void comet_runner_free(comet_runner *r) {
    if (!r)
        return;
    comet_forward_free(r->fc);
    comet_batch_builder_free(&r->bb);
    comet_kv_pool_free(&r->pool);
    if (r->be)
        comet_kv_cache_free_on(r->be, &r->kv);
    memset(r, 0, sizeof *r);
}

comet_status comet_runner_step(comet_runner *r, float *logits) {
    return comet_forward(r->fc, &r->kv, &r->bb.batch, logits);
}

comet_status comet_logits_check(const float *row, int V) {
    for (int i = 0; i < V; i++)
        if (!isfinite(row[i]))
            return comet_set_error(COMET_ERR_NUMERIC,
                                   "the logits are not finite (logit %d is %g): a NaN or "
                                   "infinity arose in the forward pass, from the input or from "
                                   "weights or activations that overflow", i, (double)row[i]);
    return COMET_OK;
}
