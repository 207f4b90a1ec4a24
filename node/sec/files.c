/*
 * node/sec/files.c: reading and writing the small files that hold keys
 * (see internal.h), and the error-message helper of node/sec.
 *
 * Secrets are refused, not warned about, when group or others may access
 * them: a world-readable cluster key is a compromised cluster, and a log
 * line is easy to miss. Writes set the mode exactly (the umask may have
 * narrowed it) and fsync before the file is renamed into place, so a crash
 * leaves either the old file or the new one, never a torn secret.
 */
#include "config.h"

#include "node/sec/internal.h"

#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void ds_sec_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int ds_sec_read_file(const char *path, char *buf, size_t cap, size_t *len, int secret, char *err,
                            size_t errlen)
{
    struct stat st;
    char why[128];
    /* A FIFO or a device is refused without blocking in open(2). */
    int fd = ds_file_open_regular(path, &st, why, sizeof(why));
    if (fd < 0) {
        ds_sec_seterr(err, errlen, "%s: %s", path, why);
        return fd;
    }
    int rc = 0;
    if (secret && (st.st_mode & 077)) {
        rc = -EPERM;
        ds_sec_seterr(err, errlen,
                      "%s: mode %04o lets group/others access a secret key; run: chmod 600 %s",
                      path, (unsigned)(st.st_mode & 07777), path);
        goto out_close;
    }
    if ((uint64_t)st.st_size >= cap) {
        rc = -EINVAL;
        ds_sec_seterr(err, errlen, "%s: %lld bytes is too large for this kind of file", path,
                      (long long)st.st_size);
        goto out_close;
    }
    size_t got = 0;
    for (;;) {
        ssize_t k = read(fd, buf + got, cap - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = -errno;
            ds_sec_seterr(err, errlen, "%s: %s", path, strerror(-rc));
            goto out_close;
        }
        if (k == 0)
            break;
        got += (size_t)k;
        if (got == cap - 1) {
            rc = -EINVAL;
            ds_sec_seterr(err, errlen, "%s: too large for this kind of file", path);
            goto out_close;
        }
    }
    buf[got] = '\0';
    *len = got;
out_close:
    close(fd);
    return rc;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Without force, O_EXCL does the refusing, so there is no window between
 * a check and the create. */
int ds_sec_write_file(const char *path, const char *data, size_t n, mode_t mode, int force,
                             char *err, size_t errlen)
{
    int rc, fd;
    char tmp[PATH_MAX];
    if (!force) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0) {
            rc = -errno;
            if (rc == -EEXIST)
                ds_sec_seterr(err, errlen, "%s exists; use --force to overwrite it", path);
            else
                ds_sec_seterr(err, errlen, "%s: %s", path, strerror(-rc));
            return rc;
        }
        tmp[0] = '\0';
    } else {
        if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp)) {
            ds_sec_seterr(err, errlen, "%s: path too long", path);
            return -ENAMETOOLONG;
        }
        fd = mkostemp(tmp, O_CLOEXEC); /* mode 0600 */
        if (fd < 0) {
            rc = -errno;
            ds_sec_seterr(err, errlen, "%s: cannot create a temporary file: %s", path,
                          strerror(-rc));
            return rc;
        }
    }
    /* The umask may have narrowed the mode; set it exactly. */
    if (fchmod(fd, mode) != 0 || (rc = write_all(fd, data, n)) != 0 || fsync(fd) != 0) {
        rc = -errno;
        ds_sec_seterr(err, errlen, "%s: %s", path, strerror(-rc));
        goto out_unlink;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = -errno;
        ds_sec_seterr(err, errlen, "%s: %s", path, strerror(-rc));
        goto out_unlink;
    }
    fd = -1;
    if (tmp[0] && rename(tmp, path) != 0) {
        rc = -errno;
        ds_sec_seterr(err, errlen, "%s: %s", path, strerror(-rc));
        goto out_unlink;
    }
    return 0;
out_unlink:
    if (fd >= 0)
        close(fd);
    unlink(tmp[0] ? tmp : path);
    return rc ? rc : -EIO;
}
