/*
 * tools/dsbench/bench_elastic.c: `dsbench elastic`: how fast the cluster
 * notices a crash and spreads a join, and what crashes cost in accuracy.
 * Two halves, both run by default:
 *
 *   dsbench elastic [--fake | --real] [--json]
 *       fake: [--seeds S] [--period-ms P] [--sizes 8,64] [--window W]
 *       real: [--repeats R] [--nodes N] [--steps N] [--kill-at STEP]
 *             [--add-at STEP] [--config FILE] [--dslaunch PATH] [--keep DIR]
 *
 * The fake half (--fake) runs the membership protocol (node/membership/membership.h)
 * on the simulated network of node/membership/sim.h, where time is
 * simulated, so the figures are protocol properties (periods, messages),
 * not machine speed, and a run repeats exactly for a given seed.
 *
 * Table 1, per cluster size, loss rate and Lifeguard on/off (off = classic
 * SWIM with a fixed suspicion timeout, the baseline, run side by side):
 *   - detection: one node crashes; periods until the first suspicion, the
 *     first death, and the last node learning of it;
 *   - dissemination: periods until a join (one new node, through a random
 *     member) and a leave reach every node;
 *   - cost: frames and bytes sent per node per period over the whole run;
 *   - false deaths: members declared dead that were alive.
 * Table 2: a node slowed by D periods each way (a node saturated by
 * training) in a cluster of 64, Lifeguard on and off: in how many runs any
 * live member was declared dead, how many distinct victims on average, and
 * how often the slow node probes.
 * Each figure is the mean (and max) over --seeds runs. ms = periods x
 * --period-ms, the simulated protocol period.
 *
 * The real half (--real) starts real dsnode clusters on loopback with
 * dslaunch local (conf/examples/cluster.ini, CPU backend, no evaluation
 * until the end, no status servers), watches the nodes' logs while they
 * train, and SIGKILLs nodes itself:
 *
 * Table 3 (real-detect), --repeats runs of --nodes (8) nodes. dslaunch adds one more
 * node at --add-at; once every other node has logged "member joined" for
 * it and has it in its view, and it has its model state, and once the
 * cluster has recovered from the join (at least 10 s later, n0 back to half
 * its typical step rate from before the join over 5 s; at most 100 s
 * later, then the row says "unsettled") and reached --kill-at, one node (a
 * different one each run) is SIGKILLed. Figures:
 *   - first_suspect: the kill to the first "member suspected" line about it
 *     in any survivor's log; first_dead / all_dead: to the first and to the
 *     last survivor's "member dead" line about it. The kill time is
 *     CLOCK_REALTIME read just before kill(2); log lines carry the node's
 *     CLOCK_REALTIME in UTC milliseconds, so both ends are the same clock
 *     (a line can read up to 1 ms early: the log truncates).
 *   - progress_during: the survivors' mean training step rate per node from
 *     the kill to the last death line, as a fraction of their typical rate
 *     before the kill (per node, 1 / the median time per step between its
 *     train lines: stalls and the machine's other load in any one stretch
 *     hardly move a median). 1 = the crash cost nothing; exchanges with the
 *     dead node time out until it is suspected, then are skipped.
 *   - progress_join: the same for every node in the 10 s from the first view
 *     with the new node in it (its effective round).
 *   - join_spread: the first "member joined" line about the new node (in the
 *     log of the member that admitted it) to the last one among the other
 *     initial nodes; state_s: the new node's "joined through" line to its
 *     "model state received" line; in_view_s: the new node's process
 *     start (its first log line, less the since_exec_s it reports: the
 *     program's loading comes before any line) to its first "view changed"
 *     with itself in the view (it trains in the view from that round).
 *   - periods = seconds / the nodes' SWIM period (membership's default; the
 *     node config has no key for it).
 *   - false_deaths: "member dead" lines about any other node.
 *   - epoch_drops: gossip messages dropped as "other view epoch": a pair of
 *     nodes ran the same round with different views, i.e. one of them had
 *     not yet heard of a join or death when its effective round came. The
 *     drop log is rate-limited, so this is a lower bound.
 *   - late_changes: membership's "late change" lines: a node learned of a
 *     join or a death after the round at which it takes effect had come
 *     (what makes views disagree; also rate-limited).
 * Then one row with the mean over the runs and one with the worst (the
 * max of times and counts, the min of progress ratios). Once every
 * survivor has logged the death, the run has served its purpose: dsbench
 * stops it with SIGINT (the nodes leave gracefully) instead of training on.
 *
 * Table 4 (real-crash): 6 nodes train --steps steps undisturbed, then the
 * same cluster again with n4 and n5 SIGKILLed at --kill-at. survivors_acc
 * is the mean final test accuracy (summary lines) of n0..n3 in both runs,
 * diff_pt the crashed run's minus the undisturbed one's in points;
 * max_round_s is the longest a survivor waited for a gossip round, beside
 * the config's gossip.timeout_ms (a round with a dead peer should end at the
 * timeout, not hang); epoch_drops and late_changes as above, over the
 * whole run.
 *
 * Every dslaunch runs as our child with PR_SET_PDEATHSIG, so if dsbench is
 * stopped dslaunch stops its nodes; when a run goes wrong dsbench also
 * SIGKILLs every process whose command line names the run's directory (a
 * fresh mkdtemp, so only our nodes). The run directories are removed at the
 * end unless --keep DIR names where to keep them.
 */
#include "config.h"

#include <errno.h>
#include <ftw.h>
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conf/conf.h"
#include "base/log.h"
#include "node/membership/membership.h"
#include "node/membership/sim.h"
#include "tools/dsbench/bench.h"
#include "tools/dslaunch/dslaunch.h"

/* ==== the fake half: the protocol on a simulated network ================== */

struct agg {
    double sum, max, min;
    int n;
};

static void agg_add(struct agg *a, double v)
{
    if (!isfinite(v))
        return;
    a->sum += v;
    a->max = a->n ? fmax(a->max, v) : v;
    a->min = a->n ? fmin(a->min, v) : v;
    a->n++;
}

static double agg_mean(const struct agg *a)
{
    return a->n ? a->sum / a->n : NAN;
}

static double agg_max(const struct agg *a)
{
    return a->n ? a->max : NAN;
}

static double agg_min(const struct agg *a)
{
    return a->n ? a->min : NAN;
}

/* Latest time a live node other than skip logged kind about subject. */
static uint64_t all_logged(ds_swimnet *net, uint32_t n, uint32_t skip,
                           enum ds_membership_event_kind kind, int32_t subject, uint64_t t0)
{
    uint64_t last = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (i == skip || !ds_swimnet_is_up(net, i))
            continue;
        uint64_t t = ds_swimnet_first_at(net, i, kind, subject, t0);
        if (t == UINT64_MAX)
            return UINT64_MAX;
        last = t > last ? t : last;
    }
    return last;
}

static size_t false_deaths(ds_swimnet *net, uint64_t t0, int *victims, uint32_t n)
{
    size_t n_ev, bad = 0;
    const ds_swimnet_ev *ev = ds_swimnet_events(net, &n_ev);
    for (size_t k = 0; k < n_ev; k++) {
        const ds_swimnet_ev *e = &ev[k];
        if (e->t < t0 || e->kind != DS_MEV_MEMBER_DEAD || e->subject < 0 ||
            !ds_swimnet_is_up(net, (uint32_t)e->subject))
            continue;
        bad++;
        if (victims && (uint32_t)e->subject < n)
            victims[e->subject] = 1;
    }
    return bad;
}

static double periods(uint64_t dt, uint32_t period_ms)
{
    return dt == UINT64_MAX ? NAN : (double)dt / period_ms;
}

struct detect {
    struct agg susp, dead, all_dead, join, leave, msgs, bytes, false_deaths;
    int failed; /* runs where the cluster did not form or an event never came */
};

/* One seed: form n (+1 spare), join the spare, leave one, crash one. */
static int detect_run(uint32_t n, uint64_t seed, int lifeguard, double loss, uint32_t period_ms,
                      struct detect *d)
{
    ds_swimnet_opts o;
    ds_swimnet_opts_default(&o, n + 1, seed);
    o.cfg.lifeguard = lifeguard;
    o.cfg.period_ms = period_ms;
    o.cfg.probe_timeout_ms = period_ms * 3 / 10;
    o.round_ms = period_ms;
    o.drop = loss;
    ds_swimnet *net = NULL;
    int rc = ds_swimnet_create(&o, &net);
    if (rc)
        return rc;
    if (ds_swimnet_form(net, n, 300ull * period_ms)) {
        d->failed++;
        ds_swimnet_destroy(&net);
        return 0;
    }
    ds_swimnet_run_for(net, 10ull * period_ms);
    const uint64_t t_start = ds_swimnet_now(net);
    ds_swimnet_stats s0;
    ds_swimnet_stats_get(net, &s0);

