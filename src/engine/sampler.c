/* sampler.c — the parameters' check and merge (comet/sampling.h), then the chain: logit_bias
 * and penalties, temperature, top-k / top-p / min-p, and the draw (see sampler.h).
 *
 * Candidates are (tempered logit, id) pairs. top-k keeps the k largest by a bounded
 * min-heap (V log k). top-p needs the candidates sorted; it first sorts only the 256
 * largest and widens to a full sort only when they hold less than top_p of the mass,
 * which on real distributions they almost never do.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOP_P_FIRST 256

struct comet_sampler {
    comet_sampler_params p; /* p.logit_bias points at `bias_list` */
    int n_vocab;
    uint64_t rng[4];
    float *val;                  /* [V] candidate tempered logits */
    int32_t *idx;                /* [V] candidate ids */
    float *hval;                 /* [V] heap scratch */
    int32_t *hidx;               /* [V] heap scratch */
    int32_t *counts;             /* [V] occurrences in the penalty window; all zero between calls */
    comet_logit_bias *bias_list; /* [n_logit_bias] the request's logit_bias, ids ascending */
    float *bias;                 /* [V] the same, dense (0 elsewhere); NULL without logit_bias */
    comet_sample_adj *adj;       /* [V + n_logit_bias] comet_sampler_sample's listed ids */
};

comet_sampler_params comet_sampler_default_params(void) {
    return (comet_sampler_params){
        .temperature = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .seed = 0,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .logit_bias = NULL,
        .n_logit_bias = 0,
    };
}

const char *comet_sampler_field_name(unsigned bit) {
    switch (bit) {
    case COMET_SAMPLER_TEMPERATURE: return "temperature";
    case COMET_SAMPLER_TOP_K: return "top_k";
    case COMET_SAMPLER_TOP_P: return "top_p";
    case COMET_SAMPLER_MIN_P: return "min_p";
    case COMET_SAMPLER_SEED: return "seed";
    case COMET_SAMPLER_REPEAT_PENALTY: return "repetition_penalty";
    case COMET_SAMPLER_REPEAT_LAST_N: return "repeat_last_n";
    case COMET_SAMPLER_PRESENCE_PENALTY: return "presence_penalty";
    case COMET_SAMPLER_FREQUENCY_PENALTY: return "frequency_penalty";
    case COMET_SAMPLER_LOGIT_BIAS: return "logit_bias";
    default: return "?";
    }
}

static int cmp_bias_id(const void *a, const void *b) {
    int32_t x = ((const comet_logit_bias *)a)->id, y = ((const comet_logit_bias *)b)->id;
    return (x > y) - (x < y);
}

/* The logit_bias entries sorted by id (into out [n]); 0, or the index in `in` of an entry
 * whose id repeats an earlier one's, plus 1. */
static int sort_bias(const comet_logit_bias *in, int n, comet_logit_bias *out) {
    memcpy(out, in, (size_t)n * sizeof *out);
    qsort(out, (size_t)n, sizeof *out, cmp_bias_id);
    for (int i = 1; i < n; i++)
        if (out[i].id == out[i - 1].id)
            for (int j = 0; j < n; j++)
                if (in[j].id == out[i].id)
                    return j + 1;
    return 0;
}

#define BAD(bit, ...)                                                                              \
    do {                                                                                           \
        if (bad)                                                                                   \
            *bad = (bit);                                                                          \
        return comet_set_error(COMET_ERR_INVALID_ARG, __VA_ARGS__);                                \
    } while (0)

