/* cmd_quantize.c — `comet quantize`: FMPQ (docs/numerics.md) of a floating-point model into a
 * comet checkpoint directory: calibration on a text, channel reordering with INT8
 * outlier blocks, INT4/INT8 weights (RTN with clipping search, or GPTQ), KV bits.
 * Progress per layer on stderr; a summary at the end (INT8 block fraction per linear
 * input group and overall, weight method, time, output size). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "comet/log.h"
#include "comet/model.h"
#include "comet/tokenizer.h"
#include "commands.h"
#include "format/checkpoint.h"
#include "engine/calibrate.h"
#include "quant/calib.h"
#include "quant/fmpq.h"
#include "quant/rotate.h"
#include "quant/smooth.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: comet quantize [--model M] [--calib FILE] --out DIR [options]\n"
        "\n"
        "Quantize a floating-point model with FMPQ: activations per token per block of B\n"
        "channels, INT4 with INT8 blocks for outlier channels (gathered into the leading\n"
        "blocks by a per-group channel permutation from calibration), INT4 weights per\n"
        "output channel per block, INT4 KV cache. Writes a checkpoint directory that\n"
        "`comet perplexity/generate --model DIR` run (simulated in fp32 on the CPU).\n"
        "\n"
        "  --model M            .gguf file or HF directory (default: the bundled model)\n"
        "  --calib FILE         calibration text (default data/mobydick.txt)\n"
        "  --out DIR            output directory (created; files replaced)\n"
        "  --calib-windows N    calibration windows (default 128)\n"
        "  --calib-len N        tokens per calibration window (default 512)\n"
        "  --calib-cache FILE   reuse the calibration statistics saved in FILE when it was\n"
        "                       made from the same model, text and windows; else calibrate\n"
        "                       and save them there\n"
        "  --block 128|64|32|0  block size B; 0 = one block per row (per-token activations,\n"
        "                       per-channel weights); default: 128, or 64 when the model's\n"
        "                       widths are not multiples of 128\n"
        "  --int8-budget F      at most this fraction of each group's blocks INT8 (default 0.25)\n"
        "  --tau T              INT8 for channels with salience > T x median (default 2)\n"
        "  --wmethod rtn|gptq   weight rounding (default gptq)\n"
        "  --no-clip            no clipping search for the weight scales\n"
        "  --damp F             GPTQ damping, fraction of the mean Hessian diagonal (0.01)\n"
        "  --no-reorder         keep the channel order (naive blocks)\n"
        "  --wbits 4|8|16       weight bits (default 4; 16 keeps fp16 weights)\n"
        "  --abits 4|8|16       activation bits: 4 = INT4 + INT8 outlier blocks (default),\n"
        "                       8 = all blocks INT8, 16 = not quantized\n"
        "  --kv-bits 4|8|16     KV cache bits (default 4)\n"
        "  --kv-group G         channels per KV scale/zero group (divides the head dim;\n"
        "                       default 16, or the head dim when it is not a multiple\n"
        "                       of 16: perplexity +35%% instead of +40%% over FP on the\n"
        "                       default model, for 6 bits per cached value instead of\n"
        "                       4.5; docs/accuracy.md)\n"
        "  --kv-rotation none|hadamard\n"
        "                       rotate K, V per KV head by the Walsh-Hadamard matrix\n"
        "                       before KV quantization (default: hadamard when the KV\n"
        "                       cache is quantized and the head dim a power of two)\n"
        "  --rotate none|orthogonal\n"
        "                       rotate the residual stream by a random orthogonal matrix\n"
        "                       folded into the weights, RMSNorm weights folded into the\n"
        "                       linears first (exact in fp32; spreads activation outliers\n"
        "                       over all channels; default none)\n"
        "  --rotate-seed N      the rotation's seed (default 1)\n"
        "  --rotate-keep N      leave the N residual channels with the largest activation\n"
        "                       outliers (on 16 calibration windows of the unrotated\n"
        "                       model) out of the rotation, for the INT8 blocks (default 0)\n"
        "  --smooth ALPHA       SmoothQuant: move activation outliers into the weights by\n"
        "                       s = max|X|^ALPHA / max|W|^(1-ALPHA) per input channel,\n"
        "                       folded into norms, up_proj and v_proj (default off)\n"
        "  --threads N          CPU threads (default: all cores)\n"
        "  --verbose            debug logs on stderr\n");
}

/* calibration windows that pick the channels --rotate-keep leaves unrotated */
#define KEEP_WINDOWS 16

