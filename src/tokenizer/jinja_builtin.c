/* jinja_builtin.c — what templates call: Jinja2's filters and tests, Python's str and
 * dict methods (the ones an ImmutableSandboxedEnvironment allows), attribute and item
 * access, and the globals of transformers' environment (range, namespace, dict,
 * raise_exception, strftime_now). Text changes (upper, replace, ...) mark their result
 * as data when any input byte was data; joining and slicing keep the taint per byte.
 * Case mapping covers ASCII only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja_int.h"

#define FAIL(line, ...) jfail(&c->err, COMET_ERR_INVALID_ARG, line, __VA_ARGS__)

jv jargs_get(const jargs *a, int i, const char *kw, jv def) {
    if (i >= 0 && i < a->n)
        return a->v[i];
    for (int k = 0; kw && k < a->nk; k++)
        if (!strcmp(a->kn[k], kw))
            return a->kv[k];
    return def;
}

static const jstr *need_str(jctx *c, int line, jv v, const char *what) {
    if (v.t != JV_STR)
        FAIL(line, "%s expects a string, got %s", what, jv_type_name(&v));
    return v.u.s;
}

jlist *jiter(jctx *c, int line, jv x) {
    switch (x.t) {
    case JV_UNDEF: return jv_list(c, 0).u.l;
    case JV_LIST: return x.u.l;
    case JV_DICT: {
        jv l = jv_list(c, x.u.d->n);
        for (size_t i = 0; i < x.u.d->n; i++)
            l.u.l->v[i] = x.u.d->k[i];
        return l.u.l;
    }
    case JV_STR: {
        const jstr *s = x.u.s;
        jv l = jv_list(c, utf8_len(s->s, s->n));
        size_t i = 0, k;
        for (size_t o = 0; o < s->n; o += k) {
            utf8_get(s->s + o, s->n - o, &k);
            l.u.l->v[i++] = jv_str(js_sub(c, s, o, o + k));
        }
        return l.u.l;
    }
    default: FAIL(line, "'%s' object is not iterable", jv_type_name(&x));
    }
}

static jv items_of(jctx *c, const jdict *d) {
    jv l = jv_list(c, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jv pair = jv_list(c, 2);
        pair.u.l->tuple = 1;
        pair.u.l->v[0] = d->k[i];
        pair.u.l->v[1] = d->v[i];
        l.u.l->v[i] = pair;
    }
    return l;
}

/* ---- string helpers ---- */

static jstr *map_case(jctx *c, const jstr *s, int mode) { /* 0 lower, 1 upper, 2 title, 3 cap */
    jstr *r = js_new(c, s->s, s->n, js_tainted(s));
    int word_start = 1;
    for (size_t i = 0; i < r->n; i++) {
        char ch = r->s[i];
        int alpha = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
        int up = mode == 1 || ((mode == 2 && word_start) || (mode == 3 && i == 0));
        if (alpha)
            r->s[i] = up ? (char)(ch & ~0x20) : (char)(ch | 0x20);
        if (mode == 2)
            word_start = !alpha && !((unsigned char)ch >= 0x80) && !(ch >= '0' && ch <= '9');
    }
    return r;
}

/* Whether code point cp is in `chars` (NULL: Python whitespace). */
static int in_set(uint32_t cp, const jstr *chars) {
    if (!chars)
        return py_isspace(cp);
    for (size_t i = 0, k; i < chars->n; i += k)
        if (utf8_get(chars->s + i, chars->n - i, &k) == cp)
            return 1;
    return 0;
}

static jstr *strip(jctx *c, const jstr *s, const jstr *chars, int left, int right) {
    size_t a = 0, b = s->n, k;
    while (left && a < b && in_set(utf8_get(s->s + a, b - a, &k), chars))
        a += k;
    while (right && b > a) {
        size_t j = b - 1;
        while (j > a && ((unsigned char)s->s[j] & 0xC0) == 0x80)
            j--;
        if (!in_set(utf8_get(s->s + j, b - j, &k), chars))
            break;
        b = j;
    }
    return js_sub(c, s, a, b);
}

