/*
 * tools/dsviz/json.h: a small, bounded JSON reader (RFC 8259) for the
 * status documents dsviz draws and the tests that check them.
 *
 * ds_jdoc_parse turns a whole text into a tree it owns; the accessors
 * below walk it and never fail on a wrong type or a missing key (they
 * return NULL or the default), so code reading a document written by
 * someone else checks each value once, where it uses it.
 *
 * Bounds: input at most DS_JSON_MAX_INPUT bytes, nesting at most
 * DS_JSON_MAX_DEPTH, at most DS_JSON_MAX_VALUES values. Strings are
 * decoded (escapes, surrogate pairs) to UTF-8; input that is not valid
 * UTF-8, a \u0000 escape, a lone surrogate, trailing text, or a number
 * outside double range is an error with line and column.
 */
#ifndef DS_TOOLS_DSVIZ_JSON_H
#define DS_TOOLS_DSVIZ_JSON_H

#include <stddef.h>

#define DS_JSON_MAX_INPUT ((size_t)16 << 20)
#define DS_JSON_MAX_DEPTH 64
#define DS_JSON_MAX_VALUES ((size_t)1 << 20)

enum ds_jtype { DS_JNULL = 0, DS_JBOOL, DS_JNUM, DS_JSTR, DS_JARR, DS_JOBJ };

typedef struct ds_jdoc ds_jdoc;
typedef struct ds_jv ds_jv; /* a value inside a ds_jdoc */

/* Parse text[0..len). On success *out receives the document (caller owns;
 * ds_jdoc_free). Returns 0, -EINVAL (syntax or bound; err holds
 * "LINE:COL: what"), or -ENOMEM. */
int ds_jdoc_parse(const char *text, size_t len, ds_jdoc **out, char *err, size_t err_len)
    __attribute__((warn_unused_result));

/* NULL-safe; clears *d. */
void ds_jdoc_free(ds_jdoc **d);

/* The top-level value; valid until ds_jdoc_free. */
const ds_jv *ds_jdoc_root(const ds_jdoc *d);

/* Every accessor accepts NULL. */
enum ds_jtype ds_jv_type(const ds_jv *v);       /* DS_JNULL for NULL */
/* Object member `key` (the first, if repeated); NULL if v is not an object
 * or has no such key. */
const ds_jv *ds_jv_get(const ds_jv *v, const char *key);
/* Array element or object member value i (in document order). */
const ds_jv *ds_jv_at(const ds_jv *v, size_t i);
/* Key of object member i; NULL otherwise. */
const char *ds_jv_key_at(const ds_jv *v, size_t i);
/* Elements of an array or members of an object; 0 otherwise. */
size_t ds_jv_len(const ds_jv *v);
/* The number, or dflt when v is not a number. */
double ds_jv_num(const ds_jv *v, double dflt);
/* The string (NUL-terminated UTF-8), or dflt when v is not a string. */
const char *ds_jv_str(const ds_jv *v, const char *dflt);
/* 1/0 for true/false, dflt otherwise. */
int ds_jv_bool(const ds_jv *v, int dflt);

/* Shorthands: ds_jv_num(ds_jv_get(v, key), dflt), ... */
double ds_jv_get_num(const ds_jv *v, const char *key, double dflt);
const char *ds_jv_get_str(const ds_jv *v, const char *key, const char *dflt);

#endif
