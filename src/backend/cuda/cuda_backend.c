/* cuda_backend.c — the CUDA backend's op table (backend.h): memory, weights, the KV page
 * pool and the step ops of the layer loop, all queued on the backend's own non-blocking
 * stream of one GPU.
 *
 * - Memory ops: cudaMalloc / cudaFree and stream-ordered copies.
 * - weights_load: cuda_weights.c (W4Ax linears packed on the device, FP16 copies of
 *   floating-point linears and the lm_head, fp32 norms and embedding, per group its
 *   activation format and permutation).
 * - Step ops and sample: cuda_step_ops.c (the batch in one copy, the kernels of
 *   convert.cu, norm_quant.cu, rope_kv.cu, attention.cu and sample.cu, the W4Ax GEMM —
 *   comet_cuda_gemm_w4ax, kernel AUTO, fp32 output, programmatic dependent launch,
 *   through comet_cuda_be_gemm_w4ax_launch here — and cuBLAS).
 * - The KV pool: kv_init allocates the layout of cuda_kv.h.
 * - Decode steps are recorded as CUDA graphs, one per batch size and attention split
 *   count, and replayed (graph_begin / graph_end; COMET_CUDA_GRAPHS=0 turns them off).
 * - The W4Ax weights of weights_load and their checked GEMM (comet_cuda_be_w4ax_load,
 *   comet_cuda_be_gemm_w4ax, cuda_internal.h), which tests drive directly.
 * The step ops read the batch of the backend's latest step_begin (its device copy and
 * attention tiles live in the backend; a step must not be used after the next step_begin).
 * Per-step ops allocate nothing except when a step needs more than any before: the step
 * buffers and attention's split workspace grow (geometrically; growing waits for the
 * stream).
 *
 * Plain C against the CUDA runtime and cuBLAS, compiled by the host compiler. It needs
 * cuda_step_ops.c, cuda_weights.c, gemm_w4ax.h, convert.h, norm_quant.h, rope_kv.h and
 * attention.h (+ their kernels), gemm_w4ax_pack.c, backend.c, w4ax_check.c, rope.c,
 * numerics/group.c, core/status.c and
 * core/log.c. Without COMET_HAVE_CUDA this file compiles to stubs that fail with a
 * message, so that callers always link.
 */
#include "backend/backend.h"

#ifdef COMET_HAVE_CUDA

#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h> /* types of the two driver functions below, reached through the runtime */

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/env_switch.h"
#include "backend/cuda/gemm_w4ax.h"
#include "backend/w4ax_check.h"
#include "comet/log.h"

static const comet_backend_ops cuda_ops;

/* A failed CUDA call as a status: COMET_ERR_NOMEM for an allocation that did not fit
 * (cleared, the context stays usable), COMET_ERR_CUDA otherwise. */
comet_status comet_cuda_be_fail(cudaError_t e, const char *what) {
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return comet_set_error(COMET_ERR_NOMEM, "cuda backend: %s: out of device memory", what);
    }
    return comet_set_error(COMET_ERR_CUDA, "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e),
                           cudaGetErrorName(e));
}

/* Every op makes its backend's device current and gives the calling thread its own CUDA
 * context back when it returns: comet_cuda_be_enter saves the caller's context (NULL when it has
 * none) and switches (if switching fails, it has restored the context itself and *prev is
 * NULL); comet_cuda_be_leave restores it. Contexts, not device numbers: restoring
 * "device 0" for a thread that never chose a device would create a context on GPU 0 (a
 * process serving on GPU 3 would pay for one there), and a caller's own driver context is
 * not any device's primary one. cuCtxGetCurrent / cuCtxSetCurrent come through the
 * runtime's driver entry points (no -lcuda); without them nothing is restored. */
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
static ctx_get_fn ctx_get;
static ctx_set_fn ctx_set;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void *driver_fn(const char *name) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fn, 4000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return fn;
}

static void ctx_fns_load(void) {
    ctx_get = (ctx_get_fn)driver_fn("cuCtxGetCurrent");
    ctx_set = (ctx_set_fn)driver_fn("cuCtxSetCurrent");
}

void comet_cuda_be_leave(CUcontext prev) {
    if (prev)
        ctx_set(prev);
}

