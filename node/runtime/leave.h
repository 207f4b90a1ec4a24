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
 * - It lingers at the pace its training had (the mean interval of its
 *   last DS_ROUND_CLOCK rounds), never faster, counted from the start of
 *   lingering (a final evaluation before it is not rounds owed, to be
 *   run back to back): a lingering round waits
 *   only for partners that answer, and with the adaptive deadline at its
 *   10 ms floor a node that finished first ran rounds 57..87 in 80 ms,
 *   ahead of every partner still training. Its requests came too early
 *   and failed, the partners at those rounds found it gone, and its round
 *   count ran past the status history (CI: dsviz_live, 51 rounds for 24
 *   steps). At the cluster's pace its rounds meet the partners' rounds,
 *   and it stops as soon as they announce their leave.
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
#define DS_ROUND_CLOCK 8 /* rounds whose starts give the pace */

/* When the last rounds began, for the pace of lingering. Owned by the
 * caller; not thread-safe. Zero it to start. */
typedef struct ds_round_clock {
    uint64_t round[DS_ROUND_CLOCK], ns[DS_ROUND_CLOCK];
    uint32_t n; /* ticks so far (the ring holds the last DS_ROUND_CLOCK) */
} ds_round_clock;

/* Round `round` began at now_ns. */
void ds_round_clock_tick(ds_round_clock *c, uint64_t round, uint64_t now_ns);

/* The mean time per round over the rounds held (0: fewer than two, or
 * no round between them), at most max_ns. *last_round and *last_ns: the
 * newest tick (when n > 0). */
uint64_t ds_round_clock_pace(const ds_round_clock *c, uint64_t max_ns, uint64_t *last_round,
                             uint64_t *last_ns);

/* Lingering in progress. Owned by the caller; not thread-safe. */
typedef struct ds_linger {
    uint64_t next_round;  /* the next round to take part in */
    uint64_t leave_round; /* our leave applies here: we are out of its view */
    uint64_t until_ms;    /* lingering ends here at the latest */
    uint64_t base_round, base_ns, round_ns; /* the pace (ds_linger_pace) */
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

/* Linger at a pace: round k starts no earlier than base_ns + (k -
 * base_round) * round_ns. round_ns 0: no pace (as soon as the last round
 * ended). ds_linger_start sets no pace. */
void ds_linger_pace(ds_linger *l, uint64_t base_round, uint64_t base_ns, uint64_t round_ns);

/* How long to wait, from now_ns, before round l->next_round (0: now). */
uint64_t ds_linger_wait_ns(const ds_linger *l, uint64_t now_ns);

/* Does any member other than self_id still count on us: one alive or
 * suspected? all: the n members of our table (any state, self included). */
int ds_leave_others_count_on_us(const ds_member_info *all, uint32_t n, uint64_t self_id);

/* When draining stops at the latest. */
uint64_t ds_leave_drain_until(int signalled, uint64_t now_ms);

#endif
