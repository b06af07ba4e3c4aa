/* test_kv_share.c — KV page reference counts: sequences sharing the full pages of a
 * common prefix hold them until the last one lets go, and a sequence continuing from a
 * shared prefix computes the same logits as one that prefilled the prefix itself
 * (default model). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "comet/model.h"
#include "engine/kv_pages.h"
#include "model/forward.h"

#define P 16

static void test_refcounts(void **state) {
    (void)state;
    comet_kv_pool pool;
    comet_kv_seq a, b, c;
    assert_int_equal(comet_kv_pool_init(&pool, 6, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&a, 4 * P, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&b, 4 * P, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&c, 1 * P, P), COMET_OK);
    assert_int_equal(comet_kv_seq_reserve(&pool, &a, 2 * P + 3), COMET_OK); /* 3 pages */
    assert_int_equal(pool.n_free, 3);
    /* only whole pages can be shared, and no more than the source holds */
    assert_int_equal(comet_kv_seq_share(&pool, &b, &a, P + 1), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_kv_seq_share(&pool, &b, &a, 3 * P), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_kv_seq_share(&pool, &c, &a, 2 * P), COMET_ERR_CONTEXT);
    assert_int_equal(comet_kv_seq_share(&pool, &b, &a, 2 * P), COMET_OK);
    assert_int_equal(b.n_tokens, 2 * P);
    assert_int_equal(b.pages[0], a.pages[0]);
    assert_int_equal(b.pages[1], a.pages[1]);
    assert_int_equal(pool.refs[a.pages[0]], 2);
    assert_int_equal(pool.refs[a.pages[2]], 1);
    assert_int_equal(pool.n_free, 3); /* sharing takes no page */
    assert_int_equal(comet_kv_seq_share(&pool, &b, &a, P), COMET_ERR_INVALID_ARG); /* not empty */
    /* b grows into a page of its own */
    assert_int_equal(comet_kv_seq_reserve(&pool, &b, 1), COMET_OK);
    assert_int_equal(pool.n_free, 2);
    assert_true(b.pages[2] != a.pages[2]);
    int32_t shared0 = a.pages[0];
    comet_kv_seq_release(&pool, &a);
    assert_int_equal(pool.n_free, 3); /* a's own last page only */
    assert_int_equal(pool.refs[shared0], 1);
    comet_kv_seq_release(&pool, &b);
    assert_int_equal(pool.n_free, 6);
    assert_int_equal(pool.refs[shared0], 0);
    comet_kv_seq_free(&a);
    comet_kv_seq_free(&b);
    comet_kv_seq_free(&c);
    comet_kv_pool_free(&pool);
}

/* Prefill tokens[0..n) of seq (reserving as it goes) in one step; logits of the last. */
static void prefill(comet_forward_ctx *fc, comet_kv_cache *kv, comet_kv_pool *pool,
                    comet_batch_builder *bb, comet_kv_seq *seq, const int32_t *tokens, int n,
                    float *logits) {
    assert_int_equal(comet_kv_seq_reserve(pool, seq, n), COMET_OK);
    comet_batch_builder_reset(bb);
    assert_int_equal(comet_batch_builder_add(bb, seq, tokens, n, 1), COMET_OK);
    assert_int_equal(comet_forward(fc, kv, &bb->batch, logits), COMET_OK);
}

static void test_shared_prefix_logits(void **state) {
    (void)state;
    const char *dir = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : ".");
    comet_model *m = NULL;
    assert_int_equal(comet_model_load(path, &m), COMET_OK);
    const comet_model_config *c = &m->cfg;
    comet_backend *be = comet_backend_cpu_init(0);
    assert_non_null(be);
    enum {
        N_PREFIX = 2 * P,
        N_TAIL = 7,
        N = N_PREFIX + N_TAIL
    };
    int32_t toks[N], tail_b[N_TAIL];
    for (int i = 0; i < N; i++)
        toks[i] = 100 + (i * 7919) % 20000;
    for (int i = 0; i < N_TAIL; i++)
        tail_b[i] = 300 + (i * 104729) % 20000;
    comet_kv_cache kv;
    comet_kv_pool pool;
    comet_batch_builder bb;
    assert_int_equal(comet_kv_cache_init(&kv, c->n_layer, 12, P, c->n_head_kv, c->head_dim),
                     COMET_OK);
    assert_int_equal(comet_kv_pool_init(&pool, 12, P), COMET_OK);
    assert_int_equal(comet_batch_builder_init(&bb, N, 1, 12, P), COMET_OK);
    comet_forward_ctx *fc = comet_forward_init(m, be, N);
    assert_non_null(fc);
    float *ref = malloc((size_t)c->n_vocab * sizeof(float));
    float *got = malloc((size_t)c->n_vocab * sizeof(float));

    /* reference: b = prefix + tail_b prefilled on its own */
    int32_t full_b[N];
    memcpy(full_b, toks, sizeof(int32_t) * N_PREFIX);
    memcpy(full_b + N_PREFIX, tail_b, sizeof tail_b);
    comet_kv_seq a, b;
    assert_int_equal(comet_kv_seq_init(&a, N, P), COMET_OK);
    assert_int_equal(comet_kv_seq_init(&b, N, P), COMET_OK);
    prefill(fc, &kv, &pool, &bb, &b, full_b, N, ref);
    comet_kv_seq_release(&pool, &b);

    /* a prefills prefix + its own tail; b shares a's two prefix pages, computes only its tail */
    prefill(fc, &kv, &pool, &bb, &a, toks, N, got);
    assert_int_equal(comet_kv_seq_share(&pool, &b, &a, N_PREFIX), COMET_OK);
    int free_before = pool.n_free;
    prefill(fc, &kv, &pool, &bb, &b, tail_b, N_TAIL, got);
    assert_int_equal(pool.n_free, free_before - 1); /* one page for the tail */
    double max_err = 0, max_ref = 0;
    int arg_ref = 0, arg_got = 0;
    for (int v = 0; v < c->n_vocab; v++) {
        max_err = fmax(max_err, fabs((double)got[v] - ref[v]));
        max_ref = fmax(max_ref, fabs((double)ref[v]));
        if (ref[v] > ref[arg_ref])
            arg_ref = v;
        if (got[v] > got[arg_got])
            arg_got = v;
    }
    assert_int_equal(arg_got, arg_ref);
    assert_true(max_err <= 1e-3 * max_ref);
    comet_kv_seq_release(&pool, &a);
    comet_kv_seq_release(&pool, &b);
    assert_int_equal(pool.n_free, 12);
    comet_kv_seq_free(&a);
    comet_kv_seq_free(&b);
    free(ref);
    free(got);
    comet_forward_free(fc);
    comet_batch_builder_free(&bb);
    comet_kv_pool_free(&pool);
    comet_kv_cache_free(&kv);
    comet_backend_free(be);
    comet_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refcounts),
        cmocka_unit_test(test_shared_prefix_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
