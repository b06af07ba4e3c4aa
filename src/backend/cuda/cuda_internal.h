/* cuda_internal.h — what the CUDA backend's files share (cuda_backend.c: the op table,
 * memory, KV pool, step ops and graphs; cuda_weights.c: a model's weights on the device):
 * the backend's state, the weight structs, and the device enter/leave and error helpers.
 * Private to src/backend/cuda; compiled only with COMET_HAVE_CUDA. */
#ifndef COMET_BACKEND_CUDA_CUDA_INTERNAL_H
#define COMET_BACKEND_CUDA_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda.h> /* CUcontext, for the device enter/leave helpers */
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/norm_quant.h"
#include "backend/cuda/rope_kv.h"
#include "backend/cuda/sample.h"

#define CUDA_W4AX_MAGIC 0x34415543u /* "CUA4": made by comet_cuda_be_w4ax_load */

#define ROPE_SLOTS 8                                     /* distinct RoPE tables kept */
#define ROPE_SLOT_FREQS (COMET_CUDA_KV_MAX_HEAD_DIM / 2) /* doubles per table */

#define CUBLAS_WORKSPACE_BYTES (32u << 20) /* cuBLAS's recommendation for Hopper: 32 MiB */
#define GRAPH_SLOTS 64 /* shapes kept: batch sizes x attention split counts in use */

/* A recorded decode step: the shape it was recorded for and its executable graph. */
typedef struct cuda_graph {
    const void *owner;      /* the forward context whose workspace the graph uses */
    const void *kv_storage; /* the KV pool */
    int T, splits, used;
    comet_cuda_step_view view; /* the step layout it was recorded with (device addresses) */
    const int32_t *tokens, *last_page_len, *logit_rows;
    int n_logits;
    int failed; /* recording failed: this shape runs op by op */
    unsigned generation;
    cudaGraphExec_t exec; /* NULL until recorded */
} cuda_graph;

typedef struct cuda_impl {
    int device;
    int n_sm;    /* multiprocessors of the device (attention's split choice) */
    int attn_sm; /* n_sm as attention's split choice sees it; 0 (COMET_CUDA_ATTN_SPLITS=0, for
                  * tests and debugging): keys never split across CTAs */
    /* prefill chunks' attention (the step view's attn_mma): by default 3, the two-CTAs-an-SM
     * tensor-core kernel where it takes the cache, on devices whose SM holds two of its CTAs,
     * else 2, the pipelined tensor-core kernel; COMET_CUDA_ATTN_MMA=N asks for N: 2, 1 the
     * first tensor-core kernel, 0 the fp32 one (A/B runs, debugging) */
    int attn_mma_on;
    int attn_mma3_auto; /* attn_mma_on 3 by default (not asked for): attn_mma3_kernel only in
                         * steps with more of its CTAs than SMs (step view's mma3_min_ctas) */
    cudaStream_t stream;
    void *workspace; /* split-K partials + tile counters of comet_cuda_gemm_w4ax, zero-filled */
    size_t workspace_bytes;
    cublasHandle_t cublas; /* bound to stream */
    /* the step's batch: host staging (pinned) and its device copy, step_cap int32 each */
    int32_t *step_host, *step_dev;
    size_t step_cap;
    cudaEvent_t step_copied;   /* recorded after the staging copy: the next step waits on it */
    comet_cuda_step_view view; /* the latest step_begin's batch on the device */
    void *attn_ws;             /* attention's split partials, grown on demand */
    size_t attn_ws_bytes;
    void *stack_ws; /* a stacked group's GEMM output [T, N] fp32, grown on demand */
    size_t stack_ws_bytes;
    /* the W4Ax GEMM of a stacked group stores each role's columns in its buffer; 0 with
     * COMET_CUDA_STACK_SPLIT=0 (the A/B against the output in stack_ws and an unstack copy) */
    int stack_split_on;
    double *rope_dev; /* [ROPE_SLOTS, ROPE_SLOT_FREQS] inv_freq tables, allocated on first use */
    comet_rope_params rope_key[ROPE_SLOTS];
    int rope_used, rope_next;
    double rope_host[ROPE_SLOTS][ROPE_SLOT_FREQS];
    void *cublas_ws; /* cuBLAS's workspace, set explicitly so that its calls can be recorded */
    /* decode-step graphs (graph_begin): an entry per shape, valid while `generation` (bumped
     * whenever a buffer the kernels read may move: a free, a workspace growing) is the
     * one it was recorded under */
    int graphs_on; /* COMET_CUDA_GRAPHS=0 turns them off */
    int pdl_on;    /* W4Ax GEMMs with programmatic dependent launch; COMET_CUDA_PDL=0: without */
    unsigned generation;
    cuda_graph graphs[GRAPH_SLOTS];
    int graph_next; /* the slot the next new shape takes */
    int capturing;  /* the slot being recorded, or -1 */
    /* sampling (op sample): the rows, listed ids and ids, pinned and on the device,
     * smp_cap bytes each, grown on demand */
    void *smp_host, *smp_dev;
    size_t smp_cap;
} cuda_impl;

