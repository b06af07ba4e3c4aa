/* jinja.h — a Jinja2 subset interpreter for chat templates (internal to comet).
 *
 * Renders a model's chat template as transformers' apply_chat_template does: Jinja2's
 * ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols
 * extension (break/continue), the {% generation %} tag, tojson as Python's json.dumps
 * with ensure_ascii=False, raise_exception and strftime_now. Covers what the official
 * templates use: if/elif/else, for (loop.*, else, inline filter), set (names, namespace
 * attributes, block set), macro, filter blocks, expressions, tests, filters, and the
 * string and dict methods templates call. Lists and dicts are immutable as in the
 * sandbox (append, pop, update are errors); no file, environment or attribute access
 * outside values.
 *
 * Every string carries which of its bytes come from the caller's data (message
 * contents, tool definitions) and which from the template itself (its literals, the
 * bos_token/eos_token values): comet_chat_tokenize makes control tokens only out of the
 * template's bytes, so marker text typed in a message stays plain text.
 *
 * Bounded: nesting depth (parser and evaluator, macro recursion), loop iterations, output
 * size and working memory are capped (comet_jinja_params); exceeding a cap is an error.
 */
#ifndef COMET_TOK_JINJA_H
#define COMET_TOK_JINJA_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "comet/status.h"

typedef struct comet_jinja comet_jinja;

typedef struct comet_jinja_params {
    size_t max_output_bytes; /* render error beyond this many output bytes */
    size_t max_memory_bytes; /* working memory of one render (values, frames) */
    long max_iterations;     /* loop iterations of one render, all loops together */
    int max_depth;           /* nesting of expressions, statements and macro calls */
    time_t now;              /* the clock strftime_now reads; 0: the current time */
    int utc;                 /* strftime_now in UTC (1) or local time (0, transformers') */
} comet_jinja_params;

comet_jinja_params comet_jinja_default_params(void);

/* Parse template source src[0..n) (UTF-8). Returns the compiled template (free with
 * comet_jinja_free), or NULL with comet_last_error() naming the line and the problem
 * (COMET_ERR_INVALID_ARG for a syntax error, COMET_ERR_NOMEM). */
comet_jinja *comet_jinja_parse(const char *src, size_t n);
void comet_jinja_free(comet_jinja *t);

/* Render with the variables of `data` (a JSON object; its strings count as data, e.g.
 * messages, tools) and of `trusted` (a JSON object or NULL; its strings count as template
 * text, e.g. bos_token, eos_token, add_generation_prompt). A name in both takes the
 * trusted value. On success *out is a malloc'd NUL-terminated string of *n_out bytes and,
 * when `taint` is non-NULL, *taint a malloc'd [*n_out] array with 1 for each byte that
 * comes from `data` (both owned by the caller). Errors: COMET_ERR_INVALID_ARG with a
 * message naming the template line (a raised exception, an undefined value used, a type
 * error, a cap exceeded), COMET_ERR_NOMEM. */
comet_status comet_jinja_render(const comet_jinja *t, const cJSON *data, const cJSON *trusted,
                                const comet_jinja_params *p, char **out, size_t *n_out,
                                uint8_t **taint);

#endif