cudaError_t comet_cuda_be_enter(int device, CUcontext *prev) {
    pthread_once(&ctx_once, ctx_fns_load);
    *prev = NULL;
    if (ctx_get && ctx_set && ctx_get(prev) != CUDA_SUCCESS)
        *prev = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        comet_cuda_be_leave(*prev);
        *prev = NULL;
    }
    return e;
}

void comet_cuda_be_w4ax_free(comet_backend *be, comet_w4ax_weight *w) {
    (void)be;
    if (!w)
        return;
    CUcontext prev;
    comet_cuda_be_enter(w->device, &prev);
    /* a queued GEMM may still read w, on this backend's stream or on that of another CUDA
     * backend of the same device (gemm_w4ax takes any CUDA backend's weight of its device) */
    cudaDeviceSynchronize();
    cudaFree(w->qw);
    cudaFree(w->sw);
    comet_cuda_be_leave(prev);
    w->magic = 0;
    free(w);
}

comet_status comet_cuda_be_w4ax_load(comet_backend *be, int N, int K, int B,
                                     const uint8_t *qw_plain, const uint16_t *sw_plain,
                                     comet_w4ax_weight **out) {
    if (out)
        *out = NULL;
    COMET_TRY(
        comet_w4ax_check_load("w4ax_load (backend 'cuda')", N, K, B, qw_plain, sw_plain, out));
    if (K > COMET_CUDA_W4AX_MAX_K) /* the GEMM would refuse every call with this weight */
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "w4ax_load (backend 'cuda'): K=%d; the CUDA W4Ax GEMM takes K <= %d",
                               K, COMET_CUDA_W4AX_MAX_K);
    cuda_impl *im = impl_of(be);
    size_t qw_bytes = comet_cuda_w4ax_packed_qw_bytes(N, K);
    size_t sw_bytes = comet_cuda_w4ax_packed_sw_bytes(N, K, B);
    uint8_t *qw_host = malloc(qw_bytes);
    uint16_t *sw_host = malloc(sw_bytes);
    comet_w4ax_weight *w = calloc(1, sizeof *w);
    comet_status st = COMET_OK;
    cudaError_t e = cudaSuccess;
    const char *what = "";
    CUcontext prev = NULL;
    if (!qw_host || !sw_host || !w) {
        st = comet_set_error(COMET_ERR_NOMEM,
                             "w4ax_load (backend 'cuda'): out of host memory packing an N=%d "
                             "K=%d weight",
                             N, K);
        goto done;
    }
    w->magic = CUDA_W4AX_MAGIC;
    w->device = im->device;
    w->N = N, w->K = K, w->B = B;
    st = comet_cuda_w4ax_pack(N, K, B, qw_plain, sw_plain, qw_host, sw_host);
    if (st < 0)
        goto done;
    if ((e = comet_cuda_be_enter(im->device, &prev)) != cudaSuccess) {
        what = "w4ax_load: cudaSetDevice";
    } else if ((e = cudaMalloc((void **)&w->qw, qw_bytes)) != cudaSuccess) {
        what = "w4ax_load: cudaMalloc of the packed codes";
    } else if ((e = cudaMalloc((void **)&w->sw, sw_bytes)) != cudaSuccess) {
        what = "w4ax_load: cudaMalloc of the packed scales";
    } else if ((e = cudaMemcpyAsync(w->qw, qw_host, qw_bytes, cudaMemcpyHostToDevice,
                                    im->stream)) != cudaSuccess ||
               (e = cudaMemcpyAsync(w->sw, sw_host, sw_bytes, cudaMemcpyHostToDevice,
                                    im->stream)) != cudaSuccess ||
               (e = cudaStreamSynchronize(im->stream)) != cudaSuccess) {
        /* on the backend's stream, not the legacy default one, which a non-blocking stream
         * does not wait for; synchronized before the host buffers are freed */
        what = "w4ax_load: copying the weights to the device";
    }
    if (e != cudaSuccess)
        st = comet_cuda_be_fail(e, what);
done:
    free(qw_host);
    free(sw_host);
    if (st < 0 && w) {
        /* only what was allocated (cudaFree(NULL) in a thread without a context would
         * create one on the default device) */
        if (w->qw)
            cudaFree(w->qw);
        if (w->sw)
            cudaFree(w->sw);
        free(w);
    }
    comet_cuda_be_leave(prev);
    if (st < 0)
        return st;
    *out = w;
    return COMET_OK;
}

