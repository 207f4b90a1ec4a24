/*
 * tests/test_failures_members.c: membership under faults with real dsnode
 * processes on loopback, started by dslaunch (issue 16).
 *
 *   members_faults/late_joiner_gives_up: a node added 64 rounds before the
 *       end of a 1500-step run (the least margin dslaunch accepts) is too
 *       late to enter the view: the others are leaving or gone. It must
 *       end on its own with status 1 and a clear error within
 *       cluster.join_timeout_s (plus start-up), and the run must end
 *       without dslaunch's --timeout; before issue 16 it retried forever.
 *
 *   members_faults/frozen_past_death_rejoins: a node stopped (SIGSTOP) until
 *       the others have declared it dead and dropped it from their views,
 *       then let go (SIGCONT), rejoins as a new member: it counts a rejoin
 *       (membership.rejoins), takes the cluster's state and is back in the
 *       views; at the end the models agree as closely as in an undisturbed
 *       run. Before issue 16 it refuted, was put back at once with its
 *       stale model, and trained alone (consensus distance 20x).
 *
 *   members_faults/partition_heals_to_one_view (root, nft): 4 nodes, one
 *       namespace each (dslaunch --netns); nftables rules in each namespace
 *       drop all frames between {n0,n1} and {n2,n3} for 15 s, then are
 *       deleted. Within 20 s of the heal all four status documents must
 *       show one view (four members, all alive), and no node may be seen
 *       alone in a view of one (a node out of the view while it rejoins,
 *       view.me null, is not alone). The goal is 5 s, measured by dsbench
 *       elastic --faults and not met: the nodes declared dead by the other
 *       half rejoin lag rounds (about 5 s) after the first frame crosses,
 *       and that frame waits for TCP's backed-off retransmissions (1 to
 *       10 s); the bound keeps this a test of the defect, not of timing.
 *       Before issue 16 a DEAD verdict from the other half overrode a
 *       node's own evidence and left two members alone for 17.5 s.
 *       Then, 8 s after one view, the nodes' rounds (status documents
 *       rewritten every 50 ms) must lie within 200 of each other: the
 *       halves meet rounds apart, and before pacing one node could run
 *       away from the others (docs/gossip.md). A guard, not a proof: in
 *       this test's configuration the build before pacing passed 7 runs
 *       of 7; `dsbench elastic --faults --scenario partition` (8,000
 *       steps) is where the runaway showed, in about 4 runs of 10.
 *       Skipped when not root or without nft; the
 *       namespaces (and the rules in them) go with dslaunch, or are
 *       reaped by the suite's fini (a root run's fini removes any
 *       namespace whose dslaunch is gone) when a test fails.
 *
 * Results come from dslaunch's --json report (each node's exit status,
 * wall_s and log path), the nodes' status.json documents (waited on with
 * hard deadlines) and the late node's log; no sleeps.
 *
 * Run: meson test -C build members_faults --verbose
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

/* Whatever a failed test left: dslaunch is SIGKILLed by tmp_fini, then
 * its namespaces (and the nftables rules inside them) are removed as
 * stale leftovers. */
static void members_fini(void)
{
    tmp_fini();
    if (geteuid() == 0)
        ds_netns_reap_stale(NULL);
}

TestSuite(members_faults, .init = tmp_init, .fini = members_fini, .timeout = 280);

#define JOIN_TIMEOUT_S 10
#define STR_(x) #x
#define STR(x) STR_(x)

