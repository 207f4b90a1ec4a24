/*
 * sparsify/group.c: the group-level rules of MiCRO and DEFT as pure
 * functions (design §4, 5 "Hierarchy"): every member of a group computes the
 * same answer from the same inputs, so no member has to announce it.
 *
 * MiCRO: the vector is cut into G near-equal contiguous chunks once; at
 * step t member r owns chunk (t + r) mod G and selects only there, so the
 * members' selections never overlap (no gradient build-up) and ownership
 * rotates so that every chunk is visited by every member's threshold.
 *
 * DEFT: units are the model's layers, a layer longer than n/G cut into G
 * parts; each unit gets a share of k by its L2 norm (largest norm first,
 * each taking its proportional part of what remains, at least one entry,
 * at most all); then units are bin-packed onto members by Longest
 * Processing Time first (the unit of largest cost into the lightest bin),
 * with the authors' cost model len * log2(k) of a top-k by partial sort.
 * LPT's heaviest bin is within 4/3 - 1/(3G) of the optimum (Graham 1969).
 * The authors' code, which we follow, lets the member whose turn it is
 * (t mod G) compute the packing from its own norms and broadcast it, and
 * rotates bins like MiCRO's chunks: member r selects in bin (t + r) mod G.
 * A unit whose k is its whole length is sent dense by every member and
 * loads no bin.
 *
 * Departures from the authors' code, each for a reason:
 * - ties (equal norms, equal costs, equally light bins) go to the lower
 *   unit or bin, where numpy's argsort and list.index leave the order to
 *   their implementation: members must agree bit for bit;
 * - a zero-length unit gets k = 0, not the max(1, .) floor's 1, which would
 *   ask a top-1 of nothing;
 * - the norm share remaining_norm is clamped to at most 1: subtracting the
 *   norms one by one in floating point can leave the last share a few ulps
 *   above 1, which could hand a unit one entry more than what remains;
 * - k that no unit could take is handed out again. In the authors' rule a
 *   unit is capped at its length and its excess carries to the units after
 *   it in norm order; when the capped unit comes late (a short layer with a
 *   large gradient per entry, like the MLP's output layer), nobody is left
 *   to take the excess and it is lost: on the real MLP at d = 10% the
 *   authors' rule allocates 83-87% of k. We give the remainder to the
 *   units in the same descending-norm order, each up to its length, so the
 *   total is k (plus at most one per unit from the floor of one), as the
 *   target density promises.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "sparsify/internal.h"

void ds_micro_chunk(size_t n, unsigned G, unsigned r, uint64_t t, size_t *off, size_t *len)
{
    if (G == 0) {
        *off = 0;
        *len = n;
        return;
    }
    const size_t c = (size_t)((t % G + r % G) % G);
    const size_t q = n / G, rem = n % G;
    *off = c * q + (c < rem ? c : rem);
    *len = q + (c < rem);
}

int ds_deft_units(const uint32_t *layer_off, size_t n_layers, unsigned G, uint32_t *unit_off,
                  size_t cap, size_t *n_units)
{
    if (!layer_off || !unit_off || !n_units || G == 0 || n_layers == 0 || layer_off[0] != 0)
        return -EINVAL;
    for (size_t l = 0; l < n_layers; l++)
        if (layer_off[l + 1] < layer_off[l])
            return -EINVAL;
    /* The authors compare a layer's length with n / G as a real number. */
    const double part = (double)layer_off[n_layers] / (double)G;
    size_t u = 0;
    if (cap < 1)
        return -ENOBUFS;
    unit_off[0] = 0;
    for (size_t l = 0; l < n_layers; l++) {
        const uint32_t len = layer_off[l + 1] - layer_off[l];
        const unsigned parts = (double)len > part ? G : 1;
        const uint32_t q = len / parts, rem = len % parts;
        uint32_t at = layer_off[l];
        for (unsigned p = 0; p < parts; p++) {
            if (u + 2 > cap)
                return -ENOBUFS;
            at += q + (p < rem);
            unit_off[++u] = at;
        }
    }
    *n_units = u;
    return 0;
}

