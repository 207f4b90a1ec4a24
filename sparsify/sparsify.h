/*
 * sparsify/sparsify.h: which entries of a vector a node sends (design §4).
 *
 * A sparsifier is an object per (method, segment): given a float vector v
 * of length n (a segment of the gossip accumulator, or g + residual at group
 * level) and a target density d in (0, 1], it returns the sorted, unique
 * uint32 indices S (relative to the segment) and the values v[S], into
 * buffers the caller owns, and keeps whatever state its method carries
 * from one call to the next (a threshold, a sampled mean, a generator).
 *
 *   none       every finite entry
 *   random     k = round(d n) indices drawn uniformly without replacement
 *   topk       the exact k largest |v|, ties to the lower index, in linear
 *              time (radix select; never a sort)
 *   threshold  |v| >= lambda, lambda fixed: the configured value, else the
 *              threshold start below
 *   sage       |v| >= delta_t, delta_t steered by the sampled mean of |v|
 *              and the density examined at the previous threshold
 *   micro      |v| >= delta_t, delta_t nudged by at most 0.5% per call
 *              towards the target count
 *   deft       per-unit k by descending L2 norm, exact top-k in each unit;
 *              units are the caller's layers
 * with k = round(d n), at least 1 when n > 0 (ds_sparsify_k).
 *
 * Threshold start: on their first call, sage, micro and threshold (when no
 * value is configured) take the exact k-th largest |v| of that call as
 * their threshold; DS_START_PUBLISHED uses the authors' 1/(2 sqrt(k)).
 *
 * Bad input loses nothing: every refused call returns a negative errno,
 * writes no output, leaves the state as it was and is counted in
 * ds_sparsify_totals.rejected. NaN and +-Inf entries are never selected by
 * any method; each call reports how many it saw, and the totals add them up.
 * Sparsifiers log nothing (sparsify/ sits below node/); the caller logs
 * from the result and the totals.
 *
 * A sparsifier is not thread-safe; one thread uses it at a time. Its
 * vectors (v, residual, g) and outputs (idx, val) are in the memory of the
 * selection table it was created with: host memory for a CPU table (the
 * default), the device's for a CUDA table (ds_select_ops_init_cuda), where
 * every method runs on the device and selects the same entries as on the
 * CPU (sparsify.c, "Device memory"). Everything else (configuration, unit
 * offsets, k_unit, bins, sq_norms, results) is host memory.
 *
 * The group-level variants (MiCRO's rotating chunk ownership, DEFT's units,
 * allocation and bin packing) are pure functions at the end of this file.
 * docs/sparsify.md explains each rule and where we depart from the authors'
 * code.
 */
#ifndef DS_SPARSIFY_SPARSIFY_H
#define DS_SPARSIFY_SPARSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/select.h"

/* The methods, in the order the config and the help list them:
 * X(enumerator, value, name). This list is the only place a method is
 * named: it generates the enum below and the name table in sparsify.c, and
 * conf/keys.h takes sparsify.method's choices from it. */
#define DS_SPARSIFY_METHODS(X) \
    X(DS_SPARSIFY_NONE, 0, "none") \
    X(DS_SPARSIFY_RANDOM, 1, "random") \
    X(DS_SPARSIFY_TOPK, 2, "topk") \
    X(DS_SPARSIFY_THRESHOLD, 3, "threshold") \
    X(DS_SPARSIFY_SAGE, 4, "sage") \
    X(DS_SPARSIFY_MICRO, 5, "micro") \
    X(DS_SPARSIFY_DEFT, 6, "deft")

#define DS_SPARSIFY_ENUMERATOR_(e, v, name) e = v,
enum ds_sparsify_method {
    DS_SPARSIFY_METHODS(DS_SPARSIFY_ENUMERATOR_)
    DS_SPARSIFY_N_METHODS /* the values above are 0..N-1 (sparsify.c checks) */
};
#undef DS_SPARSIFY_ENUMERATOR_

/* The method's name in DS_SPARSIFY_METHODS; NULL for a value out of range. */
const char *ds_sparsify_method_name(int method);

/* The method named s (exactly, lower case), or -EINVAL. */
int ds_sparsify_method_parse(const char *s);

/* MiCRO restarts from the exact k-th largest |v| when a call would keep
 * more than this many times k, or fewer than k divided by it (sparsify.c,
 * m_micro: a departure from the authors' code, docs/sparsify.md). */
#define DS_SPARSIFY_RUNAWAY 8

/* Where a threshold method without a configured value starts. */
enum ds_sparsify_start {
    DS_START_KTH = 0,       /* the exact k-th largest |v| of the first call (design §4) */
    DS_START_PUBLISHED = 1, /* 1 / (2 sqrt(k)), as the authors' code */
};