Test(members_faults, late_joiner_gives_up)
{
    const char *out = tmp_path("late");
    const char *args[] = {"local", "-n", "3", "--config", BASE_CONFIG,
                          "--set", "train.steps=1500", "--set", "train.backend=cpu",
                          "--set", "train.eval_every=0", "--set", "train.log_every=4",
                          "--set", "cluster.join_timeout_s=" STR(JOIN_TIMEOUT_S),
                          "--add-at", "1436:1", "--out", out, "--json",
                          "--timeout", "200", "--dsnode", bin("DSNODE"), NULL};
    struct result r = run_dslaunch(240000, args);
    json_t *j = last_json(r.out);
    cr_assert(json_is_null(json_object_get(j, "stopped_by")), "the run did not end by itself:\n%s",
              r.err);
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_expect_eq(jnum(jnode(j, name), "exit_status"), 0, "%s failed:\n%s", name, r.err);
    }
    const json_t *n3 = jnode(j, "n3");
    /* The late joiner's log first, so that every failure below shows it
     * (a CI run once found no summary line from n3). */
    char *log = read_text(jstr(n3, "log"));
    cr_assert_not_null(log);
    cr_expect_eq(jnum(n3, "exit_status"), 1, "the late joiner's exit status; its log:\n%s", log);
    cr_expect_str_eq(jstr(n3, "status"), "failed");
    const json_t *steps = json_object_get(n3, "steps");
    cr_assert(json_is_number(steps) && json_number_value(steps) == 0,
              "n3 printed no summary with steps=0; dslaunch:\n%s\nn3's log:\n%s", r.err, log);
    /* Within join_timeout_s of its start, plus 5 s to load and start. */
    cr_expect_leq(jnum(n3, "wall_s"), JOIN_TIMEOUT_S + 5.0, "n3 ran %.1f s",
                  jnum(n3, "wall_s"));
    cr_expect_not_null(strstr(log, "cannot join cluster 'local4': "), "no clear error:\n%s", log);
    cr_expect(strstr(log, "cluster finishing") ||
                  strstr(log, "cluster.join_timeout_s=" STR(JOIN_TIMEOUT_S)) ||
                  strstr(log, "no model state came from the cluster"),
              "the error names no reason:\n%s", log);
    cr_expect_eq(jnum(j, "exit_status"), 1, "dslaunch reports the failed node");
    cr_log_info("late joiner: exit %.0f after %.1f s", jnum(n3, "exit_status"), jnum(n3, "wall_s"));
    free(log);
    json_decref(j);
    result_free(&r);
}

/* ---- a node stopped past its death ---------------------------------------------- */

struct freeze_watch {
    const char *out;
    long long n0_step, n3_rejoins;
};

/* n0 has dropped n3 from its view (dead, removal passed). */
static int n0_dropped_n3(void *arg)
{
    struct freeze_watch *w = arg;
    json_t *doc = status_load(w->out, "n0");
    int done = 0;
    if (doc) {
        w->n0_step = status_step(doc);
        const char *st = status_member(doc, "n3");
        done = (!st || !strcmp(st, "dead")) && status_view_size(doc) == 3;
        json_decref(doc);
    }
    return done;
}

/* n3 has rejoined (its own count) and n0's view lists it alive again. */
static int n3_back(void *arg)
{
    struct freeze_watch *w = arg;
    json_t *d3 = status_load(w->out, "n3");
    json_t *d0 = status_load(w->out, "n0");
    int done = 0;
    if (d3 && d0) {
        w->n3_rejoins = (long long)status_num(d3, "membership.rejoins");
        const char *st = status_member(d0, "n3");
        done = w->n3_rejoins >= 1 && st && !strcmp(st, "alive") && status_view_size(d0) == 4;
    }
    json_decref(d3);
    json_decref(d0);
    return done;
}

/* The first "refuted with incarnation" line of a node's log whose time
 * (the line's ISO 8601 UTC stamp, base/log.h) is at or after t_ms; NULL
 * when none. */
static const char *refute_after(const char *log, uint64_t t_ms)
{
    for (const char *p = strstr(log, "refuted with incarnation"); p;
         p = strstr(p + 1, "refuted with incarnation")) {
        const char *line = p;
        while (line > log && line[-1] != '\n')
            line--;
        struct tm tm;
        memset(&tm, 0, sizeof(tm));
        const char *rest = strptime(line, "%Y-%m-%dT%H:%M:%S", &tm);
        int ms = 0;
        if (!rest || sscanf(rest, ".%3d", &ms) != 1)
            return line; /* no stamp: counted, not guessed */
        const uint64_t t = (uint64_t)timegm(&tm) * 1000u + (uint64_t)ms;
        if (t >= t_ms)
            return line;
    }
    return NULL;
}

