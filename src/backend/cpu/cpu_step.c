/* cpu_step.c — the step ops, memory ops, weights and KV pool of both CPU backends (backend.h),
 * made of each backend's own fp32 primitives (cpu_prims.h: embed, rmsnorm, linear, rope,
 * kv_append, attention, silu_mul, residual_add, logits), so the reference and the fast
 * backend keep their own arithmetic and the layer loop runs the same on both.
 *
 * Memory is the host's; the weights are the model's own fp32 arrays (borrowed). A quantized
 * group's activation is the fp32 simulation of docs/numerics.md: x gathered by the group's
 * permutation and quantized->dequantized per token per block (numerics/qlinear.h), which the
 * group's linears then multiply by their dequantized weights. The threaded backend runs a
 * W4Ax checkpoint on its codes instead (cpu_qstep.h) unless told to simulate.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_kv4.h"
#include "backend/cpu/cpu_prims.h"
#include "backend/cpu/cpu_qstep.h"
#include "backend/kv_cache.h"
#include "numerics/qlinear.h"

struct comet_weights {
    const comet_model *m;
    comet_cpu_qmodel *q; /* the integer path (cpu_qstep.h), or NULL: the fp32 simulation */
    float *scratch; /* [scratch_floats] rows before the group's quantization */
    size_t scratch_floats;
};

void *comet_cpu_alloc(comet_backend *be, size_t bytes) {
    void *p = NULL;
    if (bytes == 0 || posix_memalign(&p, 256, bytes)) {
        comet_set_error(COMET_ERR_NOMEM, "%s backend: cannot allocate %zu MiB", be->ops->name,
                        bytes >> 20);
        return NULL;
    }
    return p;
}

void comet_cpu_free(comet_backend *be, void *p) { free(p); }

comet_status comet_cpu_copy(comet_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes)
        memmove(dst, src, bytes);
    return COMET_OK;
}

comet_status comet_cpu_sync(comet_backend *be) { return COMET_OK; }

comet_status comet_cpu_weights_load(comet_backend *be, const comet_model *m, comet_weights **out) {
    if (m->synthetic_seed)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s backend: the synthetic model '%s' has no weights in host "
                               "memory; it runs on --device cuda",
                               be->ops->name, m->name);
    comet_weights *w = calloc(1, sizeof *w);
    if (!w)
        return comet_set_error(COMET_ERR_NOMEM, "%s backend: out of memory", be->ops->name);
    w->m = m;
    if (!m->tok_embd && m->vocab_total) {
        free(w);
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s backend: a vocabulary shard of a model loaded with its codes "
                               "only; load it without keep_codes_only for tensor parallelism",
                               be->ops->name);
    }
    if (!be->simulate && comet_cpu_backend_pool(be) && comet_cpu_qmodel_eligible(m)) {
        comet_status st = comet_cpu_qmodel_init(be, m, COMET_W4AX_ISA_AUTO, &w->q);
        if (st < 0) {
            free(w);
            return st;
        }
    }
    for (int l = 0; !w->q && l < m->cfg.n_layer; l++)
        for (int r = 0; r < COMET_ROLE_COUNT; r++)
            if (!comet_model_linear(m, l, (comet_role)r)->w || !m->tok_embd) {
                free(w);
                return comet_set_error(COMET_ERR_UNSUPPORTED,
                                       "%s backend: model '%s' was loaded with its weight codes "
                                       "only (no fp32 weights), which the fp32 simulation needs; "
                                       "load it without keep_codes_only, or run it on the "
                                       "integer path (the 'cpu' backend without --simulate)",
                                       be->ops->name, m->name);
            }
    *out = w;
    return COMET_OK;
}

void comet_cpu_weights_free(comet_backend *be, comet_weights *w) {
    if (!w)
        return;
    comet_cpu_qmodel_free(w->q);
    free(w->scratch);
    free(w);
}

comet_status comet_cpu_kv_init(comet_backend *be, comet_kv_cache *kv) {
    if (!be->simulate && comet_cpu_backend_pool(be) && comet_kv_type_quantized(kv->kv.type))
        return comet_cpu_kv4_init(kv); /* codes in pages (cpu_kv4.h) */
    comet_kv_cache shape;
    COMET_TRY(comet_kv_cache_init(&shape, kv->n_layer, kv->n_pages, kv->page_size, kv->n_head_kv,
                                  kv->head_dim));
    kv->k = shape.k;
    kv->v = shape.v;
    return COMET_OK;
}

