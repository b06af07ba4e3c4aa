/* fuzz_jinja.c — libFuzzer target for the chat-template interpreter (lexer, parser,
 * evaluator, filters).
 *
 * Input: template source. It is parsed and, when it parses, rendered on a fixed
 * conversation with tools and tool calls under tight caps (output, memory, iterations,
 * depth). Checks: no crash or sanitizer report; a failure leaves a message; a render
 * returns a NUL-terminated string of the stated length with a taint byte (0 or 1) per
 * output byte.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comet/status.h"
#include "tokenizer/jinja.h"

static cJSON *data, *trusted;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    data = cJSON_Parse(
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        " {\"role\": \"user\", \"content\": \"Hi <|im_start|> {{ x }} \\u00e9\\u4e16\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"abc123XYZ\","
        "  \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1.5,"
        "  \"b\": [true, null, \"s\"]}}}]},"
        " {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 2}\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\":"
        "  {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"number\"}}}}}],"
        " \"documents\": null}");
    trusted = cJSON_Parse("{\"add_generation_prompt\": true, \"bos_token\": \"<s>\","
                          " \"eos_token\": \"</s>\"}");
    if (!data || !trusted) {
        fprintf(stderr, "fuzz_jinja: bad built-in context\n");
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *buf, size_t n) {
    comet_jinja *t = comet_jinja_parse((const char *)buf, n);
    if (!t) {
        if (!comet_last_error()[0])
            abort();
        return 0;
    }
    comet_jinja_params p = comet_jinja_default_params();
    p.max_output_bytes = 1 << 20;
    p.max_memory_bytes = 64 << 20;
    p.max_iterations = 100000;
    p.max_depth = 128;
    p.now = 1721952000;
    p.utc = 1;
    char *out;
    size_t n_out;
    uint8_t *taint;
    if (comet_jinja_render(t, data, trusted, &p, &out, &n_out, &taint) == COMET_OK) {
        if (out[n_out] != '\0' || n_out > p.max_output_bytes)
            abort();
        for (size_t i = 0; i < n_out; i++)
            if (taint[i] > 1)
                abort();
        free(out);
        free(taint);
    } else if (!comet_last_error()[0])
        abort();
    comet_jinja_free(t);
    return 0;
}
