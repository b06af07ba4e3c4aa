/* jinja_eval.c — runs a parsed template: scopes, statements, expressions, macros, and the
 * entry points comet_jinja_parse/_render/_free.
 *
 * Scoping follows Jinja2: a for loop's body runs in a fresh scope each iteration (a set
 * inside it does not outlive the iteration, hence namespace()); if blocks share their
 * enclosing scope; a macro call sees its arguments over the template's top-level scope.
 * Every render allocates from one arena, freed at the end, so an error can unwind by
 * longjmp from any depth.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/status.h"
#include "tokenizer/jinja_int.h"

struct comet_jinja {
    jarena arena; /* tokens and AST */
    jnode *root;
};

comet_jinja_params comet_jinja_default_params(void) {
    return (comet_jinja_params){.max_output_bytes = 16u << 20,
                                .max_memory_bytes = 256u << 20,
                                .max_iterations = 1000000,
                                .max_depth = 256,
                                .now = 0,
                                .utc = 0};
}

/* ---- scopes ---- */

static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = ja_alloc(&c->arena, &c->err, sizeof *f);
    f->parent = parent;
    return f;
}

void jframe_set(jctx *c, jframe *f, const char *name, jv v) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        const char **nn = ja_alloc(&c->arena, &c->err, cap * sizeof *nn);
        jv *nv = ja_alloc(&c->arena, &c->err, cap * sizeof *nv);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static jv *frame_get(jframe *f, const char *name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name))
                return &f->vals[i];
    return NULL;
}

/* ---- expressions ---- */

static jv eval(jctx *c, const jnode *n, jframe *f);

static void enter(jctx *c, int line) {
    if (++c->depth > c->p->max_depth)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "nesting deeper than %d (recursion?)",
              c->p->max_depth);
}

static _Noreturn void type_err(jctx *c, int line, const char *op, const jv *a, const jv *b) {
    jfail(&c->err, COMET_ERR_INVALID_ARG, line, "unsupported operand types for %s: '%s' and '%s'",
          op, jv_type_name(a), jv_type_name(b));
}

static void undefined_check(jctx *c, int line, const jv *v) {
    if (v->t == JV_UNDEF)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "'%s' is undefined",
              v->u.undef_name ? v->u.undef_name : "value");
}

