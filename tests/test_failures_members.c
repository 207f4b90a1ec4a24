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
 * Results come from dslaunch's --json report (each node's exit status,
 * wall_s and log path), the nodes' status.json documents (waited on with
 * hard deadlines) and the late node's log; no sleeps.
 *
 * Run: meson test -C build members_faults --verbose
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch_util.h"

TestSuite(members_faults, .init = tmp_init, .fini = tmp_fini, .timeout = 280);

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
    cr_expect_eq(jnum(n3, "exit_status"), 1, "the late joiner's exit status");
    cr_expect_str_eq(jstr(n3, "status"), "failed");
    cr_expect_eq(jnum(n3, "steps"), 0);
    /* Within join_timeout_s of its start, plus 5 s to load and start. */
    cr_expect_leq(jnum(n3, "wall_s"), JOIN_TIMEOUT_S + 5.0, "n3 ran %.1f s",
                  jnum(n3, "wall_s"));
    char *log = read_text(jstr(n3, "log"));
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "cannot join cluster 'local4': "), "no clear error:\n%s", log);
    cr_expect(strstr(log, "cluster finishing") || strstr(log, "cluster.join_timeout_s="
                                                             STR(JOIN_TIMEOUT_S)),
              "the error names neither reason:\n%s", log);
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

Test(members_faults, frozen_past_death_rejoins)
{
    const char *out = tmp_path("frozen");
    const char *args[] = {"local", "-n", "4", "--config", BASE_CONFIG,
                          "--set", "train.steps=3000", "--set", "train.backend=cpu",
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
    cr_expect_eq(jnum(n3, "steps"), 3000, "n3 finished with the cluster");
    char *log = read_text(jstr(n3, "log"));
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "rejoining at round"), "n3 never took the rejoin path");
    cr_expect_not_null(strstr(log, "model state received"), "n3 never fetched the state");
    cr_expect_null(strstr(log, "refuted with incarnation"), "n3 refuted instead of rejoining");
    free(log);
    /* Undisturbed, this cluster ends at about 0.03 (the cluster suite's
     * crossover + MiCRO run); issue 16 measured 20x that after a freeze. */
    cr_log_info("consensus distance %.4f", jnum(j, "consensus_distance"));
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1, "n3 mixes with the others again");
    json_decref(j);
    live_free(&l);
}
