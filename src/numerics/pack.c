/* pack.c — packing of INT4 codes into the plain layout of w4_plain.h (see pack.h). */
#include "numerics/pack.h"

#include "comet/status.h"

void comet_w4_pack(const int8_t *q, int N, int K, uint8_t *packed) {
    COMET_ASSERT(K % 2 == 0);
    size_t n_bytes = (size_t)N * (K / 2);
    for (size_t i = 0; i < n_bytes; i++) {
        int8_t lo = q[2 * i], hi = q[2 * i + 1];
        COMET_ASSERT(lo >= -8 && lo <= 7 && hi >= -8 && hi <= 7);
        packed[i] = (uint8_t)(((uint8_t)hi & 0xF) << 4 | ((uint8_t)lo & 0xF));
    }
}

void comet_w4_unpack(const uint8_t *packed, int N, int K, int8_t *q) {
    COMET_ASSERT(K % 2 == 0);
    size_t n_bytes = (size_t)N * (K / 2);
    for (size_t i = 0; i < n_bytes; i++) {
        int lo = packed[i] & 0xF, hi = packed[i] >> 4;
        q[2 * i] = (int8_t)(lo >= 8 ? lo - 16 : lo);
        q[2 * i + 1] = (int8_t)(hi >= 8 ? hi - 16 : hi);
    }
}
