/* comet/log.h — logging through a callback.
 *
 * Library code reports progress and diagnostics only through comet_log(); the
 * application decides where it goes (the CLI prints to stderr). With no callback set,
 * messages at COMET_LOG_WARN and above go to stderr, the rest are dropped.
 */
#ifndef COMET_LOG_H
#define COMET_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum comet_log_level {
    COMET_LOG_DEBUG,
    COMET_LOG_INFO,
    COMET_LOG_WARN,
    COMET_LOG_ERROR,
    COMET_LOG_LEVEL_COUNT
} comet_log_level;

/* `msg` is one line without a trailing newline; a progress line (rewritten in place on a
 * terminal) is logged with `progress` = 1. */
typedef void (*comet_log_fn)(comet_log_level level, int progress, const char *msg, void *user);

/* Install the log callback (NULL restores the default) and the minimum level passed to it. */
void comet_log_set(comet_log_fn fn, void *user, comet_log_level min_level);

void comet_log(comet_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A progress line: "<what> <done>/<total> (<pct>%)" plus an optional suffix. */
void comet_log_progress(const char *what, long done, long total, const char *suffix);

#ifdef __cplusplus
}
#endif
#endif
