/* test_fold.c — transformations folded into a floating-point model's weights before
 * quantization: the residual rotation (quant/rotate.h) and smoothing (quant/smooth.h).
 *
 * - comet_rotation_orthogonal gives Q·Qᵀ = I (1e-5), the same Q for a seed, another for
 *   another seed;
 * - the folding is exact: logits at every position of a prompt equal the unrotated
 *   model's within 1e-4 relative (max over a row of |diff| / max |logit|), on a tiny random
 *   model (untied lm_head, norms far from 1) and, when it is present, on the default model
 *   (tied embeddings: the folded output norm unties them);
 * - the rotated model's norms are all 1 and its lm_head is its own array;
 * - kept channels (comet_rotate_residual_keeping) stay where they are, the fold stays
 *   exact, and comet_rotation_outliers ranks channels by salience over the norm weight;
 * - a quantized model is refused by name;
 * - smoothing (alpha 0.5) leaves the logits within 1e-4 relative, and the statistics it
 *   rewrites equal a new calibration of the smoothed model (salience within 1e-4
 *   relative, XᵀX within 1e-3 relative norm error).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "model/forward.h"
#include "engine/calibrate.h"
#include "quant/calib.h"
#include "quant/rotate.h"
#include "quant/smooth.h"
#include "cpu_test_util.h"
#include "test_util.h"

#define P 16

static void test_orthogonal(void **state) {
    (void)state;
    static const int ns[] = {44, 576};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        float *q = malloc((size_t)n * n * sizeof *q), *q2 = malloc((size_t)n * n * sizeof *q2);
        assert_true(q && q2);
        assert_int_equal(comet_rotation_orthogonal(n, 7, q), COMET_OK);
        double worst = 0.0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                double d = 0.0;
                for (int t = 0; t < n; t++)
                    d += (double)q[(size_t)i * n + t] * q[(size_t)j * n + t];
                worst = fmax(worst, fabs(d - (i == j)));
            }
        if (!(worst <= 1e-5))
            fail_msg("n %d: |Q·Qᵀ - I| reaches %.3g", n, worst);
        assert_int_equal(comet_rotation_orthogonal(n, 7, q2), COMET_OK);
        assert_memory_equal(q, q2, (size_t)n * n * sizeof *q);
        assert_int_equal(comet_rotation_orthogonal(n, 8, q2), COMET_OK);
        assert_true(memcmp(q, q2, (size_t)n * n * sizeof *q) != 0);
        free(q);
        free(q2);
    }
}

/* logits [n, V] after each of n prompt tokens, one step on the CPU backend */
static float *prompt_logits(const comet_model *m, const int32_t *tokens, int n) {
    comet_backend *be = comet_backend_cpu_init(1);
    assert_non_null(be);
    const int pages = (n + P - 1) / P;
    comet_kv_cache kv;
    comet_kv_pool pool;
    comet_batch_builder bb;
    comet_kv_seq seq;
    assert_int_equal(
        comet_kv_cache_init(&kv, m->cfg.n_layer, pages, P, m->cfg.n_head_kv, m->cfg.head_dim),
        COMET_OK);
    assert_int_equal(comet_kv_pool_init(&pool, pages, P), COMET_OK);
    assert_int_equal(comet_batch_builder_init(&bb, n, 1, pages, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&seq, n, P), COMET_OK);
    comet_forward_ctx *fc = comet_forward_init(m, be, n);
    assert_non_null(fc);
    float *logits = malloc((size_t)n * m->cfg.n_vocab * sizeof *logits);
    assert_non_null(logits);
    assert_int_equal(comet_kv_seq_reserve(&pool, &seq, n), COMET_OK);
    assert_int_equal(comet_batch_builder_add(&bb, &seq, tokens, n, 2), COMET_OK);
    assert_int_equal(comet_forward(fc, &kv, &bb.batch, logits), COMET_OK);
    comet_forward_free(fc);
    comet_kv_seq_free(&seq);
    comet_batch_builder_free(&bb);
    comet_kv_pool_free(&pool);
    comet_kv_cache_free(&kv);
    comet_backend_free(be);
    return logits;
}

