/*
 * node/runtime/leave.h: how a node leaves at the end of its run: when it
 * lingers in the rounds, for how long, and how long it drains. A pure
 * module: the caller passes the time (now_ms), the rounds, the signals
 * seen and the member table; no locks, no clock, no globals. The engine's
 * ds_engine_leave follows it.
 *
 * The rules (docs/gossip.md, "Leaving"), and why:
 * - The leave is announced when training is over (finished or stopped),
 *   not earlier: a leaving node refuses JOINs. It is effective lag rounds
 *   later, the same round on every node (commit 5adf3a2).
 * - Until then the node keeps taking part in the rounds, without
 *   training: the others still count on it. At most DS_LINGER_MS, and a
 *   second signal stops it at once.
 * - A node stopped by a signal does not linger: a launcher waits only a
 *   few seconds before SIGKILL. Its leave still spreads, and the others
 *   skip it after one timeout until it applies (commit 9156221).
 * - A lingering node stops as soon as no other member counts on it, i.e.
 *   none is alive or suspected: every other one has announced its leave
 *   (or died). When all nodes finish together, lingering to the leave
 *   round only cost seconds: runs ended up to 10 s late (commit fea1128).
 *   It checks after each round, not before: the others may be in that
 *   round with it already, sending, and a node that closed its endpoint
 *   under them saw libfabric 1.17 crash in fi_close (commit d8dfb64).
 * - Then it drains: up to DS_DRAIN_MS (DS_DRAIN_SIGNALLED_MS when
 *   signalled) for the leave to spread and its last frames to leave.
 */
#ifndef DS_NODE_RUNTIME_LEAVE_H
#define DS_NODE_RUNTIME_LEAVE_H

#include <stdint.h>

#include "node/membership/membership.h"

#define DS_LINGER_MS 10000
#define DS_DRAIN_MS 3000
#define DS_DRAIN_SIGNALLED_MS 1000

/* Lingering in progress. Owned by the caller; not thread-safe. */
typedef struct ds_linger {
    uint64_t next_round;  /* the next round to take part in */
    uint64_t leave_round; /* our leave applies here: we are out of its view */
    uint64_t until_ms;    /* lingering ends here at the latest */
} ds_linger;

/* Training is over; the last round we took part in is current_round.
 * leaving: our leave was announced, effective at leave_round; signalled:
 * stopped by a signal. Returns 1 and fills l when we linger (from round
 * current_round + 1 on), 0 when we do not. */
int ds_linger_start(ds_linger *l, int leaving, int signalled, uint64_t current_round,
                    uint64_t leave_round, uint64_t now_ms);

/* Take part in round l->next_round? 1: yes; 0: stop (the leave applies,
 * the time is up, or signals >= 2). The caller advances l->next_round
 * after each round. */
int ds_linger_more(const ds_linger *l, int signals, uint64_t now_ms);

/* Does any member other than self_id still count on us: one alive or
 * suspected? all: the n members of our table (any state, self included). */
int ds_leave_others_count_on_us(const ds_member_info *all, uint32_t n, uint64_t self_id);

/* When draining stops at the latest. */
uint64_t ds_leave_drain_until(int signalled, uint64_t now_ms);

#endif
