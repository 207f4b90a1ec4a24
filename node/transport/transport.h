/*
 * node/transport/transport.h: reliable, deadline-bound messaging between dsnode
 * processes over libfabric (design §7).
 *
 * One ds_transport is one libfabric FI_EP_RDM endpoint with tagged messages
 * (provider "tcp" = tcp;ofi_rxm by default, "shm", or any name fi_info
 * offers) listening on a host:port. It moves opaque messages of any size,
 * from 0 bytes to max_msg_bytes, to peers named by host:port. It knows
 * nothing about node names, keys or message types: the secured layer
 * (node/net/net.h) builds on it.
 *
 * Provider "inproc" (node/transport/inproc.h) opens an in-process endpoint
 * instead: the same API between endpoints of one process, without
 * libfabric, with faults a test can inject. What follows describes the
 * libfabric endpoint; inproc.h says what the in-process one keeps of it.
 *
 * Why it is more than a wrapper: libfabric 1.17's tcp;ofi_rxm, when a peer
 * is killed or frozen, neither completes nor fails the sends already in
 * flight to it, fi_cancel does not cancel sends, and new sends to it return
 * -FI_EAGAIN forever (measured; see docs/transport.md). So liveness is ours:
 *
 *   - every send carries an absolute deadline (ds_now_ms() clock). Its `done`
 *     callback runs exactly once: 0 when every chunk completed, -ETIMEDOUT
 *     when the deadline passed first, another negative errno on failure. It
 *     runs no later than the deadline plus one progress tick (~100 ms).
 *   - a buffer whose libfabric completion has not arrived is never reused or
 *     freed: a send that timed out is "abandoned" and the transport keeps its
 *     buffer until the completion comes (release runs then). When abandoned
 *     operations pass a bound (stuck_max_ops / stuck_max_bytes) the endpoint
 *     is closed, which makes libfabric discard them, their buffers are
 *     released, and the endpoint is reopened on the same address.
 *   - bytes posted to libfabric and not yet completed are capped per peer
 *     (max_inflight_bytes); bytes accepted but not yet completed are capped
 *     per transport (max_queued_bytes, send returns -ENOBUFS beyond it).
 *   - a peer that misses a deadline (or whose sends fail in the provider)
 *     is reported upward once (DS_TRANSPORT_EV_PEER_UNRESPONSIVE) and again
 *     when it recovers (DS_TRANSPORT_EV_PEER_RESPONSIVE).
 *
 * Messages larger than chunk_bytes travel as several libfabric messages of
 * at most chunk_bytes, each behind a small transport header (stream, seq,
 * total length, chunk index); the receiver reassembles them with bounded
 * memory (max_msg_bytes per message, rx_mem_bytes in all). Integrity is the
 * TCP checksum here and the AEAD of the secured layer above; the transport
 * checks only that the chunks are consistent.
 *
 * Order: messages from one peer are delivered whole, at most once, in the
 * order they were submitted to that peer. A message the sender abandoned
 * after posting some of its chunks is never delivered (the sender tells the
 * receiver with an abort marker); a message that was never posted never
 * existed on the wire; a message whose chunks stop arriving is skipped after
 * rx_timeout_ms. A send reported as -ETIMEDOUT may still have been delivered
 * (timeouts are ambiguous, as everywhere).
 *
 * Threading: each transport runs ONE progress thread that makes every
 * libfabric call (so the domain is opened FI_THREAD_DOMAIN). Every public
 * function except ds_transport_close may be called from any thread,
 * including from inside the callbacks: calls only take a mutex and queue
 * work for the progress thread, then wake it. All callbacks (on_recv,
 * on_event, done, release) run on the progress thread, with no transport
 * lock held; they must be short and must not block, because the transport
 * makes no progress while one runs.
 */
#ifndef DS_NODE_TRANSPORT_H
#define DS_NODE_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include "base/clock.h"
#include "base/metric.h"

typedef struct ds_transport ds_transport;

/* A peer handle: slot and generation. 0 is never a valid peer. A handle of a
 * removed peer stays invalid (-ENOENT) even when its slot is reused. */
