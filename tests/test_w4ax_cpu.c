/* test_w4ax_cpu.c — the CPU's integer W4Ax GEMM (backend/cpu/w4ax_cpu.h) against the scalar
 * oracle (backend/cpu/ref_gemm_w4ax.h): block sums and outputs bit for bit on random shapes
 * and random INT8-block sets, for every instruction set this CPU runs (each one forced),
 * with 1 and 3 threads; N not a multiple of the 8-row groups; extreme codes; several weights
 * in one call; the packing. Every oracle result is also checked against an independent
 * double-precision sum, and a handmade case against values known exactly. Bad shapes, bad
 * pointers and INT4 codes out of range are refused with the problem named. */
#include <limits.h>
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
#include "backend/w4ax_check.h"
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

/* binary16 bits -> double, written from the IEEE definition (independent of the library's
 * conversions); finite values only. */
static double f16_value(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
    return sign ? -v : v;
}

/* The oracle's y against sum_k qa * sa * qw * sw in double, with codes read from the nibbles
 * directly. Tolerance: the fp32 outer sum over nb blocks rounds each term and each partial
 * sum once, error <= ~(nb + 1) 2^-24 sum_b |term_b|; the same bound as
 * tests/cuda/test_gemm_w4ax_cuda.c. */
static void independent_check(const gemm_case *c) {
    const int K = c->K, B = c->B, nb = K / B;
    for (int t = 0; t < c->M; t++)
        for (int n = 0; n < c->N; n++) {
            double sum = 0, mag = 0;
            for (int b = 0; b < nb; b++) {
                long s = 0;
                for (int k = b * B; k < (b + 1) * B; k++) {
                    int byte = c->qw[(size_t)n * (K / 2) + k / 2];
                    int code = (k % 2 ? byte >> 4 : byte) & 15;
                    s += (long)c->qa[(size_t)t * K + k] * (code < 8 ? code : code - 16);
                }
                double term =
                    (double)s * c->sa[(size_t)t * nb + b] * f16_value(c->sw[(size_t)n * nb + b]);
                sum += term;
                mag += fabs(term);
            }
            double tol = (nb + 2) * 1.2e-7 * mag + 1e-30;
            double got = c->y_ref[(size_t)t * c->N + n];
            if (!(fabs(got - sum) <= tol))
                fail_msg("M=%d N=%d K=%d B=%d n8=%d: oracle y[%d, %d] = %.9g, double sum %.9g "
                         "(tol %.3g)",
                         c->M, c->N, K, B, c->n8, t, n, got, sum, tol);
        }
}

/* Random codes and scales, n8 INT8 blocks (n8 < 0: a random count); extreme = 1 fills with
 * the largest magnitudes (-8 weights, -128 / -8 activations) so the int16 and int32 bounds
 * are reached. The oracle's result is checked against the double sum. */
