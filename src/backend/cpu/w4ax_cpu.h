/* w4ax_cpu.h — the CPU's W4Ax GEMM on integers (docs/numerics.md "The W4Ax GEMM"):
 *
 *   y[t, n] = sum_b fma-accumulated (float)S[t, n, b] * (sa[t, b] * sw[n, b]), b increasing
 *   S[t, n, b] = sum_{k in block b} qa[t, k] * qw[n, k]                  (exact, int32)
 *
 * Weights stay INT4 codes with fp16 scales in a layout made for streaming them once per
 * decode step (comet_w4ax_cpu below); activations are int8 codes [M, K] with fp32 block
 * scales [M, K/B], as the quantizing step ops write them. The int32 block sums come from
 * integer dot products: AVX2 vpmaddubsw / vpmaddwd, AVX-VNNI or AVX-512-VNNI vpdpbusd
 * (chosen at run time from cpuid), or a scalar loop; the fp32 outer sum is the oracle's
 * (backend/cpu/ref_gemm_w4ax.h), so y equals comet_ref_gemm_w4ax bit for bit on every path,
 * whatever the thread count. This file does not quantize activations (numerics/quant.h does).
 */
#ifndef COMET_BACKEND_CPU_W4AX_CPU_H
#define COMET_BACKEND_CPU_W4AX_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"
#include "core/threads.h"

/* Instruction sets of the integer dot products. Append-only. */
typedef enum comet_w4ax_isa {
    COMET_W4AX_ISA_AUTO = 0,    /* the best one the CPU has (comet_w4ax_cpu_isa_best) */
    COMET_W4AX_ISA_SCALAR,      /* plain C, any CPU */
    COMET_W4AX_ISA_AVX2,        /* vpmaddubsw + vpmaddwd (AVX2, FMA, F16C) */
    COMET_W4AX_ISA_AVXVNNI,     /* VEX vpdpbusd on 256-bit vectors (AVX-VNNI) */
    COMET_W4AX_ISA_AVX512VNNI,  /* EVEX vpdpbusd on 256-bit vectors (AVX-512 VNNI + VL) */
    COMET_W4AX_ISA_COUNT
} comet_w4ax_isa;

/* 1 when this build and this CPU (and OS) run `isa`; AUTO and SCALAR always do. */
int comet_w4ax_cpu_isa_supported(comet_w4ax_isa isa);
/* The fastest supported instruction set (never AUTO). */
comet_w4ax_isa comet_w4ax_cpu_isa_best(void);
/* "scalar", "avx2", "avx-vnni", "avx512-vnni", "auto"; NULL outside the enum. */
const char *comet_w4ax_cpu_isa_name(comet_w4ax_isa isa);

/* Rows multiplied together: output channels are packed in groups of this many. */
#define COMET_W4AX_CPU_ROWS 8

/* INT4 weights W[N, K] for the CPU GEMM. The codes stay in the plain layout of
 * numerics/w4_plain.h, borrowed, not copied (the model's own array: no second copy of the
 * weights in memory): 8 consecutive rows (an output-channel group) are multiplied together,
 * and a decode step reads the matrix front to back once. In a row, each 64 channels take 32
 * bytes whose low nibbles hold the even channels and high nibbles the odd ones, so the
 * GEMM lines two 32-byte vectors of activation codes, even and odd channels, up with them
 * (the activation codes are split so once per call); a nibble XOR 8 is code + 8 (unsigned,
 * in [0, 15]), and the sum with the offset codes is corrected by 8 * sum(qa) per token and
 * block, exactly. The last group, when N is not a multiple of 8, is copied into `tail` with
 * code-0 rows. Scales: fp16 bits regrouped as [n_pad / 8][K / B][8], scale 0 past N. */
typedef struct comet_w4ax_cpu {
    int N, K, B, n_pad;     /* n_pad: N rounded up to 8 */
    const uint8_t *qw;      /* [N, K/2] plain codes, borrowed */
    uint8_t *tail;          /* [8, K/2] the last group padded with code 0, owned; NULL when
                             * N % 8 == 0 */
    uint16_t *sw;           /* [n_pad / 8][K / B][8] fp16 bits, owned */
} comet_w4ax_cpu;

/* Make *w for plain weights (numerics/w4_plain.h: qw_plain [N, K/2] codes, borrowed: they
 * must outlive w; sw_plain [N, K/B] fp16 scale bits, copied). Its own arrays are released by
 * comet_w4ax_cpu_free; *w is zeroed first, so it may be freed after a failure too. Returns
 * COMET_OK; COMET_ERR_INVALID_ARG (the checks of backend/w4ax_check.h: N < 1, K not a
 * positive multiple of 64, B not 64 or 128, K % B != 0, N or K above COMET_W4AX_MAX_DIM, a
 * NULL pointer) with the problem named; or COMET_ERR_NOMEM. */
comet_status comet_w4ax_cpu_pack(int N, int K, int B, const uint8_t *qw_plain,
                                 const uint16_t *sw_plain, comet_w4ax_cpu *w);

/* Release w's own arrays (w itself and the borrowed codes are the caller's); NULL or an
 * empty w is a no-op. */
void comet_w4ax_cpu_free(comet_w4ax_cpu *w);

/* Bytes the weight reads per use (codes and scales). */
size_t comet_w4ax_cpu_bytes(const comet_w4ax_cpu *w);

/* y_i [M, N_i] = the GEMM of weight ws[i] (i < n_w, every one with the same K and B) applied
 * to the same activation: qa [M, K] int8 codes (blocks 0..n8-1 INT8, the rest INT4 codes in
 * [-8, 7]), sa [M, K/B] fp32 scales (used as given: an inf or NaN propagates into the
 * outputs it touches). One parallel_for on tp (NULL: the calling thread) over chunks of
 * output channels of all the weights and tiles of tokens; every output's arithmetic is the
 * same however the work is split. isa AUTO takes the best; an unsupported one is refused. bsum (optional, tests; n_w must then be 1):
 * [M, N, K/B] int32 block sums S. All host memory, the caller's; y fully written.
 * Allocates a [M, K] copy of the codes in the weights' channel order per call.
 * Returns COMET_OK; COMET_ERR_INVALID_ARG with the problem named (n_w outside [1, 7], bsum
 * with n_w > 1, a NULL pointer, an empty weight, weights of different K or B, M outside
 * [1, COMET_W4AX_MAX_DIM], n8 outside [0, K/B], an INT4 block holding a code outside
 * [-8, 7], an unsupported isa), checked once per call before any work; or COMET_ERR_NOMEM. */
comet_status comet_w4ax_cpu_gemm(comet_threadpool *tp, comet_w4ax_isa isa, int n_w,
                                 const comet_w4ax_cpu *const *ws, int M, int n8, const int8_t *qa,
                                 const float *sa, float *const *ys, int32_t *bsum);

#endif