/* Make the workspace at least `need` bytes, zero-filled (the kernels leave the tile counters
 * at zero after each call, so zeroing once per allocation is enough). Growing waits for
 * the stream: a queued GEMM may still use the old workspace. */
static comet_status ensure_workspace(cuda_impl *im, size_t need) {
    if (need <= im->workspace_bytes)
        return COMET_OK;
    CUDA_TRY(cudaStreamSynchronize(im->stream),
             "waiting for the stream before growing the workspace");
    im->generation++;
    cudaFree(im->workspace);
    im->workspace = NULL;
    im->workspace_bytes = 0;
    CUDA_TRY(cudaMalloc(&im->workspace, need), "allocating the GEMM workspace");
    cudaError_t e = cudaMemsetAsync(im->workspace, 0, need, im->stream);
    if (e != cudaSuccess) {
        cudaFree(im->workspace);
        im->workspace = NULL;
        return comet_cuda_be_fail(e, "zero-filling the GEMM workspace");
    }
    im->workspace_bytes = need;
    return COMET_OK;
}

/* The launch of cuda_gemm_w4ax, on the backend's device (current). */
comet_status comet_cuda_be_gemm_w4ax_launch(cuda_impl *im, const comet_w4ax_weight *w, int M,
                                            int n8, const int8_t *qa, const float *sa, float *y,
                                            int n_parts, const int *widths, float *const *ys,
                                            int batch_invariant) {
    /* pdl: the GEMM's first weight loads may overlap the previous kernel on the stream. Safe
     * here: weights are written only by w4ax_load's synchronized copies and freed only after
     * the device is idle, so no kernel that may still run writes them. */
    comet_cuda_w4ax_gemm g = {.M = M,
                              .N = w->N,
                              .K = w->K,
                              .B = w->B,
                              .n8 = n8,
                              .qw = w->qw,
                              .sw = w->sw,
                              .qa = qa,
                              .sa = sa,
                              .y = y,
                              .kernel = COMET_W4AX_KERNEL_AUTO,
                              .pdl = im->pdl_on,
                              .batch_invariant = batch_invariant};
    if (n_parts > 0) {
        g.y = NULL, g.y_parts = n_parts;
        for (int i = 0; i < n_parts; i++)
            g.y_col0[i + 1] = g.y_col0[i] + widths[i], g.y_part[i] = ys[i];
    }
    COMET_TRY(ensure_workspace(im, comet_cuda_gemm_w4ax_workspace_bytes(&g)));
    g.workspace = im->workspace;
    g.workspace_bytes = im->workspace_bytes;
    return comet_cuda_gemm_w4ax(&g, im->stream);
}

comet_status comet_cuda_be_gemm_w4ax(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                                     const int8_t *qa, const float *sa, float *y) {
    cuda_impl *im = impl_of(be);
    if (w && w->magic != CUDA_W4AX_MAGIC)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend 'cuda'): the weight was not made by a CUDA "
                               "backend's w4ax_load");
    COMET_TRY(comet_w4ax_check_gemm("gemm_w4ax (backend 'cuda')", w, w ? w->K : 0, w ? w->B : 0, M,
                                    n8, qa, sa, y));
    if (w->device != im->device)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend 'cuda'): the weight lives on device %d, this "
                               "backend runs on device %d",
                               w->device, im->device);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "gemm_w4ax: cudaSetDevice");
    comet_status st = comet_cuda_be_gemm_w4ax_launch(im, w, M, n8, qa, sa, y, 0, NULL, NULL,
                                                     be->batch_invariant);
    comet_cuda_be_leave(prev);
    return st;
}

/* ---- memory ---- */