/* The worst row of max |a - b| / max |b| over n rows of V. */
static double worst_row_rel(const float *a, const float *b, int n, int V) {
    double worst = 0.0;
    for (int r = 0; r < n; r++) {
        double md = 0.0, mb = 0.0;
        for (int j = 0; j < V; j++) {
            md = fmax(md, fabs((double)a[(size_t)r * V + j] - b[(size_t)r * V + j]));
            mb = fmax(mb, fabs((double)b[(size_t)r * V + j]));
        }
        worst = fmax(worst, md / mb);
    }
    return worst;
}

static void check_folded(comet_model *m, const char *what) {
    const int n = 24, V = m->cfg.n_vocab;
    int32_t tokens[24];
    tu_seed(99);
    for (int i = 0; i < n; i++)
        tokens[i] = tu_int(V);
    float *before = prompt_logits(m, tokens, n);
    float *embd0 = m->tok_embd;
    assert_int_equal(comet_rotate_residual(m, 1234), COMET_OK);
    assert_ptr_equal(m->tok_embd, embd0); /* in place */
    assert_ptr_not_equal(m->lm_head, m->tok_embd);
    assert_int_equal(m->cfg.tie_embeddings, 0);
    for (int i = 0; i < m->cfg.n_embd; i++) {
        assert_true(m->output_norm[i] == 1.0f);
        for (int l = 0; l < m->cfg.n_layer; l++)
            assert_true(m->layers[l].attn_norm[i] == 1.0f && m->layers[l].ffn_norm[i] == 1.0f);
    }
    float *after = prompt_logits(m, tokens, n);
    double e = worst_row_rel(after, before, n, V);
    print_message("%s: rotated vs original logits, worst row %.3g relative\n", what, e);
    if (!(e <= 1e-4))
        fail_msg("%s: rotated logits differ by %.3g relative (bound 1e-4)", what, e);
    free(before);
    free(after);
}

static void test_fold_tiny(void **state) {
    (void)state;
    comet_model *m = tu_tiny_model(5);
    check_folded(m, "tiny model");
    tu_model_free(m);
}

static void test_fold_default_model(void **state) {
    (void)state;
    const char *path = default_model_path();
    if (access(path, R_OK) != 0) {
        print_message("skipped: %s not present (scripts/setup.sh fetches it)\n", path);
        skip();
    }
    comet_model *m = NULL;
    assert_int_equal(comet_model_load(path, &m), COMET_OK);
    assert_int_equal(m->cfg.tie_embeddings, 1);
    check_folded(m, "default model");
    comet_model_free(m);
}

/* Kept channels: the stream's channel j stays channel j (Q's row and column are e_j), the
 * fold stays exact, bad lists are refused; comet_rotation_outliers ranks by salience over
 * the norm weight. */
