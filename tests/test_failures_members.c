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
 * Results come from dslaunch's --json report (each node's exit status,
 * wall_s and log path) and the late node's log; no sleeps.
 *
 * Run: meson test -C build members_faults --verbose
 */
#include <criterion/criterion.h>
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
