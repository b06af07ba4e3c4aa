/* cpu_ops.c — the default CPU backend: threaded, vectorized, batch-invariant.
 *
 * Batch-invariant: every token's result is the same bit for bit whatever step it comes in
 * (its size, the token's place in it, the other sequences in it) and however many threads
 * run it. A quantized KV cache (or quantized activations) rounds each value to a code; a
 * last-bit difference that moves a value across a rounding boundary changes a code, the
 * changed code changes every later token's attention, and the difference grows layer by
 * layer: with OpenBLAS (sgemv for one token, sgemm kernels that change with the row count
 * and the column slice) and a separate sgemm attention path for long steps, `comet
 * perplexity --kv-bits 4` moved by several percent with --chunk and --threads
 * (tests/test_kv_chunking.c). So every dot product here, in the linear layers, the
 * lm_head and attention's q·k, is one fixed sequence of operations on its two vectors
 * (dot_block below), whatever the blocking around it, and attention runs the same
 * arithmetic per (token, head) in its per-token and tiled schedules.
 *
 * Linear layers and the lm_head split their output columns across the pool's threads;
 * each thread runs register-blocked dot products on its slice (dot-form: 3 tokens x 4
 * weight rows, one 8-lane FMA accumulator each). On the 2-core Cooperlake host this runs
 * at 55-65% of OpenBLAS's AVX-512 sgemm on SmolLM2-135M prefill shapes (prefill ~1.5x
 * slower end to end than with OpenBLAS: 512 tokens in 1.5 s against 1.0 s) and at or above
 * sgemv for one token (decode ~10% faster). Elementwise ops are threaded over rows when the step is large enough to pay for
 * the wake-up; exp is vectorized (AVX2 polynomial) where it is hot. Results equal the
 * scalar reference (ref_ops.c) up to fp32 rounding; tests/test_ops.c checks every op. The
 * W4Ax GEMM is integer code on the pool (see cpu_gemm_w4ax) and equals the scalar oracle
 * bit for bit.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define COMET_CPU_AVX2 1
#endif

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_qstep.h"
#include "backend/cpu/ref_gemm_w4ax.h"
#include "numerics/qlinear.h"
#include "numerics/quant.h"
#include "core/threads.h"

#define MIN_PAR_ELEMS 16384 /* elementwise work below this runs on the calling thread */

typedef struct cpu_impl {
    comet_threadpool *tp;
    int n_threads;
    float **scratch;     /* [n_threads] per-thread attention scratch */
    size_t *scratch_cap; /* [n_threads] floats allocated */
} cpu_impl;

static comet_threadpool *pool(comet_backend *be) { return ((cpu_impl *)be->impl)->tp; }

static const comet_backend_ops cpu_ops;

comet_threadpool *comet_cpu_backend_pool(comet_backend *be) {
    return be->ops == &cpu_ops ? pool(be) : NULL;
}

/* ---- vector helpers ---- */

