/* chat_template.c — the chat templates comet renders natively (ChatML, Llama-3, Llama-2)
 * and the choice of one from a model's Jinja template string.
 *
 * comet_chat renders with the model's own Jinja template (jinja.h) by default; the three
 * built-in kinds are written out to give byte-for-byte what those families' templates
 * give under transformers' apply_chat_template (tests/fixtures/chat_*.txt hold renders
 * made that way) and serve models without a template.
 *
 * The renderer also records where it wrote the template's own markers (<|im_start|>, BOS,
 * <|eot_id|>, ...; for Jinja, special-token text made only of template bytes). comet_chat_tokenize turns only those into control tokens; roles and
 * message contents are tokenized as plain text, so marker text typed inside a message
 * cannot open a turn of its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comet/tokenizer.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tok_internal.h"

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
    size_t *marks; /* [2 * n_marks] start, end of each template marker in s */
    size_t n_marks, cap_marks;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) {
    if (s)
        sb_put(b, s, strlen(s));
}

/* Append a marker of the template itself (special-token text such as "<|im_start|>" or
 * the BOS text): the only text comet_chat_tokenize may turn into a control token. */
static void sb_mark(sbuf *b, const char *s) {
    if (!s || !*s || b->oom)
        return;
    size_t start = b->n;
    sb_str(b, s);
    if (b->oom)
        return;
    if (b->n_marks == b->cap_marks) {
        size_t cap = b->cap_marks ? 2 * b->cap_marks : 32;
        size_t *p = realloc(b->marks, 2 * cap * sizeof *p);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->marks = p;
        b->cap_marks = cap;
    }
    b->marks[2 * b->n_marks] = start;
    b->marks[2 * b->n_marks + 1] = b->n;
    b->n_marks++;
}

static void sb_free(sbuf *b) {
    free(b->s);
    free(b->marks);
    memset(b, 0, sizeof *b);
}

/* Python's str.isspace() on a code point (what Jinja's trim and str.strip() remove). */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Append s[0..n) with leading and trailing whitespace removed. */
static void sb_stripped(sbuf *b, const char *s, size_t n) {
    size_t i = 0, j = n;
    while (i < j) {
        uint32_t cp;
        int k = tok_utf8_decode((const uint8_t *)s + i, j - i, &cp);
        if (!py_space(cp))
            break;
        i += (size_t)k;
    }
    while (j > i) {
        size_t k = j - 1;
        while (k > i && ((uint8_t)s[k] & 0xC0) == 0x80)
            k--;
        uint32_t cp;
        tok_utf8_decode((const uint8_t *)s + k, j - k, &cp);
        if (!py_space(cp))
            break;
        j = k;
    }
    sb_put(b, s + i, j - i);
}

comet_status comet_chat_template_detect(const char *jinja, comet_chat_template *out) {
    if (!jinja || !*jinja)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "chat template: the model has none; pass --chat-template "
                               "chatml|llama3|llama2 or use --raw");
    if (strstr(jinja, "<|im_start|>")) {
        *out = COMET_CHAT_CHATML;
        return COMET_OK;
    }
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>")) {
        *out = COMET_CHAT_LLAMA3;
        return COMET_OK;
    }
    if (strstr(jinja, "[INST]") && strstr(jinja, "<<SYS>>")) {
        *out = COMET_CHAT_LLAMA2;
        return COMET_OK;
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "chat template: not recognized (no ChatML, Llama-3 or Llama-2 "
                           "markers in \"%.60s%s\"); pass --chat-template chatml|llama3|llama2 "
                           "or use --raw",
                           jinja, strlen(jinja) > 60 ? "..." : "");
}

