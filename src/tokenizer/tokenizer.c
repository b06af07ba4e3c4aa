/* tokenizer.c — building a tokenizer from a comet_vocab_desc, the token<->id hash maps,
 * special-token splitting and the encode entry point.
 *
 * Encoding first cuts the text at special/added tokens (leftmost-longest match, as HF
 * tokenizers does), then hands each raw-text segment to the byte-level BPE (bpe.c) or
 * SentencePiece (spm.c) encoder. Decoding tables (the bytes of every token) are built
 * once here; streaming decoding lives in detok.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"
#include "tokenizer/tok_internal.h"

/* ---- hash maps ------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_cap(size_t n_expected) {
    size_t cap = 16;
    while (cap < n_expected * 2)
        cap <<= 1;
    return cap;
}

int tok_str_map_init(tok_str_map *m, size_t n_expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_cap(n_expected);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->lens = calloc(m->cap, sizeof *m->lens);
    m->vals = calloc(m->cap, sizeof *m->vals);
    if (!m->keys || !m->lens || !m->vals) {
        tok_str_map_free(m);
        return -1;
    }
    return 0;
}

void tok_str_map_free(tok_str_map *m) {
    free(m->keys);
    free(m->lens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static int str_map_grow(tok_str_map *m) {
    tok_str_map big;
    if (tok_str_map_init(&big, m->cap) < 0)
        return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            tok_str_map_put(&big, m->keys[i], m->lens[i], m->vals[i]);
    tok_str_map_free(m);
    *m = big;
    return 0;
}

int tok_str_map_put(tok_str_map *m, const char *key, uint32_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && str_map_grow(m) < 0)
        return -1;
    size_t mask = m->cap - 1;
    for (size_t i = hash_bytes(key, len) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->lens[i] = len;
            m->vals[i] = val;
            m->n++;
            return 0;
        }
        if (m->lens[i] == len && memcmp(m->keys[i], key, len) == 0)
            return 1;
    }
}

int32_t tok_str_map_get(const tok_str_map *m, const char *key, size_t len) {
    if (!m->cap)
        return -1;
    size_t mask = m->cap - 1;
    for (size_t i = hash_bytes(key, len) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i])
            return -1;
        if (m->lens[i] == len && memcmp(m->keys[i], key, len) == 0)
            return m->vals[i];
    }
}

int tok_pair_map_init(tok_pair_map *m, size_t n_expected) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_cap(n_expected);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->rank = calloc(m->cap, sizeof *m->rank);
    m->merged = calloc(m->cap, sizeof *m->merged);
    if (!m->keys || !m->rank || !m->merged) {
        tok_pair_map_free(m);
        return -1;
    }
    return 0;
}

void tok_pair_map_free(tok_pair_map *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

int tok_pair_map_put(tok_pair_map *m, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    if ((m->n + 1) * 2 > m->cap) {
        tok_pair_map big;
        if (tok_pair_map_init(&big, m->cap) < 0)
            return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                uint64_t k = m->keys[i] - 1;
                tok_pair_map_put(&big, (int32_t)(k >> 32), (int32_t)(uint32_t)k, m->rank[i],
                                 m->merged[i]);
            }
        tok_pair_map_free(m);
        *m = big;
    }
    uint64_t key = pair_key(left, right);
    size_t mask = m->cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->rank[i] = rank;
            m->merged[i] = merged;
            m->n++;
            return 0;
        }
        if (m->keys[i] == key)
            return 1;
    }
}

int32_t tok_pair_map_get(const tok_pair_map *m, int32_t left, int32_t right, int32_t *merged) {
    if (!m->cap)
        return -1;
    uint64_t key = pair_key(left, right);
    size_t mask = m->cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        if (!m->keys[i])
            return -1;
        if (m->keys[i] == key) {
            *merged = m->merged[i];
            return m->rank[i];
        }
    }
}

int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

/* ---- construction ------------------------------------------------------------------ */

static int is_special_attr(int32_t attr) {
    return attr == COMET_TOKEN_CONTROL || attr == COMET_TOKEN_USER_DEFINED ||
           attr == COMET_TOKEN_UNKNOWN;
}

/* The decoded bytes of token `id` (see comet_tokenizer_token_bytes). Special tokens keep
 * their text verbatim; the rendering decision is made at decode time. */
