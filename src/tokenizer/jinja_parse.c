/* jinja_parse.c — tokens to an AST by recursive descent, with Jinja2's grammar and
 * operator precedence: conditional (x if c else y) < or < and < not < comparisons (==,
 * !=, <, <=, >, >=, in, not in) < + - < ~ < * / // % < ** < unary -/+ < postfix ([], .,
 * call) with filters (|f) and tests (is [not] t) bound to the unary operand. Statements:
 * if/elif/else, for (with an inline `if` filter and else), set (name, namespace
 * attribute, block), macro, filter blocks, generation, break, continue. Nesting is capped
 * so hostile input cannot exhaust the stack.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_int.h"

#define MAX_PARSE_DEPTH 200

/* Jinja2 fails at compile time on an unknown filter or test unless it sits in an if
 * statement or a conditional expression ("soft" code, where only calling it fails): each
 * unknown name is kept here and judged at the end of the parse. */
#define MAX_UNKNOWN 64

typedef struct parser {
    jarena *a;
    jerr *e;
    const jtok *t;
    size_t n, i;
    int depth;
    int soft; /* inside an if statement (not in a loop, macro or block set within it) */
    const jnode *unknown[MAX_UNKNOWN];
    int unknown_soft[MAX_UNKNOWN];
    int n_unknown;
} parser;

static void note_unknown(parser *P, const jnode *n) {
    if (P->n_unknown == MAX_UNKNOWN)
        jfail(P->e, COMET_ERR_INVALID_ARG, n->line, "more than %d unknown filters or tests",
              MAX_UNKNOWN);
    P->unknown[P->n_unknown] = n;
    P->unknown_soft[P->n_unknown++] = P->soft;
}

static const jtok *cur(parser *P) { return &P->t[P->i]; }
static int line(parser *P) { return cur(P)->line; }

static _Noreturn void perr(parser *P, const char *what) {
    const jtok *t = cur(P);
    const char *got = t->type == T_EOF           ? "end of template"
                      : t->type == T_BLOCK_END   ? "'%}'"
                      : t->type == T_VAR_END     ? "'}}'"
                      : t->type == T_DATA        ? "text"
                      : t->type == T_STRING      ? "a string"
                      : t->type == T_INT || t->type == T_FLOAT ? "a number"
                                                 : t->s;
    jfail(P->e, COMET_ERR_INVALID_ARG, t->line, "expected %s, found %s", what, got);
}

static int is_op(parser *P, const char *op) {
    return cur(P)->type == T_OP && strcmp(cur(P)->s, op) == 0;
}
static int is_name(parser *P, const char *name) {
    return cur(P)->type == T_NAME && strcmp(cur(P)->s, name) == 0;
}
static int accept_op(parser *P, const char *op) {
    if (!is_op(P, op))
        return 0;
    P->i++;
    return 1;
}
static int accept_name(parser *P, const char *name) {
    if (!is_name(P, name))
        return 0;
    P->i++;
    return 1;
}
static void expect_op(parser *P, const char *op) {
    if (!accept_op(P, op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        perr(P, what);
    }
}
static const char *expect_ident(parser *P) {
    if (cur(P)->type != T_NAME)
        perr(P, "a name");
    return P->t[P->i++].s;
}
static void expect_block_end(parser *P) {
    if (cur(P)->type != T_BLOCK_END)
        perr(P, "'%}'");
    P->i++;
}

static jnode *node(parser *P, jnode_kind k, int ln) {
    jnode *n = ja_alloc(P->a, P->e, sizeof *n);
    n->kind = k;
    n->line = ln;
    return n;
}

/* A growable array of child nodes (with keyword names for calls). */
typedef struct kidvec {
    jnode **v;
    const char **kn;
    int n, cap;
} kidvec;

static void kid_push(parser *P, kidvec *k, jnode *n, const char *kname) {
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        jnode **v = ja_alloc(P->a, P->e, (size_t)cap * sizeof *v);
        const char **kn = ja_alloc(P->a, P->e, (size_t)cap * sizeof *kn);
        if (k->n) {
            memcpy(v, k->v, (size_t)k->n * sizeof *v);
            memcpy(kn, k->kn, (size_t)k->n * sizeof *kn);
        }
        k->v = v;
        k->kn = kn;
        k->cap = cap;
    }
    k->kn[k->n] = kname;
    k->v[k->n++] = n;
}

