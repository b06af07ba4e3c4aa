/* cpu_kv4.c — the CPU's quantized paged KV cache and its attention (see cpu_kv4.h).
 *
 * Attention cuts each token's keys into spans of 128 at fixed positions (0, 128, ...); one
 * item per (token, KV head, span) computes the span's max, exp-sum and unnormalized output
 * for the KV head's query heads (H / Hkv of them, GQA, sharing each key's and value's
 * unpacking), and a second pass merges a token's spans in order (flash-decoding). A decode
 * step then spreads its keys over the threads, and since the cut does not depend on the
 * thread count or the step, neither does any result. Scores use the factored dot product
 * q·k = sum_g (scale_g * sum_{c in g} q_c * code_c + zero_g * sum_{c in g} q_c), and the
 * values accumulate as out_c += (p * scale_g) * code_c + p * zero_g, so the codes are never
 * written back in a wider format. An item walks its span in blocks of 8 keys: it scores the
 * block for all of its query heads (one 8-to-1 reduction turns the 8 keys' lane sums into one
 * vector of scores), exponentiates the span's scores 8 at a time with the vector exp (the
 * span's last n % 8 keys with expf, so which keys take which exp is fixed by position), and
 * adds the block's values with the output accumulators held in registers across its keys.
 * Per key it reads D/2 + 4 D/G bytes of K and as many of V (48 + 48 bytes for D 64, G 16 at
 * 4 bits, against 512 for fp32), which keeps a decode step's attention cost low as the
 * context grows. Builds without AVX2 + FMA take plain C loops over the same blocks. */
#include "backend/cpu/cpu_kv4.h"
#include "backend/cpu/cpu_simd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_kv.h"
#include "numerics/quant.h"

#define KV4_MAX_D 256
#define KV4_MAX_GQA 32
#define KV4_MAX_GROUPS 64 /* D / G */

static comet_cuda_kv_layout layout(const comet_kv_cache *kv) {
    return comet_cuda_kv_layout_make(kv->n_layer, kv->n_pages, kv->page_size, kv->n_head_kv,
                                     kv->head_dim, comet_kv_type_bits(kv->kv.type),
                                     kv->kv.group);
}

comet_status comet_cpu_kv4_init(comet_kv_cache *kv) {
    const int D = kv->head_dim, G = kv->kv.group > 0 ? kv->kv.group : D;
    if (!comet_kv_type_quantized(kv->kv.type) || D < 2 || D % 2 || D > KV4_MAX_D || D % G ||
        D / G > KV4_MAX_GROUPS ||
        (kv->kv.rotation == COMET_KV_ROTATION_HADAMARD && !comet_is_pow2(D)))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cpu KV cache: %d-bit codes for head dim %d in groups of %d "
                               "(rotation %s): need 4 or 8 bits, an even head dim up to %d that "
                               "the group divides into at most %d groups, a power of two with "
                               "the Hadamard rotation",
                               comet_kv_type_bits(kv->kv.type), D, G, comet_kv_rotation_name(kv->kv.rotation),
                               KV4_MAX_D, KV4_MAX_GROUPS);
    comet_cuda_kv_layout L = layout(kv);
    kv->storage = calloc(1, L.total_bytes);
    if (!kv->storage)
        return comet_set_error(COMET_ERR_NOMEM, "cpu KV cache: cannot allocate %zu MiB",
                               L.total_bytes >> 20);
    kv->storage_bytes = L.total_bytes;
    kv->k = kv->v = NULL;
    return COMET_OK;
}

void comet_cpu_kv4_free(comet_kv_cache *kv) {
    if (!kv)
        return;
    free(kv->storage);
    kv->storage = NULL;
    kv->storage_bytes = 0;
}

static uint8_t *head_tile(const comet_cuda_kv_layout *L, void *storage, int layer, int page,
                          int which, int h) {
    return (uint8_t *)storage +
           ((((size_t)layer * L->n_pages + page) * 2 + which) * L->Hkv + h) * L->head_tile_bytes;
}

