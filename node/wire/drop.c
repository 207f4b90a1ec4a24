/*
 * node/wire/drop.c: drop reasons and their counters.
 *
 * Every way a frame can be refused, anywhere in node/, is one value of
 * enum ds_drop_reason (the DS_DROP_LIST X-macro in wire.h gives its enum
 * name, metric name and text together, so they cannot drift apart). The
 * counters are one relaxed atomic per reason: a drop is counted from
 * whichever thread saw it, and readers (status pages, tests) only need
 * each counter's own value, never a consistent snapshot of all of them.
 */
#include "config.h"

#include "node/wire/wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---- names ------------------------------------------------------------------ */

static const char *const drop_names[] = {
#define DS_DROP_NAME_(e, name, text) name,
    DS_DROP_LIST(DS_DROP_NAME_)
#undef DS_DROP_NAME_
};
static const char *const drop_texts[] = {
#define DS_DROP_TEXT_(e, name, text) text,
    DS_DROP_LIST(DS_DROP_TEXT_)
#undef DS_DROP_TEXT_
};
static_assert(sizeof(drop_names) / sizeof(drop_names[0]) == DS_DROP__COUNT, "drop names");

const char *ds_drop_name(enum ds_drop_reason r)
{
    return (unsigned)r < DS_DROP__COUNT ? drop_names[r] : "?";
}

const char *ds_drop_str(enum ds_drop_reason r)
{
    return (unsigned)r < DS_DROP__COUNT ? drop_texts[r] : "?";
}

/* ---- counters --------------------------------------------------------------- */

void ds_drop_inc(ds_drop_counters *c, enum ds_drop_reason r)
{
    if (c && (unsigned)r < DS_DROP__COUNT)
        atomic_fetch_add_explicit(&c->n[r], 1, memory_order_relaxed);
}

uint64_t ds_drop_get(const ds_drop_counters *c, enum ds_drop_reason r)
{
    if (!c || (unsigned)r >= DS_DROP__COUNT)
        return 0;
    /* atomic_load takes a non-const pointer in C11. */
    return atomic_load_explicit((_Atomic uint64_t *)&c->n[r], memory_order_relaxed);
}

uint64_t ds_drop_total(const ds_drop_counters *c)
{
    uint64_t t = 0;
    for (int r = 1; r < DS_DROP__COUNT; r++)
        t += ds_drop_get(c, (enum ds_drop_reason)r);
    return t;
}

int ds_drop_format(const ds_drop_counters *c, enum ds_drop_fmt fmt, char *buf, size_t cap)
{
    size_t len = 0;
    if (fmt != DS_DROP_FMT_KV)
        return -EINVAL;
    if (!buf || cap == 0)
        return -ENOSPC;
    buf[0] = '\0';
    for (int r = 1; r < DS_DROP__COUNT; r++) {
        const uint64_t v = ds_drop_get(c, (enum ds_drop_reason)r);
        if (!v)
            continue;
        const int k = snprintf(buf + len, cap - len, "%s%s=%" PRIu64, len ? " " : "",
                               drop_names[r], v);
        if (k < 0 || (size_t)k >= cap - len)
            return -ENOSPC;
        len += (size_t)k;
    }
    if (len == 0) {
        if (cap < 5)
            return -ENOSPC;
        memcpy(buf, "none", 5);
        len = 4;
    }
    return (int)len;
}
