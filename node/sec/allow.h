/*
 * node/sec/allow.h: the allow-list, the public keys a cluster admits.
 *
 * One entry per line: `<64 hex> [name]`; '#' starts a comment, blank lines
 * are ignored (a .pub file written by keygen is one such line). When an
 * entry has a name, a peer presenting that key must also present that
 * name. A malformed line, a bad name or a duplicate key fails the whole
 * list with "what:line: ..." rather than skipping it: a list that admits
 * less than its operator wrote is a silent outage, one that admits more is
 * a breach.
 *
 * Ownership: ds_allowlist is opaque; the caller owns it and frees it with
 * ds_allowlist_free. Threads: immutable once parsed, so any number of
 * threads may call ds_allowlist_check on one list at once.
 */
#ifndef DS_NODE_SEC_ALLOW_H
#define DS_NODE_SEC_ALLOW_H

#include <stddef.h>
#include <stdint.h>

#include "node/sec/keys.h"

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

#endif
