/* server.h — the HTTP/1.1 server (libmicrohttpd): routes, auth, body limits, SSE.
 *
 * Routes: GET /health, GET /v1/models, GET /metrics, POST /v1/completions,
 * POST /v1/chat/completions; anything else is 404 (405 for a known path with the wrong
 * method). The /v1/ routes need "Authorization: Bearer <api_key>" when an API key is set.
 * Bodies above max_body_bytes are refused with 413 (from Content-Length before the body
 * is read, or as soon as a chunked body passes the limit; the excess is never stored).
 * Generation requests are parsed and validated here (openai.h) and then handed, already
 * valid, to the `generate` hook, which answers with a whole JSON body or an SSE stream.
 * One thread per connection: a hook may block until its answer is ready.
 */
#ifndef COMET_SERVER_SERVER_H
#define COMET_SERVER_SERVER_H

#include <stddef.h>
#include <sys/types.h>

#include "comet/status.h"
#include "server/metrics.h"
#include "server/openai.h"

typedef struct comet_server comet_server;

/* An SSE stream produced by a generate hook. */
typedef struct comet_server_stream {
    /* Write up to `max` bytes of the stream into buf, blocking until some are ready.
     * Returns the byte count (> 0), or -1 at the end of the stream. */
    ssize_t (*read)(void *ctx, char *buf, size_t max);
    /* Called exactly once when the connection is done with the stream; `finished` is 0
     * when the client went away (or the server stopped) before the end. Frees ctx. */
    void (*close)(void *ctx, int finished);
    void *ctx;
} comet_server_stream;

/* A generate hook's answer: `status` with a malloc'd JSON `body` (taken by the server),
 * or, when stream.read is set, a 200 text/event-stream response read from `stream`. */
typedef struct comet_server_reply {
    int status;
    char *body;
    comet_server_stream stream;
    /* Set by the server before the hook runs: client_gone(client) answers 1 once the
     * client has closed its connection (for a hook that waits on a whole answer). */
    int (*client_gone)(void *client);
    void *client;
} comet_server_reply;

/* Answers one validated request. Takes ownership of *req (must comet_oai_request_free it,
 * now or when its stream closes). Runs on the connection's thread and may block. */
typedef void (*comet_server_generate_fn)(void *user, comet_server *srv, comet_oai_request *req,
                                         comet_server_reply *reply);

/* Fills the engine-side gauges for /metrics. */
typedef void (*comet_server_gauges_fn)(void *user, comet_metrics_gauges *g);

typedef struct comet_server_params {
    const char *host;                  /* address to bind; "127.0.0.1" by default */
    int port;                          /* 0 picks a free port (see comet_server_port) */
    const char *api_key;               /* NULL or "": no auth */
    size_t max_body_bytes;             /* default 4 MiB */
    int max_connections;               /* default 512 */
    const char *model_id;              /* served model id (/v1/models, request "model") */
    int n_ctx;                         /* context length (max_tokens limit, /v1/models) */
    int n_vocab;                       /* token-id prompts must be < n_vocab */
    comet_oai_defaults defaults;       /* for fields a request leaves out (default:
                                  * comet_oai_default_defaults, `comet generate`'s) */
    comet_server_generate_fn generate; /* NULL: generation routes answer 503 */
    comet_server_gauges_fn gauges;     /* may be NULL */
    void *user;                        /* passed to the hooks */
} comet_server_params;

comet_server_params comet_server_default_params(void);

/* Bind and start serving on background threads. Returns NULL with comet_last_error() set
 * when the address cannot be bound. Strings in params are copied. */
comet_server *comet_server_start(const comet_server_params *p);

/* The bound TCP port. */
int comet_server_port(const comet_server *s);

/* The server's metrics (hooks record request latencies here). */
comet_server_metrics *comet_server_metrics_get(comet_server *s);

/* Stop accepting connections (for a graceful drain); requests in flight continue. */
void comet_server_quiesce(comet_server *s);

/* Requests accepted and not yet finished. */
int comet_server_in_flight(comet_server *s);

/* Stop the daemon (open connections are closed) and free. NULL is a no-op. */
void comet_server_stop(comet_server *s);

/* Build a JSON error body for an HTTP status with an OpenAI error object. */
char *comet_server_error_body(int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
