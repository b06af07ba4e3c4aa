/* numerics/quant.h — the quantization primitives of docs/numerics.md: the one
 * implementation of its rounding rules, shared by the quantizer (`comet quantize`), the
 * checkpoint reader and writer, and every backend (the CPU's simulated execution of quantized
 * checkpoints; the CUDA kernels are held to these bit for bit).
 *
 * Holds: IEEE half conversions; per-token per-block symmetric activation quantization
 * (INT4/INT8 blocks) and its fp32 quantize->dequantize simulation; per-token per-head
 * asymmetric KV quantization (4/8 bits) and its simulation; the Walsh-Hadamard rotation of
 * the KV cache; one weight code and the dequantization of weight codes. Choosing codes for
 * a model (calibration, reordering, RTN, GPTQ) is the quantizer's: src/quant/quant.h.
 *
 * Shape letters as in docs/numerics.md: T tokens, K input channels of a linear, N output
 * channels, B block size (channels). Every [T, K] array is row-major.
 */
#ifndef COMET_NUMERICS_QUANT_H
#define COMET_NUMERICS_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

/* IEEE half conversion (round to nearest even), used for the fp16 scales and zeros.
 * Compilers without _Float16 on this target (clang < 15 on x86, used for the libFuzzer
 * builds) get the same conversion in integer code (checked equal to _Float16 on every
 * 7th fp32 bit pattern). */