static int numeric(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
static double as_f(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t as_i(const jv *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

/* markupsafe.escape: & < > " ' as HTML entities (each keeps its character's taint). */
static jstr *html_escape(jctx *c, const jstr *s) {
    jbuf b = {0};
    for (size_t i = 0; i < s->n; i++) {
        const char *e = s->s[i] == '&'    ? "&amp;"
                        : s->s[i] == '<'  ? "&lt;"
                        : s->s[i] == '>'  ? "&gt;"
                        : s->s[i] == '"'  ? "&#34;"
                        : s->s[i] == '\'' ? "&#39;"
                                          : NULL;
        int t = s->taint ? s->taint[i] : 0;
        if (e)
            jb_put(c, &b, e, strlen(e), NULL, t);
        else
            jb_put(c, &b, s->s + i, 1, NULL, t);
    }
    return jb_take(c, &b);
}

static jv arith(jctx *c, int line, int op, jv a, jv b) {
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**"};
    undefined_check(c, line, &a);
    undefined_check(c, line, &b);
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        if (!a.u.s->markup && !b.u.s->markup)
            return jv_str(js_cat(c, a.u.s, b.u.s));
        jstr *r = js_cat(c, a.u.s->markup ? a.u.s : html_escape(c, a.u.s),
                         b.u.s->markup ? b.u.s : html_escape(c, b.u.s));
        r->markup = 1;
        return jv_str(r);
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jv r = jv_list(c, a.u.l->n + b.u.l->n);
        if (a.u.l->n)
            memcpy(r.u.l->v, a.u.l->v, a.u.l->n * sizeof(jv));
        if (b.u.l->n)
            memcpy(r.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
        return r;
    }
    if (op == OP_MUL && ((a.t == JV_STR && (b.t == JV_INT || b.t == JV_BOOL)) ||
                         (b.t == JV_STR && (a.t == JV_INT || a.t == JV_BOOL)))) {
        const jstr *s = a.t == JV_STR ? a.u.s : b.u.s;
        int64_t k = a.t == JV_STR ? as_i(&b) : as_i(&a);
        if (k <= 0 || s->n == 0)
            return jv_cstr(c, "", 0);
        if ((uint64_t)k > c->p->max_output_bytes / s->n)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "string repetition over the output cap");
        return jv_str(js_repeat(c, s, (size_t)k)); /* one allocation of the exact size */
    }
    if (op == OP_MOD && a.t == JV_STR)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "printf-style string formatting (%%) is not "
              "supported");
    if (!numeric(&a) || !numeric(&b))
        type_err(c, line, names[op], &a, &b);
    if (op == OP_DIV || a.t == JV_FLOAT || b.t == JV_FLOAT || (op == OP_POW && as_i(&b) < 0)) {
        double x = as_f(&a), y = as_f(&b);
        switch (op) {
        case OP_ADD: return jv_float(x + y);
        case OP_SUB: return jv_float(x - y);
        case OP_MUL: return jv_float(x * y);
        case OP_POW: return jv_float(pow(x, y));
        default:
            if (y == 0.0)
                jfail(&c->err, COMET_ERR_INVALID_ARG, line, "division by zero");
            if (op == OP_DIV)
                return jv_float(x / y);
            if (op == OP_FLOORDIV)
                return jv_float(floor(x / y));
            {
                double m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0)))
                    m += y;
                return jv_float(m);
            }
        }
    }
    int64_t x = as_i(&a), y = as_i(&b), r;
    int ovf = 0;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(x, y, &r); break;
    case OP_SUB: ovf = __builtin_sub_overflow(x, y, &r); break;
    case OP_MUL: ovf = __builtin_mul_overflow(x, y, &r); break;
    case OP_POW:
        /* Square and multiply: O(log y) steps for any y, so 1 ** 2**62 ends at once. A base
           square is taken only while exponent bits remain, when |result| >= base**2 (bar INT64_MIN). */
        r = 1;
        for (int64_t base = x, e = y; e > 0 && !ovf; ) {
            if (e & 1)
                ovf = __builtin_mul_overflow(r, base, &r);
            e >>= 1;
            if (e > 0 && !ovf)
                ovf = __builtin_mul_overflow(base, base, &base);
        }
        break;
    default:
        if (y == 0)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            ovf = 1;
        else {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            r = op == OP_FLOORDIV ? q : m;
        }
    }
    if (ovf)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "integer overflow");
    return jv_int(r);
}

static int contains(jctx *c, int line, jv hay, jv needle) {
    switch (hay.t) {
    case JV_UNDEF: return 0;
    case JV_STR:
        if (needle.t != JV_STR)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "'in <string>' requires string as left "
                  "operand, not %s", jv_type_name(&needle));
        if (needle.u.s->n == 0)
            return 1;
        for (size_t i = 0; i + needle.u.s->n <= hay.u.s->n; i++)
            if (!memcmp(hay.u.s->s + i, needle.u.s->s, needle.u.s->n))
                return 1;
        return 0;
    case JV_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (jv_eq(&hay.u.l->v[i], &needle))
                return 1;
        return 0;
    case JV_DICT: return jd_get(hay.u.d, needle) != NULL;
    default:
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "argument of type '%s' is not iterable",
              jv_type_name(&hay));
    }
}

