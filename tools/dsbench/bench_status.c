/*
 * tools/dsbench/bench_status.c: `dsbench status`: whether real scrapes get
 * through while one client address floods the status server with idle
 * connections (node/status, libmicrohttpd).
 *
 * A real status server (the node's own, node/status/status.h, with the
 * node's defaults: 16 slots, 8 connections per client address) serves a
 * published snapshot on 127.0.0.1. The flood: N TCP connections from
 * 127.0.0.1 that connect and never send a byte, all held open while the
 * scrapes run. The scrapes: GET /status and GET /metrics, one at a time,
 * from 127.0.0.2 (all of 127/8 is loopback on Linux), each given
 * --timeout-ms to bring a whole 200 answer. Rows, side by side in one run:
 *   - baseline: no flood;
 *   - flood, per-address limit 8 (the node's default);
 *   - flood, no per-address limit (the server as it was before the limit:
 *     the flood takes every slot), fewer scrapes since most time out.
 *
 *   dsbench status [--idle N] [--scrapes S] [--timeout-ms T] [--json]
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/hostport.h"
#include "base/log.h"
#include "node/status/status.h"
#include "tools/dsbench/bench.h"

#define SCRAPER_ADDR 0x7f000002u /* 127.0.0.2 */

typedef struct status_opts {
    int idle;
    int scrapes;
    int timeout_ms;
    int json;
} status_opts;

typedef struct scrape_result {
    int ok;
    int n;
    double *lat_ms; /* of the successful ones */
} scrape_result;

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Raise the soft descriptor limit to the hard one: the flood needs N. */
static int raise_nofile(int need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)need + 64) {
        fprintf(stderr, "dsbench status: --idle %d needs %d descriptors, the limit is %llu\n",
                need, need + 64, (unsigned long long)rl.rlim_cur);
        return -EMFILE;
    }
    return 0;
}

static int start_server(int per_ip, ds_status **out, int *port)
{
    ds_status_opts o;
    ds_status_opts_default(&o);
    o.listen = "127.0.0.1:0";
    o.max_conns_per_ip = per_ip;
    int rc = ds_status_create_opts(out, &o);
    if (rc < 0)
        return rc;
    ds_status_snapshot *s = calloc(1, sizeof(*s));
    if (!s) {
        ds_status_destroy(out);
        return -ENOMEM;
    }
    ds_status_snapshot_init(s);
    snprintf(s->name, sizeof(s->name), "bench");
    s->state = DS_STATUS_TRAINING;
    ds_status_publish(*out, s);
    free(s);
    char addr[DS_HOSTPORT_MAX + 1];
    ds_hostport hp;
    rc = ds_status_addr(*out, addr, sizeof(addr));
    if (rc != 0 || ds_hostport_parse(addr, &hp) < 0 || hp.port == 0) {
        ds_status_destroy(out);
        return -EIO;
    }
    *port = hp.port;
    return 0;
}

/* A non-blocking connection to 127.0.0.1:port from src (host order, 0:
 * the kernel's choice); the descriptor or -errno. */
static int dial(int port, uint32_t src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (src) {
        struct sockaddr_in b = {.sin_family = AF_INET};
        b.sin_addr.s_addr = htonl(src);
        if (bind(fd, (struct sockaddr *)&b, sizeof(b)) < 0) {
            const int e = -errno;
            close(fd);
            return e;
        }
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno != EINPROGRESS) {
        const int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

/* Wait for `ev` on fd until deadline (ds_bench_now seconds): 1 ready, 0
 * timed out. */
static int wait_fd(int fd, short ev, double deadline)
{
    for (;;) {
        const double left = deadline - ds_bench_now();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = ev};
        const int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return 0;
    }
}

/* One GET from 127.0.0.2: 1 when a whole 200 answer came in time. */
static int scrape(int port, const char *path, int timeout_ms)
{
    const double deadline = ds_bench_now() + timeout_ms / 1000.0;
    const int fd = dial(port, SCRAPER_ADDR);
    if (fd < 0)
        return 0;
    char req[128];
    const int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: b\r\n\r\n", path);
    int ok = wait_fd(fd, POLLOUT, deadline) && send(fd, req, (size_t)n, MSG_NOSIGNAL) == n;
    char head[16] = {0};
    size_t got = 0;
    char buf[4096];
    while (ok && wait_fd(fd, POLLIN, deadline)) {
        const ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r <= 0)
            break;
        if (got < sizeof(head) - 1) {
            const size_t take = (size_t)r < sizeof(head) - 1 - got ? (size_t)r : sizeof(head) - 1 - got;
            memcpy(head + got, buf, take);
        }
        got += (size_t)r;
    }
    /* A whole answer ends with the server's close (Connection: close)
     * before the deadline. */
    ok = ok && ds_bench_now() < deadline && !strncmp(head, "HTTP/1.1 200", 12);
    close(fd);
    return ok;
}

static int run_scrapes(int port, int count, int timeout_ms, scrape_result *res)
{
    res->ok = 0;
    res->n = count;
    res->lat_ms = calloc((size_t)count + 1, sizeof(double));
    if (!res->lat_ms)
        return -ENOMEM;
    for (int i = 0; i < count; i++) {
        const double t0 = ds_bench_now();
        if (scrape(port, i % 2 ? "/metrics" : "/status", timeout_ms))
            res->lat_ms[res->ok++] = (ds_bench_now() - t0) * 1000.0;
    }
    qsort(res->lat_ms, (size_t)res->ok, sizeof(double), cmp_double);
    return 0;
}