Test(members_faults, frozen_past_death_rejoins)
{
    const char *out = tmp_path("frozen");
    /* 8000 steps: on a quiet machine the other three did 3000 before n3
     * was declared dead and back ("n0 still had n3 in its view ... (step
     * 3000)", "n3 not back 60 s after SIGCONT"), and the test waits on
     * n0's view while n0 still runs. */
    const char *args[] = {"local", "-n", "4", "--config", BASE_CONFIG,
                          "--set", "train.steps=8000", "--set", "train.backend=cpu",
                          "--set", "train.eval_every=0", "--set", "train.log_every=10",
                          "--set", "gossip.timeout_ms=2000", "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "200", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 60000);
    const pid_t p = node_pid(out, "n3");
    cr_assert_gt(p, 0);
    struct freeze_watch w = {.out = out};
    const uint64_t t_stop = ds_unix_ms();
    cr_assert_eq(kill(p, SIGSTOP), 0);
    const int dropped = live_wait(&l, 60000, n0_dropped_n3, &w);
    const long long step_at_drop = w.n0_step;
    cr_assert_eq(kill(p, SIGCONT), 0);
    cr_assert(dropped, "n0 still had n3 in its view 60 s after SIGSTOP (step %lld)", w.n0_step);
    cr_assert(live_wait(&l, 60000, n3_back, &w),
              "n3 not back 60 s after SIGCONT (its rejoins: %lld)", w.n3_rejoins);
    cr_log_info("n3 dropped by n0 at step %lld, back with %lld rejoin(s)", step_at_drop,
                w.n3_rejoins);
    const int code = live_end(&l, 200000);
    cr_assert_eq(code, 0, "exit %d\n%s", code, l.err);
    json_t *j = last_json(l.out);
    const json_t *n3 = jnode(j, "n3");
    cr_expect_eq(jnum(n3, "steps"), 8000, "n3 finished with the cluster");
    char *log = read_text(jstr(n3, "log"));
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "rejoining at round"), "n3 never took the rejoin path");
    cr_expect_not_null(strstr(log, "model state received"), "n3 never fetched the state");
    /* Refuted instead of rejoining: a refute logged after the freeze began
     * and before the rejoin. One before the freeze is SWIM's answer to a
     * false suspicion under load (a CI run beside another 4-node test saw
     * one), as is one after the rejoin. One at the wake, before the stop
     * was noticed, was a defect (CI of 271d236: the suspicion waiting in
     * the socket was refuted 12 ms before the tick's "stopped for"; the
     * receive path now checks for the stop first, docs/membership.md). */
    const char *ref = refute_after(log, t_stop);
    const char *rejoin = strstr(log, "rejoining at round");
    cr_expect(!ref || (rejoin && ref > rejoin), "n3 refuted instead of rejoining: %.160s",
              ref ? ref : "");
    free(log);
    /* Undisturbed, this cluster ends at about 0.03 (the cluster suite's
     * crossover + MiCRO run); issue 16 measured 20x that after a freeze. */
    cr_log_info("consensus distance %.4f", jnum(j, "consensus_distance"));
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1, "n3 mixes with the others again");
    json_decref(j);
    live_free(&l);
}

/* ---- a 2|2 partition, healed ------------------------------------------------------ */

#define CUT_S 15
#define HEAL_BOUND_S 20
#define PACE_CHECK_S 8 /* after one view: the rounds must be near */

