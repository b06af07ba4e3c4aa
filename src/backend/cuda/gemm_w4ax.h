/* gemm_w4ax.h — the CUDA W4Ax GEMM (docs/numerics.md "The W4Ax GEMM"), a standalone C API.
 *
 *   y[t, n] = sum_b sa[t, b] * sw[n, b] * S[t, n, b],  S = int32 block sum of qa · qw
 *
 * Weights are INT4 in a CUDA-private packed layout (made from the plain layout of
 * numerics/w4_plain.h by comet_cuda_w4ax_pack, host side, tested by round trip). Activation
 * codes are one int8 byte per element for both INT8 and INT4 blocks: on Hopper both kinds
 * of block run on the INT8 tensor cores at the same rate (docs/hopper.md), so the kernel treats
 * them alike and n8 only selects which blocks the caller promises to hold INT4-range codes.
 * The layout of the packed weights and the kernels are described in docs/gemm.md.
 *
 * Plain C header: no CUDA types; streams travel as void * (a cudaStream_t).
 */
#ifndef COMET_BACKEND_CUDA_GEMM_W4AX_H
#define COMET_BACKEND_CUDA_GEMM_W4AX_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel choice (COMET_W4AX_KERNEL_AUTO picks by M, N, K at run time). */
typedef enum comet_w4ax_kernel {
    COMET_W4AX_KERNEL_AUTO = 0,
    COMET_W4AX_KERNEL_STREAM = 1, /* small M: warps stream weights from global, split-K */
    COMET_W4AX_KERNEL_TILED = 2,  /* larger M: cp.async multi-stage smem tiles, mma.sync */
    COMET_W4AX_KERNEL_WGMMA = 3,  /* M > 8 on sm_90: warp-specialized, TMA producer warp and
                                   * two wgmma consumer warpgroups (128 x 16, 32, 64 or
                                   * 128 tiles, two or three CTAs per SM below 128 tokens,
                                   * split-K reduced in a cluster, stream-K where splits
                                   * leave SMs idle), weights in registers (A), tokens in
                                   * shared memory (B) */
    COMET_W4AX_KERNEL_PIPE = 4,   /* M <= 16 on sm_90 with N/16 at least the SM count, and
                                   * M <= 32 up to twice it (KERNEL_RULES): persistent CTAs
                                   * own items of 1-4 16-row weight tiles over all of K (no
                                   * split-K) that share one copy of the token rows; each
                                   * warp streams its share of K through its own cp.async
                                   * ring in shared memory; any M when forced */
    COMET_W4AX_KERNEL_COUNT
} comet_w4ax_kernel;

/* Largest M, N accepted (2^30): the plans round them up to tile multiples in int. */
#define COMET_CUDA_W4AX_MAX_DIM (1 << 30)
/* Largest K the GEMM accepts (2^20, 18x LLaMA-3-70B's 57344): the kernels split K into ranges
 * s * (K/B) / S in int, which stays below 2^31 up to here (packing accepts up to MAX_DIM). */
#define COMET_CUDA_W4AX_MAX_K (1 << 20)
/* Largest M * N accepted (2^36 outputs, far past any GPU's memory): the plans count output
 * tiles (16 x 8 at the smallest) in int. */
#define COMET_CUDA_W4AX_MAX_OUTPUT ((int64_t)1 << 36)

/* Packed layout (docs/gemm.md): N is padded to Np = roundup(N, 16); K % 64 == 0.
 * Codes: (Np/16) x (K/64) tiles of 512 bytes, tile (nt, kt) at byte (nt*(K/64) + kt)*512;
 * lane l of a warp reads bytes [16l, 16l+16) of a tile and gets its m16n8k32 A fragments
 * for two k32 steps, each nibble pair (low = row g, high = row g+8) expanding to INT8
 * with the x16 trick. Scales: fp16 [K/B, Np] (block-major), padded rows are 0. */
