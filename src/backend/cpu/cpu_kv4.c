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
 * written back in a wider format. An item walks its span in blocks of 8 keys. Scores: the
 * block's 8 code rows are transposed so that one vector lane holds one key, the codes become
 * floats with one AND and one conversion per 8 channels (the nibble's bit offset moved into
 * the query as an exact power of two), and each converted vector serves all of the KV head's
 * query heads, so a block's scores come out as one vector per head with no horizontal sum.
 * The span's scores are exponentiated 8 at a time with the vector exp (the span's last
 * n % 8 keys with expf, so which keys take which exp is fixed by position) and each head's
 * exp-sum runs in key order. Values: the block's p * scale products are formed 8 keys at a
 * time and the output accumulators stay in registers across the block's keys; the zero
 * terms p * zero collect lane by lane (lane k: keys k mod 8 of the span) and are summed in
 * a fixed order at the span's end.
 * Per key it reads D/2 + 4 D/G bytes of K and as many of V (48 + 48 bytes for D 64, G 16 at
 * 4 bits, against 512 for fp32), which keeps a decode step's attention cost low as the
 * context grows. Builds without AVX2, FMA and F16C, 8-bit codes, and groups that are not a
 * multiple of 16 channels (or head dims not of 64) take plain C loops over the same blocks. */
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

/* Stand-ins for the keys of a block past its last key: code 0, scale 0, zero 0. */
static const uint8_t zero_row[KV4_MAX_D / 2];
static const uint16_t zero_sz[2 * KV4_MAX_GROUPS];

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KV4_VEC 1
#define KV4_MAX_VGROUPS (KV4_MAX_D / 16) /* groups of the vector path (G a multiple of 16) */
/* channels 16 s .. 16 s + 15 of a 4-bit code row: low nibbles (even channels), high (odd) */
static inline void unpack16(const uint8_t *row, int s, __m256 *lo, __m256 *hi) {
    __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 8 * s)));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}
/* r[j] lane k = r[k] lane j: the 8 x 8 transpose of 32-bit lanes */
static inline __attribute__((always_inline)) void transpose8(__m256 *r) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}
#endif

typedef struct attn_state {
    int gqa, D, G, ng;
    int vec; /* the vector path: AVX2, 4-bit codes, G a multiple of 16, D of 64 */
    /* the plain C path's query: even / odd channels, sums per group */
    float qe[KV4_MAX_GQA][KV4_MAX_D / 2], qo[KV4_MAX_GQA][KV4_MAX_D / 2];
    float qsum[KV4_MAX_GQA][KV4_MAX_GROUPS];
    float ae[KV4_MAX_GQA][KV4_MAX_D / 2], ao[KV4_MAX_GQA][KV4_MAX_D / 2]; /* P·V, even/odd */
    float zsum[KV4_MAX_GQA][KV4_MAX_GROUPS];                              /* sum p * zero */
    int sub_g[KV4_MAX_D / 16]; /* the group of channels 16 s .. 16 s + 15 */
#ifdef KV4_VEC
    /* q_c scaled by 2^-(the bit offset of channel c's nibble in its 32-bit word of the code
     * row), see block_scores_vec */
    float qsc[KV4_MAX_GQA][KV4_MAX_D];
    float qeo[KV4_MAX_GQA][KV4_MAX_D / 2]; /* q_2c + q_2c+1: the zero term per channel pair */
    /* sum p * zero in lane 2 g + 1 of zacc[i][g / 4] (the even lanes: unused sums p * scale) */
    __m256 zacc[KV4_MAX_GQA][KV4_MAX_VGROUPS / 4];
#endif
} attn_state;

/* The fp16 scales and zeros of n groups (interleaved in sz) as fp32, exactly, still
 * interleaved: szf[2 g] = scale, szf[2 g + 1] = zero. */
static inline void load_sz(const uint16_t *sz, int n, float *szf) {
    int i = 0;
#ifdef KV4_VEC
    for (; i + 8 <= 2 * n; i += 8)
        _mm256_storeu_ps(szf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sz + i))));
#endif
    for (; i < 2 * n; i++)
        szf[i] = comet_quant_f16_value(sz[i]);
}

