/* forward.c — the LLaMA decoder forward pass as a list of op-table calls.
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) ; q,k,v = h·Wq, h·Wk, h·Wv ; rope(q, k) ; kv_append(k, v)
 *       x += attention(q, KV cache) · Wo
 *       h = rmsnorm(x) ; x += (silu(h·Wgate) * h·Wup) · Wdown
 *   logits = rmsnorm(x)[rows] · lm_headᵀ
 *
 * Batch-first: every op sees all T tokens of the step at once, whatever sequences they
 * belong to; only attention and kv_append look at the batch's sequence structure.
 */
#include "model/forward.h"

#include <stdlib.h>

struct comet_forward_ctx {
    const comet_model *m;
    comet_backend *be;
    int max_tokens;
    comet_rope_params rope;
    float *x;    /* [T, C] residual stream */
    float *h;    /* [T, C] normalized */
    float *q;    /* [T, H*D] */
    float *k;    /* [T, Hkv*D] */
    float *v;    /* [T, Hkv*D] */
    float *att;  /* [T, H*D] attention output */
    float *tmp;  /* [T, C] projection output before the residual add */
    float *gate; /* [T, F] */
    float *up;   /* [T, F] */
};

void comet_forward_free(comet_forward_ctx *fc) {
    if (!fc)
        return;
    free(fc->x);
    free(fc->h);
    free(fc->q);
    free(fc->k);
    free(fc->v);
    free(fc->att);
    free(fc->tmp);
    free(fc->gate);
    free(fc->up);
    free(fc);
}

/* Every op the layer loop calls must be there: a backend may leave ops it does not have
 * yet NULL (the CUDA backend has only the W4Ax GEMM so far). */
static comet_status check_ops(const comet_backend *be) {
    const comet_backend_ops *op = be->ops;
    const struct {
        const char *name;
        int present;
    } need[] = {
        {"embed", op->embed != NULL},         {"rmsnorm", op->rmsnorm != NULL},
        {"linear", op->linear != NULL},       {"rope", op->rope != NULL},
        {"kv_append", op->kv_append != NULL}, {"attention", op->attention != NULL},
        {"silu_mul", op->silu_mul != NULL},   {"residual_add", op->residual_add != NULL},
        {"logits", op->logits != NULL},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i].present)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "forward: backend '%s' has no '%s' op yet; the forward pass "
                                   "needs it", op->name, need[i].name);
    return COMET_OK;
}

comet_forward_ctx *comet_forward_init(const comet_model *m, comet_backend *be,
                                      int max_batch_tokens) {
    const comet_model_config *c = &m->cfg;
    if (check_ops(be) < 0)
        return NULL;
    if (max_batch_tokens <= 0) {
        comet_set_error(COMET_ERR_INVALID_ARG, "forward: max_batch_tokens must be positive");
        return NULL;
    }
    comet_forward_ctx *fc = calloc(1, sizeof *fc);
    if (!fc) {
        comet_set_error(COMET_ERR_NOMEM, "forward: out of memory");
        return NULL;
    }
    size_t T = (size_t)max_batch_tokens;
    fc->m = m;
    fc->be = be;
    fc->max_tokens = max_batch_tokens;
    fc->x = malloc(T * c->n_embd * sizeof(float));
    fc->h = malloc(T * c->n_embd * sizeof(float));
    fc->q = malloc(T * c->n_head * c->head_dim * sizeof(float));
    fc->k = malloc(T * c->n_head_kv * c->head_dim * sizeof(float));
    fc->v = malloc(T * c->n_head_kv * c->head_dim * sizeof(float));
    fc->att = malloc(T * c->n_head * c->head_dim * sizeof(float));
    fc->tmp = malloc(T * c->n_embd * sizeof(float));
    fc->gate = malloc(T * c->n_ff * sizeof(float));
    fc->up = malloc(T * c->n_ff * sizeof(float));
    if (!fc->x || !fc->h || !fc->q || !fc->k || !fc->v || !fc->att || !fc->tmp || !fc->gate ||
        !fc->up) {
        comet_forward_free(fc);
        comet_set_error(COMET_ERR_NOMEM, "forward: cannot allocate the workspace for %d tokens",
                        max_batch_tokens);
        return NULL;
    }
    fc->rope = (comet_rope_params){
        .head_dim = c->head_dim,
        .theta = c->rope_theta,
        .scaling = c->rope_scaling,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .orig_ctx = c->rope_orig_ctx,
    };
    return fc;
}

