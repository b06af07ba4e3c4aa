/* openai.c — OpenAI request parsing/validation and response/chunk JSON builders (cJSON).
 *
 * The parser reads only the parameters the server implements and ignores unknown keys
 * (as vLLM does). JSON null counts as "not given" for optional parameters. Every refusal
 * names the parameter in the error object's "param" field; strings are checked for
 * valid UTF-8 (cJSON itself copies raw bytes unchecked).
 */
#define _GNU_SOURCE
#include "server/openai.h"
#include "engine/sampler.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID_REQ "invalid_request_error"

int comet_oai_fail(comet_oai_error *e, int http_status, const char *type, const char *param,
                   const char *code, const char *fmt, ...) {
    e->http_status = http_status;
    e->type = type ? type : INVALID_REQ;
    e->code = code;
    if (param) {
        snprintf(e->param_buf, sizeof e->param_buf, "%s", param);
        e->param = e->param_buf;
    } else {
        e->param = NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return http_status;
}

comet_oai_defaults comet_oai_default_defaults(void) {
    comet_oai_defaults d = {comet_sampler_default_params(), -1};
    d.sampling.repeat_last_n = -1;
    return d;
}

int comet_oai_default_max_tokens(const comet_oai_defaults *d, comet_oai_kind kind) {
    if (d->max_tokens >= 0) /* 0: up to the context on both routes, as generate's 0 */
        return d->max_tokens > 0 ? d->max_tokens : -1;
    return kind == COMET_OAI_COMPLETION ? COMET_OAI_COMPLETION_MAX_TOKENS
                                        : COMET_OAI_CHAT_MAX_TOKENS;
}

/* ---- parameter readers: each returns 0, or the HTTP status with *err filled ---- */

static int is_absent(const cJSON *it) { return !it || cJSON_IsNull(it); }

static int get_string(const cJSON *it, const char *param, char **out, comet_oai_error *err) {
    if (!cJSON_IsString(it) || !it->valuestring)
        return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' must be a string", param);
    size_t len = strlen(it->valuestring);
    if (comet_utf8_valid_prefix(it->valuestring, len) != len)
        return comet_oai_fail(err, 400, NULL, param, NULL,
                              "'%s' is not valid UTF-8 (invalid byte at offset %zu)", param,
                              comet_utf8_valid_prefix(it->valuestring, len));
    *out = strdup(it->valuestring);
    if (!*out)
        return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static int get_int(const cJSON *it, const char *param, double lo, double hi, double *out,
                   comet_oai_error *err) {
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
        floor(it->valuedouble) != it->valuedouble)
        return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' must be an integer", param);
    double v = it->valuedouble;
    if (v < lo || v > hi)
        return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' must be in [%.0f, %.0f], got %.0f",
                              param, lo, hi, v);
    *out = v;
    return 0;
}

static int get_bool(const cJSON *it, const char *param, int *out, comet_oai_error *err) {
    if (is_absent(it))
        return 0;
    if (!cJSON_IsBool(it))
        return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' must be a boolean", param);
    *out = cJSON_IsTrue(it) ? 1 : 0;
    return 0;
}

static int parse_prompt(const cJSON *p, const comet_oai_limits *lim, comet_oai_request *req,
                        comet_oai_error *err) {
    if (is_absent(p))
        return comet_oai_fail(err, 400, NULL, "prompt", NULL,
                              "'prompt' is required: a string, an array of one string, or an "
                              "array of token ids");
    if (cJSON_IsString(p))
        return get_string(p, "prompt", &req->prompt, err);
    if (!cJSON_IsArray(p))
        return comet_oai_fail(err, 400, NULL, "prompt", NULL,
                              "'prompt' must be a string or an array (of one string or of "
                              "token ids)");
    int n = cJSON_GetArraySize(p);
    if (n == 0)
        return comet_oai_fail(err, 400, NULL, "prompt", NULL, "'prompt' must not be empty");
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(first) || cJSON_IsArray(first)) {
        if (n != 1)
            return comet_oai_fail(err, 400, NULL, "prompt", NULL,
                                  "'prompt' holds %d prompts; this server takes one per request",
                                  n);
        if (cJSON_IsString(first))
            return get_string(first, "prompt", &req->prompt, err);
        p = first; /* [[ids...]] */
        n = cJSON_GetArraySize(p);
        if (n == 0)
            return comet_oai_fail(err, 400, NULL, "prompt", NULL, "'prompt' must not be empty");
    }
    req->prompt_ids = malloc((size_t)n * sizeof *req->prompt_ids);
    if (!req->prompt_ids)
        return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        double v;
        if (!cJSON_IsNumber(it))
            return comet_oai_fail(err, 400, NULL, "prompt", NULL,
                                  "'prompt' must be a string, an array of one string, or an "
                                  "array of integer token ids");
        if (get_int(it, "prompt", 0, lim->n_vocab - 1, &v, err))
            return comet_oai_fail(err, 400, NULL, "prompt", NULL,
                                  "'prompt' token ids must be integers in [0, %d)", lim->n_vocab);
        req->prompt_ids[i++] = (int32_t)v;
    }
    req->n_prompt_ids = i;
    return 0;
}

