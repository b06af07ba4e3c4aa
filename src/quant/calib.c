/* calib.c — calibration statistics files (see calib.h). */
#include "quant/calib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- statistics files --------------------------------------------------------------- */

#define CALIB_MAGIC "COMETCAL"
#define CALIB_VERSION 1

typedef struct calib_header {
    char magic[8];
    int32_t version;
    int32_t n_layer;
    int32_t width[COMET_GROUP_LAYER_COUNT];
    int32_t has_xtx;
    int64_t n_tokens;
    comet_calib_meta meta;
} calib_header;

comet_status comet_calib_stats_save(const comet_calib_stats *cs, const comet_calib_meta *meta,
                                    const char *path) {
    calib_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CALIB_MAGIC, 8);
    h.version = CALIB_VERSION;
    h.n_layer = cs->n_layer;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        h.width[g] = cs->width[g];
    h.has_xtx = cs->xtx[0] != NULL;
    h.n_tokens = cs->n_tokens;
    h.meta = *meta;
    FILE *f = fopen(path, "wb");
    if (!f)
        return comet_set_error(COMET_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int bad = fwrite(&h, sizeof h, 1, f) != 1;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT && !bad; g++) {
        size_t K = (size_t)cs->width[g], n = (size_t)cs->n_layer * K;
        bad = fwrite(cs->sal[g], sizeof(float), n, f) != n;
        if (!bad && h.has_xtx)
            bad = fwrite(cs->xtx[g], sizeof(float), n * K, f) != n * K;
    }
    if (fclose(f) != 0 || bad)
        return comet_set_error(COMET_ERR_IO, "%s: write failed", path);
    return COMET_OK;
}

/* The file name of a path: models and texts are matched by name, not by how the path to
 * them was spelled. */
static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

comet_status comet_calib_stats_load(const char *path, const comet_model_config *cfg,
                                    const comet_calib_meta *want, int need_xtx,
                                    comet_calib_stats **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return comet_set_error(COMET_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    calib_header h;
    comet_status st = COMET_OK;
    comet_calib_stats *cs = NULL;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, CALIB_MAGIC, 8) ||
        h.version != CALIB_VERSION) {
        st = comet_set_error(COMET_ERR_FORMAT,
                             "%s: not a comet calibration statistics file "
                             "(version %d)",
                             path, CALIB_VERSION);
        goto done;
    }
    h.meta.model[sizeof h.meta.model - 1] = h.meta.corpus[sizeof h.meta.corpus - 1] = '\0';
    int same_shape = h.n_layer == cfg->n_layer;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT; g++)
        same_shape &= h.width[g] == comet_group_config_width(cfg, (comet_group)g);
    if (!same_shape || strcmp(base_name(h.meta.model), base_name(want->model)) ||
        strcmp(base_name(h.meta.corpus), base_name(want->corpus)) ||
        h.meta.windows != want->windows || h.meta.window_len != want->window_len ||
        (need_xtx && !h.has_xtx)) {
        st = comet_set_error(COMET_ERR_INVALID_ARG,
                             "%s: statistics of %s on %s (%d windows x %d%s) do not match this "
                             "run (%s on %s, %d x %d%s)",
                             path, h.meta.model, h.meta.corpus, h.meta.windows, h.meta.window_len,
                             h.has_xtx ? ", with XᵀX" : "", want->model, want->corpus,
                             want->windows, want->window_len, need_xtx ? ", with XᵀX" : "");
        goto done;
    }
    if (!(cs = comet_calib_stats_init(cfg, h.has_xtx))) {
        st = COMET_ERR_NOMEM;
        goto done;
    }
    cs->n_tokens = h.n_tokens;
    for (int g = 0; g < COMET_GROUP_LAYER_COUNT && st == COMET_OK; g++) {
        size_t K = (size_t)cs->width[g], n = (size_t)cs->n_layer * K;
        if (fread(cs->sal[g], sizeof(float), n, f) != n ||
            (h.has_xtx && fread(cs->xtx[g], sizeof(float), n * K, f) != n * K))
            st = comet_set_error(COMET_ERR_FORMAT, "%s: truncated", path);
    }
done:
    fclose(f);
    if (st < 0) {
        comet_calib_stats_free(cs);
        return st;
    }
    *out = cs;
    return COMET_OK;
}
