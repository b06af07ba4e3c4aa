/* test_quant.c — FMPQ primitives (src/quant): activation and KV quantize/dequantize error
 * bounds and rounding, amax == 0, reordering and INT8 block choice on constructed
 * salience, RTN clipping search, GPTQ vs RTN on a random layer with correlated inputs,
 * INT4 plain packing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "numerics/qlinear.h"
#include "quant/quant.h"
#include "numerics/pack.h"

/* xorshift64* + Box-Muller: reproducible test data. */
static uint64_t rng_state = 88172645463325252ull;
static double urand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static float nrand(void) {
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void test_act_rounding_known_values(void **st) {
    (void)st;
    /* amax = 7 -> s = 1: codes are rint(x), half to even, clamped to [-8, 7]. */
    float x[8] = {7.0f, -3.5f, 0.5f, 2.5f, -7.0f, 1.49f, -0.5f, 3.5f};
    int8_t q[8];
    float s = comet_quant_sym_block(x, 8, 7, q);
    assert_true(s == 1.0f);
    int8_t want[8] = {7, -4, 0, 2, -7, 1, 0, 4};
    assert_memory_equal(q, want, 8);
    /* INT8: amax 127 -> s = 1. */
    float y[3] = {127.0f, -126.5f, 0.25f};
    s = comet_quant_sym_block(y, 3, 127, q);
    assert_true(s == 1.0f);
    assert_int_equal(q[0], 127);
    assert_int_equal(q[1], -126);
    assert_int_equal(q[2], 0);
}

static void check_act_bounds(int T, int K, int B, int n8) {
    float *x = malloc((size_t)T * K * sizeof *x), *y = malloc((size_t)T * K * sizeof *y);
    int8_t *q = malloc((size_t)T * K);
    float *s = malloc((size_t)T * (K / B) * sizeof *s);
    for (int i = 0; i < T * K; i++)
        x[i] = nrand() * (i % 37 == 0 ? 40.0f : 1.0f);
    for (int k = 0; k < K; k++) /* token 1: an all-zero row */
        if (T > 1)
            x[K + k] = 0.0f;
    comet_quant_act(x, T, K, B, n8, q, s);
    comet_quant_act_sim(x, T, K, B, n8, y);
    int nb = K / B;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < nb; b++) {
            float sc = s[t * nb + b];
            int qmax = b < n8 ? 127 : 7;
            float amax = 0.0f;
            for (int i = 0; i < B; i++)
                amax = fmaxf(amax, fabsf(x[t * K + b * B + i]));
            assert_true(sc == amax / (float)qmax);
            int hit_max = 0;
            for (int i = 0; i < B; i++) {
                int k = t * K + b * B + i;
                assert_true(q[k] >= -qmax - 1 && q[k] <= qmax);
                assert_true(y[k] == (float)q[k] * sc);
                assert_true(fabsf(x[k] - y[k]) <= 0.5f * sc * (1.0f + 1e-5f));
                assert_false(isnan(y[k]));
                if (abs(q[k]) == qmax)
                    hit_max = 1;
            }
            assert_true(amax == 0.0f ? sc == 0.0f : hit_max);
        }
    /* y may alias x. */
    comet_quant_act_sim(x, T, K, B, n8, x);
    assert_memory_equal(x, y, (size_t)T * K * sizeof *x);
    free(x), free(y), free(q), free(s);
}

static void test_act_error_bounds(void **st) {
    (void)st;
    check_act_bounds(5, 192, 64, 1);
    check_act_bounds(3, 256, 128, 2);
    check_act_bounds(1, 64, 64, 0);
    check_act_bounds(2, 576, 64, 9);
}

static void test_act_amax_zero(void **st) {
    (void)st;
    float x[128] = {0}, y[128];
    int8_t q[128];
    float s[2];
    x[70] = -3.0f; /* block 0 all zero, block 1 not */
    comet_quant_act(x, 1, 128, 64, 1, q, s);
    assert_true(s[0] == 0.0f);
    for (int i = 0; i < 64; i++)
        assert_int_equal(q[i], 0);
    assert_true(s[1] == 3.0f / 7.0f);
    assert_int_equal(q[70], -7);
    comet_quant_act_sim(x, 1, 128, 64, 1, y);
    for (int i = 0; i < 128; i++)
        assert_false(isnan(y[i]));
    assert_true(y[0] == 0.0f);
}

