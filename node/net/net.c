/*
 * node/net/net.c: see net.h for the contract; internal.h lists the files
 * that implement it. This one opens and closes a net (the handshake
 * configuration is checked before anything starts; the transport's
 * largest message is lowered to the wire limit), and answers the small
 * questions: address, id, drops, stats.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/clock.h"
#include "base/log.h"
#include "node/net/internal.h"

void ds_net_cfg_default(ds_net_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mode = DS_SEC_ENCRYPT;
    ds_transport_opts_default(&cfg->transport);
    ds_wire_limits_default(&cfg->limits);
    cfg->handshake_timeout_ms = 5000;
    cfg->max_pending_bytes = 64u << 20;
    cfg->max_rx_queue_bytes = (size_t)1 << 30;
    cfg->max_handshakes = 64;
}

int ds_net_open(const ds_net_cfg *cfg, ds_net **out)
{
    if (!cfg || !out)
        return -EINVAL;
    *out = NULL;
    if (!cfg->identity || !cfg->name || !cfg->cluster || !cfg->on_recv) {
        ds_error(COMP, "net config needs identity, name, cluster and on_recv");
        return -EINVAL;
    }
    if (!cfg->cluster_key && !cfg->allow) {
        ds_error(COMP, "no admission policy: configure a cluster key, an allow-list, or both");
        return -EINVAL;
    }
    ds_net *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->cfg = *cfg;
    if (!n->cfg.handshake_timeout_ms)
        n->cfg.handshake_timeout_ms = 5000;
    if (!n->cfg.max_pending_bytes)
        n->cfg.max_pending_bytes = 64u << 20;
    if (!n->cfg.max_rx_queue_bytes)
        n->cfg.max_rx_queue_bytes = (size_t)1 << 30;
    if (!n->cfg.max_handshakes)
        n->cfg.max_handshakes = 64;
    n->limits = cfg->limits;
    if (!n->limits.max_payload)
        ds_wire_limits_default(&n->limits);
    if (cfg->allow_file && !(n->allow_file = strdup(cfg->allow_file))) {
        free(n);
        return -ENOMEM;
    }
    n->cfg.allow_file = n->allow_file;
    if (cfg->allow_reload)
        n->allow_seen = *cfg->allow_reload;
    snprintf(n->name, sizeof(n->name), "%s", cfg->name);
    n->cluster_id = ds_wire_cluster_id(cfg->cluster);
    n->self_id = cfg->identity->id;
    n->hs_cfg = (ds_hs_config){
        .identity = cfg->identity,
        .name = n->name,
        .address = n->addr,
        .cluster_id = n->cluster_id,
        .cluster_key = cfg->cluster_key,
        .allow = cfg->allow,
        .mode = cfg->mode,
        .aeads = cfg->aeads,
        .drops = &n->drops,
    };
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->rxlock, NULL);
    pthread_cond_init(&n->rxcond, NULL);

    /* Validate the handshake config before anything starts. */
    ds_hs probe;
    memset(&probe, 0, sizeof(probe));
    int r = ds_hs_init_responder(&probe, &n->hs_cfg);
    ds_hs_wipe(&probe);
    if (r) {
        ds_error(COMP, "handshake configuration refused (name, mode or ciphers)");
        goto fail;
    }
    /* Every frame the transport carries is at most a header, the payload
     * limit and a tag. */
    ds_transport_opts to = cfg->transport;
    to.on_recv = net_tp_on_recv;
    to.on_event = net_tp_on_event;
    to.cb_ctx = n;
    if (to.max_msg_bytes > (size_t)n->limits.max_payload + DS_WIRE_HDR_SIZE + DS_WIRE_TAG_SIZE)
        to.max_msg_bytes = (size_t)n->limits.max_payload + DS_WIRE_HDR_SIZE + DS_WIRE_TAG_SIZE;
    r = ds_transport_open(&to, &n->tp);
    if (r)
        goto fail;
    r = ds_transport_addr(n->tp, n->addr, sizeof(n->addr));
    if (r)
        goto fail;
    r = pthread_create(&n->worker, NULL, net_worker_main, n);
    if (r) {
        r = -r;
        goto fail;
    }
    n->worker_started = 1;
    ds_info(COMP, "node %s id=%016" PRIx64 " on %s mode=%s", n->name, n->self_id, n->addr,
            ds_sec_mode_name(cfg->mode));
    *out = n;
    return 0;
