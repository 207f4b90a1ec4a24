/*
 * tools/dsbench/bench_elastic_faults.c: `dsbench elastic --faults`: what
 * membership faults cost a real cluster (issue 16). Three scenarios, real
 * dsnode processes started by dslaunch local (conf/examples/cluster.ini,
 * CPU backend, no evaluation until the end, status.json on):
 *
 *   dsbench elastic --faults [--scenario freeze|late|partition|all]
 *       [--freeze-s 60] [--steps 8000] [--join-timeout-s 10]
 *       [--partition-s 15] [--config FILE] [--dslaunch PATH] [--json]
 *   (DSBENCH_KEEP=1 in the environment keeps each run's directory, its
 *   configs, logs and status files, and prints where it is.)
 *
 *   freeze     4 nodes train --steps + 200 x --freeze-s steps (so that the
 *              others still train when n3 is let go) undisturbed (the
 *              baseline), then
 *              again with n3 SIGSTOPped for --freeze-s seconds from n0's
 *              step 200. Row per run: consensus distance at the end (and
 *              its ratio to the baseline's), the longest gossip round any
 *              other node waited (max_round_s, capped at the timeout), the
 *              longest time any of n0..n2 published no new step while n3
 *              was frozen and in the 20 s after SIGCONT (the undisturbed
 *              run is watched over the same windows: the noise floor),
 *              and for the frozen run how long after SIGCONT n3 counted a
 *              rejoin and was alive in n0's view again.
 *   late       3 nodes, train.steps = 1500, one node added at step 1436
 *              (the least margin dslaunch accepts) with
 *              cluster.join_timeout_s = --join-timeout-s: its exit status,
 *              how long it tried to join (its log: "joining" to "join given
 *              up"),
 *              how long it ran against the timeout, why it gave up, and
 *              whether the run ended by itself.
 *   partition  4 nodes, one network namespace each (dslaunch --netns;
 *              root), cut 2|2 for --partition-s seconds from n0's step 200
 *              by nftables rules in each namespace that drop frames to and
 *              from the other side; then healed. Row: seconds from the heal
 *              until all four status documents show one view (four members,
 *              all alive), n0's view size just before the
 *              heal (2: the sides had dropped each other), and whether a
 *              node was ever seen in a 1-node view after the heal.
 *
 * Times are taken on this machine's monotonic clock while polling the
 * status documents every 50 ms (each node rewrites its own every 200 ms
 * at most), so they are upper bounds within ~0.3 s. Every run directory is
 * a fresh mkdtemp, removed at the end with everything still running in it
 * (the dslaunch is our child and is SIGKILLed with its nodes on any error).
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

typedef struct faults_opts {
    int json;
    char scenario[16];
    int freeze_s, steps, join_timeout_s, partition_s;
    char config[PATH_MAX], dslaunch[PATH_MAX];
} faults_opts;

/* ---- dslaunch runs --------------------------------------------------------- */

/* Start dslaunch local with the common settings and `extra` (NULL-ended). */
static int run_start(ds_lrun *r, const faults_opts *o, int nodes, const char *const *extra)
{
    const char *args[64] = {"--config", o->config,
                            "--set", "train.backend=cpu", "--set", "train.eval_every=0",
                            "--set", "train.log_every=20", "--set", "gossip.timeout_ms=2000",
                            "--set", "status.file=status.json",
                            /* stalls are read from these files: 50 ms, not 500 */
                            "--set", "status.file_interval_ms=50", "--timeout", "900"};
    int k = 16;
    for (; extra && *extra && k < 50; extra++)
        args[k++] = *extra;
    args[k] = NULL;
    return ds_lrun_start(r, "faults", o->dslaunch, nodes, args);
}

/* ---- status documents --------------------------------------------------------- */

static double jpath(const json_t *doc, const char *a, const char *b)
{
    const json_t *v = json_object_get(json_object_get(doc, a), b);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *member_state(const json_t *doc, const char *name)
{
    const json_t *ms = json_object_get(json_object_get(doc, "view"), "members"), *m;
    size_t i;
    json_array_foreach(ms, i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && !strcmp(n, name))
            return json_string_value(json_object_get(m, "state"));
    }
    return NULL;
}