static void test_kv_error_bounds(void **st) {
    (void)st;
    const int G = 64, n_groups = 40;
    float x[40 * 64], y[40 * 64];
    for (int i = 0; i < n_groups * G; i++)
        x[i] = nrand() * 3.0f + (i / G % 3 == 0 ? 5.0f : 0.0f);
    for (int bits = 4; bits <= 8; bits += 4) {
        comet_quant_kv_sim(x, n_groups, G, bits, y);
        int levels = (1 << bits) - 1;
        for (int g = 0; g < n_groups; g++) {
            float mn = INFINITY, mx = -INFINITY;
            for (int i = 0; i < G; i++) {
                mn = fminf(mn, x[g * G + i]);
                mx = fmaxf(mx, x[g * G + i]);
            }
            uint8_t q[64];
            uint16_t sh, zh;
            comet_quant_kv_group(x + g * G, G, bits, q, &sh, &zh);
            /* (max - min) / (2 * levels), plus the fp16 rounding of scale and zero. */
            float slack = 1e-3f * (fabsf(mn) + fabsf(mx)) + 1e-3f * (mx - mn);
            for (int i = 0; i < G; i++) {
                assert_true(q[i] <= levels);
                assert_true(y[g * G + i] ==
                            (float)q[i] * comet_quant_f16_value(sh) + comet_quant_f16_value(zh));
                assert_true(fabsf(x[g * G + i] - y[g * G + i]) <= (mx - mn) / (2 * levels) + slack);
            }
        }
    }
    /* A constant group: scale 0, codes 0, exact when the value is an fp16 value. */
    float c[8] = {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f}, cy[8];
    comet_quant_kv_sim(c, 1, 8, 4, cy);
    assert_memory_equal(c, cy, sizeof c);
    /* 16 bits: a copy. */
    comet_quant_kv_sim(x, n_groups, G, 16, y);
    assert_memory_equal(x, y, sizeof x);
    /* Known values: min 0, max 15 -> scale 1, zero 0: codes rint(x). */
    float k[4] = {0.0f, 15.0f, 2.4f, 7.6f};
    uint8_t q[4];
    uint16_t sh, zh;
    comet_quant_kv_group(k, 4, 4, q, &sh, &zh);
    assert_true(comet_quant_f16_value(sh) == 1.0f && comet_quant_f16_value(zh) == 0.0f);
    assert_int_equal(q[0], 0);
    assert_int_equal(q[1], 15);
    assert_int_equal(q[2], 2);
    assert_int_equal(q[3], 8);
}

/* comet_wht: H_n H_n = I (round trip), orthonormal (norm kept), the known H_2 and H_4
 * values; and on key-like vectors (a few channels far larger than the rest, as RoPE'd keys
 * have) KV4 after the rotation (rotated back after dequantization) has a lower error
 * than KV4 of the vector itself. */
static void test_wht_and_kv_rotation(void **st) {
    (void)st;
    float h2[2] = {1.0f, 0.0f};
    comet_wht(h2, 2);
    assert_true(fabsf(h2[0] - 0.70710678f) < 1e-7f && fabsf(h2[1] - 0.70710678f) < 1e-7f);
    float h4[4] = {0.0f, 1.0f, 0.0f, 0.0f}; /* column 1 of H_4 / 2: (1, -1, 1, -1) / 2 */
    comet_wht(h4, 4);
    assert_true(h4[0] == 0.5f && h4[1] == -0.5f && h4[2] == 0.5f && h4[3] == -0.5f);
    for (int n = 1; n <= 256; n *= 2) {
        float x[256], y[256];
        double n0 = 0, n1 = 0;
        for (int i = 0; i < n; i++) {
            x[i] = y[i] = nrand();
            n0 += (double)x[i] * x[i];
        }
        comet_wht(y, n);
        for (int i = 0; i < n; i++)
            n1 += (double)y[i] * y[i];
        assert_true(fabs(n1 - n0) <= 1e-5 * n0);
        comet_wht(y, n);
        for (int i = 0; i < n; i++)
            assert_true(fabsf(y[i] - x[i]) <= 1e-5f * (1.0f + fabsf(x[i])));
    }
    const int D = 64, trials = 200;
    double err_plain = 0, err_rot = 0;
    for (int t = 0; t < trials; t++) {
        float k[64], r[64], y[64];
        for (int i = 0; i < D; i++)
            k[i] = nrand() * 0.5f;
        for (int j = 0; j < 3; j++) /* outlier channels, 20-40x the others */
            k[(int)(urand() * D) % D] +=
                (nrand() > 0 ? 1.0f : -1.0f) * (10.0f + 10.0f * fabsf(nrand()));
        comet_quant_kv_sim(k, 1, D, 4, y);
        memcpy(r, k, sizeof r);
        comet_wht(r, D);
        comet_quant_kv_sim(r, 1, D, 4, r);
        comet_wht(r, D);
        for (int i = 0; i < D; i++) {
            err_plain += (double)(y[i] - k[i]) * (y[i] - k[i]);
            err_rot += (double)(r[i] - k[i]) * (r[i] - k[i]);
        }
    }
    print_message("KV4 squared error on key-like vectors: %.4g plain, %.4g rotated\n", err_plain,
                  err_rot);
    assert_true(err_rot < 0.5 * err_plain);
}

