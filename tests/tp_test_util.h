/* tp_test_util.h — what the tensor-parallel tests share (tests/test_tp.c on CPU ranks,
 * tests/cuda/test_tp_cuda.c on GPUs): a small LLaMA that FMPQ can block, float and
 * W4A4KV4, and a run of two sequences (prefill, then greedy decode) through the runner with
 * a given tensor_parallel, its logits kept for comparison. Header-only, for cmocka tests. */
#ifndef COMET_TESTS_TP_TEST_UTIL_H
#define COMET_TESTS_TP_TEST_UTIL_H

#include "backend/backend.h"
#include "engine/runner.h"
#include "quant/fmpq.h"
#include "cpu_test_util.h"

/* A small LLaMA whose widths FMPQ can block by 64: C = 128, H = 6, Hkv = 3 (GQA 2), D = 32,
 * F = 384 (6 down_proj blocks), V = 101, 2 layers. */
static comet_model *tp_small_model(void) {
    return tu_shaped_model(
        4242, (tu_shape){.n_layer = 2, .C = 128, .F = 384, .H = 6, .Hkv = 3, .D = 32, .V = 101});
}

/* The model above in W4A4KV4 (RTN, block 64, INT8 blocks from a few outlier channels);
 * its float arrays are replaced by ones the model owns. */
static comet_model *tp_small_model_w4a4(void) {
    comet_model *m = tp_small_model();
    /* the model owns every array from here (comet_model_free), the ones the quantizer
     * replaces too */
    void *arrays[] = {m->tok_embd, m->output_norm, m->lm_head};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        assert_non_null(comet_model_own(m, arrays[i]));
    for (int l = 0; l < m->cfg.n_layer; l++) {
        comet_layer_weights *w = &m->layers[l];
        void *per_layer[] = {w->attn_norm, w->ffn_norm, w->wq.w,   w->wk.w,    w->wv.w,
                             w->wo.w,      w->w_gate.w, w->w_up.w, w->w_down.w};
        for (size_t i = 0; i < sizeof per_layer / sizeof per_layer[0]; i++)
            assert_non_null(comet_model_own(m, per_layer[i]));
    }
    comet_calib_stats *cs = comet_calib_stats_init(&m->cfg, 0);
    assert_non_null(cs);
    enum {
        T = 200
    };
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++) {
            int K = cs->width[g];
            float *x = malloc((size_t)T * K * sizeof *x);
            for (int i = 0; i < T * K; i++)
                x[i] = tu_uniform() * (i % K % 23 == 5 ? 30.0f : 1.0f);
            comet_calib_stats_observe(cs, l, (comet_group)g, x, T);
            free(x);
        }
    comet_fmpq_params p = comet_fmpq_default_params();
    p.gptq = 0, p.block = 64, p.tau = 4.0f, p.int8_budget = 0.34f;
    p.kv = (comet_kv_format){.type = COMET_KV_INT4, .group = 16, .rotation = -1};
    assert_int_equal(comet_fmpq_quantize(m, cs, &p), COMET_OK);
    comet_calib_stats_free(cs);
    int any_n8 = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        any_n8 |= m->layers[l].w_down.n8 > 0 && m->layers[l].w_down.n8 < 6;
    assert_true(any_n8); /* the split cuts through down_proj's INT8 blocks or next to them */
    return m;
}

#define PS 8 /* page size */
#define NPAGES 16
#define NSEQ 2
#define NDEC 6
static const int plen[NSEQ] = {19, 33};

typedef struct {
    float *logits; /* [rows, V]: every prompt position, then each decode step's rows */
    int rows;
    int32_t greedy[NDEC][NSEQ];
} tp_run;

/* A runner of m on a backend opened by `device` (all cores on a CPU), with tensor_parallel
 * tp, max_tokens tokens per step and a pool of n_pages pages of page_size tokens. */
typedef struct tp_runner {
    comet_backend *be;
    comet_runner r;
} tp_runner;

