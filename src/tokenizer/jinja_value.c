/* jinja_value.c — values of the Jinja interpreter: the arena every run allocates from,
 * strings that know which bytes came from the caller's data, and Python's str(), repr(),
 * json.dumps(ensure_ascii=False), equality and ordering, which templates reproduce in
 * their output. Numbers follow Python: int is 64-bit here (overflow is an error), float
 * prints as Python's shortest repr.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_int.h"

struct jchunk {
    jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char mem[];
};

void *ja_alloc(jarena *a, jerr *e, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (a->cap && a->used + n > a->cap)
        jfail(e, COMET_ERR_INVALID_ARG, 0, "working memory over the cap of %zu bytes", a->cap);
    if (!a->head || a->head->size - a->head->used < n) {
        size_t size = n > 65536 ? n : 65536;
        jchunk *c = malloc(sizeof *c + size);
        if (!c)
            jfail(e, COMET_ERR_NOMEM, 0, "out of memory");
        c->next = a->head;
        c->size = size;
        c->used = 0;
        a->head = c;
    }
    void *p = a->head->mem + a->head->used;
    a->head->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a) {
    for (jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

void jfail(jerr *e, comet_status st, int line, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        snprintf(e->msg, sizeof e->msg, "chat template line %d: %s", line, msg);
    else
        snprintf(e->msg, sizeof e->msg, "chat template: %s", msg);
    e->st = st;
    longjmp(e->jb, 1);
}

/* ---- UTF-8 ---- */

uint32_t utf8_get(const char *s, size_t n, size_t *k) {
    const uint8_t *u = (const uint8_t *)s;
    size_t len = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *k = 1;
        return 0xFFFD;
    }
    uint32_t c = len == 1 ? u[0] : len == 2 ? u[0] & 0x1F : len == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *k = 1;
            return 0xFFFD;
        }
        c = c << 6 | (u[i] & 0x3F);
    }
    *k = len;
    return c;
}

int utf8_put(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

size_t utf8_len(const char *s, size_t n) {
    size_t cps = 0;
    for (size_t i = 0, k; i < n; i += k, cps++)
        utf8_get(s + i, n - i, &k);
    return cps;
}

uint64_t jrange_len(int64_t lo, int64_t hi, int64_t st) {
    if (st > 0)
        return lo < hi ? ((uint64_t)hi - (uint64_t)lo - 1) / (uint64_t)st + 1 : 0;
    return lo > hi ? ((uint64_t)lo - (uint64_t)hi - 1) / (0 - (uint64_t)st) + 1 : 0;
}

int64_t jrange_at(int64_t lo, int64_t st, uint64_t k) {
    return (int64_t)((uint64_t)lo + k * (uint64_t)st); /* in range: no wrap in the true value */
}

size_t utf8_off(const char *s, size_t n, size_t cp) {
    size_t i = 0, k;
    for (size_t j = 0; j < cp && i < n; j++, i += k)
        utf8_get(s + i, n - i, &k);
    return i;
}

int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- strings ---- */

/* s may be NULL: n bytes left zeroed for the caller to fill. */
jstr *js_new(jctx *c, const char *s, size_t n, int tainted) {
    jstr *x = ja_alloc(&c->arena, &c->err, sizeof *x + n + 1);
    x->n = n;
    if (n && s)
        memcpy(x->s, s, n);
    x->s[n] = '\0';
    if (tainted && n) {
        x->taint = ja_alloc(&c->arena, &c->err, n);
        memset(x->taint, 1, n);
    }
    return x;
}

int js_tainted(const jstr *x) {
    if (!x->taint)
        return 0;
    for (size_t i = 0; i < x->n; i++)
        if (x->taint[i])
            return 1;
    return 0;
}

jstr *js_cat(jctx *c, const jstr *x, const jstr *y) {
    jstr *r = js_new(c, NULL, x->n + y->n, 0);
    memcpy(r->s, x->s, x->n);
    memcpy(r->s + x->n, y->s, y->n);
    if (x->taint || y->taint) {
        r->taint = ja_alloc(&c->arena, &c->err, r->n + 1);
        if (x->taint)
            memcpy(r->taint, x->taint, x->n);
        if (y->taint)
            memcpy(r->taint + x->n, y->taint, y->n);
    }
    return r;
}

jstr *js_repeat(jctx *c, const jstr *x, size_t k) {
    jstr *r = js_new(c, NULL, x->n * k, 0);
    if (x->taint && r->n)
        r->taint = ja_alloc(&c->arena, &c->err, r->n);
    for (size_t i = 0; i < k; i++) {
        memcpy(r->s + i * x->n, x->s, x->n);
        if (x->taint)
            memcpy(r->taint + i * x->n, x->taint, x->n);
    }
    return r;
}

jstr *js_sub(jctx *c, const jstr *x, size_t from, size_t to) {
    jstr *r = js_new(c, x->s + from, to - from, 0);
    if (x->taint && to > from) {
        r->taint = ja_alloc(&c->arena, &c->err, to - from);
        memcpy(r->taint, x->taint + from, to - from);
    }
    return r;
}

jv jv_str(jstr *s) { return (jv){.t = JV_STR, .u.s = s}; }
jv jv_cstr(jctx *c, const char *s, int tainted) { return jv_str(js_new(c, s, strlen(s), tainted)); }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_float(double f) { return (jv){.t = JV_FLOAT, .u.f = f}; }
jv jv_bool(int b) { return (jv){.t = JV_BOOL, .u.b = !!b}; }
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_undef(const char *name) { return (jv){.t = JV_UNDEF, .u.undef_name = name}; }

jv jv_list(jctx *c, size_t n) {
    jlist *l = ja_alloc(&c->arena, &c->err, sizeof *l);
    l->n = n;
    l->v = n ? ja_alloc(&c->arena, &c->err, n * sizeof *l->v) : NULL;
    return (jv){.t = JV_LIST, .u.l = l};
}

jv jv_dict(jctx *c) {
    jdict *d = ja_alloc(&c->arena, &c->err, sizeof *d);
    return (jv){.t = JV_DICT, .u.d = d};
}

jv *jd_get(const jdict *d, jv k) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(&d->k[i], &k))
            return &d->v[i];
    return NULL;
}

