/* reorder.c — calibration statistics (per-channel salience, XᵀX) and FMPQ's channel
 * reordering with the INT8 block choice (docs/numerics.md "Choosing INT8 blocks"). */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "quant/quant.h"

void comet_quant_salience_update(float *sal, const float *x, int T, int K) {
    for (int t = 0; t < T; t++) {
        const float *row = x + (size_t)t * K;
        for (int k = 0; k < K; k++) {
            float a = fabsf(row[k]);
            if (a > sal[k])
                sal[k] = a;
        }
    }
}

void comet_quant_xtx_update(float *xtx, const float *x, int T, int K) {
    if (T <= 0)
        return;
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, K, T, 1.0f, x, K, 1.0f, xtx, K);
    /* ssyrk updates the upper triangle only; keep the matrix full and symmetric. */
    for (int i = 0; i < K; i++)
        for (int j = i + 1; j < K; j++)
            xtx[(size_t)j * K + i] = xtx[(size_t)i * K + j];
}

int comet_quant_choose_block(const int *dims, int n) {
    int ok128 = 1, ok64 = 1;
    for (int i = 0; i < n; i++) {
        if (dims[i] <= 0 || dims[i] % 128)
            ok128 = 0;
        if (dims[i] <= 0 || dims[i] % 64)
            ok64 = 0;
    }
    return ok128 ? 128 : ok64 ? 64 : 0;
}

typedef struct {
    float sal;
    int32_t idx;
} sal_entry;

/* Descending salience; equal salience keeps index order, so the sort is deterministic
 * (qsort is not stable; the index is the tie-breaker). NaN sorts last. */
static int cmp_desc(const void *a, const void *b) {
    const sal_entry *x = a, *y = b;
    int xn = isnan(x->sal), yn = isnan(y->sal);
    if (xn != yn)
        return xn - yn;
    if (!xn && x->sal != y->sal)
        return x->sal > y->sal ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

comet_status comet_quant_reorder(const float *sal, int K, int B, float tau, float budget,
                                 int reorder, int32_t *perm, int *n8) {
    if (K <= 0 || B <= 0 || K % B)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "reorder: K = %d is not a positive multiple of the block size %d", K,
                               B);
    if (!(budget >= 0.0f && budget <= 1.0f))
        return comet_set_error(COMET_ERR_INVALID_ARG, "reorder: INT8 budget %g outside [0, 1]",
                               (double)budget);
    sal_entry *e = malloc((size_t)K * sizeof *e);
    float *sorted = malloc((size_t)K * sizeof *sorted);
    if (!e || !sorted) {
        free(e);
        free(sorted);
        return comet_set_error(COMET_ERR_NOMEM, "reorder: out of memory for %d channels", K);
    }
    for (int k = 0; k < K; k++) {
        e[k].sal = sal[k];
        e[k].idx = k;
        sorted[k] = sal[k];
    }
    if (reorder)
        qsort(e, (size_t)K, sizeof *e, cmp_desc);
    for (int k = 0; k < K; k++)
        perm[k] = e[k].idx;

    qsort(sorted, (size_t)K, sizeof *sorted, cmp_float);
    float median = K % 2 ? sorted[K / 2] : 0.5f * (sorted[K / 2 - 1] + sorted[K / 2]);
    float thr = tau * median;
    /* The last position (in perm order) of a channel above the threshold. */
    int last = -1;
    for (int k = 0; k < K; k++)
        if (e[k].sal > thr)
            last = k;
    int need = last < 0 ? 0 : last / B + 1;
    int cap = (int)floor((double)budget * (K / B) + 1e-6);
    *n8 = need < cap ? need : cap;
    free(e);
    free(sorted);
    return COMET_OK;
}