static void case_init(gemm_case *c, int M, int N, int K, int B, int n8, int extreme) {
    int nb = K / B;
    c->M = M, c->N = N, c->K = K, c->B = B;
    c->n8 = n8 >= 0 ? n8 : (int)(rnd() % (nb + 1));
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
    for (int i = 0; i < N * nb; i++) /* finite fp16 of both signs, subnormals included */
        c->sw[i] = (uint16_t)((rnd() % 0x7800 + 1) | (rnd() & 1) << 15);
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
    independent_check(c);
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
                case_init(&c, Ms[mi], Ns[ni], KB[ki][0], KB[ki][1], -1, 0);
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
        case_init(&c, 5, 19, KB[i][0], KB[i][1], KB[i][0] / KB[i][1] / 2, 1);
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
        case_init(&c[i], 3, Ns[i], 192, 64, -1, 0);
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

/* N not a multiple of the 8-row groups (the code-0-padded tail group) nor of a work item's
 * 32 channels, M across the 64-token tiles, n8 at 0, 1 and all blocks. */
static void test_odd_shapes(void **state) {
    (void)state;
    comet_threadpool *pools[2] = {NULL, comet_threadpool_init(3)};
    assert_non_null(pools[1]);
    const int shapes[][4] = {/* M, N, K, B */
                             {5, 67, 128, 64},
                             {40, 3, 192, 64},
                             {2, 1, 128, 128},
                             {33, 131, 256, 128},
                             {65, 17, 576, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int nb = shapes[i][2] / shapes[i][3], n8s[3] = {0, 1, nb};
        for (int j = 0; j < 3; j++) {
            gemm_case c;
            case_init(&c, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], n8s[j], 0);
            check_case(&c, pools, 2);
            case_free(&c);
        }
    }
    comet_threadpool_free(pools[1]);
}

/* A handmade case whose result is known: every block sum is exact and every term a power
 * of two, so y is exact in fp32; the oracle and every instruction set give it. */
static void test_known_values(void **state) {
    (void)state;
    enum {
        M = 2,
        N = 3,
        K = 128,
        B = 64
    };
    uint8_t qw[N * K / 2] = {0};
    uint16_t sw[N * 2];
    int8_t qa[M * K];
    float sa[M * 2] = {0.5f, 2.0f, 1.0f, 0.25f};
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            comet_w4_plain_set(qw, K, n, k, k % 16 - 8 + n); /* row 2: 8, 9 wrap to -8, -7 */
    for (int i = 0; i < N * 2; i++)
        sw[i] = i % 2 ? 0x4000 : 0x3800; /* block 0: 0.5, block 1: 2.0 */
    for (int t = 0; t < M; t++)
        for (int k = 0; k < K; k++)
            qa[t * K + k] = k < B ? (int8_t)(t ? -128 : 100) : (int8_t)(t ? -8 : 7);
    /* expected, from the definition: codes of row n over one block sum to 4*sum_{j<16}(j-8+n)
     * with the wrap for n = 2 (j = 14, 15 give 8, 9 -> -8, -7) */
    long rowsum[N];
    for (int n = 0; n < N; n++) {
        rowsum[n] = 0;
        for (int j = 0; j < 16; j++) {
            int v = j - 8 + n;
            rowsum[n] += 4 * (v > 7 ? v - 16 : v);
        }
    }
    float want[M * N];
    for (int t = 0; t < M; t++)
        for (int n = 0; n < N; n++) {
            double a0 = t ? -128 : 100, a1 = t ? -8 : 7;
            want[t * N + n] =
                (float)(a0 * rowsum[n] * sa[t * 2] * 0.5 + a1 * rowsum[n] * sa[t * 2 + 1] * 2.0);
        }
    float y[M * N];
    assert_int_equal(comet_ref_gemm_w4ax(M, N, K, B, 1, qw, sw, qa, sa, y, NULL), COMET_OK);
    assert_memory_equal(y, want, sizeof y);
    comet_w4ax_cpu w;
    assert_int_equal(comet_w4ax_cpu_pack(N, K, B, qw, sw, &w), COMET_OK);
    const comet_w4ax_cpu *ws[1] = {&w};
    float *ys[1] = {y};
    for (int isa = COMET_W4AX_ISA_SCALAR; isa < COMET_W4AX_ISA_COUNT; isa++) {
        if (!comet_w4ax_cpu_isa_supported((comet_w4ax_isa)isa))
            continue;
        memset(y, 0, sizeof y);
        assert_int_equal(
            comet_w4ax_cpu_gemm(NULL, (comet_w4ax_isa)isa, 1, ws, M, 1, qa, sa, ys, NULL),
            COMET_OK);
        for (int i = 0; i < M * N; i++)
            if (y[i] != want[i])
                fail_msg("%s: y[%d] = %.9g, want %.9g",
                         comet_w4ax_cpu_isa_name((comet_w4ax_isa)isa), i, y[i], want[i]);
    }
    comet_w4ax_cpu_free(&w);
}

/* The weight borrows the plain codes, copies the last partial group into a code-0-padded
 * tail and regroups the scales (scale 0 past N), as w4ax_cpu.h says. */
static void test_pack_layout(void **state) {
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
    assert_int_equal(
        comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_SCALAR, 1, ws, 1, 0, qa, sa, ys, NULL), COMET_OK);
    for (int n = 0; n < N; n++)
        assert_true(y[n] == 0.0f);
    comet_w4ax_cpu_free(&w);
    comet_w4ax_cpu_free(&w); /* a freed weight frees again as a no-op */
    comet_w4ax_cpu_free(NULL);
    free(qw);
}

