/* w4_plain.h — the plain INT4 weight layout shared by the checkpoint, the CPU backend and
 * as the reference for every backend's private packed layout (NUMERICS.md "The W4Ax GEMM").
 *
 * codes [N, K/2] bytes, row-major: element (n, k) is in byte n*K/2 + k/2, the low nibble
 * for even k and the high nibble for odd k, as 4-bit two's complement (-8..7).
 * K must be even. */
#ifndef COMET_QUANT_W4_PLAIN_H
#define COMET_QUANT_W4_PLAIN_H

#include <stddef.h>
#include <stdint.h>

/* Pack q [N, K] codes in [-8, 7] (one per int8) into packed [N, K/2]. */
void comet_w4_pack(const int8_t *q, int N, int K, uint8_t *packed);

/* Unpack packed [N, K/2] into q [N, K], sign-extending each nibble. */
void comet_w4_unpack(const uint8_t *packed, int N, int K, int8_t *q);

/* The code of element (n, k) of a packed [N, K/2] array. */
static inline int8_t comet_w4_get(const uint8_t *packed, int K, int n, int k) {
    uint8_t byte = packed[(size_t)n * (K / 2) + k / 2];
    int v = k & 1 ? byte >> 4 : byte & 0xF;
    return (int8_t)(v >= 8 ? v - 16 : v);
}

#endif