typedef struct ds_sparsify_cfg {
    enum ds_sparsify_method method;
    /* random's draws and sage's sample positions. Derive it per node and
     * segment so that streams differ (the same seed gives the same draws). */
    uint64_t seed;
    /* threshold only: > 0 fixes lambda; 0 means the threshold start. */
    float threshold;
    enum ds_sparsify_start start;
    /* deft only: n_units + 1 non-decreasing unit (layer) boundaries
     * relative to the segment, from 0 to the segment's length; copied by
     * create. NULL / 0 means one unit, the whole segment. */
    const uint32_t *unit_off;
    size_t n_units;
} ds_sparsify_cfg;

/* Zeroes *c and sets the method: seed 0, threshold start, one unit. */
void ds_sparsify_cfg_defaults(ds_sparsify_cfg *c, enum ds_sparsify_method method);

/* What one call did. */
typedef struct ds_sparsify_result {
    size_t n;          /* length of the vector */
    size_t k;          /* target count, ds_sparsify_k(n, density) */
    size_t count;      /* entries written to idx / val */
    size_t nonfinite;  /* NaN / Inf entries this call saw (never selected;
                          random sees only its draws) */
    float threshold;   /* magnitude threshold applied (threshold, sage,
                          micro), the k-th largest |v| (topk); else 0 */
    double density;    /* count / n (0 when n = 0) */
} ds_sparsify_result;

/* Counters over the sparsifier's life. */
typedef struct ds_sparsify_totals {
    uint64_t calls;                /* accepted calls */
    uint64_t rejected;             /* refused calls (bad arguments, short buffers, no memory) */
    uint64_t elements;             /* sum of n over accepted calls */
    uint64_t selected;             /* sum of count */
    uint64_t nonfinite;            /* sum of nonfinite */
    uint64_t calls_with_nonfinite; /* calls that saw at least one NaN / Inf */
    uint64_t starts;               /* threshold starts: first calls, and restarts
                                      after the threshold left the finite range */
    uint64_t banded;               /* sage, micro: calls whose rule landed outside
                                      +-10% of k and were brought inside */
    uint64_t reread;               /* sage, micro: banded calls that read the
                                      vector a second time (their candidates
                                      held fewer than k) */
} ds_sparsify_totals;

typedef struct ds_sparsifier ds_sparsifier;

/* Create a sparsifier for vectors of up to n_max entries (n_max <=
 * UINT32_MAX; deft takes exactly the length its units cover). ops: the
 * selection kernels to use, copied; NULL means ds_select_ops_init(ops,
 * ds_cpu_flags()). A CUDA table stays borrowed: keep it initialised
 * (ds_select_cuda_fini not yet called) until the sparsifier is destroyed.
 * The caller owns *out and frees it with ds_sparsifier_destroy. Returns 0,
 * -EINVAL (unknown method, bad units, a device table that names no device
 * or lacks a kernel), -EOVERFLOW (n_max over UINT32_MAX), -ENOMEM, or -EIO
 * (a device table failed to take deft's unit offsets). */
int ds_sparsifier_create(ds_sparsifier **out, const ds_sparsify_cfg *cfg, size_t n_max,
                         const ds_select_ops *ops) __attribute__((warn_unused_result));

/* Free; NULL-safe; clears the caller's pointer. */
void ds_sparsifier_destroy(ds_sparsifier **s);

/* Forget the method's state: the next call is a first call again (e.g.
 * after the segment was replaced by a model transfer). Totals stay. */
void ds_sparsifier_reset(ds_sparsifier *s);

/* The state a sparsifier carries from one call to the next (a checkpoint's
 * part, node/runtime/checkpoint.c): the generator, the threshold and what
 * steers it. Scratch and totals are not state. */
typedef struct ds_sparsify_state {
    uint64_t rng;
    int32_t started;
    float delta;
    double mean_prev;
    double micro_ratio;
    int32_t micro_fed;
    uint64_t micro_group_count;
    uint64_t micro_k_group;
} ds_sparsify_state;
void ds_sparsifier_state_get(const ds_sparsifier *s, ds_sparsify_state *out);
/* Put a state taken by ds_sparsifier_state_get back (the same method and
 * seed; the caller checks that). */
void ds_sparsifier_state_set(ds_sparsifier *s, const ds_sparsify_state *in);
enum ds_sparsify_method ds_sparsifier_method(const ds_sparsifier *s);

/* The threshold the next call starts from (sage, micro, threshold), 0
 * before the first call and for the other methods. */
float ds_sparsifier_threshold(const ds_sparsifier *s);

void ds_sparsifier_totals(const ds_sparsifier *s, ds_sparsify_totals *t);

/* Target count: round(density * n), clamped to [1, n]; 0 when n = 0. */
size_t ds_sparsify_k(size_t n, double density);

