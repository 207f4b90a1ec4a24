/*
 * node/net/net.h: the secured peer layer. Authenticated, sealed wire frames
 * between node ids, over node/transport/transport.h, with node/sec/crypto.h's handshake
 * and sessions and node/wire/wire.h's header checks (design §7).
 *
 * What it does:
 *   - a peers table keyed by node id (the id of the peer's Ed25519 key);
 *     a peer is reached at a transport address (host:port) that the caller
 *     gives (membership's to_addr, a seed) or that the peer published in its
 *     signed HELLO;
 *   - connect = transport peer + the three-frame handshake (HELLO,
 *     HELLO_ACK, HELLO_FIN as unsealed wire frames); frames sent before the
 *     session exists wait (bounded, with their deadlines) and are sealed
 *     when it does; a session is replaced only when a new handshake with the
 *     same peer completes (a replayed HELLO cannot cut a link), and rekeyed
 *     the same way when ds_session_rekey_due says so;
 *   - every data frame sealed (security.mode: encrypt | auth | none) with
 *     the header as associated data, and opened on receipt: header checked
 *     against the limits, cluster, sender == the peer the connection
 *     authenticated, receiver == us, replay window, tag;
 *   - anything refused is dropped, counted by reason in one
 *     ds_drop_counters (node/wire/wire.h) and logged rate-limited; data frames
 *     from a connection with no session are unknown_sender;
 *   - failures surface as events: a handshake that fails or times out, a
 *     peer whose sends miss their deadlines (from the transport).
 *
 * A frame is bound to the transport connection it arrived on: its session
 * is the one that connection's handshake produced, and the header's sender
 * must be that session's peer (wrong_sender otherwise). So in mode none,
 * where there is no tag, another node still cannot speak for a peer it
 * did not authenticate as over its own connection.
 *
 * Threads: one worker thread per ds_net opens and dispatches received
 * frames and drives handshakes and their timeouts; on_recv and on_event run
 * on it (serially), must be short, and may call any ds_net function except
 * ds_net_close. Sends may come from any thread (the gossip communication
 * thread and the failure-detector thread at once): a send seals on the
 * calling thread (ds_session_seal is thread-safe) and queues the frame in
 * the transport, which has its own progress thread. So crypto for outgoing
 * frames runs on the senders' threads, for incoming frames on the worker.
 */
#ifndef DS_NODE_NET_H
#define DS_NODE_NET_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "base/metric.h"
#include "node/sec/crypto.h"
#include "node/transport/transport.h"
#include "node/wire/wire.h"

typedef struct ds_net ds_net;

/* One received, authenticated data frame, handed to on_recv. frame[0..len)
 * is the opened plaintext frame (header, payload, and the tag bytes when
 * hdr.flags say the frame was protected): pass it to ds_net_decode or to
 * ds_membership_recv. Borrowed until on_recv returns, unless on_recv calls
 * ds_net_rx_take. */
typedef struct ds_net_rx {
    uint64_t sender;       /* authenticated node id */
    const char *name;      /* the sender's name, as it signed it */
    const char *addr;      /* the address it published in its HELLO */
    ds_wire_hdr hdr;
    const uint8_t *frame;
    size_t len;
    const uint8_t *payload; /* frame + DS_WIRE_HDR_SIZE */
    size_t payload_len;     /* hdr.payload_len */
    void *base_;            /* internal */
    int taken_;             /* internal */
} ds_net_rx;

enum ds_net_event_kind {
    /* A session with `peer` was established (or replaced by a rekey). */
    DS_NET_EV_PEER_UP = 1,
    /* A handshake failed or timed out; its waiting frames failed. peer may
     * be 0 when the other side never said who it was. status: -ETIMEDOUT,
     * -EACCES (refused), -ECONNABORTED (the other side went away). */
    DS_NET_EV_HANDSHAKE_FAILED = 2,
    /* Sends to the peer missed deadlines (transport report). */
    DS_NET_EV_PEER_UNRESPONSIVE = 3,
    DS_NET_EV_PEER_RESPONSIVE = 4,
    /* The transport endpoint was reset (stuck bound). */
    DS_NET_EV_RESET = 5,
    /* An allow-list reload removed the peer's key: its session is closed
     * and it is not admitted again (ds_net_allow_reload). */
    DS_NET_EV_PEER_REVOKED = 6,
};

typedef struct ds_net_event {
    enum ds_net_event_kind kind;
    uint64_t peer;          /* node id, 0 if unknown */
    const char *name;       /* may be "" */
    const char *addr;       /* transport address, may be "" */
    int status;
} ds_net_event;

