/*
 * node/runtime/hier.h: groups (design §5, "Hierarchy"), as a pure module.
 *
 * Nodes with the same node.group form a group; a node without one is a
 * group of its own. From one membership view every node derives the same
 * groups, with no leader: entries sorted by (group, node id), groups
 * numbered in that order (so by group name), members of a group numbered
 * by node id. The gossip view's participants are then the groups, and
 * segment s of group g is handled by its member s mod |g|.
 */
#ifndef DS_NODE_RUNTIME_HIER_H
#define DS_NODE_RUNTIME_HIER_H

#include <stddef.h>
#include <stdint.h>

#include "base/metric.h"
#include "conf/choices.h"
#include "sparsify/sparsify.h"
#include "node/membership/membership.h"

/* The group's counters (base/metric.h rows; /status "group"). */
#define DS_GROUP_HELP_RAN \
    "Reductions by the algorithm they ran (direct also after a failure or to follow a member)."
#define DS_GROUP_STATS(X) \
    X(U32, size, "size", "dsnode_group_size", GAUGE, NULL, NULL, \
      "Members of this node's group at the last step (1: no group).") \
    X(U32, member, "member", "dsnode_group_member", GAUGE, NULL, NULL, \
      "This node's index in its group (by node id).") \
    X(U32, segments_owned, "segments_owned", "dsnode_group_segments_owned", GAUGE, NULL, NULL, \
      "Gossip segments this member exchanges for its group (segment mod size).") \
    X(U64, reductions, "reductions", "dsnode_group_reductions_total", COUNTER, NULL, NULL, \
      "Reductions inside the group (one per step, and the final sync).") \
    X(U64, incomplete, "incomplete", "dsnode_group_incomplete_total", COUNTER, NULL, NULL, \
      "Reductions that ended with a chunk or list missing here (a member held dead " \
      "leaves none missing).") \
    X(U64, orphaned, "orphaned", "dsnode_group_orphaned_total", COUNTER, NULL, NULL, \
      "Reductions in which this member summed a chunk whose owner it holds dead (an " \
      "orphan: docs/gossip.md, Failures).") \
    X(U64, steps_taken, "steps_taken", "dsnode_group_steps_taken_total", COUNTER, NULL, NULL, \
      "Times this member took member 0's step count (it was apart in steps).") \
    X(NS, reduce_ns, "reduce_s", "dsnode_group_reduce_seconds_total", COUNTER, NULL, NULL, \
      "Time the steps waited for the group's reductions (exposed); with group.overlap the " \
      "wait for the layers' included.") \
    X(NS, reduce_hidden_ns, "reduce_hidden_s", "dsnode_group_reduce_hidden_seconds_total", \
      COUNTER, NULL, NULL, \
      "group.overlap: time of the layers' reductions that ran behind backward (hidden).") \
    X(U64, layer_reductions, "layer_reductions", "dsnode_group_layer_reductions_total", \
      COUNTER, NULL, NULL, "group.overlap: reductions of one layer's gradient.") \
    X(U64, model_picks, "model_picks", "dsnode_group_model_picks_total", COUNTER, NULL, NULL, \
      "group.overlap with group.allreduce = auto: reductions whose algorithm the cost model " \
      "picked for their length.") \
    X(NS, exchange_wait_ns, "exchange_wait_s", "dsnode_group_exchange_wait_seconds_total", \
      COUNTER, NULL, NULL, \
      "Exposed time waiting for the overlapped inter-group exchange to finish.") \
    X(NS, exchange_ns, "exchange_s", "dsnode_group_exchange_seconds_total", COUNTER, NULL, \
      NULL, "Time of the inter-group exchanges, hidden behind compute or not.") \
    X(NS, max_wait_ns, "max_wait_s", "dsnode_group_max_wait_seconds", GAUGE, NULL, NULL, \
      "Longest wait of one step on its group: exchange, reduction and re-sync.") \
    X(U64, ran_direct, "ran_direct", "dsnode_group_reductions_ran_total", COUNTER, "algorithm", \
      "direct", DS_GROUP_HELP_RAN) \
    X(U64, ran_ring, "ran_ring", "dsnode_group_reductions_ran_total", COUNTER, "algorithm", \
      "ring", DS_GROUP_HELP_RAN) \
    X(U64, ran_butterfly, "ran_butterfly", "dsnode_group_reductions_ran_total", COUNTER, \
      "algorithm", "butterfly", DS_GROUP_HELP_RAN)

/* Each reduction also averages 1/GROUP_SYNC_SLICES of the parameters and
 * momentum, a slice in turn: members that differ are one model again
 * after this many clean steps. */
#define GROUP_SYNC_SLICES 16

/* The longest vector a group reduces, for a model of n parameters:
 * gradient, a slice of parameters and of momentum, 4 floats of position,
 * member 0's choice of the next algorithm and, with group.overlap and
 * auto, its cost model (5 floats; node/runtime/rounds.c); the reducer's
 * frames also carry a member's (index, value) pairs, 2 floats each, up
 * to this length. */
static inline size_t ds_hier_vec_len(size_t n)
{
    return n + 2 * ((n + GROUP_SYNC_SLICES - 1) / GROUP_SYNC_SLICES) + 10;
}

typedef struct ds_group_stats {
    DS_GROUP_STATS(DS_METRIC_FIELD)
} ds_group_stats;

typedef struct ds_hier {
    uint32_t n_groups;
    uint32_t group;   /* this node's group (its gossip view index) */
    uint32_t member;  /* this node's index in its group */
    uint32_t size;    /* its group's size */
    uint32_t first;   /* order[first .. first + size): its group's members */
    int any;          /* some group has more than one member */
} ds_hier;

/* Group the view v (G entries, any order) that holds node `self`: order
 * (G entries) gets the view indices sorted by (group, id), gidx (G
 * entries) each sorted entry's group. 0, or -EINVAL when self is not in
 * v. */
int ds_hier_form(const ds_member_info *v, uint32_t G, uint64_t self, uint32_t *order,
                 uint32_t *gidx, ds_hier *out);

/* group.sparsify's sparsifier for a model of n parameters: *out = NULL
 * for none (the dense mean), a MiCRO sparsifier for micro (its threshold
 * starts at the exact k-th largest |v| of its first chunk, then follows the
 * group's count, ds_micro_feedback), a DEFT sparsifier over the layers
 * for deft (layer_off: n_layers + 1 boundaries from 0 to n; NULL: one
 * layer; ds_deft_ef_step). 0, -EINVAL (an unknown mode, layers that do
 * not cover [0, n) in order) or -ENOMEM. */
int ds_hier_sparsifier_create(enum ds_group_sparsify mode, size_t n, const uint32_t *layer_off,
                              size_t n_layers, ds_sparsifier **out)
    __attribute__((warn_unused_result));

#endif
