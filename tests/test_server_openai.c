/* test_server_openai.c — the OpenAI request parser (every refusal names its parameter)
 * and the response/chunk/metrics builders (parsed back with cJSON). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "server/metrics.h"
#include "server/openai.h"

static const comet_oai_limits LIM = {"smol", 2048, 49152, NULL};

static int parse(comet_oai_kind kind, const char *body, comet_oai_request *req,
                 comet_oai_error *err) {
    return comet_oai_parse(kind, body, strlen(body), &LIM, req, err);
}

/* Expect a refusal with `status` naming `param` (NULL: no param). */
static void expect_error(comet_oai_kind kind, const char *body, int status, const char *param) {
    comet_oai_request req;
    comet_oai_error err;
    int st = parse(kind, body, &req, &err);
    if (st != status)
        fail_msg("body %s: status %d (want %d), message: %s", body, st, status,
                 st ? err.message : "");
    assert_int_equal(err.http_status, status);
    if (param) {
        assert_non_null(err.param);
        assert_string_equal(err.param, param);
    } else {
        assert_null(err.param);
    }
    assert_true(strlen(err.message) > 5);
    /* the error object is well-formed */
    char *js = comet_oai_error_json(&err);
    cJSON *o = cJSON_Parse(js);
    assert_non_null(o);
    cJSON *e = cJSON_GetObjectItem(o, "error");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    assert_string_equal(cJSON_GetObjectItem(e, "type")->valuestring, "invalid_request_error");
    assert_non_null(cJSON_GetObjectItem(e, "param"));
    assert_non_null(cJSON_GetObjectItem(e, "code"));
    cJSON_Delete(o);
    free(js);
}

static void test_completion_full(void **state) {
    (void)state;
    comet_oai_request r;
    comet_oai_error e;
    const char *body =
        "{\"model\":\"smol\",\"prompt\":\"Hello\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":42,\"stop\":[\"\\n\",\"END\"],"
        "\"n\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-0.25,\"logprobs\":3,\"echo\":true,"
        "\"user\":\"ignored\",\"ignore_eos\":true}";
    assert_int_equal(parse(COMET_OAI_COMPLETION, body, &r, &e), 0);
    assert_string_equal(r.model, "smol");
    assert_string_equal(r.prompt, "Hello");
    assert_null(r.prompt_ids);
    assert_int_equal(r.max_tokens, 7);
    assert_float_equal(r.sampling.temperature, 0.5f, 1e-7);
    assert_float_equal(r.sampling.top_p, 0.9f, 1e-7);
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05f, 1e-7);
    assert_true(r.given & COMET_SAMPLER_SEED);
    assert_int_equal(r.sampling.seed, 42);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "END");
    assert_true(r.stream);
    assert_true(r.include_usage);
    assert_float_equal(r.sampling.presence_penalty, 0.5f, 1e-7);
    assert_float_equal(r.sampling.frequency_penalty, -0.25f, 1e-7);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 3);
    assert_true(r.echo);
    assert_true(r.ignore_eos);
    comet_oai_request_free(&r);
    assert_null(r.model);
}

static void test_defaults_and_prompt_forms(void **state) {
    (void)state;
    comet_oai_request r;
    comet_oai_error e;
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":[\"x y\"],"
                           "\"temperature\":null,\"stop\":null}",
                           &r, &e),
                     0);
    assert_string_equal(r.prompt, "x y");
    /* no server defaults given: comet generate's sampling, OpenAI's 16 tokens */
    assert_int_equal(r.max_tokens, 16);
    assert_false(r.max_tokens_given);
    assert_float_equal(r.sampling.temperature, 0.8f, 0);
    assert_float_equal(r.sampling.top_p, 0.95f, 0);
    assert_int_equal(r.sampling.top_k, 40);
    assert_float_equal(r.sampling.min_p, 0.05f, 0);
    assert_false(r.given & COMET_SAMPLER_SEED);
    assert_int_equal(r.n_stop, 0);
    assert_false(r.stream);
    assert_false(r.logprobs);
    comet_oai_request_free(&r);

    assert_int_equal(
        parse(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":[1,2,49151]}", &r, &e), 0);
    assert_int_equal(r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 49151);
    comet_oai_request_free(&r);
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":[[5,6]],"
                           "\"stop\":\"x\",\"top_k\":-1}",
                           &r, &e),
                     0);
    assert_int_equal(r.n_prompt_ids, 2);
    assert_int_equal(r.n_stop, 1);
    assert_int_equal(r.sampling.top_k, 0);
    comet_oai_request_free(&r);
}

