/*
 * tests/helpers/tp_testutil.h: what the transport and net suites share.
 *
 * - tp_inbox: a queue that on_recv callbacks fill (taking ownership of each
 *   message) and test threads drain with a timeout.
 * - tp_pattern_*: seeded message contents, regenerated from (seed, index)
 *   so a receiver can check a message without keeping the original; the
 *   first 8 bytes carry the index.
 * - tp_child_*: child processes that cannot outlive the test: each child
 *   asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG),
 *   every pid is recorded, and tp_child_kill_all() (called from fixture
 *   teardowns and atexit) kills and reaps them all, so a failing or timed
 *   out test leaves nothing behind. The child's first stdout line is read
 *   with a deadline (a peer prints "ADDR host:port" when it listens).
 */
#ifndef DS_TESTS_TP_TESTUTIL_H
#define DS_TESTS_TP_TESTUTIL_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/splitmix.h"
#include "base/log.h"
#include "node/transport/transport.h"

/* ---- inbox ----------------------------------------------------------- */

typedef struct tp_item {
    struct tp_item *next;
    ds_transport_peer peer;
    const uint8_t *data;
    size_t len;
    void *base;
} tp_item;

typedef struct tp_inbox {
    pthread_mutex_t m;
    pthread_cond_t c;
    tp_item *head, *tail;
    size_t count;
} tp_inbox;

static inline void tp_inbox_init(tp_inbox *b)
{
    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->m, NULL);
    pthread_cond_init(&b->c, NULL);
}

static inline void tp_item_free(tp_item *it)
{
    if (it) {
        free(it->base);
        free(it);
    }
}

static inline void tp_inbox_destroy(tp_inbox *b)
{
    while (b->head) {
        tp_item *it = b->head;
        b->head = it->next;
        tp_item_free(it);
    }
    pthread_mutex_destroy(&b->m);
    pthread_cond_destroy(&b->c);
}

static inline void tp_inbox_push(tp_inbox *b, ds_transport_peer peer, const uint8_t *data,
                                 size_t len, void *base)
{
    tp_item *it = calloc(1, sizeof(*it));
    if (!it) {
        free(base);
        return;
    }
    it->peer = peer;
    it->data = data;
    it->len = len;
    it->base = base;
    pthread_mutex_lock(&b->m);
    if (b->tail)
        b->tail->next = it;
    else
        b->head = it;
    b->tail = it;
    b->count++;
    pthread_cond_signal(&b->c);
    pthread_mutex_unlock(&b->m);
}

/* on_recv for ds_transport: ctx is a tp_inbox. */
static inline void tp_inbox_on_recv(void *ctx, ds_transport_msg *msg)
{
    void *base = ds_transport_msg_take(msg);
    tp_inbox_push(ctx, msg->peer, msg->data, msg->len, base);
}

/* Pop one item, waiting up to timeout_ms. NULL on timeout. */
static inline tp_item *tp_inbox_pop(tp_inbox *b, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&b->m);
    while (!b->head) {
        if (pthread_cond_timedwait(&b->c, &b->m, &ts) == ETIMEDOUT)
            break;
    }
    tp_item *it = b->head;
    if (it) {
        b->head = it->next;
        if (!b->head)
            b->tail = NULL;
        b->count--;
        it->next = NULL;
    }
    pthread_mutex_unlock(&b->m);
    return it;
}

/* ---- patterns -------------------------------------------------------- */

static inline uint64_t tp_mix(uint64_t z)
{
    return ds_splitmix64_step(&z);
}

static inline void tp_pattern_fill(uint8_t *p, size_t len, uint64_t seed, uint64_t index)
{
    uint64_t s = tp_mix(seed ^ (index * 0x632be59bd9b4e019ull));
    size_t i = 0;
    for (; i < 8 && i < len; i++)
        p[i] = (uint8_t)(index >> (8 * i));
    for (; i + 8 <= len; i += 8) {
        s = tp_mix(s);
        memcpy(p + i, &s, 8);
    }
    s = tp_mix(s);
    for (; i < len; i++)
        p[i] = (uint8_t)(s >> (8 * (i & 7)));
}

