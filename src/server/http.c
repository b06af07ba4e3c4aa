/* http.c — libmicrohttpd plumbing: binding, routing, Bearer auth, body accumulation with
 * a size limit, JSON and SSE responses, in-flight accounting for a graceful drain.
 *
 * MHD runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a generate
 * hook and an SSE reader may block. MHD's own diagnostics go to comet_log at DEBUG. Every
 * response counts in /metrics by status class; a refused or failed one (status >= 400)
 * also gets a log line with its method, path, status and reason.
 * What the routes compute lives elsewhere: openai.c (parsing, JSON), metrics.c, and the
 * generate hook (api.c, over the engine).
 */
#define _GNU_SOURCE
#include "server/server.h"

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comet/log.h"

struct comet_server {
    comet_server_params p;
    char *host, *api_key, *model_id;
    struct MHD_Daemon *daemon;
    int port;
    long created;
    atomic_int in_flight;
    comet_server_metrics metrics;
};

typedef enum route {
    ROUTE_NONE,
    ROUTE_HEALTH,
    ROUTE_MODELS,
    ROUTE_METRICS,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
} route;

typedef struct conn_ctx {
    route r;
    char method[8]; /* for the log line of a refusal: the request's method and path, */
    char path[96];  /* truncated, control bytes as '?' */
    char *body;
    size_t len, cap;
    int too_large;
    int answered;
} conn_ctx;

typedef struct stream_ctx {
    comet_server_stream s;
    int finished;
} stream_ctx;

comet_server_params comet_server_default_params(void) {
    comet_server_params p;
    memset(&p, 0, sizeof p);
    p.host = "127.0.0.1";
    p.port = 8000;
    p.max_body_bytes = 4u << 20;
    p.max_connections = 512;
    p.model_id = "default";
    p.n_ctx = 2048;
    p.n_vocab = 1;
    p.defaults = comet_oai_default_defaults();
    return p;
}

char *comet_server_error_body(int status, const char *param, const char *code, const char *fmt,
                              ...) {
    comet_oai_error e;
    const char *type = status == 401   ? "authentication_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    comet_oai_fail(&e, status, type, param, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return comet_oai_error_json(&e);
}

static enum MHD_Result send_body(struct MHD_Connection *c, int status, char *body,
                                 const char *content_type) {
    if (!body)
        return MHD_NO; /* out of memory: MHD closes the connection */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, char *body) {
    return send_body(c, status, body, "application/json");
}

/* A response to cx's request is being queued: count it by status class, and log one with
 * status >= 400 (method, path, status, reason): INFO for 4xx, as vLLM and llama.cpp log
 * rejected requests, WARN for 5xx. */
static void note_response(comet_server *s, const conn_ctx *cx, int status, const char *reason) {
    comet_server_metrics_count_response(&s->metrics, status);
    if (status >= 400)
        comet_log(status >= 500 ? COMET_LOG_WARN : COMET_LOG_INFO, "http: %s %s -> %d: %s",
                  cx->method, cx->path, status, reason && reason[0] ? reason : "(no reason)");
}

/* The "error"."message" of an OpenAI error body, copied into buf[cap] ("" when absent). */
static const char *error_message(const char *body, char *buf, size_t cap) {
    buf[0] = '\0';
    cJSON *o = body ? cJSON_Parse(body) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"),
                                                      "message");
    if (cJSON_IsString(m))
        snprintf(buf, cap, "%s", m->valuestring);
    cJSON_Delete(o);
    return buf;
}

/* Refuse cx's request with an OpenAI error object. A refused generation request counts in
 * comet_requests_total{outcome="error"} as one refused after parsing does. */
static enum MHD_Result send_error(comet_server *s, conn_ctx *cx, struct MHD_Connection *c,
                                  int status, const char *param, const char *code,
                                  const char *msg) {
    cx->answered = 1;
    if (cx->r == ROUTE_COMPLETIONS || cx->r == ROUTE_CHAT)
        comet_server_metrics_record(&s->metrics, status, 0, 0, -1, -1, -1);
    note_response(s, cx, status, msg);
    return send_json(c, status, comet_server_error_body(status, param, code, "%s", msg));
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *sc = cls;
    ssize_t n = sc->s.read(sc->s.ctx, buf, max);
    if (n < 0) {
        sc->finished = 1;
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    return n;
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    sc->s.close(sc->s.ctx, sc->finished);
    free(sc);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, comet_server_reply *rep) {
    if (!rep->stream.read)
        return send_json(c, rep->status ? rep->status : 500, rep->body);
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        rep->stream.close(rep->stream.ctx, 0);
        return MHD_NO;
    }
    sc->s = rep->stream;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, sc, stream_free);
    if (!r) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* 1 when the peer has closed the connection (EOF pending, or hang-up). */
