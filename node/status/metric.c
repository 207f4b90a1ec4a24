/*
 * node/status/metric.c: the snapshot's plain parts and its metric tables.
 *
 * The counters the page shows belong to other modules. They reach this
 * module as metric groups (base/metric.h): a descriptor table of static
 * storage plus the values, copied here out of the module's stats struct by
 * ds_status_add_group. The snapshot therefore stays one plain value that
 * publish can memcpy, and this module needs no header of the modules it
 * reports on. The same tables render /status (json.c), /metrics (prom.c)
 * and the tables of docs/status.md (ds_status_doc_table), which a test
 * compares with the file: a counter is written once, in its list.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "node/status/internal.h"

/* ---- names ------------------------------------------------------------------ */

static const char *const state_names[DS_STATUS__COUNT] = {
    "joining", "training", "leaving", "done", "stopped", "failed", "paused",
};
static const char *const outcome_names[DS_XCHG__COUNT] = {
    "unknown", "ok", "failed", "skipped", "none",
};
static const char *const member_state_names[DS_STATUS_MEMBER__COUNT] = {
    "alive", "suspect", "dead", "left",
};
static const char *const wait_names[DS_WAIT__COUNT] = {
    "none", "round", "group", "members",
};

const char *ds_status_state_name(enum ds_status_state st)
{
    return (unsigned)st < DS_STATUS__COUNT ? state_names[st] : "?";
}

const char *ds_status_outcome_name(enum ds_status_outcome o)
{
    return (unsigned)o < DS_XCHG__COUNT ? outcome_names[o] : "?";
}

const char *ds_status_member_state_name(unsigned member_state)
{
    return member_state < DS_STATUS_MEMBER__COUNT ? member_state_names[member_state] : "?";
}

const char *ds_status_wait_name(enum ds_status_wait_kind k)
{
    return (unsigned)k < DS_WAIT__COUNT ? wait_names[k] : "?";
}

/* ---- the snapshot ----------------------------------------------------------- */

void ds_status_snapshot_init(ds_status_snapshot *s)
{
    memset(s, 0, sizeof(*s));
    s->state = DS_STATUS_JOINING;
    s->test_acc = -1;
    s->view_me = UINT32_MAX;
}

/* ---- the history of completed rounds ---- */

const double ds_status_round_bounds[DS_STATUS_ROUND_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, INFINITY,
};

const double ds_status_xchg_bounds[DS_STATUS_XCHG_BUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   INFINITY,
};

/* The bucket of sec among bounds[0..n-1] (the last is +Inf). */
static uint32_t bucket_of(const double *bounds, uint32_t n, double sec)
{
    uint32_t b = 0;
    while (b + 1 < n && sec > bounds[b])
        b++;
    return b;
}

void ds_status_events_add(ds_status_events *e, const ds_status_event *ev)
{
    e->ev[e->next] = *ev;
    e->ev[e->next].member[DS_STATUS_NAME_LEN - 1] = '\0';
    e->next = (e->next + 1) % DS_STATUS_EVENTS;
    if (e->n < DS_STATUS_EVENTS)
        e->n++;
    e->total++;
}

const ds_status_event *ds_status_events_get(const ds_status_events *e, uint32_t i)
{
    if (i >= e->n)
        return NULL;
    return &e->ev[(e->next + DS_STATUS_EVENTS - 1 - i) % DS_STATUS_EVENTS];
}

const char *ds_status_event_name(enum ds_status_event_kind k)
{
    static const char *const names[DS_EV__COUNT] = {
        [DS_EV_JOINED] = "joined", [DS_EV_SUSPECT] = "suspect", [DS_EV_ALIVE] = "alive",
        [DS_EV_DEAD] = "dead",     [DS_EV_LEFT] = "left",
    };
    return (unsigned)k < DS_EV__COUNT && names[k] ? names[k] : "?";
}

/* ---- the process (/proc/self) ---- */

