/* jinja_lex.c — Jinja template source to tokens, with Jinja2's whitespace rules as
 * transformers configures them: newlines normalized and one trailing newline dropped
 * (keep_trailing_newline off), trim_blocks (the newline after a block or comment tag is
 * removed), lstrip_blocks (spaces before a block or comment tag alone on its line are
 * removed), and the "-"/"+" markers of each tag. Comments are dropped here; {% raw %}
 * becomes data. Inside tags: names, numbers, strings with Python escapes, operators.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_int.h"

typedef struct lexer {
    jarena *a;
    jerr *e;
    const char *s; /* normalized source */
    size_t n, pos;
    int line;
    jtok *toks;
    size_t n_toks, cap;
} lexer;

static void push(lexer *L, jtok t) {
    if (L->n_toks == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        jtok *nt = ja_alloc(L->a, L->e, cap * sizeof *nt);
        if (L->n_toks)
            memcpy(nt, L->toks, L->n_toks * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    L->toks[L->n_toks++] = t;
}

static char *dup(lexer *L, const char *s, size_t n) {
    char *d = ja_alloc(L->a, L->e, n + 1);
    memcpy(d, s, n);
    return d;
}

static int count_lines(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* Python's str.splitlines() line ends become "\n"; one trailing newline is dropped. */
static char *normalize(jarena *a, jerr *e, const char *src, size_t n, size_t *out_n) {
    char *d = ja_alloc(a, e, n + 1);
    size_t j = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)src[i];
        if (c == '\r') {
            d[j++] = '\n';
            i += (i + 1 < n && src[i + 1] == '\n') ? 2 : 1;
        } else if (c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
            d[j++] = '\n';
            i++;
        } else if (c == 0xC2 && i + 1 < n && (unsigned char)src[i + 1] == 0x85) {
            d[j++] = '\n';
            i += 2;
        } else if (c == 0xE2 && i + 2 < n && (unsigned char)src[i + 1] == 0x80 &&
                   ((unsigned char)src[i + 2] == 0xA8 || (unsigned char)src[i + 2] == 0xA9)) {
            d[j++] = '\n';
            i += 3;
        } else
            d[j++] = src[i++];
    }
    if (j > 0 && d[j - 1] == '\n')
        j--;
    d[j] = '\0';
    *out_n = j;
    return d;
}

/* Length of the Python whitespace character at s[i] (0 if none). */
static size_t space_at(const char *s, size_t n, size_t i) {
    size_t k;
    uint32_t c = utf8_get(s + i, n - i, &k);
    return py_isspace(c) ? k : 0;
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    size_t k;
    while (i < n && (k = space_at(s, n, i)))
        i += k;
    return i;
}

/* Byte length of text[0..n) with trailing Python whitespace removed. */
static size_t rstrip_len(const char *t, size_t n) {
    while (n > 0) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)t[k] & 0xC0) == 0x80)
            k--;
        if (!space_at(t, n, k))
            break;
        n = k;
    }
    return n;
}

static void emit_data(lexer *L, const char *t, size_t n, int line) {
    if (n)
        push(L, (jtok){.type = T_DATA, .line = line, .s = dup(L, t, n), .n = n});
}

/* Decode a Python string literal body (between the quotes) with unicode-escape rules. */
static char *unescape(lexer *L, const char *s, size_t n, size_t *out_n) {
    char *d = ja_alloc(L->a, L->e, n + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            d[j++] = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp = 0;
        int hex = 0;
        switch (c) {
        case 'n': d[j++] = '\n'; break;
        case 't': d[j++] = '\t'; break;
        case 'r': d[j++] = '\r'; break;
        case '\\': d[j++] = '\\'; break;
        case '\'': d[j++] = '\''; break;
        case '"': d[j++] = '"'; break;
        case 'a': d[j++] = '\a'; break;
        case 'b': d[j++] = '\b'; break;
        case 'f': d[j++] = '\f'; break;
        case 'v': d[j++] = '\v'; break;
        case '\n': break;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                int k = 0;
                for (; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++, i++)
                    cp = cp * 8 + (uint32_t)(s[i] - '0');
                i--;
                j += (size_t)utf8_put(cp, d + j);
            } else {
                d[j++] = '\\';
                d[j++] = c;
            }
        }
        if (hex) {
            if (i + (size_t)hex >= n)
                jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "truncated \\%c escape in a string", c);
            for (int k = 0; k < hex; k++) {
                char h = s[i + 1 + (size_t)k];
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0)
                    jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "bad \\%c escape in a string", c);
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10FFFF)
                jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "\\%c escape out of range", c);
            i += (size_t)hex;
            j += (size_t)utf8_put(cp, d + j);
        }
    }
    *out_n = j;
    return d;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~<>=()[]{},.:|;";