/* Quantize x [D] (already rotated) into slot `slot` of a head tile. */
static void store_slot(const comet_cuda_kv_layout *L, uint8_t *tile, int slot, const float *x) {
    uint8_t codes[KV4_MAX_D];
    uint16_t *sz = (uint16_t *)(tile + L->sz_offset + (size_t)slot * L->sz_row_bytes);
    for (int i = 0; i < L->D / L->G; i++)
        comet_quant_kv_group(x + i * L->G, L->G, L->bits, codes + i * L->G, &sz[2 * i],
                             &sz[2 * i + 1]);
    uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
    if (L->bits == 4)
        for (int c = 0; c < L->D / 2; c++)
            row[c] = (uint8_t)(codes[2 * c] | codes[2 * c + 1] << 4);
    else
        memcpy(row, codes, (size_t)L->D);
}

comet_status comet_cpu_kv4_append(comet_kv_cache *kv, int layer, const comet_batch *b,
                                  const float *k, const float *v) {
    const comet_cuda_kv_layout L = layout(kv);
    const int D = L.D, P = L.P;
    float tmp[KV4_MAX_D];
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++) {
            int pos = b->positions[t];
            int page = b->page_indices[b->page_indptr[s] + pos / P];
            for (int h = 0; h < L.Hkv; h++)
                for (int which = 0; which < 2; which++) {
                    memcpy(tmp, (which ? v : k) + ((size_t)t * L.Hkv + h) * D, D * sizeof *tmp);
                    if (kv->kv.rotation == COMET_KV_ROTATION_HADAMARD)
                        comet_wht(tmp, D);
                    store_slot(&L, head_tile(&L, kv->storage, layer, page, which, h), pos % P,
                               tmp);
                }
        }
    return COMET_OK;
}

/* codes of slot `slot` of a head tile as floats (0 .. 2^bits - 1) */
static inline void load_codes(const comet_cuda_kv_layout *L, const uint8_t *row, float *dst) {
    if (L->bits == 4)
        for (int c = 0; c < L->D / 2; c++) {
            dst[2 * c] = (float)(row[c] & 15);
            dst[2 * c + 1] = (float)(row[c] >> 4);
        }
    else
        for (int c = 0; c < L->D; c++)
            dst[c] = (float)row[c];
}

static inline const uint16_t *slot_sz(const comet_cuda_kv_layout *L, const uint8_t *tile,
                                      int slot) {
    return (const uint16_t *)(tile + L->sz_offset + (size_t)slot * L->sz_row_bytes);
}

#define KV4_SPAN 128 /* keys per span: spans start at fixed positions 0, 128, 256, ... */

/* One item: the keys of span `span` of token t for KV head kvh. */
typedef struct {
    int t, kvh, span;
} attn_item_id;

typedef struct {
    const comet_kv_cache *kv;
    comet_cuda_kv_layout L;
    int layer, H, T;
    const comet_batch *b;
    const int32_t *seq_of;     /* [T] */
    const int32_t *span0;      /* [T + 1] first item of token t, in units of Hkv items */
    const attn_item_id *items; /* [n_items] */
    const float *q; /* [T, H, D], rotated when the cache is */
    float *out;
    float *part; /* [n_items][gqa][D + 2]: unnormalized output, then the span's max, sum */
} attn_job;

#define KV4_BLK 8 /* keys per block: scored, exponentiated and accumulated together */

