/* backend.c — backend-independent helpers of the op table: releasing a backend and the
 * argument checks of the W4Ax ops, shared so that every backend refuses the same calls with
 * the same messages. Depends on core/status.c only (the GPU machine's nvcc/gcc build of the
 * CUDA backend, bench/gemm/build.sh, links it without the rest of the library). */
#include "backend/backend.h"

#include <stddef.h>

void comet_backend_free(comet_backend *be) {
    if (be)
        be->ops->destroy(be);
}

comet_status comet_w4ax_check_load(const comet_backend *be, int N, int K, int B,
                                   const uint8_t *qw_plain, const uint16_t *sw_plain,
                                   comet_w4ax_weight **out) {
    const char *name = be->ops->name;
    if (out)
        *out = NULL;
    if (!qw_plain || !sw_plain || !out)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): qw_plain, sw_plain and out must be "
                               "non-NULL", name);
    if (N < 1 || N > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): N = %d output channels; need 1 <= N <= "
                               "%d", name, N, COMET_W4AX_MAX_DIM);
    if (K < 64 || K % 64 || K > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): K = %d input channels; need a positive "
                               "multiple of 64, at most %d", name, K, COMET_W4AX_MAX_DIM);
    if (B != 64 && B != 128)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): block size B = %d; need 64 or 128",
                               name, B);
    if (K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend '%s'): K = %d is not a multiple of the block "
                               "size B = %d", name, K, B);
    return COMET_OK;
}

comet_status comet_w4ax_check_gemm(const comet_backend *be, const comet_w4ax_weight *w, int K,
                                   int B, int M, int n8, const int8_t *qa, const float *sa,
                                   const float *y) {
    const char *name = be->ops->name;
    if (!w || !qa || !sa || !y)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): w, qa, sa and y must be non-NULL "
                               "(got w=%p qa=%p sa=%p y=%p)", name, (const void *)w,
                               (const void *)qa, (const void *)sa, (const void *)y);
    if (M < 1 || M > COMET_W4AX_MAX_DIM)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): M = %d tokens; need 1 <= M <= %d", name,
                               M, COMET_W4AX_MAX_DIM);
    if (n8 < 0 || n8 > (B > 0 ? K / B : 0))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend '%s'): n8 = %d INT8 blocks is outside "
                               "[0, K/B = %d]", name, n8, K / B);
    return COMET_OK;
}