static int parse_messages(const cJSON *m, comet_oai_request *req, comet_oai_error *err) {
    if (is_absent(m))
        return comet_oai_fail(err, 400, NULL, "messages", NULL,
                              "'messages' is required: an array of {\"role\", \"content\"}");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0)
        return comet_oai_fail(err, 400, NULL, "messages", NULL,
                              "'messages' must be a non-empty array of {\"role\", \"content\"}");
    int n = cJSON_GetArraySize(m);
    req->messages = calloc((size_t)n, sizeof *req->messages);
    if (!req->messages)
        return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *msg;
    int i = 0;
    char param[64];
    cJSON_ArrayForEach(msg, m) {
        if (!cJSON_IsObject(msg))
            return comet_oai_fail(err, 400, NULL, "messages", NULL,
                                  "'messages[%d]' must be an object with role and content", i);
        snprintf(param, sizeof param, "messages[%d].role", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        char *r = NULL;
        if (is_absent(role))
            return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' is required", param);
        int st = get_string(role, param, &r, err);
        if (st)
            return st;
        req->messages[i].role = r;
        req->n_messages = i + 1;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
            strcmp(r, "developer") && strcmp(r, "tool"))
            return comet_oai_fail(err, 400, NULL, param, NULL,
                                  "'%s' must be one of system, developer, user, assistant, tool; "
                                  "got '%.64s'",
                                  param, r);
        snprintf(param, sizeof param, "messages[%d].content", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        char *c = NULL;
        int tool_call = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"));
        if (is_absent(content) && !tool_call)
            return comet_oai_fail(err, 400, NULL, param, NULL, "'%s' is required", param);
        if (is_absent(content)) { /* an assistant turn of tool calls only */
            if (!(c = strdup("")))
                return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        } else if (cJSON_IsString(content)) {
            if ((st = get_string(content, param, &c, err)))
                return st;
        } else if (cJSON_IsArray(content)) {
            /* content parts: concatenate the "text" parts; any other part type is refused */
            size_t cap = 1, used = 0;
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
                    strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                    free(c);
                    return comet_oai_fail(err, 400, NULL, param, NULL,
                                          "'%s' parts must be {\"type\": \"text\", \"text\": "
                                          "string}",
                                          param);
                }
                char *t = NULL;
                if ((st = get_string(text, param, &t, err))) {
                    free(c);
                    return st;
                }
                size_t tl = strlen(t);
                cap = used + tl + 1;
                char *nc = realloc(c, cap);
                if (!nc) {
                    free(t);
                    free(c);
                    return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
                }
                c = nc;
                memcpy(c + used, t, tl + 1);
                used += tl;
                free(t);
            }
            if (!c && !(c = strdup("")))
                return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        } else {
            return comet_oai_fail(err, 400, NULL, param, NULL,
                                  "'%s' must be a string or an array of text parts", param);
        }
        req->messages[i].content = c;
        i++;
    }
    /* The messages as JSON for Jinja templates (tool_calls, tool_call_id, name, ...), each
     * content replaced by the text parsed above. */
    cJSON *copy = cJSON_Duplicate(m, 1);
    cJSON *cm;
    i = 0;
    cJSON_ArrayForEach(cm, copy) {
        cJSON *text = cJSON_CreateString(req->messages[i++].content);
        if (!text || !cJSON_ReplaceItemInObjectCaseSensitive(cm, "content", text)) {
            if (text && !cJSON_AddItemToObject(cm, "content", text))
                cJSON_Delete(text);
        }
    }
    req->messages_json = copy ? cJSON_PrintUnformatted(copy) : NULL;
    cJSON_Delete(copy);
    if (!req->messages_json)
        return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