static void test_reorder_int8_blocks(void **st) {
    (void)st;
    enum {
        K = 256,
        B = 64
    };
    float sal[K];
    int32_t perm[K], perm2[K];
    int n8 = -1, n8b = -1;
    for (int k = 0; k < K; k++)
        sal[k] = 1.0f;
    sal[5] = 50.0f, sal[100] = 60.0f, sal[200] = 50.0f, sal[17] = 3.0f;
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 0.25f, 1, perm, &n8), COMET_OK);
    assert_int_equal(perm[0], 100);
    assert_int_equal(perm[1], 5); /* tie with 200: lower index first */
    assert_int_equal(perm[2], 200);
    assert_int_equal(perm[3], 17);
    assert_int_equal(perm[4], 0); /* the rest in index order */
    assert_int_equal(perm[5], 1);
    assert_int_equal(perm[K - 1], 255);
    assert_int_equal(n8, 1);
    /* Deterministic. */
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 0.25f, 1, perm2, &n8b), COMET_OK);
    assert_memory_equal(perm, perm2, sizeof perm);
    assert_int_equal(n8, n8b);
    /* A permutation: every channel once. */
    int seen[K] = {0};
    for (int k = 0; k < K; k++)
        seen[perm[k]]++;
    for (int k = 0; k < K; k++)
        assert_int_equal(seen[k], 1);
    /* tau low enough that channel 17 counts too: still one block. */
    assert_int_equal(comet_quant_reorder(sal, K, B, 2.0f, 1.0f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 1);
    /* Budget 0: no INT8 blocks. */
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 0.0f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 0);
    /* 70 outliers need 2 blocks; budget 0.5 of 4 blocks allows 2, 0.25 caps at 1. */
    for (int k = 0; k < 70; k++)
        sal[(k * 3) % K] = 10.0f + k;
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 0.5f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 2);
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 0.25f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 1);
    for (int k = 1; k < K; k++)
        assert_true(sal[perm[k - 1]] >= sal[perm[k]]);
    /* Without reordering: identity, and the outliers spread over all 4 blocks. */
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 1.0f, 0, perm, &n8), COMET_OK);
    for (int k = 0; k < K; k++)
        assert_int_equal(perm[k], k);
    assert_int_equal(n8, 4);
    /* Median of an even count is the mean of the two middle values. */
    float s4[4] = {1.0f, 3.0f, 2.0f, 10.0f};
    assert_int_equal(comet_quant_reorder(s4, 4, 2, 1.0f, 1.0f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 1); /* median 2.5: channels 3 (10) and 1 (3) exceed it -> block 0 */
    assert_int_equal(perm[0], 3);
    assert_int_equal(perm[1], 1);
    assert_int_equal(comet_quant_reorder(s4, 4, 2, 0.5f, 1.0f, 1, perm, &n8), COMET_OK);
    assert_int_equal(n8, 2); /* threshold 1.25: channel 2 (2) too -> blocks 0 and 1 */
    /* Bad arguments. */
    assert_int_equal(comet_quant_reorder(sal, 100, 64, 4.0f, 0.25f, 1, perm, &n8),
                     COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_quant_reorder(sal, K, B, 4.0f, 1.5f, 1, perm, &n8),
                     COMET_ERR_INVALID_ARG);
}

