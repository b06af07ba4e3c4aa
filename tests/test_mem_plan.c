/* test_mem_plan.c — sizing the KV page pool from device memory (comet_engine_plan_memory)
 * on the synthetic LLaMA-3 shapes, with the page and weight bytes counted here by hand
 * from the shapes (independently of the planner's code), and the engine's memory
 * parameters on the CPU backend: a fraction outside (0, 1] is refused before anything is
 * loaded, n_pages <= 0 gives the fixed CPU pool, comet_engine_get_memory reports it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comet/engine.h"
#include "comet/model.h"

#define GiB ((size_t)1 << 30)

/* One KV4 page of 16 tokens, LLaMA-3 (Hkv 8, D 128, one fp16 scale + zero per head and
 * token, synthetic models keep the group at D): codes 16 x 64 bytes, scales 16 x 4 bytes,
 * K and V, 8 heads, per layer. */
static size_t kv4_page_bytes(int n_layer) { return (size_t)n_layer * 2 * 8 * (16 * 64 + 16 * 4); }

/* LLaMA-3-8B W4Ax weights on the GPU: 4-bit codes and fp16 scales per 128 inputs of every
 * linear, the fp32 embedding [128256, 4096], the INT8 lm_head's codes, fp16 row scales and
 * codes as fp16, 65 fp32 norms. */
static size_t w4_8b_weights(void) {
    size_t per_layer = (size_t)4096 * 4096 * 2 + (size_t)1024 * 4096 * 2 + (size_t)3 * 14336 * 4096;
    size_t params = per_layer * 32;
    return params / 2 + params / 64 + (size_t)128256 * 4096 * 7 + (size_t)128256 * 2 +
           (size_t)65 * 4096 * 4;
}

static void test_plan_8b(void **state) {
    (void)state;
    comet_model *m;
    assert_int_equal(comet_model_synthetic("llama3-8b", 1, 1, &m), COMET_OK);
    comet_engine_params p = comet_engine_default_params();
    comet_engine_memory_plan a, b;
    const size_t total = 80 * GiB, freeb = 79 * GiB;
    assert_int_equal(comet_engine_plan_memory(m, &p, total, freeb, 0, &a), COMET_OK);
    assert_int_equal(a.page_bytes, kv4_page_bytes(32));
    assert_int_equal(a.page_size, 16);
    assert_int_equal(a.weights, w4_8b_weights());
    assert_int_equal(a.pages_per_seq, 8192 / 16);
    assert_int_equal(a.budget, (size_t)(0.9 * (double)total));
    assert_int_equal(a.used, 1 * GiB);
    size_t left = a.budget - a.used - a.weights - a.workspace - a.headroom;
    assert_int_equal(a.n_pages, (int)(left / a.page_bytes));
    assert_int_equal(a.max_seqs_ctx, a.n_pages / 512);
    assert_int_equal(a.max_seqs_2048, a.n_pages / 128);
    /* after loading, the same device with the weights and workspace taken from free */
    size_t free_after = freeb - a.weights - a.workspace;
    assert_int_equal(comet_engine_plan_memory(m, &p, total, free_after, 1, &b), COMET_OK);
    assert_int_equal(b.n_pages, a.n_pages);
    /* a smaller fraction gives fewer pages, 1.0 more */
    p.gpu_memory_fraction = 0.5;
    assert_int_equal(comet_engine_plan_memory(m, &p, total, freeb, 0, &b), COMET_OK);
    assert_true(b.n_pages < a.n_pages);
    p.gpu_memory_fraction = 1.0;
    assert_int_equal(comet_engine_plan_memory(m, &p, total, freeb, 0, &b), COMET_OK);
    assert_true(b.n_pages > a.n_pages);
    comet_model_free(m);
}

