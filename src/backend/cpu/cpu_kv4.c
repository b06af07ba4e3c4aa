/* cpu_kv4.c — the CPU's quantized paged KV cache and its attention (see cpu_kv4.h).
 *
 * Attention runs one item per (token, KV head): the item's query heads (H / Hkv of them,
 * GQA) share each key's and value's unpacking. Scores use the factored dot product
 * q·k = sum_g (scale_g * sum_{c in g} q_c * code_c + zero_g * sum_{c in g} q_c), and the
 * values accumulate as out_c += (p * scale_g) * code_c + p * zero_g, so the codes are never
 * written back in a wider format. Per key it reads D/2 + 4 D/G bytes of K and as many of V
 * (48 + 48 bytes for D 64, G 16 at 4 bits, against 512 for fp32), which keeps a decode
 * step's attention cost low as the context grows. */
#include "backend/cpu/cpu_kv4.h"

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
                                     kv->head_dim, kv->kv.bits, kv->kv.group);
}

comet_status comet_cpu_kv4_init(comet_kv_cache *kv) {
    const int D = kv->head_dim, G = kv->kv.group > 0 ? kv->kv.group : D;
    if ((kv->kv.bits != 4 && kv->kv.bits != 8) || D < 2 || D % 2 || D > KV4_MAX_D || D % G ||
        D / G > KV4_MAX_GROUPS ||
        (kv->kv.rotation == COMET_KV_ROTATION_HADAMARD && !comet_is_pow2(D)))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cpu KV cache: %d-bit codes for head dim %d in groups of %d "
                               "(rotation %s): need 4 or 8 bits, an even head dim up to %d that "
                               "the group divides into at most %d groups, a power of two with "
                               "the Hadamard rotation",
                               kv->kv.bits, D, G, comet_kv_rotation_name(kv->kv.rotation),
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
static inline void load_codes(const comet_cuda_kv_layout *L, const uint8_t *tile, int slot,
                              float *dst) {
    const uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
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

typedef struct {
    const comet_kv_cache *kv;
    comet_cuda_kv_layout L;
    int layer, H, T, max_len;
    const comet_batch *b;
    const int32_t *seq_of; /* [T] */
    const float *q;
    float *out;
    float *scores; /* [n_threads][gqa * max_len] */
} attn_job;

/* The scores of one key for the item's query heads: sc[i] = (q_i · k) / sqrt(D) from the
 * codes. qe / qo: each head's even / odd channels (the low / high nibbles' channels), qsum:
 * its sums per group. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KV4_VEC 1
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* channels 16 s .. 16 s + 15 of a 4-bit code row: low nibbles (even channels), high (odd) */
static inline void unpack16(const uint8_t *row, int s, __m256 *lo, __m256 *hi) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * s)));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
#endif

typedef struct attn_state {
    int gqa, D, G, ng;
    float qe[KV4_MAX_GQA][KV4_MAX_D / 2], qo[KV4_MAX_GQA][KV4_MAX_D / 2];
    float qsum[KV4_MAX_GQA][KV4_MAX_GROUPS];
    float ae[KV4_MAX_GQA][KV4_MAX_D / 2], ao[KV4_MAX_GQA][KV4_MAX_D / 2]; /* P·V, even/odd */
    float zsum[KV4_MAX_GQA][KV4_MAX_GROUPS];                              /* sum p * zero */
} attn_state;

