/*
 * tests/test_runtime.c: the runtime's elasticity policies, each a pure
 * module fed with times and rounds (node/runtime/skip.h, lag.h, pace.h,
 * shadow.h, leave.h). Every test states one rule of docs/gossip.md and the
 * commit that made it (3f33fb9, fea1128, 5adf3a2, cb1b72e, d8dfb64); no
 * clock, no thread, no network. The engine that applies them is tested
 * with real processes by the `elastic` and `dslaunch_run` suites.
 * Run: meson test -C build runtime --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "node/runtime/lag.h"
#include "node/runtime/leave.h"
#include "node/runtime/pace.h"
#include "node/runtime/shadow.h"
#include "node/runtime/skip.h"

#define MS 1000000ull  /* ns */
#define SEC 1000000000ull

TestSuite(skip);

/* A missed gossip deadline: the next 4 rounds send to the peer but do not
 * wait for it; the fifth waits again (the peer may have been the one that
 * was slow only once, or we were). */
Test(skip, a_missed_deadline_stops_the_waiting_not_the_sends)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    cr_assert_eq(ds_skip_missed(&t, 7, 100, 0, 0), 1, "new in the table");
    for (uint64_t r = 101; r <= 104; r++)
        cr_expect_eq(ds_skip_check(&t, 7, r, 0), DS_SKIP_NOWAIT, "round %llu", (unsigned long long)r);
    cr_expect_eq(ds_skip_check(&t, 7, 105, 0), DS_SKIP_WAIT);
    cr_expect_eq(ds_skip_check(&t, 8, 101, 0), DS_SKIP_WAIT, "another peer is not affected");
}

/* Every further miss in a row doubles the window, up to 64 times the
 * first (4 -> 256 rounds), however many misses follow. */
Test(skip, the_window_doubles_per_miss_up_to_64x)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    uint64_t round = 1000;
    const uint64_t want[] = {4, 8, 16, 32, 64, 128, 256, 256, 256};
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
        cr_assert_eq(ds_skip_missed(&t, 7, round, 0, 0), k == 0);
        cr_expect_eq(ds_skip_check(&t, 7, round + want[k], 0), DS_SKIP_NOWAIT, "miss %zu", k + 1);
        cr_expect_eq(ds_skip_check(&t, 7, round + want[k] + 1, 0), DS_SKIP_WAIT,
                     "miss %zu: window longer than %llu", k + 1, (unsigned long long)want[k]);
        round += want[k] + 1; /* tried again, and missed again */
    }
}

/* Hearing from the peer ends the skip at once and forgets its misses: the
 * next miss is a first one again. */
Test(skip, hearing_from_the_peer_forgets_it)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    for (int k = 0; k < 5; k++)
        ds_skip_missed(&t, 7, 100, 0, 0);
    ds_skip_heard(&t, 7);
    cr_expect_eq(ds_skip_check(&t, 7, 101, 0), DS_SKIP_WAIT);
    cr_expect_eq(t.n, 0);
    cr_assert_eq(ds_skip_missed(&t, 7, 200, 0, 0), 1);
    cr_expect_eq(ds_skip_check(&t, 7, 204, 0), DS_SKIP_NOWAIT);
    cr_expect_eq(ds_skip_check(&t, 7, 205, 0), DS_SKIP_WAIT, "the window starts over at 4");
    /* Past its window it is tried again, but still listed until heard. */
    cr_expect(ds_skip_listed(&t, 7));
    ds_skip_heard(&t, 99); /* unknown: nothing happens */
    cr_expect_eq(t.n, 1);
    cr_expect(!ds_skip_listed(&t, 99));
    ds_skip_heard(&t, 7);
    cr_expect(!ds_skip_listed(&t, 7));
}

/* A transport that cannot deliver to the peer is hard: nothing is sent
 * either, for the same window. */
Test(skip, an_undeliverable_peer_is_not_sent_to)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    ds_skip_missed(&t, 7, 100, 0, 1);
    cr_expect_eq(ds_skip_check(&t, 7, 104, 0), DS_SKIP_ALL);
    cr_expect_eq(ds_skip_check(&t, 7, 105, 0), DS_SKIP_WAIT, "tried again after the window");
    /* Once hard, a soft miss does not soften it until heard. */
    ds_skip_missed(&t, 7, 105, 0, 0);
    cr_expect_eq(ds_skip_check(&t, 7, 106, 0), DS_SKIP_ALL);
}