/* Wait until node `name` has published train.step >= step (or the run
 * ended, or timeout_s). 1 when reached. */
static int wait_step(ds_lrun *r, const char *name, long long step, double timeout_s)
{
    const double t_end = ds_bench_now() + timeout_s;
    while (ds_bench_now() < t_end && ds_lrun_wait(r, 0) < 0) {
        json_t *d = ds_lrun_status(r, name);
        const double s = d ? jpath(d, "train", "step") : NAN;
        json_decref(d);
        if (s >= (double)step)
            return 1;
        ds_lrun_sleep_ms(50);
    }
    return 0;
}

/* ---- freeze ---------------------------------------------------------------- */

struct freeze_res {
    double cd, max_round, stall_frozen, stall_after, rejoin_s, back_s;
    int ok, training_at_cont;
};

/* The longest time any of n0..n2 went without a new train.step, polled
 * from the status documents: last[] and since[] carry the state. */
struct stall_watch {
    double last[3], since[3], worst;
};

static void stall_reset(struct stall_watch *w)
{
    for (int i = 0; i < 3; i++)
        w->last[i] = NAN, w->since[i] = ds_bench_now();
    w->worst = 0;
}

static void stall_poll(const ds_lrun *r, struct stall_watch *w)
{
    const double now = ds_bench_now();
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *d = ds_lrun_status(r, name);
        const double s = d ? jpath(d, "train", "step") : NAN;
        json_decref(d);
        if (isfinite(s) && s != w->last[i]) {
            w->last[i] = s;
            w->since[i] = now;
        }
        w->worst = fmax(w->worst, now - w->since[i]);
    }
}

/* n3 counts a rejoin and n0's view lists it alive among 4. */
static int n3_back(const ds_lrun *r, int *rejoined)
{
    json_t *d3 = ds_lrun_status(r, "n3"), *d0 = ds_lrun_status(r, "n0");
    const double rj = d3 ? jpath(d3, "membership", "rejoins") : NAN;
    if (rj >= 1)
        *rejoined = 1;
    const char *st = d0 ? member_state(d0, "n3") : NULL;
    const int back = st && !strcmp(st, "alive") && jpath(d0, "view", "size") == 4;
    json_decref(d3);
    json_decref(d0);
    return back;
}

static void freeze_outcome(const ds_lrun *r, struct freeze_res *res)
{
    json_t *rep = ds_lrun_report(r);
    res->cd = rep ? json_number_value(json_object_get(rep, "consensus_distance")) : NAN;
    res->max_round = 0;
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        res->max_round = fmax(res->max_round, ds_lrun_report_num(rep, name, "max_round_s"));
    }
    res->ok = rep && r->code == 0;
    json_decref(rep);
}

/* Watch the others for secs (or until the run ends). */
static void watch_for(ds_lrun *r, struct stall_watch *w, double secs)
{
    const double t0 = ds_bench_now();
    while (ds_bench_now() - t0 < secs && ds_lrun_wait(r, 0) < 0) {
        stall_poll(r, w);
        ds_lrun_sleep_ms(50);
    }
}

/* SIGSTOP n3 for freeze_s (frozen; else leave it alone as long), SIGCONT,
 * time its way back, and the others' longest stall in both phases (after
 * SIGCONT: until AFTER_S later). */