static jv split(jctx *c, int line, const jstr *s, jv sepv, int64_t maxsplit) {
    jv out = jv_list(c, 0);
    size_t n = 0, cap = 0;
    jv *v = NULL;
#define PUSH(x)                                                                                    \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            cap = cap ? 2 * cap : 8;                                                               \
            jv *nv = ja_alloc(&c->arena, &c->err, cap * sizeof *nv);                               \
            if (n)                                                                                 \
                memcpy(nv, v, n * sizeof *nv);                                                     \
            v = nv;                                                                                \
        }                                                                                          \
        v[n++] = (x);                                                                              \
    } while (0)
    if (sepv.t == JV_NONE || sepv.t == JV_UNDEF) {
        size_t i = 0, k;
        int64_t splits = 0;
        for (;;) {
            while (i < s->n && py_isspace(utf8_get(s->s + i, s->n - i, &k)))
                i += k;
            if (i >= s->n)
                break;
            if (maxsplit >= 0 && splits == maxsplit) {
                size_t e = s->n;
                while (e > i) { /* the rest, right-stripped */
                    size_t j = e - 1;
                    while (j > i && ((unsigned char)s->s[j] & 0xC0) == 0x80)
                        j--;
                    if (!py_isspace(utf8_get(s->s + j, e - j, &k)))
                        break;
                    e = j;
                }
                PUSH(jv_str(js_sub(c, s, i, e)));
                break;
            }
            size_t j = i;
            while (j < s->n && !py_isspace(utf8_get(s->s + j, s->n - j, &k)))
                j += k;
            PUSH(jv_str(js_sub(c, s, i, j)));
            splits++;
            i = j;
        }
    } else {
        const jstr *sep = need_str(c, line, sepv, "split");
        if (sep->n == 0)
            FAIL(line, "split: empty separator");
        size_t i = 0;
        int64_t splits = 0;
        for (;;) {
            const char *hit = NULL;
            if (maxsplit < 0 || splits < maxsplit)
                for (size_t j = i; j + sep->n <= s->n; j++)
                    if (!memcmp(s->s + j, sep->s, sep->n)) {
                        hit = s->s + j;
                        break;
                    }
            if (!hit) {
                PUSH(jv_str(js_sub(c, s, i, s->n)));
                break;
            }
            size_t j = (size_t)(hit - s->s);
            PUSH(jv_str(js_sub(c, s, i, j)));
            splits++;
            i = j + sep->n;
        }
    }
#undef PUSH
    out.u.l->v = v;
    out.u.l->n = n;
    return out;
}

static jstr *replace(jctx *c, const jstr *s, const jstr *old, const jstr *new_, int64_t count) {
    jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) { /* Python inserts `new` between characters */
        size_t k;
        while (i <= s->n && (count < 0 || done < count)) {
            jb_str(c, &b, new_);
            done++;
            if (i == s->n)
                break;
            utf8_get(s->s + i, s->n - i, &k);
            jb_put(c, &b, s->s + i, k, s->taint ? s->taint + i : NULL, 0);
            i += k;
        }
        if (i < s->n)
            jb_put(c, &b, s->s + i, s->n - i, s->taint ? s->taint + i : NULL, 0);
        return jb_take(c, &b);
    }
    while (i < s->n) {
        if ((count < 0 || done < count) && i + old->n <= s->n && !memcmp(s->s + i, old->s, old->n)) {
            /* the replacement is data when the matched text was */
            jstr *m = js_sub(c, s, i, i + old->n);
            jb_put(c, &b, new_->s, new_->n, js_tainted(m) ? NULL : new_->taint, js_tainted(m));
            i += old->n;
            done++;
        } else {
            jb_put(c, &b, s->s + i, 1, s->taint ? s->taint + i : NULL, 0);
            i++;
        }
    }
    return jb_take(c, &b);
}

static int starts_or_ends(jctx *c, int line, const jstr *s, jv what, int end) {
    if (what.t == JV_LIST) {
        for (size_t i = 0; i < what.u.l->n; i++)
            if (starts_or_ends(c, line, s, what.u.l->v[i], end))
                return 1;
        return 0;
    }
    const jstr *p = need_str(c, line, what, end ? "endswith" : "startswith");
    if (p->n > s->n)
        return 0;
    return !memcmp(end ? s->s + s->n - p->n : s->s, p->s, p->n);
}

static int64_t find(const jstr *s, const jstr *sub, int reverse) {
    if (sub->n > s->n)
        return -1;
    if (reverse) {
        for (size_t j = s->n - sub->n + 1; j-- > 0;)
            if (!memcmp(s->s + j, sub->s, sub->n))
                return (int64_t)utf8_len(s->s, j);
    } else
        for (size_t j = 0; j + sub->n <= s->n; j++)
            if (!memcmp(s->s + j, sub->s, sub->n))
                return (int64_t)utf8_len(s->s, j);
    return -1;
}

