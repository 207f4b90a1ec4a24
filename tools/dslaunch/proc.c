/*
 * tools/dslaunch/proc.c: children that cannot outlive dslaunch, commands
 * whose output we need, and free ports.
 *
 * A launcher that leaves training processes behind when it is killed is
 * worse than none: they hold ports, GPUs and data directories, and the next
 * run collides with them. So every child is started with
 * PR_SET_PDEATHSIG = SIGTERM: the kernel signals it when dslaunch dies, for
 * whatever reason, SIGKILL included. The setting only covers a parent that
 * dies after it is made, so the child then compares getppid() with the pid
 * dslaunch had before fork() and exits at once if we are already gone.
 * (PDEATHSIG follows the thread that forked, and dslaunch has one thread.)
 *
 * Each child gets a process group of its own, so a Ctrl-C at the terminal
 * reaches dslaunch only and dslaunch alone decides how the nodes are
 * stopped: one SIGTERM each, a grace period, then SIGKILL (local.c).
 *
 * exec failures are reported to the parent through a close-on-exec pipe: the
 * child writes its errno there if execv returns; a successful exec closes
 * the pipe with nothing written. So "no such file" is an error of the spawn
 * call, not a mysterious exit status 127 later.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/hostport.h"
#include "tools/dslaunch/dslaunch.h"

#define CAPTURE_MAX (4u << 20)

int ds_proc_exit_code(int wstatus)
{
    if (WIFSIGNALED(wstatus))
        return 128 + WTERMSIG(wstatus);
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    return 255;
}

/* In the child, between fork and exec: only async-signal-safe calls. */
static void child_setup(pid_t parent, int in_r, int out_w, int err_w, int status_w,
                        char *const argv[])
{
    int e;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent) {
        e = ESRCH;
        goto fail;
    }
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++)
        signal(s, SIG_DFL); /* errors for SIGKILL/SIGSTOP and RT gaps: harmless */
    int in = in_r >= 0 ? in_r : open("/dev/null", O_RDONLY);
    if (in < 0 || dup2(in, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) {
        e = errno;
        goto fail;
    }
    execv(argv[0], argv);
    e = errno;
fail:
    /* Best effort: if this write fails the parent sees EOF and a failed
     * child instead of a message. */
    if (write(status_w, &e, sizeof(e)) < 0)
        e = 0;
    _exit(127);
}

pid_t ds_proc_spawn(char *const argv[], int *out_fd, int *err_fd, char *err, size_t errlen)
{
    return ds_proc_spawn_io(argv, -1, NULL, -1, out_fd, err_fd, err, errlen);
}

pid_t ds_proc_spawn_io(char *const argv[], int in_fd, int *in_w, int out_file, int *out_fd,
                       int *err_fd, char *err, size_t errlen)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, ps[2] = {-1, -1}, pi[2] = {-1, -1};
    pid_t pid;
    int ret;
    if ((in_w && pipe2(pi, O_CLOEXEC) < 0) || (out_file < 0 && pipe2(po, O_CLOEXEC) < 0) ||
        pipe2(pe, O_CLOEXEC) < 0 || pipe2(ps, O_CLOEXEC) < 0) {
        ret = -errno;
        snprintf(err, errlen, "cannot run %s: pipe: %s", argv[0], strerror(-ret));
        goto close_pipes;
    }
    const pid_t parent = getpid();
    pid = fork();
    if (pid < 0) {
        ret = -errno;
        snprintf(err, errlen, "cannot run %s: fork: %s", argv[0], strerror(-ret));
        goto close_pipes;
    }
    if (pid == 0)
        child_setup(parent, in_w ? pi[0] : in_fd, out_file >= 0 ? out_file : po[1], pe[1], ps[1],
                    argv);

    if (po[1] >= 0)
        close(po[1]);
    if (pi[0] >= 0)
        close(pi[0]);
    close(pe[1]);
    close(ps[1]);
    po[1] = pe[1] = ps[1] = pi[0] = -1;
    int child_errno = 0;
    ssize_t r;
    do
        r = read(ps[0], &child_errno, sizeof(child_errno));
    while (r < 0 && errno == EINTR);
    close(ps[0]);
    ps[0] = -1;
    if (r > 0) {
        /* The exec failed: collect the child now, it has exited. */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        ret = -(child_errno ? child_errno : EIO);
        snprintf(err, errlen, "cannot run %s: %s", argv[0], strerror(-ret));
        goto close_pipes;
    }
    if (po[0] >= 0)
        fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    if (out_fd)
        *out_fd = po[0];
    *err_fd = pe[0];
    if (in_w)
        *in_w = pi[1];
    return pid;

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (pi[i] >= 0)
            close(pi[i]);
        if (po[i] >= 0)
            close(po[i]);
        if (pe[i] >= 0)
            close(pe[i]);
        if (ps[i] >= 0)
            close(ps[i]);
    }
    return ret;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Append what fd has to *buf (grown as needed, cut at CAPTURE_MAX). Returns
 * 1 while open, 0 at EOF, negative errno on error. */
