/*
 * node/sec/crypto.h: identities, admission, the handshake and sealed
 * sessions (design §7), on libsodium. Pure: bytes in, bytes out; the
 * transport moves the frames and owns the timing (deadlines, retries).
 *
 * This header is the room's umbrella: it includes one header per concern,
 * and callers may include either it or the one they need. The pieces, in
 * the order a node uses them:
 *
 *   policy.h     ds_crypto_init() once per process (sodium_init); the
 *                security modes, AEADs and admission bits peers agree on
 *   keys.h       ds_identity_load(): the node's Ed25519 key pair (keygen.h
 *                writes it; mode 0600 enforced); ds_cluster_key_load()
 *   allow.h      ds_allowlist_load(): the admitted public keys. Admission is
 *                a 32-byte pre-shared cluster key (every holder is fully
 *                trusted) or an allow-list, or both (then a peer must pass
 *                both)
 *   handshake.h  ds_hs_*: one handshake per peer connection, three frames
 *                HELLO, HELLO_ACK, HELLO_FIN; then a session
 *   session.h    ds_session_seal / _open: every later frame, in place;
 *                ds_session_seal_ref: the same, the payload's end left where
 *                it is (zero-copy sends)
 *   replay.h     the session's receive-side replay window
 *
 * The protocol is described where it is implemented: the handshake in
 * handshake.h, sealing in session.h, the replay window in replay.h; the
 * threat model in docs/security.md and the frames in docs/protocol.md.
 *
 * Secrets (identity, cluster key, ephemeral and session keys) are wiped with
 * sodium_memzero by the *_wipe functions and on every error path.
 * Functions that verify or allocate are warn_unused_result.
 *
 * Threads: a ds_hs is used by one thread at a time. ds_session_seal may be
 * called from several threads at once (the seq counter is atomic);
 * ds_session_open must be serialised per session by the caller (it moves
 * the replay window).
 */
#ifndef DS_NODE_CRYPTO_H
#define DS_NODE_CRYPTO_H

<<<<<<< HEAD
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "conf/choices.h" /* enum ds_sec_mode: security.mode's list */
#include "node/wire/wire.h"

#define DS_PK_BYTES 32
#define DS_SK_BYTES 64
#define DS_CLUSTER_KEY_BYTES 32
#define DS_SESSION_KEY_BYTES 32
#define DS_REPLAY_WINDOW 1024

/* AES-256-GCM keys are retired after this many bytes sealed (a margin far
 * below the cipher's bounds); seal then returns -EKEYEXPIRED and the
 * transport must run a new handshake. ds_session_rekey_due() turns true at
 * three quarters so it can do so without a pause. */
#define DS_SESSION_AESGCM_MAX_BYTES (1ull << 36)

/* The security modes, enum ds_sec_mode, and their names are security.mode's
 * list, DS_SEC_MODES in conf/choices.h (none 0, auth 1, encrypt 2: the
 * hello body's mode byte). A name of that list -> mode; -EINVAL otherwise. */
int ds_sec_mode_parse(const char *s) DS_WUR;
/* The mode's name in DS_SEC_MODES, or "?" for a value not in it. */
const char *ds_sec_mode_name(enum ds_sec_mode m);

/* AEADs as bits, so a set fits a handshake byte. */
enum ds_aead {
    DS_AEAD_AES256GCM = 1,
    DS_AEAD_XCHACHA20 = 2,
};
#define DS_AEAD_ALL (DS_AEAD_AES256GCM | DS_AEAD_XCHACHA20)
/* "aes256gcm", "xchacha20poly1305", "-" for 0. */
const char *ds_aead_name(unsigned aead);
/* The AEADs this CPU runs (needs ds_crypto_init first). */
unsigned ds_aead_available(void);

/* Admission bits (sent in HELLO: both peers must use the same). */
#define DS_ADMIT_CLUSTER_KEY 1
#define DS_ADMIT_ALLOWLIST 2

/* sodium_init; 0 or -EIO. Idempotent, thread-safe. */
int ds_crypto_init(void) DS_WUR;

/* ---- identity --------------------------------------------------------------- */

/* A node's long-term Ed25519 key pair. sk is libsodium's 64-byte secret
 * (seed || pk). id = ds_wire_node_id(pk). Caller owns; wipe when done. */
typedef struct ds_identity {
    uint8_t pk[DS_PK_BYTES];
    uint8_t sk[DS_SK_BYTES];
    uint64_t id;
} ds_identity;