/* Bad weights are refused by comet_w4ax_cpu_pack with the problem named (the checks of
 * backend/w4ax_check.h), before any allocation, leaving *w empty. */
static void test_pack_errors(void **state) {
    (void)state;
    uint8_t qw[8 * 64] = {0};
    uint16_t sw[8 * 2] = {0};
    const struct {
        int N, K, B;
        const char *says;
    } bad[] = {{0, 128, 64, "N = 0"},
               {-3, 128, 64, "N = -3"},
               {8, 96, 64, "K = 96"},
               {8, 0, 64, "K = 0"},
               {8, 128, 32, "B = 32"},
               {8, 192, 128, "K = 192 is not a multiple"},
               /* above COMET_W4AX_MAX_DIM: refused before any allocation */
               {COMET_W4AX_MAX_DIM + 1, 128, 64, "N = 1073741825"},
               {INT_MAX, 128, 64, "N = 2147483647"},
               {8, COMET_W4AX_MAX_DIM + 64, 64, "K = 1073741888"}};
    comet_w4ax_cpu w;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&w, 0x5A, sizeof w);
        assert_int_equal(comet_w4ax_cpu_pack(bad[i].N, bad[i].K, bad[i].B, qw, sw, &w),
                         COMET_ERR_INVALID_ARG);
        assert_non_null(strstr(comet_last_error(), bad[i].says));
        assert_non_null(strstr(comet_last_error(), "comet_w4ax_cpu_pack"));
        assert_null(w.qw);
        assert_null(w.tail);
        assert_null(w.sw);
        comet_w4ax_cpu_free(&w);
    }
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 64, NULL, sw, &w), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 64, qw, NULL, &w), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 64, qw, sw, NULL), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
}

/* One weight through the GEMM with the calling thread and the best isa. */
static comet_status gemm1(const comet_w4ax_cpu *w, int M, int n8, const int8_t *qa, const float *sa,
                          float *y) {
    const comet_w4ax_cpu *ws[1] = {w};
    float *ys[1] = {y};
    return comet_w4ax_cpu_gemm(NULL, COMET_W4AX_ISA_AUTO, 1, ws, M, n8, qa, sa, ys, NULL);
}

/* Bad calls are refused by comet_w4ax_cpu_gemm with the problem named, before y is
 * written: M, n8, NULL pointers, the weight list, an isa this CPU lacks, and an INT4 block
 * holding a code outside [-8, 7] (the oracle refuses it too; as an INT8 block it is fine). */