/* The server's defaults fill exactly the fields a request leaves out (or sends as null);
 * a request's own fields, even 0 or off, always win (`comet serve` once sampled at
 * temperature 1, top-p 1, no top-k/min-p and chat up to the context). */
static void test_server_defaults(void **state) {
    (void)state;
    comet_oai_defaults d = comet_oai_default_defaults();
    d.sampling.temperature = 0.6f, d.sampling.top_p = 0.9f, d.sampling.top_k = 20;
    d.sampling.min_p = 0.1f, d.max_tokens = 300;
    const comet_oai_limits lim = {"smol", 2048, 49152, &d};
    comet_oai_request r;
    comet_oai_error e;
    const char *absent = "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"What is the capital of France?\"}],"
                         "\"top_k\":null}";
    assert_int_equal(comet_oai_parse(COMET_OAI_CHAT, absent, strlen(absent), &lim, &r, &e), 0);
    assert_float_equal(r.sampling.temperature, 0.6f, 0);
    assert_float_equal(r.sampling.top_p, 0.9f, 0);
    assert_int_equal(r.sampling.top_k, 20);
    assert_float_equal(r.sampling.min_p, 0.1f, 0);
    assert_int_equal(r.max_tokens, 300);
    assert_false(r.max_tokens_given);
    comet_oai_request_free(&r);
    const char *cmpl = "{\"model\":\"smol\",\"prompt\":\"x\"}";
    assert_int_equal(comet_oai_parse(COMET_OAI_COMPLETION, cmpl, strlen(cmpl), &lim, &r, &e), 0);
    assert_int_equal(r.max_tokens, 300);
    assert_float_equal(r.sampling.temperature, 0.6f, 0);
    comet_oai_request_free(&r);

    const char *given = "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\","
                        "\"content\":\"hi\"}],\"temperature\":0,\"top_p\":1,\"top_k\":-1,"
                        "\"min_p\":0,\"max_completion_tokens\":7}";
    assert_int_equal(comet_oai_parse(COMET_OAI_CHAT, given, strlen(given), &lim, &r, &e), 0);
    assert_float_equal(r.sampling.temperature, 0.0f, 0);
    assert_float_equal(r.sampling.top_p, 1.0f, 0);
    assert_int_equal(r.sampling.top_k, 0);
    assert_float_equal(r.sampling.min_p, 0.0f, 0);
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.max_tokens_given);
    comet_oai_request_free(&r);

    /* built-in defaults (no generation_config.json, no flags): comet generate's sampling;
     * chat stops at 256 tokens, completions at 16; max_tokens 0 lets both run to the context,
     * as `comet generate --max-tokens 0` does */
    comet_oai_defaults b = comet_oai_default_defaults();
    assert_float_equal(b.sampling.temperature, 0.8f, 0);
    assert_float_equal(b.sampling.top_p, 0.95f, 0);
    assert_int_equal(b.sampling.top_k, 40);
    assert_float_equal(b.sampling.min_p, 0.05f, 0);
    assert_int_equal(comet_oai_default_max_tokens(&b, COMET_OAI_CHAT), 256);
    assert_int_equal(comet_oai_default_max_tokens(&b, COMET_OAI_COMPLETION), 16);
    b.max_tokens = 0;
    assert_int_equal(comet_oai_default_max_tokens(&b, COMET_OAI_CHAT), -1);
    assert_int_equal(comet_oai_default_max_tokens(&b, COMET_OAI_COMPLETION), -1);
    assert_int_equal(parse(COMET_OAI_CHAT, absent, &r, &e), 0);
    assert_float_equal(r.sampling.temperature, 0.8f, 0);
    assert_int_equal(r.max_tokens, 256);
    comet_oai_request_free(&r);
}

/* logit_bias as the OpenAI API defines it: {"<token id>": bias in [-100, 100]}; every bad
 * key or value is a 400 naming logit_bias and the problem; both routes. */