/* Tokens of one tag from L->pos to its end marker; returns 1 when the marker had "-". */
static void lex_tag(lexer *L, int var) {
    int depth = 0;
    for (;;) {
        size_t i = skip_space(L->s, L->n, L->pos);
        L->line += count_lines(L->s + L->pos, i - L->pos);
        L->pos = i;
        const char *s = L->s + i;
        size_t left = L->n - i;
        if (left == 0)
            jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "unexpected end of template inside a %s",
                  var ? "{{ ... }} tag" : "{% ... %} tag");
        if (depth == 0) {
            const char *end = var ? "}}" : "%}";
            int minus = left >= 3 && s[0] == '-' && s[1] == end[0] && s[2] == end[1];
            int plus = !var && left >= 3 && s[0] == '+' && s[1] == end[0] && s[2] == end[1];
            if (minus || plus || (left >= 2 && s[0] == end[0] && s[1] == end[1])) {
                push(L, (jtok){.type = var ? T_VAR_END : T_BLOCK_END, .line = L->line});
                L->pos += (minus || plus) ? 3 : 2;
                if (minus) {
                    size_t j = skip_space(L->s, L->n, L->pos);
                    L->line += count_lines(L->s + L->pos, j - L->pos);
                    L->pos = j;
                } else if (!var && !plus && L->pos < L->n && L->s[L->pos] == '\n') {
                    L->pos++;
                    L->line++;
                }
                return;
            }
        }
        char c = s[0];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            size_t k = 1;
            while (k < left && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
                                (s[k] >= '0' && s[k] <= '9') || s[k] == '_'))
                k++;
            push(L, (jtok){.type = T_NAME, .line = L->line, .s = dup(L, s, k), .n = k});
            L->pos += k;
        } else if (c >= '0' && c <= '9') {
            int after_dot = L->n_toks > 0 && L->toks[L->n_toks - 1].type == T_OP &&
                            strcmp(L->toks[L->n_toks - 1].s, ".") == 0;
            size_t k = 0;
            char num[64];
            size_t nn = 0;
            int is_float = 0, too_long = 0;
/* one character of the literal into num, or too_long when it has no room */
#define NUM_PUT(ch)                                                                                \
    do {                                                                                           \
        if (nn < sizeof num - 1)                                                                   \
            num[nn++] = (ch);                                                                      \
        else                                                                                       \
            too_long = 1;                                                                          \
    } while (0)
            while (k < left && ((s[k] >= '0' && s[k] <= '9') || (s[k] == '_' && k + 1 < left &&
                                                                  s[k + 1] >= '0' && s[k + 1] <= '9')))
                if (s[k++] != '_')
                    NUM_PUT(s[k - 1]);
            if (!after_dot && k + 1 < left && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
                is_float = 1;
                NUM_PUT(s[k]);
                k++;
                while (k < left && ((s[k] >= '0' && s[k] <= '9') || s[k] == '_'))
                    if (s[k++] != '_')
                        NUM_PUT(s[k - 1]);
            }
            if (!after_dot && k < left && (s[k] == 'e' || s[k] == 'E')) {
                size_t m = k + 1;
                if (m < left && (s[m] == '+' || s[m] == '-'))
                    m++;
                if (m < left && s[m] >= '0' && s[m] <= '9') {
                    is_float = 1;
                    while (k < m) {
                        NUM_PUT(s[k]);
                        k++;
                    }
                    while (k < left && s[k] >= '0' && s[k] <= '9') {
                        NUM_PUT(s[k]);
                        k++;
                    }
                }
            }
#undef NUM_PUT
            if (too_long) {
                jfail(L->e, COMET_ERR_INVALID_ARG, L->line,
                      "number literal longer than %zu characters", sizeof num - 1);
                nn = 0;
                num[nn++] = '0';
            }
            num[nn] = '\0';
            jtok t = {.type = is_float ? T_FLOAT : T_INT, .line = L->line};
            if (is_float)
                t.f = strtod(num, NULL);
            else {
                char *endp;
                unsigned long long v = strtoull(num, &endp, 10);
                if (nn > 18 || v > (unsigned long long)INT64_MAX)
                    jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "integer literal %s too large", num);
                t.i = (int64_t)v;
            }
            push(L, t);
            L->pos += k;
        } else if (c == '\'' || c == '"') {
            size_t k = 1;
            while (k < left && s[k] != c)
                k += (s[k] == '\\' && k + 1 < left) ? 2 : 1;
            if (k >= left)
                jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "unterminated string literal");
            size_t n;
            char *v = unescape(L, s + 1, k - 1, &n);
            push(L, (jtok){.type = T_STRING, .line = L->line, .s = v, .n = n});
            L->line += count_lines(s, k);
            L->pos += k + 1;
        } else {
            size_t k = 0;
            for (size_t o = 0; o < sizeof ops2 / sizeof ops2[0] && !k; o++)
                if (left >= 2 && s[0] == ops2[o][0] && s[1] == ops2[o][1])
                    k = 2;
            if (!k && strchr(ops1, c) && c)
                k = 1;
            if (!k)
                jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "unexpected character '%c' in a tag",
                      c >= 0x20 && c < 0x7f ? c : '?');
            if (c == '(' || c == '[' || c == '{')
                depth++;
            else if (c == ')' || c == ']' || c == '}') {
                if (depth == 0)
                    jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "unexpected '%c'", c);
                depth--;
            }
            push(L, (jtok){.type = T_OP, .line = L->line, .s = dup(L, s, k), .n = k});
            L->pos += k;
        }
    }
}

