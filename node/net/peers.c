/*
 * node/net/peers.c: the secured layer's peer table, its sessions, and the
 * reports that leave the lock.
 *
 * A struct net_peer exists per transport connection we handshake on (an
 * address). Its id is 0 until a handshake proves one; after that it is the
 * table's key. The peer owns at most one handshake in progress and one
 * current session; a session is a refcounted object, because senders seal
 * outside the lock while the worker may replace it (a rekey, or the peer
 * handshaking again after a restart): the old one is wiped when its last
 * sender lets go. Everything in the table is guarded by n->lock.
 *
 * Callbacks (on_event, the senders' done) never run under the lock: code
 * that holds it collects reports into a list, and net_reports_run delivers
 * them, in the order collected, after the lock is let go.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/log.h"
#include "node/net/internal.h"

struct net_sess *net_sess_ref(struct net_sess *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

void net_sess_unref(struct net_sess *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        ds_session_wipe(&s->s);
        free(s);
    }
}

void net_report_event(struct report **list, enum ds_net_event_kind kind, const struct net_peer *p,
                         int status)
{
    struct report *r = calloc(1, sizeof(*r));
    if (!r)
        return;
    r->is_event = 1;
    r->ev.kind = kind;
    r->ev.status = status;
    if (p) {
        r->ev.peer = p->id;
        snprintf(r->name, sizeof(r->name), "%s", p->name);
        snprintf(r->addr, sizeof(r->addr), "%s", p->addr[0] ? p->addr : p->dial);
    }
    r->next = *list;
    *list = r;
}

void net_report_done(struct report **list, ds_transport_done_fn done, void *arg, int status)
{
    if (!done)
        return;
    struct report *r = calloc(1, sizeof(*r));
    if (!r) {
        done(arg, status); /* better late under the lock than never */
        return;
    }
    r->done = done;
    r->done_arg = arg;
    r->status = status;
    r->next = *list;
    *list = r;
}

void net_reports_run(ds_net *n, struct report *list)
{
    /* Reverse to deliver in the order collected. */
    struct report *rev = NULL;
    while (list) {
        struct report *r = list;
        list = r->next;
        r->next = rev;
        rev = r;
    }
    while (rev) {
        struct report *r = rev;
        rev = r->next;
        if (r->is_event) {
            r->ev.name = r->name;
            r->ev.addr = r->addr;
            if (n->cfg.on_event)
                n->cfg.on_event(n->cfg.cb_ctx, &r->ev);
        } else {
            if (r->status)
                ADD(n, send_failures, 1);
            r->done(r->done_arg, r->status);
        }
        free(r);
    }
}

/* The peer authenticated as id, else one being dialled for it. */
struct net_peer *net_peer_by_id(ds_net *n, uint64_t id)
{
    struct net_peer *dialled = NULL;
    if (!id)
        return NULL;
    for (struct net_peer *p = n->peers; p; p = p->next) {
        if (p->id == id)
            return p;
        if (!p->id && p->expect == id && !dialled)
            dialled = p;
    }
    return dialled;
}

struct net_peer *net_peer_by_tp(ds_net *n, ds_transport_peer tp)
{
    for (struct net_peer *p = n->peers; p; p = p->next)
        if (p->tp == tp && tp)
            return p;
    return NULL;
}

struct net_peer *net_peer_by_addr(ds_net *n, const char *addr)
{
    for (struct net_peer *p = n->peers; p; p = p->next)
        if (!strcmp(p->dial, addr) || !strcmp(p->addr, addr) || !strcmp(p->pub, addr))
            return p;
    return NULL;
}

struct net_peer *net_peer_new(ds_net *n)
{
    struct net_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->next = n->peers;
    n->peers = p;
    return p;
}

void net_pend_fail_all(struct net_peer *p, int status, struct report **rep)
{
    while (p->pend_head) {
        struct pend *q = p->pend_head;
        p->pend_head = q->next;
        net_report_done(rep, q->done, q->done_arg, status);
        free(q->buf);
        free(q);
    }
    p->pend_tail = NULL;
    p->pend_bytes = 0;
    p->npend = 0;
}

void net_hs_drop(ds_net *n, struct net_peer *p)
{
    if (p->hs) {
        ds_hs_wipe(p->hs);
        free(p->hs);
        p->hs = NULL;
        if (!p->hs_initiator && n->nhandshakes)
            n->nhandshakes--;
    }
}

/* Unlink and free; its transport peer goes too. */
void net_peer_free(ds_net *n, struct net_peer *p, struct report **rep)
{
    for (struct net_peer **pp = &n->peers; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    net_hs_drop(n, p);
    net_pend_fail_all(p, -ECANCELED, rep);
    net_sess_unref(p->sess);
    if (p->tp) {
        /* Another peer entry may share the connection (never, in
         * practice); only remove it when none does. */
        int shared = 0;
        for (struct net_peer *q = n->peers; q; q = q->next)
            shared |= q->tp == p->tp;
        if (!shared)
            ds_transport_peer_remove(n->tp, p->tp);
    }
    free(p);
}
