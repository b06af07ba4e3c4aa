/* jinja_filter.c — Jinja2's filters as templates use them (x|name(args)), with tojson as
 * transformers defines it: json.dumps(x, ensure_ascii=False, indent=..., separators=...,
 * sort_keys=...), not Jinja's HTML-safe one. select/reject/selectattr/rejectattr take a
 * test name and its argument; map takes attribute= or a filter name.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_int.h"

#define FAIL(line, ...) jfail(&c->err, COMET_ERR_INVALID_ARG, line, __VA_ARGS__)

/* attribute="a.b" or an integer index, as Jinja's make_attrgetter. */
static jv get_path(jctx *c, int line, jv x, jv attr) {
    if (attr.t == JV_INT)
        return jgetitem(c, line, x, attr);
    if (attr.t != JV_STR)
        FAIL(line, "attribute must be a string");
    const char *s = attr.u.s->s;
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        jv key = jv_str(js_new(c, s, n, 0));
        if (n && s[0] >= '0' && s[0] <= '9')
            key = jv_int(atoll(key.u.s->s));
        x = jgetitem(c, line, x, key);
        if (!dot)
            return x;
        s = dot + 1;
    }
}

static jv list_from(jctx *c, jv *v, size_t n) {
    jv l = jv_list(c, n);
    if (n)
        memcpy(l.u.l->v, v, n * sizeof *v);
    return l;
}

static jv select_items(jctx *c, int line, jv x, const jargs *a, int attr_mode, int keep) {
    jlist *l = jv_truthy(&x) ? jiter(c, line, x) : jv_list(c, 0).u.l; /* `if value:` */
    jv *kept = l->n ? ja_alloc(&c->arena, &c->err, l->n * sizeof *kept) : NULL;
    size_t k = 0;
    int first = attr_mode ? 1 : 0;
    jv test = jargs_get(a, first, NULL, jv_undef(NULL));
    jargs ta = {0};
    if (a->n > first + 1) {
        ta.n = a->n - first - 1;
        ta.v = a->v + first + 1;
    }
    for (size_t i = 0; i < l->n; i++) {
        jv v = attr_mode ? get_path(c, line, l->v[i], jargs_get(a, 0, NULL, jv_undef(NULL))) : l->v[i];
        int r;
        if (test.t == JV_UNDEF)
            r = jv_truthy(&v);
        else if (test.t == JV_STR)
            r = jtest(c, line, test.u.s->s, v, &ta);
        else
            FAIL(line, "select: the test must be named by a string");
        if (r == keep)
            kept[k++] = l->v[i];
    }
    jv out = list_from(c, kept, k);
    out.u.l->generator = 1;
    return out;
}

static void sort_values(jctx *c, int line, jv *v, size_t n, jv attr, int reverse, int ci) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            jv x = attr.t != JV_UNDEF ? get_path(c, line, v[j - 1], attr) : v[j - 1];
            jv y = attr.t != JV_UNDEF ? get_path(c, line, v[j], attr) : v[j];
            if (ci && x.t == JV_STR && y.t == JV_STR) {
                jargs none = {0};
                x = jfilter(c, line, "lower", x, &none);
                y = jfilter(c, line, "lower", y, &none);
            }
            int r = jv_cmp(c, line, &x, &y);
            if (reverse ? r >= 0 : r <= 0)
                break;
            jv t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

static jstr *indent(jctx *c, int line, const jstr *s, jv width, int first, int blank) {
    jstr *ind;
    if (width.t == JV_STR)
        ind = width.u.s;
    else {
        int64_t w = width.t == JV_INT ? width.u.i : 4;
        if (w < 0 || w > 1024)
            FAIL(line, "indent width %lld out of range", (long long)w);
        char sp[1025];
        memset(sp, ' ', (size_t)w);
        ind = js_new(c, sp, (size_t)w, 0);
    }
    /* Jinja's do_indent: the lines of s + "\n" (str.splitlines), joined by "\n"; lines
     * after the first get the indent unless blank, the first one only with first=True. */
    jbuf b = {0};
    jstr *nl = js_new(c, "\n", 1, 0);
    size_t start = 0, line_no = 0;
    for (size_t i = 0; i <= s->n; i++) {
        if (i < s->n && s->s[i] != '\n')
            continue;
        jstr *ln = js_sub(c, s, start, i);
        if (line_no > 0)
            jb_str(c, &b, nl);
        if (line_no > 0 ? (blank || ln->n > 0) : first)
            jb_str(c, &b, ind);
        jb_str(c, &b, ln);
        line_no++;
        start = i + 1;
    }
    return jb_take(c, &b);
}