#define AFTER_S 20
static void freeze_n3(ds_lrun *r, const faults_opts *o, int frozen, struct freeze_res *res)
{
    const pid_t p = ds_lrun_node_pid(r, "n3");
    if (p <= 0 || (frozen && kill(p, SIGSTOP) < 0))
        return;
    struct stall_watch w;
    stall_reset(&w);
    watch_for(r, &w, o->freeze_s); /* the freeze itself: what is being measured */
    res->stall_frozen = w.worst;
    json_t *d0 = ds_lrun_status(r, "n0");
    const char *phase =
        d0 ? json_string_value(json_object_get(json_object_get(d0, "node"), "state")) : NULL;
    res->training_at_cont = phase && !strcmp(phase, "training");
    json_decref(d0);
    if (frozen)
        kill(p, SIGCONT);
    const double t_cont = ds_bench_now();
    stall_reset(&w);
    int rejoined = 0;
    while (ds_bench_now() - t_cont < AFTER_S && ds_lrun_wait(r, 0) < 0) {
        stall_poll(r, &w);
        const int back = frozen && n3_back(r, &rejoined);
        if (rejoined && isnan(res->rejoin_s))
            res->rejoin_s = ds_bench_now() - t_cont;
        if (back && isnan(res->back_s))
            res->back_s = ds_bench_now() - t_cont;
        ds_lrun_sleep_ms(50);
    }
    res->stall_after = w.worst;
}

/* Steps of a freeze run: --steps plus 200 per second frozen, so that the
 * others are still training when n3 is let go (~175 steps/s here). */
static int freeze_steps(const faults_opts *o)
{
    return o->steps + 200 * o->freeze_s;
}

static int freeze_run(const faults_opts *o, int frozen, struct freeze_res *res)
{
    char steps[48];
    snprintf(steps, sizeof(steps), "train.steps=%d", freeze_steps(o));
    const char *extra[] = {"--set", steps, NULL};
    ds_lrun r;
    *res = (struct freeze_res){.rejoin_s = NAN, .back_s = NAN, .stall_frozen = NAN,
                               .stall_after = NAN};
    int e = run_start(&r, o, 4, extra);
    if (e == 0) {
        if (wait_step(&r, "n0", 200, 300))
            freeze_n3(&r, o, frozen, res);
        ds_lrun_wait(&r, 900);
        freeze_outcome(&r, res);
    }
    ds_lrun_end(&r, 0);
    return e;
}

static void freeze_row(ds_row *row, const faults_opts *o, const char *run,
                       const struct freeze_res *x, double cd_base)
{
    ds_row_str(row, "scenario", "freeze");
    ds_row_str(row, "run", run);
    ds_row_int(row, "freeze_s", run[0] == 'u' ? 0 : o->freeze_s);
    ds_row_int(row, "steps", freeze_steps(o));
    ds_row_str(row, "ok", x->ok ? "yes" : "no");
    ds_row_str(row, "n0_training_at_cont", x->training_at_cont ? "yes" : "no");
    ds_row_num(row, "consensus_distance", x->cd, 6);
    ds_row_num(row, "vs_undisturbed", x->cd / cd_base, 2);
    ds_row_num(row, "others_max_round_s", x->max_round, 2);
    ds_row_num(row, "others_stall_frozen_s", x->stall_frozen, 1);
    ds_row_num(row, "others_stall_after_s", x->stall_after, 1);
    ds_row_num(row, "rejoin_after_cont_s", x->rejoin_s, 1);
    ds_row_num(row, "back_in_view_s", x->back_s, 1);
    ds_row_end(row);
}

static int scenario_freeze(const faults_opts *o)
{
    struct freeze_res base, fz;
    if (freeze_run(o, 0, &base) < 0 || freeze_run(o, 1, &fz) < 0)
        return 1;
    ds_row row;
    ds_row_table(&row, o->json);
    freeze_row(&row, o, "undisturbed", &base, base.cd);
    freeze_row(&row, o, "n3 frozen", &fz, base.cd);
    return base.ok && fz.ok ? 0 : 1;
}

/* ---- late joiner ------------------------------------------------------------ */

/* Seconds since midnight of a log line's timestamp (NAN if none). */
static double log_time(const char *line)
{
    int h, m;
    double sec;
    return sscanf(line, "%*d-%*d-%*dT%d:%d:%lfZ", &h, &m, &sec) == 3 ? h * 3600.0 + m * 60 + sec
                                                                       : NAN;
}

/* Why n3 gave up, and how long it tried (from "joining" to "join given
 * up" in its log; *tried_s NAN when either line is missing). */
