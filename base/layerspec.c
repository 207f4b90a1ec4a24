/* base/layerspec.c: see layerspec.h. */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/layerspec.h"

static int is_blank(char c) { return c == ' ' || c == '\t'; }

__attribute__((format(printf, 5, 6)))
static int refuse(ds_layerspec_err *e, size_t at, size_t len, int index, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->expected, sizeof(e->expected), fmt, ap);
    va_end(ap);
    e->at = at;
    e->len = len;
    e->index = index;
    return -EINVAL;
}

/* Decimal digits at *p (at most 9), advancing *p; -1 when there are none. */
static long digits(const char **p, const char *end)
{
    long v = 0;
    int nd = 0;
    while (*p < end && **p >= '0' && **p <= '9' && nd < 9) {
        v = v * 10 + (**p - '0');
        (*p)++;
        nd++;
    }
    return nd ? v : -1;
}

/* Blanks, ':', blanks. 1 when the colon was there. */
static int colon(const char **p, const char *end)
{
    while (*p < end && is_blank(**p))
        (*p)++;
    if (*p == end || **p != ':')
        return 0;
    (*p)++;
    while (*p < end && is_blank(**p))
        (*p)++;
    return 1;
}

#define ANY_LAYER "a layer: conv<K>x<K>:<C>, maxpool2, relu, flatten or linear:<N>"

static int parse_item(const char *s, size_t at, size_t len, int index, ds_lspec *l,
                      ds_layerspec_err *e)
{
    const char *p = s + at, *end = p + len;
    memset(l, 0, sizeof(*l));
    l->at = at;
    l->len = len;
    if (len == 8 && !memcmp(p, "maxpool2", 8)) {
        l->kind = DS_L_MAXPOOL;
        return 0;
    }
    if (len == 4 && !memcmp(p, "relu", 4)) {
        l->kind = DS_L_RELU;
        return 0;
    }
    if (len == 7 && !memcmp(p, "flatten", 7)) {
        l->kind = DS_L_FLATTEN;
        return 0;
    }
    if (len > 4 && !memcmp(p, "conv", 4)) {
        p += 4;
        const long k1 = digits(&p, end);
        long k2 = -1;
        if (k1 >= 0 && p < end && *p == 'x') {
            p++;
            k2 = digits(&p, end);
        }
        if (k1 < 0 || k2 < 0 || !colon(&p, end))
            return refuse(e, at, len, index, "conv<K>x<K>:<C>, e.g. conv3x3:32");
        if (k1 != k2 || k1 < 1 || k1 > 9 || k1 % 2 == 0)
            return refuse(e, at, len, index,
                          "a square kernel of odd size, conv<K>x<K> with K in 1, 3, 5, 7, 9");
        const long c = digits(&p, end);
        if (c < 0 || p != end)
            return refuse(e, at, len, index, "conv<K>x<K>:<C>, e.g. conv3x3:32");
        if (c < 1 || c > 4096)
            return refuse(e, at, len, index, "conv output planes <C> in 1..4096");
        l->kind = DS_L_CONV;
        l->k = (int)k1;
        l->n = (int)c;
        return 0;
    }
    if (len > 6 && !memcmp(p, "linear", 6)) {
        p += 6;
        if (!colon(&p, end))
            return refuse(e, at, len, index, "linear:<N>, e.g. linear:10");
        const long n = digits(&p, end);
        if (n < 0 || p != end)
            return refuse(e, at, len, index, "linear:<N>, e.g. linear:10");
        if (n < 1 || n > 65536)
            return refuse(e, at, len, index, "linear outputs <N> in 1..65536");
        l->kind = DS_L_LINEAR;
        l->n = (int)n;
        return 0;
    }
    return refuse(e, at, len, index, ANY_LAYER);
}