static void test_gemm_errors(void **state) {
    (void)state;
    gemm_case c;
    case_init(&c, 3, 8, 128, 64, 1, 0);
    comet_w4ax_cpu w, w128, empty = {0};
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 64, c.qw, c.sw, &w), COMET_OK);
    assert_int_equal(comet_w4ax_cpu_pack(8, 128, 128, c.qw, c.sw, &w128), COMET_OK);
    float y[3 * 8], y2[3 * 8];
    for (int i = 0; i < 3 * 8; i++)
        y[i] = guard_value;

    assert_int_equal(gemm1(&w, 0, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "M = 0"));
    assert_non_null(strstr(comet_last_error(), "comet_w4ax_cpu_gemm"));
    assert_int_equal(gemm1(&w, -1, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_int_equal(gemm1(&w, INT_MAX - 3, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "M <= 1073741824"));
    assert_int_equal(gemm1(&w, 3, -1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "n8 = -1"));
    assert_int_equal(gemm1(&w, 3, 3, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "[0, K/B = 2]"));
    assert_int_equal(gemm1(NULL, 3, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
    assert_int_equal(gemm1(&w, 3, 1, NULL, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
    assert_int_equal(gemm1(&w, 3, 1, c.qa, NULL, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
    assert_int_equal(gemm1(&w, 3, 1, c.qa, c.sa, NULL), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-NULL"));
    assert_int_equal(gemm1(&empty, 3, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "weight 0 is empty"));

    /* the weight list: its count, its arrays, bsum with one weight only, one K and B; the isa */
    const comet_w4ax_cpu *ws[2] = {&w, &w128};
    float *ys[2] = {y, y2};
    int32_t bs[3 * 8 * 2];
    const struct {
        comet_w4ax_isa isa;
        int n_w;
        const comet_w4ax_cpu *const *ws;
        float *const *ys;
        int32_t *bsum;
        const char *says;
    } bad[] = {{COMET_W4AX_ISA_AUTO, 0, ws, ys, NULL, "n_w = 0"},
               {COMET_W4AX_ISA_AUTO, 8, ws, ys, NULL, "n_w = 8"},
               {COMET_W4AX_ISA_AUTO, 1, NULL, ys, NULL, "non-NULL ws and ys"},
               {COMET_W4AX_ISA_AUTO, 1, ws, NULL, NULL, "non-NULL ws and ys"},
               {COMET_W4AX_ISA_AUTO, 2, ws, ys, bs, "a single weight when bsum is given"},
               {COMET_W4AX_ISA_AUTO, 2, ws, ys, NULL, "weight 1 has K = 128, B = 128"},
               {COMET_W4AX_ISA_COUNT, 1, ws, ys, NULL, "instruction set"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(comet_w4ax_cpu_gemm(NULL, bad[i].isa, bad[i].n_w, bad[i].ws, 3, 1, c.qa,
                                             c.sa, bad[i].ys, bad[i].bsum),
                         COMET_ERR_INVALID_ARG);
        assert_non_null(strstr(comet_last_error(), bad[i].says));
        assert_non_null(strstr(comet_last_error(), "comet_w4ax_cpu_gemm"));
    }

    /* an INT4 block (block 1 when n8 = 1) holding 8 or -9: refused by both GEMMs */
    const int8_t code = c.qa[2 * 128 + 64 + 5];
    c.qa[2 * 128 + 64 + 5] = 8;
    assert_int_equal(gemm1(&w, 3, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "qa[2, 69] = 8"));
    assert_non_null(strstr(comet_last_error(), "[-8, 7]"));
    assert_int_equal(comet_ref_gemm_w4ax(3, 8, 128, 64, 1, c.qw, c.sw, c.qa, c.sa, y2, NULL),
                     COMET_ERR_INVALID_ARG);
    c.qa[2 * 128 + 64 + 5] = -9;
    assert_int_equal(gemm1(&w, 3, 1, c.qa, c.sa, y), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "qa[2, 69] = -9"));
    for (int i = 0; i < 3 * 8; i++) /* no refused call wrote y */
        assert_true(y[i] == guard_value);
    /* as an INT8 block (n8 = 2) the code is fine, and the result is the oracle's */
    assert_int_equal(comet_ref_gemm_w4ax(3, 8, 128, 64, 2, c.qw, c.sw, c.qa, c.sa, y2, NULL),
                     COMET_OK);
    assert_int_equal(gemm1(&w, 3, 2, c.qa, c.sa, y), COMET_OK);
    assert_memory_equal(y, y2, sizeof y);
    c.qa[2 * 128 + 64 + 5] = code;
    assert_int_equal(gemm1(&w, 3, 1, c.qa, c.sa, y), COMET_OK);
    assert_memory_equal(y, c.y_ref, sizeof y);
    comet_w4ax_cpu_free(&w);
    comet_w4ax_cpu_free(&w128);
    case_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_layout),
        cmocka_unit_test(test_pack_errors),
        cmocka_unit_test(test_gemm_errors),
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_extreme_codes),
        cmocka_unit_test(test_multi_weight),
        cmocka_unit_test(test_random_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