static void test_choose_block(void **st) {
    (void)st;
    int smol[3] = {576, 576, 1536}, llama[3] = {4096, 4096, 11008}, odd[2] = {4096, 100};
    assert_int_equal(comet_quant_choose_block(smol, 3), 64);
    assert_int_equal(comet_quant_choose_block(llama, 2), 128);
    assert_int_equal(comet_quant_choose_block(llama, 3), 128); /* 11008 = 86 * 128 */
    assert_int_equal(comet_quant_choose_block(odd, 2), 0);
}

static double block_mse(const float *w, const int8_t *q, const uint16_t *s, int N, int K, int B) {
    double e = 0.0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double d = w[n * K + k] - q[n * K + k] * comet_quant_f16_value(s[n * (K / B) + k / B]);
            e += d * d;
        }
    return e / ((double)N * K);
}

static void test_weight_rtn(void **st) {
    (void)st;
    enum {
        N = 16,
        K = 128,
        B = 64
    };
    float w[N * K], wd[N * K];
    int8_t q[N * K], qc[N * K];
    uint16_t s[N * 2], sc[N * 2];
    for (int i = 0; i < N * K; i++)
        w[i] = nrand() * (i % 53 == 0 ? 6.0f : 1.0f);
    for (int k = 0; k < B; k++) /* an all-zero block */
        w[3 * K + k] = 0.0f;
    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 4, 0, q, s), COMET_OK);
    comet_quant_w_dequant(q, s, N, K, B, wd);
    for (int i = 0; i < N * K; i++) {
        float sv = comet_quant_f16_value(s[(i / K) * 2 + (i % K) / B]);
        assert_true(q[i] >= -8 && q[i] <= 7);
        /* the fp16 scale may round below amax/7, so the top code may clip by a hair */
        assert_true(fabsf(w[i] - wd[i]) <= 0.5f * sv * 1.002f + 1e-6f);
    }
    assert_true(comet_quant_f16_value(s[3 * 2]) == 0.0f);
    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 4, 1, qc, sc), COMET_OK);
    /* The search includes ratio 1, so each block is no worse; overall strictly better. */
    for (int n = 0; n < N; n++)
        for (int b = 0; b < 2; b++) {
            double e0 = 0, e1 = 0;
            for (int k = b * B; k < (b + 1) * B; k++) {
                double d0 = w[n * K + k] - q[n * K + k] * comet_quant_f16_value(s[n * 2 + b]);
                double d1 = w[n * K + k] - qc[n * K + k] * comet_quant_f16_value(sc[n * 2 + b]);
                e0 += d0 * d0, e1 += d1 * d1;
            }
            assert_true(e1 <= e0);
        }
    assert_true(block_mse(w, qc, sc, N, K, B) < 0.95 * block_mse(w, q, s, N, K, B));
    /* INT8, one scale per output channel (B = K). */
    uint16_t s8[N];
    assert_int_equal(comet_quant_w_rtn(w, N, K, K, 8, 0, q, s8), COMET_OK);
    comet_quant_w_dequant(q, s8, N, K, K, wd);
    for (int i = 0; i < N * K; i++)
        assert_true(fabsf(w[i] - wd[i]) <= 0.5f * comet_quant_f16_value(s8[i / K]) * 1.01f + 1e-6f);
    assert_int_equal(comet_quant_w_rtn(w, N, K, 48, 4, 0, q, s), COMET_ERR_INVALID_ARG);
    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 3, 0, q, s), COMET_ERR_INVALID_ARG);
    /* The weighted search: h = 1 everywhere is the plain one; a heavy weight on the
     * largest entry (which the clipped scales cut) makes the search keep it exact
     * enough: its weighted error is no larger than with the plain choice. */
    float h[64], blk[64];
    for (int i = 0; i < 64; i++)
        h[i] = 1.0f, blk[i] = nrand();
    blk[5] = 6.0f; /* an outlier: the plain search clips it */
    assert_int_equal(comet_quant_w_block_scale_weighted(blk, h, 64, 7, 1),
                     comet_quant_w_block_scale(blk, 64, 7, 1));
    h[5] = 1e4f;
    float sp = comet_quant_f16_value(comet_quant_w_block_scale(blk, 64, 7, 1));
    float sw = comet_quant_f16_value(comet_quant_w_block_scale_weighted(blk, h, 64, 7, 1));
    double ep = 0, ew = 0;
    for (int i = 0; i < 64; i++) {
        double dp = blk[i] - comet_quant_w_code(blk[i], sp, 7) * sp;
        double dw = blk[i] - comet_quant_w_code(blk[i], sw, 7) * sw;
        ep += h[i] * dp * dp, ew += h[i] * dw * dw;
    }
    assert_true(sw != sp && ew < ep);
}

