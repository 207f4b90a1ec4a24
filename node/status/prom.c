/*
 * node/status/prom.c: the /metrics page, Prometheus text format 0.0.4.
 *
 * There is no Debian library for writing this format, and it is small:
 * "# HELP", "# TYPE", then name{labels} value lines, a family's samples
 * together. The text goes to an open_memstream stream (the C library's
 * growing buffer), so nothing here manages memory by hand.
 *
 * The node's own gauges (identity, training, view, exchanges) are written
 * out below; every counter of the other modules comes from its metric
 * group (base/metric.h), one family at a time: the rows of a family are
 * gathered wherever they stand in the list, so a list can follow its
 * struct's order (which is also the /status order) and /metrics still
 * gets contiguous families.
 *
 * Label values from peers (names) are escaped as the format asks (\\, \"
 * and \n); other control characters become '?' and bytes that are not
 * valid UTF-8 become U+FFFD, so a hostile name cannot break a line.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/status/internal.h"

#define F(s) (s), sizeof(s)

/* A label value (without the quotes). */
static void label_val(FILE *f, const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strnlen(s, max);
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fputc('?', f);
            i++;
        } else {
            const size_t l = ds_status_utf8_len(u + i, n - i);
            if (l == 0) {
                fputs("\xef\xbf\xbd", f);
                i++;
            } else {
                fwrite(s + i, 1, l, f);
                i += l;
            }
        }
    }
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{node="NODE" ... : the caller adds labels, then a value. */
static void open_sample(FILE *f, const char *metric, const char *node, size_t node_max)
{
    fprintf(f, "%s{node=\"", metric);
    label_val(f, node, node_max);
    fputc('"', f);
}

static void label(FILE *f, const char *key, const char *val, size_t max)
{
    fprintf(f, ",%s=\"", key);
    label_val(f, val, max);
    fputc('"', f);
}

static void value_u(FILE *f, uint64_t v)
{
    fprintf(f, "} %llu\n", (unsigned long long)v);
}

static void value_d(FILE *f, double v)
{
    if (isnan(v))
        fputs("} NaN\n", f);
    else if (isinf(v))
        fputs(v > 0 ? "} +Inf\n" : "} -Inf\n", f);
    else
        fprintf(f, "} %.17g\n", v);
}

static void one_u(FILE *f, const ds_status_snapshot *s, const char *name, const char *type,
                  const char *help, uint64_t v)
{
    family(f, name, type, help);
    open_sample(f, name, F(s->name));
    value_u(f, v);
}

static void one_d(FILE *f, const ds_status_snapshot *s, const char *name, const char *type,
                  const char *help, double v)
{
    family(f, name, type, help);
    open_sample(f, name, F(s->name));
    value_d(f, v);
}

void ds_status_prom_rows(FILE *f, const char *name, size_t name_max, const ds_metric_desc *desc,
                         uint32_t n, const uint64_t *v)
{
    for (uint32_t i = 0; i < n; i++) {
        const ds_metric_desc *d = &desc[i];
        if (!d->prom)
            continue;
        uint32_t k = 0;
        while (k < i && !(desc[k].prom && !strcmp(desc[k].prom, d->prom)))
            k++;
        if (k < i)
            continue; /* written with its family's first row */
        family(f, d->prom, d->kind == DS_METRIC_GAUGE ? "gauge" : "counter", d->help);
        for (uint32_t j = i; j < n; j++) {
            const ds_metric_desc *e = &desc[j];
            if (!e->prom || strcmp(e->prom, d->prom))
                continue;
            open_sample(f, e->prom, name, name_max);
            if (e->label_key)
                label(f, e->label_key, e->label_value, 64);
            if (e->type == DS_METRIC_T_NS)
                value_d(f, (double)v[j] * 1e-9);
            else
                value_u(f, v[j]);
        }
    }
}

/* The node's identity, state and training progress. */
static void node_part(FILE *f, const ds_status_snapshot *s)
{
    char id[17];
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)s->id);
    family(f, "dsnode_info", "gauge", "Constant 1, labelled with the node's identity.");
    open_sample(f, "dsnode_info", F(s->name));
    label(f, "addr", F(s->addr));
    label(f, "group", F(s->group));
    label(f, "id", F(id));
    value_u(f, 1);

    family(f, "dsnode_build_info", "gauge",
           "Constant 1, labelled with the build: version and compute backend.");
    open_sample(f, "dsnode_build_info", F(s->name));
    label(f, "version", F(s->version));
    label(f, "backend", F(s->backend));
    label(f, "topology", F(s->topology));
    value_u(f, 1);
    if (s->process.valid) {
        const ds_status_process *p = &s->process;
        one_d(f, s, "process_cpu_seconds_total", "counter",
              "Total user and system CPU time spent in seconds.", p->cpu_seconds);
        one_u(f, s, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
              p->resident_bytes);
        one_u(f, s, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
              p->virtual_bytes);
        one_d(f, s, "process_start_time_seconds", "gauge",
              "Start time of the process since unix epoch in seconds.", p->start_time_seconds);
        one_u(f, s, "process_open_fds", "gauge", "Number of open file descriptors.",
              p->open_fds);
        if (p->max_fds)
            one_u(f, s, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
                  p->max_fds);
    }
    family(f, "dsnode_state", "gauge", "1 for the node's current state, 0 for the others.");
    for (int i = 0; i < DS_STATUS__COUNT; i++) {
        open_sample(f, "dsnode_state", F(s->name));
        label(f, "state", ds_status_state_name((enum ds_status_state)i), 16);
        value_u(f, s->state == i);
    }

    one_d(f, s, "dsnode_step", "gauge", "Optimizer steps done.", (double)s->step);
    one_d(f, s, "dsnode_steps", "gauge", "Optimizer steps configured (train.steps).",
          (double)s->steps);
    one_u(f, s, "dsnode_round", "gauge", "Current gossip round.", s->round);
    one_u(f, s, "dsnode_view_epoch", "gauge", "View epoch of the current round.", s->epoch);
    one_u(f, s, "dsnode_view_size", "gauge", "Members in the view of the current round.",
          s->view_size);
    one_u(f, s, "dsnode_in_view", "gauge", "1 when this node is in the current view.",
          s->view_me != UINT32_MAX);
    one_d(f, s, "dsnode_loss", "gauge", "Training loss, mean over the last log window.", s->loss);
    family(f, "dsnode_test_accuracy", "gauge",
           "Test accuracy at the last evaluation (absent before the first).");
    if (s->test_acc >= 0) {
        open_sample(f, "dsnode_test_accuracy", F(s->name));
        value_d(f, s->test_acc);
    }
    one_d(f, s, "dsnode_learning_rate", "gauge", "Current learning rate.", s->lr);
    one_d(f, s, "dsnode_samples_per_second", "gauge", "Training throughput.", s->samples_per_s);
    one_u(f, s, "dsnode_samples_total", "counter",
          "Training samples this process trained on (its steps times train.batch_size).",
          s->samples);
    one_u(f, s, "dsnode_segments", "gauge", "Segments the model is cut into for gossip.",
          s->n_segments);
}

