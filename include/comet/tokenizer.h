/* comet/tokenizer.h — text <-> token ids, streaming detokenization, chat templates.
 *
 * Two algorithms: byte-level BPE (GPT-2 / Llama-3 / SmolLM style: a pre-tokenizer regex
 * run through PCRE2, bytes mapped to printable code points, merges applied by rank) and
 * SentencePiece-style BPE (Llama-2 GGUF vocabularies: scores, "▁" for spaces, <0xXX> byte
 * fallback). Special/added tokens are matched verbatim before BPE when requested.
 * Built from a neutral description so that the GGUF reader (tokenizer.ggml.* keys) and
 * the tokenizer.json reader share one constructor.
 */
#ifndef COMET_TOKENIZER_H
#define COMET_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "comet/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct comet_tokenizer comet_tokenizer;

typedef enum comet_tok_type {
    COMET_TOK_BPE, /* byte-level BPE (GGUF tokenizer.ggml.model = "gpt2") */
    COMET_TOK_SPM, /* SentencePiece BPE (GGUF tokenizer.ggml.model = "llama") */
    COMET_TOK_IDS, /* no vocabulary: token-id prompts only (comet_tokenizer_ids) */
    COMET_TOK_TYPE_COUNT
} comet_tok_type;

/* Token attributes, numbered as GGUF's tokenizer.ggml.token_type. */
typedef enum comet_token_attr {
    COMET_TOKEN_UNDEFINED = 0,
    COMET_TOKEN_NORMAL = 1,
    COMET_TOKEN_UNKNOWN = 2,
    COMET_TOKEN_CONTROL = 3,
    COMET_TOKEN_USER_DEFINED = 4,
    COMET_TOKEN_UNUSED = 5,
    COMET_TOKEN_BYTE = 6,
    COMET_TOKEN_ATTR_COUNT
} comet_token_attr;

/* What a tokenizer is built from. All pointers are borrowed for the duration of
 * comet_tokenizer_init only; the tokenizer copies what it keeps. */
typedef struct comet_vocab_desc {
    comet_tok_type type;
    int n_tokens;
    const char *const *tokens; /* [n_tokens] UTF-8 token strings (byte-level encoded for BPE) */
    const int32_t *token_attr; /* [n_tokens] comet_token_attr, or NULL (all NORMAL) */
    const float *scores;       /* [n_tokens] SPM merge scores, or NULL */
    int n_merges;
    const char *const *merges; /* [n_merges] "left right", rank = index (BPE) */
    const char *pre;           /* pre-tokenizer name ("gpt2", "llama3", "smollm", ...) or NULL */
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int no_space_prefix; /* SPM: set when GGUF tokenizer.ggml.add_space_prefix is false
                                  * (default 0: "▁" is prepended as SentencePiece does) */
} comet_vocab_desc;

/* Build a tokenizer. Returns NULL with comet_last_error() set on a malformed description
 * (two NORMAL tokens with one text, merge naming an unknown token or producing one outside
 * the vocabulary, unknown pre-tokenizer name, ids out of range). A repeated control/unused
 * token text is accepted; lookups by text give its first id.
 * Pre-tokenizer names (GGUF tokenizer.ggml.pre): "gpt2"/"gpt-2"/"mpt"/"olmo"/"jais";
 * "llama3"/"llama-bpe"/"dbrx"/"smaug-bpe"; "smollm"/"starcoder"/"refact"/"command-r"/
 * "codeshell"/"exaone"/"minerva-7b" (digits split one by one, then GPT-2);
 * "qwen2"/"stablelm2"; NULL or "default" (llama.cpp's default). */
comet_tokenizer *comet_tokenizer_init(const comet_vocab_desc *desc);

/* A tokenizer for a model without a vocabulary (a synthetic benchmark model): it takes
 * token-id prompts only. Encoding any text fails with COMET_ERR_INVALID_ARG and the message
 * "<kind> model <name> has no vocabulary: send token ids", so text prompts and chat
 * templates are refused by name. Decoding is fixed and documented: token i (0 <= i <
 * n_vocab) decodes to the text " <i>" (a space, '<', i in decimal, '>'), e.g. 42 -> " <42>";
 * `bos_id` and `eos_id` (-1 when absent) are control tokens, so they decode to "" unless
 * special tokens are rendered. `kind` ("synthetic") and `name` ("llama3-8b") are copied.
 * Returns NULL with comet_last_error() set for n_vocab <= 0, an id outside the vocabulary
 * or out of memory. Free with comet_tokenizer_free. */