char *comet_chat_template_default_system(const char *jinja) {
    if (!jinja)
        return NULL;
    const char *cond = strstr(jinja, "messages[0]['role'] != 'system'");
    if (!cond)
        return NULL;
    static const char open[] = "<|im_start|>system\n";
    const char *a = strstr(cond, open);
    const char *endif = strstr(cond, "{% endif %}");
    if (!a || (endif && endif < a))
        return NULL;
    a += sizeof open - 1;
    const char *b = strstr(a, "<|im_end|>");
    if (!b || (endif && endif < b))
        return NULL;
    char *s = malloc((size_t)(b - a) + 1);
    if (!s)
        return NULL;
    memcpy(s, a, (size_t)(b - a));
    s[b - a] = '\0';
    return s;
}

comet_status comet_chat_template_from_name(const char *name, comet_chat_template *out) {
    static const struct {
        const char *name;
        comet_chat_template kind;
    } names[] = {
        {"chatml", COMET_CHAT_CHATML},  {"llama3", COMET_CHAT_LLAMA3},
        {"llama-3", COMET_CHAT_LLAMA3}, {"llama2", COMET_CHAT_LLAMA2},
        {"llama-2", COMET_CHAT_LLAMA2},
    };
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].kind;
            return COMET_OK;
        }
    return comet_set_error(COMET_ERR_INVALID_ARG,
                           "--chat-template \"%s\": unknown; use chatml, llama3 or llama2",
                           name ? name : "(null)");
}

static void render_chatml(sbuf *b, const comet_chat_message *m, size_t n, int gen) {
    for (size_t i = 0; i < n; i++) {
        sb_mark(b, "<|im_start|>");
        sb_str(b, m[i].role);
        sb_str(b, "\n");
        sb_str(b, m[i].content);
        sb_mark(b, "<|im_end|>");
        sb_str(b, "\n");
    }
    if (gen) {
        sb_mark(b, "<|im_start|>");
        sb_str(b, "assistant\n");
    }
}

static void render_llama3(sbuf *b, const comet_chat_message *m, size_t n, int gen,
                          const char *bos) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            sb_mark(b, bos);
        sb_mark(b, "<|start_header_id|>");
        sb_str(b, m[i].role);
        sb_mark(b, "<|end_header_id|>");
        sb_str(b, "\n\n");
        sb_stripped(b, m[i].content, strlen(m[i].content));
        sb_mark(b, "<|eot_id|>");
    }
    if (gen) {
        sb_mark(b, "<|start_header_id|>");
        sb_str(b, "assistant");
        sb_mark(b, "<|end_header_id|>");
        sb_str(b, "\n\n");
    }
}

/* Llama-2-chat: the system message is folded into the first user turn; turns must
 * alternate user/assistant; every user turn opens with BOS, every answer closes with
 * "</s>". There is no generation prompt beyond the closing "[/INST]". */
static comet_status render_llama2(sbuf *b, const comet_chat_message *m, size_t n, const char *bos) {
    const char *sys = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        sys = m[0].content;
        m++;
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        int user = strcmp(m[i].role, "user") == 0;
        if (user != (i % 2 == 0))
            return comet_set_error(COMET_ERR_INVALID_ARG,
                                   "chat template llama2: message %zu has role \"%s\"; roles "
                                   "must alternate user/assistant/user/...",
                                   i + (sys != NULL), m[i].role);
        sbuf content = {0};
        if (i == 0 && sys) {
            sb_str(&content, "<<SYS>>\n");
            sb_str(&content, sys);
            sb_str(&content, "\n<</SYS>>\n\n");
        }
        sb_str(&content, m[i].content);
        if (content.oom) {
            free(content.s);
            return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        }
        if (user) {
            sb_mark(b, bos);
            sb_str(b, "[INST] ");
            sb_stripped(b, content.s ? content.s : "", content.n);
            sb_str(b, " [/INST]");
        } else {
            sb_str(b, " ");
            sb_stripped(b, content.s ? content.s : "", content.n);
            sb_str(b, " ");
            sb_mark(b, "</s>");
        }
        free(content.s);
    }
    return COMET_OK;
}