/* A W4Ax linear's weight on the device, packed for the GEMM (gemm_w4ax.h): made by
 * comet_cuda_be_w4ax_load, released by comet_cuda_be_w4ax_free. */
typedef struct comet_w4ax_weight {
    uint32_t magic;
    int device; /* the GPU holding qw and sw */
    int N, K, B;
    uint8_t *qw;  /* device, comet_cuda_w4ax_packed_qw_bytes(N, K) */
    uint16_t *sw; /* device, comet_cuda_w4ax_packed_sw_bytes(N, K, B) */
} comet_w4ax_weight;

static inline cuda_impl *impl_of(comet_backend *be) { return be->impl; }

/* ---- a model's weights on the device (cuda_weights.c) ---- */

typedef enum cuda_lin_kind {
    LIN_NONE = 0,
    LIN_F16,
    LIN_W4AX
} cuda_lin_kind;

typedef struct cuda_lin {
    cuda_lin_kind kind;
    int N, K;
    comet_w4ax_weight *w4; /* LIN_W4AX, own rows; NULL when the group's stack holds them */
    uint16_t *w16;         /* LIN_F16: device fp16 [N, K], own or inside the group's stack */
    int row0;              /* -1: own weight; else the first of its rows in the group's stack */
} cuda_lin;

typedef struct cuda_grp {
    comet_cuda_act_fmt fmt; /* fmt.perm: device [K] or NULL */
    float *norm;            /* device fp32 [C], or NULL for O and DOWN */
    /* QKV and GATE_UP: the group's linears stacked by rows in role order (q, k, v; gate,
     * up), so that one GEMM reads the activation once for all of them; kind LIN_NONE in
     * the other groups */
    cuda_lin stack;
} cuda_grp;

#define LAYER_GROUPS COMET_GROUP_LM_HEAD /* groups per layer; the lm_head's comes after */

struct comet_weights {
    uint32_t magic;
    int device;
    const comet_model *m;
    int n_layer, C, V;
    cuda_lin *lin;     /* [n_layer, COMET_ROLE_COUNT] */
    cuda_grp *grp;     /* [n_layer * LAYER_GROUPS + 1]: per layer, then LM_HEAD */
    float *embd;       /* device fp32 [V, C] */
    uint16_t *lm_head; /* device fp16 [V, C]; NULL with the INT8 lm_head */
    int8_t *lm_head_q8;   /* device INT8 codes [V, C] (model lm_head_bits 8), else NULL */
    uint16_t *lm_head_s8; /* device fp16 row scales [V] of lm_head_q8 */
    uint16_t *lm_head_c16; /* device fp16 [V, C]: lm_head_q8's codes as fp16 (exact), for
                            * steps past COMET_CUDA_LM_HEAD_W8_MAX_ROWS logit rows */
};

