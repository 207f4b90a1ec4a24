/*
 * tools/dsbench/bench_elastic_gossip.c: `dsbench elastic --gossip-faults`:
 * what a slow node and a crash cost the others' gossip rounds (issue 16),
 * with real dsnode processes started by dslaunch local
 * (conf/examples/cluster.ini, CPU backend, evaluation at the end only,
 * status.json on). Every row is a pair run in the same invocation: the
 * undisturbed cluster (the baseline), then the same cluster disturbed.
 *
 *   dsbench elastic --gossip-faults [--scenario straggler|crash|all]
 *       [--steps 1500] [--config FILE] [--dslaunch PATH] [--dsnode PATH]
 *       [--json]
 *
 * --dsnode runs another dsnode build (dslaunch --dsnode), to set a
 * version before a change beside the one after it.
 *
 *   straggler  4 nodes, one network namespace each (dslaunch --netns;
 *              root, ip, tc and nft), --steps steps. Disturbed: n3's link
 *              limited to 10 Mbit/s both ways (tbf on both ends of its
 *              veth) from the start, and in a third run 5% of n3's packets
 *              dropped both ways (nftables `numgen random mod 100 < 5
 *              drop` in its namespace; netem is not available). Row: the
 *              others' (n0-n2) mean samples/s and its ratio to the
 *              baseline's, n3's, the mean final test accuracy of all four
 *              and its change in points (and of n0-n2's mean and n3's
 *              alone), the consensus distance.
 *   crash      6 nodes on loopback with gossip.segments = 1 (each node has
 *              one target and one in-neighbour a round, so most survivors
 *              are not the dead node's partners in a given round); n5
 *              SIGKILLed at n0's step --steps / 5, the run stopped 10 s
 *              later. Row per
 *              run: over the 10 s after the kill (the same window of the
 *              baseline run, where nobody is killed), each survivor's
 *              longest gap between two `train step=` lines (log_every 5):
 *              the worst survivor's (a partner of the dead node in the
 *              round after the kill) and the median survivor's, and the
 *              gossip timeouts counted meanwhile. The baseline's gaps are
 *              the machine's noise.
 *
 * Each run has a hard limit (dslaunch --timeout 600; the bench kills it
 * sooner if a wait fails). Every run directory is a fresh mkdtemp,
 * removed at the end with everything still running in it.
 */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/dsbench/bench.h"
#include "tools/dsbench/lrun.h"

typedef struct gf_opts {
    int json, steps;
    char scenario[16];
    char config[PATH_MAX], dslaunch[PATH_MAX], dsnode[PATH_MAX];
} gf_opts;

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- dslaunch runs --------------------------------------------------------- */

/* Start dslaunch local with n nodes, the common settings and `extra`. */
static int gf_start(ds_lrun *r, const gf_opts *o, int nodes, const char *const *extra)
{
    const char *args[64] = {"--config", o->config,
                            "--set", "train.backend=cpu", "--set", "train.eval_every=0",
                            "--set", "gossip.timeout_ms=2000",
                            "--set", "status.file=status.json", "--timeout", "600"};
    int k = 12;
    if (o->dsnode[0]) {
        args[k++] = "--dsnode";
        args[k++] = o->dsnode;
    }
    for (; extra && *extra && k < 50; extra++)
        args[k++] = *extra;
    args[k] = NULL;
    return ds_lrun_start(r, "gossip", o->dslaunch, nodes, args);
}

static double gf_status_num(const ds_lrun *r, const char *name, const char *a, const char *b)
{
    json_t *d = ds_lrun_status(r, name);
    const json_t *v = json_object_get(json_object_get(d, a), b);
    const double x = json_is_number(v) ? json_number_value(v) : NAN;
    json_decref(d);
    return x;
}

static int gf_wait_step(ds_lrun *r, const char *name, double step, double timeout_s)
{
    const double t_end = ds_bench_now() + timeout_s;
    while (ds_bench_now() < t_end && ds_lrun_wait(r, 0) < 0) {
        if (gf_status_num(r, name, "train", "step") >= step)
            return 1;
        ds_lrun_sleep_ms(50);
    }
    return 0;
}

/* ---- a straggler ----------------------------------------------------------- */

