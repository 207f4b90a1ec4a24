/*
 * tools/dsbench/bench_elastic.c: `dsbench elastic --fake`: the membership
 * protocol (node/membership.h) on the simulated network of
 * tests/swim_fakenet.h, where time is simulated, so the figures are
 * protocol properties (periods, messages), not machine speed, and a run
 * repeats exactly for a given seed.
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
 *
 * Each figure is the mean (and max) over --seeds runs. ms = periods x
 * --period-ms, the simulated protocol period.
 *
 *   dsbench elastic --fake [--seeds S] [--period-ms P] [--sizes 8,64] [--json]
 *
 * The real-process half (8 nodes on loopback) needs the node integration;
 * without --fake the command says so and fails.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/log.h"
#include "node/membership.h"
#include "tests/swim_fakenet.h"
#include "tools/dsbench/bench.h"

struct agg {
    double sum, max;
    int n;
};

static void agg_add(struct agg *a, double v)
{
    if (!isfinite(v))
        return;
    a->sum += v;
    a->max = a->n ? fmax(a->max, v) : v;
    a->n++;
}

static double agg_mean(const struct agg *a)
{
    return a->n ? a->sum / a->n : NAN;
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

int ds_bench_elastic(int argc, char **argv)
{
    int json = 0, fake = 0, seeds = 5;
    uint32_t period_ms = 1000, sizes[8] = {8, 64}, window = 90;
    int n_sizes = 2;
    for (int i = 1; i < argc; i++) {
        if (ds_bench_flag_json(argv[i], &json))
            continue;
        if (!strcmp(argv[i], "--fake")) {
            fake = 1;
        } else if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
            seeds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--period-ms") && i + 1 < argc) {
            period_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            n_sizes = parse_sizes(argv[++i], sizes, 8);
        } else if (!strcmp(argv[i], "--window") && i + 1 < argc) {
            window = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "dsbench elastic: unknown option '%s'\nusage: dsbench elastic --fake "
                            "[--seeds S] [--period-ms P] [--sizes 8,64] [--window W] [--json]\n",
                    argv[i]);
            return 2;
        }
    }
    if (!fake) {
        fprintf(stderr, "dsbench elastic: only the simulated half exists so far (--fake); the "
                        "loopback half needs dsnode to run membership\n");
        return 2;
    }
    if (seeds < 1 || seeds > 1000 || period_ms < 10 || period_ms > 600000 || n_sizes < 1 ||
        window < 10) {
        fprintf(stderr, "dsbench elastic: need 1 <= --seeds <= 1000, 10 <= --period-ms <= "
                        "600000, --sizes like 8,64, --window >= 10\n");
        return 2;
    }
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
