/*
 * kernels/select.h: the selection kernels under sparsify/ (design §4), as a
 * table of function pointers like kernels.h's ds_ops.
 *
 * Every sparsifier reduces to a few streaming passes over a float vector:
 * count the entries whose magnitude reaches a threshold, compact them into
 * (index, value) lists, build a histogram of magnitudes for an exact k-th
 * value, take per-unit L2 norms, and move values between dense and sparse
 * form (gather, scatter-add, zeroing at an index set, residual += g).
 * Those passes live here so that each has a plain C reference
 * (kernels/cpu/select_ref.c), AVX2 and AVX-512 variants of the streaming
 * ones (select_avx2.c, select_avx512.c, one template select_tmpl.c), and a
 * CUDA version of every family (kernels/cuda/select.cu); with the table's
 * own memory functions, a sparsifier runs unchanged on host or device
 * memory (sparsify/sparsify.c).
 *
 * Magnitudes are compared as integers. For a float x, key(x) = bits(x) with
 * the sign bit cleared; for finite non-negative floats a >= b exactly when
 * key(a) >= key(b), so "|x| >= delta" is "key(x) >= key(delta)", one integer
 * compare per lane, branch-free. key >= DS_SEL_KEY_INF means NaN or +-Inf:
 * such entries are never kept or counted as selected, only tallied in
 * `nonfinite`. Thresholds are keys in [0, DS_SEL_KEY_INF]; the key of a
 * threshold of +Inf selects nothing, the key 0 selects every finite entry.
 *
 * Indices are uint32 (a segment holds at most 2^32 - 1 entries) and come out
 * strictly increasing. `base` is added to every index written, so a kernel
 * run over a sub-range of a segment writes segment-relative indices; the
 * caller keeps base + n <= 2^32.
 *
 * Pointers handed to a table's kernels are that table's memory: host memory
 * for the CPU table, device memory for the CUDA table, except where a
 * family says "host". Tallies, histograms, norms and means always come
 * back in host memory.
 *
 * Test: meson test -C build select --verbose (tests/test_select.c, and
 * tests/test_select_cuda.c which skips without a device). Bench: dsbench
 * sparsify.
 */
#ifndef DS_KERNELS_SELECT_H
#define DS_KERNELS_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define DS_SEL_KEY_INF 0x7f800000u  /* key of +Inf; larger keys are NaN */
#define DS_SEL_HIST_BUCKETS 2048    /* DS_DECL_SEL_HIST: key >> 20 */
#define DS_SEL_HIST_SHIFT 20
#define DS_SEL_SUB_BUCKETS 1024     /* DS_DECL_SEL_HIST_SUB: 10 key bits */

/* The magnitude key of a float (see above). */
static inline uint32_t ds_sel_key(float x)
{
    union {
        float f;
        uint32_t u;
    } c = {x};
    return c.u & 0x7fffffffu;
}

/* The float whose key is `key` (a non-negative magnitude). */
static inline float ds_sel_key_value(uint32_t key)
{
    union {
        uint32_t u;
        float f;
    } c = {key};
    return c.f;
}

/* What one streaming pass saw. */
typedef struct ds_sel_tally {
    size_t kept;      /* finite entries with key >= t_keep, all of them, even past `cap` */
    size_t counted;   /* finite entries with key >= t_count */
    size_t nonfinite; /* NaN and +-Inf entries seen (never kept or counted) */
} ds_sel_tally;

/* Count: out->counted = finite entries of v[0..n) with key >= t,
 * out->nonfinite = NaN/Inf entries, out->kept = 0. */
#define DS_DECL_SEL_COUNT(name) \
    void (name)(const float *v, size_t n, uint32_t t, ds_sel_tally *out)

/* Compact, in one pass: for each finite v[i] with key >= t_keep, in
 * increasing i, write idx[j] = base + i and val[j] = v[i] for j < cap
 * (nothing is ever written at or past cap); out->kept counts all of them,
 * so kept > cap tells the caller the buffers were short. In the same pass
 * out->counted counts finite entries with key >= t_count (a second
 * threshold SAGE needs), out->nonfinite the NaN/Inf entries. */
#define DS_DECL_SEL_COMPACT(name) \
    void (name)(const float *v, size_t n, uint32_t t_keep, uint32_t t_count, \
                uint32_t base, uint32_t *idx, float *val, size_t cap, ds_sel_tally *out)

/* Filter a compacted list in place: keep the entries (idx[j], val[j]) with
 * key(val[j]) >= t, in order; returns how many remain. */
#define DS_DECL_SEL_FILTER(name) \
    size_t (name)(uint32_t *idx, float *val, size_t count, uint32_t t)