static inline float dot_f32(const float *a, const float *b, int n) {
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
static inline __m256 exp256_ps(__m256 x) {
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
static inline float exp_shift_sum(float *x, int n, float shift) {
    int i = 0;
    float sum = 0.0f;
#ifdef COMET_CPU_AVX2
    __m256 vs = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
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

/* Split `total` elements into chunks of at least `min_chunk` for the pool. */
static int n_chunks_for(comet_threadpool *tp, size_t total, size_t min_chunk) {
    int nt = comet_threadpool_size(tp);
    size_t by_size = total / min_chunk;
    if (by_size < 1)
        by_size = 1;
    return by_size < (size_t)nt ? (int)by_size : nt;
}

/* ---- embed ---- */

static comet_status cpu_embed(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                              int T, float *x) {
    for (int t = 0; t < T; t++)
        memcpy(x + (size_t)t * C, embd + (size_t)tokens[t] * C, (size_t)C * sizeof(float));
    return COMET_OK;
}

/* ---- rmsnorm ---- */

typedef struct {
    const float *x, *w;
    float *out;
    int T, C, n_chunks;
    float eps;
} rmsnorm_job;

static void rmsnorm_task(void *ctx, int i, int tid) {
    const rmsnorm_job *j = ctx;
    int t0 = (int)((long)j->T * i / j->n_chunks), t1 = (int)((long)j->T * (i + 1) / j->n_chunks);
    for (int t = t0; t < t1; t++) {
        const float *xr = j->x + (size_t)t * j->C;
        float *yr = j->out + (size_t)t * j->C;
        float inv = 1.0f / sqrtf(dot_f32(xr, xr, j->C) / j->C + j->eps);
        for (int c = 0; c < j->C; c++)
            yr[c] = xr[c] * inv * j->w[c];
    }
}

static comet_status cpu_rmsnorm(comet_backend *be, const float *x, const float *w, int T, int C,
                                float eps, float *out) {
    rmsnorm_job j = {x, w, out, T, C, 0, eps};
    j.n_chunks = n_chunks_for(pool(be), (size_t)T * C, MIN_PAR_ELEMS);
    if (j.n_chunks > T)
        j.n_chunks = T;
    comet_parallel_for(pool(be), j.n_chunks, rmsnorm_task, &j);
    return COMET_OK;
}

/* ---- batch-invariant dot products ----
 *
 * dot(x, w, n), as every kernel below computes it: one 8-lane accumulator, acc += x[k..k+8]
 * * w[k..k+8] (FMA) for k = 0, 8, ..., the last n % 8 values through a masked load, then
 * the lanes summed as hsum8 does. A block kernel computes MT x NR such dot products at
 * once, each with its own accumulator, so a result never depends on the block it was
 * computed in. Without AVX2: one scalar sum in k order. */

#ifdef COMET_CPU_AVX2
static inline float hsum8(__m256 a) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* {hsum8(a), hsum8(b), hsum8(c), hsum8(d)}, the same sums in the same order (fp addition
 * commutes, so only the pairing matters): lane i + lane i+4, then 0+2 and 1+3, then those
 * two. */
static inline __m128 hsum8x4(__m256 a, __m256 b, __m256 c, __m256 d) {
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
    static void dot_block_##MT##x##NR(const float *const *x, const float *const *w, int n,         \
                                      float *y, size_t ldy) {                                      \
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
                              hsum8x4(acc[a][0], acc[a][NR > 1], acc[a][NR > 2 ? 2 : 0],           \
                                      acc[a][NR > 3 ? 3 : 0]));                                    \
            else                                                                                   \
                _Pragma("GCC unroll 4")                                                            \
            for (int b = 0; b < NR; b++)                                                           \
                y[(size_t)a * ldy + b] = hsum8(acc[a][b]);                                         \
        }                                                                                          \
    }
#else
#define DOT_BLOCK(MT, NR)                                                                          \
    static void dot_block_##MT##x##NR(const float *const *x, const float *const *w, int n,         \
                                      float *y, size_t ldy) {                                      \
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
static void dot_tile(const float *const *x, int na, const float *const *w, int nb, int n, float *y,
                     size_t ldy) {
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

/* ---- linear: y[T, N] = x[T, K] · W[N, K]ᵀ, columns of y split across threads ---- */

#define GEMM_NB 64 /* weight rows per panel (64 x K floats stay in L2 while every token passes) */
#define GEMM_TB 48 /* tokens per pass over a panel */

typedef struct {
    const float *x, *w;
    float *y;
    int T, N, K, ldy, n_chunks;
} gemm_job;

static void gemm_task(void *ctx, int i, int tid) {
    const gemm_job *j = ctx;
    /* chunk boundaries rounded to 16 rows of W (any split gives the same results) */
    int n0 = (int)((long)j->N * i / j->n_chunks) & ~15;
    int n1 = i + 1 == j->n_chunks ? j->N : (int)((long)j->N * (i + 1) / j->n_chunks) & ~15;
    const float *wp[GEMM_NB], *xp[GEMM_TB];
    for (int p0 = n0; p0 < n1; p0 += GEMM_NB) {
        int nb = n1 - p0 < GEMM_NB ? n1 - p0 : GEMM_NB;
        for (int b = 0; b < nb; b++)
            wp[b] = j->w + (size_t)(p0 + b) * j->K;
        for (int t0 = 0; t0 < j->T; t0 += GEMM_TB) {
            int na = j->T - t0 < GEMM_TB ? j->T - t0 : GEMM_TB;
            for (int a = 0; a < na; a++)
                xp[a] = j->x + (size_t)(t0 + a) * j->K;
            dot_tile(xp, na, wp, nb, j->K, j->y + (size_t)t0 * j->ldy + p0, (size_t)j->ldy);
        }
    }
}

static void gemm_parallel(comet_backend *be, const float *x, const float *w, int T, int N, int K,
                          float *y, int ldy) {
    gemm_job j = {x, w, y, T, N, K, ldy, 0};
    int nt = comet_threadpool_size(pool(be));
    j.n_chunks = N >= 64 * nt ? nt : 1;
    comet_parallel_for(pool(be), j.n_chunks, gemm_task, &j);
}

/* COMET_WFMT_QSIM (a quantized checkpoint, simulated in fp32): the activation is gathered by
 * the group's permutation and quantized->dequantized per token per block
 * (src/quant/qlinear.h), then multiplied by the dequantized weights on the thread pool like
 * an fp32 linear. */
static comet_status cpu_linear(comet_backend *be, const comet_linear *lin, const float *x, int T,
                               float *y) {
    COMET_ASSERT(lin->fmt == COMET_WFMT_F32 || lin->fmt == COMET_WFMT_QSIM);
    if (lin->fmt == COMET_WFMT_F32) {
        gemm_parallel(be, x, lin->w, T, lin->n_out, lin->n_in, y, lin->n_out);
        return COMET_OK;
    }
    float *xq = malloc((size_t)T * lin->n_in * sizeof *xq);
    if (!xq)
        return comet_set_error(COMET_ERR_NOMEM, "linear: out of memory for a %dx%d activation", T,
                               lin->n_in);
    comet_qlinear_input(lin, x, T, xq);
    gemm_parallel(be, xq, lin->w, T, lin->n_out, lin->n_in, y, lin->n_out);
    free(xq);
    return COMET_OK;
}

/* ---- rope ---- */

typedef struct {
    const comet_rope_params *rp;
    const double *inv_freq;
    const int32_t *positions;
    float *q, *k;
    int T, H, Hkv, n_chunks;
} rope_job;

static void rope_task(void *ctx, int i, int tid) {
    const rope_job *j = ctx;
    int D = j->rp->head_dim, half = D / 2;
    float cs[COMET_CPU_MAX_HEAD_DIM / 2], sn[COMET_CPU_MAX_HEAD_DIM / 2];
    int t0 = (int)((long)j->T * i / j->n_chunks), t1 = (int)((long)j->T * (i + 1) / j->n_chunks);
    for (int t = t0; t < t1; t++) {
        for (int f = 0; f < half; f++) {
            double a = (double)j->positions[t] * j->inv_freq[f];
            cs[f] = (float)cos(a);
            sn[f] = (float)sin(a);
        }
        for (int h = 0; h < j->H + j->Hkv; h++) {
            float *v = h < j->H ? j->q + ((size_t)t * j->H + h) * D
                                : j->k + ((size_t)t * j->Hkv + (h - j->H)) * D;
            for (int f = 0; f < half; f++) {
                float x0 = v[f], x1 = v[f + half];
                v[f] = x0 * cs[f] - x1 * sn[f];
                v[f + half] = x0 * sn[f] + x1 * cs[f];
            }
        }
    }
}

static comet_status cpu_rope(comet_backend *be, const comet_rope_params *rp,
                             const int32_t *positions, int T, float *q, int H, float *k, int Hkv) {
    double inv_freq[COMET_CPU_MAX_HEAD_DIM / 2];
    COMET_ASSERT(rp->head_dim % 2 == 0 && rp->head_dim <= COMET_CPU_MAX_HEAD_DIM);
    comet_rope_inv_freq(rp, inv_freq);
    rope_job j = {rp, inv_freq, positions, q, k, T, H, Hkv, 0};
    j.n_chunks = n_chunks_for(pool(be), (size_t)T * (H + Hkv) * rp->head_dim, MIN_PAR_ELEMS);
    if (j.n_chunks > T)
        j.n_chunks = T;
    comet_parallel_for(pool(be), j.n_chunks, rope_task, &j);
    return COMET_OK;
}

/* ---- attention ----
 *
 * Per (token, query head), with n = the token's position + 1 keys of its sequence:
 *   s_j = dot(q, k_j) * (1/sqrt(D))       j < n (dot as in dot_block)
 *   p_j = exp(s_j - max s), l = sum p_j   (exp_shift_sum over the n scores)
 *   o   = (sum_j p_j v_j, j ascending, one FMA chain per channel) * (1/l)
 * That arithmetic is all there is, in both schedules below, so a token's output does not
 * depend on the schedule, the step or the thread it ran on (see the file comment).
 *
 * Decode-like sequences (fewer than ATT_MIN_TILE tokens in the step): one item per (token,
 * KV head), its GQA group's H/Hkv query heads together. Prefill-like: one item per (KV
 * head, tile of ATT_TILE tokens), the tile's (token, head) rows together: q·k is blocked
 * over rows and keys so each K row is read once per 3 rows, and the V rows of a page are
 * reused by every row of the tile while in cache. Keys are read from the pages in place.
 * An item's scores [rows, L] (L = its last key + 1) live in per-thread scratch, grown on the
 * calling thread before the parallel section, so it is allocated once for the longest
 * context seen, never per step.
 */

#define ATT_TILE 32
#define ATT_MIN_TILE 8
#define ATT_KB 64 /* keys per q·k block */

typedef struct {
    const comet_kv_cache *kv;
    const comet_batch *b;
    const float *q;
    float *out;
    int layer, H;
    int s;       /* tile path: the sequence */
    int n_tiles; /* tile path: tiles of that sequence */
    float **scratch;
} attn_job;

static int seq_of_token(const comet_batch *b, int t) {
    int lo = 0, hi = b->n_seqs - 1; /* last s with token_indptr[s] <= t */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (b->token_indptr[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int seq_uses_tiles(const comet_batch *b, int s) {
    return b->token_indptr[s + 1] - b->token_indptr[s] >= ATT_MIN_TILE;
}

/* K (which 0) or V (1) row of position pos of sequence s, KV head kvh */
static inline const float *kv_row(const attn_job *j, int s, int pos, int kvh, int which) {
    const comet_kv_cache *kv = j->kv;
    const comet_batch *b = j->b;
    int P = kv->page_size, page = b->page_indices[b->page_indptr[s] + pos / P];
    size_t off = ((((size_t)j->layer * kv->n_pages + page) * P + pos % P) * kv->n_head_kv + kvh) *
                 kv->head_dim;
    return (which ? kv->v : kv->k) + off;
}

#define PV_ROWS 6 /* rows of one PV block */
#ifdef COMET_CPU_AVX2
#define PV_MADD(a, b, c) fmaf(a, b, c)
#else
#define PV_MADD(a, b, c) ((a) * (b) + (c))
#endif

/* PV of up to PV_ROWS rows: o_r[d] = (sum_{i < n_r} p_r[i] * v_i[d]) * inv_r, one FMA chain
 * per (row, channel) over i ascending, v_i = the V row of position i. The rows share each V
 * load for the keys all of them see; a row's keys past the shortest row's continue its own
 * chain alone, so a row's result never depends on the rows beside it. */
static void attn_pv(const attn_job *j, int s, int kvh, int R, const float *const *p, const int *n,
                    const float *inv, float *const *o) {
    const int D = j->kv->head_dim;
    int d = 0;
#ifdef COMET_CPU_AVX2
    const int P = j->kv->page_size;
    const size_t stride = (size_t)j->kv->n_head_kv * D; /* between slots of a page */
    int n_min = n[0], n_max = n[0];
    for (int r = 1; r < R; r++) {
        n_min = n[r] < n_min ? n[r] : n_min;
        n_max = n[r] > n_max ? n[r] : n_max;
    }
    for (; d + 16 <= D; d += 16) {
        __m256 acc[PV_ROWS][2];
        for (int r = 0; r < PV_ROWS; r++)
            acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int base = 0; base < n_max; base += P) {
            const float *vp = kv_row(j, s, base, kvh, 1) + d;
            int end = base + P < n_max ? base + P : n_max;
            for (int i = base; i < end; i++, vp += stride) {
                __m256 v0 = _mm256_loadu_ps(vp), v1 = _mm256_loadu_ps(vp + 8);
                if (i < n_min && R == PV_ROWS) {
                    _Pragma("GCC unroll 6")
                    for (int r = 0; r < PV_ROWS; r++) {
                        __m256 pr = _mm256_set1_ps(p[r][i]);
                        acc[r][0] = _mm256_fmadd_ps(pr, v0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(pr, v1, acc[r][1]);
                    }
                } else {
                    for (int r = 0; r < R; r++)
                        if (i < n[r]) {
                            __m256 pr = _mm256_set1_ps(p[r][i]);
                            acc[r][0] = _mm256_fmadd_ps(pr, v0, acc[r][0]);
                            acc[r][1] = _mm256_fmadd_ps(pr, v1, acc[r][1]);
                        }
                }
            }
        }
        for (int r = 0; r < R; r++) {
            __m256 vi = _mm256_set1_ps(inv[r]);
            _mm256_storeu_ps(o[r] + d, _mm256_mul_ps(acc[r][0], vi));
            _mm256_storeu_ps(o[r] + d + 8, _mm256_mul_ps(acc[r][1], vi));
        }
    }
    for (; d + 8 <= D; d += 8)
        for (int r = 0; r < R; r++) {
            __m256 a0 = _mm256_setzero_ps();
            for (int base = 0; base < n[r]; base += P) {
                const float *vp = kv_row(j, s, base, kvh, 1) + d;
                int end = base + P < n[r] ? base + P : n[r];
                for (int i = base; i < end; i++, vp += stride)
                    a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[r][i]), _mm256_loadu_ps(vp), a0);
            }
            _mm256_storeu_ps(o[r] + d, _mm256_mul_ps(a0, _mm256_set1_ps(inv[r])));
        }
#endif
    for (; d < D; d++) /* the lanes' arithmetic: fmaf is one FMA instruction with AVX2 */
        for (int r = 0; r < R; r++) {
            float a0 = 0.0f;
            for (int i = 0; i < n[r]; i++)
                a0 = PV_MADD(p[r][i], kv_row(j, s, i, kvh, 1)[d], a0);
            o[r][d] = a0 * inv[r];
        }
}

/* Attention of the tokens t0 .. t0+nt-1 of sequence s (all in the step) for the query heads
 * of KV head kvh; sc: scratch of nt * g * L floats, L = 1 + the largest position. */
static void attn_rows(const attn_job *j, int s, int kvh, int t0, int nt, float *sc) {
    const comet_batch *b = j->b;
    const int D = j->kv->head_dim, g = j->H / j->kv->n_head_kv, M = nt * g;
    const float scale = 1.0f / sqrtf((float)D);
    int L = 0;
    for (int i = 0; i < nt; i++)
        if (b->positions[t0 + i] + 1 > L)
            L = b->positions[t0 + i] + 1;
    const float *qp[ATT_TILE * COMET_CPU_MAX_GQA_GROUP], *kp[ATT_KB];
    for (int r = 0; r < M; r++)
        qp[r] = j->q + ((size_t)(t0 + r / g) * j->H + (size_t)kvh * g + r % g) * D;
    /* scores of every row against keys 0..L-1; a row's keys past its position are ignored */
    for (int k0 = 0; k0 < L; k0 += ATT_KB) {
        int nk = L - k0 < ATT_KB ? L - k0 : ATT_KB;
        for (int c = 0; c < nk; c++)
            kp[c] = kv_row(j, s, k0 + c, kvh, 0);
        dot_tile(qp, M, kp, nk, D, sc + k0, (size_t)L);
    }
    for (int r0 = 0; r0 < M; r0 += PV_ROWS) {
        int R = M - r0 < PV_ROWS ? M - r0 : PV_ROWS, n[PV_ROWS];
        const float *p[PV_ROWS];
        float inv[PV_ROWS], *o[PV_ROWS];
        for (int i = 0; i < R; i++) {
            int r = r0 + i, t = t0 + r / g;
            float *row = sc + (size_t)r * L;
            n[i] = b->positions[t] + 1; /* causal: keys 0..position */
            float mx = -INFINITY;
            for (int c = 0; c < n[i]; c++) {
                row[c] *= scale;
                if (row[c] > mx)
                    mx = row[c];
            }
            inv[i] = 1.0f / exp_shift_sum(row, n[i], mx);
            p[i] = row;
            o[i] = j->out + ((size_t)t * j->H + (size_t)kvh * g + r % g) * D;
        }
        attn_pv(j, s, kvh, R, p, n, inv, o);
    }
}

static void attn_token_task(void *ctx, int item, int tid) {
    const attn_job *j = ctx;
    int Hkv = j->kv->n_head_kv;
    int t = item / Hkv, kvh = item % Hkv, s = seq_of_token(j->b, t);
    if (!seq_uses_tiles(j->b, s))
        attn_rows(j, s, kvh, t, 1, j->scratch[tid]);
}

static void attn_tile_task(void *ctx, int item, int tid) {
    const attn_job *j = ctx;
    const comet_batch *b = j->b;
    int Hkv = j->kv->n_head_kv, s = j->s, kvh = item % Hkv, tile = item / Hkv;
    int t0 = b->token_indptr[s] + tile * ATT_TILE;
    int nt = b->token_indptr[s + 1] - t0 < ATT_TILE ? b->token_indptr[s + 1] - t0 : ATT_TILE;
    attn_rows(j, s, kvh, t0, nt, j->scratch[tid]);
}

/* Per-thread scratch of at least `need` floats. */
static comet_status grow_scratch(cpu_impl *impl, size_t need) {
    for (int i = 0; i < impl->n_threads; i++)
        if (impl->scratch_cap[i] < need) {
            float *p = realloc(impl->scratch[i], need * sizeof(float));
            if (!p)
                return comet_set_error(COMET_ERR_NOMEM,
                                       "cpu attention: cannot grow scratch to %zu MiB",
                                       need * sizeof(float) >> 20);
            impl->scratch[i] = p;
            impl->scratch_cap[i] = need;
        }
    return COMET_OK;
}

static comet_status cpu_attention_stored(comet_backend *be, const comet_kv_cache *kv, int layer,
                                         const comet_batch *b, const float *q, int H, float *out) {
    cpu_impl *impl = be->impl;
    COMET_ASSERT(kv->head_dim <= COMET_CPU_MAX_HEAD_DIM);
    COMET_ASSERT(H % kv->n_head_kv == 0 && H / kv->n_head_kv <= COMET_CPU_MAX_GQA_GROUP);
    int g = H / kv->n_head_kv;
    size_t need = 0; /* scores of the largest item */
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            size_t rows = seq_uses_tiles(b, s) ? (size_t)ATT_TILE * g : (size_t)g;
            size_t n = rows * ((size_t)b->positions[t] + 1);
            if (n > need)
                need = n;
        }
    COMET_TRY(grow_scratch(impl, need));
    attn_job j = {kv, b, q, out, layer, H, 0, 0, impl->scratch};
    comet_parallel_for(impl->tp, b->n_tokens * kv->n_head_kv, attn_token_task, &j);
    for (int s = 0; s < b->n_seqs; s++) {
        if (!seq_uses_tiles(b, s))
            continue;
        j.s = s;
        j.n_tiles = (b->token_indptr[s + 1] - b->token_indptr[s] + ATT_TILE - 1) / ATT_TILE;
        comet_parallel_for(impl->tp, j.n_tiles * kv->n_head_kv, attn_tile_task, &j);
    }
    return COMET_OK;
}

/* ---- elementwise: silu_mul, residual_add ---- */

typedef struct {
    const float *a, *b;
    float *out;
    size_t n;
    int n_chunks;
} ew_job;

#ifdef COMET_CPU_AVX2
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
#endif

/* Every element goes through the same exp (the 8-lane polynomial with AVX2, expf without),
 * wherever the thread split and the step's end fall: chunks start at multiples of 8 and the
 * last < 8 elements run as a padded vector. */
static void silu_mul_task(void *ctx, int i, int tid) {
    const ew_job *j = ctx;
    size_t i0 = (j->n * i / j->n_chunks) & ~(size_t)7;
    size_t i1 = i + 1 == j->n_chunks ? j->n : (j->n * (i + 1) / j->n_chunks) & ~(size_t)7;
    size_t k = i0;
#ifdef COMET_CPU_AVX2
    for (; k + 8 <= i1; k += 8)
        _mm256_storeu_ps(j->out + k,
                         silu_mul8(_mm256_loadu_ps(j->a + k), _mm256_loadu_ps(j->b + k)));
    if (k < i1) {
        float ga[8] = {0}, ua[8] = {0}, oa[8];
        memcpy(ga, j->a + k, (i1 - k) * sizeof(float));
        memcpy(ua, j->b + k, (i1 - k) * sizeof(float));
        _mm256_storeu_ps(oa, silu_mul8(_mm256_loadu_ps(ga), _mm256_loadu_ps(ua)));
        memcpy(j->out + k, oa, (i1 - k) * sizeof(float));
    }
#else
    for (; k < i1; k++) {
        float g = j->a[k];
        j->out[k] = g / (1.0f + expf(-g)) * j->b[k];
    }
#endif
}

static comet_status cpu_silu_mul(comet_backend *be, const float *gate, const float *up, int T,
                                 int F, float *out) {
    ew_job j = {gate, up, out, (size_t)T * F, 0};
    j.n_chunks = n_chunks_for(pool(be), j.n, MIN_PAR_ELEMS);
    comet_parallel_for(pool(be), j.n_chunks, silu_mul_task, &j);
    return COMET_OK;
}

static void add_task(void *ctx, int i, int tid) {
    const ew_job *j = ctx;
    size_t i0 = j->n * i / j->n_chunks, i1 = j->n * (i + 1) / j->n_chunks;
    for (size_t k = i0; k < i1; k++)
        j->out[k] += j->b[k];
}

static comet_status cpu_residual_add(comet_backend *be, float *x, const float *y, int T, int C) {
    ew_job j = {x, y, x, (size_t)T * C, 0};
    j.n_chunks = n_chunks_for(pool(be), j.n, 4 * MIN_PAR_ELEMS);
    comet_parallel_for(pool(be), j.n_chunks, add_task, &j);
    return COMET_OK;
}

/* ---- logits: runs of consecutive rows go through one sgemm each ---- */

static comet_status cpu_logits(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                               const float *lm_head, int C, int V, float *logits) {
    for (int r0 = 0; r0 < n_rows;) {
        int r1 = r0 + 1;
        while (r1 < n_rows && rows[r1] == rows[r1 - 1] + 1)
            r1++;
        gemm_parallel(be, x + (size_t)rows[r0] * C, lm_head, r1 - r0, V, C, logits + (size_t)r0 * V,
                      V);
        r0 = r1;
    }
    return COMET_OK;
}

/* ---- the W4Ax GEMM (backend.h; docs/numerics.md "The W4Ax GEMM") ----
 *
 * One item = a tile of W4AX_TT tokens x a chunk of W4AX_CH output channels; items are
 * claimed by the pool's threads, token tiles outer so that concurrent items share the
 * activation tile. Inside an item, W4AX_NR weight rows go together: for each block b the
 * rows' B codes are unpacked once to int16 (1 KiB, stays in L1), then the tile's tokens, two
 * at a time (each weight load serves both), take their int32 block sums against the NR rows
 * in one loop (int8 codes widened to int16; gcc turns it into pmaddwd, no intrinsics; 2-core
 * Xeon, N = K = 4096: M = 64 in 25 ms, 44 GMAC/s, M = 1 in ~1.5 ms, where the unpacking
 * dominates; the oracle takes 1.8 s and 34 ms) and promotes them as the oracle does,
 * acc += (float)S * (sa * sw) with b increasing, so the result is bit for bit the oracle's
 * (the int32 sums are exact in any order; the fp32 expression and order are the same). All
 * scratch is on the stack; no allocation per call. */

#define W4AX_NR 4  /* weight rows multiplied together */
#define W4AX_TT 32 /* tokens per item */
#define W4AX_CH 64 /* output channels per item (a multiple of W4AX_NR) */

typedef struct {
    const comet_w4ax_weight *w;
    const int8_t *qa;
    const float *sa;
    float *y;
    int M, n_ch; /* n_ch: channel chunks */
} w4ax_job;

/* dst[k] = code k of a plain row segment of 64 codes (32 bytes), as int16. */
static inline void w4_unpack64(const uint8_t *restrict src, int16_t *restrict dst) {
    for (int j = 0; j < 32; j++) {
        dst[2 * j] = (int16_t)((int8_t)(uint8_t)(src[j] << 4) >> 4);
        dst[2 * j + 1] = (int16_t)((int8_t)src[j] >> 4);
    }
}

/* s[r] = sum_k a[k] * w_r[k] over n64 * 64 codes, exact in int32 (|a| <= 128, |w| <= 8).
 * Kept apart from w4ax_dot4x2 for a lone token: passing the token twice to that one made
 * M = 1, N = K = 4096 34 % slower (1.36 -> 1.83 ms on 2 threads). */
static inline void w4ax_dot4(const int8_t *restrict a, const int16_t *restrict w0,
                             const int16_t *restrict w1, const int16_t *restrict w2,
                             const int16_t *restrict w3, int n64, int32_t s[W4AX_NR]) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int c = 0; c < n64; c++, a += 64, w0 += 64, w1 += 64, w2 += 64, w3 += 64)
        for (int k = 0; k < 64; k++) {
            int16_t x = a[k];
            s0 += x * w0[k];
            s1 += x * w1[k];
            s2 += x * w2[k];
            s3 += x * w3[k];
        }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* The same for two tokens a, b (s[0..3] for a, s[4..7] for b): each weight load serves both. */
static inline void w4ax_dot4x2(const int8_t *restrict a, const int8_t *restrict b,
                               const int16_t *restrict w0, const int16_t *restrict w1,
                               const int16_t *restrict w2, const int16_t *restrict w3, int n64,
                               int32_t s[2 * W4AX_NR]) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, u0 = 0, u1 = 0, u2 = 0, u3 = 0;
    for (int c = 0; c < n64; c++, a += 64, b += 64, w0 += 64, w1 += 64, w2 += 64, w3 += 64)
        for (int k = 0; k < 64; k++) {
            int16_t x = a[k], z = b[k];
            s0 += x * w0[k];
            s1 += x * w1[k];
            s2 += x * w2[k];
            s3 += x * w3[k];
            u0 += z * w0[k];
            u1 += z * w1[k];
            u2 += z * w2[k];
            u3 += z * w3[k];
        }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3, s[4] = u0, s[5] = u1, s[6] = u2, s[7] = u3;
}

