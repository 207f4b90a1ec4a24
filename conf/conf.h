/*
 * conf/conf.h: dsnode's configuration (design §8).
 *
 * A configuration is one plain struct, ds_conf, generated from the key list
 * in conf/keys.h: one nested struct per ini section, one field per key, so
 * code reads c->train.lr, c->gossip.timeout_ms, c->cluster.seeds[i]. Nothing
 * in it points to the heap: a ds_conf can be copied with memcpy, compared
 * with memcmp (every setter zero-fills unused bytes), and needs no free.
 *
 * Field types (consumers rely on these exactly):
 *   str       char key[DS_CONF_STR_MAX]            NUL-terminated
 *   int       int64_t key
 *   float     double key                           always finite
 *   bool      bool key
 *   enum      enum <type> key                      a value of the key's list
 *                                                  (conf/keys.h names the list
 *                                                  and its enum type)
 *   int list  int64_t key[DS_CONF_LIST_MAX]; int key_count;
 *   str list  char key[DS_CONF_LIST_MAX][DS_CONF_STR_MAX]; int key_count;
 *
 * The usual sequence (dsnode run / check-config):
 *   ds_conf c;  char err[DS_CONF_ERR_MAX];
 *   ds_conf_defaults(&c);
 *   ds_conf_load(&c, path, err, sizeof err);      stops at the first error
 *   ds_conf_set(&c, "train.lr=0.1", err, sizeof err);   once per --set
 *   ds_conf_resolve_paths(&c, err, sizeof err);   relative paths left: cwd
 *   ds_conf_check(&c, err, sizeof err);           cross-key rules
 * Every error is ONE line in err, "FILE:LINE: section.key: expected <what>,
 * found '<text>'" and friends (docs/config.md lists them), and a failed call
 * leaves *c exactly as it was.
 *
 * An enum key is parsed once, here: its field holds the C enum of the module
 * that gives the choices a meaning (c->sparsify.method is an enum
 * ds_sparsify_method, c->security.mode an enum ds_sec_mode), so consumers
 * use the value as it is and never parse the name again.
 *
 * Relative paths (the keys keys.h marks PATH) are made absolute while the
 * configuration is built: ds_conf_load resolves those the file writes
 * against the file's directory, and ds_conf_resolve_paths the rest (the
 * defaults, --set values) against the working directory. So a config that
 * check-config printed names the same files from wherever it is run
 * (docs/config.md).
 */
#ifndef DS_CONF_CONF_H
#define DS_CONF_CONF_H

#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conf/keys.h"

#define DS_CONF_STR_MAX 256  /* bytes of a str field, NUL included */
#define DS_CONF_LIST_MAX 16  /* items of a list field */
#define DS_CONF_LINE_MAX 8192 /* longest line of a config file */
#define DS_CONF_FILE_MAX (1 << 20) /* largest config file, bytes */
#define DS_CONF_ERR_MAX 2048 /* an err buffer this large never truncates */

/* The struct, generated from conf/keys.h. */
#define DS_CONF_FIELD_STR(sec, key, def, check, help) char key[DS_CONF_STR_MAX];
#define DS_CONF_FIELD_INT(sec, key, def, min, max, help) int64_t key;
#define DS_CONF_FIELD_FLOAT(sec, key, def, min, max, bounds, help) double key;
#define DS_CONF_FIELD_BOOL(sec, key, def, help) bool key;
#define DS_CONF_FIELD_ENUM(sec, key, def, etype, list, help) etype key;
#define DS_CONF_FIELD_ILIST(sec, key, def, imin, imax, cmin, cmax, help) \
    int64_t key[DS_CONF_LIST_MAX]; \
    int key##_count;
#define DS_CONF_FIELD_SLIST(sec, key, def, check, cmin, cmax, help) \
    char key[DS_CONF_LIST_MAX][DS_CONF_STR_MAX]; \
    int key##_count;
#define DS_CONF_FIELD_(type, sec, key, def, ...) DS_CONF_FIELD_##type(sec, key, def, __VA_ARGS__)
#define DS_CONF_STRUCT_SECTION_(sec, X) struct ds_conf_##sec { DS_CONF_KEYS_##sec(X) } sec;

typedef struct ds_conf {
    DS_CONF_SECTIONS(DS_CONF_STRUCT_SECTION_, DS_CONF_FIELD_)
} ds_conf;

/* Fill *c with every key's default (zeroing all bytes first). */
void ds_conf_defaults(ds_conf *c);

/* Load the ini file at path over *c: keys the file names replace what *c
 * holds, the others keep it. Returns 0, or a negative errno with ONE line in
 * err (err_len bytes, may be NULL/0): -ENOENT, -EACCES, -EISDIR, ... when the
 * file cannot be read, -EFBIG above DS_CONF_FILE_MAX, -EINVAL for content.
 * Stops at the first error; on any error *c is unchanged (the file is loaded
 * into a copy). path and err are borrowed for the call.
 *
 * A relative value the file gives a path key becomes absolute against the
 * directory holding the file (realpath of that directory; "./" prefixes
 * dropped, "." is the directory itself); a result longer than the key holds
 * is an error at the key's line. Empty and absolute values are kept.
 *
 * Not thread-safe against other users of inih in the process: it sets inih's
 * runtime options for the duration of the parse and restores them. */
int ds_conf_load(ds_conf *c, const char *path, char *err, size_t err_len);

/* Apply one "section.key=value" (the --set override; blanks around the key
 * and the value are ignored). 0 or -EINVAL with ONE line in err, prefixed
 * "--set <assignment>: "; on error *c is unchanged. */
int ds_conf_set(ds_conf *c, const char *assignment, char *err, size_t err_len);

/* Make every relative value of a path key absolute against the working
 * directory: those that did not come from a file (defaults such as
 * node.data_dir = ".", --set values), the way a shell user reads them.
 * ds_conf_load has resolved the file's own. 0 or a negative errno with ONE
 * line in err, naming the key; on error *c is unchanged. */
int ds_conf_resolve_paths(ds_conf *c, char *err, size_t err_len);

/* Validate *c: every key against its own constraint (a struct filled by code
 * rather than by the loader gets the same checks) and then the rules that
 * tie keys together:
 *   gossip.mix = crossover needs sparsify.method = none (dense only);
 *   security.mode = none needs node.listen and every cluster.seeds entry on
 *   loopback (127.0.0.0/8, ::1 or localhost);
 *   train.nesterov = true needs train.momentum > 0;
 *   train.warmup_steps must be at most train.steps.
 * 0 or -EINVAL with ONE line in err. */
int ds_conf_check(const ds_conf *c, char *err, size_t err_len);

/* train.device: "auto" (DS_CONF_DEVICE_AUTO) or an index in
 * 0..DS_CONF_DEVICE_MAX into *device (may be NULL: only check). 0 or
 * -EINVAL. */
#define DS_CONF_DEVICE_AUTO (-1)
#define DS_CONF_DEVICE_MAX 1023
int ds_conf_device(const char *s, int *device);

/* Write *c as ini text (every key, in list order) that ds_conf_load turns
 * back into an identical struct when loaded over ds_conf_defaults. 0, -EIO
 * when writing to out failed, -ENOMEM, or -EINVAL (after writing the rest) when a
 * field cannot be formatted (text without its NUL, a list count out of
 * range, an enum value outside its list): that key is written as
 * "key = <corrupt value>", which the loader refuses. out is borrowed. */
int ds_conf_dump(const ds_conf *c, FILE *out);

/* One line per key: section.key, type, default, constraint, help. */
void ds_conf_help(FILE *out);

#endif