static void test_logit_bias(void **state) {
    (void)state;
    comet_oai_request r;
    comet_oai_error e;
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":\"x\","
                           "\"logit_bias\":{\"7042\":-100,\"13\":2.5,\"0\":100}}",
                           &r, &e),
                     0);
    assert_true(r.given & COMET_SAMPLER_LOGIT_BIAS);
    assert_int_equal(r.sampling.n_logit_bias, 3);
    assert_ptr_equal(r.sampling.logit_bias, r.logit_bias);
    assert_int_equal(r.logit_bias[0].id, 7042);
    assert_float_equal(r.logit_bias[0].bias, -100.0f, 0);
    assert_int_equal(r.logit_bias[1].id, 13);
    assert_float_equal(r.logit_bias[1].bias, 2.5f, 0);
    assert_int_equal(r.logit_bias[2].id, 0);
    assert_float_equal(r.logit_bias[2].bias, 100.0f, 0);
    comet_oai_request_free(&r);
    assert_null(r.logit_bias);
    assert_int_equal(parse(COMET_OAI_CHAT,
                           "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\","
                           "\"content\":\"hi\"}],\"logit_bias\":{\"49151\":-1}}",
                           &r, &e),
                     0);
    assert_int_equal(r.sampling.n_logit_bias, 1);
    assert_int_equal(r.logit_bias[0].id, 49151);
    comet_oai_request_free(&r);
    /* absent, null or empty: none */
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":\"x\",\"logit_bias\":{}}", &r, &e),
                     0);
    assert_int_equal(r.sampling.n_logit_bias, 0);
    comet_oai_request_free(&r);

    const struct {
        const char *bias, *says;
    } bad[] = {
        {"{\"999999999\":5}", "outside the vocabulary [0, 49152)"},
        {"{\"49152\":5}", "token id 49152 is outside the vocabulary"},
        {"{\"-1\":5}", "token id -1 is outside the vocabulary"},
        {"{\"abc\":1}", "key 'abc' is not a token id"},
        {"{\"5.5\":1}", "key '5.5' is not a token id"},
        {"{\"\":1}", "is not a token id"},
        {"{\"5\":\"x\"}", "must be a number"},
        {"{\"5\":null}", "must be a number"},
        {"{\"5\":100.5}", "must be in [-100, 100], got 100.5"},
        {"{\"5\":-101}", "must be in [-100, 100], got -101"},
        {"{\"5\":1,\"05\":2}", "token id 5 is given twice"},
        {"[1,2]", "must be an object"},
        {"5", "must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"smol\",\"prompt\":\"x\",\"logit_bias\":%s}",
                 bad[i].bias);
        expect_error(COMET_OAI_COMPLETION, body, 400, "logit_bias");
        assert_int_equal(parse(COMET_OAI_COMPLETION, body, &r, &e), 400);
        if (!strstr(e.message, bad[i].says))
            fail_msg("logit_bias %s: message '%s' does not say '%s'", bad[i].bias, e.message,
                     bad[i].says);
        snprintf(body, sizeof body,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"logit_bias\":%s}",
                 bad[i].bias);
        expect_error(COMET_OAI_CHAT, body, 400, "logit_bias");
    }
}

/* Tiny temperatures are valid (greedy, comet/sampling.h); repetition_penalty (vLLM's
 * extension) reaches the sampling parameters. */
static void test_sampling_extras(void **state) {
    (void)state;
    comet_oai_request r;
    comet_oai_error e;
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":\"x\",\"temperature\":1e-45,"
                           "\"repetition_penalty\":1.3}",
                           &r, &e),
                     0);
    assert_true(r.sampling.temperature >= 0 && r.sampling.temperature < 1e-44f);
    assert_float_equal(r.sampling.repeat_penalty, 1.3f, 0);
    assert_true(r.given & COMET_SAMPLER_REPEAT_PENALTY);
    assert_false(r.given & COMET_SAMPLER_PRESENCE_PENALTY);
    assert_int_equal(r.sampling.repeat_last_n, -1); /* the penalties see every generated token */
    comet_oai_request_free(&r);
}

static void test_chat(void **state) {
    (void)state;
    comet_oai_request r;
    comet_oai_error e;
    const char *body =
        "{\"model\":\"smol\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
        "{\"type\":\"text\",\"text\":\"th\\u00e9re\"}]}],\"max_completion_tokens\":5,"
        "\"logprobs\":true,\"top_logprobs\":2}";
    assert_int_equal(parse(COMET_OAI_CHAT, body, &r, &e), 0);
    assert_int_equal(r.n_messages, 2);
    assert_string_equal(r.messages[0].role, "system");
    assert_string_equal(r.messages[1].content, "Hi th\xc3\xa9re");
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.logprobs);
    assert_int_equal(r.top_logprobs, 2);
    comet_oai_request_free(&r);
}

