/*
 * tests/helpers/conf_enum_keys.h: every enum key of conf/keys.h with its
 * choices, for the tests (test_conf, test_conf_choices).
 *
 * The table is generated from the same X-macro lists that conf's key table
 * and the consuming modules are generated from, so a test that walks it
 * walks every choice the loader accepts, and a new enum key or choice is
 * picked up without editing a test. Include once per test program: it
 * defines static data.
 */
#ifndef DS_TESTS_CONF_ENUM_KEYS_H
#define DS_TESTS_CONF_ENUM_KEYS_H

#include <stddef.h>

#include "conf/conf.h"

/* One enum key and its choices. */
typedef struct enum_key {
    const char *key;              /* section.key */
    const char *const *names;     /* the choices, in the list's order */
    const int *values;
    size_t n;
    int (*get)(const ds_conf *c); /* the field, as an int */
} enum_key;

#define EK_SECTION_(sec, X) DS_CONF_KEYS_##sec(X)
#define EK_NAME_(e, v, name) name,
#define EK_VALUE_(e, v, name) (int)(e),
#define EK_DEFS_STR(...)
#define EK_DEFS_INT(...)
#define EK_DEFS_FLOAT(...)
#define EK_DEFS_BOOL(...)
#define EK_DEFS_ILIST(...)
#define EK_DEFS_SLIST(...)
#define EK_DEFS_ENUM(sec, key, def, etype, list, help) \
    static const char *const ek_names_##sec##_##key[] = {list(EK_NAME_)}; \
    static const int ek_values_##sec##_##key[] = {list(EK_VALUE_)}; \
    static int ek_get_##sec##_##key(const ds_conf *c) { return (int)c->sec.key; }
#define EK_DEFS_(type, sec, key, def, ...) EK_DEFS_##type(sec, key, def, __VA_ARGS__)
DS_CONF_SECTIONS(EK_SECTION_, EK_DEFS_)

#define EK_ROW_STR(...)
#define EK_ROW_INT(...)
#define EK_ROW_FLOAT(...)
#define EK_ROW_BOOL(...)
#define EK_ROW_ILIST(...)
#define EK_ROW_SLIST(...)
#define EK_ROW_ENUM(sec, key, def, etype, list, help) \
    {#sec "." #key, ek_names_##sec##_##key, ek_values_##sec##_##key, \
     sizeof(ek_values_##sec##_##key) / sizeof(int), ek_get_##sec##_##key},
#define EK_ROW_(type, sec, key, def, ...) EK_ROW_##type(sec, key, def, __VA_ARGS__)
static const enum_key enum_keys[] = {DS_CONF_SECTIONS(EK_SECTION_, EK_ROW_)};
#define NENUM (sizeof(enum_keys) / sizeof(enum_keys[0]))

#endif
