/* quantize.c — comet_quantize (comet/quantize.h): the steps of `comet quantize` in order —
 * load, optional residual rotation (with its own short calibration for the channels it
 * keeps), calibration statistics (cached or run), optional SmoothQuant, FMPQ, and the
 * checkpoint write. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comet/log.h"
#include "comet/quantize.h"
#include "comet/tokenizer.h"
#include "core/clock.h"
#include "core/mmap.h"
#include "engine/calibrate.h"
#include "format/checkpoint.h"
#include "quant/calib.h"
#include "quant/fmpq.h"
#include "quant/rotate.h"
#include "quant/smooth.h"

_Static_assert(COMET_QUANTIZE_GROUPS == COMET_GROUP_LAYER_COUNT, "one result entry per group");

/* calibration windows that pick the channels rotate_keep leaves unrotated */
#define KEEP_WINDOWS 16

comet_quantize_params comet_quantize_default_params(void) {
    return (comet_quantize_params){.fmpq = comet_fmpq_default_params(),
                                   .calib_path = "data/mobydick.txt",
                                   .calib_windows = 128,
                                   .calib_len = 512,
                                   .rotate_seed = 1,
                                   .smooth = -1.0f};
}

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

/* The state of one run: the model, and the calibration text and backend once needed. */
typedef struct run {
    const comet_quantize_params *p;
    comet_model *m;
    comet_mmap text;
    int32_t *ids;
    size_t n_ids;
    comet_backend *be;
} run;

static void stage(const run *q, comet_quantize_stage s) {
    if (q->p->progress)
        q->p->progress(q->p->progress_user, s);
}

/* The calibration text as token ids (read and tokenized on the first call, then reused),
 * and the CPU backend that runs calibration (started on the first call). */
static comet_status calib_setup(run *q) {
    if (q->ids)
        return COMET_OK;
    const char *path = q->p->calib_path;
    errno = 0;
    if (comet_mmap_open(path, &q->text) < 0) {
        int e = errno;
        return comet_set_error(COMET_ERR_IO, "cannot read calibration text %s: %s", path,
                               e ? strerror(e) : "not a regular file");
    }
    const char *text = q->text.data ? (const char *)q->text.data : "";
    if (comet_tokenizer_encode(q->m->tok, text, q->text.size, 0, &q->ids, &q->n_ids) < 0)
        return comet_last_status();
    if (q->n_ids < (size_t)q->p->calib_len)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s has %zu tokens, fewer than one calibration window "
                               "of %d; a longer text or a smaller --calib-len would work",
                               path, q->n_ids, q->p->calib_len);
    if (!(q->be = comet_backend_cpu_init(q->p->n_threads)))
        return comet_last_status();
    return COMET_OK;
}

/* Rotate the residual stream, keeping p->rotate_keep outlier channels out of it. */
static comet_status rotate(run *q) {
    const comet_quantize_params *p = q->p;
    const int n_keep = p->rotate_keep;
    int *keep = NULL;
    if (n_keep > 0) {
        /* which channels stay: outliers of the unrotated model on a few windows */
        const int w = p->calib_windows < KEEP_WINDOWS ? p->calib_windows : KEEP_WINDOWS;
        comet_calib_stats *pre = comet_calib_stats_init(&q->m->cfg, 0);
        keep = malloc((size_t)n_keep * sizeof *keep);
        comet_status st =
            !pre || !keep ? comet_set_error(COMET_ERR_NOMEM, "out of memory") : calib_setup(q);
        if (st >= 0)
            st = comet_calib_run(q->m, q->be, q->ids, q->n_ids, w, p->calib_len, pre, NULL);
        if (st >= 0)
            comet_rotation_outliers(q->m, pre, n_keep, keep);
        comet_calib_stats_free(pre);
        if (st < 0) {
            free(keep);
            return st;
        }
        char list[256] = "";
        for (long i = 0, o = 0; i < n_keep && o < (long)sizeof list - 8; i++)
            o += snprintf(list + o, sizeof list - (size_t)o, "%s%d", i ? " " : "", keep[i]);
        comet_log(COMET_LOG_INFO,
                  "rotation keeps residual channels %s (outliers on %d "
                  "windows)",
                  list, w);
    }
    comet_status st = comet_rotate_residual_keeping(q->m, p->rotate_seed, keep, n_keep);
    free(keep);
    COMET_TRY(st);
    comet_log(COMET_LOG_INFO,
              "residual stream rotated (orthogonal, seed %llu, %d channels "
              "kept), RMSNorm weights folded",
              (unsigned long long)p->rotate_seed, n_keep);
    return COMET_OK;
}

