/*
 * node/runtime/publish.c: fill the status snapshot from the modules (see
 * publish.h).
 *
 * node/status may include nothing of node/ but base (the arrows in
 * tests/arrows.py), so the runtime is the one place that reads the
 * modules for it. The metric tables are made here from the modules' own
 * X-macro lists (base/metric.h), one row per field: adding a counter to a
 * list adds it to the struct, to /status, to /metrics and to the table in
 * docs/status.md that a test compares with the file.
 */
#include "config.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/runtime/publish.h"
#include "topology/topology.h"

#define PUBLISH_EVERY_MS 200

/* The snapshot's text fields hold the wire's longest names. */
static_assert(DS_STATUS_NAME_LEN == DS_WIRE_NAME_MAX + 1, "name length");
static_assert(DS_STATUS_ADDR_LEN == DS_WIRE_ADDR_MAX + 1, "address length");
static_assert(DS_STATUS_GROUP_LEN == DS_WIRE_GROUP_MAX + 1, "group length");

/* ---- the tables, from the modules' lists ---- */

#define NET_ROW_(...) DS_METRIC_ROW(ds_net_stats, __VA_ARGS__)
static const ds_metric_desc net_desc[] = {DS_NET_STATS(NET_ROW_)};

#define WIRE_DROP_ROW_(e, name, text) \
    DS_METRIC_REASON(ds_publish_stats, drops, DS_DROP_##e, name, text, "dsnode_drops_total", \
                     "Frames dropped by the secured layer, by reason.")
static const ds_metric_desc drop_desc[] = {DS_DROP_LIST(WIRE_DROP_ROW_)};

#define GOSSIP_ROW_(...) DS_METRIC_ROW(ds_gossip_stats, __VA_ARGS__)
static const ds_metric_desc gossip_desc[] = {DS_GOSSIP_STATS(GOSSIP_ROW_)};

#define GROUP_ROW_(...) DS_METRIC_ROW(ds_group_stats, __VA_ARGS__)
static const ds_metric_desc group_desc[] = {DS_GROUP_STATS(GROUP_ROW_)};

#define GNET_ROW_(...) DS_METRIC_ROW(ds_gnet_stats, __VA_ARGS__)
static const ds_metric_desc gnet_desc[] = {DS_GNET_STATS(GNET_ROW_)};

#define TP_ROW_(...) DS_METRIC_ROW(ds_transport_stats, __VA_ARGS__)
static const ds_metric_desc tp_desc[] = {DS_TRANSPORT_STATS(TP_ROW_)};

#define TP_DROP_ROW_(e, name, text) \
    DS_METRIC_REASON(ds_transport_stats, drops, DS_TP_DROP_##e, name, text, \
                     "dsnode_transport_drops_total", "Transport messages dropped, by reason.")
static const ds_metric_desc tp_drop_desc[] = {DS_TP_DROP_LIST(TP_DROP_ROW_)};

#define MS_ROW_(...) DS_METRIC_ROW(ds_membership_stats, __VA_ARGS__)
static const ds_metric_desc ms_desc[] = {DS_MEMBERSHIP_STATS(MS_ROW_)};

#define MS_DROP_ROW_(e, name, text) \
    DS_METRIC_REASON(ds_membership_stats, drops, DS_MSHIP_DROP_##e, name, text, \
                     "dsnode_membership_drops_total", "Membership frames dropped, by reason.")
static const ds_metric_desc ms_drop_desc[] = {DS_MSHIP_DROP_LIST(MS_DROP_ROW_)};

#define MS_WIRE_ROW_(e, name, text) \
    DS_METRIC_REASON(ds_membership_stats, wire, DS_DROP_##e, name, text, \
                     "dsnode_membership_wire_drops_total", \
                     "Membership frames refused by the wire decoder, by reason.")
static const ds_metric_desc ms_wire_desc[] = {DS_DROP_LIST(MS_WIRE_ROW_)};

#define N_(a) (uint32_t)(sizeof(a) / sizeof((a)[0]))

