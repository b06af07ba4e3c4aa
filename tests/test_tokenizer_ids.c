/* test_tokenizer_ids.c — the id-only tokenizer of vocabulary-less models
 * (comet_tokenizer_ids) and the synthetic presets that carry one: text is refused by name,
 * token i decodes to " <i>", BOS/EOS are control tokens, streaming decoding and priming
 * behave as for a real vocabulary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "comet/model.h"
#include "comet/tokenizer.h"

static void test_encode_refused(void **state) {
    (void)state;
    comet_tokenizer *t = comet_tokenizer_ids("synthetic", "llama3-8b", 128256, 128000, 128009);
    assert_non_null(t);
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    assert_int_equal(comet_tokenizer_encode(t, "hello", 5, 1, &ids, &n), COMET_ERR_INVALID_ARG);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_string_equal(comet_last_error(),
                        "synthetic model llama3-8b has no vocabulary: send token ids");
    /* an empty text is refused too: there is nothing the tokenizer can encode */
    assert_int_equal(comet_tokenizer_encode(t, "", 0, 0, &ids, &n), COMET_ERR_INVALID_ARG);
    /* a chat render is text as well */
    comet_chat_message msg = {"user", "hi"};
    assert_true(comet_chat_tokenize(t, COMET_CHAT_LLAMA3, NULL, &msg, 1, 1, NULL, 0, &ids, &n) <
                0);
    assert_non_null(strstr(comet_last_error(), "has no vocabulary: send token ids"));
    assert_int_equal(comet_tokenizer_find(t, "<5>"), -1);
    comet_tokenizer_free(t);
}

