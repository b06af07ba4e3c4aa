/* test_cpu_kv4.c — the CPU's quantized paged KV cache (backend/cpu/cpu_kv4.h) against the
 * fp32 simulation of the same cache (cpu_common.h comet_cpu_kv_append, reference attention),
 * over contexts of one and of two key spans:
 * the stored codes and fp16 scale / zero are comet_quant_kv_group's, in the CUDA page layout;
 * attention from the codes equals attention over the dequantized cache up to fp32 rounding,
 * for 4 and 8 bits, with and without the Hadamard rotation, head dims 64, 128 and 192, GQA,
 * two sequences with partly filled pages, prefill and decode steps; and it does not depend
 * on the thread count. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_kv4.h"
#include "backend/cpu/cpu_prims.h"
#include "backend/cuda/cuda_kv.h"
#include "backend/kv_cache.h"
#include "cpu_test_util.h"
#include "engine/kv_pages.h"
#include "numerics/quant.h"

#define H 6
#define HKV 2
#define P 16
#define N_PAGES 20
#define LAYERS 2

typedef struct {
    comet_kv_pool pool;
    comet_kv_seq seq[2];
    comet_batch_builder bb;
} pages;

static void check_config(int bits, int G, int rotation, int D) {
    comet_backend *ref = comet_backend_cpu_ref_init();
    comet_threadpool *tp1 = comet_threadpool_init(1), *tp3 = comet_threadpool_init(3);
    comet_kv_format fmt = {comet_kv_type_from_bits(bits), G, rotation};
    comet_kv_cache sim, q4;
    assert_int_equal(comet_kv_cache_init_on(ref, &sim, LAYERS, N_PAGES, P, HKV, D, fmt), COMET_OK);
    memset(&q4, 0, sizeof q4);
    q4.n_layer = LAYERS, q4.n_pages = N_PAGES, q4.page_size = P, q4.n_head_kv = HKV,
    q4.head_dim = D, q4.kv = fmt;
    assert_int_equal(comet_cpu_kv4_init(&q4), COMET_OK);
    assert_null(q4.k);
    pages pg;
    assert_int_equal(comet_kv_pool_init(&pg.pool, N_PAGES, P), COMET_OK);
    for (int s = 0; s < 2; s++)
        assert_int_equal(comet_kv_seq_init(&pg.seq[s], N_PAGES * P, P), COMET_OK);
    assert_int_equal(comet_batch_builder_init(&pg.bb, 256, 2, N_PAGES, P), COMET_OK);
    /* steps: (tokens of seq 0, tokens of seq 1): prefill 37 + 20, then decode 1 + 1, then a
     * chunk of 5 + decode 1, a chunk of 150 (past the 128-key span: merged spans) + 3, and
     * decode 1 + 1 */
    const int steps[][2] = {{37, 20}, {1, 1}, {5, 1}, {1, 1}, {150, 3}, {1, 1}};
    int32_t ids[256] = {0};
    double worst = 0;
    for (size_t st = 0; st < sizeof steps / sizeof steps[0]; st++) {
        comet_batch_builder_reset(&pg.bb);
        for (int s = 0; s < 2; s++) {
            assert_int_equal(comet_kv_seq_reserve(&pg.pool, &pg.seq[s], steps[st][s]), COMET_OK);
            assert_int_equal(comet_batch_builder_add(&pg.bb, &pg.seq[s], ids, steps[st][s], 1),
                             COMET_OK);
        }
        const comet_batch *b = &pg.bb.batch;
        int T = b->n_tokens;
        float *k = malloc((size_t)T * HKV * D * sizeof *k), *v = malloc((size_t)T * HKV * D * 4);
        float *q = malloc((size_t)T * H * D * sizeof *q);
        float *o_ref = malloc((size_t)T * H * D * 4), *o1 = malloc((size_t)T * H * D * 4),
              *o3 = malloc((size_t)T * H * D * 4);
        tu_fill(k, (size_t)T * HKV * D, 3.0f);
        tu_fill(v, (size_t)T * HKV * D, 2.0f);
        tu_fill(q, (size_t)T * H * D, 1.0f);
        for (int layer = 0; layer < LAYERS; layer++) {
            assert_int_equal(comet_cpu_kv_append(ref, &sim, layer, b, k, v), COMET_OK);
            assert_int_equal(comet_cpu_kv4_append(&q4, layer, b, k, v), COMET_OK);
            assert_int_equal(comet_cpu_prims_of(ref)->attention(ref, &sim, layer, b, q, H, o_ref),
                             COMET_OK);
            assert_int_equal(comet_cpu_kv4_attention(tp1, &q4, layer, b, q, H, o1), COMET_OK);
            assert_int_equal(comet_cpu_kv4_attention(tp3, &q4, layer, b, q, H, o3), COMET_OK);
            assert_memory_equal(o1, o3, (size_t)T * H * D * sizeof *o1);
            double e = tu_max_rel(o1, o_ref, (size_t)T * H * D);
            worst = e > worst ? e : worst;
        }
        free(k), free(v), free(q), free(o_ref), free(o1), free(o3);
    }
    printf("  KV%d D=%d G=%d rotation %s: max relative error %.3g\n", bits, D, G,
           comet_kv_rotation_name(rotation), worst);
    assert_true(worst < 5e-5); /* fp32 sums over up to 200 keys in two orders */
    /* one stored group checked by hand: sequence 0, position 3, layer 1, K, head 1, group 0 */
    {
        comet_cuda_kv_layout L = comet_cuda_kv_layout_make(LAYERS, N_PAGES, P, HKV, D, bits, G);
        const comet_batch *b = &pg.bb.batch;
        (void)b;
        int page = pg.seq[0].pages[0];
        const uint8_t *tile = (const uint8_t *)q4.storage +
                              ((((size_t)1 * N_PAGES + page) * 2 + 0) * HKV + 1) *
                                  L.head_tile_bytes;
        const uint16_t *sz = (const uint16_t *)(tile + L.sz_offset + 3 * L.sz_row_bytes);
        const float *kd = sim.k + ((((size_t)1 * N_PAGES + page) * P + 3) * HKV + 1) * D;
        for (int c = 0; c < (G ? G : D); c++) {
            int code = bits == 4 ? (tile[3 * L.code_row_bytes + c / 2] >> (4 * (c & 1))) & 15
                                 : tile[3 * L.code_row_bytes + c];
            float val = (float)code * comet_quant_f16_value(sz[0]) + comet_quant_f16_value(sz[1]);
            assert_true(fabsf(val - kd[c]) <= 1e-6f * (1.0f + fabsf(kd[c])));
        }
    }
    comet_batch_builder_free(&pg.bb);
    for (int s = 0; s < 2; s++)
        comet_kv_seq_free(&pg.seq[s]);
    comet_kv_pool_free(&pg.pool);
    comet_cpu_kv4_free(&q4);
    comet_kv_cache_free_on(ref, &sim);
    comet_threadpool_free(tp1);
    comet_threadpool_free(tp3);
    comet_backend_free(ref);
}