static jstr *join(jctx *c, int line, jlist *l, const jstr *sep, const char *attr) {
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jb_str(c, &b, sep);
        jv v = attr ? jgetattr(c, line, l->v[i], attr) : l->v[i];
        jb_str(c, &b, jv_to_str(c, line, &v));
    }
    return jb_take(c, &b);
}

/* str.format with {} and {0}/{name} fields (no format specs). */
static jstr *format(jctx *c, int line, const jstr *s, const jargs *a) {
    jbuf b = {0};
    int auto_idx = 0;
    for (size_t i = 0; i < s->n; i++) {
        char ch = s->s[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->n && s->s[i + 1] == ch) {
            jb_put(c, &b, s->s + i, 1, s->taint ? s->taint + i : NULL, 0);
            i++;
            continue;
        }
        if (ch != '{') {
            jb_put(c, &b, s->s + i, 1, s->taint ? s->taint + i : NULL, 0);
            continue;
        }
        const char *close = memchr(s->s + i, '}', s->n - i);
        if (!close)
            FAIL(line, "format: single '{' in the format string");
        size_t flen = (size_t)(close - (s->s + i + 1));
        char field[64];
        if (flen >= sizeof field || memchr(s->s + i + 1, ':', flen) || memchr(s->s + i + 1, '!', flen))
            FAIL(line, "format: field specs are not supported");
        memcpy(field, s->s + i + 1, flen);
        field[flen] = '\0';
        jv v;
        if (flen == 0)
            v = jargs_get(a, auto_idx++, NULL, jv_undef(NULL));
        else if (field[0] >= '0' && field[0] <= '9')
            v = jargs_get(a, atoi(field), NULL, jv_undef(NULL));
        else
            v = jargs_get(a, -1, field, jv_undef(NULL));
        if (v.t == JV_UNDEF)
            FAIL(line, "format: no argument for field {%s}", field);
        jb_str(c, &b, jv_to_str(c, line, &v));
        i += flen + 1;
    }
    return jb_take(c, &b);
}

/* ---- methods ---- */

static jv str_method(jctx *c, int line, const char *m, const jstr *s, const jargs *a) {
    jv none = jv_none();
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        jv ch = jargs_get(a, 0, "chars", none);
        const jstr *chars = ch.t == JV_NONE ? NULL : need_str(c, line, ch, m);
        return jv_str(strip(c, s, chars, m[0] != 'r', m[0] != 'l'));
    }
    if (!strcmp(m, "split")) {
        jv ms = jargs_get(a, 1, "maxsplit", jv_int(-1));
        return split(c, line, s, jargs_get(a, 0, "sep", none), ms.t == JV_INT ? ms.u.i : -1);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith"))
        return jv_bool(starts_or_ends(c, line, s, jargs_get(a, 0, NULL, jv_undef(NULL)), m[0] == 'e'));
    if (!strcmp(m, "upper"))
        return jv_str(map_case(c, s, 1));
    if (!strcmp(m, "lower"))
        return jv_str(map_case(c, s, 0));
    if (!strcmp(m, "title"))
        return jv_str(map_case(c, s, 2));
    if (!strcmp(m, "capitalize"))
        return jv_str(map_case(c, map_case(c, s, 0), 3));
    if (!strcmp(m, "replace")) {
        jv cnt = jargs_get(a, 2, "count", jv_int(-1));
        return jv_str(replace(c, s, need_str(c, line, jargs_get(a, 0, NULL, none), "replace"),
                              need_str(c, line, jargs_get(a, 1, NULL, none), "replace"),
                              cnt.t == JV_INT ? cnt.u.i : -1));
    }
    if (!strcmp(m, "find") || !strcmp(m, "rfind"))
        return jv_int(find(s, need_str(c, line, jargs_get(a, 0, NULL, none), m), m[0] == 'r'));
    if (!strcmp(m, "count")) {
        const jstr *sub = need_str(c, line, jargs_get(a, 0, NULL, none), m);
        int64_t k = 0;
        if (sub->n == 0)
            return jv_int((int64_t)utf8_len(s->s, s->n) + 1);
        for (size_t j = 0; j + sub->n <= s->n;)
            if (!memcmp(s->s + j, sub->s, sub->n)) {
                k++;
                j += sub->n;
            } else
                j++;
        return jv_int(k);
    }
    if (!strcmp(m, "join"))
        return jv_str(join(c, line, jiter(c, line, jargs_get(a, 0, NULL, none)), s, NULL));
    if (!strcmp(m, "format"))
        return jv_str(format(c, line, s, a));
    if (!strcmp(m, "splitlines")) {
        jv parts = split(c, line, s, jv_cstr(c, "\n", 0), -1);
        if (parts.u.l->n && parts.u.l->v[parts.u.l->n - 1].u.s->n == 0)
            parts.u.l->n--;
        return parts;
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace")) {
        int ok = s->n > 0;
        for (size_t i = 0, k; i < s->n && ok; i += k) {
            uint32_t cp = utf8_get(s->s + i, s->n - i, &k);
            ok = m[2] == 'd' ? (cp >= '0' && cp <= '9')
                 : m[2] == 'a' ? ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
                               : py_isspace(cp);
        }
        return jv_bool(ok);
    }
    FAIL(line, "str has no method '%s' here", m);
}

