/* cmd_generate.c — `comet generate`: one prompt in, generated text streamed to stdout.
 * The chat template is applied unless --raw; logs, progress and --stats go to stderr. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comet/backend.h"
#include "comet/generate.h"
#include "comet/log.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "comet/utf8.h"
#include "commands.h"

#define MAX_STOP 8

static void usage(FILE *f) {
    fprintf(f, "usage: comet generate [--model M] --prompt P [options]\n"
               "\n"
               "Generate text from a prompt; only the generated text goes to stdout.\n"
               "\n"
               "  --model M            .gguf file or HF directory (default: the bundled model)\n"
               "  --prompt P           the prompt (user message unless --raw; special-token\n"
               "                       text in it, like <|im_start|>, stays plain text)\n"
               "  --max-tokens N       new tokens at most; 0 = up to the context (default 256)\n");
    cli_sampling_usage(f, 23, "64");
    fprintf(f,
            "  --seed S             random seed (default: from the clock, logged)\n"
            "  --stop S             stop when S appears (not printed); may repeat, up to %d\n"
            "  --raw                no chat template: the prompt is tokenized as given\n"
            "                       (special-token text like <|im_start|> becomes that token)\n"
            "  --chat-template T    a Jinja file, or chatml | llama3 | llama2 (default: the model's)\n"
            "  --system S           system message for the chat template\n"
            "  --ignore-eos         keep generating past end-of-sequence tokens\n"
            "  --device D           cpu, cuda or cuda:N (GPU N) (default cpu)\n"
            "  --threads N          CPU threads in all, split between the ranks with\n"
            "                       --tensor-parallel (default: all cores)\n"
            "  --tensor-parallel N  split the model over N devices of --device's kind\n"
            "                       (cuda:d..d+N-1, or N CPU ranks) (default: one device)\n"
            "  --batch-invariant    results independent of the prefill chunk, bit for bit, on\n"
            "                       the GPU too, at some speed (docs/numerics.md)\n"
            "  --simulate           CPU: run a quantized checkpoint by its fp32 simulation\n"
            "                       (the reference) instead of on integer codes\n"
            "  --stats              print prefill and decode tokens/s to stderr\n"
            "  --verbose            debug logs on stderr\n",
            MAX_STOP);
}

static int print_text(const char *text, size_t len, void *user) {
    int *ends_nl = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    *ends_nl = text[len - 1] == '\n';
    return 0;
}

/* Render the prompt (chat template unless raw), tokenize it, prepend BOS when the model
 * wants one. With the template only its own markers become control tokens: special-token
 * text in --prompt or --system stays text (comet_chat_tokenize); --raw parses it.
 * Returns 0 with *ids malloc'd, or prints an error and returns non-zero. */
static int build_prompt(const comet_model *m, const char *prompt, const char *system, int raw,
                        const char *template_name, int32_t **ids, int *n_ids) {
    size_t n = 0;
    int32_t *tok = NULL;
    if (raw) {
        comet_log(COMET_LOG_DEBUG, "prompt text: %s", prompt);
        if (comet_tokenizer_encode(m->tok, prompt, strlen(prompt), 1, &tok, &n) < 0) {
            cli_report_error("generate", "cannot tokenize the prompt");
            return 1;
        }
    } else {
        comet_chat *chat = comet_chat_init(m->chat_template, template_name);
        if (!chat) {
            fprintf(stderr, "comet generate: %s\n", comet_last_error());
            return 1;
        }
        comet_log(COMET_LOG_INFO, "chat template: %s", comet_chat_describe(chat));
        char bos[128] = "", eos[128] = "";
        if (m->cfg.bos_id >= 0) {
            int n = comet_tokenizer_token_bytes(m->tok, m->cfg.bos_id, 1, bos, sizeof bos - 1);
            bos[n > 0 && n < (int)sizeof bos ? n : 0] = '\0';
        }
        if (m->cfg.n_eos > 0) {
            int n = comet_tokenizer_token_bytes(m->tok, m->cfg.eos_ids[0], 1, eos, sizeof eos - 1);
            eos[n > 0 && n < (int)sizeof eos ? n : 0] = '\0';
        }
        comet_chat_message msgs[2];
        size_t n_msgs = 0;
        if (system)
            msgs[n_msgs++] = (comet_chat_message){"system", system};
        msgs[n_msgs++] = (comet_chat_message){"user", prompt};
        char *text = NULL;
        comet_status st = comet_chat_build(chat, m->tok, msgs, n_msgs, NULL, NULL, 1,
                                           bos[0] ? bos : NULL, eos[0] ? eos : NULL, 0, &text,
                                           &tok, &n);
        comet_chat_free(chat);
        if (st < 0) {
            fprintf(stderr, "comet generate: %s\n", comet_last_error());
            return 1;
        }
        comet_log(COMET_LOG_DEBUG, "prompt text: %s", text);
        free(text);
    }
    if (m->cfg.add_bos && m->cfg.bos_id >= 0 && (n == 0 || tok[0] != m->cfg.bos_id)) {
        int32_t *t2 = malloc((n + 1) * sizeof *t2);
        if (!t2) {
            free(tok);
            fprintf(stderr, "comet generate: out of memory\n");
            return 1;
        }
        t2[0] = m->cfg.bos_id;
        memcpy(t2 + 1, tok, n * sizeof *tok);
        free(tok);
        tok = t2;
        n++;
    }
    *ids = tok;
    *n_ids = (int)n;
    return 0;
}

