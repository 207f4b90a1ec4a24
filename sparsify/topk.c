/*
 * sparsify/topk.c: exact top-k by magnitude in linear time (design §4's
 * topk, DEFT's per-unit selection and the threshold start).
 *
 * Radix select on the magnitude keys (float bits with the sign cleared,
 * which order like the magnitudes; kernels/select.h):
 *   1. one streaming pass builds a histogram of the top 11 key bits (2048
 *      buckets; exponent and three mantissa bits). Walking it from the top
 *      finds the bucket b1 that holds the k-th largest key, the number of
 *      entries above it, and, for free, the NaN / Inf count (the buckets
 *      at and above the key of +Inf, which are skipped);
 *   2. one compaction pass keeps every entry with key >= b1 << 20: the
 *      entries certainly selected plus the bucket's. With gradient-like
 *      data a bucket spans an eighth of an octave, so this is about 1.2 to
 *      3 times k entries, already in index order;
 *   3. the remaining 20 key bits are resolved on those candidates only
 *      (two 1024-bucket histograms, in cache), which gives the exact k-th
 *      key and how many entries equal to it still fit;
 *   4. one branch-free pass over the candidates keeps the keys above the
 *      k-th and the first of the keys equal to it, so ties go to the lower
 *      index, and leaves exactly k entries in index order.
 * Two passes over the vector and none of sorting. The candidates are built
 * in the caller's buffers when they fit and in the sparsifier's scratch
 * otherwise.
 *
 * On a device table (s->dev) every pass is a kernel of the table and the
 * host sees histograms only: step 3's histograms come from hist_sub on
 * the device's candidates (the CPU runs the same kernel on its own), step
 * 4 is filter_ties (the first `ties` entries equal to the k-th key), and
 * "every finite entry" (k >= the finite count) takes the general path
 * with k = that count, whose refine finds the smallest key the CPU path
 * reads off the values. The selection is the same, bit for bit.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sparsify/internal.h"

#define B1_FIRST_NONFINITE (DS_SEL_KEY_INF >> DS_SEL_HIST_SHIFT) /* 0x7f8 */

int ds_sp_cand_reserve(ds_sparsifier *s, size_t need)
{
    if (need <= s->cand_cap)
        return 0;
    size_t cap = s->cand_cap ? s->cand_cap : 1024;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint32_t *ni = ds_sp_alloc(s, cap * sizeof(*ni));
    float *nv = ds_sp_alloc(s, cap * sizeof(*nv));
    if (!ni || !nv) {
        ds_sp_free(s, ni);
        ds_sp_free(s, nv);
        return -ENOMEM;
    }
    ds_sp_free(s, s->cand_idx);
    ds_sp_free(s, s->cand_val);
    s->cand_idx = ni;
    s->cand_val = nv;
    s->cand_cap = cap;
    return 0;
}

/* Histogram pass; returns the bucket of the k-th largest finite key in
 * *b1 and how many finite entries lie in buckets above it in *above.
 * Requires 1 <= k <= finite. */
static void find_bucket(const uint32_t *hist, size_t k, uint32_t *b1, size_t *above)
{
    size_t acc = 0;
    uint32_t b = B1_FIRST_NONFINITE;
    while (b-- > 0) {
        if (acc + hist[b] >= k)
            break;
        acc += hist[b];
    }
    *b1 = b;
    *above = acc;
}

/* Steps 3: the need-th largest key among the candidates whose key lies in
 * bucket b1 (1 <= need <= their number). Returns the key and, in *gt, how
 * many of those bucket entries are strictly greater. The histograms are
 * the table's hist_sub, so cv may be device memory. */
static uint32_t refine(const ds_sparsifier *s, const float *cv, size_t nc, uint32_t b1,
                       size_t need, size_t *gt)
{
    uint32_t h[DS_SEL_SUB_BUCKETS];
    memset(h, 0, sizeof(h));
    /* The candidates above b1 are selected already; only b1's count. */
    s->ops.hist_sub(cv, nc, b1, 10, h);
    size_t acc = 0;
    uint32_t b2 = 1024;
    while (b2-- > 0) {
        if (acc + h[b2] >= need)
            break;
        acc += h[b2];
    }
    const uint32_t prefix = (b1 << 10) | b2;
    memset(h, 0, sizeof(h));
    s->ops.hist_sub(cv, nc, prefix, 0, h);
    uint32_t b3 = 1024;
    while (b3-- > 0) {
        if (acc + h[b3] >= need)
            break;
        acc += h[b3];
    }
    *gt = acc;
    return (prefix << 10) | b3;
}

