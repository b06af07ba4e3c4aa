/* backend.h — the op table: the one seam between the model's layer loop and hardware.
 *
 * The forward pass (src/model/forward.c) is written once as a loop over layers calling
 * these function pointers; the CPU backend (scalar reference + threaded fast paths) and
 * the CUDA backend each fill one table. Tests run every op on two implementations and
 * compare (ARCHITECTURE.md "The op table"). Pointers passed to ops live in the backend's
 * memory space (host for CPU, device for CUDA). Ops return COMET_OK or a negative status
 * (never abort on a runtime failure); shape violations are bugs and assert, except in the
 * W4Ax ops, which check their shapes and pointers and return COMET_ERR_INVALID_ARG (they
 * are the GEMM's public launcher).
 *
 * A backend may leave an op NULL when it does not implement it yet (the CUDA backend has
 * only the W4Ax GEMM so far); comet_forward_init refuses such a backend, naming the op.
 *
 * Shape letters: T tokens in the step, C hidden, F FFN, H/Hkv heads, D head dim, V vocab.
 * Activations are row-major [T, width] fp32.
 */
#ifndef COMET_BACKEND_H
#define COMET_BACKEND_H

#include <stdint.h>

#include "comet/model.h"
#include "model/batch.h"

typedef struct comet_backend comet_backend;

/* W4Ax GEMM weights in one backend's own layout and memory, made by its w4ax_load. Opaque:
 * each backend defines the struct (CPU: src/backend/cpu/cpu_common.h, CUDA:
 * src/backend/cuda/cuda_backend.c). */
typedef struct comet_w4ax_weight comet_w4ax_weight;

/* Largest M, N and K the W4Ax ops accept (2^30): index arithmetic that rounds them up to
 * tile multiples in int cannot overflow. */
#define COMET_W4AX_MAX_DIM (1 << 30)

typedef struct comet_rope_params {
    int head_dim;        /* D (rotary over all D channels, rotate-half / NeoX pairing) */
    float theta;
    comet_rope_scaling scaling;
    float factor, low_freq_factor, high_freq_factor;
    int orig_ctx;
} comet_rope_params;

typedef struct comet_backend_ops {
    const char *name;

    /* x[t, :] = embd[tokens[t], :]. embd [V, C]; x [T, C]. */
    comet_status (*embed)(comet_backend *be, const float *embd, int C, const int32_t *tokens,
                          int T, float *x);

    /* out[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w. x, out [T, C] (may alias). */
    comet_status (*rmsnorm)(comet_backend *be, const float *x, const float *w, int T, int C,
                            float eps, float *out);

    /* y[T, N] = x[T, K] · Wᵀ, W per lin->fmt. */
    comet_status (*linear)(comet_backend *be, const comet_linear *lin, const float *x, int T,
                           float *y);

    /* Rotate q [T, H, D] and k [T, Hkv, D] in place by their positions [T]. */
    comet_status (*rope)(comet_backend *be, const comet_rope_params *rp, const int32_t *positions,
                         int T, float *q, int H, float *k, int Hkv);

    /* Write k, v [T, Hkv, D] of this step into the cache pages of `layer`, at each token's
     * position per the batch's page tables. */
    comet_status (*kv_append)(comet_backend *be, comet_kv_cache *kv, int layer,
                              const comet_batch *b, const float *k, const float *v);

    /* Causal GQA attention for every token of the batch over its sequence's cached
     * positions 0..positions[t] (this step's K/V already appended):
     * out[t, h, :] = softmax(q[t,h,:]·K[h/(H/Hkv)]ᵀ / sqrt(D)) · V. q, out [T, H, D]. */
    comet_status (*attention)(comet_backend *be, const comet_kv_cache *kv, int layer,
                              const comet_batch *b, const float *q, int H, float *out);

    /* out[t, f] = silu(gate[t, f]) * up[t, f]; gate, up, out [T, F] (out may alias gate). */
    comet_status (*silu_mul)(comet_backend *be, const float *gate, const float *up, int T, int F,
                             float *out);

    /* x[T, C] += y[T, C]. */
    comet_status (*residual_add)(comet_backend *be, float *x, const float *y, int T, int C);

    /* logits[r, :] = x[rows[r], :] · lm_headᵀ for r < n_rows. x [T, C]; lm_head [V, C];
     * logits [n_rows, V]. */
    comet_status (*logits)(comet_backend *be, const float *x, const int32_t *rows, int n_rows,
                           const float *lm_head, int C, int V, float *logits);

    /* ---- The W4Ax GEMM (NUMERICS.md "The W4Ax GEMM") ----
     *
     *   y[t, n] = sum_b (float)S[t, n, b] * (sa[t, b] * sw[n, b]),  b = 0, 1, ... K/B - 1
     *   S[t, n, b] = sum_{k in block b} qa[t, k] * qw[n, k]           (exact, int32)
     *
     * N output channels, K input channels (a multiple of 64), B the block size (64 or 128),
     * n8 the number of leading blocks holding INT8 activation codes (blocks n8..K/B-1 hold
     * INT4 codes in [-8, 7]). The int32 block sums are the same on every backend; the fp32
     * outer sum runs over b in increasing order (CPU backends: bit for bit the scalar oracle
     * comet_ref_gemm_w4ax; CUDA: equal up to fp32 rounding of the outer sum).
     *
     * w4ax_load: copy host weights in the plain layout of quant/w4_plain.h — qw_plain
     * [N, K/2] INT4 codes, sw_plain [N, K/B] fp16 scale bits, both borrowed for the call —
     * into the backend's own layout and memory (CPU: a host copy, plain layout; CUDA:
     * comet_cuda_w4ax_pack'ed, in device memory). *out receives a weight owned by the
     * caller, released with w4ax_free of the same backend; it must not outlive the backend.
     * Returns COMET_OK; COMET_ERR_INVALID_ARG (N < 1, K not a positive multiple of 64, B
     * not 64 or 128, K % B != 0, N or K above COMET_W4AX_MAX_DIM, a NULL pointer), with the
     * problem named; COMET_ERR_NOMEM
     * (host or device allocation); COMET_ERR_CUDA (another CUDA failure). *out is NULL on
     * failure. */
    comet_status (*w4ax_load)(comet_backend *be, int N, int K, int B, const uint8_t *qw_plain,
                              const uint16_t *sw_plain, comet_w4ax_weight **out);

    /* Release a weight made by this backend's w4ax_load. NULL is a no-op. CUDA: waits for
     * the backend's stream first, so a GEMM still reading w finishes. */
    void (*w4ax_free)(comet_backend *be, comet_w4ax_weight *w);

    /* y = the GEMM above for M tokens. In the backend's memory space (CUDA: device memory),
     * caller-owned: qa [M, K] int8 activation codes (CUDA: 16-byte aligned), sa [M, K/B]
     * fp32 activation scales, y [M, N] fp32 output (every element written). w's N, K, B
     * are those given to w4ax_load.
     * Scales are used as given: an inf or NaN scale propagates into the outputs it touches
     * (NUMERICS.md has the quantizer produce finite, positive scales).
     * Returns COMET_OK, or COMET_ERR_INVALID_ARG (M < 1 or above COMET_W4AX_MAX_DIM, n8
     * outside [0, K/B], a NULL
     * pointer, w made by another kind of backend; CPU: an INT4 block holding a code outside
     * [-8, 7] — the CUDA backend does not scan qa and multiplies such codes as they are),
     * COMET_ERR_NOMEM / COMET_ERR_CUDA (CUDA: growing the workspace or the launch failed).
     * CPU: synchronous. CUDA: asynchronous on the backend's stream — y is ready, and
     * errors inside the kernel surface, at comet_backend_cuda_sync. */
    comet_status (*gemm_w4ax)(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                              const int8_t *qa, const float *sa, float *y);

    /* Release the backend's private state (be->impl) and be itself. */
    void (*destroy)(comet_backend *be);
} comet_backend_ops;