static jv binop(jctx *c, const jnode *n, jframe *f) {
    jv a = eval(c, n->a, f), b = eval(c, n->b, f);
    switch (n->op) {
    case OP_CONCAT: return jv_str(js_cat(c, jv_to_str(c, n->line, &a), jv_to_str(c, n->line, &b)));
    case OP_EQ: return jv_bool(jv_eq(&a, &b));
    case OP_NE: return jv_bool(!jv_eq(&a, &b));
    case OP_LT: undefined_check(c, n->line, &a); undefined_check(c, n->line, &b);
        return jv_bool(jv_cmp(c, n->line, &a, &b) < 0);
    case OP_LE: undefined_check(c, n->line, &a); undefined_check(c, n->line, &b);
        return jv_bool(jv_cmp(c, n->line, &a, &b) <= 0);
    case OP_GT: undefined_check(c, n->line, &a); undefined_check(c, n->line, &b);
        return jv_bool(jv_cmp(c, n->line, &a, &b) > 0);
    case OP_GE: undefined_check(c, n->line, &a); undefined_check(c, n->line, &b);
        return jv_bool(jv_cmp(c, n->line, &a, &b) >= 0);
    case OP_IN: return jv_bool(contains(c, n->line, b, a));
    case OP_NOTIN: return jv_bool(!contains(c, n->line, b, a));
    default: return arith(c, n->line, n->op, a, b);
    }
}

/* Python slice indices for a sequence of length len. */
static void slice_range(jctx *c, int line, jv lo, jv hi, jv step, int64_t len, int64_t *start,
                        int64_t *stop, int64_t *st) {
    *st = 1;
    if (step.t != JV_NONE && step.t != JV_UNDEF) {
        if (step.t != JV_INT)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "slice step must be an integer");
        *st = step.u.i;
        if (*st == 0)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "slice step cannot be zero");
    }
    int64_t def_lo = *st > 0 ? 0 : len - 1, def_hi = *st > 0 ? len : -1;
    int64_t *out[2] = {start, stop};
    jv in[2] = {lo, hi};
    int64_t defs[2] = {def_lo, def_hi};
    for (int k = 0; k < 2; k++) {
        if (in[k].t == JV_NONE || in[k].t == JV_UNDEF) {
            *out[k] = defs[k];
            continue;
        }
        if (in[k].t != JV_INT && in[k].t != JV_BOOL)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "slice indices must be integers");
        int64_t v = as_i(&in[k]);
        if (v < 0)
            v += len;
        if (*st > 0)
            v = v < 0 ? 0 : v > len ? len : v;
        else
            v = v < -1 ? -1 : v > len - 1 ? len - 1 : v;
        *out[k] = v;
    }
}

static jv do_slice(jctx *c, const jnode *n, jframe *f) {
    jv x = eval(c, n->a, f);
    jv lo = n->b ? eval(c, n->b, f) : jv_none(), hi = n->c ? eval(c, n->c, f) : jv_none(),
       step = n->d ? eval(c, n->d, f) : jv_none();
    int64_t a, b, s;
    if (x.t == JV_LIST) {
        slice_range(c, n->line, lo, hi, step, (int64_t)x.u.l->n, &a, &b, &s);
        const size_t cnt = (size_t)jrange_len(a, b, s); /* at most the list's length */
        jv r = jv_list(c, cnt);
        for (size_t k = 0; k < cnt; k++)
            r.u.l->v[k] = x.u.l->v[jrange_at(a, s, k)];
        return r;
    }
    if (x.t == JV_STR) {
        const jstr *str = x.u.s;
        size_t len = utf8_len(str->s, str->n);
        slice_range(c, n->line, lo, hi, step, (int64_t)len, &a, &b, &s);
        if (s == 1)
            return jv_str(js_sub(c, str, utf8_off(str->s, str->n, (size_t)a),
                                 b > a ? utf8_off(str->s, str->n, (size_t)b)
                                       : utf8_off(str->s, str->n, (size_t)a)));
        /* every code point's byte offset once, then one copy a picked code point: linear in
         * the string, whatever the step */
        size_t *off = ja_alloc(&c->arena, &c->err, (len + 1) * sizeof *off), k;
        off[0] = 0;
        for (size_t i = 0; i < len; i++) {
            utf8_get(str->s + off[i], str->n - off[i], &k);
            off[i + 1] = off[i] + k;
        }
        const uint64_t cnt = jrange_len(a, b, s); /* at most len */
        jbuf out = {0};
        for (uint64_t j = 0; j < cnt; j++) {
            const size_t i = (size_t)jrange_at(a, s, j);
            jb_put(c, &out, str->s + off[i], off[i + 1] - off[i],
                   str->taint ? str->taint + off[i] : NULL, 0);
        }
        return jv_str(jb_take(c, &out));
    }
    undefined_check(c, n->line, &x);
    jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "'%s' object is not subscriptable",
          jv_type_name(&x));
}

