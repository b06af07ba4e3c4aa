/* cpu_ops.c — the default CPU backend: threaded, vectorized, batch-invariant. Its table
 * and state, and its fp32 primitives (cpu_prims.h) but attention, which is in
 * cpu_attention.c; the vector arithmetic both use is in cpu_simd.h.
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
 * (the dot blocks of cpu_simd.h), whatever the blocking around it, and attention runs the same
 * arithmetic per (token, head) in its per-token and tiled schedules.
 *
 * Linear layers and the lm_head split their output columns across the pool's threads;
 * each thread runs register-blocked dot products on its slice (dot-form: 3 tokens x 4
 * weight rows, one 8-lane FMA accumulator each). On the 2-core Cooperlake host this runs
 * at 55-65% of OpenBLAS's AVX-512 sgemm on SmolLM2-135M prefill shapes (prefill ~1.5x
 * slower end to end than with OpenBLAS: 512 tokens in 1.5 s against 1.0 s) and at or above
 * sgemv for one token (decode ~10% faster). Elementwise ops are threaded over rows when the
 * step is large enough to pay for the wake-up; exp is vectorized (AVX2 polynomial) where it
 * is hot. Results equal the scalar reference (ref_ops.c) up to fp32 rounding;
 * tests/test_ops.c checks every primitive.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_qstep.h"
#include "backend/cpu/cpu_simd.h"
#include "numerics/qlinear.h"

#define MIN_PAR_ELEMS 16384 /* elementwise work below this runs on the calling thread */

static comet_threadpool *pool(comet_backend *be) { return ((comet_cpu_fast *)be->impl)->tp; }

static const comet_backend_ops cpu_ops;

comet_threadpool *comet_cpu_backend_pool(comet_backend *be) {
    return be->ops == &cpu_ops ? pool(be) : NULL;
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
        float inv = 1.0f / sqrtf(comet_cpu_dot_f32(xr, xr, j->C) / j->C + j->eps);
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
            comet_cpu_dot_tile(xp, na, wp, nb, j->K, j->y + (size_t)t0 * j->ldy + p0,
                               (size_t)j->ldy);
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
 * (src/numerics/qlinear.h), then multiplied by the dequantized weights on the thread pool like
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

/* ---- elementwise: silu_mul, residual_add ---- */

typedef struct {
    const float *a, *b;
    float *out;
    size_t n;
    int n_chunks;
} ew_job;

#ifdef COMET_CPU_AVX2
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = comet_cpu_exp256_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
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

static comet_status cpu_logits_q8(comet_backend *be, const float *x, const int32_t *rows,
                                  int n_rows, const int8_t *q, const uint16_t *s, int C, int V,
                                  float *logits) {
    return comet_cpu_q_lm_head_q8(be, x, rows, n_rows, q, s, C, V, logits);
}

static void cpu_destroy(comet_backend *be) {
    comet_cpu_fast *impl = be->impl;
    comet_threadpool_free(impl->tp);
    for (int i = 0; impl->scratch && i < impl->n_threads; i++)
        free(impl->scratch[i]);
    free(impl->scratch);
    free(impl->scratch_cap);
    free(impl);
    free(be);
}

/* attention as the primitives table has it: the KV rotation (if any) around
 * comet_cpu_fast_attention_stored */
static comet_status cpu_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                  const comet_batch *b, const float *q, int H, float *out) {
    return comet_cpu_attention_rotated(be, kv, layer, b, q, H, out,
                                       comet_cpu_fast_attention_stored);
}

static const comet_cpu_prims cpu_prims = {
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .linear = cpu_linear,
    .rope = cpu_rope,
    .kv_append = comet_cpu_kv_append,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .residual_add = cpu_residual_add,
    .logits = cpu_logits,
    .logits_q8 = cpu_logits_q8,
};

static const comet_backend_ops cpu_ops = {
    .name = "cpu",
    COMET_CPU_STEP_OPS,
    .destroy = cpu_destroy,
};

comet_backend *comet_backend_cpu_init(int n_threads) {
    comet_backend *be = calloc(1, sizeof *be);
    comet_cpu_fast *impl = calloc(1, sizeof *impl);
    if (!be || !impl) {
        free(be);
        free(impl);
        comet_set_error(COMET_ERR_NOMEM, "cpu backend: out of memory");
        return NULL;
    }
    impl->base.prims = &cpu_prims;
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