    /* A join through a random member. */
    const uint32_t via = (uint32_t)(seed * 2654435761u % n);
    uint64_t t0 = ds_swimnet_now(net);
    ds_swimnet_join(net, n, &via, 1);
    ds_swimnet_run_for(net, 40ull * period_ms);
    uint64_t t = all_logged(net, n, UINT32_MAX, DS_MEV_MEMBER_JOINED, (int32_t)n, t0);
    agg_add(&d->join, periods(t == UINT64_MAX ? t : t - t0, period_ms));

    /* A leave. */
    const uint32_t leaver = (via + 1) % n;
    t0 = ds_swimnet_now(net);
    ds_membership_leave(ds_swimnet_node(net, leaver), t0, NULL);
    ds_swimnet_run_for(net, 40ull * period_ms);
    t = all_logged(net, n + 1, leaver, DS_MEV_MEMBER_LEFT, (int32_t)leaver, t0);
    agg_add(&d->leave, periods(t == UINT64_MAX ? t : t - t0, period_ms));
    ds_swimnet_crash(net, leaver); /* it exits */

    /* A crash. */
    const uint32_t victim = (via + 2) % n;
    ds_membership_cfg c = o.cfg;
    const uint64_t tmax = ds_membership_suspicion_timeout_ms(&c, n, 0);
    t0 = ds_swimnet_now(net);
    ds_swimnet_crash(net, victim);
    ds_swimnet_run_for(net, tmax + 60ull * period_ms);
    const uint64_t ts = ds_swimnet_first(net, DS_MEV_MEMBER_SUSPECTED, (int32_t)victim, t0);
    const uint64_t td = ds_swimnet_first(net, DS_MEV_MEMBER_DEAD, (int32_t)victim, t0);
    const uint64_t ta = all_logged(net, n + 1, victim, DS_MEV_MEMBER_DEAD, (int32_t)victim, t0);
    agg_add(&d->susp, periods(ts == UINT64_MAX ? ts : ts - t0, period_ms));
    agg_add(&d->dead, periods(td == UINT64_MAX ? td : td - t0, period_ms));
    agg_add(&d->all_dead, periods(ta == UINT64_MAX ? ta : ta - t0, period_ms));
    if (ts == UINT64_MAX || ta == UINT64_MAX)
        d->failed++;
    agg_add(&d->false_deaths, (double)false_deaths(net, t_start, NULL, n + 1));

    ds_swimnet_stats s1;
    ds_swimnet_stats_get(net, &s1);
    const double node_periods = (double)(n + 1) * (double)(ds_swimnet_now(net) - t_start) /
                                period_ms;
    agg_add(&d->msgs, (double)(s1.sent - s0.sent) / node_periods);
    agg_add(&d->bytes, (double)(s1.bytes - s0.bytes) / node_periods);
    ds_swimnet_destroy(&net);
    return 0;
}

struct slow {
    int runs, runs_with_deaths;
    struct agg victims, slow_probes, healthy_probes;
};

static int slow_run(uint32_t n, uint64_t seed, int lifeguard, double d_periods, uint32_t period_ms,
                    uint32_t window, struct slow *s)
{
    ds_swimnet_opts o;
    ds_swimnet_opts_default(&o, n, seed);
    o.cfg.lifeguard = lifeguard;
    o.cfg.period_ms = period_ms;
    o.cfg.probe_timeout_ms = period_ms * 3 / 10;
    o.round_ms = period_ms;
    ds_swimnet *net = NULL;
    int rc = ds_swimnet_create(&o, &net);
    if (rc)
        return rc;
    if (ds_swimnet_form(net, n, 300ull * period_ms)) {
        ds_swimnet_destroy(&net);
        return -ETIMEDOUT;
    }
    const uint32_t x = 3, y = (x + 7) % n;
    const uint64_t t0 = ds_swimnet_now(net);
    ds_membership_stats x0, y0, st;
    ds_membership_stats_get(ds_swimnet_node(net, x), &x0);
    ds_membership_stats_get(ds_swimnet_node(net, y), &y0);
    ds_swimnet_set_slow(net, x, (uint32_t)(d_periods * period_ms));
    ds_swimnet_run_for(net, (uint64_t)window * period_ms);
    int *victims = calloc(n, sizeof(*victims));
    if (!victims) {
        ds_swimnet_destroy(&net);
        return -ENOMEM;
    }
    size_t deaths = false_deaths(net, t0, victims, n);
    int nv = 0;
    for (uint32_t i = 0; i < n; i++)
        nv += victims[i];
    free(victims);
    s->runs++;
    s->runs_with_deaths += deaths > 0;
    agg_add(&s->victims, nv);
    ds_membership_stats_get(ds_swimnet_node(net, x), &st);
    agg_add(&s->slow_probes, (double)(st.probes - x0.probes) / window);
    ds_membership_stats_get(ds_swimnet_node(net, y), &st);
    agg_add(&s->healthy_probes, (double)(st.probes - y0.probes) / window);
    ds_swimnet_destroy(&net);
    return 0;
}

