/* ref_gemm_w4ax.c — scalar reference of the W4Ax GEMM (see ref_gemm_w4ax.h). Written for
 * clarity, not speed: it is the oracle every fast path is compared with. */
#include "backend/cpu/ref_gemm_w4ax.h"

#include <math.h>
#include <string.h>

#include "numerics/w4_plain.h"

float comet_ref_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

comet_status comet_ref_gemm_w4ax(int M, int N, int K, int B, int n8, const uint8_t *qw,
                                 const uint16_t *sw, const int8_t *qa, const float *sa, float *y,
                                 int32_t *bsum) {
    if (M < 1 || N < 1 || B < 2 || B % 2 || K < B || K % B || n8 < 0 || n8 > K / B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "ref_gemm_w4ax: bad shape M=%d N=%d K=%d B=%d n8=%d; need M,N >= 1, "
                               "K a multiple of an even B, 0 <= n8 <= K/B",
                               M, N, K, B, n8);
    const int nb = K / B;
    for (int t = 0; t < M; t++)
        for (int k = n8 * B; k < K; k++)
            if (qa[(size_t)t * K + k] < -8 || qa[(size_t)t * K + k] > 7)
                return comet_set_error(COMET_ERR_INVALID_ARG,
                                       "ref_gemm_w4ax: qa[%d, %d] = %d lies in an INT4 block but "
                                       "is outside [-8, 7]",
                                       t, k, qa[(size_t)t * K + k]);
    for (int t = 0; t < M; t++) {
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int32_t s = 0;
                for (int k = b * B; k < (b + 1) * B; k++)
                    s += (int32_t)qa[(size_t)t * K + k] * comet_w4_plain_get(qw, K, n, k);
                if (bsum)
                    bsum[((size_t)t * N + n) * nb + b] = s;
                float scale = sa[(size_t)t * nb + b] * comet_ref_f16_to_f32(sw[(size_t)n * nb + b]);
                acc = fmaf((float)s, scale, acc); /* one rounding, on every compiler */
            }
            if (y)
                y[(size_t)t * N + n] = acc;
        }
    }
    return COMET_OK;
}
