/*
 * node/gossip/fake.h: an in-process network for the gossip engine
 * (ds_gossip_io over mailboxes), with failures to inject: a node can be
 * dead (everything sent to it vanishes, its own sends are refused) and a
 * link can drop messages. Used by tests/test_gossip.c with one thread per
 * node.
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
uint64_t ds_fakenet_delivered(ds_fakenet *net);

#endif
