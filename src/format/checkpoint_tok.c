/* checkpoint_tok.c — the tokenizer files of a comet checkpoint: tokenizer.json copied from
 * an HF source directory, or written in HF `tokenizers` form from a GGUF source's
 * tokenizer.ggml.* metadata (byte-level BPE vocabularies: the token strings, merges by
 * rank, control/user-defined tokens as added_tokens, the pre-tokenizer named by
 * tokenizer.ggml.pre); and tokenizer_config.json (chat template, special tokens,
 * add_bos_token) from the loaded model. SentencePiece GGUF vocabularies are refused by name:
 * quantizing from the model's HF directory works for those. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "comet/tokenizer.h"
#include "format/checkpoint.h"
#include "format/gguf.h"

static comet_status write_json_file(const char *path, cJSON *j, int formatted) {
    char *text = formatted ? cJSON_Print(j) : cJSON_PrintUnformatted(j);
    if (!text)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
    free(text);
    if (fclose(f) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return COMET_OK;
}

static comet_status copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in)
        return comet_set_error(COMET_ERR_IO, "%s: cannot open: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    char buf[65536];
    size_t n;
    int bad = 0;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0)
        bad = fwrite(buf, 1, n, out) != n;
    bad |= ferror(in);
    fclose(in);
    if (fclose(out) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: copy to %s failed", from, to);
    return COMET_OK;
}

static cJSON *byte_level(int use_regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", 0);
    cJSON_AddBoolToObject(b, "trim_offsets", 1);
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

/* HF pre_tokenizer for a GGUF tokenizer.ggml.pre name; NULL if not known here. */
static cJSON *pre_tokenizer(const char *pre) {
    static const char *llama3_regex =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
        "\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (!strcmp(pre, "gpt2") || !strcmp(pre, "gpt-2") || !strcmp(pre, "default"))
        return byte_level(1);
    cJSON *seq = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    if (!strcmp(pre, "smollm") || !strcmp(pre, "starcoder") || !strcmp(pre, "refact")) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", 1);
        cJSON_AddItemToArray(list, d);
        cJSON_AddItemToArray(list, byte_level(1));
        return seq;
    }
    if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe")) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "type", "Split");
        cJSON *pat = cJSON_AddObjectToObject(s, "pattern");
        cJSON_AddStringToObject(pat, "Regex", llama3_regex);
        cJSON_AddStringToObject(s, "behavior", "Isolated");
        cJSON_AddBoolToObject(s, "invert", 0);
        cJSON_AddItemToArray(list, s);
        cJSON_AddItemToArray(list, byte_level(0));
        return seq;
    }
    cJSON_Delete(seq);
    return NULL;
}

