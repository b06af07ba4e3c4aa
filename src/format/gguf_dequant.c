/* gguf_dequant.c — GGUF tensor data to fp32: F32, F16, BF16, the legacy block quants
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants (Q2_K .. Q6_K).
 *
 * Each dequantizer follows ggml's dequantize_row_* (ggml-quants.c) block by block; the
 * block layouts (bytes per block, elements per block) are gguf.c's type table. Products
 * are rounded before sums (no fused multiply-add) so that results equal the `gguf` Python
 * package's numpy dequantization bit for bit (tests/test_gguf.c).
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "format/gguf.h"

#include <string.h>

/* little-endian loads (block data is unaligned) */
static uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

float comet_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float comet_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---- dequantization (ggml-quants.c dequantize_row_*) -------------------------------- */

static float h2f(const uint8_t *p) { return comet_fp16_to_fp32(ld16(p)); }

/* Q4_0: d (f16), 16 bytes of nibbles; low nibbles are elements 0..15, high 16..31. */
static void deq_q4_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0xf) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1: d, m (f16), 16 bytes of nibbles; x = q * d + m. */
static void deq_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0xf) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0: d (f16), qh (32 high bits), 16 bytes of low nibbles; x = (q - 16) * d. */
static void deq_q5_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    uint32_t qh = ld32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0xf) | (((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = (float)(x0 - 16) * d;
        y[j + 16] = (float)(x1 - 16) * d;
    }
}

/* Q5_1: d, m (f16), qh, 16 bytes of low nibbles; x = q * d + m. */
static void deq_q5_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = ld32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0xf) | (((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = (float)x0 * d + m;
        y[j + 16] = (float)x1 * d + m;
    }
}

/* Q8_0: d (f16), 32 int8. */
static void deq_q8_0(const uint8_t *b, float *y) {
    float d = h2f(b);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q2_K: scales[16] (4-bit scale | 4-bit min), qs[64] 2-bit codes, d, dmin (f16);
 * 16 sub-blocks of 16, x = d*sc*q - dmin*m. */
static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *q = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {
                uint8_t sc = scales[is++];
                float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
    }
}

/* Q3_K: hmask[32] (high bit), qs[64] (low 2 bits), scales[12] (16 packed 6-bit signed
 * scales, offset 32), d (f16); x = d*(sc-32)*(q - (high bit ? 0 : 4)). */
static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32;
    float d = h2f(b + 108);
    uint32_t aux[4] = {ld32(b + 96), ld32(b + 100), ld32(b + 104), 0};
    const uint32_t km1 = 0x03030303u, km2 = 0x0f0f0f0fu;
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4);
    aux[3] = ((aux[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4);
    aux[0] = (aux[0] & km2) | (((tmp >> 0) & km1) << 4);
    aux[1] = (aux[1] & km2) | (((tmp >> 2) & km1) << 4);
    int8_t sc[16];
    for (int i = 0; i < 16; i++)
        sc[i] = (int8_t)((aux[i / 4] >> (8 * (i % 4))) & 0xff);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++) {
                float dl = d * (float)(sc[is++] - 32);
                for (int l = 0; l < 16; l++) {
                    int k = l + 16 * half;
                    int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
        }
    }
}

/* 6-bit scale and min of sub-block j from the 12-byte packed K-quant scales. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K: d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32, x = d*sc*q - dmin*m. */
static void deq_q4_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        int sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)(q[l] & 0xf) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
}

/* Q5_K: d, dmin (f16), scales[12], qh[32], qs[128]. */
static void deq_q5_k(const uint8_t *b, float *y) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        int sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 0xf) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}

/* Q6_K: ql[128], qh[64], int8 scales[16], d (f16); 16 sub-blocks of 16, x = d*sc*(q-32). */
static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

comet_status comet_gguf_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    size_t bb;
    int blk = comet_gguf_type_block(type, &bb);
    if (!comet_gguf_type_supported(type)) {
        const char *nm = comet_gguf_type_name(type);
        if (nm)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "tensor type %s is not supported; supported: F32, F16, BF16, "
                                   "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K "
                                   "(re-quantize the model to one of these)",
                                   nm);
        return comet_set_error(COMET_ERR_UNSUPPORTED, "tensor type id %u is unknown", type);
    }
    COMET_ASSERT(n % blk == 0);
    int64_t nb = n / blk;
    switch (type) {
    case COMET_GGML_F32: memcpy(dst, s, (size_t)n * 4); break;
    case COMET_GGML_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = comet_fp16_to_fp32(ld16(s + 2 * i));
        break;
    case COMET_GGML_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = comet_bf16_to_fp32(ld16(s + 2 * i));
        break;
    default: {
        void (*f)(const uint8_t *, float *) = NULL;
        switch (type) {
        case COMET_GGML_Q4_0: f = deq_q4_0; break;
        case COMET_GGML_Q4_1: f = deq_q4_1; break;
        case COMET_GGML_Q5_0: f = deq_q5_0; break;
        case COMET_GGML_Q5_1: f = deq_q5_1; break;
        case COMET_GGML_Q8_0: f = deq_q8_0; break;
        case COMET_GGML_Q2_K: f = deq_q2_k; break;
        case COMET_GGML_Q3_K: f = deq_q3_k; break;
        case COMET_GGML_Q4_K: f = deq_q4_k; break;
        case COMET_GGML_Q5_K: f = deq_q5_k; break;
        case COMET_GGML_Q6_K: f = deq_q6_k; break;
        default: COMET_ASSERT(0);
        }
        for (int64_t i = 0; i < nb; i++)
            f(s + (size_t)i * bb, dst + i * blk);
    }
    }
    return COMET_OK;
}

comet_status comet_gguf_dequant(const comet_gguf *g, const comet_gguf_tensor *t, float *dst) {
    if (!comet_gguf_type_supported(t->type)) {
        const char *nm = comet_gguf_type_name(t->type);
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: tensor '%s' has type %s, which comet cannot convert; "
                               "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
                               "Q3_K, Q4_K, Q5_K, Q6_K (re-quantize the model to one of these)",
                               g->name, t->name, nm ? nm : "(unknown)");
    }
    return comet_gguf_dequant_row(t->type, t->data, dst, t->n_elements);
}