/* Output error ||X Wᵀ - X Ŵᵀ||² / (T N) for codes q and scales s. */
static double output_mse(const float *x, int T, const float *w, const int8_t *q, const uint16_t *s,
                         int N, int K, int B) {
    float *wd = malloc((size_t)N * K * sizeof *wd);
    comet_quant_w_dequant(q, s, N, K, B, wd);
    double e = 0.0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double d = 0.0;
            for (int k = 0; k < K; k++)
                d += (double)x[t * K + k] * (w[n * K + k] - wd[n * K + k]);
            e += d * d;
        }
    free(wd);
    return e / ((double)T * N);
}

static void test_gptq_beats_rtn(void **st) {
    (void)st;
    enum {
        T = 1024,
        K = 256,
        N = 48,
        B = 64
    };
    float *z = malloc((size_t)T * K * sizeof *z), *x = malloc((size_t)T * K * sizeof *x);
    float *mix = malloc((size_t)K * K * sizeof *mix), *w = malloc((size_t)N * K * sizeof *w);
    float *xtx = calloc((size_t)K * K, sizeof *xtx);
    int8_t *qr = malloc((size_t)N * K), *qg = malloc((size_t)N * K);
    uint16_t sr[N * (K / B)], sg[N * (K / B)];
    for (int i = 0; i < T * K; i++)
        z[i] = nrand();
    /* Correlated inputs: x = z · M with M = I + low-rank-ish dense mixing, plus a few
     * high-variance channels (like activation outliers). */
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++)
            mix[i * K + j] = (i == j ? 1.0f : 0.0f) + 0.3f * nrand() / sqrtf((float)K) +
                             (i % 8 == j % 8 ? 0.2f : 0.0f);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            float acc = 0.0f;
            for (int i = 0; i < K; i++)
                acc += z[t * K + i] * mix[i * K + j];
            x[t * K + j] = acc * (j % 31 == 0 ? 8.0f : 1.0f);
        }
    for (int i = 0; i < N * K; i++)
        w[i] = nrand();
    comet_quant_xtx_update(xtx, x, T / 2, K);
    comet_quant_xtx_update(xtx, x + (size_t)(T / 2) * K, T / 2, K);
    /* xtx is symmetric and matches a direct sum. */
    double d01 = 0.0;
    for (int t = 0; t < T; t++)
        d01 += (double)x[t * K + 0] * x[t * K + 1];
    assert_true(fabs(xtx[1] - d01) <= 1e-3 * fabs(d01) + 1e-2);
    assert_true(xtx[1] == xtx[K]);

    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 4, 1, qr, sr), COMET_OK);
    assert_int_equal(comet_quant_w_gptq(w, N, K, xtx, B, 4, 0.01f, 1, qg, sg), COMET_OK);
    double e_rtn = output_mse(x, T, w, qr, sr, N, K, B);
    double e_gptq = output_mse(x, T, w, qg, sg, N, K, B);
    print_message("output MSE: RTN+clip %.5f GPTQ %.5f (ratio %.3f)\n", e_rtn, e_gptq,
                  e_gptq / e_rtn);
    assert_true(e_gptq < 0.8 * e_rtn);
    for (int i = 0; i < N * K; i++)
        assert_true(qg[i] >= -8 && qg[i] <= 7);
    /* GPTQ with an all-zero Hessian (no data) still works: damping, diag 1. */
    memset(xtx, 0, (size_t)K * K * sizeof *xtx);
    assert_int_equal(comet_quant_w_gptq(w, N, K, xtx, B, 4, 0.01f, 0, qg, sg), COMET_OK);
    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 4, 0, qr, sr), COMET_OK);
    assert_memory_equal(qg, qr, (size_t)N * K); /* identity Hessian: GPTQ is RTN */
    free(z), free(x), free(mix), free(w), free(xtx), free(qr), free(qg);
}