static comet_status build_piece(comet_tokenizer *t, int id) {
    const char *s = t->text[id];
    size_t n = t->text_len[id];
    char *p = malloc(n + 1);
    if (!p)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    size_t m = 0;
    int32_t attr = t->attr[id];
    if (is_special_attr(attr)) {
        memcpy(p, s, n);
        m = n;
    } else if (t->type == COMET_TOK_BPE) {
        /* Byte-level: every code point stands for one byte; anything outside the table
         * (never in a well-formed vocabulary) is kept as its UTF-8. */
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            int k = tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
            int b = tok_cp_to_byte(cp);
            if (b >= 0) {
                p[m++] = (char)b;
            } else {
                memcpy(p + m, s + i, (size_t)k);
                m += (size_t)k;
            }
            i += (size_t)k;
        }
    } else {
        unsigned hex;
        char tail;
        if (attr == COMET_TOKEN_BYTE && n == 6 && sscanf(s, "<0x%2X>%c", &hex, &tail) == 1) {
            p[m++] = (char)hex;
        } else {
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) { /* "▁" */
                    p[m++] = ' ';
                    i += 3;
                } else {
                    p[m++] = s[i++];
                }
            }
        }
    }
    p[m] = '\0';
    t->piece[id] = p;
    t->piece_len[id] = (uint32_t)m;
    if ((int)m > t->max_piece_len)
        t->max_piece_len = (int)m;
    return COMET_OK;
}

/* Split "left right" at a space such that both halves are tokens; rank = index. */
static comet_status add_merge(comet_tokenizer *t, const char *merge, int rank) {
    size_t n = strlen(merge);
    for (size_t i = 1; i + 1 < n; i++) {
        if (merge[i] != ' ')
            continue;
        int32_t l = tok_str_map_get(&t->tok_map, merge, i);
        int32_t r = tok_str_map_get(&t->tok_map, merge + i + 1, n - i - 1);
        if (l < 0 || r < 0)
            continue;
        char stack[256];
        char *cat = n < sizeof stack ? stack : malloc(n);
        if (!cat)
            return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(cat, merge, i);
        memcpy(cat + i, merge + i + 1, n - i - 1);
        int32_t m = tok_str_map_get(&t->tok_map, cat, n - 1);
        if (cat != stack)
            free(cat);
        if (m < 0)
            return comet_set_error(COMET_ERR_FORMAT,
                                   "tokenizer merges[%d] \"%s\": the merged token is not in the "
                                   "vocabulary; every merge must produce a vocabulary token",
                                   rank, merge);
        if (tok_pair_map_put(&t->merges, l, r, rank, m) < 0)
            return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        return COMET_OK;
    }
    return comet_set_error(COMET_ERR_FORMAT,
                           "tokenizer merges[%d] \"%s\": not two vocabulary tokens separated "
                           "by a space",
                           rank, merge);
}

typedef struct special_key {
    uint8_t first;
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* Bucket the verbatim-matched tokens by first byte, longest first within a bucket. */
static comet_status build_specials(comet_tokenizer *t) {
    int n = 0;
    for (int i = 0; i < t->n_vocab; i++)
        n += is_special_attr(t->attr[i]) && t->text_len[i] > 0;
    special_key *keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
    t->special_ids = malloc((size_t)(n ? n : 1) * sizeof *t->special_ids);
    if (!keys || !t->special_ids) {
        free(keys);
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    }
    n = 0;
    for (int i = 0; i < t->n_vocab; i++)
        if (is_special_attr(t->attr[i]) && t->text_len[i] > 0)
            keys[n++] = (special_key){(uint8_t)t->text[i][0], t->text_len[i], i};
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    int j = 0;
    for (int b = 0; b < 256; b++) {
        t->special_start[b] = j;
        while (j < n && keys[j].first == b) {
            t->special_ids[j] = keys[j].id;
            j++;
        }
    }
    t->special_start[256] = n;
    free(keys);
    return COMET_OK;
}

void comet_tokenizer_free(comet_tokenizer *t) {
    if (!t)
        return;
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->text)
            free(t->text[i]);
        if (t->piece)
            free(t->piece[i]);
    }
    free(t->text);
    free(t->text_len);
    free(t->piece);
    free(t->piece_len);
    free(t->attr);
    free(t->scores);
    free(t->special_ids);
    free(t->ids_owner);
    tok_str_map_free(&t->tok_map);
    tok_pair_map_free(&t->merges);
    for (int i = 0; i < t->n_regex; i++)
        pcre2_code_free(t->regex[i]);
    free(t);
}