struct comet_backend {
    const comet_backend_ops *ops;
    int n_threads; /* CPU: worker threads */
    void *impl;    /* backend-private state */
};

/* The CPU backends. `ref` is the scalar single-threaded oracle; the default one uses
 * threads and OpenBLAS. n_threads <= 0 means all cores. comet_backend_cpu_init sets
 * OpenBLAS to one thread, process-wide (it threads around BLAS calls itself): code that
 * wants a threaded BLAS call afterwards sets openblas_set_num_threads() around it.
 * A backend is driven by one thread at a time (ops keep per-thread scratch). */
comet_backend *comet_backend_cpu_ref_init(void);
comet_backend *comet_backend_cpu_init(int n_threads);
/* Release a backend through its ops->destroy. NULL is a no-op. */
void comet_backend_free(comet_backend *be);

/* The CUDA backend on GPU `device` (0-based), with its own non-blocking cudaStream and a
 * GEMM workspace it owns (allocated and zero-filled on first need, grown when a call needs
 * more). Ops run on that stream, which does not wait for the legacy default stream: device
 * inputs written elsewhere (cudaMemcpy, other streams) must be complete before the call.
 * Like the CPU backends it is driven by one thread at a time (its workspace grows without a
 * lock); two threads use two backends. Each op makes `device` current and gives a calling
 * thread that had a CUDA context that context back (a thread with none is left with the
 * backend's device current). w4ax_free waits for the whole device: gemm_w4ax takes
 * the weights of any CUDA backend on the same device, whose streams may still read them.
 * It implements only w4ax_load, w4ax_free, gemm_w4ax and destroy so far; its other ops are
 * NULL (comet_forward_init refuses it). Returns NULL + comet_last_error() when
 * this build has no CUDA (COMET_ERR_UNSUPPORTED), no CUDA device is usable
 * (COMET_ERR_CUDA), `device` is out of range (COMET_ERR_INVALID_ARG) or memory runs out.
 * Always linkable: without CUDA it is a stub that fails. */
comet_backend *comet_backend_cuda_init(int device);

/* Wait for the work queued on a CUDA backend's stream. Returns COMET_OK, COMET_ERR_CUDA
 * with the CUDA error named when a kernel failed, or COMET_ERR_INVALID_ARG when `be` is
 * not a CUDA backend. */
comet_status comet_backend_cuda_sync(comet_backend *be);

/* Argument checks shared by every backend's W4Ax ops (the messages name the backend, the
 * op and the problem). comet_w4ax_check_load: N >= 1, K a positive multiple of 64, B 64 or
 * 128 dividing K, non-NULL pointers. comet_w4ax_check_gemm: w, qa, sa, y non-NULL, M >= 1,
 * 0 <= n8 <= K/B, with N, K, B those of the weight. COMET_OK or COMET_ERR_INVALID_ARG. */
comet_status comet_w4ax_check_load(const comet_backend *be, int N, int K, int B,
                                   const uint8_t *qw_plain, const uint16_t *sw_plain,
                                   comet_w4ax_weight **out);
comet_status comet_w4ax_check_gemm(const comet_backend *be, const comet_w4ax_weight *w, int K,
                                   int B, int M, int n8, const int8_t *qa, const float *sa,
                                   const float *y);

#endif
