/* test_attention_plan_cuda.c — paged attention's plan (attention_plan.cuh) for prefill steps on
 * the tensor-core kernels: which kernel a step takes and how many key splits. The plan is host
 * code, so this test needs no GPU: it runs wherever the CUDA backend is built.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/attention.h"

/* The backend's default plan for a step whose every chunk takes a tensor-core kernel (the step
 * view's min_q_len of at least 16 tokens), on the LLaMA-3-8B layer over 132 SMs: key splits
 * from the kernel's working CTAs in whole waves, and attn_mma3_kernel only where its CTAs
 * outnumber the SMs (mma3_min_ctas). One sequence of T tokens, pages of 16, INT4 groups of 16 (attn_mma3's
 * layout) and of 128 (one pair a head vector: attn_mma2_kernel's alone). */
static void test_attention_prefill_plan(void **state) {
    (void)state;
    const comet_cuda_kv_layout L16 = comet_cuda_kv_layout_make(1, 64, 16, 8, 128, 4, 16);
    const comet_cuda_kv_layout L128 = comet_cuda_kv_layout_make(1, 64, 16, 8, 128, 4, 128);
    static const struct {
        int T, kernel16, splits16, kernel128, splits128;
    } want[] = {
        /* 128 rows a CTA: T / 32 CTAs a KV head, 8 KV heads; 132 SMs */
        {128, 2, 2, 2, 2},  /* 32 CTAs: 4 in whole waves, at most T / 64 */
        {256, 2, 2, 2, 2},  /* 64 */
        {512, 2, 1, 2, 1},  /* 128: one wave of attn_mma2_kernel */
        {1024, 3, 1, 2, 1}, /* 256: two CTAs an SM take them at once */
        {8192, 3, 1, 2, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const int T = want[i].T;
        comet_cuda_step_view v;
        memset(&v, 0, sizeof v);
        v.n_tokens = T, v.n_seqs = 1, v.n_tiles = T / 16, v.max_kv_len = T, v.min_q_len = T;
        v.attn_mma = 3, v.mma3_min_ctas = 132;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L16, &v, 32), want[i].kernel16);
        assert_int_equal(comet_cuda_attention_splits(&L16, &v, 32, 132), want[i].splits16);
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L128, &v, 32), want[i].kernel128);
        assert_int_equal(comet_cuda_attention_splits(&L128, &v, 32, 132), want[i].splits128);
        /* COMET_CUDA_ATTN_MMA=3 (mma3_min_ctas 0): attn_mma3_kernel at every length */
        v.mma3_min_ctas = 0;
        assert_int_equal(comet_cuda_attention_prefill_kernel(&L16, &v, 32), 3);
    }
    /* a step with a shorter sequence (a decode token beside a 256-token chunk) keeps the plan
     * of the fp32 kernel's grid, which runs that token: 17 tiles x 8 KV heads, two splits to
     * fill two CTAs an SM */
    comet_cuda_step_view v;
    memset(&v, 0, sizeof v);
    v.n_tokens = 257, v.n_seqs = 2, v.n_tiles = 17, v.max_kv_len = 600, v.min_q_len = 1;
    v.attn_mma = 3, v.mma3_min_ctas = 132;
    assert_int_equal(comet_cuda_attention_splits(&L16, &v, 32, 132), 2); /* 136 CTAs: 2 */
    /* two sequences of 256 tokens: 2 x 8 tensor-core CTAs a KV head, 128 in one wave */
    v.n_tokens = 512, v.n_seqs = 2, v.n_tiles = 32, v.min_q_len = 256;
    assert_int_equal(comet_cuda_attention_splits(&L16, &v, 32, 132), 1);
    /* no tiles (a view no step makes): one split, no division by zero */
    v.n_tiles = 0;
    assert_int_equal(comet_cuda_attention_splits(&L16, &v, 32, 132), 1);
}

/* COMET_CUDA_ATTN_PLAN_WAVES=0, the A/B: splits from the fp32 kernel's grid (32 tiles x 8 KV
 * heads at 512 tokens, under 2 CTAs an SM: two) and attn_mma3_kernel wherever it takes the
 * chunks. */
static void test_attention_prefill_plan_ab(void **state) {
    (void)state;
    const comet_cuda_kv_layout L16 = comet_cuda_kv_layout_make(1, 64, 16, 8, 128, 4, 16);
    comet_cuda_step_view v;
    memset(&v, 0, sizeof v);
    v.n_tokens = 512, v.n_seqs = 1, v.n_tiles = 32, v.max_kv_len = 512, v.min_q_len = 512;
    v.attn_mma = 3, v.mma3_min_ctas = 132;
    setenv("COMET_CUDA_ATTN_PLAN_WAVES", "0", 1);
    const int kernel = comet_cuda_attention_prefill_kernel(&L16, &v, 32);
    const int splits = comet_cuda_attention_splits(&L16, &v, 32, 132);
    unsetenv("COMET_CUDA_ATTN_PLAN_WAVES");
    assert_int_equal(kernel, 3);
    assert_int_equal(splits, 2);
}

int main(void) {
    unsetenv("COMET_CUDA_ATTN_PLAN_WAVES"); /* the plan under test, not its A/B */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_prefill_plan),
        cmocka_unit_test(test_attention_prefill_plan_ab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