static void test_bad_json(void **state) {
    (void)state;
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\"", 400, NULL);
    expect_error(COMET_OAI_COMPLETION, "", 400, NULL);
    expect_error(COMET_OAI_COMPLETION, "[1,2]", 400, NULL);
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\"} trailing", 400, NULL);
    expect_error(COMET_OAI_CHAT, "nul", 400, NULL);
    /* an escaped NUL would cut the C string short: refused, not silently truncated */
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"hi\\u0000there\"}", 400,
                 NULL);
    expect_error(COMET_OAI_CHAT,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000\"}]}",
                 400, NULL);
    /* an escaped backslash followed by the letters u0000 is plain text */
    comet_oai_request req;
    comet_oai_error err;
    assert_int_equal(
        parse(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"a\\\\u0000\"}", &req, &err),
        0);
    assert_string_equal(req.prompt, "a\\u0000");
    comet_oai_request_free(&req);
}

static void test_wrong_types(void **state) {
    (void)state;
    expect_error(COMET_OAI_COMPLETION, "{\"model\":7,\"prompt\":\"x\"}", 400, "model");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":{}}", 400, "prompt");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":\"5\"}",
                 400, "max_tokens");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":2.5}",
                 400, "max_tokens");
    expect_error(COMET_OAI_COMPLETION,
                 "{\"model\":\"smol\",\"prompt\":\"x\",\"temperature\":\"hot\"}", 400,
                 "temperature");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"stream\":1}", 400,
                 "stream");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"ignore_eos\":0}",
                 400, "ignore_eos");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"stop\":[1]}", 400,
                 "stop");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"x\",\"seed\":\"1\"}", 400,
                 "seed");
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":[1,\"a\"]}", 400, "prompt");
    expect_error(COMET_OAI_CHAT, "{\"model\":\"smol\",\"messages\":\"hi\"}", 400, "messages");
    expect_error(COMET_OAI_CHAT, "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\"}]}", 400,
                 "messages[0].content");
    expect_error(COMET_OAI_CHAT,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                 "{\"role\":\"wizard\",\"content\":\"b\"}]}",
                 400, "messages[1].role");
    expect_error(COMET_OAI_CHAT,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"logprobs\":1}",
                 400, "logprobs");
    expect_error(
        COMET_OAI_COMPLETION,
        "{\"model\":\"smol\",\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
        "stream_options");
}

