/* log.c — the log callback and the default stderr sink. */
#include "comet/log.h"

#include <stdarg.h>
#include <stdio.h>

static comet_log_fn log_fn;
static void *log_user;
static comet_log_level log_min = COMET_LOG_WARN;

void comet_log_set(comet_log_fn fn, void *user, comet_log_level min_level) {
    log_fn = fn;
    log_user = user;
    log_min = min_level;
}

static void emit(comet_log_level level, int progress, const char *msg) {
    if (level < log_min)
        return;
    if (log_fn) {
        log_fn(level, progress, msg, log_user);
        return;
    }
    fprintf(stderr, "%s\n", msg);
}

void comet_log(comet_log_level level, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(level, 0, buf);
}

void comet_log_progress(const char *what, long done, long total, const char *suffix) {
    char buf[512];
    double pct = total > 0 ? 100.0 * (double)done / (double)total : 100.0;
    snprintf(buf, sizeof buf, "%s %ld/%ld (%.0f%%)%s%s", what, done, total, pct,
             suffix && suffix[0] ? " " : "", suffix ? suffix : "");
    emit(COMET_LOG_INFO, 1, buf);
}