/* Filter with a quota on ties: write to (oidx, oval), in order, the
 * entries of (idx, val)[0..count) with key(val[j]) > t and the first `ties`
 * of those with key(val[j]) == t; returns how many. The output is the
 * input (oidx == idx, oval == val: in place) or does not overlap it, and
 * has room for what is kept. filter(t) is filter_ties(t, SIZE_MAX) in
 * place; a top-k keeps the k-th key's ties up to k with it. */
#define DS_DECL_SEL_FILTER_TIES(name) \
    size_t (name)(uint32_t *oidx, float *oval, const uint32_t *idx, const float *val, \
                  size_t count, uint32_t t, size_t ties)

/* Histogram: hist[key(v[i]) >> DS_SEL_HIST_SHIFT] += 1 for every i < n,
 * non-finite entries included (they land in buckets >= DS_SEL_KEY_INF >> 20).
 * hist (host) has DS_SEL_HIST_BUCKETS entries and is added to, not cleared. */
#define DS_DECL_SEL_HIST(name) \
    void (name)(const float *v, size_t n, uint32_t *hist)

/* Histogram of the 10 key bits under a prefix (the refining passes of a
 * radix select): hist[(key(v[i]) >> shift) & 1023] += 1 for every i < n
 * with key(v[i]) >> (shift + 10) == prefix. shift <= 21; hist (host) has
 * DS_SEL_SUB_BUCKETS entries and is added to, not cleared. */
#define DS_DECL_SEL_HIST_SUB(name) \
    void (name)(const float *v, size_t n, uint32_t prefix, unsigned shift, uint32_t *hist)

/* Per-unit L2 norms over finite entries: norms[u] = sqrt(sum of v[i]^2 for
 * unit_off[u] <= i < unit_off[u+1], v[i] finite), accumulated in double.
 * unit_off (table memory) has n_units + 1 non-decreasing entries; norms is
 * host memory. Variants may differ from the reference in the last bits of
 * the sum (its order), never from run to run. */
#define DS_DECL_SEL_NORMS(name) \
    void (name)(const float *v, const uint32_t *unit_off, size_t n_units, double *norms)

/* Mean |v[pos[j]]| over the finite ones of count positions (host pos);
 * *used receives how many were finite. 0 when none. */
#define DS_DECL_SEL_ABSMEAN_AT(name) \
    double (name)(const float *v, const uint32_t *pos, size_t count, size_t *used)

/* out[j] = v[idx[j]] for j < count. */
#define DS_DECL_SEL_GATHER(name) \
    void (name)(float *out, const float *v, const uint32_t *idx, size_t count)

/* y[idx[j]] = y[idx[j]] + w * val[j] for j < count, indices unique; the
 * product and the sum are each rounded to float (no fused multiply-add), so
 * every variant gives the same bits. */
#define DS_DECL_SEL_SCATTER_ADD(name) \
    void (name)(float *y, const uint32_t *idx, const float *val, size_t count, float w)

/* y[idx[j]] = 0 for j < count. */
#define DS_DECL_SEL_ZERO_AT(name) \
    void (name)(float *y, const uint32_t *idx, size_t count)

/* y[i] = y[i] + x[i] for i < n, each sum rounded to float (error
 * feedback's residual += g). */
#define DS_DECL_SEL_ACCUMULATE(name) \
    void (name)(float *y, const float *x, size_t n)

typedef DS_DECL_SEL_COUNT(*ds_sel_count_fn);
typedef DS_DECL_SEL_COMPACT(*ds_sel_compact_fn);
typedef DS_DECL_SEL_FILTER(*ds_sel_filter_fn);
typedef DS_DECL_SEL_FILTER_TIES(*ds_sel_filter_ties_fn);
typedef DS_DECL_SEL_HIST(*ds_sel_hist_fn);
typedef DS_DECL_SEL_HIST_SUB(*ds_sel_hist_sub_fn);
typedef DS_DECL_SEL_NORMS(*ds_sel_norms_fn);
typedef DS_DECL_SEL_ABSMEAN_AT(*ds_sel_absmean_at_fn);
typedef DS_DECL_SEL_GATHER(*ds_sel_gather_fn);
typedef DS_DECL_SEL_SCATTER_ADD(*ds_sel_scatter_add_fn);
typedef DS_DECL_SEL_ZERO_AT(*ds_sel_zero_at_fn);
typedef DS_DECL_SEL_ACCUMULATE(*ds_sel_accumulate_fn);