/* A membership verdict (suspected, dead, left) is hard and holds until
 * the peer is heard from, however many rounds pass; later misses neither
 * soften nor shorten it. */
Test(skip, a_verdict_holds_until_heard)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    cr_assert_eq(ds_skip_hold(&t, 7), 1);
    cr_expect_eq(ds_skip_check(&t, 7, 0, 0), DS_SKIP_ALL);
    cr_expect_eq(ds_skip_check(&t, 7, UINT64_MAX - 1, 0), DS_SKIP_ALL);
    cr_assert_eq(ds_skip_missed(&t, 7, 100, 0, 0), 0, "known already");
    cr_expect_eq(ds_skip_check(&t, 7, 1000000, 0), DS_SKIP_ALL);
    ds_skip_heard(&t, 7);
    cr_expect_eq(ds_skip_check(&t, 7, 1000000, 0), DS_SKIP_WAIT);
    /* A verdict on a peer already skipped softly makes it hard. */
    ds_skip_missed(&t, 8, 100, 0, 0);
    cr_assert_eq(ds_skip_hold(&t, 8), 0);
    cr_expect_eq(ds_skip_check(&t, 8, 1000000, 0), DS_SKIP_ALL);
}

/* At most 64 peers are tracked; one more is waited for as usual. */
Test(skip, a_full_table_records_no_more)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    for (uint64_t id = 1; id <= DS_SKIP_MAX; id++)
        cr_assert_eq(ds_skip_missed(&t, id, 100, 0, 0), 1);
    cr_expect_eq(ds_skip_missed(&t, 1000, 100, 0, 0), -ENOSPC);
    cr_expect_eq(ds_skip_hold(&t, 1000), -ENOSPC);
    cr_expect_eq(ds_skip_check(&t, 1000, 101, 0), DS_SKIP_WAIT);
    cr_expect_eq(ds_skip_missed(&t, 5, 100, 0, 0), 0, "a known peer is still updated");
}

/* A window also lasts min_ms at least (the engine sets the gossip
 * timeout): rounds that run fast do not bring a peer that cost a full
 * deadline back before membership could judge it. The longer of the two
 * holds: rounds once the time has passed, the time once the rounds
 * have. Hearing from the peer still ends it at once. */
Test(skip, a_window_lasts_min_ms_however_fast_rounds_go)
{
    ds_skip_table t;
    memset(&t, 0, sizeof(t));
    t.min_ms = 2000;
    ds_skip_missed(&t, 7, 100, 50000, 0);
    cr_expect_eq(ds_skip_check(&t, 7, 105, 50000), DS_SKIP_NOWAIT, "rounds past, time not");
    cr_expect_eq(ds_skip_check(&t, 7, 1000, 51999), DS_SKIP_NOWAIT, "rounds past, time not");
    cr_expect_eq(ds_skip_check(&t, 7, 104, 60000), DS_SKIP_NOWAIT, "time past, rounds not");
    cr_expect_eq(ds_skip_check(&t, 7, 105, 52000), DS_SKIP_WAIT, "both past");
    /* A later miss never shortens it; one that ends later extends it. */
    ds_skip_missed(&t, 7, 101, 49000, 0);
    cr_expect_eq(ds_skip_check(&t, 7, 200, 51999), DS_SKIP_NOWAIT);
    ds_skip_missed(&t, 7, 200, 53000, 0);
    cr_expect_eq(ds_skip_check(&t, 7, 1000, 54999), DS_SKIP_NOWAIT);
    cr_expect_eq(ds_skip_check(&t, 7, 1000, 55000), DS_SKIP_WAIT);
    ds_skip_heard(&t, 7);
    cr_expect_eq(ds_skip_check(&t, 7, 0, 0), DS_SKIP_WAIT, "heard from: waited for at once");
    /* min_ms 0: rounds only, as before. */
    t.min_ms = 0;
    ds_skip_missed(&t, 8, 100, 50000, 0);
    cr_expect_eq(ds_skip_check(&t, 8, 105, 50000), DS_SKIP_WAIT);
}