/* Returns the index the message carries (UINT64_MAX if shorter than 8
 * bytes); *ok = 1 when the content matches the pattern of that index. */
static inline uint64_t tp_pattern_check(const uint8_t *p, size_t len, uint64_t seed, int *ok)
{
    uint64_t index = 0;
    if (len < 8) {
        *ok = 1;
        return UINT64_MAX;
    }
    for (int i = 7; i >= 0; i--)
        index = (index << 8) | p[i];
    uint64_t s = tp_mix(seed ^ (index * 0x632be59bd9b4e019ull));
    size_t i = 8;
    *ok = 1;
    for (; i + 8 <= len; i += 8) {
        s = tp_mix(s);
        if (memcmp(p + i, &s, 8)) {
            *ok = 0;
            return index;
        }
    }
    s = tp_mix(s);
    for (; i < len; i++)
        if (p[i] != (uint8_t)(s >> (8 * (i & 7)))) {
            *ok = 0;
            return index;
        }
    return index;
}

/* ---- done counters --------------------------------------------------- */

typedef struct tp_done {
    pthread_mutex_t m;
    pthread_cond_t c;
    unsigned expected, ok, timeouts, other;
    int last_error;
    uint64_t last_ms;   /* when the last callback ran */
} tp_done;

static inline void tp_done_init(tp_done *d)
{
    memset(d, 0, sizeof(*d));
    pthread_mutex_init(&d->m, NULL);
    pthread_cond_init(&d->c, NULL);
}

static inline void tp_done_cb(void *arg, int status)
{
    tp_done *d = arg;
    pthread_mutex_lock(&d->m);
    if (status == 0)
        d->ok++;
    else if (status == -ETIMEDOUT)
        d->timeouts++;
    else {
        d->other++;
        d->last_error = status;
    }
    d->last_ms = ds_now_ms();
    pthread_cond_broadcast(&d->c);
    pthread_mutex_unlock(&d->m);
}

/* Wait until n callbacks ran or timeout_ms passed; returns how many ran. */
static inline unsigned tp_done_wait(tp_done *d, unsigned n, int timeout_ms)
{
    uint64_t end = ds_now_ms() + (uint64_t)timeout_ms;
    pthread_mutex_lock(&d->m);
    for (;;) {
        unsigned got = d->ok + d->timeouts + d->other;
        uint64_t now = ds_now_ms();
        if (got >= n || now >= end) {
            pthread_mutex_unlock(&d->m);
            return got;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t wait = end - now < 50 ? end - now : 50;
        ts.tv_nsec += (long)wait * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&d->c, &d->m, &ts);
    }
}

/* ---- events ----------------------------------------------------------- */

typedef struct tp_events {
    pthread_mutex_t m;
    unsigned count[8];
    ds_transport_peer last_peer[8];
} tp_events;

static inline void tp_events_on_event(void *ctx, const ds_transport_event *ev)
{
    tp_events *e = ctx;
    pthread_mutex_lock(&e->m);
    if ((unsigned)ev->kind < 8) {
        e->count[ev->kind]++;
        e->last_peer[ev->kind] = ev->peer;
    }
    pthread_mutex_unlock(&e->m);
}

static inline unsigned tp_events_count(tp_events *e, int kind)
{
    pthread_mutex_lock(&e->m);
    unsigned n = e->count[kind];
    pthread_mutex_unlock(&e->m);
    return n;
}

/* ---- child processes -------------------------------------------------- */

#define TP_MAX_CHILDREN 16

typedef struct tp_child {
    pid_t pid;
    int out_fd;      /* read end of the child's stdout */
    int in_fd;       /* write end of the child's stdin */
} tp_child;

#define TP_CHILD_INIT {.pid = 0, .out_fd = -1, .in_fd = -1}

static pid_t tp_children[TP_MAX_CHILDREN];

