/*
 * tests/test_bench_viz.c: `dsbench viz` (tools/dsbench/bench_viz.c) runs and
 * measures what it says: members simulated by node/membership/sim.h,
 * documents rendered by node/status, served by dsviz --serve whose own
 * history holds more rounds than a node's ring (32) and no more than
 * --history. Small cases (suite unit); the 64-member figures are in
 * docs/benchmarks.md.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "base/log.h"
#include "tools/dsbench/bench.h"
#include "tools/dsviz/viz.h"

static void setup(void)
{
    ds_log_setup("test", DS_LOG_WARN, stderr);
    cr_assert_eq(curl_global_init(CURL_GLOBAL_DEFAULT), 0);
}

static void teardown(void)
{
    curl_global_cleanup();
}

TestSuite(dsbench_viz, .init = setup, .fini = teardown, .timeout = 120);

/* The page's "(history A..B)": the rounds its slider covers. */
static void slider(const char *page, double *lo, double *hi)
{
    const char *p = strstr(page, "(history ");
    cr_assert_not_null(p, "no slider in the page");
    unsigned long long a, b;
    cr_assert_eq(sscanf(p, "(history %llu..%llu)", &a, &b), 2);
    *lo = (double)a;
    *hi = (double)b;
}

static void one_case(unsigned members, unsigned rounds, unsigned history, size_t want_held)
{
    const ds_bench_viz_opts o = {.members = members, .rounds = rounds, .history = history,
                                 .refreshes = 2, .segments = 3, .seed = 5};
    ds_bench_viz_result r;
    char *page = NULL;
    cr_assert_eq(ds_bench_viz_case(&o, &r, &page), 0);
    cr_expect_eq(r.rounds, rounds);
    cr_expect_eq(r.held_max, want_held, "%u members, %u rounds, history %u: held %zu",
                 members, rounds, history, r.held_max);
    cr_expect_geq(r.docs, members - members / 16 - members / 32);
    cr_expect_eq(r.joins, members / 16);
    cr_expect_eq(r.deaths, members / 32);
    cr_expect_eq(r.feeds, (rounds + 15) / 16);
    cr_expect_gt(r.median_ms, 0);
    cr_expect_geq(r.max_ms, r.median_ms);
    cr_expect_gt(r.page_median_ms, 0);
    cr_expect_eq(r.page_bytes, strlen(page));
    double lo, hi;
    slider(page, &lo, &hi);
    cr_expect_eq(hi - lo + 1, (double)want_held, "slider %.0f..%.0f", lo, hi);
    cr_expect_null(strstr(page, "Sources that failed"));
    free(page);
}

/* More rounds than a node keeps (32) and than --history: the server holds
 * --history of them; with a larger --history it holds every round run,
 * beyond what any one document held. */
Test(dsbench_viz, holds_rounds_up_to_history)
{
    one_case(8, 40, 24, 24);
    one_case(16, 80, 1000, 80);
}

Test(dsbench_viz, refuses_bad_options)
{
    ds_bench_viz_opts o = {.members = 1, .rounds = 10, .history = 10, .refreshes = 1,
                           .segments = 2, .seed = 1};
    ds_bench_viz_result r;
    cr_expect_eq(ds_bench_viz_case(&o, &r, NULL), -EINVAL);
    o.members = 4;
    o.history = 0;
    cr_expect_eq(ds_bench_viz_case(&o, &r, NULL), -EINVAL);
}