static void *cuda_alloc(comet_backend *be, size_t bytes) {
    cuda_impl *im = impl_of(be);
    if (bytes == 0) {
        comet_set_error(COMET_ERR_INVALID_ARG, "cuda backend: alloc of 0 bytes");
        return NULL;
    }
    CUcontext prev;
    void *p = NULL;
    cudaError_t e = comet_cuda_be_enter(im->device, &prev);
    if (e == cudaSuccess)
        e = cudaMalloc(&p, bytes);
    comet_cuda_be_leave(prev);
    if (e != cudaSuccess) {
        cudaGetLastError();
        comet_set_error(e == cudaErrorMemoryAllocation ? COMET_ERR_NOMEM : COMET_ERR_CUDA,
                        "cuda backend: alloc of %zu MiB: %s", bytes >> 20, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cuda_free_op(comet_backend *be, void *p) {
    if (!p)
        return;
    CUcontext prev;
    impl_of(be)->generation++; /* a later allocation may reuse the address */
    if (comet_cuda_be_enter(impl_of(be)->device, &prev) == cudaSuccess)
        cudaFree(p); /* waits for the device's queued work */
    comet_cuda_be_leave(prev);
}

/* upload: stream-ordered; a page-locked source (which the copy would read later) is waited
 * for, so that src may be reused when the call returns, as backend.h promises. */
static comet_status cuda_upload(comet_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *im = impl_of(be);
    if (bytes == 0)
        return COMET_OK;
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "upload: cudaSetDevice");
    struct cudaPointerAttributes at;
    int pinned = cudaPointerGetAttributes(&at, src) == cudaSuccess && at.type == cudaMemoryTypeHost;
    cudaGetLastError();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, im->stream);
    if (e == cudaSuccess && pinned)
        e = cudaStreamSynchronize(im->stream);
    comet_cuda_be_leave(prev);
    return e == cudaSuccess ? COMET_OK : comet_cuda_be_fail(e, "upload");
}

static comet_status cuda_download(comet_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *im = impl_of(be);
    if (bytes == 0)
        return COMET_OK;
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "download: cudaSetDevice");
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, im->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(im->stream);
    comet_cuda_be_leave(prev);
    return e == cudaSuccess ? COMET_OK : comet_cuda_be_fail(e, "download");
}

static comet_status cuda_sync_op(comet_backend *be) { return comet_backend_cuda_sync(be); }

/* ---- the KV page pool ---- */

comet_cuda_kv_layout comet_cuda_be_kv_layout(const comet_kv_cache *kv) {
    return comet_cuda_kv_layout_make(kv->n_layer, kv->n_pages, kv->page_size, kv->n_head_kv,
                                     kv->head_dim, comet_kv_type_bits(kv->kv.type), kv->kv.group);
}

static comet_status cuda_kv_init(comet_backend *be, comet_kv_cache *kv) {
    cuda_impl *im = impl_of(be);
    int D = kv->head_dim, G = kv->kv.group > 0 ? kv->kv.group : D, type = kv->kv.type;
    kv->k = kv->v = NULL;
    kv->storage = NULL;
    kv->storage_bytes = 0;
    if (kv->n_layer < 1 || kv->n_pages < 1 || kv->n_head_kv < 1 || kv->page_size < 1 || D < 1)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "cuda backend: kv_init: %d layers, %d pages of %d slots, %d KV "
                               "heads of %d",
                               kv->n_layer, kv->n_pages, kv->page_size, kv->n_head_kv, D);
    if (D > COMET_CUDA_KV_MAX_HEAD_DIM || D % 8 || kv->page_size > COMET_CUDA_KV_MAX_PAGE_SIZE)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: kv_init: head dim %d, page size %d; the CUDA "
                               "kernels take D <= %d with D %% 8 == 0 and pages of at most %d",
                               D, kv->page_size, COMET_CUDA_KV_MAX_HEAD_DIM,
                               COMET_CUDA_KV_MAX_PAGE_SIZE);
    COMET_TRY(comet_kv_format_check(&kv->kv, D, "cuda backend: kv_init"));
    /* the types the kernels store (cuda_kv.h; their BITS dispatch: with_kv_bits) */
    if (type != COMET_KV_F16 && type != COMET_KV_INT8 && type != COMET_KV_INT4)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: kv_init: a %s KV cache; the CUDA kernels store "
                               "f16, int8 and int4",
                               comet_kv_type_name(type));
    if (comet_kv_type_quantized(type) && G % 8)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "cuda backend: kv_init: KV group of %d channels at head dim %d; "
                               "need a multiple of 8 dividing D",
                               G, D);
    comet_cuda_kv_layout L = comet_cuda_be_kv_layout(kv);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "kv_init: cudaSetDevice");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, L.total_bytes);
    if (e == cudaSuccess && (e = cudaMemsetAsync(p, 0, L.total_bytes, im->stream)) != cudaSuccess)
        cudaFree(p);
    comet_cuda_be_leave(prev);
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, "kv_init: allocating the KV pages");
    kv->storage = p;
    kv->storage_bytes = L.total_bytes;
    return COMET_OK;
}