static int parse_stop(const cJSON *s, comet_oai_request *req, comet_oai_error *err) {
    if (is_absent(s))
        return 0;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0])
            return comet_oai_fail(err, 400, NULL, "stop", NULL, "'stop' strings must not be empty");
        int st = get_string(s, "stop", &req->stop[0], err);
        if (!st)
            req->n_stop = 1;
        return st;
    }
    if (!cJSON_IsArray(s))
        return comet_oai_fail(err, 400, NULL, "stop", NULL,
                              "'stop' must be a string or an array of up to %d strings",
                              COMET_OAI_MAX_STOP);
    if (cJSON_GetArraySize(s) > COMET_OAI_MAX_STOP)
        return comet_oai_fail(err, 400, NULL, "stop", NULL,
                              "'stop' holds %d strings; at most %d are allowed",
                              cJSON_GetArraySize(s), COMET_OAI_MAX_STOP);
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return comet_oai_fail(err, 400, NULL, "stop", NULL,
                                  "'stop' must be a string or an array of non-empty strings");
        int st = get_string(it, "stop", &req->stop[req->n_stop], err);
        if (st)
            return st;
        req->n_stop++;
    }
    return 0;
}

/* logit_bias: {"<token id>": bias, ...} into req->logit_bias; the ids and biases are
 * checked against their ranges with the other sampling parameters. */
static int parse_logit_bias(const cJSON *o, comet_oai_request *req, comet_oai_error *err) {
    if (!cJSON_IsObject(o))
        return comet_oai_fail(err, 400, NULL, "logit_bias", NULL,
                              "'logit_bias' must be an object mapping token ids (as strings) to "
                              "biases in [-100, 100]");
    int n = cJSON_GetArraySize(o);
    if (n > COMET_SAMPLER_MAX_BIASED)
        return comet_oai_fail(err, 400, NULL, "logit_bias", NULL,
                              "'logit_bias' holds %d entries; at most %d are allowed", n,
                              COMET_SAMPLER_MAX_BIASED);
    if (n == 0)
        return 0;
    req->logit_bias = malloc((size_t)n * sizeof *req->logit_bias);
    if (!req->logit_bias)
        return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    int k = 0;
    for (const cJSON *it = o->child; it; it = it->next) {
        const char *key = it->string ? it->string : "";
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!key[0] || *end || (key[0] != '-' && (key[0] < '0' || key[0] > '9')) ||
            id > INT32_MAX || id < INT32_MIN)
            return comet_oai_fail(err, 400, NULL, "logit_bias", NULL,
                                  "'logit_bias' key '%.40s' is not a token id (an integer)", key);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
            return comet_oai_fail(err, 400, NULL, "logit_bias", NULL,
                                  "'logit_bias' value of token %ld must be a number in [-100, "
                                  "100]",
                                  id);
        double b = it->valuedouble;
        /* out of range stays out of range as a float (100.5 -> 100.5, 1e300 -> inf) */
        req->logit_bias[k++] = (comet_logit_bias){(int32_t)id, (float)b};
    }
    req->sampling.logit_bias = req->logit_bias;
    req->sampling.n_logit_bias = k;
    req->given |= COMET_SAMPLER_LOGIT_BIAS;
    return 0;
}

/* The sampling parameters: each one's type here, then every range in one place
 * (comet_sampler_params_check, the one the CLI and the engine use), against the
 * vocabulary for logit_bias. repetition_penalty is vLLM's extension. */