/* Statistics for FMPQ into *cs: from the cache, or a calibration run (saved to the cache),
 * or none when need_calib is 0. *windows and *win_len become what was used. */
static comet_status calibrate(run *q, const char *model_path, const comet_fmpq_params *fp,
                              int need_calib, double t0, comet_calib_stats **cs, int *windows,
                              int *win_len) {
    const comet_quantize_params *p = q->p;
    comet_calib_meta meta = {.windows = *windows, .window_len = *win_len};
    /* a rotated model's statistics are another model's: its cache entry says so */
    if (p->rotate)
        snprintf(meta.model, sizeof meta.model, "%s+rotate-orthogonal-%llu-keep-%d", model_path,
                 (unsigned long long)p->rotate_seed, p->rotate_keep);
    else
        snprintf(meta.model, sizeof meta.model, "%s", model_path);
    snprintf(meta.corpus, sizeof meta.corpus, "%s", p->calib_path);
    const char *cache = p->calib_cache;
    if (need_calib && cache && access(cache, R_OK) == 0) {
        if (comet_calib_stats_load(cache, &q->m->cfg, &meta, fp->gptq, cs) < 0)
            comet_log(COMET_LOG_WARN, "calibration cache not used: %s", comet_last_error());
        else
            comet_log(COMET_LOG_INFO, "calibration: %ld tokens of statistics from %s",
                      (*cs)->n_tokens, cache);
    }
    if (!*cs && !(*cs = comet_calib_stats_init(&q->m->cfg, fp->gptq || cache)))
        return comet_set_error(COMET_ERR_NOMEM, "out of memory");
    if (!need_calib) {
        *windows = 0, *win_len = 0;
        comet_log(COMET_LOG_INFO, "calibration: not needed (no reordering, no INT8 blocks, RTN)");
        return COMET_OK;
    }
    if ((*cs)->n_tokens > 0)
        return COMET_OK;
    COMET_TRY(calib_setup(q));
    size_t n = q->n_ids;
    if ((long)(n / (size_t)*win_len) < *windows) {
        comet_log(COMET_LOG_WARN, "calibration: %s holds only %zu windows of %d tokens",
                  p->calib_path, n / (size_t)*win_len, *win_len);
        *windows = (int)(n / (size_t)*win_len);
    }
    comet_log(COMET_LOG_INFO, "calibration: %s, %d windows x %d tokens%s, %d threads",
              p->calib_path, *windows, *win_len, fp->gptq ? " (with Hessians for GPTQ)" : "",
              comet_backend_n_threads(q->be));
    double ppl = 0.0;
    COMET_TRY(comet_calib_run(q->m, q->be, q->ids, n, *windows, *win_len, *cs, &ppl));
    comet_log(COMET_LOG_INFO,
              "calibration: %ld tokens, PPL %.4f on the calibration text, "
              "%.1f s",
              (*cs)->n_tokens, ppl, comet_now_s() - t0);
    if (cache && comet_calib_stats_save(*cs, &meta, cache) < 0)
        comet_log(COMET_LOG_WARN, "calibration cache not saved: %s", comet_last_error());
    return COMET_OK;
}