static void test_w4_pack_round_trip(void **st) {
    (void)st;
    enum {
        N = 3,
        K = 34
    };
    int8_t q[N * K], back[N * K];
    uint8_t packed[N * K / 2];
    for (int i = 0; i < N * K; i++)
        q[i] = (int8_t)((int)(urand() * 16.0) - 8);
    q[0] = 1, q[1] = -1, q[2] = -8, q[3] = 7;
    comet_w4_pack(q, N, K, packed);
    assert_int_equal(packed[0], 0xF1);
    assert_int_equal(packed[1], 0x78);
    comet_w4_unpack(packed, N, K, back);
    assert_memory_equal(q, back, sizeof q);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            assert_int_equal(comet_w4_plain_get(packed, K, n, k), q[n * K + k]);
    /* The element setter of w4_plain.h builds the same bytes. */
    uint8_t set[N * K / 2];
    memset(set, 0xA5, sizeof set);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            comet_w4_plain_set(set, K, n, k, q[n * K + k]);
    assert_memory_equal(set, packed, sizeof set);
}

/* The fp32 simulation of a quantized linear equals the integer W4Ax GEMM oracle on the same
 * codes and scales (up to fp32 rounding of the outer sums). */
static void test_qlinear_sim_matches_w4ax_gemm(void **st) {
    (void)st;
    enum {
        T = 7,
        K = 192,
        N = 40,
        B = 64,
        N8 = 1
    };
    float *x = malloc(sizeof(float) * T * K), *w = malloc(sizeof(float) * N * K);
    float *wd = malloc(sizeof(float) * N * K), *y = malloc(sizeof(float) * T * N);
    float *yref = malloc(sizeof(float) * T * N), *xp = malloc(sizeof(float) * T * K);
    int8_t *qw = malloc(N * K), *qa = malloc(T * K);
    uint8_t *packed = malloc(N * K / 2);
    uint16_t sw[N * (K / B)];
    float sa[T * (K / B)];
    int32_t perm[K];
    for (int i = 0; i < T * K; i++)
        x[i] = nrand() * (i % K == 5 ? 30.0f : 1.0f);
    for (int i = 0; i < N * K; i++)
        w[i] = nrand();
    for (int k = 0; k < K; k++)
        perm[k] = (k * 7 + 3) % K; /* 7 is coprime with 192: a permutation */
    assert_int_equal(comet_quant_w_rtn(w, N, K, B, 4, 1, qw, sw), COMET_OK);
    comet_quant_w_dequant(qw, sw, N, K, B, wd);
    comet_w4_pack(qw, N, K, packed);
    comet_linear lin = {.n_out = N,
                        .n_in = K,
                        .fmt = COMET_WFMT_QSIM,
                        .w = wd,
                        .perm = perm,
                        .block = B,
                        .n8 = N8,
                        .a_bits = 4,
                        .w_bits = 4,
                        .qw = packed,
                        .sw = sw};
    assert_int_equal(comet_qlinear_sim(&lin, x, T, y), COMET_OK);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++)
            xp[t * K + k] = x[t * K + perm[k]];
    comet_quant_act(xp, T, K, B, N8, qa, sa);
    assert_int_equal(comet_ref_gemm_w4ax(T, N, K, B, N8, packed, sw, qa, sa, yref, NULL), COMET_OK);
    double num = 0, den = 0;
    for (int i = 0; i < T * N; i++) {
        num += (double)(y[i] - yref[i]) * (y[i] - yref[i]);
        den += (double)yref[i] * yref[i];
    }
    assert_true(sqrt(num / den) < 1e-5);
    /* a_bits 16: only the gather, no activation rounding. */
    lin.a_bits = 16;
    float *xq = malloc(sizeof(float) * T * K);
    comet_qlinear_input(&lin, x, T, xq);
    assert_memory_equal(xq, xp, sizeof(float) * T * K);
    free(x), free(w), free(wd), free(y), free(yref), free(xp), free(qw), free(qa), free(packed);
    free(xq);
}

/* ---- degenerate inputs (docs/numerics.md "Degenerate inputs") ---- */

/* A block with a NaN or an infinity: codes 0 and a NaN scale, no NaN cast to an integer;
 * the other blocks of the token are untouched. */