/* Render into `b` (which the caller frees with sb_free). */
static comet_status render(comet_chat_template kind, const comet_chat_message *msgs, size_t n,
                           int add_generation_prompt, const char *bos, sbuf *b) {
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return comet_set_error(COMET_ERR_INVALID_ARG, "chat template: message %zu lacks %s", i,
                                   msgs[i].role ? "content" : "a role");
    sb_put(b, "", 0);
    switch (kind) {
    case COMET_CHAT_CHATML: render_chatml(b, msgs, n, add_generation_prompt); break;
    case COMET_CHAT_LLAMA3: render_llama3(b, msgs, n, add_generation_prompt, bos); break;
    case COMET_CHAT_LLAMA2: COMET_TRY(render_llama2(b, msgs, n, bos)); break;
    default:
        return comet_set_error(COMET_ERR_INVALID_ARG, "chat template: unknown kind %d", (int)kind);
    }
    if (b->oom)
        return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    return COMET_OK;
}

char *comet_chat_apply(comet_chat_template kind, const comet_chat_message *msgs, size_t n,
                       int add_generation_prompt, const char *bos) {
    sbuf b = {0};
    if (render(kind, msgs, n, add_generation_prompt, bos, &b) < 0) {
        sb_free(&b);
        return NULL;
    }
    free(b.marks);
    return b.s;
}

/* msgs with the model template's default system message in front when it inserts one
 * (*all is then a malloc'd copy and *default_system the message text, both for the caller
 * to free; else *all = msgs and both pointers NULL). */
static comet_status with_default_system(const char *jinja, const comet_chat_message *msgs,
                                        size_t *n, const comet_chat_message **all,
                                        comet_chat_message **owned, char **default_system) {
    *all = msgs;
    *owned = NULL;
    *default_system = NULL;
    if (*n > 0 && msgs[0].role && strcmp(msgs[0].role, "system") == 0)
        return COMET_OK;
    char *sys = comet_chat_template_default_system(jinja);
    if (!sys)
        return COMET_OK;
    comet_chat_message *m = malloc((*n + 1) * sizeof *m);
    if (!m) {
        free(sys);
        return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    }
    m[0] = (comet_chat_message){"system", sys};
    if (*n)
        memcpy(m + 1, msgs, *n * sizeof *msgs);
    *n += 1;
    *all = m;
    *owned = m;
    *default_system = sys;
    return COMET_OK;
}

char *comet_chat_apply_model(comet_chat_template kind, const char *jinja,
                             const comet_chat_message *msgs, size_t n, int add_generation_prompt,
                             const char *bos) {
    const comet_chat_message *all;
    comet_chat_message *owned;
    char *default_system;
    if (with_default_system(jinja, msgs, &n, &all, &owned, &default_system) < 0)
        return NULL;
    char *text = comet_chat_apply(kind, all, n, add_generation_prompt, bos);
    free(owned);
    free(default_system);
    return text;
}

/* ---- tokenizing a rendered conversation ------------------------------------------------ */

static comet_status push_ids(tok_ids *out, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (tok_ids_push(out, ids[i]) < 0)
            return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    return COMET_OK;
}

/* Plain text (parse_special off) exactly as comet_tokenizer_encode encodes that stretch of
 * the whole rendered prompt: `at_start` says whether it starts the prompt, which matters to
 * SentencePiece tokenizers that put "▁" only before the first segment of a text. */
