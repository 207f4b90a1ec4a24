/*
 * node/net/allow.c: reloading the allow-list (ds_net_allow_reload).
 *
 * The file is read and parsed without any lock; only a list that loaded
 * completely is swapped in, so a bad file changes nothing. The swap runs
 * under n->lock, which is also where every handshake reads the list
 * (handshake.c, send.c's dial), so no handshake ever sees a freed list:
 * every running handshake is pointed at the new list before the old one
 * is freed. Under the same lock, sessions whose key the new list no
 * longer admits are closed like ds_net_forget does (the transport peer
 * goes too, so its next frames are unknown_sender), and responder
 * handshakes that already know their peer's key are checked again, since
 * the last frame they wait for (HELLO_FIN) carries no key to check.
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

/* Under the lock: 1 when entry p must go under list al. */
static int peer_revoked(const ds_allowlist *al, struct net_peer *p)
{
    if (p->sess)
        return ds_allowlist_check(al, p->pk, p->name) != 0;
    if (p->hs && !p->hs_initiator) {
        const ds_peer_info *info = ds_hs_peer(p->hs);
        return info->id && ds_allowlist_check(al, info->pk, info->name) != 0;
    }
    return 0;
}

/* Under the lock: point everything at al, close what it does not admit.
 * Returns the sessions closed. */
static unsigned swap_in(ds_net *n, ds_allowlist *al, struct report **rep)
{
    unsigned closed = 0;
    n->hs_cfg.allow = al;
    struct net_peer *p, *nx;
    for (p = n->peers; p; p = nx) {
        nx = p->next;
        if (p->hs)
            ds_hs_set_allowlist(p->hs, al);
        if (!peer_revoked(al, p))
            continue;
        if (p->sess) {
            ds_warn(COMP, "session with %s id=%016" PRIx64 " addr=%s closed: its key is no longer "
                    "on the allow-list", p->name, p->id, p->addr);
            net_report_event(rep, DS_NET_EV_PEER_REVOKED, p, -EACCES);
            closed++;
        } else {
            /* It dialled us: nobody here waits for this handshake. */
            ds_warn(COMP, "handshake with %s closed: its key is no longer on the allow-list",
                    p->addr);
            ADD(n, hs_failed, 1);
        }
        net_peer_free(n, p, rep);
    }
    ds_allowlist_free(&n->allow_own);
    n->allow_own = al;
    return closed;
}

int ds_net_allow_reload(ds_net *n, char *err, size_t errlen)
{
    char e[512] = "";
    if (!n)
        return -EINVAL;
    if (!n->allow_file || !n->cfg.allow) {
        snprintf(e, sizeof(e), "no allow-list file configured: nothing to reload");
        ds_warn(COMP, "%s", e);
        if (err && errlen)
            snprintf(err, errlen, "%s", e);
        return -ENOENT;
    }
    ds_allowlist *al = NULL;
    int r = ds_allowlist_load(&al, n->allow_file, e, sizeof(e));
    if (r) {
        ADD(n, allow_reload_errors, 1);
        if (!e[0])
            snprintf(e, sizeof(e), "%s: %s", n->allow_file, strerror(-r));
        ds_error(COMP, "allow-list not reloaded, the previous one stays: %s", e);
        if (err && errlen)
            snprintf(err, errlen, "%s", e);
        return r;
    }
    const size_t keys = ds_allowlist_count(al);
    struct report *rep = NULL;
    pthread_mutex_lock(&n->lock);
    const size_t before = ds_allowlist_count(n->hs_cfg.allow);
    const unsigned closed = swap_in(n, al, &rep);
    pthread_mutex_unlock(&n->lock);
    ADD(n, allow_reloads, 1);
    ADD(n, sessions_revoked, closed);
    ds_info(COMP, "allow-list reloaded from %s: %zu keys (was %zu), sessions closed: %u",
            n->allow_file, keys, before, closed);
    net_reports_run(n, rep);
    return 0;
}

void net_allow_poll(ds_net *n)
{
    if (!n->cfg.allow_reload)
        return;
    const int now = atomic_load(n->cfg.allow_reload);
    if (now == n->allow_seen)
        return;
    n->allow_seen = now;
    char err[512];
    if (ds_net_allow_reload(n, err, sizeof(err)) != 0)
        return; /* logged there; the old list stays */
}