#ifdef KV4_VEC
/* The scales and zeros of a block's 8 keys (fp16 to fp32, exact) as rows, rows[k][m / 8]
 * lane m % 8 = key k's scale (m = 2 g) or zero (m = 2 g + 1) of group g, and as columns,
 * col[m] lane k = the same value. Rows and columns past 2 ng values are padded with zeros
 * (col holds 2 ng rounded up to 8 vectors). */
static inline __attribute__((always_inline)) void
sz_rows_columns(const uint16_t *const *sz, int ng, __m256 rows[][KV4_MAX_VGROUPS / 4],
                __m256 *col) {
    if (2 * ng % 8 == 0) {
        for (int m = 0; m < 2 * ng; m += 8) {
#pragma GCC unroll 8
            for (int k = 0; k < KV4_BLK; k++)
                col[m + k] = rows[k][m / 8] =
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sz[k] + m)));
            transpose8(col + m);
        }
        return;
    }
    float f[KV4_BLK][2 * KV4_MAX_VGROUPS] = {{0}}; /* the last chunk padded with zeros */
    for (int k = 0; k < KV4_BLK; k++)
        load_sz(sz[k], ng, f[k]);
    for (int m = 0; m < 2 * ng; m += 8) {
        for (int k = 0; k < KV4_BLK; k++)
            col[m + k] = rows[k][m / 8] = _mm256_loadu_ps(f[k] + m);
        transpose8(col + m);
    }
}

/* The vector path's scores of a block of 8 keys (padded with zero rows past the block's n
 * keys), one lane per key, so no horizontal sum per key is needed. The 8 code rows' 32-bit
 * words are transposed (word j of key k into lane k of v[j]: channels 8 j .. 8 j + 7, byte
 * b holding channels 8 j + 2 b and 8 j + 2 b + 1), and channel c's codes come out of v[j]
 * with one AND (or, for the top nibble, one shift) and one int-to-float conversion, still
 * multiplied by 2^o, o the nibble's bit offset; the query carries the 2^-o instead (qsc), so
 * qsc_c * (code << o) is exactly q_c * code and rounds as q_c * code does (an exact
 * power-of-two scaling; only a |q_c| below 2^-102 would lose bits, to a subnormal).
 * The arithmetic is the channel-pair form: for channel pair l + 8 s (channels 16 s + 2 l,
 * 16 s + 2 l + 1; l < 8, s < D/16) and key k,
 *   d_l = fma(zero_g, qeo, fma(scale_g, fma(q_even, code_even, q_odd * code_odd), d_l)),
 * s increasing, g the group of the pair, and the score is
 *   ((d_0 + d_1) + (d_2 + d_3)) + ((d_4 + d_5) + (d_6 + d_7)),
 * so each key's score is one fixed sequence of fp32 operations, whatever the block. GQA heads
 * share each converted code vector. n_sub = D / 16 (a constant where the caller knows it). */
static inline __attribute__((always_inline)) void
block_scores_vec(const attn_state *a, const uint8_t *const *row, const uint16_t *const *sz,
                 const int gqa, const int n_sub, __m256 *score) {
    __m256 col[2 * KV4_MAX_VGROUPS], rows[KV4_BLK][KV4_MAX_VGROUPS / 4], v[KV4_MAX_D / 8];
    sz_rows_columns(sz, a->ng, rows, col);
    for (int ch = 0; ch < n_sub / 4; ch++) {
#pragma GCC unroll 8
        for (int k = 0; k < KV4_BLK; k++)
            v[8 * ch + k] = _mm256_loadu_ps((const float *)(row[k] + 32 * ch));
        transpose8(v + 8 * ch);
    }
    const __m256i mask[4][2] = {
        {_mm256_set1_epi32(0x0F), _mm256_set1_epi32(0xF0)},
        {_mm256_set1_epi32(0x0F00), _mm256_set1_epi32(0xF000)},
        {_mm256_set1_epi32(0x0F0000), _mm256_set1_epi32(0xF00000)},
        {_mm256_set1_epi32(0x0F000000), _mm256_setzero_si256()}, /* the top nibble: a shift */
    };
    __m256 d[KV4_MAX_GQA][8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; l++) {
        const int b = l % 4;
#pragma GCC unroll 8
        for (int i = 0; i < gqa; i++)
            d[i][l] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int s = 0; s < n_sub; s++) {
            const __m256i w = _mm256_castps_si256(v[2 * s + l / 4]);
            const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(w, mask[b][0]));
            const __m256 hi = _mm256_cvtepi32_ps(b == 3 ? _mm256_srli_epi32(w, 28)
                                                        : _mm256_and_si256(w, mask[b][1]));
            const __m256 sg = col[2 * a->sub_g[s]], zg = col[2 * a->sub_g[s] + 1];
#pragma GCC unroll 8
            for (int i = 0; i < gqa; i++) {
                const float *qs = a->qsc[i] + 16 * s + 2 * l;
                const __m256 part =
                    _mm256_fmadd_ps(_mm256_broadcast_ss(qs), lo,
                                    _mm256_mul_ps(_mm256_broadcast_ss(qs + 1), hi));
                d[i][l] = _mm256_fmadd_ps(sg, part, d[i][l]);
                d[i][l] = _mm256_fmadd_ps(zg, _mm256_broadcast_ss(&a->qeo[i][8 * s + l]), d[i][l]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < gqa; i++)
        score[i] = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(d[i][0], d[i][1]), _mm256_add_ps(d[i][2], d[i][3])),
            _mm256_add_ps(_mm256_add_ps(d[i][4], d[i][5]), _mm256_add_ps(d[i][6], d[i][7])));
}

