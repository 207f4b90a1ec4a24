/*
 * node/transport/internal.h: the libfabric backend's shared state and the
 * functions its files call across each other. Private to node/transport.
 *
 * The backend is one struct tp_fab per endpoint, split by concern:
 *
 *   fabric.c    the libfabric stack: open/close, names and addresses, the
 *               address vector, the completion queue
 *   tx.c        sends: ops, chunking into iovecs, posting under the
 *               window and the grants, completions, failures
 *   rx.c        receives: the small pool, chunk checks (one function per
 *               phase), streams, reassembly, in-order delivery
 *   grants.c    the grant credit protocol for chunks above the eager limit
 *   peers.c     peer slots: find-or-create, events, removal
 *   deadline.c  send deadlines, held-message timeouts, quarantine aging
 *   progress.c  the progress thread, requests from other threads, resets,
 *               the backend's open and close
 *   idle.c      connections to our port that never sent a byte: counted,
 *               and shut down past a deadline
 *
 * chunk.h pins the wire format; transport.c is the public API in front of
 * this backend and of the in-process one (backend.h).
 *
 * Threads. One progress thread per transport owns the libfabric objects
 * and every field marked "progress thread" below. Application threads
 * touch only what t->lock guards: the submission queue, the peer slots'
 * identity (state, generation, address) and the request flags. They queue
 * work, write the eventfd, and return. Callbacks run on the progress
 * thread without the lock, so a callback may send, add or remove peers, or
 * ask for a reset. Unless a comment says otherwise, every function below
 * runs on the progress thread.
 */
#ifndef DS_NODE_TRANSPORT_INTERNAL_H
#define DS_NODE_TRANSPORT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>

#include "node/transport/backend.h"
#include "node/transport/chunk.h"
#include "node/transport/transport.h"

#define COMP "transport"

/* Only messages of at most TP_EAGER_MAX wire bytes travel unsolicited
 * (ofi_rxm's eager limit). A larger chunk is sent only with a grant: the
 * tag of a receive buffer the receiver has posted for that sender. ofi_rxm
 * 1.17 crashes when a receive is posted that matches an *unexpected*
 * message above its eager limit whose connection has closed (it uses the
 * freed connection: reproduced standalone, 16384 bytes survive, 16385
 * crash), so with grants a large chunk is never unexpected. */
#define TP_TAG_SMALL 1u
#define TP_TAG_GRANT (1ull << 62)
#define TP_GRANT_MASK ((1ull << 48) - 1)
#define TP_EAGER_MAX 16384u
#define TP_SMALL_BUF TP_EAGER_MAX
#define TP_GRANT_RING 256      /* grants a sender holds per peer, at most */
#define TP_GRANTS_PER_MSG 64
#define TP_REQ_REFRESH_MS 250  /* re-ask for grants that did not come */
#define TP_GRANT_IDLE_MS 5000   /* a sender gives back grants unused this long */
/* A receiver takes back a grant unused for this long: its sender would
 * have given it back if alive, so it is dead or frozen (a frozen one that
 * resumes sends on a withdrawn tag: never matched, its send times out). */
#define TP_GRANT_RECLAIM_MS (3 * TP_GRANT_IDLE_MS)
/* What libfabric failed or we cancelled is kept this long before its
 * memory is reused: ofi_rxm may report such an operation again (seen
 * within milliseconds), so the context and buffer must stay valid. */
#define TP_QUARANTINE_GRACE_MS 60000

#define TP_RX_HELD_MAX 65536  /* out-of-order messages held per peer */
#define TP_RX_COPY_MAX 16384  /* held messages up to this size are copied
                               * out of their 64 KiB pool buffer */
#define TP_RX_WINDOW 65536    /* how far ahead of rx_next a seq may be */
#define TP_STREAMS 4          /* sender streams tracked per peer (LRU) */
#define TP_CQ_BATCH 32
#define TP_POST_BUDGET 64     /* chunks posted per loop iteration */
#define TP_TICK_MS 100        /* longest sleep of the progress loop */
#define TP_FRESH_GAP_MS 200   /* gap before the first delivery of a stream */

enum ctx_kind { CTX_RX = 1, CTX_TX = 2 };

/* Every libfabric context starts with this, so a completion's op_context
 * tells what it belongs to. */
struct tp_ctx {
    struct fi_context2 fi;
    uint8_t kind;
};

struct tp_op;

