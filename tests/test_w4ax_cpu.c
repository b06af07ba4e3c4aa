/* test_w4ax_cpu.c — the CPU's integer W4Ax GEMM (backend/cpu/w4ax_cpu.h) against the scalar
 * oracle (backend/cpu/ref_gemm_w4ax.h): block sums and outputs bit for bit on random shapes
 * and random INT8-block sets, for every instruction set this CPU runs (each one forced),
 * with 1 and 3 threads; extreme codes; several weights in one call; the packing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "backend/cpu/w4ax_cpu.h"
#include "core/threads.h"
#include "numerics/quant.h"
#include "numerics/w4_plain.h"

static uint32_t rng_state = 2024;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

#define GUARD 16
static const float guard_value = 12345.0f;

typedef struct {
    int M, N, K, B, n8;
    uint8_t *qw;
    uint16_t *sw;
    int8_t *qa;
    float *sa;
    float *y_ref;
    int32_t *bs_ref;
} gemm_case;

/* Random codes and scales; extreme = 1 fills with the largest magnitudes (-8 weights, -128 /
 * -8 activations) so the int16 and int32 bounds are reached. */
static void case_init(gemm_case *c, int M, int N, int K, int B, int extreme) {
    int nb = K / B;
    c->M = M, c->N = N, c->K = K, c->B = B;
    c->n8 = extreme ? nb / 2 : (int)(rnd() % (nb + 1));
    c->qw = malloc(comet_w4_plain_bytes(N, K));
    c->sw = malloc((size_t)N * nb * sizeof *c->sw);
    c->qa = malloc((size_t)M * K);
    c->sa = malloc((size_t)M * nb * sizeof *c->sa);
    c->y_ref = malloc((size_t)M * N * sizeof *c->y_ref);
    c->bs_ref = malloc((size_t)M * N * nb * sizeof *c->bs_ref);
    assert_non_null(c->bs_ref);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            comet_w4_plain_set(c->qw, K, n, k, extreme ? -8 : (int)(rnd() % 16) - 8);
    for (int i = 0; i < N * nb; i++) /* positive finite fp16, subnormals included */
        c->sw[i] = (uint16_t)(rnd() % 0x7800 + 1);
    for (int t = 0; t < M; t++)
        for (int k = 0; k < K; k++) {
            int int8 = k / B < c->n8;
            int v = int8 ? (int)(rnd() % 256) - 128 : (int)(rnd() % 16) - 8;
            c->qa[(size_t)t * K + k] = (int8_t)(extreme ? (int8 ? -128 : -8) : v);
        }
    for (int i = 0; i < M * nb; i++)
        c->sa[i] = (float)(rnd() % 100000 + 1) * 1e-6f;
    assert_int_equal(comet_ref_gemm_w4ax(M, N, K, B, c->n8, c->qw, c->sw, c->qa, c->sa, c->y_ref,
                                         c->bs_ref),
                     COMET_OK);
}

static void case_free(gemm_case *c) {
    free(c->qw), free(c->sw), free(c->qa), free(c->sa), free(c->y_ref), free(c->bs_ref);
}

