/* rotate.c — the residual-stream rotation folded into the weights (rotate.h).
 *
 * The residual stream x [C] of a LLaMA decoder is only ever read through an RMSNorm and
 * written by adding a linear's output, so for any orthogonal Q [C, C] the model whose
 * stream is x·Q computes the same logits:
 *   - RMSNorm weights g first go into the linears that read them (W := W·diag(g), g := 1),
 *     because RMSNorm(x·Q) = RMSNorm(x)·Q holds only without a per-channel weight;
 *   - the embedding and every linear that reads the stream (q, k, v, gate, up, lm_head)
 *     take W := W·Q; the two that write it (o, down) take W := Qᵀ·W.
 * Q is a random orthogonal matrix (QR of a Gaussian matrix, columns signed so that it is
 * uniformly distributed): it spreads each outlier channel of the stream over all C
 * channels, which is what 4-bit activation blocks need. Offline only: the runtime path and
 * every kernel stay as they are.
 */
#include "quant/rotate.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A standard normal draw (Box-Muller) from the stream x. */
static double gauss(uint64_t *x) {
    double u1 = ((double)(splitmix(x) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(splitmix(x) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

comet_status comet_rotation_orthogonal(int n, uint64_t seed, float *q_out) {
    double *a = malloc((size_t)n * n * sizeof *a), *tau = malloc((size_t)n * sizeof *tau);
    double *sign = malloc((size_t)n * sizeof *sign);
    comet_status st = COMET_OK;
    if (!a || !tau || !sign) {
        st = comet_set_error(COMET_ERR_NOMEM, "rotation: out of memory for a %d x %d matrix", n, n);
        goto out;
    }
    uint64_t x = seed;
    for (size_t i = 0; i < (size_t)n * n; i++)
        a[i] = gauss(&x);
    int info = LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, n, n, a, n, tau);
    for (int i = 0; i < n && info == 0; i++) /* Haar: Q's columns times sign(R's diagonal) */
        sign[i] = a[(size_t)i * n + i] < 0 ? -1.0 : 1.0;
    if (info == 0)
        info = LAPACKE_dorgqr(LAPACK_ROW_MAJOR, n, n, n, a, n, tau);
    if (info != 0) {
        st = comet_set_error(COMET_ERR_INTERNAL,
                             "rotation: LAPACK QR of a %d x %d Gaussian "
                             "matrix failed (info %d)",
                             n, n, info);
        goto out;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            q_out[(size_t)i * n + j] = (float)(a[(size_t)i * n + j] * sign[j]);
out:
    free(a);
    free(tau);
    free(sign);
    return st;
}

/* w [rows, C] := w·diag(g) (g may be NULL: no-op). */
static void scale_cols(float *w, int rows, int C, const float *g) {
    if (!g)
        return;
    for (size_t r = 0; r < (size_t)rows; r++)
        for (int j = 0; j < C; j++)
            w[r * C + j] *= g[j];
}

/* w [rows, C] := w·Q, through tmp [rows, C]. */
static void right_rotate(float *w, int rows, int C, const float *q, float *tmp) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, C, 1.0f, w, C, q, C, 0.0f, tmp,
                C);
    memcpy(w, tmp, (size_t)rows * C * sizeof *w);
}

/* w [C, cols] := Qᵀ·w, through tmp [C, cols]. */
static void left_rotate(float *w, int C, int cols, const float *q, float *tmp) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, cols, C, 1.0f, q, C, w, cols, 0.0f, tmp,
                cols);
    memcpy(w, tmp, (size_t)C * cols * sizeof *w);
}

static int plain(const comet_linear *l) { return l->fmt == COMET_WFMT_F32 && l->w; }

/* q [C, C] := identity on the channels keep[0..n_keep), a random orthogonal matrix of
 * order C - n_keep on the others. */
static comet_status rotation_keeping(int C, uint64_t seed, const int *keep, int n_keep, float *q) {
    const int n = C - n_keep;
    int *rest = malloc((size_t)(n > 0 ? n : 1) * sizeof *rest);
    unsigned char *kept = calloc((size_t)C, 1);
    float *sub = malloc((size_t)(n > 0 ? n : 1) * (n > 0 ? n : 1) * sizeof *sub);
    comet_status st = COMET_OK;
    if (!rest || !kept || !sub) {
        st = comet_set_error(COMET_ERR_NOMEM, "rotation: out of memory");
        goto out;
    }
    for (int i = 0; i < n_keep; i++) {
        if (keep[i] < 0 || keep[i] >= C || kept[keep[i]]) {
            st = comet_set_error(COMET_ERR_INVALID_ARG,
                                 "rotation: kept channel %d is outside "
                                 "0..%d or listed twice",
                                 keep[i], C - 1);
            goto out;
        }
        kept[keep[i]] = 1;
    }
    for (int j = 0, k = 0; j < C; j++)
        if (!kept[j])
            rest[k++] = j;
    if (n > 0 && (st = comet_rotation_orthogonal(n, seed, sub)) < 0)
        goto out;
    memset(q, 0, (size_t)C * C * sizeof *q);
    for (int i = 0; i < n_keep; i++)
        q[(size_t)keep[i] * C + keep[i]] = 1.0f;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            q[(size_t)rest[a] * C + rest[b]] = sub[(size_t)a * n + b];
out:
    free(rest);
    free(kept);
    free(sub);
    return st;
}