extern const char *const comet_cuda_role_names[COMET_ROLE_COUNT];
extern const char *const comet_cuda_group_names[COMET_GROUP_COUNT];

static inline const cuda_grp *group_of(const comet_weights *w, int layer, comet_group g) {
    return g == COMET_GROUP_LM_HEAD ? &w->grp[(size_t)w->n_layer * LAYER_GROUPS]
                                    : &w->grp[(size_t)layer * LAYER_GROUPS + g];
}

/* backend.h weights_load / weights_free of the CUDA backend. */
comet_status comet_cuda_be_weights_load(comet_backend *be, const comet_model *m,
                                        comet_weights **out);
void comet_cuda_be_weights_free(comet_backend *be, comet_weights *w);
/* COMET_OK when w was loaded by a CUDA backend of im's device, else INVALID_ARG naming op. */
comet_status comet_cuda_be_check_weights(const cuda_impl *im, const comet_weights *w,
                                         const char *op);

/* ---- the step ops (cuda_step_ops.c) and what they share with cuda_backend.c ----
 * The op-table entries of backend.h of the same names. */
comet_status comet_cuda_be_step_begin(comet_backend *be, const comet_batch *b, comet_step *st);
comet_status comet_cuda_be_embed_tokens(comet_backend *be, const comet_weights *w,
                                        const comet_step *st, float *x);
comet_status comet_cuda_be_rmsnorm_quant(comet_backend *be, const comet_weights *w, int layer,
                                         comet_group g, float *x, const float *residual, int T,
                                         void *act);
comet_status comet_cuda_be_act_quant(comet_backend *be, const comet_weights *w, int layer,
                                     comet_group g, const float *x, int T, void *act);
comet_status comet_cuda_be_silu_mul_quant(comet_backend *be, const comet_weights *w, int layer,
                                          const float *gate, const float *up, int T, void *act);
comet_status comet_cuda_be_matmul(comet_backend *be, const comet_weights *w, int layer,
                                  comet_role r, const void *act, int T, float *y);
comet_status comet_cuda_be_matmul_group(comet_backend *be, const comet_weights *w, int layer,
                                        comet_group g, const void *act, int T, float *const *ys);
comet_status comet_cuda_be_rope_kv_append(comet_backend *be, comet_kv_cache *kv, int layer,
                                          const comet_step *st, const comet_rope_params *rp,
                                          float *q, int H, float *k, const float *v);
comet_status comet_cuda_be_paged_attention(comet_backend *be, const comet_kv_cache *kv, int layer,
                                           const comet_step *st, const float *q, int H, float *out);
comet_status comet_cuda_be_paged_attention_quant(comet_backend *be, const comet_kv_cache *kv,
                                                 int layer, const comet_step *st, const float *q,
                                                 int H, float *out, const comet_weights *w,
                                                 void *act);
comet_status comet_cuda_be_rope_attention_quant(comet_backend *be, comet_kv_cache *kv, int layer,
                                                const comet_step *st, const comet_rope_params *rp,
                                                float *q, int H, float *k, const float *v,
                                                float *out, const comet_weights *w, void *act);
comet_status comet_cuda_be_lm_head(comet_backend *be, const comet_weights *w, const void *act,
                                   const comet_step *st, float *logits);
comet_status comet_cuda_be_sample(comet_backend *be, const float *logits, int V,
                                  const comet_sample_row *rows, int n_rows,
                                  const comet_sample_adj *adj, int n_adj, int32_t *ids);
/* *v = the device view of step st, the latest step_begin's; INVALID_ARG naming op when st
 * is not that step. */
comet_status comet_cuda_be_step_view(const cuda_impl *im, const comet_step *st, const char *op,
                                     comet_cuda_step_view *v);