/* Every supported isa, 1 and 3 threads: bsum and y bit-equal to the oracle, guards intact. */
static void check_case(const gemm_case *c, comet_threadpool *const *pools, int n_pools) {
    comet_w4ax_cpu w;
    assert_int_equal(comet_w4ax_cpu_pack(c->N, c->K, c->B, c->qw, c->sw, &w), COMET_OK);
    size_t ny = (size_t)c->M * c->N, nbs = ny * (c->K / c->B);
    float *y = malloc((ny + GUARD) * sizeof *y);
    int32_t *bs = malloc(nbs * sizeof *bs);
    for (int isa = COMET_W4AX_ISA_SCALAR; isa < COMET_W4AX_ISA_COUNT; isa++) {
        if (!comet_w4ax_cpu_isa_supported((comet_w4ax_isa)isa))
            continue;
        for (int p = 0; p < n_pools; p++) {
            for (size_t i = 0; i < ny + GUARD; i++)
                y[i] = guard_value;
            memset(bs, 0x5A, nbs * sizeof *bs);
            const comet_w4ax_cpu *ws[1] = {&w};
            float *ys[1] = {y};
            assert_int_equal(comet_w4ax_cpu_gemm(pools[p], (comet_w4ax_isa)isa, 1, ws, c->M,
                                                 c->n8, c->qa, c->sa, ys, bs),
                             COMET_OK);
            if (memcmp(bs, c->bs_ref, nbs * sizeof *bs) || memcmp(y, c->y_ref, ny * sizeof *y))
                fail_msg("%s, pool %d: M=%d N=%d K=%d B=%d n8=%d differs from the oracle",
                         comet_w4ax_cpu_isa_name((comet_w4ax_isa)isa), p, c->M, c->N, c->K, c->B,
                         c->n8);
            for (int i = 0; i < GUARD; i++)
                assert_true(y[ny + i] == guard_value);
            /* without bsum: the same y */
            for (size_t i = 0; i < ny; i++)
                y[i] = guard_value;
            assert_int_equal(comet_w4ax_cpu_gemm(pools[p], (comet_w4ax_isa)isa, 1, ws, c->M,
                                                 c->n8, c->qa, c->sa, ys, NULL),
                             COMET_OK);
            assert_memory_equal(y, c->y_ref, ny * sizeof *y);
        }
    }
    free(y), free(bs);
    comet_w4ax_cpu_free(&w);
}

static void test_random_shapes(void **state) {
    (void)state;
    comet_threadpool *pools[2] = {comet_threadpool_init(1), comet_threadpool_init(3)};
    assert_non_null(pools[0]);
    assert_non_null(pools[1]);
    const int Ms[] = {1, 3, 17, 64, 257}, Ns[] = {8, 72, 1000};
    const int KB[][2] = {{64, 64}, {576, 64}, {256, 128}, {1536, 128}};
    int n_isa = 0;
    for (int isa = COMET_W4AX_ISA_SCALAR; isa < COMET_W4AX_ISA_COUNT; isa++)
        if (comet_w4ax_cpu_isa_supported((comet_w4ax_isa)isa)) {
            printf("  isa %s: tested\n", comet_w4ax_cpu_isa_name((comet_w4ax_isa)isa));
            n_isa++;
        } else {
            printf("  isa %s: not on this CPU, skipped\n",
                   comet_w4ax_cpu_isa_name((comet_w4ax_isa)isa));
        }
    assert_true(n_isa >= 1);
    for (size_t mi = 0; mi < 5; mi++)
        for (size_t ni = 0; ni < 3; ni++)
            for (size_t ki = 0; ki < 4; ki++) {
                if (Ms[mi] * Ns[ni] * KB[ki][0] > 100000000)
                    continue; /* the oracle is slow: the largest shape is 257 x 1000 x 256 */
                gemm_case c;
                case_init(&c, Ms[mi], Ns[ni], KB[ki][0], KB[ki][1], 0);
                check_case(&c, pools, 2);
                case_free(&c);
            }
    comet_threadpool_free(pools[0]);
    comet_threadpool_free(pools[1]);
}

/* -128 x -8 everywhere: the largest int16 pair sums (AVX2) and block sums (131072 at B 128). */
static void test_extreme_codes(void **state) {
    (void)state;
    comet_threadpool *pool = NULL;
    const int KB[][2] = {{128, 64}, {256, 128}};
    for (int i = 0; i < 2; i++) {
        gemm_case c;
        case_init(&c, 5, 19, KB[i][0], KB[i][1], 1);
        assert_int_equal(c.bs_ref[0], 128 * 8 * KB[i][1]); /* block 0 is INT8 */
        check_case(&c, &pool, 1);
        case_free(&c);
    }
}

