/*
 * tests/test_group.c: the hierarchy's parts on the fake network
 * (node/gossip/fake.h) and as pure functions: the group reduction
 * (node/gossip/group.h) leaves every member with the same bytes, the mean
 * of the gradient part and the sum of the rest, and a dead member costs
 * the others at most the deadline; groups form the same on every node
 * (node/runtime/hier.h); a member handles only its share of the gossip
 * segments (ds_gossip_set_share).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "node/gossip/fake.h"
#include "node/gossip/gossip.h"
#include "node/gossip/group.h"
#include "node/runtime/hier.h"
#include "testutil.h"

#define N 1003      /* odd: chunks of unequal length */
#define N_MEAN 500  /* the "gradient" part */
#define MAXG 5

struct member {
    ds_fakenet *net;
    uint32_t G, me;
    float vec[N];
    uint64_t deadline;
    ds_greduce_result res;
    int ret;
    int rounds;
    const ds_gsparse *sp; /* NULL: no list */
    enum ds_greduce_algo algo;
    uint64_t t_end;       /* the fake clock when the member was done */
    int direct_once;      /* ds_greduce_direct_once before every run */
    int direct_first;     /* ... before the first this many runs only */
    const uint8_t *skip;  /* NULL: everyone waited for */
    int twice;            /* every frame this member sends is delivered twice */
    ds_gossip_io dup;     /* (its io then: the fake's, each send made twice) */
    int whole;            /* ds_greduce_mean_all instead of ds_greduce_run */
};

static int send_twice(void *ctx, const ds_gmsg *m, uint64_t deadline_ns)
{
    const ds_gossip_io *io = ctx;
    const int e = io->send(io->ctx, m, deadline_ns);
    return e < 0 ? e : io->send(io->ctx, m, deadline_ns);
}

static uint64_t now_of(void *ctx)
{
    const ds_gossip_io *io = ctx;
    return io->now_ns(io->ctx);
}

static int recv_of(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    const ds_gossip_io *io = ctx;
    return io->recv(io->ctx, m, deadline_ns);
}

static void *member_main(void *p)
{
    struct member *m = p;
    ds_greduce *r;
    const ds_gossip_io *io = ds_fakenet_io(m->net, m->me);
    if (m->twice) {
        m->dup = (ds_gossip_io){.ctx = (void *)io, .send = send_twice, .recv = recv_of,
                                .now_ns = now_of};
        io = &m->dup;
    }
    m->ret = ds_greduce_create(&r, N);
    if (m->ret == 0)
        ds_greduce_set_algo(r, m->algo);
    for (int k = 0; k < m->rounds && m->ret == 0; k++) {
        if (m->direct_once || k < m->direct_first)
            ds_greduce_direct_once(r);
        m->ret = m->whole ? ds_greduce_mean_all(r, io, m->vec, N, m->G, m->me, m->skip,
                                                (uint64_t)k, m->deadline, &m->res)
                          : ds_greduce_run(r, io, m->vec, N, N_MEAN, m->G, m->me, m->skip,
                                           (uint64_t)k, m->deadline, m->sp, &m->res);
    }
    m->t_end = ds_fakenet_now_ns(m->net);
    ds_greduce_destroy(&r);
    return NULL;
}

/* G members reduce seeded vectors `rounds` times (the result of one
 * reduction feeding the next). */
static void run_group(struct member *m, uint32_t G, int rounds, int dead)
{
    ds_fakenet *net = ds_fakenet_create(G);
    if (dead >= 0)
        ds_fakenet_set_dead(net, (uint32_t)dead, 1);
    pthread_t th[MAXG];
    for (uint32_t i = 0; i < G; i++) {
        m[i].net = net;
        m[i].G = G;
        m[i].me = i;
        m[i].rounds = rounds;
        m[i].deadline = 2000000000ull; /* 2 s on the fake clock */
        ds_t_fill(m[i].vec, N, 100 + i, -1.0f, 1.0f);
    }
    for (uint32_t i = 0; i < G; i++)
        if ((int)i != dead)
            pthread_create(&th[i], NULL, member_main, &m[i]);
    for (uint32_t i = 0; i < G; i++)
        if ((int)i != dead)
            pthread_join(th[i], NULL);
    ds_fakenet_destroy(net);
}

Test(group, members_end_with_the_same_bytes_mean_and_sum)
{
    for (uint32_t G = 2; G <= MAXG; G++) {
        static struct member m[MAXG];
        run_group(m, G, 1, -1);
        /* The reference, in double. */
        float in[MAXG][N];
        for (uint32_t i = 0; i < G; i++)
            ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
        for (size_t j = 0; j < N; j++) {
            double sum = 0;
            for (uint32_t i = 0; i < G; i++)
                sum += in[i][j];
            const double want = j < N_MEAN ? sum / G : sum;
            cr_assert(fabs(m[0].vec[j] - want) < 1e-5, "G=%u element %zu: %g, want %g", G, j,
                      (double)m[0].vec[j], want);
        }
        for (uint32_t i = 0; i < G; i++) {
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "G=%u member %u incomplete", G, i);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                         "G=%u: member %u differs from member 0", G, i);
        }
    }
}

/* Each member's sparse list, gathered and summed in member order: every
 * member ends with the same sum, equal to the sum of the lists; an empty
 * list counts. */
Test(group, sparse_lists_are_summed_alike)
{
    enum { G = 4, K = 40, NO = 300 };
    static struct member m[G];
    static uint32_t idx[G][K];
    static float val[G][K], out[G][NO];
    static ds_gsparse sp[G];
    double want[NO] = {0};
    uint64_t seed = 42;
    for (uint32_t i = 0; i < G; i++) {
        const uint32_t k = i == 2 ? 0 : K; /* member 2: nothing to send */
        for (uint32_t j = 0; j < k; j++) {
            idx[i][j] = (uint32_t)(ds_t_next(&seed) % NO);
            val[i][j] = (float)(ds_t_next(&seed) % 1000) / 100.0f - 5.0f;
            want[idx[i][j]] += val[i][j];
        }
        sp[i] = (ds_gsparse){.idx = idx[i], .val = val[i], .count = k, .out = out[i], .n_out = NO};
        m[i].sp = &sp[i];
    }
    run_group(m, G, 1, -1);
    for (uint32_t i = 0; i < G; i++) {
        cr_assert(m[i].res.complete, "member %u incomplete", i);
        cr_assert_eq(memcmp(out[i], out[0], sizeof(out[0])), 0, "member %u's sum differs", i);
    }
    for (uint32_t j = 0; j < NO; j++)
        cr_assert(fabs(out[0][j] - want[j]) < 1e-4, "index %u: %g, want %g", j, (double)out[0][j],
                  want[j]);
    for (uint32_t i = 0; i < G; i++)
        m[i].sp = NULL;
}

Test(group, many_reductions_in_a_row_stay_identical)
{
    static struct member m[4];
    run_group(m, 4, 20, -1);
    for (uint32_t i = 0; i < 4; i++) {
        cr_assert(m[i].res.complete);
        cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0, "member %u", i);
    }
}

/* A dead member: the others end at the deadline, not later; its chunk is
 * missing, every other chunk is the same on every survivor and averages
 * the survivors only. */
