/*
 * node/status/internal.h: what the files of node/status share and nobody
 * else sees: the server's struct, the text helpers, and the hooks between
 * the status thread (status.c), the HTTP server (http.c) and the file
 * writer (file.c).
 *
 * Threads: publish, stats_get and create/destroy run on the caller's
 * threads and touch only the fields marked "mu"; every other field belongs
 * to the status thread (and to destroy, after the thread is joined).
 */
#ifndef DS_NODE_STATUS_INTERNAL_H
#define DS_NODE_STATUS_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/clock.h"
#include "node/status/status.h"

#define DS_STATUS_COMP "status"

typedef struct ds_status_http ds_status_http;

struct ds_status {
    ds_status_opts o;
    char *listen, *file, *tmp;   /* copies of the option strings */
    int wake[2];                 /* destroy -> status thread */
    pthread_t thread;
    int thread_up;

    pthread_mutex_t mu;          /* guards pub, pub_gen, pub_unix_ms, wait, wait_gen,
                                  * wait_unix_ms, stop, stats */
    ds_status_snapshot *pub;
    uint64_t pub_gen, pub_unix_ms;
    ds_status_wait wait;         /* ds_status_set_wait's record */
    uint64_t wait_gen, wait_unix_ms;
    int stop;
    ds_status_stats stats;

    /* status thread only */
    ds_status_snapshot *cur;     /* the last published snapshot, taken */
    uint64_t cur_gen, cur_unix_ms;
    uint64_t cur_wait_gen;       /* the wait record cur->wait holds */
    uint64_t view_gen;           /* bumped when what cur renders to changes:
                                  * a publish, a wait set or cleared, a shown
                                  * wait's tick */
    uint64_t view_unix_ms;       /* and the document's time_unix_ms */
    char *json, *metrics;        /* rendered from cur, once per view_gen */
    size_t json_len, metrics_len;
    uint64_t json_gen, metrics_gen;
    uint64_t file_gen, file_last_ms;
    uint64_t file_failing; /* consecutive failed writes of status.file */
    ds_status_http *http;        /* NULL: no HTTP */
    struct pollfd *pfd;          /* the wake pipe, then the HTTP server's */
};

/* Add one to the server counter `field` (under mu). */
#define DS_STATUS_BUMP(st, field) \
    do { \
        pthread_mutex_lock(&(st)->mu); \
        (st)->stats.field++; \
        pthread_mutex_unlock(&(st)->mu); \
    } while (0)

/* ---- status.c: the caches (status thread) ---- */

/* Take the newest published snapshot and wait record into cur (bumping
 * view_gen when the document changes). */
void ds_status_refresh(ds_status *st);

/* Make st->json / st->metrics the rendering of the newest published
 * snapshot. 0 or -ENOMEM (the previous rendering is then gone). */
int ds_status_cached_json(ds_status *st);
int ds_status_cached_metrics(ds_status *st);

/* ---- json.c / prom.c: text ---- */

/* Length of the valid UTF-8 sequence at s[0..n), 0 if it is not one
 * (overlongs, surrogates and values past U+10FFFF are not valid). */
size_t ds_status_utf8_len(const unsigned char *s, size_t n);

/* The value of descriptor i of group `gi` of s, as a double (NS in
 * seconds). */
double ds_status_value_d(const ds_status_snapshot *s, uint32_t gi, uint32_t i);

/* The server's own counters as Prometheus text, appended to the cached
 * page per request. Same contract as ds_status_render_metrics. */
int ds_status_render_server_metrics(const ds_status_snapshot *s, const ds_status_stats *ss,
                                    char **out, size_t *len);

/* Prometheus text for the rows of `desc` (n of them) over values v, one
 * family at a time (HELP, TYPE, then each row of the family), to f, every
 * sample labelled node="name". */
void ds_status_prom_rows(FILE *f, const char *name, size_t name_max, const ds_metric_desc *desc,
                         uint32_t n, const uint64_t *v);

/* ---- http.c: the HTTP server (status thread, after start) ---- */

/* Bind st->listen and set up the server (not yet serving: the status
 * thread drives it). 0 or a negative errno, logged. */
int ds_status_http_start(ds_status *st);
/* Close every connection and the listener. NULL-safe; clears st->http. */
void ds_status_http_stop(ds_status *st);
/* The most descriptors ds_status_http_pollfds gives. */
size_t ds_status_http_max_pollfds(const ds_status *st);
/* Fill pfd with what the status thread polls for HTTP: MHD's epoll
 * descriptor, and each connection still waiting for its request (for the
 * client closing its side). Returns how many. */
size_t ds_status_http_pollfds(ds_status *st, struct pollfd *pfd);
/* Milliseconds until the server needs to run even without I/O (its own
 * timeouts, a connection's deadline); at most `cap`. */
int64_t ds_status_http_timeout(ds_status *st, uint64_t now_ms, int64_t cap);
/* After poll: do the pending work (accept, read, answer, write, close),
 * then drop the connections whose client left mid-request and those past
 * their deadline. pfd: the n descriptors polled, with their revents. */
void ds_status_http_run(ds_status *st, uint64_t now_ms, const struct pollfd *pfd, size_t n);
/* The bound address, "host:port". */
const char *ds_status_http_addr(const ds_status *st);

/* ---- file.c: status.file (status thread; create and destroy) ---- */

/* Create and remove PATH.tmp once, to find a bad directory at start.
 * 0 or a negative errno, logged. */
int ds_status_file_check(const ds_status *st);
/* Write the newest snapshot to PATH (through PATH.tmp); counts and logs a
 * failure (rate-limited). */
/* 0, or the negative errno of a failed write (counted and logged). */
int ds_status_file_write(ds_status *st);
/* 1 when the document changed since the file was last written (a
 * publish, a wait set or cleared, a shown wait's tick). */
int ds_status_file_dirty(ds_status *st);

#endif