/* Worst-case count of one call: n for none and the threshold methods,
 * k for random and topk, min(n, k + units) for deft (its per-unit floor of
 * one entry may exceed k). Size idx and val for this. */
size_t ds_sparsify_capacity(const ds_sparsifier *s, size_t n, double density);

/* Select from v[0..n) at the target density. idx and val (caller-owned,
 * cap entries each, cap >= ds_sparsify_capacity) receive res->count sorted,
 * unique indices and their values. res may be NULL.
 * Returns 0; -EINVAL for NULL pointers, a density that is NaN, <= 0 or > 1,
 * n > n_max (deft: n != its units' length); -EOVERFLOW for n > UINT32_MAX;
 * -ENOBUFS when cap is short; -ENOMEM when scratch cannot grow; -EIO when
 * a device kernel failed (the state is then as before the call). n = 0 is
 * accepted and selects nothing. */
int ds_sparsify_select(ds_sparsifier *s, const float *v, size_t n, double density,
                       uint32_t *idx, float *val, size_t cap, ds_sparsify_result *res)
    __attribute__((warn_unused_result));

/* ---- error feedback: what is not sent stays --------------------------- */

/* residual[i] = residual[i] + g[i] for i < n (host memory; the steps
 * below use the sparsifier's table). */
void ds_ef_accumulate(float *residual, const float *g, size_t n);

/* residual[idx[j]] = 0 for j < count: the sent entries leave the residual.
 * idx must be strictly increasing and below n; otherwise nothing is
 * written and -EINVAL (order) or -ERANGE (an index >= n) comes back. Host
 * memory. */
int ds_ef_zero(float *residual, size_t n, const uint32_t *idx, size_t count)
    __attribute__((warn_unused_result));

/* One group-level step: residual += g, select from the residual, zero the
 * residual at the selection. val receives the values sent, so that
 * sent + new residual == g + old residual, bit for bit (each entry is
 * either sent whole or kept whole). Arguments and returns as
 * ds_sparsify_select; on error the residual is unchanged. */
int ds_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, double density,
               uint32_t *idx, float *val, size_t cap, ds_sparsify_result *res)
    __attribute__((warn_unused_result));

/* ---- group level: MiCRO ---------------------------------------------- */

/* Chunk c of a vector of n entries cut into G near-equal contiguous chunks
 * (the first n mod G chunks one longer). At step t, member r of G owns
 * chunk (t + r) mod G. */
void ds_micro_chunk(size_t n, unsigned G, unsigned r, uint64_t t, size_t *off, size_t *len);

/* Member r's selection at step t: the sparsifier s (any method; micro in
 * practice) runs on its own chunk only, at the target density, and writes
 * segment-relative indices. Returns as ds_sparsify_select; -EINVAL also for
 * G = 0 or r >= G. */
int ds_micro_select_owned(ds_sparsifier *s, const float *v, size_t n, unsigned G, unsigned r,
                          uint64_t t, double density, uint32_t *idx, float *val, size_t cap,
                          ds_sparsify_result *res) __attribute__((warn_unused_result));

/* One member's MiCRO step with error feedback (the paper's EF, one
 * member's part): residual += g over the whole vector, select with s
 * inside the chunk member r owns at step t only (ds_micro_select_owned),
 * zero the residual at the selection. val receives the values sent, so
 * sent + new residual == g + old residual, bit for bit; what the member
 * holds outside its chunk stays in its residual until it owns that chunk.
 * Arguments and returns as ds_micro_select_owned (cap >= the capacity of
 * the owned chunk's length); a refused call changes nothing. */
int ds_micro_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, unsigned G,
                     unsigned r, uint64_t t, double density, uint32_t *idx, float *val,
                     size_t cap, ds_sparsify_result *res) __attribute__((warn_unused_result));

/* MiCRO steers by the group's count, not the member's: pass the total
 * number of entries the whole group selected at the last step, and the
 * next call compares it with k of the whole vector, as the authors' code
 * does. Without it, the member's own count, scaled by n / chunk length,
 * stands in. Ignored by the other methods. */
void ds_micro_feedback(ds_sparsifier *s, size_t group_count);

/* ---- group level: DEFT ----------------------------------------------- */

/* The bin of a unit every member selects whole. ds_deft_pack never
 * assigns it; a caller may, for a unit it wants all-reduced. */
#define DS_DEFT_COMMON UINT32_MAX

/* Cut layers into units: a layer longer than n / G (n = the layers'
 * total length) becomes G near-equal parts, the first len mod G one
 * longer; others stay whole. layer_off has n_layers + 1 entries from 0;
 * unit_off (cap entries) receives *n_units + 1 boundaries. Returns 0,
 * -EINVAL (G = 0, offsets not non-decreasing from 0) or -ENOBUFS. */