int comet_forward_max_tokens(const comet_forward_ctx *fc) { return fc->max_tokens; }

static comet_status check_batch(const comet_forward_ctx *fc, const comet_kv_cache *kv,
                                const comet_batch *b) {
    const comet_model_config *c = &fc->m->cfg;
    if (b->n_tokens <= 0 || b->n_tokens > fc->max_tokens)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "forward: step of %d tokens; the workspace holds 1..%d",
                               b->n_tokens, fc->max_tokens);
    COMET_ASSERT(kv->n_layer == c->n_layer && kv->n_head_kv == c->n_head_kv &&
                 kv->head_dim == c->head_dim);
    COMET_ASSERT(b->token_indptr[0] == 0 && b->token_indptr[b->n_seqs] == b->n_tokens);
    for (int s = 0; s < b->n_seqs; s++) {
        int kv_len = comet_batch_kv_len(b, kv->page_size, s);
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= c->n_vocab)
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "forward: token id %d out of the vocabulary [0, %d)",
                                       b->tokens[t], c->n_vocab);
            if (b->positions[t] < 0 || b->positions[t] >= kv_len)
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "forward: position %d outside the %d KV slots of "
                                       "sequence %d",
                                       b->positions[t], kv_len, s);
        }
    }
    for (int r = 0; r < b->n_logits; r++)
        COMET_ASSERT(b->logit_rows[r] >= 0 && b->logit_rows[r] < b->n_tokens);
    return COMET_OK;
}

comet_status comet_forward(comet_forward_ctx *fc, comet_kv_cache *kv, const comet_batch *b,
                           float *logits) {
    const comet_model *m = fc->m;
    const comet_model_config *c = &m->cfg;
    const comet_backend_ops *op = fc->be->ops;
    comet_backend *be = fc->be;
    int T = b->n_tokens, C = c->n_embd, F = c->n_ff, H = c->n_head, Hkv = c->n_head_kv;
    COMET_TRY(check_batch(fc, kv, b));

    COMET_TRY(op->embed(be, m->tok_embd, C, b->tokens, T, fc->x));
    for (int l = 0; l < c->n_layer; l++) {
        const comet_layer_weights *w = &m->layers[l];
        COMET_TRY(op->rmsnorm(be, fc->x, w->attn_norm, T, C, c->rms_eps, fc->h));
        COMET_TRY(op->linear(be, &w->wq, fc->h, T, fc->q));
        COMET_TRY(op->linear(be, &w->wk, fc->h, T, fc->k));
        COMET_TRY(op->linear(be, &w->wv, fc->h, T, fc->v));
        COMET_TRY(op->rope(be, &fc->rope, b->positions, T, fc->q, H, fc->k, Hkv));
        COMET_TRY(op->kv_append(be, kv, l, b, fc->k, fc->v));
        COMET_TRY(op->attention(be, kv, l, b, fc->q, H, fc->att));
        COMET_TRY(op->linear(be, &w->wo, fc->att, T, fc->tmp));
        COMET_TRY(op->residual_add(be, fc->x, fc->tmp, T, C));

        COMET_TRY(op->rmsnorm(be, fc->x, w->ffn_norm, T, C, c->rms_eps, fc->h));
        COMET_TRY(op->linear(be, &w->w_gate, fc->h, T, fc->gate));
        COMET_TRY(op->linear(be, &w->w_up, fc->h, T, fc->up));
        COMET_TRY(op->silu_mul(be, fc->gate, fc->up, T, F, fc->gate));
        COMET_TRY(op->linear(be, &w->w_down, fc->gate, T, fc->tmp));
        COMET_TRY(op->residual_add(be, fc->x, fc->tmp, T, C));
    }
    if (b->n_logits == 0)
        return COMET_OK;
    COMET_TRY(op->rmsnorm(be, fc->x, m->output_norm, T, C, c->rms_eps, fc->h));
    return op->logits(be, fc->h, b->logit_rows, b->n_logits, m->lm_head, C, c->n_vocab, logits);
}