TestSuite(lag);

/* The lag is 5 seconds' worth of rounds at the pace measured over a
 * window of at least 2 s; the first call only starts the window. */
Test(lag, five_seconds_of_rounds)
{
    ds_lag l;
    ds_lag_init(&l, 32);
    cr_expect_eq(ds_lag_update(&l, 0, 0), 0, "the first call starts the window");
    cr_expect_eq(ds_lag_update(&l, 1999, 150), 0, "a window is at least 2 s");
    cr_expect_eq(l.lag, 32);
    cr_expect_eq(ds_lag_update(&l, 2000, 200), 1);
    cr_expect_float_eq(l.rate, 100.0, 1e-9);
    cr_expect_eq(l.lag, 500);
    cr_expect_eq(ds_lag_update(&l, 3000, 300), 0, "the next window started at 2000 ms");
}

/* Never below 32 rounds, never above 2^20. */
Test(lag, between_32_and_2_20_rounds)
{
    ds_lag l;
    ds_lag_init(&l, 100);
    ds_lag_update(&l, 0, 0);
    cr_expect_eq(ds_lag_update(&l, 2000, 2), 1);
    cr_expect_eq(l.lag, DS_LAG_MIN_ROUNDS, "1 round/s gives 5 rounds: %llu", (unsigned long long)l.lag);
    ds_lag_init(&l, 100);
    ds_lag_update(&l, 0, 0);
    ds_lag_update(&l, 2000, 2000000);
    cr_expect_eq(l.lag, DS_LAG_MAX_ROUNDS);
}

/* Membership is told only of a change by more than a quarter. */
Test(lag, moves_only_by_more_than_a_quarter)
{
    ds_lag l;
    ds_lag_init(&l, 32);
    ds_lag_update(&l, 0, 0);
    ds_lag_update(&l, 2000, 200); /* 100/s: 500 */
    cr_expect_eq(ds_lag_update(&l, 4000, 200 + 240), 0, "120/s: 600 is within 625");
    cr_expect_eq(l.lag, 500);
    cr_expect_eq(ds_lag_update(&l, 6000, 440 + 260), 1, "130/s: 650");
    cr_expect_eq(l.lag, 650);
}

/* A lag sized at 100 rounds/s (500 rounds), its window begun at 2000 ms
 * and round 300. */
static void lag_at_100_a_second(ds_lag *l)
{
    ds_lag_init(l, 32);
    ds_lag_update(l, 0, 100);
    ds_lag_update(l, 2000, 300);
    cr_assert_eq(l->lag, 500);
}

/* A round that goes back (a group member takes member 0's step) starts
 * the window again: before, the unsigned difference gave a lag of 2^20
 * rounds for good, and a death this node declared never took effect (CI:
 * a group kept its killed member to the end and its survivors differed). */
Test(lag, a_round_that_goes_back_starts_the_window_again)
{
    ds_lag l;
    lag_at_100_a_second(&l);
    cr_expect_eq(ds_lag_update(&l, 3000, 120), 0, "back from 300 to 120: no rate from that");
    cr_expect_eq(l.lag, 500);
    cr_expect_eq(ds_lag_update(&l, 4500, 270), 0, "1.5 s since the new window began");
    cr_expect_eq(ds_lag_update(&l, 5000, 320), 0, "100 rounds/s again: 500, unchanged");
    cr_expect_eq(l.lag, 500);
    cr_expect_float_eq(l.rate, 100.0, 1e-9, "the rate of the window since the round went back");
}

/* A jump forward told by ds_lag_restart (a member took member 0's step
 * ahead of its own) is not a pace: the window starts at the jump. */
