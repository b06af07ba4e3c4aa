/* comm.h — collectives between the ranks of a tensor-parallel group (engine/tp.h).
 *
 * A group holds one endpoint per rank; rank r's endpoint is driven by rank r's thread, on
 * rank r's backend, and every rank calls the same collectives in the same order. Buffers
 * live in the rank's backend memory. Two implementations, chosen by the backends' kind:
 *   - host memory (CPU backends): the ranks are threads of one process; a collective
 *     publishes each rank's pointer and meets at a barrier, and every rank reads the
 *     others' buffers directly. Sums run over the ranks in order 0..N-1, so every rank
 *     gets the same bits whatever the thread timing.
 *   - CUDA: NCCL (ncclAllReduce, ncclBroadcast) on each rank's stream, asynchronous like
 *     the backend's other ops, and recordable in its graphs. A build without NCCL runs
 *     one rank only.
 * NCCL's NVLink multicast (NVLS) stays off: the group sets NCCL_NVLS_ENABLE=0 unless the
 * environment says otherwise.
 */
#ifndef COMET_BACKEND_COMM_H
#define COMET_BACKEND_COMM_H

#include <stddef.h>

#include "backend/backend.h"

typedef struct comet_comm_group comet_comm_group;
typedef struct comet_comm comet_comm; /* one rank's endpoint */

/* A group over bes[0..n-1] (borrowed; rank r runs on bes[r]; all of one kind: all CPU, or
 * all CUDA on distinct GPUs). max_floats bounds the elements of any one collective, and
 * root_floats those of a gather to rank 0 (the CUDA gather stages that many floats on each
 * rank, and on rank 0 the larger of the two). COMET_OK and *out; COMET_ERR_INVALID_ARG (n < 1,
 * mixed kinds, a GPU twice), COMET_ERR_UNSUPPORTED (n > 1 on CUDA in a build without
 * NCCL), COMET_ERR_NOMEM, COMET_ERR_CUDA (NCCL's set-up, named). */
comet_status comet_comm_group_create(comet_backend *const *bes, int n, size_t max_floats,
                                     size_t root_floats, comet_comm_group **out);

/* Rank r's endpoint (owned by the group). */
comet_comm *comet_comm_group_rank(comet_comm_group *g, int r);

/* Called by a rank that failed in the middle of a step, from its own thread: every rank
 * waiting in a collective, or entering one later, returns COMET_ERR_INTERNAL ("another rank
 * failed") instead of waiting forever. */
void comet_comm_group_abort(comet_comm_group *g);

/* After every rank has returned from an aborted step: make the group usable again. COMET_OK;
 * COMET_ERR_CUDA for NCCL, whose aborted communicators cannot be reused. */
comet_status comet_comm_group_reset(comet_comm_group *g);

/* Release the group and its endpoints (no rank may be inside a collective). NULL: no-op. */
void comet_comm_group_free(comet_comm_group *g);

int comet_comm_rank(const comet_comm *c);
int comet_comm_size(const comet_comm *c);

/* buf [n] (n <= max_floats) becomes the elementwise sum of every rank's buf, the same on
 * every rank. One rank: a no-op. COMET_OK, COMET_ERR_INTERNAL (aborted), COMET_ERR_CUDA. */
comet_status comet_comm_all_reduce(comet_comm *c, float *buf, size_t n);

/* Gather columns: dst [rows, col0[N]] gets, in columns col0[r] .. col0[r+1]-1, rank r's src
 * [rows, col0[r+1] - col0[r]] (col0 [N+1] increasing from 0, the same on every rank), on
 * every rank (root -1; rows * col0[N] <= max_floats) or on rank 0 only (root 0; rows *
 * col0[N] <= root_floats; dst is ignored elsewhere, may be NULL). dst does not overlap src. Statuses as above. */
comet_status comet_comm_gather_cols(comet_comm *c, const float *src, int rows, const int *col0,
                                    float *dst, int root);

/* The implementations behind the calls above (comm.c dispatches by the backends' kind). */
typedef struct comet_comm_ops {
    comet_status (*all_reduce)(comet_comm *c, float *buf, size_t n);
    comet_status (*gather_cols)(comet_comm *c, const float *src, int rows, const int *col0,
                                float *dst, int root);
    void (*abort)(comet_comm_group *g);
    comet_status (*reset)(comet_comm_group *g);
    void (*destroy)(comet_comm_group *g);
} comet_comm_ops;

struct comet_comm {
    comet_comm_group *group;
    comet_backend *be;
    int rank, size;
};

struct comet_comm_group {
    const comet_comm_ops *ops;
    int n;
    size_t max_floats, root_floats;
    comet_comm *ranks; /* [n] */
    void *impl;        /* the implementation's shared state */
};

/* Fill g->ops and g->impl for host-memory backends (cpu/cpu_comm.c) or CUDA ones
 * (cuda/cuda_comm.c; without CUDA: COMET_ERR_UNSUPPORTED). g->n, g->max_floats and
 * g->ranks are set. */
comet_status comet_comm_cpu_setup(comet_comm_group *g);
comet_status comet_comm_cuda_setup(comet_comm_group *g);

#endif