static void cuda_kv_free(comet_backend *be, comet_kv_cache *kv) {
    if (!kv || !kv->storage)
        return;
    cuda_impl *im = impl_of(be);
    CUcontext prev;
    im->generation++;
    if (comet_cuda_be_enter(im->device, &prev) == cudaSuccess) {
        cudaStreamSynchronize(im->stream);
        cudaFree(kv->storage);
    }
    comet_cuda_be_leave(prev);
    kv->storage = NULL;
    kv->storage_bytes = 0;
}

/* ---- decode-step graphs ----
 *
 * A decode step launches about 14 kernels a layer; from the host that costs more than the
 * GPU needs to read the 4-bit weights. graph_begin records a step's launches once per shape
 * (batch size T, attention split count: every other launch parameter of a decode step
 * follows from T, and the kernels read positions, page tables and lengths from the step
 * buffer) and replays the recording with one launch. A shape is first run op by op, which
 * grows every workspace it needs, and recorded the second time it comes. A recording keys
 * on the forward context (its workspace) and the KV pool, and holds while no buffer it
 * reads has moved (im->generation). */

/* Whether recording g reads the step of view v (st) right: its kernels took every device
 * array of the step by address and every size by value. */
static int same_layout(const cuda_graph *g, const comet_cuda_step_view *v, const comet_step *st) {
    const comet_cuda_step_view *r = &g->view;
    return r->n_tokens == v->n_tokens && r->n_seqs == v->n_seqs && r->n_tiles == v->n_tiles &&
           r->positions == v->positions && r->token_indptr == v->token_indptr &&
           r->page_indptr == v->page_indptr && r->page_indices == v->page_indices &&
           r->tiles == v->tiles && g->tokens == st->dev.tokens &&
           g->last_page_len == st->dev.last_page_len && g->logit_rows == st->dev.logit_rows &&
           g->n_logits == st->host.n_logits;
}

static void graph_drop(cuda_graph *g) {
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    memset(g, 0, sizeof *g);
}

static comet_status cuda_graph_begin(comet_backend *be, const void *owner, const comet_kv_cache *kv,
                                     const comet_step *st, int H, int *mode) {
    cuda_impl *im = impl_of(be);
    *mode = COMET_GRAPH_NONE;
    if (!im->graphs_on || !kv->storage)
        return COMET_OK;
    comet_cuda_step_view view;
    COMET_TRY(comet_cuda_be_step_view(im, st, "graph_begin", &view));
    comet_cuda_kv_layout L = comet_cuda_be_kv_layout(kv);
    int splits = comet_cuda_attention_splits(&L, &view, H, im->attn_sm);
    cuda_graph *g = NULL;
    for (int i = 0; i < GRAPH_SLOTS && !g; i++) {
        cuda_graph *c = &im->graphs[i];
        if (c->used && c->owner == owner && c->kv_storage == kv->storage && c->T == view.n_tokens &&
            c->splits == splits && same_layout(c, &view, st))
            g = c;
    }
    if (!g) { /* first sight: run op by op (growing what it needs), record next time */
        g = &im->graphs[im->graph_next];
        im->graph_next = (im->graph_next + 1) % GRAPH_SLOTS;
        graph_drop(g);
        *g = (cuda_graph){.owner = owner,
                          .kv_storage = kv->storage,
                          .T = view.n_tokens,
                          .splits = splits,
                          .used = 1,
                          .view = view,
                          .tokens = st->dev.tokens,
                          .last_page_len = st->dev.last_page_len,
                          .logit_rows = st->dev.logit_rows,
                          .n_logits = st->host.n_logits};
        return COMET_OK;
    }
    if (g->failed)
        return COMET_OK;
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "graph_begin: cudaSetDevice");
    cudaError_t e = cudaSuccess;
    if (g->exec && g->generation == im->generation) {
        e = cudaGraphLaunch(g->exec, im->stream);
        if (e == cudaSuccess)
            *mode = COMET_GRAPH_REPLAYED;
    } else {
        if (g->exec) { /* a buffer it reads has moved */
            cudaGraphExecDestroy(g->exec);
            g->exec = NULL;
        }
        e = cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeThreadLocal);
        if (e == cudaSuccess) {
            *mode = COMET_GRAPH_CAPTURING;
            im->capturing = (int)(g - im->graphs);
            g->generation = im->generation;
        }
    }
    comet_cuda_be_leave(prev);
    return e == cudaSuccess ? COMET_OK : comet_cuda_be_fail(e, "graph_begin");
}

