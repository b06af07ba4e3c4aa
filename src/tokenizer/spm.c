/* spm.c — SentencePiece-style BPE (Llama-2 vocabularies).
 *
 * Text is normalized the SentencePiece way: spaces become "▁" (U+2581) and a "▁" is
 * prepended (add_dummy_prefix). Two ways to merge:
 *  - by score (GGUF tokenizer.ggml.scores; merges, if any, are ignored as llama.cpp does):
 *    starting from single characters, repeatedly join the adjacent pair whose
 *    concatenation is a token with the highest score (leftmost on ties), as
 *    SentencePiece's BPE model does;
 *  - by merge rank when there are no scores (tokenizer.json BPE with byte_fallback): HF
 *    BPE on characters.
 * Characters that end up outside the vocabulary become <0xXX> byte tokens (byte fallback)
 * or unk.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct spm_sym {
    uint32_t off, len; /* bytes in the normalized text; len 0 = merged away */
    int32_t prev, next;
} spm_sym;

typedef struct spm_cand {
    float score;
    int32_t left;
    uint32_t len; /* combined length when queued (stale entries are skipped) */
} spm_cand;

static int spm_better(const spm_cand *a, const spm_cand *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct spm_heap {
    spm_cand *v;
    size_t n;
} spm_heap;

static void spm_push(spm_heap *h, spm_cand c) {
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!spm_better(&c, &h->v[p]))
            break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
}

static spm_cand spm_pop(spm_heap *h) {
    spm_cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const spm_cand *best = &last;
        if (l < h->n && spm_better(&h->v[l], best))
            m = l, best = &h->v[l];
        if (r < h->n && spm_better(&h->v[r], best))
            m = r;
        if (m == i)
            break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n)
        h->v[i] = last;
    return top;
}

static void spm_try_pair(const struct comet_tokenizer *t, const char *s, const spm_sym *sym,
                         spm_heap *h, int32_t left) {
    if (left < 0 || sym[left].next < 0)
        return;
    const spm_sym *a = &sym[left], *b = &sym[a->next];
    int32_t id = tok_str_map_get(&t->tok_map, s + a->off, a->len + b->len);
    if (id < 0)
        return;
    spm_push(h, (spm_cand){t->scores[id], left, a->len + b->len});
}

static comet_status push_id(tok_ids *out, int32_t id) {
    if (tok_ids_push(out, id) < 0)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    return COMET_OK;
}

/* Score-driven merging of one normalized word s[0..n). */
static comet_status spm_merge_scores(const struct comet_tokenizer *t, const char *s, size_t n,
                                     tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    spm_sym *sym = malloc(n * sizeof *sym);
    spm_heap h = {malloc(3 * n * sizeof *h.v), 0};
    comet_status st = COMET_OK;
    if (!sym || !h.v) {
        st = comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
        goto done;
    }
    int32_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = tok_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        sym[k] = (spm_sym){(uint32_t)i, (uint32_t)len, k - 1, -1};
        if (k > 0)
            sym[k - 1].next = k;
        k++;
        i += (size_t)len;
    }
    for (int32_t i = 0; i + 1 < k; i++)
        spm_try_pair(t, s, sym, &h, i);
    while (h.n) {
        spm_cand c = spm_pop(&h);
        spm_sym *a = &sym[c.left];
        if (a->len == 0 || a->next < 0)
            continue;
        spm_sym *b = &sym[a->next];
        if (b->len == 0 || a->len + b->len != c.len)
            continue;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            sym[b->next].prev = c.left;
        spm_try_pair(t, s, sym, &h, a->prev);
        spm_try_pair(t, s, sym, &h, c.left);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        int32_t id = tok_str_map_get(&t->tok_map, s + sym[i].off, sym[i].len);
        if (id >= 0) {
            if ((st = push_id(out, id)) < 0)
                goto done;
            continue;
        }
        int ok = t->byte_fallback;
        for (uint32_t j = 0; ok && j < sym[i].len; j++)
            ok = t->byte_id[(uint8_t)s[sym[i].off + j]] >= 0;
        if (ok) {
            for (uint32_t j = 0; j < sym[i].len; j++)
                if ((st = push_id(out, t->byte_id[(uint8_t)s[sym[i].off + j]])) < 0)
                    goto done;
        } else if (t->unk_id >= 0 && (st = push_id(out, t->unk_id)) < 0) {
            goto done;
        }
    }
done:
    free(sym);
    free(h.v);
    return st;
}

static comet_status spm_word(const struct comet_tokenizer *t, const char *s, size_t n,
                             tok_ids *out) {
    if (t->scores)
        return spm_merge_scores(t, s, n, out);
    return tok_merge_chars(t, s, n, out);
}

comet_status tok_spm_encode_segment(const struct comet_tokenizer *t, const char *s, size_t n,
                                    int first, tok_ids *out) {
    if (n == 0)
        return COMET_OK;
    int prefix = (t->spm_prefix == TOK_SPM_PREFIX_ALWAYS ||
                  (t->spm_prefix == TOK_SPM_PREFIX_FIRST && first)) &&
                 !(t->spm_prefix_if_no_space && s[0] == ' ');
    size_t n_space = 0;
    for (size_t i = 0; i < n; i++)
        n_space += s[i] == ' ';
    size_t m = n + 2 * n_space + (prefix ? 3 : 0);
    char *buf = malloc(m);
    if (!buf)
        return comet_set_error(COMET_ERR_NOMEM, "tokenizer: out of memory");
    size_t j = 0;
    if (prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        j = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + j, "\xe2\x96\x81", 3);
            j += 3;
        } else {
            buf[j++] = s[i];
        }
    }
    comet_status st = COMET_OK;
    if (!t->spm_split) {
        st = spm_word(t, buf, m, out);
    } else {
        /* Metaspace split: every "▁" starts a new word. */
        size_t start = 0;
        for (size_t i = 1; i + 3 <= m && st >= 0; i++) {
            if (memcmp(buf + i, "\xe2\x96\x81", 3) == 0) {
                st = spm_word(t, buf + start, i - start, out);
                start = i;
                i += 2;
            }
        }
        if (st >= 0)
            st = spm_word(t, buf + start, m - start, out);
    }
    free(buf);
    return st;
}
