/*
 * tools/dsbench/bench_viz.c: `dsbench viz` -- the live page of dsviz
 * --serve with many members and a long history (issue 15).
 *
 *   dsbench viz [--members N] [--rounds R] [--history H] [--refreshes K]
 *               [--segments S] [--seed X] [--json]
 *
 * N members (default 64) run real SWIM (node/membership) on the simulated
 * network of node/membership/sim.h: N - N/16 form the cluster, N/16 join
 * later, N/32 crash. At every round each member's view (ds_membership_view_at)
 * gives the crossover schedule of topology/ (the nodes' own function) for
 * each of S segments; the member records the completed round in its
 * ds_status_history (node/status: target, its id, outcome, bytes) the way
 * node/runtime does. Every 16 rounds each live member's /status document is
 * rendered by node/status (ds_status_render_json) into DIR/NAME/status.json
 * (a crashed member's file stays as it was), and the dsviz --serve server
 * (tools/dsviz, in this process, on 127.0.0.1) is asked for / once, so its
 * own history (--history H) merges what the documents hold (each 32
 * rounds). After R rounds, K more GET / are timed (libcurl, the whole
 * request: the sources read, merged, the page built and sent). The same
 * run first does the baseline (8 members, 32 rounds, history 32: what a
 * page held before the server kept its own) so the ratio is of one run.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "base/log.h"
#include "node/membership/sim.h"
#include "node/status/status.h"
#include "tools/dsbench/bench.h"
#include "tools/dsviz/viz.h"
#include "topology/topology.h"

#define PUBLISH_EVERY 16 /* rounds between documents: half a node's ring */

typedef struct viz_sim {
    const ds_bench_viz_opts *o;
    ds_swimnet *net;
    ds_status_snapshot **snap; /* per member */
    ds_member_info *info;      /* view scratch */
    uint32_t *perm;
    uint64_t rounds_recorded;
} viz_sim;

/* Round `round`'s exchanges of every live member, from its own view. */
static void record_round(void *ctx, ds_swimnet *net, uint64_t round)
{
    viz_sim *s = ctx;
    const uint32_t n = ds_swimnet_size(net);
    for (uint32_t i = 0; i < n; i++) {
        if (!ds_swimnet_is_up(net, i) || !ds_swimnet_joined(net, i))
            continue;
        uint32_t G = 0, me = 0;
        uint64_t epoch = 0;
        if (ds_membership_view_at(ds_swimnet_node(net, i), round, s->info, n + 1, &G, &me,
                                  &epoch) < 0 ||
            me == DS_MEMBERSHIP_NOT_IN_VIEW || G < 2)
            continue;
        ds_status_snapshot *sn = s->snap[i];
        ds_status_round r;
        memset(&r, 0, sizeof(r));
        r.round = round;
        r.epoch = epoch;
        r.view_size = G;
        r.me = me;
        r.end_unix_ms = ds_swimnet_now(net);
        r.duration_ns = 50000000;
        r.n_segments = r.n_listed = s->o->segments;
        const char *names[DS_STATUS_HIST_SEGMENTS];
        for (uint32_t seg = 0; seg < s->o->segments; seg++) {
            const ds_topo_key key = {.seed = s->o->seed, .epoch = epoch, .round = round,
                                     .segment = seg};
            if (ds_topo_targets(DS_TOPO_CROSSOVER, &key, G, s->perm) < 0)
                return;
            ds_status_seg_done *d = &r.seg[seg];
            const uint32_t t = s->perm[me];
            d->target = t;
            names[seg] = "";
            if (t == me) {
                d->outcome = DS_XCHG_NONE;
                continue;
            }
            const int ti = ds_swimnet_index(net, s->info[t].id);
            d->target_id = s->info[t].id;
            names[seg] = s->info[t].name;
            if (ti < 0 || !ds_swimnet_is_up(net, (uint32_t)ti)) {
                d->outcome = DS_XCHG_FAILED; /* a crashed member does not answer */
                continue;
            }
            d->outcome = DS_XCHG_OK;
            d->bytes = 4096 + (round * 131 + seg * 17 + i) % 1024;
            d->latency_ns = 2000000;
            d->n_in = 1;
        }
        ds_status_history_add_named(&sn->hist, &r, names);
        sn->round = round;
        sn->epoch = epoch;
    }
    s->rounds_recorded++;
}