static void test_act_nonfinite(void **st) {
    (void)st;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float x[128];
        for (int i = 0; i < 128; i++)
            x[i] = 0.01f * (float)(i - 60);
        x[5] = bad[k];
        int8_t q[128];
        float s[2];
        memset(q, 0x55, sizeof q);
        comet_quant_act(x, 1, 128, 64, 0, q, s);
        assert_true(isnan(s[0]));
        for (int i = 0; i < 64; i++)
            assert_int_equal(q[i], 0);
        float s1 = comet_quant_sym_block(x + 64, 64, 7, q + 64);
        assert_true(isfinite(s[1]) && s[1] == s1);
        float y[128];
        comet_quant_act_sim(x, 1, 128, 64, 0, y);
        assert_true(isnan(y[0]) && isfinite(y[100]));
    }
}

/* fp16 weight scales at the edges: tiny blocks keep |w - q*s| <= s/2 (subnormal scales
 * rounded up, the smallest scale below that), a 1e-6 block meets amax/7; a block whose
 * scale fp16 cannot hold, or with a non-finite weight, is refused naming the block. */
static void test_weight_scale_edges(void **st) {
    (void)st;
    const float amaxes[] = {1e-40f, 1e-30f, 1e-6f, 3e-5f, 1.0f, 4.5e5f};
    for (size_t a = 0; a < sizeof amaxes / sizeof amaxes[0]; a++) {
        for (int clip = 0; clip < 2; clip++) {
            float w[64];
            for (int i = 0; i < 64; i++)
                w[i] = amaxes[a] * (float)((i * 37) % 64 - 32) / 32.0f;
            w[7] = amaxes[a];
            int8_t q[64];
            uint16_t sh;
            assert_int_equal(comet_quant_w_rtn(w, 1, 64, 64, 4, clip, q, &sh), COMET_OK);
            float s = comet_quant_f16_value(sh);
            assert_true(isfinite(s) && s > 0.0f);
            double worst = 0;
            for (int i = 0; i < 64; i++)
                worst = fmax(worst, fabs((double)w[i] - (double)q[i] * s));
            if (!clip) { /* unclipped: within half a step, and within amax/7 */
                assert_true(worst <= 0.5 * s * (1 + 1e-6));
                assert_true(worst <= amaxes[a] / 7.0 || s == comet_quant_f16_value(1));
            }
        }
    }
    float w[128];
    for (int i = 0; i < 128; i++)
        w[i] = 0.5f;
    w[64 + 9] = 5e5f; /* block 1: 5e5 / 7 > 65504 */
    int8_t q[128];
    uint16_t sh[2];
    assert_int_equal(comet_quant_w_rtn(w, 1, 128, 64, 4, 1, q, sh), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "block 1"));
    assert_non_null(strstr(comet_last_error(), "65504"));
    w[64 + 9] = NAN;
    assert_int_equal(comet_quant_w_rtn(w, 1, 128, 64, 4, 0, q, sh), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "non-finite"));
    assert_int_equal(comet_quant_w_code(NAN, 1.0f, 7), 0);
}

/* The INT8 lm_head row (docs/numerics.md "lm_head"): codes in [-127, 127] with the largest
 * magnitude reaching 127, within half a step of the weights, the scale an fp16 value at or
 * just above amax / 127; zeros give s = 0, a non-finite value or an amax fp16 cannot scale
 * gives a NaN scale and zero codes. */
