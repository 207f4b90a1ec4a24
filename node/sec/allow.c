/*
 * node/sec/allow.c: the allow-list (see allow.h).
 *
 * Entries are kept sorted by key, so a check is a binary search and a
 * duplicate key is found by comparing neighbours after one sort (and named
 * by both of its lines). The list is bounded (ALLOW_FILE_MAX bytes,
 * ALLOW_MAX_ENTRIES keys) so a wrong path cannot make a node read or
 * allocate without limit.
 */
#include "config.h"

#include "node/sec/allow.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "node/sec/internal.h"

#define ALLOW_FILE_MAX (64u << 20)
#define ALLOW_MAX_ENTRIES (1u << 20)

typedef struct allow_entry {
    uint8_t pk[DS_PK_BYTES];
    char name[DS_WIRE_NAME_MAX + 1]; /* "" = any name */
    int line;
} allow_entry;

struct ds_allowlist {
    allow_entry *e;
    size_t n;
};

static int entry_cmp(const void *a, const void *b)
{
    return memcmp(((const allow_entry *)a)->pk, ((const allow_entry *)b)->pk, DS_PK_BYTES);
}

int ds_allowlist_parse(ds_allowlist **out, const char *text, size_t len, const char *what,
                       char *err, size_t errlen)
{
    ds_allowlist *al = calloc(1, sizeof(*al));
    size_t cap = 0;
    int line = 0, rc;
    if (!al)
        return -ENOMEM;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        line++;
        const char *a = p, *b = eol;
        p = eol + (eol < end);
        const char *hash = memchr(a, '#', (size_t)(b - a));
        if (hash)
            b = hash;
        /* Split into at most three whitespace-separated tokens. */
        const char *tok[3];
        size_t tl[3];
        int nt = 0;
        for (const char *q = a; q < b && nt < 3;) {
            while (q < b && (*q == ' ' || *q == '\t' || *q == '\r'))
                q++;
            if (q >= b)
                break;
            tok[nt] = q;
            while (q < b && *q != ' ' && *q != '\t' && *q != '\r')
                q++;
            tl[nt] = (size_t)(q - tok[nt]);
            nt++;
        }
        if (nt == 0)
            continue;
        if (nt == 3) {
            ds_sec_seterr(err, errlen, "%s:%d: expected '<64 hex digits> [name]', found more", what,
                          line);
            rc = -EINVAL;
            goto out_free;
        }
        if (al->n == ALLOW_MAX_ENTRIES) {
            ds_sec_seterr(err, errlen, "%s:%d: more than %u keys", what, line, ALLOW_MAX_ENTRIES);
            rc = -EINVAL;
            goto out_free;
        }
        if (al->n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            allow_entry *ne = realloc(al->e, nc * sizeof(*ne));
            if (!ne) {
                rc = -ENOMEM;
                goto out_free;
            }
            al->e = ne;
            cap = nc;
        }
        allow_entry *e = &al->e[al->n];
        memset(e, 0, sizeof(*e));
        e->line = line;
        if (ds_pk_from_hex(e->pk, tok[0], tl[0]) != 0) {
            ds_sec_seterr(err, errlen, "%s:%d: '%.*s' is not a public key (64 hex digits)", what,
                          line, (int)(tl[0] > 70 ? 70 : tl[0]), tok[0]);
            rc = -EINVAL;
            goto out_free;
        }
        if (nt == 2) {
            char name[DS_WIRE_NAME_MAX + 2];
            size_t k = tl[1] < sizeof(name) - 1 ? tl[1] : sizeof(name) - 1;
            memcpy(name, tok[1], k);
            name[k] = '\0';
            if (!ds_sec_name_ok(name, 1, DS_WIRE_NAME_MAX + 1)) {
                ds_sec_seterr(err, errlen, "%s:%d: name '%.*s' is not 1..%d printable characters",
                              what, line, (int)(tl[1] > 70 ? 70 : tl[1]), tok[1], DS_WIRE_NAME_MAX);
                rc = -EINVAL;
                goto out_free;
            }
            memcpy(e->name, name, k + 1);
        }
        al->n++;
    }
    if (al->n > 1) {
        qsort(al->e, al->n, sizeof(*al->e), entry_cmp);
        for (size_t i = 1; i < al->n; i++)
            if (entry_cmp(&al->e[i - 1], &al->e[i]) == 0) {
                int l1 = al->e[i - 1].line, l2 = al->e[i].line;
                ds_sec_seterr(err, errlen, "%s:%d: duplicate key (also on line %d)", what,
                              l1 > l2 ? l1 : l2, l1 > l2 ? l2 : l1);
                rc = -EINVAL;
                goto out_free;
            }
    }
    *out = al;
    return 0;
out_free:
    ds_allowlist_free(&al);
    return rc;
}

int ds_allowlist_load(ds_allowlist **out, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        ds_sec_seterr(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    /* stat, not open: sizing the buffer must not block on a FIFO either
     * (ds_sec_read_file opens without blocking and checks again). */
    if (!S_ISREG(st.st_mode)) {
        ds_sec_seterr(err, errlen, "%s: not a regular file (%s)", path, ds_file_kind(st.st_mode));
        return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    }
    if ((uint64_t)st.st_size >= ALLOW_FILE_MAX) {
        ds_sec_seterr(err, errlen, "%s: %lld bytes; an allow-list holds less than %u MiB", path,
                      (long long)st.st_size, ALLOW_FILE_MAX >> 20);
        return -EINVAL;
    }
    size_t cap = (size_t)st.st_size + 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -ENOMEM;
    int rc = ds_sec_read_file(path, buf, cap, &len, 0, err, errlen);
    if (rc == 0)
        rc = ds_allowlist_parse(out, buf, len, path, err, errlen);
    free(buf);
    return rc;
}

int ds_allowlist_check(const ds_allowlist *al, const uint8_t pk[DS_PK_BYTES], const char *name)
{
    if (!al || !al->n) /* (an empty list has no array: bsearch must not see NULL) */
        return -EACCES;
    allow_entry key;
    memcpy(key.pk, pk, DS_PK_BYTES);
    const allow_entry *e = bsearch(&key, al->e, al->n, sizeof(*al->e), entry_cmp);
    if (!e)
        return -EACCES;
    if (e->name[0] && (!name || strcmp(e->name, name) != 0))
        return -EPERM;
    return 0;
}

size_t ds_allowlist_count(const ds_allowlist *al)
{
    return al ? al->n : 0;
}

void ds_allowlist_free(ds_allowlist **al)
{
    if (!al || !*al)
        return;
    free((*al)->e);
    free(*al);
    *al = NULL;
}