static const char *late_reason(const json_t *rep, double *tried_s)
{
    const char *path = json_string_value(
        json_object_get(json_object_get(json_object_get(rep, "nodes"), "n3"), "log"));
    FILE *f = path ? fopen(path, "r") : NULL;
    const char *why = "?";
    char line[2048];
    double t_join = NAN, t_gave = NAN;
    while (f && fgets(line, sizeof(line), f)) {
        if (strstr(line, "joining through") && isnan(t_join))
            t_join = log_time(line);
        if (strstr(line, "join given up"))
            t_gave = log_time(line);
        if (strstr(line, "cannot join cluster"))
            why = strstr(line, "all ") && strstr(line, "are leaving") ? "all seeds finishing"
                                                                       : "join_timeout_s";
    }
    if (f)
        fclose(f);
    *tried_s = t_gave - t_join;
    return why;
}

static int scenario_late(const faults_opts *o)
{
    char jt[48];
    snprintf(jt, sizeof(jt), "cluster.join_timeout_s=%d", o->join_timeout_s);
    const char *extra[] = {"--set", "train.steps=1500", "--set", jt, "--add-at", "1436:1", NULL};
    ds_lrun r;
    if (run_start(&r, o, 3, extra) < 0)
        return 1;
    const double t0 = ds_bench_now();
    ds_lrun_wait(&r, 900);
    const double wall = ds_bench_now() - t0;
    json_t *rep = ds_lrun_report(&r);
    ds_row row;
    ds_row_table(&row, o->json);
    ds_row_str(&row, "scenario", "late joiner");
    ds_row_int(&row, "join_timeout_s", o->join_timeout_s);
    ds_row_num(&row, "joiner_exit", ds_lrun_report_num(rep, "n3", "exit_status"), 0);
    double tried_s = NAN;
    const char *why = rep ? late_reason(rep, &tried_s) : "?";
    ds_row_num(&row, "joiner_tried_s", tried_s, 1);
    ds_row_num(&row, "joiner_ran_s", ds_lrun_report_num(rep, "n3", "wall_s"), 1);
    ds_row_str(&row, "reason", why);
    ds_row_str(&row, "run_ended_by_itself",
               rep && json_is_null(json_object_get(rep, "stopped_by")) ? "yes" : "no");
    ds_row_num(&row, "run_wall_s", wall, 1);
    ds_row_end(&row);
    const int ok = rep && ds_lrun_report_num(rep, "n3", "exit_status") == 1;
    json_decref(rep);
    ds_lrun_end(&r, 0);
    return ok ? 0 : 1;
}

/* ---- partition ---------------------------------------------------------------- */

/* The host part of node `name`'s listen address (from DIR/name.ini). */
static int node_host(const ds_lrun *r, const char *name, char *out, size_t len)
{
    char path[PATH_MAX + 32], line[512];
    snprintf(path, sizeof(path), "%s/%s.ini", r->out, name);
    FILE *f = fopen(path, "r");
    int found = -1;
    while (f && found < 0 && fgets(line, sizeof(line), f)) {
        char host[256];
        if (sscanf(line, " listen = %255[^:]", host) == 1) {
            snprintf(out, len, "%s", host);
            found = 0;
        }
    }
    if (f)
        fclose(f);
    return found;
}