typedef void (*ds_net_recv_fn)(void *ctx, ds_net_rx *rx);
typedef void (*ds_net_event_fn)(void *ctx, const ds_net_event *ev);

typedef struct ds_net_cfg {
    const ds_identity *identity;       /* borrowed for the net's life */
    const char *name;                  /* this node's name (copied) */
    const char *cluster;               /* cluster name: ds_wire_cluster_id (copied) */
    const ds_cluster_key *cluster_key; /* borrowed; NULL: none */
    const ds_allowlist *allow;         /* borrowed; NULL: none */
    /* The file `allow` was read from (copied; NULL: none), re-read by
     * ds_net_allow_reload, which the worker calls whenever the value at
     * allow_reload changes (a counter a SIGHUP handler increments;
     * borrowed; NULL: only explicit calls). */
    const char *allow_file;
    const atomic_int *allow_reload;
    enum ds_sec_mode mode;
    unsigned aeads;                    /* acceptable AEADs; 0 = all this CPU runs */
    /* Transport options (provider, listen, advertise, sizes). The
     * callbacks are the net's own; whatever is set there is ignored. */
    ds_transport_opts transport;
    ds_wire_limits limits;             /* all zero: ds_wire_limits_default */
    uint32_t handshake_timeout_ms;     /* 0: 5000 */
    size_t max_pending_bytes;          /* frames waiting for a session, per peer;
                                        * 0: 64 MiB */
    size_t max_rx_queue_bytes;         /* received, not yet processed; 0: 1 GiB */
    unsigned max_handshakes;           /* concurrent handshakes we answer; 0: 64 */
    ds_net_recv_fn on_recv;            /* required */
    ds_net_event_fn on_event;          /* may be NULL */
    void *cb_ctx;
    /* Tests only: every handshake frame we send or receive (dir 'S'/'R'),
     * borrowed for the call. NULL normally. */
    void (*hs_tap)(void *ctx, char dir, const uint8_t *frame, size_t len);
} ds_net_cfg;

/* Fill the numeric defaults and ds_transport_opts_default; mode encrypt. */
void ds_net_cfg_default(ds_net_cfg *cfg);

/* Start the transport and the worker. Needs ds_crypto_init() done. The
 * caller owns *out (ds_net_close). Returns 0, -EINVAL (config, logged),
 * or what ds_transport_open returns. */
int ds_net_open(const ds_net_cfg *cfg, ds_net **out) DS_WUR;

/* Stop the worker and the transport (pending sends fail with -ECANCELED),
 * wipe every session and handshake, free. Accepts NULL; clears *n. Not
 * from a callback. */
void ds_net_close(ds_net **n);

/* This node's transport address ("host:port") and node id. */
int ds_net_addr(ds_net *n, char *buf, size_t len);
uint64_t ds_net_self_id(const ds_net *n);

/* Options of one send. deadline_ms: absolute, ds_now_ms() clock; it covers
 * the handshake too when there is no session yet. done (may be NULL) runs
 * exactly once, on a net or transport thread, with 0 or a negative errno
 * (-ETIMEDOUT, -ECANCELED, -EACCES when the handshake was refused, ...). */
typedef struct ds_net_send_opts {
    uint64_t deadline_ms;
    ds_transport_done_fn done;
    void *done_arg;
} ds_net_send_opts;

/* Send one encoded, unsealed data frame (header + payload as
 * ds_wire_encode wrote it, e.g. by node/membership) to node `to` (0: the
 * node at to_addr, whoever it turns out to be). to_addr may be NULL when
 * the peer's address is known (a session, an earlier send, its HELLO).
 * The frame is copied. The header's cluster, sender, receiver, seq and
 * protection bits are set here. Returns 0 (accepted: done will run),
 * -EINVAL (not a data frame), -EHOSTUNREACH (no address known), -ENOBUFS
 * (pending bound), -ETIMEDOUT (deadline past), -EMSGSIZE (over the limits),
 * -ENOMEM, -ECANCELED (closing). */
int ds_net_send_frame(ds_net *n, uint64_t to, const char *to_addr, const uint8_t *frame,
                      size_t len, const ds_net_send_opts *o) DS_WUR;

/* Encode m (ds_wire_encode: the caller sets type, round, epoch, segment,
 * count and the type's union member; addressing is filled here) straight
 * into a sealed frame and send it like ds_net_send_frame, without the
 * copy. */
int ds_net_send_msg(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                    const ds_net_send_opts *o) DS_WUR;