int ds_identity_generate(ds_identity *out) DS_WUR;
/* Loads a secret key file written by ds_identity_save. Refuses a file that
 * is not a regular file (-EINVAL), is readable or writable by group or
 * others (-EPERM: "chmod 600 F"), is missing (-ENOENT), or is malformed,
 * truncated or inconsistent (-EINVAL). err (may be NULL) receives one line
 * naming the file and the problem. */
int ds_identity_load(ds_identity *out, const char *path, char *err, size_t errlen) DS_WUR;
/* Writes path (mode 0600) and path.pub (0644, an allow-list line: hex key
 * and, if name is non-NULL, the name). Refuses to overwrite either unless
 * force (-EEXIST); with force it replaces them atomically (rename). */
int ds_identity_save(const ds_identity *id, const char *path, const char *name, int force,
                     char *err, size_t errlen) DS_WUR;
void ds_identity_wipe(ds_identity *id);

/* 64 lowercase hex digits + NUL. */
void ds_pk_to_hex(const uint8_t pk[DS_PK_BYTES], char out[2 * DS_PK_BYTES + 1]);
/* Exactly 64 hex digits; 0 or -EINVAL. */
int ds_pk_from_hex(uint8_t pk[DS_PK_BYTES], const char *hex, size_t len) DS_WUR;

/* ---- cluster key -------------------------------------------------------------- */

typedef struct ds_cluster_key {
    uint8_t k[DS_CLUSTER_KEY_BYTES];
} ds_cluster_key;

int ds_cluster_key_generate(ds_cluster_key *out) DS_WUR;
/* Same checks and errors as ds_identity_load. */
int ds_cluster_key_load(ds_cluster_key *out, const char *path, char *err, size_t errlen) DS_WUR;
/* Writes path with mode 0600; refuses to overwrite unless force. */
int ds_cluster_key_save(const ds_cluster_key *k, const char *path, int force, char *err,
                        size_t errlen) DS_WUR;
void ds_cluster_key_wipe(ds_cluster_key *k);

/* ---- allow-list --------------------------------------------------------------- */

/* The admitted public keys: `<64 hex> [name]` per line, '#' starts a
 * comment, blank lines ignored (a .pub file written by keygen is one such
 * line). When an entry has a name, a peer presenting that key must also
 * present that name. Opaque; caller owns; free with ds_allowlist_free. */
typedef struct ds_allowlist ds_allowlist;

/* Parse text (len bytes; `what` names it in errors, e.g. the path).
 * Errors: -EINVAL with "what:line: ..." in err; -ENOMEM. */
int ds_allowlist_parse(ds_allowlist **out, const char *text, size_t len, const char *what,
                       char *err, size_t errlen) DS_WUR;
int ds_allowlist_load(ds_allowlist **out, const char *path, char *err, size_t errlen) DS_WUR;
/* 0 admitted; -EACCES key not listed; -EPERM listed under another name. */
int ds_allowlist_check(const ds_allowlist *al, const uint8_t pk[DS_PK_BYTES],
                       const char *name) DS_WUR;
size_t ds_allowlist_count(const ds_allowlist *al);
/* Accepts NULL; clears *al. */
void ds_allowlist_free(ds_allowlist **al);

/* ---- session ------------------------------------------------------------------- */

/* Receive-side replay window over seq. Zero-initialise. */
typedef struct ds_replay {
    uint64_t top; /* newest accepted seq; 0 = none yet */
    uint64_t bits[DS_REPLAY_WINDOW / 64];
} ds_replay;

/* DS_DROP_NONE when seq may be accepted (new, inside the window); REPLAY or
 * TOO_OLD otherwise. Does not change the window. */
enum ds_drop_reason ds_replay_check(const ds_replay *w, uint64_t seq) DS_WUR;
/* Mark seq seen (after it has been authenticated). */
void ds_replay_mark(ds_replay *w, uint64_t seq);

/* Everything a session is made of; ds_hs_session fills it from a
 * handshake, tests and benches may fill it directly. */
typedef struct ds_session_params {
    enum ds_sec_mode mode;
    unsigned aead; /* one DS_AEAD_* bit; ignored for DS_SEC_NONE */
    uint8_t tx_key[DS_SESSION_KEY_BYTES];
    uint8_t rx_key[DS_SESSION_KEY_BYTES];
    uint64_t cluster_id;
    uint64_t self_id; /* our node id: sender of sealed frames, receiver of opened */
    uint64_t peer_id;
} ds_session_params;