typedef uint32_t ds_transport_peer;
#define DS_TRANSPORT_PEER_NONE 0u

/* Longest "host:port" text the transport returns, with its NUL. */
#define DS_TRANSPORT_ADDR_MAX 96

/* A received message, handed to on_recv. `data` (len bytes) is borrowed
 * until on_recv returns, unless on_recv calls ds_transport_msg_take. */
typedef struct ds_transport_msg {
    ds_transport_peer peer; /* sender (created on first contact if unknown) */
    const uint8_t *data;
    size_t len;
    void *base_;  /* internal: the allocation holding data */
    int taken_;   /* internal */
} ds_transport_msg;

enum ds_transport_event_kind {
    /* A message came from an address no peer had; a peer slot was created
     * for it (the message itself follows through on_recv). */
    DS_TRANSPORT_EV_PEER_NEW = 1,
    /* The peer missed a deadline `misses` times in a row (reported once per
     * episode, when misses reaches opts.miss_limit). */
    DS_TRANSPORT_EV_PEER_UNRESPONSIVE = 2,
    /* An unresponsive peer completed a send or sent us a message again. */
    DS_TRANSPORT_EV_PEER_RESPONSIVE = 3,
    /* The endpoint was closed and reopened (stuck bound or
     * ds_transport_reset); peer = 0, status = stuck ops discarded. */
    DS_TRANSPORT_EV_RESET = 4,
};

typedef struct ds_transport_event {
    enum ds_transport_event_kind kind;
    ds_transport_peer peer;
    uint32_t misses;
    int status;
} ds_transport_event;

typedef void (*ds_transport_recv_fn)(void *ctx, ds_transport_msg *msg);
typedef void (*ds_transport_event_fn)(void *ctx, const ds_transport_event *ev);
typedef void (*ds_transport_done_fn)(void *arg, int status);
typedef void (*ds_transport_release_fn)(void *arg, void *buf);

typedef struct ds_transport_opts {
    const char *provider;  /* "tcp" (= "tcp;ofi_rxm"), "shm", or an fi_info
                            * provider name; NULL means "tcp"; "inproc":
                            * the in-process transport (inproc.h) */
    const char *listen;    /* "host:port" or "[v6]:port"; port 0 = any free */
    const char *advertise; /* address peers reply to, published in every
                            * chunk header; NULL = the bound listen address
                            * (required when listen's host is a wildcard) */
    size_t chunk_bytes;        /* payload per libfabric message (4 KiB..64 MiB,
                                * the same on every node); default 1 MiB +
                                * 4 KiB (room for node/net's frame overhead) */
    size_t max_inflight_bytes; /* per peer, posted and not completed; 8 MiB */
    size_t max_queued_bytes;   /* accepted, not yet released, all peers; 2 GiB */
    size_t max_msg_bytes;      /* largest message accepted on receive; 1 GiB */
    size_t rx_mem_bytes;       /* all partial / held received messages; 2 GiB */
    unsigned rx_small_bufs;    /* posted 16 KiB receive buffers for eager
                                * messages (any sender); 64 */
    unsigned rx_large_bufs;    /* chunk-sized receive buffers granted to
                                * senders, all peers together (each peer at
                                * most a window's worth); 64 */
    unsigned max_peers;        /* peer slots (<= 65535); 1024 */
    uint32_t rx_timeout_ms;    /* a message missing chunks this long is
                                * skipped; 10000 */
    unsigned miss_limit;       /* missed deadlines before UNRESPONSIVE; 1 */
    unsigned stuck_max_ops;    /* abandoned sends before a reset; 1024 */
    size_t stuck_max_bytes;    /* abandoned bytes before a reset; 256 MiB */
    uint32_t idle_conn_ms;     /* a TCP connection to our port that has sent
                                * nothing this long is shut down (tcp
                                * providers; idle_connections_closed); 10000 */
    ds_transport_recv_fn on_recv;   /* required */
    ds_transport_event_fn on_event; /* may be NULL */
    void *cb_ctx;                   /* passed to on_recv and on_event */
} ds_transport_opts;

