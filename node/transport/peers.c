/*
 * node/transport/peers.c: the libfabric backend's peer slots.
 *
 * A peer is a slot in a fixed table (max_peers), keyed by the canonical
 * text of its raw address ("127.0.0.1:5000", "[::1]:5000", the shm name
 * without "fi_ns://"). Its public handle is the slot and a 16-bit
 * generation, so a handle of a removed peer stays invalid (-ENOENT) even
 * when the slot is reused. A peer comes to exist in one of two ways, both
 * through fab_peer_find_or_create: the application names an address
 * (ds_transport_peer_add, any thread: the progress thread inserts it into
 * the address vector later), or a chunk arrives from an address no peer
 * has (the progress thread: inserted at once, PEER_NEW reported).
 *
 * Removal is a request (state REMOVING) the progress thread carries out:
 * queued sends fail with -ECANCELED, what the peer sent and was not yet
 * delivered is dropped, grants are taken back and given back, and the slot
 * is freed once libfabric holds nothing of it (DRAINING until then).
 *
 * Identity fields (state, gen, addr, raw) are written under t->lock; the
 * progress thread reads state and gen, which are atomic, without it. The
 * rest is the progress thread's.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "node/transport/internal.h"

ds_transport_peer fab_peer_handle(const tp_fab *t, uint32_t slot)
{
    return ((uint32_t)t->peers[slot].gen << 16) | (slot + 1);
}

/* The slot of a live peer's handle (under t->lock). 0 or -ENOENT. */
int fab_peer_slot(tp_fab *t, ds_transport_peer p, uint32_t *slot)
{
    uint32_t s = (p & 0xffffu);
    if (s == 0 || s > t->npeers)
        return -ENOENT;
    s--;
    if (t->peers[s].state != PEER_LIVE || t->peers[s].gen != (uint16_t)(p >> 16))
        return -ENOENT;
    *slot = s;
    return 0;
}

void fab_event(tp_fab *t, enum ds_transport_event_kind kind, uint32_t slot, int status)
{
    if (!t->o.on_event)
        return;
    ds_transport_event ev = {
        .kind = kind,
        .peer = slot == UINT32_MAX ? 0 : fab_peer_handle(t, slot),
        .misses = slot == UINT32_MAX ? 0 : t->peers[slot].misses,
        .status = status,
    };
    t->o.on_event(t->o.cb_ctx, &ev);
}

/* The peer completed a send or sent us something. */
void fab_peer_alive(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    p->misses = 0;
    if (p->unresponsive) {
        p->unresponsive = 0;
        ds_info(COMP, "peer %s responsive again", p->addr);
        fab_event(t, DS_TRANSPORT_EV_PEER_RESPONSIVE, slot, 0);
    }
}

/* The progress thread's part of a slot, as new. */
void fab_peer_fresh(struct tp_peer *p)
{
    p->in_av = 0;
    p->unresponsive = 0;
    p->misses = 0;
    p->tx_stream = 0;
    p->tx_seq = 0;
    memset(p->rxs, 0, sizeof(p->rxs)); /* (held lists were emptied before) */
    for (int i = 0; i < TP_STREAMS; i++)
        p->rxs[i].next = 1;
    p->gr_head = p->gr_n = 0;
    memset(p->used, 0, sizeof(p->used));
    p->used_pos = 0;
    p->need_sent = 0;
    p->req_pending = 0;
    p->req_ms = 0;
    p->grants_out = 0;
    p->need = 0;
    p->gbatch_n = 0;
    p->grant_stream = 0;
    p->large_ms = 0;
}

void fab_peer_free_slot(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    fab_av_remove(t, slot);
    fab_peer_fresh(p);
    pthread_mutex_lock(&t->lock);
    p->state = PEER_FREE;
    p->addr[0] = 0;
    pthread_mutex_unlock(&t->lock);
}

/* Removal: fail what is queued, forget what was received, free the slot
 * once libfabric holds nothing of it. */