static comet_tokenizer *fail(comet_tokenizer *t) {
    comet_tokenizer_free(t);
    return NULL;
}

comet_tokenizer *comet_tokenizer_init(const comet_vocab_desc *d) {
    if (!d || d->type < 0 || d->type >= COMET_TOK_TYPE_COUNT) {
        comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: unknown tokenizer type");
        return NULL;
    }
    if (d->type == COMET_TOK_IDS) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "tokenizer: a vocabulary description cannot build an id-only "
                        "tokenizer; use comet_tokenizer_ids");
        return NULL;
    }
    if (d->n_tokens <= 0 || !d->tokens) {
        comet_set_error(COMET_ERR_FORMAT, "tokenizer: empty vocabulary (n_tokens = %d)",
                        d->n_tokens);
        return NULL;
    }
    if (d->n_merges < 0 || (d->n_merges > 0 && !d->merges)) {
        comet_set_error(COMET_ERR_FORMAT, "tokenizer: n_merges = %d without merges", d->n_merges);
        return NULL;
    }
    comet_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        return NULL;
    }
    int n = d->n_tokens;
    t->type = d->type;
    t->n_vocab = n;
    t->bos_id = d->bos_id;
    t->eos_id = d->eos_id;
    t->unk_id = d->unk_id;
    t->pad_id = d->pad_id;
    t->text = calloc((size_t)n, sizeof *t->text);
    t->text_len = calloc((size_t)n, sizeof *t->text_len);
    t->piece = calloc((size_t)n, sizeof *t->piece);
    t->piece_len = calloc((size_t)n, sizeof *t->piece_len);
    t->attr = malloc((size_t)n * sizeof *t->attr);
    if (!t->text || !t->text_len || !t->piece || !t->piece_len || !t->attr ||
        tok_str_map_init(&t->tok_map, (size_t)n) < 0 ||
        tok_pair_map_init(&t->merges, (size_t)d->n_merges) < 0) {
        comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        return fail(t);
    }
    if (d->scores) {
        t->scores = malloc((size_t)n * sizeof *t->scores);
        if (!t->scores) {
            comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return fail(t);
        }
        memcpy(t->scores, d->scores, (size_t)n * sizeof *t->scores);
    }
    for (int i = 0; i < n; i++) {
        const char *s = d->tokens[i];
        if (!s) {
            comet_set_error(COMET_ERR_FORMAT, "tokenizer: token %d is NULL", i);
            return fail(t);
        }
        int32_t attr = d->token_attr ? d->token_attr[i] : COMET_TOKEN_NORMAL;
        if (attr < 0 || attr >= COMET_TOKEN_ATTR_COUNT) {
            comet_set_error(COMET_ERR_FORMAT, "tokenizer: token %d has unknown type %d", i,
                            (int)attr);
            return fail(t);
        }
        t->attr[i] = attr;
        t->text[i] = strdup(s);
        if (!t->text[i]) {
            comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return fail(t);
        }
        t->text_len[i] = (uint32_t)strlen(s);
        int r = tok_str_map_put(&t->tok_map, t->text[i], t->text_len[i], i);
        if (r < 0) {
            comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return fail(t);
        }
        if (r == 1) {
            /* Real vocabularies repeat the odd control/unused token; the first id wins
             * for lookups. Two normal tokens with one text would make merges ambiguous. */
            int32_t prev = tok_str_map_get(&t->tok_map, s, t->text_len[i]);
            if (attr == COMET_TOKEN_NORMAL && t->attr[prev] == COMET_TOKEN_NORMAL) {
                comet_set_error(COMET_ERR_FORMAT,
                                "tokenizer: tokens %d and %d are both \"%s\"; a vocabulary "
                                "needs distinct normal tokens",
                                (int)prev, i, s);
                return fail(t);
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (build_piece(t, i) < 0)
            return fail(t);
    for (int i = 0; i < d->n_merges; i++) {
        if (!d->merges[i]) {
            comet_set_error(COMET_ERR_FORMAT, "tokenizer merges[%d] is NULL", i);
            return fail(t);
        }
        if (add_merge(t, d->merges[i], i) < 0)
            return fail(t);
    }
    t->n_merges = d->n_merges;
    const int32_t *ids[] = {&d->bos_id, &d->eos_id, &d->unk_id, &d->pad_id};
    const char *names[] = {"bos", "eos", "unk", "pad"};
    for (int k = 0; k < 4; k++)
        if (*ids[k] < -1 || *ids[k] >= n) {
            comet_set_error(COMET_ERR_FORMAT, "tokenizer: %s id %d outside the vocabulary [0, %d)",
                            names[k], (int)*ids[k], n);
            return fail(t);
        }
    for (int b = 0; b < 256; b++) {
        char buf[8];
        if (t->type == COMET_TOK_BPE) {
            int k = tok_utf8_encode(tok_byte_to_cp((uint8_t)b), buf);
            t->byte_id[b] = tok_str_map_get(&t->tok_map, buf, (size_t)k);
        } else {
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_id[b] = tok_str_map_get(&t->tok_map, buf, 6);
        }
    }
    if (build_specials(t) < 0)
        return fail(t);
    if (t->type == COMET_TOK_BPE) {
        if (tok_bpe_set_pre(t, d->pre) < 0)
            return fail(t);
    } else {
        t->spm_prefix = d->no_space_prefix ? TOK_SPM_PREFIX_NEVER : TOK_SPM_PREFIX_ALWAYS;
        t->byte_fallback = 1;
    }
    return t;
}

/* An id-only tokenizer reuses the decoding tables (text, piece, attr) so that
 * comet_tokenizer_token_bytes and the streaming detokenizer work unchanged; it has no
 * token map, merges or special-token buckets, and encoding refuses text. */
comet_tokenizer *comet_tokenizer_ids(const char *kind, const char *name, int n_vocab,
                                     int32_t bos_id, int32_t eos_id) {
    if (n_vocab <= 0) {
        comet_set_error(COMET_ERR_INVALID_ARG, "id tokenizer: n_vocab = %d, expected > 0",
                        n_vocab);
        return NULL;
    }
    if (bos_id < -1 || bos_id >= n_vocab || eos_id < -1 || eos_id >= n_vocab) {
        comet_set_error(COMET_ERR_INVALID_ARG,
                        "id tokenizer: bos %d / eos %d outside the vocabulary [0, %d)",
                        (int)bos_id, (int)eos_id, n_vocab);
        return NULL;
    }
    comet_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        return NULL;
    }
    t->type = COMET_TOK_IDS;
    t->n_vocab = n_vocab;
    t->bos_id = bos_id;
    t->eos_id = eos_id;
    t->unk_id = t->pad_id = -1;
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    size_t n_owner = strlen(kind ? kind : "") + strlen(name ? name : "") + 8;
    t->ids_owner = malloc(n_owner);
    t->text = calloc((size_t)n_vocab, sizeof *t->text);
    t->text_len = calloc((size_t)n_vocab, sizeof *t->text_len);
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)n_vocab, sizeof *t->piece_len);
    t->attr = malloc((size_t)n_vocab * sizeof *t->attr);
    if (!t->ids_owner || !t->text || !t->text_len || !t->piece || !t->piece_len || !t->attr) {
        comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        return fail(t);
    }
    snprintf(t->ids_owner, n_owner, "%s model %s", kind ? kind : "", name ? name : "");
    for (int i = 0; i < n_vocab; i++) {
        char buf[24];
        int n = snprintf(buf, sizeof buf, " <%d>", i);
        t->piece[i] = strdup(buf);
        t->text[i] = strdup(buf + 1);
        if (!t->piece[i] || !t->text[i]) {
            comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            return fail(t);
        }
        t->piece_len[i] = (uint32_t)n;
        t->text_len[i] = (uint32_t)n - 1;
        t->attr[i] = i == bos_id || i == eos_id ? COMET_TOKEN_CONTROL : COMET_TOKEN_NORMAL;
        if (n > t->max_piece_len)
            t->max_piece_len = n;
    }
    return t;
}