/* Run argv (fixed, no shell), output discarded. 0 or -1. */
static int gf_exec(const char *const *argv)
{
    const pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static void base36(long v, char *out, size_t len)
{
    char tmp[16];
    int k = 0;
    do {
        tmp[k++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
        v /= 36;
    } while (v && k < 15);
    size_t i = 0;
    while (k && i + 1 < len)
        out[i++] = tmp[--k];
    out[i] = 0;
}

enum { GF_NONE, GF_TBF, GF_LOSS };

/* n3's link at 10 Mbit/s both ways, or 5% of its packets lost both ways,
 * once dslaunch has made its namespace. 0 or -1. */
static int disturb_n3(const ds_lrun *r, int how)
{
    char ns[64], veth[32], tag[16], path[96];
    snprintf(ns, sizeof(ns), "dsl-%d-n3", (int)r->pid);
    base36((long)r->pid, tag, sizeof(tag));
    snprintf(veth, sizeof(veth), "dsl%sv3", tag);
    snprintf(path, sizeof(path), "/sys/class/net/%s", veth);
    for (int i = 0; i < 600 && access(path, F_OK) < 0; i++)
        ds_lrun_sleep_ms(50);
    if (how == GF_TBF) {
        const char *root[] = {"/usr/sbin/tc", "qdisc", "add", "dev", veth, "root", "tbf",
                              "rate", "10mbit", "burst", "64kb", "latency", "50ms", NULL};
        const char *in[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/tc", "qdisc",
                            "add", "dev", "eth0", "root", "tbf", "rate", "10mbit", "burst",
                            "64kb", "latency", "50ms", NULL};
        int r1 = -1;
        for (int i = 0; i < 100 && (r1 = gf_exec(in)) < 0; i++)
            ds_lrun_sleep_ms(50); /* eth0 comes with the namespace's setup */
        return gf_exec(root) || r1 ? -1 : 0;
    }
    const char *t[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft", "add", "table",
                       "inet", "dsbench_loss", NULL};
    const char *ci[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft", "add", "chain",
                        "inet", "dsbench_loss", "in",
                        "{ type filter hook input priority 0 ; }", NULL};
    const char *co[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft", "add", "chain",
                        "inet", "dsbench_loss", "out",
                        "{ type filter hook output priority 0 ; }", NULL};
    const char *ri[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft", "add", "rule",
                        "inet", "dsbench_loss", "in", "iifname", "eth0", "numgen", "random",
                        "mod", "100", "<", "5", "drop", NULL};
    const char *ro[] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft", "add", "rule",
                        "inet", "dsbench_loss", "out", "oifname", "eth0", "numgen", "random",
                        "mod", "100", "<", "5", "drop", NULL};
    int e = -1;
    for (int i = 0; i < 100 && (e = gf_exec(t)) < 0; i++)
        ds_lrun_sleep_ms(50);
    return e || gf_exec(ci) || gf_exec(co) || gf_exec(ri) || gf_exec(ro) ? -1 : 0;
}

struct strag_res {
    double others_sps, n3_sps, acc, others_acc, n3_acc, cd, wall;
    int ok;
};

static void straggler_run(const gf_opts *o, int how, struct strag_res *res)
{
    memset(res, 0, sizeof(*res));
    char steps[48];
    snprintf(steps, sizeof(steps), "train.steps=%d", o->steps);
    const char *extra[] = {"--netns", "--set", steps, NULL};
    ds_lrun r;
    if (gf_start(&r, o, 4, extra) < 0)
        return;
    int ok = how == GF_NONE || disturb_n3(&r, how) == 0;
    if (!ok)
        fprintf(stderr, "dsbench elastic --gossip-faults: could not disturb n3 (root, tc, nft?)\n");
    ok = ok && ds_lrun_wait(&r, 600) == 0;
    json_t *rep = ok ? ds_lrun_report(&r) : NULL;
    if (rep) {
        double s = 0, acc = 0;
        for (int i = 0; i < 4; i++) {
            char name[4] = {'n', (char)('0' + i), 0};
            const double a = ds_lrun_report_num(rep, name, "test_acc");
            if (i < 3) {
                s += ds_lrun_report_num(rep, name, "samples_per_s") / 3;
                res->others_acc += a / 3;
            }
            acc += a / 4;
        }
        res->n3_acc = ds_lrun_report_num(rep, "n3", "test_acc");
        res->others_sps = s;
        res->n3_sps = ds_lrun_report_num(rep, "n3", "samples_per_s");
        res->acc = acc;
        const json_t *cd = json_object_get(rep, "consensus_distance");
        res->cd = json_is_number(cd) ? json_number_value(cd) : NAN;
        const json_t *w = json_object_get(rep, "wall_s");
        res->wall = json_is_number(w) ? json_number_value(w) : NAN;
        res->ok = isfinite(s) && isfinite(acc);
        json_decref(rep);
    }
    ds_lrun_end(&r, 1);
}

static int scenario_straggler(const gf_opts *o)
{
    if (geteuid() != 0) {
        fprintf(stderr, "dsbench elastic --gossip-faults: the straggler needs root (netns)\n");
        return 1;
    }
    static const char *names[] = {"baseline", "n3 at 10 Mbit/s", "n3 loses 5%"};
    struct strag_res res[3];
    ds_row row;
    ds_row_table(&row, o->json);
    int bad = 0;
    for (int how = GF_NONE; how <= GF_LOSS; how++) {
        straggler_run(o, how, &res[how]);
        const struct strag_res *b = &res[0], *x = &res[how];
        ds_row_str(&row, "scenario", "straggler");
        ds_row_str(&row, "run", names[how]);
        ds_row_num(&row, "others_samples_per_s", x->ok ? x->others_sps : NAN, 0);
        ds_row_num(&row, "ratio", x->ok && b->ok ? x->others_sps / b->others_sps : NAN, 2);
        ds_row_num(&row, "n3_samples_per_s", x->ok ? x->n3_sps : NAN, 0);
        ds_row_num(&row, "test_acc", x->ok ? x->acc : NAN, 4);
        ds_row_num(&row, "acc_delta_pt", x->ok && b->ok ? 100 * (x->acc - b->acc) : NAN, 2);
        ds_row_num(&row, "others_delta_pt",
                   x->ok && b->ok ? 100 * (x->others_acc - b->others_acc) : NAN, 2);
        ds_row_num(&row, "n3_delta_pt", x->ok && b->ok ? 100 * (x->n3_acc - b->n3_acc) : NAN, 2);
        ds_row_num(&row, "consensus", x->ok ? x->cd : NAN, 4);
        ds_row_num(&row, "wall_s", x->ok ? x->wall : NAN, 1);
        bad |= ds_row_end(&row) < 0 || !x->ok;
    }
    return bad;
}

/* ---- a crash ------------------------------------------------------------------ */

/* Seconds since the epoch of a log line's "YYYY-MM-DDTHH:MM:SS.mmmZ". */
static double line_time(const char *l)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    int ms = 0;
    if (sscanf(l, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &ms) != 7)
        return NAN;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + ms / 1000.0;
}

