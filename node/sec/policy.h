/*
 * node/sec/policy.h: what two peers must agree on before they talk: the
 * security mode, the AEADs, the admission policy; and libsodium's start.
 *
 * These are values, not state: a mode and an AEAD set travel in every
 * HELLO (node/wire/hello.h), and the handshake refuses a peer whose mode or
 * admission differ (DS_DROP_POLICY_MISMATCH) instead of negotiating down.
 *
 * Threads: every function here is pure or, for ds_crypto_init, idempotent
 * and thread-safe.
 */
#ifndef DS_NODE_SEC_POLICY_H
#define DS_NODE_SEC_POLICY_H

#include "conf/choices.h" /* enum ds_sec_mode: security.mode's list */
#include "node/wire/wire.h"

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

#endif
