/*
 * node/status/file.c: status.file, the /status document on disk.
 *
 * The document is written to PATH.tmp, flushed (fsync) and renamed over
 * PATH, so a reader (dsviz, dslaunch, a test) always sees a whole
 * document, never a half written one, even after a crash of the host. The
 * status thread decides when (status.c: at most once per file_interval_ms,
 * only when something new was published, and once more at destroy); this
 * file does the writing. A failed write is counted (file_errors, also in
 * /metrics); the first failure of a run of failures is logged with its
 * reason, the rest rate-limited, and the first success after them says how
 * many there were, since a full disk would otherwise fail twice a second
 * for the rest of the run. A final write that fails is an error line.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/status/internal.h"

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int ds_status_file_check(const ds_status *st)
{
    int fd = open(st->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int e = -errno;
        ds_error(DS_STATUS_COMP, "status.file: cannot create %s: %s", st->tmp, strerror(-e));
        return e;
    }
    close(fd);
    unlink(st->tmp);
    return 0;
}

/* PATH.tmp, then rename over PATH. 0 or a negative errno; no .tmp is left
 * behind either way. */
static int replace(const ds_status *st)
{
    int fd = open(st->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int e = write_all(fd, st->json, st->json_len);
    if (e == 0 && fsync(fd) < 0)
        e = -errno;
    if (close(fd) < 0 && e == 0)
        e = -errno;
    if (e == 0 && rename(st->tmp, st->file) < 0)
        e = -errno;
    if (e < 0)
        unlink(st->tmp);
    return e;
}

int ds_status_file_write(ds_status *st)
{
    int e = ds_status_cached_json(st);
    if (e == 0)
        e = replace(st);
    st->file_last_ms = ds_now_ms();
    if (e < 0) {
        DS_STATUS_BUMP(st, file_errors);
        if (st->file_failing++ == 0)
            ds_warn(DS_STATUS_COMP, "cannot write %s: %s (retried; counted in file_errors)",
                    st->file, strerror(-e));
        else
            ds_log_rl(DS_LOG_WARN, DS_STATUS_COMP, "cannot write %s: %s", st->file,
                      strerror(-e));
        return e;
    }
    if (st->file_failing)
        ds_info(DS_STATUS_COMP, "%s written again after %llu failed writes", st->file,
                (unsigned long long)st->file_failing);
    st->file_failing = 0;
    st->file_gen = st->view_gen;
    DS_STATUS_BUMP(st, file_writes);
    return 0;
}

int ds_status_file_dirty(ds_status *st)
{
    ds_status_refresh(st);
    return st->view_gen != st->file_gen;
}
