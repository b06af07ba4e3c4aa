/* shard.c — a rank's view of a model for tensor parallelism (shard.h). */
#include "model/shard.h"

#include <stdlib.h>
#include <string.h>

/* first KV head of rank r (r = n: Hkv) */
static int kv_head_first(const comet_model_config *c, int n, int r) {
    return (int)((long)r * c->n_head_kv / n);
}

/* The FFN is cut at multiples of this many channels: down_proj's activation block where it
 * is quantized (the largest over the layers), else 1. */
static int ffn_unit(const comet_model *m) {
    int unit = 1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const comet_linear *d = &m->layers[l].w_down;
        if (d->fmt == COMET_WFMT_QSIM) {
            int b = d->block > 0 ? d->block : d->n_in;
            if (b > unit)
                unit = b;
        }
    }
    return unit;
}

/* first vocabulary row of rank r (r = n: V) */
static int vocab_first(const comet_model_config *c, int n, int r) {
    return (int)((long)r * c->n_vocab / n);
}

static int ffn_first(const comet_model *m, int n, int r) {
    int unit = ffn_unit(m), units = m->cfg.n_ff / unit;
    return (int)((long)r * units / n) * unit;
}

int comet_shard_o_split(const comet_model *m) {
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (m->layers[l].wo.fmt != COMET_WFMT_F32)
            return 0;
    return 1;
}

comet_status comet_shard_check(const comet_model *m, int n) {
    const comet_model_config *c = &m->cfg;
    if (n < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG, "tensor parallel: %d ranks; at least 1", n);
    if (c->n_head_kv < n)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "tensor parallel %d: the model has %d KV heads, and each rank "
                               "needs at least one",
                               n, c->n_head_kv);
    if (m->vocab_total)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "tensor parallel: the model is already a rank's shard");
    if (c->n_vocab < n)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "tensor parallel %d: the vocabulary has %d tokens", n, c->n_vocab);
    int unit = ffn_unit(m);
    if (c->n_ff % unit || c->n_ff / unit < n)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "tensor parallel %d: the FFN's %d channels make %d down_proj "
                               "blocks of %d, fewer than the ranks",
                               n, c->n_ff, c->n_ff / unit, unit);
    for (int l = 0; l < c->n_layer; l++) {
        const comet_linear *d = &m->layers[l].w_down;
        if (d->fmt == COMET_WFMT_QSIM && d->perm)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "tensor parallel: layer %d down_proj gathers its input by a "
                                   "permutation (not folded into gate_proj / up_proj), so "
                                   "its blocks mix every rank's FFN channels",
                                   l);
    }
    return COMET_OK;
}

/* Rows [r0, r0 + nr) of l (borrowed). */
static comet_linear linear_rows(const comet_linear *l, int r0, int nr) {
    comet_linear s = *l;
    size_t K = (size_t)l->n_in, nb = l->block > 0 ? K / (size_t)l->block : 1;
    s.n_out = nr;
    if (l->w)
        s.w = l->w + (size_t)r0 * K;
    if (l->qw)
        s.qw = l->qw + (size_t)r0 * (l->w_bits == 4 ? K / 2 : K);
    if (l->sw)
        s.sw = l->sw + (size_t)r0 * nb;
    return s;
}

static void *own(comet_shard *s, size_t bytes, comet_status *st) {
    if (*st < 0)
        return NULL;
    void *p = malloc(bytes ? bytes : 1);
    void **grown = p ? realloc(s->owned, (size_t)(s->n_owned + 1) * sizeof *grown) : NULL;
    if (!grown) {
        free(p);
        *st = comet_set_error(COMET_ERR_NOMEM, "tensor parallel: out of memory for a shard");
        return NULL;
    }
    s->owned = grown;
    s->owned[s->n_owned++] = p;
    return p;
}

/* Copy rows [0, N) of a [N, row_bytes] array's byte columns [c0, c0 + nc). */
static void copy_cols(void *dst, const void *src, size_t N, size_t row_bytes, size_t c0,
                      size_t nc) {
    for (size_t i = 0; i < N; i++)
        memcpy((char *)dst + i * nc, (const char *)src + i * row_bytes + c0, nc);
}