static void test_lm_head_row(void **st) {
    (void)st;
    const float amaxes[] = {1e-30f, 3e-5f, 0.02f, 1.0f, 7.9e6f};
    enum {
        N = 577
    };
    float w[N];
    int8_t q[N];
    for (size_t a = 0; a < sizeof amaxes / sizeof amaxes[0]; a++) {
        for (int i = 0; i < N; i++)
            w[i] = amaxes[a] * (float)((i * 37) % 255 - 127) / 127.0f;
        w[N - 1] = -amaxes[a]; /* the largest magnitude in the tail */
        const float s = comet_quant_f16_value(comet_quant_lm_head_row(w, N, q));
        assert_true(isfinite(s) && s >= amaxes[a] / 127.0f);
        assert_true(s > 0.0f);
        int qmax = 0;
        for (int i = 0; i < N; i++) {
            assert_true(q[i] >= -127 && q[i] <= 127);
            qmax = abs(q[i]) > qmax ? abs(q[i]) : qmax;
            assert_true(fabs((double)w[i] - (double)q[i] * s) <= 0.5 * s * (1 + 1e-6));
        }
        if (amaxes[a] / 127.0f >= 6.104e-5f) /* a normal fp16 scale: within 2^-10 of amax/127 */
            assert_int_equal(qmax, 127);
    }
    memset(w, 0, sizeof w);
    w[5] = 1.4e-45f; /* amax / 127 underflows fp32: the smallest fp16 scale, codes 0 */
    assert_int_equal(comet_quant_lm_head_row(w, N, q), 1);
    assert_int_equal(q[5], 0);
    w[5] = 0.0f;
    assert_int_equal(comet_quant_lm_head_row(w, N, q), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(q[i], 0);
    w[3] = 1.0f, w[100] = NAN;
    assert_true(isnan(comet_quant_f16_value(comet_quant_lm_head_row(w, N, q))));
    assert_int_equal(q[3], 0);
    w[100] = -INFINITY;
    assert_true(isnan(comet_quant_f16_value(comet_quant_lm_head_row(w, N, q))));
    w[100] = 1e7f; /* 1e7 / 127 > 65504 */
    assert_true(isnan(comet_quant_f16_value(comet_quant_lm_head_row(w, N, q))));
}

/* KV zero points: a large offset with a small spread stays within half a stored step (the
 * zero rounds down, the scale up); values fp16 cannot hold give codes 0 and a NaN scale. */
static void test_kv_zero_edges(void **st) {
    (void)st;
    const float offsets[] = {2000.0f, 2000.3f, -2000.3f, 1e-7f, -3.3e4f};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++) {
            float x[64];
            for (int i = 0; i < 64; i++)
                x[i] = offsets[o] + 0.5f * (float)((i * 29) % 64) / 63.0f;
            uint8_t q[64];
            uint16_t sh, zh;
            comet_quant_kv_group(x, 64, bits, q, &sh, &zh);
            float s = comet_quant_f16_value(sh), z = comet_quant_f16_value(zh);
            assert_true(isfinite(s) && isfinite(z) && z <= offsets[o]);
            double worst = 0;
            for (int i = 0; i < 64; i++)
                worst = fmax(worst, fabs((double)x[i] - ((double)q[i] * s + z)));
            /* half a stored step (fp32 rounding of x - z aside) */
            assert_true(worst <= 0.5 * s + 1e-6 * fabs(offsets[o]) + 1e-7);
        }
    const float bad[] = {7e4f, -7e4f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        float x[64];
        for (int i = 0; i < 64; i++)
            x[i] = 0.1f * (float)i;
        x[11] = bad[k];
        uint8_t q[64];
        uint16_t sh, zh;
        memset(q, 0x55, sizeof q);
        comet_quant_kv_group(x, 64, 4, q, &sh, &zh);
        assert_true(isnan(comet_quant_f16_value(sh)));
        for (int i = 0; i < 64; i++)
            assert_int_equal(q[i], 0);
    }
}

/* The directed fp16 roundings agree with their definition around zero, subnormals and
 * the top of the range. */
static void test_f16_directed(void **st) {
    (void)st;
    const float xs[] = {0.0f,     -0.0f,   1e-9f,    -1e-9f,    6e-8f,   1.0001f,
                        -1.0001f, 2000.3f, 65503.0f, -65503.0f, 3.14159f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        float d = comet_quant_f16_value(comet_quant_f16_bits_down(xs[i]));
        float u = comet_quant_f16_value(comet_quant_f16_bits_up(xs[i]));
        assert_true(d <= xs[i] && u >= xs[i]);
        assert_true(u - d <= fabsf(comet_quant_f16_round(xs[i])) / 1024.0f + 6e-8f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_act_rounding_known_values),
        cmocka_unit_test(test_act_error_bounds),
        cmocka_unit_test(test_act_amax_zero),
        cmocka_unit_test(test_kv_error_bounds),
        cmocka_unit_test(test_wht_and_kv_rotation),
        cmocka_unit_test(test_reorder_int8_blocks),
        cmocka_unit_test(test_choose_block),
        cmocka_unit_test(test_weight_rtn),
        cmocka_unit_test(test_gptq_beats_rtn),
        cmocka_unit_test(test_w4_pack_round_trip),
        cmocka_unit_test(test_qlinear_sim_matches_w4ax_gemm),
        cmocka_unit_test(test_act_nonfinite),
        cmocka_unit_test(test_weight_scale_edges),
        cmocka_unit_test(test_lm_head_row),
        cmocka_unit_test(test_kv_zero_edges),
        cmocka_unit_test(test_f16_directed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