static int parse_sizes(const char *s, uint32_t *out, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v < 2 || v > 1024)
            return -1;
        out[n++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

typedef struct fake_opts {
    int seeds;
    uint32_t period_ms, window, sizes[8];
    int n_sizes;
} fake_opts;

static int fake_half(const fake_opts *fo, int json)
{
    const int seeds = fo->seeds, n_sizes = fo->n_sizes;
    const uint32_t period_ms = fo->period_ms, window = fo->window, *sizes = fo->sizes;
    ds_log_setup("dsbench", DS_LOG_ERROR, NULL);

    ds_row row;
    ds_row_table(&row, json);
    static const double losses[] = {0.0, 0.05};
    for (int si = 0; si < n_sizes; si++) {
        for (size_t li = 0; li < sizeof(losses) / sizeof(losses[0]); li++) {
            for (int lg = 1; lg >= 0; lg--) {
                struct detect d;
                memset(&d, 0, sizeof(d));
                for (int k = 0; k < seeds; k++) {
                    int rc = detect_run(sizes[si], 1000 + (uint64_t)k, lg, losses[li], period_ms,
                                        &d);
                    if (rc) {
                        fprintf(stderr, "dsbench elastic: run failed: %s\n", strerror(-rc));
                        return 1;
                    }
                }
                ds_row_str(&row, "table", "detect");
                ds_row_int(&row, "nodes", sizes[si]);
                ds_row_num(&row, "loss", losses[li], 2);
                ds_row_str(&row, "lifeguard", lg ? "on" : "off");
                ds_row_int(&row, "runs", seeds);
                ds_row_int(&row, "failed", d.failed);
                ds_row_num(&row, "first_suspect_periods", agg_mean(&d.susp), 2);
                ds_row_num(&row, "first_dead_periods", agg_mean(&d.dead), 2);
                ds_row_num(&row, "all_dead_periods", agg_mean(&d.all_dead), 2);
                ds_row_num(&row, "all_dead_max", d.all_dead.max, 2);
                ds_row_num(&row, "all_dead_ms", agg_mean(&d.all_dead) * period_ms, 0);
                ds_row_num(&row, "join_spread_periods", agg_mean(&d.join), 2);
                ds_row_num(&row, "join_spread_max", d.join.max, 2);
                ds_row_num(&row, "leave_spread_periods", agg_mean(&d.leave), 2);
                ds_row_num(&row, "spread_ms", agg_mean(&d.join) * period_ms, 0);
                ds_row_num(&row, "msgs_per_node_period", agg_mean(&d.msgs), 2);
                ds_row_num(&row, "bytes_per_node_period", agg_mean(&d.bytes), 0);
                ds_row_num(&row, "false_deaths", agg_mean(&d.false_deaths), 2);
                ds_row_end(&row);
                fflush(stdout);
            }
        }
    }

    if (!json)
        printf("\n");
    ds_row_table(&row, json);
    static const double slow_d[] = {1.0, 2.0, 3.0, 3.5, 4.0, 4.5};
    const uint32_t n_slow = 64;
    for (size_t di = 0; di < sizeof(slow_d) / sizeof(slow_d[0]); di++) {
        for (int lg = 1; lg >= 0; lg--) {
            struct slow s;
            memset(&s, 0, sizeof(s));
            for (int k = 0; k < seeds; k++) {
                int rc = slow_run(n_slow, 2000 + (uint64_t)k, lg, slow_d[di], period_ms, window,
                                  &s);
                if (rc) {
                    fprintf(stderr, "dsbench elastic: slow run failed: %s\n", strerror(-rc));
                    return 1;
                }
            }
            ds_row_str(&row, "table", "slow");
            ds_row_int(&row, "nodes", n_slow);
            ds_row_num(&row, "slow_periods", slow_d[di], 1);
            ds_row_str(&row, "lifeguard", lg ? "on" : "off");
            ds_row_int(&row, "runs", s.runs);
            ds_row_int(&row, "runs_with_false_deaths", s.runs_with_deaths);
            ds_row_num(&row, "victims_mean", agg_mean(&s.victims), 2);
            ds_row_num(&row, "victims_max", s.victims.max, 0);
            ds_row_num(&row, "slow_probes_per_period", agg_mean(&s.slow_probes), 2);
            ds_row_num(&row, "healthy_probes_per_period", agg_mean(&s.healthy_probes), 2);
            ds_row_end(&row);
            fflush(stdout);
        }
    }
    return 0;
}

/* ==== the real half: dsnode clusters on loopback ============================ */

#define REAL_MAX_NODES 16
#define REAL_RUN_TIMEOUT_S 600 /* dslaunch --timeout: a hung run cannot last */
#define SETTLE_S 10            /* training between a join and the kill, at least */
#define SETTLE_MAX_S 90        /* ... and at most this much longer */
#define RECOVER_S 5            /* the window of the recovery check */
#define JOIN_WINDOW_S 10       /* progress_join: the rate over this long */

typedef struct real_opts {
    int repeats;        /* detection runs */
    int det_nodes;      /* initial nodes of a detection run (one more joins) */
    int acc_nodes;      /* nodes of the accuracy runs */
    int acc_kills;      /* of which this many are SIGKILLed (the last ones) */
    int steps;          /* train.steps of the accuracy runs */
    int kill_at;        /* the step at which nodes are SIGKILLed */
    int add_at;         /* detection runs: dslaunch --add-at STEP:1 */
    char config[PATH_MAX];
    char dslaunch[PATH_MAX];
    char dir[PATH_MAX]; /* run directories go under it */
    int keep;           /* 1: leave dir in place */
    uint32_t period_ms; /* the nodes' SWIM period */
    uint64_t susp_max_ms; /* the longest suspicion timeout at det_nodes + 1 */
    int64_t gossip_timeout_ms;
} real_opts;

/* "2026-12-02T17:28:24.109Z ..." -> seconds since the epoch; NAN if the
 * line does not start with such a time stamp. */
static double log_time(const char *line)
{
    struct tm tm;
    int ms;
    memset(&tm, 0, sizeof(tm));
    if (sscanf(line, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return NAN;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + ms * 1e-3;
}

static double realtime_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* What one node's log has said so far; read as it grows. Times are log
 * time stamps (epoch seconds), NAN until the line appears. */
typedef struct nlog {
    char path[PATH_MAX + 96];
    long off;              /* bytes of whole lines consumed */
    long step;             /* the last "train step=N", -1 */
    long view_size;        /* size= of the last "view changed", -1 */
    double t_view_all;     /* first "view changed" to a view of every node */
    double t_joined;       /* first "member joined name=<joiner>" */
    double t_self_joined;  /* first "joined through" */
    double t_state;        /* "model state received" */
    double t_first;        /* the process started (first line less since_exec_s) */
    double t_in_view;      /* first "view changed" with in_view=1 */
    double t_suspect;      /* first "member suspected name=<victim>" */
    double t_dead;         /* first "member dead name=<victim>" */
    int false_deaths;      /* "member dead" lines about anyone else */
    int epoch_drops;       /* gossip messages dropped for "other view epoch" */
    int late_changes;      /* membership "late change" lines */
    int have_summary;      /* its summary line */
    char status[16];
    double test_acc, max_round_s;
} nlog;

/* One dslaunch run and the logs of its nodes n0..n{n-1}. */
typedef struct cluster {
    pid_t pid;             /* dslaunch, 0 once reaped */
    int fo, fe;            /* its stdout and stderr (ours; -1 when closed) */
    int code;              /* its exit status once reaped, else -1 */
    char err_tail[4096];   /* the end of what it said on stderr */
    size_t err_len;
    char dir[PATH_MAX + 32];
    char joiner[16], victim[16]; /* nodes whose events are timed ("": none) */
    int n;
    nlog node[REAL_MAX_NODES];
    double t_start;        /* monotonic */
    double t_stop;         /* CLOCK_REALTIME when we stopped it; INFINITY */
} cluster;

static void nlog_line(const cluster *c, nlog *l, char *line)
{
    ds_kvline kv;
    double v;
    if (!strncmp(line, "summary ", 8)) {
        ds_kv_parse(line + 8, &kv);
        l->have_summary = 1;
        const char *st = ds_kv_get(&kv, "status");
        snprintf(l->status, sizeof(l->status), "%s", st ? st : "?");
        if (ds_kv_get_double(&kv, "test_acc", &l->test_acc) < 0)
            l->test_acc = NAN;
        if (ds_kv_get_double(&kv, "max_round_s", &l->max_round_s) < 0)
            l->max_round_s = NAN;
        return;
    }
    const double t = log_time(line);
    ds_logline ll;
    if (!isfinite(t) || ds_logline_split(line, &ll) < 0)
        return;
    if (!isfinite(l->t_first)) {
        /* dsnode's first line says how long ago the process was started
         * (its libraries load before any line). */
        static const char key[] = "since_exec_s=";
        const char *ex = strstr(ll.msg, key);
        const double since = ex ? strtod(ex + sizeof(key) - 1, NULL) : 0;
        l->t_first = t - (since > 0 ? since : 0);
    }
    if (!strcmp(ll.component, "gossip")) {
        /* A peer ran this round with another view: the two did not know
         * the same members yet (logged rate-limited: a lower bound). */
        if (strstr(ll.msg, "other view epoch") && t < c->t_stop)
            l->epoch_drops++;
    } else if (!strcmp(ll.component, "train")) {
        if (ds_kv_parse(ll.msg, &kv) > 0 && ds_kv_get(&kv, "loss") &&
            ds_kv_get_double(&kv, "step", &v) == 0)
            l->step = (long)v;
    } else if (!strcmp(ll.component, "state")) {
        if (!strncmp(ll.msg, "model state received", 20) && !isfinite(l->t_state))
            l->t_state = t;
    } else if (!strcmp(ll.component, "membership")) {
        if (!strncmp(ll.msg, "joined through ", 15)) {
            if (!isfinite(l->t_self_joined))
                l->t_self_joined = t;
            return;
        }
        if (!strncmp(ll.msg, "late change:", 12)) {
            if (t < c->t_stop)
                l->late_changes++;
            return;
        }
        if (!strncmp(ll.msg, "view changed ", 13)) {
            if (ds_kv_parse(ll.msg, &kv) > 0 && ds_kv_get_double(&kv, "size", &v) == 0) {
                l->view_size = (long)v;
                if (l->view_size == c->n && !isfinite(l->t_view_all))
                    l->t_view_all = t;
            }
            if (ds_kv_get_double(&kv, "in_view", &v) == 0 && v == 1 && !isfinite(l->t_in_view))
                l->t_in_view = t;
            return;
        }
        if (strncmp(ll.msg, "member ", 7) || ds_kv_parse(ll.msg, &kv) <= 0)
            return;
        const char *name = ds_kv_get(&kv, "name");
        if (!name)
            return;
        const char *what = ll.msg + 7;
        if (!strncmp(what, "joined ", 7) && c->joiner[0] && !strcmp(name, c->joiner)) {
            if (!isfinite(l->t_joined))
                l->t_joined = t;
        } else if (!strncmp(what, "suspected ", 10) && c->victim[0] && !strcmp(name, c->victim)) {
            if (!isfinite(l->t_suspect))
                l->t_suspect = t;
        } else if (!strncmp(what, "dead ", 5)) {
            if (c->victim[0] && !strcmp(name, c->victim)) {
                if (!isfinite(l->t_dead))
                    l->t_dead = t;
            } else if (t < c->t_stop) {
                /* Not while everyone leaves at the end. */
                l->false_deaths++;
            }
        }
    }
}

/* Reads the whole lines added to the log since the last call. */
static void nlog_read(const cluster *c, nlog *l)
{
    FILE *f = fopen(l->path, "r");
    if (!f)
        return; /* not started yet */
    if (fseek(f, l->off, SEEK_SET) == 0) {
        char line[8192];
        while (fgets(line, sizeof(line), f)) {
            size_t len = strlen(line);
            if (len && line[len - 1] != '\n' && len < sizeof(line) - 1)
                break; /* the node is still writing it: next time */
            l->off += (long)len; /* a line longer than the buffer goes in pieces */
            if (len && line[len - 1] == '\n')
                line[len - 1] = '\0';
            nlog_line(c, l, line);
        }
    }
    fclose(f);
}

/* Reads what is there (non-blocking); keeps the end of it in tail when
 * tail is not NULL. Closes *fd at end of file. */
static void drain(int *fd, char *tail, size_t cap, size_t *len)
{
    char buf[4096];
    ssize_t r;
    while (*fd >= 0 && (r = read(*fd, buf, sizeof(buf))) != 0) {
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return; /* EAGAIN: nothing more now */
        }
        if (!tail)
            continue;
        size_t n = (size_t)r;
        if (n >= cap - 1) {
            memcpy(tail, buf + n - (cap - 1), cap - 1);
            *len = cap - 1;
        } else {
            if (*len + n > cap - 1) {
                const size_t drop = *len + n - (cap - 1);
                memmove(tail, tail + drop, *len - drop);
                *len -= drop;
            }
            memcpy(tail + *len, buf, n);
            *len += n;
        }
        tail[*len] = '\0';
    }
    if (*fd >= 0 && r == 0) {
        close(*fd);
        *fd = -1;
    }
}

static void cluster_poll(cluster *c)
{
    drain(&c->fo, NULL, 0, NULL);
    drain(&c->fe, c->err_tail, sizeof(c->err_tail), &c->err_len);
    int ws;
    if (c->pid > 0 && waitpid(c->pid, &ws, WNOHANG) == c->pid) {
        c->code = ds_proc_exit_code(ws);
        c->pid = 0;
        drain(&c->fo, NULL, 0, NULL);
        drain(&c->fe, c->err_tail, sizeof(c->err_tail), &c->err_len);
    }
    for (int i = 0; i < c->n; i++)
        nlog_read(c, &c->node[i]);
}

/* The pids of the processes whose command line contains needle (at most
 * max), and how many there are. */
static int procs_naming(const char *needle, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        const long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid())
            continue;
        char path[64], buf[8192];
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        const ssize_t r = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (r <= 0)
            continue;
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[r] = '\0';
        if (strstr(buf, needle)) {
            if (n < max)
                out[n] = (pid_t)pid;
            n++;
        }
    }
    closedir(d);
    return n;
}