/* The vector path's values of a block of n keys (rows padded as for the scores): the
 * weights p (w, one row per head) times each key's group scale, formed 8 keys at a time,
 * then per 16 channels and head the accumulators stay in registers over the block's keys,
 * out += (p_k * scale_kg) * code_k key by key; the zero terms p_k * zero_kg collect lane by
 * lane in zacc. */
static inline __attribute__((always_inline)) void
block_values_vec(attn_state *a, const uint8_t *const *row, const uint16_t *const *sz, int n,
                 const float *w, size_t stride, const int gqa) {
    const int ng = a->ng;
    __m256 col[2 * KV4_MAX_VGROUPS], rows[KV4_BLK][KV4_MAX_VGROUPS / 4];
    sz_rows_columns(sz, ng, rows, col);
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(n),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    float ws[KV4_MAX_GQA][KV4_MAX_VGROUPS][KV4_BLK];
#pragma GCC unroll 8
    for (int i = 0; i < gqa; i++) {
        const __m256 p = _mm256_maskload_ps(w + (size_t)i * stride, live);
        float pk[KV4_BLK];
        _mm256_storeu_ps(pk, p);
        for (int g = 0; g < ng; g++)
            _mm256_storeu_ps(ws[i][g], _mm256_mul_ps(p, col[2 * g]));
        /* the zero terms key by key, in key order: zacc += p_k * (key k's scale/zero row) */
        for (int m = 0; m < (2 * ng + 7) / 8; m++) {
            __m256 z = a->zacc[i][m];
#pragma GCC unroll 8
            for (int k = 0; k < KV4_BLK; k++)
                z = _mm256_fmadd_ps(_mm256_broadcast_ss(pk + k), rows[k][m], z);
            a->zacc[i][m] = z;
        }
    }
    /* all 8 keys: past n, p = 0 and the zero rows add exact zeros */
    for (int s = 0; s < a->D / 16; s++) {
        __m256 lo[KV4_BLK], hi[KV4_BLK];
        const int g = a->sub_g[s];
#pragma GCC unroll 8
        for (int k = 0; k < KV4_BLK; k++)
            unpack16(row[k], s, &lo[k], &hi[k]);
#pragma GCC unroll 8
        for (int i = 0; i < gqa; i++) {
            __m256 e = _mm256_loadu_ps(a->ae[i] + 8 * s), o = _mm256_loadu_ps(a->ao[i] + 8 * s);
#pragma GCC unroll 8
            for (int k = 0; k < KV4_BLK; k++) {
                const __m256 wsk = _mm256_broadcast_ss(&ws[i][g][k]);
                e = _mm256_fmadd_ps(wsk, lo[k], e);
                o = _mm256_fmadd_ps(wsk, hi[k], o);
            }
            _mm256_storeu_ps(a->ae[i] + 8 * s, e);
            _mm256_storeu_ps(a->ao[i] + 8 * s, o);
        }
    }
}
#endif