jv *jd_gets(const jdict *d, const char *k) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->s, k, n) == 0)
            return &d->v[i];
    return NULL;
}

void jd_set(jctx *c, jdict *d, jv k, jv v) {
    jv *old = jd_get(d, k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        jv *nk = ja_alloc(&c->arena, &c->err, cap * sizeof *nk);
        jv *nv = ja_alloc(&c->arena, &c->err, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

jv jv_from_json(jctx *c, const cJSON *j, int tainted) {
    if (!j || cJSON_IsNull(j))
        return jv_none();
    if (cJSON_IsBool(j))
        return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double f = j->valuedouble;
        if (f == floor(f) && fabs(f) < 9007199254740992.0)
            return jv_int((int64_t)f);
        return jv_float(f);
    }
    if (cJSON_IsString(j))
        return jv_cstr(c, j->valuestring ? j->valuestring : "", tainted);
    if (cJSON_IsArray(j)) {
        jv l = jv_list(c, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        for (const cJSON *e = j->child; e; e = e->next)
            l.u.l->v[i++] = jv_from_json(c, e, tainted);
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict(c);
        for (const cJSON *e = j->child; e; e = e->next)
            jd_set(c, d.u.d, jv_cstr(c, e->string ? e->string : "", tainted),
                   jv_from_json(c, e, tainted));
        return d;
    }
    return jv_none();
}

/* ---- truth, equality, order ---- */

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s->n != 0;
    case JV_LIST: return v->u.l->n != 0 || v->u.l->generator;
    case JV_DICT: return v->u.d->n != 0 || v->u.d->ns;
    default: return 1;
    }
}

static int is_num(const jv *v) { return v->t == JV_BOOL || v->t == JV_INT || v->t == JV_FLOAT; }
static double num_f(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

int jv_eq(const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a->u.s->n == b->u.s->n && memcmp(a->u.s->s, b->u.s->s, a->u.s->n) == 0;
    case JV_LIST:
        if (a->u.l->n != b->u.l->n)
            return 0;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return 0;
        return 1;
    case JV_DICT:
        if (a->u.d->ns || b->u.d->ns)
            return a->u.d == b->u.d;
        if (a->u.d->n != b->u.d->n)
            return 0;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jv *o = jd_get(b->u.d, a->u.d->k[i]);
            if (!o || !jv_eq(&a->u.d->v[i], o))
                return 0;
        }
        return 1;
    case JV_MACRO: return a->u.m == b->u.m;
    case JV_FUNC: return a->u.fn == b->u.fn;
    default: return 0;
    }
}