static double pct(const scrape_result *r, double q)
{
    if (r->ok == 0)
        return -1;
    size_t i = (size_t)(q * (r->ok - 1) + 0.5);
    return r->lat_ms[i];
}

/* Open `idle` connections from 127.0.0.1 and wait until the server has
 * taken what it will take (its accepted counter stops moving). */
static int flood(int port, int idle, int *fds, ds_status *st)
{
    for (int i = 0; i < idle; i++) {
        fds[i] = dial(port, 0);
        if (fds[i] < 0) {
            fprintf(stderr, "dsbench status: idle connection %d: %s\n", i, strerror(-fds[i]));
            return fds[i];
        }
    }
    uint64_t last = UINT64_MAX;
    for (int still = 0; still < 5;) {
        struct pollfd none;
        (void)poll(&none, 0, 20);
        ds_status_stats ss;
        ds_status_stats_get(st, &ss);
        still = ss.accepted == last ? still + 1 : 0;
        last = ss.accepted;
    }
    return 0;
}

static int one_row(const status_opts *o, ds_row *row, const char *name, int idle, int per_ip,
                   int scrapes)
{
    ds_status *st = NULL;
    int port = 0;
    int rc = start_server(per_ip, &st, &port);
    if (rc < 0) {
        fprintf(stderr, "dsbench status: cannot start a status server: %s\n", strerror(-rc));
        return rc;
    }
    int *fds = calloc((size_t)idle + 1, sizeof(int));
    scrape_result res = {0};
    rc = fds ? flood(port, idle, fds, st) : -ENOMEM;
    if (rc == 0)
        rc = run_scrapes(port, scrapes, o->timeout_ms, &res);
    ds_status_stats ss;
    ds_status_stats_get(st, &ss);
    for (int i = 0; fds && i < idle; i++)
        if (fds[i] > 0)
            close(fds[i]);
    free(fds);
    ds_status_destroy(&st);
    if (rc == 0) {
        ds_row_str(row, "case", name);
        ds_row_int(row, "idle_conns", idle);
        ds_row_int(row, "per_address_limit", per_ip);
        ds_row_int(row, "scrapes", res.n);
        ds_row_int(row, "ok", res.ok);
        ds_row_num(row, "ok_pct", 100.0 * res.ok / res.n, 1);
        ds_row_num(row, "p50_ms", pct(&res, 0.5), 2);
        ds_row_num(row, "p99_ms", pct(&res, 0.99), 2);
        ds_row_int(row, "server_accepted", (int64_t)ss.accepted);
        rc = ds_row_end(row);
    }
    free(res.lat_ms);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dsbench status [--idle N] [--scrapes S] [--timeout-ms T] [--json]\n"
               "  --idle N        idle connections from 127.0.0.1 (default 2000, 1..60000)\n"
               "  --scrapes S     scrapes from 127.0.0.2 per row (default 400, 10..100000)\n"
               "  --timeout-ms T  for one scrape's whole answer (default 1000)\n");
}

static int read_opts(status_opts *o, int argc, char **argv)
{
    static const struct option longs[] = {{"idle", required_argument, 0, 'i'},
                                          {"scrapes", required_argument, 0, 's'},
                                          {"timeout-ms", required_argument, 0, 't'},
                                          {"json", no_argument, 0, 'j'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    *o = (status_opts){.idle = 2000, .scrapes = 400, .timeout_ms = 1000};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        char *end = NULL;
        long v = optarg ? strtol(optarg, &end, 10) : 0;
        const int bad_num = optarg && (*optarg == 0 || *end != 0);
        if (c == 'i' && !bad_num && v >= 1 && v <= 60000)
            o->idle = (int)v;
        else if (c == 's' && !bad_num && v >= 10 && v <= 100000)
            o->scrapes = (int)v;
        else if (c == 't' && !bad_num && v >= 10 && v <= 60000)
            o->timeout_ms = (int)v;
        else if (c == 'j')
            o->json = 1;
        else if (c == 'h') {
            usage(stdout);
            return 1;
        } else {
            fprintf(stderr, "dsbench status: bad option or value: '%s'\n", argv[optind - 1]);
            usage(stderr);
            return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "dsbench status: unexpected argument '%s'\n", argv[optind]);
        return -EINVAL;
    }
    return 0;
}

int ds_bench_status(int argc, char **argv)
{
    status_opts o;
    int rc = read_opts(&o, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (raise_nofile(o.idle) < 0)
        return 1;
    /* The server logs every refusal (rate-limited); the rows say it all. */
    ds_log_setup("dsbench", DS_LOG_WARN, NULL);
    ds_row row;
    ds_row_table(&row, o.json);
    const int few = o.scrapes < 40 ? o.scrapes : 40;
    if (one_row(&o, &row, "baseline", 0, 8, o.scrapes) < 0 ||
        one_row(&o, &row, "idle flood", o.idle, 8, o.scrapes) < 0 ||
        one_row(&o, &row, "idle flood, no per-address limit", o.idle, 0, few) < 0)
        return 1;
    return 0;
}
