/* gemm_w4ax_pack.c — host-side packing of plain INT4 weights (numerics/w4_plain.h) into the
 * layout the CUDA W4Ax kernels read (see gemm_w4ax.h and docs/gemm.md). Plain C, built with
 * or without CUDA so that the round-trip test runs in CI. */
#include "backend/cuda/gemm_w4ax.h"

#include <string.h>

#include "numerics/w4_plain.h"

static int dims_ok(int N, int K) {
    return N >= 1 && N <= COMET_CUDA_W4AX_MAX_DIM && K >= 64 && K <= COMET_CUDA_W4AX_MAX_DIM &&
           K % 64 == 0;
}

static size_t round16(int n) { return ((size_t)n + 15) / 16 * 16; }

size_t comet_cuda_w4ax_packed_qw_bytes(int N, int K) {
    return dims_ok(N, K) ? round16(N) * (size_t)(K / 2) : 0;
}

size_t comet_cuda_w4ax_packed_sw_bytes(int N, int K, int B) {
    return dims_ok(N, K) && (B == 64 || B == 128) && K % B == 0
               ? (size_t)(K / B) * round16(N) * sizeof(uint16_t)
               : 0;
}

static comet_status check_shape(int N, int K, int B) {
    if (!dims_ok(N, K) || (B != 64 && B != 128) || K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_pack: N=%d K=%d B=%d; need 1 <= N <= %d, K a multiple of 64 "
                               "(at most %d), B 64 or 128 dividing K",
                               N, K, B, COMET_CUDA_W4AX_MAX_DIM, COMET_CUDA_W4AX_MAX_DIM);
    return COMET_OK;
}

/* Byte offset in the packed codes and nibble position (0 low, 1 high) of element (n, k). */
static size_t packed_pos(int K, int n, int k, int *high) {
    int nt = n / 16, r = n % 16, kt = k / 64, kk = k % 64;
    int g = r % 8, step = kk / 32, half = (kk % 32) / 16, tid = (kk % 16) / 4, j = kk % 4;
    int lane = g * 4 + tid, word = step * 2 + half;
    *high = r >= 8;
    return ((size_t)nt * (size_t)(K / 64) + (size_t)kt) * 512 + (size_t)lane * 16 +
           (size_t)word * 4 + (size_t)j;
}

comet_status comet_cuda_w4ax_pack(int N, int K, int B, const uint8_t *qw_plain,
                                  const uint16_t *sw_plain, uint8_t *qw_packed,
                                  uint16_t *sw_packed) {
    COMET_TRY(check_shape(N, K, B));
    const int Np = round16(N), nb = K / B;
    memset(qw_packed, 0, comet_cuda_w4ax_packed_qw_bytes(N, K));
    memset(sw_packed, 0, comet_cuda_w4ax_packed_sw_bytes(N, K, B));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) {
            int high;
            size_t pos = packed_pos(K, n, k, &high);
            uint8_t nib = (uint8_t)(comet_w4_plain_get(qw_plain, K, n, k) & 0x0F);
            qw_packed[pos] |= high ? (uint8_t)(nib << 4) : nib;
        }
        for (int b = 0; b < nb; b++)
            sw_packed[(size_t)b * Np + n] = sw_plain[(size_t)n * nb + b];
    }
    return COMET_OK;
}

comet_status comet_cuda_w4ax_unpack(int N, int K, int B, const uint8_t *qw_packed,
                                    const uint16_t *sw_packed, uint8_t *qw_plain,
                                    uint16_t *sw_plain) {
    COMET_TRY(check_shape(N, K, B));
    const int Np = round16(N), nb = K / B;
    memset(qw_plain, 0, comet_w4_plain_bytes(N, K));
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < K; k++) {
            int high;
            size_t pos = packed_pos(K, n, k, &high);
            int nib = high ? qw_packed[pos] >> 4 : qw_packed[pos] & 0x0F;
            comet_w4_plain_set(qw_plain, K, n, k, nib >= 8 ? nib - 16 : nib);
        }
        for (int b = 0; b < nb; b++)
            sw_plain[(size_t)n * nb + b] = sw_packed[(size_t)b * Np + n];
    }
    return COMET_OK;
}