static comet_status tokenizer_json_from_gguf(const char *src, const char *out_path) {
    comet_gguf *g = NULL;
    COMET_TRY(comet_gguf_open(src, &g));
    comet_status st = COMET_OK;
    char **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    cJSON *root = NULL;
    comet_gguf_str model_s = {0}, pre_s = {0};
    const comet_gguf_kv *tk = NULL, *ty = NULL, *mg = NULL;
    char pre[64] = "default";
    if ((st = comet_gguf_get_str(g, "tokenizer.ggml.model", &model_s)) < 0)
        goto done;
    if (model_s.len != 4 || memcmp(model_s.s, "gpt2", 4)) {
        st = comet_set_error(COMET_ERR_UNSUPPORTED,
                             "%s: tokenizer.ggml.model \"%.*s\": writing tokenizer.json is "
                             "supported for byte-level BPE (\"gpt2\") vocabularies; quantizing "
                             "from the model's HF directory works for others",
                             src, (int)model_s.len, model_s.s);
        goto done;
    }
    if (comet_gguf_find(g, "tokenizer.ggml.pre")) {
        if ((st = comet_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s)) < 0)
            goto done;
        snprintf(pre, sizeof pre, "%.*s", (int)(pre_s.len < 63 ? pre_s.len : 63), pre_s.s);
    }
    cJSON *pt = pre_tokenizer(pre);
    if (!pt) {
        st = comet_set_error(COMET_ERR_UNSUPPORTED,
                             "%s: tokenizer.ggml.pre \"%s\": no HF pre-tokenizer known for it "
                             "(gpt2, smollm, llama3 are); quantizing from the HF directory works",
                             src, pre);
        goto done;
    }
    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    if ((st = comet_gguf_get_arr(g, "tokenizer.ggml.tokens", COMET_GGUF_STRING, &tk)) < 0 ||
        (st = comet_gguf_arr_strings(tk, &tokens)) < 0 ||
        (st = comet_gguf_get_arr(g, "tokenizer.ggml.merges", COMET_GGUF_STRING, &mg)) < 0 ||
        (st = comet_gguf_arr_strings(mg, &merges)) < 0)
        goto done;
    types = calloc(tk->arr_n ? tk->arr_n : 1, sizeof *types);
    if (!types) {
        st = comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", src);
        goto done;
    }
    if (comet_gguf_find(g, "tokenizer.ggml.token_type")) {
        if ((st = comet_gguf_get_arr(g, "tokenizer.ggml.token_type", COMET_GGUF_VTYPE_COUNT, &ty)) <
            0)
            goto done;
        if (ty->arr_n != tk->arr_n) {
            st = comet_set_error(COMET_ERR_FORMAT,
                                 "%s: tokenizer.ggml.token_type has %llu "
                                 "entries for %llu tokens",
                                 src, (unsigned long long)ty->arr_n, (unsigned long long)tk->arr_n);
            goto done;
        }
        if ((st = comet_gguf_arr_i32(ty, types)) < 0)
            goto done;
    }
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (uint64_t i = 0; i < tk->arr_n; i++) {
        if (types[i] != COMET_TOKEN_CONTROL && types[i] != COMET_TOKEN_USER_DEFINED)
            continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", (double)i);
        cJSON_AddStringToObject(a, "content", tokens[i]);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", types[i] == COMET_TOKEN_CONTROL);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddItemToObject(root, "decoder", byte_level(1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges",
                          !strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe"));
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (uint64_t i = 0; i < tk->arr_n; i++)
        cJSON_AddItemToObject(vocab, tokens[i], cJSON_CreateNumber((double)i));
    cJSON *ml = cJSON_AddArrayToObject(model, "merges");
    for (uint64_t i = 0; i < mg->arr_n; i++)
        cJSON_AddItemToArray(ml, cJSON_CreateString(merges[i]));
    st = write_json_file(out_path, root, 0);
done:
    cJSON_Delete(root);
    free(tokens);
    free(merges);
    free(types);
    comet_gguf_free(g);
    return st;
}

/* The text of token `id` for tokenizer_config.json, or NULL. */
static void add_token_text(cJSON *j, const char *key, const comet_tokenizer *tok, int32_t id) {
    char buf[256];
    int n = id >= 0 && tok ? comet_tokenizer_token_bytes(tok, id, 1, buf, sizeof buf - 1) : -1;
    if (n < 0 || n >= (int)sizeof buf) {
        cJSON_AddNullToObject(j, key);
        return;
    }
    buf[n] = '\0';
    cJSON_AddStringToObject(j, key, buf);
}

comet_status comet_checkpoint_write_tokenizer(const comet_model *m, const char *src_path,
                                              const char *dir) {
    char out[4096], in[4096];
    snprintf(out, sizeof out, "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(src_path, &sb) != 0)
        return comet_set_error(COMET_ERR_IO, "%s: %s", src_path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(in, sizeof in, "%s/tokenizer.json", src_path);
        COMET_TRY(copy_file(in, out));
    } else {
        COMET_TRY(tokenizer_json_from_gguf(src_path, out));
    }
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddBoolToObject(tc, "add_bos_token", m->cfg.add_bos);
    cJSON_AddBoolToObject(tc, "add_eos_token", 0);
    add_token_text(tc, "bos_token", m->tok, m->cfg.bos_id);
    add_token_text(tc, "eos_token", m->tok, m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : -1);
    cJSON_AddBoolToObject(tc, "clean_up_tokenization_spaces", 0);
    cJSON_AddNumberToObject(tc, "model_max_length", m->cfg.n_ctx);
    cJSON_AddStringToObject(tc, "tokenizer_class", "PreTrainedTokenizerFast");
    if (m->chat_template)
        cJSON_AddStringToObject(tc, "chat_template", m->chat_template);
    snprintf(out, sizeof out, "%s/tokenizer_config.json", dir);
    comet_status st = write_json_file(out, tc, 1);
    cJSON_Delete(tc);
    return st;
}