/* A node of `kind` whose children are k's. */
static jnode *node_of_kids(parser *P, jnode_kind kind, int ln, const kidvec *k) {
    jnode *n = node(P, kind, ln);
    n->kids = k->v;
    n->n_kids = k->n;
    return n;
}

static void enter(parser *P) {
    if (++P->depth > MAX_PARSE_DEPTH)
        jfail(P->e, COMET_ERR_INVALID_ARG, line(P), "nesting deeper than %d", MAX_PARSE_DEPTH);
}

static jnode *parse_expr(parser *P, int with_cond);
static jnode *parse_unary(parser *P, int with_filter);
static jnode *parse_or(parser *P);

/* (args) after '(' was consumed: positional then keyword (name=value). */
static void parse_call_args(parser *P, kidvec *k) {
    while (!accept_op(P, ")")) {
        if (k->n && !accept_op(P, ","))
            perr(P, "',' or ')'");
        if (accept_op(P, ")"))
            break;
        const char *kname = NULL;
        if (cur(P)->type == T_NAME && P->t[P->i + 1].type == T_OP && strcmp(P->t[P->i + 1].s, "=") == 0) {
            kname = cur(P)->s;
            P->i += 2;
        }
        kid_push(P, k, parse_expr(P, 1), kname);
    }
}

static jnode *parse_primary(parser *P) {
    const jtok *t = cur(P);
    int ln = t->line;
    jnode *n;
    if (t->type == T_NAME) {
        P->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") ||
            !strcmp(t->s, "False")) {
            n = node(P, E_LIT, ln);
            n->lit = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n = node(P, E_LIT, ln);
            n->lit = jv_none();
        } else {
            n = node(P, E_NAME, ln);
            n->name = t->s;
        }
        return n;
    }
    if (t->type == T_STRING) {
        /* adjacent literals concatenate */
        size_t total = 0, j = P->i;
        while (P->t[j].type == T_STRING)
            total += P->t[j++].n;
        char *s = ja_alloc(P->a, P->e, total + 1);
        size_t o = 0;
        while (cur(P)->type == T_STRING) {
            memcpy(s + o, cur(P)->s, cur(P)->n);
            o += cur(P)->n;
            P->i++;
        }
        jstr *js = ja_alloc(P->a, P->e, sizeof *js + total + 1);
        js->n = total;
        memcpy(js->s, s, total);
        n = node(P, E_LIT, ln);
        n->lit = jv_str(js);
        return n;
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        P->i++;
        n = node(P, E_LIT, ln);
        n->lit = t->type == T_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    }
    if (accept_op(P, "(")) {
        if (accept_op(P, ")"))
            return node(P, E_LIST, ln); /* () is an empty tuple */
        jnode *first = parse_expr(P, 1);
        if (accept_op(P, ")"))
            return first;
        kidvec k = {0};
        kid_push(P, &k, first, NULL);
        while (accept_op(P, ",")) {
            if (is_op(P, ")"))
                break;
            kid_push(P, &k, parse_expr(P, 1), NULL);
        }
        expect_op(P, ")");
        return node_of_kids(P, E_LIST, ln, &k);
    }
    if (accept_op(P, "[")) {
        kidvec k = {0};
        while (!accept_op(P, "]")) {
            if (k.n && !accept_op(P, ","))
                perr(P, "',' or ']'");
            if (accept_op(P, "]"))
                break;
            kid_push(P, &k, parse_expr(P, 1), NULL);
        }
        return node_of_kids(P, E_LIST, ln, &k);
    }
    if (accept_op(P, "{")) {
        kidvec k = {0};
        while (!accept_op(P, "}")) {
            if (k.n && !accept_op(P, ","))
                perr(P, "',' or '}'");
            if (accept_op(P, "}"))
                break;
            kid_push(P, &k, parse_expr(P, 1), NULL);
            expect_op(P, ":");
            kid_push(P, &k, parse_expr(P, 1), NULL);
        }
        return node_of_kids(P, E_DICT, ln, &k);
    }
    perr(P, "an expression");
}

