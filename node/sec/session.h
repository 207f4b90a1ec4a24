/*
 * node/sec/session.h: sealed sessions, every frame after the handshake
 * (design §7).
 *
 * Sealing: the 64-byte header is the associated data; the nonce is the
 * header's per-direction seq (1, 2, ...) in little-endian, zero-padded to
 * the cipher's nonce size; the 16-byte tag follows the payload.
 * encrypt: AES-256-GCM when both peers have AES-NI, else XChaCha20-Poly1305.
 * auth:    the same AEAD over an empty message with header || payload as
 *          associated data (payload in clear): AES-GCM's GHASH alone ran at
 *          about 4.7 GB/s here, Poly1305 at 2-3 GB/s (docs/bench/crypto.md).
 * none:    no tag; seq, addressing and replay checks still apply (they catch
 *          accidents, not attackers). Config refuses it off loopback.
 * Opening checks the header, the addressing and the replay window
 * (node/sec/replay.h) before the tag, and moves the window only after the
 * tag verified.
 *
 * Keys differ per direction (the handshake derives both), so a nonce never
 * repeats under one key; an AES-256-GCM key is retired well before its
 * bounds (DS_SESSION_AESGCM_MAX_BYTES).
 *
 * The AEAD runs on OpenSSL's EVP or on libsodium (ds_aead_lib_set,
 * policy.h): the same algorithms, so the bytes are the same either way.
 *
 * Ownership: ds_session is the caller's storage; ds_session_wipe erases
 * its keys and frees its OpenSSL contexts (every initialised session must
 * be wiped). Threads: ds_session_seal and ds_session_seal_ref may be called
 * from several threads at once (the seq and byte counters are atomic);
 * ds_session_open must be serialised per session by the caller (it moves
 * the replay window).
 */
#ifndef DS_NODE_SEC_SESSION_H
#define DS_NODE_SEC_SESSION_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "node/sec/policy.h"
#include "node/sec/replay.h"

#define DS_SESSION_KEY_BYTES 32

/* AES-256-GCM keys are retired after this many bytes sealed (a margin far
 * below the cipher's bounds); seal then returns -EKEYEXPIRED and the
 * transport must run a new handshake. ds_session_rekey_due() turns true at
 * three quarters so it can do so without a pause. */
#define DS_SESSION_AESGCM_MAX_BYTES (1ull << 36)

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

struct evp_cipher_ctx_st; /* OpenSSL's EVP_CIPHER_CTX, kept out of this header */

/* Sealing contexts per session with OpenSSL (an EVP context holds one
 * frame's state, so concurrent sealers each take one; a sealer that finds
 * all taken makes a temporary one). */
#define DS_SESSION_TX_CTXS 4

typedef struct ds_session {
    crypto_aead_aes256gcm_state tx_aes; /* 16-byte aligned by its type */
    crypto_aead_aes256gcm_state rx_aes;
    unsigned lib; /* enum ds_aead_lib: who runs the AEAD */
    struct evp_cipher_ctx_st *tx_ctx[DS_SESSION_TX_CTXS]; /* OpenSSL: AES key set */
    atomic_flag tx_busy[DS_SESSION_TX_CTXS];
    struct evp_cipher_ctx_st *rx_ctx; /* OpenSSL: open is serialised per session */
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
 * unknown mode or an AEAD this CPU cannot run; -ENOMEM when OpenSSL could
 * not make its contexts. */
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
 * -ENOMEM when OpenSSL failed (the frame's seq is spent);
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

/* Seal a frame whose payload's end is elsewhere, copying it in as part of
 * sealing: frame[0..head_len) holds the header and the first payload bytes
 * as ds_wire_encode_head wrote them (payload_len counts body too), body is
 * read and never written, and cap >= head_len + body_len + overhead. The
 * sealed frame, frame[0..*out_len), is byte for byte what ds_session_seal
 * makes of the contiguous frame with the same seq. In mode encrypt with
 * AES-256-GCM on OpenSSL the body is encrypted from where it is into the
 * frame (one pass over it instead of a copy and a pass); otherwise it is
 * copied and the frame sealed in place (what measured faster for each). Returns what ds_session_seal returns. Thread-safe
 * against other seals. */
int ds_session_seal_from(ds_session *s, uint8_t *frame, size_t head_len, const uint8_t *body,
                         size_t body_len, size_t cap, size_t *out_len) DS_WUR;
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

#endif