static comet_status cuda_graph_end(comet_backend *be, comet_status ops_status, int *rerun) {
    cuda_impl *im = impl_of(be);
    *rerun = 0;
    COMET_ASSERT(im->capturing >= 0);
    cuda_graph *g = &im->graphs[im->capturing];
    im->capturing = -1;
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "graph_end: cudaSetDevice");
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(im->stream, &graph);
    if (e == cudaSuccess && ops_status >= 0 && g->generation == im->generation)
        e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph)
        cudaGraphDestroy(graph);
    comet_status r = COMET_OK;
    if (e != cudaSuccess || ops_status < 0 || g->generation != im->generation || !g->exec) {
        /* nothing ran: the step runs op by op, and this shape from now on */
        cudaGetLastError();
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
        g->failed = 1;
        comet_log(COMET_LOG_DEBUG,
                  "cuda backend: a decode step of %d tokens could not be "
                  "recorded as a graph (%s); it runs op by op",
                  g->T, e != cudaSuccess ? cudaGetErrorString(e) : comet_last_error());
        comet_clear_error();
        *rerun = 1;
    } else if ((e = cudaGraphLaunch(g->exec, im->stream)) != cudaSuccess) {
        r = comet_cuda_be_fail(e, "graph_end: launching the recorded step");
    }
    comet_cuda_be_leave(prev);
    return r;
}

static void cuda_destroy(comet_backend *be) {
    cuda_impl *im = impl_of(be);
    if (im && im->stream) { /* without a stream nothing was made: no device to enter */
        CUcontext prev;
        if (comet_cuda_be_enter(im->device, &prev) != cudaSuccess)
            cudaGetLastError(); /* release what can be released anyway */
        cudaStreamSynchronize(im->stream);
        for (int i = 0; i < GRAPH_SLOTS; i++)
            graph_drop(&im->graphs[i]);
        if (im->cublas)
            cublasDestroy(im->cublas);
        if (im->cublas_ws)
            cudaFree(im->cublas_ws);
        if (im->step_copied)
            cudaEventDestroy(im->step_copied);
        if (im->step_host)
            cudaFreeHost(im->step_host);
        if (im->step_dev)
            cudaFree(im->step_dev);
        if (im->attn_ws)
            cudaFree(im->attn_ws);
        if (im->stack_ws)
            cudaFree(im->stack_ws);
        if (im->smp_host)
            cudaFreeHost(im->smp_host);
        if (im->smp_dev)
            cudaFree(im->smp_dev);
        if (im->rope_dev)
            cudaFree(im->rope_dev);
        if (im->workspace)
            cudaFree(im->workspace);
        cudaStreamDestroy(im->stream);
        comet_cuda_be_leave(prev);
    }
    free(im);
    free(be);
}

static const comet_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free_op,
    .upload = cuda_upload,
    .download = cuda_download,
    .sync = cuda_sync_op,
    .weights_load = comet_cuda_be_weights_load,
    .weights_free = comet_cuda_be_weights_free,
    .kv_init = cuda_kv_init,
    .kv_free = cuda_kv_free,
    .step_begin = comet_cuda_be_step_begin,
    .embed_tokens = comet_cuda_be_embed_tokens,
    .rmsnorm_quant = comet_cuda_be_rmsnorm_quant,
    .act_quant = comet_cuda_be_act_quant,
    .silu_mul_quant = comet_cuda_be_silu_mul_quant,
    .matmul = comet_cuda_be_matmul,
    .matmul_group = comet_cuda_be_matmul_group,
    .rope_kv_append = comet_cuda_be_rope_kv_append,
    .paged_attention = comet_cuda_be_paged_attention,
    .paged_attention_quant = comet_cuda_be_paged_attention_quant,
    .rope_attention_quant = comet_cuda_be_rope_attention_quant,
    .lm_head = comet_cuda_be_lm_head,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .sample = comet_cuda_be_sample,
    .destroy = cuda_destroy,
};

