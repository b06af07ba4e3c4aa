/* comet/server.h — an OpenAI-compatible HTTP server over a running engine
 * (comet/engine.h): GET /health, GET /v1/models, POST /v1/completions,
 * POST /v1/chat/completions (stream: true for SSE), GET /metrics (Prometheus).
 *
 * Requests are validated, turned into prompt tokens (the chat template for chat; BOS as
 * the model wants, as comet_chat_tokenize builds it) and submitted to the engine; the
 * server runs on background threads, one per connection. The fields a request leaves out
 * take the server's defaults: `comet generate`'s sampling, then the model's
 * generation_config.json (comet_model.gen), then the overrides in the params, each merged
 * by its "given" mask (comet_sampler_params_merge).
 */
#ifndef COMET_SERVER_H
#define COMET_SERVER_H

#include <stddef.h>

#include "comet/engine.h"
#include "comet/model.h"
#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comet_openai_server comet_openai_server;

typedef struct comet_openai_server_params {
    const char *host;              /* address to bind (default "127.0.0.1") */
    int port;                      /* TCP port (default 8000); 0 picks a free one
                                * (comet_openai_server_port) */
    const char *api_key;           /* NULL or "" (default): no auth; else the /v1/ routes need
                                * "Authorization: Bearer <api_key>" */
    size_t max_body_bytes;         /* request body limit; larger bodies get 413 (default 4 MiB) */
    const char *model_id;          /* the model name clients send and /v1/models lists
                                * (default "default") */
    const char *chat_template;     /* "chatml", "llama3", "llama2", or NULL (default): detected
                                * from the model; none known: the chat route answers 400 */
    int allow_special_in_messages; /* 1: special-token text in a chat message's content
                                    * becomes that control token; any client can forge system
                                    * turns: trusted clients only. Default 0: plain text */
    int kv_tokens;                 /* tokens the engine's KV pool holds (n_pages * page_size of
                                    * its comet_engine_params): a default max_tokens is cut to
                                    * it; 0 (default): not known */
    /* Request defaults that override the model's generation_config.json: the fields of
     * `sampling` whose COMET_SAMPLER_* bits are in sampling_given (default 0: none);
     * checked at start (comet_sampler_params_check). sampling.logit_bias is borrowed: it
     * must outlive the server. */
    comet_sampler_params sampling;
    unsigned sampling_given;
    int max_tokens; /* < 0 (default): not given; 0: both routes up to the context (as comet
                     * generate's 0) */
} comet_openai_server_params;

comet_openai_server_params comet_openai_server_default_params(void);

/* Bind and start serving requests of model `m` through engine `e` (both borrowed: they
 * must outlive the server). Logs a warning for allow_special_in_messages and for a model
 * without a known chat template, and the request defaults in effect. Strings in `p` are
 * copied. Returns COMET_OK with *out (stop with comet_openai_server_stop), or a negative
 * status with comet_last_error() naming the problem and *out NULL: COMET_ERR_INVALID_ARG
 * for an unknown chat_template (comet_chat_template_from_name) or other bad params;
 * COMET_ERR_IO when the address cannot be bound; COMET_ERR_NOMEM. */
comet_status comet_openai_server_start(comet_engine *e, const comet_model *m,
                                       const comet_openai_server_params *p,
                                       comet_openai_server **out);

/* The bound TCP port. */
int comet_openai_server_port(const comet_openai_server *s);

/* Stop accepting connections (for a graceful drain); requests in flight continue. */
void comet_openai_server_quiesce(comet_openai_server *s);

/* Requests accepted and not yet finished. */
int comet_openai_server_in_flight(comet_openai_server *s);

/* Stop the server (open connections are closed; cancel the engine's requests first with
 * comet_engine_cancel_all so that their streams end) and free it. NULL is a no-op. */
void comet_openai_server_stop(comet_openai_server *s);

#ifdef __cplusplus
}
#endif
#endif