static comet_status encode_plain(const comet_tokenizer *t, const char *s, size_t n, int at_start,
                                 tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    if (at_start || t->type != COMET_TOK_SPM || t->spm_prefix != TOK_SPM_PREFIX_FIRST) {
        int32_t *ids;
        size_t k;
        COMET_TRY(comet_tokenizer_encode(t, s, n, 0, &ids, &k));
        comet_status st = push_ids(out, ids, k);
        free(ids);
        return st;
    }
    /* A "first"-scheme SentencePiece text after a control token: no "▁" in front. With
     * parse_special off only user-defined tokens split it (comet_tokenizer_encode). */
    size_t seg = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = -1;
        uint8_t c = (uint8_t)s[i];
        for (int j = t->special_start[c]; j < t->special_start[c + 1] && id < 0; j++) {
            int32_t cand = t->special_ids[j];
            if (t->attr[cand] == COMET_TOKEN_USER_DEFINED && t->text_len[cand] <= n - i &&
                memcmp(s + i, t->text[cand], t->text_len[cand]) == 0)
                id = cand;
        }
        if (id < 0)
            continue;
        COMET_TRY(tok_spm_encode_segment(t, s + seg, i - seg, 0, out));
        if (tok_ids_push(out, id) < 0)
            return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        i += t->text_len[id] - 1;
        seg = i + 1;
    }
    return tok_spm_encode_segment(t, s + seg, n - seg, 0, out);
}

/* The control/user-defined token whose text is exactly s[0..n), or -1 (the vocabulary has
 * no such special token: the marker is then plain text, as it is in the whole render). */
static int32_t marker_id(const comet_tokenizer *t, const char *s, size_t n) {
    for (int j = t->special_start[(uint8_t)s[0]]; j < t->special_start[(uint8_t)s[0] + 1]; j++) {
        int32_t id = t->special_ids[j];
        if (t->text_len[id] == n && memcmp(s, t->text[id], n) == 0)
            return id;
    }
    return -1;
}

/* Tokenize the render in `b`: its marks become control tokens, the text between them is
 * plain text (or the whole render with parse_special on when allow_special). */
static comet_status tokenize_marked(const comet_tokenizer *tok, sbuf *b, int allow_special,
                                    int32_t **ids, size_t *n_ids) {
    comet_status st = COMET_OK;
    if (allow_special)
        /* trusted caller: the whole render, special-token text anywhere parsed */
        return comet_tokenizer_encode(tok, b->s ? b->s : "", b->n, 1, ids, n_ids);
    /* Only the template's markers become control tokens; the text between two of them
     * (roles, contents, the template's own plain text) is encoded in one piece with
     * parse_special off, so ordinary text tokenizes as it does in the whole render. */
    tok_ids out = {0};
    size_t run = 0; /* start of the plain text not yet encoded */
    for (size_t k = 0; k < b->n_marks && st >= 0; k++) {
        size_t a = b->marks[2 * k], e = b->marks[2 * k + 1];
        int32_t id = marker_id(tok, b->s + a, e - a);
        if (id < 0)
            continue;
        st = encode_plain(tok, b->s + run, a - run, run == 0, &out);
        if (st >= 0 && tok_ids_push(&out, id) < 0)
            st = comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        run = e;
    }
    if (st >= 0)
        st = encode_plain(tok, b->s + run, b->n - run, run == 0, &out);
    if (st >= 0 && !out.v && !(out.v = malloc(sizeof *out.v)))
        st = comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    if (st < 0) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n_ids = out.n;
    return COMET_OK;
}

comet_status comet_chat_tokenize(const comet_tokenizer *tok, comet_chat_template kind,
                                 const char *jinja, const comet_chat_message *msgs, size_t n,
                                 int add_generation_prompt, const char *bos,
                                 int allow_special_in_content, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    const comet_chat_message *all;
    comet_chat_message *owned;
    char *default_system;
    COMET_TRY(with_default_system(jinja, msgs, &n, &all, &owned, &default_system));
    sbuf b = {0};
    comet_status st = render(kind, all, n, add_generation_prompt, bos, &b);
    free(owned);
    free(default_system);
    if (st < 0) {
        sb_free(&b);
        return st;
    }
    st = tokenize_marked(tok, &b, allow_special_in_content, ids, n_ids);
    sb_free(&b);
    return st;
}

/* ---- the model's chat template: Jinja or a built-in renderer -------------------------- */

struct comet_chat {
    comet_jinja *jinja;        /* NULL: the built-in `kind` */
    comet_chat_template kind;
    char *model_template;      /* owned copy (the built-ins read its default system message) */
    char describe[320];
};