jv jcall_builtin(jctx *c, int line, const jfunc *f, const jargs *a) {
    const char *m = f->name;
    jv none = jv_none();
    if (f->method) {
        jv self = f->self;
        if (self.t == JV_STR)
            return str_method(c, line, m, self.u.s, a);
        if (self.t == JV_DICT) {
            if (!strcmp(m, "items"))
                return items_of(c, self.u.d);
            if (!strcmp(m, "keys") || !strcmp(m, "values")) {
                jv l = jv_list(c, self.u.d->n);
                for (size_t i = 0; i < self.u.d->n; i++)
                    l.u.l->v[i] = m[0] == 'k' ? self.u.d->k[i] : self.u.d->v[i];
                return l;
            }
            if (!strcmp(m, "get")) {
                jv *v = jd_get(self.u.d, jargs_get(a, 0, NULL, none));
                return v ? *v : jargs_get(a, 1, NULL, none);
            }
        }
        if (self.t == JV_LIST) {
            if (!strcmp(m, "index") || !strcmp(m, "count")) {
                jv x = jargs_get(a, 0, NULL, none);
                int64_t k = 0;
                for (size_t i = 0; i < self.u.l->n; i++)
                    if (jv_eq(&self.u.l->v[i], &x)) {
                        if (m[0] == 'i')
                            return jv_int((int64_t)i);
                        k++;
                    }
                if (m[0] == 'i')
                    FAIL(line, "list.index(x): x not in list");
                return jv_int(k);
            }
        }
        FAIL(line, "'%s' object has no method '%s'", jv_type_name(&self), m);
    }
    if (!strcmp(m, "range")) {
        int64_t lo = 0, hi, st = 1;
        for (int i = 0; i < a->n; i++)
            if (a->v[i].t != JV_INT)
                FAIL(line, "range() takes integers");
        if (a->n == 1)
            hi = a->v[0].u.i;
        else if (a->n == 2 || a->n == 3) {
            lo = a->v[0].u.i;
            hi = a->v[1].u.i;
            if (a->n == 3)
                st = a->v[2].u.i;
        } else
            FAIL(line, "range() takes 1 to 3 arguments");
        if (st == 0)
            FAIL(line, "range() arg 3 must not be zero");
        const uint64_t n = jrange_len(lo, hi, st);
        if (n > (uint64_t)c->p->max_iterations)
            FAIL(line, "range() longer than %ld", c->p->max_iterations);
        jv l = jv_list(c, (size_t)n);
        for (uint64_t k = 0; k < n; k++)
            l.u.l->v[k] = jv_int(jrange_at(lo, st, k));
        return l;
    }
    if (!strcmp(m, "namespace") || !strcmp(m, "dict")) {
        jv d = jv_dict(c);
        d.u.d->ns = m[0] == 'n';
        for (int i = 0; i < a->n; i++) {
            if (a->v[i].t != JV_DICT)
                FAIL(line, "%s() takes keyword arguments or a dict", m);
            for (size_t k = 0; k < a->v[i].u.d->n; k++)
                jd_set(c, d.u.d, a->v[i].u.d->k[k], a->v[i].u.d->v[k]);
        }
        for (int k = 0; k < a->nk; k++)
            jd_set(c, d.u.d, jv_cstr(c, a->kn[k], 0), a->kv[k]);
        return d;
    }
    if (!strcmp(m, "raise_exception")) {
        jv msg = jargs_get(a, 0, "message", jv_cstr(c, "", 0));
        FAIL(line, "the template raised an exception: %s", jv_to_str(c, line, &msg)->s);
    }
    if (!strcmp(m, "strftime_now")) {
        const jstr *fmt = need_str(c, line, jargs_get(a, 0, NULL, none), "strftime_now");
        time_t now = c->p->now ? c->p->now : time(NULL);
        struct tm tm;
        if (c->p->utc)
            gmtime_r(&now, &tm);
        else
            localtime_r(&now, &tm);
        char buf[512];
        size_t n = fmt->n < 200 ? strftime(buf, sizeof buf, fmt->s, &tm) : 0;
        if (fmt->n && !n)
            FAIL(line, "strftime_now: format \"%.40s\" too long or empty result", fmt->s);
        return jv_str(js_new(c, buf, n, 0));
    }
    FAIL(line, "'%s' is not callable", m);
}