int comet_tokenizer_n_vocab(const comet_tokenizer *t) { return t->n_vocab; }

int comet_tokenizer_max_token_bytes(const comet_tokenizer *t) { return t->max_piece_len; }

int32_t comet_tokenizer_find(const comet_tokenizer *t, const char *token) {
    return tok_str_map_get(&t->tok_map, token, strlen(token));
}

int32_t comet_tokenizer_special_id(const comet_tokenizer *t, comet_special_token which) {
    switch (which) {
    case COMET_SPECIAL_BOS: return t->bos_id;
    case COMET_SPECIAL_EOS: return t->eos_id;
    case COMET_SPECIAL_UNK: return t->unk_id;
    case COMET_SPECIAL_PAD: return t->pad_id;
    default: return -1;
    }
}

comet_status comet_tokenizer_set_special(comet_tokenizer *t, comet_special_token which,
                                         int32_t id) {
    if (id < -1 || id >= t->n_vocab)
        return comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: special id %d outside [0, %d)",
                               (int)id, t->n_vocab);
    switch (which) {
    case COMET_SPECIAL_BOS: t->bos_id = id; break;
    case COMET_SPECIAL_EOS: t->eos_id = id; break;
    case COMET_SPECIAL_UNK: t->unk_id = id; break;
    case COMET_SPECIAL_PAD: t->pad_id = id; break;
    default:
        return comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: unknown special token %d",
                               (int)which);
    }
    return COMET_OK;
}

