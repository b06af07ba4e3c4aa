/* comm.c — the collectives' entry points (comm.h): argument checks and dispatch to the
 * shared-memory (cpu/cpu_comm.c) or NCCL (cuda/cuda_comm.c) implementation. */
#include "backend/comm.h"

#include <stdlib.h>

comet_status comet_comm_group_create(comet_backend *const *bes, int n, size_t max_floats,
                                     size_t root_floats, comet_comm_group **out) {
    *out = NULL;
    if (n < 1 || !bes)
        return comet_set_error(COMET_ERR_INVALID_ARG, "comm: a group needs at least one rank");
    for (int r = 0; r < n; r++)
        if (!bes[r] || bes[r]->ops->host_memory != bes[0]->ops->host_memory)
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "comm: rank %d's backend is %s; a group's backends are all "
                                   "CPU or all CUDA",
                                   r, bes[r] ? bes[r]->ops->name : "missing");
    comet_comm_group *g = calloc(1, sizeof *g);
    comet_comm *ranks = calloc((size_t)n, sizeof *ranks);
    if (!g || !ranks) {
        free(g);
        free(ranks);
        return comet_set_error(COMET_ERR_NOMEM, "comm: out of memory");
    }
    g->n = n;
    g->max_floats = max_floats;
    g->root_floats = root_floats;
    g->ranks = ranks;
    for (int r = 0; r < n; r++)
        ranks[r] = (comet_comm){.group = g, .be = bes[r], .rank = r, .size = n};
    comet_status st = bes[0]->ops->host_memory ? comet_comm_cpu_setup(g) : comet_comm_cuda_setup(g);
    if (st < 0) {
        free(ranks);
        free(g);
        return st;
    }
    *out = g;
    return COMET_OK;
}

comet_comm *comet_comm_group_rank(comet_comm_group *g, int r) {
    COMET_ASSERT(r >= 0 && r < g->n);
    return &g->ranks[r];
}

void comet_comm_group_abort(comet_comm_group *g) { g->ops->abort(g); }

comet_status comet_comm_group_reset(comet_comm_group *g) { return g->ops->reset(g); }

void comet_comm_group_free(comet_comm_group *g) {
    if (!g)
        return;
    g->ops->destroy(g);
    free(g->ranks);
    free(g);
}

int comet_comm_rank(const comet_comm *c) { return c->rank; }

int comet_comm_size(const comet_comm *c) { return c->size; }

comet_status comet_comm_all_reduce(comet_comm *c, float *buf, size_t n) {
    COMET_ASSERT(n <= c->group->max_floats);
    if (c->size == 1 || n == 0)
        return COMET_OK;
    return c->group->ops->all_reduce(c, buf, n);
}

comet_status comet_comm_gather_cols(comet_comm *c, const float *src, int rows, const int *col0,
                                    float *dst, int root) {
    COMET_ASSERT(rows >= 0 && col0[0] == 0 && (root == -1 || root == 0));
    COMET_ASSERT((size_t)rows * col0[c->size] <=
                 (root < 0 ? c->group->max_floats : c->group->root_floats));
    COMET_ASSERT(dst || (root >= 0 && root != c->rank));
    return c->group->ops->gather_cols(c, src, rows, col0, dst, root);
}