static void eval_args(jctx *c, const jnode *n, jframe *f, jargs *a) {
    memset(a, 0, sizeof *a);
    if (!n->n_kids)
        return;
    a->v = ja_alloc(&c->arena, &c->err, (size_t)n->n_kids * sizeof(jv));
    a->kv = ja_alloc(&c->arena, &c->err, (size_t)n->n_kids * sizeof(jv));
    a->kn = ja_alloc(&c->arena, &c->err, (size_t)n->n_kids * sizeof(char *));
    for (int i = 0; i < n->n_kids; i++) {
        jv v = eval(c, n->kids[i], f);
        if (n->knames && n->knames[i]) {
            a->kn[a->nk] = n->knames[i];
            a->kv[a->nk++] = v;
        } else {
            if (a->nk)
                jfail(&c->err, COMET_ERR_INVALID_ARG, n->line,
                      "positional argument follows keyword argument");
            a->v[a->n++] = v;
        }
    }
}

static void exec_body(jctx *c, const jnode *body, jframe *f, jbuf *out);

jv jcall_macro(jctx *c, int line, const jnode *m, const jargs *a) {
    enter(c, line);
    jframe *f = frame_new(c, c->root);
    if (a->n > m->n_names)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "macro '%s' takes not more than %d "
              "argument(s)", m->name, m->n_names);
    for (int i = 0; i < m->n_names; i++) {
        jv v = jv_undef(m->names[i]);
        int set = 0;
        if (i < a->n) {
            v = a->v[i];
            set = 1;
        }
        for (int k = 0; k < a->nk; k++)
            if (!strcmp(a->kn[k], m->names[i])) {
                v = a->kv[k];
                set = 1;
            }
        if (!set && m->kids[i])
            v = eval(c, m->kids[i], f);
        jframe_set(c, f, m->names[i], v);
    }
    for (int k = 0; k < a->nk; k++) {
        int known = 0;
        for (int i = 0; i < m->n_names; i++)
            known |= !strcmp(a->kn[k], m->names[i]);
        if (!known)
            jfail(&c->err, COMET_ERR_INVALID_ARG, line, "macro '%s' takes no keyword argument "
                  "'%s'", m->name, a->kn[k]);
    }
    jbuf b = {0};
    exec_body(c, m->b, f, &b);
    c->depth--;
    return jv_str(jb_take(c, &b));
}