int comet_tokenizer_token_attr(const comet_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab)
        return comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: token id %d outside [0, %d)",
                               (int)id, t->n_vocab);
    return t->attr[id];
}

int comet_tokenizer_token_bytes(const comet_tokenizer *t, int32_t id, int render_special, char *buf,
                                size_t cap) {
    if (id < 0 || id >= t->n_vocab)
        return comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: token id %d outside [0, %d)",
                               (int)id, t->n_vocab);
    int32_t attr = t->attr[id];
    size_t n = t->piece_len[id];
    if (!render_special && (attr == COMET_TOKEN_CONTROL || attr == COMET_TOKEN_UNKNOWN))
        n = 0;
    if (buf && cap)
        memcpy(buf, t->piece[id], n < cap ? n : cap);
    return (int)n;
}

/* ---- encoding ---------------------------------------------------------------------- */

static comet_status encode_segment(const comet_tokenizer *t, const char *s, size_t n, int first,
                                   tok_ids *out) {
    if (t->type == COMET_TOK_BPE)
        return n ? tok_bpe_encode_segment(t, s, n, out) : COMET_OK;
    return tok_spm_encode_segment(t, s, n, first, out);
}

/* Longest special token starting at s[0..n) that may be matched, or -1. */
static int32_t match_special(const comet_tokenizer *t, const char *s, size_t n, int parse_special) {
    uint8_t b = (uint8_t)s[0];
    for (int j = t->special_start[b]; j < t->special_start[b + 1]; j++) {
        int32_t id = t->special_ids[j];
        if (!parse_special && t->attr[id] != COMET_TOKEN_USER_DEFINED)
            continue;
        if (t->text_len[id] <= n && memcmp(s, t->text[id], t->text_len[id]) == 0)
            return id;
    }
    return -1;
}

comet_status comet_tokenizer_encode(const comet_tokenizer *t, const char *text, size_t len,
                                    int parse_special, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (t->type == COMET_TOK_IDS)
        return comet_set_error(COMET_ERR_INVALID_ARG, "%s has no vocabulary: send token ids",
                               t->ids_owner);
    if (!text && len)
        return comet_set_error(COMET_ERR_INVALID_ARG, "tokenizer: NULL text of %zu bytes", len);
    tok_ids out = {0};
    comet_status st = COMET_OK;
    size_t seg = 0;
    int have_specials = t->special_start[256] > 0;
    for (size_t i = 0; have_specials && i < len; i++) {
        int32_t id = match_special(t, text + i, len - i, parse_special);
        if (id < 0)
            continue;
        st = encode_segment(t, text + seg, i - seg, seg == 0, &out);
        if (st < 0)
            goto done;
        if (tok_ids_push(&out, id) < 0) {
            st = comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
            goto done;
        }
        i += t->text_len[id] - 1;
        seg = i + 1;
    }
    if (seg < len || seg == 0)
        st = encode_segment(t, text + seg, len - seg, seg == 0, &out);
done:
    if (st < 0) {
        free(out.v);
        return st;
    }
    if (!out.v)
        out.v = malloc(sizeof *out.v); /* a valid pointer even for zero ids */
    if (!out.v)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    *ids = out.v;
    *n_ids = out.n;
    return COMET_OK;
}
