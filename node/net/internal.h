/*
 * node/net/internal.h: the secured layer's shared state and the functions
 * its files call across each other. Private to node/net.
 *
 * The net is split by concern:
 *
 *   net.c        open and close, configuration, stats and accessors
 *   peers.c      the peer table, refcounted sessions, and the reports
 *                (events and done callbacks) collected under the lock and
 *                delivered after it
 *   send.c       the send paths: sealing on the caller's thread, frames
 *                waiting for a handshake, the zero-copy STATE_CHUNK path,
 *                dialling, forgetting, the test hooks
 *   handshake.c  the worker's side of the three-frame handshake: HELLO as
 *                responder, HELLO_ACK/HELLO_FIN, collisions, refusals
 *                (HELLO_REJECT), installing a session and flushing what
 *                waited for it
 *   worker.c     the worker thread: what the transport's progress thread
 *                queues for it, data frames opened and delivered, timers
 *   allow.c      the allow-list reload: the new list swapped in under the
 *                lock, sessions and handshakes of removed keys closed
 *
 * Locks: n->lock guards the peer table and everything in a net_peer and
 * the handshake bound; n->rxlock the receive queue. No callback runs under
 * either (reports are collected and run after the lock is let go).
 */
#ifndef DS_NODE_NET_INTERNAL_H
#define DS_NODE_NET_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "node/net/net.h"

#define COMP "net"
#define NET_TICK_MS 100

struct pend {
    struct pend *next;
    uint8_t *buf; /* unsealed frame, room for the tag */
    size_t len;
    uint64_t deadline_ms;
    ds_transport_done_fn done;
    void *done_arg;
};

struct net_sess {
    ds_session s;
    _Atomic int refs;
};

struct net_peer {
    struct net_peer *next;
    uint64_t id;      /* 0 until authenticated */
    uint64_t expect;  /* dialled for this id (0: whoever answers) */
    char dial[DS_TRANSPORT_ADDR_MAX]; /* address we were asked to use */
    char addr[DS_TRANSPORT_ADDR_MAX]; /* the transport's text for tp */
    char name[DS_WIRE_NAME_MAX + 1];
    char pub[DS_WIRE_ADDR_MAX + 1];   /* address it published in its HELLO */
    uint8_t pk[DS_PK_BYTES];          /* its identity key, once authenticated */
    ds_transport_peer tp;
    struct net_sess *sess;
    ds_hs *hs;
    int hs_initiator;
    uint64_t hs_deadline_ms;
    int hs_refused;   /* a handshake frame was refused (policy, key, MAC),
                       * or the responder sent HELLO_REJECT for our HELLO */
    uint8_t hello_hash[32]; /* BLAKE2b-256 of the HELLO we sent (initiator) */
    int rekey;
    int flushing;     /* the worker is sealing the queue: new frames queue too */
    struct pend *pend_head, *pend_tail;
    size_t pend_bytes;
    unsigned npend;
};

/* What the transport's progress thread hands to the worker. */
struct rxitem {
    struct rxitem *next;
    int is_event;
    ds_transport_peer tp;
    ds_transport_event ev;
    uint8_t *base;
    const uint8_t *data;
    size_t len;
};

/* Reports collected under the lock, delivered after it. */
struct report {
    struct report *next;
    int is_event;
    ds_net_event ev;
    char name[DS_WIRE_NAME_MAX + 1];
    char addr[DS_TRANSPORT_ADDR_MAX];
    ds_transport_done_fn done;
    void *done_arg;
    int status;
};

struct send_ctx {
    ds_net *n;
    ds_transport_done_fn done;
    void *done_arg;
};

/* Message kinds for the bytes by kind, in ds_net_stats' order. */
enum net_kind {
    NET_KIND_GOSSIP,     /* GOSSIP_* */
    NET_KIND_MEMBERSHIP, /* PING .. LEAVE */
    NET_KIND_STATE,      /* STATE_REQ, STATE_CHUNK */
    NET_KIND_GROUP,      /* GROUP_REDUCE, GROUP_BCAST, ALLREDUCE */
    NET_KIND_OTHER,
    NET_KINDS
};

struct ds_net {
    ds_net_cfg cfg;
    uint64_t reject_window_ms;   /* HELLO_REJECT rate limit (under lock) */
    unsigned rejects_in_window;
    char name[DS_WIRE_NAME_MAX + 1];
    uint64_t cluster_id;
    uint64_t self_id;
    ds_wire_limits limits;
    ds_hs_config hs_cfg;
    ds_transport *tp;
    char addr[DS_TRANSPORT_ADDR_MAX];
    ds_drop_counters drops;

