/*
 * kernels/cpu/select_ref.c: the plain C reference of every selection kernel
 * (see kernels/select.h), and the CPU selection table.
 *
 * Compiled without SIMD flags on purpose: these are the definitions that
 * select_avx2.c, select_avx512.c and kernels/cuda/select.cu are checked
 * against (tests/test_select.c, tests/test_select_cuda.c), so they are
 * written to be obviously right rather than fast. The optimized variants
 * must give the same bits: the same kept set in the same order, the same
 * tallies and histogram, the same gathered and scattered floats; only the
 * norms may differ in the last bits of the double sum.
 *
 * Five families have no SIMD variant. absmean_at reads about 400 random
 * positions: it is bound by the latency of those loads, which a vector
 * gather does not hide, and it costs microseconds next to a pass over the
 * vector. zero_at writes scattered zeros; the stores are the whole cost and
 * a vector scatter issues the same stores. hist_sub runs over a top-k's
 * candidates only (a few times k entries, in cache), and filter_ties over
 * a list; on the CPU the sparsifier keeps its own branch-free loop for the
 * latter (sparsify/topk.c), so both are here as the definition the CUDA
 * table is checked against. accumulate is a loop the compiler vectorizes.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/select.h"

DS_DECL_SEL_COUNT(ds_sel_count_c)
{
    size_t counted = 0, nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t k = ds_sel_key(v[i]);
        if (k >= DS_SEL_KEY_INF)
            nonfinite++;
        else if (k >= t)
            counted++;
    }
    out->kept = 0;
    out->counted = counted;
    out->nonfinite = nonfinite;
}

DS_DECL_SEL_COMPACT(ds_sel_compact_c)
{
    size_t kept = 0, counted = 0, nonfinite = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t k = ds_sel_key(v[i]);
        if (k >= DS_SEL_KEY_INF) {
            nonfinite++;
            continue;
        }
        if (k >= t_count)
            counted++;
        if (k >= t_keep) {
            if (kept < cap) {
                idx[kept] = base + (uint32_t)i;
                val[kept] = v[i];
            }
            kept++;
        }
    }
    out->kept = kept;
    out->counted = counted;
    out->nonfinite = nonfinite;
}

DS_DECL_SEL_FILTER(ds_sel_filter_c)
{
    size_t j = 0;
    for (size_t i = 0; i < count; i++) {
        if (ds_sel_key(val[i]) >= t) {
            idx[j] = idx[i];
            val[j] = val[i];
            j++;
        }
    }
    return j;
}

DS_DECL_SEL_FILTER_TIES(ds_sel_filter_ties_c)
{
    size_t j = 0;
    for (size_t i = 0; i < count; i++) {
        const uint32_t k = ds_sel_key(val[i]);
        if (k > t || (k == t && ties > 0)) {
            ties -= k == t;
            oidx[j] = idx[i];
            oval[j] = val[i];
            j++;
        }
    }
    return j;
}

DS_DECL_SEL_HIST_SUB(ds_sel_hist_sub_c)
{
    for (size_t i = 0; i < n; i++) {
        const uint32_t key = ds_sel_key(v[i]);
        if ((key >> (shift + 10)) == prefix)
            hist[(key >> shift) & (DS_SEL_SUB_BUCKETS - 1)]++;
    }
}

DS_DECL_SEL_HIST(ds_sel_hist_c)
{
    for (size_t i = 0; i < n; i++)
        hist[ds_sel_key(v[i]) >> DS_SEL_HIST_SHIFT]++;
}

DS_DECL_SEL_NORMS(ds_sel_norms_c)
{
    for (size_t u = 0; u < n_units; u++) {
        double s = 0;
        for (uint32_t i = unit_off[u]; i < unit_off[u + 1]; i++)
            if (ds_sel_key(v[i]) < DS_SEL_KEY_INF)
                s += (double)v[i] * (double)v[i];
        norms[u] = sqrt(s);
    }
}

DS_DECL_SEL_ABSMEAN_AT(ds_sel_absmean_at_c)
{
    double s = 0;
    size_t good = 0;
    for (size_t j = 0; j < count; j++) {
        const float x = v[pos[j]];
        if (ds_sel_key(x) < DS_SEL_KEY_INF) {
            s += fabs((double)x);
            good++;
        }
    }
    *used = good;
    return good ? s / (double)good : 0.0;
}

DS_DECL_SEL_GATHER(ds_sel_gather_c)
{
    for (size_t j = 0; j < count; j++)
        out[j] = v[idx[j]];
}

DS_DECL_SEL_SCATTER_ADD(ds_sel_scatter_add_c)
{
    /* C11 without -ffp-contract=fast keeps w * val and the add as two
     * rounded operations; the SIMD variants use a multiply then an add to
     * match. */
    for (size_t j = 0; j < count; j++) {
        const float p = w * val[j];
        y[idx[j]] = y[idx[j]] + p;
    }
}