int jv_cmp(jctx *c, int line, const jv *a, const jv *b) {
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->u.s->n < b->u.s->n ? a->u.s->n : b->u.s->n;
        int r = memcmp(a->u.s->s, b->u.s->s, n); /* UTF-8 byte order = code point order */
        return r ? r : (a->u.s->n > b->u.s->n) - (a->u.s->n < b->u.s->n);
    }
    if (a->t == JV_LIST && b->t == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (!jv_eq(&a->u.l->v[i], &b->u.l->v[i]))
                return jv_cmp(c, line, &a->u.l->v[i], &b->u.l->v[i]);
        }
        return (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
    }
    jfail(&c->err, COMET_ERR_INVALID_ARG, line, "cannot order %s and %s", jv_type_name(a),
          jv_type_name(b));
}

const char *jv_type_name(const jv *v) {
    static const char *names[] = {"undefined", "NoneType", "bool", "int",   "float",
                                  "str",       "list",     "dict", "macro", "builtin"};
    return names[v->t];
}

/* ---- output buffers ---- */

void jb_put(jctx *c, jbuf *b, const char *s, size_t n, const uint8_t *taint, int tainted) {
    if (n == 0)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = ja_alloc(&c->arena, &c->err, cap);
        uint8_t *nt = ja_alloc(&c->arena, &c->err, cap);
        if (b->n) {
            memcpy(ns, b->s, b->n);
            memcpy(nt, b->taint, b->n);
        }
        b->s = ns;
        b->taint = nt;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    if (taint)
        memcpy(b->taint + b->n, taint, n);
    else
        memset(b->taint + b->n, tainted ? 1 : 0, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void jb_str(jctx *c, jbuf *b, const jstr *s) { jb_put(c, b, s->s, s->n, s->taint, 0); }

static void jb_cstr(jctx *c, jbuf *b, const char *s) { jb_put(c, b, s, strlen(s), NULL, 0); }

jstr *jb_take(jctx *c, jbuf *b) {
    jstr *r = js_new(c, b->s ? b->s : "", b->n, 0);
    if (b->n) {
        r->taint = ja_alloc(&c->arena, &c->err, b->n);
        memcpy(r->taint, b->taint, b->n);
    }
    memset(b, 0, sizeof *b);
    return r;
}

/* ---- Python forms ---- */

/* Python's float repr: the shortest digits that round-trip, fixed notation for decimal
 * exponents in [-4, 16), else d.ddde+XX. */
static void float_repr(double f, char *out, size_t cap) {
    if (isnan(f)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e: [-]d[.ddd]e[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *p = e;
    int neg = *p == '-';
    if (neg)
        p++;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char *o = out;
    size_t left = cap;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        int w_ = snprintf(o, left, __VA_ARGS__);                                                   \
        if (w_ > 0 && (size_t)w_ < left) {                                                         \
            o += w_;                                                                               \
            left -= (size_t)w_;                                                                    \
        }                                                                                          \
    } while (0)
    if (neg)
        PUT("-");
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            PUT("0.");
            for (int i = -1; i > exp10; i--)
                PUT("0");
            PUT("%s", digits);
        } else {
            for (int i = 0; i <= exp10; i++)
                PUT("%c", i < (int)nd ? digits[i] : '0');
            PUT(".");
            if ((int)nd > exp10 + 1)
                PUT("%s", digits + exp10 + 1);
            else
                PUT("0");
        }
    } else {
        PUT("%c", digits[0]);
        if (nd > 1)
            PUT(".%s", digits + 1);
        PUT("e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
#undef PUT
}

static void put_num(jctx *c, jbuf *b, const jv *v) {
    char t[64];
    if (v->t == JV_INT)
        snprintf(t, sizeof t, "%lld", (long long)v->u.i);
    else
        float_repr(v->u.f, t, sizeof t);
    jb_cstr(c, b, t);
}

/* Python repr of a string: single quotes unless it holds ' and no ". */
static void put_str_repr(jctx *c, jbuf *b, const jstr *s) {
    int sq = memchr(s->s, '\'', s->n) != NULL, dq = memchr(s->s, '"', s->n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jb_put(c, b, &q, 1, NULL, 0);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        int t = s->taint ? s->taint[i] : 0;
        char esc[8];
        if (ch == (unsigned char)q || ch == '\\')
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (ch == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (ch == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (ch < 0x20 || ch == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", ch);
        else {
            jb_put(c, b, s->s + i, 1, NULL, t);
            continue;
        }
        jb_put(c, b, esc, strlen(esc), NULL, t);
    }
    jb_put(c, b, &q, 1, NULL, 0);
}

static void put_repr(jctx *c, int line, jbuf *b, const jv *v, int depth);

static void put_str_form(jctx *c, int line, jbuf *b, const jv *v, int depth) {
    if (++depth > c->p->max_depth)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "value nested deeper than %d", c->p->max_depth);
    switch (v->t) {
    case JV_UNDEF: break;
    case JV_NONE: jb_cstr(c, b, "None"); break;
    case JV_BOOL: jb_cstr(c, b, v->u.b ? "True" : "False"); break;
    case JV_INT:
    case JV_FLOAT: put_num(c, b, v); break;
    case JV_STR: jb_str(c, b, v->u.s); break;
    case JV_LIST:
        jb_cstr(c, b, v->u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                jb_cstr(c, b, ", ");
            put_repr(c, line, b, &v->u.l->v[i], depth);
        }
        jb_cstr(c, b, v->u.l->tuple ? (v->u.l->n == 1 ? ",)" : ")") : "]");
        break;
    case JV_DICT:
        if (v->u.d->ns) {
            jb_cstr(c, b, "<Namespace>");
            break;
        }
        jb_cstr(c, b, "{");
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i)
                jb_cstr(c, b, ", ");
            put_repr(c, line, b, &v->u.d->k[i], depth);
            jb_cstr(c, b, ": ");
            put_repr(c, line, b, &v->u.d->v[i], depth);
        }
        jb_cstr(c, b, "}");
        break;
    case JV_MACRO: jb_cstr(c, b, "<macro>"); break;
    case JV_FUNC: jb_cstr(c, b, "<built-in method>"); break;
    }
}

static void put_repr(jctx *c, int line, jbuf *b, const jv *v, int depth) {
    if (v->t == JV_STR)
        put_str_repr(c, b, v->u.s);
    else if (v->t == JV_UNDEF)
        jb_cstr(c, b, "Undefined");
    else
        put_str_form(c, line, b, v, depth);
}

jstr *jv_to_str(jctx *c, int line, const jv *v) {
    if (v->t == JV_STR)
        return v->u.s;
    jbuf b = {0};
    put_str_form(c, line, &b, v, 0);
    return jb_take(c, &b);
}

jstr *jv_repr(jctx *c, int line, const jv *v) {
    jbuf b = {0};
    put_repr(c, line, &b, v, 0);
    return jb_take(c, &b);
}

static void put_json_str(jctx *c, jbuf *b, const jstr *s) {
    jb_cstr(c, b, "\"");
    for (size_t i = 0; i < s->n; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        int t = s->taint ? s->taint[i] : 0;
        char esc[8];
        switch (ch) {
        case '"': snprintf(esc, sizeof esc, "\\\""); break;
        case '\\': snprintf(esc, sizeof esc, "\\\\"); break;
        case '\n': snprintf(esc, sizeof esc, "\\n"); break;
        case '\r': snprintf(esc, sizeof esc, "\\r"); break;
        case '\t': snprintf(esc, sizeof esc, "\\t"); break;
        case '\b': snprintf(esc, sizeof esc, "\\b"); break;
        case '\f': snprintf(esc, sizeof esc, "\\f"); break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                break;
            }
            jb_put(c, b, s->s + i, 1, NULL, t);
            continue;
        }
        jb_put(c, b, esc, strlen(esc), NULL, t);
    }
    jb_cstr(c, b, "\"");
}

typedef struct json_opts {
    const char *indent, *item_sep, *key_sep;
    int sort_keys;
} json_opts;

static void put_newline_indent(jctx *c, jbuf *b, const json_opts *o, int level) {
    jb_cstr(c, b, "\n");
    for (int i = 0; i < level; i++)
        jb_cstr(c, b, o->indent);
}

static void put_json(jctx *c, int line, jbuf *b, const jv *v, const json_opts *o, int level) {
    if (level > c->p->max_depth)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "value nested deeper than %d", c->p->max_depth);
    switch (v->t) {
    case JV_NONE: jb_cstr(c, b, "null"); break;
    case JV_BOOL: jb_cstr(c, b, v->u.b ? "true" : "false"); break;
    case JV_INT: put_num(c, b, v); break;
    case JV_FLOAT:
        if (isnan(v->u.f))
            jb_cstr(c, b, "NaN");
        else if (isinf(v->u.f))
            jb_cstr(c, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else
            put_num(c, b, v);
        break;
    case JV_STR: put_json_str(c, b, v->u.s); break;
    case JV_LIST:
        if (v->u.l->generator)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "tojson: Object of type generator is not "
                  "JSON serializable (add |list)");
        if (v->u.l->n == 0) {
            jb_cstr(c, b, "[]");
            break;
        }
        jb_cstr(c, b, "[");
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i)
                jb_cstr(c, b, o->item_sep);
            if (o->indent)
                put_newline_indent(c, b, o, level + 1);
            put_json(c, line, b, &v->u.l->v[i], o, level + 1);
        }
        if (o->indent)
            put_newline_indent(c, b, o, level);
        jb_cstr(c, b, "]");
        break;
    case JV_DICT: {
        const jdict *d = v->u.d;
        if (d->n == 0) {
            jb_cstr(c, b, "{}");
            break;
        }
        size_t *order = ja_alloc(&c->arena, &c->err, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) {
            if (d->k[i].t != JV_STR && d->k[i].t != JV_INT && d->k[i].t != JV_BOOL &&
                d->k[i].t != JV_NONE && d->k[i].t != JV_FLOAT)
                jfail(&c->err, COMET_ERR_INVALID_ARG, line, "tojson: keys must be str, not %s",
                      jv_type_name(&d->k[i]));
            order[i] = i;
        }
        if (o->sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && jv_cmp(c, line, &d->k[order[j - 1]], &d->k[order[j]]) > 0;
                     j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jb_cstr(c, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jb_cstr(c, b, o->item_sep);
            if (o->indent)
                put_newline_indent(c, b, o, level + 1);
            const jv *k = &d->k[order[i]];
            if (k->t == JV_STR)
                put_json_str(c, b, k->u.s);
            else {
                jb_cstr(c, b, "\"");
                if (k->t == JV_NONE)
                    jb_cstr(c, b, "null");
                else if (k->t == JV_BOOL)
                    jb_cstr(c, b, k->u.b ? "true" : "false");
                else
                    put_num(c, b, k);
                jb_cstr(c, b, "\"");
            }
            jb_cstr(c, b, o->key_sep);
            put_json(c, line, b, &d->v[order[i]], o, level + 1);
        }
        if (o->indent)
            put_newline_indent(c, b, o, level);
        jb_cstr(c, b, "}");
        break;
    }
    default:
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "tojson: Object of type %s is not JSON "
              "serializable", v->t == JV_UNDEF ? "Undefined" : jv_type_name(v));
    }
}

jstr *jv_json(jctx *c, int line, const jv *v, const char *indent, const char *item_sep,
              const char *key_sep, int sort_keys) {
    json_opts o = {indent, item_sep ? item_sep : (indent ? "," : ", "), key_sep ? key_sep : ": ",
                   sort_keys};
    jbuf b = {0};
    put_json(c, line, &b, v, &o, 0);
    return jb_take(c, &b);
}