int cmd_generate(int argc, char **argv) {
    const char *model_path = NULL, *prompt = NULL, *system = NULL, *template_name = NULL;
    const char *device = "cpu";
    const char *stop[MAX_STOP];
    int raw = 0, stats = 0, verbose = 0, seed_given = 0, batch_invariant = 0, simulate = 0;
    long threads = 0;
    comet_gen_params gp = comet_gen_default_params();
    cli_sampling smp;
    cli_sampling_init(&smp, &gp.sampling);
    comet_sampler_params *sp = &smp.p;
    gp.stop = stop;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long lv;
        int got = cli_sampling_option("generate", &smp, a, val);
        if (got < 0)
            return 2;
        if (got > 0) {
            i++;
            continue;
        }
#define NEED_VALUE()                                                                               \
    do {                                                                                           \
        if (!val) {                                                                                \
            fprintf(stderr, "comet generate: %s needs a value\n", a);                              \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model")) {
            NEED_VALUE();
            model_path = val;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) {
            NEED_VALUE();
            prompt = val;
        } else if (!strcmp(a, "--system")) {
            NEED_VALUE();
            system = val;
        } else if (!strcmp(a, "--chat-template")) {
            NEED_VALUE();
            template_name = val;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            device = val;
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            if (gp.n_stop == MAX_STOP) {
                fprintf(stderr, "comet generate: at most %d --stop strings\n", MAX_STOP);
                return 2;
            }
            if (!val[0]) {
                fprintf(stderr, "comet generate: --stop needs a non-empty string\n");
                return 2;
            }
            stop[gp.n_stop++] = val;
        } else if (!strcmp(a, "--max-tokens")) {
            if (cli_parse_int("generate", a, val, 0, 1 << 24, &lv))
                return 2;
            gp.max_tokens = (int)lv, i++;
        } else if (!strcmp(a, "--tensor-parallel")) {
            if (cli_parse_int("generate", a, val, 1, COMET_MAX_TENSOR_PARALLEL, &lv))
                return 2;
            gp.tensor_parallel = (int)lv, i++;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int("generate", a, val, 1, 1024, &threads))
                return 2;
            i++;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            if (!val || !*val || (sp->seed = strtoull(val, &end, 10), *end)) {
                fprintf(stderr, "comet generate: --seed expects a non-negative integer\n");
                return 2;
            }
            seed_given = 1, i++;
        } else if (!strcmp(a, "--raw")) {
            raw = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            gp.ignore_eos = 1;
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else if (!strcmp(a, "--batch-invariant")) {
            batch_invariant = 1;
        } else if (!strcmp(a, "--simulate")) {
            simulate = 1;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            verbose = 1;
        } else {
            fprintf(stderr, "comet generate: unknown option '%s' (see comet generate --help)\n", a);
            return 2;
        }
#undef NEED_VALUE
    }
    cli_log_to_stderr(verbose);
    if (!prompt) {
        fprintf(stderr, "comet generate: --prompt is required (see comet generate --help)\n");
        return 2;
    }
    if (!prompt[0]) {
        fprintf(stderr, "comet generate: the prompt is empty; give --prompt some text\n");
        return 1;
    }
    if (cli_device_ok("generate", device) || cli_sampling_check("generate", &smp, 0))
        return 2;
    if (!seed_given)
        sp->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    size_t prompt_len = strlen(prompt), valid = comet_utf8_valid_prefix(prompt, prompt_len);
    if (valid != prompt_len) {
        fprintf(stderr,
                "comet generate: the prompt is not valid UTF-8 (invalid byte at offset %zu)\n",
                valid);
        return 2;
    }
    if (!model_path)
        model_path = cli_default_model();
    comet_model *m = NULL;
    if (cli_load_model(model_path, device, simulate, gp.tensor_parallel, &m) < 0) {
        cli_report_error("generate", "cannot load the model");
        return 1;
    }
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    comet_backend *be = NULL;
    gp.sampling = smp.p; /* logit_bias: smp's, alive until the end */
    if (cli_sampling_check("generate", &smp, m->cfg.n_vocab)) { /* logit_bias ids */
        rc = 2;
        goto out;
    }
    if (build_prompt(m, prompt, system, raw, template_name, &ids, &n_ids))
        goto out;
    if (n_ids >= m->cfg.n_ctx) {
        fprintf(stderr,
                "comet generate: the prompt has %d tokens but the model's context is %d tokens\n",
                n_ids, m->cfg.n_ctx);
        goto out;
    }
    int up_to_context = gp.max_tokens == 0; /* as serve's --max-tokens 0 */
    if (up_to_context)
        gp.max_tokens = m->cfg.n_ctx - n_ids;
    if (!(be = cli_open_backend("generate", device, (int)threads, gp.tensor_parallel,
                                batch_invariant)))
        goto out;
    comet_backend_set_simulate(be, simulate);
    comet_log(COMET_LOG_DEBUG, "generate: %d prompt tokens, %d threads, seed %llu", n_ids,
              comet_backend_n_threads(be), (unsigned long long)sp->seed);
    /* the help promises it: a sampled run can be repeated */
    if (!seed_given && sp->temperature >= COMET_SAMPLER_GREEDY_BELOW && sp->top_k != 1)
        fprintf(stderr, "seed: %llu (from the clock; --seed %llu samples this text again)\n",
                (unsigned long long)sp->seed, (unsigned long long)sp->seed);
    int ends_nl = 1;
    comet_gen_stats gs;
    if (comet_generate(m, be, ids, n_ids, &gp, print_text, &ends_nl, &gs) < 0) {
        cli_report_error("generate", "generation failed");
        goto out;
    }
    if (!ends_nl && isatty(1))
        fputc('\n', stdout);
    fflush(stdout);
    if (gs.stop == COMET_STOP_LENGTH && gs.n_generated < gp.max_tokens && !up_to_context)
        fprintf(stderr,
                "comet generate: warning: stopped at the model's context of %d tokens (%d prompt + "
                "%d generated), before --max-tokens %d\n",
                m->cfg.n_ctx, gs.n_prompt, gs.n_generated, gp.max_tokens);
    if (stats) {
        int n_dec = gs.n_decode_steps;
        fprintf(stderr,
                "stats: prompt_tokens=%d prefill_s=%.3f prefill_tok_s=%.2f gen_tokens=%d "
                "decode_steps=%d decode_s=%.3f decode_tok_s=%.2f threads=%d stop=%s\n",
                gs.n_prompt, gs.prefill_s, gs.prefill_s > 0 ? gs.n_prompt / gs.prefill_s : 0.0,
                gs.n_generated, n_dec, gs.decode_s, gs.decode_s > 0 ? n_dec / gs.decode_s : 0.0,
                comet_backend_n_threads(be), comet_stop_reason_name(gs.stop));
    }
    rc = 0;
out:
    comet_backend_free(be);
    free(ids);
    comet_model_free(m);
    return rc;
}
