/* bpe.c — byte-level BPE (GPT-2 / Llama-3 / SmolLM): pre-tokenizer regexes run through
 * PCRE2 (UTF-8 + Unicode properties, JIT), the GPT-2 byte <-> code point table, and
 * merging by rank within each pre-token word.
 *
 * Pre-tokenization follows HF tokenizers' Sequence of Split(..., "isolated"): each regex
 * of the sequence cuts every piece left by the previous one into its matches and the gaps
 * between them, keeping both. The regex table per GGUF tokenizer.ggml.pre name is the one
 * llama.cpp and the models' tokenizer.json files use. Merging keeps a binary heap of
 * candidate pairs ordered by (rank, position), so a word of n bytes costs O(n log n).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- UTF-8 and the byte table ------------------------------------------------------- */

int tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    int len;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    if ((size_t)len > n) {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = 0xFFFFFFFFu;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    *cp = v;
    return len;
}

int tok_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
 * bytes (controls, space, DEL, NBSP, soft hyphen) are moved to U+0100.. in byte order. */
static int byte_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_printable(b))
        return b;
    uint32_t k = 0;
    for (int i = 0; i < b; i++)
        k += !byte_printable(i);
    return 256 + k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256)
        return byte_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    uint32_t k = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!byte_printable(b) && k-- == 0)
            return b;
    return -1;
}

/* ---- pre-tokenizer table ---------------------------------------------------------- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct pre_entry {
    const char *names; /* '|'-separated GGUF tokenizer.ggml.pre names */
    int ignore_merges;
    const char *regex[TOK_MAX_REGEX];
} pre_entry;

static const pre_entry pre_table[] = {
    {"gpt2|gpt-2|mpt|olmo|jais|trillion", 0, {RE_GPT2}},
    {"llama3|llama-bpe|llama-v3|dbrx|smaug-bpe", 1, {RE_LLAMA3}},
    {"smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RE_GPT2}},
    {"qwen2|stablelm2|hunyuan", 0, {RE_QWEN2}},
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static int name_in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && memcmp(p, name, n) == 0)
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

comet_status tok_bpe_set_regexes(struct comet_tokenizer *t, const char *const *patterns, int n) {
    if (n > TOK_MAX_REGEX)
        return comet_set_error(COMET_ERR_UNSUPPORTED,
                               "tokenizer: %d pre-tokenizer regexes, at most %d are supported", n,
                               TOK_MAX_REGEX);
    for (int i = 0; i < t->n_regex; i++)
        pcre2_code_free(t->regex[i]);
    t->n_regex = 0;
    for (int i = 0; i < n; i++) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)patterns[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return comet_set_error(COMET_ERR_FORMAT,
                                   "tokenizer: pre-tokenizer regex \"%s\" does not compile at "
                                   "offset %zu: %s",
                                   patterns[i], (size_t)off, (const char *)msg);
        }
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
        t->regex[t->n_regex++] = re;
    }
    return COMET_OK;
}

comet_status tok_bpe_set_pre(struct comet_tokenizer *t, const char *pre) {
    const char *name = pre && *pre ? pre : "default";
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
        const pre_entry *e = &pre_table[i];
        if (!name_in_list(name, e->names))
            continue;
        int n = 0;
        while (n < TOK_MAX_REGEX && e->regex[n])
            n++;
        t->ignore_merges = e->ignore_merges;
        return tok_bpe_set_regexes(t, e->regex, n);
    }
    return comet_set_error(COMET_ERR_UNSUPPORTED,
                           "tokenizer.ggml.pre \"%s\": unknown pre-tokenizer; supported: gpt2, "
                           "llama-bpe (llama3), smollm, starcoder, qwen2, default",
                           name);
}

/* ---- merging ------------------------------------------------------------------------ */

typedef struct cand {
    int32_t rank, pos; /* ordered by rank, then leftmost */
    int32_t lid, rid;  /* ids the pair had when queued (stale entries are skipped) */
    int32_t merged;
} cand;

typedef struct bpe_work {
    int32_t *id;   /* [n] symbol ids; -2 = merged away */
    int32_t *next; /* [n] -1 = end */
    int32_t *prev;
    cand *heap;
    size_t n_heap;
    size_t cap;   /* symbols */
    char *mapped; /* byte-level text of the word for ignore_merges lookups */
} bpe_work;

