/* sampler.c — penalties, temperature, top-k / top-p / min-p, and the draw (see sampler.h).
 *
 * Candidates are (tempered logit, id) pairs. top-k keeps the k largest by a bounded
 * min-heap (V log k). top-p needs the candidates sorted; it first sorts only the 256
 * largest and widens to a full sort only when they hold less than top_p of the mass,
 * which on real distributions they almost never do.
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOP_P_FIRST 256

struct comet_sampler {
    comet_sampler_params p;
    int n_vocab;
    uint64_t rng[4];
    float *val;      /* [V] candidate tempered logits */
    int32_t *idx;    /* [V] candidate ids */
    float *hval;     /* [V] heap scratch */
    int32_t *hidx;   /* [V] heap scratch */
    int32_t *counts; /* [V] occurrences in the penalty window; all zero between calls */
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
    };
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
    const char *bad = NULL;
    if (!(p->temperature >= 0))
        bad = "temperature must be >= 0";
    else if (p->top_k < 0)
        bad = "top_k must be >= 0";
    else if (!(p->top_p > 0 && p->top_p <= 1))
        bad = "top_p must be in (0, 1]";
    else if (!(p->min_p >= 0 && p->min_p <= 1))
        bad = "min_p must be in [0, 1]";
    else if (!(p->repeat_penalty > 0))
        bad = "repeat_penalty must be > 0";
    else if (n_vocab <= 0)
        bad = "n_vocab must be positive";
    if (bad) {
        comet_set_error(COMET_ERR_INVALID_ARG, "sampler: %s", bad);
        return NULL;
    }
    comet_sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->val = malloc((size_t)n_vocab * sizeof *s->val);
        s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
        s->hval = malloc((size_t)n_vocab * sizeof *s->hval);
        s->hidx = malloc((size_t)n_vocab * sizeof *s->hidx);
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    }
    if (!s || !s->val || !s->idx || !s->hval || !s->hidx || !s->counts) {
        comet_sampler_free(s);
        comet_set_error(COMET_ERR_NOMEM, "sampler: out of memory");
        return NULL;
    }
    s->p = *p;
    s->n_vocab = n_vocab;
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
    free(s);
}

int comet_sampler_penalty_list(comet_sampler *s, const int32_t *hist, int n, int32_t *ids,
                               int32_t *counts) {
    const comet_sampler_params *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return 0;
    int w = p->repeat_last_n < 0 || p->repeat_last_n > n ? n : p->repeat_last_n;
    const int32_t *h = hist + (n - w);
    for (int i = 0; i < w; i++)
        if (h[i] >= 0 && h[i] < s->n_vocab)
            s->counts[h[i]]++;
    int k = 0;
    for (int i = 0; i < w; i++) {
        int32_t id = h[i];
        if (id < 0 || id >= s->n_vocab || s->counts[id] == 0)
            continue; /* out of range, or already listed */
        ids[k] = id;
        counts[k++] = s->counts[id];
        s->counts[id] = 0;
    }
    return k;
}

float comet_sampler_penalize(const comet_sampler_params *p, float logit, int32_t count) {
    float l = logit > 0 ? logit / p->repeat_penalty : logit * p->repeat_penalty;
    /* one fused multiply-add, written out: the CUDA sampler computes the same */
    return l - fmaf(p->frequency_penalty, (float)count, p->presence_penalty);
}

static void apply_penalties(comet_sampler *s, float *logits, const int32_t *hist, int n) {
    int k = comet_sampler_penalty_list(s, hist, n, s->hidx, s->idx);
    for (int i = 0; i < k; i++)
        logits[s->hidx[i]] = comet_sampler_penalize(&s->p, logits[s->hidx[i]], s->idx[i]);
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
    return s->p.temperature <= 0.0f || s->p.top_k == 1;
}

const comet_sampler_params *comet_sampler_get_params(const comet_sampler *s) { return &s->p; }

int32_t comet_sampler_sample(comet_sampler *s, float *logits, const int32_t *history,
                             int n_history) {
    apply_penalties(s, logits, history, n_history);
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