comet_status comet_rotate_residual(comet_model *m, uint64_t seed) {
    return comet_rotate_residual_keeping(m, seed, NULL, 0);
}

comet_status comet_rotate_residual_keeping(comet_model *m, uint64_t seed, const int *keep,
                                           int n_keep) {
    const comet_model_config *c = &m->cfg;
    const int C = c->n_embd, V = c->n_vocab;
    if (m->quant || !m->tok_embd || !m->output_norm || !m->lm_head)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "rotation: the model must be a "
                               "floating-point model with its embedding, lm_head and norms");
    for (int l = 0; l < c->n_layer; l++) {
        const comet_layer_weights *lw = &m->layers[l];
        const comet_linear *lin[7] = {&lw->wq,     &lw->wk,   &lw->wv,    &lw->wo,
                                      &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++)
            if (!plain(lin[i]))
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "rotation: layer %d has a "
                                       "linear that is not plain fp32",
                                       l);
    }
    size_t widest = (size_t)V;
    if ((size_t)c->n_ff > widest)
        widest = (size_t)c->n_ff;
    if ((size_t)c->n_head * c->head_dim > widest)
        widest = (size_t)c->n_head * c->head_dim;
    float *q = malloc((size_t)C * C * sizeof *q);
    float *tmp = malloc(widest * C * sizeof *tmp);
    float *lm = m->lm_head;
    if (q && tmp && c->tie_embeddings) { /* the folded output norm unties them */
        lm = comet_model_own(m, malloc((size_t)V * C * sizeof *lm));
        if (lm)
            memcpy(lm, m->tok_embd, (size_t)V * C * sizeof *lm);
    }
    if (!q || !tmp || !lm) {
        free(q);
        free(tmp);
        return comet_set_error(COMET_ERR_NOMEM, "rotation: out of memory");
    }
    comet_status st = rotation_keeping(C, seed, keep, n_keep, q);
    if (st < 0) {
        free(q);
        free(tmp);
        return st;
    }
    m->lm_head = lm;
    m->cfg.tie_embeddings = 0;
    scale_cols(m->lm_head, V, C, m->output_norm);
    right_rotate(m->lm_head, V, C, q, tmp);
    right_rotate(m->tok_embd, V, C, q, tmp);
    for (int i = 0; i < C; i++)
        m->output_norm[i] = 1.0f;
    for (int l = 0; l < c->n_layer; l++) {
        comet_layer_weights *lw = &m->layers[l];
        comet_linear *reads[5] = {&lw->wq, &lw->wk, &lw->wv, &lw->w_gate, &lw->w_up};
        for (int i = 0; i < 5; i++) {
            scale_cols(reads[i]->w, reads[i]->n_out, C, i < 3 ? lw->attn_norm : lw->ffn_norm);
            right_rotate(reads[i]->w, reads[i]->n_out, C, q, tmp);
        }
        left_rotate(lw->wo.w, C, lw->wo.n_in, q, tmp);
        left_rotate(lw->w_down.w, C, lw->w_down.n_in, q, tmp);
        for (int i = 0; i < C; i++)
            lw->attn_norm[i] = lw->ffn_norm[i] = 1.0f;
    }
    free(q);
    free(tmp);
    return COMET_OK;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void comet_rotation_outliers(const comet_model *m, const comet_calib_stats *cs, int n_keep,
                             int *keep_out) {
    const int C = m->cfg.n_embd;
    float *score = calloc((size_t)C, sizeof *score), *tmp = malloc((size_t)C * sizeof *tmp);
    float *sorted = malloc((size_t)C * sizeof *sorted);
    if (!score || !tmp || !sorted) { /* no statistics to rank by: the first channels */
        for (int i = 0; i < n_keep; i++)
            keep_out[i] = i;
        free(score);
        free(tmp);
        free(sorted);
        return;
    }
    const comet_group groups[2] = {COMET_GROUP_QKV, COMET_GROUP_GATE_UP};
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int gi = 0; gi < 2; gi++) {
            const float *sal = cs->sal[groups[gi]] + (size_t)l * C;
            const float *g = gi == 0 ? m->layers[l].attn_norm : m->layers[l].ffn_norm;
            for (int j = 0; j < C; j++)
                tmp[j] = sal[j] / fmaxf(fabsf(g[j]), 1e-6f);
            memcpy(sorted, tmp, (size_t)C * sizeof *sorted);
            qsort(sorted, (size_t)C, sizeof *sorted, cmp_float);
            const float med = fmaxf(sorted[C / 2], 1e-30f);
            for (int j = 0; j < C; j++)
                score[j] = fmaxf(score[j], tmp[j] / med);
        }
    for (int i = 0; i < n_keep; i++) { /* selection: n_keep is small */
        int best = -1;
        for (int j = 0; j < C; j++)
            if (score[j] >= 0 && (best < 0 || score[j] > score[best]))
                best = j;
        keep_out[i] = best;
        score[best] = -1.0f;
    }
    free(score);
    free(tmp);
    free(sorted);
}
