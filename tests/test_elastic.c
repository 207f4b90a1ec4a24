/*
 * tests/test_elastic.c: what a real cluster of dsnode processes does
 * together, started on loopback by dslaunch (tools/dslaunch).
 *
 * Suites in one binary, registered separately in meson (both slow, one
 * test at a time):
 *
 *   cluster   decentralized training (issue 5): four nodes per topology
 *             and mixing rule train, clear an accuracy bound and exchange
 *             real traffic; crossover + MiCRO keeps the models close.
 *   elastic   membership while the cluster trains (issue 6): newcomers get
 *             the state and catch up, two crashes out of six cost no
 *             accuracy, a frozen node comes back, a graceful leave is seen
 *             as a leave, a node under the wrong key is refused.
 *
 * The elastic tests act while the nodes train (kill, stop, start one more)
 * and check what the cluster then knows. They read it from the nodes'
 * status documents (docs/status.md: train.step, node.state, the view with
 * each member's state, the counters), which dslaunch has every node write
 * to DIR/nI/status.json (STATUS_FILE_ON). Every wait is on such a state
 * ("n0 reached step 150", "every node's view has 6 members", "n3 is left
 * in n0's view") with a hard deadline, never a sleep followed by a hope;
 * results come from the same documents, from the summary line (dslaunch's
 * --json carries every key of it) and from --json itself. A node's
 * evaluations over time are the one thing a document does not keep (it
 * has the last one): those come from the nodes' `eval` lines, read as
 * dslaunch reads them (ds_logline_split, ds_kv_parse: component `eval`,
 * keys step= and test_acc=, the contract of docs/dslaunch.md).
 *
 * Wall-clock bounds that remain are requirements, not synchronisation:
 * issue 6's "no gossip round waits longer than the timeout + 1 s"
 * (max_round_s of the summary line) and the 5 s a node is frozen.
 *
 * Run: meson test -C build cluster elastic --num-processes 1 --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"
#include "topology/topology.h"

static const char *const node_names[] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};

/* ================================================================================ */
/* cluster: decentralized training across real processes (issue 5)                  */
/* ================================================================================ */

TestSuite(cluster, .init = tmp_init, .fini = tmp_fini, .timeout = 280);

/* Four dsnode processes on loopback, the given gossip settings, `steps`
 * steps. Every node must finish, clear min_acc and have exchanged data;
 * returns dslaunch's report (caller json_decref()s). */
static json_t *run_cluster(const char *topology, const char *mix, const char *method, int steps,
                           double min_acc)
{
    const char *out = tmp_path(topology);
    char s_steps[64], s_topo[64], s_mix[64], s_method[64];
    snprintf(s_steps, sizeof(s_steps), "train.steps=%d", steps);
    snprintf(s_topo, sizeof(s_topo), "gossip.topology=%s", topology);
    snprintf(s_mix, sizeof(s_mix), "gossip.mix=%s", mix);
    snprintf(s_method, sizeof(s_method), "sparsify.method=%s", method);
    const char *args[] = {"local", "-n", "4", "--config", BASE_CONFIG,
                          "--set", s_steps, "--set", "train.eval_every=0",
                          "--set", "train.backend=cpu", "--set", s_topo, "--set", s_mix,
                          "--set", s_method, "--set", "sparsify.density=0.01",
                          "--set", "gossip.timeout_ms=2000",
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct result r = run_dslaunch(260000, args);
    cr_assert_eq(r.code, 0, "%s/%s/%s: dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", topology, mix,
                 method, r.code, r.out, r.err);
    json_t *j = last_json(r.out);
    const json_t *nodes = json_object_get(j, "nodes");
    cr_assert(json_is_object(nodes) && json_object_size(nodes) == 4, "four nodes in the JSON");
    double lowest = 1;
    for (int i = 0; i < 4; i++) {
        const char *name = node_names[i];
        check_node_ok(nodes, name, min_acc);
        const json_t *n = jnode(j, name);
        cr_assert_eq(jnum(n, "steps"), steps);
        /* Membership alone is a few KB; gossip of 1% of 269k parameters
         * each round is far more (a 300-step run sends ~10 MB a node). */
        cr_assert_gt(jnum(n, "bytes_sent"), 1e6, "%s/%s: %s sent %.0f bytes", topology, mix, name,
                     jnum(n, "bytes_sent"));
        if (jnum(n, "test_acc") < lowest)
            lowest = jnum(n, "test_acc");
    }
    cr_log_info("%s/%s/%s, %d steps: mean test_acc %.4f (lowest node %.4f), consensus distance "
                "%.4f",
                topology, mix, method, steps, jnum(j, "mean_test_acc"), lowest,
                jnum(j, "consensus_distance"));
    result_free(&r);
    return j;
}

/* Every node above 0.80 after 600 steps: the goal this test was written
 * for (crossover + MiCRO at 1% reaches 80%), not a figure fitted to a
 * run. Measured on the shared 2-core machine (avx2 kernels), 2 runs: the
 * lowest node 0.8659 both times (seeds fix data and initialisation; only
 * a round lost to a timeout changes the mixing). The 6.6 pt between them
 * is room for other kernels' rounding and rounds lost under load; a node
 * that stopped mixing or diverged falls well below. */
Test(cluster, crossover_micro_reaches_80_percent_and_agrees)
{
    json_t *j = run_cluster("crossover", "pairwise", "micro", 600, 0.80);
    /* Gossip keeps the models close: they drift apart by a few percent of
     * their norm at most. Measured 0.0221 in both runs (dsbench cluster:
     * 0.030 for this variant at 3000 steps); independent runs differ by
     * far more, ~100%, so 0.1 still tells mixing from none, with room for
     * four times the distance seen. */
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1);
    json_decref(j);
}

/* Every node above 0.70 after 300 steps, for every topology and mixing
 * rule. Measured on the shared 2-core machine (avx2 kernels), 2 runs, the
 * lowest node per variant: ring/MiCRO 0.8549 both times, exponential/SAGE
 * 0.8557 both, random/top-k 0.8541 and 0.8557, crossover dense 0.8615 and
 * allreduce 0.8626 both. The test is that each variant trains and
 * gossips, not a ranking of them (they lie within 1 pt), so the bound is
 * a trained model's and sits 15 pt under the lowest seen: an untrained
 * node scores about 0.1, and one whose gossip corrupts the model far less
 * than 0.70. */
Test(cluster, every_topology_and_mixing_rule_trains)
{
    static const char *const runs[][3] = {
        {"ring", "pairwise", "micro"},
        {"exponential", "pairwise", "sage"},
        {"random", "pairwise", "topk"},
        {"crossover", "crossover", "none"},
        {"allreduce", "pairwise", "none"},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        json_t *j = run_cluster(runs[i][0], runs[i][1], runs[i][2], 300, 0.70);
        json_decref(j);
    }
}

/* ================================================================================ */
/* elastic: joins, crashes, freezes and leaves while the cluster trains (issue 6)   */
/* ================================================================================ */

TestSuite(elastic, .init = tmp_init, .fini = tmp_fini, .timeout = 290);

/* The leave run: 1000 steps. The leave, sent at step 150, takes effect
 * the membership lag later (5 s of the rounds' peak pace: 200-320 rounds
 * for 4 nodes here), and the test wants it taken 50 steps before the end:
 * with 500 steps that left 300 rounds, and CI 56's n2 took it only after
 * step 450. 800 rounds of margin hold a peak pace of 160 rounds/s. */
#define EL_STEP_COUNT 1000
#define EL_STR(x) #x
#define EL_SET_STEPS(n) "train.steps=" EL_STR(n)
#define EL_STEPS EL_SET_STEPS(EL_STEP_COUNT)
/* The two-crash run: long enough after its kill at step 150 for the
 * survivors to notice, however fast the machine. Noticing takes about 2 s
 * of time (1.5-2.0 s measured); since the deadline's 10 ms floor, 6 nodes
 * of this model train about 150 steps/s each here, so 350 steps after the
 * kill lasted about 2.3 s, and a CI run's n1 finished before noticing. */
#define EL_CRASH_STEPS EL_SET_STEPS(1500)

/* log_every = 10: --add-at fires on train lines (dslaunch), so this is the
 * granularity of a newcomer's start. */
static const char *const el_common[] = {
    "--set", "train.backend=cpu", "--set", "train.log_every=10", "--set", "gossip.timeout_ms=2000",
    "--set", STATUS_FILE_ON,
};