static int work_reserve(bpe_work *w, size_t n) {
    if (n <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *id = realloc(w->id, cap * sizeof *id);
    if (id)
        w->id = id;
    int32_t *next = realloc(w->next, cap * sizeof *next);
    if (next)
        w->next = next;
    int32_t *prev = realloc(w->prev, cap * sizeof *prev);
    if (prev)
        w->prev = prev;
    cand *heap = realloc(w->heap, 3 * cap * sizeof *heap);
    if (heap)
        w->heap = heap;
    char *mapped = realloc(w->mapped, 2 * cap);
    if (mapped)
        w->mapped = mapped;
    if (!id || !next || !prev || !heap || !mapped)
        return -1;
    w->cap = cap;
    return 0;
}

static int cand_less(const cand *a, const cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(bpe_work *w, cand c) {
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static cand heap_pop(bpe_work *w) {
    cand top = w->heap[0];
    cand last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < n && cand_less(&w->heap[l], best))
            m = l, best = &w->heap[l];
        if (r < n && cand_less(&w->heap[r], best))
            m = r;
        if (m == i)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static void queue_pair(const struct comet_tokenizer *t, bpe_work *w, int32_t pos) {
    if (pos < 0)
        return;
    int32_t nx = w->next[pos];
    if (nx < 0)
        return;
    int32_t l = w->id[pos], r = w->id[nx];
    if (l < 0 || r < 0)
        return;
    int32_t merged;
    int32_t rank = tok_pair_map_get(&t->merges, l, r, &merged);
    if (rank < 0)
        return;
    heap_push(w, (cand){rank, pos, l, r, merged});
}

/* Merge the symbols w->id[0..n) (linked in order) by rank and append the result to out.
 * Symbols with id -1 (not in the vocabulary) never merge; `emit_unknown` says how they
 * are written. */
static comet_status merge_symbols(const struct comet_tokenizer *t, bpe_work *w, int32_t n,
                                  tok_ids *out,
                                  comet_status (*emit_unknown)(const struct comet_tokenizer *,
                                                               int32_t pos, void *ctx,
                                                               tok_ids *out),
                                  void *ctx) {
    for (int32_t i = 0; i < n; i++) {
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < n ? i + 1 : -1;
    }
    w->n_heap = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        queue_pair(t, w, i);
    while (w->n_heap) {
        cand c = heap_pop(w);
        int32_t nx = w->next[c.pos];
        if (w->id[c.pos] != c.lid || nx < 0 || w->id[nx] != c.rid)
            continue;
        w->id[c.pos] = c.merged;
        w->id[nx] = -2;
        w->next[c.pos] = w->next[nx];
        if (w->next[nx] >= 0)
            w->prev[w->next[nx]] = c.pos;
        queue_pair(t, w, w->prev[c.pos]);
        queue_pair(t, w, c.pos);
    }
    for (int32_t i = 0; i >= 0 && n > 0; i = w->next[i]) {
        if (w->id[i] >= 0) {
            if (tok_ids_push(out, w->id[i]) < 0)
                return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        } else {
            COMET_TRY(emit_unknown(t, i, ctx, out));
        }
    }
    return COMET_OK;
}

/* ---- byte-level words ---------------------------------------------------------------- */

/* Only reached when even U+FFFD's bytes are missing: such a byte is dropped, as
 * llama.cpp does (emitting unk, often a control token, would end the document). */
static comet_status bpe_emit_unknown_byte(const struct comet_tokenizer *t, int32_t pos, void *ctx,
                                          tok_ids *out) {
    (void)t;
    (void)pos;
    (void)ctx;
    (void)out;
    return COMET_OK;
}

static comet_status bpe_word(const struct comet_tokenizer *t, bpe_work *w, const uint8_t *s,
                             size_t n, tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    if (work_reserve(w, n) < 0)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    if (t->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += (size_t)tok_utf8_encode(tok_byte_to_cp(s[i]), w->mapped + m);
        int32_t id = tok_str_map_get(&t->tok_map, w->mapped, m);
        if (id >= 0 && t->attr[id] == COMET_TOKEN_NORMAL) {
            if (tok_ids_push(out, id) < 0)
                return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return COMET_OK;
        }
    }
    /* A byte the vocabulary lacks (vocabularies trained on valid UTF-8 often have no
     * token for 0xC0, 0xC1, 0xF5..0xFF) stands for U+FFFD, as a decoder would show it. */
    size_t n_sym = 0;
    for (size_t i = 0; i < n; i++)
        n_sym += t->byte_id[s[i]] >= 0 ? 1 : 3;
    if (n_sym > n && work_reserve(w, n_sym) < 0)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->byte_id[s[i]] >= 0) {
            w->id[k++] = t->byte_id[s[i]];
        } else {
            for (int j = 0; j < 3; j++)
                w->id[k++] = t->byte_id[fffd[j]];
        }
    }
    return merge_symbols(t, w, (int32_t)k, out, bpe_emit_unknown_byte, NULL);
}

/* Apply regex `level` to s[0..n): matches and the gaps between them go to the next level;
 * past the last level each piece is one word. */
static comet_status pre_split(const struct comet_tokenizer *t, bpe_work *w, pcre2_match_data *md,
                              int level, const char *s, size_t n, tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    if (level == t->n_regex)
        return bpe_word(t, w, (const uint8_t *)s, n, out);
    const pcre2_code *re = t->regex[level];
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_jit_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_BADOPTION)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return comet_set_error(COMET_ERR_INTERNAL, "tokenizer: PCRE2 match failed (%d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* an empty match splits nothing: step over one character */
            uint32_t cp;
            pos = a + (size_t)tok_utf8_decode((const uint8_t *)s + a, n - a, &cp);
            continue;
        }
        COMET_TRY(pre_split(t, w, md, level + 1, s + gap, a - gap, out));
        COMET_TRY(pre_split(t, w, md, level + 1, s + a, b - a, out));
        pos = gap = b;
    }
    return pre_split(t, w, md, level + 1, s + gap, n - gap, out);
}