static double dir_bytes(const char *dir) {
    DIR *d = opendir(dir);
    double total = 0;
    struct dirent *e;
    char path[4096];
    struct stat sb;
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
            total += (double)sb.st_size;
    }
    if (d)
        closedir(d);
    return total;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The calibration text as token ids (*ids, *n: read and tokenized on the first call, then
 * reused), and the CPU backend that runs calibration (*be: started on the first call).
 * Returns 0, or 1 after printing why not. */
static int calib_setup(const comet_model *m, const char *calib_path, long win_len, long threads,
                       char **text, int32_t **ids, size_t *n, comet_backend **be) {
    if (*ids)
        return 0;
    size_t text_len = 0;
    if (!(*text = cli_read_file(calib_path, &text_len))) {
        fprintf(stderr, "comet quantize: cannot read calibration text %s: %s\n", calib_path,
                strerror(errno));
        return 1;
    }
    if (comet_tokenizer_encode(m->tok, *text, text_len, 0, ids, n) < 0) {
        cli_report_error("quantize", "cannot tokenize the calibration text");
        return 1;
    }
    if (*n < (size_t)win_len) {
        fprintf(stderr,
                "comet quantize: %s has %zu tokens, fewer than one calibration window "
                "of %ld; a longer text or a smaller --calib-len would work\n",
                calib_path, *n, win_len);
        return 1;
    }
    if (!(*be = comet_backend_cpu_init((int)threads))) {
        cli_report_error("quantize", "cannot start the CPU backend");
        return 1;
    }
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *model_path = NULL, *calib_path = "data/mobydick.txt", *out_dir = NULL;
    const char *cache_path = NULL;
    long windows = 128, win_len = 512, threads = 0, wbits = 4, abits = 4, kvbits = 4, block = -1;
    long kvgroup = 0;
    double budget = 0.25, tau = 2.0, damp = 0.01, smooth = -1.0;
    comet_fmpq_params p = comet_fmpq_default_params();
    int verbose = 0, rotate = 0;
    long rotate_seed = 1, rotate_keep = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--calib") || !strcmp(a, "--out")) {
            if (!val) {
                fprintf(stderr, "comet quantize: %s needs a value\n", a);
                return 2;
            }
            *(a[2] == 'm' ? &model_path : a[2] == 'c' ? &calib_path : &out_dir) = val;
            i++;
        } else if (!strcmp(a, "--calib-cache")) {
            if (!val) {
                fprintf(stderr, "comet quantize: %s needs a value\n", a);
                return 2;
            }
            cache_path = val;
            i++;
        } else if (!strcmp(a, "--wmethod")) {
            if (!val || (strcmp(val, "rtn") && strcmp(val, "gptq"))) {
                fprintf(stderr, "comet quantize: --wmethod expects rtn or gptq\n");
                return 2;
            }
            p.gptq = !strcmp(val, "gptq");
            i++;
        } else if (!strcmp(a, "--calib-windows")) {
            bad = cli_parse_int("quantize", a, val, 1, 1 << 20, &windows), i++;
        } else if (!strcmp(a, "--calib-len")) {
            bad = cli_parse_int("quantize", a, val, 2, 1 << 20, &win_len), i++;
        } else if (!strcmp(a, "--block")) {
            bad = cli_parse_int("quantize", a, val, 0, 1 << 16, &block), i++;
            if (!bad && block != 0 && block != 32 && block != 64 && block != 128) {
                fprintf(stderr, "comet quantize: --block expects 128, 64, 32 or 0, got %ld\n",
                        block);
                return 2;
            }
        } else if (!strcmp(a, "--int8-budget")) {
            bad = cli_parse_float("quantize", a, val, 0.0, 1.0, &budget), i++;
        } else if (!strcmp(a, "--tau")) {
            bad = cli_parse_float("quantize", a, val, 0.0, 1e6, &tau), i++;
        } else if (!strcmp(a, "--damp")) {
            bad = cli_parse_float("quantize", a, val, 0.0, 10.0, &damp), i++;
        } else if (!strcmp(a, "--wbits") || !strcmp(a, "--abits") || !strcmp(a, "--kv-bits")) {
            long *dst = a[2] == 'w' ? &wbits : a[2] == 'a' ? &abits : &kvbits;
            bad = cli_parse_int("quantize", a, val, 4, 16, dst), i++;
            if (!bad && *dst != 4 && *dst != 8 && *dst != 16) {
                fprintf(stderr, "comet quantize: %s expects 4, 8 or 16, got %ld\n", a, *dst);
                return 2;
            }
        } else if (!strcmp(a, "--kv-group")) {
            bad = cli_parse_int("quantize", a, val, 1, 4096, &kvgroup), i++;
        } else if (!strcmp(a, "--kv-rotation")) {
            p.kv.rotation = comet_kv_rotation_parse(val);
            if (p.kv.rotation < 0) {
                fprintf(stderr, "comet quantize: --kv-rotation expects none or hadamard\n");
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--rotate")) {
            if (!val || (strcmp(val, "none") && strcmp(val, "orthogonal"))) {
                fprintf(stderr, "comet quantize: --rotate expects none or orthogonal\n");
                return 2;
            }
            rotate = !strcmp(val, "orthogonal"), i++;
        } else if (!strcmp(a, "--rotate-seed")) {
            bad = cli_parse_int("quantize", a, val, 0, 2147483647L, &rotate_seed), i++;
        } else if (!strcmp(a, "--rotate-keep")) {
            bad = cli_parse_int("quantize", a, val, 0, 4096, &rotate_keep), i++;
        } else if (!strcmp(a, "--smooth")) {
            bad = cli_parse_float("quantize", a, val, 0.0, 1.0, &smooth), i++;
        } else if (!strcmp(a, "--no-clip")) {
            p.clip_search = 0;
        } else if (!strcmp(a, "--no-reorder")) {
            p.reorder = 0;
        } else if (!strcmp(a, "--threads")) {
            bad = cli_parse_int("quantize", a, val, 1, 1024, &threads), i++;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            verbose = 1;
        } else {
            fprintf(stderr, "comet quantize: unknown option '%s' (see comet quantize --help)\n", a);
            return 2;
        }
        if (bad)
            return 2;
    }
    cli_log_to_stderr(verbose);
    if (!out_dir) {
        fprintf(stderr, "comet quantize: --out DIR is required (see comet quantize --help)\n");
        return 2;
    }
    p.w_bits = (int)wbits, p.a_bits = (int)abits, p.kv.bits = (int)kvbits, p.block = (int)block;
    p.kv.group = (int)kvgroup;
    p.int8_budget = (float)budget, p.tau = (float)tau, p.gptq_damp = (float)damp;
    if (p.w_bits == 16)
        p.gptq = 0;
    if (!model_path)
        model_path = cli_default_model();

    double t0 = now_s();
    int rc = 1;
    char *text = NULL;
    int32_t *ids = NULL;
    comet_model *m = NULL;
    comet_backend *be = NULL;
    comet_calib_stats *cs = NULL;
    if (comet_model_load(model_path, &m) < 0) {
        cli_report_error("quantize", "cannot load the model");
        goto out;
    }
    if (p.kv.group == 0 && p.kv.bits < 16)
        p.kv.group = comet_kv_default_group(m->cfg.head_dim);
    if (m->quant) {
        fprintf(stderr,
                "comet quantize: %s is already quantized; quantize the floating-point "
                "source model\n",
                model_path);
        goto out;
    }
    size_t n_ids = 0;
    if (rotate_keep > 0 && (!rotate || rotate_keep >= m->cfg.n_embd)) {
        fprintf(stderr,
                "comet quantize: --rotate-keep %ld needs --rotate orthogonal and fewer "
                "than the model's %d residual channels\n",
                rotate_keep, m->cfg.n_embd);
        goto out;
    }
    if (rotate) {
        int *keep = NULL;
        if (rotate_keep > 0) {
            /* which channels stay: outliers of the unrotated model on a few windows */
            const long w = windows < KEEP_WINDOWS ? windows : KEEP_WINDOWS;
            comet_calib_stats *pre = comet_calib_stats_init(&m->cfg, 0);
            keep = malloc((size_t)rotate_keep * sizeof *keep);
            if (!pre || !keep) {
                comet_calib_stats_free(pre);
                free(keep);
                cli_report_error("quantize", "out of memory");
                goto out;
            }
            if (calib_setup(m, calib_path, win_len, threads, &text, &ids, &n_ids, &be) ||
                comet_calib_run(m, be, ids, n_ids, (int)w, (int)win_len, pre, NULL) < 0) {
                if (comet_last_status() < 0)
                    cli_report_error("quantize", "calibration for the rotation failed");
                comet_calib_stats_free(pre);
                free(keep);
                goto out;
            }
            comet_rotation_outliers(m, pre, (int)rotate_keep, keep);
            comet_calib_stats_free(pre);
            char list[256] = "";
            for (long i = 0, o = 0; i < rotate_keep && o < (long)sizeof list - 8; i++)
                o += snprintf(list + o, sizeof list - (size_t)o, "%s%d", i ? " " : "", keep[i]);
            comet_log(COMET_LOG_INFO,
                      "rotation keeps residual channels %s (outliers on %ld "
                      "windows)",
                      list, w);
        }
        comet_status rs =
            comet_rotate_residual_keeping(m, (uint64_t)rotate_seed, keep, (int)rotate_keep);
        free(keep);
        if (rs < 0) {
            cli_report_error("quantize", "cannot rotate the residual stream");
            goto out;
        }
        comet_log(COMET_LOG_INFO,
                  "residual stream rotated (orthogonal, seed %ld, %ld channels "
                  "kept), RMSNorm weights folded",
                  rotate_seed, rotate_keep);
    }
    /* Statistics are needed for reordering, INT8 blocks and GPTQ; a W?A16 RTN run without
     * reordering needs none, so calibration is skipped. */
    int need_calib = p.gptq || p.reorder || p.a_bits == 4;
    comet_calib_meta meta = {.windows = (int)windows, .window_len = (int)win_len};
    /* a rotated model's statistics are another model's: its cache entry says so */
    snprintf(meta.model, sizeof meta.model, rotate ? "%s+rotate-orthogonal-%ld-keep-%ld" : "%s",
             model_path, rotate_seed, rotate_keep);
    snprintf(meta.corpus, sizeof meta.corpus, "%s", calib_path);
    if (need_calib && cache_path && access(cache_path, R_OK) == 0) {
        if (comet_calib_stats_load(cache_path, &m->cfg, &meta, p.gptq, &cs) < 0)
            comet_log(COMET_LOG_WARN, "calibration cache not used: %s", comet_last_error());
        else
            comet_log(COMET_LOG_INFO, "calibration: %ld tokens of statistics from %s", cs->n_tokens,
                      cache_path);
    }
    double calib_ppl = 0.0;
    if (!cs && !(cs = comet_calib_stats_init(&m->cfg, p.gptq || cache_path))) {
        cli_report_error("quantize", "out of memory");
        goto out;
    }
    if (need_calib && cs->n_tokens == 0) {
        if (calib_setup(m, calib_path, win_len, threads, &text, &ids, &n_ids, &be))
            goto out;
        size_t n = n_ids;
        if ((long)(n / (size_t)win_len) < windows) {
            comet_log(COMET_LOG_WARN, "calibration: %s holds only %zu windows of %ld tokens",
                      calib_path, n / (size_t)win_len, win_len);
            windows = (long)(n / (size_t)win_len);
        }
        comet_log(COMET_LOG_INFO, "calibration: %s, %ld windows x %ld tokens%s, %d threads",
                  calib_path, windows, win_len, p.gptq ? " (with Hessians for GPTQ)" : "",
                  be->n_threads);
        if (comet_calib_run(m, be, ids, n, (int)windows, (int)win_len, cs, &calib_ppl) < 0) {
            cli_report_error("quantize", "calibration failed");
            goto out;
        }
        comet_log(COMET_LOG_INFO,
                  "calibration: %ld tokens, PPL %.4f on the calibration text, "
                  "%.1f s",
                  cs->n_tokens, calib_ppl, now_s() - t0);
        if (cache_path && comet_calib_stats_save(cs, &meta, cache_path) < 0)
            comet_log(COMET_LOG_WARN, "calibration cache not saved: %s", comet_last_error());
    } else if (!need_calib) {
        windows = 0, win_len = 0;
        comet_log(COMET_LOG_INFO, "calibration: not needed (no reordering, no INT8 blocks, RTN)");
    }
    if (smooth >= 0.0) {
        if (!need_calib || comet_smooth(m, cs, (float)smooth) < 0) {
            if (!need_calib)
                comet_set_error(COMET_ERR_INVALID_ARG, "--smooth needs calibration statistics "
                                                       "(GPTQ, reordering or 4-bit activations)");
            cli_report_error("quantize", "cannot smooth the model");
            goto out;
        }
        comet_log(COMET_LOG_INFO,
                  "smoothed (alpha %.2f): activation outliers moved into the "
                  "weights",
                  smooth);
    }
    double t1 = now_s();
    if (comet_fmpq_quantize(m, cs, &p) < 0) {
        cli_report_error("quantize", "quantization failed");
        goto out;
    }
    double t2 = now_s();
    comet_quant_config *qc = m->quant;
    if (need_calib)
        snprintf(qc->calib_corpus, sizeof qc->calib_corpus, "%s", calib_path);
    qc->calib_windows = (int)windows;
    qc->calib_window_len = (int)win_len;
    qc->calib_tokens = cs->n_tokens;
    if (comet_checkpoint_write(m, out_dir) < 0 ||
        comet_checkpoint_write_tokenizer(m, model_path, out_dir) < 0) {
        cli_report_error("quantize", "cannot write the checkpoint");
        goto out;
    }
    double frac[COMET_QGROUP_COUNT], fb, fw;
    comet_qgroup_int8_fraction(m, frac, &fb, &fw);
    fprintf(stderr, "quantized %s -> %s\n", model_path, out_dir);
    fprintf(stderr, "  W%d A%s KV%d (group %d, rotation %s), block %d, weights %s%s, %s\n",
            p.w_bits,
            p.a_bits == 4   ? "x (INT4 + INT8 blocks)"
            : p.a_bits == 8 ? "8"
                            : "16",
            p.kv.bits, qc->kv.group, comet_kv_rotation_name(qc->kv.rotation), qc->block,
            qc->wmethod, p.clip_search && p.w_bits != 16 ? " + clipping search" : "",
            p.reorder ? "channels reordered" : "channel order kept");
    if (p.a_bits == 4) {
        fprintf(stderr, "  INT8 block fraction (tau %g, budget %g):", (double)p.tau,
                (double)p.int8_budget);
        for (int g = 0; g < COMET_QGROUP_COUNT; g++)
            fprintf(stderr, " %s %.1f%%", comet_qgroup_name((comet_qgroup)g), 100.0 * frac[g]);
        fprintf(stderr, "; overall %.1f%% of blocks, %.1f%% of GEMM work\n", 100.0 * fb,
                100.0 * fw);
    }
    fprintf(stderr, "  time: calibration %.1f s, quantization %.1f s, total %.1f s\n", t1 - t0,
            t2 - t1, now_s() - t0);
    fprintf(stderr, "  output: %.1f MB\n", dir_bytes(out_dir) / 1e6);
    rc = 0;
out:
    comet_calib_stats_free(cs);
    comet_backend_free(be);
    comet_model_free(m);
    free(ids);
    free(text);
    return rc;
}