/* args for dslaunch: local -n N --config ... common --set extra... --out out --json */
static void el_args(const char **args, int n_nodes, const char *out, const char *const *extra)
{
    static char nbuf[8];
    int k = 0;
    snprintf(nbuf, sizeof(nbuf), "%d", n_nodes);
    args[k++] = "local";
    args[k++] = "-n";
    args[k++] = nbuf;
    args[k++] = "--config";
    args[k++] = BASE_CONFIG;
    for (size_t i = 0; i < sizeof(el_common) / sizeof(el_common[0]); i++)
        args[k++] = el_common[i];
    for (; extra && *extra; extra++)
        args[k++] = *extra;
    args[k++] = "--out";
    args[k++] = out;
    args[k++] = "--json";
    args[k++] = "--timeout";
    args[k++] = "240";
    args[k++] = "--dsnode";
    args[k++] = bin("DSNODE");
    args[k] = NULL;
}

/* 1 when the document's view lists the member as alive. */
static int listed_alive(const json_t *doc, const char *name)
{
    const char *m = status_member(doc, name);
    return m && !strcmp(m, "alive");
}

static uint64_t now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* From node `name`'s log, the lines of `component` whose message starts
 * with `prefix` and carries `key` (and `key2`, unless NULL): their values
 * into v (and v2), in order; returns how many (at most max). */
static int log_values(const char *out, const char *name, const char *component,
                      const char *prefix, const char *key, const char *key2, double *v,
                      double *v2, int max)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", out, name);
    char *log = read_text(path);
    cr_assert_not_null(log, "%s: no log", path);
    const size_t np = strlen(prefix);
    int n = 0;
    for (char *save = NULL, *line = strtok_r(log, "\n", &save); line && n < max;
         line = strtok_r(NULL, "\n", &save)) {
        ds_logline ll;
        ds_kvline kv;
        double a, b = 0;
        if (ds_logline_split(line, &ll) < 0 || strcmp(ll.component, component) ||
            strncmp(ll.msg, prefix, np))
            continue;
        ds_kv_parse(ll.msg + np, &kv);
        if (ds_kv_get_double(&kv, key, &a) == 0 &&
            (!key2 || ds_kv_get_double(&kv, key2, &b) == 0)) {
            v[n] = a;
            if (v2)
                v2[n] = b;
            n++;
        }
    }
    free(log);
    return n;
}

/* The node's evaluations (step, test_acc) from its `eval` lines, in order;
 * returns how many (at most max). */
static int evals_of(const char *out, const char *name, long long *step, double *acc, int max)
{
    double s[64];
    const int n = log_values(out, name, "eval", "", "step", "test_acc", s, acc,
                             max < 64 ? max : 64);
    for (int i = 0; i < n; i++)
        step[i] = (long long)s[i];
    return n;
}

/* The step of the first model state the node received ("model state
 * received: step=N" in its log), or -1. */
static long long state_step(const char *out, const char *name)
{
    double s;
    return log_values(out, name, "state", "model state received: ", "step", NULL, &s, NULL, 1)
               ? (long long)s
               : -1;
}

/* test_acc at `step` among evals_of's results, or -1. */
static double acc_at(const long long *step, const double *acc, int n, long long at)
{
    for (int i = 0; i < n; i++)
        if (step[i] == at)
            return acc[i];
    return -1;
}

/* What the join test follows in the documents of all six nodes. A
 * newcomer's join is a round, the same on every node; the original nodes'
 * documents place it. One that does not list newcomer k yet says k joins
 * after its step; one that lists k says k joined at or before the view
 * epoch it shows (the largest effective round of any change so far,
 * docs/membership.md), which is k's join round itself when no later
 * change came first. Rounds are steps here (gossip.every = 1) counted
 * from round0, the document's round minus its step. */
struct join_watch {
    const char *out;
    long long before[6]; /* newcomer k: the last step a node trained at without k in its view */
    long long join[6];   /* the smallest epoch, as a step, of a view listing k */
    long long first[6];  /* newcomer k's step in its first document in state training */
    int full[6];         /* node i's view was seen with all six members */
};

static int everyone_sees_six(void *arg)
{
    struct join_watch *w = arg;
    int all = 1;
    for (int i = 0; i < 6; i++) {
        json_t *doc = status_load(w->out, node_names[i]);
        if (!doc) {
            all = 0;
            continue;
        }
        const long long step = status_step(doc);
        const int training = !strcmp(status_state(doc), "training");
        if (i >= 4 && training && w->first[i] < 0)
            w->first[i] = step;
        for (int k = 4; k < 6 && training && i < 4; k++) {
            if (status_member(doc, node_names[k])) {
                const long long round0 = (long long)status_num(doc, "round") - step;
                const long long at = (long long)status_num(doc, "epoch") - round0;
                if (w->join[k] < 0 || at < w->join[k])
                    w->join[k] = at;
            } else if (step > w->before[k]) {
                w->before[k] = step;
            }
        }
        if (status_view_size(doc) == 6)
            w->full[i] = 1;
        all &= w->full[i];
        json_decref(doc);
    }
    return all;
}

Test(elastic, nodes_added_mid_run_get_the_state_and_catch_up)
{
    const char *out = tmp_path("join");
    /* Long enough that the newcomers join while the others still train;
     * late enough (step 500: 2.5 s and more) that the members have
     * measured their pace over a 2 s window, which a joiner needs to bring
     * its join round forward (node/runtime/lag.h). */
    const char *extra[] = {"--set", "train.steps=1500", "--set", "train.eval_every=50",
                           "--add-at", "500:2", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    /* The newcomers enter every view: 6 members on every node. */
    struct join_watch w = {.out = out};
    for (int k = 0; k < 6; k++)
        w.before[k] = w.join[k] = w.first[k] = -1;
    const int joined = live_wait(&l, 200000, everyone_sees_six, &w);
    cr_assert(joined, "not every node saw a view of 6 within 200 s (n0..n5: %d %d %d %d %d %d)%s",
              w.full[0], w.full[1], w.full[2], w.full[3], w.full[4], w.full[5],
              l.exited ? "; dslaunch exited" : "");
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 0, "dslaunch exit %d\nstderr:\n%s", code, l.err);
    json_t *j = last_json(l.out);
    cr_assert_eq(json_object_size(json_object_get(j, "nodes")), 6, "six nodes ran");
    for (int k = 4; k < 6; k++) {
        const char *name = node_names[k];
        /* It got the cluster's state: it trained from the cluster's step
         * (>= 500, where --add-at started it), not from 0, and ended with
         * the others. */
        cr_assert_geq(w.first[k], 500, "%s started training at step %lld", name, w.first[k]);
        cr_assert_eq(jnum(jnode(j, name), "steps"), 1500, "%s ended with the cluster", name);
        /* Its join round, as a step: after every step seen without it,
         * at or before the epoch of every view seen with it, and after the
         * step of the first state it received (its log; its documents,
         * every 0.5 s, can come after a join round brought forward to a
         * quarter of a second). */
        const long long from = w.join[k], got = state_step(out, name);
        cr_log_info("%s: state from step %lld; last seen outside the view at step %lld, joined "
                    "at step %lld", name, got, w.before[k], from);
        cr_assert_geq(got, 500, "%s: its first state was of step %lld", name, got);
        cr_assert(from > w.before[k] && from > got,
                  "%s: join at step %lld, yet outside a view at step %lld (state of step %lld)",
                  name, from, w.before[k], got);
        /* With the state in hand it brought its join round forward from
         * the seed's full lag (issue 17: in the view within 2 s of
         * starting; timed in dsbench elastic, in_view_s). */
        json_t *doc = status_load(out, name);
        cr_assert_not_null(doc, "%s: no status document", name);
        cr_expect_eq(status_num(doc, "membership.joins_advanced"), 1,
                     "%s did not bring its join round forward", name);
        json_decref(doc);
        /* Issue 6: within 1 pt of the others' test accuracy within 200
         * steps: at some evaluation in (from, from + 200]. One node against
         * the others' mean at one evaluation moves by about 1 pt by itself
         * (the original nodes differ that much), so the first evaluation
         * alone would be a coin toss near the bound; the four evaluations
         * of the window give it four draws. Measured on the shared 2-core
         * machine, 2 runs: each newcomer within 1 pt at 3 of its 4
         * evaluations, 0.05-1.6 pt apart. The bound is the issue's. */
        long long st_mine[64], st_o[4][64];
        double acc_mine[64], acc_o[4][64];
        const int n_mine = evals_of(out, name, st_mine, acc_mine, 64);
        int n_o[4];
        for (int o = 0; o < 4; o++)
            n_o[o] = evals_of(out, node_names[o], st_o[o], acc_o[o], 64);
        int evals = 0, close = 0;
        double best = 1;
        for (long long st = ((from + 50) / 50) * 50; st <= from + 200 && st <= 1500; st += 50) {
            const double mine = acc_at(st_mine, acc_mine, n_mine, st);
            if (mine < 0)
                continue;
            double others = 0;
            int no = 0;
            for (int o = 0; o < 4; o++) {
                const double v = acc_at(st_o[o], acc_o[o], n_o[o], st);
                if (v >= 0) {
                    others += v;
                    no++;
                }
            }
            if (!no)
                continue;
            others /= no;
            evals++;
            close += fabs(mine - others) <= 0.01;
            if (fabs(mine - others) < best)
                best = fabs(mine - others);
            cr_log_info("%s (joined at step %lld): test_acc %.4f at step %lld, the others %.4f",
                        name, from, mine, st, others);
        }
        cr_assert_gt(evals, 0, "%s never evaluated in the 200 steps after step %lld", name, from);
        cr_expect(close > 0, "%s not within 1 pt of the others at any of %d evaluations in the 200 "
                  "steps after step %lld (closest %.4f apart)", name, evals, from, best);
    }
    json_decref(j);
    live_free(&l);
}