/* Member i's document now, into DIR/NAME/status.json. */
static int publish(viz_sim *s, uint32_t i, const char *dir)
{
    ds_swimnet *net = s->net;
    const uint32_t n = ds_swimnet_size(net);
    ds_status_snapshot *sn = s->snap[i];
    uint32_t G = 0, me = 0;
    uint64_t epoch = 0;
    if (ds_membership_view_at(ds_swimnet_node(net, i), ds_swimnet_round(net), s->info, n + 1, &G,
                              &me, &epoch) < 0)
        return -EIO;
    sn->state = DS_STATUS_TRAINING;
    sn->view_size = G;
    sn->n_view = G < DS_STATUS_MAX_VIEW ? G : DS_STATUS_MAX_VIEW;
    sn->view_me = me;
    for (uint32_t k = 0; k < sn->n_view; k++) {
        ds_status_member *m = &sn->view[k];
        m->id = s->info[k].id;
        snprintf(m->name, sizeof(m->name), "%s", s->info[k].name);
        snprintf(m->addr, sizeof(m->addr), "%s", s->info[k].addr);
        m->state = (uint8_t)s->info[k].state;
    }
    sn->step = (int64_t)sn->round;
    sn->n_segments = s->o->segments;
    char *text;
    size_t len;
    if (ds_status_render_json(sn, 1700000000000ull + ds_swimnet_now(net), &text, &len) < 0)
        return -ENOMEM;
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/%s", dir, sn->name);
    if (mkdir(path, 0700) < 0 && errno != EEXIST) {
        free(text);
        return -errno;
    }
    snprintf(path, sizeof(path), "%s/%s/status.json", dir, sn->name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    int e = f ? 0 : -errno;
    if (f && fwrite(text, 1, len, f) != len)
        e = -EIO;
    if (f && fclose(f) != 0)
        e = -EIO;
    free(text);
    if (e == 0 && rename(tmp, path) < 0)
        e = -errno;
    return e;
}

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void rm_tree(const char *dir, viz_sim *s, uint32_t n)
{
    char p[600];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(p, sizeof(p), "%s/%s/status.json", dir, ds_swimnet_name(s->net, i));
        unlink(p);
        snprintf(p, sizeof(p), "%s/%s", dir, ds_swimnet_name(s->net, i));
        rmdir(p);
    }
    rmdir(dir);
}