static char *read_template_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        comet_set_error(COMET_ERR_IO, "--chat-template %s: cannot open (give chatml, llama3, "
                        "llama2 or the path of a Jinja file)", path);
        return NULL;
    }
    char *s = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *p = cap <= ((size_t)16 << 20) ? realloc(s, cap) : NULL;
            if (!p) {
                free(s);
                fclose(f);
                comet_set_error(COMET_ERR_INVALID_ARG, "--chat-template %s: too large or out of "
                                "memory", path);
                return NULL;
            }
            s = p;
        }
        size_t k = fread(s + n, 1, 4096, f);
        n += k;
        if (k < 4096)
            break;
    }
    fclose(f);
    s[n] = '\0';
    return s;
}

comet_chat *comet_chat_init(const char *model_template, const char *override) {
    comet_chat *c = calloc(1, sizeof *c);
    if (!c) {
        comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        return NULL;
    }
    if (model_template && !(c->model_template = strdup(model_template))) {
        free(c);
        comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        return NULL;
    }
    comet_chat_template kind;
    const char *src = NULL;
    char *file = NULL;
    if (override && comet_chat_template_from_name(override, &kind) == COMET_OK) {
        c->kind = kind;
        snprintf(c->describe, sizeof c->describe, "the built-in %s renderer (--chat-template)",
                 override);
        return c;
    }
    if (override) {
        if (!(file = read_template_file(override))) {
            comet_chat_free(c);
            return NULL;
        }
        src = file;
        snprintf(c->describe, sizeof c->describe, "the Jinja template of %.250s", override);
    } else if (model_template && *model_template) {
        src = model_template;
        snprintf(c->describe, sizeof c->describe, "the model's own Jinja chat template");
    } else {
        comet_chat_free(c);
        comet_set_error(COMET_ERR_UNSUPPORTED,
                        "chat template: the model has none; pass --chat-template FILE.jinja (or "
                        "a built-in: chatml, llama3, llama2) or use --raw");
        return NULL;
    }
    c->jinja = comet_jinja_parse(src, strlen(src));
    free(file);
    if (!c->jinja) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", comet_last_error());
        comet_chat_free(c);
        comet_set_error(COMET_ERR_INVALID_ARG, "%s (in %s)", msg,
                        override ? override : "the model's chat template");
        return NULL;
    }
    return c;
}

void comet_chat_free(comet_chat *c) {
    if (!c)
        return;
    comet_jinja_free(c->jinja);
    free(c->model_template);
    free(c);
}

const char *comet_chat_describe(const comet_chat *c) { return c->describe; }

/* Marks for the Jinja render: every special token whose text lies wholly in bytes from the
 * template itself (taint 0), longest first at each position, as comet_tokenizer_encode
 * with parse_special finds them. */
static comet_status mark_template_tokens(const comet_tokenizer *t, sbuf *b, const uint8_t *taint) {
    for (size_t i = 0; i < b->n;) {
        if (taint[i]) {
            i++;
            continue;
        }
        uint8_t c = (uint8_t)b->s[i];
        int32_t hit = -1;
        for (int j = t->special_start[c]; j < t->special_start[c + 1] && hit < 0; j++) {
            int32_t id = t->special_ids[j];
            size_t len = t->text_len[id];
            if (len == 0 || len > b->n - i || memcmp(b->s + i, t->text[id], len) != 0)
                continue;
            size_t k = 0;
            while (k < len && !taint[i + k])
                k++;
            if (k == len)
                hit = id;
        }
        if (hit < 0) {
            i++;
            continue;
        }
        if (b->n_marks == b->cap_marks) {
            size_t cap = b->cap_marks ? 2 * b->cap_marks : 32;
            size_t *p = realloc(b->marks, 2 * cap * sizeof *p);
            if (!p)
                return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
            b->marks = p;
            b->cap_marks = cap;
        }
        b->marks[2 * b->n_marks] = i;
        b->marks[2 * b->n_marks + 1] = i + t->text_len[hit];
        b->n_marks++;
        i += t->text_len[hit];
    }
    return COMET_OK;
}