static void test_decode_pieces(void **state) {
    (void)state;
    comet_tokenizer *t = comet_tokenizer_ids("synthetic", "llama3-70b", 128256, 128000, 128009);
    assert_non_null(t);
    assert_int_equal(comet_tokenizer_n_vocab(t), 128256);
    assert_int_equal(comet_tokenizer_special_id(t, COMET_SPECIAL_BOS), 128000);
    assert_int_equal(comet_tokenizer_special_id(t, COMET_SPECIAL_EOS), 128009);
    assert_int_equal(comet_tokenizer_special_id(t, COMET_SPECIAL_UNK), -1);
    assert_int_equal(comet_tokenizer_max_token_bytes(t), 9); /* " <128255>" */
    char buf[32];
    struct {
        int32_t id;
        const char *text;
    } cases[] = {{0, " <0>"}, {42, " <42>"}, {9999, " <9999>"}, {128255, " <128255>"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = comet_tokenizer_token_bytes(t, cases[i].id, 0, buf, sizeof buf);
        assert_int_equal(n, (int)strlen(cases[i].text));
        buf[n] = '\0';
        assert_string_equal(buf, cases[i].text);
        assert_int_equal(comet_tokenizer_token_attr(t, cases[i].id), COMET_TOKEN_NORMAL);
    }
    /* BOS/EOS: control tokens, text only when rendered */
    assert_int_equal(comet_tokenizer_token_attr(t, 128000), COMET_TOKEN_CONTROL);
    assert_int_equal(comet_tokenizer_token_bytes(t, 128009, 0, buf, sizeof buf), 0);
    int n = comet_tokenizer_token_bytes(t, 128009, 1, buf, sizeof buf);
    buf[n] = '\0';
    assert_string_equal(buf, " <128009>");
    /* a short buffer gets a prefix and the full length */
    assert_int_equal(comet_tokenizer_token_bytes(t, 12345, 0, buf, 3), 8);
    assert_memory_equal(buf, " <1", 3);
    assert_true(comet_tokenizer_token_bytes(t, 128256, 0, buf, sizeof buf) < 0);
    assert_true(comet_tokenizer_token_bytes(t, -1, 0, buf, sizeof buf) < 0);
    comet_tokenizer_free(t);
}

static void test_detok_stream(void **state) {
    (void)state;
    comet_tokenizer *t = comet_tokenizer_ids("synthetic", "llama3-8b", 128256, 128000, 128009);
    assert_non_null(t);
    comet_detok d;
    comet_detok_init(&d, t);
    const int32_t prompt[] = {128000, 7, 8};
    assert_int_equal(comet_detok_prime(&d, prompt, 3), 0);
    /* no dummy-prefix rule: the first generated piece keeps its space */
    const int32_t gen[] = {100, 128009, 5};
    char out[64], all[256] = "";
    for (int i = 0; i < 3; i++) {
        int n = comet_detok_push(&d, gen[i], out, sizeof out);
        assert_true(n >= 0);
        strcat(all, out);
    }
    assert_int_equal(comet_detok_flush(&d, out, sizeof out), 0);
    assert_string_equal(all, " <100> <5>");
    /* the piece for echo/logprobs is the same text */
    char p[16];
    int n = comet_detok_piece(&d, 31, 0, p, sizeof p);
    p[n] = '\0';
    assert_string_equal(p, " <31>");
    /* a fresh stream starts with a space as well */
    comet_detok_init(&d, t);
    assert_int_equal(comet_detok_push(&d, 3, out, sizeof out), 4);
    assert_string_equal(out, " <3>");
    assert_true(comet_detok_push(&d, 200000, out, sizeof out) < 0);
    comet_tokenizer_free(t);
}

static void test_bad_args(void **state) {
    (void)state;
    assert_null(comet_tokenizer_ids("synthetic", "x", 0, -1, -1));
    assert_non_null(strstr(comet_last_error(), "n_vocab"));
    assert_null(comet_tokenizer_ids("synthetic", "x", 100, 100, -1));
    assert_non_null(strstr(comet_last_error(), "outside the vocabulary"));
    comet_tokenizer *t = comet_tokenizer_ids("synthetic", "x", 100, -1, -1);
    assert_non_null(t);
    comet_tokenizer_free(t);
    /* a vocabulary description cannot ask for the id-only kind */
    const char *tokens[] = {"a"};
    comet_vocab_desc d = {.type = COMET_TOK_IDS, .n_tokens = 1, .tokens = tokens,
                          .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    assert_null(comet_tokenizer_init(&d));
    assert_non_null(strstr(comet_last_error(), "comet_tokenizer_ids"));
}

static void test_synthetic_models_have_it(void **state) {
    (void)state;
    const char *names[] = {"llama3-8b", "llama3-70b"};
    for (int i = 0; i < 2; i++)
        for (int q = 0; q < 2; q++) {
            comet_model *m = NULL;
            assert_int_equal(comet_model_synthetic(names[i], q, 1, &m), COMET_OK);
            assert_non_null(m->tok);
            assert_int_equal(comet_tokenizer_n_vocab(m->tok), m->cfg.n_vocab);
            assert_int_equal(comet_tokenizer_special_id(m->tok, COMET_SPECIAL_BOS), 128000);
            assert_int_equal(comet_tokenizer_special_id(m->tok, COMET_SPECIAL_EOS), 128009);
            assert_int_equal(m->cfg.bos_id, 128000);
            assert_int_equal(m->cfg.eos_ids[0], 128009);
            int32_t *ids;
            size_t n;
            assert_int_equal(comet_tokenizer_encode(m->tok, "x", 1, 1, &ids, &n),
                             COMET_ERR_INVALID_ARG);
            char want[128];
            snprintf(want, sizeof want, "synthetic model %s has no vocabulary: send token ids",
                     names[i]);
            assert_string_equal(comet_last_error(), want);
            comet_model_free(m);
        }
    comet_model *m = (comet_model *)1;
    assert_int_equal(comet_model_synthetic("llama3-13b", 1, 1, &m), COMET_ERR_INVALID_ARG);
    assert_non_null(strstr(comet_last_error(), "llama3-13b"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_refused),
        cmocka_unit_test(test_decode_pieces),
        cmocka_unit_test(test_detok_stream),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_synthetic_models_have_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
