/* jinja_int.h — the Jinja interpreter's private types, shared by its source files.
 *
 * jinja_lex.c turns template source into tokens (whitespace control, trim_blocks,
 * lstrip_blocks), jinja_parse.c tokens into an AST, jinja_eval.c runs the AST,
 * jinja_value.c holds values (arena, tainted strings, Python str()/repr()/json.dumps
 * forms, comparison) and jinja_builtin.c the filters, tests, methods and globals.
 * Errors unwind by longjmp to the entry point (comet_jinja_parse/_render), which frees the
 * arena that holds every allocation of the run.
 */
#ifndef COMET_TOK_JINJA_INT_H
#define COMET_TOK_JINJA_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/jinja.h"

/* ---- arena and errors ---- */

typedef struct jchunk jchunk;

typedef struct jarena {
    jchunk *head;
    size_t used, cap; /* bytes allocated, the cap (error beyond it) */
} jarena;

typedef struct jerr {
    jmp_buf jb;
    comet_status st;
    char msg[512];
} jerr;

void *ja_alloc(jarena *a, jerr *e, size_t n); /* zeroed; longjmps on OOM/cap */
void ja_free(jarena *a);
/* Record the error (st, "chat template line %d: ...") and longjmp to e->jb. */
_Noreturn void jfail(jerr *e, comet_status st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- values ---- */

typedef enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_MACRO,
    JV_FUNC,
} jv_type;

/* A string: s[0..n) UTF-8 plus NUL; taint NULL (all template text) or [n] with 1 for each
 * byte from the caller's data. */
typedef struct jstr {
    size_t n;
    uint8_t *taint;
    int markup; /* a |safe string (markupsafe.Markup): `+` HTML-escapes a plain operand */
    char s[];
} jstr;

struct jv;
typedef struct jlist {
    size_t n;
    struct jv *v; /* [n] */
    int tuple;    /* prints as a Python tuple: (a, b) (items() pairs, dictsort) */
    int generator; /* the lazy result of map/select/reject in Jinja2: always true, no len(),
                    * no subscript, not JSON-serializable (|list makes a list) */
} jlist;

/* Insertion-ordered map; `ns` marks a namespace() (the only mutable value). */
typedef struct jdict {
    size_t n, cap;
    struct jv *k, *v; /* [cap] */
    int ns;
} jdict;

struct jnode;
struct jfunc;

typedef struct jv {
    jv_type t;
    union {
        int b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        const struct jnode *m; /* macro definition */
        struct jfunc *fn;
        const char *undef_name; /* what was undefined, for messages (may be NULL) */
    } u;
} jv;

/* A builtin callable: a global (self undefined) or a method bound to `self`. */
typedef struct jfunc {
    const char *name;
    jv self;
    int method;
} jfunc;

/* ---- AST ---- */

typedef enum jnode_kind {
    N_BODY, /* kids: statements */
    N_TEXT, /* lit: the text */
    N_OUT,  /* a: expression */
    N_IF,   /* a: condition, b: body, c: else (N_IF or N_BODY) or NULL */
    N_FOR,  /* names[n_names]: targets, a: iterable, d: filter or NULL, b: body, c: else */
    N_SET,  /* a: target (E_NAME or E_ATTR), b: value */
    N_SETBLOCK, /* name, b: body */
    N_MACRO,    /* name, names[n_names]: params, kids[n_names]: defaults (NULL), b: body */
    N_FILTERBLOCK, /* a: the filter chain applied to E_NAME "__body__", b: body */
    N_BREAK,
    N_CONTINUE,
    E_LIT,    /* lit */
    E_NAME,   /* name */
    E_ATTR,   /* a.name */
    E_ITEM,   /* a[b] */
    E_SLICE,  /* a[b:c:d], each NULL when absent */
    E_CALL,   /* a(kids); knames[i] non-NULL for keyword arguments */
    E_FILTER, /* a|name(kids) */
    E_TEST,   /* a is [not] name(kids); op 1: negated */
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN,  /* a op b: op one of the jop values */
    E_AND,
    E_OR,
    E_COND, /* b if a else c (c NULL: undefined) */
    E_LIST, /* kids */
    E_DICT, /* kids: key, value, key, value, ... */
} jnode_kind;

typedef enum jop {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
} jop;

typedef struct jnode {
    jnode_kind kind;
    int line;
    int op;
    jv lit;
    const char *name;
    struct jnode *a, *b, *c, *d;
    struct jnode **kids;
    const char **knames;
    int n_kids;
    const char **names;
    int n_names;
} jnode;

/* ---- lexer ---- */