Test(lag, a_restart_at_a_jump_forward_keeps_the_pace)
{
    ds_lag l;
    lag_at_100_a_second(&l);
    ds_lag_restart(&l, 2500, 750); /* 400 rounds ahead, at 350 */
    cr_expect_eq(ds_lag_update(&l, 4500, 950), 0, "100 rounds/s since the jump: 500 still");
    cr_expect_eq(l.lag, 500);
    cr_expect_float_eq(l.rate, 100.0, 1e-9);
    /* Without the restart the window from 2000 to 4500 ms held 650
     * rounds: 260 rounds/s, a lag of 1300. */
    ds_lag m;
    lag_at_100_a_second(&m);
    cr_expect_eq(ds_lag_update(&m, 4500, 950), 1);
    cr_expect_eq(m.lag, 1300);
}

/* The lag follows a peak of the pace that decays by a fifth per window,
 * so the stall right after a crash (rounds waiting out their timeouts)
 * does not shrink the lag of the death that follows (commit 3f33fb9). */
Test(lag, follows_a_decaying_peak_of_the_rate)
{
    ds_lag l;
    ds_lag_init(&l, 32);
    ds_lag_update(&l, 0, 0);
    ds_lag_update(&l, 2000, 200); /* 100 rounds/s */
    cr_assert_eq(l.lag, 500);
    uint64_t t = 2000, round = 200;
    /* A stall: two timeouts, no round at all. */
    t += 2000;
    cr_expect_eq(ds_lag_update(&l, t, round), 0);
    cr_expect_float_eq(l.rate, 0.0, 1e-12, "the rate measured is the stall's");
    cr_expect_float_eq(l.peak, 80.0, 1e-9);
    cr_expect_eq(l.lag, 500, "400 is within a quarter of 500: unchanged");
    t += 2000;
    cr_expect_eq(ds_lag_update(&l, t, round), 1);
    cr_expect_float_eq(l.peak, 64.0, 1e-9);
    cr_expect_eq(l.lag, 320, "the peak decays a fifth per window");
    /* The pace comes back: the peak follows it up at once. */
    t += 2000;
    round += 200;
    cr_expect_eq(ds_lag_update(&l, t, round), 1);
    cr_expect_float_eq(l.peak, 100.0, 1e-9);
    cr_expect_eq(l.lag, 500);
}

/* A joiner with the cluster's state comes in a quarter of a second of
 * rounds after it (plus the rounds run since it asked for the state), sized from the cluster's lag (its peak pace) when that is
 * above the floor, else from the snapshot's rate; never fewer than 4
 * rounds; 0 (keep the seed's round) when no pace is known or the full lag
 * is no longer. */
Test(lag, a_join_is_a_quarter_second_of_rounds)
{
    cr_expect_eq(ds_join_lag_rounds(500, 12.4, 0), 25, "100 rounds/s at its peak, not 12.4");
    cr_expect_eq(ds_join_lag_rounds(32, 200.0, 0), 0, "the seed's 32 rounds are shorter");
    cr_expect_eq(ds_join_lag_rounds(32, 40.0, 0), 10, "lag at its floor: the snapshot's rate");
    cr_expect_eq(ds_join_lag_rounds(0, 200.0, 0), 50, "no lag sent: the snapshot's rate");
    cr_expect_eq(ds_join_lag_rounds(32, 0.0, 0), 0, "no pace known: the seed's round stays");
    cr_expect_eq(ds_join_lag_rounds(32, 2.0, 0), DS_JOIN_LAG_MIN_ROUNDS, "slow: 4 rounds, 2 s");
    cr_expect_eq(ds_join_lag_rounds(0, 0.5, 0), DS_JOIN_LAG_MIN_ROUNDS);
    cr_expect_eq(ds_join_lag_rounds(4, 0.5, 0), 0, "not shorter than the lag");
    cr_expect_eq(ds_join_lag_rounds(500, 12.4, 300), 55, "plus 0.3 s the cluster ran since");
    cr_expect_eq(ds_join_lag_rounds(500, 12.4, 5000), 0, "a snapshot 5 s old: the full lag");
}

TestSuite(pace);

/* A joiner runs round r no earlier than (r - snapshot round) / rate after
 * the snapshot arrived: it enters the view in step with the cluster
 * instead of seconds ahead of it (commit 5adf3a2). */