#if defined(__AVX2__) && defined(__FMA__)
#define KV4_VEC 1
/* channels 16 s .. 16 s + 15 of a 4-bit code row: low nibbles (even channels), high (odd) */
static inline void unpack16(const uint8_t *row, int s, __m256 *lo, __m256 *hi) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * s)));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
/* lane k of the result = the sum of the 8 lanes of v[k] */
static inline __m256 hsum8x8(const __m256 *v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

typedef struct attn_state {
    int gqa, D, G, ng;
    float qe[KV4_MAX_GQA][KV4_MAX_D / 2], qo[KV4_MAX_GQA][KV4_MAX_D / 2];
    float qeo[KV4_MAX_GQA][KV4_MAX_D / 2]; /* qe + qo: the zero term per 16 channels */
    float qsum[KV4_MAX_GQA][KV4_MAX_GROUPS];
    float ae[KV4_MAX_GQA][KV4_MAX_D / 2], ao[KV4_MAX_GQA][KV4_MAX_D / 2]; /* P·V, even/odd */
    float zsum[KV4_MAX_GQA][KV4_MAX_GROUPS];                              /* sum p * zero */
    int sub_g[KV4_MAX_D / 16]; /* the group of channels 16 s .. 16 s + 15 */
} attn_state;

/* The fp16 scales and zeros of n groups (interleaved in sz) as fp32, exactly, still
 * interleaved: szf[2 g] = scale, szf[2 g + 1] = zero. */
static inline void load_sz(const uint16_t *sz, int n, float *szf) {
    int i = 0;
#if defined(KV4_VEC) && defined(__F16C__)
    for (; i + 8 <= 2 * n; i += 8)
        _mm256_storeu_ps(szf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sz + i))));
#endif
    for (; i < 2 * n; i++)
        szf[i] = comet_quant_f16_value(sz[i]);
}

/* A block of n <= KV4_BLK keys (code rows row[k], scales and zeros sz[k]): the scores of
 * the item's query heads, sc[i * stride + k] = (q_i · k_k) / sqrt(D) from the codes. qe / qo:
 * each head's even / odd channels (the low / high nibbles' channels), qsum: its sums per
 * group. The vector path keeps each (head, key) dot product in 8 lanes and reduces the
 * block's 8 keys at once, so lane k of one vector holds key k's score. */
static void block_scores(const attn_state *a, const comet_cuda_kv_layout *L,
                         const uint8_t *const *row, const uint16_t *const *sz, int n,
                         float inv_sqrt_d, float *sc, size_t stride) {
    float szf[2 * KV4_MAX_GROUPS];
#ifdef KV4_VEC
    if (L->bits == 4 && a->G % 16 == 0) {
        const int n_sub = a->D / 16;
        __m256 acc[KV4_MAX_GQA][KV4_BLK];
        for (int k = 0; k < KV4_BLK; k++) {
            if (k >= n) {
                for (int i = 0; i < a->gqa; i++)
                    acc[i][k] = _mm256_setzero_ps();
                continue;
            }
            load_sz(sz[k], a->ng, szf);
            __m256 lo[KV4_MAX_D / 16], hi[KV4_MAX_D / 16], sg[KV4_MAX_D / 16], zg[KV4_MAX_D / 16];
            for (int s = 0; s < n_sub; s++) {
                unpack16(row[k], s, &lo[s], &hi[s]);
                sg[s] = _mm256_broadcast_ss(szf + 2 * a->sub_g[s]);
                zg[s] = _mm256_broadcast_ss(szf + 2 * a->sub_g[s] + 1);
            }
            for (int i = 0; i < a->gqa; i++) {
                __m256 d = _mm256_setzero_ps();
                for (int s = 0; s < n_sub; s++) {
                    __m256 part = _mm256_fmadd_ps(_mm256_loadu_ps(a->qe[i] + 8 * s), lo[s],
                                                  _mm256_mul_ps(_mm256_loadu_ps(a->qo[i] + 8 * s), hi[s]));
                    d = _mm256_fmadd_ps(sg[s], part, d);
                    d = _mm256_fmadd_ps(zg[s], _mm256_loadu_ps(a->qeo[i] + 8 * s), d);
                }
                acc[i][k] = d;
            }
        }
        for (int i = 0; i < a->gqa; i++) {
            float r[KV4_BLK];
            _mm256_storeu_ps(r, _mm256_mul_ps(hsum8x8(acc[i]), _mm256_set1_ps(inv_sqrt_d)));
            memcpy(sc + (size_t)i * stride, r, (size_t)n * sizeof *r);
        }
        return;
    }
#endif
    for (int k = 0; k < n; k++) {
        float codes[KV4_MAX_D];
        load_sz(sz[k], a->ng, szf);
        load_codes(L, row[k], codes);
        for (int i = 0; i < a->gqa; i++) {
            float d = 0.0f;
            for (int g = 0; g < a->ng; g++) {
                float part = 0.0f;
                for (int c = g * a->G; c < (g + 1) * a->G; c++)
                    part += (c & 1 ? a->qo[i][c / 2] : a->qe[i][c / 2]) * codes[c];
                d += szf[2 * g] * part + szf[2 * g + 1] * a->qsum[i][g];
            }
            sc[(size_t)i * stride + k] = d * inv_sqrt_d;
        }
    }
}