DS_DECL_SEL_ZERO_AT(ds_sel_zero_at_c)
{
    for (size_t j = 0; j < count; j++)
        y[idx[j]] = 0.0f;
}

DS_DECL_SEL_ACCUMULATE(ds_sel_accumulate_c)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] + x[i];
}

static int sync_cpu(void)
{
    return 0;
}

static void *alloc_cpu(size_t bytes)
{
    /* Never NULL for 0 bytes: NULL means "no memory" here. */
    return malloc(bytes ? bytes : 1);
}

static void free_cpu(void *p)
{
    free(p);
}

static int copy_cpu(void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
    return 0;
}

void ds_select_ops_init(ds_select_ops *ops, unsigned cpu_flags)
{
    memset(ops, 0, sizeof(*ops));
    ops->kind = DS_BACKEND_CPU;
    ops->device = -1;
    ops->count = ds_sel_count_c;
    ops->compact = ds_sel_compact_c;
    ops->filter = ds_sel_filter_c;
    ops->filter_ties = ds_sel_filter_ties_c;
    ops->hist = ds_sel_hist_c;
    ops->hist_sub = ds_sel_hist_sub_c;
    ops->norms = ds_sel_norms_c;
    ops->absmean_at = ds_sel_absmean_at_c;
    ops->gather = ds_sel_gather_c;
    ops->scatter_add = ds_sel_scatter_add_c;
    ops->zero_at = ds_sel_zero_at_c;
    ops->accumulate = ds_sel_accumulate_c;
    ops->sync = sync_cpu;
    ops->alloc = alloc_cpu;
    ops->free = free_cpu;
    ops->upload = copy_cpu;
    ops->download = copy_cpu;
#if ARCH_X86_64
    if (cpu_flags & DS_CPU_AVX2) {
        ops->count = ds_sel_count_avx2;
        ops->compact = ds_sel_compact_avx2;
        ops->filter = ds_sel_filter_avx2;
        ops->hist = ds_sel_hist_avx2;
        ops->norms = ds_sel_norms_avx2;
        ops->gather = ds_sel_gather_avx2;
        ops->scatter_add = ds_sel_scatter_add_avx2;
    }
    if (cpu_flags & DS_CPU_AVX512) {
        ops->count = ds_sel_count_avx512;
        ops->compact = ds_sel_compact_avx512;
        ops->filter = ds_sel_filter_avx512;
        ops->hist = ds_sel_hist_avx512;
        ops->norms = ds_sel_norms_avx512;
        ops->gather = ds_sel_gather_avx512;
        ops->scatter_add = ds_sel_scatter_add_avx512;
    }
#endif
    snprintf(ops->name, sizeof(ops->name), "select-%s", ds_cpu_flags_name(cpu_flags));
}

#if !HAVE_CUDA
int ds_select_cuda_available(int device, char *why, size_t why_len)
{
    (void)device;
    snprintf(why, why_len, "this build has no CUDA backend (configured with -Dcuda=disabled or no nvcc)");
    return 0;
}

int ds_select_ops_init_cuda(ds_select_ops *ops, int device, char *why, size_t why_len)
{
    (void)ops;
    (void)device;
    snprintf(why, why_len, "this build has no CUDA backend (configured with -Dcuda=disabled or no nvcc)");
    return -ENODEV;
}

void ds_select_cuda_fini(ds_select_ops *ops)
{
    (void)ops;
}
#endif