/* The KV pool's layout (cuda_kv.h) for kv's sizes and format (cuda_backend.c). */
comet_cuda_kv_layout comet_cuda_be_kv_layout(const comet_kv_cache *kv);
/* y [M, N] = the W4Ax GEMM of w on (qa, sa), kernel AUTO (with batch_invariant: the plan
 * fixed by w's shape, gemm_w4ax.h), on im's stream (cuda_backend.c). With n_parts 2 or 3 the
 * output goes by columns to ys[i] [M, widths[i]] instead (y unused; widths sum to N, each a
 * multiple of 4; a NULL ys[i] drops its columns): a stacked group's roles, written by the
 * GEMM itself. */
comet_status comet_cuda_be_gemm_w4ax_launch(cuda_impl *im, const comet_w4ax_weight *w, int M,
                                            int n8, const int8_t *qa, const float *sa, float *y,
                                            int n_parts, const int *widths, float *const *ys,
                                            int batch_invariant);

/* ---- helpers the backend's files share ---- */

/* A failed CUDA call as a status: COMET_ERR_NOMEM for an allocation that did not fit
 * (cleared, the context stays usable), COMET_ERR_CUDA otherwise. */
comet_status comet_cuda_be_fail(cudaError_t e, const char *what);

#define CUDA_TRY(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t cuda_try_e_ = (call);                                                          \
        if (cuda_try_e_ != cudaSuccess)                                                            \
            return comet_cuda_be_fail(cuda_try_e_, what);                                          \
    } while (0)

/* Make `device` current for an op, saving the caller's context in *prev (see
 * cuda_backend.c); comet_cuda_be_leave gives it back. */
cudaError_t comet_cuda_be_enter(int device, CUcontext *prev);
void comet_cuda_be_leave(CUcontext prev);

/* The last error message prefixed with "cuda backend: <where>: "; returns st. */
comet_status comet_cuda_be_prefix_error(comet_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The CUDA backend's W4Ax weights, as weights_load makes them for the step ops, and a checked
 * GEMM on them; tests/cuda/test_backend_cuda.c drives them directly (cuda_backend.c).
 *
 * comet_cuda_be_w4ax_load: copy host weights in the plain layout of numerics/w4_plain.h —
 * qw_plain [N, K/2] INT4 codes, sw_plain [N, K/B] fp16 scale bits, borrowed for the call —
 * comet_cuda_w4ax_pack'ed into be's device memory. *out, owned by the caller, is released
 * with comet_cuda_be_w4ax_free and must not outlive be. COMET_OK; COMET_ERR_INVALID_ARG
 * (comet_w4ax_check_load's checks, K above COMET_CUDA_W4AX_MAX_K), the problem named;
 * COMET_ERR_NOMEM; COMET_ERR_CUDA. *out is NULL on failure.
 * comet_cuda_be_w4ax_free: NULL is a no-op; waits for the whole device first (a GEMM of any
 * CUDA backend on the device may still read w).
 * comet_cuda_be_gemm_w4ax: y [M, N] fp32 = the GEMM of w on qa [M, K] int8 codes (16-byte
 * aligned) and sa [M, K/B] fp32 scales, device memory, asynchronous on be's stream (y is
 * ready, and a kernel's failure surfaces, at comet_backend_cuda_sync); w may come from any
 * CUDA backend on the same device. COMET_OK; COMET_ERR_INVALID_ARG (comet_w4ax_check_gemm's
 * checks, w not made by comet_cuda_be_w4ax_load, w on another device); COMET_ERR_NOMEM /
 * COMET_ERR_CUDA (growing the workspace or the launch). INT4-block codes are not scanned. */
comet_status comet_cuda_be_w4ax_load(comet_backend *be, int N, int K, int B,
                                     const uint8_t *qw_plain, const uint16_t *sw_plain,
                                     comet_w4ax_weight **out);
void comet_cuda_be_w4ax_free(comet_backend *be, comet_w4ax_weight *w);
comet_status comet_cuda_be_gemm_w4ax(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                                     const int8_t *qa, const float *sa, float *y);

#endif