typedef struct ds_session {
    crypto_aead_aes256gcm_state tx_aes; /* 16-byte aligned by its type */
    crypto_aead_aes256gcm_state rx_aes;
    uint8_t tx_key[DS_SESSION_KEY_BYTES];
    uint8_t rx_key[DS_SESSION_KEY_BYTES];
    enum ds_sec_mode mode;
    unsigned aead;
    uint64_t cluster_id, self_id, peer_id;
    _Atomic uint64_t tx_seq;   /* last seq used; the next frame gets tx_seq + 1 */
    _Atomic uint64_t tx_bytes; /* bytes sealed under tx_key */
    ds_replay rx;
    ds_wire_limits lim;
    ds_drop_counters *drops; /* borrowed; may be NULL */
} ds_session;

/* Set up s from p (copied; wipe p afterwards) and lim (copied; NULL means
 * defaults). drops is borrowed for the session's life. -EINVAL for an
 * unknown mode or an AEAD this CPU cannot run. */
int ds_session_init(ds_session *s, const ds_session_params *p, const ds_wire_limits *lim,
                    ds_drop_counters *drops) DS_WUR;

/* Bytes seal appends: 16, or 0 in mode none. */
size_t ds_session_overhead(const ds_session *s);

/* Seal one encoded frame in place. frame[0..len) is header + payload as
 * ds_wire_encode wrote it; cap >= len + ds_session_overhead(s). Sets the
 * header's cluster, sender, receiver, seq and protection bits (the caller
 * need not), encrypts the payload (encrypt) and appends the tag. Returns 0
 * and *out_len; -ENOSPC; -EINVAL if frame is not a well-formed unsealed
 * data frame; -EKEYEXPIRED when this key must be retired (re-handshake);
 * -EOVERFLOW when seq would wrap. Thread-safe against other seals. */
int ds_session_seal(ds_session *s, uint8_t *frame, size_t len, size_t cap,
                    size_t *out_len) DS_WUR;

/* Seal a frame whose payload ends outside it, without copying that end:
 * the frame is head[0..head_len) || body[0..body_len), head holding the
 * header and the first payload bytes as ds_wire_encode_head wrote them
 * (payload_len counts body too), body read in place and never written.
 * Sets the header fields as ds_session_seal does; *tag_len = 0 (mode none
 * has no tag): the bytes head || body are exactly what ds_session_seal
 * makes of the contiguous frame with the same seq. Returns 0; the errors
 * of ds_session_seal; -ENOTSUP in modes auth and encrypt (libsodium's
 * AEADs take the associated data and the message whole), before anything
 * is consumed: seal the contiguous frame then. Thread-safe against other
 * seals. */
int ds_session_seal_ref(ds_session *s, uint8_t *head, size_t head_len, const uint8_t *body,
                        size_t body_len, uint8_t tag[DS_WIRE_TAG_SIZE], size_t *tag_len) DS_WUR;

/* Open one received frame in place: checks the header (ds_wire_hdr_decode
 * under the session's limits), its protection against the session mode,
 * cluster, sender == peer, receiver == self, the replay window, then the
 * tag, decrypting the payload in place. On DS_DROP_NONE, pass the same
 * (frame, len) to ds_wire_decode; on anything else the frame is to be
 * dropped (its payload may have been overwritten). Counts and logs drops. */
enum ds_drop_reason ds_session_open(ds_session *s, uint8_t *frame, size_t len) DS_WUR;

/* 1 when the transport should start a new handshake for this peer. */
int ds_session_rekey_due(const ds_session *s);
void ds_session_wipe(ds_session *s);

/* ---- handshake ------------------------------------------------------------------ */

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
/* Once done: set up *s (as ds_session_init) and wipe the keys from hs.
 * -EAGAIN if not done; -EALREADY if taken before. */
int ds_hs_session(ds_hs *hs, ds_session *s, const ds_wire_limits *lim) DS_WUR;
/* Wipe every secret in hs. Safe on a zeroed or finished hs. */
void ds_hs_wipe(ds_hs *hs);
=======
#include "node/sec/allow.h"
#include "node/sec/handshake.h"
#include "node/sec/keys.h"
#include "node/sec/policy.h"
#include "node/sec/replay.h"
#include "node/sec/session.h"
>>>>>>> h-sec

#endif
