/*
 * tests/test_failures_gossip.c: what a failure costs a real cluster's
 * gossip rounds (issue 16), with dsnode processes started on loopback by
 * dslaunch (tools/dslaunch).
 *
 *   failures_gossip/sigterm_in_round   a node whose only partner is frozen
 *       (SIGSTOP), once its rounds have run into their deadline on it,
 *       gets SIGTERM: it evaluates, writes its summary, status document
 *       and model, and exits 128 + SIGTERM well inside dslaunch's grace,
 *       instead of waiting out a gossip timeout first (defect 7). Since
 *       the adaptive deadline (node/gossip/latency.h) a round waits a
 *       fraction of a second on the frozen partner, not the whole
 *       gossip.timeout_ms, so the signal rarely finds n0 inside a wait:
 *       that a stop ends a wait at once is gossip/stop_ends_the_wait
 *       (tests/test_gossip.c), measured on real processes when waits were
 *       20 s (docs/benchmarks.md, "Issue 16: gossip").
 *
 *   failures_gossip/crash_bounded   SIGKILL of one node of four: until
 *       the dead node has left every survivor's view, no survivor's
 *       train.step stands still for more than CRASH_STALL_MS (its status
 *       document is rewritten every 200 ms, so that is the stall plus at
 *       most a quarter second), well under one gossip timeout (2 s), and
 *       no exchange phase takes more than the timeout + 1 s. With Crossover
 *       on 4 nodes every survivor is a partner of the dead node: issue 16's
 *       goal for partners is one timeout at most. Before the adaptive
 *       deadline (node/gossip/latency.h) each survivor stood still for one
 *       whole timeout, 2.06-2.10 s (docs/gossip.md, "What a crash costs").
 *
 *   failures_gossip/straggler_10mbit   4 nodes, each in a network namespace
 *       of its own (dslaunch --netns; root only, skipped otherwise); once
 *       they train, n3's link gets a 10 Mbit/s token bucket both ways. The
 *       others' step rate, read from their status documents over a window
 *       before and one after, keeps at least STRAGGLER_MIN of what it was
 *       (issue 16's goal is 0.8x; dsbench elastic --gossip-faults measures
 *       the figure), n3 still mixes, and its requests carry a share of k
 *       (gossip.trimmed). Before the adaptive deadline and
 *       the slow-partner rule (node/gossip/latency.h) they ran at 0.36x to
 *       0.58x (by the machine's load):
 *       every round waited for n3 (defect 5).
 *
 * Every wait is on what the nodes' status documents say, with a hard
 * deadline (launch_util.h). The one wall-clock bound, the exit time after
 * SIGTERM, is the requirement itself.
 *
 * Run: meson test -C build failures_gossip --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

/* tmp_fini kills a dslaunch a failed test left (SIGKILL: it cannot clean
 * up), so its namespaces, veths and their qdiscs are removed here as
 * stale leftovers. */
static void fg_fini(void)
{
    tmp_fini();
    if (geteuid() == 0)
        ds_netns_reap_stale(NULL);
}

TestSuite(failures_gossip, .init = tmp_init, .fini = fg_fini, .timeout = 280);

/* Long enough that a wait on the frozen partner cannot end by itself while
 * the test looks at it. */
#define FG_TIMEOUT_MS 20000
#define FG_STR(x) #x
#define FG_SET_TIMEOUT(ms) "gossip.timeout_ms=" FG_STR(ms)

/* SIGTERM to exit: the 1 s signalled drain (node/runtime/leave.h), one
 * evaluation and the model file, with room for a loaded 2-core machine;
 * far below one gossip timeout (20 s) and dslaunch's 5 s grace. */
#define FG_EXIT_MS 3500

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* n0 has run into its deadline on the frozen partner: its gossip.timeouts
 * counter passed what it read at the freeze. */
struct noticed_watch {
    const char *out;
    double timeouts0;
    long long step;
};

static int n0_noticed(void *arg)
{
    struct noticed_watch *w = arg;
    json_t *doc = status_load(w->out, "n0");
    if (!doc)
        return 0;
    w->step = status_step(doc);
    const int yes = status_num(doc, "gossip.timeouts") > w->timeouts0;
    json_decref(doc);
    return yes;
}

struct exit_watch {
    pid_t pid;
};

static int exited(void *arg)
{
    return !alive(((struct exit_watch *)arg)->pid);
}