/* GET / once: ms, or < 0. */
static double get_page(const char *addr, size_t *bytes, char **page)
{
    char *body = NULL, err[600];
    size_t len = 0;
    const double t0 = ds_bench_now();
    if (ds_viz_http_get(addr, "/", 60000, (size_t)256 << 20, &body, &len, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsbench viz: GET /: %s\n", err);
        return -1;
    }
    const double ms = (ds_bench_now() - t0) * 1e3;
    *bytes = len;
    if (page) {
        free(*page);
        *page = body;
    } else {
        free(body);
    }
    return ms;
}

/* The page GET / answers, built in this thread (ds_viz_live_page: the
 * sources read, merged into hist, built, written): ms, or -errno. */
static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double direct_page(ds_viz_hist *hist, char *const *srcs, size_t *bytes, double *cpu_ms)
{
    char *body = NULL;
    size_t len = 0;
    const double t0 = ds_bench_now(), c0 = thread_cpu_ms();
    const int e = ds_viz_live_page(hist, srcs, 1, 60000, 5, -1, -1, &body, &len);
    const double ms = (ds_bench_now() - t0) * 1e3;
    if (cpu_ms)
        *cpu_ms = thread_cpu_ms() - c0;
    free(body);
    if (e < 0)
        return e;
    if (bytes)
        *bytes = len;
    return ms;
}

int ds_bench_viz_case(const ds_bench_viz_opts *o, ds_bench_viz_result *res, char **page)
{
    memset(res, 0, sizeof(*res));
    if (page)
        *page = NULL;
    if (o->members < 2 || o->members > 1024 || o->rounds < 1 || o->refreshes < 1 ||
        o->segments < 1 || o->segments > DS_STATUS_HIST_SEGMENTS || o->history < 1 ||
        o->history > DS_VIZ_HISTORY_MAX)
        return -EINVAL;
    const uint32_t n = o->members;
    const uint32_t joins = n / 16, deaths = n / 32, initial = n - joins;
    res->joins = joins;
    res->deaths = deaths;
    ds_swimnet_opts so;
    ds_swimnet_opts_default(&so, n, o->seed);
    viz_sim s = {.o = o};
    int rc = ds_swimnet_create(&so, &s.net);
    if (rc)
        return rc;
    s.snap = calloc(n, sizeof(*s.snap));
    s.info = calloc(n + 1, sizeof(*s.info));
    s.perm = calloc(n + 1, sizeof(*s.perm));
    char dir[] = "/tmp/dsbench-viz-XXXXXX";
    ds_viz_server *sv = NULL;
    ds_viz_hist *hist = NULL; /* the same merging, called directly */
    double *ms = NULL;
    if (!s.snap || !s.info || !s.perm || !mkdtemp(dir)) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!(s.snap[i] = calloc(1, sizeof(**s.snap)))) {
            rc = -ENOMEM;
            goto out_dir;
        }
        ds_status_snapshot_init(s.snap[i]);
        snprintf(s.snap[i]->name, sizeof(s.snap[i]->name), "%s", ds_swimnet_name(s.net, i));
        snprintf(s.snap[i]->addr, sizeof(s.snap[i]->addr), "%s", ds_swimnet_addr(s.net, i));
        snprintf(s.snap[i]->topology, sizeof(s.snap[i]->topology), "crossover");
        s.snap[i]->id = ds_swimnet_id(s.net, i);
        s.snap[i]->seed = o->seed;
    }
    const uint64_t period = so.cfg.period_ms;
    if (ds_swimnet_form(s.net, initial, 300 * period)) {
        fprintf(stderr, "dsbench viz: %u members did not form\n", initial);
        rc = -ETIMEDOUT;
        goto out_dir;
    }
    char *srcs[] = {dir};
    char err[600], addr[80];
    rc = ds_viz_serve_start(&sv, "127.0.0.1:0", srcs, 1, 60000, 5, o->history, err, sizeof(err));
    if (rc < 0 || (rc = ds_viz_serve_addr(sv, addr, sizeof(addr))) < 0) {
        fprintf(stderr, "dsbench viz: %s\n", err);
        goto out_dir;
    }
    if ((rc = ds_viz_hist_new(&hist, o->history)) < 0)
        goto out_stop;
    ds_swimnet_on_round(s.net, record_round, &s);
    /* Joins and deaths spread over the run. */
    for (uint64_t r = 1; r <= o->rounds && rc == 0; r++) {
        ds_swimnet_run_for(s.net, period);
        for (uint32_t j = 0; j < joins; j++)
            if (r == (uint64_t)o->rounds * (j + 1) / (joins + 1)) {
                const uint32_t via = 0; /* never crashed */
                ds_swimnet_join(s.net, initial + j, &via, 1);
            }
        for (uint32_t d = 0; d < deaths; d++)
            if (r == (uint64_t)o->rounds * (2 * d + 1) / (2 * deaths + 1))
                ds_swimnet_crash(s.net, 1 + d * 5 % (initial - 1));
        if (r % PUBLISH_EVERY && r != o->rounds)
            continue;
        for (uint32_t i = 0; i < n && rc == 0; i++)
            if (ds_swimnet_is_up(s.net, i) && ds_swimnet_joined(s.net, i))
                rc = publish(&s, i, dir);
        size_t bytes;
        if (rc == 0 && get_page(addr, &bytes, NULL) < 0)
            rc = -EIO;
        if (rc == 0 && (rc = direct_page(hist, srcs, NULL, NULL)) > 0)
            rc = 0;
        res->feeds++;
    }
    if (rc < 0)
        goto out_stop;
    const unsigned K = o->refreshes;
    ms = calloc(3 * (size_t)K, sizeof(*ms));
    if (!ms) {
        rc = -ENOMEM;
        goto out_stop;
    }
    /* In turns: GET / over HTTP, then the same page built directly. */
    for (unsigned k = 0; k < K && rc == 0; k++) {
        if ((ms[k] = get_page(addr, &res->page_bytes, page)) < 0)
            rc = -EIO;
        else if ((ms[K + k] = direct_page(hist, srcs, &res->direct_bytes, &ms[2 * K + k])) < 0)
            rc = (int)ms[K + k];
    }
    if (rc == 0) {
        qsort(ms, K, sizeof(*ms), cmp_dbl);
        qsort(ms + K, K, sizeof(*ms), cmp_dbl);
        qsort(ms + 2 * K, K, sizeof(*ms), cmp_dbl);
        res->median_ms = K % 2 ? ms[K / 2] : (ms[K / 2 - 1] + ms[K / 2]) / 2;
        res->max_ms = ms[K - 1];
        const double *d = ms + K;
        res->page_median_ms = K % 2 ? d[K / 2] : (d[K / 2 - 1] + d[K / 2]) / 2;
        res->page_max_ms = d[K - 1];
        const double *c = ms + 2 * K;
        res->page_cpu_median_ms = K % 2 ? c[K / 2] : (c[K / 2 - 1] + c[K / 2]) / 2;
    }
    res->rounds = s.rounds_recorded;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        res->max_rss_mb = (double)ru.ru_maxrss / 1024.0;
    for (uint32_t i = 0; i < n; i++) {
        double lo, hi;
        const size_t held = ds_viz_hist_held(ds_viz_serve_hist(sv), s.snap[i]->name, &lo, &hi);
        if (held) {
            res->docs++;
            if (held > res->held_max)
                res->held_max = held;
        }
    }
out_stop:
    free(ms);
    ds_viz_hist_free(&hist);
    ds_viz_serve_stop(&sv);
out_dir:
    rm_tree(dir, &s, n);
