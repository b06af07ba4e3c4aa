/* openai.h — the OpenAI-compatible request parser and response builders.
 *
 * Parses the JSON bodies of POST /v1/completions and POST /v1/chat/completions into a
 * plain C request, checking every parameter the server supports (types, ranges, n = 1,
 * UTF-8) and naming the first bad one in an OpenAI error object
 * {"error": {"message", "type", "param", "code"}}. Builds the JSON of responses, SSE
 * chunks, /v1/models and errors with cJSON. Nothing here touches the network, the
 * tokenizer or the engine: http.c and api.c do that.
 * Reference: the OpenAI API reference for /v1/completions and /v1/chat/completions.
 */
#ifndef COMET_SERVER_OPENAI_H
#define COMET_SERVER_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "comet/sampling.h"
#include "comet/tokenizer.h"
#include "comet/utf8.h"

typedef enum comet_oai_kind {
    COMET_OAI_COMPLETION, /* /v1/completions */
    COMET_OAI_CHAT,       /* /v1/chat/completions */
    COMET_OAI_KIND_COUNT
} comet_oai_kind;

/* An error to send back: HTTP status plus the OpenAI error object's fields.
 * type/param/code point to static strings or into `param_buf`; param and code may be NULL
 * (sent as JSON null). */
typedef struct comet_oai_error {
    int http_status;
    char message[512];
    const char *type;
    const char *param;
    const char *code;
    char param_buf[64];
} comet_oai_error;

