/*
 * node/gossip/fake.h: an in-process network for the gossip engine
 * (ds_gossip_io over mailboxes), with a failure to inject: a node can be
 * dead (everything sent to it vanishes, its own sends are refused). Used
 * by tests/test_gossip.c with one thread per node.
 *
 * The fake has its own clock, shared by all its nodes, which the tests
 * control: it starts at 0 and moves only when a test advances it or when a
 * recv runs out of time (the clock then jumps to that recv's deadline).
 * A round in which nobody waits out a deadline therefore takes no time at
 * all on this clock, whatever the machine's load; a test asserts on the
 * clock, not on elapsed wall time. While waiting, a recv blocks in real
 * time for as long as the fake clock has left until its deadline, so a
 * peer thread that is merely slow still gets that long to deliver.
 *
 * Thread safety: every function may be called from any thread; each
 * node's io is meant for one thread at a time (the engine's).
 */
#ifndef DS_NODE_GOSSIP_FAKE_H
#define DS_NODE_GOSSIP_FAKE_H

#include <stdint.h>

#include "node/gossip/gossip.h"

typedef struct ds_fakenet ds_fakenet;

ds_fakenet *ds_fakenet_create(uint32_t G);
void ds_fakenet_destroy(ds_fakenet *net);
/* The io of node `me`; valid until destroy. */
const ds_gossip_io *ds_fakenet_io(ds_fakenet *net, uint32_t me);
void ds_fakenet_set_dead(ds_fakenet *net, uint32_t node, int dead);
/* How many times peer_failed named `peer`, over all nodes. */
uint64_t ds_fakenet_failures(ds_fakenet *net, uint32_t peer);
/* How many times peer_view_differs named `peer`, over all nodes. */
uint64_t ds_fakenet_view_differs(ds_fakenet *net, uint32_t peer);
uint64_t ds_fakenet_delivered(ds_fakenet *net);

/* The fake clock, in nanoseconds (what every node's io->now_ns reads). */
uint64_t ds_fakenet_now_ns(ds_fakenet *net);
/* Move the fake clock forward by ns. */
void ds_fakenet_advance(ds_fakenet *net, uint64_t ns);
/* How many recv calls ran out of time (each moved the clock to its
 * deadline), over all nodes. */
uint64_t ds_fakenet_timeouts(ds_fakenet *net);
/* on = 1: a recv that finds its mailbox empty does not block at all; the
 * clock jumps to its deadline at once. For single-threaded tests, where
 * nobody else could deliver while it waited. */
void ds_fakenet_set_instant(ds_fakenet *net, int on);
/* A recv with an empty mailbox waits `factor` times the fake time it has
 * left, in real time (1, the default: as long). The clock still moves
 * only to the deadline. For multi-threaded tests where every node is
 * alive and a time-out can only mean that the machine stalled a thread
 * (sanitizers, a loaded CI host): a larger factor keeps such a stall
 * from becoming a missed exchange. */
void ds_fakenet_set_patience(ds_fakenet *net, uint32_t factor);

#endif
