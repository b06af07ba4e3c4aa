/* openai_server.c — comet_openai_server (comet/server.h): the HTTP server (server.h) with
 * the OpenAI routes over the engine (api.h) as its hooks, and its request defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/log.h"
#include "comet/server.h"
#include "server/api.h"
#include "server/server.h"

struct comet_openai_server {
    comet_api api; /* the hooks' state; api.model_id points at model_id */
    char *model_id;
    comet_server *srv;
};

comet_openai_server_params comet_openai_server_default_params(void) {
    comet_server_params sp = comet_server_default_params();
    return (comet_openai_server_params){.host = sp.host,
                                        .port = sp.port,
                                        .max_body_bytes = sp.max_body_bytes,
                                        .model_id = sp.model_id,
                                        .sampling = comet_sampler_default_params(),
                                        .sampling_given = 0,
                                        .max_tokens = -1};
}

/* comet generate's defaults, then the model's generation_config.json, then p's overrides;
 * logged. */
static comet_oai_defaults request_defaults(const comet_model *m,
                                           const comet_openai_server_params *p) {
    comet_oai_defaults d = comet_oai_default_defaults();
    const comet_gen_config *gc = &m->gen;
    comet_sampler_params_merge(&d.sampling, &gc->sampling, gc->given);
    if (gc->max_new_tokens > 0)
        d.max_tokens = gc->max_new_tokens;
    comet_sampler_params_merge(&d.sampling, &p->sampling, p->sampling_given);
    if (p->max_tokens >= 0)
        d.max_tokens = p->max_tokens;
    char mt_chat[32], mt_cmpl[32];
    int mc = comet_oai_default_max_tokens(&d, COMET_OAI_CHAT);
    int mo = comet_oai_default_max_tokens(&d, COMET_OAI_COMPLETION);
    snprintf(mt_chat, sizeof mt_chat, mc > 0 ? "%d" : "up to the context", mc);
    snprintf(mt_cmpl, sizeof mt_cmpl, mo > 0 ? "%d" : "up to the context", mo);
    comet_log(COMET_LOG_INFO,
              "request defaults: temperature %g, top_p %g, top_k %d, min_p %g, "
              "max_tokens %s (chat) / %s (completions)%s%s",
              d.sampling.temperature, d.sampling.top_p, d.sampling.top_k, d.sampling.min_p, mt_chat,
              mt_cmpl,
              gc->given || gc->max_new_tokens > 0 ? "; model generation_config.json read" : "",
              p->sampling_given || p->max_tokens >= 0 ? "; command-line overrides" : "");
    return d;
}

comet_status comet_openai_server_start(comet_engine *e, const comet_model *m,
                                       const comet_openai_server_params *p,
                                       comet_openai_server **out) {
    *out = NULL;
    if (!e || !m || !p || !p->model_id)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "server: engine, model, params and model_id must be non-NULL");
    comet_openai_server *s = calloc(1, sizeof *s);
    if (!s || !(s->model_id = strdup(p->model_id))) {
        free(s);
        return comet_set_error(COMET_ERR_NOMEM, "server: out of memory");
    }
    comet_sampler_params given = comet_sampler_default_params();
    comet_sampler_params_merge(&given, &p->sampling, p->sampling_given);
    if (comet_sampler_params_check(&given, m->cfg.n_vocab, NULL) < 0) {
        char why[256]; /* the message, copied: comet_set_error writes over it */
        snprintf(why, sizeof why, "%s", comet_last_error());
        comet_openai_server_stop(s);
        return comet_set_error(COMET_ERR_INVALID_ARG, "server: request defaults: %s", why);
    }
    comet_status st = comet_api_init(&s->api, e, m, s->model_id, p->chat_template);
    if (st < 0) {
        comet_openai_server_stop(s);
        return st;
    }
    s->api.allow_special_in_messages = p->allow_special_in_messages;
    s->api.kv_tokens = p->kv_tokens;
    if (p->allow_special_in_messages)
        comet_log(COMET_LOG_WARN, "--allow-special-in-messages: special-token text in chat "
                                  "messages is parsed; any client can forge system turns");
    if (!s->api.has_tmpl)
        comet_log(COMET_LOG_WARN, "no known chat template in the model: /v1/chat/completions "
                                  "answers 400 (pass --chat-template FILE or a built-in name)");

    comet_server_params sp = comet_server_default_params();
    sp.host = p->host;
    sp.port = p->port;
    sp.api_key = p->api_key;
    sp.max_body_bytes = p->max_body_bytes;
    sp.model_id = s->model_id;
    sp.n_ctx = m->cfg.n_ctx;
    sp.n_vocab = m->cfg.n_vocab;
    sp.defaults = request_defaults(m, p);
    sp.generate = comet_api_generate;
    sp.gauges = comet_api_gauges;
    sp.user = &s->api;
    if (!(s->srv = comet_server_start(&sp))) {
        st = comet_last_status() < 0 ? comet_last_status() : COMET_ERR_IO;
        comet_openai_server_stop(s);
        return st;
    }
    *out = s;
    return COMET_OK;
}

int comet_openai_server_port(const comet_openai_server *s) { return comet_server_port(s->srv); }

void comet_openai_server_quiesce(comet_openai_server *s) { comet_server_quiesce(s->srv); }

int comet_openai_server_in_flight(comet_openai_server *s) { return comet_server_in_flight(s->srv); }

void comet_openai_server_stop(comet_openai_server *s) {
    if (!s)
        return;
    comet_server_stop(s->srv);
    comet_api_free(&s->api);
    free(s->model_id);
    free(s);
}