/* The longest gap between two `train step=` lines of node `name` with
 * the later one in (t0, t1]. */
static double max_gap(const ds_lrun *r, const char *name, double t0, double t1)
{
    char path[PATH_MAX + 32], line[4096];
    snprintf(path, sizeof(path), "%s/%s.log", r->out, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return NAN;
    double prev = NAN, worst = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strstr(line, " train step="))
            continue;
        const double t = line_time(line);
        if (t > t0 && t <= t1 && isfinite(prev) && t - prev > worst)
            worst = t - prev;
        prev = t;
    }
    fclose(f);
    return worst;
}

static int cmp_dbl(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct crash_res {
    double worst, median, timeouts;
    int ok;
};

#define CRASH_WINDOW_S 10.0

static void crash_run(const gf_opts *o, int kill_it, struct crash_res *res)
{
    memset(res, 0, sizeof(*res));
    const char *extra[] = {"--set", "train.steps=1000000", "--set", "gossip.segments=1",
                           "--set", "train.log_every=5", NULL};
    ds_lrun r;
    if (gf_start(&r, o, 6, extra) < 0)
        return;
    double before[5] = {0};
    int ok = gf_wait_step(&r, "n0", o->steps / 5, 300);
    for (int i = 0; ok && i < 5; i++) {
        char name[4] = {'n', (char)('0' + i), 0};
        before[i] = gf_status_num(&r, name, "gossip", "timeouts");
    }
    const double t_kill = wall_now();
    if (ok && kill_it) {
        const pid_t p = ds_lrun_node_pid(&r, "n5");
        ok = p > 0 && kill(p, SIGKILL) == 0;
    }
    const double t_end = ds_bench_now() + CRASH_WINDOW_S;
    while (ok && ds_bench_now() < t_end && ds_lrun_wait(&r, 0) < 0)
        ds_lrun_sleep_ms(100);
    double gaps[5], to = 0;
    for (int i = 0; ok && i < 5; i++) {
        char name[4] = {'n', (char)('0' + i), 0};
        gaps[i] = max_gap(&r, name, t_kill, t_kill + CRASH_WINDOW_S);
        to += gf_status_num(&r, name, "gossip", "timeouts") - before[i];
    }
    if (ok) {
        qsort(gaps, 5, sizeof(gaps[0]), cmp_dbl);
        res->worst = gaps[4];
        res->median = gaps[2];
        res->timeouts = to;
        res->ok = isfinite(res->worst) && isfinite(res->median);
    }
    ds_lrun_end(&r, 1);
}

static int scenario_crash(const gf_opts *o)
{
    struct crash_res res[2];
    ds_row row;
    ds_row_table(&row, o->json);
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        crash_run(o, k, &res[k]);
        ds_row_str(&row, "scenario", "crash");
        ds_row_str(&row, "run", k ? "n5 SIGKILLed" : "baseline");
        ds_row_num(&row, "worst_survivor_max_gap_s", res[k].ok ? res[k].worst : NAN, 2);
        ds_row_num(&row, "median_survivor_max_gap_s", res[k].ok ? res[k].median : NAN, 2);
        ds_row_num(&row, "timeouts", res[k].ok ? res[k].timeouts : NAN, 0);
        bad |= ds_row_end(&row) < 0 || !res[k].ok;
    }
    return bad;
}