int ds_status_process_read(ds_status_process *p)
{
    memset(p, 0, sizeof(*p));
    const long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    if (tck <= 0 || page <= 0)
        return -EINVAL;
    /* stat: the command name may hold spaces and ')': fields resume after
     * the last ')'. utime, stime are fields 14, 15; starttime 22; vsize 23. */
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "re");
    if (!f)
        return -errno;
    const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    unsigned long long ut, st, start, vsize;
    if (!rp || sscanf(rp + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d "
                               "%*d %*d %*d %*d %llu %llu",
                      &ut, &st, &start, &vsize) != 4)
        return -EPROTO;
    unsigned long long btime = 0;
    if ((f = fopen("/proc/stat", "re"))) {
        char line[256];
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "btime %llu", &btime) == 1)
                break;
        fclose(f);
    }
    unsigned long long pages_total, pages_res;
    if (!(f = fopen("/proc/self/statm", "re")))
        return -errno;
    const int got = fscanf(f, "%llu %llu", &pages_total, &pages_res);
    fclose(f);
    if (got != 2)
        return -EPROTO;
    uint64_t fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        const struct dirent *e;
        while ((e = readdir(d)))
            fds += e->d_name[0] != '.';
        closedir(d);
        fds -= fds > 0; /* the directory's own descriptor */
    }
    struct rlimit rl;
    p->max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? (uint64_t)rl.rlim_cur
                     : 0;
    p->cpu_seconds = (double)(ut + st) / (double)tck;
    p->start_time_seconds = btime ? (double)btime + (double)start / (double)tck : 0;
    p->resident_bytes = (uint64_t)pages_res * (uint64_t)page;
    p->virtual_bytes = (uint64_t)vsize;
    p->open_fds = fds;
    p->valid = 1;
    return 0;
}

void ds_status_times_add(ds_status_times *t, uint64_t ns)
{
    t->bucket[bucket_of(ds_status_xchg_bounds, DS_STATUS_XCHG_BUCKETS, (double)ns * 1e-9)]++;
    t->count++;
    t->sum_ns += ns;
}

void ds_status_history_add(ds_status_history *h, const ds_status_round *r)
{
    ds_status_history_add_named(h, r, NULL);
}

void ds_status_history_add_named(ds_status_history *h, const ds_status_round *r,
                                 const char *const *names)
{
    const uint32_t nl = r->n_listed < DS_STATUS_HIST_SEGMENTS ? r->n_listed
                                                              : DS_STATUS_HIST_SEGMENTS;
    for (uint32_t k = 0; k < nl; k++) {
        const ds_status_seg_done *d = &r->seg[k];
        if (d->outcome == DS_XCHG_OK && d->target_id) {
            h->lat_bucket[bucket_of(ds_status_xchg_bounds, DS_STATUS_XCHG_BUCKETS,
                                    (double)d->latency_ns * 1e-9)]++;
            h->lat_count++;
            h->lat_sum_ns += d->latency_ns;
        }
        if (!d->target_id || !d->bytes)
            continue;
        uint32_t p = 0;
        while (p < h->n_peers && h->peer_id[p] != d->target_id)
            p++;
        if (p == h->n_peers && p < DS_STATUS_PEER_SERIES) {
            h->peer_id[p] = d->target_id;
            snprintf(h->peer_name[p], sizeof(h->peer_name[p]), "%s",
                     names && names[k] ? names[k] : "");
            if (!h->peer_name[p][0])
                snprintf(h->peer_name[p], sizeof(h->peer_name[p]), "%016llx",
                         (unsigned long long)d->target_id);
            h->n_peers++;
        }
        if (p < h->n_peers)
            h->peer_bytes[p] += d->bytes;
        else
            h->other_bytes += d->bytes;
    }
    h->r[h->next] = *r;
    h->next = (h->next + 1) % DS_STATUS_HISTORY;
    if (h->n < DS_STATUS_HISTORY)
        h->n++;
    h->dur_bucket[bucket_of(ds_status_round_bounds, DS_STATUS_ROUND_BUCKETS,
                            (double)r->duration_ns * 1e-9)]++;
    h->dur_count++;
    h->dur_sum_ns += r->duration_ns;
}