Test(group, dead_member_costs_the_deadline_and_only_its_chunk)
{
    static struct member m[4];
    const uint32_t dead = 2;
    run_group(m, 4, 1, (int)dead);
    float in[4][N];
    for (uint32_t i = 0; i < 4; i++)
        ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
    size_t doff, dlen;
    ds_greduce_chunk(N, 4, dead, &doff, &dlen);
    for (uint32_t i = 0; i < 4; i++) {
        if (i == dead)
            continue;
        cr_assert_eq(m[i].ret, 0);
        cr_assert(!m[i].res.complete, "member %u: complete without member %u", i, dead);
        cr_assert_eq(m[i].res.chunks_missing, 1);
        cr_assert_eq(m[i].res.contributions, 3);
        for (size_t j = 0; j < N; j++) {
            if (j >= doff && j < doff + dlen) {
                cr_assert_eq(m[i].vec[j], in[i][j], "the dead member's chunk keeps our own");
                continue;
            }
            cr_assert_eq(m[i].vec[j], m[0].vec[j], "member %u element %zu", i, j);
            const double sum = (double)in[0][j] + in[1][j] + in[3][j];
            const double want = j < N_MEAN ? sum / 3 : sum;
            cr_assert(fabs(m[i].vec[j] - want) < 1e-5, "element %zu", j);
        }
    }
}

/* The mean of the whole vectors over `who` (a bit per member), as
 * ds_greduce_mean_all computes it: summed in member order, then scaled. */
static void whole_mean(uint32_t G, unsigned who, float *out)
{
    static float in[MAXG][N];
    uint32_t k = 0;
    for (uint32_t i = 0; i < G; i++)
        ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
    memset(out, 0, N * sizeof(float));
    for (uint32_t i = 0; i < G; i++)
        if (who >> i & 1) {
            for (size_t j = 0; j < N; j++)
                out[j] += in[i][j];
            k++;
        }
    const float inv = 1.0f / (float)k;
    for (size_t j = 0; j < N; j++)
        out[j] *= inv;
}

/* The final sync's reduction: every member ends with the mean of all the
 * vectors, the same bytes on every member. */
Test(group, mean_all_members_end_with_the_same_bytes)
{
    static float want[N];
    for (uint32_t G = 2; G <= MAXG; G++) {
        static struct member m[MAXG];
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < G; i++)
            m[i].whole = 1;
        run_group(m, G, 1, -1);
        whole_mean(G, (1u << G) - 1, want);
        for (uint32_t i = 0; i < G; i++) {
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "G=%u member %u incomplete", G, i);
            cr_assert_eq(m[i].res.contributions, G);
            cr_assert_eq(memcmp(m[i].vec, want, sizeof(want)), 0,
                         "G=%u: member %u is not the mean in member order", G, i);
        }
    }
}

/* A member that died while still in the view: the survivors wait out the
 * deadline for it (once) and end with the same bytes, the mean of the
 * survivors, where the direct algorithm leaves its chunk as each one's
 * own (dead_member_costs_the_deadline_and_only_its_chunk; CI 56 ended so,
 * 3.9e-7 apart). Held dead (skipped hard) by every survivor, nobody waits. */
Test(group, mean_all_a_dead_member_costs_nothing_of_the_result)
{
    static struct member m[4];
    static float want[N];
    static const uint8_t hard[4] = {0, 0, DS_GREDUCE_SKIP_ALL, 0};
    const uint32_t dead = 2;
    whole_mean(4, 0xbu, want);
    for (int held = 0; held < 2; held++) {
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < 4; i++) {
            m[i].whole = 1;
            m[i].skip = held ? hard : NULL;
        }
        run_group(m, 4, 1, (int)dead);
        for (uint32_t i = 0; i < 4; i++) {
            if (i == dead)
                continue;
            cr_assert_eq(m[i].ret, 0);
            cr_assert(!m[i].res.complete, "member %u: complete without member %u", i, dead);
            cr_assert_eq(m[i].res.contributions, 3);
            cr_assert_eq(m[i].res.chunks_missing, 1);
            cr_assert_eq(memcmp(m[i].vec, want, sizeof(want)), 0,
                         "held=%d: member %u is not the survivors' mean", held, i);
            if (held)
                cr_expect_lt(m[i].t_end, m[i].deadline, "member %u waited for the dead", i);
            else
                cr_expect_geq(m[i].t_end, m[i].deadline, "member %u did not wait", i);
        }
    }
}

/* A member skipped softly (not waited for by a step's reduction) is
 * waited for here: one only slow sends to every member alike, and a
 * member one waits for and another does not would be in one mean only.
 * One skipped hard is left out even when its vector comes. */
Test(group, mean_all_waits_for_a_soft_skip_and_leaves_out_a_hard_one)
{
    static struct member m[3];
    static float want[N];
    static const uint8_t soft[3] = {0, DS_GREDUCE_SKIP_NOWAIT, DS_GREDUCE_SKIP_NOWAIT};
    static const uint8_t hard[3] = {0, DS_GREDUCE_SKIP_ALL, 0};
    memset(m, 0, sizeof(m));
    for (uint32_t i = 0; i < 3; i++)
        m[i].whole = 1;
    m[0].skip = soft;
    run_group(m, 3, 1, -1);
    whole_mean(3, 0x7u, want);
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert(m[i].res.complete, "member %u", i);
        cr_assert_eq(memcmp(m[i].vec, want, sizeof(want)), 0, "member %u", i);
    }
    memset(m, 0, sizeof(m));
    for (uint32_t i = 0; i < 3; i++)
        m[i].whole = 1;
    m[0].skip = hard;
    run_group(m, 3, 1, -1);
    whole_mean(3, 0x5u, want);
    cr_assert_eq(m[0].res.contributions, 2);
    cr_assert_eq(memcmp(m[0].vec, want, sizeof(want)), 0, "member 0 used member 1's vector");
    /* Member 1 heard nothing from member 0 (skipped hard: not sent to). */
    cr_assert_eq(m[1].res.contributions, 2);
    whole_mean(3, 0x6u, want);
    cr_assert_eq(memcmp(m[1].vec, want, sizeof(want)), 0, "member 1");
}

/* Bad arguments, and a group too large for every member's vector. */
Test(group, mean_all_refuses_what_does_not_fit)
{
    ds_fakenet *net = ds_fakenet_create(2);
    ds_greduce *r;
    cr_assert_eq(ds_greduce_create(&r, N), 0);
    static float v[N];
    ds_greduce_result res;
    const ds_gossip_io *io = ds_fakenet_io(net, 0);
    cr_expect_eq(ds_greduce_mean_all(r, io, v, N + 1, 2, 0, NULL, 0, 1, &res), -EINVAL,
                 "n over max_n");
    cr_expect_eq(ds_greduce_mean_all(r, io, v, N, 2, 2, NULL, 0, 1, &res), -EINVAL, "me >= G");
    cr_expect_eq(ds_greduce_mean_all(r, io, v, 0, 2, 0, NULL, 0, 1, &res), -EINVAL, "n 0");
    const uint32_t big = (uint32_t)(DS_GREDUCE_WHOLE_MAX / N + 1);
    cr_expect_eq(ds_greduce_mean_all(r, io, v, N, big, 0, NULL, 0, 1, &res), -EINVAL,
                 "G * n over DS_GREDUCE_WHOLE_MAX");
    cr_expect_eq(ds_greduce_mean_all(r, io, v, N, 1, 0, NULL, 0, 1, &res), 0);
    cr_expect(res.complete, "a group of one");
    ds_greduce_destroy(&r);
    ds_fakenet_destroy(net);
}

/* A dead member that every survivor holds dead (skipped hard: a
 * membership verdict) while it is still in the view: its chunk is an
 * orphan, which the survivors sum themselves from each other's parts, so
 * nothing is missing and nobody waits; every survivor holds the same
 * bytes, the survivors' mean and sum. Twenty in a row stay alike. */
