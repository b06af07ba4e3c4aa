/* test_threads.c — the persistent pool: every item runs exactly once, thread ids stay in
 * range, thousands of back-to-back calls (the decode pattern) neither lose nor repeat
 * work, nested calls run serially, and a NULL pool runs on the caller. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "core/threads.h"

typedef struct {
    atomic_int *hits;
    int n_threads;
    atomic_int bad_tid;
    comet_threadpool *tp;
    atomic_long sum;
} job;

static void count_task(void *ctx, int i, int tid) {
    job *j = ctx;
    atomic_fetch_add(&j->hits[i], 1);
    if (tid < 0 || tid >= j->n_threads)
        atomic_store(&j->bad_tid, 1);
}

static void test_each_item_once(void **state) {
    int sizes[] = {1, 2, 3, 7, 100, 10007};
    for (int nt = 1; nt <= 4; nt++) {
        comet_threadpool *tp = comet_threadpool_init(nt);
        assert_non_null(tp);
        assert_int_equal(comet_threadpool_size(tp), nt);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            int n = sizes[k];
            job j = {.hits = calloc((size_t)n, sizeof(atomic_int)), .n_threads = nt};
            comet_parallel_for(tp, n, count_task, &j);
            for (int i = 0; i < n; i++)
                assert_int_equal(atomic_load(&j.hits[i]), 1);
            assert_int_equal(atomic_load(&j.bad_tid), 0);
            free(j.hits);
        }
        comet_threadpool_free(tp);
    }
}

static void sum_task(void *ctx, int i, int tid) {
    job *j = ctx;
    atomic_fetch_add(&j->sum, i + 1);
}

static void test_back_to_back(void **state) {
    comet_threadpool *tp = comet_threadpool_init(3);
    job j = {0};
    long want = 0;
    for (int call = 0; call < 5000; call++) {
        int n = 1 + call % 9;
        comet_parallel_for(tp, n, sum_task, &j);
        want += (long)n * (n + 1) / 2;
        assert_int_equal(atomic_load(&j.sum), want); /* the call returned after all items */
    }
    comet_threadpool_free(tp);
}

static void outer_task(void *ctx, int i, int tid) {
    job *j = ctx;
    comet_parallel_for(j->tp, 4, sum_task, j); /* nested: serial on this thread */
}

static void test_nested_and_null(void **state) {
    job j = {0};
    j.tp = comet_threadpool_init(2);
    comet_parallel_for(j.tp, 10, outer_task, &j);
    assert_int_equal(atomic_load(&j.sum), 10 * (1 + 2 + 3 + 4));
    comet_threadpool_free(j.tp);
    job k = {.hits = calloc(5, sizeof(atomic_int)), .n_threads = 1};
    comet_parallel_for(NULL, 5, count_task, &k);
    for (int i = 0; i < 5; i++)
        assert_int_equal(atomic_load(&k.hits[i]), 1);
    free(k.hits);
    comet_threadpool_free(NULL);
    assert_true(comet_n_cores() >= 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_item_once),
        cmocka_unit_test(test_back_to_back),
        cmocka_unit_test(test_nested_and_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
