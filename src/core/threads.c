/* threads.c — persistent pthread pool (see threads.h).
 *
 * Workers sleep on a condition variable between calls and are woken by a generation
 * counter; within a call they claim items with an atomic fetch-add, so uneven items
 * balance themselves. Workers spin briefly before sleeping, which keeps the wake-up
 * latency of back-to-back ops (one token's decode issues hundreds) low without burning
 * a core while idle.
 */
#define _GNU_SOURCE
#include "core/threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "comet/status.h"

#define SPIN_ITERS 20000

struct comet_threadpool {
    int n_threads;
    pthread_t *workers;
    pthread_mutex_t mu;      /* guards gen/stop and the condition variables */
    pthread_cond_t wake;     /* workers wait here for a new generation */
    pthread_cond_t done_cv;  /* the caller waits here for the workers to finish */
    pthread_mutex_t call_mu; /* serializes parallel_for callers */
    atomic_int gen;          /* bumped once per call */
    int stop;
    /* the current call */
    comet_task_fn fn;
    void *ctx;
    int n;
    atomic_int next;   /* next unclaimed item */
    atomic_int active; /* workers still inside the current call */
};

static _Thread_local int in_task;

static void run_items(comet_threadpool *tp, int tid) {
    in_task = 1;
    for (;;) {
        int i = atomic_fetch_add_explicit(&tp->next, 1, memory_order_relaxed);
        if (i >= tp->n)
            break;
        tp->fn(tp->ctx, i, tid);
    }
    in_task = 0;
}

typedef struct {
    comet_threadpool *tp;
    int tid;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    comet_threadpool *tp = wa.tp;
    int seen = 0;
    for (;;) {
        int spins = 0;
        while (atomic_load_explicit(&tp->gen, memory_order_acquire) == seen && spins < SPIN_ITERS)
            spins++;
        pthread_mutex_lock(&tp->mu);
        while (atomic_load(&tp->gen) == seen && !tp->stop)
            pthread_cond_wait(&tp->wake, &tp->mu);
        if (tp->stop) {
            pthread_mutex_unlock(&tp->mu);
            return NULL;
        }
        seen = atomic_load(&tp->gen);
        pthread_mutex_unlock(&tp->mu);

        run_items(tp, wa.tid);

        if (atomic_fetch_sub_explicit(&tp->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done_cv);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

int comet_n_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

comet_threadpool *comet_threadpool_init(int n_threads) {
    if (n_threads <= 0)
        n_threads = comet_n_cores();
    comet_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) {
        comet_set_error(COMET_ERR_NOMEM, "threadpool: out of memory");
        return NULL;
    }
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_mutex_init(&tp->call_mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done_cv, NULL);
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->next, 0);
    atomic_init(&tp->active, 0);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            comet_set_error(COMET_ERR_NOMEM, "threadpool: out of memory");
            return NULL;
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->tp = tp;
            wa->tid = i + 1;
        }
        if (!wa || pthread_create(&tp->workers[i], NULL, worker_main, wa) != 0) {
            free(wa);
            tp->n_threads = i + 1; /* the workers started so far, plus the caller */
            comet_threadpool_free(tp);
            comet_set_error(COMET_ERR_INTERNAL, "threadpool: cannot start thread %d of %d", i + 1,
                            n_threads - 1);
            return NULL;
        }
    }
    return tp;
}

void comet_threadpool_free(comet_threadpool *tp) {
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_threads - 1; i++)
        pthread_join(tp->workers[i], NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done_cv);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->call_mu);
    free(tp->workers);
    free(tp);
}

int comet_threadpool_size(const comet_threadpool *tp) { return tp ? tp->n_threads : 1; }

void comet_parallel_for(comet_threadpool *tp, int n, comet_task_fn fn, void *ctx) {
    if (n <= 0)
        return;
    if (!tp || tp->n_threads == 1 || n == 1 || in_task) {
        for (int i = 0; i < n; i++)
            fn(ctx, i, 0);
        return;
    }
    pthread_mutex_lock(&tp->call_mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    atomic_store(&tp->next, 0);
    atomic_store(&tp->active, tp->n_threads - 1);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);

    run_items(tp, 0);

    int spins = 0;
    while (atomic_load_explicit(&tp->active, memory_order_acquire) > 0 && spins < SPIN_ITERS)
        spins++;
    pthread_mutex_lock(&tp->mu);
    while (atomic_load(&tp->active) > 0)
        pthread_cond_wait(&tp->done_cv, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->call_mu);
}