static inline void tp_child_forget(pid_t pid)
{
    for (int i = 0; i < TP_MAX_CHILDREN; i++)
        if (tp_children[i] == pid)
            tp_children[i] = 0;
}

/* Kill and reap every child still recorded. Safe to call repeatedly. */
static inline void tp_child_kill_all(void)
{
    for (int i = 0; i < TP_MAX_CHILDREN; i++) {
        pid_t pid = tp_children[i];
        if (pid > 0) {
            kill(pid, SIGCONT);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            tp_children[i] = 0;
        }
    }
}

/* Start argv[0] (a path) with argv; its stdout comes back through a pipe.
 * Returns 0 or -errno. */
static inline int tp_child_spawn(tp_child *c, char *const argv[])
{
    int fds[2], ins[2];
    if (pipe2(fds, O_CLOEXEC))
        return -errno;
    if (pipe2(ins, O_CLOEXEC)) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        return -e;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        close(ins[0]);
        close(ins[1]);
        return -e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(99); /* the parent died before prctl took effect */
        dup2(fds[1], STDOUT_FILENO);
        dup2(ins[0], STDIN_FILENO);
        execv(argv[0], argv);
        _exit(98);
    }
    close(fds[1]);
    close(ins[0]);
    for (int i = 0; i < TP_MAX_CHILDREN; i++)
        if (tp_children[i] == 0) {
            tp_children[i] = pid;
            break;
        }
    static int atexit_done;
    if (!atexit_done) {
        atexit(tp_child_kill_all);
        atexit_done = 1;
    }
    c->pid = pid;
    c->out_fd = fds[0];
    c->in_fd = ins[1];
    return 0;
}

/* Write one command line to the child's stdin. */
static inline int tp_child_cmd(tp_child *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline int tp_child_cmd(tp_child *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof(line) - 1)
        return -EINVAL;
    line[n++] = '\n';
    return write(c->in_fd, line, (size_t)n) == n ? 0 : -EPIPE;
}

/* Read one line of the child's stdout within timeout_ms. Returns its length
 * or -ETIMEDOUT / -EPIPE. */
static inline int tp_child_readline(tp_child *c, char *buf, size_t n, int timeout_ms)
{
    size_t len = 0;
    uint64_t end = ds_now_ms() + (uint64_t)timeout_ms;
    while (len + 1 < n) {
        uint64_t now = ds_now_ms();
        if (now >= end)
            return -ETIMEDOUT;
        struct pollfd pf = {.fd = c->out_fd, .events = POLLIN};
        int r = poll(&pf, 1, (int)(end - now));
        if (r <= 0)
            continue;
        char ch;
        ssize_t k = read(c->out_fd, &ch, 1);
        if (k <= 0)
            return -EPIPE;
        if (ch == '\n')
            break;
        buf[len++] = ch;
    }
    buf[len] = 0;
    return (int)len;
}

/* Wait for the child's "ADDR host:port" line; copies the address. */
static inline int tp_child_addr(tp_child *c, char *addr, size_t n, int timeout_ms)
{
    char line[256];
    for (;;) {
        int r = tp_child_readline(c, line, sizeof(line), timeout_ms);
        if (r < 0)
            return r;
        if (!strncmp(line, "ADDR ", 5)) {
            size_t l = strlen(line + 5);
            if (l >= n)
                return -ENOSPC;
            memcpy(addr, line + 5, l + 1);
            return 0;
        }
    }
}

/* SIGKILL and reap one child. */
static inline void tp_child_kill(tp_child *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGCONT);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
        tp_child_forget(c->pid);
        c->pid = 0;
    }
    if (c->out_fd >= 0) {
        close(c->out_fd);
        c->out_fd = -1;
    }
    if (c->in_fd >= 0) {
        close(c->in_fd);
        c->in_fd = -1;
    }
}

/* Path of a helper binary from the environment (set by meson). */
static inline const char *tp_helper_path(const char *env)
{
    const char *p = getenv(env);
    return p && *p ? p : NULL;
}

#endif