    pthread_mutex_t lock;
    struct net_peer *peers;
    unsigned nhandshakes;
    int closing;

    pthread_mutex_t rxlock;
    pthread_cond_t rxcond;
    struct rxitem *rx_head, *rx_tail;
    size_t rx_bytes;
    int stop;
    pthread_t worker;
    int worker_started;

    _Atomic uint64_t frames_sent, bytes_sent, frames_recv, bytes_recv;
    /* bytes_sent / bytes_recv split by message kind (enum net_kind) */
    _Atomic uint64_t kind_sent[NET_KINDS], kind_recv[NET_KINDS];
    _Atomic uint64_t hs_ok, hs_failed, send_failures;

    /* The allow-list (allow.c). hs_cfg.allow is cfg.allow until a reload,
     * then allow_own, which the net owns; both change under lock. */
    char *allow_file;
    ds_allowlist *allow_own;
    int allow_seen; /* the last *cfg.allow_reload acted on (worker) */
    _Atomic uint64_t allow_reloads, allow_reload_errors, sessions_revoked;
};

#define ADD(n, f, v) atomic_fetch_add_explicit(&(n)->f, (uint64_t)(v), memory_order_relaxed)

/* The kind of a message type (ds_net_stats' bytes by kind). */
static inline enum net_kind net_kind_of(unsigned type)
{
    if (type >= DS_MSG_GOSSIP_REQ && type <= DS_MSG_GOSSIP_PUSH)
        return NET_KIND_GOSSIP;
    if (type >= DS_MSG_PING && type <= DS_MSG_LEAVE)
        return NET_KIND_MEMBERSHIP;
    if (type == DS_MSG_STATE_REQ || type == DS_MSG_STATE_CHUNK)
        return NET_KIND_STATE;
    if (type >= DS_MSG_GROUP_REDUCE && type <= DS_MSG_ALLREDUCE)
        return NET_KIND_GROUP;
    return NET_KIND_OTHER;
}

/* ---- peers.c ----------------------------------------------------------- */

struct net_sess *net_sess_ref(struct net_sess *s);
void net_sess_unref(struct net_sess *s);
/* Collect an event or a done callback into *list (under n->lock). */
void net_report_event(struct report **list, enum ds_net_event_kind kind,
                      const struct net_peer *p, int status);
void net_report_done(struct report **list, ds_transport_done_fn done, void *arg, int status);
/* Deliver collected reports in order, without any lock held. */
void net_reports_run(ds_net *n, struct report *list);
/* Under n->lock. */
struct net_peer *net_peer_by_id(ds_net *n, uint64_t id);
struct net_peer *net_peer_by_tp(ds_net *n, ds_transport_peer tp);
struct net_peer *net_peer_by_addr(ds_net *n, const char *addr);
struct net_peer *net_peer_new(ds_net *n);
void net_pend_fail_all(struct net_peer *p, int status, struct report **rep);
void net_hs_drop(ds_net *n, struct net_peer *p);
void net_peer_free(ds_net *n, struct net_peer *p, struct report **rep);

/* ---- send.c ------------------------------------------------------------ */

void net_tap(ds_net *n, char dir, const uint8_t *frame, size_t len);
int net_seal_and_send(ds_net *n, struct net_sess *s, ds_transport_peer tp, uint8_t *buf,
                      size_t len, uint64_t deadline_ms, ds_transport_done_fn done,
                      void *done_arg);
int net_send_hs_frame(ds_net *n, struct net_peer *p, const uint8_t *frame, size_t len);
int net_dial(ds_net *n, struct net_peer *p);
void net_wake_worker(ds_net *n);

/* ---- handshake.c -------------------------------------------------------- */

void net_on_hs_frame(ds_net *n, ds_transport_peer tp, const uint8_t *frame, size_t len,
                     const ds_wire_hdr *h, struct report **rep);

/* ---- allow.c -------------------------------------------------------------- */

/* Worker timers: reload when *cfg.allow_reload changed since last time. */
void net_allow_poll(ds_net *n);

/* ---- worker.c ------------------------------------------------------------ */

void *net_worker_main(void *arg);
void net_tp_on_recv(void *ctx, ds_transport_msg *msg);
void net_tp_on_event(void *ctx, const ds_transport_event *ev);

#endif
