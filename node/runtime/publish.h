/*
 * node/runtime/publish.h: the runtime's side of the status page: it reads
 * the other modules (view, this round's exchanges, every stats struct) and
 * fills a ds_status_snapshot for node/status, which knows none of them.
 *
 * The counters go to the snapshot as metric groups (base/metric.h), whose
 * descriptor tables are made here from each module's X-macro list; the
 * groups' order is the order of the /status document (docs/status.md).
 *
 * Everything here runs on the thread that publishes (the training thread)
 * and only reads the modules through their thread-safe getters.
 */
#ifndef DS_NODE_RUNTIME_PUBLISH_H
#define DS_NODE_RUNTIME_PUBLISH_H

#include <stddef.h>
#include <stdint.h>

#include "base/metric.h"
#include "node/gossip/gossip.h"
#include "node/gossip/gossip_net.h"
#include "node/membership/membership.h"
#include "node/net/net.h"
#include "node/runtime/hier.h"
#include "node/status/status.h"
#include "node/wire/wire.h"

/* Plain copies of every counter the status page shows. */
typedef struct ds_publish_stats {
    ds_net_stats net;                /* frames, bytes, handshakes, .transport */
    uint64_t drops[DS_DROP__COUNT];  /* the net's drop counters, read once */
    ds_gossip_stats gossip;
    ds_gnet_stats gnet;
    ds_membership_stats membership;
    ds_group_stats group;
} ds_publish_stats;

/* The metric groups of the page, in page order (static storage): *n of
 * them. For tests and the docs check. */
const ds_metric_group *const *ds_publish_groups(size_t *n);

/* Replace the snapshot's metric groups with the counters in *ps (borrowed
 * for the call). 0, or a negative errno from ds_status_add_group (a table
 * that does not fit: a programming error, caught by the tests). */
int ds_publish_metrics(ds_status_snapshot *sn, const ds_publish_stats *ps)
    __attribute__((warn_unused_result));

/* ds_status_create for the node: sn (the caller's, initialised) gets the
 * metric groups with zero counters and is the document shown until the
 * first publish, so even that one carries every key. Same contract as
 * ds_status_create. */
int ds_publish_open(ds_status **out, const char *listen, const char *file, int file_interval_ms,
                    ds_status_snapshot *sn) __attribute__((warn_unused_result));

/* What the runtime knows at a publish; the modules are borrowed for the
 * call (any may be NULL: its part then stays empty). */
typedef struct ds_publish_src {
    int state;                       /* enum ds_status_state */
    int64_t step, steps;
    uint64_t round, epoch;
    double loss, test_acc, lr, samples_per_s;
    uint64_t samples;                /* steps this process trained x batch size */
    const ds_member_info *view;      /* the view of `round`: view_len entries */
    uint32_t view_len;               /* those in `view` (at most view_size) */
    uint32_t view_size;              /* the view's real size */
    /* NULL, or view_len entries: the view is sorted by group (hier.h) and
     * entry i is in group view_group[i]; gossip's view indices are then
     * groups, and segment s of group h is handled by its member s mod |h|. */
    const uint32_t *view_group;
    const ds_group_stats *group;     /* may be NULL */
    uint64_t self_id;
    ds_gossip *gossip;
    ds_gnet *gnet;
    ds_net *net;
    ds_membership *membership;
    const ds_layer *layers;          /* the model's layer table, NULL before */
    int n_layers;
} ds_publish_src;

/* Fill *sn from *src and publish it on st: at most every 200 ms (tracked
 * in *last_ms, ds_now_ms() time) unless force (phase changes, the end).
 * Does nothing when st or sn is NULL. */
void ds_publish_status(ds_status *st, ds_status_snapshot *sn, uint64_t *last_ms, int force,
                       const ds_publish_src *src);

/* A round that has just ended, for the status page's history. */
typedef struct ds_publish_round_src {
    uint64_t round, epoch;
    uint32_t view_size, me;   /* me == view_size: not in the view */
    const uint64_t *vids;     /* the view's node ids: view_size of them */
    const ds_member_info *view; /* their records (names), or NULL */
    uint64_t begin_ns;        /* ds_now_ns() at the round's begin */
    ds_gossip *gossip;        /* after ds_gossip_end: the outcomes are final */
    /* A round between groups: view_size and me count groups, and
     * node_ids / node_group (n_nodes each: the round's nodes sorted by
     * group, and each one's group index) map a target group and segment to
     * the member that handles it (ds_topo_hier_owner); vids is then unused
     * and view (n_view records, any order) only names nodes. NULL: a
     * round between nodes. */
    const uint64_t *node_ids;
    const uint32_t *node_group;
    uint32_t n_nodes, n_view;
    uint32_t group_member, group_size;
} ds_publish_round_src;

/* Add the round to sn's history (the round's thread: it reads gossip's
 * live per-segment outcomes). */
void ds_publish_round(ds_status_snapshot *sn, const ds_publish_round_src *src);

#endif
