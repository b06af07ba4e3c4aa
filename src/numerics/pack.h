/* pack.h — whole-matrix packing into and out of the plain INT4 layout of w4_plain.h
 * (codes [N, K/2] bytes row-major, element (n, k) in byte n*K/2 + k/2, low nibble for even
 * k, high nibble for odd k, 4-bit two's complement). */
#ifndef COMET_NUMERICS_PACK_H
#define COMET_NUMERICS_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "numerics/w4_plain.h"

/* Pack q [N, K] codes in [-8, 7] (one per int8) into packed [N, K/2] (K even). */
void comet_w4_pack(const int8_t *q, int N, int K, uint8_t *packed);

/* Unpack packed [N, K/2] into q [N, K], sign-extending each nibble. */
void comet_w4_unpack(const uint8_t *packed, int N, int K, int8_t *q);

#endif