/* Run `ip netns exec NS nft ARGS...` (fixed argv, no shell). 0 or -1. */
static int nft_in(const char *ns, const char *const *args)
{
    const char *argv[24] = {"/usr/sbin/ip", "netns", "exec", ns, "/usr/sbin/nft"};
    int k = 5;
    for (; *args && k < 23; args++)
        argv[k++] = *args;
    argv[k] = NULL;
    pid_t p = fork();
    if (p < 0)
        return -1;
    if (p == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Cut node i (namespace) off from the hosts of the other side, or heal. */
static int cut(const ds_lrun *r, int i, const char *other_a, const char *other_b, int on)
{
    char ns[64], set[160];
    snprintf(ns, sizeof(ns), "dsl-%d-n%d", (int)r->pid, i);
    if (!on) {
        const char *del[] = {"delete", "table", "inet", "dsbench_cut", NULL};
        return nft_in(ns, del);
    }
    snprintf(set, sizeof(set), "{ %s, %s }", other_a, other_b);
    const char *t[] = {"add", "table", "inet", "dsbench_cut", NULL};
    const char *ci[] = {"add", "chain", "inet", "dsbench_cut", "in",
                        "{ type filter hook input priority 0 ; }", NULL};
    const char *co[] = {"add", "chain", "inet", "dsbench_cut", "out",
                        "{ type filter hook output priority 0 ; }", NULL};
    const char *ri[] = {"add", "rule", "inet", "dsbench_cut", "in", "ip", "saddr", set, "drop",
                        NULL};
    const char *ro[] = {"add", "rule", "inet", "dsbench_cut", "out", "ip", "daddr", set, "drop",
                        NULL};
    return nft_in(ns, t) || nft_in(ns, ci) || nft_in(ns, co) || nft_in(ns, ri) || nft_in(ns, ro)
               ? -1
               : 0;
}

/* All four documents: 4 members, all alive. *solo: a node seen alone in a
 * view of one (itself: view.me set). A node out of the view while it
 * rejoins (view.me null; it shadows the cluster's state) is not alone. */
static int one_view(const ds_lrun *r, int *solo)
{
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *d = ds_lrun_status(r, name);
        const double size = d ? jpath(d, "view", "size") : NAN;
        if (size == 1 && json_is_integer(json_object_get(json_object_get(d, "view"), "me")))
            *solo = 1;
        int alive = 0;
        for (int k = 0; d && k < 4; k++) {
            char m[8];
            snprintf(m, sizeof(m), "n%d", k);
            const char *st = member_state(d, m);
            alive += st && !strcmp(st, "alive");
        }
        ok = ok && size == 4 && alive == 4;
        json_decref(d);
    }
    return ok;
}

static int partition_cut(ds_lrun *r, int on)
{
    char h[4][256];
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        if (node_host(r, name, h[i], sizeof(h[i])) < 0)
            return -1;
    }
    int e = 0;
    for (int i = 0; i < 4; i++)
        e |= i < 2 ? cut(r, i, h[2], h[3], on) : cut(r, i, h[0], h[1], on);
    return e;
}

static int scenario_partition(const faults_opts *o)
{
    char steps[48];
    snprintf(steps, sizeof(steps), "train.steps=%d", o->steps);
    const char *extra[] = {"--set", steps, "--netns", NULL};
    ds_lrun r;
    if (run_start(&r, o, 4, extra) < 0)
        return 1;
    double heal_to_one = NAN, view_cut = NAN;
    int solo = 0, cut_ok = 0;
    if (wait_step(&r, "n0", 200, 300) && partition_cut(&r, 1) == 0) {
        cut_ok = 1;
        const double t_cut = ds_bench_now();
        while (ds_bench_now() - t_cut < o->partition_s && ds_lrun_wait(&r, 0) < 0)
            ds_lrun_sleep_ms(100); /* the partition itself: what is being measured */
        json_t *d0 = ds_lrun_status(&r, "n0");
        view_cut = d0 ? jpath(d0, "view", "size") : NAN;
        json_decref(d0);
        partition_cut(&r, 0);
        const double t_heal = ds_bench_now();
        while (ds_bench_now() - t_heal < 120 && ds_lrun_wait(&r, 0) < 0) {
            if (one_view(&r, &solo)) {
                heal_to_one = ds_bench_now() - t_heal;
                break;
            }
            ds_lrun_sleep_ms(50);
        }
    }
    ds_lrun_wait(&r, 900);
    json_t *rep = ds_lrun_report(&r);
    ds_row row;
    ds_row_table(&row, o->json);
    ds_row_str(&row, "scenario", "partition 2|2");
    ds_row_int(&row, "partition_s", o->partition_s);
    ds_row_str(&row, "cut", cut_ok ? "yes" : "no (needs root, ip, nft)");
    ds_row_num(&row, "n0_view_before_heal", view_cut, 0);
    ds_row_num(&row, "heal_to_one_view_s", heal_to_one, 1);
    ds_row_str(&row, "solo_view_after_heal", solo ? "yes" : "no");
    ds_row_num(&row, "consensus_distance",
               rep ? json_number_value(json_object_get(rep, "consensus_distance")) : NAN, 4);
    ds_row_num(&row, "exit", r.code, 0);
    ds_row_end(&row);
    json_decref(rep);
    ds_lrun_end(&r, 0);
    return cut_ok && isfinite(heal_to_one) ? 0 : 1;
}