size_t comet_cuda_w4ax_packed_qw_bytes(int N, int K);        /* 0 for shapes pack refuses */
size_t comet_cuda_w4ax_packed_sw_bytes(int N, int K, int B); /* likewise */

/* Host-side repacking. qw_plain [N, K/2] and sw_plain [N, K/B] fp16 bits in, qw_packed
 * (packed_qw_bytes) and sw_packed (packed_sw_bytes) out; caller-owned host buffers.
 * Returns COMET_ERR_INVALID_ARG unless 1 <= N, K <= COMET_CUDA_W4AX_MAX_DIM, K % 64 == 0,
 * B in {64, 128}, K % B == 0. */
comet_status comet_cuda_w4ax_pack(int N, int K, int B, const uint8_t *qw_plain,
                                  const uint16_t *sw_plain, uint8_t *qw_packed,
                                  uint16_t *sw_packed);

/* Inverse of comet_cuda_w4ax_pack (for the round-trip test and debugging). */
comet_status comet_cuda_w4ax_unpack(int N, int K, int B, const uint8_t *qw_packed,
                                    const uint16_t *sw_packed, uint8_t *qw_plain,
                                    uint16_t *sw_plain);

/* One GEMM call. Pointers are device memory owned by the caller. Shape limits:
 * COMET_CUDA_W4AX_MAX_DIM for M and N, COMET_CUDA_W4AX_MAX_K for K,
 * COMET_CUDA_W4AX_MAX_OUTPUT for M * N. */
typedef struct comet_cuda_w4ax_gemm {
    int M, N, K, B, n8; /* M >= 1 tokens, N >= 1, K % 64 == 0, B in {64,128}, 0<=n8<=K/B */
    const uint8_t *qw;  /* packed codes, comet_cuda_w4ax_packed_qw_bytes(N, K), 16-byte aligned */
    const uint16_t *sw; /* packed fp16 scales [K/B, roundup(N,16)], 16-byte aligned */
    const int8_t *qa;   /* [M, K] activation codes, 16-byte aligned */
    const float *sa;    /* [M, K/B] fp32 activation scales */
    float *y;           /* [M, N] fp32 output, or NULL (or unused: y_parts) */
    uint16_t *y_f16;    /* [M, N] fp16 output (bits), or NULL; at least one of y, y_f16 */
    int32_t *bsum;      /* tests: [M, N, K/B] int32 block sums written from the very
                          * accumulators the kernel scales, or NULL. Only a build of
                          * gemm_w4ax.cu with COMET_W4AX_TEST_INSTANCES (test_gemm_w4ax_cuda's)
                          * has the kernels that write them; elsewhere a call with bsum is
                          * refused with COMET_ERR_UNSUPPORTED */
    void *workspace;    /* tile counters + split-K / stream-K partials, or NULL when none
                          * is needed; zero-filled once by the caller when allocated (the
                          * kernels leave the counters at zero again). Shareable by calls
                          * made one after another on ONE stream: the counters occupy the
                          * same first 256 KB in every plan (a plan with more than 65536
                          * tiles uses a larger region, which the call zeroes first), so
                          * no call's partials land on another's counters. Calls that may
                          * run at the same time (other streams, other threads) need
                          * workspaces of their own. */
    size_t workspace_bytes;
    comet_w4ax_kernel kernel; /* AUTO in production; tests force each kernel */
    int splits;               /* 0 = automatic split-K; tests force values */
    int tile_tokens;          /* wgmma kernel: tokens per CTA tile, 0 = automatic (16 for
                               * M <= 16 with K >= 8192, else 32 for M <= 32, 64 for M <= 64,
                               * else 128), or 16 / 32 / 64 / 128 (tests force each) */
    int pipe_tiles;           /* pipe kernel: 16-row weight tiles per work item, which share one
                               * copy of the item's token rows; 0 = automatic, 1-4 forced */
    int pdl;                  /* 1 = programmatic dependent launch (docs/gemm.md): the kernel
                               * may start while the previous kernel of the stream still runs,
                               * once every CTA of that kernel has begun, and reads qw and sw --
                               * nothing else -- before that kernel has finished; activations,
                               * outputs and workspace wait for it. The caller guarantees that
                               * no kernel that may still be running (the previous one, or one
                               * before it that also started early) writes qw or sw: weights
                               * loaded before the stream's work. Applied on sm_90+ GPUs running
                               * this file's sm_90 code; elsewhere (older GPUs, or a "90a;80"
                               * build on a newer GPU, which runs the JIT-compiled sm_80 code)
                               * the call is a plain launch. The plan does not depend on pdl
                               * (the kernels' arithmetic is the same with and without it);
                               * size the workspace with the same struct all
                               * the same. A plan that zeroes a large
                               * counter region (> 65536 tiles) waits fully behind that
                               * memset. It pays in CUDA graphs and back-to-back launches after
                               * kernels that let dependents launch early
                               * (griddepcontrol.launch_dependents). Every kernel here does so
                               * at its start, pdl or not: a caller's kernel launched after one
                               * of them with the attribute must itself wait before reading y
                               * or writing qa, sa, y or the workspace. 0 = plain stream order. */
    int y_parts;              /* 0 = the fp32 output is y. 2 or 3 = it is split by columns
                               * (a stacked GEMM's roles: q, k, v or gate, up) into
                               * y_part[i] [M, y_col0[i + 1] - y_col0[i]], columns y_col0[i] ..
                               * y_col0[i + 1] - 1 of each token row, written where the kernels
                               * would write y (no copy after the GEMM); y is ignored and y_f16
                               * must be NULL. 0 = y_col0[0] < y_col0[1] < ... < y_col0[y_parts]
                               * = N, each a multiple of 4; each y_part[i] 16-byte aligned device
                               * memory, or NULL to drop those columns (at least one non-NULL) */
    int y_col0[4];
    float *y_part[3];
    int batch_invariant;      /* 1 = a token row's outputs do not depend on M, bit for bit: with
                               * kernel AUTO and splits 0 the plan takes a split count fixed by
                               * N, K, B and the device, and the stream (small M), wgmma or
                               * tiled kernel, which give the same bits for the same splits; no
                               * pipe kernel, stream-K or persistent tiles. Slower than the
                               * automatic plan (bench/results). 0 = the fastest plan per M. */
} comet_cuda_w4ax_gemm;

