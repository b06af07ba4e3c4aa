/* qlinear.c — fp32 simulation of a quantized linear (see qlinear.h). */
#include "numerics/qlinear.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "numerics/quant.h"

void comet_qlinear_input(const comet_linear *lin, const float *x, int T, float *xq) {
    int K = lin->n_in;
    if (lin->perm) {
        for (int t = 0; t < T; t++) {
            const float *xr = x + (size_t)t * K;
            float *qr = xq + (size_t)t * K;
            for (int k = 0; k < K; k++)
                qr[k] = xr[lin->perm[k]];
        }
    } else {
        memcpy(xq, x, (size_t)T * K * sizeof *xq);
    }
    if (lin->a_bits < 16)
        comet_quant_act_sim(xq, T, K, lin->block, lin->n8, xq);
}

comet_status comet_qlinear_sim(const comet_linear *lin, const float *x, int T, float *y) {
    COMET_ASSERT(lin->fmt == COMET_WFMT_QSIM && lin->w);
    int K = lin->n_in, N = lin->n_out;
    float *xq = malloc((size_t)T * K * sizeof *xq);
    if (!xq)
        return comet_set_error(COMET_ERR_NOMEM, "linear: out of memory for a %dx%d activation", T,
                               K);
    comet_qlinear_input(lin, x, T, xq);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, xq, K, lin->w, K, 0.0f, y,
                N);
    free(xq);
    return COMET_OK;
}
