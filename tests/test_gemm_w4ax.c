/* test_gemm_w4ax.c — CPU checks of the W4Ax GEMM oracle (backend/cpu/ref_gemm_w4ax.c) and of
 * the CUDA weight packing round trip (backend/cuda/gemm_w4ax_pack.c, plain C). The GPU
 * kernels themselves are tested in tests/cuda/ on the GPU machine. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "backend/cuda/gemm_w4ax.h"
#include "numerics/w4_plain.h"

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* Hand-computed case: M=2, N=2, K=4, B=2 (two blocks), n8=1. */
static void test_ref_known_values(void **state) {
    (void)state;
    const int8_t w[2][4] = {{1, -2, 7, -8}, {0, 3, -1, 2}};
    uint8_t qw[2 * 2] = {0};
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++)
            comet_w4_plain_set(qw, 4, n, k, w[n][k]);
    /* fp16: 0x3C00 = 1.0, 0x4000 = 2.0, 0x3800 = 0.5, 0x3400 = 0.25 */
    const uint16_t sw[2 * 2] = {0x3C00, 0x4000, 0x3800, 0x3400};
    const int8_t qa[2 * 4] = {100, -128, 3, -8, -1, 2, 7, 0};
    const float sa[2 * 2] = {0.5f, 0.25f, 2.0f, 1.0f};
    float y[4];
    int32_t bs[2 * 2 * 2];
    assert_int_equal(comet_ref_gemm_w4ax(2, 2, 4, 2, 1, qw, sw, qa, sa, y, bs), COMET_OK);
    /* t0,n0: b0 = 100*1 + -128*-2 = 356; b1 = 3*7 + -8*-8 = 85 */
    assert_int_equal(bs[0], 356);
    assert_int_equal(bs[1], 85);
    /* t0,n1: b0 = 0 + -128*3 = -384; b1 = -3 - 16 = -19 */
    assert_int_equal(bs[2], -384);
    assert_int_equal(bs[3], -19);
    assert_true(y[0] == 356.0f * 0.5f * 1.0f + 85.0f * 0.25f * 2.0f);
    assert_true(y[1] == -384.0f * 0.5f * 0.5f + -19.0f * 0.25f * 0.25f);
    /* t1,n0: b0 = -1 - 4 = -5; b1 = 49 + 0 = 49 */
    assert_int_equal(bs[4], -5);
    assert_int_equal(bs[5], 49);
    assert_true(y[2] == -5.0f * 2.0f * 1.0f + 49.0f * 1.0f * 2.0f);
}