/* Every survivor has noticed both victims: its view no longer lists them
 * alive (suspect or dead, or no more). Noticing is what the run leaves
 * time for: the first suspicion comes 1-3 s after a kill, while a death
 * is declared 5 s of suspicion later (6-8 s after the kill,
 * docs/bench/elastic.md), about when the 1,500-step run ends on an
 * unloaded machine; the log line says how far each survivor got, and how
 * long after the kill. */
struct crash_watch {
    const char *out;
    int noticed[4];
    long long at[4];   /* the step of the document that first showed it */
    double dead[4];    /* membership.dead then */
    uint64_t kill_ms;  /* when the victims were killed (unix ms) */
    uint64_t ms[4];    /* how long after that the document showed it */
};

static int survivors_notice(void *arg)
{
    struct crash_watch *w = arg;
    int all = 1;
    for (int i = 0; i < 4; i++) {
        json_t *doc = w->noticed[i] ? NULL : status_load(w->out, node_names[i]);
        if (doc && !listed_alive(doc, "n4") && !listed_alive(doc, "n5")) {
            w->noticed[i] = 1;
            w->at[i] = status_step(doc);
            w->dead[i] = status_num(doc, "membership.dead");
            w->ms[i] = now_unix_ms() - w->kill_ms;
        }
        json_decref(doc);
        all &= w->noticed[i];
    }
    return all;
}

/* 6 nodes, 2 SIGKILLed mid-run: the survivors notice and finish, no
 * round waits longer than the gossip timeout + 1 s, and the final
 * accuracy is within 1 pt of the same cluster undisturbed. */
Test(elastic, two_crashes_out_of_six)
{
    const char *extra[] = {"--set", EL_CRASH_STEPS, "--set", "train.eval_every=0", NULL};
    const char *args[40];

    const char *calm = tmp_path("calm");
    el_args(args, 6, calm, extra);
    struct result r0 = run_dslaunch(280000, args);
    cr_assert_eq(r0.code, 0, "undisturbed run: exit %d\nstderr:\n%s", r0.code, r0.err);
    json_t *j0 = last_json(r0.out);
    double calm_acc = 0;
    for (int i = 0; i < 4; i++)
        calm_acc += jnum(jnode(j0, node_names[i]), "test_acc") / 4;

    const char *out = tmp_path("crash");
    el_args(args, 6, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 200000);
    const uint64_t kill_ms = now_unix_ms();
    for (int i = 4; i < 6; i++) {
        const pid_t p = node_pid(out, node_names[i]);
        cr_assert_gt(p, 0, "%s not found", node_names[i]);
        cr_assert_eq(kill(p, SIGKILL), 0);
    }
    /* The survivors notice while they train on (a survivor that finishes
     * first is checked on its last document). */
    struct crash_watch cw = {.out = out, .kill_ms = kill_ms};
    cr_assert(live_wait(&l, 120000, survivors_notice, &cw),
              "a survivor still listed n4 or n5 alive after 120 s or at its end (n0..n3: %d %d "
              "%d %d)%s",
              cw.noticed[0], cw.noticed[1], cw.noticed[2], cw.noticed[3],
              l.exited ? "; dslaunch exited" : "");
    for (int i = 0; i < 4; i++)
        cr_log_info("%s no longer listed n4 and n5 alive by step %lld, %llu ms after the kill "
                    "(%.0f dead in its table)",
                    node_names[i], cw.at[i], (unsigned long long)cw.ms[i], cw.dead[i]);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 1, "dslaunch reports the two killed nodes: exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    double acc = 0;
    for (int i = 0; i < 4; i++) {
        const json_t *n = jnode(j, node_names[i]);
        cr_assert_eq(jnum(n, "exit_status"), 0, "%s exit", node_names[i]);
        acc += jnum(n, "test_acc") / 4;
        /* Issue 6: no gossip round waits longer than the timeout (2 s
         * here) + 1 s. max_round_s is the summary line's longest wait. */
        const double max_round = jnum(n, "max_round_s");
        cr_expect(max_round >= 0 && max_round <= 2.0 + 1.0, "%s: a round took %.3f s",
                  node_names[i], max_round);
    }
    /* Issue 15's membership timeline: each survivor's last document
     * lists each killed node's death with its removal round, after its
     * join; or, when the survivor ended before the suspicion timed out
     * (a CI run's n2 finished 1.3 s after suspecting both), its suspicion,
     * with the view still showing it suspect. (The view is the round's
     * and keeps a member until its removal round, with the state it had
     * when the view was made; so a death may show there as suspect.) */
    for (int i = 0; i < 4; i++) {
        json_t *doc = status_load(out, node_names[i]);
        cr_assert_not_null(doc);
        const json_t *ev = json_object_get(doc, "events");
        for (int d = 4; d < 6; d++) {
            const char *state = status_member(doc, node_names[d]);
            const char *newest = NULL;
            int ok = 0, joined = 0;
            for (size_t k = 0; k < json_array_size(ev); k++) {
                const json_t *e = json_array_get(ev, k);
                const char *m = json_string_value(json_object_get(e, "member"));
                const char *what = json_string_value(json_object_get(e, "event"));
                if (!m || strcmp(m, node_names[d]) || !what)
                    continue;
                if (!newest) {
                    newest = what; /* newest first */
                    ok = (!strcmp(what, "dead") &&
                          json_is_integer(json_object_get(e, "effective_round"))) ||
                         (!strcmp(what, "suspect") && state && !strcmp(state, "suspect"));
                }
                if (!strcmp(what, "joined") && ok)
                    joined = 1; /* the join comes before the change */
            }
            cr_expect(ok, "%s's view shows %s %s, its newest event about it is %s: %s",
                      node_names[i], node_names[d], state ? state : "(not listed)",
                      newest ? newest : "(none)", json_dumps(ev, JSON_COMPACT));
            cr_expect(joined || json_integer_value(json_object_get(doc, "events_total")) >
                                    (json_int_t)json_array_size(ev),
                      "%s's events list no join of %s before its %s", node_names[i],
                      node_names[d], newest ? newest : "death");
        }
        json_decref(doc);
    }
    cr_log_info("2 of 6 killed after step 150: survivors' accuracy %.4f, undisturbed %.4f", acc,
                calm_acc);
    /* Issue 6's bound: within 1 pt of the undisturbed run. Both runs have
     * the same seeds and data order, so what differs is the mixing the
     * crash disturbed. Measured on the shared 2-core machine, 4 runs: the
     * undisturbed run 0.8638 every time, the survivors 0.8623, 0.8631,
     * 0.8631, 0.8636 (0.02-0.15 pt lower; dsbench elastic: -0.05 pt). The
     * bound is the issue's, 7 times the largest loss seen. */
    cr_expect(fabs(acc - calm_acc) <= 0.01, "accuracy %.4f vs undisturbed %.4f", acc, calm_acc);
    json_decref(j);
    json_decref(j0);
    live_free(&l);
    result_free(&r0);
}

/* What the freeze test reads from n0's documents: its step in the first
 * document published after n3 was stopped, and in the last one published
 * before the 5 s were over. time_unix_ms is the node's publication time,
 * so a document read late cannot make progress appear. */
struct freeze_watch {
    const char *out;
    uint64_t t_stop, t_cont;
    long long first, last;
    /* What n0's documents said meanwhile, for a failure's message: each
     * new document's time (ms after the stop), step, group reductions and
     * how many of them were incomplete. */
    char trace[1024];
    size_t tl;
    uint64_t t_seen;
};

#define FREEZE_MS 5000
/* Steps n0 must take while n3 is frozen. See frozen_node_comes_back. */
#define FREEZE_MIN_STEPS 10