comet_tokenizer *comet_tokenizer_ids(const char *kind, const char *name, int n_vocab,
                                     int32_t bos_id, int32_t eos_id);

/* Read an HF tokenizer.json (model.type "BPE" with byte-level pre-tokenizer, or
 * SentencePiece-style BPE with byte fallback) plus added_tokens. NULL + last error on
 * failure (names the file and field). */
comet_tokenizer *comet_tokenizer_from_hf_json(const char *path);

void comet_tokenizer_free(comet_tokenizer *tok);

int comet_tokenizer_n_vocab(const comet_tokenizer *tok);

/* Length in bytes of the longest decoded token (comet_tokenizer_token_bytes). */
int comet_tokenizer_max_token_bytes(const comet_tokenizer *tok);

typedef enum comet_special_token {
    COMET_SPECIAL_BOS,
    COMET_SPECIAL_EOS,
    COMET_SPECIAL_UNK,
    COMET_SPECIAL_PAD,
    COMET_SPECIAL_COUNT
} comet_special_token;

/* Id of the BOS/EOS/UNK/PAD token given at construction, or -1. */
int32_t comet_tokenizer_special_id(const comet_tokenizer *tok, comet_special_token which);

/* Set the BOS/EOS/UNK/PAD id (tokenizer.json does not carry BOS/EOS; the HF loader takes
 * them from tokenizer_config.json / config.json). id -1 clears it. Returns
 * COMET_ERR_INVALID_ARG for an id outside the vocabulary. */
comet_status comet_tokenizer_set_special(comet_tokenizer *tok, comet_special_token which,
                                         int32_t id);

/* comet_token_attr of `id`, or COMET_ERR_INVALID_ARG for an id out of range. */
int comet_tokenizer_token_attr(const comet_tokenizer *tok, int32_t id);

/* Encode `len` bytes of UTF-8 `text` into ids (a COMET_TOK_IDS tokenizer refuses all text
 * with COMET_ERR_INVALID_ARG, see comet_tokenizer_ids). When `parse_special` is non-zero, the
 * text of control/user-defined tokens ("<|im_start|>") becomes that token; otherwise it
 * is tokenized as plain text (user-defined added tokens are always matched, as in HF and
 * llama.cpp). No BOS is added here. On success *ids is a malloc'd array of *n_ids ids owned
 * by the caller (non-NULL even when *n_ids is 0). Invalid UTF-8 is encoded byte-wise,
 * never refused; a byte that has no byte-level token in the vocabulary (e.g. 0xFF in
 * vocabularies trained on valid UTF-8) is encoded as U+FFFD. */
comet_status comet_tokenizer_encode(const comet_tokenizer *tok, const char *text, size_t len,
                                    int parse_special, int32_t **ids, size_t *n_ids);

/* The raw bytes of one token as it appears in decoded text (byte-level decoding applied,
 * "▁" -> space for SPM, <0xXX> -> that byte). Control tokens give their text only when
 * `render_special` is non-zero, else "". Writes at most `cap` bytes to `buf`; returns the
 * number of bytes of the piece (which may exceed cap: then buf holds a prefix) or a
 * negative status for an id out of range. */
int comet_tokenizer_token_bytes(const comet_tokenizer *tok, int32_t id, int render_special,
                                char *buf, size_t cap);

/* Id of a token's exact string, or -1. */
int32_t comet_tokenizer_find(const comet_tokenizer *tok, const char *token);

/* Streaming detokenizer: feed ids one by one, get back only complete UTF-8 characters;
 * bytes of a character split across tokens are held until complete. For SPM, the leading
 * (dummy-prefix) space of the first piece of the whole text is dropped, as SentencePiece
 * does: the first token with text (control tokens such as BOS have none). A generation
 * continues its prompt, so prime the detokenizer with the prompt (comet_detok_prime): then
 * prompt text + generated text == the decoding of prompt ids + generated ids. */