/* The wire's reason 0 is "none" (accepted): not a drop, not shown. */
static_assert(DS_DROP_NONE == 0, "wire reason 0 is none");

static const ds_metric_group g_net = {
    .json = "net", .doc = "net", .desc = net_desc, .n = N_(net_desc)};
static const ds_metric_group g_drops = {.json = "drops", .total = "drops_total",
                                        .doc = "drops", .desc = drop_desc + 1,
                                        .n = N_(drop_desc) - 1};
static const ds_metric_group g_gossip = {
    .json = "gossip", .doc = "gossip", .desc = gossip_desc, .n = N_(gossip_desc)};
static const ds_metric_group g_group = {
    .json = "group", .doc = "group", .desc = group_desc, .n = N_(group_desc)};
static const ds_metric_group g_gnet = {
    .json = "gossip_net", .doc = "gossip_net", .desc = gnet_desc, .n = N_(gnet_desc)};
static const ds_metric_group g_tp = {
    .json = "transport", .doc = "transport", .desc = tp_desc, .n = N_(tp_desc)};
static const ds_metric_group g_tp_drops = {.json = "drops", .parent = "transport",
                                           .doc = "transport.drops", .desc = tp_drop_desc,
                                           .n = N_(tp_drop_desc)};
static const ds_metric_group g_ms = {
    .json = "membership", .doc = "membership", .desc = ms_desc, .n = N_(ms_desc)};
static const ds_metric_group g_ms_drops = {.json = "drops", .parent = "membership",
                                           .doc = "membership.drops", .desc = ms_drop_desc,
                                           .n = N_(ms_drop_desc)};
static const ds_metric_group g_ms_wire = {.json = "wire_drops", .parent = "membership",
                                          .doc = "membership.wire_drops",
                                          .desc = ms_wire_desc + 1, .n = N_(ms_wire_desc) - 1};

static const ds_metric_group *const groups[] = {
    &g_net, &g_drops, &g_gossip, &g_group, &g_gnet, &g_tp, &g_tp_drops, &g_ms, &g_ms_drops,
    &g_ms_wire,
};

const ds_metric_group *const *ds_publish_groups(size_t *n)
{
    *n = sizeof(groups) / sizeof(groups[0]);
    return groups;
}

int ds_publish_metrics(ds_status_snapshot *sn, const ds_publish_stats *ps)
{
    /* Each group reads the struct its descriptors were made for. */
    const void *src[] = {&ps->net, ps, &ps->gossip, &ps->group, &ps->gnet, &ps->net.transport,
                         &ps->net.transport, &ps->membership, &ps->membership,
                         &ps->membership};
    static_assert(sizeof(src) / sizeof(src[0]) == sizeof(groups) / sizeof(groups[0]),
                  "a struct per group");
    ds_status_clear_groups(sn);
    for (size_t i = 0; i < sizeof(groups) / sizeof(groups[0]); i++) {
        const int e = ds_status_add_group(sn, groups[i], src[i]);
        if (e < 0)
            return e;
    }
    return 0;
}

int ds_publish_open(ds_status **out, const char *listen, const char *file, int file_interval_ms,
                    ds_status_snapshot *sn)
{
    ds_publish_stats zero;
    memset(&zero, 0, sizeof(zero));
    int e = ds_publish_metrics(sn, &zero);
    if (e < 0)
        return e;
    ds_status_opts o;
    ds_status_opts_default(&o);
    o.listen = listen;
    o.file = file;
    o.file_interval_ms = file_interval_ms;
    o.initial = sn;
    return ds_status_create_opts(out, &o);
}

/* ---- the rest of the snapshot ---- */

static uint8_t member_state(enum ds_member_state s)
{
    switch (s) {
    case DS_MEMBER_ALIVE: return DS_STATUS_MEMBER_ALIVE;
    case DS_MEMBER_SUSPECT: return DS_STATUS_MEMBER_SUSPECT;
    case DS_MEMBER_DEAD: return DS_STATUS_MEMBER_DEAD;
    case DS_MEMBER_LEFT: return DS_STATUS_MEMBER_LEFT;
    default: return DS_STATUS_MEMBER__COUNT; /* shown as "?" */
    }
}

