/*
 * node/status/status.c: the status thread and the life of a ds_status (see
 * status.h).
 *
 * Why a thread of its own, and why a copy. The training thread must never
 * wait for a client: publish copies the snapshot under a mutex (about
 * 100 KB, a few microseconds) and returns. The status thread takes its own
 * copy only when the generation changed, renders the JSON and the
 * Prometheus body once per generation (cached), and serves every request
 * from those, so a client asking 1000 times a second costs a cached page,
 * not a render.
 *
 * The thread sleeps in poll() on two descriptors: the HTTP server's (it
 * becomes readable when a client needs something, http.c) and a pipe that
 * destroy writes to. publish does not wake it (publish must stay a
 * memcpy), so the thread looks for news at least every
 * max(file_interval_ms, 20 ms) while there is a file to keep current.
 *
 * The wait record (ds_status_set_wait) is news the same way, with its own
 * generation: refresh puts it into the taken copy, and while one is shown
 * restamps the document every DS_STATUS_WAIT_TICK_MS, so its for_s grows
 * in the file and in /status (one render per tick, not per request)
 * although nothing is published.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/status/internal.h"

void ds_status_opts_default(ds_status_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_conns = 16;
    o->max_conns_per_ip = 8;
    o->max_request = 8192;
    o->request_timeout_ms = 5000;
    o->write_timeout_ms = 5000;
    o->file_interval_ms = 500;
}

/* ---- the caches (status thread) ---- */

void ds_status_refresh(ds_status *st)
{
    const uint64_t now = ds_unix_ms();
    int changed = 0;
    pthread_mutex_lock(&st->mu);
    if (st->pub_gen != st->cur_gen) {
        memcpy(st->cur, st->pub, sizeof(*st->cur));
        st->cur_gen = st->pub_gen;
        st->cur_unix_ms = st->pub_unix_ms;
        changed = 1;
    }
    if (changed || st->wait_gen != st->cur_wait_gen) {
        st->cur->wait = st->wait; /* the record wins over a published one */
        st->cur_wait_gen = st->wait_gen;
        changed = 1;
    }
    const uint64_t wait_ms = st->wait_unix_ms;
    pthread_mutex_unlock(&st->mu);
    const int waiting = st->cur->wait.kind != DS_WAIT_NONE;
    if (waiting && now >= st->view_unix_ms + DS_STATUS_WAIT_TICK_MS)
        changed = 1;
    if (!changed)
        return;
    st->view_gen++;
    uint64_t t = st->cur_unix_ms > wait_ms ? st->cur_unix_ms : wait_ms;
    if (waiting && now > t)
        t = now; /* for_s as of now */
    st->view_unix_ms = t;
}

int ds_status_cached_json(ds_status *st)
{
    ds_status_refresh(st);
    if (st->json && st->json_gen == st->view_gen)
        return 0;
    free(st->json);
    st->json = NULL;
    int e = ds_status_render_json(st->cur, st->view_unix_ms, &st->json, &st->json_len);
    if (e == 0)
        st->json_gen = st->view_gen;
    return e;
}

int ds_status_cached_metrics(ds_status *st)
{
    ds_status_refresh(st);
    if (st->metrics && st->metrics_gen == st->view_gen)
        return 0;
    free(st->metrics);
    st->metrics = NULL;
    int e = ds_status_render_metrics(st->cur, &st->metrics, &st->metrics_len);
    if (e == 0)
        st->metrics_gen = st->view_gen;
    return e;
}

/* ---- the thread ---- */

/* How long poll may sleep: until the HTTP server's next timer, and while
 * there is a file, until it is due (or the next look for news). */
static int64_t sleep_ms(ds_status *st, uint64_t now)
{
    int64_t timeout = 1000;
    if (st->http)
        timeout = ds_status_http_timeout(st, now, timeout);
    if (st->file) {
        const uint64_t due = st->file_last_ms + (uint64_t)st->o.file_interval_ms;
        const int64_t left = due > now ? (int64_t)(due - now) : 0;
        const int64_t check = st->o.file_interval_ms > 20 ? st->o.file_interval_ms : 20;
        if (ds_status_file_dirty(st)) {
            if (left < timeout)
                timeout = left;
        } else if (check < timeout) {
            timeout = check;
        }
    }
    return timeout;
}