Test(failures_gossip, sigterm_in_round)
{
    const char *out = tmp_path("sigterm");
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.backend=cpu", "--set", "train.steps=1000000",
                          "--set", "train.eval_every=0", "--set", FG_SET_TIMEOUT(FG_TIMEOUT_MS),
                          "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 50, 120000);
    const pid_t p0 = node_pid(out, "n0"), p1 = node_pid(out, "n1");
    cr_assert_gt(p0, 0);
    cr_assert_gt(p1, 0);
    json_t *d0 = status_load(out, "n0");
    cr_assert_not_null(d0);
    struct noticed_watch sw = {.out = out, .timeouts0 = status_num(d0, "gossip.timeouts"),
                               .step = -1};
    json_decref(d0);
    cr_assert_eq(kill(p1, SIGSTOP), 0);
    const int noticed = live_wait(&l, 30000, n0_noticed, &sw);
    cr_assert(noticed, "n0 never ran into a deadline on frozen n1 (last step %lld)", sw.step);

    const uint64_t t0 = mono_ms();
    cr_assert_eq(kill(p0, SIGTERM), 0);
    struct exit_watch ew = {.pid = p0};
    const int gone = live_wait(&l, 30000, exited, &ew);
    const uint64_t took = mono_ms() - t0;
    cr_log_info("n0 exited %llu ms after SIGTERM (at step %lld)", (unsigned long long)took,
                sw.step);
    kill(p1, SIGCONT);
    kill(p1, SIGTERM);
    live_end(&l, 60000);
    cr_assert(gone, "n0 still running 30 s after SIGTERM");
    cr_expect_leq(took, FG_EXIT_MS, "n0 took %llu ms to exit after SIGTERM",
                  (unsigned long long)took);

    json_t *j = last_json(l.out);
    cr_assert_not_null(j, "no report from dslaunch\n%s", l.err);
    cr_expect_eq(jnum(jnode(j, "n0"), "exit_status"), 128 + SIGTERM);
    cr_expect_geq(jnum(jnode(j, "n0"), "steps"), sw.step, "n0's summary line");
    json_decref(j);
    json_t *doc = status_load(out, "n0");
    cr_assert_not_null(doc, "n0 wrote no status document");
    cr_expect_str_eq(status_state(doc), "stopped");
    cr_log_info("n0: gossip.interrupted=%.0f (non-zero when the signal found it inside a wait)",
                status_num(doc, "gossip.interrupted"));
    json_decref(doc);
    char model[4096];
    snprintf(model, sizeof(model), "%s/n0/model.bin", out);
    struct stat sb;
    cr_expect(stat(model, &sb) == 0 && sb.st_size > 0, "n0 wrote no model (%s)", model);
    live_free(&l);
}

static const char *const survivors[] = {"n0", "n1", "n2"};

/* The longest a survivor may stand still after the crash (see the top). */
#define CRASH_STALL_MS 1500

/* After the crash: every survivor still training with n3 out of its view
 * (size 3, the view change at n3's removal round) and 50 steps past the
 * first such document; its timeouts counted then. */
struct crash_watch {
    const char *out;
    long long step_out[3]; /* first step seen with n3 out of the view; -1 */
    double timeouts[3];
    double max_round[3];
    long long last_step[3];   /* train.step last seen */
    uint64_t since_ms[3];     /* our clock when it was first seen */
    uint64_t stall_ms[3];     /* the longest it stood still */
};

/* How long survivor i's step has stood still, kept as its worst. */
static void track_stall(struct crash_watch *w, int i, long long step)
{
    const uint64_t now = mono_ms();
    if (step != w->last_step[i]) {
        w->last_step[i] = step;
        w->since_ms[i] = now;
    }
    if (now - w->since_ms[i] > w->stall_ms[i])
        w->stall_ms[i] = now - w->since_ms[i];
}

static int survivors_settled(void *arg)
{
    struct crash_watch *w = arg;
    int all = 1;
    for (int i = 0; i < 3; i++) {
        json_t *doc = status_load(w->out, survivors[i]);
        if (!doc) {
            all = 0;
            continue;
        }
        if (!strcmp(status_state(doc), "training"))
            track_stall(w, i, status_step(doc));
        if (!strcmp(status_state(doc), "training") && status_view_size(doc) == 3) {
            const long long step = status_step(doc);
            if (w->step_out[i] < 0)
                w->step_out[i] = step;
            w->timeouts[i] = status_num(doc, "gossip.timeouts");
            w->max_round[i] = status_num(doc, "gossip.max_round_s");
            all &= step >= w->step_out[i] + 50;
        } else {
            all = 0;
        }
        json_decref(doc);
    }
    return all;
}

