/* node/runtime/hier.c: see hier.h. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "node/runtime/hier.h"

/* Same group: the same non-empty name. */
static int same_group(const ds_member_info *a, const ds_member_info *b)
{
    return a->group[0] && strcmp(a->group, b->group) == 0;
}

static int before(const ds_member_info *a, const ds_member_info *b)
{
    const int c = strcmp(a->group, b->group);
    return c < 0 || (c == 0 && a->id < b->id);
}

int ds_hier_form(const ds_member_info *v, uint32_t G, uint64_t self, uint32_t *order,
                 uint32_t *gidx, ds_hier *out)
{
    memset(out, 0, sizeof(*out));
    /* Insertion sort: views are small. */
    for (uint32_t i = 0; i < G; i++) {
        uint32_t j = i;
        for (; j > 0 && before(&v[i], &v[order[j - 1]]); j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    int found = 0;
    uint32_t g = 0, start = 0;
    for (uint32_t k = 0; k < G; k++) {
        if (k > 0 && !same_group(&v[order[k]], &v[order[k - 1]])) {
            g++;
            start = k;
        }
        gidx[k] = g;
        if (k > start)
            out->any = 1;
        if (v[order[k]].id == self) {
            found = 1;
            out->group = g;
            out->member = k - start;
            out->first = start;
        }
    }
    if (!found)
        return -EINVAL;
    out->n_groups = G ? g + 1 : 0;
    for (uint32_t k = out->first; k < G && gidx[k] == out->group; k++)
        out->size++;
    return 0;
}

int ds_hier_sparsifier_create(enum ds_group_sparsify mode, size_t n, const uint32_t *layer_off,
                              size_t n_layers, ds_sparsifier **out)
{
    *out = NULL;
    ds_sparsify_cfg sc;
    switch (mode) {
    case DS_GROUP_SPARSIFY_NONE:
        return 0;
    case DS_GROUP_SPARSIFY_MICRO:
        ds_sparsify_cfg_defaults(&sc, DS_SPARSIFY_MICRO);
        return ds_sparsifier_create(out, &sc, n, NULL);
    case DS_GROUP_SPARSIFY_DEFT:
        ds_sparsify_cfg_defaults(&sc, DS_SPARSIFY_DEFT);
        sc.unit_off = layer_off;
        sc.n_units = layer_off ? n_layers : 0;
        return ds_sparsifier_create(out, &sc, n, NULL);
    }
    return -EINVAL;
}
