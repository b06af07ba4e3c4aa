/* cpu_gemm_w4ax.c — the W4Ax GEMM on the CPU (cpu_gemm_w4ax.h): integer code on a thread
 * pool, bit for bit the scalar oracle (ref_gemm_w4ax.c), tested against it by
 * tests/test_ops.c.
 *
 * One item = a tile of W4AX_TT tokens x a chunk of W4AX_CH output channels; items are
 * claimed by the pool's threads, token tiles outer so that concurrent items share the
 * activation tile. Inside an item, W4AX_NR weight rows go together: for each block b the
 * rows' B codes are unpacked once to int16 (1 KiB, stays in L1), then the tile's tokens, two
 * at a time (each weight load serves both), take their int32 block sums against the NR rows
 * in one loop (int8 codes widened to int16; gcc turns it into pmaddwd, no intrinsics; 2-core
 * Xeon, N = K = 4096: M = 64 in 25 ms, 44 GMAC/s, M = 1 in ~1.5 ms, where the unpacking
 * dominates; the oracle takes 1.8 s and 34 ms) and promotes them as the oracle does,
 * acc += (float)S * (sa * sw) with b increasing, so the result is bit for bit the oracle's
 * (the int32 sums are exact in any order; the fp32 expression and order are the same). All
 * scratch is on the stack; no allocation per call. */
#include "backend/cpu/cpu_gemm_w4ax.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ref_gemm_w4ax.h"
#include "backend/w4ax_check.h"
#include "numerics/w4_plain.h"

#define W4AX_NR 4  /* weight rows multiplied together */
#define W4AX_TT 32 /* tokens per item */
#define W4AX_CH 64 /* output channels per item (a multiple of W4AX_NR) */

typedef struct {
    const comet_cpu_w4ax_weight *w;
    const int8_t *qa;
    const float *sa;
    float *y;
    int M, n_ch; /* n_ch: channel chunks */
} w4ax_job;

/* dst[k] = code k of a plain row segment of 64 codes (32 bytes), as int16. */
static inline void w4_unpack64(const uint8_t *restrict src, int16_t *restrict dst) {
    for (int j = 0; j < 32; j++) {
        dst[2 * j] = (int16_t)((int8_t)(uint8_t)(src[j] << 4) >> 4);
        dst[2 * j + 1] = (int16_t)((int8_t)src[j] >> 4);
    }
}

/* s[r] = sum_k a[k] * w_r[k] over n64 * 64 codes, exact in int32 (|a| <= 128, |w| <= 8).
 * Kept apart from w4ax_dot4x2 for a lone token: passing the token twice to that one made
 * M = 1, N = K = 4096 34 % slower (1.36 -> 1.83 ms on 2 threads). */
static inline void w4ax_dot4(const int8_t *restrict a, const int16_t *restrict w0,
                             const int16_t *restrict w1, const int16_t *restrict w2,
                             const int16_t *restrict w3, int n64, int32_t s[W4AX_NR]) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int c = 0; c < n64; c++, a += 64, w0 += 64, w1 += 64, w2 += 64, w3 += 64)
        for (int k = 0; k < 64; k++) {
            int16_t x = a[k];
            s0 += x * w0[k];
            s1 += x * w1[k];
            s2 += x * w2[k];
            s3 += x * w3[k];
        }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* The same for two tokens a, b (s[0..3] for a, s[4..7] for b): each weight load serves both. */
static inline void w4ax_dot4x2(const int8_t *restrict a, const int8_t *restrict b,
                               const int16_t *restrict w0, const int16_t *restrict w1,
                               const int16_t *restrict w2, const int16_t *restrict w3, int n64,
                               int32_t s[2 * W4AX_NR]) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, u0 = 0, u1 = 0, u2 = 0, u3 = 0;
    for (int c = 0; c < n64; c++, a += 64, b += 64, w0 += 64, w1 += 64, w2 += 64, w3 += 64)
        for (int k = 0; k < 64; k++) {
            int16_t x = a[k], z = b[k];
            s0 += x * w0[k];
            s1 += x * w1[k];
            s2 += x * w2[k];
            s3 += x * w3[k];
            u0 += z * w0[k];
            u1 += z * w1[k];
            u2 += z * w2[k];
            u3 += z * w3[k];
        }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3, s[4] = u0, s[5] = u1, s[6] = u2, s[7] = u3;
}

