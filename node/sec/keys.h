/*
 * node/sec/keys.h: a node's Ed25519 identity and the cluster key, and the
 * files that hold them (formats in docs/security.md).
 *
 * The loaders refuse secrets that group or others may access (as ssh does)
 * instead of warning: a world-readable cluster key is a compromised
 * cluster, and a log line is easy to miss. The savers never leave a file
 * half-written or with a wider mode than asked (a temporary file renamed
 * over the old one), and never overwrite without being told to.
 *
 * Ownership: every key struct is the caller's; wipe it with its *_wipe
 * function when done (the loaders wipe their buffers and, on error, *out).
 * Threads: no shared state; the functions may run on any thread.
 */
#ifndef DS_NODE_SEC_KEYS_H
#define DS_NODE_SEC_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "node/sec/policy.h"

#define DS_PK_BYTES 32
#define DS_SK_BYTES 64
#define DS_CLUSTER_KEY_BYTES 32

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

#endif
