/* hf_json.c — reading an HF tokenizer.json (via cJSON) into a comet tokenizer.
 *
 * Supported: model.type "BPE" with
 *  - a byte-level pre-tokenizer (ByteLevel, optionally after Split/Digits steps, as in
 *    GPT-2, Llama-3, SmolLM) -> COMET_TOK_BPE with the regexes taken from the file;
 *  - SentencePiece-style text (Metaspace pre-tokenizer, or Prepend/Replace "▁"
 *    normalizers, byte_fallback) -> COMET_TOK_SPM merged by rank.
 * added_tokens become CONTROL (special: true) or USER_DEFINED tokens. BOS/EOS are not in
 * tokenizer.json (they live in tokenizer_config.json / config.json): callers set them with
 * comet_tokenizer_set_special. Anything else is refused by name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comet/tokenizer.h"
#include "tokenizer/tok_internal.h"

#define RE_GPT2_HF                                                                                 \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct hf_pre {
    int n_regex;
    char *regex[TOK_MAX_REGEX]; /* owned */
    int byte_level;
    int metaspace;
    int metaspace_pretok; /* a Metaspace pre-tokenizer (not the Llama-2 normalizers) */
    tok_spm_prefix prefix;
    int split;
} hf_pre;

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A literal string as a PCRE2 pattern (\Q...\E cannot hold "\E", so escape by hand). */
static char *regex_quote(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(2 * n + 1);
    if (!o)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}", s[i]))
            o[j++] = '\\';
        o[j++] = s[i];
    }
    o[j] = '\0';
    return o;
}

static comet_status add_regex(hf_pre *p, const char *path, char *re) {
    if (!re)
        return comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
    if (p->n_regex == TOK_MAX_REGEX) {
        free(re);
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "%s: pre_tokenizer: more than %d splitting steps", path,
                               TOK_MAX_REGEX);
    }
    p->regex[p->n_regex++] = re;
    return COMET_OK;
}

static comet_status parse_pre(hf_pre *p, const char *path, const cJSON *pt) {
    if (!pt || cJSON_IsNull(pt))
        return COMET_OK;
    const char *type = jstr(pt, "type");
    if (!type)
        return comet_set_error(COMET_ERR_FORMAT, "%s: pre_tokenizer without a type", path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"))
            COMET_TRY(parse_pre(p, path, item));
        return COMET_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (jbool(pt, "add_prefix_space", 0))
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: pre_tokenizer ByteLevel.add_prefix_space = true is not "
                                   "supported",
                                   path);
        p->byte_level = 1;
        if (jbool(pt, "use_regex", 1))
            return add_regex(p, path, strdup(RE_GPT2_HF));
        return COMET_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const char *behavior = jstr(pt, "behavior");
        if (!behavior || strcmp(behavior, "Isolated") != 0 || jbool(pt, "invert", 0))
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: pre_tokenizer Split with behavior \"%s\"%s; only "
                                   "Isolated, not inverted, is supported",
                                   path, behavior ? behavior : "?",
                                   jbool(pt, "invert", 0) ? " inverted" : "");
        const char *re = jstr(pat, "Regex");
        if (re)
            return add_regex(p, path, strdup(re));
        const char *lit = jstr(pat, "String");
        if (lit)
            return add_regex(p, path, regex_quote(lit));
        return comet_set_error(COMET_ERR_FORMAT, "%s: pre_tokenizer Split without a pattern", path);
    }
    if (strcmp(type, "Digits") == 0)
        return add_regex(p, path, strdup(jbool(pt, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+"));
    if (strcmp(type, "Metaspace") == 0) {
        const char *rep = jstr(pt, "replacement");
        if (rep && strcmp(rep, "\xe2\x96\x81") != 0)
            return comet_set_error(COMET_ERR_UNSUPPORTED,
                                   "%s: Metaspace replacement \"%s\"; only \"\xe2\x96\x81\"", path,
                                   rep);
        p->metaspace = 1;
        p->metaspace_pretok = 1;
        const char *scheme = jstr(pt, "prepend_scheme");
        if (scheme)
            p->prefix = strcmp(scheme, "always") == 0  ? TOK_SPM_PREFIX_ALWAYS
                        : strcmp(scheme, "first") == 0 ? TOK_SPM_PREFIX_FIRST
                                                       : TOK_SPM_PREFIX_NEVER;
        else
            p->prefix =
                jbool(pt, "add_prefix_space", 1) ? TOK_SPM_PREFIX_ALWAYS : TOK_SPM_PREFIX_NEVER;
        p->split = jbool(pt, "split", 1);
        return COMET_OK;
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "%s: pre_tokenizer type \"%s\" is not supported (ByteLevel, Split, "
                           "Digits, Metaspace, Sequence are)",
                           path, type);
}

/* Llama-2 style normalizers: Prepend("▁") and Replace(" ", "▁"). */
static comet_status parse_normalizer(hf_pre *p, const char *path, const cJSON *nz) {
    if (!nz || cJSON_IsNull(nz))
        return COMET_OK;
    const char *type = jstr(nz, "type");
    if (!type)
        return comet_set_error(COMET_ERR_FORMAT, "%s: normalizer without a type", path);
    if (strcmp(type, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(nz, "normalizers"))
            COMET_TRY(parse_normalizer(p, path, item));
        return COMET_OK;
    }
    if (strcmp(type, "Prepend") == 0 && jstr(nz, "prepend") &&
        strcmp(jstr(nz, "prepend"), "\xe2\x96\x81") == 0) {
        p->metaspace = 1;
        p->prefix = TOK_SPM_PREFIX_ALWAYS;
        return COMET_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        const char *with = jstr(nz, "content");
        const char *what = jstr(cJSON_GetObjectItemCaseSensitive(nz, "pattern"), "String");
        if (what && with && strcmp(what, " ") == 0 && strcmp(with, "\xe2\x96\x81") == 0) {
            p->metaspace = 1;
            return COMET_OK;
        }
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "%s: normalizer \"%s\" is not supported (only the SentencePiece "
                           "Prepend/Replace \"\xe2\x96\x81\" pair)",
                           path, type);
}

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1))) {
            if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
                free(buf);
                buf = NULL;
            } else {
                buf[len] = '\0';
                *n = (size_t)len;
            }
        }
    }
    fclose(f);
    return buf;
}