comet_status tok_bpe_encode_segment(const struct comet_tokenizer *t, const char *s, size_t n,
                                    tok_ids *out) {
    bpe_work w = {0};
    pcre2_match_data *md = NULL;
    if (t->n_regex) {
        md = pcre2_match_data_create(4, NULL);
        if (!md)
            return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    }
    comet_status st = pre_split(t, &w, md, 0, s, n, out);
    pcre2_match_data_free(md);
    free(w.id);
    free(w.next);
    free(w.prev);
    free(w.heap);
    free(w.mapped);
    return st;
}

/* ---- characters as symbols (SentencePiece-style text with merges) ------------------ */

typedef struct char_ctx {
    const uint8_t *s;
    const uint32_t *off; /* [n+1] byte offset of each character */
} char_ctx;

static comet_status emit_char_bytes(const struct comet_tokenizer *t, int32_t pos, void *vctx,
                                    tok_ids *out) {
    const char_ctx *c = vctx;
    if (t->byte_fallback) {
        int ok = 1;
        for (uint32_t i = c->off[pos]; i < c->off[pos + 1]; i++)
            ok &= t->byte_id[c->s[i]] >= 0;
        if (ok) {
            for (uint32_t i = c->off[pos]; i < c->off[pos + 1]; i++)
                if (tok_ids_push(out, t->byte_id[c->s[i]]) < 0)
                    return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return COMET_OK;
        }
    }
    if (t->unk_id >= 0 && tok_ids_push(out, t->unk_id) < 0)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    return COMET_OK;
}

/* Merge the characters of s[0..n) by merge rank (HF BPE semantics); characters that are
 * not tokens fall back to <0xXX> byte tokens or unk. */
comet_status tok_merge_chars(const struct comet_tokenizer *t, const char *s, size_t n,
                             tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    bpe_work w = {0};
    uint32_t *off = malloc((n + 1) * sizeof *off);
    comet_status st = COMET_OK;
    if (!off || work_reserve(&w, n) < 0) {
        st = comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    int32_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        off[k] = (uint32_t)i;
        w.id[k] = tok_str_map_get(&t->tok_map, s + i, (size_t)len);
        k++;
        i += (size_t)len;
    }
    off[k] = (uint32_t)n;
    char_ctx c = {(const uint8_t *)s, off};
    st = merge_symbols(t, &w, k, out, emit_char_bytes, &c);
done:
    free(off);
    free(w.id);
    free(w.next);
    free(w.prev);
    free(w.heap);
    free(w.mapped);
    return st;
}