static int parse_sampling(const cJSON *root, const comet_oai_limits *lim, comet_oai_request *req,
                          comet_oai_error *err) {
    comet_sampler_params *sp = &req->sampling;
    const struct {
        const char *key;
        unsigned bit;
        float *field;
    } nums[] = {
        {"temperature", COMET_SAMPLER_TEMPERATURE, &sp->temperature},
        {"top_p", COMET_SAMPLER_TOP_P, &sp->top_p},
        {"min_p", COMET_SAMPLER_MIN_P, &sp->min_p},
        {"presence_penalty", COMET_SAMPLER_PRESENCE_PENALTY, &sp->presence_penalty},
        {"frequency_penalty", COMET_SAMPLER_FREQUENCY_PENALTY, &sp->frequency_penalty},
        {"repetition_penalty", COMET_SAMPLER_REPEAT_PENALTY, &sp->repeat_penalty},
    };
    int st;
    double v;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, nums[i].key);
        if (is_absent(it))
            continue;
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
            return comet_oai_fail(err, 400, NULL, nums[i].key, NULL, "'%s' must be a number",
                                  nums[i].key);
        *nums[i].field = (float)it->valuedouble;
        req->given |= nums[i].bit;
    }
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "top_k");
    if (!is_absent(it)) {
        if ((st = get_int(it, "top_k", -1, 1 << 30, &v, err)))
            return st;
        sp->top_k = v < 0 ? 0 : (int)v; /* -1: off, as vLLM */
        req->given |= COMET_SAMPLER_TOP_K;
    }
    it = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (!is_absent(it)) {
        if ((st = get_int(it, "seed", -9223372036854775808.0, 9223372036854775807.0, &v, err)))
            return st;
        sp->seed = v >= 9223372036854775807.0 ? (uint64_t)INT64_MAX : (uint64_t)(int64_t)v;
        req->given |= COMET_SAMPLER_SEED;
    }
    it = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    if (!is_absent(it) && (st = parse_logit_bias(it, req, err)))
        return st;
    unsigned bad;
    if (comet_sampler_params_check(sp, lim->n_vocab, &bad) < 0) {
        const char *name = comet_sampler_field_name(bad), *msg = comet_last_error();
        size_t n = strlen(name);
        if (!strncmp(msg, name, n)) /* "top_p must be ..." -> "'top_p' must be ..." */
            return comet_oai_fail(err, 400, NULL, name, NULL, "'%s'%s", name, msg + n);
        return comet_oai_fail(err, 400, NULL, name, NULL, "%s", msg);
    }
    return 0;
}