/* This round's segments and the exchanges this node initiates. */
static void exchange_part(FILE *f, const ds_status_snapshot *s)
{
    const uint32_t n_x =
        s->n_exchanges < DS_STATUS_MAX_SEGMENTS ? s->n_exchanges : DS_STATUS_MAX_SEGMENTS;
    family(f, "dsnode_segment_length", "gauge", "Floats in each listed segment.");
    for (uint32_t i = 0; i < n_x; i++) {
        char seg[16];
        snprintf(seg, sizeof(seg), "%u", s->exchanges[i].segment);
        open_sample(f, "dsnode_segment_length", F(s->name));
        label(f, "segment", F(seg));
        value_u(f, s->exchanges[i].length);
    }
}

/* One histogram family: name's _bucket (cumulative), _sum and _count
 * from the by-slot counts of the n buckets bounded by bounds. */
static void histogram(FILE *f, const ds_status_snapshot *s, const char *name,
                      const char *help, const double *bounds, const uint64_t *slot,
                      uint32_t n, uint64_t sum_ns, uint64_t count)
{
    char sample[96];
    family(f, name, "histogram", help);
    uint64_t cum = 0;
    for (uint32_t b = 0; b < n; b++) {
        char le[32];
        cum += slot[b];
        if (isinf(bounds[b]))
            snprintf(le, sizeof(le), "+Inf");
        else
            snprintf(le, sizeof(le), "%g", bounds[b]);
        snprintf(sample, sizeof(sample), "%s_bucket", name);
        open_sample(f, sample, F(s->name));
        label(f, "le", F(le));
        value_u(f, cum);
    }
    snprintf(sample, sizeof(sample), "%s_sum", name);
    open_sample(f, sample, F(s->name));
    value_d(f, (double)sum_ns * 1e-9);
    snprintf(sample, sizeof(sample), "%s_count", name);
    open_sample(f, sample, F(s->name));
    value_u(f, count);
}

/* Round durations and exchange latencies, every completed round since the
 * start; bytes by peer. */