/* A block of n <= KV4_BLK values: adds w[i * stride + k] * v_k for every head i of the item
 * and key k of the block. The vector path walks the head dim in 16-channel steps and, per
 * step and head, keeps the accumulators in registers over the block's keys. */
static void block_values(attn_state *a, const comet_cuda_kv_layout *L,
                         const uint8_t *const *row, const uint16_t *const *sz, int n,
                         const float *w, size_t stride) {
    float szf[KV4_BLK][2 * KV4_MAX_GROUPS];
    for (int k = 0; k < n; k++)
        load_sz(sz[k], a->ng, szf[k]);
    for (int i = 0; i < a->gqa; i++)
        for (int g = 0; g < a->ng; g++) {
            float z = a->zsum[i][g];
            for (int k = 0; k < n; k++)
                z = fmaf(w[(size_t)i * stride + k], szf[k][2 * g + 1], z);
            a->zsum[i][g] = z;
        }
#ifdef KV4_VEC
    if (L->bits == 4 && a->G % 16 == 0) {
        for (int s = 0; s < a->D / 16; s++) {
            __m256 lo[KV4_BLK], hi[KV4_BLK];
            const int g = a->sub_g[s];
            for (int k = 0; k < n; k++)
                unpack16(row[k], s, &lo[k], &hi[k]);
            for (int i = 0; i < a->gqa; i++) {
                __m256 e = _mm256_loadu_ps(a->ae[i] + 8 * s), o = _mm256_loadu_ps(a->ao[i] + 8 * s);
                for (int k = 0; k < n; k++) {
                    const __m256 ws = _mm256_set1_ps(w[(size_t)i * stride + k] * szf[k][2 * g]);
                    e = _mm256_fmadd_ps(ws, lo[k], e);
                    o = _mm256_fmadd_ps(ws, hi[k], o);
                }
                _mm256_storeu_ps(a->ae[i] + 8 * s, e);
                _mm256_storeu_ps(a->ao[i] + 8 * s, o);
            }
        }
        return;
    }
#endif
    for (int k = 0; k < n; k++) {
        float codes[KV4_MAX_D];
        load_codes(L, row[k], codes);
        for (int i = 0; i < a->gqa; i++)
            for (int c = 0; c < a->D; c++) {
                float ws = w[(size_t)i * stride + k] * szf[k][2 * (c / a->G)];
                float *dst = c & 1 ? &a->ao[i][c / 2] : &a->ae[i][c / 2];
                *dst = fmaf(ws, codes[c], *dst);
            }
    }
}

/* The code rows and scale/zero rows of the n keys from position p of a sequence. */
static void block_rows(const attn_job *j, const int32_t *pages, int which, int kvh, int p,
                       int n, const uint8_t **row, const uint16_t **sz) {
    const comet_cuda_kv_layout *L = &j->L;
    for (int k = 0; k < n; k++) {
        const uint8_t *tile =
            head_tile(L, j->kv->storage, j->layer, pages[(p + k) / L->P], which, kvh);
        row[k] = tile + (size_t)((p + k) % L->P) * L->code_row_bytes;
        sz[k] = slot_sz(L, tile, (p + k) % L->P);
    }
}

/* x[i] = exp(x[i] - shift) for i < n, 8 at a time where the vector exp exists. */
static void exp_shift(float *x, int n, float shift) {
    int i = 0;
#ifdef KV4_VEC
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, comet_cpu_exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i),
                                                                  _mm256_set1_ps(shift))));
#endif
    for (; i < n; i++)
        x[i] = expf(x[i] - shift);
}