static int client_gone(void *client) {
    struct MHD_Connection *c = client;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return 1;
    char b;
    return recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static route find_route(const char *url, const char *method, int *method_ok) {
    static const struct {
        const char *url, *method;
        route r;
    } routes[] = {
        {"/health", "GET", ROUTE_HEALTH},
        {"/v1/models", "GET", ROUTE_MODELS},
        {"/metrics", "GET", ROUTE_METRICS},
        {"/v1/completions", "POST", ROUTE_COMPLETIONS},
        {"/v1/chat/completions", "POST", ROUTE_CHAT},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!strcmp(url, routes[i].url)) {
            *method_ok = !strcmp(method, routes[i].method) ||
                         (!strcmp(method, "HEAD") && !strcmp(routes[i].method, "GET"));
            return routes[i].r;
        }
    }
    *method_ok = 0;
    return ROUTE_NONE;
}

static int authorized(comet_server *s, struct MHD_Connection *c) {
    if (!s->api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7))
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    /* compare without an early exit on the first differing byte */
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++)
        diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i];
    return diff == 0;
}

static enum MHD_Result answer_get(comet_server *s, conn_ctx *cx, struct MHD_Connection *c) {
    cx->answered = 1;
    if (cx->r == ROUTE_HEALTH || cx->r == ROUTE_MODELS || cx->r == ROUTE_METRICS)
        note_response(s, cx, 200, NULL);
    switch (cx->r) {
    case ROUTE_HEALTH: return send_json(c, 200, strdup("{\"status\":\"ok\"}"));
    case ROUTE_MODELS:
        return send_json(c, 200, comet_oai_models_json(s->model_id, s->created, s->p.n_ctx));
    case ROUTE_METRICS: {
        comet_metrics_gauges g;
        memset(&g, 0, sizeof g);
        if (s->p.gauges)
            s->p.gauges(s->p.user, &g);
        return send_body(c, 200, comet_server_metrics_render(&s->metrics, &g),
                         "text/plain; version=0.0.4; charset=utf-8");
    }
    default: return send_error(s, cx, c, 500, NULL, NULL, "unrouted request");
    }
}