static jv eval(jctx *c, const jnode *n, jframe *f) {
    enter(c, n->line);
    jv r;
    switch (n->kind) {
    case E_LIT: r = n->lit; break;
    case E_NAME: {
        jv *v = frame_get(f, n->name);
        r = v ? *v : jv_undef(n->name);
        break;
    }
    case E_ATTR: r = jgetattr(c, n->line, eval(c, n->a, f), n->name); break;
    case E_ITEM: {
        jv x = eval(c, n->a, f);
        r = jgetitem(c, n->line, x, eval(c, n->b, f));
        break;
    }
    case E_SLICE: r = do_slice(c, n, f); break;
    case E_CALL: {
        jv fn = eval(c, n->a, f);
        jargs a;
        eval_args(c, n, f, &a);
        if (fn.t == JV_MACRO)
            r = jcall_macro(c, n->line, fn.u.m, &a);
        else if (fn.t == JV_FUNC)
            r = jcall_builtin(c, n->line, fn.u.fn, &a);
        else {
            undefined_check(c, n->line, &fn);
            jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "'%s' object is not callable",
                  jv_type_name(&fn));
        }
        break;
    }
    case E_FILTER: {
        jv x = eval(c, n->a, f);
        jargs a;
        eval_args(c, n, f, &a);
        r = jfilter(c, n->line, n->name, x, &a);
        break;
    }
    case E_TEST: {
        jv x = eval(c, n->a, f);
        jargs a;
        eval_args(c, n, f, &a);
        r = jv_bool(jtest(c, n->line, n->name, x, &a) != n->op);
        break;
    }
    case E_NOT: {
        jv x = eval(c, n->a, f);
        r = jv_bool(!jv_truthy(&x));
        break;
    }
    case E_NEG:
    case E_POS: {
        jv x = eval(c, n->a, f);
        undefined_check(c, n->line, &x);
        if (!numeric(&x))
            jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "bad operand type for unary %c: '%s'",
                  n->kind == E_NEG ? '-' : '+', jv_type_name(&x));
        if (n->kind == E_POS)
            r = x.t == JV_BOOL ? jv_int(x.u.b) : x;
        else if (x.t == JV_FLOAT)
            r = jv_float(-x.u.f);
        else if (as_i(&x) == INT64_MIN)
            jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "integer overflow");
        else
            r = jv_int(-as_i(&x));
        break;
    }
    case E_BIN: r = binop(c, n, f); break;
    case E_AND: {
        jv x = eval(c, n->a, f);
        r = jv_truthy(&x) ? eval(c, n->b, f) : x;
        break;
    }
    case E_OR: {
        jv x = eval(c, n->a, f);
        r = jv_truthy(&x) ? x : eval(c, n->b, f);
        break;
    }
    case E_COND: {
        jv cond = eval(c, n->a, f);
        r = jv_truthy(&cond) ? eval(c, n->b, f) : n->c ? eval(c, n->c, f) : jv_undef(NULL);
        break;
    }
    case E_LIST: {
        r = jv_list(c, (size_t)n->n_kids);
        for (int i = 0; i < n->n_kids; i++)
            r.u.l->v[i] = eval(c, n->kids[i], f);
        break;
    }
    case E_DICT: {
        r = jv_dict(c);
        for (int i = 0; i + 1 < n->n_kids; i += 2) {
            jv k = eval(c, n->kids[i], f);
            if (k.t == JV_LIST || k.t == JV_DICT || k.t == JV_UNDEF)
                jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "unhashable dict key of type '%s'",
                      jv_type_name(&k));
            jd_set(c, r.u.d, k, eval(c, n->kids[i + 1], f));
        }
        break;
    }
    default: jfail(&c->err, COMET_ERR_INTERNAL, n->line, "bad expression node %d", (int)n->kind);
    }
    c->depth--;
    return r;
}

/* ---- statements ---- */

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

typedef struct runstate {
    int flow;
    int in_loop;
} runstate;

static void exec_node(jctx *c, const jnode *n, jframe *f, jbuf *out, runstate *rs);

static void output(jctx *c, int line, jbuf *out, const jstr *s) {
    c->out_bytes += s->n;
    if (c->out_bytes > c->p->max_output_bytes)
        jfail(&c->err, COMET_ERR_INVALID_ARG, line, "output over the cap of %zu bytes",
              c->p->max_output_bytes);
    jb_str(c, out, s);
}

static void exec_list(jctx *c, const jnode *body, jframe *f, jbuf *out, runstate *rs) {
    for (int i = 0; i < body->n_kids && rs->flow == FLOW_NONE; i++)
        exec_node(c, body->kids[i], f, out, rs);
}

static void exec_body(jctx *c, const jnode *body, jframe *f, jbuf *out) {
    runstate rs = {0};
    exec_list(c, body, f, out, &rs);
}

static void assign_targets(jctx *c, const jnode *n, jframe *f, jv item) {
    if (n->n_names == 1) {
        jframe_set(c, f, n->names[0], item);
        return;
    }
    jlist *l = jiter(c, n->line, item);
    if (l->n != (size_t)n->n_names)
        jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "cannot unpack %zu values into %d loop "
              "variables", l->n, n->n_names);
    for (int i = 0; i < n->n_names; i++)
        jframe_set(c, f, n->names[i], l->v[i]);
}