/* Ends the run now: SIGKILL dslaunch, then any process still naming the
 * run directory (nodes die with dslaunch, but gracefully: they would still
 * be writing there). */
static void cluster_abort(cluster *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGKILL);
        int ws;
        if (waitpid(c->pid, &ws, 0) == c->pid)
            c->code = ds_proc_exit_code(ws);
        c->pid = 0;
    }
    pid_t left[64];
    const int n = procs_naming(c->dir, left, 64);
    for (int i = 0; i < n && i < 64; i++)
        kill(left[i], SIGKILL);
    if (c->fo >= 0)
        close(c->fo);
    if (c->fe >= 0)
        close(c->fe);
    c->fo = c->fe = -1;
}

/* Waits up to limit_s for dslaunch to exit (aborting the run if it does
 * not); returns its exit status, or -1 when it had to be killed. */
static int cluster_end(cluster *c, double limit_s)
{
    const double end = ds_bench_now() + limit_s;
    while (c->pid > 0 && ds_bench_now() < end) {
        cluster_poll(c);
        if (c->pid > 0)
            usleep(50000);
    }
    if (c->pid > 0) {
        fprintf(stderr, "dsbench elastic: dslaunch did not end within %.0f s: killed\n", limit_s);
        cluster_abort(c);
        return -1;
    }
    cluster_poll(c); /* the last lines */
    if (c->fo >= 0)
        close(c->fo);
    if (c->fe >= 0)
        close(c->fe);
    c->fo = c->fe = -1;
    return c->code;
}

typedef int (*cluster_pred)(const cluster *c, const void *arg);

/* Polls every 50 ms until pred holds (1), or limit_s passed or dslaunch
 * ended without it (0). */
static int cluster_wait(cluster *c, double limit_s, cluster_pred pred, const void *arg)
{
    const double end = ds_bench_now() + limit_s;
    for (;;) {
        cluster_poll(c);
        if (pred(c, arg))
            return 1;
        if (c->pid <= 0 || ds_bench_now() > end)
            return 0;
        usleep(50000);
    }
}

/* dslaunch local -n n_start with the common settings and `extra` (NULL-
 * terminated, may be NULL); logs n0..n{n_logs-1} are read. 0, or a
 * negative errno (said). */
static int cluster_start(cluster *c, const real_opts *o, const char *name, int n_start,
                         int n_logs, int steps, const char *const *extra)
{
    memset(c, 0, sizeof(*c));
    c->fo = c->fe = -1;
    c->code = -1;
    c->t_stop = INFINITY;
    c->n = n_logs;
    snprintf(c->dir, sizeof(c->dir), "%s/%s", o->dir, name);
    for (int i = 0; i < n_logs; i++) {
        nlog *l = &c->node[i];
        snprintf(l->path, sizeof(l->path), "%s/n%d.log", c->dir, i);
        l->step = l->view_size = -1;
        l->t_joined = l->t_self_joined = l->t_state = l->t_suspect = l->t_dead = NAN;
        l->t_first = l->t_in_view = NAN;
        l->t_view_all = NAN;
        l->test_acc = l->max_round_s = NAN;
    }
    char s_n[16], s_steps[48], s_timeout[16];
    snprintf(s_n, sizeof(s_n), "%d", n_start);
    snprintf(s_steps, sizeof(s_steps), "train.steps=%d", steps);
    snprintf(s_timeout, sizeof(s_timeout), "%d", REAL_RUN_TIMEOUT_S);
    /* Evaluation only after the last step (train.eval_every = 0), so it
     * costs the training nothing; progress every 10 steps, which is what
     * --kill-at and --add-at see. */
    const char *common[] = {s_steps, "train.eval_every=0", "train.log_every=10",
                            "train.backend=cpu", "status.listen="};
    char *argv[64];
    int k = 0;
    argv[k++] = (char *)o->dslaunch;
    argv[k++] = "local";
    argv[k++] = "-n";
    argv[k++] = s_n;
    argv[k++] = "--config";
    argv[k++] = (char *)o->config;
    for (size_t i = 0; i < sizeof(common) / sizeof(common[0]); i++) {
        argv[k++] = "--set";
        argv[k++] = (char *)common[i];
    }
    for (; extra && *extra && k < 54; extra++)
        argv[k++] = (char *)*extra;
    argv[k++] = "--out";
    argv[k++] = c->dir;
    argv[k++] = "--json";
    argv[k++] = "--timeout";
    argv[k++] = s_timeout;
    argv[k] = NULL;
    char err[512];
    c->t_start = ds_bench_now();
    const pid_t pid = ds_proc_spawn(argv, &c->fo, &c->fe, err, sizeof(err));
    if (pid < 0) {
        fprintf(stderr, "dsbench elastic: %s\n", err);
        c->fo = c->fe = -1;
        return (int)pid;
    }
    c->pid = pid;
    return 0;
}

static void cluster_say_failure(const cluster *c)
{
    fprintf(stderr, "dsbench elastic: dslaunch exit %d; the end of what it said:\n%s\n", c->code,
            c->err_tail);
}

/* SIGKILL node `name`: its pid is the process whose command line names
 * DIR/name.ini (dslaunch starts `dsnode run --config DIR/name.ini`); *at
 * gets CLOCK_REALTIME just before the signal. 0, or a negative errno. */
static int node_kill(const cluster *c, const char *name, double *at)
{
    char needle[PATH_MAX + 64];
    pid_t pid[4];
    snprintf(needle, sizeof(needle), "%s/%s.ini", c->dir, name);
    const int n = procs_naming(needle, pid, 4);
    if (n != 1) {
        fprintf(stderr, "dsbench elastic: %d processes name %s, want exactly 1\n", n, needle);
        return n ? -EEXIST : -ESRCH;
    }
    *at = realtime_now();
    return kill(pid[0], SIGKILL) < 0 ? -errno : 0;
}

