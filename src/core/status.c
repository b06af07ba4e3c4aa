/* status.c — thread-local last-error message and the always-on assert. */
#include "comet/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char last_error[1024];
static _Thread_local comet_status last_status;

const char *comet_status_name(comet_status st) {
    switch (st) {
    case COMET_OK: return "COMET_OK";
    case COMET_KV_FULL: return "COMET_KV_FULL";
    case COMET_CANCELLED: return "COMET_CANCELLED";
    case COMET_QUEUE_FULL: return "COMET_QUEUE_FULL";
    case COMET_ERR_IO: return "COMET_ERR_IO";
    case COMET_ERR_FORMAT: return "COMET_ERR_FORMAT";
    case COMET_ERR_UNSUPPORTED: return "COMET_ERR_UNSUPPORTED";
    case COMET_ERR_NOMEM: return "COMET_ERR_NOMEM";
    case COMET_ERR_INVALID_ARG: return "COMET_ERR_INVALID_ARG";
    case COMET_ERR_CUDA: return "COMET_ERR_CUDA";
    case COMET_ERR_CONTEXT: return "COMET_ERR_CONTEXT";
    case COMET_ERR_INTERNAL: return "COMET_ERR_INTERNAL";
    case COMET_ERR_NUMERIC: return "COMET_ERR_NUMERIC";
    default: return "COMET_STATUS_UNKNOWN";
    }
}

comet_status comet_set_error(comet_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_status = st;
    return st;
}

comet_status comet_last_status(void) { return last_error[0] ? last_status : COMET_OK; }

const char *comet_last_error(void) { return last_error; }

void comet_clear_error(void) {
    last_error[0] = '\0';
    last_status = COMET_OK;
}

void comet_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "comet: assertion failed: %s at %s:%d\n", expr, file, line);
    fflush(stderr);
    abort();
}