static int n0_went_on(void *arg)
{
    struct freeze_watch *w = arg;
    json_t *doc = status_load(w->out, "n0");
    if (doc) {
        const uint64_t t = (uint64_t)status_num(doc, "time_unix_ms");
        if (t >= w->t_stop && t <= w->t_cont) {
            if (w->first < 0)
                w->first = status_step(doc);
            w->last = status_step(doc);
        }
        if (t >= w->t_stop && t != w->t_seen && w->tl < sizeof(w->trace)) {
            w->t_seen = t;
            const int k = snprintf(w->trace + w->tl, sizeof(w->trace) - w->tl,
                                   " %+lldms:step %lld red %.0f inc %.0f;",
                                   (long long)(t - w->t_stop), status_step(doc),
                                   status_num(doc, "group.reductions"),
                                   status_num(doc, "group.incomplete"));
            w->tl += k > 0 ? (size_t)k : 0;
        }
        json_decref(doc);
    }
    return now_unix_ms() >= w->t_cont;
}

/* A node frozen for 5 s (SIGSTOP, then SIGCONT): the others go on, it
 * comes back, catches up, and everyone finishes. */
Test(elastic, frozen_node_comes_back)
{
    const char *out = tmp_path("stop");
    /* Long enough that the others still train when it wakes up. */
    const char *extra[] = {"--set", "train.steps=2000", "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 200000);
    const pid_t p = node_pid(out, "n3");
    cr_assert_gt(p, 0);
    struct freeze_watch fw = {.out = out, .first = -1, .last = -1};
    fw.t_stop = now_unix_ms();
    fw.t_cont = fw.t_stop + FREEZE_MS;
    cr_assert_eq(kill(p, SIGSTOP), 0);
    /* The freeze lasts 5 s (issue 6); n0's documents meanwhile tell
     * whether the others keep training. */
    live_wait(&l, FREEZE_MS + 1000, n0_went_on, &fw);
    cr_assert_eq(kill(p, SIGCONT), 0);
    /* Steps seen between two of n0's own documents, not a rate. Measured
     * on the shared 2-core machine: 89, 216, 157 and 135 steps in the 5 s
     * (4 runs; rounds paired with n3 wait out the 2 s gossip timeout
     * until n3 is skipped, the rest run at full speed). A cluster that
     * waited out the timeout in every round would show at most 3 steps in
     * 5 s, and one that waited for n3 none: 10 tells those apart from
     * skipping, with a ninth of the fewest steps seen as margin for load. */
    cr_log_info("n0 while n3 was frozen: step %lld to %lld", fw.first, fw.last);
    cr_expect(fw.first >= 0 && fw.last - fw.first >= FREEZE_MIN_STEPS,
              "n0 took %lld steps in the 5 s n3 was frozen (from step %lld); its documents:%s",
              fw.first >= 0 ? fw.last - fw.first : -1, fw.first, fw.trace);
    /* It comes back and catches up: n3 reaches the step n0 had reached
     * when n3 was let go. */
    wait_for_step(&l, out, "n3", fw.last, 120000);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 0, "exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    for (int i = 0; i < 3; i++) {
        /* Issue 6 asks this of crashes; a frozen peer is one until it is
         * skipped: the gossip timeout (2 s) + 1 s. */
        const double max_round = jnum(jnode(j, node_names[i]), "max_round_s");
        cr_expect(max_round >= 0 && max_round <= 3.0, "%s: a round took %.3f s", node_names[i],
                  max_round);
    }
    cr_expect_eq(jnum(jnode(j, "n3"), "steps"), 2000, "n3 finished");
    /* n3 mixes with the others again: the same bound as the cluster
     * suite's crossover + MiCRO run (measured there 0.03; a node that
     * stopped mixing after the freeze would be far off, ~1). */
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1, "n3 mixes with the others again");
    json_decref(j);
    live_free(&l);
}

/* What frozen_member_is_named_while_waited_for sees: a document of
 * another node, written during the freeze, saying it has waited a second
 * or more on its group's reduction with n1. */
struct named_watch {
    const char *out;
    uint64_t t_stop;
    char seen[300];    /* the first such "waiting" object, as JSON */
    char last[4][200]; /* each node's last "waiting" */
};

static int frozen_member_named(void *arg)
{
    struct named_watch *w = arg;
    for (int i = 0; i < 4; i++) {
        if (i == 1)
            continue;
        json_t *doc = status_load(w->out, node_names[i]);
        if (!doc)
            continue;
        const json_t *wj = json_object_get(doc, "waiting");
        char *text = json_dumps(wj, JSON_COMPACT | JSON_ENCODE_ANY);
        snprintf(w->last[i], sizeof(w->last[i]), "%s", text ? text : "?");
        const json_t *peers = json_object_get(wj, "peers");
        const char *on = json_string_value(json_object_get(wj, "on"));
        int named = 0;
        for (size_t k = 0; k < json_array_size(peers); k++) {
            const char *p = json_string_value(json_array_get(peers, k));
            named |= p && !strcmp(p, "n1");
        }
        const uint64_t t = (uint64_t)status_num(doc, "time_unix_ms");
        const double for_s = json_number_value(json_object_get(wj, "for_s"));
        if (named && on && !strcmp(on, "group") && for_s >= 1.0 && t > w->t_stop &&
            !w->seen[0])
            snprintf(w->seen, sizeof(w->seen), "%s: %s", node_names[i], text ? text : "?");
        free(text);
        json_decref(doc);
    }
    return w->seen[0] != 0;
}

/* A group member frozen (SIGSTOP): its group's next reduction cannot
 * complete without it and waits out its deadline (gossip.timeout_ms,
 * 2 s). While that lasts, the waiting member's status.json says so
 * ("waiting" on the group, naming n1, for a second or more; a reduction
 * of this model otherwise takes milliseconds), written by the status
 * thread without a publish (the training thread is blocked in the
 * reduction). Once the run ends nobody waits. */
Test(elastic, frozen_member_is_named_while_waited_for)
{
    const char *out = tmp_path("named");
    const char *extra[] = {"--set", "train.steps=600", "--set", "train.eval_every=0",
                           "--set", "status.file_interval_ms=100", "--groups", "2", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 50, 200000);
    const pid_t p = node_pid(out, "n1");
    cr_assert_gt(p, 0);
    struct named_watch nw = {.out = out};
    nw.t_stop = now_unix_ms();
    cr_assert_eq(kill(p, SIGSTOP), 0);
    const int seen = live_wait(&l, FREEZE_MS, frozen_member_named, &nw);
    cr_assert_eq(kill(p, SIGCONT), 0);
    cr_expect(seen, "no document named n1 as waited for while it was frozen; last: n0 %s, "
              "n2 %s, n3 %s", nw.last[0], nw.last[2], nw.last[3]);
    cr_log_info("while n1 was frozen: %s", nw.seen);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 0, "exit %d\n%s", code, l.err);
    for (int i = 0; i < 4; i++) {
        json_t *doc = status_load(out, node_names[i]);
        cr_assert_not_null(doc);
        cr_expect(json_is_null(json_object_get(doc, "waiting")), "%s still waits at its end",
                  node_names[i]);
        json_decref(doc);
    }
    live_free(&l);
}

/* What the leave test sees of n3 in the others' documents. A leave shows
 * as "left" in a view only until its effective round, the membership lag
 * later: 32 rounds while the lag is still at its floor, a third of a
 * second on a fast machine, which documents written every 0.5 s can miss.
 * The member table keeps a left member for minutes, and the documents
 * count its states: a survivor still training well before the end (50
 * steps, while the survivors move in lockstep rounds and none has left
 * yet) that counts a left member, no dead one, and does not list n3
 * alive, has taken n3's leave. */
struct leave_watch {
    const char *out;
    int left[3], dead[3];
    char last[3][96]; /* node i's last document: its step, n3 in its view, its counts */
};

static int others_see_n3_left(void *arg)
{
    struct leave_watch *w = arg;
    int all = 1;
    for (int i = 0; i < 3; i++) {
        json_t *doc = status_load(w->out, node_names[i]);
        if (!doc) {
            all = 0;
            continue;
        }
        const char *m = status_member(doc, "n3");
        const int training = !strcmp(status_state(doc), "training");
        const double left = status_num(doc, "membership.left");
        const double dead = status_num(doc, "membership.dead");
        if (training && status_step(doc) < EL_STEP_COUNT - 50 && left >= 1 && dead == 0 &&
            !listed_alive(doc, "n3"))
            w->left[i] = 1;
        if ((m && !strcmp(m, "dead")) || (training && dead > 0))
            w->dead[i] = 1;
        snprintf(w->last[i], sizeof(w->last[i]), "step %lld, n3 %s, left %.0f dead %.0f, "
                 "lag %.0f rounds", status_step(doc), m ? m : "not listed", left, dead,
                 status_num(doc, "membership.lag_rounds"));
        json_decref(doc);
        all &= w->left[i];
    }
    return all;
}

/* SIGTERM: the node stops training, announces its leave for a future round,
 * and exits; the others take it as LEFT (not dead), and finish. */
