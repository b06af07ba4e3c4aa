/* cuda_backend.c — the CUDA backend's op table (backend.h). So far it holds the W4Ax GEMM
 * only: w4ax_load packs plain weights (comet_cuda_w4ax_pack) into device memory, gemm_w4ax
 * launches comet_cuda_gemm_w4ax (kernel AUTO, fp32 output, programmatic dependent launch) on
 * the backend's own stream;
 * the other ops are NULL until their kernels exist, and comet_forward_init refuses the
 * backend, naming the first op missing.
 *
 * Plain C against the CUDA runtime. It depends only on gemm_w4ax.h (+ the kernels),
 * gemm_w4ax_pack.c, backend.c and core/status.c, so the GPU machine, which cannot build
 * comet_lib, builds it with gcc in bench/gemm/build.sh. Without COMET_HAVE_CUDA this file
 * compiles to stubs that fail with a message, so that callers always link.
 */
#include "backend/backend.h"

#ifdef COMET_HAVE_CUDA

#include <pthread.h>
#include <stdlib.h>

#include <cuda.h> /* types of the two driver functions below, reached through the runtime */
#include <cuda_runtime_api.h>

#include "backend/cuda/gemm_w4ax.h"

#define CUDA_W4AX_MAGIC 0x34415543u /* "CUA4"; the CPU backends tag theirs "CWA4" */

typedef struct cuda_impl {
    int device;
    cudaStream_t stream;
    void *workspace; /* split-K partials + tile counters of comet_cuda_gemm_w4ax, zero-filled */
    size_t workspace_bytes;
} cuda_impl;

struct comet_w4ax_weight {
    uint32_t magic;
    int device; /* the GPU holding qw and sw */
    int N, K, B;
    uint8_t *qw;  /* device, comet_cuda_w4ax_packed_qw_bytes(N, K) */
    uint16_t *sw; /* device, comet_cuda_w4ax_packed_sw_bytes(N, K, B) */
};

static const comet_backend_ops cuda_ops;

/* A failed CUDA call as a status: COMET_ERR_NOMEM for an allocation that did not fit
 * (cleared, the context stays usable), COMET_ERR_CUDA otherwise. */
static comet_status cuda_fail(cudaError_t e, const char *what) {
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return comet_set_error(COMET_ERR_NOMEM, "cuda backend: %s: out of device memory", what);
    }
    return comet_set_error(COMET_ERR_CUDA, "cuda backend: %s: %s (%s)", what, cudaGetErrorString(e),
                           cudaGetErrorName(e));
}

#define CUDA_TRY(call, what)                     \
    do {                                         \
        cudaError_t cuda_try_e_ = (call);        \
        if (cuda_try_e_ != cudaSuccess)          \
            return cuda_fail(cuda_try_e_, what); \
    } while (0)

static cuda_impl *impl_of(comet_backend *be) { return be->impl; }

/* Every op makes its backend's device current and gives the calling thread its own CUDA
 * context back when it returns: device_enter saves the caller's context (NULL when it has
 * none) and switches (if switching fails, it has restored the context itself and *prev is
 * NULL); device_leave restores it. Contexts, not device numbers: restoring
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

static void device_leave(CUcontext prev) {
    if (prev)
        ctx_set(prev);
}

static cudaError_t device_enter(int device, CUcontext *prev) {
    pthread_once(&ctx_once, ctx_fns_load);
    *prev = NULL;
    if (ctx_get && ctx_set && ctx_get(prev) != CUDA_SUCCESS)
        *prev = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        device_leave(*prev);
        *prev = NULL;
    }
    return e;
}

static void cuda_w4ax_free(comet_backend *be, comet_w4ax_weight *w) {
    (void)be;
    if (!w)
        return;
    CUcontext prev;
    device_enter(w->device, &prev);
    /* a queued GEMM may still read w, on this backend's stream or on that of another CUDA
     * backend of the same device (gemm_w4ax takes any CUDA backend's weight of its device) */
    cudaDeviceSynchronize();
    cudaFree(w->qw);
    cudaFree(w->sw);
    device_leave(prev);
    w->magic = 0;
    free(w);
}

static comet_status cuda_w4ax_load(comet_backend *be, int N, int K, int B,
                                   const uint8_t *qw_plain, const uint16_t *sw_plain,
                                   comet_w4ax_weight **out) {
    COMET_TRY(comet_w4ax_check_load(be, N, K, B, qw_plain, sw_plain, out));
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
                             "K=%d weight", N, K);
        goto done;
    }
    w->magic = CUDA_W4AX_MAGIC;
    w->device = im->device;
    w->N = N, w->K = K, w->B = B;
    st = comet_cuda_w4ax_pack(N, K, B, qw_plain, sw_plain, qw_host, sw_host);
    if (st < 0)
        goto done;
    if ((e = device_enter(im->device, &prev)) != cudaSuccess) {
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
        st = cuda_fail(e, what);
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
    device_leave(prev);
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
    CUDA_TRY(cudaStreamSynchronize(im->stream), "waiting for the stream before growing the workspace");
    cudaFree(im->workspace);
    im->workspace = NULL;
    im->workspace_bytes = 0;
    CUDA_TRY(cudaMalloc(&im->workspace, need), "allocating the GEMM workspace");
    cudaError_t e = cudaMemsetAsync(im->workspace, 0, need, im->stream);
    if (e != cudaSuccess) {
        cudaFree(im->workspace);
        im->workspace = NULL;
        return cuda_fail(e, "zero-filling the GEMM workspace");
    }
    im->workspace_bytes = need;
    return COMET_OK;
}