Test(pace, a_joiner_keeps_the_clusters_pace)
{
    ds_pace p = {0};
    const uint64_t t0 = 5 * SEC;
    ds_pace_set(&p, t0, 100, 50.0); /* round 100, 50 rounds/s */
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 1000, t0), 1 * SEC, "round 150 is due 1 s later");
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 1000, t0 + 400 * MS), 600 * MS);
    cr_expect_eq(ds_pace_wait_ns(&p, 101, 1000, t0), 20 * MS);
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 1000, t0 + 2 * SEC), 0, "late: go now");
}

/* From its join round on the gossip rounds pace the joiner; without a
 * known pace, or for rounds not past the snapshot's, it does not wait. */
Test(pace, only_before_the_join_round)
{
    ds_pace p = {0};
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 1000, 0), 0, "no snapshot yet: no pace");
    ds_pace_set(&p, 0, 100, 50.0);
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 150, 0), 0, "at the join round");
    cr_expect_eq(ds_pace_wait_ns(&p, 151, 150, 0), 0, "past it");
    cr_expect_eq(ds_pace_wait_ns(&p, 149, 150, 0), 980 * MS);
    cr_expect_eq(ds_pace_wait_ns(&p, 100, 150, 0), 0, "the snapshot's own round");
    ds_pace_set(&p, 0, 100, 0.0);
    cr_expect_eq(ds_pace_wait_ns(&p, 150, 1000, 0), 0, "a cluster with no measured pace");
}

TestSuite(shadow);

/* The joiner trains only the last 4 + 5% of the pace rounds itself
 * (commit cb1b72e). */
Test(shadow, trains_only_the_last_few_rounds)
{
    cr_expect_eq(ds_shadow_margin(0), 4);
    cr_expect_eq(ds_shadow_margin(100), 9);
    cr_expect_eq(ds_shadow_margin(250), 16);
    ds_pace p = {0};
    ds_pace_set(&p, 0, 1000, 100.0);
    double w = -1;
    cr_expect_eq(ds_shadow_next(&p, 1190, 1200, 0, &w), 1, "10 rounds before: still shadowing");
    cr_expect_eq(ds_shadow_next(&p, 1191, 1200, 0, &w), 0, "9 rounds before: train");
}

/* Far from its join round it takes a fresh snapshot every half second
 * (commit 5adf3a2). */
Test(shadow, a_snapshot_every_half_second)
{
    ds_pace p = {0};
    ds_pace_set(&p, 0, 1000, 100.0);
    double w = -1;
    cr_assert_eq(ds_shadow_next(&p, 1000, 5000, 0, &w), 1);
    cr_expect_float_eq(w, DS_SHADOW_EVERY_S, 1e-12);
    /* No pace known (a cluster that had not measured one yet). */
    ds_pace_set(&p, 0, 1000, 0.0);
    cr_assert_eq(ds_shadow_next(&p, 1000, 1100, 0, &w), 1);
    cr_expect_float_eq(w, DS_SHADOW_EVERY_S, 1e-12);
}

/* The last snapshot must land before the cluster is `margin` rounds
 * before our join round: the wait shrinks so that wait + the 150 ms a
 * fetch may take always fits, and when no fetch fits any more the joiner
 * trains (commit 3f33fb9: a late snapshot stalled the cluster 10-28 s). */
Test(shadow, the_last_snapshot_lands_before_the_join_round)
{
    ds_pace p = {0};
    ds_pace_set(&p, 0, 1000, 100.0);
    const uint64_t join = 1200;
    /* The cluster is margin (9) rounds before round 1200 at 1.91 s. */
    const double due_s = (double)(join - ds_shadow_margin(100) - 1000) / 100.0;
    double w;
    int fetches = 0, stopped_at_ms = -1;
    for (int ms = 0; ms <= 2500; ms += 10) {
        const uint64_t now = (uint64_t)ms * MS;
        const uint64_t round = 1000 + (uint64_t)ms / 10; /* the snapshot's pace */
        if (!ds_shadow_next(&p, round, join, now, &w)) {
            stopped_at_ms = ms;
            break;
        }
        fetches++;
        cr_expect_leq(ms * 1e-3 + w + DS_SHADOW_FETCH_S, due_s + 1e-9,
                      "at %d ms: a fetch after %.3f s would land late", ms, w);
        cr_expect_leq(w, DS_SHADOW_EVERY_S);
        cr_expect_geq(w, 0.0);
    }
    /* 150 ms before 1.91 s, give or take a float's rounding at 1.76 s. */
    cr_expect(stopped_at_ms >= 1750 && stopped_at_ms <= 1770, "training from %d ms on",
              stopped_at_ms);
    cr_expect_gt(fetches, 0);
    /* The last fetches come closer together. */
    cr_assert_eq(ds_shadow_next(&p, 1150, join, 1500 * MS, &w), 1);
    cr_expect_float_eq(w, 0.26, 1e-9);
}