static jv bind(jctx *c, jv self, const char *name, int method) {
    jfunc *f = ja_alloc(&c->arena, &c->err, sizeof *f);
    f->name = name;
    f->self = self;
    f->method = method;
    return (jv){.t = JV_FUNC, .u.fn = f};
}

void jglobals(jctx *c, jframe *f) {
    static const char *names[] = {"range", "namespace", "dict", "raise_exception", "strftime_now"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        jframe_set(c, f, names[i], bind(c, jv_undef(NULL), names[i], 0));
}

static int one_of(const char *s, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(s, *list))
            return 1;
    return 0;
}

jv jgetattr(jctx *c, int line, jv x, const char *name) {
    static const char *const str_methods[] = {
        "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
        "title", "capitalize", "replace", "find", "rfind", "count", "join", "format",
        "splitlines", "isdigit", "isalpha", "isspace", NULL};
    static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
    static const char *const dict_unsafe[] = {"pop", "update", "setdefault", "clear", "popitem",
                                              "copy", NULL};
    static const char *const list_methods[] = {"index", "count", NULL};
    static const char *const list_unsafe[] = {"append", "pop", "extend", "insert", "remove",
                                              "sort", "reverse", "clear", NULL};
    switch (x.t) {
    case JV_UNDEF:
        FAIL(line, "'%s' is undefined (reading its attribute '%s')",
             x.u.undef_name ? x.u.undef_name : "value", name);
    case JV_STR:
        if (one_of(name, str_methods))
            return bind(c, x, name, 1);
        return jv_undef(name);
    case JV_DICT:
        if (!x.u.d->ns) {
            if (one_of(name, dict_methods))
                return bind(c, x, name, 1);
            if (one_of(name, dict_unsafe))
                FAIL(line, "access to attribute '%s' of 'dict' object is unsafe", name);
        }
        {
            jv *v = jd_gets(x.u.d, name);
            return v ? *v : jv_undef(name);
        }
    case JV_LIST:
        if (one_of(name, list_methods))
            return bind(c, x, name, 1);
        if (one_of(name, list_unsafe))
            FAIL(line, "access to attribute '%s' of 'list' object is unsafe", name);
        return jv_undef(name);
    default: return jv_undef(name);
    }
}

jv jgetitem(jctx *c, int line, jv x, jv key) {
    switch (x.t) {
    case JV_UNDEF:
        FAIL(line, "'%s' is undefined (reading an item)", x.u.undef_name ? x.u.undef_name : "value");
    case JV_DICT: {
        jv *v = jd_get(x.u.d, key);
        if (v)
            return *v;
        if (key.t == JV_STR && !x.u.d->ns)
            return jgetattr(c, line, x, key.u.s->s);
        return jv_undef(key.t == JV_STR ? key.u.s->s : NULL);
    }
    case JV_LIST:
    case JV_STR: {
        if (x.t == JV_LIST && x.u.l->generator)
            FAIL(line, "'generator' object is not subscriptable (add |list)");
        if (key.t != JV_INT && key.t != JV_BOOL) {
            if (key.t == JV_STR)
                return jgetattr(c, line, x, key.u.s->s);
            return jv_undef(NULL);
        }
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        int64_t len = x.t == JV_LIST ? (int64_t)x.u.l->n : (int64_t)utf8_len(x.u.s->s, x.u.s->n);
        if (i < 0)
            i += len;
        if (i < 0 || i >= len)
            return jv_undef("index");
        if (x.t == JV_LIST)
            return x.u.l->v[i];
        size_t o = utf8_off(x.u.s->s, x.u.s->n, (size_t)i), k;
        utf8_get(x.u.s->s + o, x.u.s->n - o, &k);
        return jv_str(js_sub(c, x.u.s, o, o + k));
    }
    default: return jv_undef(NULL);
    }
}