Test(elastic, graceful_leave)
{
    const char *out = tmp_path("leave");
    const char *extra[] = {"--set", EL_STEPS, "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 200000);
    const pid_t p = node_pid(out, "n3");
    cr_assert_gt(p, 0);
    cr_assert_eq(kill(p, SIGTERM), 0);
    struct leave_watch lw = {.out = out};
    const int seen = live_wait(&l, 60000, others_see_n3_left, &lw);
    const int code = live_end(&l, 240000);
    cr_expect(seen, "n3's leave not taken by every other node while training (n0..n2: %d %d "
              "%d; last documents: %s; %s; %s)", lw.left[0], lw.left[1], lw.left[2], lw.last[0],
              lw.last[1], lw.last[2]);
    for (int i = 0; i < 3; i++)
        cr_expect(!lw.dead[i], "%s took n3 for dead", node_names[i]);
    cr_assert_eq(code, 1, "dslaunch reports n3 stopped: exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    cr_expect_eq(jnum(jnode(j, "n3"), "exit_status"), 128 + SIGTERM);
    /* n3's last document: stopped, after it told members of its leave. */
    json_t *doc = status_load(out, "n3");
    cr_assert_not_null(doc, "n3 wrote no status document");
    cr_expect_str_eq(status_state(doc), "stopped");
    cr_expect_geq(status_num(doc, "membership.leaves_sent"), 1, "n3 announced its leave");
    json_decref(doc);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(jnum(jnode(j, node_names[i]), "exit_status"), 0, "%s", node_names[i]);
        doc = status_load(out, node_names[i]);
        cr_assert_not_null(doc);
        const char *m = status_member(doc, "n3");
        cr_expect(!m || strcmp(m, "dead"), "%s ended with n3 dead in its view", node_names[i]);
        json_decref(doc);
    }
    json_decref(j);
    live_free(&l);
}

/* n0 and n1 while an intruder knocks: n0 counts the refusal, neither
 * ever lists the intruder, neither view grows past the two of them. */
struct intruder_watch {
    const char *out;
    int refused, listed;
    long long max_view;
};

static int n0_refused(void *arg)
{
    struct intruder_watch *w = arg;
    for (int i = 0; i < 2; i++) {
        json_t *doc = status_load(w->out, node_names[i]);
        if (!doc)
            continue;
        w->listed |= status_member(doc, "intruder") != NULL;
        if (status_view_size(doc) > w->max_view)
            w->max_view = status_view_size(doc);
        if (i == 0)
            w->refused = status_num(doc, "drops.bad_mac") + status_num(doc, "drops.not_allowed") > 0;
        json_decref(doc);
    }
    return w->refused;
}

/* A node whose cluster key is not the cluster's asks to join: the seed
 * refuses its handshake (HELLO_REJECT), it exits at once with a clear
 * error, and the cluster goes on as if nothing happened. */
Test(elastic, wrong_key_is_refused)
{
    const char *out = tmp_path("intruder");
    /* Long enough to still be training when the intruder knocks. */
    const char *extra[] = {"--set", "train.steps=4000", "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 2, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n1", 30, 200000);

    char bad_key[600], bad_id[600], n1ini[600], s_key[700], s_id[700], s_seed[400], s_data[700],
        s_listen[64];
    const int port = ds_port_find(40000 + (int)(getpid() % 20000), 1);
    cr_assert_gt(port, 0, "no free port");
    snprintf(s_listen, sizeof(s_listen), "node.listen=127.0.0.1:%d", port);
    snprintf(bad_key, sizeof(bad_key), "%s/bad.key", out);
    snprintf(bad_id, sizeof(bad_id), "%s/bad.id", out);
    snprintf(n1ini, sizeof(n1ini), "%s/n1.ini", out);
    char *kg1[] = {(char *)bin("DSNODE"), "keygen", "--cluster", "--out", bad_key, NULL};
    char *kg2[] = {(char *)bin("DSNODE"), "keygen", "--out", bad_id, NULL};
    char *o = NULL, *e = NULL, errbuf[256];
    int code;
    cr_assert_eq(ds_proc_capture(kg1, 20000, &o, &e, &code, errbuf, sizeof(errbuf)), 0);
    cr_assert_eq(code, 0, "%s", e);
    free(o);
    free(e);
    cr_assert_eq(ds_proc_capture(kg2, 20000, &o, &e, &code, errbuf, sizeof(errbuf)), 0);
    cr_assert_eq(code, 0, "%s", e);
    free(o);
    free(e);

    /* n0's address: the first seed of n1's config. */
    char *dump = config_valid(n1ini), seeds[300];
    dump_value(dump, "\nseeds = ", seeds, sizeof(seeds));
    free(dump);
    snprintf(s_seed, sizeof(s_seed), "cluster.seeds=%s", seeds);
    snprintf(s_key, sizeof(s_key), "cluster.key_file=%s", bad_key);
    snprintf(s_id, sizeof(s_id), "cluster.identity_file=%s", bad_id);
    snprintf(s_data, sizeof(s_data), "node.data_dir=%s/intruder", out);
    char *run[] = {(char *)bin("DSNODE"), "run", "--config", n1ini, "--set", "node.name=intruder",
                   "--set", s_listen, "--set", "status.listen=",
                   "--set", "status.file=", "--set", "cluster.min_members=1",
                   "--set", s_seed, "--set", s_key, "--set", s_id, "--set", s_data, NULL};
    const uint64_t t0 = (uint64_t)time(NULL);
    cr_assert_eq(ds_proc_capture(run, 60000, &o, &e, &code, errbuf, sizeof(errbuf)), 0, "%s\n%s",
                 errbuf, e ? e : "");
    /* What the refused user reads is the feature here: a clear error. */
    cr_expect_eq(code, 1, "the refused node exits 1 (got %d)\n%s", code, e);
    cr_expect(strstr(e, "is not admitted to cluster"), "a clear error:\n%s", e);
    cr_expect_lt((uint64_t)time(NULL) - t0, 30, "refused quickly, not after retries");
    free(o);
    free(e);

    /* n0 refused it at the handshake, counted under its reason. */
    struct intruder_watch iw = {.out = out};
    cr_expect(live_wait(&l, 30000, n0_refused, &iw),
              "n0's status counts no bad_mac or not_allowed drop");
    cr_assert_eq(live_end(&l, 200000), 0, "the cluster finishes: %s", l.err);
    json_t *j = last_json(l.out);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(jnum(jnode(j, node_names[i]), "exit_status"), 0, "%s", node_names[i]);
        json_t *doc = status_load(out, node_names[i]);
        cr_assert_not_null(doc);
        iw.listed |= status_member(doc, "intruder") != NULL;
        json_decref(doc);
    }
    cr_expect(!iw.listed, "a node listed the intruder in its view");
    cr_expect_eq(iw.max_view, 2, "a view of %lld members while the intruder knocked", iw.max_view);
    json_decref(j);
    live_free(&l);
}

/* Issue 10, hierarchy: 8 nodes as 2 groups of 4, then as 3 groups of
 * 3/3/2 (dslaunch --groups, contiguous blocks). Members reduce gradients
 * and their round deltas every step and gossip as one between groups, so
 * every group ends with one model, byte for byte: intra_group_consensus is
 * exactly 0. The groups still mix: the consensus distance over all nodes
 * stays small (a run of unmixed groups is ~1, see the flat runs above),
 * and every node trains (0.70: the bound of the flat variants above).
 *
 * Who exchanges for the group is read off each node's /status while the
 * cluster runs, on its first document of mid-run (a step between 50 and
 * steps - 50) that shows its whole group: a segment names a peer only
 * when this member handles it for its group (topology/'s owner of the
 * segment is its index), and the peer is in another group. Not on the
 * last document: there, the exchanges are of the node's last gossip round,
 * whose view may already lack members that finished first, beside the
 * group of its last step (CI of 8bf897c: n5's last round, as a group of
 * one, named a peer for all 8 segments beside "size": 4). */
struct groups_watch {
    const char *out;
    int groups, steps;
    int checked[8];
    long long at[8];
    char why[8][512];
};