struct tp_chunk {
    struct tp_ctx ctx;
    struct tp_op *op;
    uint32_t wire;   /* header + payload bytes, charged to inflight */
    uint8_t posted;  /* a completion is expected */
    uint8_t hdr[TP_HDR_MAX];
};

enum op_where { OP_NOWHERE = 0, OP_TXQ, OP_INFLIGHT, OP_CTRLQ };

struct tp_op {
    struct tp_op *next, *prev;
    uint32_t slot;
    uint8_t is_abort;
    uint8_t is_ctrl;                  /* control message (payload in copy) */
    uint8_t where;
    uint8_t reported;
    uint8_t abandoned;
    uint8_t tainted;                  /* libfabric failed a chunk: quarantine */
    uint64_t q_ms;                    /* quarantined at */
    const uint8_t *data;              /* the caller's buf (or copy): released */
    size_t len;                       /* head + body + tail */
    size_t body_len;
    uint16_t head_len, tail_len;      /* edge[0..head_len), then the tail */
    uint8_t edge[DS_TRANSPORT_EDGE_MAX];
    uint8_t *flat;                    /* the whole message in one piece, for a
                                       * provider with too few iovecs */
    void *copy;                       /* our own copy (release == NULL) */
    ds_transport_release_fn release;
    void *release_arg;
    ds_transport_done_fn done;
    void *done_arg;
    uint64_t deadline_ms;
    uint64_t stream, seq;
    uint32_t chunk_size, nchunks, next_chunk, pending, completed;
    uint64_t pending_bytes;           /* wire bytes posted, not completed */
    struct tp_chunk *chunks;
};

struct op_list {
    struct tp_op *head, *tail;
};

enum rx_state { RX_PARTIAL = 0, RX_COMPLETE, RX_SKIP };

struct tp_rxmsg {
    struct tp_rxmsg *next;
    uint64_t seq;
    uint8_t state;
    uint8_t pooled;      /* base is a receive pool buffer */
    uint8_t *base;       /* allocation holding data */
    uint8_t *data;
    uint64_t len;
    uint32_t chunk_size, nchunks, got;
    uint8_t *bitmap;
    uint64_t last_ms;
    uint64_t mem;        /* bytes charged to rx_mem */
};

/* One sender stream (a sender's endpoint incarnation) as we receive it.
 * The stream id in a chunk is not authenticated, so a forged one must not
 * be able to evict the genuine stream for good: a peer keeps several, the
 * least recently active makes room, and a stream that comes back after
 * being evicted simply starts over (a short gap wait, then in order). */
struct tp_rxs {
    uint64_t id;                       /* 0: unused */
    uint64_t next;                     /* next seq to deliver */
    uint8_t resync;                    /* after our reset: next seq is the base */
    uint8_t fresh;                     /* nothing delivered on it yet */
    struct tp_rxmsg *held, *held_tail; /* sorted by seq */
    unsigned nheld;
    uint64_t gap_since_ms;
    uint64_t last_use;                 /* t->rx_tick at its last chunk (LRU) */
};

enum peer_state { PEER_FREE = 0, PEER_LIVE, PEER_REMOVING, PEER_DRAINING };

struct tp_peer {
    /* written under t->lock; state and gen are atomic because the progress
     * thread reads them without it (any state other than PEER_LIVE makes
     * it leave the peer alone) */
    _Atomic uint8_t state;
    uint8_t need_av;
    _Atomic uint16_t gen;
    char addr[DS_TRANSPORT_ADDR_MAX]; /* canonical "host:port": the key */
    uint8_t raw[TP_NAME_MAX];
    size_t rawlen;

    /* progress thread */
    fi_addr_t fa;
    uint8_t in_av;
    uint8_t unresponsive;
    uint8_t in_busy;
    uint32_t misses;
    uint64_t tx_stream, tx_seq;
    struct op_list txq, inflight;
    uint64_t inflight_bytes;
    struct tp_rxs rxs[TP_STREAMS];   /* its senders' streams */