static void key_scores(attn_state *a, const comet_cuda_kv_layout *L, const uint8_t *tile,
                       int slot, float inv_sqrt_d, float *sc, size_t stride) {
    const uint16_t *sz = slot_sz(L, tile, slot);
    float scale[KV4_MAX_GROUPS], zero[KV4_MAX_GROUPS];
    for (int g = 0; g < a->ng; g++) {
        scale[g] = comet_quant_f16_value(sz[2 * g]);
        zero[g] = comet_quant_f16_value(sz[2 * g + 1]);
    }
#ifdef KV4_VEC
    if (L->bits == 4 && a->G % 16 == 0) {
        const uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
        __m256 acc[KV4_MAX_GQA];
        for (int i = 0; i < a->gqa; i++)
            acc[i] = _mm256_setzero_ps();
        for (int s = 0; s < a->D / 16; s++) {
            __m256 lo, hi;
            unpack16(row, s, &lo, &hi);
            const __m256 sg = _mm256_set1_ps(scale[16 * s / a->G]);
            for (int i = 0; i < a->gqa; i++) {
                __m256 part = _mm256_fmadd_ps(_mm256_loadu_ps(a->qe[i] + 8 * s), lo,
                                              _mm256_mul_ps(_mm256_loadu_ps(a->qo[i] + 8 * s), hi));
                acc[i] = _mm256_fmadd_ps(sg, part, acc[i]);
            }
        }
        for (int i = 0; i < a->gqa; i++) {
            float d = hsum8(acc[i]);
            for (int g = 0; g < a->ng; g++)
                d = fmaf(zero[g], a->qsum[i][g], d);
            sc[(size_t)i * stride] = d * inv_sqrt_d;
        }
        return;
    }
#endif
    float codes[KV4_MAX_D];
    load_codes(L, tile, slot, codes);
    for (int i = 0; i < a->gqa; i++) {
        float d = 0.0f;
        for (int g = 0; g < a->ng; g++) {
            float part = 0.0f;
            for (int c = g * a->G; c < (g + 1) * a->G; c++)
                part += (c & 1 ? a->qo[i][c / 2] : a->qe[i][c / 2]) * codes[c];
            d += scale[g] * part + zero[g] * a->qsum[i][g];
        }
        sc[(size_t)i * stride] = d * inv_sqrt_d;
    }
}

/* Adds w_i * v (v this key's values from the codes) for every head i of the item. */
static void key_values(attn_state *a, const comet_cuda_kv_layout *L, const uint8_t *tile,
                       int slot, const float *w, size_t stride) {
    const uint16_t *sz = slot_sz(L, tile, slot);
    float scale[KV4_MAX_GROUPS], zero[KV4_MAX_GROUPS];
    for (int g = 0; g < a->ng; g++) {
        scale[g] = comet_quant_f16_value(sz[2 * g]);
        zero[g] = comet_quant_f16_value(sz[2 * g + 1]);
    }
    for (int i = 0; i < a->gqa; i++)
        for (int g = 0; g < a->ng; g++)
            a->zsum[i][g] = fmaf(w[(size_t)i * stride], zero[g], a->zsum[i][g]);
#ifdef KV4_VEC
    if (L->bits == 4 && a->G % 16 == 0) {
        const uint8_t *row = tile + (size_t)slot * L->code_row_bytes;
        for (int s = 0; s < a->D / 16; s++) {
            __m256 lo, hi;
            unpack16(row, s, &lo, &hi);
            for (int i = 0; i < a->gqa; i++) {
                const __m256 ws = _mm256_set1_ps(w[(size_t)i * stride] * scale[16 * s / a->G]);
                _mm256_storeu_ps(a->ae[i] + 8 * s,
                                 _mm256_fmadd_ps(ws, lo, _mm256_loadu_ps(a->ae[i] + 8 * s)));
                _mm256_storeu_ps(a->ao[i] + 8 * s,
                                 _mm256_fmadd_ps(ws, hi, _mm256_loadu_ps(a->ao[i] + 8 * s)));
            }
        }
        return;
    }
#endif
    float codes[KV4_MAX_D];
    load_codes(L, tile, slot, codes);
    for (int i = 0; i < a->gqa; i++)
        for (int c = 0; c < a->D; c++) {
            float ws = w[(size_t)i * stride] * scale[c / a->G];
            float *dst = c & 1 ? &a->ao[i][c / 2] : &a->ae[i][c / 2];
            *dst = fmaf(ws, codes[c], *dst);
        }
}

