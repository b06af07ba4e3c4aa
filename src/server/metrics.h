/* metrics.h — the server's Prometheus metrics: counters, latency histograms, and the
 * text exposition format (version 0.0.4) rendered for GET /metrics.
 *
 * The server records per-request latencies here (TTFT, TPOT, end-to-end) and counts
 * requests and tokens; gauges that belong to the engine (running/waiting requests, KV
 * pages) are passed in as a snapshot when rendering. Thread-safe (one mutex).
 */
#ifndef COMET_SERVER_METRICS_H
#define COMET_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#define COMET_HIST_MAX_BUCKETS 16

typedef struct comet_histogram {
    int n_bounds;
    double bounds[COMET_HIST_MAX_BUCKETS];       /* upper bounds, ascending; +Inf implied */
    uint64_t counts[COMET_HIST_MAX_BUCKETS + 1]; /* per bucket, not cumulative */
    double sum;
    uint64_t count;
} comet_histogram;

typedef struct comet_server_metrics {
    pthread_mutex_t mu;
    uint64_t requests_ok;        /* finished with 200 */
    uint64_t requests_failed;    /* answered with an error status */
    uint64_t requests_cancelled; /* client went away */
    uint64_t prompt_tokens;
    uint64_t generation_tokens;
    uint64_t http_responses[6]; /* every HTTP response by status class: [2] 2xx ... [5] 5xx
                                 * ([0]: other) */
    comet_histogram ttft; /* seconds from arrival to first token */
    comet_histogram tpot; /* seconds per output token after the first */
    comet_histogram e2e;  /* seconds from arrival to the last token */
} comet_server_metrics;

/* Engine-side gauges at render time. */
typedef struct comet_metrics_gauges {
    int requests_running;
    int requests_waiting;
    int kv_pages_used;
    int kv_pages_free;
    uint64_t preemptions;
} comet_metrics_gauges;

void comet_server_metrics_init(comet_server_metrics *m);
void comet_server_metrics_free(comet_server_metrics *m);

void comet_histogram_observe(comet_histogram *h, double v);

/* Record one finished request: status 200 / other / cancelled (-1); latencies in
 * seconds, < 0 when not applicable (no token produced). */
void comet_server_metrics_record(comet_server_metrics *m, int status, int prompt_tokens,
                                 int completion_tokens, double ttft_s, double tpot_s, double e2e_s);

/* Count one HTTP response of `status` (any route, refusals included) in its class. */
void comet_server_metrics_count_response(comet_server_metrics *m, int status);

/* Render the exposition text; malloc'd, caller frees; NULL when out of memory. */
char *comet_server_metrics_render(comet_server_metrics *m, const comet_metrics_gauges *g);

#endif