comet_tokenizer *comet_tokenizer_from_hf_json(const char *path) {
    comet_tokenizer *tok = NULL;
    cJSON *doc = NULL;
    char **tokens = NULL, **merges = NULL;
    int32_t *attr = NULL;
    int n_tokens = 0, n_merges = 0;
    hf_pre pre = {0};
    size_t len = 0;
    char *text = read_file(path, &len);
    if (!text) {
        comet_set_error(COMET_ERR_IO, "%s: cannot read the file", path);
        return NULL;
    }
    doc = cJSON_ParseWithLength(text, len);
    free(text);
    if (!doc) {
        comet_set_error(COMET_ERR_FORMAT, "%s: not valid JSON", path);
        return NULL;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    const char *mtype = jstr(model, "type");
    if (!mtype || strcmp(mtype, "BPE") != 0) {
        comet_set_error(COMET_ERR_UNSUPPORTED,
                        "%s: model.type \"%s\" is not supported; only \"BPE\" tokenizers are", path,
                        mtype ? mtype : "(missing)");
        goto done;
    }
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *a = jstr(model, affixes[i]);
        if (a && *a) {
            comet_set_error(COMET_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is not supported", path,
                            affixes[i], a);
            goto done;
        }
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(doc, "added_tokens");
    if (!cJSON_IsObject(vocab)) {
        comet_set_error(COMET_ERR_FORMAT, "%s: model.vocab is not an object", path);
        goto done;
    }
    const cJSON *it;
    int max_id = -1;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valueint < 0) {
            comet_set_error(COMET_ERR_FORMAT, "%s: model.vocab[\"%s\"] is not an id", path,
                            it->string);
            goto done;
        }
        if (it->valueint > max_id)
            max_id = it->valueint;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || !jstr(it, "content")) {
            comet_set_error(COMET_ERR_FORMAT, "%s: added_tokens entry without id/content", path);
            goto done;
        }
        if (id->valueint > max_id)
            max_id = id->valueint;
    }
    int n_entries = cJSON_GetArraySize(vocab) + cJSON_GetArraySize(added);
    if (max_id >= n_entries) {
        comet_set_error(COMET_ERR_FORMAT,
                        "%s: token id %d but only %d vocab/added_tokens entries; ids must be "
                        "0..n-1",
                        path, max_id, n_entries);
        goto done;
    }
    n_tokens = max_id + 1;
    tokens = calloc((size_t)(n_tokens ? n_tokens : 1), sizeof *tokens);
    attr = calloc((size_t)(n_tokens ? n_tokens : 1), sizeof *attr);
    if (!tokens || !attr) {
        comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    cJSON_ArrayForEach(it, vocab) {
        tokens[it->valueint] = it->string;
        attr[it->valueint] = COMET_TOKEN_NORMAL;
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        tokens[id] = (char *)jstr(it, "content");
        attr[id] = jbool(it, "special", 0) ? COMET_TOKEN_CONTROL : COMET_TOKEN_USER_DEFINED;
    }
    for (int i = 0; i < n_tokens; i++)
        if (!tokens[i]) {
            comet_set_error(COMET_ERR_FORMAT,
                            "%s: no token has id %d (ids must be 0..%d without gaps)", path, i,
                            n_tokens - 1);
            goto done;
        }

    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(model, "merges");
    n_merges = cJSON_GetArraySize(jm);
    merges = calloc((size_t)(n_merges ? n_merges : 1), sizeof *merges);
    if (!merges) {
        comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    int k = 0;
    cJSON_ArrayForEach(it, jm) {
        if (cJSON_IsString(it)) {
            merges[k] = strdup(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring;
            const char *b = cJSON_GetArrayItem(it, 1)->valuestring;
            merges[k] = malloc(strlen(a) + strlen(b) + 2);
            if (merges[k])
                sprintf(merges[k], "%s %s", a, b);
        } else {
            comet_set_error(COMET_ERR_FORMAT,
                            "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, k);
            goto done;
        }
        if (!merges[k]) {
            comet_set_error(COMET_ERR_NOMEM, "%s: out of memory", path);
            goto done;
        }
        k++;
    }

    pre.prefix = TOK_SPM_PREFIX_NEVER;
    if (parse_pre(&pre, path, cJSON_GetObjectItemCaseSensitive(doc, "pre_tokenizer")) < 0 ||
        parse_normalizer(&pre, path, cJSON_GetObjectItemCaseSensitive(doc, "normalizer")) < 0)
        goto done;
    int byte_fallback = jbool(model, "byte_fallback", 0);
    if (pre.byte_level && (pre.metaspace || byte_fallback)) {
        comet_set_error(COMET_ERR_UNSUPPORTED,
                        "%s: byte-level pre-tokenizer mixed with Metaspace/byte_fallback", path);
        goto done;
    }
    if (!pre.byte_level && !pre.metaspace) {
        comet_set_error(COMET_ERR_UNSUPPORTED,
                        "%s: neither a ByteLevel nor a Metaspace (SentencePiece) BPE tokenizer",
                        path);
        goto done;
    }
    if (pre.metaspace && pre.n_regex > 0) {
        comet_set_error(COMET_ERR_UNSUPPORTED,
                        "%s: Split/Digits steps before Metaspace are not supported", path);
        goto done;
    }
    if (!pre.byte_level)
        for (int i = 0; i < n_tokens; i++) { /* byte-fallback pieces "<0xXX>" */
            const char *s = tokens[i];
            if (attr[i] == COMET_TOKEN_NORMAL && strlen(s) == 6 && strncmp(s, "<0x", 3) == 0 &&
                strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF", s[4]) && s[5] == '>')
                attr[i] = COMET_TOKEN_BYTE;
        }
    const char *unk = jstr(model, "unk_token");
    int32_t unk_id = -1;
    if (unk) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(vocab, unk);
        unk_id = cJSON_IsNumber(u) ? u->valueint : -1;
    }
    comet_vocab_desc d = {
        .type = pre.byte_level ? COMET_TOK_BPE : COMET_TOK_SPM,
        .n_tokens = n_tokens,
        .tokens = (const char *const *)tokens,
        .token_attr = attr,
        .n_merges = n_merges,
        .merges = (const char *const *)merges,
        .pre = "gpt2",
        .bos_id = -1,
        .eos_id = -1,
        .unk_id = unk_id,
        .pad_id = -1,
    };
    tok = comet_tokenizer_init(&d);
    if (!tok) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", comet_last_error());
        comet_set_error(COMET_ERR_FORMAT, "%s: %s", path, msg);
        goto done;
    }
    if (pre.byte_level) {
        tok->ignore_merges = jbool(model, "ignore_merges", 0);
        if (tok_bpe_set_regexes(tok, (const char *const *)pre.regex, pre.n_regex) < 0) {
            comet_tokenizer_free(tok);
            tok = NULL;
        }
    } else {
        tok->spm_prefix = pre.prefix;
        tok->spm_split = pre.split;
        tok->spm_prefix_if_no_space = pre.metaspace_pretok;
        tok->byte_fallback = byte_fallback;
    }
done:
    for (int i = 0; merges && i < n_merges; i++)
        free(merges[i]);
    free(merges);
    free(tokens);
    free(attr);
    for (int i = 0; i < pre.n_regex; i++)
        free(pre.regex[i]);
    cJSON_Delete(doc);
    return tok;
}
