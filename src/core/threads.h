/* threads.h — a small persistent pthread pool with parallel_for.
 *
 * The pool is created once (backend init) and reused by every op: a call hands the
 * workers one function and a range of items; items are claimed through an atomic
 * counter, the calling thread works too, and the call returns when all items are done.
 * No allocation per call. One parallel_for at a time per pool (calls from several
 * threads on one pool are serialized by a mutex); a nested call from inside a task runs
 * serially on the calling thread.
 */
#ifndef COMET_CORE_THREADS_H
#define COMET_CORE_THREADS_H

typedef struct comet_threadpool comet_threadpool;

/* One item of work: `i` in [0, n), `tid` in [0, n_threads) names the thread running it
 * (for per-thread scratch). */
typedef void (*comet_task_fn)(void *ctx, int i, int tid);

/* A pool of n_threads threads counting the caller (n_threads - 1 workers are started);
 * n_threads <= 0 means the number of online cores. NULL + comet_last_error() on failure. */
comet_threadpool *comet_threadpool_init(int n_threads);

/* Stop and join the workers. NULL is a no-op. */
void comet_threadpool_free(comet_threadpool *tp);

/* Threads in the pool, counting the caller. */
int comet_threadpool_size(const comet_threadpool *tp);

/* Run fn(ctx, i, tid) for every i in [0, n) across the pool; returns when all are done.
 * tp may be NULL (runs serially with tid 0). */
void comet_parallel_for(comet_threadpool *tp, int n, comet_task_fn fn, void *ctx);

/* Number of online cores (at least 1). */
int comet_n_cores(void);

#endif
