/* base/file.c: see file.h. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

const char *ds_file_kind(mode_t mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode))
        return "a character device";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISLNK(mode))
        return "a symbolic link";
    return "an unknown kind of file";
}

/* Close fd (if open), say why, and return -e. */
static int refuse(int fd, int e, char *why, size_t why_len, const char *msg)
{
    if (why && why_len)
        snprintf(why, why_len, "%s", msg);
    if (fd >= 0)
        close(fd);
    return -e;
}

int ds_file_open_regular(const char *path, struct stat *st, char *why, size_t why_len)
{
    struct stat sb;
    char msg[96];
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return refuse(-1, e, why, why_len, strerror(e));
    }
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        return refuse(fd, e, why, why_len, strerror(e));
    }
    if (S_ISDIR(sb.st_mode))
        return refuse(fd, EISDIR, why, why_len, strerror(EISDIR));
    if (!S_ISREG(sb.st_mode)) {
        snprintf(msg, sizeof(msg), "not a regular file (%s)", ds_file_kind(sb.st_mode));
        return refuse(fd, EINVAL, why, why_len, msg);
    }
    /* A regular file never blocks a read, but callers may hand the
     * descriptor on (gzdopen) and should see an ordinary one. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        return refuse(fd, e, why, why_len, strerror(e));
    }
    if (st)
        *st = sb;
    return fd;
}