Test(group, a_member_held_dead_leaves_no_orphan_chunk)
{
    static struct member m[4];
    static const uint8_t hard[4] = {0, 0, DS_GREDUCE_SKIP_ALL, 0};
    const uint32_t dead = 2;
    for (int rounds = 1; rounds <= 20; rounds += 19) {
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < 4; i++)
            m[i].skip = hard;
        run_group(m, 4, rounds, (int)dead);
        float in[4][N];
        for (uint32_t i = 0; i < 4; i++)
            ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
        for (uint32_t i = 0; i < 4; i++) {
            if (i == dead)
                continue;
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "member %u: %u chunk(s) missing", i,
                      m[i].res.chunks_missing);
            cr_assert_eq(m[i].res.orphans, 1, "member %u summed the dead owner's chunk", i);
            cr_expect_lt(m[i].t_end, m[i].deadline, "member %u waited", i);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                         "%d reduction(s): member %u differs from member 0", rounds, i);
            if (rounds > 1)
                continue;
            for (size_t j = 0; j < N; j++) {
                const double sum = (double)in[0][j] + in[1][j] + in[3][j];
                const double want = j < N_MEAN ? sum / 3 : sum;
                cr_assert(fabs(m[i].vec[j] - want) < 1e-5, "element %zu: %g, want %g", j,
                          (double)m[i].vec[j], want);
            }
        }
    }
}

/* The same with sparse lists, and on the ring and the butterfly (which
 * leave a member held dead out of their schedule): complete, the same
 * bytes, the survivors' lists summed. */
Test(group, a_member_held_dead_leaves_the_reduction_complete_in_every_algorithm)
{
    enum { G = 4, K = 30, NO = 200 };
    static struct member m[G];
    static uint32_t idx[G][K];
    static float val[G][K], out[G][NO];
    static ds_gsparse sp[G];
    static const uint8_t hard[G] = {0, 0, DS_GREDUCE_SKIP_ALL, 0};
    static const enum ds_greduce_algo algos[] = {DS_GREDUCE_DIRECT, DS_GREDUCE_RING,
                                                 DS_GREDUCE_BUTTERFLY};
    const uint32_t dead = 2;
    for (size_t a = 0; a < 3; a++) {
        double want[NO] = {0};
        uint64_t seed = 7;
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < G; i++) {
            for (uint32_t j = 0; j < K; j++) {
                idx[i][j] = (uint32_t)(ds_t_next(&seed) % NO);
                val[i][j] = (float)(ds_t_next(&seed) % 1000) / 100.0f - 5.0f;
                if (i != dead)
                    want[idx[i][j]] += val[i][j];
            }
            sp[i] = (ds_gsparse){.idx = idx[i], .val = val[i], .count = K, .out = out[i],
                                 .n_out = NO};
            m[i].sp = &sp[i];
            m[i].skip = hard;
            m[i].algo = algos[a];
        }
        run_group(m, G, 1, (int)dead);
        for (uint32_t i = 0; i < G; i++) {
            if (i == dead)
                continue;
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "%s: member %u: %u chunk(s), %u list(s) missing",
                      ds_greduce_algo_name(algos[a]), i, m[i].res.chunks_missing,
                      m[i].res.lists_missing);
            cr_expect_lt(m[i].t_end, m[i].deadline, "member %u waited", i);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0, "%s: member %u",
                         ds_greduce_algo_name(algos[a]), i);
            cr_assert_eq(memcmp(out[i], out[0], sizeof(out[0])), 0, "member %u's lists", i);
        }
        for (uint32_t j = 0; j < NO; j++)
            cr_assert(fabs(out[0][j] - want[j]) < 1e-4, "index %u", j);
    }
    for (uint32_t i = 0; i < G; i++)
        m[i].sp = NULL;
}

/* Members that differ on who is dead: member 0 holds member 2 dead, 1 and
 * 3 still wait for it. The chunks of the living owners are reduced alike
 * everywhere; member 2's chunk is the only one that differs, and each
 * survivor says its reduction is incomplete (member 0 did not get 1's and
 * 3's parts, which they sent to member 2). */
Test(group, members_that_differ_on_a_dead_owner_differ_in_its_chunk_only)
{
    static struct member m[4];
    static const uint8_t hard[4] = {0, 0, DS_GREDUCE_SKIP_ALL, 0};
    const uint32_t dead = 2;
    memset(m, 0, sizeof(m));
    m[0].skip = hard;
    run_group(m, 4, 1, (int)dead);
    size_t doff, dlen;
    ds_greduce_chunk(N, 4, dead, &doff, &dlen);
    for (uint32_t i = 1; i < 4; i++) {
        if (i == dead)
            continue;
        cr_assert_eq(m[i].ret, 0);
        cr_assert(!m[i].res.complete, "member %u", i);
        for (size_t j = 0; j < N; j++)
            if (j < doff || j >= doff + dlen)
                cr_assert_eq(m[i].vec[j], m[0].vec[j], "member %u element %zu", i, j);
    }
    cr_assert(!m[0].res.complete, "member 0 had no part of the orphan from 1 and 3");
    cr_assert_eq(m[0].res.chunks_missing, 1);
    cr_assert_eq(m[0].res.orphans, 1);
    cr_assert_eq(m[1].res.orphans, 0, "member 1 does not hold member 2 dead");
}

/* Member 0 alone skips member 2 hard (its transport cannot reach it),
 * the others hold nobody dead. Member 1's contribution says it holds no
 * orphan, so member 0 does not wait for a part of chunk 2 that member 1
 * sends to its owner instead: it is done well before half the deadline
 * (with the wait, at half), its chunk 2 incomplete and kept as its own
 * (member 2's result for it is not taken), the rest the group's. */
Test(group, an_orphan_part_nobody_sends_is_not_waited_for)
{
    static struct member m[3];
    static const uint8_t hard[3] = {0, 0, DS_GREDUCE_SKIP_ALL};
    memset(m, 0, sizeof(m));
    m[0].skip = hard;
    run_group(m, 3, 1, -1);
    cr_assert_eq(m[0].ret, 0);
    cr_expect_lt(m[0].t_end, m[0].deadline / 2, "member 0 waited %llu ns",
                 (unsigned long long)m[0].t_end);
    cr_assert(!m[0].res.complete);
    cr_assert_eq(m[0].res.chunks_missing, 1);
    float own[N];
    ds_t_fill(own, N, 100, -1.0f, 1.0f);
    size_t off, len;
    ds_greduce_chunk(N, 3, 2, &off, &len);
    cr_assert_eq(memcmp(m[0].vec + off, own + off, len * sizeof(float)), 0,
                 "member 0's chunk 2 is its own");
    ds_greduce_chunk(N, 3, 1, &off, &len);
    cr_assert_eq(memcmp(m[0].vec + off, m[1].vec + off, len * sizeof(float)), 0,
                 "chunk 1, member 1's result");
}

Test(group, skipped_member_is_not_waited_for)
{
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_dead(net, 1, 1);
    ds_greduce *r;
    cr_assert_eq(ds_greduce_create(&r, N), 0);
    float v[N];
    ds_t_fill(v, N, 7, -1, 1);
    const uint8_t skip[2] = {0, 1};
    ds_greduce_result res;
    cr_assert_eq(ds_greduce_run(r, ds_fakenet_io(net, 0), v, N, N_MEAN, 2, 0, skip, 0,
                                5000000000ull, NULL, &res), 0);
    cr_expect_eq(ds_fakenet_now_ns(net), 0, "nobody waited: the fake clock did not move");
    cr_expect(!res.complete);
    cr_expect_eq(ds_greduce_run(r, ds_fakenet_io(net, 0), v, N, N + 1, 2, 0, skip, 1,
                                5000000000ull, NULL, &res), -EINVAL, "n_mean over n");
    ds_greduce_destroy(&r);
    ds_fakenet_destroy(net);
}