static void w4ax_task(void *ctx, int item, int tid) {
    const w4ax_job *j = ctx;
    const comet_w4ax_weight *w = j->w;
    const int N = w->N, K = w->K, B = w->B, nb = K / B, n64 = B / 64;
    const int t0 = item / j->n_ch * W4AX_TT, n_tok = j->M - t0 < W4AX_TT ? j->M - t0 : W4AX_TT;
    const int c0 = item % j->n_ch * W4AX_CH, c1 = N - c0 < W4AX_CH ? N : c0 + W4AX_CH;
    int16_t wrow[W4AX_NR][128];
    float acc[W4AX_TT][W4AX_NR];
    for (int n0 = c0; n0 < c1; n0 += W4AX_NR) {
        int nr = c1 - n0 < W4AX_NR ? c1 - n0 : W4AX_NR; /* rows past c1 repeat row n0 */
        memset(acc, 0, sizeof acc);
        for (int b = 0; b < nb; b++) {
            float swb[W4AX_NR];
            for (int r = 0; r < W4AX_NR; r++) {
                int n = r < nr ? n0 + r : n0;
                const uint8_t *src = w->qw + (size_t)n * (K / 2) + (size_t)b * (B / 2);
                for (int c = 0; c < n64; c++)
                    w4_unpack64(src + 32 * c, wrow[r] + 64 * c);
                swb[r] = w->sw_f32[(size_t)n * nb + b];
            }
            for (int t = 0; t < n_tok; t += 2) {
                const int8_t *a = j->qa + (size_t)(t0 + t) * K + (size_t)b * B;
                int32_t s[2 * W4AX_NR];
                int n_t = n_tok - t < 2 ? 1 : 2;
                if (n_t == 2)
                    w4ax_dot4x2(a, a + K, wrow[0], wrow[1], wrow[2], wrow[3], n64, s);
                else
                    w4ax_dot4(a, wrow[0], wrow[1], wrow[2], wrow[3], n64, s);
                for (int i = 0; i < n_t; i++) {
                    const float sat = j->sa[(size_t)(t0 + t + i) * nb + b];
                    for (int r = 0; r < W4AX_NR; r++) {
                        float scale = sat * swb[r]; /* the oracle's expression, term for term */
                        acc[t + i][r] += (float)s[i * W4AX_NR + r] * scale;
                    }
                }
            }
        }
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < nr; r++)
                j->y[(size_t)(t0 + t) * N + n0 + r] = acc[t][r];
    }
}