static void exec_for(jctx *c, const jnode *n, jframe *f, jbuf *out, runstate *outer) {
    jv seq = eval(c, n->a, f);
    jlist *items = jiter(c, n->line, seq);
    if (n->d) { /* the inline filter runs before loop.* is computed */
        jv kept = jv_list(c, items->n);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            jframe *g = frame_new(c, f);
            assign_targets(c, n, g, items->v[i]);
            jv keep = eval(c, n->d, g);
            if (jv_truthy(&keep))
                kept.u.l->v[k++] = items->v[i];
        }
        kept.u.l->n = k;
        items = kept.u.l;
    }
    size_t len = items->n;
    for (size_t i = 0; i < len; i++) {
        if (++c->iterations > c->p->max_iterations)
            jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "more than %ld loop iterations",
                  c->p->max_iterations);
        jframe *g = frame_new(c, f);
        jv loop = jv_dict(c);
        jd_set(c, loop.u.d, jv_cstr(c, "index", 0), jv_int((int64_t)i + 1));
        jd_set(c, loop.u.d, jv_cstr(c, "index0", 0), jv_int((int64_t)i));
        jd_set(c, loop.u.d, jv_cstr(c, "revindex", 0), jv_int((int64_t)(len - i)));
        jd_set(c, loop.u.d, jv_cstr(c, "revindex0", 0), jv_int((int64_t)(len - i - 1)));
        jd_set(c, loop.u.d, jv_cstr(c, "first", 0), jv_bool(i == 0));
        jd_set(c, loop.u.d, jv_cstr(c, "last", 0), jv_bool(i + 1 == len));
        jd_set(c, loop.u.d, jv_cstr(c, "length", 0), jv_int((int64_t)len));
        jd_set(c, loop.u.d, jv_cstr(c, "depth", 0), jv_int(1));
        jd_set(c, loop.u.d, jv_cstr(c, "depth0", 0), jv_int(0));
        jd_set(c, loop.u.d, jv_cstr(c, "previtem", 0), i ? items->v[i - 1] : jv_undef("previtem"));
        jd_set(c, loop.u.d, jv_cstr(c, "nextitem", 0),
               i + 1 < len ? items->v[i + 1] : jv_undef("nextitem"));
        jframe_set(c, g, "loop", loop);
        assign_targets(c, n, g, items->v[i]);
        runstate rs = {FLOW_NONE, 1};
        exec_list(c, n->b, g, out, &rs);
        if (rs.flow == FLOW_BREAK)
            break;
    }
    (void)outer;
    if (len == 0 && n->c)
        exec_list(c, n->c, f, out, outer);
}

static void exec_node(jctx *c, const jnode *n, jframe *f, jbuf *out, runstate *rs) {
    enter(c, n->line);
    switch (n->kind) {
    case N_TEXT: output(c, n->line, out, n->lit.u.s); break;
    case N_OUT: {
        jv v = eval(c, n->a, f);
        output(c, n->line, out, jv_to_str(c, n->line, &v));
        break;
    }
    case N_BODY: exec_list(c, n, f, out, rs); break;
    case N_IF: {
        jv cond = eval(c, n->a, f);
        if (jv_truthy(&cond))
            exec_list(c, n->b, f, out, rs);
        else if (n->c)
            exec_node(c, n->c, f, out, rs);
        break;
    }
    case N_FOR: exec_for(c, n, f, out, rs); break;
    case N_SET: {
        jv v = eval(c, n->b, f);
        if (n->a->kind == E_NAME)
            jframe_set(c, f, n->a->name, v);
        else {
            jv *ns = frame_get(f, n->a->a->name);
            if (!ns || ns->t != JV_DICT || !ns->u.d->ns)
                jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "cannot assign attribute on a "
                      "non-namespace object ('%s')", n->a->a->name);
            jd_set(c, ns->u.d, jv_cstr(c, n->a->name, 0), v);
        }
        break;
    }
    case N_SETBLOCK: {
        jbuf b = {0};
        exec_body(c, n->b, f, &b);
        jframe_set(c, f, n->name, jv_str(jb_take(c, &b)));
        break;
    }
    case N_MACRO: jframe_set(c, f, n->name, (jv){.t = JV_MACRO, .u.m = n}); break;
    case N_FILTERBLOCK: {
        jbuf b = {0};
        exec_body(c, n->b, f, &b);
        jframe *g = frame_new(c, f);
        jframe_set(c, g, "__body__", jv_str(jb_take(c, &b)));
        jv v = eval(c, n->a, g);
        output(c, n->line, out, jv_to_str(c, n->line, &v));
        break;
    }
    case N_BREAK:
    case N_CONTINUE:
        if (!rs->in_loop)
            jfail(&c->err, COMET_ERR_INVALID_ARG, n->line, "'%s' outside a loop",
                  n->kind == N_BREAK ? "break" : "continue");
        rs->flow = n->kind == N_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
        break;
    default: jfail(&c->err, COMET_ERR_INTERNAL, n->line, "bad statement node %d", (int)n->kind);
    }
    c->depth--;
}