/* Bytes of head and tail together in one send. */
#define DS_TRANSPORT_EDGE_MAX 256

/* One send. `buf`/`len`: the message. Ownership of buf:
 *  - release == NULL: the transport copies the message before
 *    ds_transport_send returns; the caller keeps buf.
 *  - release != NULL: on success the transport owns buf (read-only) until it
 *    calls release(release_arg, buf), exactly once, on the progress thread,
 *    after libfabric has finished with every byte -- possibly long after
 *    `done` reported a timeout (or when the endpoint is closed, which makes
 *    libfabric discard it). On failure the caller keeps buf.
 * done(done_arg, status) runs exactly once when the send was accepted (may
 * be NULL). deadline_ms is absolute, on the ds_now_ms() clock. */
typedef struct ds_transport_send_args {
    const void *buf;
    size_t len;
    /* Optional small pieces sent before and after buf, always copied here
     * (head_len + tail_len <= DS_TRANSPORT_EDGE_MAX): the message is then
     * head || buf || tail, len counting buf only. They let a caller frame a
     * buffer without copying it (node/net: header and chunk prefix before
     * the caller's payload, the tag after it); each chunk goes to libfabric
     * as an iovec of its pieces. */
    const void *head;
    size_t head_len;
    const void *tail;
    size_t tail_len;
    uint64_t deadline_ms;
    ds_transport_release_fn release;
    void *release_arg;
    ds_transport_done_fn done;
    void *done_arg;
} ds_transport_send_args;

/* Drop reasons counted on the receive path (a chunk or message discarded).
 * One list: enum, metric name, meaning. */
#define DS_TP_DROP_LIST(X) \
    X(BAD_HEADER, "bad_header", "short, bad magic/version/lengths") \
    X(BAD_ADDR, "bad_addr", "sender address not valid for the provider") \
    X(PEERS_FULL, "peers_full", "unknown sender, no free peer slot") \
    X(TOO_BIG, "too_big", "message > max_msg_bytes or truncated chunk") \
    X(NO_MEMORY, "no_memory", "rx_mem_bytes or malloc exhausted") \
    X(LATE, "late", "chunk of a message already delivered/skipped") \
    X(DUPLICATE, "duplicate", "chunk received twice") \
    X(STALE_STREAM, "stale_stream", "chunk from a sender instance since replaced") \
    X(ABORTED, "aborted", "the sender abandoned the message") \
    X(RX_TIMEOUT, "rx_timeout", "chunks stopped arriving") \
    X(BACKLOG, "backlog", "too many out-of-order messages held") \
    X(RX_ERROR, "rx_error", "libfabric receive error completion") \
    X(REMOVED_PEER, "removed_peer", "held for a peer the application removed")

enum ds_transport_drop {
#define DS_TP_DROP_ENUM_(e, name, text) DS_TP_DROP_##e,
    DS_TP_DROP_LIST(DS_TP_DROP_ENUM_)
#undef DS_TP_DROP_ENUM_
    DS_TP_DROP_COUNT
};

/* Name of a drop reason ("bad_header", ...), for logs and /metrics. */
const char *ds_transport_drop_name(enum ds_transport_drop reason);

/* The transport's counters (base/metric.h: one row per field gives the
 * member, its /status key, its /metrics family and its docs/status.md
 * row). "now" marks a level rather than a running count. */