static comet_status cpu_gemm_w4ax(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                                  const int8_t *qa, const float *sa, float *y) {
    COMET_TRY(comet_cpu_w4ax_check(be, w, M, n8, qa, sa, y));
    COMET_ASSERT(w->B <= 128 && w->B % 64 == 0); /* w4ax_load checked it */
    w4ax_job j = {w, qa, sa, y, M, (w->N + W4AX_CH - 1) / W4AX_CH};
    int n_tiles = (M + W4AX_TT - 1) / W4AX_TT;
    comet_parallel_for(pool(be), n_tiles * j.n_ch, w4ax_task, &j);
    return COMET_OK;
}

static void cpu_destroy(comet_backend *be) {
    cpu_impl *impl = be->impl;
    comet_threadpool_free(impl->tp);
    for (int i = 0; impl->scratch && i < impl->n_threads; i++)
        free(impl->scratch[i]);
    free(impl->scratch);
    free(impl->scratch_cap);
    free(impl);
    free(be);
}

/* attention as the ops table sees it: the KV rotation (if any) around cpu_attention_stored */
static comet_status cpu_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                  const comet_batch *b, const float *q, int H, float *out) {
    return comet_cpu_attention_rotated(be, kv, layer, b, q, H, out, cpu_attention_stored);
}

