/* test_tokenizer.c — tokenizer against golden ids from HF tokenizers/transformers.
 *
 * Fixtures (tests/fixtures, made by scripts/golden_*.py from independent implementations):
 *  tokens_smollm2.json    ids for ~290 strings with the default model's tokenizer
 *  tok_bytelevel.json, tok_spm.json, tok_small_golden.json   small tokenizer.json files
 *                         (byte-level and SentencePiece-style) with their golden ids
 *  chat_templates.json    transformers' apply_chat_template renders
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "comet/model.h"
#include "comet/tokenizer.h"

static char *fixture_path(const char *name) {
    const char *root = getenv("COMET_SOURCE_DIR");
    static char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", root ? root : ".", name);
    return path;
}

static cJSON *load_json(const char *name) {
    const char *path = fixture_path(name);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    cJSON *doc = cJSON_Parse(buf);
    free(buf);
    if (!doc)
        fail_msg("fixture %s is not valid JSON", path);
    return doc;
}

static char *unhex(const char *h, size_t *n) {
    size_t len = strlen(h) / 2;
    char *out = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[len] = '\0';
    *n = len;
    return out;
}

static const char *jstr(const cJSON *o, const char *k) {
    return cJSON_GetObjectItemCaseSensitive(o, k)->valuestring;
}

/* Concatenated bytes of ids (control tokens rendered when render_special). */
static char *decode_all(const comet_tokenizer *tok, const int32_t *ids, size_t n,
                        int render_special, size_t *len) {
    size_t cap = 16, m = 0;
    char *out = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        int k = comet_tokenizer_token_bytes(tok, ids[i], render_special, NULL, 0);
        assert_true(k >= 0);
        while (m + (size_t)k + 1 > cap)
            out = realloc(out, cap *= 2);
        assert_int_equal(
            comet_tokenizer_token_bytes(tok, ids[i], render_special, out + m, (size_t)k), k);
        m += (size_t)k;
    }
    out[m] = '\0';
    *len = m;
    return out;
}

/* Streaming detokenization of ids, one at a time, plus the final flush. */
static char *detok_all(const comet_tokenizer *tok, const int32_t *ids, size_t n) {
    comet_detok d;
    comet_detok_init(&d, tok);
    size_t chunk = 3 * (size_t)comet_tokenizer_max_token_bytes(tok) + 16;
    char *out = malloc(n * chunk + chunk + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int k = comet_detok_push(&d, ids[i], out + m, chunk);
        assert_true(k >= 0);
        m += (size_t)k;
    }
    int k = comet_detok_flush(&d, out + m, chunk);
    assert_true(k >= 0);
    m += (size_t)k;
    out[m] = '\0';
    return out;
}

static int ids_equal(const cJSON *expect, const int32_t *ids, size_t n) {
    if ((size_t)cJSON_GetArraySize(expect) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (cJSON_GetArrayItem(expect, (int)i)->valueint != ids[i])
            return 0;
    return 1;
}

static void print_mismatch(const char *what, const char *text, const cJSON *expect,
                           const int32_t *ids, size_t n) {
    fprintf(stderr, "%s: ids differ for \"%s\"\n  got     :", what, text);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n  expected:");
    const cJSON *e;
    cJSON_ArrayForEach(e, expect) fprintf(stderr, " %d", e->valueint);
    fprintf(stderr, "\n");
}

/* Check every case of `cases` whose "tokenizer" field is `name` (or all when NULL). */
static void check_cases(const comet_tokenizer *tok, const cJSON *cases, const char *name,
                        int check_decoded) {
    int n_cases = 0, n_bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        if (name && strcmp(jstr(c, "tokenizer"), name) != 0)
            continue;
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(c, "special");
        int parse_special = sp ? sp->valueint : 1;
        size_t len;
        char *text = unhex(jstr(c, "hex"), &len);
        int32_t *ids;
        size_t n;
        assert_int_equal(comet_tokenizer_encode(tok, text, len, parse_special, &ids, &n), COMET_OK);
        const cJSON *expect = cJSON_GetObjectItemCaseSensitive(c, "ids");
        n_cases++;
        if (!ids_equal(expect, ids, n)) {
            print_mismatch(name ? name : "smollm2", jstr(c, "text"), expect, ids, n);
            n_bad++;
        }
        if (check_decoded) {
            const char *decoded = jstr(c, "decoded");
            if (!strstr(decoded, "<s>") && !strstr(decoded, "</s>") &&
                !strstr(decoded, "<|special|>")) {
                char *streamed = detok_all(tok, ids, n);
                if (strcmp(streamed, decoded) != 0) {
                    fprintf(stderr, "%s: streamed \"%s\" != HF decode \"%s\"\n", name, streamed,
                            decoded);
                    n_bad++;
                }
                free(streamed);
            }
        }
        free(ids);
        free(text);
    }
    assert_true(n_cases > 0);
    assert_int_equal(n_bad, 0);
}