static void tp_runner_open(tp_runner *t, const comet_model *m, const char *device, int tp,
                           int max_tokens, int max_seqs, int n_pages, int page_size) {
    t->be = comet_backend_open(device, 0);
    if (!t->be)
        fail_msg("backend %s: %s", device, comet_last_error());
    comet_runner_params rp = {.max_batch_tokens = max_tokens,
                              .max_seqs = max_seqs,
                              .n_pages = n_pages,
                              .page_size = page_size,
                              .tensor_parallel = tp};
    if (comet_runner_init(&t->r, m, t->be, &rp) < 0)
        fail_msg("runner (%s, tp %d): %s", device, tp, comet_last_error());
}

static void tp_runner_close(tp_runner *t) {
    comet_runner_free(&t->r);
    comet_backend_free(t->be);
}

/* The id of the largest of x [V] (the lowest on ties). */
static int tp_argmax(const float *x, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[best])
            best = v;
    return best;
}

/* On a backend opened by `device`, with tensor_parallel tp: prefill both prompts in one
 * step (every row's logits), then NDEC decode steps feeding the tokens `feed` (NULL: each
 * run's own greedy picks). */
static void tp_run_model(const comet_model *m, const char *device, int tp,
                         const int32_t (*feed)[NSEQ], tp_run *out) {
    const int V = m->cfg.n_vocab;
    tp_runner t;
    tp_runner_open(&t, m, device, tp, 64, NSEQ, NPAGES, PS);
    comet_runner *r = &t.r;
    comet_kv_seq seq[NSEQ];
    int32_t prompt[NSEQ][40];
    tu_seed(99);
    out->rows = plen[0] + plen[1] + NDEC * NSEQ;
    out->logits = malloc((size_t)out->rows * V * sizeof(float));
    comet_batch_builder_reset(&r->bb);
    for (int s = 0; s < NSEQ; s++) {
        for (int i = 0; i < plen[s]; i++)
            prompt[s][i] = tu_int(V);
        assert_int_equal(comet_kv_seq_init(&seq[s], 64, PS), COMET_OK);
        assert_int_equal(comet_kv_seq_reserve(&r->pool, &seq[s], plen[s]), COMET_OK);
        assert_int_equal(comet_batch_builder_add(&r->bb, &seq[s], prompt[s], plen[s], 2), COMET_OK);
    }
    assert_int_equal(comet_runner_step(r, out->logits), COMET_OK);
    float *row = out->logits + (size_t)(plen[0] + plen[1]) * V;
    const float *last[NSEQ] = {out->logits + (size_t)(plen[0] - 1) * V,
                               out->logits + (size_t)(plen[0] + plen[1] - 1) * V};
    for (int d = 0; d < NDEC; d++) {
        comet_batch_builder_reset(&r->bb);
        for (int s = 0; s < NSEQ; s++) {
            int best = tp_argmax(last[s], V);
            out->greedy[d][s] = best;
            int32_t tok = feed ? feed[d][s] : best;
            assert_int_equal(comet_kv_seq_reserve(&r->pool, &seq[s], 1), COMET_OK);
            assert_int_equal(comet_batch_builder_add(&r->bb, &seq[s], &tok, 1, 1), COMET_OK);
        }
        assert_int_equal(comet_runner_step(r, row), COMET_OK);
        for (int s = 0; s < NSEQ; s++)
            last[s] = row + (size_t)s * V;
        row += (size_t)NSEQ * V;
    }
    for (int s = 0; s < NSEQ; s++) {
        comet_kv_seq_release(&r->pool, &seq[s]);
        comet_kv_seq_free(&seq[s]);
    }
    tp_runner_close(&t);
}

/* Relative error of the worst logits row, and the rows whose argmax differs. */
static void tp_compare(const tp_run *a, const tp_run *b, int V, double *worst, int *argmax_diff) {
    *worst = 0;
    *argmax_diff = 0;
    for (int i = 0; i < a->rows; i++) {
        const float *x = a->logits + (size_t)i * V, *y = b->logits + (size_t)i * V;
        double e = tu_nerr(x, y, (size_t)V);
        if (e > *worst)
            *worst = e;
        *argmax_diff += tp_argmax(x, V) != tp_argmax(y, V);
    }
}

#endif
