/* detok.c — streaming detokenization: ids in, complete UTF-8 characters out.
 *
 * A byte-level token may end in the middle of a character (an emoji is often four byte
 * tokens), so bytes of an unfinished character are held in comet_detok.pending until the
 * rest arrives. Bytes that can never become a valid character are replaced by U+FFFD
 * one by one, as Python's bytes.decode("utf-8", "replace") does.
 *
 * SentencePiece's dummy prefix: the space the encoder put before the text is dropped from
 * the first piece of the whole text only (the first token with text; BOS and other control
 * tokens have none). A generation continues its prompt, so the detokenizer is primed with
 * the prompt (comet_detok_prime) and the first generated " world" keeps its space.
 */
#include <stdlib.h>
#include <string.h>

#include "comet/tokenizer.h"
#include "tokenizer/tok_internal.h"

static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

void comet_detok_init(comet_detok *d, const comet_tokenizer *tok) {
    memset(d, 0, sizeof *d);
    d->tok = tok;
}

/* Whether a piece with text pushed now would start the text and lose its dummy-prefix
 * space. */
static int at_dummy_prefix(const comet_detok *d) {
    return d->tok->type == COMET_TOK_SPM && d->tok->spm_prefix != TOK_SPM_PREFIX_NEVER &&
           !d->text_started;
}

int comet_detok_prime(comet_detok *d, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int k = comet_tokenizer_token_bytes(d->tok, ids[i], 0, NULL, 0);
        if (k < 0)
            return k;
        if (k > 0)
            d->text_started = 1;
    }
    return 0;
}

int comet_detok_piece(const comet_detok *d, int32_t id, int render_special, char *buf, size_t cap) {
    const comet_tokenizer *t = d->tok;
    int n_text = comet_tokenizer_token_bytes(t, id, 0, NULL, 0);
    if (n_text < 0)
        return n_text;
    const char *p = t->piece[id];
    size_t n = (size_t)comet_tokenizer_token_bytes(t, id, render_special, NULL, 0);
    if (n_text > 0 && at_dummy_prefix(d) && p[0] == ' ') {
        p++; /* the dummy-prefix space, as comet_detok_push drops it */
        n--;
    }
    if (buf && cap)
        memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

/* Expected length of the character starting with byte c, or 0 if c cannot start one. */
static int utf8_len(uint8_t c) {
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Write the complete characters of s[0..n) to out (or only count them when out is NULL);
 * returns the bytes written and sets *hold to the length of an unfinished final character
 * that could still be completed. */
static size_t emit_complete(const uint8_t *s, size_t n, char *out, size_t *hold) {
    size_t o = 0, i = 0;
    *hold = 0;
    while (i < n) {
        int len = utf8_len(s[i]);
        if (len > 0 && i + (size_t)len > n) {
            int ok = 1;
            for (size_t j = i + 1; j < n; j++)
                ok &= (s[j] & 0xC0) == 0x80;
            if (ok) {
                *hold = n - i;
                break;
            }
        }
        uint32_t cp = 0xFFFFFFFFu;
        int k = len > 0 ? tok_utf8_decode(s + i, n - i, &cp) : 1;
        if (cp == 0xFFFFFFFFu) {
            if (out)
                memcpy(out + o, fffd, 3);
            o += 3;
            i++;
            continue;
        }
        if (out)
            memcpy(out + o, s + i, (size_t)k);
        o += (size_t)k;
        i += (size_t)k;
    }
    return o;
}

int comet_detok_push(comet_detok *d, int32_t id, char *out, size_t cap) {
    const comet_tokenizer *t = d->tok;
    int n_piece = comet_tokenizer_token_bytes(t, id, 0, NULL, 0);
    if (n_piece < 0)
        return n_piece;
    size_t n = (size_t)d->n_pending + (size_t)n_piece;
    uint8_t stack[512];
    uint8_t *buf = n <= sizeof stack ? stack : malloc(n);
    if (!buf)
        return comet_set_error(COMET_ERR_NOMEM, "detok: out of memory");
    memcpy(buf, d->pending, (size_t)d->n_pending);
    comet_tokenizer_token_bytes(t, id, 0, (char *)buf + d->n_pending, (size_t)n_piece);
    const uint8_t *s = buf;
    if (at_dummy_prefix(d) && n > 0 && s[0] == ' ') {
        s++; /* SentencePiece drops the dummy-prefix space at the start of the text */
        n--;
    }
    size_t hold, need = emit_complete(s, n, NULL, &hold);
    if (need + 1 > cap) {
        if (buf != stack)
            free(buf);
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "detok: output buffer of %zu bytes is too small for token %d "
                               "(needs %zu)",
                               cap, (int)id, need + 1);
    }
    size_t o = emit_complete(s, n, out, &hold);
    out[o] = '\0';
    memcpy(d->pending, s + n - hold, hold);
    d->n_pending = (int)hold;
    if (n_piece > 0)
        d->text_started = 1;
    if (buf != stack)
        free(buf);
    return (int)o;
}

int comet_detok_flush(comet_detok *d, char *out, size_t cap) {
    if (cap < 4)
        return comet_set_error(COMET_ERR_INVALID_ARG, "detok: output buffer too small");
    int o = 0;
    if (d->n_pending > 0) {
        memcpy(out, fffd, 3);
        o = 3;
    }
    d->n_pending = 0;
    out[o] = '\0';
    return o;
}