/* ---- the command -------------------------------------------------------------- */

static void gf_usage(FILE *f)
{
    fprintf(f, "usage: dsbench elastic --gossip-faults [--scenario straggler|crash|all]\n"
               "         [--steps 1500] [--config FILE] [--dslaunch PATH] [--dsnode PATH]\n"
               "         [--json]\n");
}

static int gf_opts_read(gf_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->scenario, sizeof(o->scenario), "all");
    o->steps = 1500;
    snprintf(o->config, sizeof(o->config), "%s/../conf/examples/cluster.ini",
             ds_bench_tools_dir());
    ds_lrun_default_dslaunch(o->dslaunch, sizeof(o->dslaunch));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--gossip-faults"))
            continue;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gf_usage(stdout);
            return 1;
        }
        if (!v || (strcmp(a, "--scenario") && strcmp(a, "--steps") && strcmp(a, "--config") &&
                   strcmp(a, "--dslaunch") && strcmp(a, "--dsnode"))) {
            fprintf(stderr, "dsbench elastic --gossip-faults: unknown option or missing "
                            "value: '%s'\n", a);
            gf_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--scenario"))
            snprintf(o->scenario, sizeof(o->scenario), "%s", v);
        else if (!strcmp(a, "--steps"))
            o->steps = atoi(v);
        else if (!strcmp(a, "--config"))
            snprintf(o->config, sizeof(o->config), "%s", v);
        else if (!strcmp(a, "--dsnode"))
            snprintf(o->dsnode, sizeof(o->dsnode), "%s", v);
        else
            snprintf(o->dslaunch, sizeof(o->dslaunch), "%s", v);
    }
    return 0;
}

static int gf_opts_check(const gf_opts *o)
{
    const char *s = o->scenario;
    if (strcmp(s, "all") && strcmp(s, "straggler") && strcmp(s, "crash")) {
        fprintf(stderr, "dsbench elastic --gossip-faults: --scenario expects straggler, crash "
                        "or all, found '%s'\n", s);
        return 2;
    }
    if (o->steps < 300 || o->steps > 100000) {
        fprintf(stderr, "dsbench elastic --gossip-faults: --steps expects 300..100000, "
                        "found %d\n", o->steps);
        return 2;
    }
    if (access(o->dslaunch, X_OK) < 0) {
        fprintf(stderr, "dsbench elastic --gossip-faults: %s: %s (pass --dslaunch)\n",
                o->dslaunch, strerror(errno));
        return 2;
    }
    return 0;
}

int ds_bench_elastic_gossip(int argc, char **argv)
{
    gf_opts o;
    int ret = gf_opts_read(&o, argc, argv);
    if (ret)
        return ret == 1 ? 0 : ret;
    if ((ret = gf_opts_check(&o)))
        return ret;
    const int all = !strcmp(o.scenario, "all");
    if (all || !strcmp(o.scenario, "straggler"))
        ret |= scenario_straggler(&o);
    if (all || !strcmp(o.scenario, "crash"))
        ret |= scenario_crash(&o);
    return ret ? 1 : 0;
}