/* STATE_CHUNK data of at least this many bytes goes out without a copy
 * through ds_net_send_msg_ref (below it a copy costs less than the
 * bookkeeping). */
#define DS_NET_REF_MIN (64u << 10)

/* ds_net_send_msg for a STATE_CHUNK (-EINVAL for another type) whose data
 * the caller lends instead of having it copied: in mode none, when a
 * session is up, the header and prefix go out from a small
 * buffer and the data straight from m->u.chunk.data (count bytes), which
 * the transport reads until libfabric is done with it. The caller promises
 * that those bytes stay valid and unchanged until
 * release(release_arg, (void *)m->u.chunk.data) runs: exactly once when
 * this returns 0, on a net or transport thread, after done or (a send that
 * timed out while libfabric still holds it) long after, at the latest when
 * the transport resets its endpoint or the net closes (docs/transport.md:
 * a send to a killed peer may never complete). In mode encrypt, with a
 * session up, the data is sealed from where it is into the frame (one
 * pass: ds_session_seal_from). Where the data is sealed from or copied
 * (modes auth and encrypt, below DS_NET_REF_MIN, no session yet: the frame
 * waits for the handshake) release runs before this returns, on the
 * calling thread. When this returns an error, release does not run and
 * the data is the caller's again at once. The bytes on the wire are the
 * same as ds_net_send_msg's. */
int ds_net_send_msg_ref(ds_net *n, uint64_t to, const char *to_addr, ds_wire_msg *m,
                        const ds_net_send_opts *o, ds_transport_release_fn release,
                        void *release_arg) DS_WUR;

/* Start a handshake with the node at addr now (sends start one anyway).
 * expect: the node id it must prove, 0 = any admitted node. Returns 0 or
 * an errno as ds_net_send_frame. */
int ds_net_connect(ds_net *n, const char *addr, uint64_t expect) DS_WUR;

/* Re-read cfg.allow_file and admit by it from now on: handshakes check the
 * new list, sessions whose key (or pinned name) it no longer admits are
 * closed (their waiting frames fail -ECANCELED, DS_NET_EV_PEER_REVOKED is
 * reported, and their later frames are dropped as unknown_sender), running
 * handshakes with such keys are dropped. Keys added are admitted at their
 * next HELLO. A file that does not load changes nothing: the old list
 * stays, the error (naming file and line) is logged and copied to err
 * (may be NULL).
 * Any thread; counted in allow_reloads / allow_reload_errors /
 * sessions_revoked. 0, or -ENOENT without cfg.allow_file and cfg.allow, or
 * the loader's errno. */
int ds_net_allow_reload(ds_net *n, char *err, size_t errlen) DS_WUR;

/* 1 when a session with `peer` is up. */
int ds_net_connected(ds_net *n, uint64_t peer);

/* Forget a peer: wipe its session, fail its waiting frames (-ECANCELED),
 * remove its transport peer. Its next frames are unknown_sender until it
 * handshakes again. -ENOENT if unknown. */
int ds_net_forget(ds_net *n, uint64_t peer);

/* Take the received frame's buffer inside on_recv: returns the pointer to
 * free() when done with rx->frame (which stays valid). */
void *ds_net_rx_take(ds_net_rx *rx);

/* ds_wire_decode of a received frame with this net's limits and drop
 * counters. */
enum ds_drop_reason ds_net_decode(ds_net *n, const ds_net_rx *rx, const ds_wire_bufs *bufs,
                                  ds_wire_msg *out) DS_WUR;

/* The drop counters (every reason the net, the handshake, the sessions and
 * ds_net_decode refused a frame for). Valid while the net lives. */
ds_drop_counters *ds_net_drops(ds_net *n);

/* The secured layer's counters (base/metric.h: one row per field gives
 * the member, its /status key, its /metrics family and its docs/status.md
 * row). The transport's own counters follow as .transport. */
#define DS_NET_HELP_HS "Handshakes by result."
#define DS_NET_HELP_RELOAD "Allow-list reloads by result (an error keeps the old list)."
#define DS_NET_HELP_KSENT "Bytes of sealed frames sent, by message kind (they sum to bytes_sent)."
#define DS_NET_HELP_KRECV \
    "Bytes of frames received, by message kind (they sum to bytes_received)."