fail:
    ds_transport_close(&n->tp);
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->rxlock);
    pthread_cond_destroy(&n->rxcond);
    free(n->allow_file);
    free(n);
    return r;
}

void ds_net_close(ds_net **np)
{
    if (!np || !*np)
        return;
    ds_net *n = *np;
    *np = NULL;
    pthread_mutex_lock(&n->lock);
    n->closing = 1;
    pthread_mutex_unlock(&n->lock);
    if (n->worker_started) {
        pthread_mutex_lock(&n->rxlock);
        n->stop = 1;
        pthread_cond_signal(&n->rxcond);
        pthread_mutex_unlock(&n->rxlock);
        pthread_join(n->worker, NULL);
    }
    /* The transport fails and releases what it holds (our send contexts
     * run their done callbacks on its thread before it stops). */
    ds_transport_close(&n->tp);
    struct report *rep = NULL;
    pthread_mutex_lock(&n->lock);
    while (n->peers) {
        n->peers->tp = 0;
        net_peer_free(n, n->peers, &rep);
    }
    pthread_mutex_unlock(&n->lock);
    net_reports_run(n, rep);
    while (n->rx_head) {
        struct rxitem *it = n->rx_head;
        n->rx_head = it->next;
        free(it->base);
        free(it);
    }
    pthread_mutex_destroy(&n->lock);
    pthread_mutex_destroy(&n->rxlock);
    pthread_cond_destroy(&n->rxcond);
    ds_allowlist_free(&n->allow_own);
    free(n->allow_file);
    free(n);
}

int ds_net_addr(ds_net *n, char *buf, size_t len)
{
    if (!n || !buf || !len)
        return -EINVAL;
    if ((size_t)snprintf(buf, len, "%s", n->addr) >= len)
        return -ENOSPC;
    return 0;
}

uint64_t ds_net_self_id(const ds_net *n)
{
    return n ? n->self_id : 0;
}

void *ds_net_rx_take(ds_net_rx *rx)
{
    if (!rx || rx->taken_)
        return NULL;
    rx->taken_ = 1;
    return rx->base_;
}

enum ds_drop_reason ds_net_decode(ds_net *n, const ds_net_rx *rx, const ds_wire_bufs *bufs,
                                  ds_wire_msg *out)
{
    return ds_wire_decode(rx->frame, rx->len, &n->limits, bufs, out, &n->drops);
}

ds_drop_counters *ds_net_drops(ds_net *n)
{
    return &n->drops;
}

void ds_net_stats_get(ds_net *n, ds_net_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!n)
        return;
    st->frames_sent = atomic_load(&n->frames_sent);
    st->bytes_sent = atomic_load(&n->bytes_sent);
    st->frames_recv = atomic_load(&n->frames_recv);
    st->bytes_recv = atomic_load(&n->bytes_recv);
    st->handshakes_ok = atomic_load(&n->hs_ok);
    st->handshakes_failed = atomic_load(&n->hs_failed);
    st->send_failures = atomic_load(&n->send_failures);
    st->allow_reloads = atomic_load(&n->allow_reloads);
    st->allow_reload_errors = atomic_load(&n->allow_reload_errors);
    st->sessions_revoked = atomic_load(&n->sessions_revoked);
    uint64_t *const ks[NET_KINDS] = {&st->sent_gossip, &st->sent_membership, &st->sent_state,
                                     &st->sent_group, &st->sent_other};
    uint64_t *const kr[NET_KINDS] = {&st->recv_gossip, &st->recv_membership, &st->recv_state,
                                     &st->recv_group, &st->recv_other};
    for (int k = 0; k < NET_KINDS; k++) {
        *ks[k] = atomic_load(&n->kind_sent[k]);
        *kr[k] = atomic_load(&n->kind_recv[k]);
    }
    pthread_mutex_lock(&n->lock);
    for (struct net_peer *p = n->peers; p; p = p->next) {
        st->sessions += p->sess != NULL;
        st->pending_frames += p->npend;
    }
    pthread_mutex_unlock(&n->lock);
    ds_transport_stats_get(n->tp, &st->transport);
}
