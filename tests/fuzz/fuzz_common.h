/*
 * tests/fuzz/fuzz_common.h: what the harnesses and the seed generator
 * share: decode limits sized for fuzzing, fixed identities and the fixed
 * session keys of a node A talking to a node B, so the committed sealed
 * seeds open under the harness's keys.
 */
#ifndef DS_TESTS_FUZZ_COMMON_H
#define DS_TESTS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node/sec/crypto.h"
#include "node/wire/wire.h"

#define FZ_CLUSTER 0x00c0ffee00c0ffeeull
#define FZ_CAP 4096

static inline void fz_limits(ds_wire_limits *lim)
{
    ds_wire_limits_default(lim);
    lim->max_payload = 1u << 20;
    lim->max_segment = UINT32_MAX;
    lim->max_count = FZ_CAP;
    lim->max_members = 64;
}

static inline void fz_identity(ds_identity *id, uint8_t seedbyte)
{
    uint8_t seed[32];
    memset(seed, seedbyte, sizeof(seed));
    if (crypto_sign_seed_keypair(id->pk, id->sk, seed) != 0)
        abort();
    id->id = ds_wire_node_id(id->pk);
}

/* Session variant v (0..3): auth/encrypt x AES-GCM/XChaCha, falling back
 * to XChaCha where the CPU lacks AES-NI. tx = 1 for A's sending side. */
/* Sets up *s afresh (wiping what it held: static storage starts zeroed)
 * for variant v: bit 0 encrypt/auth, bit 1 XChaCha20/AES-GCM, bit 2 the
 * AEAD run by libsodium instead of OpenSSL (the bytes are the same). */
static inline void fz_session(ds_session *s, unsigned v, int a_side)
{
    ds_session_wipe(s);
    ds_aead_lib_set((v & 4) ? DS_AEAD_LIB_SODIUM : DS_AEAD_LIB_OPENSSL);
    static ds_identity a, b; /* derived once: keypairs are slow under ASan */
    if (!a.id) {
        fz_identity(&a, 0xa1);
        fz_identity(&b, 0xb2);
    }
    ds_session_params p;
    memset(&p, 0, sizeof(p));
    p.mode = (v & 1) ? DS_SEC_ENCRYPT : DS_SEC_AUTH;
    p.aead = (v & 2) || !crypto_aead_aes256gcm_is_available() ? DS_AEAD_XCHACHA20
                                                              : DS_AEAD_AES256GCM;
    memset(a_side ? p.tx_key : p.rx_key, 0x11, 32);
    memset(a_side ? p.rx_key : p.tx_key, 0x22, 32);
    p.cluster_id = FZ_CLUSTER;
    p.self_id = a_side ? a.id : b.id;
    p.peer_id = a_side ? b.id : a.id;
    ds_wire_limits lim;
    fz_limits(&lim);
    if (ds_session_init(s, &p, &lim, NULL) != 0)
        abort();
}

#endif
