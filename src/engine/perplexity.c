/* perplexity.c — the accuracy protocol of docs/numerics.md (see comet/perplexity.h). */
#include "engine/perplexity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/log.h"
#include "engine/runner.h"

comet_ppl_params comet_ppl_default_params(void) {
    return (comet_ppl_params){.ctx = 2048,
                              .max_windows = 0,
                              .chunk = 256,
                              .protocol = COMET_PPL_COMET,
                              .bos_id = -1,
                              .kv = {.type = -1, .group = 0, .rotation = -1}};
}

/* -log softmax(row)[target], in double */
static double token_nll(const float *row, int V, int32_t target) {
    float mx = row[0];
    for (int i = 1; i < V; i++)
        if (row[i] > mx)
            mx = row[i];
    double z = 0.0;
    for (int i = 0; i < V; i++)
        z += exp((double)row[i] - mx);
    return log(z) - ((double)row[target] - mx);
}

comet_status comet_perplexity(const comet_model *m, comet_backend *be, const int32_t *tokens,
                              size_t n_tokens, const comet_ppl_params *p, comet_ppl_result *out) {
    return comet_perplexity_observed(m, be, tokens, n_tokens, p, NULL, NULL, out);
}

comet_status comet_perplexity_observed(const comet_model *m, comet_backend *be,
                                       const int32_t *tokens, size_t n_tokens,
                                       const comet_ppl_params *p, comet_forward_input_fn observer,
                                       void *observer_user, comet_ppl_result *out) {
    const comet_model_config *c = &m->cfg;
    const int P = 16;
    int ctx = p->ctx, V = c->n_vocab;
    const int llama = p->protocol == COMET_PPL_LLAMA_CPP, bos = p->bos_id;
    if (ctx < (llama ? 4 : 2) || p->chunk <= 0 || p->max_windows < 0 ||
        (p->protocol != COMET_PPL_COMET && !llama) || bos >= V)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "perplexity: ctx must be >= %d (got %d), chunk > 0, max_windows "
                               ">= 0, a known protocol and a BOS id inside the vocabulary",
                               llama ? 4 : 2, ctx);
    if (ctx > c->n_ctx)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "perplexity: ctx %d exceeds the model's context of %d tokens", ctx,
                               c->n_ctx);
    if (p->tensor_parallel < 0 || p->tensor_parallel > COMET_MAX_TENSOR_PARALLEL)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "perplexity: tensor_parallel must be 0 (one device) or 1..%d "
                               "ranks, got %d",
                               COMET_MAX_TENSOR_PARALLEL, p->tensor_parallel);
    comet_kv_format kv;
    COMET_TRY(comet_kv_format_resolve(&p->kv, &m->kv, c->head_dim, "perplexity", &kv));
    if (observer && p->tensor_parallel)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "perplexity: observing the linears' inputs needs the model on one "
                               "device (tensor_parallel 0)");
    /* text tokens a window takes, and the stream length they come from */
    const size_t per = !llama && bos >= 0 ? (size_t)ctx - 1 : (size_t)ctx;
    const size_t stream = n_tokens + (llama && bos >= 0 ? 1 : 0);
    if (stream < (llama ? 2 : 1) * per)
        return comet_set_error(
            COMET_ERR_INVALID_ARG,
            "perplexity: the text has %zu tokens, fewer than %s of ctx %d; use "
            "a longer text or a smaller --ctx",
            n_tokens, llama ? "the two windows llama.cpp's protocol needs" : "one window", ctx);
    long n_windows = (long)(stream / per);
    if (p->max_windows > 0 && n_windows > p->max_windows)
        n_windows = p->max_windows;
    /* logits of window position j predict token j + 1; scored from position `first` */
    const int first = llama ? ctx / 2 : 0;
    int chunk = p->chunk < ctx ? p->chunk : ctx;
    int n_pages = (ctx + P - 1) / P;

    comet_status st = COMET_OK;
    comet_runner run = {0};
    comet_kv_seq seq = {0};
    float *logits = malloc((size_t)chunk * V * sizeof(float));
    int32_t *win = malloc((size_t)ctx * sizeof *win);
    if (!logits || !win) {
        st = comet_set_error(COMET_ERR_NOMEM, "perplexity: cannot allocate logits for %d tokens",
                             chunk);
        goto done;
    }
    comet_runner_params rp = {.max_batch_tokens = chunk,
                              .max_seqs = 1,
                              .n_pages = n_pages,
                              .page_size = P,
                              .tensor_parallel = p->tensor_parallel,
                              .kv = &kv};
    if ((st = comet_runner_init(&run, m, be, &rp)) < 0 ||
        (st = comet_forward_set_input_observer(run.fc, observer, observer_user)) < 0 ||
        (st = comet_kv_seq_init(&seq, ctx, P)) < 0)
        goto done;
    double nll = 0.0;
    long scored = 0;
    for (long w = 0; w < n_windows; w++) {
        if (llama) { /* window w of the stream [BOS] + tokens, BOS in place of its first */
            for (int j = 0; j < ctx; j++) {
                size_t k = (size_t)w * ctx + (size_t)j; /* index in the stream */
                win[j] = bos >= 0 ? (k == 0 ? bos : tokens[k - 1]) : tokens[k];
            }
            if (bos >= 0)
                win[0] = bos;
        } else if (bos >= 0) { /* BOS, then the next ctx - 1 text tokens */
            win[0] = bos;
            memcpy(win + 1, tokens + (size_t)w * per, per * sizeof *win);
        } else {
            memcpy(win, tokens + (size_t)w * per, per * sizeof *win);
        }
        comet_kv_seq_release(&run.pool, &seq); /* each window from an empty cache */
        for (int done = 0; done < ctx;) {
            int n = ctx - done < chunk ? ctx - done : chunk;
            st = comet_kv_seq_reserve(&run.pool, &seq, n);
            COMET_ASSERT(st != COMET_KV_FULL);
            if (st < 0)
                goto done;
            comet_batch_builder_reset(&run.bb);
            if ((st = comet_batch_builder_add(&run.bb, &seq, win + done, n, 2)) < 0 ||
                (st = comet_runner_step(&run, logits)) < 0)
                goto done;
            for (int i = 0; i < n && done + i + 1 < ctx; i++)
                if (done + i >= first) {
                    nll += token_nll(logits + (size_t)i * V, V, win[done + i + 1]);
                    scored++;
                }
            done += n;
        }
        if (!isfinite(nll)) {
            st = comet_set_error(COMET_ERR_NUMERIC,
                                 "perplexity: window %ld gives a non-finite NLL: a NaN or "
                                 "infinity arose in the forward pass",
                                 w + 1);
            goto done;
        }
        char suffix[64];
        snprintf(suffix, sizeof suffix, "PPL %.4f", exp(nll / (double)scored));
        comet_log_progress("perplexity: window", w + 1, n_windows, suffix);
    }
    out->nll_sum = nll;
    out->n_scored = scored;
    out->ppl = exp(nll / (double)scored);
    out->ctx = ctx;
    out->windows = (int)n_windows;
    st = COMET_OK;
done:
    comet_kv_seq_free(&seq);
    comet_runner_free(&run);
    free(logits);
    free(win);
    return st;
}
