/* cmd_perplexity.c — `comet perplexity`: the docs/numerics.md accuracy protocol on a text
 * file. Progress on stderr; one result line on stdout:
 *   PPL <value> tokens <scored tokens> ctx <n> windows <n> */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/backend.h"
#include "comet/log.h"
#include "comet/model.h"
#include "comet/perplexity.h"
#include "comet/tokenizer.h"
#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: comet perplexity [--model M] --text FILE [options]\n"
            "\n"
            "Perplexity over non-overlapping windows of --ctx tokens, each from an empty\n"
            "cache, every token but the first of a window scored (docs/numerics.md); a\n"
            "model that adds BOS gets it at the start of every window. Ends with one\n"
            "stdout line: PPL <value> tokens <scored tokens> ctx <n> windows <n>\n"
            "\n"
            "  --model M          .gguf file or HF directory (default: the bundled model)\n"
            "  --text FILE        UTF-8 text, tokenized whole\n"
            "  --protocol comet|llama.cpp\n"
            "                     llama.cpp: as llama-perplexity -c <ctx> --chunks <windows>:\n"
            "                     BOS at each window's first position (models that add BOS),\n"
            "                     the second half of each window scored; the text must hold\n"
            "                     two windows, as llama-perplexity requires, and\n"
            "                     --max-windows 1 then scores one (default: comet)\n"
            "  --ctx N            tokens per window (default 2048, or the model's context if\n"
            "                     smaller)\n"
            "  --max-windows N    evaluate the first N windows only (default: all)\n"
            "  --chunk N          tokens per prefill step (default 256)\n"
            "  --device D         cpu, cuda or cuda:N (GPU N) (default cpu)\n"
            "  --threads N        CPU threads in all, split between the ranks with\n"
            "                     --tensor-parallel (default: all cores)\n"
            "  --tensor-parallel N\n"
            "                     split the model over N devices of --device's kind\n"
            "                     (cuda:d..d+N-1, or N CPU ranks) (default: one device)\n"
            "  --batch-invariant  results independent of --chunk, bit for bit, on the GPU too,\n"
            "                     at some speed (docs/numerics.md)\n"
            "  --simulate         CPU: run a quantized checkpoint by its fp32 simulation (the\n"
            "                     reference) instead of on integer codes\n"
            "  --kv-bits 4|8|16   simulate a 4/8-bit KV cache (default: the model's; 16 for\n"
            "                     floating-point models)\n"
            "  --kv-group G       channels per KV scale/zero group (default: the model's; 16\n"
            "                     when --kv-bits 4 or 8 quantizes the KV cache of a model\n"
            "                     without one, as comet quantize does)\n"
            "  --kv-rotation none|hadamard\n"
            "                     rotate K, V (and q) per KV head by the Walsh-Hadamard matrix\n"
            "                     before KV quantization (default: the model's; hadamard when\n"
            "                     --kv-bits 4 or 8 quantizes the KV cache of a model without one)\n"
            "  --verbose          debug logs on stderr\n");
}