static int drain(int fd, char **buf, size_t *len, size_t *cap)
{
    for (;;) {
        char tmp[8192];
        ssize_t r = read(fd, tmp, sizeof(tmp));
        if (r == 0)
            return 0;
        if (r < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 1 : errno == EINTR ? 1 : -errno;
        size_t keep = (size_t)r;
        if (*len + keep > CAPTURE_MAX)
            keep = CAPTURE_MAX - *len;
        if (*len + keep + 1 > *cap) {
            size_t nc = *cap ? *cap : 4096;
            while (nc < *len + keep + 1)
                nc *= 2;
            char *nb = realloc(*buf, nc);
            if (!nb)
                return -ENOMEM;
            *buf = nb;
            *cap = nc;
        }
        memcpy(*buf + *len, tmp, keep);
        *len += keep;
        (*buf)[*len] = '\0';
    }
}

int ds_proc_capture(char *const argv[], int timeout_ms, char **out, char **errtext, int *exit_code,
                    char *err, size_t errlen)
{
    return ds_proc_capture_io(argv, -1, -1, timeout_ms, out, errtext, exit_code, err, errlen);
}

int ds_proc_capture_io(char *const argv[], int in_fd, int out_file, int timeout_ms, char **out,
                       char **errtext, int *exit_code, char *err, size_t errlen)
{
    int fo = -1, fe;
    char *b[2] = {NULL, NULL};
    size_t len[2] = {0, 0}, cap[2] = {0, 0};
    *out = *errtext = NULL;
    pid_t pid = ds_proc_spawn_io(argv, in_fd, NULL, out_file, &fo, &fe, err, errlen);
    if (pid < 0)
        return (int)pid;
    int open_[2] = {fo >= 0, 1};
    int fds[2] = {fo, fe};
    int ret = 0;
    const int64_t deadline = now_ms() + timeout_ms;
    while (open_[0] || open_[1]) {
        struct pollfd p[2];
        int np = 0, map[2];
        for (int i = 0; i < 2; i++)
            if (open_[i]) {
                p[np].fd = fds[i];
                p[np].events = POLLIN;
                map[np++] = i;
            }
        const int64_t left = deadline - now_ms();
        if (left <= 0) {
            ret = -ETIMEDOUT;
            break;
        }
        int r = poll(p, (nfds_t)np, (int)left);
        if (r < 0 && errno != EINTR) {
            ret = -errno;
            break;
        }
        for (int k = 0; k < np && r > 0; k++) {
            if (!p[k].revents)
                continue;
            int d = drain(p[k].fd, &b[map[k]], &len[map[k]], &cap[map[k]]);
            if (d < 0) {
                ret = d;
                break;
            }
            if (d == 0)
                open_[map[k]] = 0;
        }
        if (ret < 0)
            break;
    }
    if (ret < 0)
        kill(pid, SIGKILL);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR)
        ;
    if (fo >= 0)
        close(fo);
    close(fe);
    *exit_code = ds_proc_exit_code(ws);
    if (ret < 0 && ret != -ETIMEDOUT) {
        snprintf(err, errlen, "%s: %s", argv[0], strerror(-ret));
        free(b[0]);
        free(b[1]);
        return ret;
    }
    for (int i = 0; i < 2; i++)
        if (!b[i] && !(b[i] = calloc(1, 1))) {
            free(b[0]);
            free(b[1]);
            snprintf(err, errlen, "out of memory");
            return -ENOMEM;
        }
    *out = b[0];
    *errtext = b[1];
    if (ret == -ETIMEDOUT)
        snprintf(err, errlen, "%s: no answer within %d ms (killed)", argv[0], timeout_ms);
    return ret;
}

int ds_port_range_free_at(const char *host, int base, int count)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const int kind = ds_host_kind_of(host);
    if (kind == DS_HOST_IPV4 && inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        sl = sizeof(*a4);
    } else if (kind == DS_HOST_IPV6 && inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        sl = sizeof(*a6);
    } else {
        return 0;
    }
    for (int p = base; p < base + count; p++) {
        if (p < 1 || p > 65535)
            return 0;
        int s = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0)
            return 0;
        if (ss.ss_family == AF_INET)
            a4->sin_port = htons((uint16_t)p);
        else
            a6->sin6_port = htons((uint16_t)p);
        /* No SO_REUSEADDR: a port still in TIME_WAIT from an earlier run
         * counts as busy, which only makes the choice more conservative. */
        int ok = bind(s, (struct sockaddr *)&ss, sl) == 0;
        close(s);
        if (!ok)
            return 0;
    }
    return 1;
}

int ds_port_range_free(int base, int count)
{
    return ds_port_range_free_at("127.0.0.1", base, count);
}

int ds_port_find_at(const char *host, int preferred, int count)
{
    const int lo = 1024, hi = 65535;
    if (count < 1 || count > hi - lo + 1)
        return -EINVAL;
    int p = preferred;
    /* Try up to 200 blocks: enough to step over a busy neighbourhood,
     * bounded so a full port space fails in milliseconds, not minutes. */
    for (int tries = 0; tries < 200; tries++) {
        if (p < lo || p + count - 1 > hi)
            p = lo;
        if (ds_port_range_free_at(host, p, count))
            return p;
        p += count;
    }
    return -EADDRINUSE;
}

int ds_port_find(int preferred, int count)
{
    return ds_port_find_at("127.0.0.1", preferred, count);
}
