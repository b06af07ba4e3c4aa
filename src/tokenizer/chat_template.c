/* chat_template.c — the chat templates comet renders natively (ChatML, Llama-3, Llama-2)
 * and the choice of one from a model's Jinja template string.
 *
 * No Jinja interpreter: each kind is written out to give byte-for-byte what the model's
 * own template gives under transformers' apply_chat_template (tests/fixtures/chat_*.txt
 * hold renders made that way). Templates with other logic (tool calls, date headers)
 * are not reproduced; detection picks a kind by the markers it finds.
 */
#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"
#include "tokenizer/tok_internal.h"

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
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
        {"chatml", COMET_CHAT_CHATML}, {"llama3", COMET_CHAT_LLAMA3},
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
        sb_str(b, "<|im_start|>");
        sb_str(b, m[i].role);
        sb_str(b, "\n");
        sb_str(b, m[i].content);
        sb_str(b, "<|im_end|>\n");
    }
    if (gen)
        sb_str(b, "<|im_start|>assistant\n");
}

static void render_llama3(sbuf *b, const comet_chat_message *m, size_t n, int gen,
                          const char *bos) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            sb_str(b, bos);
        sb_str(b, "<|start_header_id|>");
        sb_str(b, m[i].role);
        sb_str(b, "<|end_header_id|>\n\n");
        sb_stripped(b, m[i].content, strlen(m[i].content));
        sb_str(b, "<|eot_id|>");
    }
    if (gen)
        sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama-2-chat: the system message is folded into the first user turn; turns must
 * alternate user/assistant; every user turn opens with BOS, every answer closes with
 * "</s>". There is no generation prompt beyond the closing "[/INST]". */
static comet_status render_llama2(sbuf *b, const comet_chat_message *m, size_t n,
                                  const char *bos) {
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
            sb_str(b, bos);
            sb_str(b, "[INST] ");
            sb_stripped(b, content.s ? content.s : "", content.n);
            sb_str(b, " [/INST]");
        } else {
            sb_str(b, " ");
            sb_stripped(b, content.s ? content.s : "", content.n);
            sb_str(b, " </s>");
        }
        free(content.s);
    }
    return COMET_OK;
}

char *comet_chat_apply(comet_chat_template kind, const comet_chat_message *msgs, size_t n,
                       int add_generation_prompt, const char *bos) {
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) {
            comet_set_error(COMET_ERR_INVALID_ARG, "chat template: message %zu lacks %s", i,
                            msgs[i].role ? "content" : "a role");
            return NULL;
        }
    sbuf b = {0};
    sb_put(&b, "", 0);
    switch (kind) {
    case COMET_CHAT_CHATML: render_chatml(&b, msgs, n, add_generation_prompt); break;
    case COMET_CHAT_LLAMA3: render_llama3(&b, msgs, n, add_generation_prompt, bos); break;
    case COMET_CHAT_LLAMA2:
        if (render_llama2(&b, msgs, n, bos) < 0) {
            free(b.s);
            return NULL;
        }
        break;
    default:
        comet_set_error(COMET_ERR_INVALID_ARG, "chat template: unknown kind %d", (int)kind);
        free(b.s);
        return NULL;
    }
    if (b.oom) {
        free(b.s);
        comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        return NULL;
    }
    return b.s;
}

char *comet_chat_apply_model(comet_chat_template kind, const char *jinja,
                             const comet_chat_message *msgs, size_t n, int add_generation_prompt,
                             const char *bos) {
    char *default_system = NULL;
    if (n == 0 || !msgs[0].role || strcmp(msgs[0].role, "system") != 0)
        default_system = comet_chat_template_default_system(jinja);
    if (!default_system)
        return comet_chat_apply(kind, msgs, n, add_generation_prompt, bos);
    comet_chat_message *all = malloc((n + 1) * sizeof *all);
    if (!all) {
        free(default_system);
        comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        return NULL;
    }
    all[0] = (comet_chat_message){"system", default_system};
    if (n)
        memcpy(all + 1, msgs, n * sizeof *msgs);
    char *text = comet_chat_apply(kind, all, n + 1, add_generation_prompt, bos);
    free(all);
    free(default_system);
    return text;
}