/* `ip netns exec NS nft ARGS...`; 0 on success. */
static int nft_in(const char *ns, const char *const *args)
{
    char *argv[24] = {"/usr/sbin/ip", "netns", "exec", (char *)ns, "/usr/sbin/nft"};
    int k = 5;
    for (; *args && k < 23; args++)
        argv[k++] = (char *)*args;
    argv[k] = NULL;
    char *out = NULL, *etext = NULL, err[256];
    int code = -1;
    const int e = ds_proc_capture(argv, 20000, &out, &etext, &code, err, sizeof(err));
    if (e == 0 && code != 0)
        cr_log_error("nft in %s: %s", ns, etext ? etext : "");
    free(out);
    free(etext);
    return e == 0 && code == 0 ? 0 : -1;
}

/* Node i drops every frame to and from the two nodes of the other half
 * (cut), or deletes that table again (heal). */
static int cut_node(pid_t owner, int i, int on)
{
    char ns[64], a[32], b[32], set[80];
    snprintf(ns, sizeof(ns), "dsl-%ld-n%d", (long)owner, i);
    if (!on) {
        const char *del[] = {"delete", "table", "inet", "ds_cut", NULL};
        return nft_in(ns, del);
    }
    ds_netns_addr(i < 2 ? 2 : 0, a, sizeof(a));
    ds_netns_addr(i < 2 ? 3 : 1, b, sizeof(b));
    snprintf(set, sizeof(set), "{ %s, %s }", a, b);
    const char *t[] = {"add", "table", "inet", "ds_cut", NULL};
    const char *ci[] = {"add", "chain", "inet", "ds_cut", "in",
                        "{ type filter hook input priority 0 ; }", NULL};
    const char *co[] = {"add", "chain", "inet", "ds_cut", "out",
                        "{ type filter hook output priority 0 ; }", NULL};
    const char *ri[] = {"add", "rule", "inet", "ds_cut", "in", "ip", "saddr", set, "drop", NULL};
    const char *ro[] = {"add", "rule", "inet", "ds_cut", "out", "ip", "daddr", set, "drop", NULL};
    return nft_in(ns, t) || nft_in(ns, ci) || nft_in(ns, co) || nft_in(ns, ri) || nft_in(ns, ro)
               ? -1
               : 0;
}

static int cut_all(pid_t owner, int on)
{
    int e = 0;
    for (int i = 0; i < 4; i++)
        e |= cut_node(owner, i, on);
    return e;
}

struct heal_watch {
    const char *out;
    int solo;         /* a node was seen alone in its view after the heal */
    long long sizes[4];
    long long rounds[4]; /* each node's round, from its last document */
};

/* All four documents: a view of four members, all alive. */
static int one_view(void *arg)
{
    struct heal_watch *w = arg;
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *d = status_load(w->out, name);
        w->sizes[i] = d ? status_view_size(d) : -1;
        /* Alone: a view of one that holds this node (view.me set). A node
         * out of the view while it rejoins (view.me null) is not. */
        w->solo |= w->sizes[i] == 1 &&
                   json_is_integer(json_object_get(json_object_get(d, "view"), "me"));
        int alive = 0;
        for (int k = 0; d && k < 4; k++) {
            char m[8];
            snprintf(m, sizeof(m), "n%d", k);
            const char *st = status_member(d, m);
            alive += st && !strcmp(st, "alive");
        }
        ok = ok && w->sizes[i] == 4 && alive == 4;
        json_decref(d);
    }
    return ok;
}

/* The membership lines of each node's log from the heal on, for a failure's
 * report: what each node heard and decided. */
static void log_membership(const char *out, const char *since)
{
    for (int i = 0; i < 4; i++) {
        char path[512], line[512];
        snprintf(path, sizeof(path), "%s/n%d.log", out, i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int n = 0;
        while (fgets(line, sizeof(line), f) && n < 40)
            if (strcmp(line, since) >= 0 && strstr(line, " membership ")) {
                cr_log_error("%s", line);
                n++;
            }
        fclose(f);
    }
}

/* n0 and n2 each see a 2-node view: the halves have dropped each other. */
static int halves_split(void *arg)
{
    struct heal_watch *w = arg;
    json_t *d0 = status_load(w->out, "n0"), *d2 = status_load(w->out, "n2");
    const int split = d0 && d2 && status_view_size(d0) == 2 && status_view_size(d2) == 2;
    json_decref(d0);
    json_decref(d2);
    return split;
}

static int never(void *arg)
{
    (void)arg;
    return 0;
}

/* Reads every node's round; never done (a sample over a fixed time). */
static int read_rounds(void *arg)
{
    struct heal_watch *w = arg;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *d = status_load(w->out, name);
        if (d)
            w->rounds[i] = (long long)status_num(d, "round");
        json_decref(d);
    }
    return 0;
}