static void test_ranges(void **state) {
    (void)state;
    const char *cases[][2] = {
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":-1}", "max_tokens"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":0}", "max_tokens"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":2049}", "max_tokens"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"max_tokens\":1e300}", "max_tokens"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"temperature\":2.5}", "temperature"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"temperature\":-0.1}", "temperature"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"top_p\":0}", "top_p"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"top_p\":1.5}", "top_p"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"min_p\":-1}", "min_p"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"top_k\":-2}", "top_k"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"n\":2}", "n"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"n\":0}", "n"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"presence_penalty\":3}", "presence_penalty"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"frequency_penalty\":-2.01}", "frequency_penalty"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"repetition_penalty\":0}", "repetition_penalty"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"repetition_penalty\":\"1\"}",
         "repetition_penalty"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"logprobs\":6}", "logprobs"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop"},
        {"{\"model\":\"smol\",\"prompt\":\"x\",\"stop\":\"\"}", "stop"},
        {"{\"model\":\"smol\",\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {"{\"model\":\"smol\",\"prompt\":[]}", "prompt"},
        {"{\"model\":\"smol\",\"prompt\":[49152]}", "prompt"},
        {"{\"model\":\"smol\",\"prompt\":[-1]}", "prompt"},
        {"{\"model\":\"smol\"}", "prompt"},
        {"{\"prompt\":\"x\"}", "model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(COMET_OAI_COMPLETION, cases[i][0], 400, cases[i][1]);
    /* max_tokens 0 is allowed with echo (prompt scoring) */
    comet_oai_request r;
    comet_oai_error e;
    assert_int_equal(parse(COMET_OAI_COMPLETION,
                           "{\"model\":\"smol\",\"prompt\":\"x\","
                           "\"max_tokens\":0,\"echo\":true,\"logprobs\":0}",
                           &r, &e),
                     0);
    assert_int_equal(r.max_tokens, 0);
    comet_oai_request_free(&r);
    expect_error(COMET_OAI_CHAT,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"logprobs\":true,\"top_logprobs\":21}",
                 400, "top_logprobs");
    expect_error(COMET_OAI_CHAT,
                 "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                 "\"top_logprobs\":2}",
                 400, "top_logprobs");
}

static void test_missing_messages_unknown_model(void **state) {
    (void)state;
    expect_error(COMET_OAI_CHAT, "{\"model\":\"smol\"}", 400, "messages");
    expect_error(COMET_OAI_CHAT, "{\"model\":\"smol\",\"messages\":[]}", 400, "messages");
    expect_error(COMET_OAI_CHAT, "{\"model\":\"smol\",\"messages\":null}", 400, "messages");
    comet_oai_request r;
    comet_oai_error e;
    assert_int_equal(parse(COMET_OAI_CHAT, "{\"model\":\"gpt-4\",\"messages\":[]}", &r, &e), 404);
    assert_string_equal(e.param, "model");
    assert_string_equal(e.code, "model_not_found");
    assert_non_null(strstr(e.message, "gpt-4"));
}

static void test_invalid_utf8(void **state) {
    (void)state;
    /* invalid bytes inside a string value: the body is refused before JSON parsing */
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"a\xff\"}", 400, NULL);
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"\xc0\xaf\"}", 400, NULL);
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"\xed\xa0\x80\"}", 400,
                 NULL);
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"\xe2\x82\"}", 400, NULL);
    /* a lone surrogate escape cannot become UTF-8 */
    expect_error(COMET_OAI_COMPLETION, "{\"model\":\"smol\",\"prompt\":\"\\ud800\"}", 400, NULL);

    const char ok[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    assert_int_equal(comet_utf8_valid_prefix(ok, sizeof ok - 1), sizeof ok - 1);
    assert_int_equal(comet_utf8_valid_prefix("ab\xf4\x90\x80\x80", 6), 2); /* > U+10FFFF */
    assert_int_equal(comet_utf8_valid_prefix("ab\xe0\x80\x80", 5), 2);     /* overlong */
}

static void test_response_builders(void **state) {
    (void)state;
    comet_oai_top top[2] = {{"lo", 2, -0.1f}, {"la", 2, -2.5f}};
    comet_oai_token_lp lps[2] = {{"He", 2, 0, 0, 0, NULL, 0}, {"lo", 2, 1, -0.1f, 2, top, 2}};
    comet_oai_result r = {"cmpl-1", 1000, "smol", "Hello\xe2", 6, "length", lps, 2, {3, 2}};
    char *js = comet_oai_response_json(COMET_OAI_COMPLETION, &r);
    cJSON *o = cJSON_Parse(js);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "text_completion");
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(c, "text")->valuestring, "Hello\xef\xbf\xbd");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "length");
    cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)));
    assert_float_equal(
        cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble, -0.1, 1e-6);
    cJSON *t1 = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 1);
    assert_float_equal(cJSON_GetObjectItem(t1, "la")->valuedouble, -2.5, 1e-6);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valueint, 2);
    cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 5);
    cJSON_Delete(o);
    free(js);

    r.lps = lps + 1;
    r.n_lps = 1;
    js = comet_oai_response_json(COMET_OAI_CHAT, &r);
    o = cJSON_Parse(js);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "role")->valuestring,
                        "assistant");
    cJSON *ct =
        cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content"), 0);
    assert_string_equal(cJSON_GetObjectItem(ct, "token")->valuestring, "lo");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(ct, "bytes")), 2);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(ct, "top_logprobs")), 2);
    cJSON_Delete(o);
    free(js);

    comet_oai_chunk k = {"chatcmpl-1", 1000, "smol", 1, "Hi", 2, NULL, 0, NULL, NULL, 0};
    js = comet_oai_chunk_json(COMET_OAI_CHAT, &k);
    o = cJSON_Parse(js);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion.chunk");
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content")->valuestring, "Hi");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    assert_null(cJSON_GetObjectItem(o, "usage")); /* no include_usage: no key, as OpenAI */
    cJSON_Delete(o);
    free(js);
    comet_oai_usage us = {4, 9};
    k.usage = &us;
    js = comet_oai_chunk_json(COMET_OAI_CHAT, &k);
    o = cJSON_Parse(js);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "total_tokens")->valueint,
                     13);
    cJSON_Delete(o);
    free(js);
}