static jnode *parse_subscript(parser *P, jnode *obj, int ln) {
    jnode *parts[3] = {0};
    int colons = 0;
    for (;;) {
        if (is_op(P, ":")) {
            if (++colons > 2)
                perr(P, "']'");
            P->i++;
            continue;
        }
        if (is_op(P, "]"))
            break;
        if (parts[colons])
            perr(P, "':' or ']'");
        parts[colons] = parse_expr(P, 1);
    }
    expect_op(P, "]");
    jnode *n = node(P, colons ? E_SLICE : E_ITEM, ln);
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    if (!colons && !parts[0])
        jfail(P->e, COMET_ERR_INVALID_ARG, ln, "empty subscript []");
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        int ln = line(P);
        if (accept_op(P, ".")) {
            jnode *a = node(P, E_ATTR, ln);
            a->a = n;
            if (cur(P)->type == T_INT) {
                /* x.0 is x[0] */
                jnode *idx = node(P, E_LIT, ln);
                idx->lit = jv_int(cur(P)->i);
                P->i++;
                a->kind = E_ITEM;
                a->b = idx;
            } else
                a->name = expect_ident(P);
            n = a;
        } else if (accept_op(P, "[")) {
            n = parse_subscript(P, n, ln);
        } else if (accept_op(P, "(")) {
            kidvec k = {0};
            parse_call_args(P, &k);
            jnode *c = node(P, E_CALL, ln);
            c->a = n;
            c->kids = k.v;
            c->knames = k.kn;
            c->n_kids = k.n;
            n = c;
        } else
            return n;
    }
}

static jnode *parse_filter_chain(parser *P, jnode *n) {
    for (;;) {
        int ln = line(P);
        if (accept_op(P, "|")) {
            jnode *f = node(P, E_FILTER, ln);
            f->name = expect_ident(P);
            if (is_op(P, "."))
                jfail(P->e, COMET_ERR_INVALID_ARG, ln, "no filter named '%s.'", f->name);
            if (!jfilter_known(f->name))
                note_unknown(P, f);
            f->a = n;
            if (accept_op(P, "(")) {
                kidvec k = {0};
                parse_call_args(P, &k);
                f->kids = k.v;
                f->knames = k.kn;
                f->n_kids = k.n;
            }
            n = f;
        } else if (accept_name(P, "is")) {
            jnode *t = node(P, E_TEST, ln);
            t->op = accept_name(P, "not");
            t->name = expect_ident(P);
            if (!jtest_known(t->name))
                note_unknown(P, t);
            t->a = n;
            kidvec k = {0};
            if (accept_op(P, "(")) {
                parse_call_args(P, &k);
            } else {
                jtok_type ty = cur(P)->type;
                int starts = ty == T_NAME || ty == T_STRING || ty == T_INT || ty == T_FLOAT ||
                             is_op(P, "[") || is_op(P, "{");
                if (starts && !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") &&
                    !is_name(P, "is") && !is_name(P, "if") && !is_name(P, "in") &&
                    !is_name(P, "not")) {
                    enter(P);
                    kid_push(P, &k, parse_postfix(P, parse_primary(P)), NULL);
                    P->depth--;
                }
            }
            t->kids = k.v;
            t->knames = k.kn;
            t->n_kids = k.n;
            n = t;
        } else
            return n;
    }
}

static jnode *parse_unary(parser *P, int with_filter) {
    enter(P);
    int ln = line(P);
    jnode *n;
    if (accept_op(P, "-")) {
        n = node(P, E_NEG, ln);
        n->a = parse_unary(P, 0);
    } else if (accept_op(P, "+")) {
        n = node(P, E_POS, ln);
        n->a = parse_unary(P, 0);
    } else
        n = parse_postfix(P, parse_primary(P));
    if (with_filter)
        n = parse_filter_chain(P, n);
    P->depth--;
    return n;
}

static jnode *bin(parser *P, int op, jnode *a, jnode *b, int ln) {
    jnode *n = node(P, E_BIN, ln);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, 1);
    while (is_op(P, "**")) {
        int ln = line(P);
        P->i++;
        n = bin(P, OP_POW, n, parse_unary(P, 1), ln);
    }
    return n;
}

