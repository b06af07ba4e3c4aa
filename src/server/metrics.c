/* metrics.c — Prometheus text exposition of the server's counters and histograms. */
#define _GNU_SOURCE
#include "server/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hist_init(comet_histogram *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->n_bounds = n;
    memcpy(h->bounds, bounds, (size_t)n * sizeof *bounds);
}

void comet_server_metrics_init(comet_server_metrics *m) {
    static const double ttft[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    static const double tpot[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                  0.15,  0.2,  0.3,   0.5,  1,     2.5};
    static const double e2e[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, ttft, 12);
    hist_init(&m->tpot, tpot, 12);
    hist_init(&m->e2e, e2e, 12);
}

void comet_server_metrics_free(comet_server_metrics *m) {
    if (m)
        pthread_mutex_destroy(&m->mu);
}

void comet_histogram_observe(comet_histogram *h, double v) {
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += v;
    h->count++;
}

void comet_server_metrics_record(comet_server_metrics *m, int status, int prompt_tokens,
                                 int completion_tokens, double ttft_s, double tpot_s,
                                 double e2e_s) {
    pthread_mutex_lock(&m->mu);
    if (status == 200)
        m->requests_ok++;
    else if (status < 0)
        m->requests_cancelled++;
    else
        m->requests_failed++;
    m->prompt_tokens += (uint64_t)(prompt_tokens > 0 ? prompt_tokens : 0);
    m->generation_tokens += (uint64_t)(completion_tokens > 0 ? completion_tokens : 0);
    if (ttft_s >= 0)
        comet_histogram_observe(&m->ttft, ttft_s);
    if (tpot_s >= 0)
        comet_histogram_observe(&m->tpot, tpot_s);
    if (e2e_s >= 0)
        comet_histogram_observe(&m->e2e, e2e_s);
    pthread_mutex_unlock(&m->mu);
}

void comet_server_metrics_count_response(comet_server_metrics *m, int status) {
    int cls = status >= 100 && status < 600 ? status / 100 : 0;
    pthread_mutex_lock(&m->mu);
    m->http_responses[cls]++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 1;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void metric(sbuf *b, const char *name, const char *type, const char *help, double v) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void hist(sbuf *b, const char *name, const char *help, const comet_histogram *h) {
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    sb_printf(b, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

char *comet_server_metrics_render(comet_server_metrics *m, const comet_metrics_gauges *g) {
    sbuf b = {malloc(4096), 0, 4096, 0};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    metric(&b, "comet_requests_running", "gauge", "Requests with a sequence in the running batch.",
           g->requests_running);
    metric(&b, "comet_requests_waiting", "gauge", "Requests queued, waiting for admission.",
           g->requests_waiting);
    metric(&b, "comet_kv_pages_used", "gauge", "KV cache pages held by sequences.",
           g->kv_pages_used);
    metric(&b, "comet_kv_pages_free", "gauge", "KV cache pages free in the pool.",
           g->kv_pages_free);
    metric(&b, "comet_preemptions_total", "counter",
           "Sequences preempted (pages freed, recomputed later) because the pool was full.",
           (double)g->preemptions);
    pthread_mutex_lock(&m->mu);
    sb_printf(&b,
              "# HELP comet_requests_total Finished HTTP generation requests by outcome.\n"
              "# TYPE comet_requests_total counter\n"
              "comet_requests_total{outcome=\"ok\"} %llu\n"
              "comet_requests_total{outcome=\"error\"} %llu\n"
              "comet_requests_total{outcome=\"cancelled\"} %llu\n",
              (unsigned long long)m->requests_ok, (unsigned long long)m->requests_failed,
              (unsigned long long)m->requests_cancelled);
    sb_printf(&b, "# HELP comet_http_responses_total HTTP responses by status class, refused "
                  "requests (401, 404, 413, 400 ...) included.\n"
                  "# TYPE comet_http_responses_total counter\n");
    for (int c = 2; c <= 5; c++)
        sb_printf(&b, "comet_http_responses_total{class=\"%dxx\"} %llu\n", c,
                  (unsigned long long)m->http_responses[c]);
    metric(&b, "comet_prompt_tokens_total", "counter", "Prompt tokens processed.",
           (double)m->prompt_tokens);
    metric(&b, "comet_generation_tokens_total", "counter", "Tokens generated.",
           (double)m->generation_tokens);
    hist(&b, "comet_time_to_first_token_seconds",
         "Time from request arrival to first token (TTFT).", &m->ttft);
    hist(&b, "comet_time_per_output_token_seconds",
         "Mean time per output token after the first (TPOT), per request.", &m->tpot);
    hist(&b, "comet_e2e_request_latency_seconds", "Time from request arrival to its last token.",
         &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