/* The histogram, the bucket, the finite count; shared by both entry
 * points. */
static void histogram(const ds_sparsifier *s, const float *v, size_t n, uint32_t *hist,
                      size_t *nonfinite)
{
    memset(hist, 0, DS_SEL_HIST_BUCKETS * sizeof(*hist));
    s->ops.hist(v, n, hist);
    size_t nf = 0;
    for (uint32_t b = B1_FIRST_NONFINITE; b < DS_SEL_HIST_BUCKETS; b++)
        nf += hist[b];
    *nonfinite = nf;
}

int ds_sp_topk(ds_sparsifier *s, const float *v, size_t n, size_t k, uint32_t base, uint32_t *idx,
               float *val, size_t cap, size_t *count, uint32_t *kth_key, size_t *nonfinite)
{
    uint32_t hist[DS_SEL_HIST_BUCKETS];
    ds_sel_tally tl;
    *count = 0;
    *kth_key = 0;
    *nonfinite = 0;
    if (n == 0 || k == 0)
        return 0;
    size_t nf;
    histogram(s, v, n, hist, &nf);
    *nonfinite = nf;
    const size_t finite = n - nf;
    if (finite == 0)
        return 0;
    if (k >= finite && !s->dev) {
        /* Everything finite goes; cap >= min(k, n) >= finite. */
        s->ops.compact(v, n, 0, 0, base, idx, val, cap, &tl);
        *count = tl.kept;
        uint32_t lo = UINT32_MAX;
        for (size_t j = 0; j < tl.kept; j++) {
            const uint32_t key = ds_sel_key(val[j]);
            lo = key < lo ? key : lo;
        }
        *kth_key = lo;
        return 0;
    }
    if (k > finite)
        k = finite; /* a device: every finite entry by the general path (top of the file) */

    uint32_t b1;
    size_t above;
    find_bucket(hist, k, &b1, &above);
    const size_t nc = above + hist[b1];
    uint32_t *ci = idx;
    float *cv = val;
    if (nc > cap) {
        int ret = ds_sp_cand_reserve(s, nc);
        if (ret < 0)
            return ret;
        ci = s->cand_idx;
        cv = s->cand_val;
    }
    s->ops.compact(v, n, b1 << DS_SEL_HIST_SHIFT, 0, base, ci, cv, nc, &tl);

    size_t gt_in_bucket;
    const uint32_t kth = refine(s, cv, nc, b1, k - above, &gt_in_bucket);
    size_t ties = k - above - gt_in_bucket; /* entries equal to kth to keep */
    *kth_key = kth;
    if (s->dev) {
        /* Step 4 as a kernel: what the loop below keeps. */
        *count = s->ops.filter_ties(idx, val, ci, cv, nc, kth, ties);
        return 0;
    }

    /* Step 4, branch-free: write every candidate at j, advance j only for
     * the ones kept. j <= i, so this works in place; once k are kept the
     * rest are all dropped, and stopping there keeps the writes below k. */
    size_t j = 0;
    for (size_t i = 0; i < nc && j < k; i++) {
        const uint32_t key = ds_sel_key(cv[i]);
        const int eq = key == kth;
        const int take = (key > kth) | (eq & (ties > 0));
        idx[j] = ci[i];
        val[j] = cv[i];
        j += (size_t)take;
        ties -= (size_t)(eq & take);
    }
    *count = j;
    return 0;
}

int ds_sp_kth_key(ds_sparsifier *s, const float *v, size_t n, size_t k, uint32_t *kth_key)
{
    uint32_t hist[DS_SEL_HIST_BUCKETS];
    *kth_key = 0;
    if (n == 0 || k == 0)
        return 0;
    size_t nf;
    histogram(s, v, n, hist, &nf);
    if (k > n - nf)
        return 0;
    uint32_t b1;
    size_t above;
    find_bucket(hist, k, &b1, &above);
    const size_t nc = above + hist[b1];
    int ret = ds_sp_cand_reserve(s, nc);
    if (ret < 0)
        return ret;
    ds_sel_tally tl;
    s->ops.compact(v, n, b1 << DS_SEL_HIST_SHIFT, 0, 0, s->cand_idx, s->cand_val, nc, &tl);
    size_t gt;
    *kth_key = refine(s, s->cand_val, nc, b1, k - above, &gt);
    return 0;
}
