/* fuzz_tokenizer.c — libFuzzer target for encoding and streaming decoding.
 *
 * Input: byte 0 picks the tokenizer (the byte-level, SentencePiece and Metaspace
 * tokenizer.json fixtures) and parse_special; the rest is the text. Checks: encoding never
 * fails; byte-level ids decode to exactly the input bytes (all 256 bytes are tokens
 * there); the streaming detokenizer emits valid UTF-8 only, within its stated room.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"

static comet_tokenizer *toks[3];

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *names[3] = {"tok_bytelevel.json", "tok_spm.json", "tok_spm_meta.json"};
    for (int i = 0; i < 3; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tests/fixtures/%s", COMET_FUZZ_SOURCE_DIR, names[i]);
        toks[i] = comet_tokenizer_from_hf_json(path);
        if (!toks[i]) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", comet_last_error());
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const comet_tokenizer *tok = toks[data[0] % 3];
    int parse_special = (data[0] >> 2) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    if (comet_tokenizer_encode(tok, text, len, parse_special, &ids, &n) != COMET_OK)
        abort();
    if (data[0] % 3 == 0) {
        char *dec = malloc(len + 1);
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            int k = comet_tokenizer_token_bytes(tok, ids[i], 1, NULL, 0);
            if (k < 0 || m + (size_t)k > len)
                abort();
            comet_tokenizer_token_bytes(tok, ids[i], 1, dec + m, (size_t)k);
            m += (size_t)k;
        }
        if (m != len || memcmp(dec, text, len) != 0)
            abort();
        free(dec);
    }
    comet_detok d;
    comet_detok_init(&d, tok);
    size_t cap = 3 * ((size_t)comet_tokenizer_max_token_bytes(tok) + 3) + 1;
    char *out = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        int k = comet_detok_push(&d, ids[i], out, cap);
        if (k < 0 || (size_t)k >= cap || !valid_utf8(out, (size_t)k))
            abort();
    }
    int k = comet_detok_flush(&d, out, cap);
    if (k < 0 || !valid_utf8(out, (size_t)k))
        abort();
    free(out);
    free(ids);
    return 0;
}