/* ---- default model -------------------------------------------------------------------- */

/* Loaded once for the whole group (the loader dequantizes every weight). */
static comet_model *default_model;

static int setup_default_model(void **state) {
    (void)state;
    const char *root = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/SmolLM2-135M-Instruct.Q4_1.gguf", root ? root : ".");
    if (comet_model_load(path, &default_model) != COMET_OK) {
        fprintf(stderr, "cannot load the default model %s: %s\n", path, comet_last_error());
        return -1;
    }
    return default_model->tok ? 0 : -1;
}

static int teardown_default_model(void **state) {
    (void)state;
    comet_model_free(default_model);
    default_model = NULL;
    return 0;
}

static comet_model *load_default_model(void) {
    assert_non_null(default_model);
    return default_model;
}

static void test_smollm2_golden_ids(void **state) {
    (void)state;
    comet_model *m = load_default_model();
    cJSON *doc = load_json("tokens_smollm2.json");
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases");
    assert_true(cJSON_GetArraySize(cases) >= 200);
    check_cases(m->tok, cases, NULL, 0);

    /* decode(encode(s)) == s, both by token bytes and by streaming. */
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        size_t len, n, dlen;
        char *text = unhex(jstr(c, "hex"), &len);
        int32_t *ids;
        int special = cJSON_GetObjectItemCaseSensitive(c, "special")->valueint;
        assert_int_equal(comet_tokenizer_encode(m->tok, text, len, special, &ids, &n), COMET_OK);
        char *dec = decode_all(m->tok, ids, n, 1, &dlen);
        assert_int_equal(dlen, len);
        assert_memory_equal(dec, text, len);
        if (!strstr(text, "<|") && !strstr(text, "<repo") && !strstr(text, "<jupyter")) {
            char *streamed = detok_all(m->tok, ids, n);
            assert_string_equal(streamed, text);
            free(streamed);
        }
        free(dec);
        free(ids);
        free(text);
    }
    cJSON_Delete(doc);
}

/* Whole novels (data/ from scripts/extract_texts.py, which the setup runs): the id count
 * and an FNV-1a hash of all ids match HF tokenizers'. */
static void test_smollm2_novels(void **state) {
    (void)state;
    comet_model *m = load_default_model();
    cJSON *doc = load_json("tokens_smollm2.json");
    const cJSON *nv;
    int n_novels = 0;
    cJSON_ArrayForEach(nv, cJSON_GetObjectItemCaseSensitive(doc, "novels")) {
        const char *root = getenv("COMET_SOURCE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", root ? root : ".", jstr(nv, "path"));
        FILE *f = fopen(path, "rb");
        if (!f)
            fail_msg("%s is missing: run scripts/extract_texts.py (the setup does)", path);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)len);
        assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
        fclose(f);
        int32_t *ids;
        size_t n;
        assert_int_equal(comet_tokenizer_encode(m->tok, text, (size_t)len, 0, &ids, &n), COMET_OK);
        assert_int_equal(n, cJSON_GetObjectItemCaseSensitive(nv, "n_tokens")->valueint);
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++) {
                h ^= ((uint32_t)ids[i] >> (8 * b)) & 0xFF;
                h *= 0x100000001b3ull;
            }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        assert_string_equal(hex, jstr(nv, "fnv1a64"));
        const cJSON *first = cJSON_GetObjectItemCaseSensitive(nv, "first");
        assert_true(ids_equal(first, ids, (size_t)cJSON_GetArraySize(first)));
        free(ids);
        free(text);
        n_novels++;
    }
    assert_int_equal(n_novels, 2);
    cJSON_Delete(doc);
}