void comet_cpu_kv_free(comet_backend *be, comet_kv_cache *kv) {
    comet_cpu_kv4_free(kv);
    comet_kv_cache_free(kv);
}

comet_status comet_cpu_step_begin(comet_backend *be, const comet_batch *b, comet_step *st) {
    st->host = *b;
    st->dev = *b;
    st->max_kv_len = 0;
    st->max_q_len = 0;
    return COMET_OK;
}

comet_status comet_cpu_embed_tokens(comet_backend *be, const comet_weights *w, const comet_step *st,
                                    float *x) {
    const comet_model *m = w->m;
    const int C = m->cfg.n_embd;
    if (!m->tok_embd) /* keep_codes_only: fp16 table, whole vocabulary (weights_load) */
        return comet_cpu_q_embed_f16(be, m, st->dev.tokens, st->dev.n_tokens, x);
    if (!m->vocab_total)
        return comet_cpu_prims_of(be)->embed(be, m->tok_embd, C, st->dev.tokens, st->dev.n_tokens,
                                             x);
    for (int t = 0; t < st->dev.n_tokens; t++) { /* a shard: its rows, zeros for the others */
        int row = st->dev.tokens[t] - m->vocab0;
        if (row >= 0 && row < m->cfg.n_vocab)
            memcpy(x + (size_t)t * C, m->tok_embd + (size_t)row * C, (size_t)C * sizeof *x);
        else
            memset(x + (size_t)t * C, 0, (size_t)C * sizeof *x);
    }
    return COMET_OK;
}

/* The group's first linear: its permutation, block, n8 and a_bits are the group's. */
static const comet_linear *group_linear(const comet_model *m, int layer, comet_group g) {
    static const comet_role first[COMET_GROUP_COUNT] = {COMET_ROLE_Q, COMET_ROLE_O, COMET_ROLE_GATE,
                                                        COMET_ROLE_DOWN, COMET_ROLE_COUNT};
    if (g == COMET_GROUP_LM_HEAD)
        return NULL;
    return comet_model_linear(m, layer, first[g]);
}

static int group_quantized(const comet_linear *lin) { return lin && lin->fmt == COMET_WFMT_QSIM; }

/* A [n] fp32 scratch owned by w, grown when a larger step comes. */
static float *scratch(comet_weights *w, size_t n) {
    if (w->scratch_floats < n) {
        float *p = realloc(w->scratch, n * sizeof *p);
        if (!p) {
            comet_set_error(COMET_ERR_NOMEM, "cpu backend: cannot grow scratch to %zu MiB",
                            n * sizeof *p >> 20);
            return NULL;
        }
        w->scratch = p;
        w->scratch_floats = n;
    }
    return w->scratch;
}

comet_status comet_cpu_rmsnorm_quant(comet_backend *be, const comet_weights *cw, int layer,
                                     comet_group g, float *x, const float *residual, int T,
                                     void *act) {
    comet_weights *w = (comet_weights *)cw;
    const comet_model *m = w->m;
    int C = m->cfg.n_embd;
    const float *norm = comet_model_norm(m, layer, g);
    COMET_ASSERT(norm);
    if (w->q && g != COMET_GROUP_LM_HEAD)
        return comet_cpu_q_rmsnorm_quant(be, w->q, layer, g, x, residual, T, act);
    if (residual)
        COMET_TRY(comet_cpu_prims_of(be)->residual_add(be, x, residual, T, C));
    const comet_linear *lin = group_linear(m, layer, g);
    if (!group_quantized(lin))
        return comet_cpu_prims_of(be)->rmsnorm(be, x, norm, T, C, m->cfg.rms_eps, act);
    float *h = scratch(w, (size_t)T * C);
    if (!h)
        return COMET_ERR_NOMEM;
    COMET_TRY(comet_cpu_prims_of(be)->rmsnorm(be, x, norm, T, C, m->cfg.rms_eps, h));
    comet_qlinear_input(lin, h, T, act);
    return COMET_OK;
}