int cmd_perplexity(int argc, char **argv) {
    const char *model_path = NULL, *text_path = NULL;
    long ctx = 0, max_windows = 0, threads = 0, chunk = 256, kv_bits = 0, kv_group = 0;
    long tensor_parallel = 0;
    int verbose = 0, batch_invariant = 0, simulate = 0;
    /* the KV cache asked for: -1 / 0 = the model's or the default policy (kv_format.h) */
    comet_kv_format kv_req = {.type = -1, .group = 0, .rotation = -1};
    comet_ppl_protocol protocol = COMET_PPL_COMET;
    const char *device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--text")) {
            if (!val) {
                fprintf(stderr, "comet perplexity: %s needs a value\n", a);
                return 2;
            }
            *(a[2] == 'm' ? &model_path : &text_path) = val;
            i++;
        } else if (!strcmp(a, "--ctx")) {
            if (cli_parse_int("perplexity", a, val, 2, 1 << 24, &ctx))
                return 2;
            i++;
        } else if (!strcmp(a, "--max-windows")) {
            if (cli_parse_int("perplexity", a, val, 1, 1 << 30, &max_windows))
                return 2;
            i++;
        } else if (!strcmp(a, "--chunk")) {
            if (cli_parse_int("perplexity", a, val, 1, 1 << 16, &chunk))
                return 2;
            i++;
        } else if (!strcmp(a, "--threads")) {
            if (cli_parse_int("perplexity", a, val, 1, 1024, &threads))
                return 2;
            i++;
        } else if (!strcmp(a, "--tensor-parallel")) {
            if (cli_parse_int("perplexity", a, val, 1, COMET_MAX_TENSOR_PARALLEL, &tensor_parallel))
                return 2;
            i++;
        } else if (!strcmp(a, "--kv-group")) {
            if (cli_parse_int("perplexity", a, val, 1, 4096, &kv_group))
                return 2;
            i++;
        } else if (!strcmp(a, "--kv-bits")) {
            if (cli_parse_int("perplexity", a, val, 4, 16, &kv_bits))
                return 2;
            kv_req.type = comet_kv_type_from_bits((int)kv_bits);
            if (kv_req.type < 0) {
                fprintf(stderr, "comet perplexity: --kv-bits expects 4, 8 or 16, got %ld\n",
                        kv_bits);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--device")) {
            device = val;
            if (cli_device_ok("perplexity", device))
                return 2;
            i++;
        } else if (!strcmp(a, "--kv-rotation")) {
            kv_req.rotation = comet_kv_rotation_parse(val);
            if (kv_req.rotation < 0) {
                fprintf(stderr, "comet perplexity: --kv-rotation expects none or hadamard\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--protocol")) {
            if (!strcmp(val, "comet")) {
                protocol = COMET_PPL_COMET;
            } else if (!strcmp(val, "llama.cpp")) {
                protocol = COMET_PPL_LLAMA_CPP;
            } else {
                fprintf(stderr,
                        "comet perplexity: --protocol expects comet or llama.cpp, got "
                        "'%s'\n",
                        val);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            verbose = 1;
        } else if (!strcmp(a, "--batch-invariant")) {
            batch_invariant = 1;
        } else if (!strcmp(a, "--simulate")) {
            simulate = 1;
        } else {
            fprintf(stderr, "comet perplexity: unknown option '%s' (see comet perplexity --help)\n",
                    a);
            return 2;
        }
    }
    cli_log_to_stderr(verbose);
    if (!text_path) {
        fprintf(stderr,
                "comet perplexity: --text FILE is required (see comet perplexity --help)\n");
        return 2;
    }
    size_t text_len = 0;
    char *text = cli_read_file(text_path, &text_len);
    if (!text) {
        fprintf(stderr, "comet perplexity: cannot read %s: %s\n", text_path, strerror(errno));
        return 1;
    }
    if (!model_path)
        model_path = cli_default_model();
    comet_model *m = NULL;
    comet_backend *be = NULL;
    int32_t *ids = NULL;
    int rc = 1;
    if (cli_load_model(model_path, device, simulate, (int)tensor_parallel, &m) < 0) {
        cli_report_error("perplexity", "cannot load the model");
        goto out;
    }
    kv_req.group = (int)kv_group;
    comet_kv_format kv; /* what the cache runs with: the request on top of the model's */
    if (comet_kv_format_resolve(&kv_req, &m->kv, m->cfg.head_dim, "perplexity", &kv) < 0) {
        cli_report_error("perplexity", "bad KV cache options");
        goto out;
    }
    size_t n = 0;
    if (comet_tokenizer_encode(m->tok, text, text_len, 0, &ids, &n) < 0) {
        cli_report_error("perplexity", "cannot tokenize the text");
        goto out;
    }
    comet_ppl_params pp = comet_ppl_default_params();
    pp.bos_id = m->cfg.add_bos && m->cfg.bos_id >= 0 ? m->cfg.bos_id : -1;
    pp.protocol = protocol;
    if (ctx > 0)
        pp.ctx = (int)ctx;
    else if (pp.ctx > m->cfg.n_ctx)
        pp.ctx = m->cfg.n_ctx;
    pp.max_windows = (int)max_windows;
    pp.chunk = (int)chunk;
    pp.tensor_parallel = (int)tensor_parallel;
    pp.kv = kv;
    if (!(be = cli_open_backend("perplexity", device, (int)threads, (int)tensor_parallel,
                                batch_invariant)))
        goto out;
    comet_backend_set_simulate(be, simulate);
    comet_log(COMET_LOG_INFO, "perplexity: %s, %zu tokens, ctx %d, %d threads, %s protocol",
              text_path, n, pp.ctx, comet_backend_n_threads(be),
              protocol == COMET_PPL_LLAMA_CPP ? "llama.cpp" : "comet");
    const comet_quant_config *q = m->quant;
    if (q)
        comet_log(COMET_LOG_INFO,
                  "model: W%d A%d KV%d (group %d, rotation %s) FMPQ, block %d, "
                  "weights %s, calibration %s (%ld tokens)",
                  q->w_bits, q->a_bits, comet_kv_type_bits(kv.type), kv.group,
                  comet_kv_rotation_name(kv.rotation), q->block, q->wmethod,
                  q->calib_corpus[0] ? q->calib_corpus : "none", q->calib_tokens);
    else
        comet_log(COMET_LOG_INFO, "model: floating point (fp32), KV%d (group %d, rotation %s)",
                  comet_kv_type_bits(kv.type), kv.group, comet_kv_rotation_name(kv.rotation));
    comet_ppl_result r;
    if (comet_perplexity(m, be, ids, n, &pp, &r) < 0) {
        cli_report_error("perplexity", "perplexity failed");
        goto out;
    }
    printf("PPL %.4f tokens %ld ctx %d windows %d\n", r.ppl, r.n_scored, r.ctx, r.windows);
    rc = 0;
out:
    comet_backend_free(be);
    free(ids);
    comet_model_free(m);
    free(text);
    return rc;
}