/* stream_options.include_usage: every chunk before the final usage chunk carries
 * "usage": null (OpenAI's stream does; strictly typed clients require the key), the
 * usage chunk the numbers; chat and completions, role, text and finish chunks alike. */
static void test_chunk_usage_null(void **state) {
    (void)state;
    static const comet_oai_kind kinds[] = {COMET_OAI_CHAT, COMET_OAI_COMPLETION};
    for (int ki = 0; ki < 2; ki++) {
        for (int form = 0; form < 3; form++) {
            comet_oai_chunk k;
            memset(&k, 0, sizeof k);
            k.id = "x-1";
            k.created = 1000;
            k.model = "smol";
            k.usage_null = 1;
            k.first = form == 0 && kinds[ki] == COMET_OAI_CHAT;
            k.text = form == 1 ? "Hi" : "";
            k.text_len = form == 1 ? 2 : 0;
            k.finish_reason = form == 2 ? "stop" : NULL;
            char *js = comet_oai_chunk_json(kinds[ki], &k);
            cJSON *o = cJSON_Parse(js);
            assert_non_null(o);
            cJSON *u = cJSON_GetObjectItem(o, "usage");
            if (!u || !cJSON_IsNull(u))
                fail_msg("chunk %s: \"usage\": null expected", js);
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 1);
            cJSON_Delete(o);
            free(js);
            comet_oai_usage us = {4, 9};
            k.usage = &us;
            js = comet_oai_chunk_json(kinds[ki], &k);
            o = cJSON_Parse(js);
            assert_int_equal(
                cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valueint,
                9);
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
            cJSON_Delete(o);
            free(js);
        }
    }
}

static void test_metrics_render(void **state) {
    (void)state;
    comet_server_metrics m;
    comet_server_metrics_init(&m);
    comet_server_metrics_record(&m, 200, 10, 5, 0.02, 0.06, 0.3);
    comet_server_metrics_record(&m, 200, 4, 1, 2.0, -1, 2.0);
    comet_server_metrics_record(&m, 400, 0, 0, -1, -1, -1);
    const int statuses[] = {200, 200, 400, 401, 404, 499, 503};
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        comet_server_metrics_count_response(&m, statuses[i]);
    comet_metrics_gauges g = {3, 2, 40, 24, 1};
    char *t = comet_server_metrics_render(&m, &g);
    assert_non_null(t);
    assert_non_null(strstr(t, "comet_requests_running 3\n"));
    assert_non_null(strstr(t, "comet_kv_pages_free 24\n"));
    assert_non_null(strstr(t, "comet_requests_total{outcome=\"ok\"} 2\n"));
    assert_non_null(strstr(t, "comet_requests_total{outcome=\"error\"} 1\n"));
    assert_non_null(strstr(t, "comet_generation_tokens_total 6\n"));
    assert_non_null(strstr(t, "# TYPE comet_http_responses_total counter\n"));
    assert_non_null(strstr(t, "comet_http_responses_total{class=\"2xx\"} 2\n"));
    assert_non_null(strstr(t, "comet_http_responses_total{class=\"4xx\"} 4\n"));
    assert_non_null(strstr(t, "comet_http_responses_total{class=\"5xx\"} 1\n"));
    assert_non_null(strstr(t, "# TYPE comet_time_to_first_token_seconds histogram\n"));
    /* cumulative buckets: 0.02 falls in le=0.025, 2.0 in le=2.5 */
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"));
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"));
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_bucket{le=\"1\"} 1\n"));
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_bucket{le=\"2.5\"} 2\n"));
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(t, "comet_time_to_first_token_seconds_count 2\n"));
    assert_non_null(strstr(t, "comet_time_per_output_token_seconds_count 1\n"));
    free(t);
    comet_server_metrics_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_full),
        cmocka_unit_test(test_defaults_and_prompt_forms),
        cmocka_unit_test(test_server_defaults),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_sampling_extras),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_missing_messages_unknown_model),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_response_builders),
        cmocka_unit_test(test_chunk_usage_null),
        cmocka_unit_test(test_metrics_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