const ds_status_round *ds_status_history_get(const ds_status_history *h, uint32_t i)
{
    if (i >= h->n)
        return NULL;
    return &h->r[(h->next + DS_STATUS_HISTORY - 1 - i) % DS_STATUS_HISTORY];
}

void ds_status_clear_groups(ds_status_snapshot *s)
{
    s->n_groups = 0;
    s->n_values = 0;
}

int ds_status_add_group(ds_status_snapshot *s, const ds_metric_group *g, const void *src)
{
    if (!g || !src || (g->n && !g->desc) || (g->parent && !g->json))
        return -EINVAL;
    if (g->parent) {
        /* The parent's object must exist by the time this one is shown. */
        uint32_t k = 0;
        while (k < s->n_groups &&
               !(s->groups[k]->json && !strcmp(s->groups[k]->json, g->parent)))
            k++;
        if (k == s->n_groups)
            return -EINVAL;
    }
    if (s->n_groups >= DS_STATUS_MAX_GROUPS || g->n > DS_STATUS_MAX_VALUES - s->n_values)
        return -ENOSPC;
    s->groups[s->n_groups] = g;
    s->first[s->n_groups] = s->n_values;
    for (uint32_t i = 0; i < g->n; i++)
        s->values[s->n_values + i] = ds_metric_get(&g->desc[i], src);
    s->n_values += g->n;
    s->n_groups++;
    return 0;
}

double ds_status_value_d(const ds_status_snapshot *s, uint32_t gi, uint32_t i)
{
    const uint64_t v = s->values[s->first[gi] + i];
    return s->groups[gi]->desc[i].type == DS_METRIC_T_NS ? (double)v * 1e-9 : (double)v;
}

/* ---- the server's own counters ----------------------------------------------- */

#define STATUS_ROW_(...) DS_METRIC_ROW(ds_status_stats, __VA_ARGS__)
static const ds_metric_desc status_stats_desc[] = {DS_STATUS_STATS(STATUS_ROW_)};
#undef STATUS_ROW_

const ds_metric_group ds_status_stats_group = {
    .json = NULL,
    .doc = "status",
    .desc = status_stats_desc,
    .n = sizeof(status_stats_desc) / sizeof(status_stats_desc[0]),
};

/* ---- docs/status.md ---------------------------------------------------------- */

/* A table cell: s with '|' escaped (Markdown tables split on it). */
static void cell(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            fputc('\\', f);
        fputc(*s, f);
    }
}

int ds_status_doc_table(const ds_metric_group *g, char **out)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return -ENOMEM;
    fputs("| JSON key | metric | type | meaning |\n|---|---|---|---|\n", f);
    for (uint32_t i = 0; i < g->n; i++) {
        const ds_metric_desc *d = &g->desc[i];
        fputs("| ", f);
        if (d->json)
            fprintf(f, "`%s`%s", d->json, d->type == DS_METRIC_T_NS ? " (seconds)" : "");
        else
            fputs("-", f);
        fputs(" | ", f);
        if (d->prom && d->label_key)
            fprintf(f, "`%s{%s=\"%s\"}`", d->prom, d->label_key, d->label_value);
        else if (d->prom)
            fprintf(f, "`%s`", d->prom);
        else
            fputs("-", f);
        fprintf(f, " | %s | ", d->kind == DS_METRIC_GAUGE ? "gauge" : "counter");
        cell(f, d->doc ? d->doc : d->help);
        fputs(" |\n", f);
    }
    if (fclose(f) != 0) {
        free(buf);
        return -ENOMEM;
    }
    *out = buf;
    return 0;
}