comet_status comet_cpu_act_quant(comet_backend *be, const comet_weights *w, int layer,
                                 comet_group g, const float *x, int T, void *act) {
    if (w->q)
        return comet_cpu_q_act_quant(be, w->q, layer, g, x, T, act);
    const comet_linear *lin = group_linear(w->m, layer, g);
    if (group_quantized(lin))
        comet_qlinear_input(lin, x, T, act);
    else
        memcpy(act, x, (size_t)T * comet_group_width(w->m, g) * sizeof(float));
    return COMET_OK;
}

comet_status comet_cpu_silu_mul_quant(comet_backend *be, const comet_weights *cw, int layer,
                                      const float *gate, const float *up, int T, void *act) {
    comet_weights *w = (comet_weights *)cw;
    if (w->q)
        return comet_cpu_q_silu_mul_quant(be, w->q, layer, gate, up, T, act);
    int F = w->m->cfg.n_ff;
    const comet_linear *lin = group_linear(w->m, layer, COMET_GROUP_DOWN);
    if (!group_quantized(lin))
        return comet_cpu_prims_of(be)->silu_mul(be, gate, up, T, F, act);
    float *h = scratch(w, (size_t)T * F);
    if (!h)
        return COMET_ERR_NOMEM;
    COMET_TRY(comet_cpu_prims_of(be)->silu_mul(be, gate, up, T, F, h));
    comet_qlinear_input(lin, h, T, act);
    return COMET_OK;
}

/* The act is already the group's input: the linear runs without gathering or quantizing
 * again (a QSIM linear as an identity-permuted, unquantized-input one), so each backend's
 * own linear multiplies it as before. */
comet_status comet_cpu_matmul(comet_backend *be, const comet_weights *w, int layer, comet_role r,
                              const void *act, int T, float *y) {
    if (w->q)
        return comet_cpu_q_matmul(be, w->q, layer, r, act, T, y);
    const comet_linear *orig = comet_model_linear(w->m, layer, r);
    if (orig->fmt != COMET_WFMT_QSIM)
        return comet_cpu_prims_of(be)->linear(be, orig, act, T, y);
    comet_linear lin = *orig;
    lin.perm = NULL;
    lin.a_bits = 16;
    return comet_cpu_prims_of(be)->linear(be, &lin, act, T, y);
}

comet_status comet_cpu_matmul_group(comet_backend *be, const comet_weights *w, int layer,
                                    comet_group g, const void *act, int T, float *const *ys) {
    if (w->q)
        return comet_cpu_q_matmul_group(be, w->q, layer, g, act, T, ys);
    comet_role roles[3];
    for (int i = 0, n = comet_group_roles(g, roles); i < n; i++)
        COMET_TRY(comet_cpu_matmul(be, w, layer, roles[i], act, T, ys[i]));
    return COMET_OK;
}

comet_status comet_cpu_rope_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                      const comet_step *st, const comet_rope_params *rp, float *q,
                                      int H, float *k, const float *v) {
    COMET_TRY(comet_cpu_prims_of(be)->rope(be, rp, st->dev.positions, st->dev.n_tokens, q, H, k,
                                           kv->n_head_kv));
    if (kv->storage)
        return comet_cpu_kv4_append(kv, layer, &st->dev, k, v);
    return comet_cpu_prims_of(be)->kv_append(be, kv, layer, &st->dev, k, v);
}

comet_status comet_cpu_paged_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                       const comet_step *st, const float *q, int H, float *out) {
    if (kv->storage)
        return comet_cpu_kv4_attention(comet_cpu_backend_pool(be), kv, layer, &st->dev, q, H, out);
    return comet_cpu_prims_of(be)->attention(be, kv, layer, &st->dev, q, H, out);
}

comet_status comet_cpu_lm_head(comet_backend *be, const comet_weights *w, const void *act,
                               const comet_step *st, float *logits) {
    const comet_model_config *c = &w->m->cfg;
    if (w->m->lm_head_q8)
        return comet_cpu_prims_of(be)->logits_q8(be, act, st->dev.logit_rows, st->dev.n_logits,
                                                 w->m->lm_head_q8, w->m->lm_head_s8, c->n_embd,
                                                 c->n_vocab, logits);
    if (!w->m->lm_head)
        return comet_cpu_q_lm_head_f16(be, w->m, act, st->dev.logit_rows, st->dev.n_logits,
                                       logits);
    return comet_cpu_prims_of(be)->logits(be, act, st->dev.logit_rows, st->dev.n_logits,
                                          w->m->lm_head, c->n_embd, c->n_vocab, logits);
}