#define DS_TP_HELP_MSGS "Transport messages (completed sends, delivered messages)."
#define DS_TP_HELP_BYTES "Transport message bytes."
#define DS_TRANSPORT_STATS(X) \
    X(U64, msgs_sent, "msgs_sent", "dsnode_transport_messages_total", COUNTER, \
      "direction", "sent", DS_TP_HELP_MSGS) \
    X(U64, bytes_sent, "bytes_sent", "dsnode_transport_bytes_total", COUNTER, \
      "direction", "sent", DS_TP_HELP_BYTES) \
    X(U64, msgs_recv, "msgs_received", "dsnode_transport_messages_total", COUNTER, \
      "direction", "received", DS_TP_HELP_MSGS) \
    X(U64, bytes_recv, "bytes_received", "dsnode_transport_bytes_total", COUNTER, \
      "direction", "received", DS_TP_HELP_BYTES) \
    X(U64, send_timeouts, "send_timeouts", "dsnode_transport_send_timeouts_total", COUNTER, \
      NULL, NULL, "Sends past their deadline.") \
    X(U64, send_errors, "send_errors", "dsnode_transport_send_errors_total", COUNTER, \
      NULL, NULL, "Sends failed by the provider.") \
    X(U64, eagain, "eagain", "dsnode_transport_eagain_total", COUNTER, NULL, NULL, \
      "-FI_EAGAIN from libfabric posts.") \
    X(U64, stuck_ops, "stuck_ops", "dsnode_transport_stuck_ops", GAUGE, NULL, NULL, \
      "Abandoned operations whose completion is pending now.") \
    X(U64, stuck_bytes, "stuck_bytes", "dsnode_transport_stuck_bytes", GAUGE, NULL, NULL, \
      "Bytes of abandoned operations now.") \
    X(U64, queued_bytes, "queued_bytes", "dsnode_transport_queued_bytes", GAUGE, NULL, NULL, \
      "Bytes accepted, not yet released, now.") \
    X(U64, resets, "resets", "dsnode_transport_resets_total", COUNTER, NULL, NULL, \
      "Endpoint resets.") \
    X(U64, quarantined_bytes, "quarantined_bytes", "dsnode_transport_quarantined_bytes", \
      GAUGE, NULL, NULL, \
      "Bytes failed by libfabric, kept until the next reset (they count toward " \
      "stuck_max_bytes).") \
    X(U64, dup_completions, "dup_completions", "dsnode_transport_dup_completions_total", \
      COUNTER, NULL, NULL, "Repeated completions for one operation.") \
    X(U64, pinned_bufs, "pinned_bufs", "dsnode_transport_pinned_buffers", GAUGE, NULL, NULL, \
      "Receive buffers set aside while a stalled peer's transfer holds them.") \
    X(U64, idle_conns, "idle_connections", "dsnode_transport_idle_connections", GAUGE, NULL, \
      NULL, "TCP connections to the fabric port that have sent nothing yet, now.") \
    X(U64, idle_closed, "idle_connections_closed", \
      "dsnode_transport_idle_connections_closed_total", COUNTER, NULL, NULL, \
      "TCP connections to the fabric port closed for sending nothing within the deadline.")

typedef struct ds_transport_stats {
    DS_TRANSPORT_STATS(DS_METRIC_FIELD)
    uint64_t drops[DS_TP_DROP_COUNT];   /* by enum ds_transport_drop */
} ds_transport_stats;

/* Fill *o with the defaults above (listen "127.0.0.1:0", provider "tcp",
 * no callbacks). */
void ds_transport_opts_default(ds_transport_opts *o);

/* Start libfabric's one-time initialisation (loading it and probing its
 * providers) on a thread of its own, so that it overlaps what the caller
 * does before ds_transport_open (dsnode run: loading the dataset). With
 * o->listen set, the thread also opens the libfabric endpoint for
 * o->provider, o->listen and o->max_peers (only those are read; the
 * rest of *o need not be filled in), and the next ds_transport_open for
 * the same three takes it over; an open for anything else closes it and
 * opens its own. Once per process; later calls, and provider
 * DS_TRANSPORT_INPROC, do nothing. The next ds_transport_open joins the
 * thread. Not needed for correctness: the open does it all otherwise. */
void ds_transport_warm(const ds_transport_opts *o);

/* Loading libfabric puts back every signal disposition its libraries'
 * constructors changed (fabric_dl.c): a load running on the warm-up's
 * thread would also undo a handler the caller installs meanwhile. Install
 * signal handlers between lock and unlock: the load saves and restores
 * the dispositions under the same lock, so it sees them before or after,
 * never in between. Blocks while a load runs. Any thread. */
void ds_transport_signals_lock(void);
void ds_transport_signals_unlock(void);