    /* grants, as a sender: receive buffers it posted for us */
    uint64_t gr[TP_GRANT_RING];
    unsigned gr_head, gr_n;
    uint64_t used[TP_GRANT_RING];     /* grants we used lately: a repeated
                                       * GRANT for one of them is stale */
    unsigned used_pos;
    uint32_t need_sent;               /* grants asked for and not yet come */
    uint8_t req_pending;              /* a REQ is queued or in flight */
    uint64_t req_ms;                  /* when we last asked */
    struct op_list ctrlq;             /* control messages, posted first */
    uint64_t large_ms;                /* last time a large chunk was queued/posted */
    /* grants, as a receiver: buffers we posted for it */
    uint64_t grant_stream;            /* its stream our grants belong to */
    unsigned grants_out;
    uint32_t need;                    /* grants it asked for, not yet given */
    uint64_t gbatch[TP_GRANTS_PER_MSG];
    unsigned gbatch_n;
    uint32_t busy_next;               /* busy list link: slot+1, 0 = end */
};

/* One posted receive. A fresh one replaces it in its pool slot whenever
 * libfabric fails it, because ofi_rxm may report the same failed receive
 * more than once (seen when a sender's connection breaks mid-rendezvous):
 * the failed posting, buffer and context, stays untouched in quarantine
 * until the next stack close, so a late report can neither complete a
 * newer posting nor land in reused memory. */
struct tp_rxbuf {
    struct tp_ctx ctx;
    uint8_t *buf;
    size_t cap;
    uint64_t tag;
    uint32_t slot;
    uint8_t posted;     /* libfabric holds it */
    uint8_t canceling;  /* fi_cancel issued (grants only), no completion yet */
    uint8_t is_grant;   /* a buffer granted to one sender (not a pool slot) */
    uint32_t grant_slot;
    uint16_t grant_gen;
    uint64_t grant_id;
    uint64_t grant_stream; /* the sender stream that asked for it */
    uint64_t q_ms;      /* quarantined at */
    uint64_t since_ms;  /* posted at, or cancel issued at */
    struct tp_rxbuf *qnext;
    struct tp_rxbuf *gnext, *gprev; /* the transport's list of grants */
};

struct tp_stats_atomic {
    _Atomic uint64_t msgs_sent, bytes_sent, msgs_recv, bytes_recv;
    _Atomic uint64_t send_timeouts, send_errors, eagain;
    _Atomic uint64_t stuck_ops, stuck_bytes, queued_bytes, resets;
    _Atomic uint64_t quarantined_bytes, dup_completions, idle_conns, idle_closed;
    _Atomic uint64_t drops[DS_TP_DROP_COUNT];
};

typedef struct tp_fab {
    ds_transport pub;             /* first: the public handle (backend.h) */
    ds_transport_opts o;
    char *provider, *listen_host, *listen_port, *advertise;

    /* libfabric stack (progress thread once started) */
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    int cq_fd;
    uint8_t name[TP_NAME_MAX];   /* what goes in every header */
    size_t namelen;
    uint32_t addr_format;
    size_t iov_limit;            /* the provider's, for sends */
    int broken;                  /* stack closed, reopen pending */
    int quiet;                   /* fab_stack_open logs nothing (the warm-up's) */
    uint64_t reopen_at_ms;

    int evfd;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t lock;
    /* under lock */
    struct op_list subq;
    int stop;
    int reset_req;
    int peers_dirty;            /* some slot needs an AV insert or removal */
    struct tp_peer *peers;
    unsigned npeers;

    /* progress thread */
    struct tp_rxbuf **rx;        /* pool slots: the current posting of each */
    unsigned nrx, rx_unposted;
    struct tp_rxbuf *q_rx;       /* failed receives, kept until stack close */
    struct tp_rxbuf *grants;     /* posted grant buffers */
    unsigned ngrants;
    unsigned grants_per_peer;    /* a window's worth of chunks */
    uint64_t next_grant_id;
    uint64_t next_quarantine_ms; /* next look for quarantine past its grace */
    struct tp_op *q_ops;         /* ops with failed chunks, same */
    uint64_t rx_mem;
    uint32_t busy_head;         /* peers with txq/inflight/held work */
    uint64_t next_due_ms;
    int eagain_seen;
    uint64_t last_work_ns;
    uint64_t rx_tick;           /* chunks received: the streams' LRU clock */
    uint64_t last_stream;       /* one-entry cache of stream -> slot, index */
    uint32_t last_slot, last_sidx;

    int idle_scan;              /* a TCP provider: look for idle connections */
    uint64_t idle_print;        /* the last pass's sockets (idle.c) */
    unsigned idle_silent;       /* and the silent ones it found */
    uint64_t idle_warned_ms;    /* the last warning about closed ones */
    unsigned idle_unwarned;     /* closed since, and the first one's peer */
    char idle_first[64];

    struct tp_stats_atomic st;
} tp_fab;