static void test_smollm2_special_tokens(void **state) {
    (void)state;
    comet_model *m = load_default_model();
    const comet_tokenizer *tok = m->tok;
    int32_t im_start = comet_tokenizer_find(tok, "<|im_start|>");
    int32_t im_end = comet_tokenizer_find(tok, "<|im_end|>");
    assert_int_equal(im_start, 1);
    assert_int_equal(im_end, 2);
    const char *text = "<|im_start|>user\nHi<|im_end|>";
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n), COMET_OK);
    assert_true(n >= 4);
    assert_int_equal(ids[0], im_start);
    assert_int_equal(ids[n - 1], im_end);
    free(ids);
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n), COMET_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_not_equal(ids[i], im_start);
        assert_int_not_equal(ids[i], im_end);
    }
    /* Control tokens are rendered only on request. */
    char buf[64];
    assert_int_equal(comet_tokenizer_token_bytes(tok, im_start, 0, buf, sizeof buf), 0);
    assert_int_equal(comet_tokenizer_token_bytes(tok, im_start, 1, buf, sizeof buf), 12);
    assert_memory_equal(buf, "<|im_start|>", 12);
    assert_true(comet_tokenizer_token_bytes(tok, comet_tokenizer_n_vocab(tok), 0, buf, 4) < 0);
    free(ids);
}

/* An emoji is four byte tokens in SmolLM2's vocabulary: the streaming detokenizer must hold
 * the partial character and emit it whole with the last byte. */