/* The launch of cuda_gemm_w4ax, on the backend's device (current). */
static comet_status gemm_w4ax_launch(cuda_impl *im, const comet_w4ax_weight *w, int M, int n8,
                                     const int8_t *qa, const float *sa, float *y) {
    /* pdl: the GEMM's first weight loads may overlap the previous kernel on the stream. Safe
     * here: weights are written only by w4ax_load's synchronized copies and freed only after
     * the device is idle, so no kernel that may still run writes them. */
    comet_cuda_w4ax_gemm g = {.M = M, .N = w->N, .K = w->K, .B = w->B, .n8 = n8, .qw = w->qw,
                              .sw = w->sw, .qa = qa, .sa = sa, .y = y,
                              .kernel = COMET_W4AX_KERNEL_AUTO, .pdl = 1};
    COMET_TRY(ensure_workspace(im, comet_cuda_gemm_w4ax_workspace_bytes(&g)));
    g.workspace = im->workspace;
    g.workspace_bytes = im->workspace_bytes;
    return comet_cuda_gemm_w4ax(&g, im->stream);
}

static comet_status cuda_gemm_w4ax(comet_backend *be, const comet_w4ax_weight *w, int M, int n8,
                                   const int8_t *qa, const float *sa, float *y) {
    cuda_impl *im = impl_of(be);
    if (w && w->magic != CUDA_W4AX_MAGIC)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend 'cuda'): the weight was not made by a CUDA "
                               "backend's w4ax_load");
    COMET_TRY(comet_w4ax_check_gemm(be, w, w ? w->K : 0, w ? w->B : 0, M, n8, qa, sa, y));
    if (w->device != im->device)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "gemm_w4ax (backend 'cuda'): the weight lives on device %d, this "
                               "backend runs on device %d", w->device, im->device);
    CUcontext prev;
    CUDA_TRY(device_enter(im->device, &prev), "gemm_w4ax: cudaSetDevice");
    comet_status st = gemm_w4ax_launch(im, w, M, n8, qa, sa, y);
    device_leave(prev);
    return st;
}

static void cuda_destroy(comet_backend *be) {
    cuda_impl *im = impl_of(be);
    if (im && (im->stream || im->workspace)) { /* nothing to release, no device to enter */
        CUcontext prev;
        if (device_enter(im->device, &prev) != cudaSuccess)
            cudaGetLastError(); /* release what can be released anyway */
        if (im->stream) {
            cudaStreamSynchronize(im->stream);
            cudaStreamDestroy(im->stream);
        }
        if (im->workspace)
            cudaFree(im->workspace);
        device_leave(prev);
    }
    free(im);
    free(be);
}

static const comet_backend_ops cuda_ops = {
    .name = "cuda",
    .w4ax_load = cuda_w4ax_load,
    .w4ax_free = cuda_w4ax_free,
    .gemm_w4ax = cuda_gemm_w4ax,
    .destroy = cuda_destroy,
};

comet_backend *comet_backend_cuda_init(int device) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (e != cudaSuccess)
            comet_set_error(COMET_ERR_CUDA, "cuda backend: no usable CUDA device: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
        else
            comet_set_error(COMET_ERR_CUDA, "cuda backend: no CUDA device on this machine");
        cudaGetLastError();
        return NULL;
    }
    if (device < 0 || device >= n) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "cuda backend: device index %d out of range; this machine has %d CUDA "
                        "device(s), 0..%d", device, n, n - 1);
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
    be->ops = &cuda_ops;
    be->n_threads = 1;
    be->impl = im;
    CUcontext prev;
    if ((e = device_enter(device, &prev)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        cuda_fail(e, "creating the stream");
        im->stream = NULL;
        device_leave(prev); /* NULL when device_enter failed */
        cuda_destroy(be);
        return NULL;
    }
    device_leave(prev);
    return be;
}

comet_status comet_backend_cuda_sync(comet_backend *be) {
    if (!be || be->ops != &cuda_ops)
        return comet_set_error(COMET_ERR_INVALID_ARG, "comet_backend_cuda_sync: backend '%s' is "
                               "not a CUDA backend", be ? be->ops->name : "(NULL)");
    cuda_impl *im = impl_of(be);
    CUcontext prev;
    CUDA_TRY(device_enter(im->device, &prev), "sync: cudaSetDevice");
    cudaError_t e = cudaStreamSynchronize(im->stream);
    device_leave(prev);
    if (e != cudaSuccess)
        return comet_set_error(COMET_ERR_CUDA, "cuda backend: a kernel on the stream failed: %s (%s)",
                               cudaGetErrorString(e), cudaGetErrorName(e));
    return COMET_OK;
}

#else /* no CUDA in this build: stubs, so that callers link and fail with a message */

comet_backend *comet_backend_cuda_init(int device) {
    (void)device;
    comet_set_error(COMET_ERR_UNSUPPORTED,
                    "cuda backend: this build has no CUDA (configure with -DCOMET_CUDA=ON on a "
                    "machine with the CUDA toolkit)");
    return NULL;
}

comet_status comet_backend_cuda_sync(comet_backend *be) {
    return comet_set_error(COMET_ERR_INVALID_ARG,
                           "comet_backend_cuda_sync: backend '%s' is not a CUDA backend (this "
                           "build has no CUDA)", be ? be->ops->name : "(NULL)");
}

#endif