static inline tp_fab *fab_of(ds_transport *t)
{
    return (tp_fab *)t;
}

#define ST_ADD(t, f, n) atomic_fetch_add_explicit(&(t)->st.f, (uint64_t)(n), memory_order_relaxed)
#define ST_SUB(t, f, n) atomic_fetch_sub_explicit(&(t)->st.f, (uint64_t)(n), memory_order_relaxed)

static inline void fab_drop(tp_fab *t, enum ds_transport_drop why)
{
    ST_ADD(t, drops[why], 1);
}

/* Lower the progress loop's next wake-up to `due`. */
static inline void fab_due(tp_fab *t, uint64_t due)
{
    if (due < t->next_due_ms)
        t->next_due_ms = due;
}

/* ---- op lists ---------------------------------------------------------- */

static inline void list_push_tail(struct op_list *l, struct tp_op *op)
{
    op->next = NULL;
    op->prev = l->tail;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
}

static inline void list_push_head(struct op_list *l, struct tp_op *op)
{
    op->prev = NULL;
    op->next = l->head;
    if (l->head)
        l->head->prev = op;
    else
        l->tail = op;
    l->head = op;
}

static inline void list_unlink(struct op_list *l, struct tp_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        l->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        l->tail = op->prev;
    op->next = op->prev = NULL;
}

/* Put the peer on the busy list (work to post, deadlines or held messages
 * to watch); scan_due takes it off when nothing is left. */
static inline void fab_mark_busy(tp_fab *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (p->in_busy)
        return;
    p->in_busy = 1;
    p->busy_next = t->busy_head;
    t->busy_head = slot + 1;
}

/* ---- fabric_dl.c: libfabric opened at run time -------------------------- */

/* The functions libfabric exports that the backend calls; everything else
 * in its API is inline. Filled once by tp_fi_load, read-only after: call
 * them only once a load returned 0 (a transport that opened did). */
struct tp_fi {
    int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                   const struct fi_info *hints, struct fi_info **info);
    void (*freeinfo)(struct fi_info *info);
    struct fi_info *(*dupinfo)(const struct fi_info *info);
    int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
    const char *(*strerror)(int errnum);
};
extern struct tp_fi tp_fi;

/* dlopen libfabric.so.<major> and look its functions up, once per process
 * (any thread; later calls return the first answer). 0, or -ELIBACC /
 * -ELIBBAD with the reason in why. */
int tp_fi_load(char *why, size_t why_len);

/* ---- fabric.c: the libfabric stack ------------------------------------ */

int fab_errno(int fierr);
/* t's provider (fab_provider_name), listen host and port, and advertise
 * address, copied from o. 0, -EINVAL (listen does not split) or -ENOMEM;
 * what was copied is t's either way. Any thread. */
int fab_copy_strings(tp_fab *t, const ds_transport_opts *o);
/* The libfabric provider a transport option names: NULL or "" is "tcp",
 * and "tcp" is "tcp;ofi_rxm" (RDM endpoints over TCP). Any thread. */
const char *fab_provider_name(const char *provider);
int fab_addr_canon(uint32_t fmt, const uint8_t *raw, size_t len, char *out, size_t n);
int fab_stack_open(tp_fab *t, const char *port);
/* Take the warm-up's stack (fab_warm) into t when it was opened for t's
 * provider, listen address and peer count: 1. Otherwise 0, and a stack
 * opened for something else is closed. Any thread, after fab_warm_join. */
int fab_warm_adopt(tp_fab *t);
void fab_stack_close(tp_fab *t);
int fab_learn_name(tp_fab *t);
/* Any thread: resolve "host:port" for the provider into its raw address
 * (raw: TP_NAME_MAX bytes) and canonical key. 0, -EINVAL, -ENOENT, -ENOMEM. */
int fab_resolve(tp_fab *t, const char *hostport, uint8_t *raw, size_t *rawlen, char *key,
                size_t keyn);
void fab_av_insert(tp_fab *t, uint32_t slot);
void fab_av_remove(tp_fab *t, uint32_t slot);
int fab_read_cq(tp_fab *t);

/* ---- tx.c: sends ------------------------------------------------------ */