Test(failures_gossip, crash_bounded)
{
    const char *out = tmp_path("crash");
    const char *args[] = {"local", "-n", "4", "--config", BASE_CONFIG,
                          "--set", "train.backend=cpu", "--set", "train.steps=1000000",
                          "--set", "train.eval_every=0", "--set", "gossip.timeout_ms=2000",
                          "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 120000);
    const pid_t p3 = node_pid(out, "n3");
    cr_assert_gt(p3, 0);
    /* Timeouts before the crash (a round at the start can wait for a node
     * still starting): the crash's cost is what comes on top. */
    double before[3];
    for (int i = 0; i < 3; i++) {
        json_t *doc = status_load(out, survivors[i]);
        cr_assert_not_null(doc, "%s wrote no status document", survivors[i]);
        before[i] = status_num(doc, "gossip.timeouts");
        json_decref(doc);
    }
    struct crash_watch w = {.out = out, .step_out = {-1, -1, -1}};
    for (int i = 0; i < 3; i++) {
        w.last_step[i] = -1;
        w.since_ms[i] = mono_ms();
    }
    cr_assert_eq(kill(p3, SIGKILL), 0);
    const int settled = live_wait(&l, 120000, survivors_settled, &w);
    for (int i = 0; i < 3; i++) {
        const pid_t p = node_pid(out, survivors[i]);
        if (p > 0)
            kill(p, SIGTERM);
    }
    live_end(&l, 60000);
    cr_assert(settled, "n3 not out of every survivor's view while training (steps %lld %lld %lld)",
              w.step_out[0], w.step_out[1], w.step_out[2]);
    for (int i = 0; i < 3; i++) {
        const double cost = w.timeouts[i] - before[i];
        cr_log_info("%s: stood still %llu ms at most; timeouts %.0f before the crash, %.0f "
                    "after (adaptive deadlines); max_round_s=%.3f (n3 out of its view at step "
                    "%lld)", survivors[i], (unsigned long long)w.stall_ms[i], before[i],
                    w.timeouts[i], w.max_round[i], w.step_out[i]);
        cr_expect_leq(w.stall_ms[i], CRASH_STALL_MS, "%s stood still %llu ms after one crash "
                      "(%.0f timeouts)", survivors[i], (unsigned long long)w.stall_ms[i], cost);
        cr_expect_leq(w.max_round[i], 2.0 + 1.0, "%s: a round took %.3f s", survivors[i],
                      w.max_round[i]);
    }
    live_free(&l);
}

/* ---- a straggler ------------------------------------------------------------ */

/* The others' step rate with n3 at 10 Mbit/s, as a share of theirs
 * before: generous for a loaded 2-core machine (goal 0.8, measured in
 * dsbench); 0.36 to 0.58 before the fix, by load. */
#define STRAGGLER_MIN 0.7
#define WINDOW_MS 6000

static const char *const others[] = {"n0", "n1", "n2"};

/* Sum of the three others' train.step now; -1 if a document is missing. */
static long long others_steps(const char *out)
{
    long long sum = 0;
    for (int i = 0; i < 3; i++) {
        json_t *doc = status_load(out, others[i]);
        if (!doc)
            return -1;
        sum += status_step(doc);
        json_decref(doc);
    }
    return sum;
}

struct until_ms {
    uint64_t at;
};

static int reached(void *arg)
{
    return mono_ms() >= ((struct until_ms *)arg)->at;
}

/* The others' steps per second over `ms` of our clock, reading their
 * documents at both ends (the measurement window, not a synchronisation:
 * dslaunch's output is read meanwhile, and its exit ends the wait). */
static double others_rate(struct live *l, const char *out, int ms)
{
    const long long s0 = others_steps(out);
    const uint64_t t0 = mono_ms();
    struct until_ms u = {.at = t0 + (uint64_t)ms};
    cr_assert_eq(live_wait(l, ms + 1000, reached, &u), 1, "dslaunch ended during the window\n%s",
                 l->err);
    const long long s1 = others_steps(out);
    cr_assert(s0 >= 0 && s1 >= s0, "status documents missing");
    return (double)(s1 - s0) * 1000.0 / (double)(mono_ms() - t0);
}

/* `tc qdisc add dev DEV root tbf rate 10mbit ...`, in namespace ns (NULL:
 * the root namespace). 0, or fails the test with tc's message. */
static void tbf_10mbit(const ds_netns *n, const char *ns, const char *dev)
{
    char *argv[16];
    int k = 0;
    if (ns) {
        argv[k++] = (char *)n->ip;
        argv[k++] = "netns";
        argv[k++] = "exec";
        argv[k++] = (char *)ns;
    }
    argv[k++] = (char *)n->tc;
    const char *rest[] = {"qdisc", "add", "dev", dev, "root", "tbf", "rate", "10mbit",
                          "burst", "64kb", "latency", "50ms"};
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++)
        argv[k++] = (char *)rest[i];
    argv[k] = NULL;
    char *o = NULL, *e = NULL, err[256];
    int code = -1;
    const int r = ds_proc_capture(argv, 20000, &o, &e, &code, err, sizeof(err));
    cr_assert(r == 0 && code == 0, "tc on %s %s: %s", ns ? ns : "(root)", dev,
              r == 0 ? (e ? e : "") : err);
    free(o);
    free(e);
}

