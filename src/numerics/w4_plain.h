/* w4_plain.h — the plain INT4 weight layout shared by the quantizer and every backend.
 *
 * Codes of W[N, K] (n output channel, k input channel, after the input permutation) are
 * stored row-major as N rows of K/2 bytes: element k of row n lives in byte n*K/2 + k/2,
 * the low nibble holds even k and the high nibble odd k, each a 4-bit two's complement
 * value in [-8, 7]. Scales are fp16, one per (n, block b): sw[n * (K/B) + b] (docs/numerics.md
 * "Weights"). Backends repack this layout into their own (tested by round trip); this
 * header holds only the accessors, so it is usable from C and CUDA alike.
 */
#ifndef COMET_NUMERICS_W4_PLAIN_H
#define COMET_NUMERICS_W4_PLAIN_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of the plain codes of an [N, K] INT4 matrix (K even). */
static inline size_t comet_w4_plain_bytes(int N, int K) { return (size_t)N * (size_t)(K / 2); }

/* Code of element (n, k) of a plain [N, K] matrix, in [-8, 7]. */
static inline int comet_w4_plain_get(const uint8_t *codes, int K, int n, int k) {
    uint8_t byte = codes[(size_t)n * (size_t)(K / 2) + (size_t)(k / 2)];
    int nib = (k & 1) ? (byte >> 4) : (byte & 0x0F);
    return nib >= 8 ? nib - 16 : nib;
}

/* Store code v (in [-8, 7]) as element (n, k) of a plain [N, K] matrix. */
static inline void comet_w4_plain_set(uint8_t *codes, int K, int n, int k, int v) {
    uint8_t *p = &codes[(size_t)n * (size_t)(K / 2) + (size_t)(k / 2)];
    uint8_t nib = (uint8_t)(v & 0x0F);
    *p = (k & 1) ? (uint8_t)((*p & 0x0F) | (nib << 4)) : (uint8_t)((*p & 0xF0) | nib);
}

#endif
