/* calib.c — calibration through a wrapping backend (see calib.h). */
#include "quant/calib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_common.h"
#include "engine/perplexity.h"

typedef struct calib_backend {
    comet_backend base; /* base.impl points back to this struct */
    comet_backend *inner;
    const comet_model *m;
    comet_calib_stats *cs;
} calib_backend;

static comet_backend *inner(comet_backend *be) { return ((calib_backend *)be->impl)->inner; }

static comet_status c_embed(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                            int T, float *x) {
    comet_backend *in = inner(be);
    return in->ops->embed(in, embd, C, tokens, T, x);
}

static comet_status c_rmsnorm(comet_backend *be, const float *x, const float *w, int T, int C,
                              float eps, float *out) {
    comet_backend *in = inner(be);
    return in->ops->rmsnorm(in, x, w, T, C, eps, out);
}

/* Record the input of the first linear of each group, then run the linear. */
static comet_status c_linear(comet_backend *be, const comet_linear *lin, const float *x, int T,
                             float *y) {
    calib_backend *cb = be->impl;
    for (int l = 0; l < cb->m->cfg.n_layer; l++) {
        const comet_layer_weights *lw = &cb->m->layers[l];
        int g = lin == &lw->wq       ? COMET_QGROUP_QKV
                : lin == &lw->wo     ? COMET_QGROUP_O
                : lin == &lw->w_gate ? COMET_QGROUP_GATE_UP
                : lin == &lw->w_down ? COMET_QGROUP_DOWN
                                     : -1;
        if (g >= 0) {
            comet_calib_stats_observe(cb->cs, l, (comet_qgroup)g, x, T);
            break;
        }
    }
    return cb->inner->ops->linear(cb->inner, lin, x, T, y);
}

static comet_status c_rope(comet_backend *be, const comet_rope_params *rp,
                           const int32_t *positions, int T, float *q, int H, float *k, int Hkv) {
    comet_backend *in = inner(be);
    return in->ops->rope(in, rp, positions, T, q, H, k, Hkv);
}

static comet_status c_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                const comet_batch *b, const float *k, const float *v) {
    comet_backend *in = inner(be);
    return in->ops->kv_append(in, kv, layer, b, k, v);
}

static comet_status c_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                const comet_batch *b, const float *q, int H, float *out) {
    comet_backend *in = inner(be);
    return in->ops->attention(in, kv, layer, b, q, H, out);
}

static comet_status c_silu_mul(comet_backend *be, const float *gate, const float *up, int T,
                               int F, float *out) {
    comet_backend *in = inner(be);
    return in->ops->silu_mul(in, gate, up, T, F, out);
}

static comet_status c_residual_add(comet_backend *be, float *x, const float *y, int T, int C) {
    comet_backend *in = inner(be);
    return in->ops->residual_add(in, x, y, T, C);
}

static comet_status c_logits(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                             const float *lm_head, int C, int V, float *logits) {
    comet_backend *in = inner(be);
    return in->ops->logits(in, x, rows, n_rows, lm_head, C, V, logits);
}

/* The wrapping table forwards the fp32 primitives, and its step ops are the CPU ones made
 * of those primitives, so every linear input passes through c_linear. The W4Ax ops stay NULL:
 * calibration runs the fp32 (or simulated) model through `linear` to collect salience of
 * the linear inputs before any W4Ax weight exists, and the forward pass never calls them.
 * destroy stays NULL too: the wrapper lives on comet_calib_run's stack. */
static const comet_backend_ops calib_ops = {
    .name = "calibration",
    COMET_CPU_STEP_OPS,
    .embed = c_embed,
    .rmsnorm = c_rmsnorm,
    .linear = c_linear,
    .rope = c_rope,
    .kv_append = c_kv_append,
    .attention = c_attention,
    .silu_mul = c_silu_mul,
    .residual_add = c_residual_add,
    .logits = c_logits,
};

comet_status comet_calib_run(const comet_model *m, comet_backend *be, const int32_t *tokens,
                             size_t n_tokens, int n_windows, int window_len,
                             comet_calib_stats *cs, double *ppl) {
    if (n_windows <= 0 || window_len < 2)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "calibration: %d windows of %d tokens; positive counts (windows "
                               "of at least 2 tokens) would work",
                               n_windows, window_len);
    calib_backend cb = {.inner = be, .m = m, .cs = cs};
    cb.base.ops = &calib_ops;
    cb.base.n_threads = be->n_threads;
    cb.base.impl = &cb;
    comet_ppl_params p = comet_ppl_default_params();
    p.ctx = window_len;
    p.max_windows = n_windows;
    comet_ppl_result r;
    COMET_TRY(comet_perplexity(m, &cb.base, tokens, n_tokens, &p, &r));
    if (ppl)
        *ppl = r.ppl;
    return COMET_OK;
}