static void attn_item(void *ctx, int item, int tid) {
    const attn_job *j = ctx;
    const comet_cuda_kv_layout *L = &j->L;
    const int D = L->D, G = L->G, Hkv = L->Hkv, gqa = j->H / Hkv, P = L->P;
    const int t = item / Hkv, kvh = item % Hkv, s = j->seq_of[t];
    const int n_keys = j->b->positions[t] + 1;
    const int32_t *pages = j->b->page_indices + j->b->page_indptr[s];
    const int rotated = j->kv->kv.rotation == COMET_KV_ROTATION_HADAMARD;
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    attn_state state, *a = &state; /* ~80 KiB at most, on the worker's stack */
    a->gqa = gqa, a->D = D, a->G = G, a->ng = D / G;
    float *sc = j->scores + (size_t)tid * gqa * j->max_len, sum[KV4_MAX_GQA], qr[KV4_MAX_D];
    for (int i = 0; i < gqa; i++) {
        memcpy(qr, j->q + ((size_t)t * j->H + kvh * gqa + i) * D, D * sizeof(float));
        if (rotated)
            comet_wht(qr, D);
        for (int c = 0; c < D / 2; c++) {
            a->qe[i][c] = qr[2 * c];
            a->qo[i][c] = qr[2 * c + 1];
        }
        for (int g = 0; g < a->ng; g++) {
            float z = 0.0f;
            for (int c = g * G; c < (g + 1) * G; c++)
                z += qr[c];
            a->qsum[i][g] = z;
        }
    }
    for (int p = 0; p < n_keys; p++)
        key_scores(a, L, head_tile(L, j->kv->storage, j->layer, pages[p / P], 0, kvh), p % P,
                   inv_sqrt_d, sc + p, (size_t)j->max_len);
    for (int i = 0; i < gqa; i++) {
        float *si = sc + (size_t)i * j->max_len, m = -INFINITY, z = 0.0f;
        for (int p = 0; p < n_keys; p++)
            m = si[p] > m ? si[p] : m;
        for (int p = 0; p < n_keys; p++) {
            si[p] = expf(si[p] - m);
            z += si[p];
        }
        sum[i] = z;
        memset(a->ae[i], 0, D / 2 * sizeof(float));
        memset(a->ao[i], 0, D / 2 * sizeof(float));
        memset(a->zsum[i], 0, a->ng * sizeof(float));
    }
    for (int p = 0; p < n_keys; p++)
        key_values(a, L, head_tile(L, j->kv->storage, j->layer, pages[p / P], 1, kvh), p % P,
                   sc + p, (size_t)j->max_len);
    for (int i = 0; i < gqa; i++) {
        const float inv = 1.0f / sum[i];
        for (int c = 0; c < D; c++)
            qr[c] = ((c & 1 ? a->ao[i][c / 2] : a->ae[i][c / 2]) + a->zsum[i][c / G]) * inv;
        if (rotated)
            comet_wht(qr, D);
        memcpy(j->out + ((size_t)t * j->H + kvh * gqa + i) * D, qr, D * sizeof(float));
    }
}

comet_status comet_cpu_kv4_attention(comet_threadpool *tp, const comet_kv_cache *kv, int layer,
                                     const comet_batch *b, const float *q, int H, float *out) {
    const int T = b->n_tokens, Hkv = kv->n_head_kv;
    COMET_ASSERT(H % Hkv == 0 && H / Hkv <= KV4_MAX_GQA && kv->storage);
    int max_len = 1;
    for (int t = 0; t < T; t++)
        max_len = b->positions[t] + 1 > max_len ? b->positions[t] + 1 : max_len;
    const int n_threads = tp ? comet_threadpool_size(tp) : 1;
    int32_t *seq_of = malloc((size_t)T * sizeof *seq_of);
    float *scores = malloc((size_t)n_threads * (H / Hkv) * max_len * sizeof *scores);
    if (!seq_of || !scores) {
        free(seq_of);
        free(scores);
        return comet_set_error(COMET_ERR_NOMEM, "cpu attention: no memory for %d keys", max_len);
    }
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->token_indptr[s]; t < b->token_indptr[s + 1]; t++)
            seq_of[t] = s;
    attn_job j = {kv, layout(kv), layer, H, T, max_len, b, seq_of, q, out, scores};
    comet_parallel_for(tp, T * Hkv, attn_item, &j);
    free(seq_of);
    free(scores);
    return COMET_OK;
}
