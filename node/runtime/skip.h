/*
 * node/runtime/skip.h: which peers a gossip round does not wait for, as a
 * pure table: no locks, no clock, no globals. The engine (engine.c) holds
 * a lock around it, feeds it what the network, gossip and membership tell
 * it, and asks it, while setting up each round's view, which peers that
 * round waits for.
 *
 * The rules (docs/gossip.md, "Skipped peers"), and why:
 * - A peer that misses a gossip deadline is not waited for in the next
 *   DS_SKIP_ROUNDS rounds; every further miss in a row doubles that
 *   window, up to 64 times (256 rounds). Then it is tried again: if we
 *   were the slow one (frozen, overloaded), both sides would otherwise
 *   skip each other for good.
 * - A window also lasts at least min_ms (the engine sets the gossip
 *   timeout): the peer that cost us one full deadline is not waited for
 *   again before as long has passed, however fast rounds go. Four rounds
 *   of a group's reductions took 50 ms, far less than membership needs to
 *   suspect a killed member (a probe period, more under load), and every
 *   window that ran out before the verdict cost another full deadline: in
 *   CI, a group of three waited out three deadlines in the 5 s after one
 *   member was SIGKILLed. A peer that is only slow is not skipped longer
 *   for it: its next frame (ds_skip_heard) ends the window.
 * - Two strengths. A missed gossip deadline is soft (DS_SKIP_NOWAIT): we
 *   still send the peer its requests and only stop waiting for it. A skip
 *   that also stopped our sends made the peer, which expected our request,
 *   wait out its own timeout and then skip us in turn, and so on round the
 *   cluster: after a crash in a 9-node cluster the rounds ran at one
 *   timeout each for seconds (commit 3f33fb9). A transport that cannot
 *   deliver to the peer, or a membership verdict (suspected, dead, left),
 *   is hard (DS_SKIP_ALL): nothing is sent to it either.
 * - A verdict holds until the peer is heard from (ds_skip_heard: a gossip
 *   frame from the peer itself, or membership's ALIVE), however many
 *   rounds pass. The transport's "responsive again" is not such news: a
 *   frozen peer's kernel still takes our sends (commit cb1b72e).
 * - Hearing from a peer forgets it entirely, its count of misses too.
 */
#ifndef DS_NODE_RUNTIME_SKIP_H
#define DS_NODE_RUNTIME_SKIP_H

#include <stdint.h>

#define DS_SKIP_MAX 64       /* peers tracked; a full table records no more */
#define DS_SKIP_ROUNDS 4     /* the first window, in rounds */
#define DS_SKIP_MAX_DOUBLINGS 6

/* What a round does with a peer. */
enum ds_skip_verdict {
    DS_SKIP_WAIT = 0,   /* exchange and wait, as usual */
    DS_SKIP_NOWAIT = 1, /* send to it, do not wait for it */
    DS_SKIP_ALL = 2,    /* neither */
};

/* A zeroed table is empty. Owned by the caller; not thread-safe. */
typedef struct ds_skip_table {
    uint64_t ids[DS_SKIP_MAX];
    uint64_t until[DS_SKIP_MAX]; /* first round it is tried again; UINT64_MAX: until heard */
    uint32_t fails[DS_SKIP_MAX]; /* misses in a row: the window doubles */
    uint64_t until_ms[DS_SKIP_MAX]; /* and not before this time (ms) */
    uint8_t hard[DS_SKIP_MAX];   /* 1: not sent to either */
    int n;
    uint32_t min_ms; /* the shortest window in time; 0: rounds only */
} ds_skip_table;

/* Peer `id` missed a deadline during round `round`, at now_ms (any
 * monotonic clock in ms, the same as ds_skip_check's): skip it from the
 * next round on for DS_SKIP_ROUNDS << min(misses so far, 6) rounds, and
 * until now_ms + min_ms at least. A window only ever grows. hard: not sent to either (a transport that cannot
 * deliver); once hard, a peer stays hard until heard from. Returns 1 when
 * the peer was not in the table before, 0 when it was, -ENOSPC when the
 * table is full (nothing recorded: the peer is waited for). */
int ds_skip_missed(ds_skip_table *t, uint64_t id, uint64_t round, uint64_t now_ms, int hard);

/* A membership verdict about `id` (suspected, dead, left): hard, until
 * heard from. Returns as ds_skip_missed. */
int ds_skip_hold(ds_skip_table *t, uint64_t id);

/* Heard from `id` (or membership saw it alive): forget it. */
void ds_skip_heard(ds_skip_table *t, uint64_t id);

/* What round `round`, set up at now_ms, does with peer `id`. */
enum ds_skip_verdict ds_skip_check(const ds_skip_table *t, uint64_t id, uint64_t round,
                                   uint64_t now_ms);

/* 1 when `id` missed a deadline or was held and has not been heard from
 * since, whether or not its window has passed (a peer being tried again). */
int ds_skip_listed(const ds_skip_table *t, uint64_t id);

#endif
