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

/* check-config's file-system and network checks: the key files load, the
 * dataset's four files are readable regular files, node.data_dir and
 * status.file's directory are (or can be created) writable, and
 * node.listen and status.listen can be bound now. */
int ds_preflight_all(const ds_conf *c, char *err, size_t err_len);

#endif