static int node_index(const char *name)
{
    return name[0] == 'n' ? atoi(name + 1) : -1;
}

/* The smallest last step among nodes [0, n) except `skip` (-1: none). */
static long min_step(const cluster *c, int n, int skip)
{
    long m = LONG_MAX;
    for (int i = 0; i < n; i++)
        if (i != skip)
            m = c->node[i].step < m ? c->node[i].step : m;
    return m;
}

struct step_goal {
    int n, skip;
    long step;
};

static int reached_step(const cluster *c, const void *arg)
{
    const struct step_goal *g = arg;
    return min_step(c, g->n, g->skip) >= g->step;
}

/* The joiner has its state, and every initial node has logged it and
 * has it in its view (its effective round has come). */
static int join_done(const cluster *c, const void *arg)
{
    const struct step_goal *g = arg;
    const int j = node_index(c->joiner);
    if (j < 0 || j >= c->n || !isfinite(c->node[j].t_state))
        return 0;
    for (int i = 0; i < g->n; i++)
        if (!isfinite(c->node[i].t_joined) || c->node[i].view_size != g->n + 1)
            return 0;
    return 1;
}

static int never(const cluster *c, const void *arg)
{
    (void)c;
    (void)arg;
    return 0;
}

/* Every node but the victim has logged its death. */
static int dead_everywhere(const cluster *c, const void *arg)
{
    (void)arg;
    const int v = node_index(c->victim);
    for (int i = 0; i < c->n; i++)
        if (i != v && !isfinite(c->node[i].t_dead))
            return 0;
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A "train step=N" line of the log at path: the last one stamped <= t
 * (after = 0) or the first one stamped >= t (after = 1). 0 with *step and
 * *at, or -ENOENT. Read after the run, from the whole log. */
static int train_line(const char *path, double t, int after, long *step, double *at)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -ENOENT;
    char line[8192];
    int found = 0;
    while (fgets(line, sizeof(line), f)) {
        const double lt = log_time(line);
        const char *p = strstr(line, " train step=");
        if (!isfinite(lt) || !p || !strstr(p, " loss="))
            continue;
        if (after ? lt >= t : lt <= t) {
            *step = strtol(p + 12, NULL, 10);
            *at = lt;
            found = 1;
            if (after)
                break;
        } else if (!after) {
            break; /* time stamps only grow */
        }
    }
    fclose(f);
    return found ? 0 : -ENOENT;
}

/* Steps per second of the log at path from t0 to t1: the steps between
 * the last train lines stamped by each (log_every granularity), over that
 * time. When the node was not training yet at t0, from its first train
 * line instead. NAN when less than 1 s remains or nothing was logged. */
static double step_rate(const char *path, double t0, double t1)
{
    long s0, s1;
    double a0, a1;
    if (train_line(path, t0, 0, &s0, &a0) == 0)
        a0 = t0;
    else if (train_line(path, t0, 1, &s0, &a0) < 0)
        return NAN;
    if (train_line(path, t1, 0, &s1, &a1) < 0 || t1 - a0 < 1.0 || s1 < s0)
        return NAN;
    return (double)(s1 - s0) / (t1 - a0);
}

/* A node's typical steps per second until t: 1 / the median of seconds
 * per step between its consecutive train lines stamped <= t. NAN with
 * fewer than 5 such intervals. */
static double typical_rate(const char *path, double t)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NAN;
    double *spp = NULL, prev_t = NAN;
    size_t n = 0, cap = 0;
    long prev_s = -1;
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        const double lt = log_time(line);
        const char *p = strstr(line, " train step=");
        if (!isfinite(lt) || !p || !strstr(p, " loss="))
            continue;
        if (lt > t)
            break;
        const long st = strtol(p + 12, NULL, 10);
        if (prev_s >= 0 && st > prev_s) {
            if (n == cap) {
                cap = cap ? 2 * cap : 256;
                double *nb = realloc(spp, cap * sizeof(*nb));
                if (!nb)
                    break;
                spp = nb;
            }
            spp[n++] = (lt - prev_t) / (double)(st - prev_s);
        }
        prev_s = st;
        prev_t = lt;
    }
    fclose(f);
    double rate = NAN;
    if (n >= 5) {
        qsort(spp, n, sizeof(*spp), cmp_double);
        const double med = n % 2 ? spp[n / 2] : 0.5 * (spp[n / 2 - 1] + spp[n / 2]);
        rate = med > 0 ? 1.0 / med : NAN;
    }
    free(spp);
    return rate;
}

typedef struct det_result {
    int ok;
    char victim[16], why[128];
    long kill_step;
    double suspect_s, first_dead_s, all_dead_s, spread_s, state_s, in_view_s, wall_s;
    int unsettled;        /* killed while the join's disturbance lasted */
    double progress;      /* survivors' step rate during detection / baseline */
    double progress_join; /* the same in JOIN_WINDOW_S from the join's round */
    int false_deaths, epoch_drops, late_changes;
} det_result;

/* Clears r for detection run k (figures NAN until measured) and picks its
 * victim: a different one each run, never n0 (the founder; no reason to
 * avoid it, but keeping it makes runs alike). Returns the victim's index. */
static int det_result_init(det_result *r, const real_opts *o, int k)
{
    memset(r, 0, sizeof(*r));
    r->suspect_s = r->first_dead_s = r->all_dead_s = r->spread_s = r->state_s = NAN;
    r->in_view_s = NAN;
    r->progress = r->progress_join = NAN;
    r->kill_step = -1;
    const int v = 1 + (2 + 2 * k) % (o->det_nodes - 1);
    snprintf(r->victim, sizeof(r->victim), "n%d", v);
    return v;
}

/* Waits (up to 240 s) until the joiner n{n} has its state and every
 * initial node has it in its view. 0, or -1 with r->why. */
static int detect_await_join(cluster *c, int n, det_result *r)
{
    const struct step_goal g = {n, -1, 0};
    if (cluster_wait(c, 240, join_done, &g))
        return 0;
    if (c->pid <= 0)
        snprintf(r->why, sizeof(r->why), "dslaunch ended (exit %d) before the join of n%d "
                 "completed", c->code, n);
    else
        snprintf(r->why, sizeof(r->why), "the join of n%d did not complete within 240 s", n);
    return -1;
}

/* The join itself disturbs the rounds for a while (progress_join), at
 * times for 20 s and more. So that the crash is measured on its own, the
 * kill waits at least SETTLE_S, until n0 is back to half its typical rate
 * from before the join over the last RECOVER_S (checked once a second), at
 * most SETTLE_MAX_S (then r->unsettled), and until every initial node has
 * reached --kill-at. 0 when the kill may come, or -1 with r->why. */
static int detect_settle(cluster *c, const real_opts *o, det_result *r)
{
    const int n = o->det_nodes;
    double t_admit = INFINITY;
    for (int i = 0; i < n; i++)
        t_admit = fmin(t_admit, c->node[i].t_joined);
    const double base0 = typical_rate(c->node[0].path, t_admit);
    const double settle_min = ds_bench_now() + SETTLE_S, settle_max = settle_min + SETTLE_MAX_S;
    for (;;) {
        cluster_wait(c, 1.0, never, NULL);
        if (c->pid <= 0) {
            snprintf(r->why, sizeof(r->why), "dslaunch ended before the kill");
            return -1;
        }
        if (ds_bench_now() > settle_max) {
            if (min_step(c, n, -1) < o->kill_at) {
                snprintf(r->why, sizeof(r->why), "step %d not reached", o->kill_at);
                return -1;
            }
            r->unsettled = 1;
            return 0;
        }
        if (ds_bench_now() < settle_min || min_step(c, n, -1) < o->kill_at)
            continue;
        const double now = realtime_now();
        const double rate = step_rate(c->node[0].path, now - RECOVER_S, now);
        if (!isfinite(base0) || rate >= 0.5 * base0)
            return 0;
    }
}

/* From the logs of the ended run (initial nodes n0..n{n-1}, joiner n{n},
 * victim v killed at t_kill): the detection times, the join's spread and
 * state transfer, and the counts of false deaths, epoch drops and late
 * changes. */
