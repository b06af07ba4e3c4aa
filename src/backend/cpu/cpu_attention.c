/* cpu_attention.c — attention of the fast CPU backend: causal GQA attention over the paged
 * fp32 cache as stored, threaded on the backend's pool and batch-invariant (cpu_ops.c's
 * file comment says why). The KV rotation around it and the KV append are shared with the
 * reference backend (cpu_common.c); the oracle is ref_ops.c's attention.
 *
 * Per (token, query head), with n = the token's position + 1 keys of its sequence:
 *   s_j = dot(q, k_j) * (1/sqrt(D))       j < n (dot as in cpu_simd.h)
 *   p_j = exp(s_j - max s), l = sum p_j   (comet_cpu_exp_shift_sum over the n scores)
 *   o   = (sum_j p_j v_j, j ascending, one FMA chain per channel) * (1/l)
 * That arithmetic is all there is, in both schedules below, so a token's output does not
 * depend on the schedule, the step or the thread it ran on.
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
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_common.h"
#include "backend/cpu/cpu_fast.h"
#include "backend/cpu/cpu_simd.h"

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
        comet_cpu_dot_tile(qp, M, kp, nk, D, sc + k0, (size_t)L);
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
            inv[i] = 1.0f / comet_cpu_exp_shift_sum(row, n[i], mx);
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
static comet_status grow_scratch(comet_cpu_fast *impl, size_t need) {
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

comet_status comet_cpu_fast_attention_stored(comet_backend *be, const comet_kv_cache *kv, int layer,
                                             const comet_batch *b, const float *q, int H,
                                             float *out) {
    comet_cpu_fast *impl = be->impl;
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