/* When two members admitted us with different join rounds, the smaller
 * wins; an unknown round (UINT64_MAX) never does (commit 3f33fb9). */
Test(shadow, the_smaller_join_round_wins)
{
    cr_expect_eq(ds_shadow_join_round(500, 480), 480);
    cr_expect_eq(ds_shadow_join_round(500, 520), 500);
    cr_expect_eq(ds_shadow_join_round(500, UINT64_MAX), 500);
}

/* Three failed fetches in a row: the cluster may be gone, go on alone; a
 * fetch that works starts the count over. */
Test(shadow, three_failed_fetches_in_a_row_stop_it)
{
    int failures = 0;
    cr_expect_eq(ds_shadow_fetched(&failures, 0), 0);
    cr_expect_eq(ds_shadow_fetched(&failures, 0), 0);
    cr_expect_eq(ds_shadow_fetched(&failures, 1), 0);
    cr_expect_eq(failures, 0);
    cr_expect_eq(ds_shadow_fetched(&failures, 0), 0);
    cr_expect_eq(ds_shadow_fetched(&failures, 0), 0);
    cr_expect_eq(ds_shadow_fetched(&failures, 0), 1);
}

TestSuite(leave);

static ds_member_info member(uint64_t id, enum ds_member_state st)
{
    ds_member_info m;
    memset(&m, 0, sizeof(m));
    m.id = id;
    m.state = st;
    return m;
}

/* A leaver lingers while another member is alive or suspected, and stops
 * once every other member has announced its leave (or died): nobody is
 * left to wait for it (commit fea1128: runs ended up to 10 s late). */
Test(leave, a_leaver_stops_lingering_once_every_other_member_left)
{
    ds_member_info all[3] = {member(1, DS_MEMBER_ALIVE), member(2, DS_MEMBER_ALIVE),
                             member(3, DS_MEMBER_LEFT)};
    cr_expect_eq(ds_leave_others_count_on_us(all, 3, 1), 1, "member 2 still trains");
    all[1].state = DS_MEMBER_SUSPECT;
    cr_expect_eq(ds_leave_others_count_on_us(all, 3, 1), 1, "a suspect may still be there");
    all[1].state = DS_MEMBER_LEFT;
    cr_expect_eq(ds_leave_others_count_on_us(all, 3, 1), 0, "everyone else announced its leave");
    all[1].state = DS_MEMBER_DEAD;
    cr_expect_eq(ds_leave_others_count_on_us(all, 3, 1), 0);
    cr_expect_eq(ds_leave_others_count_on_us(all, 1, 1), 0, "alone");
    all[0].state = DS_MEMBER_LEFT; /* our own record does not count */
    all[1].state = DS_MEMBER_ALIVE;
    cr_expect_eq(ds_leave_others_count_on_us(all, 3, 1), 1);
}

/* A finished node takes part in the rounds after its last one up to the
 * one before its leave round, where every view drops it. */
Test(leave, lingers_until_the_leave_round)
{
    ds_linger l;
    cr_assert_eq(ds_linger_start(&l, 1, 0, 200, 230, 1000), 1);
    int rounds = 0;
    uint64_t first = l.next_round, last = 0;
    for (; ds_linger_more(&l, 0, 1000); l.next_round++) {
        last = l.next_round;
        rounds++;
    }
    cr_expect_eq(first, 201);
    cr_expect_eq(last, 229);
    cr_expect_eq(rounds, 29);
    cr_expect_eq(ds_linger_start(&l, 1, 0, 229, 230, 0), 1);
    cr_expect_eq(ds_linger_more(&l, 0, 0), 0, "nothing left to linger for");
}

