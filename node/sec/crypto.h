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

#include "node/sec/allow.h"
#include "node/sec/handshake.h"
#include "node/sec/keys.h"
#include "node/sec/policy.h"
#include "node/sec/replay.h"
#include "node/sec/session.h"

#endif