static void test_smollm2_detok_split_emoji(void **state) {
    (void)state;
    comet_model *m = load_default_model();
    const comet_tokenizer *tok = m->tok;
    const char *text = "a\xf0\x9f\xa6\x9c"; /* "a🦜" */
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n), COMET_OK);
    /* Feed the bytes of the emoji as separate single-byte tokens. */
    int32_t byte_ids[5];
    for (int i = 0; i < 5; i++) {
        int32_t *one;
        size_t k;
        assert_int_equal(comet_tokenizer_encode(tok, text + i, 1, 0, &one, &k), COMET_OK);
        assert_int_equal(k, 1);
        byte_ids[i] = one[0];
        free(one);
    }
    comet_detok d;
    comet_detok_init(&d, tok);
    char out[1024];
    assert_int_equal(comet_detok_push(&d, byte_ids[0], out, sizeof out), 1);
    assert_string_equal(out, "a");
    for (int i = 1; i < 4; i++) {
        assert_int_equal(comet_detok_push(&d, byte_ids[i], out, sizeof out), 0);
        assert_string_equal(out, "");
    }
    assert_int_equal(comet_detok_push(&d, byte_ids[4], out, sizeof out), 4);
    assert_string_equal(out, text + 1);
    assert_int_equal(comet_detok_flush(&d, out, sizeof out), 0);
    /* An unfinished character at the end of the stream becomes U+FFFD. */
    comet_detok_init(&d, tok);
    assert_int_equal(comet_detok_push(&d, byte_ids[1], out, sizeof out), 0);
    assert_int_equal(comet_detok_push(&d, byte_ids[2], out, sizeof out), 0);
    assert_int_equal(comet_detok_flush(&d, out, sizeof out), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    /* A stray continuation byte can never complete: replaced at once. */
    comet_detok_init(&d, tok);
    assert_int_equal(comet_detok_push(&d, byte_ids[3], out, sizeof out), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    /* The model's own ids for the text stream back to the text. */
    char *streamed = detok_all(tok, ids, n);
    assert_string_equal(streamed, text);
    free(streamed);
    free(ids);
}

/* Invalid UTF-8 is tokenized byte-wise and decodes back to the same bytes; bytes the
 * vocabulary has no token for (0xC0, 0xFF, ...) come back as U+FFFD. */
static void test_smollm2_invalid_utf8(void **state) {
    (void)state;
    comet_model *m = load_default_model();
    const char text[] = "ok \xe2\x82 tail \xed\xa0\x80 end\x80\xa0";
    size_t len = sizeof text - 1, n, dlen;
    int32_t *ids;
    assert_int_equal(comet_tokenizer_encode(m->tok, text, len, 1, &ids, &n), COMET_OK);
    assert_true(n > 0);
    char *dec = decode_all(m->tok, ids, n, 1, &dlen);
    assert_int_equal(dlen, len);
    assert_memory_equal(dec, text, len);
    free(dec);
    free(ids);
    const char lacking[] = "a\xff\xc0"
                           "b";
    const char replaced[] = "a\xef\xbf\xbd\xef\xbf\xbd"
                            "b";
    assert_int_equal(comet_tokenizer_encode(m->tok, lacking, 4, 1, &ids, &n), COMET_OK);
    dec = decode_all(m->tok, ids, n, 1, &dlen);
    assert_int_equal(dlen, sizeof replaced - 1);
    assert_memory_equal(dec, replaced, dlen);
    free(dec);
    free(ids);
}

/* ---- small tokenizer.json fixtures -------------------------------------------------- */

static void test_hf_json_bytelevel(void **state) {
    (void)state;
    comet_tokenizer *tok = comet_tokenizer_from_hf_json(fixture_path("tok_bytelevel.json"));
    if (!tok)
        fail_msg("%s", comet_last_error());
    cJSON *doc = load_json("tok_small_golden.json");
    check_cases(tok, cJSON_GetObjectItemCaseSensitive(doc, "cases"), "bytelevel", 1);

    /* Special tokens parsed or not; the non-special added token "<mask>" always. */
    const char *text = "a <|special|> b<mask>";
    int32_t special = comet_tokenizer_find(tok, "<|special|>");
    int32_t mask = comet_tokenizer_find(tok, "<mask>");
    assert_true(special >= 0 && mask >= 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n), COMET_OK);
    int seen_special = 0;
    for (size_t i = 0; i < n; i++)
        seen_special |= ids[i] == special;
    assert_true(seen_special);
    assert_int_equal(ids[n - 1], mask);
    free(ids);
    assert_int_equal(comet_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n), COMET_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], special);
    assert_int_equal(ids[n - 1], mask);
    free(ids);
    cJSON_Delete(doc);
    comet_tokenizer_free(tok);
}

static void test_hf_json_spm(void **state) {
    (void)state;
    comet_tokenizer *tok = comet_tokenizer_from_hf_json(fixture_path("tok_spm.json"));
    if (!tok)
        fail_msg("%s", comet_last_error());
    cJSON *doc = load_json("tok_small_golden.json");
    check_cases(tok, cJSON_GetObjectItemCaseSensitive(doc, "cases"), "spm", 1);
    comet_tokenizer_free(tok);
    tok = comet_tokenizer_from_hf_json(fixture_path("tok_spm_meta.json"));
    if (!tok)
        fail_msg("%s", comet_last_error());
    check_cases(tok, cJSON_GetObjectItemCaseSensitive(doc, "cases"), "spm_meta", 1);
    cJSON_Delete(doc);
    comet_tokenizer_free(tok);
}

/* The same SentencePiece vocabulary described the GGUF way (scores, token types, no
 * merges) must tokenize like HF's BPE on it. */