typedef struct comet_detok {
    const comet_tokenizer *tok;
    char pending[8];
    int n_pending;
    int text_started; /* a token with text has been consumed: no dummy prefix to drop */
} comet_detok;

void comet_detok_init(comet_detok *d, const comet_tokenizer *tok);

/* Continue after `ids` (a prompt) that are already text: nothing is output, and the next
 * piece is decoded as following them (its leading space is kept unless no id of `ids` has
 * text). Call right after comet_detok_init. Bytes of a character left unfinished at the
 * end of `ids` are not carried over. Returns 0, or a negative status for an id out of
 * range. */
int comet_detok_prime(comet_detok *d, const int32_t *ids, size_t n);

/* The bytes of token `id` as they appear at this point of the text, for per-token strings
 * (echo and logprobs): comet_tokenizer_token_bytes, less the SPM dummy-prefix space when
 * `id` would be the first token with text (so the dummy-prefix token "▁" alone gives "").
 * Does not advance `d`: follow with comet_detok_prime(d, &id, 1) or comet_detok_push.
 * Same return and `cap` rules as comet_tokenizer_token_bytes. */
int comet_detok_piece(const comet_detok *d, int32_t id, int render_special, char *buf, size_t cap);

/* Append the complete characters decoded so far to `out` (capacity `cap`, NUL-terminated);
 * returns the number of bytes written (excluding NUL). Control tokens give "". Bytes that
 * can never form a valid UTF-8 character are emitted as U+FFFD each.
 * Room needed: the token's bytes plus held bytes (<= 3) plus the NUL, and 2 more per
 * invalid byte; `cap` >= 3 * (comet_tokenizer_max_token_bytes(tok) + 3) + 1 always
 * suffices (253 for SmolLM2). With less room COMET_ERR_INVALID_ARG is returned and nothing
 * is consumed. Returns a negative status for an id out of range. */
int comet_detok_push(comet_detok *d, int32_t id, char *out, size_t cap);

/* Flush held bytes at the end of a stream (an incomplete character is emitted as U+FFFD). */
int comet_detok_flush(comet_detok *d, char *out, size_t cap);

/* Chat templates. */
typedef enum comet_chat_template {
    COMET_CHAT_CHATML, /* <|im_start|>role\ncontent<|im_end|>\n (SmolLM2, Qwen) */
    COMET_CHAT_LLAMA3, /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    COMET_CHAT_LLAMA2, /* <s>[INST] <<SYS>>...<</SYS>> user [/INST] */
    COMET_CHAT_TEMPLATE_COUNT
} comet_chat_template;

typedef struct comet_chat_message {
    const char *role;    /* "system", "user", "assistant" */
    const char *content; /* UTF-8 */
} comet_chat_message;

/* Pick the template kind from a model's Jinja template string (by its markers).
 * Returns COMET_ERR_UNSUPPORTED (named) if none is recognized; NULL template -> ChatML is
 * not assumed, also unsupported. */
comet_status comet_chat_template_detect(const char *jinja, comet_chat_template *out);

/* The system message a model's template inserts when a conversation has none (SmolLM2's
 * "You are a helpful AI assistant named SmolLM, trained by Hugging Face"), found by the
 * ChatML pattern `messages[0]['role'] != 'system'` ... `<|im_start|>system\n...<|im_end|>`.
 * Returns a malloc'd string owned by the caller, or NULL when the template has none.
 * Callers prepend {"system", it} before comet_chat_apply to match the model's template. */
char *comet_chat_template_default_system(const char *jinja);

/* comet_chat_apply as the model's own template would render it: when the first message is
 * not a system message and the model's Jinja template inserts a default one (SmolLM2's
 * "You are a helpful AI assistant named SmolLM, ..."), that message is prepended, so the
 * CLI and the server build the prompt transformers would. Same ownership and errors as
 * comet_chat_apply. */
char *comet_chat_apply_model(comet_chat_template kind, const char *jinja,
                             const comet_chat_message *msgs, size_t n, int add_generation_prompt,
                             const char *bos);

/* Parse a --chat-template name ("chatml", "llama3", "llama2"). */
comet_status comet_chat_template_from_name(const char *name, comet_chat_template *out);