/* Workspace bytes that comet_cuda_gemm_w4ax needs for this call's plan on the current
 * device (0 if none; the plan depends on the device's SM count and code). */
size_t comet_cuda_gemm_w4ax_workspace_bytes(const comet_cuda_w4ax_gemm *g);

/* Short text naming the plan chosen for g ("stream MI=2 splits=8 grid=64x1x8"), for
 * benchmarks and logs; storage per thread, overwritten by the thread's next call. */
const char *comet_cuda_gemm_w4ax_plan_name(const comet_cuda_w4ax_gemm *g);

/* Launch the GEMM on `stream` (a cudaStream_t, NULL for the default stream) of the current
 * device. Returns COMET_OK; COMET_ERR_INVALID_ARG for bad shapes/pointers, too small a
 * workspace, or a shape past the launch grid's limits; COMET_ERR_UNSUPPORTED when the GPU or
 * the build cannot run the plan (the wgmma kernel forced without sm_90a code, a plan needing
 * more shared memory than the GPU allows); COMET_ERR_CUDA when the launch fails. Calls can be
 * captured in a CUDA graph (bench_gemm --graph does; plans with more tiles than the fixed
 * 256 KB of workspace counters hold add a memset node). Asynchronous: errors inside the
 * kernel surface at the next synchronizing call. */
comet_status comet_cuda_gemm_w4ax(const comet_cuda_w4ax_gemm *g, void *stream);

#ifdef __cplusplus
}
#endif
#endif