static void test_spm_desc_scores(void **state) {
    (void)state;
    cJSON *tj = load_json("tok_spm.json");
    cJSON *doc = load_json("tok_small_golden.json");
    const cJSON *vocab =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tj, "model"), "vocab");
    const cJSON *scores = cJSON_GetObjectItemCaseSensitive(doc, "spm_scores");
    const cJSON *attrs = cJSON_GetObjectItemCaseSensitive(doc, "spm_attr");
    int n = cJSON_GetArraySize(scores);
    assert_int_equal(cJSON_GetArraySize(vocab), n);
    const char **tokens = calloc((size_t)n, sizeof *tokens);
    float *sc = malloc((size_t)n * sizeof *sc);
    int32_t *attr = malloc((size_t)n * sizeof *attr);
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) tokens[it->valueint] = it->string;
    for (int i = 0; i < n; i++) {
        assert_non_null(tokens[i]);
        sc[i] = (float)cJSON_GetArrayItem(scores, i)->valuedouble;
        attr[i] = cJSON_GetArrayItem(attrs, i)->valueint;
    }
    comet_vocab_desc d = {.type = COMET_TOK_SPM,
                          .n_tokens = n,
                          .tokens = tokens,
                          .token_attr = attr,
                          .scores = sc,
                          .bos_id = 1,
                          .eos_id = 2,
                          .unk_id = 0,
                          .pad_id = -1};
    comet_tokenizer *tok = comet_tokenizer_init(&d);
    if (!tok)
        fail_msg("%s", comet_last_error());
    check_cases(tok, cJSON_GetObjectItemCaseSensitive(doc, "cases"), "spm", 1);
    assert_int_equal(comet_tokenizer_special_id(tok, COMET_SPECIAL_BOS), 1);
    /* <0x41> decodes to "A". */
    char buf[8];
    assert_int_equal(
        comet_tokenizer_token_bytes(tok, comet_tokenizer_find(tok, "<0x41>"), 0, buf, sizeof buf),
        1);
    assert_int_equal(buf[0], 'A');
    comet_tokenizer_free(tok);
    free(tokens);
    free(sc);
    free(attr);
    cJSON_Delete(doc);
    cJSON_Delete(tj);
}

/* The byte-level fixture described the GGUF way with tokenizer.ggml.pre = "llama-bpe":
 * the built-in Llama-3 regex and ignore_merges must give what the file's own Split regex
 * gives under HF tokenizers. */
static void test_desc_llama_bpe_pre(void **state) {
    (void)state;
    cJSON *tj = load_json("tok_bytelevel.json");
    cJSON *doc = load_json("tok_small_golden.json");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    int n = cJSON_GetArraySize(vocab) + 1; /* + the added "<mask>" */
    const char **tokens = calloc((size_t)n, sizeof *tokens);
    int32_t *attr = malloc((size_t)n * sizeof *attr);
    const char **merges = malloc((size_t)cJSON_GetArraySize(jm) * sizeof *merges);
    const cJSON *it;
    for (int i = 0; i < n; i++)
        attr[i] = COMET_TOKEN_NORMAL;
    cJSON_ArrayForEach(it, vocab) tokens[it->valueint] = it->string;
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        assert_true(id < n);
        tokens[id] = jstr(it, "content");
        attr[id] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"))
                       ? COMET_TOKEN_CONTROL
                       : COMET_TOKEN_USER_DEFINED;
    }
    int k = 0;
    cJSON_ArrayForEach(it, jm) merges[k++] = it->valuestring;
    for (int i = 0; i < n; i++)
        assert_non_null(tokens[i]);
    comet_vocab_desc d = {.type = COMET_TOK_BPE,
                          .n_tokens = n,
                          .tokens = tokens,
                          .token_attr = attr,
                          .n_merges = k,
                          .merges = merges,
                          .pre = "llama-bpe",
                          .bos_id = 0,
                          .eos_id = 1,
                          .unk_id = -1,
                          .pad_id = -1};
    comet_tokenizer *tok = comet_tokenizer_init(&d);
    if (!tok)
        fail_msg("%s", comet_last_error());
    check_cases(tok, cJSON_GetObjectItemCaseSensitive(doc, "cases"), "bytelevel", 1);
    comet_tokenizer_free(tok);
    free(tokens);
    free(attr);
    free(merges);
    cJSON_Delete(doc);
    cJSON_Delete(tj);
}

/* Every pre-tokenizer name builds (its regexes compile under PCRE2) and encodes text
 * byte-wise over a vocabulary of the 256 byte symbols alone. */