/* ---- tests ---- */

/* Jinja2's builtin tests: another name fails at parse time, as in Jinja2's compiler. */
int jtest_known(const char *name) {
    static const char *const names[] = {
        "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
        "false", "filter", "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le",
        "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
        "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">",
        ">=", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return 1;
    return 0;
}

int jtest(jctx *c, int line, const char *name, jv x, const jargs *a) {
    jv y = jargs_get(a, 0, NULL, jv_undef(NULL));
    if (!strcmp(name, "defined"))
        return x.t != JV_UNDEF;
    if (!strcmp(name, "undefined"))
        return x.t == JV_UNDEF;
    if (!strcmp(name, "none"))
        return x.t == JV_NONE;
    if (!strcmp(name, "string"))
        return x.t == JV_STR;
    if (!strcmp(name, "mapping"))
        return x.t == JV_DICT;
    if (!strcmp(name, "iterable"))
        return x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT || x.t == JV_UNDEF;
    if (!strcmp(name, "sequence"))
        return x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT;
    if (!strcmp(name, "number"))
        return x.t == JV_INT || x.t == JV_FLOAT || x.t == JV_BOOL;
    if (!strcmp(name, "integer"))
        return x.t == JV_INT;
    if (!strcmp(name, "float"))
        return x.t == JV_FLOAT;
    if (!strcmp(name, "boolean"))
        return x.t == JV_BOOL;
    if (!strcmp(name, "true"))
        return x.t == JV_BOOL && x.u.b;
    if (!strcmp(name, "false"))
        return x.t == JV_BOOL && !x.u.b;
    if (!strcmp(name, "callable"))
        return x.t == JV_MACRO || x.t == JV_FUNC;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "=="))
        return jv_eq(&x, &y);
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !jv_eq(&x, &y);
    if (!strcmp(name, "sameas"))
        return x.t == y.t && (x.t == JV_NONE || x.t == JV_UNDEF || jv_eq(&x, &y)) &&
               (x.t != JV_STR && x.t != JV_LIST && x.t != JV_DICT);
    if (!strcmp(name, "in"))
        return y.t == JV_LIST || y.t == JV_STR || y.t == JV_DICT
                   ? (y.t == JV_DICT ? jd_get(y.u.d, x) != NULL
                      : y.t == JV_LIST ? ({
                            int f_ = 0;
                            for (size_t i = 0; i < y.u.l->n && !f_; i++)
                                f_ = jv_eq(&y.u.l->v[i], &x);
                            f_;
                        })
                                       : (x.t == JV_STR && strstr(y.u.s->s, x.u.s->s) != NULL))
                   : 0;
    if (!strcmp(name, "lt") || !strcmp(name, "le") || !strcmp(name, "gt") || !strcmp(name, "ge") ||
        !strcmp(name, "lessthan") || !strcmp(name, "greaterthan")) {
        int r = jv_cmp(c, line, &x, &y);
        return name[0] == 'l' ? (name[1] == 'e' && name[2] == '\0' ? r <= 0 : r < 0)
                              : (name[1] == 'e' ? r >= 0 : r > 0);
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (x.t != JV_INT)
            FAIL(line, "test '%s' needs an integer", name);
        if (name[0] == 'o')
            return (x.u.i & 1) != 0;
        if (name[0] == 'e')
            return (x.u.i & 1) == 0;
        if (y.t != JV_INT || y.u.i == 0)
            FAIL(line, "divisibleby needs a non-zero integer");
        return x.u.i % y.u.i == 0;
    }
    if (!strcmp(name, "filter") || !strcmp(name, "test"))
        return x.t == JV_STR && (name[0] == 'f' ? jfilter_known(x.u.s->s) : jtest_known(x.u.s->s));
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (x.t != JV_STR)
            return 0;
        jstr *m = map_case(c, x.u.s, name[0] == 'u');
        return !memcmp(m->s, x.u.s->s, m->n);
    }
    FAIL(line, "no test named '%s'", name);
}
