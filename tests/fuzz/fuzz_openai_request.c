/* fuzz_openai_request.c — libFuzzer target for the OpenAI request parser.
 *
 * The first input byte picks the route (completions or chat); the rest is the body.
 * A request that parses is rendered back through the response builders, and every
 * refusal must carry an HTTP status and an error object that cJSON can read back.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comet/status.h"
#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    comet_oai_kind kind = (data[0] & 1) ? COMET_OAI_CHAT : COMET_OAI_COMPLETION;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    comet_oai_limits lim = {"smol", 2048, 49152, NULL};
    comet_oai_request req;
    comet_oai_error err;
    int st = comet_oai_parse(kind, body, len, &lim, &req, &err);
    if (st) {
        COMET_ASSERT(st == err.http_status && (st == 400 || st == 404 || st == 500));
        char *js = comet_oai_error_json(&err);
        cJSON *o = js ? cJSON_Parse(js) : NULL;
        COMET_ASSERT(o && cJSON_GetObjectItem(o, "error"));
        cJSON_Delete(o);
        free(js);
        return 0;
    }
    COMET_ASSERT(req.model && !strcmp(req.model, "smol"));
    if (kind == COMET_OAI_CHAT)
        COMET_ASSERT(req.n_messages > 0 && req.messages[0].content);
    else
        COMET_ASSERT((req.prompt != NULL) != (req.prompt_ids != NULL));
    const char *text = kind == COMET_OAI_CHAT ? req.messages[0].content
                       : req.prompt           ? req.prompt
                                              : "";
    comet_oai_top top = {text, strlen(text), -1.0f};
    comet_oai_token_lp lp = {text, strlen(text), 1, -0.5f, 1, &top, 0};
    comet_oai_result r = {"id", 1, req.model, text, strlen(text), "stop", &lp, 1, {1, 1}};
    char *js = comet_oai_response_json(kind, &r);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    COMET_ASSERT(o != NULL);
    cJSON_Delete(o);
    free(js);
    comet_oai_request_free(&req);
    return 0;
}