/* One level of left-associative binary operators: the operator tokens and their ops. */
typedef struct binop_tok {
    const char *tok;
    int op;
} binop_tok;

static const binop_tok MUL_OPS[] = {{"*", OP_MUL}, {"/", OP_DIV}, {"//", OP_FLOORDIV},
                                    {"%", OP_MOD}, {NULL, 0}};
static const binop_tok CONCAT_OPS[] = {{"~", OP_CONCAT}, {NULL, 0}};
static const binop_tok ADD_OPS[] = {{"+", OP_ADD}, {"-", OP_SUB}, {NULL, 0}};

/* next (op next)* for the operators of one level, folded to the left. */
static jnode *parse_left_assoc(parser *P, jnode *(*next)(parser *), const binop_tok *ops) {
    jnode *n = next(P);
    for (;;) {
        const binop_tok *o = ops;
        while (o->tok && !is_op(P, o->tok))
            o++;
        if (!o->tok)
            return n;
        int ln = line(P);
        P->i++;
        n = bin(P, o->op, n, next(P), ln);
    }
}

static jnode *parse_math2(parser *P) { return parse_left_assoc(P, parse_pow, MUL_OPS); }
static jnode *parse_concat(parser *P) { return parse_left_assoc(P, parse_math2, CONCAT_OPS); }
static jnode *parse_math1(parser *P) { return parse_left_assoc(P, parse_concat, ADD_OPS); }

static jnode *parse_compare(parser *P) {
    jnode *n = parse_math1(P);
    for (;;) {
        int ln = line(P), op;
        if (is_op(P, "=="))
            op = OP_EQ;
        else if (is_op(P, "!="))
            op = OP_NE;
        else if (is_op(P, "<"))
            op = OP_LT;
        else if (is_op(P, "<="))
            op = OP_LE;
        else if (is_op(P, ">"))
            op = OP_GT;
        else if (is_op(P, ">="))
            op = OP_GE;
        else if (is_name(P, "in"))
            op = OP_IN;
        else if (is_name(P, "not") && P->t[P->i + 1].type == T_NAME && !strcmp(P->t[P->i + 1].s, "in")) {
            op = OP_NOTIN;
            P->i++;
        } else
            return n;
        P->i++;
        /* a < b < c is (a < b) and (b < c) in Jinja; templates do not chain: keep it binary */
        n = bin(P, op, n, parse_math1(P), ln);
    }
}