/* 1 when the NVIDIA kernel driver shows no device node (/dev/nvidiactl, /dev/nvidia0, ...):
 * then the runtime's cudaErrorInsufficientDriver means "no driver", not "an old driver". */
static int no_nvidia_device_nodes(void) {
    glob_t g;
    int found = glob("/dev/nvidia*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
    if (found)
        globfree(&g);
    return !found;
}

comet_backend *comet_backend_cuda_init(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        /* The runtime reports a machine without a driver as an insufficient driver; say
         * what is true and how to go on without a GPU. */
        if (e == cudaSuccess || e == cudaErrorNoDevice ||
            (e == cudaErrorInsufficientDriver && no_nvidia_device_nodes()))
            comet_set_error(COMET_ERR_CUDA,
                            "cuda backend: no NVIDIA GPU/driver found (%s%s); run with "
                            "--device cpu",
                            e == cudaSuccess ? "0 CUDA devices" : cudaGetErrorName(e),
                            e == cudaErrorInsufficientDriver ? ", no /dev/nvidia*" : "");
        else
            comet_set_error(COMET_ERR_CUDA,
                            "cuda backend: no usable CUDA device: %s (%s); --device cpu runs "
                            "on the CPU",
                            cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= n) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "cuda backend: device index %d out of range; this machine has %d CUDA "
                        "device(s), 0..%d",
                        device, n, n - 1);
        return NULL;
    }
    comet_backend *be = calloc(1, sizeof *be);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be);
        free(im);
        comet_set_error(COMET_ERR_NOMEM, "cuda backend: out of memory");
        return NULL;
    }
    im->device = device;
    im->capturing = -1;
    im->graphs_on = !comet_cuda_env_off("COMET_CUDA_GRAPHS");
    im->pdl_on = !comet_cuda_env_off("COMET_CUDA_PDL");
    const int attn_splits_on = !comet_cuda_env_off("COMET_CUDA_ATTN_SPLITS");
    const char *attn_mma = getenv("COMET_CUDA_ATTN_MMA");
    /* -1: not asked for; the default is settled once the device is current (below) */
    im->attn_mma_on = attn_mma && !strcmp(attn_mma, "0")   ? 0
                      : attn_mma && !strcmp(attn_mma, "1") ? 1
                      : attn_mma && !strcmp(attn_mma, "2") ? 2
                      : attn_mma && !strcmp(attn_mma, "3") ? 3
                                                           : -1;
    im->stack_split_on = !comet_cuda_env_off("COMET_CUDA_STACK_SPLIT");
    be->ops = &cuda_ops;
    be->n_threads = 1;
    be->impl = im;
    CUcontext prev;
    if ((e = comet_cuda_be_enter(device, &prev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        comet_cuda_be_fail(e, "creating the stream");
        im->stream = NULL;
        comet_cuda_be_leave(prev); /* NULL when comet_cuda_be_enter failed */
        cuda_destroy(be);
        return NULL;
    }
    const char *what = NULL;
    cublasStatus_t cs = CUBLAS_STATUS_SUCCESS;
    if ((e = cudaDeviceGetAttribute(&im->n_sm, cudaDevAttrMultiProcessorCount, device)) !=
        cudaSuccess)
        what = "querying the SM count";
    else if ((e = cudaEventCreateWithFlags(&im->step_copied, cudaEventDisableTiming)) !=
             cudaSuccess)
        what = "creating the step event";
    else if ((cs = cublasCreate(&im->cublas)) != CUBLAS_STATUS_SUCCESS ||
             (cs = cublasSetStream(im->cublas, im->stream)) != CUBLAS_STATUS_SUCCESS)
        what = "creating the cuBLAS handle";
    else if ((e = cudaMalloc(&im->cublas_ws, CUBLAS_WORKSPACE_BYTES)) != cudaSuccess)
        what = "allocating cuBLAS's workspace";
    else if ((cs = cublasSetWorkspace(im->cublas, im->cublas_ws, CUBLAS_WORKSPACE_BYTES)) !=
             CUBLAS_STATUS_SUCCESS)
        what = "setting cuBLAS's workspace";
    /* The default: attn_mma3_kernel where an SM holds two of its CTAs (sm_90) in steps with
     * more of its CTAs than SMs (1.25x over attn_mma2_kernel at 8K tokens on an H100), else
     * attn_mma2_kernel, which fills an SM alone. COMET_CUDA_ATTN_MMA=3 on a device whose SM
     * cannot hold one (under ~103 KB of shared memory a CTA: sm_86, sm_89) falls back to
     * attn_mma2_kernel too. */
    if (!what && im->attn_mma_on < 0) {
        im->attn_mma_on = comet_cuda_attention_mma3_ctas_per_sm() >= 2 ? 3 : 2;
        im->attn_mma3_auto = im->attn_mma_on == 3;
    } else if (!what && im->attn_mma_on == 3 && comet_cuda_attention_mma3_ctas_per_sm() < 1) {
        comet_log(COMET_LOG_WARN,
                  "COMET_CUDA_ATTN_MMA=3: attn_mma3_kernel does not fit an SM of device %d; "
                  "prefill attention runs attn_mma2_kernel",
                  device);
        im->attn_mma_on = 2;
    }
    comet_cuda_be_leave(prev);
    if (what) {
        if (cs != CUBLAS_STATUS_SUCCESS)
            comet_set_error(cs == CUBLAS_STATUS_ALLOC_FAILED ? COMET_ERR_NOMEM : COMET_ERR_CUDA,
                            "cuda backend: %s: %s", what, cublasGetStatusString(cs));
        else
            comet_cuda_be_fail(e, what);
        cuda_destroy(be);
        return NULL;
    }
    im->attn_sm = attn_splits_on ? im->n_sm : 0;
    return be;
}

int comet_backend_cuda_device(const comet_backend *be) {
    return be && be->ops == &cuda_ops ? ((const cuda_impl *)be->impl)->device : -1;
}

comet_status comet_backend_cuda_sync(comet_backend *be) {
    if (!be || be->ops != &cuda_ops)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "comet_backend_cuda_sync: backend '%s' is "
                               "not a CUDA backend",
                               be ? be->ops->name : "(NULL)");
    cuda_impl *im = impl_of(be);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "sync: cudaSetDevice");
    cudaError_t e = cudaStreamSynchronize(im->stream);
    comet_cuda_be_leave(prev);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA,
                               "cuda backend: a kernel on the stream failed: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    return COMET_OK;
}