#define DS_NET_STATS(X) \
    X(U64, frames_sent, "frames_sent", "dsnode_frames_sent_total", COUNTER, NULL, NULL, \
      "Sealed frames handed to the transport.") \
    X(U64, bytes_sent, "bytes_sent", "dsnode_bytes_sent_total", COUNTER, NULL, NULL, \
      "Bytes of sealed frames sent.") \
    X(U64, frames_recv, "frames_received", "dsnode_frames_received_total", COUNTER, NULL, \
      NULL, "Frames opened and delivered.") \
    X(U64, bytes_recv, "bytes_received", "dsnode_bytes_received_total", COUNTER, NULL, NULL, \
      "Bytes of frames received.") \
    X(U64, handshakes_ok, "handshakes_ok", "dsnode_handshakes_total", COUNTER, "result", "ok", \
      DS_NET_HELP_HS) \
    X(U64, handshakes_failed, "handshakes_failed", "dsnode_handshakes_total", COUNTER, \
      "result", "failed", DS_NET_HELP_HS) \
    X(U64, sessions, "sessions", "dsnode_sessions", GAUGE, NULL, NULL, \
      "Secure sessions up now.") \
    X(U64, pending_frames, "pending_frames", "dsnode_pending_frames", GAUGE, NULL, NULL, \
      "Frames waiting for a session now.") \
    X(U64, send_failures, "send_failures", "dsnode_send_failures_total", COUNTER, NULL, NULL, \
      "Frame sends that failed (done callbacks with an error).") \
    X(U64, allow_reloads, "allow_reloads", "dsnode_allow_reloads_total", COUNTER, "result", \
      "ok", DS_NET_HELP_RELOAD) \
    X(U64, allow_reload_errors, "allow_reload_errors", "dsnode_allow_reloads_total", COUNTER, \
      "result", "error", DS_NET_HELP_RELOAD) \
    X(U64, sessions_revoked, "sessions_revoked", "dsnode_sessions_revoked_total", COUNTER, NULL, \
      NULL, "Sessions closed because their key left the allow-list.") \
    X(U64, sent_gossip, "bytes_sent_gossip", "dsnode_bytes_sent_by_kind_total", COUNTER, \
      "kind", "gossip", DS_NET_HELP_KSENT) \
    X(U64, sent_membership, "bytes_sent_membership", "dsnode_bytes_sent_by_kind_total", \
      COUNTER, "kind", "membership", DS_NET_HELP_KSENT) \
    X(U64, sent_state, "bytes_sent_state", "dsnode_bytes_sent_by_kind_total", COUNTER, "kind", \
      "state", DS_NET_HELP_KSENT) \
    X(U64, sent_group, "bytes_sent_group", "dsnode_bytes_sent_by_kind_total", COUNTER, "kind", \
      "group", DS_NET_HELP_KSENT) \
    X(U64, sent_other, "bytes_sent_other", "dsnode_bytes_sent_by_kind_total", COUNTER, "kind", \
      "other", DS_NET_HELP_KSENT) \
    X(U64, recv_gossip, "bytes_received_gossip", "dsnode_bytes_received_by_kind_total", \
      COUNTER, "kind", "gossip", DS_NET_HELP_KRECV) \
    X(U64, recv_membership, "bytes_received_membership", "dsnode_bytes_received_by_kind_total", \
      COUNTER, "kind", "membership", DS_NET_HELP_KRECV) \
    X(U64, recv_state, "bytes_received_state", "dsnode_bytes_received_by_kind_total", COUNTER, \
      "kind", "state", DS_NET_HELP_KRECV) \
    X(U64, recv_group, "bytes_received_group", "dsnode_bytes_received_by_kind_total", COUNTER, \
      "kind", "group", DS_NET_HELP_KRECV) \
    X(U64, recv_other, "bytes_received_other", "dsnode_bytes_received_by_kind_total", COUNTER, \
      "kind", "other", DS_NET_HELP_KRECV)

typedef struct ds_net_stats {
    DS_NET_STATS(DS_METRIC_FIELD)
    ds_transport_stats transport;
} ds_net_stats;

void ds_net_stats_get(ds_net *n, ds_net_stats *st);

/* Tests only (the cross-process security suite's attacker): seal m for
 * `to` exactly as ds_net_send_msg would, into a new buffer (*out, caller
 * frees) of *out_len bytes, without sending it; then ds_net_send_raw
 * sends any bytes as they are on to's transport connection. -ENOTCONN
 * without a session. */
int ds_net_seal_for_test(ds_net *n, uint64_t to, ds_wire_msg *m, uint8_t **out,
                         size_t *out_len) DS_WUR;
int ds_net_send_raw(ds_net *n, uint64_t to, const uint8_t *bytes, size_t len,
                    uint64_t deadline_ms) DS_WUR;

#endif