static const comet_backend_ops cpu_ops = {
    .name = "cpu",
    COMET_CPU_STEP_OPS,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .rope = cpu_rope,
    .kv_append = comet_cpu_kv_append,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .residual_add = cpu_residual_add,
    .logits = cpu_logits,
    .w4ax_load = comet_cpu_w4ax_load,
    .w4ax_free = comet_cpu_w4ax_free,
    .gemm_w4ax = cpu_gemm_w4ax,
    .destroy = cpu_destroy,
};

comet_backend *comet_backend_cpu_init(int n_threads) {
    comet_backend *be = calloc(1, sizeof *be);
    cpu_impl *impl = calloc(1, sizeof *impl);
    if (!be || !impl) {
        free(be);
        free(impl);
        comet_set_error(COMET_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    impl->tp = comet_threadpool_init(n_threads);
    if (!impl->tp) {
        free(be);
        free(impl);
        return NULL;
    }
    impl->n_threads = comet_threadpool_size(impl->tp);
    impl->scratch = calloc((size_t)impl->n_threads, sizeof *impl->scratch);
    impl->scratch_cap = calloc((size_t)impl->n_threads, sizeof *impl->scratch_cap);
    if (!impl->scratch || !impl->scratch_cap) {
        be->impl = impl;
        cpu_destroy(be);
        comet_set_error(COMET_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    openblas_set_num_threads(1); /* we thread around BLAS; see the file comment */
    be->ops = &cpu_ops;
    be->n_threads = comet_threadpool_size(impl->tp);
    be->impl = impl;
    return be;
}
