/* tp.c — the tensor-parallel group: shards, rank backends, KV pools and threads (tp.h). */
#include "engine/tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "backend/kv_cache.h"
#include "model/shard.h"

typedef struct tp_rank {
    comet_tp *tp;
    int rank;
    comet_shard shard;
    comet_backend *be; /* rank 0: the caller's */
    comet_kv_cache kv;
    comet_forward_ctx *fc;
    pthread_t thread;
    int started;
    comet_status st;  /* the latest step's status */
    char error[1024]; /* and its message */
} tp_rank;

struct comet_tp {
    int n;
    tp_rank *ranks;
    comet_comm_group *comm;
    int *att_cols;   /* [n + 1] */
    int *vocab_cols; /* [n + 1] */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned step; /* steps handed out */
    int pending;   /* ranks 1..n-1 still in the current step */
    int stop;
    int first_failed; /* the rank that failed first in the current step; -1: none */
    int broken;       /* an aborted group that cannot be reset */
    const comet_batch *batch;
};

/* A backend like be0 for rank r: GPU d + r for be0 on GPU d, else a CPU backend of its
 * kind and threads. */
static comet_backend *open_peer(comet_backend *be0, int r) {
    char device[32];
    int dev = comet_backend_cuda_device(be0);
    if (dev >= 0)
        snprintf(device, sizeof device, "cuda:%d", dev + r);
    else
        snprintf(device, sizeof device, "%s", be0->ops->name);
    comet_backend *be = comet_backend_open(device, be0->n_threads);
    comet_backend_set_batch_invariant(be, be0->batch_invariant);
    comet_backend_set_simulate(be, be0->simulate);
    return be;
}

/* Run the step on rank r; a failure is recorded and aborts the group's collectives. */
static void run_rank(tp_rank *rk, const comet_batch *b, float *logits) {
    comet_tp *tp = rk->tp;
    comet_status st = comet_forward(rk->fc, &rk->kv, b, rk->rank == 0 ? logits : NULL);
    if (st >= 0 && rk->rank != 0 && !rk->be->ops->host_memory)
        st = rk->be->ops->sync(rk->be); /* its failures surface in this step */
    rk->st = st;
    if (st >= 0)
        return;
    snprintf(rk->error, sizeof rk->error, "%s", comet_last_error());
    pthread_mutex_lock(&tp->mu);
    if (tp->first_failed < 0)
        tp->first_failed = rk->rank;
    pthread_mutex_unlock(&tp->mu);
    comet_comm_group_abort(tp->comm);
}

static void *rank_main(void *arg) {
    tp_rank *rk = arg;
    comet_tp *tp = rk->tp;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&tp->mu);
        while (!tp->stop && tp->step == seen)
            pthread_cond_wait(&tp->go, &tp->mu);
        if (tp->stop) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = tp->step;
        const comet_batch *b = tp->batch;
        pthread_mutex_unlock(&tp->mu);
        run_rank(rk, b, NULL);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0)
            pthread_cond_signal(&tp->done);
        pthread_mutex_unlock(&tp->mu);
    }
}

/* Rank r's shard, backend, KV pool and forward context. */
static comet_status rank_init(comet_tp *tp, const comet_model *m, comet_backend *be0, int r,
                              int max_batch_tokens, int n_pages, int page_size,
                              comet_kv_format kv) {
    tp_rank *rk = &tp->ranks[r];
    rk->tp = tp;
    rk->rank = r;
    COMET_TRY(comet_shard_make(m, tp->n, r, &rk->shard));
    rk->be = r == 0 ? be0 : open_peer(be0, r);
    if (!rk->be)
        return comet_last_status();
    const comet_model_config *c = &rk->shard.m.cfg;
    COMET_TRY(comet_kv_cache_init_on(rk->be, &rk->kv, c->n_layer, n_pages, page_size, c->n_head_kv,
                                     c->head_dim, kv));
    rk->fc = comet_forward_init(&rk->shard.m, rk->be, max_batch_tokens);
    return rk->fc ? COMET_OK : comet_last_status();
}