comet_status comet_backend_device_memory(comet_backend *be, size_t *free_bytes,
                                         size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!be || be->ops != &cuda_ops)
        return COMET_OK; /* a host-memory backend */
    cuda_impl *im = impl_of(be);
    CUcontext prev;
    CUDA_TRY(comet_cuda_be_enter(im->device, &prev), "device_memory: cudaSetDevice");
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    comet_cuda_be_leave(prev);
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, "device_memory: cudaMemGetInfo");
    *free_bytes = f;
    *total_bytes = t;
    return COMET_OK;
}

#else /* no CUDA in this build: stubs, so that callers link and fail with a message */

comet_status comet_backend_device_memory(comet_backend *be, size_t *free_bytes,
                                         size_t *total_bytes) {
    (void)be; /* no CUDA backend exists in this build: every backend uses host memory */
    *free_bytes = *total_bytes = 0;
    return COMET_OK;
}

comet_backend *comet_backend_cuda_init(int device) {
    (void)device;
    comet_set_error(COMET_ERR_UNSUPPORTED,
                    "cuda backend: this build has no CUDA (configure with -DCOMET_CUDA=ON on a "
                    "machine with the CUDA toolkit)");
    return NULL;
}

int comet_backend_cuda_device(const comet_backend *be) {
    (void)be;
    return -1;
}

comet_status comet_backend_cuda_sync(comet_backend *be) {
    return comet_set_error(COMET_ERR_INVALID_ARG,
                           "comet_backend_cuda_sync: backend '%s' is not a CUDA backend (this "
                           "build has no CUDA)",
                           be ? be->ops->name : "(NULL)");
}

#endif