static jnode *parse_not(parser *P) {
    int ln = line(P);
    if (accept_name(P, "not")) {
        enter(P);
        jnode *n = node(P, E_NOT, ln);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (is_name(P, "and")) {
        jnode *a = node(P, E_AND, line(P));
        P->i++;
        a->a = n;
        a->b = parse_not(P);
        n = a;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (is_name(P, "or")) {
        jnode *o = node(P, E_OR, line(P));
        P->i++;
        o->a = n;
        o->b = parse_and(P);
        n = o;
    }
    return n;
}

static jnode *parse_expr(parser *P, int with_cond) {
    enter(P);
    int first_unknown = P->n_unknown;
    jnode *n = parse_or(P);
    while (with_cond && is_name(P, "if")) {
        int outer = P->soft;
        P->soft = 1;
        for (int k = first_unknown; k < P->n_unknown; k++)
            P->unknown_soft[k] = 1;
        jnode *c = node(P, E_COND, line(P));
        P->i++;
        c->b = n;
        c->a = parse_or(P);
        if (accept_name(P, "else"))
            c->c = parse_expr(P, 1);
        n = c;
        P->soft = outer;
    }
    P->depth--;
    return n;
}

/* ---- statements ---- */

static jnode *parse_body(parser *P, const char *const *ends, const char **which);

static jnode *parse_if(parser *P, int ln) {
    int outer = P->soft;
    P->soft = 1;
    jnode *n = node(P, N_IF, ln);
    n->a = parse_expr(P, 1);
    expect_block_end(P);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const char *which;
    n->b = parse_body(P, ends, &which);
    if (!strcmp(which, "elif"))
        n->c = parse_if(P, line(P));
    else {
        if (!strcmp(which, "else")) {
            expect_block_end(P);
            static const char *const end[] = {"endif", NULL};
            n->c = parse_body(P, end, &which);
        }
        expect_block_end(P);
    }
    P->soft = outer;
    return n;
}

static jnode *parse_for(parser *P, int ln) {
    jnode *n = node(P, N_FOR, ln);
    const char *names[8];
    int k = 0;
    int paren = accept_op(P, "(");
    do {
        if (k == 8)
            jfail(P->e, COMET_ERR_INVALID_ARG, ln, "more than 8 loop variables");
        names[k++] = expect_ident(P);
    } while (accept_op(P, ","));
    if (paren)
        expect_op(P, ")");
    n->names = ja_alloc(P->a, P->e, (size_t)k * sizeof *n->names);
    memcpy(n->names, names, (size_t)k * sizeof *names);
    n->n_names = k;
    if (!accept_name(P, "in"))
        perr(P, "'in'");
    n->a = parse_expr(P, 0);
    if (accept_name(P, "if"))
        n->d = parse_expr(P, 0);
    if (accept_name(P, "recursive"))
        jfail(P->e, COMET_ERR_INVALID_ARG, ln, "recursive loops are not supported");
    expect_block_end(P);
    static const char *const ends[] = {"else", "endfor", NULL};
    const char *which;
    int outer = P->soft;
    P->soft = 0;
    n->b = parse_body(P, ends, &which);
    if (!strcmp(which, "else")) {
        expect_block_end(P);
        static const char *const end[] = {"endfor", NULL};
        n->c = parse_body(P, end, &which);
    }
    P->soft = outer;
    expect_block_end(P);
    return n;
}

static jnode *parse_set(parser *P, int ln) {
    const char *name = expect_ident(P);
    jnode *target = node(P, E_NAME, ln);
    target->name = name;
    if (accept_op(P, ".")) {
        jnode *t = node(P, E_ATTR, ln);
        t->a = target;
        t->name = expect_ident(P);
        target = t;
    }
    if (target->kind == E_NAME && cur(P)->type == T_BLOCK_END) {
        P->i++;
        jnode *n = node(P, N_SETBLOCK, ln);
        n->name = name;
        static const char *const end[] = {"endset", NULL};
        const char *which;
        int outer = P->soft;
        P->soft = 0;
        n->b = parse_body(P, end, &which);
        P->soft = outer;
        expect_block_end(P);
        return n;
    }
    if (target->kind == E_NAME && is_op(P, "|"))
        jfail(P->e, COMET_ERR_INVALID_ARG, ln, "filtered block set is not supported");
    if (is_op(P, ","))
        jfail(P->e, COMET_ERR_INVALID_ARG, ln, "tuple assignment in set is not supported");
    expect_op(P, "=");
    jnode *n = node(P, N_SET, ln);
    n->a = target;
    n->b = parse_expr(P, 1);
    expect_block_end(P);
    return n;
}

static jnode *parse_macro(parser *P, int ln) {
    jnode *n = node(P, N_MACRO, ln);
    n->name = expect_ident(P);
    expect_op(P, "(");
    kidvec defs = {0};
    kidvec names = {0};
    while (!accept_op(P, ")")) {
        if (names.n && !accept_op(P, ","))
            perr(P, "',' or ')'");
        if (accept_op(P, ")"))
            break;
        const char *pname = expect_ident(P);
        jnode *def = NULL;
        if (accept_op(P, "="))
            def = parse_expr(P, 1);
        kid_push(P, &names, NULL, pname);
        kid_push(P, &defs, def, NULL);
    }
    expect_block_end(P);
    n->names = names.kn;
    n->n_names = names.n;
    n->kids = defs.v;
    n->n_kids = defs.n;
    static const char *const end[] = {"endmacro", NULL};
    const char *which;
    int outer = P->soft;
    P->soft = 0;
    n->b = parse_body(P, end, &which);
    P->soft = outer;
    if (cur(P)->type == T_NAME)
        P->i++; /* {% endmacro name %} */
    expect_block_end(P);
    return n;
}

static jnode *parse_filter_block(parser *P, int ln) {
    jnode *n = node(P, N_FILTERBLOCK, ln);
    jnode *body = node(P, E_NAME, ln);
    body->name = "__body__";
    jnode *f = node(P, E_FILTER, ln);
    f->name = expect_ident(P);
    if (!jfilter_known(f->name))
        note_unknown(P, f);
    f->a = body;
    if (accept_op(P, "(")) {
        kidvec k = {0};
        parse_call_args(P, &k);
        f->kids = k.v;
        f->knames = k.kn;
        f->n_kids = k.n;
    }
    n->a = parse_filter_chain(P, f);
    expect_block_end(P);
    static const char *const end[] = {"endfilter", NULL};
    const char *which;
    n->b = parse_body(P, end, &which);
    expect_block_end(P);
    return n;
}

/* Statements until a block whose name is in `ends` (NULL-terminated; NULL `ends`: until
 * the end of the template). On return cur is past that name; *which names it. */
static jnode *parse_body(parser *P, const char *const *ends, const char **which) {
    enter(P);
    kidvec k = {0};
    int start_line = line(P);
    for (;;) {
        const jtok *t = cur(P);
        if (t->type == T_EOF) {
            if (ends)
                jfail(P->e, COMET_ERR_INVALID_ARG, start_line,
                      "block opened here is not closed (expected {%% %s %%} before the end)",
                      ends[0]);
            break;
        }
        if (t->type == T_DATA) {
            jnode *n = node(P, N_TEXT, t->line);
            jstr *s = ja_alloc(P->a, P->e, sizeof *s + t->n + 1);
            s->n = t->n;
            memcpy(s->s, t->s, t->n);
            n->lit = jv_str(s);
            kid_push(P, &k, n, NULL);
            P->i++;
            continue;
        }
        if (t->type == T_VAR_BEGIN) {
            P->i++;
            jnode *n = node(P, N_OUT, t->line);
            n->a = parse_expr(P, 1);
            if (cur(P)->type != T_VAR_END)
                perr(P, "'}}'");
            P->i++;
            kid_push(P, &k, n, NULL);
            continue;
        }
        if (t->type != T_BLOCK_BEGIN)
            perr(P, "text or a tag");
        P->i++;
        int ln = line(P);
        const char *kw = expect_ident(P);
        for (int j = 0; ends && ends[j]; j++)
            if (!strcmp(kw, ends[j])) {
                *which = ends[j];
                jnode *body = node(P, N_BODY, start_line);
                body->kids = k.v;
                body->n_kids = k.n;
                P->depth--;
                return body;
            }
        jnode *n;
        if (!strcmp(kw, "if"))
            n = parse_if(P, ln);
        else if (!strcmp(kw, "for"))
            n = parse_for(P, ln);
        else if (!strcmp(kw, "set"))
            n = parse_set(P, ln);
        else if (!strcmp(kw, "macro"))
            n = parse_macro(P, ln);
        else if (!strcmp(kw, "filter"))
            n = parse_filter_block(P, ln);
        else if (!strcmp(kw, "generation")) {
            expect_block_end(P);
            static const char *const end[] = {"endgeneration", NULL};
            const char *w;
            n = parse_body(P, end, &w);
            expect_block_end(P);
        } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
            n = node(P, kw[0] == 'b' ? N_BREAK : N_CONTINUE, ln);
            expect_block_end(P);
        } else
            jfail(P->e, COMET_ERR_INVALID_ARG, ln, "unknown or misplaced tag '%s'%s", kw,
                  ends ? "" : " (no block is open)");
        kid_push(P, &k, n, NULL);
    }
    jnode *body = node(P, N_BODY, start_line);
    body->kids = k.v;
    body->n_kids = k.n;
    *which = NULL;
    P->depth--;
    return body;
}

jnode *jparse(jarena *a, jerr *e, const jtok *toks, size_t n_toks) {
    parser P = {.a = a, .e = e, .t = toks, .n = n_toks};
    const char *which;
    jnode *root = parse_body(&P, NULL, &which);
    for (int k = 0; k < P.n_unknown; k++)
        if (!P.unknown_soft[k])
            jfail(e, COMET_ERR_INVALID_ARG, P.unknown[k]->line, "no %s named '%s'",
                  P.unknown[k]->kind == E_FILTER ? "filter" : "test", P.unknown[k]->name);
    return root;
}