/* ---- statistics files --------------------------------------------------------------- */

#define CALIB_MAGIC "COMETCAL"
#define CALIB_VERSION 1

typedef struct calib_header {
    char magic[8];
    int32_t version;
    int32_t n_layer;
    int32_t width[COMET_QGROUP_COUNT];
    int32_t has_xtx;
    int64_t n_tokens;
    comet_calib_meta meta;
} calib_header;

comet_status comet_calib_stats_save(const comet_calib_stats *cs, const comet_calib_meta *meta,
                                    const char *path) {
    calib_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CALIB_MAGIC, 8);
    h.version = CALIB_VERSION;
    h.n_layer = cs->n_layer;
    for (int g = 0; g < COMET_QGROUP_COUNT; g++)
        h.width[g] = cs->width[g];
    h.has_xtx = cs->xtx[0] != NULL;
    h.n_tokens = cs->n_tokens;
    h.meta = *meta;
    FILE *f = fopen(path, "wb");
    if (!f)
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fwrite(&h, sizeof h, 1, f) != 1;
    for (int g = 0; g < COMET_QGROUP_COUNT && !bad; g++) {
        size_t K = (size_t)cs->width[g], n = (size_t)cs->n_layer * K;
        bad = fwrite(cs->sal[g], sizeof(float), n, f) != n;
        if (!bad && h.has_xtx)
            bad = fwrite(cs->xtx[g], sizeof(float), n * K, f) != n * K;
    }
    if (fclose(f) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: write failed", path);
    return COMET_OK;
}

/* The file name of a path: models and texts are matched by name, not by how the path to
 * them was spelled. */
static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

comet_status comet_calib_stats_load(const char *path, const comet_model_config *cfg,
                                    const comet_calib_meta *want, int need_xtx,
                                    comet_calib_stats **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return comet_set_error(COMET_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    calib_header h;
    comet_status st = COMET_OK;
    comet_calib_stats *cs = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, CALIB_MAGIC, 8) ||
        h.version != CALIB_VERSION) {
        st = comet_set_error(COMET_ERR_FORMAT, "%s: not a comet calibration statistics file "
                             "(version %d)", path, CALIB_VERSION);
        goto done;
    }
    h.meta.model[sizeof h.meta.model - 1] = h.meta.corpus[sizeof h.meta.corpus - 1] = '\0';
    int same_shape = h.n_layer == cfg->n_layer;
    for (int g = 0; g < COMET_QGROUP_COUNT; g++)
        same_shape &= h.width[g] == comet_qgroup_width(cfg, (comet_qgroup)g);
    if (!same_shape || strcmp(base_name(h.meta.model), base_name(want->model)) ||
        strcmp(base_name(h.meta.corpus), base_name(want->corpus)) ||
        h.meta.windows != want->windows || h.meta.window_len != want->window_len ||
        (need_xtx && !h.has_xtx)) {
        st = comet_set_error(COMET_ERR_INVALID_ARG,
                             "%s: statistics of %s on %s (%d windows x %d%s) do not match this "
                             "run (%s on %s, %d x %d%s)", path, h.meta.model, h.meta.corpus,
                             h.meta.windows, h.meta.window_len, h.has_xtx ? ", with XᵀX" : "",
                             want->model, want->corpus, want->windows, want->window_len,
                             need_xtx ? ", with XᵀX" : "");
        goto done;
    }
    if (!(cs = comet_calib_stats_init(cfg, h.has_xtx))) {
        st = COMET_ERR_NOMEM;
        goto done;
    }
    cs->n_tokens = h.n_tokens;
    for (int g = 0; g < COMET_QGROUP_COUNT && st == COMET_OK; g++) {
        size_t K = (size_t)cs->width[g], n = (size_t)cs->n_layer * K;
        if (fread(cs->sal[g], sizeof(float), n, f) != n ||
            (h.has_xtx && fread(cs->xtx[g], sizeof(float), n * K, f) != n * K))
            st = comet_set_error(COMET_ERR_FORMAT, "%s: truncated", path);
    }
done:
    fclose(f);
    if (st < 0) {
        comet_calib_stats_free(cs);
        return st;
    }
    *out = cs;
    return COMET_OK;
}
