/* api.h — the OpenAI routes over the engine: the server's generate hook.
 *
 * Turns a validated request into prompt tokens (chat template for chat; BOS as the model
 * wants, exactly as `comet generate` builds its prompt), submits it to the engine and
 * answers with one JSON response or an SSE stream (chunks, the usage chunk when
 * stream_options.include_usage, then `data: [DONE]`). Logprobs and top_logprobs for
 * both routes; echo with prompt logprobs for completions. A client that goes away
 * mid-stream cancels its request. Latencies (TTFT, TPOT, end-to-end) go to the server's
 * metrics.
 */
#ifndef COMET_SERVER_API_H
#define COMET_SERVER_API_H

#include "comet/engine.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "server/server.h"

typedef struct comet_api {
    comet_engine *engine;     /* borrowed */
    const comet_model *model; /* borrowed */
    const char *model_id;     /* borrowed; the id clients send as "model" */
    comet_chat *chat;              /* owned; NULL: the chat route answers 400 (no template) */
    int has_tmpl;                  /* chat != NULL */
    char bos[128];                 /* BOS text for templates that start with it, or "" */
    char eos[128];                 /* EOS text (Jinja templates' eos_token), or "" */
    int kv_tokens;                 /* tokens the engine's KV pool holds (a default max_tokens is cut
                               * to it, as to the context); 0: not known */
    int allow_special_in_messages; /* 0 (default): special-token text in a message's content
                                    * is plain text; 1 (serve --allow-special-in-messages, for
                                    * trusted clients only): it becomes the control token */
} comet_api;

/* Bind the routes to an engine and model. `template_name` overrides the model's Jinja
 * chat template (a built-in name "chatml", "llama3", "llama2", or a Jinja file) or is
 * NULL (comet_chat_init). Logs which template is used. Returns COMET_OK (without any
 * template the chat route answers 400), or the error of a bad override or of a model
 * template that does not parse. Release with comet_api_free. */
comet_status comet_api_init(comet_api *a, comet_engine *e, const comet_model *m,
                            const char *model_id, const char *template_name);
void comet_api_free(comet_api *a);

/* The chat route's prompt ids: the messages rendered with the chat template, only the
 * template's own markers as control tokens (comet_chat_tokenize; message contents are
 * plain text unless allow_special_in_messages), BOS prepended when the model wants one.
 * *ids is malloc'd. */
comet_status comet_api_chat_prompt(const comet_api *a, const comet_chat_message *msgs,
                                   size_t n_msgs, int32_t **ids, int *n_ids);

/* comet_server_generate_fn and comet_server_gauges_fn; `user` is the comet_api. */
void comet_api_generate(void *user, comet_server *srv, comet_oai_request *req,
                        comet_server_reply *reply);
void comet_api_gauges(void *user, comet_metrics_gauges *g);

#endif