static void test_pre_names(void **state) {
    (void)state;
    char sym[256][4];
    const char *tokens[256];
    for (int b = 0, k = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)k++;
        if (cp < 0x80) {
            sym[b][0] = (char)cp, sym[b][1] = 0;
        } else {
            sym[b][0] = (char)(0xC0 | (cp >> 6)), sym[b][1] = (char)(0x80 | (cp & 0x3F));
            sym[b][2] = 0;
        }
        tokens[b] = sym[b];
    }
    const char *names[] = {NULL,     "default",   "gpt2",  "gpt-2", "llama3",   "llama-bpe",
                           "smollm", "starcoder", "qwen2", "dbrx",  "command-r"};
    const char text[] = "Hello 123 world!!\n\n  x's \xe4\xbd\xa0\xf0\x9f\x98\x80 $+<=> 4096";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        comet_vocab_desc d = {.type = COMET_TOK_BPE,
                              .n_tokens = 256,
                              .tokens = tokens,
                              .pre = names[i],
                              .bos_id = -1,
                              .eos_id = -1,
                              .unk_id = -1,
                              .pad_id = -1};
        comet_tokenizer *tok = comet_tokenizer_init(&d);
        if (!tok)
            fail_msg("pre %s: %s", names[i] ? names[i] : "(none)", comet_last_error());
        int32_t *ids;
        size_t n, len;
        assert_int_equal(comet_tokenizer_encode(tok, text, sizeof text - 1, 1, &ids, &n), COMET_OK);
        assert_int_equal(n, sizeof text - 1);
        char *dec = decode_all(tok, ids, n, 1, &len);
        assert_int_equal(len, sizeof text - 1);
        assert_memory_equal(dec, text, len);
        free(dec);
        free(ids);
        comet_tokenizer_free(tok);
    }
}

/* ---- construction errors -------------------------------------------------------------- */

static void test_bad_inputs(void **state) {
    (void)state;
    assert_null(comet_tokenizer_from_hf_json("/nonexistent/tokenizer.json"));
    assert_non_null(strstr(comet_last_error(), "/nonexistent/tokenizer.json"));

    /* Malformed or unsupported tokenizer.json files: refused, naming the field. */
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "Unigram"},
        {"not json", "JSON"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "id 2"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [3]},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "merges[0]"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]},"
         " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "a b"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"normalizer\": {\"type\": \"NFKC\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "NFKC"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
         " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
         "Whitespace"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [],"
         " \"continuing_subword_prefix\": \"##\"}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "continuing_subword_prefix"},
    };
    const char *path = "test_tokenizer_bad.json";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i].json, f);
        fclose(f);
        comet_clear_error();
        assert_null(comet_tokenizer_from_hf_json(path));
        if (!strstr(comet_last_error(), bad[i].needle) || !strstr(comet_last_error(), path))
            fail_msg("case %zu: error \"%s\" should name %s and the file", i, comet_last_error(),
                     bad[i].needle);
    }
    remove(path);

    const char *toks[] = {"a", "b", "ab", "c"};
    const char *bad_merge[] = {"a x"};
    comet_vocab_desc d = {.type = COMET_TOK_BPE,
                          .n_tokens = 4,
                          .tokens = toks,
                          .n_merges = 1,
                          .merges = bad_merge,
                          .pre = "gpt2",
                          .bos_id = -1,
                          .eos_id = -1,
                          .unk_id = -1,
                          .pad_id = -1};
    assert_null(comet_tokenizer_init(&d));
    assert_non_null(strstr(comet_last_error(), "a x"));
    const char *no_result[] = {"b c"};
    d.merges = no_result;
    assert_null(comet_tokenizer_init(&d));
    assert_non_null(strstr(comet_last_error(), "b c"));
    const char *good[] = {"a b"};
    d.merges = good;
    d.pre = "no-such-pre";
    assert_null(comet_tokenizer_init(&d));
    assert_non_null(strstr(comet_last_error(), "no-such-pre"));
    const char *dup[] = {"a", "b", "ab", "a"};
    d.tokens = dup;
    d.pre = "gpt2";
    assert_null(comet_tokenizer_init(&d));
    d.tokens = toks;
    d.bos_id = 4;
    assert_null(comet_tokenizer_init(&d));
    d.bos_id = -1;
    comet_tokenizer *tok = comet_tokenizer_init(&d);
    assert_non_null(tok);
    int32_t *ids;
    size_t n;
    assert_int_equal(comet_tokenizer_encode(tok, "abc", 3, 0, &ids, &n), COMET_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2); /* "ab" */
    assert_int_equal(ids[1], 3); /* "c" */
    free(ids);
    assert_int_equal(comet_tokenizer_encode(tok, "", 0, 0, &ids, &n), COMET_OK);
    assert_int_equal(n, 0);
    free(ids);
    comet_tokenizer_free(tok);
    comet_tokenizer_free(NULL);
}