/* A member not waited for (a soft skip, group.h) is still sent our frames,
 * so its own reduction, which waits for us, completes (and its skip
 * window on us would end); one skipped hard is sent nothing and waits out
 * its deadline. */
Test(group, a_member_not_waited_for_still_hears_from_us)
{
    static struct member m[2];
    static const uint8_t soft[2] = {DS_GREDUCE_SKIP_WAIT, DS_GREDUCE_SKIP_NOWAIT};
    static const uint8_t hard[2] = {DS_GREDUCE_SKIP_WAIT, DS_GREDUCE_SKIP_ALL};
    memset(m, 0, sizeof(m));
    m[0].skip = soft;
    run_group(m, 2, 1, -1);
    cr_assert_eq(m[0].ret, 0);
    cr_assert_eq(m[1].ret, 0);
    cr_expect(m[1].res.complete, "member 1 waited for member 0 and did not hear from it");
    cr_expect_eq(m[1].res.contributions, 2);
    cr_expect(!m[0].res.complete, "member 0 did not wait for member 1's chunk");
    memset(m, 0, sizeof(m));
    m[0].skip = hard;
    run_group(m, 2, 1, -1);
    cr_assert_eq(m[1].ret, 0);
    cr_expect(!m[1].res.complete, "member 1 heard from member 0, which skipped it hard");
    cr_expect_eq(m[1].res.contributions, 1);
}

/* Members a step ahead: the laggard sees their tag and meets them. */
Test(group, reports_the_largest_tag_seen)
{
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_instant(net, 1);
    ds_greduce *a, *b;
    cr_assert_eq(ds_greduce_create(&a, N), 0);
    cr_assert_eq(ds_greduce_create(&b, N), 0);
    float va[N], vb[N];
    ds_t_fill(va, N, 1, -1, 1);
    ds_t_fill(vb, N, 2, -1, 1);
    ds_greduce_result ra, rb;
    /* b runs reduction 7 alone (a is not there yet): it times out. */
    cr_assert_eq(ds_greduce_run(b, ds_fakenet_io(net, 1), vb, N, 0, 2, 1, NULL, 7, 1000, NULL, &rb), 0);
    cr_expect(!rb.complete);
    /* a, at reduction 3, finds b's messages of 7 and says so. */
    cr_assert_eq(ds_greduce_run(a, ds_fakenet_io(net, 0), va, N, 0, 2, 0, NULL, 3,
                                ds_fakenet_now_ns(net) + 1000, NULL, &ra), 0);
    cr_expect_eq(ra.max_tag, 7);
    ds_greduce_destroy(&a);
    ds_greduce_destroy(&b);
    ds_fakenet_destroy(net);
}

static ds_member_info mi(uint64_t id, const char *group)
{
    ds_member_info m;
    memset(&m, 0, sizeof(m));
    m.id = id;
    snprintf(m.name, sizeof(m.name), "n%llu", (unsigned long long)id);
    snprintf(m.group, sizeof(m.group), "%s", group);
    return m;
}

Test(group, groups_form_alike_on_every_node)
{
    /* The view in membership's order (by name): groups b, a, and two
     * nodes of no group. */
    const ds_member_info v[] = {mi(50, "b"), mi(10, "a"), mi(40, ""), mi(30, "b"),
                                mi(20, "a"), mi(60, "b"), mi(5, "")};
    const uint32_t G = sizeof(v) / sizeof(v[0]);
    uint32_t order[8], gidx[8];
    ds_hier h;
    /* Sorted by (group, id): "" 5, "" 40, a 10, a 20, b 30, b 50, b 60. */
    const uint64_t want_ids[] = {5, 40, 10, 20, 30, 50, 60};
    const uint32_t want_g[] = {0, 1, 2, 2, 3, 3, 3};
    for (uint32_t self = 0; self < G; self++) {
        cr_assert_eq(ds_hier_form(v, G, v[self].id, order, gidx, &h), 0);
        cr_assert_eq(h.n_groups, 4);
        cr_assert(h.any);
        for (uint32_t k = 0; k < G; k++) {
            cr_assert_eq(v[order[k]].id, want_ids[k], "entry %u", k);
            cr_assert_eq(gidx[k], want_g[k], "entry %u", k);
        }
        cr_assert_eq(v[order[h.first + h.member]].id, v[self].id);
    }
    cr_assert_eq(ds_hier_form(v, G, 60, order, gidx, &h), 0);
    cr_expect(h.group == 3 && h.member == 2 && h.size == 3 && h.first == 4);
    cr_assert_eq(ds_hier_form(v, G, 40, order, gidx, &h), 0);
    cr_expect(h.group == 1 && h.member == 0 && h.size == 1, "no group: a group of one");
    cr_expect_eq(ds_hier_form(v, G, 99, order, gidx, &h), -EINVAL);
    /* Nobody in a group: no hierarchy. */
    const ds_member_info flat[] = {mi(3, ""), mi(1, ""), mi(2, "")};
    cr_assert_eq(ds_hier_form(flat, 3, 1, order, gidx, &h), 0);
    cr_expect(!h.any && h.n_groups == 3 && h.size == 1);
}

/* Member m of a group of size 3 initiates only in segments s with
 * s mod 3 == m, and forgets its drift in the others; between two groups,
 * only in those of them its group initiates (ds_topo_pair_initiator). */
Test(group, a_member_handles_its_share_of_segments)
{
    const ds_layer layer = {.name = "fc1", .off = 0, .len = 64, .in = 63, .out = 1};
    ds_gossip_cfg cfg = {.topology = DS_TOPO_CROSSOVER, .mix = DS_MIX_PAIRWISE, .weight = 0.5f,
                         .segments = 8, .method = DS_SPARSIFY_TOPK, .density = 0.25,
                         .error_feedback = 1, .seed = 1, .timeout_ms = 100};
    float theta[64] = {0}, moved[64];
    for (int i = 0; i < 64; i++)
        moved[i] = (float)(i + 1);
    for (uint32_t m = 0; m < 3; m++) {
        ds_gossip *g;
        cr_assert_eq(ds_gossip_create(&g, &cfg, &layer, 1, 64, theta), 0);
        cr_assert_eq(ds_gossip_set_view(g, 2, 0, 1), 0);
        cr_assert_eq(ds_gossip_set_share(g, m, 3), 0);
        cr_assert_eq(ds_gossip_begin(g, moved, 1), 0);
        for (int s = 0; s < ds_gossip_n_segments(g); s++) {
            const ds_gseg *sg = ds_gossip_segment(g, s);
            const int mine = (uint32_t)s % 3 == m;
            const ds_topo_key key = {cfg.seed, 1, 1, (uint32_t)s};
            cr_expect_eq(ds_gossip_target(g, s) != 0, mine && ds_topo_pair_initiator(&key) == 0,
                         "member %u segment %d", m, s);
            float drift = 0;
            for (size_t i = 0; i < sg->len; i++)
                drift += fabsf(ds_gossip_acc(g)[sg->off + i]);
            if (!mine)
                cr_expect_eq(drift, 0, "member %u segment %d: drift kept", m, s);
        }
        cr_expect_eq(ds_gossip_set_share(g, 3, 3), -EINVAL);
        ds_gossip_destroy(&g);
    }
}

/* ---- group.allreduce = ring | butterfly ------------------------------------ */