static void w4ax_task(void *ctx, int item, int tid) {
    const w4ax_job *j = ctx;
    const comet_cpu_w4ax_weight *w = j->w;
    const int N = w->N, K = w->K, B = w->B, nb = K / B, n64 = B / 64;
    const int t0 = item / j->n_ch * W4AX_TT, n_tok = j->M - t0 < W4AX_TT ? j->M - t0 : W4AX_TT;
    const int c0 = item % j->n_ch * W4AX_CH, c1 = N - c0 < W4AX_CH ? N : c0 + W4AX_CH;
    int16_t wrow[W4AX_NR][128];
    float acc[W4AX_TT][W4AX_NR];
    for (int n0 = c0; n0 < c1; n0 += W4AX_NR) {
        int nr = c1 - n0 < W4AX_NR ? c1 - n0 : W4AX_NR; /* rows past c1 repeat row n0 */
        memset(acc, 0, sizeof acc);
        for (int b = 0; b < nb; b++) {
            float swb[W4AX_NR];
            for (int r = 0; r < W4AX_NR; r++) {
                int n = r < nr ? n0 + r : n0;
                const uint8_t *src = w->qw + (size_t)n * (K / 2) + (size_t)b * (B / 2);
                for (int c = 0; c < n64; c++)
                    w4_unpack64(src + 32 * c, wrow[r] + 64 * c);
                swb[r] = w->sw_f32[(size_t)n * nb + b];
            }
            for (int t = 0; t < n_tok; t += 2) {
                const int8_t *a = j->qa + (size_t)(t0 + t) * K + (size_t)b * B;
                int32_t s[2 * W4AX_NR];
                int n_t = n_tok - t < 2 ? 1 : 2;
                if (n_t == 2)
                    w4ax_dot4x2(a, a + K, wrow[0], wrow[1], wrow[2], wrow[3], n64, s);
                else
                    w4ax_dot4(a, wrow[0], wrow[1], wrow[2], wrow[3], n64, s);
                for (int i = 0; i < n_t; i++) {
                    const float sat = j->sa[(size_t)(t0 + t + i) * nb + b];
                    for (int r = 0; r < W4AX_NR; r++) {
                        float scale = sat * swb[r]; /* the oracle's expression, term for term */
                        acc[t + i][r] += (float)s[i * W4AX_NR + r] * scale;
                    }
                }
            }
        }
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < nr; r++)
                j->y[(size_t)(t0 + t) * N + n0 + r] = acc[t][r];
    }
}

comet_status comet_cpu_w4ax_load(int N, int K, int B, const uint8_t *qw_plain,
                                 const uint16_t *sw_plain, comet_cpu_w4ax_weight **out) {
    if (out)
        *out = NULL;
    COMET_TRY(comet_w4ax_check_load("comet_cpu_w4ax_load", N, K, B, qw_plain, sw_plain, out));
    size_t qw_bytes = comet_w4_plain_bytes(N, K), n_scales = (size_t)N * (size_t)(K / B);
    comet_cpu_w4ax_weight *w = calloc(1, sizeof *w);
    if (w) {
        w->qw = malloc(qw_bytes);
        w->sw = malloc(n_scales * sizeof *w->sw);
        w->sw_f32 = malloc(n_scales * sizeof *w->sw_f32);
    }
    if (!w || !w->qw || !w->sw || !w->sw_f32) {
        comet_cpu_w4ax_free(w);
        return comet_set_error(COMET_ERR_NOMEM,
                               "comet_cpu_w4ax_load: out of memory for an N=%d K=%d weight "
                               "(%zu MiB)",
                               N, K, (qw_bytes + n_scales * 6) >> 20);
    }
    w->N = N, w->K = K, w->B = B;
    memcpy(w->qw, qw_plain, qw_bytes);
    memcpy(w->sw, sw_plain, n_scales * sizeof *w->sw);
    for (size_t i = 0; i < n_scales; i++)
        w->sw_f32[i] = comet_ref_f16_to_f32(sw_plain[i]);
    *out = w;
    return COMET_OK;
}

void comet_cpu_w4ax_free(comet_cpu_w4ax_weight *w) {
    if (!w)
        return;
    free(w->qw);
    free(w->sw);
    free(w->sw_f32);
    free(w);
}

/* comet_w4ax_check_gemm, then every code of the INT4 blocks n8..K/B-1 of qa in [-8, 7]. */
static comet_status check_gemm(const comet_cpu_w4ax_weight *w, int M, int n8, const int8_t *qa,
                               const float *sa, const float *y) {
    COMET_TRY(comet_w4ax_check_gemm("comet_cpu_gemm_w4ax", w, w ? w->K : 0, w ? w->B : 0, M, n8, qa,
                                    sa, y));
    const int K = w->K;
    for (int t = 0; t < M; t++) {
        const int8_t *row = qa + (size_t)t * K;
        int bad = 0;
        for (int k = n8 * w->B; k < K; k++) /* no early exit: the loop vectorizes */
            bad |= row[k] < -8 || row[k] > 7;
        if (bad)
            for (int k = n8 * w->B; k < K; k++)
                if (row[k] < -8 || row[k] > 7)
                    return comet_set_error(COMET_ERR_INVALID_ARG,
                                           "comet_cpu_gemm_w4ax: qa[%d, %d] = %d lies in INT4 "
                                           "block %d (n8 = %d) but is outside [-8, 7]",
                                           t, k, row[k], k / w->B, n8);
    }
    return COMET_OK;
}

comet_status comet_cpu_gemm_w4ax(comet_threadpool *tp, const comet_cpu_w4ax_weight *w, int M,
                                 int n8, const int8_t *qa, const float *sa, float *y) {
    COMET_TRY(check_gemm(w, M, n8, qa, sa, y));
    COMET_ASSERT(w->B <= 128 && w->B % 64 == 0); /* comet_cpu_w4ax_load checked it */
    w4ax_job j = {w, qa, sa, y, M, (w->N + W4AX_CH - 1) / W4AX_CH};
    int n_tiles = (M + W4AX_TT - 1) / W4AX_TT;
    comet_parallel_for(tp, n_tiles * j.n_ch, w4ax_task, &j);
    return COMET_OK;
}