static void test_ref_rejects_bad_calls(void **state) {
    (void)state;
    uint8_t qw[2] = {0};
    const uint16_t sw[2] = {0x3C00, 0x3C00};
    int8_t qa[4] = {100, 1, 9, 0}; /* block 1 is INT4 when n8 = 1: 9 is out of range */
    const float sa[2] = {1.0f, 1.0f};
    float y[1];
    assert_int_equal(comet_ref_gemm_w4ax(1, 1, 4, 2, 1, qw, sw, qa, sa, y, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_ref_gemm_w4ax(1, 1, 4, 2, 2, qw, sw, qa, sa, y, NULL), COMET_OK);
    assert_int_equal(comet_ref_gemm_w4ax(1, 1, 4, 2, 0, qw, sw, qa, sa, y, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_ref_gemm_w4ax(1, 1, 5, 2, 0, qw, sw, qa, sa, y, NULL),
                     COMET_ERR_INVALID_ARG);
    /* bad shapes, named in the message */
    assert_int_equal(comet_ref_gemm_w4ax(1, 1, 4, 2, 3, qw, sw, qa, sa, y, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "n8=3"));
    assert_int_equal(comet_ref_gemm_w4ax(0, 1, 4, 2, 1, qw, sw, qa, sa, y, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "M=0"));
}

static void test_f16_to_f32(void **state) {
    (void)state;
    assert_true(comet_ref_f16_to_f32(0x3C00) == 1.0f);
    assert_true(comet_ref_f16_to_f32(0xC000) == -2.0f);
    assert_true(comet_ref_f16_to_f32(0x0001) == 5.9604644775390625e-8f); /* smallest subnormal */
    assert_true(comet_ref_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(comet_ref_f16_to_f32(0x3555) == 0.333251953125f);
}

/* Packing round trip on awkward shapes, and the packed position of one known element. */
static void test_pack_round_trip(void **state) {
    (void)state;
    const int shapes[][3] = {
        {8, 64, 64}, {136, 576, 64}, {17, 1536, 128}, {1, 128, 128}, {48, 256, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], K = shapes[si][1], B = shapes[si][2], nb = K / B;
        size_t qb = comet_w4_plain_bytes(N, K);
        uint8_t *qw = malloc(qb), *qw2 = malloc(qb),
                *pk = malloc(comet_cuda_w4ax_packed_qw_bytes(N, K));
        uint16_t *sw = malloc((size_t)N * nb * 2), *sw2 = malloc((size_t)N * nb * 2);
        uint16_t *spk = malloc(comet_cuda_w4ax_packed_sw_bytes(N, K, B));
        for (size_t i = 0; i < qb; i++)
            qw[i] = (uint8_t)rnd();
        for (int i = 0; i < N * nb; i++)
            sw[i] = (uint16_t)(rnd() & 0x7BFF);
        assert_int_equal(comet_cuda_w4ax_pack(N, K, B, qw, sw, pk, spk), COMET_OK);
        assert_int_equal(comet_cuda_w4ax_unpack(N, K, B, pk, spk, qw2, sw2), COMET_OK);
        assert_memory_equal(qw, qw2, qb);
        assert_memory_equal(sw, sw2, (size_t)N * nb * 2);
        /* padded rows are zero */
        int Np = (N + 15) / 16 * 16;
        for (int b = 0; b < nb; b++)
            for (int n = N; n < Np; n++)
                assert_int_equal(spk[(size_t)b * Np + n], 0);
        /* element (n=9, k=21) of tile 0: g=1, high nibble, k%64=21 -> step 0, half 1,
         * tid 1, j 1 -> lane 5, word 1, byte 1 */
        if (N > 9 && K >= 64) {
            int v = comet_w4_plain_get(qw, K, 9, 21);
            int nib = pk[5 * 16 + 1 * 4 + 1] >> 4;
            assert_int_equal(nib >= 8 ? nib - 16 : nib, v);
        }
        free(qw), free(qw2), free(pk), free(sw), free(sw2), free(spk);
    }
    uint8_t dummy[64];
    uint16_t ds[4];
    assert_int_equal(comet_cuda_w4ax_pack(8, 96, 64, dummy, ds, dummy, ds), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_cuda_w4ax_pack(8, 128, 32, dummy, ds, dummy, ds), COMET_ERR_INVALID_ARG);
    /* N past COMET_CUDA_W4AX_MAX_DIM (rounding N up to 16 would overflow an int near INT_MAX):
     * refused, and the size helpers say 0 instead of wrapping */
    assert_int_equal(comet_cuda_w4ax_pack(INT_MAX, 128, 64, dummy, ds, dummy, ds),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_cuda_w4ax_packed_qw_bytes(INT_MAX, 128), 0);
    assert_int_equal(comet_cuda_w4ax_packed_sw_bytes(INT_MAX, 128, 64), 0);
    assert_int_equal(comet_cuda_w4ax_packed_qw_bytes(COMET_CUDA_W4AX_MAX_DIM, 64),
                     (size_t)COMET_CUDA_W4AX_MAX_DIM * 32);
    /* shapes pack refuses for K: the size helpers say 0 for them too (K not a multiple of 64,
     * or of B) */
    assert_int_equal(comet_cuda_w4ax_packed_qw_bytes(16, 100), 0);
    assert_int_equal(comet_cuda_w4ax_packed_sw_bytes(16, 100, 64), 0);
    assert_int_equal(comet_cuda_w4ax_packed_sw_bytes(16, 192, 128), 0);
    assert_int_equal(comet_cuda_w4ax_packed_sw_bytes(16, 192, 64), 3 * 16 * 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ref_known_values),
        cmocka_unit_test(test_ref_rejects_bad_calls),
        cmocka_unit_test(test_f16_to_f32),
        cmocka_unit_test(test_pack_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