/* ---- chat templates ------------------------------------------------------------------- */

static void test_chat_templates(void **state) {
    (void)state;
    cJSON *doc = load_json("chat_templates.json");
    const cJSON *t;
    int n_renders = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(doc, "templates")) {
        const char *name = jstr(t, "name");
        const char *jinja = jstr(t, "jinja");
        comet_chat_template by_name, detected;
        assert_int_equal(comet_chat_template_from_name(name, &by_name), COMET_OK);
        assert_int_equal(comet_chat_template_detect(jinja, &detected), COMET_OK);
        assert_int_equal(detected, by_name);
        const cJSON *bos_j = cJSON_GetObjectItemCaseSensitive(t, "bos");
        const char *bos = cJSON_IsString(bos_j) ? bos_j->valuestring : NULL;
        char *default_system = comet_chat_template_default_system(jinja);
        const cJSON *r;
        cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(t, "renders")) {
            const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(r, "messages");
            size_t n = (size_t)cJSON_GetArraySize(msgs);
            comet_chat_message m[8];
            size_t k = 0;
            if (default_system && strcmp(jstr(cJSON_GetArrayItem(msgs, 0), "role"), "system"))
                m[k++] = (comet_chat_message){"system", default_system};
            for (size_t i = 0; i < n; i++) {
                const cJSON *mi = cJSON_GetArrayItem(msgs, (int)i);
                m[k++] = (comet_chat_message){jstr(mi, "role"), jstr(mi, "content")};
            }
            int gen = cJSON_GetObjectItemCaseSensitive(r, "add_generation_prompt")->valueint;
            char *out = comet_chat_apply(detected, m, k, gen, bos);
            assert_non_null(out);
            assert_string_equal(out, jstr(r, "render"));
            free(out);
            n_renders++;
        }
        free(default_system);
    }
    assert_true(n_renders >= 12);
    cJSON_Delete(doc);

    comet_chat_template kind;
    assert_int_equal(comet_chat_template_detect("{{ messages }} <start_of_turn>", &kind),
                     COMET_ERR_UNSUPPORTED);
    assert_non_null(strstr(comet_last_error(), "--chat-template"));
    assert_int_equal(comet_chat_template_detect(NULL, &kind), COMET_ERR_UNSUPPORTED);
    assert_int_equal(comet_chat_template_from_name("vicuna", &kind), COMET_ERR_INVALID_ARG);
    assert_null(comet_chat_template_default_system("{{ '<|im_start|>' }}"));
    comet_chat_message bad[] = {{"user", "a"}, {"user", "b"}};
    assert_null(comet_chat_apply(COMET_CHAT_LLAMA2, bad, 2, 0, "<s>"));
    assert_non_null(strstr(comet_last_error(), "alternate"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_golden_ids),
        cmocka_unit_test(test_smollm2_novels),
        cmocka_unit_test(test_smollm2_special_tokens),
        cmocka_unit_test(test_smollm2_detok_split_emoji),
        cmocka_unit_test(test_smollm2_invalid_utf8),
        cmocka_unit_test(test_hf_json_bytelevel),
        cmocka_unit_test(test_hf_json_spm),
        cmocka_unit_test(test_spm_desc_scores),
        cmocka_unit_test(test_desc_llama_bpe_pre),
        cmocka_unit_test(test_pre_names),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_chat_templates),
    };
    return cmocka_run_group_tests(tests, setup_default_model, teardown_default_model);
}