static void groups_check_doc(struct groups_watch *w, int i, const json_t *st, long long step)
{
    const uint32_t full = 8u / (uint32_t)w->groups + (i * w->groups / 8 < 8 % w->groups);
    const json_t *grp = json_object_get(st, "group");
    const uint32_t gsize = (uint32_t)json_integer_value(json_object_get(grp, "size"));
    const uint32_t gmem = (uint32_t)json_integer_value(json_object_get(grp, "member"));
    const json_t *xl = json_object_get(json_object_get(st, "exchanges"), "list");
    if (gsize != full || json_array_size(xl) != 8)
        return;
    w->checked[i] = 1;
    w->at[i] = step;
    int named = 0;
    for (size_t k = 0; k < json_array_size(xl); k++) {
        const json_t *x = json_array_get(xl, k);
        const char *to = json_string_value(json_object_get(x, "initiate_to"));
        uint32_t owner;
        if (ds_topo_hier_owner((uint32_t)k, gsize, &owner) < 0) {
            snprintf(w->why[i], sizeof(w->why[i]), "no owner of segment %zu in %u", k, gsize);
            return;
        }
        if (!to || !to[0])
            continue;
        named++;
        const int ti = to[0] == 'n' ? atoi(to + 1) : -1;
        if (owner != gmem)
            snprintf(w->why[i], sizeof(w->why[i]),
                     "names %s for segment %zu, which member %u handles (it is %u)", to, k,
                     owner, gmem);
        else if (ti < 0 || ti * w->groups / 8 == i * w->groups / 8)
            snprintf(w->why[i], sizeof(w->why[i]),
                     "names %s for segment %zu: not another group", to, k);
        if (w->why[i][0])
            return;
    }
    if (named > (int)((8 + gsize - 1) / gsize)) {
        snprintf(w->why[i], sizeof(w->why[i]), "names %d peers, as member %u of %u", named,
                 gmem, gsize);
        return;
    }
    /* Its history holds rounds between groups: the groups are the round's
     * participants (view_size, me: group indices) and each segment this
     * member initiated names a member of another group. */
    const json_t *hist = json_object_get(st, "history");
    const json_t *h0 = json_array_get(hist, 0);
    const long long want_g = i * w->groups / 8;
    if (!h0) {
        snprintf(w->why[i], sizeof(w->why[i]), "no history");
        return;
    }
    const json_t *hl = json_object_get(h0, "list");
    if (json_integer_value(json_object_get(h0, "groups")) != w->groups ||
        json_integer_value(json_object_get(h0, "view_size")) != w->groups ||
        json_integer_value(json_object_get(h0, "me")) != want_g ||
        json_integer_value(json_object_get(h0, "group_size")) != gsize ||
        json_integer_value(json_object_get(h0, "group_member")) != gmem ||
        json_array_size(hl) != 8) {
        char *d = json_dumps(h0, JSON_COMPACT);
        snprintf(w->why[i], sizeof(w->why[i]), "history entry not of group g%lld's round: %.300s",
                 want_g, d ? d : "?");
        free(d);
        return;
    }
    for (size_t k = 0; k < 8; k++) {
        const json_t *x = json_array_get(hl, k);
        const char *oc = json_string_value(json_object_get(x, "outcome"));
        const char *peer = json_string_value(json_object_get(x, "peer"));
        uint32_t owner;
        if (!oc || !strcmp(oc, "none") || ds_topo_hier_owner((uint32_t)k, gsize, &owner) < 0)
            continue;
        const long long tg = json_integer_value(json_object_get(x, "target"));
        const int pi = peer && peer[0] == 'n' ? atoi(peer + 1) : -1;
        if (owner != gmem || tg == want_g || tg >= w->groups || pi < 0 ||
            pi * w->groups / 8 != tg) {
            snprintf(w->why[i], sizeof(w->why[i]),
                     "history round %lld segment %zu: %s to group %lld, peer %s (member %u of "
                     "%u; segment's owner %u)",
                     (long long)json_integer_value(json_object_get(h0, "round")), k, oc, tg,
                     peer ? peer : "(none)", gmem, gsize, owner);
            return;
        }
    }
}

static int groups_owners_seen(void *arg)
{
    struct groups_watch *w = arg;
    int done = 0;
    for (int i = 0; i < 8; i++) {
        if (!w->checked[i]) {
            json_t *doc = status_load(w->out, node_names[i]);
            if (doc) {
                const long long step = status_step(doc);
                if (step >= 50 && step <= w->steps - 50)
                    groups_check_doc(w, i, doc, step);
                json_decref(doc);
            }
        }
        done += w->checked[i];
    }
    return done == 8;
}

static void run_groups_with(int groups, int steps, const char *mode, const char *algo,
                            double min_acc, int overlap)
{
    char s_steps[64], s_groups[16], name[64], s_intra[64], s_algo[64], s_ov[64];
    snprintf(s_steps, sizeof(s_steps), "train.steps=%d", steps);
    snprintf(s_groups, sizeof(s_groups), "%d", groups);
    snprintf(name, sizeof(name), "groups%d-%s-%s%s", groups, mode, algo, overlap ? "-ov" : "");
    snprintf(s_ov, sizeof(s_ov), "group.overlap=%s", overlap ? "true" : "false");
    snprintf(s_intra, sizeof(s_intra), "group.sparsify=%s", mode);
    snprintf(s_algo, sizeof(s_algo), "group.allreduce=%s", algo);
    const char *out = tmp_path(name);
    const char *args[] = {"local", "-n", "8", "--groups", s_groups, "--config", BASE_CONFIG,
                          "--set", s_steps, "--set", "train.eval_every=0",
                          "--set", "train.backend=cpu", "--set", "train.threads=1",
                          "--set", "gossip.segments=8", "--set", "sparsify.method=micro",
                          "--set", "sparsify.density=0.01", "--set", "gossip.timeout_ms=2000",
                          "--set", STATUS_FILE_ON, "--set", s_intra,
                          "--set", "group.density=0.01", "--set", s_algo, "--set", s_ov,
                          "--out", out, "--json", "--timeout", "400",
                          "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    struct groups_watch w = {.out = out, .groups = groups, .steps = steps};
    live_wait(&l, 400000, groups_owners_seen, &w);
    const int code = live_end(&l, 420000);
    cr_assert_eq(code, 0, "--groups %d: dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", groups,
                 code, l.out, l.err);
    for (int i = 0; i < 8; i++) {
        cr_expect(w.checked[i], "%s: no mid-run status document showed its whole group",
                  node_names[i]);
        cr_expect(!w.why[i][0], "%s (group g%d) at step %lld %s", node_names[i],
                  i * groups / 8, w.at[i], w.why[i]);
    }
    cr_log_info("owners checked at steps %lld %lld %lld %lld %lld %lld %lld %lld", w.at[0],
                w.at[1], w.at[2], w.at[3], w.at[4], w.at[5], w.at[6], w.at[7]);
    json_t *j = last_json(l.out);
    const json_t *nodes = json_object_get(j, "nodes");
    cr_assert(json_is_object(nodes) && json_object_size(nodes) == 8, "eight nodes in the JSON");
    for (int i = 0; i < 8; i++) {
        char want[16];
        snprintf(want, sizeof(want), "g%d", i * groups / 8);
        check_node_ok(nodes, node_names[i], min_acc);
        const json_t *n = jnode(j, node_names[i]);
        cr_assert_eq(jnum(n, "steps"), steps);
        cr_assert_str_eq(json_string_value(json_object_get(n, "group")), want, "%s's group",
                         node_names[i]);
    }
    const json_t *intra = json_object_get(j, "intra_group_consensus");
    cr_assert(json_is_number(intra), "intra_group_consensus present");
    cr_expect_eq(json_number_value(intra), 0.0, "--groups %d: members differ (%g)", groups,
                 json_number_value(intra));
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1);
    /* The algorithms that ran, from each node's last status document:
     * the one configured (auto: direct, and the butterfly of member 0's
     * timing, which every member follows), never another. */
    const int want_d = !strcmp(algo, "direct") || !strcmp(algo, "auto");
    const int want_r = !strcmp(algo, "ring"), want_b = !strcmp(algo, "butterfly") ||
                                                       !strcmp(algo, "auto");
    for (int i = 0; i < 8; i++) {
        json_t *doc = status_load(out, node_names[i]);
        cr_assert_not_null(doc, "%s: no status document", node_names[i]);
        const double rd = status_num(doc, "group.ran_direct");
        const double rr = status_num(doc, "group.ran_ring");
        const double rb = status_num(doc, "group.ran_butterfly");
        cr_log_info("%s: reductions ran direct %.0f, ring %.0f, butterfly %.0f", node_names[i],
                    rd, rr, rb);
        if (want_d) /* (ring and butterfly also run direct after a failure) */
            cr_expect(rd >= 1, "%s: %.0f direct (%s)", node_names[i], rd, algo);
        cr_expect(want_r ? rr >= 1 : rr == 0, "%s: %.0f ring (%s)", node_names[i], rr, algo);
        cr_expect(want_b ? rb >= 1 : rb == 0, "%s: %.0f butterfly (%s)", node_names[i], rb,
                  algo);
        /* group.overlap: the layers above the first went on the layer
         * thread, one reduction (a bucket) a step. */
        const double lr = status_num(doc, "group.layer_reductions");
        cr_expect(overlap ? lr >= steps / 2 : lr == 0, "%s: %.0f layer reductions in %d steps",
                  node_names[i], lr, steps);
        /* overlap and auto: after the probe the cost model picks every
         * reduction's algorithm, member 0's model on every member */
        const double mp = status_num(doc, "group.model_picks");
        cr_expect(overlap && !strcmp(algo, "auto") ? mp >= steps / 2 : mp == 0,
                  "%s: %.0f reductions picked by the cost model in %d steps", node_names[i], mp,
                  steps);
        json_decref(doc);
    }
    cr_log_info("--groups %d, group.sparsify %s, group.allreduce %s, %d steps: mean test_acc "
                "%.4f, consensus distance %.4f, intra-group %g", groups, mode, algo, steps,
                jnum(j, "mean_test_acc"),
                jnum(j, "consensus_distance"),
                json_number_value(intra));
    json_decref(j);
    live_free(&l);
}