static void detect_times(const cluster *c, int n, int v, double t_kill, det_result *r)
{
    double first_s = INFINITY, first_d = INFINITY, last_d = -INFINITY;
    double j_first = INFINITY, j_last = -INFINITY;
    for (int i = 0; i <= n; i++) {
        const nlog *l = &c->node[i];
        r->false_deaths += l->false_deaths;
        r->epoch_drops += l->epoch_drops;
        r->late_changes += l->late_changes;
        if (i == v)
            continue;
        if (isfinite(l->t_suspect))
            first_s = fmin(first_s, l->t_suspect);
        if (isfinite(l->t_dead)) {
            first_d = fmin(first_d, l->t_dead);
            last_d = fmax(last_d, l->t_dead);
        }
    }
    for (int i = 0; i < n; i++) {
        j_first = fmin(j_first, c->node[i].t_joined);
        j_last = fmax(j_last, c->node[i].t_joined);
    }
    const nlog *jn = &c->node[n];
    r->suspect_s = isfinite(first_s) ? first_s - t_kill : NAN;
    r->first_dead_s = isfinite(first_d) ? first_d - t_kill : NAN;
    r->all_dead_s = r->ok ? last_d - t_kill : NAN;
    r->spread_s = j_last - j_first;
    r->state_s = jn->t_state - jn->t_self_joined;
    r->in_view_s = jn->t_in_view - jn->t_first;
}

/* Training progress, as the mean step rate per node: while the cluster
 * has not yet removed the dead node (survivors, from the kill to the last
 * death line), and in JOIN_WINDOW_S from the first view with the new node
 * (every node); both against the same nodes' typical rate before the kill
 * (typical_rate: the median, so that the stalls measured here hardly move
 * it, nor the machine's other load in any one window). Needs
 * detect_times' all_dead_s; leaves the ratios NAN when a node's rate is
 * missing. */
static void detect_progress(const cluster *c, int n, int v, double t_kill, det_result *r)
{
    double t_view = INFINITY;
    for (int i = 0; i < n; i++)
        t_view = fmin(t_view, c->node[i].t_view_all);
    if (!r->ok || !(r->all_dead_s > 0) || !isfinite(t_view))
        return;
    struct agg typ_all = {0}, typ_surv = {0}, during = {0}, join = {0};
    for (int i = 0; i <= n; i++) {
        const char *path = c->node[i].path;
        const double typ = typical_rate(path, t_kill);
        agg_add(&typ_all, typ);
        agg_add(&join, step_rate(path, t_view, t_view + JOIN_WINDOW_S));
        if (i == v)
            continue;
        agg_add(&typ_surv, typ);
        agg_add(&during, step_rate(path, t_kill, t_kill + r->all_dead_s));
    }
    if (typ_surv.n == n && during.n == n && agg_mean(&typ_surv) > 0)
        r->progress = agg_mean(&during) / agg_mean(&typ_surv);
    if (typ_all.n == n + 1 && join.n == n + 1 && agg_mean(&typ_all) > 0)
        r->progress_join = agg_mean(&join) / agg_mean(&typ_all);
}

/* One detection run (k = 0, 1, ...): 8 nodes, a 9th joins, one is killed
 * once the cluster has settled from the join, and the cluster is stopped
 * once every survivor has declared it dead. 0 with r (r->ok: every
 * survivor did), or a negative errno (r->why said). */
static int detect_real_run(const real_opts *o, int k, det_result *r)
{
    const int n = o->det_nodes;
    const int v = det_result_init(r, o, k);
    char name[32], add[32];
    snprintf(name, sizeof(name), "detect-%d", k + 1);
    snprintf(add, sizeof(add), "%d:1", o->add_at);
    /* Steps enough never to end on their own: the run is stopped once
     * measured. */
    const char *extra[] = {"--add-at", add, NULL};
    cluster c;
    int ret = cluster_start(&c, o, name, n, n + 1, 1000000, extra);
    if (ret < 0) {
        snprintf(r->why, sizeof(r->why), "dslaunch did not start");
        fprintf(stderr, "FAILED: %s\n", r->why);
        return ret;
    }
    snprintf(c.joiner, sizeof(c.joiner), "n%d", n);
    snprintf(c.victim, sizeof(c.victim), "%s", r->victim);

    double t_kill = NAN;
    if (detect_await_join(&c, n, r) < 0 || detect_settle(&c, o, r) < 0)
        goto abort;
    r->kill_step = c.node[v].step;
    if ((ret = node_kill(&c, r->victim, &t_kill)) < 0) {
        snprintf(r->why, sizeof(r->why), "could not kill %s: %s", r->victim, strerror(-ret));
        goto abort;
    }
    /* Lifeguard's longest suspicion timeout, plus a minute. */
    const double limit = (double)o->susp_max_ms * 1e-3 + 60;
    if (!cluster_wait(&c, limit, dead_everywhere, NULL)) {
        snprintf(r->why, sizeof(r->why), "not every survivor declared %s dead within %.0f s",
                 r->victim, limit);
        fprintf(stderr, "FAILED: %s\n", r->why);
    } else {
        r->ok = 1;
    }
    /* Measured: stop the cluster (SIGINT: every node leaves gracefully). */
    c.t_stop = realtime_now();
    if (c.pid > 0)
        kill(c.pid, SIGINT);
    cluster_end(&c, 60);
    detect_times(&c, n, v, t_kill, r);
    detect_progress(&c, n, v, t_kill, r);
    r->wall_s = ds_bench_now() - c.t_start;
    return 0;

abort:
    fprintf(stderr, "FAILED: %s\n", r->why);
    cluster_abort(&c);
    cluster_say_failure(&c);
    r->wall_s = ds_bench_now() - c.t_start;
    return -ETIMEDOUT;
}

typedef struct acc_result {
    int ok, killed, survivors, done, code, epoch_drops, late_changes;
    long kill_step;
    double acc, max_round_s, wall_s;
} acc_result;

/* One accuracy run: acc_nodes nodes, the last `kills` of them SIGKILLed at
 * kill_at; figures over the first acc_nodes - acc_kills (in both runs). */
static int acc_real_run(const real_opts *o, int kills, acc_result *r)
{
    memset(r, 0, sizeof(*r));
    r->acc = r->max_round_s = NAN;
    r->kill_step = -1;
    r->killed = kills;
    const int n = o->acc_nodes, keep = o->acc_nodes - o->acc_kills;
    cluster c;
    int ret = cluster_start(&c, o, kills ? "crashed" : "undisturbed", n, n, o->steps, NULL);
    if (ret < 0)
        return ret;
    if (kills) {
        const struct step_goal g = {n, -1, o->kill_at};
        if (!cluster_wait(&c, REAL_RUN_TIMEOUT_S, reached_step, &g)) {
            fprintf(stderr, "FAILED: the cluster never reached step %d\n", o->kill_at);
            cluster_abort(&c);
            cluster_say_failure(&c);
            r->wall_s = ds_bench_now() - c.t_start;
            return -ETIMEDOUT;
        }
        r->kill_step = min_step(&c, n, -1);
        for (int i = n - kills; i < n; i++) {
            char name[16];
            double at;
            snprintf(name, sizeof(name), "n%d", i);
            if ((ret = node_kill(&c, name, &at)) < 0) {
                fprintf(stderr, "FAILED: could not kill %s: %s\n", name, strerror(-ret));
                cluster_abort(&c);
                r->wall_s = ds_bench_now() - c.t_start;
                return ret;
            }
        }
    }
    r->code = cluster_end(&c, REAL_RUN_TIMEOUT_S + 60);
    r->wall_s = ds_bench_now() - c.t_start;
    double acc = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        r->epoch_drops += c.node[i].epoch_drops;
        r->late_changes += c.node[i].late_changes;
    }
    for (int i = 0; i < keep; i++) {
        const nlog *l = &c.node[i];
        if (!l->have_summary)
            continue;
        r->survivors++;
        r->done += !strcmp(l->status, "done");
        acc += l->test_acc;
        mr = fmax(mr, l->max_round_s);
    }
    /* dslaunch exits 1 when nodes were killed: that is the experiment. */
    r->ok = r->done == keep && r->code == (kills ? 1 : 0);
    if (!r->ok) {
        fprintf(stderr, "FAILED: %d of %d survivors done\n", r->done, keep);
        cluster_say_failure(&c);
    }
    if (r->survivors == keep) {
        r->acc = acc / keep;
        r->max_round_s = mr;
    }
    return 0;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* dslaunch beside dsbench: the build tree (tools/dsbench/dsbench ->
 * tools/dslaunch/dslaunch), then an install (bin/). */
static int find_dslaunch(char *out, size_t len)
{
    char self[PATH_MAX - 32];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -ENOENT;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return -ENOENT;
    *slash = '\0';
    snprintf(out, len, "%s/../dslaunch/dslaunch", self);
    if (access(out, X_OK) == 0)
        return 0;
    snprintf(out, len, "%s/dslaunch", self);
    return access(out, X_OK) == 0 ? 0 : -ENOENT;
}

