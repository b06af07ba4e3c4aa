/* gptq.c — GPTQ weight quantization (Frantar et al., "GPTQ: Accurate Post-Training
 * Quantization for Generative Pre-trained Transformers", 2022, Algorithm 1) for
 * comet's per-output-channel per-block INT4/INT8 weights.
 *
 * H = XᵀX of the calibration inputs (the factor 2 and the 1/n of the paper cancel in the
 * update), damped; the inverse's upper Cholesky factor U (H⁻¹ = UᵀU) comes from LAPACKE
 * (dpotrf, dpotri, dpotrf). Columns are quantized left to right in the permuted channel
 * order, each one's error spread over the not-yet-quantized columns; updates outside
 * the current batch of columns are deferred and applied as one SGEMM ("lazy batch").
 * Block scales are chosen when a block's first column is reached, from the weights as
 * updated by then, by the clipping search weighted with GPTQ's per-column loss 1/U_ii². */
#include <cblas.h>
#include <lapacke.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

/* Upper Cholesky factor of the inverse of the damped H, as fp32 [K, K] (upper triangle
 * used). Returns 0 on success, the LAPACK info otherwise. */
static int inverse_cholesky(const float *xtx, int K, double damp, double *work, float *u) {
    double mean_diag = 0.0;
    for (int i = 0; i < K; i++)
        mean_diag += xtx[(size_t)i * K + i];
    mean_diag /= K;
    if (mean_diag <= 0.0)
        mean_diag = 1.0;
    for (size_t i = 0; i < (size_t)K * K; i++)
        work[i] = xtx[i];
    for (int i = 0; i < K; i++) {
        double *d = &work[(size_t)i * K + i];
        if (*d == 0.0)
            *d = 1.0;
        *d += damp * mean_diag;
    }
    int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', K, work, K);
    if (!info)
        info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'U', K, work, K);
    if (!info)
        info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', K, work, K);
    if (info)
        return info;
    for (int i = 0; i < K; i++)
        for (int j = 0; j < K; j++)
            u[(size_t)i * K + j] = j >= i ? (float)work[(size_t)i * K + j] : 0.0f;
    return 0;
}

comet_status comet_quant_w_gptq(const float *w, int N, int K, const float *xtx, int B, int bits,
                                float damp, int clip_search, int8_t *q, uint16_t *s) {
    if (N <= 0 || K <= 0 || B <= 0 || K % B || (bits != 4 && bits != 8) || !(damp >= 0.0f))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gptq: bad arguments N=%d K=%d block=%d bits=%d damp=%g", N, K, B,
                               bits, (double)damp);
    int qmax = bits == 4 ? 7 : 127, nb = K / B;
    int bs = B >= 128 ? B : (128 / B) * B;
    float *W = malloc((size_t)N * K * sizeof *W);
    float *U = malloc((size_t)K * K * sizeof *U);
    double *work = malloc((size_t)K * K * sizeof *work);
    float *E = malloc((size_t)N * bs * sizeof *E), *hw = malloc((size_t)B * sizeof *hw);
    if (!W || !U || !work || !E || !hw) {
        free(W), free(U), free(work), free(E), free(hw);
        return comet_set_error(COMET_ERR_NOMEM, "gptq: out of memory for a %dx%d layer", N, K);
    }
    int info = -1;
    double d = damp > 0.0f ? damp : 1e-6;
    for (int attempt = 0; attempt < 4 && info; attempt++, d *= 10.0)
        info = inverse_cholesky(xtx, K, d, work, U);
    free(work);
    if (info) {
        free(W), free(U), free(E), free(hw);
        return comet_set_error(COMET_ERR_INTERNAL,
                               "gptq: the calibration Hessian (%dx%d) is not positive definite "
                               "even with damping %g (LAPACK info %d); more calibration data "
                               "or --wmethod rtn would work",
                               K, K, d / 10.0, info);
    }
    memcpy(W, w, (size_t)N * K * sizeof *W);
    for (int i1 = 0; i1 < K; i1 += bs) {
        int i2 = i1 + bs < K ? i1 + bs : K;
        for (int i = i1; i < i2; i++) {
            if (i % B == 0) {
                int b = i / B;
                for (int j = 0; j < B; j++) { /* GPTQ's loss of column i+j: err² / U_jj² */
                    float dj = U[(size_t)(i + j) * K + i + j];
                    hw[j] = 1.0f / (dj * dj);
                }
                for (int n = 0; n < N; n++) {
                    s[(size_t)n * nb + b] = comet_quant_w_block_scale_weighted(
                        W + (size_t)n * K + i, hw, B, qmax, clip_search);
                    comet_status cs = comet_quant_w_scale_check(
                        s[(size_t)n * nb + b], W + (size_t)n * K + i, B, qmax, n, b, "gptq");
                    if (cs < 0) {
                        free(W), free(U), free(E), free(hw);
                        return cs;
                    }
                }
            }
            const float *urow = U + (size_t)i * K;
            float dii = urow[i];
            for (int n = 0; n < N; n++) {
                float *wr = W + (size_t)n * K;
                float sc = comet_quant_f16_value(s[(size_t)n * nb + i / B]);
                int8_t c = comet_quant_w_code(wr[i], sc, qmax);
                q[(size_t)n * K + i] = c;
                float err = (wr[i] - (float)c * sc) / dii;
                E[(size_t)n * bs + (i - i1)] = err;
                for (int j = i + 1; j < i2; j++)
                    wr[j] -= err * urow[j];
            }
        }
        if (i2 < K)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K - i2, i2 - i1, -1.0f, E, bs,
                        U + (size_t)i1 * K + i2, K, 1.0f, W + i2, K);
    }
    free(W), free(U), free(E), free(hw);
    return COMET_OK;
}