typedef struct ds_select_ops {
    enum ds_backend_kind kind;
    int device;    /* the CUDA device a CUDA table works on; -1 for the CPU table */
    char name[96]; /* "select-avx512", "select-ref", "select-cuda:0 NVIDIA H200" */

    ds_sel_count_fn count;
    ds_sel_compact_fn compact;
    ds_sel_filter_fn filter;
    ds_sel_filter_ties_fn filter_ties;
    ds_sel_hist_fn hist;
    ds_sel_hist_sub_fn hist_sub;
    ds_sel_norms_fn norms;
    ds_sel_absmean_at_fn absmean_at;
    ds_sel_gather_fn gather;
    ds_sel_scatter_add_fn scatter_add;
    ds_sel_zero_at_fn zero_at;
    ds_sel_accumulate_fn accumulate;

    /* The table's memory, for what a caller keeps there (a sparsifier's
     * scratch and unit offsets). alloc returns NULL on failure, else memory
     * the caller owns and gives back with free (NULL is fine); contents are
     * undefined. upload and download return 0 or -EIO and are complete on
     * return (the host buffer may be reused, downloaded data read), ordered
     * with the kernels queued before them. malloc and memcpy on the CPU. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    int (*upload)(void *dst, const void *src_host, size_t bytes);
    int (*download)(void *dst_host, const void *src, size_t bytes);

    /* Wait for queued kernels; returns 0 or -EIO when one failed (CUDA
     * reports launch errors here, like ds_ops.sync). Always 0 on the CPU. */
    int (*sync)(void);
} ds_select_ops;

/* Fill *ops with the CPU selection kernels allowed by `cpu_flags` (pass
 * ds_cpu_flags(), which honours DS_KERNELS; tests pass each mask in turn):
 * the C reference first, then the AVX2 / AVX-512 variants over it. */
void ds_select_ops_init(ds_select_ops *ops, unsigned cpu_flags);

/* Probe for a CUDA device without side effects beyond the runtime's own
 * initialisation. Returns 1 when device `device` answers, 0 otherwise (no
 * CUDA in this build, no driver, no device), with the reason in why. */
int ds_select_cuda_available(int device, char *why, size_t why_len);

/* Fill *ops with the CUDA selection kernels for `device`, every slot.
 * Returns 0, or -ENODEV (a normal state) with the reason in why. Each
 * successful call takes a reference on the device (its stream and the
 * selection scratch) that ds_select_cuda_fini gives back; tables for
 * different devices may coexist.
 *
 * The kernels run on the device's one stream (kernels/cuda/device.h),
 * which every CUDA table of the process shares: once the CUDA training
 * table (kernels.h) queues its ops there too (issue 11 moves cuda_ops.cu
 * onto it), buffers a training op is still writing can be handed here
 * without ds_ops.sync(), as the stream orders them; a training table on a
 * stream of its own still needs ds_ops.sync() first. The kernels that
 * return a result on the host (count, compact, filter, filter_ties, hist,
 * hist_sub, norms, absmean_at) return synchronized, as do upload and
 * download; gather, scatter_add, zero_at and accumulate are queued, and
 * ops->sync() waits for them and reports the first error since the last
 * sync. The table's kernels share the device's scratch: call them from one
 * thread at a time. */
int ds_select_ops_init_cuda(ds_select_ops *ops, int device, char *why, size_t why_len);

/* Give back the reference a successful ds_select_ops_init_cuda took (the
 * last one waits for the stream and frees the device's scratch), and clear
 * *ops. Call it once per successful init, after the last use of the table
 * and of every copy of it (a sparsifier holds a copy). NULL, a CPU table
 * and a cleared table are no-ops, as is every call without CUDA. */
void ds_select_cuda_fini(ds_select_ops *ops);

/* ---- every CPU variant, declared from the family macros ---------------- */

#define DS_DECL_SEL_VARIANTS(sfx) \
    DS_DECL_SEL_COUNT(ds_sel_count_##sfx); \
    DS_DECL_SEL_COMPACT(ds_sel_compact_##sfx); \
    DS_DECL_SEL_FILTER(ds_sel_filter_##sfx); \
    DS_DECL_SEL_HIST(ds_sel_hist_##sfx); \
    DS_DECL_SEL_NORMS(ds_sel_norms_##sfx); \
    DS_DECL_SEL_GATHER(ds_sel_gather_##sfx); \
    DS_DECL_SEL_SCATTER_ADD(ds_sel_scatter_add_##sfx)

/* The C reference has every family; absmean_at, zero_at, filter_ties,
 * hist_sub and accumulate have only it (see select_ref.c for why a SIMD
 * version would not help). */
DS_DECL_SEL_VARIANTS(c);
DS_DECL_SEL_ABSMEAN_AT(ds_sel_absmean_at_c);
DS_DECL_SEL_ZERO_AT(ds_sel_zero_at_c);
DS_DECL_SEL_FILTER_TIES(ds_sel_filter_ties_c);
DS_DECL_SEL_HIST_SUB(ds_sel_hist_sub_c);
DS_DECL_SEL_ACCUMULATE(ds_sel_accumulate_c);
DS_DECL_SEL_VARIANTS(avx2);
DS_DECL_SEL_VARIANTS(avx512);

#endif