/* Jinja2's builtin filters plus transformers' tojson: a name outside this list fails at
 * parse time, as Jinja2 fails at compile time. */
static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson", "trim",
    "truncate", "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
    NULL};

int jfilter_known(const char *name) {
    for (int i = 0; filter_names[i]; i++)
        if (!strcmp(filter_names[i], name))
            return 1;
    return 0;
}

jv jfilter(jctx *c, int line, const char *name, jv x, const jargs *a) {
    jv none = jv_none(), undef = jv_undef(NULL);
    if (!strcmp(name, "safe")) {
        jstr *s = jv_to_str(c, line, &x);
        jstr *r = js_sub(c, s, 0, s->n);
        r->markup = 1;
        return jv_str(r);
    }
    if (!strcmp(name, "list") && x.t == JV_LIST)
        return list_from(c, x.u.l->v, x.u.l->n);
    if (!strcmp(name, "tojson")) {
        jv ind = jargs_get(a, 0, "indent", none), sep = jargs_get(a, -1, "separators", none),
           sk = jargs_get(a, -1, "sort_keys", jv_bool(0));
        const char *indent_s = NULL;
        if (ind.t == JV_INT) {
            if (ind.u.i < 0 || ind.u.i > 64)
                FAIL(line, "tojson: indent %lld out of range", (long long)ind.u.i);
            char *sp = ja_alloc(&c->arena, &c->err, (size_t)ind.u.i + 1);
            memset(sp, ' ', (size_t)ind.u.i);
            indent_s = sp;
        } else if (ind.t == JV_STR)
            indent_s = ind.u.s->s;
        const char *item_sep = NULL, *key_sep = NULL;
        if (sep.t == JV_LIST && sep.u.l->n == 2 && sep.u.l->v[0].t == JV_STR &&
            sep.u.l->v[1].t == JV_STR) {
            item_sep = sep.u.l->v[0].u.s->s;
            key_sep = sep.u.l->v[1].u.s->s;
        } else if (sep.t != JV_NONE)
            FAIL(line, "tojson: separators must be a pair of strings");
        return jv_str(jv_json(c, line, &x, indent_s, item_sep, key_sep, jv_truthy(&sk)));
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        switch (x.t) {
        case JV_UNDEF: return jv_int(0);
        case JV_STR: return jv_int((int64_t)utf8_len(x.u.s->s, x.u.s->n));
        case JV_LIST:
            if (x.u.l->generator)
                FAIL(line, "object of type 'generator' has no len() (add |list)");
            return jv_int((int64_t)x.u.l->n);
        case JV_DICT: return jv_int((int64_t)x.u.d->n);
        default: FAIL(line, "object of type '%s' has no len()", jv_type_name(&x));
        }
    }
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        jv b = jargs_get(a, 1, "boolean", jv_bool(0));
        if (x.t == JV_UNDEF || (jv_truthy(&b) && !jv_truthy(&x)))
            return jargs_get(a, 0, "default_value", jv_cstr(c, "", 0));
        return x;
    }
    if (!strcmp(name, "string"))
        return jv_str(jv_to_str(c, line, &x));
    if (!strcmp(name, "trim")) {
        jargs sa = {0};
        jv chars = jargs_get(a, 0, "chars", none);
        sa.n = chars.t == JV_NONE ? 0 : 1;
        sa.v = &chars;
        jfunc f = {"strip", jv_str(jv_to_str(c, line, &x)), 1};
        return jcall_builtin(c, line, &f, &sa);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize") || !strcmp(name, "replace")) {
        jfunc f = {name, jv_str(jv_to_str(c, line, &x)), 1};
        return jcall_builtin(c, line, &f, a);
    }
    if (!strcmp(name, "join")) {
        jv sep = jargs_get(a, 0, "d", jv_cstr(c, "", 0));
        jv attr = jargs_get(a, 1, "attribute", none);
        jlist *l = jiter(c, line, x);
        jbuf b = {0};
        const jstr *s = jv_to_str(c, line, &sep);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                jb_str(c, &b, s);
            jv v = attr.t == JV_NONE ? l->v[i] : get_path(c, line, l->v[i], attr);
            jb_str(c, &b, jv_to_str(c, line, &v));
        }
        return jv_str(jb_take(c, &b));
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jlist *l = jiter(c, line, x);
        if (name[0] == 'l' && x.t == JV_LIST && x.u.l->generator)
            FAIL(line, "last: 'generator' object is not reversible (add |list)");
        if (!l->n)
            return jv_undef(name);
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(name, "list"))
        return (jv){.t = JV_LIST, .u.l = jiter(c, line, x)};
    if (!strcmp(name, "items")) {
        if (x.t == JV_UNDEF)
            return jv_list(c, 0);
        if (x.t != JV_DICT)
            FAIL(line, "items: expected a mapping, got %s", jv_type_name(&x));
        jfunc f = {"items", x, 1};
        jargs none_a = {0};
        return jcall_builtin(c, line, &f, &none_a);
    }
    if (!strcmp(name, "dictsort")) {
        if (x.t != JV_DICT)
            FAIL(line, "dictsort: expected a mapping, got %s", jv_type_name(&x));
        jfunc f = {"items", x, 1};
        jargs none_a = {0};
        jv l = jcall_builtin(c, line, &f, &none_a);
        jv cs = jargs_get(a, 0, "case_sensitive", jv_bool(0)), by = jargs_get(a, 1, "by", jv_cstr(c, "key", 0)),
           rev = jargs_get(a, 2, "reverse", jv_bool(0));
        jv idx = jv_int(by.t == JV_STR && !strcmp(by.u.s->s, "value") ? 1 : 0);
        sort_values(c, line, l.u.l->v, l.u.l->n, idx, jv_truthy(&rev), !jv_truthy(&cs));
        return l;
    }
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return select_items(c, line, x, a, 1, name[0] == 's');
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return select_items(c, line, x, a, 0, name[0] == 's');
    if (!strcmp(name, "map")) {
        jlist *l = jv_truthy(&x) ? jiter(c, line, x) : jv_list(c, 0).u.l;
        jv out = jv_list(c, l->n);
        jv attr = jargs_get(a, -1, "attribute", undef), def = jargs_get(a, -1, "default", undef);
        for (size_t i = 0; i < l->n; i++) {
            if (attr.t != JV_UNDEF) {
                jv v = get_path(c, line, l->v[i], attr);
                out.u.l->v[i] = v.t == JV_UNDEF && def.t != JV_UNDEF ? def : v;
            } else {
                if (a->n < 1 || a->v[0].t != JV_STR)
                    FAIL(line, "map: needs a filter name or attribute=");
                jargs fa = {.n = a->n - 1, .v = a->v + 1};
                out.u.l->v[i] = jfilter(c, line, a->v[0].u.s->s, l->v[i], &fa);
            }
        }
        out.u.l->generator = 1;
        return out;
    }
    if (!strcmp(name, "indent")) {
        jv first = jargs_get(a, 1, "first", jv_bool(0)), blank = jargs_get(a, 2, "blank", jv_bool(0));
        return jv_str(indent(c, line, jv_to_str(c, line, &x), jargs_get(a, 0, "width", jv_int(4)),
                             jv_truthy(&first), jv_truthy(&blank)));
    }
    if (!strcmp(name, "int")) {
        jv def = jargs_get(a, 0, "default", jv_int(0));
        if (x.t == JV_INT)
            return x;
        if (x.t == JV_BOOL)
            return jv_int(x.u.b);
        if (x.t == JV_FLOAT)
            return isfinite(x.u.f) && fabs(x.u.f) < 9.2e18 ? jv_int((int64_t)x.u.f) : def;
        if (x.t == JV_STR) {
            char *end;
            long long v = strtoll(x.u.s->s, &end, 10);
            while (*end == ' ')
                end++;
            return *end || end == x.u.s->s ? def : jv_int(v);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        jv def = jargs_get(a, 0, "default", jv_float(0));
        if (x.t == JV_INT)
            return jv_float((double)x.u.i);
        if (x.t == JV_FLOAT)
            return x;
        if (x.t == JV_STR) {
            char *end;
            double v = strtod(x.u.s->s, &end);
            return *end || end == x.u.s->s ? def : jv_float(v);
        }
        return def;
    }
    if (!strcmp(name, "abs")) {
        if (x.t == JV_INT)
            return x.u.i == INT64_MIN ? x : jv_int(x.u.i < 0 ? -x.u.i : x.u.i);
        if (x.t == JV_FLOAT)
            return jv_float(fabs(x.u.f));
        FAIL(line, "abs: bad operand type '%s'", jv_type_name(&x));
    }
    if (!strcmp(name, "unique") || !strcmp(name, "reverse") || !strcmp(name, "sort") ||
        !strcmp(name, "min") || !strcmp(name, "max") || !strcmp(name, "sum")) {
        if (!strcmp(name, "reverse") && x.t == JV_STR) {
            jlist *l = jiter(c, line, x); /* its code points */
            jbuf r = {0};
            for (size_t i = l->n; i-- > 0;)
                jb_str(c, &r, l->v[i].u.s);
            return jv_str(jb_take(c, &r));
        }
        jlist *l = jiter(c, line, x);
        jv out = list_from(c, l->v, l->n);
        jlist *o = out.u.l;
        if (name[0] == 'r') {
            for (size_t i = 0; i < o->n / 2; i++) {
                jv t = o->v[i];
                o->v[i] = o->v[o->n - 1 - i];
                o->v[o->n - 1 - i] = t;
            }
            return out;
        }
        if (name[0] == 'u') {
            size_t k = 0;
            for (size_t i = 0; i < o->n; i++) {
                int seen = 0;
                for (size_t j = 0; j < k && !seen; j++)
                    seen = jv_eq(&o->v[j], &o->v[i]);
                if (!seen)
                    o->v[k++] = o->v[i];
            }
            o->n = k;
            return out;
        }
        if (!strcmp(name, "sum")) {
            jv acc = jargs_get(a, 1, "start", jv_int(0));
            jv attr = jargs_get(a, 0, "attribute", undef);
            for (size_t i = 0; i < o->n; i++) {
                jv v = attr.t != JV_UNDEF ? get_path(c, line, o->v[i], attr) : o->v[i];
                if ((acc.t != JV_INT && acc.t != JV_FLOAT) || (v.t != JV_INT && v.t != JV_FLOAT))
                    FAIL(line, "sum: numbers only");
                acc = acc.t == JV_INT && v.t == JV_INT
                          ? jv_int(acc.u.i + v.u.i)
                          : jv_float((acc.t == JV_INT ? (double)acc.u.i : acc.u.f) +
                                     (v.t == JV_INT ? (double)v.u.i : v.u.f));
            }
            return acc;
        }
        jv rev = jargs_get(a, 0, "reverse", jv_bool(0)), cs = jargs_get(a, 1, "case_sensitive", jv_bool(0)),
           attr = jargs_get(a, 2, "attribute", undef);
        if (name[1] == 'i' || name[1] == 'a') { /* min, max */
            cs = jargs_get(a, 0, "case_sensitive", jv_bool(0));
            attr = jargs_get(a, 1, "attribute", undef);
            rev = jv_bool(name[1] == 'a');
        }
        sort_values(c, line, o->v, o->n, attr, jv_truthy(&rev), !jv_truthy(&cs));
        if (name[0] == 'm')
            return o->n ? o->v[0] : jv_undef(name);
        return out;
    }
    if (!strcmp(name, "wordcount")) {
        jstr *s = jv_to_str(c, line, &x);
        int64_t n = 0;
        int in = 0;
        for (size_t i = 0; i < s->n; i++) {
            char ch = s->s[i];
            int w = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '_' || (unsigned char)ch >= 0x80;
            n += w && !in;
            in = w;
        }
        return jv_int(n);
    }
    if (!strcmp(name, "round")) {
        jv prec = jargs_get(a, 0, "precision", jv_int(0));
        double v = x.t == JV_INT ? (double)x.u.i : x.t == JV_FLOAT ? x.u.f : NAN;
        if (isnan(v) || prec.t != JV_INT || prec.u.i < 0 || prec.u.i > 15)
            FAIL(line, "round: needs a number and a precision 0..15");
        double m = pow(10, (double)prec.u.i);
        return jv_float(nearbyint(v * m) / m);
    }
    if (!strcmp(name, "batch") || !strcmp(name, "slice") || !strcmp(name, "groupby") ||
        !strcmp(name, "truncate") || !strcmp(name, "center") || !strcmp(name, "format") ||
        !strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "urlencode") ||
        !strcmp(name, "xmlattr") || !strcmp(name, "pprint") || !strcmp(name, "filesizeformat") ||
        !strcmp(name, "striptags") || !strcmp(name, "wordwrap") || !strcmp(name, "urlize") ||
        !strcmp(name, "forceescape") || !strcmp(name, "attr") || !strcmp(name, "random"))
        FAIL(line, "filter '%s' is not supported by comet's Jinja subset", name);
    FAIL(line, "no filter named '%s'", name);
}
