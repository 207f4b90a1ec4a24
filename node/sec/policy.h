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

/* The library that runs the bulk AEAD of sealed sessions (seal and open;
 * identities, key exchange and the handshake are always libsodium's). The
 * algorithms and the frame format are the same, so frames sealed by one
 * open with the other. OpenSSL's EVP (3.0) is the default: it measured
 * faster (docs/benchmarks.md, issue 17); libsodium stays as the plain
 * reference, chosen by benches and tests with ds_aead_lib_set. */
enum ds_aead_lib {
    DS_AEAD_LIB_OPENSSL = 0,
    DS_AEAD_LIB_SODIUM = 1,
};
/* The process-wide choice that ds_session_init reads (sessions keep what
 * they were made with). Thread-safe. */
void ds_aead_lib_set(enum ds_aead_lib lib);
enum ds_aead_lib ds_aead_lib_get(void);
/* "openssl", "libsodium"; -EINVAL for another name. */
const char *ds_aead_lib_name(enum ds_aead_lib lib);
int ds_aead_lib_parse(const char *s) DS_WUR;

/* Admission bits (sent in HELLO: both peers must use the same). */
#define DS_ADMIT_CLUSTER_KEY 1
#define DS_ADMIT_ALLOWLIST 2

/* sodium_init; 0 or -EIO. Idempotent, thread-safe. */
int ds_crypto_init(void) DS_WUR;

#endif