/* Render `n` messages; with add_generation_prompt the assistant header is appended
 * (Llama-2 has none: its text always ends with " [/INST]"). `bos` is the BOS token text to
 * emit where the template has it (Llama-3: once at the start; Llama-2: before every user
 * turn), or NULL. Llama-2 closes each assistant turn with " </s>". Llama-3 and Llama-2
 * strip whitespace around contents as their templates do. Returns a malloc'd string owned
 * by the caller, or NULL + last error (COMET_ERR_INVALID_ARG: a message without role or
 * content; Llama-2 roles not alternating user/assistant). */
char *comet_chat_apply(comet_chat_template kind, const comet_chat_message *msgs, size_t n,
                       int add_generation_prompt, const char *bos);

/* Render a conversation as comet_chat_apply_model does and tokenize it for the model: the
 * template's own markers (<|im_start|>, <|eot_id|>, the `bos` text, ...) become their
 * control tokens; roles and message contents are tokenized as plain text (parse_special
 * off), so marker text typed inside a message ("<|im_start|>system ...") stays text and
 * cannot open a turn of its own. The plain text between two markers is encoded in one
 * piece, giving the ids comet_tokenizer_encode gives the whole render when no content holds
 * special-token text. `allow_special_in_content` non-zero restores parsing of special-token
 * text everywhere (the whole render with parse_special on): only for trusted callers.
 * `jinja` may be NULL (no default system message). No BOS is added beyond the template's
 * own. On success *ids is a malloc'd array of *n_ids ids owned by the caller; errors as
 * comet_chat_apply. */
comet_status comet_chat_tokenize(const comet_tokenizer *tok, comet_chat_template kind,
                                 const char *jinja, const comet_chat_message *msgs, size_t n,
                                 int add_generation_prompt, const char *bos,
                                 int allow_special_in_content, int32_t **ids, size_t *n_ids);

/* The chat prompt of a model: its own Jinja chat template (rendered as transformers'
 * apply_chat_template does, src/tokenizer/jinja.h), a Jinja file given by the user, or
 * one of the built-in renderers (ChatML, Llama-3, Llama-2) for models without a template. */
typedef struct comet_chat comet_chat;

/* Choose and load the chat template. `override` is NULL (the model's template), a
 * built-in name ("chatml", "llama3", "llama2") or the path of a Jinja file;
 * `model_template` is the model's Jinja string or NULL. Jinja is parsed here, so a broken
 * template fails at load time with the line named. Returns NULL with comet_last_error():
 * COMET_ERR_UNSUPPORTED when there is no template at all (the model has none and no
 * override), COMET_ERR_INVALID_ARG for a parse error or an unknown name, COMET_ERR_IO for
 * an unreadable file. Free with comet_chat_free. */
comet_chat *comet_chat_init(const char *model_template, const char *override);
void comet_chat_free(comet_chat *c);
/* One line saying which template is in use ("the model's Jinja template", ...). */
const char *comet_chat_describe(const comet_chat *c);

/* Render a conversation with `c` and tokenize it. Messages come as `msgs` [n] or, when
 * `messages_json` is non-NULL, as that JSON array of message objects (role, content,
 * tool_calls, tool_call_id, name, ...: what a Jinja template may read; the built-in
 * renderers use role and content). `tools_json` is a JSON array of tool definitions or
 * NULL (the template sees tools = none). `bos`/`eos` are the texts of the model's BOS/EOS
 * tokens or NULL. As in comet_chat_tokenize, only the template's own text can become
 * control tokens; message contents and tool definitions stay plain text unless
 * `allow_special_in_content`. On success *ids [*n_ids] and, when `text` is non-NULL,
 * *text (the rendered prompt) are malloc'd and owned by the caller. Errors: a raised
 * template exception or a bad message (COMET_ERR_INVALID_ARG, named), COMET_ERR_NOMEM. */
comet_status comet_chat_build(const comet_chat *c, const comet_tokenizer *tok,
                              const comet_chat_message *msgs, size_t n, const char *messages_json,
                              const char *tools_json, int add_generation_prompt, const char *bos,
                              const char *eos, int allow_special_in_content, char **text,
                              int32_t **ids, size_t *n_ids);

#ifdef __cplusplus
}
#endif
#endif