/* A block of n <= KV4_BLK keys (code rows row[k], scales and zeros sz[k]; past n the zero
 * stand-ins): the scores of the item's query heads, sc[i * stride + k] = (q_i · k_k) /
 * sqrt(D) from the codes. qe / qo: each head's even / odd channels (the low / high nibbles'
 * channels), qsum: its sums per group. */
static void block_scores(const attn_state *a, const comet_cuda_kv_layout *L,
                         const uint8_t *const *row, const uint16_t *const *sz, int n,
                         float inv_sqrt_d, float *sc, size_t stride) {
    float szf[2 * KV4_MAX_GROUPS];
#ifdef KV4_VEC
    if (a->vec) {
        __m256 score[KV4_MAX_GQA];
        if (a->D == 64) /* the common head dim and GQA ratios, their loops unrolled */
            switch (a->gqa) {
            case 1: block_scores_vec(a, row, sz, 1, 4, score); break;
            case 2: block_scores_vec(a, row, sz, 2, 4, score); break;
            case 3: block_scores_vec(a, row, sz, 3, 4, score); break;
            case 4: block_scores_vec(a, row, sz, 4, 4, score); break;
            default: block_scores_vec(a, row, sz, a->gqa, 4, score); break;
            }
        else
            block_scores_vec(a, row, sz, a->gqa, a->D / 16, score);
        for (int i = 0; i < a->gqa; i++) {
            float r[KV4_BLK];
            _mm256_storeu_ps(r, _mm256_mul_ps(score[i], _mm256_set1_ps(inv_sqrt_d)));
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
 * and key k of the block. */
static void block_values(attn_state *a, const comet_cuda_kv_layout *L,
                         const uint8_t *const *row, const uint16_t *const *sz, int n,
                         const float *w, size_t stride) {
#ifdef KV4_VEC
    if (a->vec) {
        switch (a->gqa) {
        case 1: block_values_vec(a, row, sz, n, w, stride, 1); break;
        case 2: block_values_vec(a, row, sz, n, w, stride, 2); break;
        case 3: block_values_vec(a, row, sz, n, w, stride, 3); break;
        case 4: block_values_vec(a, row, sz, n, w, stride, 4); break;
        default: block_values_vec(a, row, sz, n, w, stride, a->gqa); break;
        }
        return;
    }
#endif
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

/* The code rows and scale/zero rows of the n keys from position p of a sequence; the
 * block's remaining rows are the zero stand-ins. One division per block: the keys' slots
 * are walked from p's, page by page. */
static void block_rows(const attn_job *j, const int32_t *pages, int which, int kvh, int p,
                       int n, const uint8_t **row, const uint16_t **sz) {
    const comet_cuda_kv_layout *L = &j->L;
    int page = p / L->P, slot = p - page * L->P;
    const uint8_t *tile = head_tile(L, j->kv->storage, j->layer, pages[page], which, kvh);
    for (int k = 0; k < n; k++, slot++) {
        if (slot == L->P) {
            slot = 0;
            tile = head_tile(L, j->kv->storage, j->layer, pages[++page], which, kvh);
        }
        row[k] = tile + (size_t)slot * L->code_row_bytes;
        sz[k] = slot_sz(L, tile, slot);
    }
    for (int k = n; k < KV4_BLK; k++)
        row[k] = zero_row, sz[k] = zero_sz;
}

/* The largest of x[0..n-1] (-inf for n = 0). */
static float span_max(const float *x, int n) {
    float m = -INFINITY;
    int i = 0;
#ifdef KV4_VEC
    if (n >= 8) {
        __m256 v = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8)
            v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
        float lane[8];
        _mm256_storeu_ps(lane, v);
        for (int k = 0; k < 8; k++)
            m = lane[k] > m ? lane[k] : m;
    }
#endif
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
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
    attn_state state, *a = &state; /* ~100 KiB at most, on the worker's stack */
    a->gqa = gqa, a->D = D, a->G = G, a->ng = D / G, a->vec = 0;
#ifdef KV4_VEC
    a->vec = L->bits == 4 && G % 16 == 0 && D % 64 == 0;
#endif
    for (int sc16 = 0; sc16 < D / 16; sc16++)
        a->sub_g[sc16] = 16 * sc16 / G;
    float sc[KV4_MAX_GQA * KV4_SPAN], qr[KV4_MAX_D];
    for (int i = 0; i < gqa; i++) {
        memcpy(qr, j->q + ((size_t)t * j->H + kvh * gqa + i) * D, D * sizeof(float));
#ifdef KV4_VEC
        if (a->vec) {
            /* channel c sits at bit 4 (c mod 8) of its code word; the top nibble is shifted
             * down to bit 0 instead of masked (block_scores_vec) */
            static const float pow16[8] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f,
                                           0x1p-16f, 0x1p-20f, 0x1p-24f, 1.0f};
            for (int c = 0; c < D; c++)
                a->qsc[i][c] = qr[c] * pow16[c % 8];
            for (int c = 0; c < D / 2; c++)
                a->qeo[i][c] = qr[2 * c] + qr[2 * c + 1];
            for (int m = 0; m < (2 * a->ng + 7) / 8; m++)
                a->zacc[i][m] = _mm256_setzero_ps();
            continue;
        }
#endif
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
    const uint8_t *row[KV4_BLK];
    const uint16_t *sz[KV4_BLK];
    for (int p = p0; p < p1; p += KV4_BLK) {
        const int n = p1 - p < KV4_BLK ? p1 - p : KV4_BLK;
        block_rows(j, pages, 0, kvh, p, n, row, sz);
        block_scores(a, L, row, sz, n, inv_sqrt_d, sc + (p - p0), KV4_SPAN);
    }
    float *part = j->part + (size_t)item * gqa * (D + 2);
    const int n_span = p1 - p0;
    float m[KV4_MAX_GQA], z[KV4_MAX_GQA];
    for (int i = 0; i < gqa; i++) {
        m[i] = span_max(sc + (size_t)i * KV4_SPAN, n_span);
        exp_shift(sc + (size_t)i * KV4_SPAN, n_span, m[i]);
    }
    /* each head's exp-sum in key order, four heads' sums side by side in registers so that
     * their latency chains overlap */
    for (int i0 = 0; i0 < gqa; i0 += 4) {
        static const float none[KV4_SPAN]; /* a head past gqa: its sum is discarded */
        const float *s0 = sc + (size_t)i0 * KV4_SPAN;
        const float *s1 = i0 + 1 < gqa ? s0 + KV4_SPAN : none;
        const float *s2 = i0 + 2 < gqa ? s0 + 2 * KV4_SPAN : none;
        const float *s3 = i0 + 3 < gqa ? s0 + 3 * KV4_SPAN : none;
        float z0 = 0.0f, z1 = 0.0f, z2 = 0.0f, z3 = 0.0f;
        for (int p = 0; p < n_span; p++)
            z0 += s0[p], z1 += s1[p], z2 += s2[p], z3 += s3[p];
        const float zz[4] = {z0, z1, z2, z3};
        for (int i = i0; i < gqa && i < i0 + 4; i++)
            z[i] = zz[i - i0];
    }
    for (int i = 0; i < gqa; i++) {
        part[(size_t)i * (D + 2) + D] = m[i];
        part[(size_t)i * (D + 2) + D + 1] = z[i];
        memset(a->ae[i], 0, D / 2 * sizeof(float));
        memset(a->ao[i], 0, D / 2 * sizeof(float));
        memset(a->zsum[i], 0, a->ng * sizeof(float));
    }
    for (int p = p0; p < p1; p += KV4_BLK) {
        const int n = p1 - p < KV4_BLK ? p1 - p : KV4_BLK;
        block_rows(j, pages, 1, kvh, p, n, row, sz);
        block_values(a, L, row, sz, n, sc + (p - p0), KV4_SPAN);
    }
#ifdef KV4_VEC
    for (int i = 0; i < gqa && a->vec; i++)
        for (int m = 0; m < (2 * a->ng + 7) / 8; m++) {
            float lane[KV4_BLK];
            _mm256_storeu_ps(lane, a->zacc[i][m]);
            for (int g = 4 * m; g < a->ng && g < 4 * m + 4; g++)
                a->zsum[i][g] = lane[2 * (g - 4 * m) + 1];
        }
#endif
    for (int i = 0; i < gqa; i++)
        for (int g = 0; g < a->ng; g++)
            for (int c = g * G; c < (g + 1) * G; c++)
                part[(size_t)i * (D + 2) + c] =
                    (c & 1 ? a->ao[i][c / 2] : a->ae[i][c / 2]) + a->zsum[i][g];
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
