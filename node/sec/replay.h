/*
 * node/sec/replay.h: the receive-side replay window over a session's seq.
 *
 * The receiver keeps a 1024-wide sliding window over seq: a seq seen
 * before is REPLAY, one more than 1023 behind the newest is TOO_OLD, and
 * seq 0 (never sent: seq starts at 1) is TOO_OLD too. Checking and marking
 * are separate because the window must move only after the frame's tag has
 * verified: otherwise a forged frame with a huge seq would push every
 * genuine frame out as too_old.
 *
 * Ownership: the caller's (embedded in ds_session). Threads: none inside;
 * the session serialises ds_session_open per session.
 */
#ifndef DS_NODE_SEC_REPLAY_H
#define DS_NODE_SEC_REPLAY_H

#include <stdint.h>

#include "node/wire/wire.h"

#define DS_REPLAY_WINDOW 1024

/* Receive-side replay window over seq. Zero-initialise. */
typedef struct ds_replay {
    uint64_t top; /* newest accepted seq; 0 = none yet */
    uint64_t bits[DS_REPLAY_WINDOW / 64];
} ds_replay;

/* DS_DROP_NONE when seq may be accepted (new, inside the window); REPLAY or
 * TOO_OLD otherwise. Does not change the window. */
enum ds_drop_reason ds_replay_check(const ds_replay *w, uint64_t seq) DS_WUR;
/* Mark seq seen (after it has been authenticated). */
void ds_replay_mark(ds_replay *w, uint64_t seq);

#endif