static void test_keep_channels(void **state) {
    (void)state;
    comet_model *m = tu_tiny_model(8);
    const int C = m->cfg.n_embd, V = m->cfg.n_vocab;
    comet_calib_stats *cs = comet_calib_stats_init(&m->cfg, 0);
    assert_non_null(cs);
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int j = 0; j < C; j++) {
            cs->sal[COMET_GROUP_QKV][(size_t)l * C + j] = 1.0f + 0.01f * (float)j;
            cs->sal[COMET_GROUP_GATE_UP][(size_t)l * C + j] = 1.0f;
        }
    cs->sal[COMET_GROUP_QKV][5] = 40.0f * m->layers[0].attn_norm[5]; /* layer 0 */
    cs->sal[COMET_GROUP_GATE_UP][(size_t)C + 11] = 90.0f * m->layers[1].ffn_norm[11];
    int keep[3];
    comet_rotation_outliers(m, cs, 3, keep);
    assert_int_equal(keep[0], 11);
    assert_int_equal(keep[1], 5);
    assert_true(keep[2] != 5 && keep[2] != 11 && keep[2] >= 0 && keep[2] < C);
    comet_calib_stats_free(cs);

    int bad[2] = {3, 3};
    assert_int_equal(comet_rotate_residual_keeping(m, 1, bad, 2), COMET_ERR_INVALID_ARG);
    bad[1] = C;
    assert_int_equal(comet_rotate_residual_keeping(m, 1, bad, 2), COMET_ERR_INVALID_ARG);

    /* Q is the identity on a kept channel, and no norm folds into the embedding: its
     * column stays as it was */
    float *col = malloc((size_t)V * sizeof *col);
    for (int v = 0; v < V; v++)
        col[v] = m->tok_embd[(size_t)v * C + keep[0]];
    const int n = 16;
    int32_t tokens[16];
    for (int i = 0; i < n; i++)
        tokens[i] = tu_int(V);
    float *before = prompt_logits(m, tokens, n);
    assert_int_equal(comet_rotate_residual_keeping(m, 3, keep, 3), COMET_OK);
    for (int v = 0; v < V; v++)
        assert_true(m->tok_embd[(size_t)v * C + keep[0]] == col[v]);
    float *after = prompt_logits(m, tokens, n);
    double e = worst_row_rel(after, before, n, V);
    if (!(e <= 1e-4))
        fail_msg("keeping 3 channels: rotated logits differ by %.3g relative", e);
    free(col);
    free(before);
    free(after);
    tu_model_free(m);
}

static void test_refuses_quantized(void **state) {
    (void)state;
    comet_model *m = tu_tiny_model(6);
    comet_quant_config q = {0};
    m->quant = &q;
    assert_int_equal(comet_rotate_residual(m, 1), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "floating-point"));
    m->quant = NULL;
    tu_model_free(m);
}

static void test_smooth(void **state) {
    (void)state;
    comet_model *m = tu_tiny_model(9);
    const int V = m->cfg.n_vocab, win = 32, n_win = 4;
    int32_t tokens[128];
    for (int i = 0; i < win * n_win; i++)
        tokens[i] = tu_int(V);
    for (int l = 0; l < m->cfg.n_layer; l++) /* an outlier channel for smoothing to move */
        m->layers[l].attn_norm[3] *= 20.0f;
    comet_backend *be = comet_backend_cpu_init(1);
    assert_non_null(be);
    comet_calib_stats *cs = comet_calib_stats_init(&m->cfg, 1);
    comet_calib_stats *again = comet_calib_stats_init(&m->cfg, 1);
    assert_true(cs && again);
    assert_int_equal(comet_calib_run(m, be, tokens, 128, n_win, win, cs, NULL), COMET_OK);
    float *before = prompt_logits(m, tokens, 24);
    assert_int_equal(comet_smooth(m, cs, 0.5f), COMET_OK);
    float *after = prompt_logits(m, tokens, 24);
    double e = worst_row_rel(after, before, 24, V);
    print_message("smoothed vs original logits, worst row %.3g relative\n", e);
    if (!(e <= 1e-4))
        fail_msg("smoothing changed the logits by %.3g relative", e);
    assert_int_equal(comet_calib_run(m, be, tokens, 128, n_win, win, again, NULL), COMET_OK);
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
        const size_t K = (size_t)cs->width[g], n = (size_t)m->cfg.n_layer * K;
        double es = worst_row_rel(cs->sal[g], again->sal[g], 1, (int)n);
        double ex = tu_nerr(cs->xtx[g], again->xtx[g], n * K);
        if (!(es <= 1e-4 && ex <= 1e-3))
            fail_msg("group %d: rewritten statistics differ from a new calibration (salience "
                     "%.3g, XtX %.3g)",
                     g, es, ex);
    }
    assert_int_equal(comet_smooth(m, cs, 1.5f), COMET_ERR_INVALID_ARG);
    comet_calib_stats_free(cs);
    comet_calib_stats_free(again);
    comet_backend_free(be);
    free(before);
    free(after);
    tu_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orthogonal),         cmocka_unit_test(test_fold_tiny),
        cmocka_unit_test(test_fold_default_model), cmocka_unit_test(test_keep_channels),
        cmocka_unit_test(test_refuses_quantized),  cmocka_unit_test(test_smooth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
