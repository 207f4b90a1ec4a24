/*
 * node/gossip/gossip_net.h: the gossip engine's seam (ds_gossip_io) over the
 * secured peer layer (node/net/net.h).
 *
 * Outgoing: a ds_gmsg becomes one wire frame (GOSSIP_REQ with a sparse
 * payload, GOSSIP_RESP with values, GOSSIP_STALE, GOSSIP_PUSH for the dense
 * crossover rule, ALLREDUCE chunks), addressed by node id through the
 * current view, sealed and sent by ds_net_send_msg with the round deadline.
 *
 * Incoming: the net's worker thread hands every gossip-class frame to
 * ds_gnet_on_frame, which decodes it (bounds from the model's largest
 * segment), copies the variable parts and queues it, bounded in bytes; the
 * gossip thread's recv() pops the queue and maps the sender's node id to
 * its index in the current view. A frame from a node outside the view is
 * dropped and counted.
 */
#ifndef DS_NODE_GOSSIP_NET_H
#define DS_NODE_GOSSIP_NET_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/metric.h"
#include "node/gossip/gossip.h"
#include "node/net/net.h"

typedef struct ds_gnet ds_gnet;

/* gossip_net's counters (base/metric.h: one row per field gives the
 * member, its /status key, its /metrics family and its docs/status.md
 * row). */
#define DS_GNET_HELP_DROP "Gossip frames dropped before the engine, by reason."
#define DS_GNET_STATS(X) \
    X(U64, queued, "queued", "dsnode_gossip_net_queued_total", COUNTER, NULL, NULL, \
      "Gossip frames queued.") \
    X(U64, dropped_full, "dropped_full", "dsnode_gossip_net_dropped_total", COUNTER, "reason", \
      "queue_full", DS_GNET_HELP_DROP) \
    X(U64, dropped_decode, "dropped_decode", "dsnode_gossip_net_dropped_total", COUNTER, \
      "reason", "decode", DS_GNET_HELP_DROP) \
    X(U64, dropped_not_in_view, "dropped_not_in_view", "dsnode_gossip_net_dropped_total", \
      COUNTER, "reason", "not_in_view", DS_GNET_HELP_DROP) \
    X(U64, send_failed, "send_failed", "dsnode_gossip_net_send_failed_total", COUNTER, NULL, \
      NULL, "Gossip sends that failed.") \
    X(U64, queue_reused, "queue_reused", "dsnode_gossip_net_queue_reused_total", COUNTER, NULL, \
      NULL, "Large gossip frames queued in memory kept from an earlier one (not allocated).")

typedef struct ds_gnet_stats {
    DS_GNET_STATS(DS_METRIC_FIELD)
} ds_gnet_stats;

/* net is borrowed for the gnet's life. max_count: the largest count a
 * frame may carry (the model's largest segment); max_queue_bytes bounds
 * what waits for the gossip thread. The caller owns *out. */
int ds_gnet_create(ds_gnet **out, ds_net *net, uint32_t max_count, size_t max_queue_bytes)
    __attribute__((warn_unused_result));

/* NULL-safe; clears the caller's pointer. */
void ds_gnet_destroy(ds_gnet **g);

/* 1 for the wire types this adapter carries. */
int ds_gnet_handles(unsigned wire_type);

/* From the net's on_recv (worker thread): decode and queue one frame. */
void ds_gnet_on_frame(ds_gnet *g, const ds_net_rx *rx);

/* The view the next round uses: ids[i] is the node id of view index i and
 * addrs[i] its transport address (may be NULL: addresses the net already
 * knows), both copied. Call between rounds. */
int ds_gnet_set_view(ds_gnet *g, const uint64_t *ids, const char *const *addrs, uint32_t G);

/* The same with groups as view indices (design §5, "Hierarchy"): ids[i]
 * (n of them, group by group) belongs to group group[i]; groups are
 * numbered 0..G-1 in order, none empty. A message to view index h for
 * segment s goes to member s mod |h| of group h; one from any member of h
 * comes from view index h. group NULL: every id a group of its own (that
 * is ds_gnet_set_view). 0, -EINVAL or -ENOMEM. */
int ds_gnet_set_groups(ds_gnet *g, const uint64_t *ids, const char *const *addrs, uint32_t n,
                       const uint32_t *group, uint32_t G);

/* Node id of view index i: 0 when out of range, and for a group of
 * several members (which member failed is not known there). */
uint64_t ds_gnet_view_id(ds_gnet *g, uint32_t i);

/* The io to hand to the gossip engine; valid for the gnet's life. Its
 * peer_failed calls `on_peer_failed(ctx, node id)` when set. */
const ds_gossip_io *ds_gnet_io(ds_gnet *g);
void ds_gnet_set_failure_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx);

/* Called (the gossip thread) with the node id of a peer whose frame
 * carried another view epoch than this round's (ds_gossip_io's
 * peer_view_differs). */
void ds_gnet_set_view_differs_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx);

/* Called (net worker thread) with the sender's node id of every gossip
 * frame received: the peer is alive. */
void ds_gnet_set_heard_hook(ds_gnet *g, void (*fn)(void *ctx, uint64_t id), void *ctx);

/* A stop flag (a signal handler sets it; may be NULL): once non-zero,
 * recv gives -ECANCELED within 50 ms instead of waiting out its deadline,
 * and send gives -ECANCELED at once. Call before the first round. */
void ds_gnet_set_stop(ds_gnet *g, const atomic_int *flag);

void ds_gnet_stats_get(ds_gnet *g, ds_gnet_stats *st);

#endif