/* At most 10 s of lingering; a second signal ends it at once (a first
 * one during lingering does not). */
Test(leave, lingering_is_bounded)
{
    ds_linger l;
    cr_assert_eq(ds_linger_start(&l, 1, 0, 200, 100000, 1000), 1);
    cr_expect_eq(ds_linger_more(&l, 0, 1000 + DS_LINGER_MS - 1), 1);
    cr_expect_eq(ds_linger_more(&l, 0, 1000 + DS_LINGER_MS), 0, "10 s are up");
    cr_expect_eq(ds_linger_more(&l, 1, 1000), 1);
    cr_expect_eq(ds_linger_more(&l, 2, 1000), 0, "a second signal");
}

/* A node stopped by a signal does not linger: a launcher's grace period
 * is short (commit 9156221); without an announced leave there is nothing
 * to linger for. */
Test(leave, no_lingering_when_signalled_or_not_leaving)
{
    ds_linger l;
    cr_expect_eq(ds_linger_start(&l, 1, 15, 200, 230, 0), 0);
    cr_expect_eq(ds_linger_start(&l, 0, 0, 200, 230, 0), 0);
}

/* Then the leave spreads and the last frames leave: 3 s, 1 s when
 * signalled. */
Test(leave, drains_three_seconds_or_one_when_signalled)
{
    cr_expect_eq(ds_leave_drain_until(0, 5000), 8000);
    cr_expect_eq(ds_leave_drain_until(15, 5000), 6000);
}

/* Lingering keeps the pace training had: the mean interval of the last
 * DS_ROUND_CLOCK rounds, capped, and never faster (leave.h: a node that
 * finished first ran 31 rounds in 80 ms, ahead of every partner). */
Test(leave, lingers_at_the_pace_of_its_last_rounds)
{
    ds_round_clock c = {0};
    uint64_t lr = 0, lns = 0;
    cr_expect_eq(ds_round_clock_pace(&c, 1000000000u, &lr, &lns), 0, "no round yet");
    ds_round_clock_tick(&c, 40, 5000);
    cr_expect_eq(ds_round_clock_pace(&c, 1000000000u, &lr, &lns), 0, "one round: no pace");
    cr_expect_eq(lr, 40);
    cr_expect_eq(lns, 5000);
    /* 20 rounds 30 ms apart, then one after 100 ms: the ring holds the
     * last 8 (rounds 53..60), 6 x 30 + 100 ms over 7 rounds. */
    uint64_t t = 5000;
    for (uint64_t k = 41; k <= 59; k++)
        ds_round_clock_tick(&c, k, t += 30000000u);
    ds_round_clock_tick(&c, 60, t += 100000000u);
    cr_expect_eq(ds_round_clock_pace(&c, 1000000000u, &lr, &lns), (6 * 30000000u + 100000000u) / 7);
    cr_expect_eq(lr, 60);
    cr_expect_eq(lns, t);
    cr_expect_eq(ds_round_clock_pace(&c, 25000000u, &lr, &lns), 25000000u, "capped");

    ds_linger l;
    cr_assert_eq(ds_linger_start(&l, 1, 0, 60, 100, 0), 1);
    cr_expect_eq(ds_linger_wait_ns(&l, t), 0, "no pace set: at once");
    ds_linger_pace(&l, 60, t, 40000000u);
    cr_expect_eq(ds_linger_wait_ns(&l, t), 40000000u, "round 61 one interval after 60");
    cr_expect_eq(ds_linger_wait_ns(&l, t + 15000000u), 25000000u);
    l.next_round = 65;
    cr_expect_eq(ds_linger_wait_ns(&l, t + 15000000u), 5 * 40000000u - 15000000u);
    cr_expect_eq(ds_linger_wait_ns(&l, t + 500000000u), 0, "behind the pace: no wait");
    ds_linger_pace(&l, 60, t, 0);
    cr_expect_eq(ds_linger_wait_ns(&l, t), 0, "pace 0: at once");
}
