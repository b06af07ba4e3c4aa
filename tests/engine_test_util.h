/* engine_test_util.h — requests shared by the engine tests on the CPU (test_engine.c) and the
 * GPU (cuda/test_engine_cuda.c). Header-only; include after <cmocka.h>. */
#ifndef COMET_TESTS_ENGINE_TEST_UTIL_H
#define COMET_TESTS_ENGINE_TEST_UTIL_H

#include <stdio.h>
#include <string.h>

#include "comet/engine.h"
#include "comet/tokenizer.h"

/* Prompt i for tokenizer tok: a prefix of varied length of a fixed text with a
 * request-specific tail; `short_cut` keeps the prefix to a few characters. *ids is the
 * tokenizer's allocation (free it); returns the token count. */
static inline int et_prompt(const comet_tokenizer *tok, int i, int short_cut, int32_t **ids) {
    static const char *base =
        "The old lighthouse keeper climbed the spiral stairs every evening, counting the "
        "steps, checking the lamp, and writing the weather in a worn leather book. One night "
        "a ship appeared without lights, drifting slowly toward the rocks below the cliff.";
    char text[1024];
    int cut = short_cut ? i % 17 : 20 + (i * 37) % 200;
    snprintf(text, sizeof text, "%.*s Question %d: what happens next?", cut, base, i);
    size_t n;
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 0, ids, &n), COMET_OK);
    return (int)n;
}

/* A greedy request of max_tokens tokens over ids [n] that ignores EOS. */
static inline comet_request_params et_greedy(const int32_t *ids, int n, int max_tokens) {
    comet_request_params rp = comet_request_default_params();
    rp.prompt = ids;
    rp.n_prompt = n;
    rp.max_tokens = max_tokens;
    rp.sampling.temperature = 0;
    rp.ignore_eos = 1;
    return rp;
}

#endif
