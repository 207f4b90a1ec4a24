/*
 * sparsify/internal.h: the sparsifier object and the pieces sparsify.c,
 * topk.c and group.c share. Not installed; tests include sparsify.h only.
 */
#ifndef DS_SPARSIFY_INTERNAL_H
#define DS_SPARSIFY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/splitmix.h"
#include "sparsify/sparsify.h"

struct ds_sparsifier {
    ds_sparsify_cfg cfg;       /* cfg.unit_off points at units below */
    uint32_t *units;           /* deft: n_units + 1 boundaries, owned */
    size_t n_units;
    size_t n_max;
    ds_select_ops ops;
    /* ops is a device table: vectors, idx, val and the scratch the kernels
     * touch live in the table's memory, reached only through ops (the
     * host reads downloaded copies). The CPU path never looks at this
     * beyond choosing itself. */
    int dev;
    uint32_t *units_k;         /* deft: units as the kernels read them (== units on the CPU) */

    uint64_t rng;              /* SplitMix64 state: random, sage samples */

    /* Threshold methods. */
    int started;               /* the threshold start has happened */
    float delta;               /* threshold for the next call (sage, micro, threshold) */
    double mean_prev;          /* sage: sampled mean |v| of the last call */
    double micro_ratio;        /* micro: count / k of the last call (e in design §4) */
    int micro_fed;             /* ds_micro_feedback() supplied the group's count */
    size_t micro_group_count;
    size_t micro_k_group;      /* k of the whole vector at the last call */
    float micro_cand;          /* micro: the pass also keeps the entries over
                                  delta x this (0 < x <= 1), so that a call
                                  under the band finds its k-th largest among
                                  them; speed only, never the result */

    /* Scratch, grown on demand and kept: top-k candidates (in the table's
     * memory), random's bitmap, deft's per-unit arrays, and on a device
     * random's draws before they are uploaded. */
    uint32_t *cand_idx;
    float *cand_val;
    size_t cand_cap;
    uint32_t *h_idx;
    float *h_val;
    size_t h_cap;
    uint64_t *bitmap;          /* n_max bits, zero between calls */
    double *norms;
    size_t *k_unit;

    /* deft inside a group (ds_deft_ef_step): the layers cut for a group of
     * g_G members, the group's mean squared unit norms fed back one step
     * late (g_fed: ds_deft_feedback supplied them for g_G), this step's
     * per-unit k and bins. */
    unsigned g_G;
    uint32_t *g_units;
    uint32_t *g_units_k;       /* g_units as the kernels read them (== g_units on the CPU) */
    size_t g_n_units;
    double *g_norms, *g_sq;
    size_t *g_k;
    uint32_t *g_bin;
    int g_fed;

    ds_sparsify_totals totals;
};

/* Uniform in [0, n) from SplitMix64 (base/splitmix.h), 1 <= n <= 2^32, no bias (Lemire's multiply and
 * reject, 32-bit draws). */
static inline uint32_t ds_sp_below(uint64_t *state, uint64_t n)
{
    uint64_t m = (ds_splitmix64_step(state) >> 32) * n;
    if ((uint32_t)m < n) {
        const uint32_t t = (uint32_t)((0x100000000ull - n) % n);
        while ((uint32_t)m < t)
            m = (ds_splitmix64_step(state) >> 32) * n;
    }
    return (uint32_t)(m >> 32);
}

/* Memory the kernels touch: the table's on a device, malloc's otherwise
 * (the CPU path as it always was). */
static inline void *ds_sp_alloc(const ds_sparsifier *s, size_t bytes)
{
    return s->dev ? s->ops.alloc(bytes) : malloc(bytes);
}

static inline void ds_sp_free(const ds_sparsifier *s, void *p)
{
    if (s->dev)
        s->ops.free(p);
    else
        free(p);
}

/* Make room for `need` top-k candidates in s->cand_*; 0 or -ENOMEM. */
int ds_sp_cand_reserve(ds_sparsifier *s, size_t need);

/* Exact top-k of v[0..n): the k largest finite |v| (every finite entry when
 * fewer), ties to the lower index, written in index order as idx = base + i
 * and val = v[i]. cap >= min(k, n). *count gets how many were written,
 * *kth_key the magnitude key of the smallest one selected (0 when none),
 * *nonfinite the NaN / Inf entries of v. 0 or -ENOMEM. */
int ds_sp_topk(ds_sparsifier *s, const float *v, size_t n, size_t k, uint32_t base, uint32_t *idx,
               float *val, size_t cap, size_t *count, uint32_t *kth_key, size_t *nonfinite);

/* The k-th largest finite magnitude key of v[0..n) without selecting
 * (the threshold start); 0 when v has fewer than k finite entries.
 * 0 or -ENOMEM. */
int ds_sp_kth_key(ds_sparsifier *s, const float *v, size_t n, size_t k, uint32_t *kth_key);

/* Common argument checks of every select entry point: 0 or the errno to
 * return (and the call is then counted as rejected by the caller). */
int ds_sp_check(const ds_sparsifier *s, const float *v, size_t n, double density,
                const uint32_t *idx, const float *val);

/* Fold a finished call into the totals and the result. */
void ds_sp_account(ds_sparsifier *s, ds_sparsify_result *res, size_t n, size_t k, size_t count,
                   size_t nonfinite, float threshold);

#endif