/* Input columns [c0, c0 + nc) of l (copied; c0 and nc multiples of its block). */
static comet_status linear_cols(comet_shard *s, const comet_linear *l, int c0, int nc,
                                comet_linear *out) {
    comet_status st = COMET_OK;
    size_t N = (size_t)l->n_out, K = (size_t)l->n_in;
    *out = *l;
    out->n_in = nc;
    out->perm_folded = NULL; /* the checkpoint's; the shard runs with it applied */
    if (l->w) {
        out->w = own(s, N * nc * sizeof(float), &st);
        if (out->w)
            copy_cols(out->w, l->w, N, K * sizeof(float), c0 * sizeof(float), nc * sizeof(float));
    }
    if (l->qw) { /* INT4: two channels per byte (c0 and nc are even); INT8: one */
        int int4 = l->w_bits == 4;
        size_t row = int4 ? K / 2 : K, b0 = int4 ? (size_t)c0 / 2 : (size_t)c0;
        size_t nbytes = int4 ? (size_t)nc / 2 : (size_t)nc;
        out->qw = own(s, N * nbytes, &st);
        if (out->qw)
            copy_cols(out->qw, l->qw, N, row, b0, nbytes);
    }
    if (l->sw) {
        size_t B = (size_t)l->block, nb = K / B;
        out->sw = own(s, N * (nc / B) * sizeof *l->sw, &st);
        if (out->sw)
            copy_cols(out->sw, l->sw, N, nb * sizeof *l->sw, c0 / B * sizeof *l->sw,
                      nc / B * sizeof *l->sw);
    }
    if (l->fmt == COMET_WFMT_QSIM && l->block > 0) {
        int b0 = c0 / l->block, b1 = (c0 + nc) / l->block, n8 = l->n8 - b0;
        out->n8 = n8 < 0 ? 0 : n8 > b1 - b0 ? b1 - b0 : n8;
    }
    return st;
}

comet_status comet_shard_make(const comet_model *m, int n, int rank, comet_shard *s) {
    memset(s, 0, sizeof *s);
    COMET_TRY(comet_shard_check(m, n));
    COMET_ASSERT(rank >= 0 && rank < n);
    const comet_model_config *c = &m->cfg;
    const int D = c->head_dim, G = c->n_head / c->n_head_kv;
    const int kv0 = kv_head_first(c, n, rank), kv1 = kv_head_first(c, n, rank + 1);
    const int f0 = ffn_first(m, n, rank), f1 = rank + 1 == n ? c->n_ff : ffn_first(m, n, rank + 1);
    const int head0 = kv0 * G;
    s->o_split = comet_shard_o_split(m);
    s->m = *m;
    s->m.owned = NULL, s->m.n_owned = s->m.cap_owned = 0;
    comet_model_config *sc = &s->m.cfg;
    sc->n_head_kv = kv1 - kv0;
    sc->n_head = sc->n_head_kv * G;
    sc->n_ff = f1 - f0;
    const int v0 = vocab_first(c, n, rank), C = c->n_embd;
    const float *lm = m->lm_head ? m->lm_head : m->tok_embd;
    s->m.vocab0 = v0;
    s->m.vocab_total = c->n_vocab;
    sc->n_vocab = vocab_first(c, n, rank + 1) - v0;
    s->m.tok_embd = m->tok_embd ? m->tok_embd + (size_t)v0 * C : NULL;
    s->m.lm_head = lm ? (float *)lm + (size_t)v0 * C : NULL;
    s->m.lm_head_q8 = m->lm_head_q8 ? m->lm_head_q8 + (size_t)v0 * C : NULL;
    s->m.lm_head_s8 = m->lm_head_s8 ? m->lm_head_s8 + v0 : NULL;
    s->m.layers = calloc((size_t)c->n_layer, sizeof *s->m.layers);
    if (!s->m.layers)
        return comet_set_error(COMET_ERR_NOMEM, "tensor parallel: out of memory for a shard");
    comet_status st = COMET_OK;
    for (int l = 0; l < c->n_layer && st >= 0; l++) {
        const comet_layer_weights *w = &m->layers[l];
        comet_layer_weights *sw = &s->m.layers[l];
        *sw = *w;
        sw->wq = linear_rows(&w->wq, head0 * D, sc->n_head * D);
        sw->wk = linear_rows(&w->wk, kv0 * D, sc->n_head_kv * D);
        sw->wv = linear_rows(&w->wv, kv0 * D, sc->n_head_kv * D);
        sw->w_gate = linear_rows(&w->w_gate, f0, sc->n_ff);
        sw->w_up = linear_rows(&w->w_up, f0, sc->n_ff);
        st = linear_cols(s, &w->w_down, f0, sc->n_ff, &sw->w_down);
        if (st >= 0 && s->o_split)
            st = linear_cols(s, &w->wo, head0 * D, sc->n_head * D, &sw->wo);
    }
    if (st < 0)
        comet_shard_free(s);
    return st;
}

void comet_shard_free(comet_shard *s) {
    if (!s)
        return;
    for (int i = 0; i < s->n_owned; i++)
        free(s->owned[i]);
    free(s->owned);
    free(s->m.layers);
    memset(s, 0, sizeof *s);
}

void comet_shard_vocab_cols(const comet_model *m, int n, int *col0) {
    for (int r = 0; r <= n; r++)
        col0[r] = vocab_first(&m->cfg, n, r);
}

void comet_shard_att_cols(const comet_model *m, int n, int *col0) {
    const comet_model_config *c = &m->cfg;
    const int G = c->n_head / c->n_head_kv;
    for (int r = 0; r <= n; r++)
        col0[r] = kv_head_first(c, n, r) * G * c->head_dim;
}
