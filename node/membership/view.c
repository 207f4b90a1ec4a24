/*
 * node/membership/view.c: effective rounds and the view for a round.
 *
 * A member enters the view at its join round and leaves it at its removal
 * round; both are decided once, by one node, and travel in the record. All
 * nodes evaluate the same pure function of their tables, so once they know
 * the same records they agree on every view and epoch at every round from
 * then on. The view at round r is the members with join round <= r and no
 * removal round <= r, sorted by (name, id); its epoch is the largest change
 * round <= r (folded into a floor when a member is purged, so purging
 * changes no epoch already reached).
 *
 * The round a change is decided at is ours, or the highest round heard
 * from live members when we are behind (ds_mship_note_round), bounded so
 * that one confused member cannot push every decision into the far
 * future.
 */
#include "config.h"

#include "node/membership/internal.h"

#include <errno.h>

/* ---- rounds and epochs ----------------------------------------------------------- */

/* A purged member's change rounds: fold them into the floor so the epochs
 * of rounds we have reached do not move. Only rounds already passed are
 * folded, and those are below every current round, so nodes that purge at
 * different times still compute the same epochs. */
void ds_mship_fold_change(ds_membership *m, uint64_t c)
{
    if (c != NO_ROUND && c <= m->round && c > m->epoch_floor)
        m->epoch_floor = c;
}

uint64_t ds_mship_epoch_at(ds_membership *m, uint64_t r)
{
    uint64_t e = m->epoch_floor;
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *x = &m->tab[i];
        if (!x->used)
            continue;
        const uint64_t c[2] = {x->join_round, x->removal_round};
        for (int k = 0; k < 2; k++)
            if (c[k] != NO_ROUND && c[k] <= r && c[k] > e)
                e = c[k];
    }
    return e;
}

/* Track the cluster's round from members' headers, bounded so that one
 * confused member cannot push every decision into the far future. */
void ds_mship_note_round(ds_membership *m, const ds_wire_msg *msg)
{
    const member *snd = find(m, msg->h.sender);
    if (msg->h.type == DS_MSG_MEMBERS && m->joining && !m->joined) {
        m->seen_round = max64(m->seen_round, msg->u.members.round_now);
        return;
    }
    if (!snd || !is_live(snd))
        return;
    const uint64_t cap = sat_add(decide_round(m), m->cfg.max_round_ahead);
    m->seen_round = max64(m->seen_round, msg->h.round < cap ? msg->h.round : cap);
}

/* ---- view tracking --------------------------------------------------------------- */

static void view_summary(ds_membership *m, uint64_t r, uint32_t *G, uint64_t *fp, int *in)
{
    uint32_t g = 0;
    uint64_t f = 0;
    for (uint32_t i = 0; i < m->cap; i++) {
        const member *e = &m->tab[i];
        if (e->used && in_view(e, r)) {
            g++;
            uint64_t z = e->id;
            f += ds_splitmix64_step(&z);
        }
    }
    *G = g;
    *fp = f;
    *in = in_view(self_m(m), r);
}

void ds_mship_check_view(ds_membership *m, uint64_t now)
{
    if (!m->joined)
        return;
    uint32_t G;
    uint64_t fp;
    int in;
    view_summary(m, m->round, &G, &fp, &in);
    const uint64_t epoch = ds_mship_epoch_at(m, m->round);
    if (m->view_known && G == m->view_G && fp == m->view_fp && in == m->view_in &&
        epoch == m->view_epoch)
        return;
    m->view_known = 1;
    m->view_G = G;
    m->view_fp = fp;
    m->view_in = in;
    m->view_epoch = epoch;
    ds_membership_event *ev = ds_mship_push_event(m, DS_MEV_VIEW_CHANGED, self_m(m), now);
    if (ev) {
        ev->epoch = epoch;
        ev->view_size = G;
        ev->in_view = in;
    }
}

void ds_membership_set_round(ds_membership *m, uint64_t round, uint64_t now_ms)
{
    pthread_mutex_lock(&m->mu);
    m->round = round;
    ds_mship_check_view(m, now_ms);
    ds_mship_unlock_and_flush(m);
}

/* ---- the view at a round --------------------------------------------------------- */

static int member_cmp(const member *a, const member *b)
{
    int c = strcmp(a->name, b->name);
    if (c)
        return c;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Insertion sort of slot indices by (name, id): views are small and this
 * needs no global context for qsort. */
static void sort_slots(ds_membership *m, uint32_t *v, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        uint32_t x = v[i], j = i;
        while (j > 0 && member_cmp(&m->tab[v[j - 1]], &m->tab[x]) > 0) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
}

int ds_membership_view_at(ds_membership *m, uint64_t round, ds_member_info *out, uint32_t cap,
                          uint32_t *G, uint32_t *me, uint64_t *epoch)
{
    pthread_mutex_lock(&m->mu);
    uint32_t g = 0;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->tab[i].used && in_view(&m->tab[i], round))
            m->tmp[g++] = i;
    sort_slots(m, m->tmp, g);
    uint32_t mine = DS_MEMBERSHIP_NOT_IN_VIEW;
    for (uint32_t i = 0; i < g; i++) {
        if (m->tmp[i] == 0)
            mine = i;
        if (out && i < cap)
            ds_mship_info_of(&m->tab[m->tmp[i]], &out[i]);
    }
    if (G)
        *G = g;
    if (me)
        *me = mine;
    if (epoch)
        *epoch = ds_mship_epoch_at(m, round);
    pthread_mutex_unlock(&m->mu);
    return out && cap < g ? -ENOSPC : 0;
}