static void test_kv4_attention_matches_simulation(void **state) {
    (void)state;
    tu_seed(7);
    check_config(4, 16, COMET_KV_ROTATION_NONE, 64);
    check_config(4, 16, COMET_KV_ROTATION_HADAMARD, 64);
    check_config(4, 0, COMET_KV_ROTATION_HADAMARD, 64);
    check_config(4, 8, COMET_KV_ROTATION_NONE, 64); /* groups of 8: the generic path */
    check_config(8, 16, COMET_KV_ROTATION_NONE, 64);
    /* the vector path's other shapes: 2 groups per row, two 64-channel chunks, and a row of
     * 6 groups (its scales and zeros in a padded chunk) */
    check_config(4, 32, COMET_KV_ROTATION_NONE, 64);
    check_config(4, 16, COMET_KV_ROTATION_HADAMARD, 128);
    check_config(4, 32, COMET_KV_ROTATION_NONE, 192);
}

static void test_kv4_refuses_bad_formats(void **state) {
    (void)state;
    comet_kv_cache kv;
    memset(&kv, 0, sizeof kv);
    kv.n_layer = 1, kv.n_pages = 1, kv.page_size = P, kv.n_head_kv = 1, kv.head_dim = 48;
    kv.kv = (comet_kv_format){COMET_KV_INT4, 16, COMET_KV_ROTATION_HADAMARD}; /* 48: not a power of two */
    assert_int_equal(comet_cpu_kv4_init(&kv), COMET_ERR_INVALID_ARG);
    kv.kv = (comet_kv_format){COMET_KV_INT4, 20, COMET_KV_ROTATION_NONE}; /* 20 does not divide 48 */
    assert_int_equal(comet_cpu_kv4_init(&kv), COMET_ERR_INVALID_ARG);
    kv.kv = (comet_kv_format){COMET_KV_F16, 16, COMET_KV_ROTATION_NONE};
    assert_int_equal(comet_cpu_kv4_init(&kv), COMET_ERR_INVALID_ARG);
    kv.kv = (comet_kv_format){COMET_KV_INT4, 16, COMET_KV_ROTATION_NONE};
    assert_int_equal(comet_cpu_kv4_init(&kv), COMET_OK);
    assert_non_null(kv.storage);
    comet_cpu_kv4_free(&kv);
    assert_null(kv.storage);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv4_refuses_bad_formats),
        cmocka_unit_test(test_kv4_attention_matches_simulation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
