/* kv_format.c — the KV cache format's names, check and default policy (comet/kv_format.h). */
#include "comet/kv_format.h"

#include <string.h>

#include "numerics/quant.h"

const char *comet_kv_type_name(int type) {
    switch (type) {
    case COMET_KV_F16: return "f16";
    case COMET_KV_INT8: return "int8";
    case COMET_KV_INT4: return "int4";
    }
    return NULL;
}

int comet_kv_type_bits(int type) {
    switch (type) {
    case COMET_KV_F16: return 16;
    case COMET_KV_INT8: return 8;
    case COMET_KV_INT4: return 4;
    }
    return 0;
}

int comet_kv_type_from_bits(int bits) {
    switch (bits) {
    case 16: return COMET_KV_F16;
    case 8: return COMET_KV_INT8;
    case 4: return COMET_KV_INT4;
    }
    return -1;
}

int comet_kv_type_quantized(int type) { return type == COMET_KV_INT8 || type == COMET_KV_INT4; }

const char *comet_kv_rotation_name(int rotation) {
    switch (rotation) {
    case COMET_KV_ROTATION_NONE: return "none";
    case COMET_KV_ROTATION_HADAMARD: return "hadamard";
    }
    return NULL;
}

int comet_kv_rotation_parse(const char *name) {
    if (!name)
        return -1;
    if (!strcmp(name, "none"))
        return COMET_KV_ROTATION_NONE;
    if (!strcmp(name, "hadamard"))
        return COMET_KV_ROTATION_HADAMARD;
    return -1;
}

int comet_kv_default_group(int head_dim) { return head_dim % 16 == 0 ? 16 : 0; }

comet_status comet_kv_format_check(const comet_kv_format *f, int head_dim, const char *who) {
    if (head_dim <= 0)
        return comet_set_error(COMET_ERR_INVALID_ARG, "%s: KV cache of head dim %d", who, head_dim);
    if (!comet_kv_type_name(f->type))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: KV cache type %d; 4, 8 or 16 bits (int4, int8, f16) would "
                               "work",
                               who, f->type);
    if (f->group < 0 || f->group > head_dim || (f->group > 0 && head_dim % f->group))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: KV group %d does not divide the head dim %d; a divisor of %d "
                               "would work",
                               who, f->group, head_dim, head_dim);
    if (!comet_kv_rotation_name(f->rotation))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: KV rotation %d; none or hadamard would work", who, f->rotation);
    if (f->rotation == COMET_KV_ROTATION_HADAMARD && !comet_is_pow2(head_dim))
        return comet_set_error(COMET_ERR_INVALID_ARG,
                               "%s: the hadamard KV rotation needs a power-of-two head dim, not "
                               "%d; rotation none would work",
                               who, head_dim);
    return COMET_OK;
}

comet_status comet_kv_format_resolve(const comet_kv_format *req, const comet_kv_format *base,
                                     int head_dim, const char *who, comet_kv_format *out) {
    comet_kv_format f = *req;
    if (f.type == -1)
        f.type = base ? base->type : COMET_KV_F16;
    const int quantized = comet_kv_type_quantized(f.type);
    const int policy = !base || (quantized && !comet_kv_type_quantized(base->type));
    if (f.group == 0)
        f.group = policy ? (quantized ? comet_kv_default_group(head_dim) : 0) : base->group;
    if (f.rotation == -1)
        f.rotation = !policy                                ? base->rotation
                     : quantized && comet_is_pow2(head_dim) ? COMET_KV_ROTATION_HADAMARD
                                                            : COMET_KV_ROTATION_NONE;
    COMET_TRY(comet_kv_format_check(&f, head_dim, who));
    if (f.group == 0)
        f.group = head_dim;
    *out = f;
    return COMET_OK;
}