/* Three weights in one call give what three calls give (the QKV group). */
static void test_multi_weight(void **state) {
    (void)state;
    comet_threadpool *pool = comet_threadpool_init(2);
    gemm_case c[3];
    const int Ns[3] = {72, 24, 24};
    for (int i = 0; i < 3; i++) {
        case_init(&c[i], 3, Ns[i], 192, 64, 0);
        if (i) { /* the same activation for every weight */
            memcpy(c[i].qa, c[0].qa, (size_t)3 * 192);
            memcpy(c[i].sa, c[0].sa, (size_t)3 * 3 * sizeof(float));
            c[i].n8 = c[0].n8;
            comet_ref_gemm_w4ax(3, Ns[i], 192, 64, c[i].n8, c[i].qw, c[i].sw, c[i].qa, c[i].sa,
                                c[i].y_ref, NULL);
        }
    }
    comet_w4ax_cpu w[3];
    const comet_w4ax_cpu *ws[3];
    float *ys[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(comet_w4ax_cpu_pack(Ns[i], 192, 64, c[i].qw, c[i].sw, &w[i]), COMET_OK);
        ws[i] = &w[i];
        ys[i] = calloc((size_t)3 * Ns[i], sizeof(float));
    }
    assert_int_equal(comet_w4ax_cpu_gemm(pool, COMET_W4AX_ISA_AUTO, 3, ws, 3, c[0].n8, c[0].qa,
                                         c[0].sa, ys, NULL),
                     COMET_OK);
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(ys[i], c[i].y_ref, (size_t)3 * Ns[i] * sizeof(float));
        free(ys[i]);
        comet_w4ax_cpu_free(&w[i]);
        case_free(&c[i]);
    }
    comet_threadpool_free(pool);
}

/* The weight borrows the plain codes, copies the last partial group into a code-0-padded
 * tail and regroups the scales (scale 0 past N), as w4ax_cpu.h says; bad shapes and calls
 * are refused. */
static void test_pack_layout_and_errors(void **state) {
    (void)state;
    const int N = 11, K = 256, B = 128, nb = K / B;
    uint8_t *qw = malloc(comet_w4_plain_bytes(N, K));
    uint16_t sw[11 * 2];
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            comet_w4_plain_set(qw, K, n, k, (int)(rnd() % 16) - 8);
    for (int i = 0; i < N * nb; i++)
        sw[i] = (uint16_t)(0x3C00 + i);
    comet_w4ax_cpu w;
    assert_int_equal(comet_w4ax_cpu_pack(N, K, B, qw, sw, &w), COMET_OK);
    assert_int_equal(w.n_pad, 16);
    assert_ptr_equal(w.qw, qw);
    assert_non_null(w.tail);
    assert_int_equal(comet_w4ax_cpu_bytes(&w), (size_t)N * K / 2 + (size_t)16 * nb * 2);
    for (int n = 8; n < w.n_pad; n++)
        for (int k = 0; k < K; k++)
            assert_int_equal(comet_w4_plain_get(w.tail, K, n - 8, k),
                             n < N ? comet_w4_plain_get(qw, K, n, k) : 0);
    for (int n = 0; n < w.n_pad; n++)
        for (int b = 0; b < nb; b++)
            assert_int_equal(w.sw[((size_t)(n / 8) * nb + b) * 8 + n % 8],
                             n < N ? sw[n * nb + b] : 0);
    int8_t qa[256] = {0};
    float sa[2] = {1, 1}, y[11];
    const comet_w4ax_cpu *ws[1] = {&w};
    float *ys[1] = {y};
    assert_int_equal(comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_AUTO, 1, ws, 0, 0, qa, sa, ys, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_AUTO, 1, ws, 1, 3, qa, sa, ys, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_AUTO, 1, ws, 1, 0, NULL, sa, ys,
                                         NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_COUNT, 1, ws, 1, 0, qa, sa, ys, NULL),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_SCALAR, 1, ws, 1, 0, qa, sa, ys,
                                         NULL),
                     COMET_OK);
    for (int n = 0; n < N; n++)
        assert_true(y[n] == 0.0f);
    comet_w4ax_cpu_free(&w);
    comet_w4ax_cpu_free(&w); /* a freed weight frees again as a no-op */
    assert_int_equal(comet_w4ax_cpu_pack(8, 96, 64, qw, sw, &w), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 32, qw, sw, &w), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_pack(0, 128, 64, qw, sw, &w), COMET_ERR_INVALID_ARG);
    free(qw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_layout_and_errors),
        cmocka_unit_test(test_extreme_codes),
        cmocka_unit_test(test_multi_weight),
        cmocka_unit_test(test_random_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