struct ns_ready {
    const ds_netns *n;
    char veth[32];
};

static int veth_up(void *arg)
{
    const struct ns_ready *w = arg;
    char path[96];
    snprintf(path, sizeof(path), "/sys/class/net/%s", w->veth);
    return access(path, F_OK) == 0;
}

Test(failures_gossip, straggler_10mbit, .timeout = 300)
{
    char why[512];
    if (geteuid() != 0)
        cr_skip_test("--netns needs root");
    if (ds_netns_check(why, sizeof(why)) < 0)
        cr_skip_test("%s", why);
    const char *out = tmp_path("straggler");
    const char *args[] = {"local", "-n", "4", "--netns", "--config", BASE_CONFIG,
                          "--set", "train.backend=cpu", "--set", "train.steps=1000000",
                          "--set", "train.eval_every=0", "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    ds_netns n;
    cr_assert_eq(ds_netns_init(&n, l.pid, 4, 0, why, sizeof(why)), 0, "%s", why);
    wait_for_step(&l, out, "n0", 200, 120000);
    wait_for_step(&l, out, "n3", 200, 60000);
    const double before = others_rate(&l, out, WINDOW_MS);

    /* n3's link, both ends: what it receives (the bridge's side) and what
     * it sends (eth0 in its namespace). */
    struct ns_ready w = {.n = &n};
    snprintf(w.veth, sizeof(w.veth), "dsl%sv3", n.tag);
    cr_assert_eq(live_wait(&l, 5000, veth_up, &w), 1, "no veth %s", w.veth);
    char ns3[64];
    ds_netns_name(&n, 3, ns3, sizeof(ns3));
    tbf_10mbit(&n, NULL, w.veth);
    tbf_10mbit(&n, ns3, "eth0");
    json_t *d3 = status_load(out, "n3");
    cr_assert_not_null(d3);
    const double mixed0 = status_num(d3, "gossip.answered");
    const double trimmed0 = status_num(d3, "gossip.trimmed");
    json_decref(d3);

    /* Let the latencies show it (a few rounds), then measure. */
    (void)others_rate(&l, out, 2000);
    const double after = others_rate(&l, out, WINDOW_MS);
    cr_log_info("others' steps/s: %.1f before, %.1f with n3 at 10 Mbit/s (%.2fx)", before, after,
                after / before);
    json_t *doc = status_load(out, "n0");
    cr_assert_not_null(doc);
    const double slow = status_num(doc, "gossip.slow_peers");
    const double late = status_num(doc, "gossip.late_applied");
    json_decref(doc);
    d3 = status_load(out, "n3");
    cr_assert_not_null(d3);
    const double mixed1 = status_num(d3, "gossip.answered");
    const double trimmed1 = status_num(d3, "gossip.trimmed");
    const char *state3 = status_state(d3);
    const int training3 = !strcmp(state3, "training");
    json_decref(d3);

    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const pid_t p = node_pid(out, name);
        if (p > 0)
            kill(p, SIGTERM);
    }
    const int code = live_end(&l, 60000);
    cr_log_info("n0: slow_peers=%.0f late_applied=%.0f; n3 answered %.0f requests meanwhile",
                slow, late, mixed1 - mixed0);
    cr_expect_neq(code, -1, "dslaunch did not end");
    cr_expect(training3, "n3 stopped training");
    cr_expect_gt(mixed1 - mixed0, 0, "n3 no longer mixes");
    /* n3's own requests carry a share of k on its slow link (latency.h,
     * ds_glat_share): before that rule its link carried a full exchange
     * in several rounds, and its model was 10x further from the others'
     * (docs/gossip.md, "A slow link carries a share"). */
    cr_expect_gt(trimmed1 - trimmed0, 0, "n3 sent no trimmed request (%.0f -> %.0f)", trimmed0,
                 trimmed1);
    cr_expect_geq(after, STRAGGLER_MIN * before,
                  "the others slowed to %.2fx (%.1f -> %.1f steps/s) behind a 10 Mbit/s node",
                  after / before, before, after);
    live_free(&l);
}
