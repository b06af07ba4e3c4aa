/* cuda_comm.c — the collectives of comm.h between CUDA ranks (one GPU each): NCCL on each
 * rank's stream, so that they queue like the backend's other ops and are recorded in its
 * graphs. A gather of uneven column blocks is one ncclBroadcast per rank (to every rank) or
 * an ncclSend / ncclRecv pair per rank (to one root) into a staging buffer, then one strided
 * copy per rank into the destination's columns. Without
 * COMET_HAVE_NCCL a group has one rank; without COMET_HAVE_CUDA there is none. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdlib.h>

#include "backend/comm.h"

#ifdef COMET_HAVE_CUDA
#include "backend/cuda/cuda_internal.h"
#ifdef COMET_HAVE_NCCL
#include <nccl.h>
#endif

typedef struct cuda_comm {
    float **stage; /* [n] each rank's staging buffer of max_floats, on its GPU */
#ifdef COMET_HAVE_NCCL
    ncclComm_t *nccl; /* [n]; NULL for one rank */
#endif
    int aborted;
} cuda_comm;

static cuda_comm *impl(comet_comm_group *g) { return g->impl; }

static comet_status aborted_error(void) {
    return comet_set_error(COMET_ERR_INTERNAL,
                           "tensor parallel: a rank failed and the NCCL communicators were "
                           "aborted; the group cannot run further steps");
}

#ifdef COMET_HAVE_NCCL
static comet_status nccl_fail(ncclResult_t r, const char *what) {
    return comet_set_error(COMET_ERR_CUDA, "comm: %s: %s", what, ncclGetErrorString(r));
}
#endif

static comet_status all_reduce(comet_comm *c, float *buf, size_t n) {
#ifdef COMET_HAVE_NCCL
    cuda_comm *s = impl(c->group);
    if (s->aborted)
        return aborted_error();
    cuda_impl *im = impl_of(c->be);
    CUcontext prev;
    cudaError_t e = comet_cuda_be_enter(im->device, &prev);
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, "comm: all_reduce: cudaSetDevice");
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, s->nccl[c->rank], im->stream);
    comet_cuda_be_leave(prev);
    return r == ncclSuccess ? COMET_OK : nccl_fail(r, "ncclAllReduce");
#else
    (void)buf, (void)n;
    return comet_set_error(COMET_ERR_UNSUPPORTED, "comm: %d CUDA ranks need NCCL", c->size);
#endif
}

static comet_status gather_cols(comet_comm *c, const float *src, int rows, const int *col0,
                                float *dst, int root) {
    cuda_comm *s = impl(c->group);
    if (s->aborted)
        return aborted_error();
    cuda_impl *im = impl_of(c->be);
    float *stage = s->stage[c->rank];
    CUcontext prev;
    cudaError_t e = comet_cuda_be_enter(im->device, &prev);
    if (e != cudaSuccess)
        return comet_cuda_be_fail(e, "comm: gather_cols: cudaSetDevice");
    comet_status st = COMET_OK;
#ifdef COMET_HAVE_NCCL
    if (c->size > 1) { /* to every rank: one broadcast per rank; to root: send / receive */
        ncclResult_t r = ncclGroupStart();
        for (int q = 0; q < c->size && r == ncclSuccess; q++) {
            size_t count = (size_t)rows * (col0[q + 1] - col0[q]);
            float *part = stage + (size_t)rows * col0[q];
            if (!count)
                continue;
            if (root < 0)
                r = ncclBroadcast(q == c->rank ? src : part, part, count, ncclFloat, q,
                                  s->nccl[c->rank], im->stream);
            else if (q == c->rank && q != root)
                r = ncclSend(src, count, ncclFloat, root, s->nccl[c->rank], im->stream);
            else if (c->rank == root && q != root)
                r = ncclRecv(part, count, ncclFloat, q, s->nccl[c->rank], im->stream);
        }
        ncclResult_t r2 = ncclGroupEnd();
        if (r != ncclSuccess || r2 != ncclSuccess)
            st = nccl_fail(r != ncclSuccess ? r : r2, "ncclBroadcast / ncclSend (gather)");
    }
#endif
    const int W = col0[c->size];
    for (int q = 0; (root < 0 || root == c->rank) && q < c->size && st >= 0; q++) {
        int w = col0[q + 1] - col0[q];
        const float *from = q == c->rank ? src : stage + (size_t)rows * col0[q];
        if (w && rows &&
            (e = cudaMemcpy2DAsync(dst + col0[q], (size_t)W * sizeof *dst, from,
                                   (size_t)w * sizeof *dst, (size_t)w * sizeof *dst, (size_t)rows,
                                   cudaMemcpyDeviceToDevice, im->stream)) != cudaSuccess)
            st = comet_cuda_be_fail(e, "comm: gather_cols: cudaMemcpy2DAsync");
    }
    comet_cuda_be_leave(prev);
    return st;
}

