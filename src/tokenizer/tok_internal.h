/* tok_internal.h — the tokenizer's private state shared by its source files.
 *
 * tokenizer.c owns construction, the token<->id maps and special-token splitting;
 * bpe.c the byte-level pre-tokenizer (PCRE2) and rank-ordered merging; spm.c the
 * SentencePiece-style encoder; detok.c streaming decoding; hf_json.c the tokenizer.json
 * reader. Nothing here is part of the public API.
 */
#ifndef COMET_TOK_INTERNAL_H
#define COMET_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stddef.h>
#include <stdint.h>

#include "comet/tokenizer.h"

/* Open-addressing map from a byte string (borrowed, must outlive the map) to an id. */
typedef struct tok_str_map {
    const char **keys; /* [cap] NULL = empty slot */
    uint32_t *lens;    /* [cap] */
    int32_t *vals;     /* [cap] */
    size_t cap;        /* power of two */
    size_t n;
} tok_str_map;

/* Open-addressing map from a pair of token ids to (merge rank, merged id). */
typedef struct tok_pair_map {
    uint64_t *keys; /* [cap] (left << 32 | right) + 1; 0 = empty slot */
    int32_t *rank;  /* [cap] */
    int32_t *merged;
    size_t cap;
    size_t n;
} tok_pair_map;

int tok_str_map_init(tok_str_map *m, size_t n_expected);
void tok_str_map_free(tok_str_map *m);
/* Insert; returns 0, 1 if the key already existed (value left unchanged), -1 on OOM. */
int tok_str_map_put(tok_str_map *m, const char *key, uint32_t len, int32_t val);
int32_t tok_str_map_get(const tok_str_map *m, const char *key, size_t len); /* -1 if absent */

int tok_pair_map_init(tok_pair_map *m, size_t n_expected);
void tok_pair_map_free(tok_pair_map *m);
/* Insert; returns 0, 1 if the pair already existed (first rank kept), -1 on OOM. */
int tok_pair_map_put(tok_pair_map *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* Rank of merging (left, right) and the merged id in *merged; -1 if no such merge. */
int32_t tok_pair_map_get(const tok_pair_map *m, int32_t left, int32_t right, int32_t *merged);

/* How SentencePiece-style text is turned into "▁"-spaced text before merging. */
typedef enum tok_spm_prefix {
    TOK_SPM_PREFIX_ALWAYS, /* "▁" before every raw-text segment (SentencePiece, llama.cpp) */
    TOK_SPM_PREFIX_FIRST,  /* only before the segment that starts the text */
    TOK_SPM_PREFIX_NEVER,
} tok_spm_prefix;

#define TOK_MAX_REGEX 4

struct comet_tokenizer {
    comet_tok_type type;
    int n_vocab;
    char **text;         /* [n_vocab] token strings as given (NUL-terminated, owned) */
    uint32_t *text_len;  /* [n_vocab] */
    char **piece;        /* [n_vocab] decoded bytes of each token (owned, may hold NUL) */
    uint32_t *piece_len; /* [n_vocab] */
    int32_t *attr;       /* [n_vocab] comet_token_attr */
    float *scores;       /* [n_vocab] or NULL */
    int max_piece_len;
    tok_str_map tok_map;
    tok_pair_map merges; /* empty for score-driven SPM */
    int n_merges;
    int32_t byte_id[256]; /* BPE: id of the byte's mapped char; SPM: id of <0xXX>; -1 */
    int32_t bos_id, eos_id, unk_id, pad_id;

    /* Tokens matched verbatim before pre-tokenization, bucketed by first byte, each bucket
     * sorted longest first. */
    int32_t *special_ids; /* all matchable ids grouped by first byte */
    int32_t special_start[257];

    /* BPE pre-tokenizer: the regexes applied in sequence (each splits the pieces of the
     * previous one into matches and gaps, both kept). */
    int n_regex;
    pcre2_code *regex[TOK_MAX_REGEX];
    int ignore_merges; /* a word that is itself a token is not merged (Llama-3) */

    /* SPM options. */
    tok_spm_prefix spm_prefix;
    int spm_split;              /* split the text at "▁" into words before merging (Metaspace) */
    int spm_prefix_if_no_space; /* Metaspace: no "▁" prepended to text starting with a space */
    int byte_fallback;          /* unknown characters become <0xXX> tokens (else unk) */

    /* COMET_TOK_IDS: what encoding's refusal names ("synthetic model llama3-8b"). */
    char *ids_owner;
};

/* A growable id array used while encoding. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

int tok_ids_push(tok_ids *a, int32_t id); /* 0 or -1 on OOM */

/* Set up the BPE pre-tokenizer by name (NULL = llama.cpp's default). */
comet_status tok_bpe_set_pre(struct comet_tokenizer *t, const char *pre);
/* Use a caller-given sequence of regexes (from tokenizer.json). */
comet_status tok_bpe_set_regexes(struct comet_tokenizer *t, const char *const *patterns, int n);
/* The GPT-2 byte <-> code point table. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the table */
/* Decode one UTF-8 character at s[0..n); returns its length (1 for an invalid byte, with
 * *cp = 0xFFFFFFFF). */
int tok_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
int tok_utf8_encode(uint32_t cp, char *out);

/* Encode one raw-text segment (no special tokens in it). `first` says whether the segment
 * starts the text. Both return 0 or a negative status. */
comet_status tok_bpe_encode_segment(const struct comet_tokenizer *t, const char *s, size_t n,
                                    tok_ids *out);
/* Merge the characters of s[0..n) by merge rank (HF BPE on characters); characters that
 * are not tokens become <0xXX> byte tokens (byte_fallback) or unk. */
comet_status tok_merge_chars(const struct comet_tokenizer *t, const char *s, size_t n,
                             tok_ids *out);
comet_status tok_spm_encode_segment(const struct comet_tokenizer *t, const char *s, size_t n,
                                    int first, tok_ids *out);

#endif