static int parse_object(comet_oai_kind kind, const cJSON *root, const comet_oai_limits *lim,
                        comet_oai_request *req, comet_oai_error *err) {
    int st;
    double v;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (is_absent(it))
        return comet_oai_fail(err, 400, NULL, "model", NULL,
                              "'model' is required (this server serves '%s')", lim->model_id);
    if ((st = get_string(it, "model", &req->model, err)))
        return st;
    if (lim->model_id && strcmp(req->model, lim->model_id))
        return comet_oai_fail(err, 404, NULL, "model", "model_not_found",
                              "The model '%.200s' does not exist; this server serves '%s'",
                              req->model, lim->model_id);

    if (kind == COMET_OAI_COMPLETION) {
        if ((st = parse_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), lim, req, err)))
            return st;
        if (cJSON_GetObjectItemCaseSensitive(root, "messages"))
            return comet_oai_fail(err, 400, NULL, "messages", NULL,
                                  "'messages' belongs to /v1/chat/completions; completions take "
                                  "'prompt'");
    } else {
        if ((st = parse_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), req, err)))
            return st;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (!is_absent(tools) && !cJSON_IsArray(tools))
            return comet_oai_fail(err, 400, NULL, "tools", NULL,
                                  "'tools' must be an array of tool definitions");
        if (cJSON_IsArray(tools) && !(req->tools_json = cJSON_PrintUnformatted(tools)))
            return comet_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    }

    /* max_tokens (chat also takes max_completion_tokens) */
    const char *mt_name = "max_tokens";
    it = cJSON_GetObjectItemCaseSensitive(root, "max_tokens");
    if (kind == COMET_OAI_CHAT && is_absent(it)) {
        it = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens");
        mt_name = "max_completion_tokens";
    }
    if (!is_absent(it)) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
            floor(it->valuedouble) != it->valuedouble)
            return comet_oai_fail(err, 400, NULL, mt_name, NULL, "'%s' must be an integer",
                                  mt_name);
        if (it->valuedouble < 0)
            return comet_oai_fail(err, 400, NULL, mt_name, NULL,
                                  "'%s' must be at least 1, got %.0f", mt_name, it->valuedouble);
        if (it->valuedouble > lim->n_ctx)
            return comet_oai_fail(err, 400, NULL, mt_name, NULL,
                                  "'%s' is too large: %.0f; this model's maximum context length "
                                  "is %d tokens",
                                  mt_name, it->valuedouble, lim->n_ctx);
        req->max_tokens = (int)it->valuedouble;
        req->max_tokens_given = 1;
    }

    if ((st = parse_sampling(root, lim, req, err)))
        return st;
    if ((st = parse_stop(cJSON_GetObjectItemCaseSensitive(root, "stop"), req, err)))
        return st;
    it = cJSON_GetObjectItemCaseSensitive(root, "n");
    if (!is_absent(it)) {
        if ((st = get_int(it, "n", -1e18, 1e18, &v, err)))
            return st;
        if (v != 1)
            return comet_oai_fail(err, 400, NULL, "n", NULL,
                                  "'n' must be 1 (one choice per request), got %.0f", v);
    }
    if ((st = get_bool(cJSON_GetObjectItemCaseSensitive(root, "stream"), "stream", &req->stream,
                       err)))
        return st;
    it = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!is_absent(it)) {
        if (!cJSON_IsObject(it))
            return comet_oai_fail(err, 400, NULL, "stream_options", NULL,
                                  "'stream_options' must be an object");
        if (!req->stream)
            return comet_oai_fail(err, 400, NULL, "stream_options", NULL,
                                  "'stream_options' is only allowed when 'stream' is true");
        if ((st = get_bool(cJSON_GetObjectItemCaseSensitive(it, "include_usage"),
                           "stream_options.include_usage", &req->include_usage, err)))
            return st;
    }
    if ((st = get_bool(cJSON_GetObjectItemCaseSensitive(root, "ignore_eos"), "ignore_eos",
                       &req->ignore_eos, err)))
        return st;
    it = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (kind == COMET_OAI_COMPLETION) {
        if (!is_absent(it)) {
            if ((st = get_int(it, "logprobs", 0, 5, &v, err)))
                return st;
            req->logprobs = 1;
            req->top_logprobs = (int)v;
        }
        if ((st =
                 get_bool(cJSON_GetObjectItemCaseSensitive(root, "echo"), "echo", &req->echo, err)))
            return st;
        if (cJSON_GetObjectItemCaseSensitive(root, "top_logprobs") &&
            !is_absent(cJSON_GetObjectItemCaseSensitive(root, "top_logprobs")))
            return comet_oai_fail(err, 400, NULL, "top_logprobs", NULL,
                                  "'top_logprobs' belongs to chat completions; completions take "
                                  "'logprobs': N");
    } else {
        if ((st = get_bool(it, "logprobs", &req->logprobs, err)))
            return st;
        it = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs");
        if (!is_absent(it)) {
            if ((st = get_int(it, "top_logprobs", 0, COMET_OAI_MAX_TOP_LOGPROBS, &v, err)))
                return st;
            if (!req->logprobs)
                return comet_oai_fail(err, 400, NULL, "top_logprobs", NULL,
                                      "'top_logprobs' needs 'logprobs': true");
            req->top_logprobs = (int)v;
        }
        if (!is_absent(cJSON_GetObjectItemCaseSensitive(root, "echo")))
            return comet_oai_fail(err, 400, NULL, "echo", NULL,
                                  "'echo' is a /v1/completions parameter");
    }
    if (req->max_tokens == 0 && !req->echo)
        return comet_oai_fail(err, 400, NULL, mt_name, NULL,
                              "'%s' must be at least 1 (0 is allowed only with echo)", mt_name);
    return 0;
}

/* Offset of the first JSON escape \u0000 in `body` (a backslash run of odd length before
 * "u0000"), or len when there is none. cJSON hands strings over NUL-terminated, so a NUL
 * inside a string would silently cut it short: such requests are refused instead. */