static void det_row(ds_row *row, const real_opts *o, const char *run, const char *victim,
                    double kill_step, double susp, double first_dead, double all_dead,
                    double progress, double spread, double state, double in_view,
                    double progress_join,
                    double false_deaths, double epoch_drops, double late_changes,
                    const char *status)
{
    const double T = o->period_ms * 1e-3;
    ds_row_str(row, "table", "real-detect");
    ds_row_str(row, "run", run);
    ds_row_int(row, "nodes", o->det_nodes);
    ds_row_str(row, "victim", victim);
    ds_row_num(row, "kill_step", kill_step, 0);
    ds_row_num(row, "first_suspect_s", susp, 2);
    ds_row_num(row, "first_suspect_periods", susp / T, 2);
    ds_row_num(row, "first_dead_s", first_dead, 2);
    ds_row_num(row, "all_dead_s", all_dead, 2);
    ds_row_num(row, "all_dead_periods", all_dead / T, 2);
    ds_row_num(row, "progress_during", progress, 2);
    ds_row_num(row, "join_spread_s", spread, 3);
    ds_row_num(row, "join_spread_periods", spread / T, 2);
    ds_row_num(row, "state_s", state, 2);
    ds_row_num(row, "in_view_s", in_view, 2);
    ds_row_num(row, "progress_join", progress_join, 2);
    ds_row_num(row, "false_deaths", false_deaths, 1);
    ds_row_num(row, "epoch_drops", epoch_drops, 1);
    ds_row_num(row, "late_changes", late_changes, 1);
    ds_row_str(row, "status", status);
    ds_row_end(row);
}

static void acc_row(ds_row *row, const real_opts *o, const acc_result *r, double base_acc)
{
    const int keep = o->acc_nodes - o->acc_kills;
    char run[48], done[16];
    if (r->killed)
        snprintf(run, sizeof(run), "%d killed", r->killed);
    else
        snprintf(run, sizeof(run), "undisturbed");
    snprintf(done, sizeof(done), "%d/%d", r->done, keep);
    ds_row_str(row, "table", "real-crash");
    ds_row_str(row, "run", run);
    ds_row_int(row, "nodes", o->acc_nodes);
    ds_row_int(row, "steps", o->steps);
    ds_row_num(row, "kill_step", r->kill_step >= 0 ? (double)r->kill_step : NAN, 0);
    ds_row_str(row, "survivors_done", done);
    ds_row_num(row, "survivors_acc", r->acc, 4);
    ds_row_num(row, "diff_pt", (r->acc - base_acc) * 100, 2);
    ds_row_num(row, "max_round_s", r->max_round_s, 3);
    ds_row_num(row, "gossip_timeout_s", o->gossip_timeout_ms * 1e-3, 3);
    ds_row_int(row, "epoch_drops", r->epoch_drops);
    ds_row_int(row, "late_changes", r->late_changes);
    ds_row_num(row, "wall_s", r->wall_s, 1);
    ds_row_str(row, "status", r->ok ? "ok" : "failed");
    ds_row_end(row);
}