static comet_status build_jinja(const comet_chat *c, const comet_tokenizer *tok,
                                const comet_chat_message *msgs, size_t n,
                                const char *messages_json, const char *tools_json, int gen,
                                const char *bos, const char *eos, sbuf *b, uint8_t **taint) {
    cJSON *data = cJSON_CreateObject(), *trusted = cJSON_CreateObject();
    cJSON *messages = NULL, *tools = NULL;
    comet_status st = COMET_OK;
    if (!data || !trusted) {
        st = comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        goto done;
    }
    if (messages_json) {
        messages = cJSON_Parse(messages_json);
        if (!cJSON_IsArray(messages)) {
            cJSON_Delete(messages);
            st = comet_set_error(COMET_ERR_INVALID_ARG, "chat template: messages are not a JSON "
                                 "array");
            goto done;
        }
    } else {
        messages = cJSON_CreateArray();
        for (size_t i = 0; messages && i < n; i++) {
            if (!msgs[i].role || !msgs[i].content) {
                cJSON_Delete(messages);
                st = comet_set_error(COMET_ERR_INVALID_ARG, "chat template: message %zu lacks %s",
                                     i, msgs[i].role ? "content" : "a role");
                goto done;
            }
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", msgs[i].role);
            cJSON_AddStringToObject(m, "content", msgs[i].content);
            cJSON_AddItemToArray(messages, m);
        }
    }
    cJSON_AddItemToObject(data, "messages", messages);
    tools = tools_json ? cJSON_Parse(tools_json) : cJSON_CreateNull();
    if (!tools) {
        st = comet_set_error(COMET_ERR_INVALID_ARG, "chat template: tools are not valid JSON");
        goto done;
    }
    cJSON_AddItemToObject(data, "tools", tools);
    cJSON_AddNullToObject(data, "documents");
    cJSON_AddBoolToObject(trusted, "add_generation_prompt", gen);
    if (bos)
        cJSON_AddStringToObject(trusted, "bos_token", bos);
    if (eos)
        cJSON_AddStringToObject(trusted, "eos_token", eos);
    char *out;
    size_t n_out;
    st = comet_jinja_render(c->jinja, data, trusted, NULL, &out, &n_out, taint);
    if (st >= 0) {
        b->s = out;
        b->n = n_out;
        b->cap = n_out + 1;
        st = mark_template_tokens(tok, b, *taint);
    }
done:
    cJSON_Delete(data);
    cJSON_Delete(trusted);
    return st;
}

comet_status comet_chat_build(const comet_chat *c, const comet_tokenizer *tok,
                              const comet_chat_message *msgs, size_t n, const char *messages_json,
                              const char *tools_json, int add_generation_prompt, const char *bos,
                              const char *eos, int allow_special_in_content, char **text,
                              int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (text)
        *text = NULL;
    if (!c->jinja) {
        if (text && !(*text = comet_chat_apply_model(c->kind, c->model_template, msgs, n,
                                                     add_generation_prompt, bos)))
            return COMET_ERR_INVALID_ARG;
        comet_status st = comet_chat_tokenize(tok, c->kind, c->model_template, msgs, n,
                                              add_generation_prompt, bos,
                                              allow_special_in_content, ids, n_ids);
        if (st < 0 && text) {
            free(*text);
            *text = NULL;
        }
        return st;
    }
    sbuf b = {0};
    uint8_t *taint = NULL;
    comet_status st = build_jinja(c, tok, msgs, n, messages_json, tools_json,
                                  add_generation_prompt, bos, eos, &b, &taint);
    free(taint);
    if (st >= 0)
        st = tokenize_marked(tok, &b, allow_special_in_content, ids, n_ids);
    if (st >= 0 && text) {
        *text = b.s;
        b.s = NULL;
    }
    sb_free(&b);
    return st;
}
