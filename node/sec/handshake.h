/*
 * node/sec/handshake.h: the three-frame handshake that starts every peer
 * connection and yields a session (design §7). Pure: bytes in, bytes out;
 * the transport moves the frames and owns the timing (deadlines, retries).
 *
 * Handshake (initiator I, responder R; H = BLAKE2b-256; K = cluster key):
 *
 *   I -> R  HELLO      mode, AEADs offered, admission, I's name, address,
 *                      identity key, fresh X25519 key e_I;
 *                      sig_I(H1), mac_K(H1)    H1 = H("hello" || frame)
 *   R -> I  HELLO_ACK  the same fields for R with the chosen AEAD, fresh
 *                      e_R, echo = H1;
 *                      sig_R(H2), mac_K(H2)    H2 = H("ack" || HELLO || frame)
 *   I -> R  HELLO_FIN  echo = H2;
 *                      sig_I(H3), mac_K(H3)    H3 = H("fin" || HELLO ||
 *                                                     HELLO_ACK || frame)
 *
 * ("frame" is the message's own header and payload up to its signature;
 * node/wire/hello.h pins the payloads.) Each hash covers every earlier byte
 * of the handshake: the cluster id, both names, addresses, identity keys
 * and ephemeral keys, the modes and the chosen cipher. Session keys:
 * crypto_kx (I is the client), each direction's key then bound to the
 * transcript: k = BLAKE2b-256(key = kx key, "session" || H3), so a session
 * is bound to the names, identities and cipher choice it was negotiated
 * for, not only to the ephemeral keys. A replayed HELLO makes R answer with
 * a fresh e_R, and no old HELLO_FIN can sign the new H2 (its echo does not
 * even match: the reason is STALE_HANDSHAKE); a replayed HELLO_ACK fails
 * the same way at I. The HELLO signature lets R reject forged HELLOs before
 * it spends a key exchange; it is not proof of freshness (HELLO_FIN is).
 *
 * Every ds_hs_read is all-or-nothing: a frame is checked completely
 * (structure, policy, admission, signature, cluster-key MAC, key exchange)
 * before any field of the handshake is written, so a forged or corrupted
 * frame leaves the handshake exactly as it was and the genuine frame can
 * still complete it. An attacker who can inject frames can already delay a
 * handshake; it must not be able to kill one with a single bad byte.
 *
 * Secrets (ephemeral keys, the key-exchange output, the session keys until
 * ds_hs_session takes them) are wiped by ds_hs_wipe and as soon as they are
 * no longer needed.
 *
 * Ownership: ds_hs is the caller's storage; the identity, cluster key,
 * allow-list and drop counters in its config are borrowed until
 * ds_hs_wipe. Threads: a ds_hs is used by one thread at a time.
 */
#ifndef DS_NODE_SEC_HANDSHAKE_H
#define DS_NODE_SEC_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "node/sec/allow.h"
#include "node/sec/keys.h"
#include "node/sec/policy.h"
#include "node/sec/session.h"

typedef struct ds_hs_config {
    const ds_identity *identity;   /* borrowed until ds_hs_wipe */
    const char *name;              /* this node's name (1..63 printable chars) */
    const char *address;           /* published listen address ("" allowed) */
    uint64_t cluster_id;           /* ds_wire_cluster_id(cluster name) */
    const ds_cluster_key *cluster_key; /* borrowed; NULL: no cluster key */
    const ds_allowlist *allow;     /* borrowed; NULL: no allow-list */
    enum ds_sec_mode mode;
    unsigned aeads;                /* acceptable AEADs; 0 = all this CPU runs */
    ds_drop_counters *drops;       /* borrowed; may be NULL */
} ds_hs_config;

/* What the handshake proved about the peer. */
typedef struct ds_peer_info {
    uint8_t pk[DS_PK_BYTES];
    uint64_t id;
    char name[DS_WIRE_NAME_MAX + 1];
    char address[DS_WIRE_ADDR_MAX + 1];
    enum ds_sec_mode mode;
    unsigned aead;
} ds_peer_info;

enum ds_hs_state {
    DS_HS_SEND_HELLO,
    DS_HS_WAIT_HELLO,
    DS_HS_SEND_ACK,
    DS_HS_WAIT_ACK,
    DS_HS_SEND_FIN,
    DS_HS_WAIT_FIN,
    DS_HS_DONE,
};

/* One handshake. Caller owns the storage; everything inside is private. */
typedef struct ds_hs {
    ds_hs_config cfg;
    enum ds_hs_state state;
    int initiator;
    uint64_t expect_peer; /* initiator: the id it dialled, 0 = any */
    unsigned my_aeads;
    unsigned aead;        /* chosen */
    uint8_t eph_pk[crypto_kx_PUBLICKEYBYTES];
    uint8_t eph_sk[crypto_kx_SECRETKEYBYTES];
    uint8_t peer_eph[crypto_kx_PUBLICKEYBYTES];
    uint8_t hello[DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_SIZE];
    uint8_t ack[DS_WIRE_HDR_SIZE + DS_WIRE_HELLO_ACK_SIZE];
    uint8_t h1[32], h2[32];
    uint8_t kx_rx[crypto_kx_SESSIONKEYBYTES], kx_tx[crypto_kx_SESSIONKEYBYTES];
    ds_session_params out;
    int have_out;
    ds_peer_info peer;
} ds_hs;

/* Start a handshake. The initiator may name the peer id it expects (from
 * membership; 0 = accept any admitted key). -EINVAL for a bad config (no
 * admission policy, bad name, mode/AEAD not runnable here). */
int ds_hs_init_initiator(ds_hs *hs, const ds_hs_config *cfg, uint64_t expect_peer) DS_WUR;
int ds_hs_init_responder(ds_hs *hs, const ds_hs_config *cfg) DS_WUR;

/* 1 when ds_hs_write has a frame to send now. */
int ds_hs_want_write(const ds_hs *hs);
/* Write the next frame into out[0..cap) (DS_WIRE_MAX_HS_FRAME suffices).
 * Returns 0 and *len; -EAGAIN when it is the peer's turn; -ENOSPC. */
int ds_hs_write(ds_hs *hs, uint8_t *out, size_t cap, size_t *len) DS_WUR;
/* Feed one received frame. DS_DROP_NONE: accepted, the state moved on.
 * Anything else: the frame was dropped (counted, logged) and the state is
 * exactly as before, so the genuine frame can still arrive. */
enum ds_drop_reason ds_hs_read(ds_hs *hs, const uint8_t *frame, size_t len) DS_WUR;
int ds_hs_done(const ds_hs *hs);
/* The authenticated peer; valid once ds_hs_done. */
const ds_peer_info *ds_hs_peer(const ds_hs *hs);
/* Replace the borrowed allow-list of a running handshake (a reload): the
 * frames it reads from now on are checked against al. Both the old and the
 * new list must be non-NULL (the admission bits a HELLO carries stay). */
void ds_hs_set_allowlist(ds_hs *hs, const ds_allowlist *al);
/* Once done: set up *s (as ds_session_init) and wipe the keys from hs.
 * -EAGAIN if not done; -EALREADY if taken before. */
int ds_hs_session(ds_hs *hs, ds_session *s, const ds_wire_limits *lim) DS_WUR;
/* Wipe every secret in hs. Safe on a zeroed or finished hs. */
void ds_hs_wipe(ds_hs *hs);

#endif