static void algo_same_bytes(enum ds_greduce_algo algo)
{
    for (uint32_t G = 2; G <= MAXG; G++) {
        static struct member m[MAXG];
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < G; i++)
            m[i].algo = algo;
        run_group(m, G, 1, -1);
        float in[MAXG][N];
        for (uint32_t i = 0; i < G; i++)
            ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
        for (size_t j = 0; j < N; j++) {
            double sum = 0;
            for (uint32_t i = 0; i < G; i++)
                sum += in[i][j];
            const double want = j < N_MEAN ? sum / G : sum;
            cr_assert(fabs(m[0].vec[j] - want) < 1e-5, "%s G=%u element %zu: %g, want %g",
                      ds_greduce_algo_name(algo), G, j, (double)m[0].vec[j], want);
        }
        for (uint32_t i = 0; i < G; i++) {
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "%s G=%u member %u incomplete",
                      ds_greduce_algo_name(algo), G, i);
            cr_assert_eq(m[i].res.contributions, G);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                         "%s G=%u: member %u differs from member 0", ds_greduce_algo_name(algo),
                         G, i);
        }
        /* Twenty in a row (each result the next input): still one vector. */
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < G; i++)
            m[i].algo = algo;
        run_group(m, G, 20, -1);
        for (uint32_t i = 0; i < G; i++) {
            cr_assert(m[i].res.complete);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0, "%s G=%u member %u",
                         ds_greduce_algo_name(algo), G, i);
        }
    }
}

/* The ring and the butterfly give every member the same bytes, the mean of
 * the first part and the sum of the rest, for 2 to 5 members (3 and 5: the
 * butterfly's extra members), once and twenty times in a row. */
Test(group, ring_and_butterfly_members_end_with_the_same_bytes)
{
    algo_same_bytes(DS_GREDUCE_RING);
    algo_same_bytes(DS_GREDUCE_BUTTERFLY);
}

/* Sparse lists ride beside a ring or a butterfly as beside the direct
 * algorithm. */
Test(group, ring_and_butterfly_carry_the_sparse_lists)
{
    enum { G = 3, K = 25, NO = 200 };
    for (int a = 1; a <= 2; a++) {
        static struct member m[G];
        static uint32_t idx[G][K];
        static float val[G][K], out[G][NO];
        static ds_gsparse sp[G];
        double want[NO] = {0};
        uint64_t seed = 43;
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < G; i++) {
            for (uint32_t j = 0; j < K; j++) {
                idx[i][j] = (uint32_t)(ds_t_next(&seed) % NO);
                val[i][j] = (float)(ds_t_next(&seed) % 1000) / 100.0f - 5.0f;
                want[idx[i][j]] += val[i][j];
            }
            sp[i] = (ds_gsparse){.idx = idx[i], .val = val[i], .count = K, .out = out[i],
                                 .n_out = NO};
            m[i].sp = &sp[i];
            m[i].algo = (enum ds_greduce_algo)a;
        }
        run_group(m, G, 1, -1);
        for (uint32_t i = 0; i < G; i++) {
            cr_assert(m[i].res.complete, "algo %d member %u incomplete", a, i);
            cr_assert_eq(memcmp(out[i], out[0], sizeof(out[0])), 0, "member %u's sum differs", i);
        }
        for (uint32_t j = 0; j < NO; j++)
            cr_assert(fabs(out[0][j] - want[j]) < 1e-4, "index %u", j);
    }
}

/* A member that runs direct (as one does for a while after a failed
 * reduction) among members on the ring or the butterfly: they meet its
 * contribution, fall back to direct within the same reduction, and every
 * reduction completes with the same bytes everywhere, once and twenty
 * times in a row (the others start each reduction on their own algorithm
 * and follow it again). */
Test(group, ring_and_butterfly_follow_a_member_that_runs_direct)
{
    for (int a = 1; a <= 2; a++) {
        for (int rounds = 1; rounds <= 20; rounds += 19) {
            static struct member m[4];
            memset(m, 0, sizeof(m));
            for (uint32_t i = 0; i < 4; i++)
                m[i].algo = i == 2 ? DS_GREDUCE_DIRECT : (enum ds_greduce_algo)a;
            run_group(m, 4, rounds, -1);
            for (uint32_t i = 0; i < 4; i++) {
                cr_assert_eq(m[i].ret, 0);
                cr_assert(m[i].res.complete, "algo %d, %d rounds: member %u incomplete", a,
                          rounds, i);
                cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                             "algo %d, %d rounds: member %u differs", a, rounds, i);
            }
            if (rounds == 1) {
                float in[4][N];
                for (uint32_t i = 0; i < 4; i++)
                    ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
                for (size_t j = 0; j < N; j++) {
                    const double sum = (double)in[0][j] + in[1][j] + in[2][j] + in[3][j];
                    const double want = j < N_MEAN ? sum / 4 : sum;
                    cr_assert(fabs(m[0].vec[j] - want) < 1e-5, "algo %d element %zu", a, j);
                }
            }
        }
    }
}

/* Every frame delivered twice (a transport that resends what it reported
 * lost, two endpoints to one member): each counts once, since what comes
 * is kept per sender and per step, never added on arrival. Direct, ring and
 * butterfly, 2 to 5 members, once against the reference and twenty
 * reductions in a row with one member running direct for the first
 * three (the others follow it, then return to their algorithm): every
 * member complete, the same bytes, the mean of the first part and the
 * sum of the rest, never a contribution counted twice. */
Test(group, a_frame_delivered_twice_counts_once)
{
    for (int a = 0; a <= 2; a++) {
        for (uint32_t G = 2; G <= MAXG; G++) {
            for (int rounds = 1; rounds <= 20; rounds += 19) {
                static struct member m[MAXG];
                memset(m, 0, sizeof(m));
                for (uint32_t i = 0; i < G; i++) {
                    m[i].algo = (enum ds_greduce_algo)a;
                    m[i].twice = 1;
                    m[i].direct_first = rounds > 1 && i == 1 ? 3 : 0;
                }
                run_group(m, G, rounds, -1);
                for (uint32_t i = 0; i < G; i++) {
                    cr_assert_eq(m[i].ret, 0);
                    cr_assert(m[i].res.complete, "algo %d G=%u rounds %d: member %u incomplete",
                              a, G, rounds, i);
                    cr_assert_eq(m[i].res.contributions, G, "algo %d G=%u member %u: %u", a, G,
                                 i, m[i].res.contributions);
                    cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                                 "algo %d G=%u rounds %d: member %u differs", a, G, rounds, i);
                }
                /* After the first reduction the members are alike: each
                 * next one keeps the mean and multiplies the sum by G. */
                float in[MAXG][N];
                for (uint32_t i = 0; i < G; i++)
                    ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
                const double grow = pow((double)G, rounds - 1);
                for (size_t j = 0; j < N; j++) {
                    double sum = 0;
                    for (uint32_t i = 0; i < G; i++)
                        sum += in[i][j];
                    const double want = j < N_MEAN ? sum / G : sum * grow;
                    cr_assert(fabs(m[0].vec[j] - want) <= 1e-5 * (j < N_MEAN ? 1 : grow),
                              "algo %d G=%u rounds %d element %zu: %g, want %g", a, G, rounds,
                              j, (double)m[0].vec[j], want);
                }
            }
        }
    }
}

/* One member runs direct for a few reductions (as after a failure of its
 * own), then its algorithm again: the others follow it in those
 * reductions only, and the group is back on the ring or the butterfly
 * the reduction after. Members that armed their own fallback whenever
 * they followed kept re-arming each other's, for good. */
Test(group, ring_and_butterfly_return_when_the_direct_member_does)
{
    for (int a = 1; a <= 2; a++) {
        static struct member m[4];
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < 4; i++) {
            m[i].algo = (enum ds_greduce_algo)a;
            m[i].direct_first = i == 2 ? 3 : 0;
        }
        run_group(m, 4, 6, -1);
        for (uint32_t i = 0; i < 4; i++) {
            cr_assert_eq(m[i].ret, 0);
            cr_assert(m[i].res.complete, "algo %d member %u incomplete", a, i);
            cr_assert_eq(memcmp(m[i].vec, m[0].vec, sizeof(m[0].vec)), 0,
                         "algo %d member %u differs", a, i);
            cr_expect_eq(m[i].res.ran, a, "algo %d member %u: the last reduction ran %s", a, i,
                         ds_greduce_algo_name((enum ds_greduce_algo)m[i].res.ran));
        }
    }
}

