/*
 * node/sec/replay.c: the replay window (see replay.h).
 *
 * A bitmap of DS_REPLAY_WINDOW bits indexed by seq modulo its size, and the
 * newest accepted seq. Moving the window forward clears the slots of the
 * seqs it jumps over, so a slot always describes the one seq of the window
 * that maps to it.
 */
#include "config.h"

#include "node/sec/replay.h"

#include <string.h>

enum ds_drop_reason ds_replay_check(const ds_replay *w, uint64_t seq)
{
    if (seq == 0)
        return DS_DROP_TOO_OLD; /* seq starts at 1 */
    if (seq > w->top)
        return DS_DROP_NONE;
    if (w->top - seq >= DS_REPLAY_WINDOW)
        return DS_DROP_TOO_OLD;
    const uint64_t bit = seq % DS_REPLAY_WINDOW;
    return (w->bits[bit / 64] >> (bit % 64)) & 1 ? DS_DROP_REPLAY : DS_DROP_NONE;
}

void ds_replay_mark(ds_replay *w, uint64_t seq)
{
    if (seq > w->top) {
        /* Slots for the seqs we jump over become "not seen". */
        if (seq - w->top >= DS_REPLAY_WINDOW) {
            memset(w->bits, 0, sizeof(w->bits));
        } else {
            for (uint64_t s = w->top + 1; s < seq; s++) {
                const uint64_t b = s % DS_REPLAY_WINDOW;
                w->bits[b / 64] &= ~(1ull << (b % 64));
            }
        }
        w->top = seq;
    }
    const uint64_t bit = seq % DS_REPLAY_WINDOW;
    w->bits[bit / 64] |= 1ull << (bit % 64);
}
