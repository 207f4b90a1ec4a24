/*
 * node/sec/internal.h: what the files of node/sec share and nobody else
 * uses: error messages into a caller's buffer, the rule for names on the
 * wire, and reading and writing small key files safely (files.c). Not part
 * of the API: include it only from the .c files of node/sec.
 */
#ifndef DS_NODE_SEC_INTERNAL_H
#define DS_NODE_SEC_INTERNAL_H

#include <stddef.h>
#include <string.h>
#include <sys/types.h>

/* printf into err[0..errlen) when err is non-NULL. */
void ds_sec_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 when s is min..field-1 printable ASCII characters without spaces (the
 * rule for names and addresses on the wire, node/wire/header.h). */
static inline int ds_sec_name_ok(const char *s, size_t min, size_t field)
{
    if (!s)
        return 0;
    size_t n = strnlen(s, field);
    if (n < min || n >= field)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* Read a small regular file into buf[0..cap) (NUL-terminated, *len bytes).
 * secret: refuse modes that let group or others in (-EPERM). A file of cap
 * bytes or more is -EINVAL. 0 or -errno, with one line in err. */
int ds_sec_read_file(const char *path, char *buf, size_t cap, size_t *len, int secret, char *err,
                     size_t errlen);

/* Create path with exactly `mode`. Without force: -EEXIST if it exists.
 * With force: a temporary file next to it, renamed over it, so the file is
 * never seen half-written or with a wider mode. 0 or -errno, with one line
 * in err. */
int ds_sec_write_file(const char *path, const char *data, size_t n, mode_t mode, int force,
                      char *err, size_t errlen);

#endif
