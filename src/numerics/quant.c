/* numerics/quant.c — activation (per token, per block, symmetric) and KV cache (per token,
 * per head, asymmetric) quantization with docs/numerics.md's rounding, their fp32
 * quantize->dequantize simulations, the Walsh-Hadamard rotation and weight dequantization.
 * Scalar reference code: every faster path must give the same codes. */
#include <math.h>
#include <string.h>

#include "numerics/quant.h"

float comet_quant_sym_block(const float *x, int n, int qmax, int8_t *q) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        finite &= isfinite(a) != 0;
        if (a > amax)
            amax = a;
    }
    if (!finite) {
        memset(q, 0, (size_t)n);
        return NAN;
    }
    if (amax == 0.0f) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    float s = amax / (float)qmax;
    float inv = 1.0f / s;
    float lo = (float)(-qmax - 1), hi = (float)qmax;
    for (int i = 0; i < n; i++) {
        float v = rintf(x[i] * inv);
        v = v < lo ? lo : v > hi ? hi : v;
        q[i] = (int8_t)v;
    }
    return s;
}

void comet_quant_act(const float *x, int T, int K, int B, int n8, int8_t *q, float *s) {
    COMET_ASSERT(B > 0 && K % B == 0 && n8 >= 0 && n8 <= K / B);
    int nb = K / B;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < nb; b++) {
            size_t off = (size_t)t * K + (size_t)b * B;
            s[(size_t)t * nb + b] = comet_quant_sym_block(x + off, B, b < n8 ? 127 : 7, q + off);
        }
}

void comet_quant_act_sim(const float *x, int T, int K, int B, int n8, float *y) {
    COMET_ASSERT(B > 0 && K % B == 0 && n8 >= 0 && n8 <= K / B && B <= 65536);
    int nb = K / B;
    int8_t q[B];
    for (int t = 0; t < T; t++)
        for (int b = 0; b < nb; b++) {
            size_t off = (size_t)t * K + (size_t)b * B;
            float sc = comet_quant_sym_block(x + off, B, b < n8 ? 127 : 7, q);
            for (int i = 0; i < B; i++)
                y[off + i] = (float)q[i] * sc;
        }
}

void comet_quant_kv_group(const float *x, int n, int bits, uint8_t *q, uint16_t *scale,
                          uint16_t *zero) {
    COMET_ASSERT((bits == 4 || bits == 8) && n > 0);
    float mn = x[0], mx = x[0];
    int ok = 1;
    for (int i = 0; i < n; i++) {
        ok &= fabsf(x[i]) <= COMET_QUANT_F16_MAX; /* false for NaN and infinities too */
        if (x[i] < mn)
            mn = x[i];
        if (x[i] > mx)
            mx = x[i];
    }
    if (!ok) {
        *scale = COMET_QUANT_F16_NAN;
        *zero = 0;
        memset(q, 0, (size_t)n);
        return;
    }
    int levels = (1 << bits) - 1;
    *zero = comet_quant_f16_bits_down(mn);
    float z = comet_quant_f16_value(*zero);
    *scale = comet_quant_f16_bits_up((mx - z) / (float)levels);
    float s = comet_quant_f16_value(*scale);
    if (s == 0.0f) {
        memset(q, 0, (size_t)n);
        return;
    }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) {
        float v = rintf((x[i] - z) * inv);
        v = v < 0.0f ? 0.0f : v > (float)levels ? (float)levels : v;
        q[i] = (uint8_t)v;
    }
}

void comet_quant_kv_sim(const float *x, int n_groups, int G, int bits, float *y) {
    if (bits == 16 || bits == 0) {
        if (y != x)
            memmove(y, x, (size_t)n_groups * G * sizeof *y);
        return;
    }
    COMET_ASSERT(G > 0 && G <= 65536);
    uint8_t q[G];
    for (int g = 0; g < n_groups; g++) {
        uint16_t sh, zh;
        const float *xg = x + (size_t)g * G;
        comet_quant_kv_group(xg, G, bits, q, &sh, &zh);
        float s = comet_quant_f16_value(sh), z = comet_quant_f16_value(zh);
        float *yg = y + (size_t)g * G;
        for (int i = 0; i < G; i++)
            yg[i] = (float)q[i] * s + z;
    }
}

void comet_wht(float *x, int n) {
    COMET_ASSERT(comet_is_pow2(n));
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float norm = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++)
        x[i] *= norm;
}

void comet_quant_w_dequant(const int8_t *q, const uint16_t *s, int N, int K, int B, float *w) {
    COMET_ASSERT(B > 0 && K % B == 0);
    int nb = K / B;
    for (int n = 0; n < N; n++)
        for (int b = 0; b < nb; b++) {
            float sc = comet_quant_f16_value(s[(size_t)n * nb + b]);
            size_t off = (size_t)n * K + (size_t)b * B;
            for (int i = 0; i < B; i++)
                w[off + i] = (float)q[off + i] * sc;
        }
}

uint16_t comet_quant_lm_head_row(const float *w, int n, int8_t *q) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < n; i++) {
        finite &= isfinite(w[i]) != 0;
        amax = fmaxf(amax, fabsf(w[i]));
    }
    if (!finite || amax / 127.0f > COMET_QUANT_F16_MAX) {
        memset(q, 0, (size_t)n);
        return COMET_QUANT_F16_NAN;
    }
    uint16_t sb = comet_quant_f16_bits_up(amax / 127.0f);
    if (sb == 0 && amax > 0.0f) /* amax / 127 underflows fp32: the smallest fp16 scale */
        sb = 1;
    const float s = comet_quant_f16_value(sb);
    for (int i = 0; i < n; i++)
        q[i] = comet_quant_w_code(w[i], s, 127);
    return sb;
}