#if defined(__FLT16_MAX__)
static inline uint16_t comet_quant_f16_bits(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    __builtin_memcpy(&u, &h, sizeof u);
    return u;
}
static inline float comet_quant_f16_value(uint16_t u) {
    _Float16 h;
    __builtin_memcpy(&h, &u, sizeof h);
    return (float)h;
}
#else
static inline uint16_t comet_quant_f16_bits(float f) {
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t h, rem, half;
    if (e <= 0) { /* fp16 subnormal or zero */
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        int shift = 14 - e;
        h = man >> shift;
        rem = man & ((1u << shift) - 1);
        half = 1u << (shift - 1);
    } else {
        h = ((uint32_t)e << 10) | (man >> 13);
        rem = man & 0x1fffu;
        half = 0x1000u;
    }
    if (rem > half || (rem == half && (h & 1))) /* a carry into the exponent is correct */
        h++;
    return (uint16_t)(sign | h);
}
static inline float comet_quant_f16_value(uint16_t u) {
    uint32_t sign = (uint32_t)(u & 0x8000u) << 16, exp = (u >> 10) & 0x1fu, man = u & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (!man) {
        bits = sign;
    } else {
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}
#endif
/* f rounded to the nearest fp16 value, as fp32. */
static inline float comet_quant_f16_round(float f) {
    return comet_quant_f16_value(comet_quant_f16_bits(f));
}

/* The fp16 bit pattern of the largest fp16 value <= f (down) or the smallest >= f (up), for
 * finite f within fp16's range [-65504, 65504] (CUDA's __float2half_rd / __float2half_ru
 * there). */
static inline uint16_t comet_quant_f16_bits_down(float f) {
    uint16_t h = comet_quant_f16_bits(f);
    if (comet_quant_f16_value(h) <= f)
        return h;
    /* one fp16 step towards -inf: magnitude up for negatives (and -0), down for positives */
    return (h & 0x8000u) || h == 0 ? (uint16_t)((h == 0 ? 0x8000u : h) + 1) : (uint16_t)(h - 1);
}
static inline uint16_t comet_quant_f16_bits_up(float f) {
    uint16_t h = comet_quant_f16_bits(f);
    if (comet_quant_f16_value(h) >= f)
        return h;
    return (h & 0x8000u) ? (h == 0x8000u ? (uint16_t)1 : (uint16_t)(h - 1)) : (uint16_t)(h + 1);
}

/* fp16 bits of a quiet NaN: the scale of a block or KV group holding a non-finite value */
#define COMET_QUANT_F16_NAN 0x7e00u
/* The largest finite fp16 value */
#define COMET_QUANT_F16_MAX 65504.0f

/* ---- Activations (docs/numerics.md "Activations") ---------------------------------------- */

/* Symmetric quantization of one block of n values with code range [-qmax-1, qmax]
 * (qmax = 7 for INT4, 127 for INT8): s = amax / qmax, q = clamp(rint(x * (1/s))) in fp32.
 * amax == 0 gives s = 0 and q = 0. A block holding a NaN or an infinity gives q = 0 and
 * s = NaN: its products are NaN, so the token's logits are not finite and the engine fails
 * that request (docs/numerics.md "Degenerate inputs"). Writes q[n], returns s. */
float comet_quant_sym_block(const float *x, int n, int qmax, int8_t *q);

/* Quantize activations x [T, K] (already in the group's permuted order) per token per
 * block of B channels: blocks 0..n8-1 INT8 (s = amax/127), the rest INT4 (s = amax/7).
 * K % B == 0, 0 <= n8 <= K/B. Writes codes q [T, K] and fp32 scales s [T, K/B]. */
void comet_quant_act(const float *x, int T, int K, int B, int n8, int8_t *q, float *s);

/* The fp32 simulation of comet_quant_act: y[t, k] = q[t, k] * s[t, k/B] with exactly the
 * same codes and scales. y may alias x. */
void comet_quant_act_sim(const float *x, int T, int K, int B, int n8, float *y);

/* ---- KV cache (docs/numerics.md "KV cache") ----------------------------------------------- */

/* Asymmetric quantization of one group of n values to `bits` (4 or 8) bits: zero = min
 * rounded down to fp16, scale = (max - zero) / (2^bits - 1) rounded up to fp16, so that
 * [zero, zero + (2^bits - 1) * scale] holds every value; the codes use the stored values:
 * q = clamp(rint((x - zero) * (1/scale)), 0, 2^bits - 1) (scale == 0 gives q = 0), and
 * |x - (q * scale + zero)| <= scale / 2 up to fp32 rounding. A group holding a non-finite
 * value or one outside fp16's range gets q = 0, zero = 0 and a NaN scale (the request then
 * fails, as for activations). Writes q[n] (one code per byte) and the fp16 bit patterns
 * of scale and zero. */
void comet_quant_kv_group(const float *x, int n, int bits, uint8_t *q, uint16_t *scale,
                          uint16_t *zero);

/* Simulation over n_groups consecutive groups of G values (K or V of one token and KV
 * head: G = D): y = dequant(quant(x)) per group with comet_quant_kv_group's rounding.
 * bits 16 (or 0) copies x. y may alias x. */
void comet_quant_kv_sim(const float *x, int n_groups, int G, int bits, float *y);

/* In-place normalized fast Walsh–Hadamard transform of x[n] (n a power of two, n >= 1):
 * x <- H_n x with H_n the Sylvester Hadamard matrix divided by sqrt(n). H_n is symmetric
 * and orthogonal (H_n H_n = I), so applying it twice gives x back up to fp32 rounding.
 * O(n log n). This is the KV-cache rotation of docs/numerics.md "KV cache". */
void comet_wht(float *x, int n);

/* 1 when n is a power of two (n >= 1): the head dims comet_wht accepts. */
static inline int comet_is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* ---- Weights (docs/numerics.md "Weights") ------------------------------------------------- */

/* One weight code: clamp(rint(w * (1/s)), -qmax-1, qmax); s == 0 or a NaN product gives 0
 * (no NaN is cast to an integer). */
static inline int8_t comet_quant_w_code(float w, float s, int qmax) {
    if (s == 0.0f)
        return 0;
    float v = __builtin_rintf(w * (1.0f / s));
    if (v != v)
        return 0;
    float lo = (float)(-qmax - 1), hi = (float)qmax;
    return (int8_t)(v < lo ? lo : v > hi ? hi : v);
}

/* One lm_head row of n weights as INT8 (docs/numerics.md "lm_head"): s = amax / 127 rounded
 * up to fp16 (no weight clips), q = comet_quant_w_code(w, s, 127), so codes lie in
 * [-127, 127] and |w - q*s| <= s/2 (an amax too small for amax / 127 in fp32 takes the
 * smallest fp16 scale, 2^-24). A row of zeros gives s = 0 and q = 0; a row holding a
 * non-finite value, or an amax beyond fp16's range times 127, gives q = 0 and a NaN scale.
 * Writes q[n]; returns the fp16 bits of s. */
uint16_t comet_quant_lm_head_row(const float *w, int n, int8_t *q);

/* w [N, K] = q [N, K] * s [N, K/B] (fp16 scales). */
void comet_quant_w_dequant(const int8_t *q, const uint16_t *s, int N, int K, int B, float *w);

#endif
