/* comet/status.h — status codes, the last-error message, and always-on asserts.
 *
 * Library code never exit()s and never prints: a runtime failure returns a negative
 * comet_status and leaves a one-line message in a thread-local buffer readable with
 * comet_last_error(). Soft outcomes the caller decides on are positive. A broken
 * invariant (a bug) is a COMET_ASSERT, which prints expression, file and line and aborts.
 */
#ifndef COMET_STATUS_H
#define COMET_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum comet_status {
    COMET_OK = 0,
    /* soft outcomes (> 0) */
    COMET_KV_FULL = 1,    /* the KV page pool cannot hold the next step */
    COMET_CANCELLED = 2,  /* the request was cancelled */
    COMET_QUEUE_FULL = 3, /* the engine's request queue is full; retry later */
    COMET_STATUS_SOFT_COUNT,
    /* failures (< 0) */
    COMET_ERR_IO = -1,          /* open/read/mmap failed */
    COMET_ERR_FORMAT = -2,      /* a file is malformed (bad magic, truncated, bad offsets) */
    COMET_ERR_UNSUPPORTED = -3, /* well-formed but not supported (architecture, tensor type) */
    COMET_ERR_NOMEM = -4,       /* allocation failed */
    COMET_ERR_INVALID_ARG = -5, /* bad argument from the caller or the user */
    COMET_ERR_CUDA = -6,        /* a CUDA runtime/library call failed */
    COMET_ERR_CONTEXT = -7,     /* prompt or sequence longer than the context */
    COMET_ERR_INTERNAL = -8,    /* unexpected condition that is not a bug in the caller */
    COMET_ERR_NUMERIC = -9,     /* a computation gave NaN or infinity (input or weights overflow) */
} comet_status;

/* Human-readable name of a status ("COMET_ERR_FORMAT"). Never NULL. */
const char *comet_status_name(comet_status st);

/* Set the calling thread's last-error message (printf format) and return `st`, so that
 * `return comet_set_error(COMET_ERR_FORMAT, "%s: bad magic", path);` reads as one line. */
comet_status comet_set_error(comet_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last error message; "" if none. Valid until the next failing call
 * on the same thread. */
const char *comet_last_error(void);

/* The status given with the calling thread's last error message; COMET_OK if none (for
 * constructors that return NULL and callers that want the status as well). */
comet_status comet_last_status(void);

/* Clear the calling thread's last-error message. */
void comet_clear_error(void);

/* Print "comet: assertion failed: <expr> at <file>:<line>" to stderr and abort(). */
void comet_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define COMET_ASSERT(expr) ((expr) ? (void)0 : comet_assert_fail(#expr, __FILE__, __LINE__))

/* Propagate a failure: evaluate `call`; if it returned a negative status, return it. */
#define COMET_TRY(call)                                                                            \
    do {                                                                                           \
        comet_status comet_try_st_ = (call);                                                       \
        if (comet_try_st_ < 0)                                                                     \
            return comet_try_st_;                                                                  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