static comet_status quantize(run *q, const char *model_path, const char *out_dir, double t0,
                             comet_quantize_result *r) {
    const comet_quantize_params *p = q->p;
    comet_fmpq_params fp = p->fmpq;
    if (fp.w_bits == 16)
        fp.gptq = 0; /* fp16 weights have nothing to round */
    /* the output is checked first: a bad --out must not cost a calibration run */
    COMET_TRY(comet_checkpoint_out_check(out_dir, p->overwrite));
    stage(q, COMET_QUANTIZE_LOAD);
    COMET_TRY(comet_model_load(model_path, &q->m));
    comet_model *m = q->m;
    /* the KV format now, not after calibration: a bad --kv-group fails at once */
    COMET_TRY(comet_kv_format_resolve(&fp.kv, NULL, m->cfg.head_dim, "quantize", &fp.kv));
    if (m->quant)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s is already quantized; quantize the floating-point "
                               "source model",
                               model_path);
    if (p->rotate_keep > 0 && (!p->rotate || p->rotate_keep >= m->cfg.n_embd))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "--rotate-keep %d needs --rotate orthogonal and fewer "
                               "than the model's %d residual channels",
                               p->rotate_keep, m->cfg.n_embd);
    if (p->rotate) {
        stage(q, COMET_QUANTIZE_ROTATE);
        COMET_TRY(rotate(q));
    }
    /* Statistics are needed for reordering, INT8 blocks and GPTQ; a W?A16 RTN run without
     * reordering needs none, so calibration is skipped. */
    int need_calib = fp.gptq || fp.reorder || fp.a_bits == 4;
    int windows = p->calib_windows, win_len = p->calib_len;
    comet_calib_stats *cs = NULL;
    stage(q, COMET_QUANTIZE_CALIBRATE);
    comet_status st = calibrate(q, model_path, &fp, need_calib, t0, &cs, &windows, &win_len);
    if (st >= 0 && p->smooth >= 0.0f) {
        stage(q, COMET_QUANTIZE_SMOOTH);
        st = need_calib ? comet_smooth(m, cs, p->smooth)
                        : comet_set_error(COMET_ERR_INVALID_ARG,
                                          "--smooth needs calibration statistics "
                                          "(GPTQ, reordering or 4-bit activations)");
        if (st >= 0)
            comet_log(COMET_LOG_INFO,
                      "smoothed (alpha %.2f): activation outliers moved into the "
                      "weights",
                      (double)p->smooth);
    }
    double t1 = comet_now_s();
    if (st >= 0) {
        stage(q, COMET_QUANTIZE_QUANTIZE);
        st = comet_fmpq_quantize(m, cs, &fp);
    }
    double t2 = comet_now_s();
    long calib_tokens = cs ? cs->n_tokens : 0;
    comet_calib_stats_free(cs);
    COMET_TRY(st);
    comet_quant_config *qc = m->quant;
    if (need_calib)
        snprintf(qc->calib_corpus, sizeof qc->calib_corpus, "%s", p->calib_path);
    qc->calib_windows = windows;
    qc->calib_window_len = win_len;
    qc->calib_tokens = calib_tokens;
    stage(q, COMET_QUANTIZE_WRITE);
    COMET_TRY(comet_checkpoint_write(m, out_dir));
    COMET_TRY(comet_checkpoint_write_tokenizer(m, model_path, out_dir));
    if (r) {
        r->config = *qc;
        comet_group_int8_fraction(m, r->int8_fraction, &r->int8_blocks, &r->int8_work);
        for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
            r->group_name[g] = comet_group_name((comet_group)g);
        r->calib_s = t1 - t0;
        r->quant_s = t2 - t1;
        r->out_bytes = dir_bytes(out_dir);
        r->total_s = comet_now_s() - t0;
    }
    return COMET_OK;
}

comet_status comet_quantize(const char *model_path, const char *out_dir,
                            const comet_quantize_params *p, comet_quantize_result *r) {
    if (!model_path || !out_dir || !p || !p->calib_path || p->calib_windows < 1 ||
        p->calib_len < 2 || p->rotate_keep < 0)
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "quantize: model_path, out_dir, p and p->calib_path must be "
                               "non-NULL, calib_windows >= 1, calib_len >= 2, rotate_keep >= 0");
    run q = {.p = p};
    comet_status st = quantize(&q, model_path, out_dir, comet_now_s(), r);
    comet_backend_free(q.be);
    comet_model_free(q.m);
    free(q.ids);
    comet_mmap_close(&q.text);
    return st;
}