static size_t find_escaped_nul(const char *body, size_t len) {
    for (size_t i = 0; i + 6 <= len; i++) {
        if (body[i] != '\\')
            continue;
        size_t run = 0;
        while (i + run < len && body[i + run] == '\\')
            run++;
        size_t u = i + run;
        if ((run & 1) && u + 5 <= len && body[u] == 'u' && !memcmp(body + u + 1, "0000", 4))
            return i + run - 1;
        i = u - 1;
    }
    return len;
}

int comet_oai_parse(comet_oai_kind kind, const char *body, size_t len, const comet_oai_limits *lim,
                    comet_oai_request *req, comet_oai_error *err) {
    memset(req, 0, sizeof *req);
    req->kind = kind;
    /* absent fields keep the server's defaults; the parser overwrites the given ones */
    comet_oai_defaults dd = comet_oai_default_defaults();
    const comet_oai_defaults *d = lim->defaults ? lim->defaults : &dd;
    req->max_tokens = comet_oai_default_max_tokens(d, kind);
    req->sampling = d->sampling;
    size_t ok = comet_utf8_valid_prefix(body, len);
    if (ok != len)
        return comet_oai_fail(err, 400, NULL, NULL, NULL,
                              "request body is not valid UTF-8 (invalid byte at offset %zu)", ok);
    size_t nul = find_escaped_nul(body, len);
    if (nul != len)
        return comet_oai_fail(err, 400, NULL, NULL, NULL,
                              "request body holds a NUL character (\\u0000 at offset %zu); "
                              "strings must not contain NUL",
                              nul);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (root && end) { /* nothing but whitespace may follow the value */
        while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
            end++;
        if (end != body + len) {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return comet_oai_fail(err, 400, NULL, NULL, NULL,
                              "request body is not valid JSON (error near byte %zu of %zu)", at,
                              len);
    }
    int st;
    if (!cJSON_IsObject(root))
        st = comet_oai_fail(err, 400, NULL, NULL, NULL, "request body must be a JSON object");
    else
        st = parse_object(kind, root, lim, req, err);
    cJSON_Delete(root);
    if (st)
        comet_oai_request_free(req);
    return st;
}

void comet_oai_request_free(comet_oai_request *req) {
    if (!req)
        return;
    free(req->model);
    free(req->prompt);
    free(req->prompt_ids);
    for (int i = 0; i < req->n_messages; i++) {
        free((char *)req->messages[i].role);
        free((char *)req->messages[i].content);
    }
    free(req->messages);
    free(req->messages_json);
    free(req->tools_json);
    for (int i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    free(req->logit_bias);
    comet_oai_kind kind = req->kind;
    memset(req, 0, sizeof *req);
    req->kind = kind;
}

/* ---- builders ---- */

static char *print_and_delete(cJSON *o) {
    if (!o)
        return NULL;
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A JSON string from bytes that may hold partial UTF-8 (a token can end mid-character):
 * invalid sequences become U+FFFD so that the JSON stays valid. */
static cJSON *lossy_string(const char *s, size_t len) {
    char *buf = malloc(len * 3 + 1);
    if (!buf)
        return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        size_t ok = comet_utf8_valid_prefix(s + i, len - i);
        memcpy(buf + o, s + i, ok);
        o += ok;
        i += ok;
        if (i < len) {
            memcpy(buf + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = '\0';
    /* cJSON strings end at NUL; a NUL byte inside token text is dropped by this */
    cJSON *j = cJSON_CreateString(buf);
    free(buf);
    return j;
}

static cJSON *bytes_array(const char *s, size_t len) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < len; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

char *comet_oai_error_json(const comet_oai_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (!o) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : INVALID_REQ);
    if (e->param)
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    return print_and_delete(root);
}

char *comet_oai_models_json(const char *model_id, long created, int n_ctx) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    if (!data || !m) {
        cJSON_Delete(m);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "comet");
    cJSON_AddNumberToObject(m, "max_model_len", n_ctx);
    return print_and_delete(root);
}

static cJSON *usage_json(const comet_oai_usage *u) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    return o;
}

/* Completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"} */
static cJSON *completion_logprobs(const comet_oai_token_lp *lps, int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lp = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *off = cJSON_AddArrayToObject(o, "text_offset");
    if (!toks || !lp || !top || !off) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const comet_oai_token_lp *t = &lps[i];
        cJSON_AddItemToArray(toks, lossy_string(t->text, t->len));
        if (t->has_lp) {
            cJSON_AddItemToArray(lp, cJSON_CreateNumber(t->logprob));
            cJSON *d = cJSON_CreateObject();
            for (int k = 0; d && k < t->n_top; k++) {
                cJSON *s = lossy_string(t->top[k].text, t->top[k].len);
                /* distinct tokens can decode to the same text: keep the first (best) */
                if (s && !cJSON_GetObjectItemCaseSensitive(d, s->valuestring))
                    cJSON_AddNumberToObject(d, s->valuestring, t->top[k].logprob);
                cJSON_Delete(s);
            }
            cJSON_AddItemToArray(top, d);
        } else {
            cJSON_AddItemToArray(lp, cJSON_CreateNull());
            cJSON_AddItemToArray(top, cJSON_CreateNull());
        }
        cJSON_AddItemToArray(off, cJSON_CreateNumber(t->text_offset));
    }
    return o;
}

/* Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]} */
static cJSON *chat_logprobs(const comet_oai_token_lp *lps, int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    if (!content) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const comet_oai_token_lp *t = &lps[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(content, e);
        cJSON_AddItemToObject(e, "token", lossy_string(t->text, t->len));
        cJSON_AddNumberToObject(e, "logprob", t->logprob);
        cJSON_AddItemToObject(e, "bytes", bytes_array(t->text, t->len));
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; top && k < t->n_top; k++) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddItemToArray(top, x);
            cJSON_AddItemToObject(x, "token", lossy_string(t->top[k].text, t->top[k].len));
            cJSON_AddNumberToObject(x, "logprob", t->top[k].logprob);
            cJSON_AddItemToObject(x, "bytes", bytes_array(t->top[k].text, t->top[k].len));
        }
    }
    return o;
}

