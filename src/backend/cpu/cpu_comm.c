/* cpu_comm.c — the collectives of comm.h between CPU ranks: threads of one process that share
 * memory. A collective publishes each rank's pointer, meets at a barrier, and reads the other
 * ranks' buffers directly; a second barrier keeps those buffers untouched until every rank
 * has read them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"

typedef struct cpu_comm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;         /* ranks at the current barrier */
    unsigned generation; /* barriers passed */
    int aborted;
    const float **ptr; /* [n] each rank's published buffer */
    float *sum;        /* [max_floats] the all-reduce's result */
} cpu_comm;

static cpu_comm *impl(comet_comm_group *g) { return g->impl; }

/* All n ranks meet; COMET_ERR_INTERNAL once the group is aborted. */
static comet_status barrier(comet_comm_group *g) {
    cpu_comm *s = impl(g);
    pthread_mutex_lock(&s->mu);
    unsigned gen = s->generation;
    if (!s->aborted && ++s->arrived == g->n) {
        s->arrived = 0;
        s->generation++;
        pthread_cond_broadcast(&s->cv);
    }
    while (!s->aborted && s->generation == gen)
        pthread_cond_wait(&s->cv, &s->mu);
    int aborted = s->generation == gen; /* an abort after every rank arrived is not this one's */
    pthread_mutex_unlock(&s->mu);
    return aborted ? comet_set_error(COMET_ERR_INTERNAL,
                                     "tensor parallel: another rank failed during this step")
                   : COMET_OK;
}

/* Rank r sums its share of the elements over every rank in order 0..n-1 into s->sum; then
 * each rank copies the whole sum into its own buffer. */
static comet_status all_reduce(comet_comm *c, float *buf, size_t n) {
    comet_comm_group *g = c->group;
    cpu_comm *s = impl(g);
    s->ptr[c->rank] = buf;
    COMET_TRY(barrier(g));
    size_t lo = n * (size_t)c->rank / (size_t)c->size, hi = n * (size_t)(c->rank + 1) / c->size;
    for (size_t i = lo; i < hi; i++) {
        float acc = s->ptr[0][i];
        for (int r = 1; r < c->size; r++)
            acc += s->ptr[r][i];
        s->sum[i] = acc;
    }
    COMET_TRY(barrier(g));
    memcpy(buf, s->sum, n * sizeof *buf); /* s->sum is next written after the next barrier */
    return COMET_OK;
}

static comet_status gather_cols(comet_comm *c, const float *src, int rows, const int *col0,
                                float *dst, int root) {
    comet_comm_group *g = c->group;
    cpu_comm *s = impl(g);
    s->ptr[c->rank] = src;
    if (c->size > 1)
        COMET_TRY(barrier(g));
    const int W = col0[c->size];
    for (int r = 0; (root < 0 || root == c->rank) && r < c->size; r++) {
        int w = col0[r + 1] - col0[r];
        for (int t = 0; t < rows; t++)
            memcpy(dst + (size_t)t * W + col0[r], s->ptr[r] + (size_t)t * w,
                   (size_t)w * sizeof *dst);
    }
    return c->size > 1 ? barrier(g) : COMET_OK;
}

static void abort_group(comet_comm_group *g) {
    cpu_comm *s = impl(g);
    pthread_mutex_lock(&s->mu);
    s->aborted = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static comet_status reset(comet_comm_group *g) {
    cpu_comm *s = impl(g);
    pthread_mutex_lock(&s->mu);
    s->aborted = 0;
    s->arrived = 0;
    pthread_mutex_unlock(&s->mu);
    return COMET_OK;
}

static void destroy(comet_comm_group *g) {
    cpu_comm *s = impl(g);
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->ptr);
    free(s->sum);
    free(s);
    g->impl = NULL;
}

static const comet_comm_ops cpu_comm_ops = {
    .all_reduce = all_reduce,
    .gather_cols = gather_cols,
    .abort = abort_group,
    .reset = reset,
    .destroy = destroy,
};

comet_status comet_comm_cpu_setup(comet_comm_group *g) {
    cpu_comm *s = calloc(1, sizeof *s);
    if (s) {
        s->ptr = calloc((size_t)g->n, sizeof *s->ptr);
        s->sum = malloc((g->max_floats ? g->max_floats : 1) * sizeof *s->sum);
    }
    if (!s || !s->ptr || !s->sum) {
        if (s) {
            free(s->ptr);
            free(s->sum);
        }
        free(s);
        return comet_set_error(COMET_ERR_NOMEM, "comm: out of memory for %zu floats",
                               g->max_floats);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    g->impl = s;
    g->ops = &cpu_comm_ops;
    return COMET_OK;
}