static int real_half(real_opts *o, int json)
{
    ds_conf conf;
    char err[DS_CONF_ERR_MAX];
    ds_conf_defaults(&conf);
    if (ds_conf_load(&conf, o->config, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsbench elastic: %s\n", err);
        return 2;
    }
    o->gossip_timeout_ms = conf.gossip.timeout_ms;
    /* dsnode runs membership with its defaults (no config key): the
     * period and the longest suspicion timeout are those. */
    ds_membership_cfg mc;
    ds_membership_cfg_default(&mc);
    o->period_ms = mc.period_ms;
    o->susp_max_ms = ds_membership_suspicion_timeout_ms(&mc, (uint32_t)o->det_nodes + 1, 0);
    if (o->keep) {
        if (mkdir(o->dir, 0755) < 0 && errno != EEXIST) {
            fprintf(stderr, "dsbench elastic: cannot create %s: %s\n", o->dir, strerror(errno));
            return 2;
        }
    } else {
        snprintf(o->dir, sizeof(o->dir), "/tmp/dsbench-elastic.XXXXXX");
        if (!mkdtemp(o->dir)) {
            fprintf(stderr, "dsbench elastic: mkdtemp: %s\n", strerror(errno));
            return 1;
        }
    }
    fprintf(stderr, "dsbench elastic: real clusters from %s in %s; SWIM period %u ms, "
                    "suspicion timeout %.0f..%.0f s at %d nodes, gossip.timeout_ms %lld\n",
            o->config, o->dir, o->period_ms,
            ds_membership_suspicion_timeout_ms(&mc, (uint32_t)o->det_nodes + 1, 8) * 1e-3,
            o->susp_max_ms * 1e-3, o->det_nodes + 1, (long long)o->gossip_timeout_ms);

    int failed = 0;
    ds_row row;
    ds_row_table(&row, json);
    struct agg susp = {0}, fdead = {0}, adead = {0}, spread = {0}, state = {0}, inview = {0},
               fd = {0}, ed = {0}, prog = {0}, pjoin = {0}, lc = {0};
    for (int k = 0; k < o->repeats; k++) {
        det_result r;
        fprintf(stderr, "dsbench elastic: detection run %d/%d (%d nodes + 1 at step %d) ... ",
                k + 1, o->repeats, o->det_nodes, o->add_at);
        fflush(stderr);
        if (detect_real_run(o, k, &r) < 0 || !r.ok) {
            failed = 1;
        } else {
            fprintf(stderr, "%.0f s: %s killed at step %ld, suspected after %.2f s, dead "
                            "everywhere after %.2f s; join spread %.3f s\n",
                    r.wall_s, r.victim, r.kill_step, r.suspect_s, r.all_dead_s, r.spread_s);
        }
        agg_add(&susp, r.suspect_s);
        agg_add(&fdead, r.first_dead_s);
        agg_add(&adead, r.all_dead_s);
        agg_add(&spread, r.spread_s);
        agg_add(&state, r.state_s);
        agg_add(&inview, r.in_view_s);
        agg_add(&fd, r.false_deaths);
        agg_add(&ed, r.epoch_drops);
        agg_add(&lc, r.late_changes);
        agg_add(&prog, r.progress);
        agg_add(&pjoin, r.progress_join);
        char run[16];
        snprintf(run, sizeof(run), "%d", k + 1);
        det_row(&row, o, run, r.victim, r.kill_step >= 0 ? (double)r.kill_step : NAN,
                r.suspect_s, r.first_dead_s, r.all_dead_s, r.progress, r.spread_s, r.state_s,
                r.in_view_s, r.progress_join, r.false_deaths, r.epoch_drops, r.late_changes,
                !r.ok ? "failed" : r.unsettled ? "ok, unsettled" : "ok");
    }
    char st[32];
    snprintf(st, sizeof(st), "%d/%d ok", adead.n, o->repeats);
    det_row(&row, o, "mean", "-", NAN, agg_mean(&susp), agg_mean(&fdead), agg_mean(&adead),
            agg_mean(&prog), agg_mean(&spread), agg_mean(&state), agg_mean(&inview),
            agg_mean(&pjoin),
            agg_mean(&fd), agg_mean(&ed), agg_mean(&lc), st);
    /* The worst run per column: the longest times, the most drops, the
     * least progress. */
    det_row(&row, o, "worst", "-", NAN, agg_max(&susp), agg_max(&fdead), agg_max(&adead),
            agg_min(&prog), agg_max(&spread), agg_max(&state), agg_max(&inview),
            agg_min(&pjoin), agg_max(&fd),
            agg_max(&ed), agg_max(&lc), st);

    if (!json)
        printf("\n");
    ds_row_table(&row, json);
    acc_result calm, crash;
    fprintf(stderr, "dsbench elastic: %d nodes, %d steps, undisturbed ... ", o->acc_nodes,
            o->steps);
    fflush(stderr);
    if (acc_real_run(o, 0, &calm) < 0 || !calm.ok)
        failed = 1;
    else
        fprintf(stderr, "%.0f s, survivors' accuracy %.4f\n", calm.wall_s, calm.acc);
    fprintf(stderr, "dsbench elastic: %d nodes, %d steps, %d killed at step %d ... ", o->acc_nodes,
            o->steps, o->acc_kills, o->kill_at);
    fflush(stderr);
    if (acc_real_run(o, o->acc_kills, &crash) < 0 || !crash.ok)
        failed = 1;
    else
        fprintf(stderr, "%.0f s, survivors' accuracy %.4f, longest round %.3f s\n", crash.wall_s,
            crash.acc, crash.max_round_s);
    acc_row(&row, o, &calm, calm.acc);
    acc_row(&row, o, &crash, calm.acc);

    if (!o->keep) {
        if (nftw(o->dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
            fprintf(stderr, "dsbench elastic: could not remove %s\n", o->dir);
    } else {
        fprintf(stderr, "dsbench elastic: run directories kept in %s\n", o->dir);
    }
    return failed;
}

/* ==== the command ========================================================== */

static void usage(FILE *f)
{
    fprintf(f, "usage: dsbench elastic [--fake | --real] [--json]\n"
               "  fake half: [--seeds S] [--period-ms P] [--sizes 8,64] [--window W]\n"
               "  real half: [--repeats R] [--nodes N] [--steps N] [--kill-at STEP]\n"
               "             [--add-at STEP]\n"
               "             [--config FILE] [--dslaunch PATH] [--keep DIR]\n"
               "Without --fake or --real both halves run.\n");
}

/* The command line: which halves, their options, and the paths as given
 * (borrowed from argv; NULL: the default). */
typedef struct elastic_opts {
    int json, want_fake, want_real;
    fake_opts fo;
    real_opts ro;
    const char *config, *dslaunch, *keep;
} elastic_opts;

/* The argument getopt_long stopped at: what the complaint names. at is
 * optind before that call (0 on the first, which means argv[1]). */
static const char *bad_arg(int argc, char **argv, int at)
{
    if (at < 1)
        at = 1;
    return at < argc ? argv[at] : "";
}

/* getopt_long over argv into e (defaults first). 0, 1 (--help: usage on
 * stdout, done) or 2 (said, with the usage on stderr). Values are checked
 * by check_opts. */
static int read_opts(elastic_opts *e, int argc, char **argv)
{
    enum { O_JSON = 256, O_FAKE, O_REAL, O_SEEDS, O_PERIOD, O_SIZES, O_WINDOW, O_REPEATS,
           O_STEPS, O_KILL_AT, O_ADD_AT, O_CONFIG, O_DSLAUNCH, O_KEEP, O_NODES };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"json", no_argument, NULL, O_JSON},
        {"fake", no_argument, NULL, O_FAKE},
        {"real", no_argument, NULL, O_REAL},
        {"seeds", required_argument, NULL, O_SEEDS},
        {"period-ms", required_argument, NULL, O_PERIOD},
        {"sizes", required_argument, NULL, O_SIZES},
        {"window", required_argument, NULL, O_WINDOW},
        {"repeats", required_argument, NULL, O_REPEATS},
        {"steps", required_argument, NULL, O_STEPS},
        {"kill-at", required_argument, NULL, O_KILL_AT},
        {"add-at", required_argument, NULL, O_ADD_AT},
        {"config", required_argument, NULL, O_CONFIG},
        {"dslaunch", required_argument, NULL, O_DSLAUNCH},
        {"keep", required_argument, NULL, O_KEEP},
        {"nodes", required_argument, NULL, O_NODES},
        {NULL, 0, NULL, 0},
    };
    memset(e, 0, sizeof(*e));
    e->fo = (fake_opts){.seeds = 5, .period_ms = 1000, .window = 90, .sizes = {8, 64},
                        .n_sizes = 2};
    e->ro.repeats = 3;
    e->ro.det_nodes = 8;
    e->ro.acc_nodes = 6;
    e->ro.acc_kills = 2;
    e->ro.steps = 500;
    e->ro.kill_at = 150;
    e->ro.add_at = 30;
    int c, at = 0;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+:h", options, NULL)) != -1) {
        switch (c) {
        case 'h': usage(stdout); return 1;
        case O_JSON: e->json = 1; break;
        case O_FAKE: e->want_fake = 1; break;
        case O_REAL: e->want_real = 1; break;
        case O_SEEDS: e->fo.seeds = atoi(optarg); break;
        case O_PERIOD: e->fo.period_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_SIZES: e->fo.n_sizes = parse_sizes(optarg, e->fo.sizes, 8); break;
        case O_WINDOW: e->fo.window = (uint32_t)strtoul(optarg, NULL, 10); break;
        case O_REPEATS: e->ro.repeats = atoi(optarg); break;
        case O_STEPS: e->ro.steps = atoi(optarg); break;
        case O_KILL_AT: e->ro.kill_at = atoi(optarg); break;
        case O_ADD_AT: e->ro.add_at = atoi(optarg); break;
        case O_CONFIG: e->config = optarg; break;
        case O_DSLAUNCH: e->dslaunch = optarg; break;
        case O_KEEP: e->keep = optarg; break;
        case O_NODES: e->ro.det_nodes = atoi(optarg); break;
        default: /* an unknown option or a missing value */
            fprintf(stderr, "dsbench elastic: unknown option or missing value: '%s'\n",
                    bad_arg(argc, argv, at));
            usage(stderr);
            return 2;
        }
        at = optind;
    }
    if (optind < argc) {
        fprintf(stderr, "dsbench elastic: unknown option or missing value: '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!e->want_fake && !e->want_real)
        e->want_fake = e->want_real = 1;
    return 0;
}

/* Both halves' numbers in range (checked whichever halves run). 0, or 2
 * (said). */
static int check_opts(const elastic_opts *e)
{
    const fake_opts *fo = &e->fo;
    const real_opts *ro = &e->ro;
    if (fo->seeds < 1 || fo->seeds > 1000 || fo->period_ms < 10 || fo->period_ms > 600000 ||
        fo->n_sizes < 1 || fo->window < 10) {
        fprintf(stderr, "dsbench elastic: need 1 <= --seeds <= 1000, 10 <= --period-ms <= "
                        "600000, --sizes like 8,64, --window >= 10\n");
        return 2;
    }
    /* The kill must come after the join's start, and well before the
     * accuracy runs end (their survivors must train on without them). */
    if (ro->repeats < 1 || ro->repeats > 20 || ro->steps < 50 || ro->steps > 100000 ||
        ro->add_at < 10 || ro->kill_at <= ro->add_at || ro->kill_at > ro->steps / 2 ||
        ro->det_nodes < 3 || ro->det_nodes >= REAL_MAX_NODES) {
        fprintf(stderr, "dsbench elastic: need 1 <= --repeats <= 20, 3 <= --nodes <= %d, "
                        "50 <= --steps <= 100000, 10 <= --add-at < --kill-at <= --steps / 2\n",
                REAL_MAX_NODES - 1);
        return 2;
    }
    return 0;
}

/* The real half's paths into e->ro: the config (default: the source
 * tree's conf/examples/cluster.ini), dslaunch (default: beside dsbench;
 * it must be executable) and --keep. 0, or 2 (said). */
static int real_paths(elastic_opts *e)
{
    real_opts *ro = &e->ro;
    if (e->config)
        snprintf(ro->config, sizeof(ro->config), "%s", e->config);
    else
        snprintf(ro->config, sizeof(ro->config), "%s/../conf/examples/cluster.ini",
                 ds_bench_tools_dir());
    if (e->dslaunch)
        snprintf(ro->dslaunch, sizeof(ro->dslaunch), "%s", e->dslaunch);
    else if (find_dslaunch(ro->dslaunch, sizeof(ro->dslaunch)) < 0) {
        fprintf(stderr, "dsbench elastic: cannot find dslaunch beside dsbench; pass "
                        "--dslaunch\n");
        return 2;
    }
    if (access(ro->dslaunch, X_OK) < 0) {
        fprintf(stderr, "dsbench elastic: %s: %s\n", ro->dslaunch, strerror(errno));
        return 2;
    }
    if (e->keep) {
        snprintf(ro->dir, sizeof(ro->dir), "%s", e->keep);
        ro->keep = 1;
    }
    return 0;
}

int ds_bench_elastic(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--faults"))
            return ds_bench_elastic_faults(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--gossip-faults"))
            return ds_bench_elastic_gossip(argc, argv);
    elastic_opts e;
    int ret = read_opts(&e, argc, argv);
    if (ret)
        return ret == 1 ? 0 : ret;
    if ((ret = check_opts(&e)) || (e.want_real && (ret = real_paths(&e))))
        return ret;
    if (e.want_fake)
        ret = fake_half(&e.fo, e.json);
    if (e.want_real && ret != 2) {
        if (e.want_fake && !e.json)
            printf("\n");
        const int r = real_half(&e.ro, e.json);
        ret = r == 2 ? 2 : ret ? ret : r;
    }
    return ret;
}