/* Span `span` of the keys of token t for KV head kvh: for each of the group's query heads,
 * the span's max score m, sum l of exp(score - m) and unnormalized output sum p v into
 * part[i] = [out (D), m, l]. */
static void attn_span(void *ctx, int item, int tid) {
    (void)tid;
    const attn_job *j = ctx;
    const comet_cuda_kv_layout *L = &j->L;
    const attn_item_id id = j->items[item];
    const int D = L->D, G = L->G, Hkv = L->Hkv, gqa = j->H / Hkv;
    const int t = id.t, kvh = id.kvh, s = j->seq_of[t];
    const int n_keys = j->b->positions[t] + 1;
    const int p0 = id.span * KV4_SPAN, p1 = p0 + KV4_SPAN < n_keys ? p0 + KV4_SPAN : n_keys;
    const int32_t *pages = j->b->page_indices + j->b->page_indptr[s];
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    attn_state state, *a = &state; /* ~80 KiB at most, on the worker's stack */
    a->gqa = gqa, a->D = D, a->G = G, a->ng = D / G;
    for (int sc16 = 0; sc16 < D / 16; sc16++)
        a->sub_g[sc16] = 16 * sc16 / G;
    float sc[KV4_MAX_GQA * KV4_SPAN], qr[KV4_MAX_D];
    for (int i = 0; i < gqa; i++) {
        memcpy(qr, j->q + ((size_t)t * j->H + kvh * gqa + i) * D, D * sizeof(float));
        for (int c = 0; c < D / 2; c++) {
            a->qe[i][c] = qr[2 * c];
            a->qo[i][c] = qr[2 * c + 1];
            a->qeo[i][c] = qr[2 * c] + qr[2 * c + 1];
        }
        for (int g = 0; g < a->ng; g++) {
            float z = 0.0f;
            for (int c = g * G; c < (g + 1) * G; c++)
                z += qr[c];
            a->qsum[i][g] = z;
        }
    }
    const uint8_t *row[KV4_BLK];
    const uint16_t *sz[KV4_BLK];
    for (int p = p0; p < p1; p += KV4_BLK) {
        const int n = p1 - p < KV4_BLK ? p1 - p : KV4_BLK;
        block_rows(j, pages, 0, kvh, p, n, row, sz);
        block_scores(a, L, row, sz, n, inv_sqrt_d, sc + (p - p0), KV4_SPAN);
    }
    float *part = j->part + (size_t)item * gqa * (D + 2);
    for (int i = 0; i < gqa; i++) {
        float *si = sc + (size_t)i * KV4_SPAN, m = -INFINITY;
        for (int p = 0; p < p1 - p0; p++)
            m = si[p] > m ? si[p] : m;
        float z = 0.0f;
        exp_shift(si, p1 - p0, m);
        for (int p = 0; p < p1 - p0; p++)
            z += si[p];
        part[(size_t)i * (D + 2) + D] = m;
        part[(size_t)i * (D + 2) + D + 1] = z;
        memset(a->ae[i], 0, D / 2 * sizeof(float));
        memset(a->ao[i], 0, D / 2 * sizeof(float));
        memset(a->zsum[i], 0, a->ng * sizeof(float));
    }
    for (int p = p0; p < p1; p += KV4_BLK) {
        const int n = p1 - p < KV4_BLK ? p1 - p : KV4_BLK;
        block_rows(j, pages, 1, kvh, p, n, row, sz);
        block_values(a, L, row, sz, n, sc + (p - p0), KV4_SPAN);
    }
    for (int i = 0; i < gqa; i++)
        for (int c = 0; c < D; c++)
            part[(size_t)i * (D + 2) + c] =
                (c & 1 ? a->ao[i][c / 2] : a->ae[i][c / 2]) + a->zsum[i][c / G];
}

