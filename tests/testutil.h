/*
 * tests/testutil.h: helpers shared by the Criterion suites.
 *
 * ds_t_fill: seeded uniform floats; ds_t_close: compare two float arrays
 * with an absolute + relative tolerance, printing the seed and the first ten
 * mismatches (both values) before failing, so a failure says what differed.
 */
#ifndef DS_TESTS_TESTUTIL_H
#define DS_TESTS_TESTUTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/splitmix.h"

static inline uint64_t ds_t_next(uint64_t *s)
{
    return ds_splitmix64_step(s);
}

/* Uniform in [lo, hi). */
static inline void ds_t_fill(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((ds_t_next(&s) >> 40) * (1.0 / 16777216.0));
}

/* Returns 1 when |a-b| <= atol + rtol*|b| everywhere; otherwise prints and
 * returns 0. NaN equals NaN. */
static inline int ds_t_close(const char *what, uint64_t seed, const float *a, const float *b,
                             size_t n, double atol, double rtol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i]))
            continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= atol + rtol * fabs((double)b[i]))) {
            if (bad < 10)
                cr_log_error("%s seed=%llu n=%zu: [%zu] got %.9g want %.9g (diff %.3g)", what,
                             (unsigned long long)seed, n, i, a[i], b[i], d);
            bad++;
        }
    }
    if (bad)
        cr_log_error("%s: %d of %zu values differ", what, bad, n);
    return bad == 0;
}

static inline int ds_t_close_d(double a, double b, double atol, double rtol)
{
    return fabs(a - b) <= atol + rtol * fabs(b);
}

#endif