comet_status comet_tp_init(const comet_model *m, comet_backend *be0, int n, int max_batch_tokens,
                           int n_pages, int page_size, comet_kv_format kv, comet_tp **out) {
    *out = NULL;
    COMET_TRY(comet_shard_check(m, n));
    comet_tp *tp = calloc(1, sizeof *tp);
    if (!tp)
        return comet_set_error(COMET_ERR_NOMEM, "tensor parallel: out of memory");
    tp->n = n;
    tp->first_failed = -1;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->go, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->ranks = calloc((size_t)n, sizeof *tp->ranks);
    tp->att_cols = calloc((size_t)n + 1, sizeof *tp->att_cols);
    tp->vocab_cols = calloc((size_t)n + 1, sizeof *tp->vocab_cols);
    if (!tp->ranks || !tp->att_cols || !tp->vocab_cols) {
        comet_tp_free(tp);
        return comet_set_error(COMET_ERR_NOMEM, "tensor parallel: out of memory");
    }
    comet_shard_att_cols(m, n, tp->att_cols);
    comet_shard_vocab_cols(m, n, tp->vocab_cols);
    comet_status st = COMET_OK;
    for (int r = 0; r < n && st >= 0; r++)
        if ((st = rank_init(tp, m, be0, r, max_batch_tokens, n_pages, page_size, kv)) < 0) {
            char why[1024];
            snprintf(why, sizeof why, "%s", comet_last_error());
            st = comet_set_error(st, "tensor parallel %d: rank %d: %s", n, r, why);
        }
    if (st >= 0) {
        const comet_model_config *c = &m->cfg;
        int width = comet_group_width(m, COMET_GROUP_O); /* the widest all-reduce or gather */
        if (c->n_embd > width)
            width = c->n_embd;
        comet_backend **bes = malloc((size_t)n * sizeof *bes);
        for (int r = 0; bes && r < n; r++)
            bes[r] = tp->ranks[r].be;
        st = bes ? comet_comm_group_create(bes, n, (size_t)max_batch_tokens * width,
                                           (size_t)max_batch_tokens * c->n_vocab, &tp->comm)
                 : comet_set_error(COMET_ERR_NOMEM, "tensor parallel: out of memory");
        free(bes);
    }
    for (int r = 0; r < n && st >= 0; r++)
        st = comet_forward_set_comm(tp->ranks[r].fc, comet_comm_group_rank(tp->comm, r),
                                    tp->ranks[r].shard.o_split ? NULL : tp->att_cols,
                                    tp->vocab_cols);
    for (int r = 1; r < n && st >= 0; r++) {
        if (pthread_create(&tp->ranks[r].thread, NULL, rank_main, &tp->ranks[r]))
            st = comet_set_error(COMET_ERR_INTERNAL,
                                 "tensor parallel: cannot start rank %d's "
                                 "thread",
                                 r);
        else
            tp->ranks[r].started = 1;
    }
    if (st < 0) {
        comet_tp_free(tp);
        return st;
    }
    *out = tp;
    return COMET_OK;
}

void comet_tp_free(comet_tp *tp) {
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    for (int r = 0; tp->ranks && r < tp->n; r++)
        if (tp->ranks[r].started)
            pthread_join(tp->ranks[r].thread, NULL);
    comet_comm_group_free(tp->comm);
    for (int r = tp->n - 1; tp->ranks && r >= 0; r--) {
        tp_rank *rk = &tp->ranks[r];
        comet_forward_free(rk->fc);
        comet_kv_cache_free_on(rk->be, &rk->kv); /* a zeroed kv: no-op */
        if (r > 0)
            comet_backend_free(rk->be);
        comet_shard_free(&rk->shard);
    }
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->go);
    pthread_cond_destroy(&tp->done);
    free(tp->ranks);
    free(tp->att_cols);
    free(tp->vocab_cols);
    free(tp);
}

comet_forward_ctx *comet_tp_rank0(comet_tp *tp) { return tp->ranks[0].fc; }

comet_status comet_tp_step(comet_tp *tp, const comet_batch *b, float *logits) {
    if (tp->broken)
        return comet_set_error(COMET_ERR_INTERNAL,
                               "tensor parallel: an earlier step failed on a rank and the "
                               "group's communicators were aborted; reload the model");
    COMET_TRY(comet_forward_check_batch(tp->ranks[0].fc, &tp->ranks[0].kv, b));
    pthread_mutex_lock(&tp->mu);
    tp->batch = b;
    tp->first_failed = -1;
    tp->pending = tp->n - 1;
    tp->step++;
    pthread_cond_broadcast(&tp->go);
    pthread_mutex_unlock(&tp->mu);
    run_rank(&tp->ranks[0], b, logits);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending > 0)
        pthread_cond_wait(&tp->done, &tp->mu);
    int failed = tp->first_failed;
    pthread_mutex_unlock(&tp->mu);
    if (failed < 0)
        return COMET_OK;
    tp_rank *rk = &tp->ranks[failed];
    comet_status st = comet_set_error(rk->st, "tensor parallel rank %d: %s", failed, rk->error);
    if (comet_comm_group_reset(tp->comm) < 0) {
        tp->broken = 1;
        comet_set_error(st, "tensor parallel rank %d: %s", failed, rk->error);
    }
    return st;
}