/* Token t, KV head kvh: its spans merged in span order, normalized, rotated back. */
static void attn_merge(void *ctx, int item, int tid) {
    (void)tid;
    const attn_job *j = ctx;
    const int D = j->L.D, Hkv = j->L.Hkv, gqa = j->H / Hkv;
    const int t = item / Hkv, kvh = item % Hkv;
    const int n_spans = j->span0[t + 1] - j->span0[t];
    const size_t first = (size_t)j->span0[t] * Hkv + (size_t)kvh * n_spans, stride = (size_t)gqa * (D + 2);
    for (int i = 0; i < gqa; i++) {
        const float *p0 = j->part + first * stride + (size_t)i * (D + 2);
        float m = -INFINITY, l = 0.0f, o[KV4_MAX_D] = {0};
        for (int sp = 0; sp < n_spans; sp++)
            m = p0[sp * stride + D] > m ? p0[sp * stride + D] : m;
        for (int sp = 0; sp < n_spans; sp++) {
            const float *ps = p0 + sp * stride, f = expf(ps[D] - m);
            l = fmaf(ps[D + 1], f, l);
            for (int c = 0; c < D; c++)
                o[c] = fmaf(ps[c], f, o[c]);
        }
        const float inv = 1.0f / l;
        for (int c = 0; c < D; c++)
            o[c] *= inv;
        if (j->kv->kv.rotation == COMET_KV_ROTATION_HADAMARD)
            comet_wht(o, D);
        memcpy(j->out + ((size_t)t * j->H + kvh * gqa + i) * D, o, D * sizeof(float));
    }
}

comet_status comet_cpu_kv4_attention(comet_threadpool *tp, const comet_kv_cache *kv, int layer,
                                     const comet_batch *b, const float *q, int H, float *out) {
    const int T = b->n_tokens, Hkv = kv->n_head_kv, D = kv->head_dim, gqa = H / Hkv;
    COMET_ASSERT(H % Hkv == 0 && gqa <= KV4_MAX_GQA && kv->storage);
    int32_t *seq_of = malloc((size_t)T * sizeof *seq_of);
    int32_t *span0 = malloc((size_t)(T + 1) * sizeof *span0);
    if (!seq_of || !span0) {
        free(seq_of);
        free(span0);
        return comet_set_error(COMET_ERR_NOMEM, "cpu attention: out of memory for %d tokens", T);
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++)
            seq_of[t] = s;
    span0[0] = 0;
    for (int t = 0; t < T; t++)
        span0[t + 1] = span0[t] + (b->positions[t] + KV4_SPAN) / KV4_SPAN;
    const size_t n_items = (size_t)span0[T] * Hkv;
    attn_item_id *items = malloc(n_items * sizeof *items);
    float *part = malloc(n_items * gqa * (D + 2) * sizeof *part);
    const int rotated = kv->kv.rotation == COMET_KV_ROTATION_HADAMARD;
    float *qr = rotated ? malloc((size_t)T * H * D * sizeof *qr) : NULL;
    if (!items || !part || (rotated && !qr)) {
        free(seq_of), free(span0), free(items), free(part), free(qr);
        return comet_set_error(COMET_ERR_NOMEM, "cpu attention: out of memory for %zu spans",
                               n_items);
    }
    for (int t = 0; t < T; t++) { /* token t's items: KV head-major, then span */
        const int n_spans = span0[t + 1] - span0[t];
        for (int h = 0; h < Hkv; h++)
            for (int sp = 0; sp < n_spans; sp++)
                items[(size_t)span0[t] * Hkv + (size_t)h * n_spans + sp] =
                    (attn_item_id){t, h, sp};
    }
    if (rotated) { /* H_D q once per head, for all of its spans: (H q)·(H k) = q·k */
        memcpy(qr, q, (size_t)T * H * D * sizeof *qr);
        for (size_t i = 0; i < (size_t)T * H; i++)
            comet_wht(qr + i * D, D);
    }
    attn_job j = {kv, layout(kv), layer, H, T, b, seq_of, span0, items, rotated ? qr : q, out, part};
    comet_parallel_for(tp, (int)n_items, attn_span, &j);
    comet_parallel_for(tp, T * Hkv, attn_merge, &j);
    free(seq_of), free(span0), free(items), free(part), free(qr);
    return COMET_OK;
}