void fab_peer_drain(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    while (p->txq.head) {
        struct tp_op *op = p->txq.head;
        if (op->is_abort) {
            list_unlink(&p->txq, op);
            op->where = OP_NOWHERE;
            fab_op_free(t, op);
            continue;
        }
        fab_op_fail(t, op, -ECANCELED);
    }
    for (struct tp_op *op = p->inflight.head; op; op = op->next)
        if (!op->reported)
            fab_op_fail(t, op, -ECANCELED);
    fab_rx_clear(t, p, DS_TP_DROP_REMOVED_PEER);
    /* Grants: ours to it are cancelled, its to us handed back (the slot
     * stays until that message is out). */
    fab_grants_cancel(t, slot, NULL, 0);
    p->need = 0;
    if (p->gr_n)
        fab_release_grants(t, slot);
    if (!p->inflight.head && !p->ctrlq.head)
        fab_peer_free_slot(t, slot);
}

/* The one place a peer is found by address or created. key: canonical
 * address; raw/rawlen: the provider's raw address. from_progress: called
 * on the progress thread, which inserts a new peer into the address vector
 * at once (else the slot is marked for the progress thread to insert).
 * Returns the slot, or UINT32_MAX when the address is new and no slot is
 * free; *created says whether the slot is new; *handle (may be NULL)
 * receives the handle, taken under the lock. Any thread. */
uint32_t fab_peer_find_or_create(tp_fab *t, const char *key, const uint8_t *raw, size_t rawlen,
                                 int from_progress, int *created, ds_transport_peer *handle)
{
    uint32_t slot = UINT32_MAX, free_slot = UINT32_MAX;
    *created = 0;
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->npeers; i++) {
        if (t->peers[i].state == PEER_LIVE && !strcmp(t->peers[i].addr, key)) {
            slot = i;
            break;
        }
        if (t->peers[i].state == PEER_FREE && free_slot == UINT32_MAX)
            free_slot = i;
    }
    if (slot == UINT32_MAX && free_slot != UINT32_MAX) {
        struct tp_peer *p = &t->peers[free_slot];
        p->state = PEER_LIVE;
        p->gen++;
        snprintf(p->addr, sizeof(p->addr), "%s", key);
        memcpy(p->raw, raw, rawlen);
        p->rawlen = rawlen;
        p->need_av = !from_progress;
        if (!from_progress)
            t->peers_dirty = 1;
        slot = free_slot;
        *created = 1;
    }
    if (slot != UINT32_MAX && handle)
        *handle = fab_peer_handle(t, slot);
    pthread_mutex_unlock(&t->lock);
    if (*created && from_progress && !t->broken)
        fab_av_insert(t, slot);
    return slot;
}

int fab_peer_add(ds_transport *pub, const char *hostport, ds_transport_peer *out)
{
    tp_fab *t = fab_of(pub);
    uint8_t raw[TP_NAME_MAX];
    size_t rawlen = 0;
    char key[DS_TRANSPORT_ADDR_MAX];
    int r = fab_resolve(t, hostport, raw, &rawlen, key, sizeof(key));
    if (r)
        return r;
    int created;
    if (fab_peer_find_or_create(t, key, raw, rawlen, 0, &created, out) == UINT32_MAX)
        return -ENOSPC;
    fab_wake(t);
    return 0;
}

int fab_peer_remove(ds_transport *pub, ds_transport_peer p)
{
    tp_fab *t = fab_of(pub);
    uint32_t slot;
    pthread_mutex_lock(&t->lock);
    int r = fab_peer_slot(t, p, &slot);
    if (!r) {
        t->peers[slot].state = PEER_REMOVING;
        t->peers_dirty = 1;
    }
    pthread_mutex_unlock(&t->lock);
    if (!r)
        fab_wake(t);
    return r;
}

int fab_peer_addr(ds_transport *pub, ds_transport_peer p, char *buf, size_t n)
{
    tp_fab *t = fab_of(pub);
    uint32_t slot;
    pthread_mutex_lock(&t->lock);
    int r = fab_peer_slot(t, p, &slot);
    if (!r && (size_t)snprintf(buf, n, "%s", t->peers[slot].addr) >= n)
        r = -ENOSPC;
    pthread_mutex_unlock(&t->lock);
    return r;
}