/* A dead member in a ring or a butterfly: nobody waits past the deadline
 * (2 s on the fake clock), every survivor says incomplete, and no partial
 * sum is left behind: each survivor keeps its own vector. */
Test(group, ring_and_butterfly_dead_member_ends_at_the_deadline)
{
    for (int a = 1; a <= 2; a++) {
        static struct member m[4];
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < 4; i++)
            m[i].algo = (enum ds_greduce_algo)a;
        const uint32_t dead = 2;
        run_group(m, 4, 1, (int)dead);
        for (uint32_t i = 0; i < 4; i++) {
            if (i == dead)
                continue;
            float in[N];
            ds_t_fill(in, N, 100 + i, -1.0f, 1.0f);
            cr_assert_eq(m[i].ret, 0);
            cr_assert(!m[i].res.complete, "algo %d member %u: complete without member %u", a,
                      i, dead);
            cr_assert_leq(m[i].t_end, 2000000000ull, "algo %d member %u waited past the deadline",
                         a, i);
            cr_assert_eq(memcmp(m[i].vec, in, sizeof(in)), 0,
                         "algo %d member %u: a partial sum was left", a, i);
        }
    }
}

/* The result names the algorithm that ran (group.allreduce = auto times
 * by it, the status counts by it): the one set when the members ran it,
 * direct when they were told to run direct. */
Test(group, result_names_the_algorithm_that_ran)
{
    for (int once = 0; once <= 1; once++)
        for (int a = DS_GREDUCE_DIRECT; a <= DS_GREDUCE_BUTTERFLY; a++) {
            static struct member m[MAXG];
            memset(m, 0, sizeof(m));
            for (uint32_t i = 0; i < 3; i++) {
                m[i].algo = (enum ds_greduce_algo)a;
                m[i].direct_once = once;
            }
            run_group(m, 3, 2, -1);
            const int want = once ? DS_GREDUCE_DIRECT : a;
            for (uint32_t i = 0; i < 3; i++) {
                cr_assert_eq(m[i].ret, 0);
                cr_assert(m[i].res.complete, "%s member %u", ds_greduce_algo_name(a), i);
                cr_expect_eq(m[i].res.ran, want, "%s%s member %u: ran %s",
                             ds_greduce_algo_name(a), once ? " (direct once)" : "", i,
                             ds_greduce_algo_name(m[i].res.ran));
            }
        }
}

/* The same dead member, with the survivors told it is in doubt
 * (ds_greduce_direct_once, as rounds.c does while a member missed and was
 * not heard from since): the reduction runs direct, so the survivors'
 * chunks are reduced over the three of them, the same bytes on each, and
 * only the dead member's chunk keeps each survivor's own values. */
Test(group, ring_and_butterfly_run_direct_while_a_member_is_in_doubt)
{
    for (int a = 1; a <= 2; a++) {
        static struct member m[4];
        memset(m, 0, sizeof(m));
        for (uint32_t i = 0; i < 4; i++) {
            m[i].algo = (enum ds_greduce_algo)a;
            m[i].direct_once = 1;
        }
        const uint32_t dead = 2;
        run_group(m, 4, 1, (int)dead);
        float in[4][N];
        for (uint32_t i = 0; i < 4; i++)
            ds_t_fill(in[i], N, 100 + i, -1.0f, 1.0f);
        size_t off, len;
        ds_greduce_chunk(N, 4, dead, &off, &len);
        for (uint32_t i = 0; i < 4; i++) {
            if (i == dead)
                continue;
            cr_assert_eq(m[i].ret, 0);
            cr_assert_eq(m[i].res.chunks_missing, 1, "algo %d member %u: %u chunks missing", a,
                         i, m[i].res.chunks_missing);
            cr_assert_eq(m[i].res.contributions, 3, "algo %d member %u", a, i);
            cr_assert_leq(m[i].t_end, 2000000000ull, "algo %d member %u waited past the deadline",
                          a, i);
            for (size_t j = 0; j < N; j++) {
                const double sum = (double)in[0][j] + in[1][j] + in[3][j];
                const double want = j >= off && j < off + len ? in[i][j]
                                    : j < N_MEAN             ? sum / 3
                                                             : sum;
                cr_assert(fabs(m[i].vec[j] - want) < 1e-5, "algo %d member %u element %zu", a, i,
                          j);
            }
        }
    }
}

/* ---- group.sparsify = micro: MiCRO inside a group ------------------------ */

#define MN 20000   /* the model's length */
#define MD 0.01    /* density: k = 200 for the whole group */
#define MSTEPS 400
#define MMAXG 8
#define MV 8       /* the dense part: the count at v[0], summed */

struct mmember {
    ds_fakenet *net;
    uint32_t G, me;
    float theta[MN], res[MN], g[MN], sum[MN], val[MN];
    uint32_t idx[MN];
    uint64_t hash[MSTEPS];    /* FNV-1a of theta after each step */
    uint32_t total[MSTEPS];   /* the group's count, as the reduction summed it */
    int outside;              /* selections outside the owned chunk */
    int not_owner_value;      /* own pairs whose sum differs from the value sent */
    int incomplete;
    int ret;
};