static cJSON *header(comet_oai_kind kind, const char *id, long created, const char *model,
                     int chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", id);
    cJSON_AddStringToObject(root, "object",
                            kind == COMET_OAI_CHAT
                                ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)created);
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "system_fingerprint", "comet");
    return root;
}

char *comet_oai_response_json(comet_oai_kind kind, const comet_oai_result *r) {
    cJSON *root = header(kind, r->id, r->created, r->model, 0);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (kind == COMET_OAI_CHAT) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddItemToObject(msg, "content", lossy_string(r->text, r->text_len));
        if (r->lps)
            cJSON_AddItemToObject(c, "logprobs", chat_logprobs(r->lps, r->n_lps));
        else
            cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddItemToObject(c, "text", lossy_string(r->text, r->text_len));
        if (r->lps)
            cJSON_AddItemToObject(c, "logprobs", completion_logprobs(r->lps, r->n_lps));
        else
            cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", r->finish_reason);
    cJSON_AddItemToObject(root, "usage", usage_json(&r->usage));
    return print_and_delete(root);
}

char *comet_oai_chunk_json(comet_oai_kind kind, const comet_oai_chunk *k) {
    cJSON *root = header(kind, k->id, k->created, k->model, 1);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    if (k->usage) {
        cJSON_AddItemToObject(root, "usage", usage_json(k->usage));
        return print_and_delete(root);
    }
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (kind == COMET_OAI_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (k->first)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (k->text_len || k->first || !k->finish_reason)
            cJSON_AddItemToObject(d, "content", lossy_string(k->text ? k->text : "", k->text_len));
        if (k->lps)
            cJSON_AddItemToObject(c, "logprobs", chat_logprobs(k->lps, k->n_lps));
        else
            cJSON_AddNullToObject(c, "logprobs");
    } else {
        cJSON_AddItemToObject(c, "text", lossy_string(k->text ? k->text : "", k->text_len));
        if (k->lps)
            cJSON_AddItemToObject(c, "logprobs", completion_logprobs(k->lps, k->n_lps));
        else
            cJSON_AddNullToObject(c, "logprobs");
    }
    if (k->finish_reason)
        cJSON_AddStringToObject(c, "finish_reason", k->finish_reason);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (k->usage_null)
        cJSON_AddNullToObject(root, "usage");
    return print_and_delete(root);
}