static void run_groups(int groups, int steps, const char *mode, double min_acc)
{
    run_groups_with(groups, steps, mode, "direct", min_acc, 0);
}

Test(cluster, groups_of_four_hold_one_model)
{
    run_groups(2, 300, "none", 0.70);
}

/* The same with MiCRO inside the groups (group.sparsify = micro, 1%):
 * members send only their owned chunk's selection, and still hold one
 * model byte for byte. What this checks is that identity; its accuracy
 * after 300 steps is 0.67 to 0.76 (against 0.87 for the dense mean:
 * docs/benchmarks.md), so the bound is only "it trains" (chance: 0.1). */
Test(cluster, groups_of_four_micro_intra_hold_one_model)
{
    run_groups(2, 300, "micro", 0.50);
}

/* The same with DEFT inside the groups (group.sparsify = deft, 1%): units
 * of the layers bin-packed to members by the group's norms of the step
 * before; members still hold one model byte for byte. */
Test(cluster, groups_of_four_deft_intra_hold_one_model)
{
    run_groups(2, 300, "deft", 0.50);
}

Test(cluster, groups_of_three_three_two_hold_one_model)
{
    run_groups(3, 300, "none", 0.70);
}

/* group.allreduce = ring and butterfly in real processes: groups of 4 by
 * ring; groups of 3, 3 and 2 by butterfly (3: an extra member hands its
 * vector in and gets the result back). Members hold one model. */
Test(cluster, groups_of_four_ring_hold_one_model)
{
    run_groups_with(2, 300, "none", "ring", 0.70, 0);
}

/* group.overlap: each layer's gradient (but the first) reduced on the
 * layer thread while backward goes on; members hold one model. */
Test(cluster, groups_of_four_overlap_hold_one_model)
{
    run_groups_with(2, 300, "none", "direct", 0.70, 1);
}

Test(cluster, groups_of_three_three_two_butterfly_hold_one_model)
{
    run_groups_with(3, 300, "none", "butterfly", 0.70, 0);
}

/* group.allreduce = auto: each group's member 0 times direct and the
 * butterfly (groups of 3 and of 2) and publishes each next reduction's
 * algorithm inside the reduction; every member runs both (it followed
 * the timing), members hold one model. */
Test(cluster, groups_of_three_three_two_auto_hold_one_model)
{
    run_groups_with(3, 300, "none", "auto", 0.70, 0);
}

/* group.allreduce = auto with group.overlap: the probe alternates whole
 * steps (layers and the step's own reduction alike), member 0 fits a
 * cost model alpha + beta * floats to its timings of both algorithms and
 * publishes it in every reduction, and each member picks each layer's
 * algorithm from it by the layer's length: members hold one model. */
Test(cluster, groups_of_three_three_two_overlap_auto_hold_one_model)
{
    run_groups_with(3, 300, "none", "auto", 0.70, 1);
}

/* Issue 10, failures in groups: 6 nodes as 2 groups of 3; n1 (group g0)
 * is SIGKILLed and member 0 of group g1 (n3, n4 or n5: members go by node
 * id, random each run) frozen for 5 s mid-run. Each group goes on (n0
 * keeps training while that member is frozen), re-forms with its
 * survivors and takes the frozen member back, whose step the other two
 * take (their rounds go back, lag.c); no step waits on its group longer than
 * gossip.timeout_ms + 1 s (group_max_wait_s: the summary line's longest
 * exchange wait + reduction), no gossip exchange longer either
 * (max_round_s); everyone but n1 finishes, and every group ends with one
 * model (the slices re-sync what the misses made differ). */
/* On a failure only: node `name`'s last `max` log lines that are not
 * training progress (membership, state, gossip and group news), so that a
 * CI log says what happened. */
static void log_tail(const char *out, const char *name, int max)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", out, name);
    char *log = read_text(path);
    if (!log)
        return;
    const char *keep[256];
    int n = 0;
    for (char *save = NULL, *line = strtok_r(log, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char copy[1024]; /* ds_logline_split cuts the line it splits */
        snprintf(copy, sizeof(copy), "%s", line);
        ds_logline ll;
        /* Nor a reduction's incomplete warning or the rate limit's count
         * of them: with a dead member in the group they are every line,
         * and the membership news (its suspicion, death, the view) went
         * out of the window (CI 56). */
        if (ds_logline_split(copy, &ll) == 0 &&
            (!strcmp(ll.component, "eval") ||
             (!strcmp(ll.component, "train") && !strncmp(ll.msg, "step=", 5)) ||
             (!strcmp(ll.component, "group") &&
              (!strncmp(ll.msg, "suppressed=", 11) ||
               (!strncmp(ll.msg, "reduction ", 10) && strstr(ll.msg, " incomplete"))))))
            continue;
        keep[n++ % 256] = line;
    }
    const int from = n > max ? n - max : 0;
    /* stderr, not cr_log_info: a CI run is not --verbose. */
    fprintf(stderr, "---- %s: its last %d news lines of %d\n", name, n - from, n);
    for (int i = from; i < n; i++)
        fprintf(stderr, "%s\n", keep[i % 256]);
    free(log);
}

/* Whether a node's last document (doc) shows n1's removal still to come:
 * its newest event about n1 a death whose removal round lies past the
 * document's round (and within the lag's bound, not CI 43's 2^20), or a
 * suspicion only. why: what the document says, for a message. */
static int n1_removal_pending(const json_t *doc, char *why, size_t n)
{
    const json_t *ev = json_object_get(doc, "events");
    const json_int_t last = json_integer_value(json_object_get(doc, "round"));
    const char *newest = NULL;
    json_int_t eff = -1, at = -1;
    for (size_t k = 0; k < json_array_size(ev) && !newest; k++) {
        const json_t *e = json_array_get(ev, k);
        const char *m = json_string_value(json_object_get(e, "member"));
        const char *what = json_string_value(json_object_get(e, "event"));
        if (!m || strcmp(m, "n1") || !what)
            continue;
        newest = what; /* newest first */
        eff = json_integer_value(json_object_get(e, "effective_round"));
        at = json_integer_value(json_object_get(e, "round"));
    }
    snprintf(why, n, "last round %lld, newest event about n1: %s at round %lld, effective %lld",
             (long long)last, newest ? newest : "(none)", (long long)at, (long long)eff);
    return newest && ((!strcmp(newest, "dead") && eff > last && eff - at < 100000) ||
                      !strcmp(newest, "suspect"));
}