static void fill_view(ds_status_snapshot *sn, const ds_publish_src *src)
{
    const uint32_t G = src->view ? src->view_len : 0;
    sn->view_size = src->view_size;
    sn->n_view = G < DS_STATUS_MAX_VIEW ? G : DS_STATUS_MAX_VIEW;
    sn->view_me = UINT32_MAX;
    for (uint32_t i = 0; i < sn->n_view; i++) {
        ds_status_member *m = &sn->view[i];
        m->id = src->view[i].id;
        snprintf(m->name, sizeof(m->name), "%s", src->view[i].name);
        snprintf(m->addr, sizeof(m->addr), "%s", src->view[i].addr);
        snprintf(m->group, sizeof(m->group), "%s", src->view[i].group);
        m->state = member_state(src->view[i].state);
        if (m->id == src->self_id)
            sn->view_me = i;
    }
}

/* Nodes sorted by group (gidx: n entries, each one's group index): *at
 * is the entry of group g that handles segment s (member s mod |g|,
 * ds_topo_hier_owner). 0, or -ENOENT when g has no entry. */
static int group_handler_at(const uint32_t *gidx, uint32_t n, uint32_t g, uint32_t s,
                            uint32_t *at)
{
    uint32_t first = 0;
    while (first < n && gidx[first] != g)
        first++;
    uint32_t size = 0;
    while (first + size < n && gidx[first + size] == g)
        size++;
    uint32_t owner;
    if (ds_topo_hier_owner(s, size, &owner) < 0)
        return -ENOENT;
    *at = first + owner;
    return 0;
}

/* The node behind gossip's view index i for segment s: the view's entry
 * i, or with groups member s mod |i| of group i. NULL when out of range. */
static const ds_member_info *peer_of(const ds_publish_src *src, uint32_t i, uint32_t s)
{
    const uint32_t G = src->view ? src->view_len : 0;
    if (!src->view_group)
        return i < G ? &src->view[i] : NULL;
    uint32_t at;
    if (group_handler_at(src->view_group, G, i, s, &at) < 0)
        return NULL; /* no such group */
    return &src->view[at];
}

/* This round's exchange of each segment, named by view members, from
 * gossip's copy for other threads (the comm thread may be in a round). */
static void fill_exchanges(ds_status_snapshot *sn, const ds_publish_src *src,
                           const ds_gossip_xinfo *xs, const uint32_t *in_from)
{
    static const uint8_t outcome[] = {
        [DS_GOUT_NONE] = DS_XCHG_NONE,     [DS_GOUT_PENDING] = DS_XCHG_UNKNOWN,
        [DS_GOUT_OK] = DS_XCHG_OK,         [DS_GOUT_FAILED] = DS_XCHG_FAILED,
        [DS_GOUT_SKIPPED] = DS_XCHG_SKIPPED,
    };
    const int nseg = src->gossip ? ds_gossip_n_segments(src->gossip) : 0;
    const uint32_t G = src->view ? src->view_len : 0;
    sn->n_segments = (uint32_t)nseg;
    sn->n_exchanges = nseg < DS_STATUS_MAX_SEGMENTS ? (uint32_t)nseg : DS_STATUS_MAX_SEGMENTS;
    for (uint32_t s = 0; s < sn->n_exchanges; s++) {
        ds_status_exchange *x = &sn->exchanges[s];
        const ds_gossip_xinfo *xi = &xs[s];
        memset(x, 0, sizeof(*x));
        x->segment = s;
        x->offset = ds_gossip_segment(src->gossip, (int)s)->off;
        x->length = ds_gossip_segment(src->gossip, (int)s)->len;
        if (G < 2)
            continue;
        x->outcome = (unsigned)xi->outcome < sizeof(outcome) ? outcome[xi->outcome]
                                                             : (uint8_t)DS_XCHG_UNKNOWN;
        x->bytes = xi->bytes;
        /* Nothing initiated (outcome none): the target is this node's own
         * gossip index, with groups its own group, whose handler of s
         * (peer_of) is a group mate, not a peer. */
        const ds_member_info *to =
            xi->outcome != DS_GOUT_NONE ? peer_of(src, xi->target, s) : NULL;
        if (to && to->id != src->self_id)
            snprintf(x->initiate_to, sizeof(x->initiate_to), "%s", to->name);
        x->n_answer_from = xi->n_in;
        const uint32_t *from = in_from + (size_t)s * DS_STATUS_MAX_ANSWERS;
        for (uint32_t k = 0; k < xi->n_in && k < DS_STATUS_MAX_ANSWERS; k++)
            if (peer_of(src, from[k], s))
                snprintf(x->answer_from[k], sizeof(x->answer_from[k]), "%s",
                         peer_of(src, from[k], s)->name);
    }
}