Test(members_faults, partition_heals_to_one_view)
{
    char why[512];
    if (geteuid() != 0)
        cr_skip_test("the partition needs root (namespaces, nftables)");
    if (ds_netns_check(why, sizeof(why)) < 0)
        cr_skip_test("%s", why);
    if (access("/usr/sbin/nft", X_OK) != 0)
        cr_skip_test("no /usr/sbin/nft (apt-get install nftables)");
    const char *out = tmp_path("partition");
    const char *args[] = {"local", "-n", "4", "--netns", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000", "--set", "train.backend=cpu",
                          "--set", "train.eval_every=0", "--set", "train.log_every=10",
                          "--set", "gossip.timeout_ms=2000", "--set", STATUS_FILE_ON,
                          "--set", "status.file_interval_ms=50",
                          "--out", out, "--json", "--timeout", "200", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150, 60000);
    cr_assert_eq(cut_all(l.pid, 1), 0, "could not cut the cluster 2|2 with nftables");
    struct heal_watch w = {.out = out};
    /* The cut itself lasts CUT_S: nothing to wait on but the clock. */
    live_wait(&l, CUT_S * 1000, never, NULL);
    cr_assert(!l.exited, "dslaunch ended during the partition:\n%s", l.err);
    const int split = halves_split(&w);
    /* Log lines start with an ISO 8601 UTC time: they sort as text. */
    char since[32];
    const time_t t_heal = time(NULL);
    strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%S", gmtime(&t_heal));
    cr_assert_eq(cut_all(l.pid, 0), 0, "could not heal the cut");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int one = live_wait(&l, HEAL_BOUND_S * 1000, one_view, &w);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_log_info("before the heal the halves had %s each other; views after %.1f s: %lld %lld %lld "
                "%lld", split ? "dropped" : "not dropped", took, w.sizes[0], w.sizes[1],
                w.sizes[2], w.sizes[3]);
    if (!one || w.solo)
        log_membership(out, since);
    cr_expect(one, "no single view %d s after the heal (view sizes %lld %lld %lld %lld)",
              HEAL_BOUND_S, w.sizes[0], w.sizes[1], w.sizes[2], w.sizes[3]);
    cr_expect(!w.solo, "a node sat alone in its view after the heal");
    /* Then the rounds: a node ahead of most of its view must hold for it
     * (docs/gossip.md, pacing). A node that runs away at compute speed
     * drifts hundreds of rounds a second from the others. */
    if (one) {
        live_wait(&l, PACE_CHECK_S * 1000, read_rounds, &w);
        long long lo = w.rounds[0], hi = w.rounds[0];
        for (int i = 1; i < 4; i++) {
            lo = w.rounds[i] < lo ? w.rounds[i] : lo;
            hi = w.rounds[i] > hi ? w.rounds[i] : hi;
        }
        cr_log_info("rounds %d s after one view: %lld %lld %lld %lld", PACE_CHECK_S,
                    w.rounds[0], w.rounds[1], w.rounds[2], w.rounds[3]);
        cr_expect_leq(hi - lo, 200, "rounds %lld %lld %lld %lld %d s after one view: a node "
                      "ran away from the others", w.rounds[0], w.rounds[1], w.rounds[2],
                      w.rounds[3], PACE_CHECK_S);
    }
    kill(l.pid, SIGTERM); /* the run is long on purpose: end it now */
    const int code = live_end(&l, 60000);
    cr_expect_neq(code, -1, "dslaunch did not end 60 s after SIGTERM");
    live_free(&l);
}