int ds_deft_units(const uint32_t *layer_off, size_t n_layers, unsigned G, uint32_t *unit_off,
                  size_t cap, size_t *n_units) __attribute__((warn_unused_result));

/* Per-unit k: in descending norm order (ties to the lower unit),
 * k_u = min(len_u, max(1, trunc(remaining_k * norm_u / remaining_norm))),
 * then remaining_k -= k_u, remaining_norm -= norm_u; a unit met when the
 * remaining norm is 0 gets min(len_u, 1). What capped units left over is
 * then handed out in the same order, each unit up to its length (group.c
 * says why). norms must be finite and >= 0. Returns the sum of k_unit:
 * k, plus at most n_units from the floor of one entry per unit, less only
 * when the units hold fewer than k entries; or -EINVAL, -ENOMEM. */
long long ds_deft_alloc(const uint32_t *unit_off, size_t n_units, const double *norms, size_t k,
                        size_t *k_unit);

/* Bin-pack units to G members, largest cost first into the lightest bin
 * (ties: lower unit, lower bin), cost = len * log2(k) for k > 1, len
 * otherwise, and len for a unit sent whole (k == len), which has a bin
 * like any other (DS_DEFT_COMMON is never produced here). bin (n_units entries)
 * receives each unit's bin; load (G entries, may be NULL) each bin's cost.
 * Returns 0, -EINVAL or -ENOMEM. */
int ds_deft_pack(const uint32_t *unit_off, const size_t *k_unit, size_t n_units, unsigned G,
                 uint32_t *bin, double *load) __attribute__((warn_unused_result));

/* Member r's selection at step t: exact top-k_unit[u] in every unit u whose
 * bin is (t + r) mod G, and every entry of the DS_DEFT_COMMON units, in
 * index order; segment-relative indices. s provides the kernels and
 * scratch (any method) and counts the call. cap must hold the sum of
 * k_unit over those units. Returns as ds_sparsify_select. */
int ds_deft_select_owned(ds_sparsifier *s, const float *v, const uint32_t *unit_off,
                         size_t n_units, const size_t *k_unit, const uint32_t *bin, unsigned G,
                         unsigned r, uint64_t t, uint32_t *idx, float *val, size_t cap,
                         ds_sparsify_result *res) __attribute__((warn_unused_result));

/* ---- group level: DEFT with error feedback ------------------------------ */

/* DEFT inside a group (group.sparsify = deft): one member's step. s is a
 * deft sparsifier whose units are the model's layers (cfg.unit_off of
 * ds_sparsifier_create); n is their length. Every member must reach the
 * same per-unit k and the same bins, or some units are selected twice and
 * others by nobody. The authors' code has the member whose turn it is
 * compute them from its own norms and broadcast them, a second message
 * latency each step; here they come from the group's norms one step late:
 * each call writes this member's squared unit norms of its residual into
 * sq_norms (ds_deft_group_units(s, G) floats; NULL: none, and k then
 * stays shared by length for want of feedback), the caller averages them
 * over the group inside the step's one reduction and hands the mean back
 * with ds_deft_feedback, the same floats on every member. Before the
 * first feedback for G (and after G changed) units get k in proportion to
 * their length.
 *
 * The step: the layers cut for G (ds_deft_units, kept while G stays),
 * k = ds_sparsify_k(n, density) shared by norm (ds_deft_alloc), the bins
 * (ds_deft_pack), residual += g, sq_norms, member r's exact top-k in its
 * bin (t + r) mod G (ds_deft_select_owned, on the residual), and the sent
 * entries leave the residual: sent + new residual == g + old residual bit
 * for bit. cap must hold the bin's k (at most k + the units). Returns as
 * ds_sparsify_select, -EINVAL also for a method other than deft, r >= G,
 * n other than the units' length; a refused call changes nothing. */
int ds_deft_ef_step(ds_sparsifier *s, float *residual, const float *g, size_t n, unsigned G,
                    unsigned r, uint64_t t, double density, uint32_t *idx, float *val,
                    size_t cap, float *sq_norms, ds_sparsify_result *res)
    __attribute__((warn_unused_result));

/* The units a group of G cuts s's layers into: the length of sq_norms.
 * 0 for a sparsifier that is not deft, G = 0, or no memory. */
size_t ds_deft_group_units(ds_sparsifier *s, unsigned G);

/* The group's mean squared unit norms for G (n_units of them, as
 * ds_deft_ef_step wrote them), for the next step. Ignored when G or
 * n_units do not match the cut; a value that is not finite and >= 0 makes
 * the next step share k by length. */
void ds_deft_feedback(ds_sparsifier *s, unsigned G, const float *sq_norms, size_t n_units);

#endif
