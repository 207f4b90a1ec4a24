/*
 * node/transport/inproc.h: the in-process transport, and the faults a test
 * can inject into it.
 *
 * ds_transport_open with provider DS_TRANSPORT_INPROC ("inproc") opens an
 * endpoint that implements the whole ds_transport API (transport.h) without
 * libfabric: messages go between endpoints of this process, through a
 * process-wide registry of addresses. It exists so that node/net, and what
 * runs on it (node/gossip's gossip_net and state transfer), can be tested
 * in the unit suite without sockets, and with failures that are hard to
 * produce with real processes on cue. Nothing outside this process can
 * reach an inproc endpoint, so dsnode has no use for it.
 *
 * What it keeps of the contract: one progress thread per endpoint runs
 * every callback, without locks held; messages from one peer arrive whole,
 * at most once, in the order they were sent; every send's done runs exactly
 * once, -ETIMEDOUT no later than about 5 ms after its deadline when the
 * message could not be delivered; a lent buffer (release != NULL) is read
 * only on the progress thread and released exactly once; peers are
 * created on first contact (DS_TRANSPORT_EV_PEER_NEW), reported
 * unresponsive after miss_limit missed deadlines and responsive again;
 * max_queued_bytes, max_msg_bytes (drop too_big), max_peers (drop
 * peers_full), removal, reset and close behave as documented.
 *
 * What it does not model: chunks, grants, windows, libfabric's own
 * failures. A message is one copy from the sender's buffer into the
 * receiver's, made on the sender's progress thread when it is delivered.
 *
 * Addresses. listen is "host:port" as for the libfabric transport; the
 * host is kept as text (no name resolution), port 0 picks an unused port
 * for that host, starting at 1. A wildcard host needs `advertise`. Peers
 * are keyed by the canonical text of base/hostport.h (IPv6 in brackets).
 * A send to an address where no endpoint is open waits until one opens
 * there or its deadline passes.
 *
 * Faults are process-wide, by the address an endpoint advertises
 * (ds_transport_addr), and may be set before the endpoint exists. Every
 * function here may be called from any thread.
 */
#ifndef DS_NODE_TRANSPORT_INPROC_H
#define DS_NODE_TRANSPORT_INPROC_H

#include "node/transport/transport.h"

/* The provider name that selects the in-process transport. */
#define DS_TRANSPORT_INPROC "inproc"

/* Make the endpoint at addr dead (dead = 1) or alive again (dead = 0).
 * While it is dead, nothing reaches it and nothing leaves it: a message
 * to or from it waits, and fails with -ETIMEDOUT at its deadline; the
 * sender's transport then keeps the message's buffer ("stuck", counted in
 * stuck_ops and stuck_bytes, released only by a reset, a close, its
 * peer's removal, or the fault ending), which is what a send toward a
 * killed process does in the libfabric transport. Messages that had
 * reached its receive queue are lost. When it comes back, waiting
 * messages whose deadline has not passed are delivered in order; stuck
 * ones are released, never delivered. Returns 0, -EINVAL (not
 * host:port), -ENOSPC (too many fault entries). */
int ds_transport_inproc_kill(const char *addr, int dead);

/* Lose the next n messages sent to the endpoint at addr (n = 0 clears):
 * each is reported sent (done 0) and never delivered, as the first
 * message written into a connection whose peer has just restarted.
 * Returns 0, -EINVAL, -ENOSPC. */
int ds_transport_inproc_drop(const char *addr, unsigned n);

/* Forget every fault (a test's teardown). */
void ds_transport_inproc_clear(void);

#endif