static void *status_main(void *arg)
{
    ds_status *st = arg;
    pthread_setname_np(pthread_self(), "ds-status");
    for (;;) {
        pthread_mutex_lock(&st->mu);
        const int stop = st->stop;
        pthread_mutex_unlock(&st->mu);
        if (stop)
            break;
        struct pollfd *pfd = st->pfd;
        pfd[0] = (struct pollfd){.fd = st->wake[0], .events = POLLIN};
        const size_t nh = st->http ? ds_status_http_pollfds(st, pfd + 1) : 0;
        const int n = poll(pfd, (nfds_t)(1 + nh), (int)sleep_ms(st, ds_now_ms()));
        if (n < 0 && errno != EINTR) {
            ds_log_rl(DS_LOG_WARN, DS_STATUS_COMP, "poll: %s", strerror(errno));
            const struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (n > 0 && (pfd[0].revents & POLLIN)) {
            char junk[64];
            while (read(st->wake[0], junk, sizeof(junk)) > 0) {
            }
        }
        const uint64_t now = ds_now_ms();
        if (st->http)
            ds_status_http_run(st, now, pfd + 1, n > 0 ? nh : 0);
        if (st->file && now >= st->file_last_ms + (uint64_t)st->o.file_interval_ms &&
            ds_status_file_dirty(st))
            ds_status_file_write(st);
    }
    return NULL;
}

/* ---- life cycle ---- */

static void status_free(ds_status *st)
{
    ds_status_http_stop(st);
    if (st->wake[0] >= 0)
        close(st->wake[0]);
    if (st->wake[1] >= 0)
        close(st->wake[1]);
    pthread_mutex_destroy(&st->mu);
    free(st->pfd);
    free(st->pub);
    free(st->cur);
    free(st->json);
    free(st->metrics);
    free(st->listen);
    free(st->file);
    free(st->tmp);
    free(st);
}

static int opts_valid(const ds_status_opts *o)
{
    return o->max_conns >= 1 && o->max_conns <= 4096 && o->max_conns_per_ip >= 0 &&
           o->max_request >= 64 && o->max_request <= ((size_t)1 << 20) &&
           o->request_timeout_ms >= 1 && o->write_timeout_ms >= 1 && o->file_interval_ms >= 0;
}

/* Copy the option strings; check the file's directory. */
static int take_opts(ds_status *st, const ds_status_opts *o, int want_http, int want_file)
{
    st->o = *o;
    if (want_http && !(st->listen = strdup(o->listen)))
        return -ENOMEM;
    if (want_file) {
        const size_t n = strlen(o->file) + 5;
        st->file = strdup(o->file);
        st->tmp = malloc(n);
        if (!st->file || !st->tmp)
            return -ENOMEM;
        snprintf(st->tmp, n, "%s.tmp", o->file);
        const int e = ds_status_file_check(st);
        if (e < 0)
            return e;
    }
    st->o.listen = st->listen;
    st->o.file = st->file;
    st->o.initial = NULL; /* copied into pub */
    return 0;
}

int ds_status_create_opts(ds_status **out, const ds_status_opts *o)
{
    *out = NULL;
    const int want_http = o->listen && o->listen[0];
    const int want_file = o->file && o->file[0];
    if (!want_http && !want_file)
        return 0;
    if (!opts_valid(o)) {
        ds_error(DS_STATUS_COMP, "invalid status server options");
        return -EINVAL;
    }
    ds_status *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->wake[0] = st->wake[1] = -1;
    pthread_mutex_init(&st->mu, NULL);
    int e = -ENOMEM;
    st->pub = malloc(sizeof(*st->pub));
    st->cur = malloc(sizeof(*st->cur));
    if (!st->pub || !st->cur)
        goto fail_free;
    if (o->initial)
        memcpy(st->pub, o->initial, sizeof(*st->pub));
    else
        ds_status_snapshot_init(st->pub);
    st->pub_gen = 1; /* the thread starts at generation 0: it copies this */
    st->pub_unix_ms = ds_unix_ms();
    if ((e = take_opts(st, o, want_http, want_file)) < 0)
        goto fail_free;
    if (pipe2(st->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
        e = -errno;
        goto fail_free;
    }
    if (want_http && (e = ds_status_http_start(st)) < 0)
        goto fail_free;
    st->pfd = calloc(1 + (st->http ? ds_status_http_max_pollfds(st) : 0), sizeof(*st->pfd));
    if (!st->pfd) {
        e = -ENOMEM;
        goto fail_free;
    }
    if ((e = pthread_create(&st->thread, NULL, status_main, st)) != 0) {
        e = -e;
        ds_error(DS_STATUS_COMP, "cannot start the status thread: %s", strerror(-e));
        goto fail_free;
    }
    st->thread_up = 1;
    if (want_http)
        ds_info(DS_STATUS_COMP, "serving /status and /metrics on http://%s",
                ds_status_http_addr(st));
    *out = st;
    return 0;

fail_free:
    status_free(st);
    return e;
}

int ds_status_create(ds_status **out, const char *listen, const char *file)
{
    ds_status_opts o;
    ds_status_opts_default(&o);
    o.listen = listen;
    o.file = file;
    return ds_status_create_opts(out, &o);
}

void ds_status_publish(ds_status *st, const ds_status_snapshot *s)
{
    if (!st || !s)
        return;
    const uint64_t t = ds_unix_ms();
    pthread_mutex_lock(&st->mu);
    memcpy(st->pub, s, sizeof(*s));
    st->pub_gen++;
    st->pub_unix_ms = t;
    st->stats.publishes++;
    pthread_mutex_unlock(&st->mu);
}

void ds_status_set_wait(ds_status *st, const ds_status_wait *w)
{
    if (!st || !w)
        return;
    const uint64_t t = ds_unix_ms();
    pthread_mutex_lock(&st->mu);
    st->wait = *w;
    if (!st->wait.since_unix_ms)
        st->wait.since_unix_ms = t;
    st->wait_gen++;
    st->wait_unix_ms = t;
    pthread_mutex_unlock(&st->mu);
}

void ds_status_clear_wait(ds_status *st)
{
    if (!st)
        return;
    const uint64_t t = ds_unix_ms();
    pthread_mutex_lock(&st->mu);
    if (st->wait.kind != DS_WAIT_NONE) {
        memset(&st->wait, 0, sizeof(st->wait));
        st->wait_gen++;
        st->wait_unix_ms = t;
    }
    pthread_mutex_unlock(&st->mu);
}

int ds_status_addr(const ds_status *st, char *buf, size_t n)
{
    if (!st || !st->http)
        return -ENOENT;
    const int w = snprintf(buf, n, "%s", ds_status_http_addr(st));
    return w < 0 || (size_t)w >= n ? -ENOSPC : 0;
}

void ds_status_stats_get(ds_status *st, ds_status_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    pthread_mutex_unlock(&st->mu);
}

void ds_status_destroy(ds_status **pst)
{
    ds_status *st = pst ? *pst : NULL;
    if (!st)
        return;
    *pst = NULL;
    if (st->thread_up) {
        pthread_mutex_lock(&st->mu);
        st->stop = 1;
        pthread_mutex_unlock(&st->mu);
        const char one = 1;
        ssize_t w = write(st->wake[1], &one, 1);
        (void)w;
        pthread_join(st->thread, NULL);
    }
    /* The thread is gone: its fields are ours. The last state (done,
     * stopped) must reach the file even inside the rate limit. */
    if (st->file && ds_status_file_dirty(st) && ds_status_file_write(st) < 0)
        ds_error(DS_STATUS_COMP, "%s: the final status was not written; it shows an earlier state",
                 st->file);
    status_free(st);
}