/* Fill `e` (printf-style message). Returns http_status for `return comet_oai_fail(...)`. */
int comet_oai_fail(comet_oai_error *e, int http_status, const char *type, const char *param,
                   const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#define COMET_OAI_MAX_STOP 4
#define COMET_OAI_MAX_TOP_LOGPROBS 20

/* A parsed request. Strings are owned (malloc'd) and released by comet_oai_request_free.
 * Unset optional numbers hold the defaults listed beside them. */
typedef struct comet_oai_request {
    comet_oai_kind kind;
    char *model;
    /* completions: exactly one of prompt / prompt_ids is set */
    char *prompt;        /* UTF-8 text, or NULL */
    int32_t *prompt_ids; /* [n_prompt_ids] token ids, or NULL */
    int n_prompt_ids;
    /* chat: messages with owned role/content strings */
    comet_chat_message *messages; /* [n_messages] */
    int n_messages;
    char *messages_json; /* chat: the messages as a JSON array (contents as parsed) for the
                          * Jinja template, which may read tool_calls, tool_call_id, ... */
    char *tools_json;    /* chat: the request's "tools" array as JSON, or NULL */
    /* max_tokens and the sampling parameters: the request's value, or when the request
     * leaves the field out (or null) the server's default (comet_oai_defaults) */
    int max_tokens;                 /* -1: up to the context (server default 0) */
    int max_tokens_given;           /* 1: max_tokens came from the request (too large is refused);
                            * 0: it is the server's default (cut to what the context leaves) */
    comet_sampler_params sampling;  /* checked (comet_sampler_params_check against n_vocab);
                                    * sampling.logit_bias points at `logit_bias` */
    unsigned given;                 /* COMET_SAMPLER_* bits of the fields the request set
                                    * (COMET_SAMPLER_SEED: a seed was given) */
    comet_logit_bias *logit_bias;   /* owned [sampling.n_logit_bias], or NULL */
    char *stop[COMET_OAI_MAX_STOP]; /* owned, non-empty strings */
    int n_stop;
    int stream;
    int include_usage; /* stream_options.include_usage */
    int logprobs;      /* completions: logprobs given (0..5 top entries); chat: logprobs=true */
    int top_logprobs;  /* top entries per token: completions `logprobs` N, chat `top_logprobs` */
    int echo;          /* completions: prompt prepended, with prompt logprobs when logprobs */
    int ignore_eos;    /* vLLM's extension: keep generating past EOS (benchmarks, tests) */
} comet_oai_request;

/* The server's defaults for the fields a request leaves out (a request's own fields always
 * win). `comet serve` takes them from `comet generate`'s defaults, then the model's
 * generation_config.json, then its command-line options (comet_sampler_params_merge). */
typedef struct comet_oai_defaults {
    comet_sampler_params sampling; /* checked; logit_bias borrowed (outlives the server) */
    int max_tokens;                /* > 0: both routes; 0: chat up to the context, completions 16;
                      * -1: chat COMET_OAI_CHAT_MAX_TOKENS, completions 16 */
} comet_oai_defaults;

#define COMET_OAI_CHAT_MAX_TOKENS 256      /* `comet generate`'s default */
#define COMET_OAI_COMPLETION_MAX_TOKENS 16 /* OpenAI's completions default */

/* `comet generate`'s sampling (comet_sampler_default_params: temperature 0.8, top-k 40,
 * top-p 0.95, min-p 0.05) with the penalties over every generated token (repeat_last_n -1,
 * as OpenAI's), and max_tokens -1. */
comet_oai_defaults comet_oai_default_defaults(void);

/* The default max_tokens of a route under `d`: d->max_tokens when > 0; -1 (up to the
 * context) when it is 0; when unset (< 0) 16 for completions, 256 for chat. */
int comet_oai_default_max_tokens(const comet_oai_defaults *d, comet_oai_kind kind);

/* Limits the parser checks against. */
typedef struct comet_oai_limits {
    const char *model_id; /* the one served model's id; `model` must equal it (else 404) */
    int n_ctx;            /* max_tokens above this is refused */
    int n_vocab;          /* token-id prompts must lie in [0, n_vocab) */
    const comet_oai_defaults *defaults; /* for absent fields; NULL: comet_oai_default_defaults */
} comet_oai_limits;

/* Parse and validate `len` bytes of JSON body. Returns 0 and fills *req (free it with
 * comet_oai_request_free) or returns the HTTP status (400, 404) with *err filled and *req
 * left empty. Checks, in order: UTF-8 of the whole body, JSON syntax, top-level object,
 * model (string; unknown -> 404 model_not_found), then each parameter's type and range. */
int comet_oai_parse(comet_oai_kind kind, const char *body, size_t len, const comet_oai_limits *lim,
                    comet_oai_request *req, comet_oai_error *err);

/* Release what a request owns and zero it. NULL is a no-op. */
void comet_oai_request_free(comet_oai_request *req);

/* ---- response builders: each returns a malloc'd NUL-terminated JSON string (caller
 * frees) or NULL when out of memory. ---- */

/* {"error": {...}} */
char *comet_oai_error_json(const comet_oai_error *e);

/* {"object":"list","data":[{"id":model_id,"object":"model","created":created,
 *  "owned_by":"comet","max_model_len":n_ctx}]} */
char *comet_oai_models_json(const char *model_id, long created, int n_ctx);

/* Per-token log-probabilities of one choice. text[i] is the token's decoded bytes
 * (may be partial UTF-8: serialized lossily, exact bytes go to "bytes" for chat).
 * has_lp[i] = 0 marks the first prompt token under echo (JSON null). */
typedef struct comet_oai_top {
    const char *text;
    size_t len;
    float logprob;
} comet_oai_top;

typedef struct comet_oai_token_lp {
    const char *text;
    size_t len;
    int has_lp;
    float logprob;
    int n_top;
    const comet_oai_top *top; /* [n_top] best first */
    int text_offset;          /* completions: offset of the token in the choice text, in
                               * characters (code points), as the OpenAI API counts */
} comet_oai_token_lp;

typedef struct comet_oai_usage {
    int prompt_tokens;
    int completion_tokens;
} comet_oai_usage;

/* A whole (non-streaming) response. For completions, `text` is the choice text; for chat,
 * the assistant message content. finish_reason: "stop" or "length". lps may be NULL. */
typedef struct comet_oai_result {
    const char *id;
    long created;
    const char *model;
    const char *text;
    size_t text_len;
    const char *finish_reason;
    const comet_oai_token_lp *lps; /* [n_lps] or NULL (no logprobs requested) */
    int n_lps;
    comet_oai_usage usage;
} comet_oai_result;

char *comet_oai_response_json(comet_oai_kind kind, const comet_oai_result *r);

/* One SSE chunk's JSON (without "data: "): a text delta (`text`, may be empty), optional
 * logprobs of the tokens in it, a finish_reason or NULL; `first` adds the chat
 * role:"assistant" delta. `usage` non-NULL gives the final usage-only chunk
 * (choices: []), used when stream_options.include_usage is set; `usage_null` (set with
 * include_usage) gives every other chunk "usage": null, as OpenAI's stream does (without
 * include_usage the key is absent). */
typedef struct comet_oai_chunk {
    const char *id;
    long created;
    const char *model;
    int first;
    const char *text;
    size_t text_len;
    const comet_oai_token_lp *lps;
    int n_lps;
    const char *finish_reason;
    const comet_oai_usage *usage;
    int usage_null;
} comet_oai_chunk;

char *comet_oai_chunk_json(comet_oai_kind kind, const comet_oai_chunk *c);

#endif