comet_status comet_sampler_params_check(const comet_sampler_params *p, int n_vocab, unsigned *bad) {
    if (bad)
        *bad = 0;
    if (!(p->temperature >= 0 && p->temperature <= COMET_SAMPLER_MAX_TEMPERATURE))
        BAD(COMET_SAMPLER_TEMPERATURE, "temperature must be in [0, %g] (0 = greedy), got %g",
            (double)COMET_SAMPLER_MAX_TEMPERATURE, (double)p->temperature);
    if (p->top_k < 0)
        BAD(COMET_SAMPLER_TOP_K, "top_k must be >= 0 (0 = off), got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        BAD(COMET_SAMPLER_TOP_P, "top_p must be in (0, 1] (1 = off), got %g", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        BAD(COMET_SAMPLER_MIN_P, "min_p must be in [0, 1] (0 = off), got %g", (double)p->min_p);
    if (!(p->repeat_penalty > 0 && isfinite(p->repeat_penalty)))
        BAD(COMET_SAMPLER_REPEAT_PENALTY, "repetition_penalty must be > 0 (1 = off), got %g",
            (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        BAD(COMET_SAMPLER_REPEAT_LAST_N, "repeat_last_n must be >= -1 (-1 = all), got %d",
            p->repeat_last_n);
    if (!(fabsf(p->presence_penalty) <= COMET_SAMPLER_MAX_PENALTY))
        BAD(COMET_SAMPLER_PRESENCE_PENALTY, "presence_penalty must be in [-%g, %g], got %g",
            (double)COMET_SAMPLER_MAX_PENALTY, (double)COMET_SAMPLER_MAX_PENALTY,
            (double)p->presence_penalty);
    if (!(fabsf(p->frequency_penalty) <= COMET_SAMPLER_MAX_PENALTY))
        BAD(COMET_SAMPLER_FREQUENCY_PENALTY, "frequency_penalty must be in [-%g, %g], got %g",
            (double)COMET_SAMPLER_MAX_PENALTY, (double)COMET_SAMPLER_MAX_PENALTY,
            (double)p->frequency_penalty);
    int n = p->n_logit_bias, n_ban = 0;
    if (n < 0 || n > COMET_SAMPLER_MAX_BIASED || (n > 0 && !p->logit_bias))
        BAD(COMET_SAMPLER_LOGIT_BIAS, "logit_bias must hold 0..%d entries, got %d",
            COMET_SAMPLER_MAX_BIASED, n);
    for (int i = 0; i < n; i++) {
        const comet_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0 || (n_vocab > 0 && b->id >= n_vocab)) {
            if (n_vocab > 0)
                BAD(COMET_SAMPLER_LOGIT_BIAS,
                    "logit_bias: token id %d is outside the vocabulary [0, %d)", (int)b->id,
                    n_vocab);
            BAD(COMET_SAMPLER_LOGIT_BIAS, "logit_bias: token id %d is negative", (int)b->id);
        }
        if (!(fabsf(b->bias) <= COMET_SAMPLER_MAX_LOGIT_BIAS))
            BAD(COMET_SAMPLER_LOGIT_BIAS,
                "logit_bias: the bias of token %d must be in [-%g, %g], got %g", (int)b->id,
                (double)COMET_SAMPLER_MAX_LOGIT_BIAS, (double)COMET_SAMPLER_MAX_LOGIT_BIAS,
                (double)b->bias);
        n_ban += b->bias == -COMET_SAMPLER_MAX_LOGIT_BIAS;
    }
    if (n > 1) {
        comet_logit_bias *sorted = malloc((size_t)n * sizeof *sorted);
        if (!sorted)
            return comet_set_error(COMET_ERR_NOMEM, "sampler: out of memory");
        int dup = sort_bias(p->logit_bias, n, sorted);
        free(sorted);
        if (dup)
            BAD(COMET_SAMPLER_LOGIT_BIAS, "logit_bias: token id %d is given twice",
                (int)p->logit_bias[dup - 1].id);
    }
    if (n_vocab > 0 && n_ban >= n_vocab)
        BAD(COMET_SAMPLER_LOGIT_BIAS, "logit_bias bans every token of the vocabulary (%d)",
            n_vocab);
    return COMET_OK;
}

#undef BAD

void comet_sampler_params_merge(comet_sampler_params *dst, const comet_sampler_params *src,
                                unsigned given) {
    if (given & COMET_SAMPLER_TEMPERATURE)
        dst->temperature = src->temperature;
    if (given & COMET_SAMPLER_TOP_K)
        dst->top_k = src->top_k;
    if (given & COMET_SAMPLER_TOP_P)
        dst->top_p = src->top_p;
    if (given & COMET_SAMPLER_MIN_P)
        dst->min_p = src->min_p;
    if (given & COMET_SAMPLER_SEED)
        dst->seed = src->seed;
    if (given & COMET_SAMPLER_REPEAT_PENALTY)
        dst->repeat_penalty = src->repeat_penalty;
    if (given & COMET_SAMPLER_REPEAT_LAST_N)
        dst->repeat_last_n = src->repeat_last_n;
    if (given & COMET_SAMPLER_PRESENCE_PENALTY)
        dst->presence_penalty = src->presence_penalty;
    if (given & COMET_SAMPLER_FREQUENCY_PENALTY)
        dst->frequency_penalty = src->frequency_penalty;
    if (given & COMET_SAMPLER_LOGIT_BIAS) {
        dst->logit_bias = src->logit_bias;
        dst->n_logit_bias = src->n_logit_bias;
    }
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

void comet_sampler_reseed(comet_sampler *s, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
}

double comet_sampler_uniform(comet_sampler *s) {
    return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

comet_sampler *comet_sampler_init(const comet_sampler_params *p, int n_vocab) {
    if (n_vocab <= 0) {
        comet_set_error(COMET_ERR_INVALID_ARG, "sampler: n_vocab must be positive, got %d",
                        n_vocab);
        return NULL;
    }
    if (comet_sampler_params_check(p, n_vocab, NULL) < 0) {
        char why[256]; /* the message, copied: comet_set_error writes over it */
        snprintf(why, sizeof why, "%s", comet_last_error());
        comet_set_error(COMET_ERR_INVALID_ARG, "sampler: %s", why);
        return NULL;
    }
    int nb = p->n_logit_bias;
    comet_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->val = malloc((size_t)n_vocab * sizeof *s->val);
        s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
        s->hval = malloc((size_t)n_vocab * sizeof *s->hval);
        s->hidx = malloc((size_t)n_vocab * sizeof *s->hidx);
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
        s->adj = malloc(((size_t)n_vocab + (size_t)nb) * sizeof *s->adj);
        if (nb > 0) {
            s->bias_list = malloc((size_t)nb * sizeof *s->bias_list);
            s->bias = calloc((size_t)n_vocab, sizeof *s->bias);
        }
    }
    if (!s || !s->val || !s->idx || !s->hval || !s->hidx || !s->counts || !s->adj ||
        (nb > 0 && (!s->bias_list || !s->bias))) {
        comet_sampler_free(s);
        comet_set_error(COMET_ERR_NOMEM, "sampler: out of memory");
        return NULL;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
    if (nb > 0) {
        sort_bias(p->logit_bias, nb, s->bias_list); /* distinct: checked above */
        for (int i = 0; i < nb; i++)
            s->bias[s->bias_list[i].id] = s->bias_list[i].bias;
    }
    s->p.logit_bias = nb > 0 ? s->bias_list : NULL;
    comet_sampler_reseed(s, p->seed);
    return s;
}

void comet_sampler_free(comet_sampler *s) {
    if (!s)
        return;
    free(s->val);
    free(s->idx);
    free(s->hval);
    free(s->hidx);
    free(s->counts);
    free(s->bias_list);
    free(s->bias);
    free(s->adj);
    free(s);
}

static int penalties_on(const comet_sampler_params *p) {
    return !(p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
             p->frequency_penalty == 0.0f);
}

int comet_sampler_adjust_cap(const comet_sampler *s, int n) {
    return (n < s->n_vocab ? n : s->n_vocab) + s->p.n_logit_bias;
}

int comet_sampler_adjust_list(comet_sampler *s, const int32_t *hist, int n, comet_sample_adj *adj) {
    const comet_sampler_params *p = &s->p;
    const int pen = penalties_on(p);
    int k = 0;
    if (pen) {
        int w = p->repeat_last_n < 0 || p->repeat_last_n > n ? n : p->repeat_last_n;
        const int32_t *h = hist + (n - w);
        for (int i = 0; i < w; i++)
            if (h[i] >= 0 && h[i] < s->n_vocab)
                s->counts[h[i]]++;
        for (int i = 0; i < w; i++) {
            int32_t id = h[i];
            if (id < 0 || id >= s->n_vocab || s->counts[id] <= 0)
                continue; /* out of range, or already listed (-1) */
            adj[k++] = (comet_sample_adj){id, s->counts[id], s->bias ? s->bias[id] : 0.0f};
            s->counts[id] = -1;
        }
    }
    int n_window = k;
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t id = s->bias_list[i].id;
        if (pen && s->counts[id] == -1)
            continue; /* listed with its count */
        adj[k++] = (comet_sample_adj){id, 0, s->bias_list[i].bias};
    }
    for (int i = 0; i < n_window; i++)
        s->counts[adj[i].id] = 0;
    return k;
}

float comet_sampler_adjust(const comet_sampler_params *p, float logit, int32_t count, float bias) {
    if (bias == -COMET_SAMPLER_MAX_LOGIT_BIAS)
        return -INFINITY; /* banned */
    if (bias != 0.0f)
        logit += bias;
    if (count == 0)
        return logit;
    float l = logit > 0 ? logit / p->repeat_penalty : logit * p->repeat_penalty;
    /* one fused multiply-add, written out: the CUDA sampler computes the same */
    return l - fmaf(p->frequency_penalty, (float)count, p->presence_penalty);
}

static void apply_adjustments(comet_sampler *s, float *logits, const int32_t *hist, int n) {
    int k = comet_sampler_adjust_list(s, hist, n, s->adj);
    for (int i = 0; i < k; i++) {
        const comet_sample_adj *a = &s->adj[i];
        logits[a->id] = comet_sampler_adjust(&s->p, logits[a->id], a->count, a->bias);
    }
}

/* a before b in the candidate order: larger value first, then lower id */
static inline int ahead(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

/* Sift a hole at the root of the min-heap (hv, hi)[0..sz) down to where (v, id) belongs;
 * moves the children up and returns the slot for (v, id) (the caller stores it there). */
static int sift_down(float *hv, int32_t *hi, int sz, float v, int32_t id) {
    int c = 0;
    for (;;) {
        int l = 2 * c + 1, r = l + 1, w = c;
        float wv = v;
        int32_t wi = id;
        if (l < sz && ahead(wv, wi, hv[l], hi[l]))
            w = l, wv = hv[l], wi = hi[l];
        if (r < sz && ahead(wv, wi, hv[r], hi[r]))
            w = r;
        if (w == c)
            return c;
        hv[c] = hv[w];
        hi[c] = hi[w];
        c = w;
    }
}

/* Write the m best of the n candidates, sorted, to the front of (val, idx); returns m.
 * The other candidates are not kept (the front m slots are overwritten). */
static int select_top(comet_sampler *s, int n, int m) {
    if (m > n)
        m = n;
    float *hv = s->hval;
    int32_t *hi = s->hidx;
    int sz = 0;
    /* min-heap on the candidate order: the root is the worst kept candidate */
    for (int i = 0; i < n; i++) {
        float v = s->val[i];
        int32_t id = s->idx[i];
        int c;
        if (sz < m) {
            c = sz++;
            while (c > 0 && ahead(hv[(c - 1) / 2], hi[(c - 1) / 2], v, id)) {
                hv[c] = hv[(c - 1) / 2];
                hi[c] = hi[(c - 1) / 2];
                c = (c - 1) / 2;
            }
        } else if (ahead(v, id, hv[0], hi[0])) {
            c = sift_down(hv, hi, sz, v, id);
        } else {
            continue;
        }
        hv[c] = v;
        hi[c] = id;
    }
    /* pop worst-first into the tail of the front m slots */
    for (int k = m - 1; k >= 0; k--) {
        s->val[k] = hv[0];
        s->idx[k] = hi[0];
        float v = hv[--sz];
        int32_t id = hi[sz];
        int c = sift_down(hv, hi, sz, v, id);
        if (sz > 0) {
            hv[c] = v;
            hi[c] = id;
        }
    }
    return m;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int comet_sampler_greedy(const comet_sampler *s) {
    return s->p.temperature < COMET_SAMPLER_GREEDY_BELOW || s->p.top_k == 1;
}

comet_sample_row comet_sampler_row(comet_sampler *s, int row, int adj_offset, int n_adj) {
    const comet_sampler_params *p = &s->p;
    int greedy = comet_sampler_greedy(s), has_ban = 0;
    for (int i = 0; i < p->n_logit_bias && !has_ban; i++)
        has_ban = p->logit_bias[i].bias == -COMET_SAMPLER_MAX_LOGIT_BIAS;
    return (comet_sample_row){
        .p = *p,
        .row = row,
        .greedy = greedy,
        .inv_temperature = greedy ? 1.0f : 1.0f / p->temperature,
        .log_min_p = p->min_p > 0.0f ? logf(p->min_p) : -INFINITY,
        .adj_offset = adj_offset,
        .n_adj = n_adj,
        .has_ban = has_ban,
        .u = greedy ? 0.0 : comet_sampler_uniform(s),
    };
}

const comet_sampler_params *comet_sampler_get_params(const comet_sampler *s) { return &s->p; }

int32_t comet_sampler_sample(comet_sampler *s, float *logits, const int32_t *history,
                             int n_history) {
    apply_adjustments(s, logits, history, n_history);
    if (comet_sampler_greedy(s))
        return argmax(logits, s->n_vocab);
    return comet_sampler_pick(s, logits, comet_sampler_uniform(s));
}

int32_t comet_sampler_pick(comet_sampler *s, const float *logits, double u) {
    const comet_sampler_params *p = &s->p;
    int V = s->n_vocab;
    if (comet_sampler_greedy(s))
        return argmax(logits, V);

    float inv_t = 1.0f / p->temperature;
    for (int i = 0; i < V; i++) {
        s->val[i] = logits[i] * inv_t;
        s->idx[i] = i;
    }
    int n = V, sorted = 0;
    if (p->top_k > 0 && p->top_k < V) {
        n = select_top(s, n, p->top_k);
        sorted = 1;
    }
    float zmax = s->val[0];
    for (int i = 1; i < n; i++)
        if (s->val[i] > zmax)
            zmax = s->val[i];
    if (p->top_p < 1.0f) {
        double z = 0.0;
        for (int i = 0; i < n; i++)
            z += exp((double)s->val[i] - zmax);
        int m = sorted ? n : select_top(s, n, TOP_P_FIRST);
        for (;;) {
            double cum = 0.0;
            int cut = -1;
            for (int i = 0; i < m; i++) {
                cum += exp((double)s->val[i] - zmax) / z;
                if (cum >= p->top_p) {
                    cut = i + 1;
                    break;
                }
            }
            if (cut > 0) {
                n = cut;
                break;
            }
            if (m == n) /* rounding: the whole set is kept */
                break;
            /* the first TOP_P_FIRST did not reach top_p (only without top-k, so the
             * candidates are the whole vocabulary): rebuild them and sort them all */
            for (int i = 0; i < V; i++) {
                s->val[i] = logits[i] * inv_t;
                s->idx[i] = i;
            }
            m = select_top(s, n, n);
        }
    }
    if (p->min_p > 0.0f) {
        float floor_z = zmax + logf(p->min_p); /* p_i >= min_p * p_max */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (s->val[i] >= floor_z) {
                s->val[k] = s->val[i];
                s->idx[k++] = s->idx[i];
            }
        n = k;
    }
    double z = 0.0;
    for (int i = 0; i < n; i++)
        z += exp((double)s->val[i] - zmax);
    double target = u * z, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp((double)s->val[i] - zmax);
        if (target < acc)
            return s->idx[i];
    }
    return s->idx[n - 1];
}
