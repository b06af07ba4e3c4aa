/* w4ax_check.c — the W4Ax GEMM argument checks (w4ax_check.h). Depends on core/status.c
 * only. */
#include "backend/w4ax_check.h"

comet_status comet_w4ax_check_load(const char *who, int N, int K, int B, const void *qw_plain,
                                   const void *sw_plain, const void *out) {
    if (!qw_plain || !sw_plain || !out)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: qw_plain, sw_plain and out must be non-NULL", who);
    if (N < 1 || N > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: N = %d output channels; need 1 <= N <= %d", who, N,
                               COMET_W4AX_MAX_DIM);
    if (K < 64 || K % 64 || K > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: K = %d input channels; need a positive multiple of 64, at "
                               "most %d",
                               who, K, COMET_W4AX_MAX_DIM);
    if (B != 64 && B != 128)
        return comet_set_error(COMET_ERR_INVALID_ARG, "%s: block size B = %d; need 64 or 128", who,
                               B);
    if (K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: K = %d is not a multiple of the block size B = %d", who, K, B);
    return COMET_OK;
}

comet_status comet_w4ax_check_gemm(const char *who, const void *w, int K, int B, int M, int n8,
                                   const int8_t *qa, const float *sa, const float *y) {
    if (!w || !qa || !sa || !y)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: w, qa, sa and y must be non-NULL (got w=%p qa=%p sa=%p y=%p)",
                               who, w, (const void *)qa, (const void *)sa, (const void *)y);
    if (M < 1 || M > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG, "%s: M = %d tokens; need 1 <= M <= %d", who,
                               M, COMET_W4AX_MAX_DIM);
    if (n8 < 0 || n8 > (B > 0 ? K / B : 0))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: n8 = %d INT8 blocks is outside [0, K/B = %d]", who, n8,
                               B > 0 ? K / B : 0);
    return COMET_OK;
}