out:
    for (uint32_t i = 0; s.snap && i < n; i++)
        free(s.snap[i]);
    free(s.snap);
    free(s.info);
    free(s.perm);
    ds_swimnet_destroy(&s.net);
    return rc;
}

static void put_row(ds_row *row, const char *label, const ds_bench_viz_opts *o,
                    const ds_bench_viz_result *r, double ratio)
{
    ds_row_str(row, "case", label);
    ds_row_int(row, "members", o->members);
    ds_row_int(row, "joins", r->joins);
    ds_row_int(row, "deaths", r->deaths);
    ds_row_int(row, "segments", o->segments);
    ds_row_int(row, "rounds_run", (int64_t)r->rounds);
    ds_row_int(row, "history", o->history);
    ds_row_int(row, "rounds_held", (int64_t)r->held_max);
    ds_row_int(row, "documents", (int64_t)r->docs);
    ds_row_num(row, "page_kb", (double)r->page_bytes / 1024.0, 0);
    ds_row_int(row, "refreshes", o->refreshes);
    ds_row_num(row, "get_median_ms", r->median_ms, 1);
    ds_row_num(row, "get_max_ms", r->max_ms, 1);
    ds_row_num(row, "page_median_ms", r->page_median_ms, 1);
    ds_row_num(row, "page_max_ms", r->page_max_ms, 1);
    ds_row_num(row, "page_cpu_median_ms", r->page_cpu_median_ms, 1);
    ds_row_num(row, "max_rss_mb", r->max_rss_mb, 0);
    ds_row_num(row, "vs_baseline", ratio, 2);
    ds_row_end(row);
}

int ds_bench_viz(int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"members", required_argument, NULL, 'm'},
        {"rounds", required_argument, NULL, 'r'},
        {"history", required_argument, NULL, 'H'},
        {"refreshes", required_argument, NULL, 'k'},
        {"segments", required_argument, NULL, 's'},
        {"seed", required_argument, NULL, 'x'},
        {NULL, 0, NULL, 0},
    };
    ds_bench_viz_opts o = {.members = 64, .rounds = 1000, .history = DS_VIZ_HISTORY_DEFAULT,
                           .refreshes = 10, .segments = 8, .seed = 1};
    int json = 0, bad = 0, opt;
    optind = 0;
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        char *end = NULL;
        const unsigned long long u = optarg ? strtoull(optarg, &end, 10) : 0;
        if (optarg && (!optarg[0] || *end || optarg[0] == '-' || u > 1000000)) {
            fprintf(stderr, "dsbench viz: %s: expected a whole number, found '%s'\n",
                    argv[optind - 1], optarg);
            return 2;
        }
        switch (opt) {
        case 'j': json = 1; break;
        case 'm': o.members = (unsigned)u; break;
        case 'r': o.rounds = (unsigned)u; break;
        case 'H': o.history = (unsigned)u; break;
        case 'k': o.refreshes = (unsigned)u; break;
        case 's': o.segments = (unsigned)u; break;
        case 'x': o.seed = u; break;
        default: bad = 1;
        }
    }
    if (bad || optind < argc) {
        fprintf(stderr, "usage: dsbench viz [--members N] [--rounds R] [--history H] "
                        "[--refreshes K] [--segments S] [--seed X] [--json]\n");
        return 2;
    }
    if (o.members < 2 || o.members > 1024 || o.rounds < 1 || o.refreshes < 1 ||
        o.segments < 1 || o.segments > DS_STATUS_HIST_SEGMENTS || o.history < 1 ||
        o.history > DS_VIZ_HISTORY_MAX) {
        fprintf(stderr, "dsbench viz: --members 2..1024, --rounds >= 1, --refreshes >= 1, "
                        "--segments 1..%d, --history 1..%d\n",
                DS_STATUS_HIST_SEGMENTS, DS_VIZ_HISTORY_MAX);
        return 2;
    }
    ds_log_setup("dsbench", DS_LOG_WARN, stderr); /* not every join of the simulation */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "dsbench viz: cannot initialise libcurl\n");
        return 1;
    }
    const ds_bench_viz_opts base = {.members = 8, .rounds = 32, .history = 32,
                                    .refreshes = o.refreshes, .segments = o.segments,
                                    .seed = o.seed};
    ds_bench_viz_result rb, rm;
    int rc = ds_bench_viz_case(&base, &rb, NULL);
    if (rc == 0)
        rc = ds_bench_viz_case(&o, &rm, NULL);
    if (rc < 0) {
        fprintf(stderr, "dsbench viz: failed: %s\n", strerror(-rc));
        curl_global_cleanup();
        return 1;
    }
    ds_row row;
    ds_row_table(&row, json);
    put_row(&row, "baseline", &base, &rb, 1.0);
    put_row(&row, "measured", &o, &rm, rb.median_ms > 0 ? rm.median_ms / rb.median_ms : 0);
    curl_global_cleanup();
    return 0;
}