/* Between groups: the node of group g that handles segment s (member
 * s mod |g| of g, ds_topo_hier_owner), from the round's nodes sorted by
 * group. 0 when g has no members listed. */
static uint64_t group_handler(const ds_publish_round_src *src, uint32_t g, uint32_t s)
{
    uint32_t at;
    return group_handler_at(src->node_group, src->n_nodes, g, s, &at) < 0 ? 0
                                                                           : src->node_ids[at];
}

void ds_publish_round(ds_status_snapshot *sn, const ds_publish_round_src *src)
{
    static const uint8_t outcome[] = {
        [DS_GOUT_NONE] = DS_XCHG_NONE,
        /* still pending when the round closed: it did not complete */
        [DS_GOUT_PENDING] = DS_XCHG_FAILED,
        [DS_GOUT_OK] = DS_XCHG_OK,
        [DS_GOUT_FAILED] = DS_XCHG_FAILED,
        [DS_GOUT_SKIPPED] = DS_XCHG_SKIPPED,
    };
    if (!sn || !src->gossip)
        return;
    ds_status_round *h = malloc(sizeof(*h)); /* ~1 KiB, not on the round's stack */
    if (!h)
        return; /* the history skips a round; the histogram too */
    memset(h, 0, sizeof(*h));
    const uint64_t now = ds_now_ns();
    h->round = src->round;
    h->epoch = src->epoch;
    h->view_size = src->view_size;
    h->me = src->me;
    if (src->node_group) {
        h->groups = src->view_size;
        h->group_member = src->group_member;
        h->group_size = src->group_size;
    }
    h->duration_ns = now > src->begin_ns ? now - src->begin_ns : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    h->end_unix_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    const int nseg = ds_gossip_n_segments(src->gossip);
    h->n_segments = nseg > 0 ? (uint32_t)nseg : 0;
    h->n_listed = h->n_segments < DS_STATUS_HIST_SEGMENTS ? h->n_segments : DS_STATUS_HIST_SEGMENTS;
    for (uint32_t s = 0; s < h->n_listed; s++) {
        ds_status_seg_done *d = &h->seg[s];
        ds_gossip_xinfo xi;
        d->target = src->me;
        d->outcome = DS_XCHG_NONE;
        if (ds_gossip_xinfo_get(src->gossip, (int)s, &xi) < 0)
            continue;
        d->target = xi.target;
        d->n_in = xi.n_in;
        d->bytes = xi.bytes;
        d->latency_ns = xi.latency_ns;
        d->outcome = (unsigned)xi.outcome < sizeof(outcome) ? outcome[xi.outcome]
                                                            : (uint8_t)DS_XCHG_FAILED;
        if (xi.target < src->view_size && xi.target != src->me)
            d->target_id = src->node_group ? group_handler(src, xi.target, s)
                                           : src->vids[xi.target];
        if (!d->target_id)
            d->outcome = DS_XCHG_NONE;
    }
    const char *names[DS_STATUS_HIST_SEGMENTS] = {0};
    for (uint32_t s = 0; src->view && s < h->n_listed; s++) {
        if (!h->seg[s].target_id)
            continue;
        if (!src->node_group) {
            if (h->seg[s].target < src->view_size)
                names[s] = src->view[h->seg[s].target].name;
            continue;
        }
        for (uint32_t k = 0; k < src->n_view && !names[s]; k++)
            if (src->view[k].id == h->seg[s].target_id)
                names[s] = src->view[k].name;
    }
    ds_status_history_add_named(&sn->hist, h, names);
    free(h);
}

