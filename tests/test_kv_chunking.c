/* test_kv_chunking.c — a quantized KV cache gives the same perplexity whatever the
 * prefill chunk size and the thread count, bit for bit.
 *
 * With kv_bits 4 or 8 every K/V row is rounded to codes as it is appended; a difference in
 * the last bit of a K/V value (sgemv against sgemm, one GEMM kernel or column slice against
 * another, the tile attention path against the per-token one) moves a value across a
 * rounding boundary now and then, the changed code changes every later token's attention,
 * and the change grows layer by layer: `comet perplexity --kv-bits 4 --kv-rotation none
 * --ctx 512 --max-windows 1` on SmolLM2-135M gave 18.46 to 19.48 with --chunk 1, 7, 8, 512
 * (18.32 to 19.65 on another machine, where --threads mattered too), while --kv-bits 16
 * stayed at 16.1413. No tolerance tells such a run from a correct one, so the backends must
 * be batch-invariant: every token's arithmetic the same whatever the step it is in and
 * however the work is split between threads. This test runs
 * comet_perplexity on a tiny random model (2 windows, so the cache is reused) at chunks
 * 1, 7, 16 and the whole window, on 1 and 2 threads, with KV 4 (with and without the
 * Hadamard rotation), 8 and 16 bits, and requires the same NLL sum, bit for bit, as the
 * whole-window single-thread run; the scalar reference backend likewise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "engine/perplexity.h"
#include "cpu_test_util.h"

#define CTX                                                                                        \
    100 /* not a multiple of the 16-slot page nor of 7 or 16: partial pages, ragged chunks */
#define WINDOWS 2

typedef struct {
    int bits, rotation;
} kv_config;

static const kv_config configs[] = {
    {4, COMET_KV_ROTATION_NONE},
    {4, COMET_KV_ROTATION_HADAMARD},
    {8, COMET_KV_ROTATION_NONE},
    {16, COMET_KV_ROTATION_NONE},
};
static const int chunks[] = {CTX, 1, 7, 16};

static comet_ppl_result run(comet_model *m, comet_backend *be, const int32_t *tokens, size_t n,
                            int chunk, comet_kv_format kv) {
    comet_ppl_params p = comet_ppl_default_params();
    p.kv = kv; /* perplexity's override: the model itself keeps its unquantized cache */
    p.ctx = CTX;
    p.max_windows = WINDOWS;
    p.chunk = chunk;
    comet_ppl_result r;
    memset(&r, 0, sizeof r);
    assert_int_equal(comet_perplexity(m, be, tokens, n, &p, &r), COMET_OK);
    assert_int_equal(r.n_scored, WINDOWS * (CTX - 1));
    return r;
}

/* Every (chunk, threads) run of every KV config equals that config's first run. */
static void check_backend(comet_backend *(*make)(int threads), const int *threads, int n_threads,
                          const char *name) {
    comet_model *m = tu_tiny_model(2024);
    size_t n = WINDOWS * CTX;
    int32_t *tokens = malloc(n * sizeof *tokens);
    tu_seed(99);
    for (size_t i = 0; i < n; i++)
        tokens[i] = tu_int(m->cfg.n_vocab);
    int bad = 0;
    double refs[sizeof configs / sizeof configs[0]];
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        const comet_kv_format kv = {.type = comet_kv_type_from_bits(configs[c].bits),
                                    .group = m->cfg.head_dim, /* one scale/zero per head */
                                    .rotation = configs[c].rotation};
        double ref = 0;
        for (int ti = 0; ti < n_threads; ti++) {
            comet_backend *be = make(threads[ti]);
            assert_non_null(be);
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
                comet_ppl_result r = run(m, be, tokens, n, chunks[k], kv);
                if (ti == 0 && k == 0) {
                    ref = refs[c] = r.nll_sum;
                    continue;
                }
                if (memcmp(&r.nll_sum, &ref, sizeof ref)) {
                    fprintf(stderr,
                            "%s, KV%d rotation %s, chunk %d, %d thread(s): NLL sum %.17g, "
                            "whole window on %d thread(s) %.17g (%+.3g relative)\n",
                            name, configs[c].bits, comet_kv_rotation_name(configs[c].rotation),
                            chunks[k], threads[ti], r.nll_sum, threads[0], ref,
                            (r.nll_sum - ref) / ref);
                    bad++;
                }
            }
            comet_backend_free(be);
        }
    }
    free(tokens);
    const int model_type = m->kv.type;
    tu_model_free(m);
    assert_int_equal(bad, 0);
    assert_int_equal(model_type, COMET_KV_F16);
    /* the override took effect: each quantized cache moves the NLL off the unquantized one,
     * the rotation moves KV4's, and the model's own format was left alone */
    const size_t last = sizeof configs / sizeof configs[0] - 1; /* KV16 */
    for (size_t c = 0; c < last; c++)
        assert_true(refs[c] != refs[last]);
    assert_true(refs[0] != refs[1]);
}

static comet_backend *make_fast(int threads) { return comet_backend_cpu_init(threads); }
static comet_backend *make_ref(int threads) {
    (void)threads;
    return comet_backend_cpu_ref_init();
}

static void test_fast_backend_chunk_and_thread_invariant(void **state) {
    (void)state;
    const int threads[] = {1, 2};
    check_backend(make_fast, threads, 2, "cpu");
}

static void test_ref_backend_chunk_invariant(void **state) {
    (void)state;
    const int threads[] = {1};
    check_backend(make_ref, threads, 1, "cpu-ref");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_backend_chunk_and_thread_invariant),
        cmocka_unit_test(test_ref_backend_chunk_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
