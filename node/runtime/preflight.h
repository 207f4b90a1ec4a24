/*
 * node/runtime/preflight.h: what a node needs from the file system and the
 * network, checked before anything is trained, so a run that cannot keep
 * its results fails at once instead of after hours.
 *
 * `dsnode run` calls ds_preflight_outputs once the model's size is known;
 * `dsnode check-config` (without --offline) calls ds_preflight_all. Each
 * check returns 0, or a negative errno with a one-line message in err
 * that names the config key and the path.
 */
#ifndef DS_RUNTIME_PREFLIGHT_H
#define DS_RUNTIME_PREFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"

/* node.data_dir for `run`: created when missing (its parent must exist), a
 * directory, writable, and with room for model.bin (model_bytes reserved
 * with posix_fallocate on a probe file, then removed). */
int ds_preflight_outputs(const ds_conf *c, uint64_t model_bytes, char *err, size_t err_len);

/* The address this node tells peers to dial (docs/config.md,
 * node.advertise): node.advertise when set; else node.listen, unless its
 * host is a wildcard (0.0.0.0 or [::]): then the address of the interface
 * of the default route of that family (base/route.h) with node.listen's
 * port. Into out (n bytes; DS_HOSTPORT_MAX + 1 is enough). how (how_n
 * bytes) gets "" or where a found address came from ("eth0, the interface
 * of the IPv4 default route"). Returns 0, or a negative errno with a
 * message in err that names node.listen and asks for node.advertise. */
int ds_preflight_advertise(const ds_conf *c, char *out, size_t n, char *how, size_t how_n,
                           char *err, size_t err_len);

/* check-config's file-system and network checks: the key files load, the
 * dataset's four files are readable regular files, node.data_dir and
 * status.file's directory are (or can be created) writable, and
 * node.listen and status.listen can be bound now, and a wildcard
 * node.listen without node.advertise has an address to advertise
 * (ds_preflight_advertise). */
int ds_preflight_all(const ds_conf *c, char *err, size_t err_len);

#endif