/* ---- the command -------------------------------------------------------------- */

static void faults_usage(FILE *f)
{
    fprintf(f, "usage: dsbench elastic --faults [--scenario freeze|late|partition|all]\n"
               "         [--freeze-s 60] [--steps 8000] [--join-timeout-s 10]\n"
               "         [--partition-s 15] [--config FILE] [--dslaunch PATH] [--json]\n");
}

static int faults_opts_read(faults_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->scenario, sizeof(o->scenario), "all");
    o->freeze_s = 60;
    o->steps = 8000;
    o->join_timeout_s = 10;
    o->partition_s = 15;
    snprintf(o->config, sizeof(o->config), "%s/../conf/examples/cluster.ini",
             ds_bench_tools_dir());
    ds_lrun_default_dslaunch(o->dslaunch, sizeof(o->dslaunch));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--faults"))
            continue;
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            faults_usage(stdout);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "dsbench elastic --faults: unknown option or missing value: '%s'\n",
                    a);
            faults_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--scenario"))
            snprintf(o->scenario, sizeof(o->scenario), "%s", v);
        else if (!strcmp(a, "--freeze-s"))
            o->freeze_s = atoi(v);
        else if (!strcmp(a, "--steps"))
            o->steps = atoi(v);
        else if (!strcmp(a, "--join-timeout-s"))
            o->join_timeout_s = atoi(v);
        else if (!strcmp(a, "--partition-s"))
            o->partition_s = atoi(v);
        else if (!strcmp(a, "--config"))
            snprintf(o->config, sizeof(o->config), "%s", v);
        else if (!strcmp(a, "--dslaunch"))
            snprintf(o->dslaunch, sizeof(o->dslaunch), "%s", v);
        else {
            fprintf(stderr, "dsbench elastic --faults: unknown option '%s'\n", a);
            faults_usage(stderr);
            return 2;
        }
    }
    return 0;
}

static int faults_opts_check(const faults_opts *o)
{
    const char *s = o->scenario;
    if (strcmp(s, "all") && strcmp(s, "freeze") && strcmp(s, "late") && strcmp(s, "partition")) {
        fprintf(stderr, "dsbench elastic --faults: --scenario expects freeze, late, partition "
                        "or all, found '%s'\n", s);
        return 2;
    }
    if (o->freeze_s < 1 || o->freeze_s > 600 || o->steps < 500 || o->steps > 1000000 ||
        o->join_timeout_s < 1 || o->join_timeout_s > 600 || o->partition_s < 1 ||
        o->partition_s > 600) {
        fprintf(stderr, "dsbench elastic --faults: need 1 <= --freeze-s, --join-timeout-s, "
                        "--partition-s <= 600 and 500 <= --steps <= 1000000\n");
        return 2;
    }
    if (access(o->dslaunch, X_OK) < 0) {
        fprintf(stderr, "dsbench elastic --faults: %s: %s (pass --dslaunch)\n", o->dslaunch,
                strerror(errno));
        return 2;
    }
    return 0;
}

int ds_bench_elastic_faults(int argc, char **argv)
{
    faults_opts o;
    int ret = faults_opts_read(&o, argc, argv);
    if (ret)
        return ret == 1 ? 0 : ret;
    if ((ret = faults_opts_check(&o)))
        return ret;
    const int all = !strcmp(o.scenario, "all");
    if (all || !strcmp(o.scenario, "late"))
        ret |= scenario_late(&o);
    if (all || !strcmp(o.scenario, "partition"))
        ret |= scenario_partition(&o);
    if (all || !strcmp(o.scenario, "freeze"))
        ret |= scenario_freeze(&o);
    return ret ? 1 : 0;
}