static void abort_group(comet_comm_group *g) {
    cuda_comm *s = impl(g);
    if (s->aborted)
        return;
    s->aborted = 1;
#ifdef COMET_HAVE_NCCL
    for (int r = 0; s->nccl && r < g->n; r++)
        ncclCommAbort(s->nccl[r]);
#endif
}

static comet_status reset(comet_comm_group *g) {
    return impl(g)->aborted ? aborted_error() : COMET_OK;
}

static void destroy(comet_comm_group *g) {
    cuda_comm *s = impl(g);
    if (!s)
        return;
#ifdef COMET_HAVE_NCCL
    for (int r = 0; s->nccl && !s->aborted && r < g->n; r++)
        ncclCommDestroy(s->nccl[r]);
    free(s->nccl);
#endif
    for (int r = 0; s->stage && r < g->n; r++)
        if (s->stage[r]) {
            CUcontext prev;
            if (comet_cuda_be_enter(impl_of(g->ranks[r].be)->device, &prev) == cudaSuccess) {
                cudaFree(s->stage[r]);
                comet_cuda_be_leave(prev);
            }
        }
    free(s->stage);
    free(s);
    g->impl = NULL;
}

static const comet_comm_ops cuda_comm_ops = {
    .all_reduce = all_reduce,
    .gather_cols = gather_cols,
    .abort = abort_group,
    .reset = reset,
    .destroy = destroy,
};

comet_status comet_comm_cuda_setup(comet_comm_group *g) {
    const int n = g->n;
    int *devs = malloc((size_t)n * sizeof *devs);
    cuda_comm *s = calloc(1, sizeof *s);
    if (s)
        s->stage = calloc((size_t)n, sizeof *s->stage);
    if (!devs || !s || !s->stage) {
        free(devs);
        if (s)
            free(s->stage);
        free(s);
        return comet_set_error(COMET_ERR_NOMEM, "comm: out of memory");
    }
    g->impl = s;
    g->ops = &cuda_comm_ops;
    comet_status st = COMET_OK;
    for (int r = 0; r < n && st >= 0; r++) {
        devs[r] = impl_of(g->ranks[r].be)->device;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r])
                st = comet_set_error(COMET_ERR_INVALID_ARG,
                                     "comm: ranks %d and %d are both on GPU %d; a tensor-parallel "
                                     "group takes one GPU per rank",
                                     q, r, devs[r]);
    }
#ifndef COMET_HAVE_NCCL
    if (st >= 0 && n > 1)
        st = comet_set_error(COMET_ERR_UNSUPPORTED,
                             "comm: tensor parallelism over %d GPUs needs NCCL, and this build "
                             "has none (install libnccl-dev and rebuild)",
                             n);
#else
    if (st >= 0 && n > 1) {
        setenv("NCCL_NVLS_ENABLE", "0", 0); /* the shared machines forbid NVLink multicast */
        s->nccl = calloc((size_t)n, sizeof *s->nccl);
        ncclResult_t r = s->nccl ? ncclCommInitAll(s->nccl, n, devs) : ncclSystemError;
        if (!s->nccl)
            st = comet_set_error(COMET_ERR_NOMEM, "comm: out of memory");
        else if (r != ncclSuccess) {
            free(s->nccl);
            s->nccl = NULL;
            st = nccl_fail(r, "ncclCommInitAll");
        }
    }
#endif
    for (int r = 0; r < n && st >= 0; r++) {
        CUcontext prev;
        cudaError_t e = comet_cuda_be_enter(devs[r], &prev);
        if (e == cudaSuccess) {
            size_t n_floats =
                r == 0 && g->root_floats > g->max_floats ? g->root_floats : g->max_floats;
            e = cudaMalloc((void **)&s->stage[r], (n_floats ? n_floats : 1) * sizeof(float));
            comet_cuda_be_leave(prev);
        }
        if (e != cudaSuccess)
            st = e == cudaErrorMemoryAllocation
                     ? comet_set_error(COMET_ERR_NOMEM,
                                       "comm: no room on GPU %d for the gather stage", devs[r])
                     : comet_cuda_be_fail(e, "comm: cudaMalloc");
    }
    free(devs);
    if (st < 0) {
        destroy(g);
        g->ops = NULL;
    }
    return st;
}

#else

comet_status comet_comm_cuda_setup(comet_comm_group *g) {
    (void)g;
    return comet_set_error(COMET_ERR_UNSUPPORTED, "comm: this build has no CUDA");
}

#endif
