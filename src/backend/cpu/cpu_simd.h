/* cpu_simd.h — the vector arithmetic of the fast CPU backend, shared by its linear layers,
 * lm_head and elementwise ops (cpu_ops.c) and its attention (cpu_attention.c): the
 * batch-invariant dot products (one fixed sequence of operations per pair of vectors, see
 * cpu_ops.c's file comment) and a vectorized exp. AVX2 + FMA when the compiler targets it,
 * plain C loops otherwise. Private to src/backend/cpu. */
#ifndef COMET_BACKEND_CPU_SIMD_H
#define COMET_BACKEND_CPU_SIMD_H

#include <math.h>
#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define COMET_CPU_AVX2 1
#endif

static inline float comet_cpu_dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.0f;
#ifdef COMET_CPU_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

#ifdef COMET_CPU_AVX2
/* e^x for 8 lanes, Cephes polynomial (about 2 ulp over the clamped range; below -87.3
 * the result underflows towards 0 like expf). */
static inline __m256 comet_cpu_exp256_ps(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365447504f);
    x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

/* x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. */
static inline float comet_cpu_exp_shift_sum(float *x, int n, float shift) {
    int i = 0;
    float sum = 0.0f;
#ifdef COMET_CPU_AVX2
    __m256 vs = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 e = comet_cpu_exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sum = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++)
        sum += (x[i] = expf(x[i] - shift));
    return sum;
}

/* ---- batch-invariant dot products ----
 *
 * dot(x, w, n), as every kernel below computes it: one 8-lane accumulator, acc += x[k..k+8]
 * * w[k..k+8] (FMA) for k = 0, 8, ..., the last n % 8 values through a masked load, then
 * the lanes summed as hsum8 does. A block kernel computes MT x NR such dot products at
 * once, each with its own accumulator, so a result never depends on the block it was
 * computed in. Without AVX2: one scalar sum in k order. */

#ifdef COMET_CPU_AVX2
static inline float comet_cpu_hsum8(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* {hsum8(a), hsum8(b), hsum8(c), hsum8(d)}, the same sums in the same order (fp addition
 * commutes, so only the pairing matters): lane i + lane i+4, then 0+2 and 1+3, then those
 * two. */
static inline __m128 comet_cpu_hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 ab =
        _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    __m256 cd =
        _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    ab = _mm256_add_ps(ab, _mm256_shuffle_ps(ab, ab, _MM_SHUFFLE(1, 0, 3, 2)));
    cd = _mm256_add_ps(cd, _mm256_shuffle_ps(cd, cd, _MM_SHUFFLE(1, 0, 3, 2)));
    ab = _mm256_add_ps(ab, _mm256_shuffle_ps(ab, ab, _MM_SHUFFLE(2, 3, 0, 1)));
    cd = _mm256_add_ps(cd, _mm256_shuffle_ps(cd, cd, _MM_SHUFFLE(2, 3, 0, 1)));
    __m128 r = _mm_blend_ps(_mm256_castps256_ps128(ab), _mm256_extractf128_ps(ab, 1), 0x2);
    r = _mm_blend_ps(r, _mm256_castps256_ps128(cd), 0x4);
    return _mm_blend_ps(r, _mm256_extractf128_ps(cd, 1), 0x8);
}