/* The counters, read from the modules through their getters (gossip's
 * from the report copy: gst). */
static void fill_metrics(ds_status_snapshot *sn, const ds_publish_src *src,
                         const ds_gossip_stats *gst)
{
    ds_publish_stats ps;
    memset(&ps, 0, sizeof(ps));
    ps.gossip = *gst;
    if (src->group)
        ps.group = *src->group;
    if (src->gnet)
        ds_gnet_stats_get(src->gnet, &ps.gnet);
    if (src->net) {
        ds_net_stats_get(src->net, &ps.net);
        const ds_drop_counters *dc = ds_net_drops(src->net);
        for (int r = 0; r < DS_DROP__COUNT; r++)
            ps.drops[r] = ds_drop_get(dc, (enum ds_drop_reason)r);
    }
    if (src->membership)
        ds_membership_stats_get(src->membership, &ps.membership);
    /* The tables are fixed and fit (test_status checks it): an error here
     * would be a programming error, and the page then lacks counters. */
    const int e = ds_publish_metrics(sn, &ps);
    if (e < 0)
        ds_log_rl(DS_LOG_WARN, "status", "the counters do not fit the snapshot: %s",
                  strerror(-e));
}

void ds_publish_status(ds_status *st, ds_status_snapshot *sn, uint64_t *last_ms, int force,
                       const ds_publish_src *src)
{
    if (!st || !sn)
        return;
    const uint64_t now = ds_now_ms();
    if (!force && now - *last_ms < PUBLISH_EVERY_MS)
        return;
    *last_ms = now;
    sn->state = (uint8_t)src->state;
    sn->step = src->step;
    sn->steps = src->steps;
    sn->round = src->round;
    sn->epoch = src->epoch;
    sn->loss = src->loss;
    sn->test_acc = src->test_acc;
    sn->lr = src->lr;
    sn->samples_per_s = src->samples_per_s;
    sn->samples = src->samples;
    /* The process metrics: a few small /proc reads, at most every
     * PUBLISH_EVERY_MS; a failure leaves them out of /metrics. */
    (void)ds_status_process_read(&sn->process);
    fill_view(sn, src);
    sn->n_layers = 0;
    for (int i = 0; src->layers && i < src->n_layers && i < DS_STATUS_MAX_LAYERS; i++) {
        const ds_layer *l = &src->layers[i];
        ds_status_layer *o = &sn->layers[sn->n_layers++];
        memset(o, 0, sizeof(*o));
        snprintf(o->name, sizeof(o->name), "%s", l->name);
        o->k = (uint32_t)l->k;
        o->in = (uint32_t)l->in;
        o->out = (uint32_t)l->out;
        o->offset = l->off;
        o->length = l->len;
    }
    ds_gossip_xinfo xs[DS_STATUS_MAX_SEGMENTS]; /* 4 KiB on the stack with in_from */
    uint32_t in_from[DS_STATUS_MAX_SEGMENTS * DS_STATUS_MAX_ANSWERS];
    ds_gossip_stats gst;
    memset(&gst, 0, sizeof(gst));
    if (src->gossip)
        ds_gossip_report(src->gossip, &gst, xs, DS_STATUS_MAX_SEGMENTS, in_from,
                         DS_STATUS_MAX_ANSWERS);
    fill_exchanges(sn, src, xs, in_from);
    fill_metrics(sn, src, &gst);
    ds_status_publish(st, sn);
}