static uint64_t fnv(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* One member's training loop as node/runtime/rounds.c's group_reduce
 * does it with group.sparsify = micro: its own gradient (depends on the
 * shared theta and on its own seeded noise) joins its residual, it selects
 * inside its owned chunk, the lists are gathered and summed, every member
 * applies sum / G, the summed count steers its threshold. */
static void *mmember_main(void *p)
{
    struct mmember *m = p;
    ds_greduce *r = NULL;
    ds_sparsifier *sp = NULL;
    m->ret = ds_greduce_create(&r, MN + MV);
    if (m->ret == 0)
        m->ret = ds_hier_sparsifier_create(DS_GROUP_SPARSIFY_MICRO, MN, NULL, 0, &sp);
    for (int t = 0; t < MSTEPS && m->ret == 0; t++) {
        uint64_t seed = 1000u * (m->me + 1) + (uint64_t)t;
        for (size_t i = 0; i < MN; i++)
            m->g[i] = 0.05f * m->theta[i] +
                      ((float)(ds_t_next(&seed) % 2001) / 1000.0f - 1.0f) * (1.0f + (float)(i % 7));
        ds_sparsify_result sr;
        m->ret = ds_micro_ef_step(sp, m->res, m->g, MN, m->G, m->me, (uint64_t)t, MD, m->idx,
                                  m->val, MN, &sr);
        if (m->ret < 0)
            break;
        size_t off, len;
        ds_micro_chunk(MN, m->G, m->me, (uint64_t)t, &off, &len);
        for (size_t j = 0; j < sr.count; j++)
            m->outside += m->idx[j] < off || m->idx[j] >= off + len;
        float v[MV] = {(float)sr.count};
        const ds_gsparse gs = {.idx = m->idx, .val = m->val, .count = (uint32_t)sr.count,
                               .out = m->sum, .n_out = MN};
        ds_greduce_result gr;
        m->ret = ds_greduce_run(r, ds_fakenet_io(m->net, m->me), v, MV, 0, m->G, m->me, NULL,
                                (uint64_t)t, ds_fakenet_now_ns(m->net) + 2000000000ull, &gs, &gr);
        m->incomplete += !gr.complete;
        for (size_t j = 0; j < sr.count; j++)
            m->not_owner_value += memcmp(&m->sum[m->idx[j]], &m->val[j], sizeof(float)) != 0;
        for (size_t i = 0; i < MN; i++)
            m->theta[i] -= 0.1f * (m->sum[i] / (float)m->G);
        ds_micro_feedback(sp, (size_t)v[0]);
        m->total[t] = (uint32_t)v[0];
        m->hash[t] = fnv(m->theta, sizeof(m->theta));
    }
    ds_sparsifier_destroy(&sp);
    ds_greduce_destroy(&r);
    return NULL;
}

static double micro_group(uint32_t G)
{
    static struct mmember m[MMAXG];
    ds_fakenet *net = ds_fakenet_create(G);
    pthread_t th[MMAXG];
    memset(m, 0, sizeof(m));
    for (uint32_t i = 0; i < G; i++) {
        m[i].net = net;
        m[i].G = G;
        m[i].me = i;
        ds_t_fill(m[i].theta, MN, 7, -1.0f, 1.0f); /* the same start on every member */
        pthread_create(&th[i], NULL, mmember_main, &m[i]);
    }
    for (uint32_t i = 0; i < G; i++)
        pthread_join(th[i], NULL);
    ds_fakenet_destroy(net);
    for (uint32_t i = 0; i < G; i++) {
        cr_assert_eq(m[i].ret, 0, "G=%u member %u: %d", G, i, m[i].ret);
        cr_expect_eq(m[i].incomplete, 0, "G=%u member %u", G, i);
        cr_expect_eq(m[i].outside, 0, "G=%u member %u selected outside its chunk", G, i);
        cr_expect_eq(m[i].not_owner_value, 0, "G=%u member %u: a sum is not the owner's value",
                     G, i);
        for (int t = 0; t < MSTEPS; t++) {
            cr_assert_eq(m[i].hash[t], m[0].hash[t],
                         "G=%u step %d: member %u's parameters differ from member 0's", G, t, i);
            cr_assert_eq(m[i].total[t], m[0].total[t]);
        }
    }
    cr_assert_eq(memcmp(m[G - 1].theta, m[0].theta, sizeof(m[0].theta)), 0);
    /* The group's count per step over the last 100 steps: the threshold
     * moves by at most 0.5% a step, so it needs a few hundred steps to
     * follow the residuals' growth from their start at zero. */
    double mean = 0;
    for (int t = MSTEPS - 100; t < MSTEPS; t++)
        mean += m[0].total[t];
    return mean / 100;
}

/* MiCRO inside a group: members end every step with byte-identical
 * parameters, each selects only inside the chunk it owns, every sum is the
 * owner's value (chunks are disjoint), and the group's count per step stays
 * at k of the whole vector as the group grows 2 -> 4 -> 8: no gradient
 * build-up. */
Test(group, micro_members_identical_owned_chunks_and_flat_k, .timeout = 60)
{
    const double k = (double)ds_sparsify_k(MN, MD);
    double c[3];
    const uint32_t Gs[3] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        c[i] = micro_group(Gs[i]);
        cr_expect(c[i] > 0.7 * k && c[i] < 1.3 * k, "G=%u: %.1f selected per step, k = %.0f",
                  Gs[i], c[i], k);
    }
    cr_expect(c[2] < 1.3 * c[0] && c[2] > 0.7 * c[0], "k grows with G: %.1f (G=2) %.1f (G=8)",
              c[0], c[2]);
    cr_log_info("MiCRO in a group: selected per step %.1f (G=2) %.1f (G=4) %.1f (G=8), k = %.0f",
                c[0], c[1], c[2], k);
}

/* ---- group.sparsify = deft: DEFT inside a group ---------------------------- */

#define DSTEPS 200
#define DL 4       /* layers */
#define DMAXU (DL * MMAXG)

static const uint32_t deft_layers[DL + 1] = {0, 12000, 12500, 19500, MN};

struct dmember {
    ds_fakenet *net;
    uint32_t G, me;
    float theta[MN], res[MN], g[MN], sum[MN], val[MN];
    uint32_t idx[MN];
    uint64_t hash[DSTEPS];
    uint32_t total[DSTEPS];
    int outside;          /* selections outside the units of this member's bin */
    int not_owner_value;  /* own pairs whose sum differs from the value sent */
    int unbalanced;       /* steps whose heaviest bin broke LPT's 4/3 bound */
    int incomplete;
    int ret;
};

/* One member's loop as rounds.c's group_reduce does it with group.sparsify
 * = deft: the DEFT step on its residual writes its squared unit norms into
 * the averaged part of the reduction vector, the lists are gathered and
 * summed, every member applies sum / G, and the group's mean norms go back
 * for the next step. Beside it the test computes, from the same fed-back
 * norms, the allocation and bins every member should use, and checks the
 * member's selection against them. */
static void *dmember_main(void *p)
{
    struct dmember *m = p;
    ds_greduce *r = NULL;
    ds_sparsifier *sp = NULL;
    uint32_t units[DMAXU + 1], bin[DMAXU];
    size_t nu = 0, k_unit[DMAXU];
    double norms[DMAXU], load[MMAXG];
    float fed[DMAXU];
    int have_fed = 0;
    m->ret = ds_greduce_create(&r, MN + MV);
    if (m->ret == 0)
        m->ret = ds_hier_sparsifier_create(DS_GROUP_SPARSIFY_DEFT, MN, deft_layers, DL, &sp);
    if (m->ret == 0)
        m->ret = ds_deft_units(deft_layers, DL, m->G, units, DMAXU + 1, &nu);
    if (m->ret == 0 && ds_deft_group_units(sp, m->G) != nu)
        m->ret = -EPROTO;
    const size_t k = ds_sparsify_k(MN, MD);
    for (int t = 0; t < DSTEPS && m->ret == 0; t++) {
        uint64_t seed = 1000u * (m->me + 1) + (uint64_t)t;
        for (size_t i = 0; i < MN; i++) {
            /* Layers of different scales, so the norms share k unevenly. */
            const float scale = i < 12000 ? 0.2f : i < 12500 ? 3.0f : i < 19500 ? 1.0f : 6.0f;
            m->g[i] = 0.05f * m->theta[i] +
                      scale * ((float)(ds_t_next(&seed) % 2001) / 1000.0f - 1.0f);
        }
        /* What every member should use this step. */
        for (size_t u = 0; u < nu; u++)
            norms[u] = have_fed ? sqrt(fed[u]) : (double)(units[u + 1] - units[u]);
        if (ds_deft_alloc(units, nu, norms, k, k_unit) < 0 ||
            ds_deft_pack(units, k_unit, nu, m->G, bin, load) < 0) {
            m->ret = -EPROTO;
            break;
        }
        double total = 0, heavy = 0, top = 0;
        for (uint32_t b = 0; b < m->G; b++) {
            total += load[b];
            heavy = load[b] > heavy ? load[b] : heavy;
        }
        for (size_t u = 0; u < nu; u++) {
            const double len = (double)(units[u + 1] - units[u]);
            const double c = k_unit[u] > 1 && (double)k_unit[u] < len
                                 ? len * log2((double)k_unit[u]) : len;
            top = c > top ? c : top;
        }
        const double opt = total / m->G > top ? total / m->G : top;
        m->unbalanced += heavy > (4.0 / 3.0) * opt * (1 + 1e-12);

        float v[DMAXU + 1];
        ds_sparsify_result sr;
        m->ret = ds_deft_ef_step(sp, m->res, m->g, MN, m->G, m->me, (uint64_t)t, MD, m->idx,
                                 m->val, MN, v, &sr);
        if (m->ret < 0)
            break;
        const uint32_t mine = (uint32_t)((t % m->G + m->me) % m->G);
        size_t u = 0;
        for (size_t j = 0; j < sr.count; j++) {
            while (u < nu && m->idx[j] >= units[u + 1])
                u++;
            m->outside += u == nu || bin[u] != mine;
        }
        v[nu] = (float)sr.count;
        const ds_gsparse gs = {.idx = m->idx, .val = m->val, .count = (uint32_t)sr.count,
                               .out = m->sum, .n_out = MN};
        ds_greduce_result gr;
        m->ret = ds_greduce_run(r, ds_fakenet_io(m->net, m->me), v, nu + 1, nu, m->G, m->me,
                                NULL, (uint64_t)t, ds_fakenet_now_ns(m->net) + 2000000000ull,
                                &gs, &gr);
        m->incomplete += !gr.complete;
        for (size_t j = 0; j < sr.count; j++)
            m->not_owner_value += memcmp(&m->sum[m->idx[j]], &m->val[j], sizeof(float)) != 0;
        for (size_t i = 0; i < MN; i++)
            m->theta[i] -= 0.1f * (m->sum[i] / (float)m->G);
        ds_deft_feedback(sp, m->G, v, nu);
        memcpy(fed, v, nu * sizeof(float));
        have_fed = 1;
        m->total[t] = (uint32_t)v[nu];
        m->hash[t] = fnv(m->theta, sizeof(m->theta));
    }
    ds_sparsifier_destroy(&sp);
    ds_greduce_destroy(&r);
    return NULL;
}