/* y[a * ldy + b] = dot(x[a], w[b], n) for a < MT, b < NR */
#define DOT_BLOCK(MT, NR)                                                                          \
    static inline void dot_block_##MT##x##NR(const float *const *x, const float *const *w,         \
                                             int n, float *y, size_t ldy) {                        \
        __m256 acc[MT][NR];                                                                        \
        _Pragma("GCC unroll 4")                                                                    \
        for (int a = 0; a < MT; a++)                                                               \
            _Pragma("GCC unroll 4")                                                                \
        for (int b = 0; b < NR; b++)                                                               \
            acc[a][b] = _mm256_setzero_ps();                                                       \
        int k = 0;                                                                                 \
        for (; k + 8 <= n; k += 8) {                                                               \
            __m256 wv[NR];                                                                         \
            _Pragma("GCC unroll 4")                                                                \
            for (int b = 0; b < NR; b++)                                                           \
                wv[b] = _mm256_loadu_ps(w[b] + k);                                                 \
            _Pragma("GCC unroll 4")                                                                \
            for (int a = 0; a < MT; a++) {                                                         \
                __m256 xv = _mm256_loadu_ps(x[a] + k);                                             \
                _Pragma("GCC unroll 4")                                                            \
                for (int b = 0; b < NR; b++)                                                       \
                    acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);                             \
            }                                                                                      \
        }                                                                                          \
        if (k < n) {                                                                               \
            __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - k),                               \
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));             \
            __m256 wv[NR];                                                                         \
            _Pragma("GCC unroll 4")                                                                \
            for (int b = 0; b < NR; b++)                                                           \
                wv[b] = _mm256_maskload_ps(w[b] + k, m);                                           \
            _Pragma("GCC unroll 4")                                                                \
            for (int a = 0; a < MT; a++) {                                                         \
                __m256 xv = _mm256_maskload_ps(x[a] + k, m);                                       \
                _Pragma("GCC unroll 4")                                                            \
                for (int b = 0; b < NR; b++)                                                       \
                    acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);                             \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4")                                                                    \
        for (int a = 0; a < MT; a++) {                                                             \
            if (NR == 4)                                                                           \
                _mm_storeu_ps(y + (size_t)a * ldy,                                                 \
                              comet_cpu_hsum8x4(acc[a][0], acc[a][NR > 1],                         \
                                                acc[a][NR > 2 ? 2 : 0],                            \
                                                acc[a][NR > 3 ? 3 : 0]));                          \
            else                                                                                   \
                _Pragma("GCC unroll 4")                                                            \
            for (int b = 0; b < NR; b++)                                                           \
                y[(size_t)a * ldy + b] = comet_cpu_hsum8(acc[a][b]);                               \
        }                                                                                          \
    }
#else
#define DOT_BLOCK(MT, NR)                                                                          \
    static inline void dot_block_##MT##x##NR(const float *const *x, const float *const *w,         \
                                             int n, float *y, size_t ldy) {                        \
        for (int a = 0; a < MT; a++)                                                               \
            for (int b = 0; b < NR; b++) {                                                         \
                float s = 0.0f;                                                                    \
                for (int k = 0; k < n; k++)                                                        \
                    s += x[a][k] * w[b][k];                                                        \
                y[(size_t)a * ldy + b] = s;                                                        \
            }                                                                                      \
    }
#endif
DOT_BLOCK(3, 4)
DOT_BLOCK(1, 4)
DOT_BLOCK(1, 1)

/* y[a * ldy + b] = dot(x[a], w[b], n) for a < na, b < nb */
static inline void comet_cpu_dot_tile(const float *const *x, int na, const float *const *w,
                                      int nb, int n, float *y, size_t ldy) {
    int a = 0;
    for (; a + 3 <= na; a += 3) {
        int b = 0;
        for (; b + 4 <= nb; b += 4)
            dot_block_3x4(x + a, w + b, n, y + (size_t)a * ldy + b, ldy);
        for (; b < nb; b++)
            for (int i = 0; i < 3; i++)
                dot_block_1x1(x + a + i, w + b, n, y + (size_t)(a + i) * ldy + b, ldy);
    }
    for (; a < na; a++) {
        int b = 0;
        for (; b + 4 <= nb; b += 4)
            dot_block_1x4(x + a, w + b, n, y + (size_t)a * ldy + b, ldy);
        for (; b < nb; b++)
            dot_block_1x1(x + a, w + b, n, y + (size_t)a * ldy + b, ldy);
    }
}

#endif