int ds_layerspec_parse(const char *s, ds_layerspec *out, ds_layerspec_err *e)
{
    memset(out, 0, sizeof(*out));
    if (!s)
        s = "";
    size_t i = 0;
    const size_t n = strlen(s);
    for (;;) {
        size_t a = i;
        while (a < n && s[a] != ',')
            a++;
        /* item s[i..a), trimmed */
        size_t b = i, c = a;
        while (b < c && is_blank(s[b]))
            b++;
        while (c > b && is_blank(s[c - 1]))
            c--;
        if (out->n == DS_LAYERSPEC_MAX)
            return refuse(e, b, c - b, out->n + 1, "at most %d layers", DS_LAYERSPEC_MAX);
        if (b == c)
            return refuse(e, b, 0, out->n + 1, ANY_LAYER);
        int r = parse_item(s, b, c - b, out->n + 1, &out->l[out->n], e);
        if (r < 0)
            return r;
        out->n++;
        if (a == n)
            return 0;
        i = a + 1;
    }
}

void ds_lspec_format(const ds_lspec *l, char *out, size_t n)
{
    switch (l->kind) {
    case DS_L_CONV:
        snprintf(out, n, "conv%dx%d:%d", l->k, l->k, l->n);
        return;
    case DS_L_MAXPOOL:
        snprintf(out, n, "maxpool2");
        return;
    case DS_L_RELU:
        snprintf(out, n, "relu");
        return;
    case DS_L_FLATTEN:
        snprintf(out, n, "flatten");
        return;
    case DS_L_LINEAR:
        snprintf(out, n, "linear:%d", l->n);
        return;
    }
    snprintf(out, n, "?");
}

int ds_layerspec_check(const ds_layerspec *sp, int c, int h, int w, int classes,
                       ds_layerspec_err *e)
{
    int flat = 0;            /* after flatten: a vector of c*h*w */
    int owns = 0;            /* the previous layer wrote its own output */
    int prev_relu = 0;
    uint64_t params = 0;
    int n_param = 0;
    if (sp->n < 1)
        return refuse(e, 0, 0, 0, "at least one layer");
    for (int i = 0; i < sp->n; i++) {
        const ds_lspec *l = &sp->l[i];
        switch (l->kind) {
        case DS_L_CONV:
            if (flat)
                return refuse(e, l->at, l->len, i + 1, "conv before flatten (conv needs an image)");
            params += (uint64_t)l->n * c * l->k * l->k + (uint64_t)l->n;
            c = l->n;
            break;
        case DS_L_MAXPOOL:
            if (flat)
                return refuse(e, l->at, l->len, i + 1,
                              "maxpool2 before flatten (maxpool2 needs an image)");
            if (h < 2 || w < 2)
                return refuse(e, l->at, l->len, i + 1,
                              "maxpool2 on an image of at least 2x2 (its input here is %dx%dx%d)",
                              c, h, w);
            h /= 2;
            w /= 2;
            break;
        case DS_L_RELU:
            if (!owns || prev_relu)
                return refuse(e, l->at, l->len, i + 1,
                              "relu after a conv, maxpool2 or linear (a flatten between is fine)");
            break;
        case DS_L_FLATTEN:
            if (flat)
                return refuse(e, l->at, l->len, i + 1, "one flatten (the input is a vector already)");
            flat = 1;
            break;
        case DS_L_LINEAR:
            if (!flat)
                return refuse(e, l->at, l->len, i + 1,
                              "flatten before linear (linear needs a vector)");
            params += (uint64_t)l->n * c * h * w + (uint64_t)l->n;
            c = l->n;
            h = w = 1;
            break;
        }
        if ((l->kind == DS_L_CONV || l->kind == DS_L_LINEAR) && ++n_param > DS_LAYERSPEC_MAX_PARAM)
            return refuse(e, l->at, l->len, i + 1, "at most %d conv and linear layers",
                          DS_LAYERSPEC_MAX_PARAM);
        if (params > INT32_MAX)
            return refuse(e, l->at, l->len, i + 1, "at most %d parameters in all", INT32_MAX);
        if (l->kind != DS_L_FLATTEN)
            prev_relu = l->kind == DS_L_RELU;
        if (l->kind != DS_L_RELU && l->kind != DS_L_FLATTEN)
            owns = 1;
    }
    const ds_lspec *last = &sp->l[sp->n - 1];
    if (last->kind != DS_L_LINEAR || last->n != classes)
        return refuse(e, last->at, last->len, sp->n,
                      "the last layer to be linear:%d (one output per class)", classes);
    return 0;
}