typedef struct keyed {
    double key;
    size_t u;
} keyed;

/* Descending key, then ascending unit. */
static int by_key_desc(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? 1 : -1;
    return x->u < y->u ? -1 : x->u > y->u;
}

long long ds_deft_alloc(const uint32_t *unit_off, size_t n_units, const double *norms, size_t k,
                        size_t *k_unit)
{
    if (n_units == 0)
        return 0;
    if (!unit_off || !norms || !k_unit)
        return -EINVAL;
    keyed *order = malloc(n_units * sizeof(*order));
    if (!order)
        return -ENOMEM;
    double remain_norm = 0.0;
    for (size_t u = 0; u < n_units; u++) {
        if (!(norms[u] >= 0.0) || !isfinite(norms[u])) {
            free(order);
            return -EINVAL;
        }
        order[u].key = norms[u];
        order[u].u = u;
        remain_norm += norms[u];
    }
    qsort(order, n_units, sizeof(*order), by_key_desc);

    long long remain_k = (long long)k, sum = 0;
    for (size_t i = 0; i < n_units; i++) {
        const size_t u = order[i].u;
        const long long len = (long long)unit_off[u + 1] - (long long)unit_off[u];
        long long share = 0;
        if (remain_norm > 0.0) {
            double f = norms[u] / remain_norm;
            if (f > 1.0)
                f = 1.0;
            share = (long long)trunc((double)remain_k * f);
        }
        long long ku = len < share ? len : (share > 1 ? share : 1);
        if (ku > len)
            ku = len; /* a zero-length unit */
        k_unit[u] = (size_t)ku;
        sum += ku;
        remain_k -= ku;
        remain_norm -= norms[u];
    }
    /* What a capped unit late in the order could not take is lost in the
     * authors' rule (see the top of the file); hand it out again in the
     * same order, each unit up to its length. */
    for (size_t i = 0; i < n_units && remain_k > 0; i++) {
        const size_t u = order[i].u;
        const long long room = (long long)unit_off[u + 1] - (long long)unit_off[u] - (long long)k_unit[u];
        const long long take = room < remain_k ? room : remain_k;
        if (take > 0) {
            k_unit[u] += (size_t)take;
            sum += take;
            remain_k -= take;
        }
    }
    free(order);
    return sum;
}

int ds_deft_pack(const uint32_t *unit_off, const size_t *k_unit, size_t n_units, unsigned G,
                 uint32_t *bin, double *load)
{
    if (G == 0 || (n_units && (!unit_off || !k_unit || !bin)))
        return -EINVAL;
    double *ld = calloc(G, sizeof(*ld));
    keyed *order = malloc((n_units ? n_units : 1) * sizeof(*order));
    if (!ld || !order) {
        free(ld);
        free(order);
        return -ENOMEM;
    }
    for (size_t u = 0; u < n_units; u++) {
        const double len = (double)(unit_off[u + 1] - unit_off[u]);
        /* A unit sent whole needs no selection: a copy, len. */
        order[u].key = k_unit[u] > 1 && (double)k_unit[u] < len ? len * log2((double)k_unit[u]) : len;
        order[u].u = u;
    }
    qsort(order, n_units, sizeof(*order), by_key_desc);
    for (size_t i = 0; i < n_units; i++) {
        const size_t u = order[i].u;
        /* A unit sent whole (k == len) goes to a bin like any other: the
         * authors have every member send it, which at 64 workers made
         * each one send 11x its share (docs/sparsify.md). */
        unsigned best = 0;
        for (unsigned b = 1; b < G; b++)
            if (ld[b] < ld[best])
                best = b;
        bin[u] = best;
        ld[best] += order[i].key;
    }
    if (load)
        for (unsigned b = 0; b < G; b++)
            load[b] = ld[b];
    free(ld);
    free(order);
    return 0;
}