static void history_part(FILE *f, const ds_status_snapshot *s)
{
    const ds_status_history *h = &s->hist;
    histogram(f, s, "dsnode_round_duration_seconds",
              "Completed gossip rounds by duration, begin to end.", ds_status_round_bounds,
              h->dur_bucket, DS_STATUS_ROUND_BUCKETS, h->dur_sum_ns, h->dur_count);
    histogram(f, s, "dsnode_exchange_latency_seconds",
              "Exchanges this node initiated that completed, by latency: REQ sent to RESP "
              "received (pairwise), or the CROSS's send (crossover).",
              ds_status_xchg_bounds, h->lat_bucket, DS_STATUS_XCHG_BUCKETS, h->lat_sum_ns,
              h->lat_count);
    if (s->group[0]) {
        const ds_status_group_times *g = &s->gtimes;
        histogram(f, s, "dsnode_group_reduce_seconds",
                  "Per step, the time the step waited for its group reduction (exposed; with "
                  "group.overlap the wait for its layers' included).",
                  ds_status_xchg_bounds, g->reduce.bucket, DS_STATUS_XCHG_BUCKETS,
                  g->reduce.sum_ns, g->reduce.count);
        histogram(f, s, "dsnode_group_reduce_hidden_seconds",
                  "group.overlap: per step, the part of its layers' reductions that ran behind "
                  "backward (hidden).",
                  ds_status_xchg_bounds, g->reduce_hidden.bucket, DS_STATUS_XCHG_BUCKETS,
                  g->reduce_hidden.sum_ns, g->reduce_hidden.count);
        histogram(f, s, "dsnode_group_exchange_exposed_seconds",
                  "Per step, the time the step waited for the exchange between groups "
                  "(exposed).",
                  ds_status_xchg_bounds, g->exchange_exposed.bucket, DS_STATUS_XCHG_BUCKETS,
                  g->exchange_exposed.sum_ns, g->exchange_exposed.count);
        histogram(f, s, "dsnode_group_exchange_hidden_seconds",
                  "Per exchange between groups, the part of it that ran behind the step's "
                  "compute (hidden).",
                  ds_status_xchg_bounds, g->exchange_hidden.bucket, DS_STATUS_XCHG_BUCKETS,
                  g->exchange_hidden.sum_ns, g->exchange_hidden.count);
    }
    family(f, "dsnode_gossip_peer_bytes_total", "counter",
           "Gossip payload bytes this node initiated, by peer: the first 8 peers by name, "
           "later ones as other.");
    for (uint32_t p = 0; p < h->n_peers && p < DS_STATUS_PEER_SERIES; p++) {
        open_sample(f, "dsnode_gossip_peer_bytes_total", F(s->name));
        label(f, "peer", F(h->peer_name[p]));
        value_u(f, h->peer_bytes[p]);
    }
    open_sample(f, "dsnode_gossip_peer_bytes_total", F(s->name));
    label(f, "peer", "other", 8);
    value_u(f, h->other_bytes);
}

/* Close the stream (which sets *buf and *blen, as open_memstream was
 * given them) and hand the text over: 0, or -ENOMEM when the stream ran
 * out of memory on the way. */
static int finish(FILE *f, char **buf, size_t *blen, char **out, size_t *len)
{
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad || !*buf) {
        free(*buf);
        return -ENOMEM;
    }
    *out = *buf;
    *len = *blen;
    return 0;
}

int ds_status_render_metrics(const ds_status_snapshot *s, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f)
        return -ENOMEM;
    node_part(f, s);
    exchange_part(f, s);
    history_part(f, s);
    const uint32_t ng = s->n_groups < DS_STATUS_MAX_GROUPS ? s->n_groups : DS_STATUS_MAX_GROUPS;
    for (uint32_t gi = 0; gi < ng; gi++)
        ds_status_prom_rows(f, F(s->name), s->groups[gi]->desc, s->groups[gi]->n,
                            &s->values[s->first[gi]]);
    return finish(f, &buf, &blen, out, len);
}

int ds_status_render_server_metrics(const ds_status_snapshot *s, const ds_status_stats *ss,
                                    char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    const ds_metric_group *g = &ds_status_stats_group;
    uint64_t v[sizeof(ds_status_stats) / sizeof(uint64_t)];
    for (uint32_t i = 0; i < g->n; i++)
        v[i] = ds_metric_get(&g->desc[i], ss);
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f)
        return -ENOMEM;
    ds_status_prom_rows(f, F(s->name), g->desc, g->n, v);
    return finish(f, &buf, &blen, out, len);
}
