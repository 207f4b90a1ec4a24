/*
 * base/metric.h: one description per counter, so that a counter is written
 * once.
 *
 * Every module that counts things (transport, net, gossip, membership, the
 * status server) declares its stats struct through an X-macro list next to
 * the struct. One row per field:
 *
 *     X(TYPE, field, json, prom, KIND, label_key, label_value, help)
 *
 *   TYPE         U64, U32, or NS (a uint64_t of nanoseconds, shown in
 *                seconds);
 *   field        the C member;
 *   json         its key in the module's object of /status, or NULL when
 *                /status does not show it;
 *   prom         its Prometheus family in /metrics, or NULL;
 *   KIND         COUNTER or GAUGE (for the Prometheus TYPE line);
 *   label_key,   one label telling the rows of one family apart
 *   label_value  ("direction", "sent"), or NULL, NULL;
 *   help         the family's HELP text: rows of one family carry the same
 *                text (a test checks this).
 *
 * The same list then expands three ways: DS_METRIC_FIELD makes the struct's
 * members, DS_METRIC_ROW makes a ds_metric_desc (with the member's offset),
 * and node/status renders /status, /metrics and the tables of
 * docs/status.md from the descriptors. Counters kept in arrays indexed by
 * a reason (drop reasons) get one descriptor per reason from the reason's
 * own X-list, through DS_METRIC_REASON.
 *
 * A ds_metric_group is what the status page shows as one JSON object: a
 * table of descriptors over one struct. Descriptors and groups are plain
 * constant data of static storage; nothing here allocates or locks.
 */
#ifndef DS_BASE_METRIC_H
#define DS_BASE_METRIC_H

#include <stddef.h>
#include <stdint.h>

enum ds_metric_kind {
    DS_METRIC_COUNTER = 0,
    DS_METRIC_GAUGE = 1,
};

enum ds_metric_type {
    DS_METRIC_T_U64 = 0,
    DS_METRIC_T_U32 = 1,
    DS_METRIC_T_NS = 2, /* uint64_t nanoseconds, shown as seconds */
};

/* One counter or gauge: where it lives in its struct and how it is shown. */
typedef struct ds_metric_desc {
    uint8_t type;            /* enum ds_metric_type */
    uint8_t kind;            /* enum ds_metric_kind */
    size_t offset;           /* of the field in its struct */
    const char *json;        /* key in the group's JSON object; NULL: none */
    const char *prom;        /* Prometheus family; NULL: none */
    const char *label_key;   /* NULL: no label besides node */
    const char *label_value;
    const char *help;        /* the family's HELP text */
    const char *doc;         /* this row's meaning in docs/status.md when it
                              * says more than help (a drop reason's text);
                              * NULL: help */
} ds_metric_desc;

/* A table of descriptors over one struct, shown as one JSON object. */
typedef struct ds_metric_group {
    const char *json;        /* key of the object; NULL: not in /status */
    const char *parent;      /* NULL: at the top of /status; else the json
                              * key of a group shown before this one, which
                              * holds this group's object (transport.drops) */
    const char *total;       /* when set, the sum of the values also goes
                              * beside the object under this key */
    const char *doc;         /* the docs/status.md table's name */
    const ds_metric_desc *desc;
    uint32_t n;
} ds_metric_group;

/* ---- generating structs and tables from a list ---- */

#define DS_METRIC_CTYPE_U64 uint64_t
#define DS_METRIC_CTYPE_U32 uint32_t
#define DS_METRIC_CTYPE_NS uint64_t

/* A struct member from a row: X = DS_METRIC_FIELD. */
#define DS_METRIC_FIELD(T, field, json, prom, kind, lkey, lval, help) \
    DS_METRIC_CTYPE_##T field;

/* A descriptor of struct S from a row. Use through a one-line adapter:
 *   #define ROW_(...) DS_METRIC_ROW(ds_gossip_stats, __VA_ARGS__)
 *   static const ds_metric_desc d[] = {DS_GOSSIP_STATS(ROW_)}; */
#define DS_METRIC_ROW(S, T, field, json_, prom_, kind_, lkey, lval, help_) \
    {.type = DS_METRIC_T_##T, .kind = DS_METRIC_##kind_, .offset = offsetof(S, field), \
     .json = json_, .prom = prom_, .label_key = lkey, .label_value = lval, .help = help_},

/* A descriptor for element `index` of the uint64_t array `arr` of struct
 * S, one per reason: JSON key and label value `name`, family `prom_`
 * (a counter) labelled reason=name, HELP `help_`, doc `text`. */
#define DS_METRIC_REASON(S, arr, index, name, text, prom_, help_) \
    {.type = DS_METRIC_T_U64, .kind = DS_METRIC_COUNTER, \
     .offset = offsetof(S, arr) + (size_t)(index) * sizeof(uint64_t), .json = name, \
     .prom = prom_, .label_key = "reason", .label_value = name, .help = help_, .doc = text},

/* The raw value of d in the struct at base (U32 widened; NS in ns). */
static inline uint64_t ds_metric_get(const ds_metric_desc *d, const void *base)
{
    const unsigned char *p = (const unsigned char *)base + d->offset;
    if (d->type == DS_METRIC_T_U32)
        return *(const uint32_t *)(const void *)p;
    return *(const uint64_t *)(const void *)p;
}

#endif