static double deft_group(uint32_t G)
{
    static struct dmember m[MMAXG];
    ds_fakenet *net = ds_fakenet_create(G);
    pthread_t th[MMAXG];
    memset(m, 0, sizeof(m));
    for (uint32_t i = 0; i < G; i++) {
        m[i].net = net;
        m[i].G = G;
        m[i].me = i;
        ds_t_fill(m[i].theta, MN, 7, -1.0f, 1.0f);
        pthread_create(&th[i], NULL, dmember_main, &m[i]);
    }
    for (uint32_t i = 0; i < G; i++)
        pthread_join(th[i], NULL);
    ds_fakenet_destroy(net);
    for (uint32_t i = 0; i < G; i++) {
        cr_assert_eq(m[i].ret, 0, "G=%u member %u: %d", G, i, m[i].ret);
        cr_expect_eq(m[i].incomplete, 0, "G=%u member %u", G, i);
        cr_expect_eq(m[i].outside, 0, "G=%u member %u selected outside its bin's units", G, i);
        cr_expect_eq(m[i].not_owner_value, 0, "G=%u member %u: a sum is not the owner's value",
                     G, i);
        cr_expect_eq(m[i].unbalanced, 0, "G=%u member %u: bins over LPT's bound", G, i);
        for (int t = 0; t < DSTEPS; t++) {
            cr_assert_eq(m[i].hash[t], m[0].hash[t],
                         "G=%u step %d: member %u's parameters differ from member 0's", G, t, i);
            cr_assert_eq(m[i].total[t], m[0].total[t]);
        }
    }
    double mean = 0;
    for (int t = 0; t < DSTEPS; t++)
        mean += m[0].total[t];
    return mean / DSTEPS;
}

/* DEFT inside a group: members end every step with byte-identical
 * parameters; every member reaches the same per-unit k and bins from the
 * group's norms of the step before (each selects only in its own bin's
 * units, and every sum is its owner's value: the bins never overlap); the
 * heaviest bin stays within LPT's bound; and the group's count per step is
 * k of the whole vector (plus at most one per unit) at every group size:
 * no gradient build-up. */
Test(group, deft_members_identical_own_bins_and_flat_k, .timeout = 60)
{
    const double k = (double)ds_sparsify_k(MN, MD);
    double c[3];
    const uint32_t Gs[3] = {2, 4, 8};
    for (int i = 0; i < 3; i++) {
        c[i] = deft_group(Gs[i]);
        cr_expect(c[i] >= k && c[i] <= k + DL * Gs[i], "G=%u: %.1f selected per step, k = %.0f",
                  Gs[i], c[i], k);
    }
    cr_log_info("DEFT in a group: selected per step %.1f (G=2) %.1f (G=4) %.1f (G=8), k = %.0f",
                c[0], c[1], c[2], k);
}

/* group.allreduce = auto with group.overlap: the cost model. A fit to
 * timings drawn from known lines (with a little seeded noise) recovers
 * them, and the pick follows the lines: the butterfly (lower fixed cost,
 * dearer per float here) for small layers, direct for large ones, direct
 * on a tie; a negative slope or intercept is refitted; one length gives
 * its mean; no sample is an error. */
Test(group, cost_model_fit_and_pick)
{
    enum { NS = 40 };
    double x[NS], yd[NS], yb[NS];
    uint64_t s = 9;
    for (int i = 0; i < NS; i++) {
        x[i] = (double)(1000 + (i % 8) * 60000);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double noise = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.02;
        yd[i] = (2.0 + 1e-4 * x[i]) * (1 + noise);
        yb[i] = (0.5 + 3e-4 * x[i]) * (1 - noise);
    }
    ds_greduce_cost c;
    cr_assert_eq(ds_greduce_fit(x, yd, NS, &c.alpha_ms[0], &c.beta_ms[0]), 0);
    cr_assert_eq(ds_greduce_fit(x, yb, NS, &c.alpha_ms[1], &c.beta_ms[1]), 0);
    cr_assert_float_eq(c.alpha_ms[0], 2.0f, 0.2f, "%g", c.alpha_ms[0]);
    cr_assert_float_eq(c.beta_ms[0], 1e-4f, 5e-6f, "%g", c.beta_ms[0]);
    cr_assert_float_eq(c.alpha_ms[1], 0.5f, 0.2f, "%g", c.alpha_ms[1]);
    cr_assert_float_eq(c.beta_ms[1], 3e-4f, 5e-6f, "%g", c.beta_ms[1]);
    /* the lines cross at 1.5 / 2e-4 = 7500 floats */
    cr_assert_eq(ds_greduce_pick(&c, 320), DS_GREDUCE_BUTTERFLY);
    cr_assert_eq(ds_greduce_pick(&c, 4000), DS_GREDUCE_BUTTERFLY);
    cr_assert_eq(ds_greduce_pick(&c, 20000), DS_GREDUCE_DIRECT);
    cr_assert_eq(ds_greduce_pick(&c, 401408), DS_GREDUCE_DIRECT);
    const ds_greduce_cost tie = {{1.0f, 1.0f}, {1e-4f, 1e-4f}};
    cr_assert_eq(ds_greduce_pick(&tie, 5000), DS_GREDUCE_DIRECT);

    /* slower for fewer floats: beta 0, alpha the mean */
    const double xs[3] = {100, 200, 300}, ys[3] = {3, 2, 1};
    float a, b;
    cr_assert_eq(ds_greduce_fit(xs, ys, 3, &a, &b), 0);
    cr_assert_eq(b, 0.0f);
    cr_assert_float_eq(a, 2.0f, 1e-6f);
    /* a negative intercept: through the origin */
    const double yn[3] = {0.5, 1.5, 2.5};
    cr_assert_eq(ds_greduce_fit(xs, yn, 3, &a, &b), 0);
    cr_assert_eq(a, 0.0f);
    cr_assert_gt(b, 0.0f);
    /* one length: its mean, no slope */
    const double x1[2] = {500, 500}, y1[2] = {1, 3};
    cr_assert_eq(ds_greduce_fit(x1, y1, 2, &a, &b), 0);
    cr_assert_eq(b, 0.0f);
    cr_assert_float_eq(a, 2.0f, 1e-6f);
    cr_assert_eq(ds_greduce_fit(x1, y1, 0, &a, &b), -EINVAL);
}