static void group_failures(const char *algo, int overlap)
{
    char name[32], s_algo[48], s_ov[48];
    snprintf(name, sizeof(name), "groupfail-%s%s", algo, overlap ? "-ov" : "");
    snprintf(s_algo, sizeof(s_algo), "group.allreduce=%s", algo);
    snprintf(s_ov, sizeof(s_ov), "group.overlap=%s", overlap ? "true" : "false");
    const char *out = tmp_path(name);
    const char *extra[] = {"--set", "train.steps=1200", "--set", "train.eval_every=0",
                           "--set", "gossip.segments=8", "--set", "sparsify.method=micro",
                           "--set", s_algo, "--set", s_ov, "--groups", "2", NULL};
    const char *args[40];
    el_args(args, 6, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 200000);
    /* g1's member 0: when it comes back the others take its step. Until
     * 7 December the test froze n4 whatever its place, so in about two
     * runs of three the frozen member took member 0's step forward
     * instead, and the rounds that went back were there in one run of
     * three (CI 43 was one). */
    int fz = -1;
    for (int i = 3; i < 6 && fz < 0; i++) {
        json_t *doc = status_load(out, node_names[i]);
        const json_t *m = json_object_get(json_object_get(doc, "group"), "member");
        if (json_is_integer(m) && json_integer_value(m) == 0)
            fz = i;
        json_decref(doc);
    }
    cr_assert(fz >= 0, "g1's member 0 found among n3, n4, n5");
    const char *fname = node_names[fz];
    const pid_t dead = node_pid(out, "n1"), frozen = node_pid(out, fname);
    cr_assert(dead > 0 && frozen > 0, "n1 and %s found", fname);
    cr_assert_eq(kill(dead, SIGKILL), 0);
    cr_assert_eq(kill(frozen, SIGSTOP), 0);
    struct freeze_watch fw = {.out = out, .first = -1, .last = -1};
    fw.t_stop = now_unix_ms();
    fw.t_cont = fw.t_stop + FREEZE_MS;
    live_wait(&l, FREEZE_MS + 1000, n0_went_on, &fw);
    cr_assert_eq(kill(frozen, SIGCONT), 0);
    cr_expect_geq(fw.last - fw.first, FREEZE_MIN_STEPS,
                  "n0 took %lld steps while %s was frozen; its documents:%s",
                  fw.last - fw.first, fname, fw.trace);
    cr_log_info("n0 took %lld steps while %s was frozen (from step %lld)", fw.last - fw.first,
                fname, fw.first);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 1, "dslaunch reports the killed node: exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    for (int i = 0; i < 6; i++) {
        if (i == 1)
            continue;
        const json_t *n = jnode(j, node_names[i]);
        cr_assert_eq(jnum(n, "exit_status"), 0, "%s exit", node_names[i]);
        /* The frozen member's own clock ran on while it was stopped: its
         * step and round across the freeze lasted 5 s without waiting on
         * anyone. */
        if (i != fz) {
            cr_expect_leq(jnum(n, "group_max_wait_s"), 2.0 + 1.0, "%s: a step waited %.3f s",
                          node_names[i], jnum(n, "group_max_wait_s"));
            cr_expect_leq(jnum(n, "max_round_s"), 2.0 + 1.0, "%s: a round took %.3f s",
                          node_names[i], jnum(n, "max_round_s"));
        }
        cr_log_info("%s: group_max_wait_s %.3f, max_round_s %.3f, test_acc %.4f", node_names[i],
                    jnum(n, "group_max_wait_s"), jnum(n, "max_round_s"), jnum(n, "test_acc"));
    }
    /* From each survivor's last document:
     * - n1's death took effect: its group went on as the two survivors.
     *   CI 43: a node that had taken member 0's step measured a lag of
     *   2^20 rounds (lag.c) and declared n1 dead for round 2^20 + r, so
     *   n0 and n2 kept a group of three and differed at the end;
     * - g1's other two took the frozen member's step when it came back
     *   (their rounds went back about 200): their lag stays what the pace
     *   gives, 5 s of rounds, not the 2^20 that the unsigned difference
     *   gave them before, so that a death either declares takes effect. */
    for (int i = 0; i < 6; i++) {
        if (i == 1)
            continue;
        json_t *doc = status_load(out, node_names[i]);
        const json_t *gr = json_object_get(doc, "group");
        if (i < 3 && json_integer_value(json_object_get(gr, "size")) != 2) {
            /* Still three at the end: allowed only when the death's
             * removal round lies past this node's last round (the lag is
             * 5 s of the peak pace, and a loaded machine slows the rounds
             * after the failure: CI 56 ended so, every figure otherwise
             * right), or the death was not declared yet (suspected only).
             * Since the orphan chunks and the final sync over whole
             * vectors, the survivors still end as one model (checked
             * below). A removal round in the past, or none at all, fails. */
            char why[256];
            cr_expect(n1_removal_pending(doc, why, sizeof(why)),
                      "%s ends in a group of %lld, not the two survivors: %s", node_names[i],
                      (long long)json_integer_value(json_object_get(gr, "size")), why);
            cr_log_info("%s ends with n1 still in its group: %s", node_names[i], why);
        }
        const json_int_t lag = json_integer_value(
            json_object_get(json_object_get(doc, "membership"), "lag_rounds"));
        cr_expect(lag > 0 && lag < 100000, "%s: membership.lag_rounds %lld", node_names[i],
                  (long long)lag);
        cr_log_info("%s: membership.lag_rounds %lld, group.steps_taken %lld", node_names[i],
                    (long long)lag,
                    (long long)json_integer_value(json_object_get(gr, "steps_taken")));
        json_decref(doc);
    }
    const double intra = json_number_value(json_object_get(j, "intra_group_consensus"));
    cr_expect_eq(intra, 0.0, "members differ at the end: %g", intra);
    if (intra != 0.0) /* CI 23 (ring, 0.14) and CI 24 (direct, 1.6e-6): say why next time */
        for (int i = 0; i < 6; i++) {
            if (i == 1)
                continue;
            json_t *doc = status_load(out, node_names[i]);
            const json_t *tr = json_object_get(doc, "train"), *gr = json_object_get(doc, "group");
#define DOC_NUM(o, k) json_number_value(json_object_get((o), (k)))
            fprintf(stderr, "---- %s: step %.0f, group size %.0f member %.0f, reductions %.0f, "
                    "incomplete %.0f, steps_taken %.0f\n", node_names[i], DOC_NUM(tr, "step"),
                    DOC_NUM(gr, "size"), DOC_NUM(gr, "member"), DOC_NUM(gr, "reductions"),
                    DOC_NUM(gr, "incomplete"), DOC_NUM(gr, "steps_taken"));
#undef DOC_NUM
            json_decref(doc);
            log_tail(out, node_names[i], 60);
        }
    json_decref(j);
    live_free(&l);
}

Test(elastic, group_member_killed_and_another_frozen)
{
    group_failures("direct", 0);
}

/* The same with group.overlap: a layer's reduction that meets the dead or
 * the frozen member ends at the step's deadline like the step's own. */
Test(elastic, group_member_killed_and_another_frozen_overlap)
{
    group_failures("direct", 1);
}

/* The same with the ring and the butterfly: the reduction that meets the
 * failure ends at the deadline, the next ones run direct (group.h), and
 * the group goes on as with direct. */
Test(elastic, group_member_killed_and_another_frozen_ring)
{
    group_failures("ring", 0);
}

Test(elastic, group_member_killed_and_another_frozen_butterfly)
{
    group_failures("butterfly", 0);
}

/* A member killed shortly before the end: the removal round the death
 * gets (the lag: 5 s of the rounds' pace) falls after the survivors'
 * last step, so they end in a group of three with the dead member in it.
 * Their final sync averages the whole vectors that came (group.h,
 * ds_greduce_mean_all), so they still end as one model. With the group's
 * direct algorithm the dead member's chunk stayed each survivor's own
 * and the two ended a few 1e-7 apart (CI 56, where load put a removal
 * past the end of training). */
Test(elastic, group_member_killed_near_the_end_survivors_end_alike)
{
    const char *out = tmp_path("groupend");
    const char *extra[] = {"--set", "train.steps=800", "--set", "train.eval_every=0",
                           "--set", "sparsify.method=micro", "--groups", "1", NULL};
    const char *args[40];
    el_args(args, 3, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 600, 200000);
    const pid_t dead = node_pid(out, "n1");
    cr_assert_gt(dead, 0);
    cr_assert_eq(kill(dead, SIGKILL), 0);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 1, "dslaunch reports the killed node: exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    const double intra = json_number_value(json_object_get(j, "intra_group_consensus"));
    long long size[3] = {0}, orphaned[3] = {0};
    for (int i = 0; i < 3; i += 2) {
        cr_assert_eq(jnum(jnode(j, node_names[i]), "exit_status"), 0, "%s exit", node_names[i]);
        json_t *doc = status_load(out, node_names[i]);
        size[i] = (long long)json_integer_value(
            json_object_get(json_object_get(doc, "group"), "size"));
        orphaned[i] = (long long)json_integer_value(
            json_object_get(json_object_get(doc, "group"), "orphaned"));
        /* Between the suspicion (about a second after the kill) and the
         * end, 200 steps later, the survivors summed n1's chunk
         * themselves. */
        cr_expect_geq(orphaned[i], 1, "%s summed no orphan chunk after n1's death",
                      node_names[i]);
        char why[256];
        if (size[i] == 3)
            cr_expect(n1_removal_pending(doc, why, sizeof(why)),
                      "%s ends with n1 in its group, its removal not pending: %s",
                      node_names[i], why);
        json_decref(doc);
    }
    cr_log_info("group size at the end: n0 %lld, n2 %lld (3: n1's removal came after the "
                "end); reductions with an orphan: n0 %lld, n2 %lld; intra_group_consensus %g",
                size[0], size[2], orphaned[0], orphaned[2], intra);
    cr_expect_eq(intra, 0.0, "the survivors differ at the end: %g (group sizes %lld, %lld)",
                 intra, size[0], size[2]);
    if (intra != 0.0) {
        log_tail(out, "n0", 30);
        log_tail(out, "n2", 30);
    }
    json_decref(j);
    live_free(&l);
}