/* ---- entry points ---- */

comet_jinja *comet_jinja_parse(const char *src, size_t n) {
    if (!src) {
        comet_set_error(COMET_ERR_INVALID_ARG, "chat template: NULL source");
        return NULL;
    }
    comet_jinja *t = calloc(1, sizeof *t);
    if (!t) {
        comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
        return NULL;
    }
    jerr e = {0};
    t->arena.cap = (size_t)64 << 20;
    if (setjmp(e.jb)) {
        comet_set_error(e.st, "%s", e.msg);
        ja_free(&t->arena);
        free(t);
        return NULL;
    }
    jtok *toks;
    size_t n_toks;
    jlex(&t->arena, &e, src, n, &toks, &n_toks);
    t->root = jparse(&t->arena, &e, toks, n_toks);
    return t;
}

void comet_jinja_free(comet_jinja *t) {
    if (!t)
        return;
    ja_free(&t->arena);
    free(t);
}

static void bind_json(jctx *c, jframe *f, const cJSON *obj, int tainted) {
    for (const cJSON *e = obj ? obj->child : NULL; e; e = e->next) {
        if (!e->string)
            continue;
        char *name = ja_alloc(&c->arena, &c->err, strlen(e->string) + 1);
        strcpy(name, e->string);
        jframe_set(c, f, name, jv_from_json(c, e, tainted));
    }
}

comet_status comet_jinja_render(const comet_jinja *t, const cJSON *data, const cJSON *trusted,
                                const comet_jinja_params *p, char **out, size_t *n_out,
                                uint8_t **taint) {
    *out = NULL;
    *n_out = 0;
    if (taint)
        *taint = NULL;
    comet_jinja_params defaults = comet_jinja_default_params();
    jctx *c = calloc(1, sizeof *c);
    if (!c)
        return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    c->p = p ? p : &defaults;
    c->arena.cap = c->p->max_memory_bytes;
    if (setjmp(c->err.jb)) {
        comet_status st = comet_set_error(c->err.st, "%s", c->err.msg);
        ja_free(&c->arena);
        free(c);
        return st;
    }
    c->root = frame_new(c, NULL);
    jglobals(c, c->root);
    bind_json(c, c->root, data, 1);
    bind_json(c, c->root, trusted, 0);
    jbuf b = {0};
    exec_body(c, t->root, c->root, &b);
    char *s = malloc(b.n + 1);
    uint8_t *tt = taint ? malloc(b.n + 1) : NULL;
    if (!s || (taint && !tt)) {
        free(s);
        free(tt);
        ja_free(&c->arena);
        free(c);
        return comet_set_error(COMET_ERR_NOMEM, "chat template: out of memory");
    }
    if (b.n)
        memcpy(s, b.s, b.n);
    s[b.n] = '\0';
    if (tt && b.n)
        memcpy(tt, b.taint, b.n);
    *out = s;
    *n_out = b.n;
    if (taint)
        *taint = tt;
    ja_free(&c->arena);
    free(c);
    return COMET_OK;
}