/* Open an endpoint and start its progress thread. *out receives the
 * transport (caller owns; ds_transport_close frees it), before the thread
 * starts, so callbacks may use it; it is NULL on failure. The option strings
 * are copied. Returns 0, -EINVAL (bad option, logged with the reason),
 * -EADDRINUSE, -ENODATA (provider/address not offered by libfabric),
 * -ENOMEM, or another negative errno. */
__attribute__((warn_unused_result))
int ds_transport_open(const ds_transport_opts *o, ds_transport **out);

/* Stop the progress thread, which fails every pending send with -ECANCELED
 * (done callbacks, then release callbacks, still on the progress thread),
 * closes the endpoint and frees what libfabric held; then free everything.
 * Accepts NULL; clears *t once the thread has stopped (the callbacks may
 * still use *t until then). Must not be called from a callback. */
void ds_transport_close(ds_transport **t);

/* This endpoint's advertised address as "host:port" (the real port when
 * listen asked for port 0). */
int ds_transport_addr(ds_transport *t, char *buf, size_t n);

/* Resolve "host:port" and return its peer (the existing one when the same
 * address was added or heard from before). Resolution happens here, on the
 * calling thread; the address vector insert on the progress thread. Returns
 * 0, -EINVAL (malformed), -ENOENT (does not resolve), -ENOSPC (no slot). */
__attribute__((warn_unused_result))
int ds_transport_peer_add(ds_transport *t, const char *hostport, ds_transport_peer *out);

/* Forget a peer: its queued sends fail with -ECANCELED, what it had sent
 * and not yet delivered is dropped, its handle becomes invalid, and its slot
 * is reused once its abandoned sends are gone. A later message from the same
 * address creates a new peer (DS_TRANSPORT_EV_PEER_NEW). */
int ds_transport_peer_remove(ds_transport *t, ds_transport_peer p);

/* The peer's address as "host:port". -ENOENT if p is not a live peer. */
int ds_transport_peer_addr(ds_transport *t, ds_transport_peer p, char *buf, size_t n);

/* Queue one message for p. Returns 0 (accepted: done will run), or
 * -EINVAL, -ENOENT (unknown/removed peer), -ENOBUFS (max_queued_bytes),
 * -ENOMEM, -ECANCELED (closing), -ETIMEDOUT (deadline already past). */
__attribute__((warn_unused_result))
int ds_transport_send(ds_transport *t, ds_transport_peer p, const ds_transport_send_args *a);

/* Convenience: copy buf, send it, and wait for its done status (0,
 * -ETIMEDOUT, ...). Never waits much past deadline_ms. Not from callbacks. */
int ds_transport_send_wait(ds_transport *t, ds_transport_peer p, const void *buf, size_t len,
                           uint64_t deadline_ms);

/* Take ownership of a received message inside on_recv: returns the pointer
 * to free() when done with msg->data (which stays valid and unchanged). */
void *ds_transport_msg_take(ds_transport_msg *msg);

/* Large-buffer recycling (optional). ds_transport_buf_get returns a buffer
 * of at least `size` bytes, from the transport's small cache of freed
 * large buffers when one fits, else malloc; ds_transport_buf_put hands a
 * malloc'd buffer back (kept if the cache has room, else freed). A buffer
 * taken with ds_transport_msg_take may go back this way instead of free():
 * reusing warm pages spares the page faults of a fresh 1-64 MiB allocation
 * on every message. Any thread; put accepts NULL. Both are plain malloc
 * memory: free() is always allowed too. */
void *ds_transport_buf_get(ds_transport *t, size_t size);
void ds_transport_buf_put(ds_transport *t, void *buf);

/* Ask the progress thread to close and reopen the endpoint now (what the
 * stuck bound does on its own). Pending sends fail with -ENETRESET except
 * those not yet posted, which go out on the new endpoint. */
int ds_transport_reset(ds_transport *t);

/* A consistent snapshot of the counters. */
void ds_transport_stats_get(ds_transport *t, ds_transport_stats *st);


#endif