/* Position of "{% endraw %}" (any whitespace and -/+ markers) from i; sets *end past it. */
static size_t find_endraw(lexer *L, size_t i, size_t *end, int *minus_before) {
    for (;;) {
        const char *p = strstr(L->s + i, "{%");
        if (!p)
            jfail(L->e, COMET_ERR_INVALID_ARG, L->line, "{%% raw %%} without {%% endraw %%}");
        size_t at = (size_t)(p - L->s), j = at + 2;
        int minus = j < L->n && L->s[j] == '-';
        if (j < L->n && (L->s[j] == '-' || L->s[j] == '+'))
            j++;
        j = skip_space(L->s, L->n, j);
        if (strncmp(L->s + j, "endraw", 6) == 0) {
            j = skip_space(L->s, L->n, j + 6);
            int tminus = L->s[j] == '-';
            if (L->s[j] == '-' || L->s[j] == '+')
                j++;
            if (strncmp(L->s + j, "%}", 2) == 0) {
                j += 2;
                if (tminus)
                    j = skip_space(L->s, L->n, j);
                else if (j < L->n && L->s[j] == '\n')
                    j++;
                *end = j;
                *minus_before = minus;
                return at;
            }
        }
        i = at + 2;
    }
}

void jlex(jarena *a, jerr *e, const char *src, size_t n, jtok **toks, size_t *n_toks) {
    lexer L = {.a = a, .e = e, .line = 1};
    L.s = normalize(a, e, src, n, &L.n);
    int line_starting = 1;
    while (L.pos < L.n) {
        const char *p = L.s + L.pos, *tag = NULL;
        for (const char *q = p; (q = memchr(q, '{', L.n - (size_t)(q - L.s))) != NULL; q++)
            if (q + 1 < L.s + L.n && (q[1] == '{' || q[1] == '%' || q[1] == '#')) {
                tag = q;
                break;
            }
        if (!tag) {
            emit_data(&L, p, L.n - L.pos, L.line);
            break;
        }
        size_t tlen = (size_t)(tag - p);
        char kind = tag[1];
        char sign = tag + 2 < L.s + L.n ? tag[2] : 0;
        if (sign != '-' && sign != '+')
            sign = 0;
        if (sign == '-')
            tlen = rstrip_len(p, tlen);
        else if (sign != '+' && kind != '{') {
            size_t l_pos = 0;
            for (size_t k = tlen; k > 0; k--)
                if (p[k - 1] == '\n') {
                    l_pos = k;
                    break;
                }
            if ((l_pos > 0 || line_starting) && l_pos < tlen && rstrip_len(p + l_pos, tlen - l_pos) == 0)
                tlen = l_pos;
        }
        int text_line = L.line;
        L.line += count_lines(p, (size_t)(tag - p));
        size_t after = (size_t)(tag - L.s) + 2 + (sign ? 1 : 0);
        /* {% raw %} */
        if (kind == '%') {
            size_t j = skip_space(L.s, L.n, after);
            if (strncmp(L.s + j, "raw", 3) == 0) {
                size_t k = skip_space(L.s, L.n, j + 3);
                int rminus = L.s[k] == '-';
                if (L.s[k] == '-' || L.s[k] == '+')
                    k++;
                if (strncmp(L.s + k, "%}", 2) == 0) {
                    emit_data(&L, p, tlen, text_line);
                    k += 2;
                    if (rminus)
                        k = skip_space(L.s, L.n, k);
                    else if (k < L.n && L.s[k] == '\n')
                        k++;
                    size_t end;
                    int minus_before;
                    size_t at = find_endraw(&L, k, &end, &minus_before);
                    size_t rl = at - k;
                    if (minus_before)
                        rl = rstrip_len(L.s + k, rl);
                    emit_data(&L, L.s + k, rl, L.line);
                    L.line = text_line + count_lines(p, end - L.pos);
                    L.pos = end;
                    line_starting = L.s[end - 1] == '\n';
                    continue;
                }
            }
        }
        emit_data(&L, p, tlen, text_line);
        L.pos = after;
        if (kind == '#') {
            const char *q = strstr(L.s + L.pos, "#}");
            if (!q)
                jfail(e, COMET_ERR_INVALID_ARG, L.line, "unterminated comment {# ... #}");
            size_t end = (size_t)(q - L.s) + 2;
            L.line += count_lines(L.s + L.pos, end - L.pos);
            if (q > L.s + L.pos && q[-1] == '-') {
                size_t j = skip_space(L.s, L.n, end);
                L.line += count_lines(L.s + end, j - end);
                end = j;
            } else if (end < L.n && L.s[end] == '\n') {
                end++;
                L.line++;
            }
            L.pos = end;
        } else {
            push(&L, (jtok){.type = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = L.line});
            lex_tag(&L, kind == '{');
        }
        line_starting = L.pos > 0 && L.s[L.pos - 1] == '\n';
    }
    push(&L, (jtok){.type = T_EOF, .line = L.line});
    *toks = L.toks;
    *n_toks = L.n_toks;
}
