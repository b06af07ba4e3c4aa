/* cmd_quantize.c — `comet quantize`: FMPQ (docs/numerics.md) of a floating-point model into a
 * comet checkpoint directory: calibration on a text, channel reordering with INT8
 * outlier blocks, INT4/INT8 weights (RTN with clipping search, or GPTQ), KV bits.
 * Progress per layer on stderr; a summary at the end (INT8 block fraction per linear
 * input group and overall, weight method, time, output size). The work itself is
 * comet_quantize (comet/quantize.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comet/model.h"
#include "comet/quantize.h"
#include "commands.h"

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
        "  --out DIR            output directory: new, empty or a comet checkpoint (created;\n"
        "                       files replaced); checked before the model loads\n"
        "  --force              write into a non-empty --out that is not a checkpoint\n"
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
        "  --lm-head-bits 8|16  lm_head as INT8 rows (default with 4- or 8-bit weights:\n"
        "                       half the bytes a decode step reads there, perplexity\n"
        "                       +0.03%% on the default model) or fp16\n"
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

int cmd_quantize(int argc, char **argv) {
    const char *model_path = NULL, *calib_path = "data/mobydick.txt", *out_dir = NULL;
    const char *cache_path = NULL;
    long windows = 128, win_len = 512, threads = 0, wbits = 4, abits = 4, kvbits = 4, block = -1,
         lmbits = 0;
    long kvgroup = 0;
    double budget = 0.25, tau = 2.0, damp = 0.01, smooth = -1.0;
    comet_quantize_params qp = comet_quantize_default_params();
    comet_fmpq_params p = qp.fmpq;
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
        } else if (!strcmp(a, "--lm-head-bits")) {
            bad = cli_parse_int("quantize", a, val, 8, 16, &lmbits), i++;
            if (!bad && lmbits != 8 && lmbits != 16) {
                fprintf(stderr, "comet quantize: --lm-head-bits expects 8 or 16, got %ld\n",
                        lmbits);
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
        } else if (!strcmp(a, "--force")) {
            qp.overwrite = 1;
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
    p.w_bits = (int)wbits, p.a_bits = (int)abits, p.block = (int)block;
    p.lm_head_bits = (int)lmbits;
    p.kv.type = comet_kv_type_from_bits((int)kvbits); /* 4, 8 or 16: checked above */
    p.kv.group = (int)kvgroup;
    p.int8_budget = (float)budget, p.tau = (float)tau, p.gptq_damp = (float)damp;
    qp.fmpq = p;
    qp.calib_path = calib_path;
    qp.calib_cache = cache_path;
    qp.calib_windows = (int)windows, qp.calib_len = (int)win_len;
    qp.rotate = rotate, qp.rotate_seed = (uint64_t)rotate_seed, qp.rotate_keep = (int)rotate_keep;
    qp.smooth = (float)smooth;
    qp.n_threads = (int)threads;
    if (!model_path)
        model_path = cli_default_model();

    comet_quantize_result r;
    if (comet_quantize(model_path, out_dir, &qp, &r) < 0) {
        cli_report_error("quantize", "quantization failed");
        return 1;
    }
    const comet_quant_config *qc = &r.config;
    fprintf(stderr, "quantized %s -> %s\n", model_path, out_dir);
    fprintf(stderr,
            "  W%d A%s KV%d (group %d, rotation %s), block %d, weights %s%s, %s, %s lm_head\n",
            p.w_bits,
            p.a_bits == 4   ? "x (INT4 + INT8 blocks)"
            : p.a_bits == 8 ? "8"
                            : "16",
            comet_kv_type_bits(qc->kv.type), qc->kv.group, comet_kv_rotation_name(qc->kv.rotation),
            qc->block, qc->wmethod, p.clip_search && p.w_bits != 16 ? " + clipping search" : "",
            p.reorder ? "channels reordered" : "channel order kept",
            qc->lm_head_bits == 8 ? "INT8" : "fp16");
    if (p.a_bits == 4) {
        fprintf(stderr, "  INT8 block fraction (tau %g, budget %g):", (double)p.tau,
                (double)p.int8_budget);
        for (int g = 0; g < COMET_QUANTIZE_GROUPS; g++)
            fprintf(stderr, " %s %.1f%%", r.group_name[g], 100.0 * r.int8_fraction[g]);
        fprintf(stderr, "; overall %.1f%% of blocks, %.1f%% of GEMM work\n", 100.0 * r.int8_blocks,
                100.0 * r.int8_work);
    }
    fprintf(stderr, "  time: calibration %.1f s, quantization %.1f s, total %.1f s\n", r.calib_s,
            r.quant_s, r.total_s);
    fprintf(stderr, "  output: %.1f MB\n", r.out_bytes / 1e6);
    return 0;
}