void fab_op_free(tp_fab *t, struct tp_op *op);
void fab_op_report(tp_fab *t, struct tp_op *op, int status);
void fab_op_retire(tp_fab *t, struct tp_op *op);
void fab_op_fail(tp_fab *t, struct tp_op *op, int status);
int fab_post_sends(tp_fab *t);
void fab_tx_complete(tp_fab *t, struct tp_chunk *c, int err);
/* Any thread (ops->send). */
int fab_send(ds_transport *pub, ds_transport_peer p, const ds_transport_send_args *a);

/* ---- rx.c: receives and reassembly ------------------------------------ */

void fab_rxmsg_free(tp_fab *t, struct tp_rxmsg *m);
void fab_rxs_clear(tp_fab *t, struct tp_rxs *s, enum ds_transport_drop why);
void fab_rx_clear(tp_fab *t, struct tp_peer *p, enum ds_transport_drop why);
int fab_peer_holds(const struct tp_peer *p);
struct tp_rxmsg *fab_held_pop(struct tp_rxs *s);
uint64_t fab_gap_ms(const tp_fab *t, const struct tp_rxs *s);
void fab_deliver_ready(tp_fab *t, uint32_t slot, struct tp_rxs *s);
void fab_rx_chunk(tp_fab *t, struct tp_rxbuf *rb, size_t len);
int fab_post_receives(tp_fab *t);
void fab_rx_complete(tp_fab *t, struct tp_rxbuf *rb, size_t len, int err);

/* ---- grants.c: the grant credit protocol ------------------------------ */

uint64_t fab_gr_pop(struct tp_peer *p);
void fab_gr_push_front(struct tp_peer *p, uint64_t id);
int fab_ctrl_send(tp_fab *t, uint32_t slot, const uint8_t *payload, size_t len);
void fab_ctrl_send_ids(tp_fab *t, uint32_t slot, uint8_t kind, uint64_t epoch,
                       const uint64_t *ids, unsigned n);
void fab_grants_cancel(tp_fab *t, uint32_t slot, const uint64_t *ids, unsigned n);
void fab_grants_reclaim(tp_fab *t, uint64_t now);
void fab_grants_free(tp_fab *t);
uint32_t fab_large_chunks_queued(tp_fab *t, struct tp_peer *p, uint32_t cap);
void fab_ask_grants(tp_fab *t, uint32_t slot);
void fab_release_grants(tp_fab *t, uint32_t slot);
int fab_rx_ctrl(tp_fab *t, uint32_t slot, uint64_t stream, const uint8_t *b, size_t len);
void fab_grant_complete(tp_fab *t, struct tp_rxbuf *rb, size_t len, int err);

/* ---- peers.c: peer slots ---------------------------------------------- */

ds_transport_peer fab_peer_handle(const tp_fab *t, uint32_t slot);
/* Under t->lock (any thread): the slot of a live peer's handle; 0 or -ENOENT. */
int fab_peer_slot(tp_fab *t, ds_transport_peer p, uint32_t *slot);
void fab_event(tp_fab *t, enum ds_transport_event_kind kind, uint32_t slot, int status);
void fab_peer_alive(tp_fab *t, uint32_t slot);
void fab_peer_fresh(struct tp_peer *p);
void fab_peer_free_slot(tp_fab *t, uint32_t slot);
void fab_peer_drain(tp_fab *t, uint32_t slot);
/* Any thread (takes t->lock). */
uint32_t fab_peer_find_or_create(tp_fab *t, const char *key, const uint8_t *raw, size_t rawlen,
                                 int from_progress, int *created, ds_transport_peer *handle);
int fab_peer_add(ds_transport *pub, const char *hostport, ds_transport_peer *out);
int fab_peer_remove(ds_transport *pub, ds_transport_peer p);
int fab_peer_addr(ds_transport *pub, ds_transport_peer p, char *buf, size_t n);

/* ---- deadline.c: deadlines, held-message timeouts, quarantine -------- */

int fab_scan_due(tp_fab *t, uint64_t now);
void fab_quarantine_age(tp_fab *t, uint64_t now);
/* idle.c: count connections to our port that never sent a byte, shut
 * down those past idle_conn_ms (once a second, progress thread). */
void fab_idle_scan(tp_fab *t, uint64_t now);
void fab_quarantine_free(tp_fab *t);

/* ---- progress.c: the thread, requests, resets ------------------------- */

/* Any thread: make the progress thread look at its queues. */
void fab_wake(tp_fab *t);

#endif