static void test_plan_70b_fits_fp16_does_not(void **state) {
    (void)state;
    const size_t h200 = (size_t)143771 * ((size_t)1 << 20); /* cudaMemGetInfo on an H200 */
    comet_engine_params p = comet_engine_default_params();
    comet_model *m;
    comet_engine_memory_plan a;
    assert_int_equal(comet_model_synthetic("llama3-70b", 1, 1, &m), COMET_OK);
    assert_int_equal(comet_engine_plan_memory(m, &p, h200, h200 - GiB / 2, 0, &a), COMET_OK);
    assert_int_equal(a.page_bytes, kv4_page_bytes(80));
    assert_true(a.weights > 35 * GiB && a.weights < 40 * GiB);
    assert_true(a.max_seqs_ctx >= 1);
    comet_model_free(m);
    /* FP16 70B: ~140 GB of weights against 0.9 x 140 GiB */
    assert_int_equal(comet_model_synthetic("llama3-70b", 0, 1, &m), COMET_OK);
    assert_int_equal(comet_engine_plan_memory(m, &p, h200, h200 - GiB / 2, 0, &a),
                     COMET_ERR_NOMEM);
    assert_non_null(strstr(comet_last_error(), "cannot hold one sequence"));
    assert_non_null(strstr(comet_last_error(), "--gpu-memory-fraction"));
    assert_int_equal(a.n_pages, 0);
    assert_true(a.weights > 130 * GiB);
    /* its 16-bit KV page: 2 bytes a channel, no scales */
    assert_int_equal(a.page_bytes, (size_t)80 * 2 * 8 * 16 * 128 * 2);
    comet_model_free(m);
}

static void test_plan_bad_input(void **state) {
    (void)state;
    comet_model *m;
    assert_int_equal(comet_model_synthetic("llama3-8b", 1, 1, &m), COMET_OK);
    comet_engine_params p = comet_engine_default_params();
    comet_engine_memory_plan a;
    const double bad[] = {0.0, -0.5, 1.01, NAN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.gpu_memory_fraction = bad[i];
        assert_int_equal(comet_engine_plan_memory(m, &p, 80 * GiB, 80 * GiB, 0, &a),
                         COMET_ERR_INVALID_ARG);
        assert_non_null(strstr(comet_last_error(), "outside (0, 1]"));
    }
    p.gpu_memory_fraction = 0.9;
    assert_int_equal(comet_engine_plan_memory(m, &p, 0, 0, 0, &a), COMET_ERR_INVALID_ARG);
    /* a device too small even for the weights: the numbers are named */
    assert_int_equal(comet_engine_plan_memory(m, &p, 8 * GiB, 8 * GiB, 0, &a), COMET_ERR_NOMEM);
    assert_non_null(strstr(comet_last_error(), "8192 tokens"));
    comet_model_free(m);
}

static void test_engine_cpu_memory(void **state) {
    (void)state;
    const char *dir = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : ".");
    comet_model *m;
    if (comet_model_load(path, &m) != COMET_OK)
        fail_msg("cannot load %s: %s", path, comet_last_error());
    comet_engine_params p = comet_engine_default_params();
    assert_true(fabs(p.gpu_memory_fraction - 0.9) < 1e-12);
    assert_true(p.n_pages <= 0);
    p.gpu_memory_fraction = 1.5;
    assert_null(comet_engine_init(m, &p));
    assert_non_null(strstr(comet_last_error(), "gpu_memory_fraction 1.5 is outside (0, 1]"));
    p.gpu_memory_fraction = 0.9;
    p.n_threads = 1;
    comet_engine *e = comet_engine_init(m, &p);
    assert_non_null(e);
    comet_engine_memory mem;
    comet_engine_get_memory(e, &mem);
    assert_int_equal(mem.device_total, 0);
    assert_int_equal(mem.device_used_peak, 0);
    assert_int_equal(mem.kv_pool_pages, COMET_ENGINE_FIXED_PAGES);
    assert_int_equal(mem.kv_pool_tokens, COMET_ENGINE_FIXED_PAGES * 16);
    /* fp32 K and V: layers x pages x 16 x Hkv x D x 4 bytes x 2 */
    size_t want = (size_t)m->cfg.n_layer * COMET_ENGINE_FIXED_PAGES * 16 * m->cfg.n_head_kv *
                  m->cfg.head_dim * 4 * 2;
    assert_int_equal(mem.kv_pool, want);
    assert_true(mem.workspace > 0);
    assert_int_equal(mem.max_seqs_ctx, COMET_ENGINE_FIXED_PAGES * 16 / m->cfg.n_ctx);
    assert_int_equal(mem.max_seqs_2048, COMET_ENGINE_FIXED_PAGES * 16 / 2048);
    comet_engine_stats st;
    comet_engine_get_stats(e, &st);
    assert_int_equal(st.pages_free, COMET_ENGINE_FIXED_PAGES);
    comet_engine_free(e);
    comet_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_8b),
        cmocka_unit_test(test_plan_70b_fits_fp16_does_not),
        cmocka_unit_test(test_plan_bad_input),
        cmocka_unit_test(test_engine_cpu_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
