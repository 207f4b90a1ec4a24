/* node/run/state.c: see state.h. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/le.h"
#include "node/run/state.h"

static size_t state_len(size_t n, size_t dn)
{
    return 16 + 4 * n + 56 + 4 * dn;
}

static void put64(uint8_t **p, uint64_t v)
{
    ds_put64(*p, v);
    *p += 8;
}

static uint64_t get64(const uint8_t **p)
{
    const uint64_t v = ds_le64(*p);
    *p += 8;
    return v;
}

int ds_run_state_save(ds_trainer *t, uint8_t **out, size_t *len, char *err, size_t err_len)
{
    const size_t n = t->n_params, dn = t->sampler.n, total = state_len(n, dn);
    uint8_t *b = malloc(total), *p = b;
    if (!b) {
        snprintf(err, err_len, "out of memory (%zu bytes)", total);
        return -ENOMEM;
    }
    put64(&p, t->samples);
    put64(&p, n);
    const int e = t->ops.download(p, t->mom, n * sizeof(float));
    if (e < 0) {
        snprintf(err, err_len, "momentum not read from the device: %s", strerror(-e));
        free(b);
        return e;
    }
    p += n * sizeof(float);
    const ds_sampler *s = &t->sampler;
    put64(&p, dn);
    put64(&p, s->pos);
    put64(&p, s->epoch);
    for (int i = 0; i < 4; i++)
        put64(&p, s->rng.s[i]);
    memcpy(p, s->perm, dn * sizeof(uint32_t));
    *out = b;
    *len = total;
    return 0;
}

int ds_run_state_load(ds_trainer *t, const void *b, size_t len, int64_t step, char *err,
                      size_t err_len)
{
    const size_t n = t->n_params, dn = t->sampler.n;
    const uint8_t *p = b;
    if (len != state_len(n, dn)) {
        snprintf(err, err_len, "the checkpoint's trainer state holds %zu bytes; this model and "
                 "data need %zu", len, state_len(n, dn));
        return -EINVAL;
    }
    const uint64_t samples = get64(&p), tn = get64(&p);
    const uint8_t *mom = p;
    p += n * sizeof(float);
    const uint64_t ddn = get64(&p), pos = get64(&p), epoch = get64(&p);
    ds_rng rng;
    for (int i = 0; i < 4; i++)
        rng.s[i] = get64(&p);
    if (tn != n || ddn != dn || pos > dn) {
        snprintf(err, err_len, "the checkpoint's trainer state holds %llu parameters and %llu "
                 "examples (position %llu); this node has %zu and %zu", (unsigned long long)tn,
                 (unsigned long long)ddn, (unsigned long long)pos, n, dn);
        return -EINVAL;
    }
    for (size_t i = 0; i < dn; i++) {
        const uint32_t v = ds_le32(p + 4 * i);
        if (v >= dn) {
            snprintf(err, err_len, "corrupt checkpoint: data order entry %zu is %u", i, v);
            return -EINVAL;
        }
    }
    const int e = t->ops.upload(t->mom, mom, n * sizeof(float));
    if (e < 0) {
        snprintf(err, err_len, "momentum not copied to the device: %s", strerror(-e));
        return e;
    }
    memcpy(t->sampler.perm, p, dn * sizeof(uint32_t));
    t->sampler.pos = pos;
    t->sampler.epoch = epoch;
    t->sampler.rng = rng;
    t->samples = samples;
    t->step = step;
    return 0;
}