static enum MHD_Result answer_post(comet_server *s, conn_ctx *cx, struct MHD_Connection *c) {
    comet_oai_kind kind = cx->r == ROUTE_CHAT ? COMET_OAI_CHAT : COMET_OAI_COMPLETION;
    comet_oai_limits lim = {s->model_id, s->p.n_ctx, s->p.n_vocab, &s->p.defaults};
    comet_oai_request req;
    comet_oai_error err;
    cx->answered = 1;
    if (comet_oai_parse(kind, cx->body ? cx->body : "", cx->len, &lim, &req, &err)) {
        comet_server_metrics_record(&s->metrics, err.http_status, 0, 0, -1, -1, -1);
        note_response(s, cx, err.http_status, err.message);
        return send_json(c, err.http_status, comet_oai_error_json(&err));
    }
    free(cx->body);
    cx->body = NULL;
    if (!s->p.generate) {
        comet_oai_request_free(&req);
        return send_error(s, cx, c, 503, NULL, NULL, "no model is loaded for generation");
    }
    comet_server_reply rep;
    memset(&rep, 0, sizeof rep);
    rep.client_gone = client_gone;
    rep.client = c;
    s->p.generate(s->p.user, s, &req, &rep);
    int status = rep.stream.read ? 200 : rep.status ? rep.status : 500;
    char why[256] = "";
    if (status >= 400)
        error_message(rep.body, why, sizeof why);
    note_response(s, cx, status, why);
    return send_reply(c, &rep);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls) {
    (void)version;
    comet_server *s = cls;
    conn_ctx *cx = *con_cls;
    if (!cx) {
        cx = calloc(1, sizeof *cx);
        if (!cx)
            return MHD_NO;
        *con_cls = cx;
        atomic_fetch_add(&s->in_flight, 1);
        snprintf(cx->method, sizeof cx->method, "%s", method);
        snprintf(cx->path, sizeof cx->path, "%s", url);
        for (char *p = cx->path; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        int method_ok;
        cx->r = find_route(url, method, &method_ok);
        if (cx->r == ROUTE_NONE)
            return send_error(s, cx, c, 404, NULL, "not_found", "no route for this path");
        if (!method_ok)
            return send_error(s, cx, c, 405, NULL, NULL, "method not allowed on this path");
        if (!strncmp(url, "/v1/", 4) && !authorized(s, c))
            return send_error(s, cx, c, 401, NULL, "invalid_api_key",
                              "missing or wrong API key (send 'Authorization: Bearer <key>')");
        if (cx->r == ROUTE_COMPLETIONS || cx->r == ROUTE_CHAT) {
            const char *cl =
                MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > s->p.max_body_bytes) {
                char msg[160];
                snprintf(msg, sizeof msg, "request body of %s bytes is over the limit of %zu bytes",
                         cl, s->p.max_body_bytes);
                return send_error(s, cx, c, 413, NULL, "request_too_large", msg);
            }
        }
        return MHD_YES;
    }
    if (cx->answered) { /* body of an already refused request: drop it */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cx->too_large || cx->r == ROUTE_HEALTH || cx->r == ROUTE_MODELS ||
            cx->r == ROUTE_METRICS)
            return MHD_YES;
        if (cx->len + n > s->p.max_body_bytes) {
            cx->too_large = 1;
            free(cx->body);
            cx->body = NULL;
            return MHD_YES;
        }
        if (cx->len + n + 1 > cx->cap) {
            size_t cap = cx->cap ? cx->cap : 4096;
            while (cap < cx->len + n + 1)
                cap *= 2;
            char *b = realloc(cx->body, cap);
            if (!b)
                return MHD_NO;
            cx->body = b;
            cx->cap = cap;
        }
        memcpy(cx->body + cx->len, upload_data, n);
        cx->len += n;
        cx->body[cx->len] = '\0';
        return MHD_YES;
    }
    if (cx->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes",
                 s->p.max_body_bytes);
        return send_error(s, cx, c, 413, NULL, "request_too_large", msg);
    }
    if (cx->r == ROUTE_COMPLETIONS || cx->r == ROUTE_CHAT)
        return answer_post(s, cx, c);
    return answer_get(s, cx, c);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    comet_server *s = cls;
    conn_ctx *cx = *con_cls;
    if (!cx)
        return;
    free(cx->body);
    free(cx);
    *con_cls = NULL;
    atomic_fetch_sub(&s->in_flight, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    comet_log(COMET_LOG_DEBUG, "http: %s", msg);
}

comet_server *comet_server_start(const comet_server_params *p) {
    comet_server *s = calloc(1, sizeof *s);
    if (!s) {
        comet_set_error(COMET_ERR_NOMEM, "server: out of memory");
        return NULL;
    }
    s->p = *p;
    s->host = strdup(p->host && p->host[0] ? p->host : "127.0.0.1");
    s->api_key = p->api_key && p->api_key[0] ? strdup(p->api_key) : NULL;
    s->model_id = strdup(p->model_id ? p->model_id : "default");
    if (!s->p.max_body_bytes)
        s->p.max_body_bytes = 4u << 20;
    if (s->p.max_connections <= 0)
        s->p.max_connections = 512;
    if (!(s->p.defaults.sampling.top_p > 0 && s->p.defaults.sampling.top_p <= 1)) /* zeroed */
        s->p.defaults = comet_oai_default_defaults();
    s->created = (long)time(NULL);
    comet_server_metrics_init(&s->metrics);

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai || !ai) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "server: cannot resolve host '%s': %s; use an IP "
                        "address such as 127.0.0.1",
                        s->host, gai_strerror(gai));
        comet_server_stop(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)s->p.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        comet_set_error(COMET_ERR_IO,
                        "server: cannot listen on %s:%d (port in use or address "
                        "not local?)",
                        s->host, p->port);
        comet_server_stop(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    return s;
}

int comet_server_port(const comet_server *s) { return s->port; }

comet_server_metrics *comet_server_metrics_get(comet_server *s) { return &s->metrics; }

void comet_server_quiesce(comet_server *s) {
    if (s && s->daemon) {
        MHD_socket fd = MHD_quiesce_daemon(s->daemon);
        if (fd != MHD_INVALID_SOCKET)
            close(fd); /* MHD hands the listening socket back to us */
    }
}

int comet_server_in_flight(comet_server *s) { return atomic_load(&s->in_flight); }

void comet_server_stop(comet_server *s) {
    if (!s)
        return;
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    comet_server_metrics_free(&s->metrics);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s);
}