typedef enum jtok_type {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    int line;
    const char *s; /* T_DATA, T_NAME, T_STRING (decoded), T_OP: NUL-terminated, arena */
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Tokenize src[0..n) into *toks (arena), ending with T_EOF. */
void jlex(jarena *a, jerr *e, const char *src, size_t n, jtok **toks, size_t *n_toks);

/* ---- parser ---- */

jnode *jparse(jarena *a, jerr *e, const jtok *toks, size_t n_toks);

/* ---- values (jinja_value.c) ---- */

typedef struct jctx jctx;

jstr *js_new(jctx *c, const char *s, size_t n, int tainted);
jstr *js_cat(jctx *c, const jstr *x, const jstr *y);
jstr *js_sub(jctx *c, const jstr *x, size_t from, size_t to); /* bytes [from, to) */
/* x repeated k times; the caller bounds x->n * k. */
jstr *js_repeat(jctx *c, const jstr *x, size_t k);
int js_tainted(const jstr *x);
jv jv_str(jstr *s);
jv jv_cstr(jctx *c, const char *s, int tainted);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_bool(int b);
jv jv_none(void);
jv jv_undef(const char *name);
jv jv_list(jctx *c, size_t n);
jv jv_dict(jctx *c);
void jd_set(jctx *c, jdict *d, jv k, jv v);
jv *jd_get(const jdict *d, jv k);
jv *jd_gets(const jdict *d, const char *k);
jv jv_from_json(jctx *c, const cJSON *j, int tainted);

int jv_truthy(const jv *v);
int jv_eq(const jv *a, const jv *b);
/* <0, 0, >0; fails (line) for values Python cannot order. */
int jv_cmp(jctx *c, int line, const jv *a, const jv *b);
const char *jv_type_name(const jv *v);
/* Python str(v) / repr(v) / json.dumps(v, ensure_ascii=False, ...). Strings keep taint. */
jstr *jv_to_str(jctx *c, int line, const jv *v);
jstr *jv_repr(jctx *c, int line, const jv *v);
jstr *jv_json(jctx *c, int line, const jv *v, const char *indent, const char *item_sep,
              const char *key_sep, int sort_keys);
size_t utf8_len(const char *s, size_t n);              /* code points */
size_t utf8_off(const char *s, size_t n, size_t cp);   /* byte offset of code point cp */
/* Python's range(lo, hi, st), st != 0: its length, counted without stepping past hi (which
 * could overflow int64), and its element k < that length. */
uint64_t jrange_len(int64_t lo, int64_t hi, int64_t st);
int64_t jrange_at(int64_t lo, int64_t st, uint64_t k);
int py_isspace(uint32_t c);
int utf8_put(uint32_t cp, char *out);                  /* bytes written (1..4) */
uint32_t utf8_get(const char *s, size_t n, size_t *k); /* decode at s, *k = length */

/* A growable output with per-byte taint. */
typedef struct jbuf {
    char *s;
    uint8_t *taint;
    size_t n, cap;
} jbuf;

void jb_put(jctx *c, jbuf *b, const char *s, size_t n, const uint8_t *taint, int tainted);
void jb_str(jctx *c, jbuf *b, const jstr *s);
jstr *jb_take(jctx *c, jbuf *b); /* a jstr of the buffer's contents (buffer reset) */

/* ---- evaluator state ---- */

typedef struct jframe {
    struct jframe *parent;
    size_t n, cap;
    const char **names;
    jv *vals;
} jframe;

struct jctx {
    jarena arena;
    jerr err;
    const comet_jinja_params *p;
    jframe *root;
    long iterations;
    int depth;
    size_t out_bytes;
};

/* ---- builtins (jinja_builtin.c) ---- */

typedef struct jargs {
    int n;            /* positional */
    jv *v;            /* [n] */
    int nk;           /* keyword */
    const char **kn;  /* [nk] */
    jv *kv;           /* [nk] */
} jargs;

/* Argument i of a call (positional), else the keyword argument `kw` (may be NULL), else
 * `def`. */
jv jargs_get(const jargs *a, int i, const char *kw, jv def);

jv jfilter(jctx *c, int line, const char *name, jv x, const jargs *a);
int jfilter_known(const char *name); /* a Jinja2 filter name (parse-time check) */
int jtest_known(const char *name);   /* a Jinja2 test name (parse-time check) */
int jtest(jctx *c, int line, const char *name, jv x, const jargs *a);
jv jcall_builtin(jctx *c, int line, const jfunc *f, const jargs *a);
/* x.name as Jinja's sandboxed getattr: a bound method, a dict item, or undefined. */
jv jgetattr(jctx *c, int line, jv x, const char *name);
jv jgetitem(jctx *c, int line, jv x, jv key);
/* The globals: range, namespace, dict, raise_exception, strftime_now. */
void jglobals(jctx *c, jframe *f);
void jframe_set(jctx *c, jframe *f, const char *name, jv v);
/* Iterate: a list of the items of x (list, dict keys, string characters), or fail. */
jlist *jiter(jctx *c, int line, jv x);

/* Macro calls from filters (map with a macro is not supported): the evaluator's entry. */
jv jcall_macro(jctx *c, int line, const jnode *m, const jargs *a);

#endif
