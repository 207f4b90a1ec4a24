/*
 * tests/test_gossip.c: the gossip engine on an in-process fake network
 * (node/gossip/fake.c), one thread per node.
 *   - pairwise rounds with every sparsifier conserve the sum of all models
 *     (to float rounding), with local drift added between rounds;
 *   - dense pairwise and the paper's crossover rule shrink the consensus
 *     distance geometrically;
 *   - a node that does not answer is skipped, reported, and the others' sum
 *     does not change;
 *   - the engine's deadlines run on its io's clock (the fake's, which
 *     moves only when a wait runs out);
 *   - a REQ for a round that is over is answered when its sender was our
 *     in-neighbour then (else STALE), and its initiator applies the reply
 *     late: a partner rounds behind still mixes and the sum holds;
 *   - the time a partner held our REQ on its own waits for others is not
 *     counted as its link's (held_us);
 *   - the adaptive deadline and the slow-partner rule (latency.h) on
 *     seeded latencies; pacing to the view's median round, where a
 *     partner last heard rounds ago, in step then, is still in step;
 *   - the all-reduce baseline gives every node the mean gradient.
 * Run: meson test -C build gossip --verbose
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "node/gossip/fake.h"
#include "node/gossip/gossip.h"
#include "node/gossip/latency.h"
#include "base/log.h"
#include "testutil.h"

#define MAXG 8
#define NL 3

static ds_layer layers[NL];
static size_t n_params;

static void make_layers(void)
{
    const size_t len[NL] = {2000, 515, 33};
    size_t off = 0;
    for (int i = 0; i < NL; i++) {
        snprintf(layers[i].name, sizeof(layers[i].name), "fc%d", i + 1);
        layers[i].off = off;
        layers[i].len = len[i];
        off += len[i];
    }
    n_params = off;
}

typedef struct cluster {
    uint32_t G;
    int rounds;
    int noise;              /* add seeded drift before each round */
    ds_gossip_cfg cfg;
    ds_fakenet *net;
    int dead[MAXG];
    float *theta[MAXG];
    ds_gossip *g[MAXG];
    pthread_barrier_t bar;
    double max_sum_err;     /* worst |sum after - sum before| / scale */
    double dist[64];        /* consensus distance before each round */
    int skip_dead;          /* every node marks the dead nodes skipped */
    int groups;             /* the participants are groups (of one each) */
} cluster;

typedef struct worker {
    cluster *c;
    uint32_t me;
} worker;

static double sum_err(cluster *c, const float *before)
{
    double worst = 0;
    for (size_t j = 0; j < n_params; j++) {
        double s = 0, scale = 0;
        for (uint32_t i = 0; i < c->G; i++) {
            if (c->dead[i])
                continue;
            s += c->theta[i][j];
            scale += fabs(c->theta[i][j]);
        }
        double e = fabs(s - before[j]) / (scale * FLT_EPSILON * 4 * c->G + 1e-30);
        if (e > worst)
            worst = e;
    }
    return worst;
}

static void sums(cluster *c, float *out)
{
    for (size_t j = 0; j < n_params; j++) {
        double s = 0;
        for (uint32_t i = 0; i < c->G; i++)
            if (!c->dead[i])
                s += c->theta[i][j];
        out[j] = (float)s;
    }
}

static double consensus(cluster *c)
{
    double d = 0;
    int alive = 0;
    for (uint32_t i = 0; i < c->G; i++)
        alive += !c->dead[i];
    for (size_t j = 0; j < n_params; j++) {
        double m = 0;
        for (uint32_t i = 0; i < c->G; i++)
            if (!c->dead[i])
                m += c->theta[i][j];
        m /= alive;
        for (uint32_t i = 0; i < c->G; i++)
            if (!c->dead[i])
                d += (c->theta[i][j] - m) * (c->theta[i][j] - m);
    }
    return d / alive;
}

static void *work(void *arg)
{
    worker *w = arg;
    cluster *c = w->c;
    uint64_t s = 1000 + w->me;
    for (int r = 0; r < c->rounds; r++) {
        if (c->noise)
            for (size_t j = 0; j < n_params; j++)
                c->theta[w->me][j] += 0.01f * (float)((int64_t)(ds_t_next(&s) >> 40) - (1 << 23)) / (1 << 23);
        pthread_barrier_wait(&c->bar); /* main: sums before */
        pthread_barrier_wait(&c->bar);
        int ret = ds_gossip_round(c->g[w->me], c->theta[w->me], (uint64_t)r, ds_fakenet_io(c->net, w->me));
        cr_assert_eq(ret, 0);
        pthread_barrier_wait(&c->bar); /* main: sums after */
        pthread_barrier_wait(&c->bar);
    }
    return NULL;
}

static void run_cluster(cluster *c)
{
    make_layers();
    c->net = ds_fakenet_create(c->G);
    uint32_t alive = 0;
    for (uint32_t i = 0; i < c->G; i++) {
        c->theta[i] = malloc(n_params * sizeof(float));
        ds_t_fill(c->theta[i], n_params, 77 + i, -1, 1);
        ds_gossip_cfg cfg = c->cfg;
        cfg.node_seed = 500 + i;
        cr_assert_eq(ds_gossip_create(&c->g[i], &cfg, layers, NL, n_params, c->theta[i]), 0);
        cr_assert_eq(ds_gossip_set_view(c->g[i], c->G, i, 1), 0);
        if (c->groups)
            cr_assert_eq(ds_gossip_set_share(c->g[i], 0, 1), 0);
        for (uint32_t d = 0; c->skip_dead && d < c->G; d++)
            if (c->dead[d] && d != i)
                cr_assert_eq(ds_gossip_set_skip(c->g[i], d), 0);
        if (c->dead[i])
            ds_fakenet_set_dead(c->net, i, 1);
        else
            alive++;
    }
    /* With every node alive, a time-out can only be the machine stalling a
     * thread past the deadline's floor (gossip.min_wait_ms, 10 ms; seen
     * under ASan on a loaded CI host with the floor at 100 ms and no
     * patience: an exchange missed, the sum drifted); wait 200x as long in
     * real time (2 s). With a dead node the time-outs are the test. */
    if (alive == c->G)
        ds_fakenet_set_patience(c->net, 200);
    pthread_barrier_init(&c->bar, NULL, alive + 1);
    pthread_t th[MAXG];
    worker w[MAXG];
    for (uint32_t i = 0; i < c->G; i++) {
        if (c->dead[i])
            continue;
        w[i].c = c;
        w[i].me = i;
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    float *before = malloc(n_params * sizeof(float));
    c->max_sum_err = 0;
    for (int r = 0; r < c->rounds; r++) {
        pthread_barrier_wait(&c->bar);
        sums(c, before);
        if (r < 64)
            c->dist[r] = consensus(c);
        pthread_barrier_wait(&c->bar);
        pthread_barrier_wait(&c->bar);
        double e = sum_err(c, before);
        if (e > c->max_sum_err)
            c->max_sum_err = e;
        pthread_barrier_wait(&c->bar);
    }
    for (uint32_t i = 0; i < c->G; i++)
        if (!c->dead[i])
            pthread_join(th[i], NULL);
    free(before);
    pthread_barrier_destroy(&c->bar);
}

static void free_cluster(cluster *c)
{
    for (uint32_t i = 0; i < c->G; i++) {
        ds_gossip_destroy(&c->g[i]);
        free(c->theta[i]);
    }
    ds_fakenet_destroy(c->net);
}

static ds_gossip_cfg base_cfg(void)
{
    ds_gossip_cfg cfg = {
        .topology = DS_TOPO_CROSSOVER,
        .mix = DS_MIX_PAIRWISE,
        .weight = 1.0f / 3.0f,
        .method = DS_SPARSIFY_MICRO,
        .density = 0.05,
        .error_feedback = 1,
        .seed = 42,
        .timeout_ms = 5000,
    };
    return cfg;
}

static void quiet(void)
{
    ds_log_setup("test", DS_LOG_ERROR, NULL);
}

TestSuite(gossip, .init = quiet, .timeout = 120);

Test(gossip, segments_per_layer_and_cut)
{
    make_layers();
    ds_gseg seg[8];
    cr_assert_eq(ds_gossip_segments(layers, NL, n_params, 0, seg), NL);
    cr_expect_eq(seg[1].off, 2000);
    cr_expect_eq(seg[1].len, 515);
    int k = ds_gossip_segments(layers, NL, n_params, 4, seg);
    cr_assert_eq(k, 4);
    size_t off = 0;
    for (int i = 0; i < k; i++) {
        cr_expect_eq(seg[i].off, off);
        cr_expect_gt(seg[i].len, 0);
        off += seg[i].len;
    }
    cr_expect_eq(off, n_params);
    /* n/4 = 637: the third cut (1911) moves to the layer boundary 2000. */
    cr_expect_eq(seg[2].off + seg[2].len, 2000);
    cr_expect_eq(ds_gossip_segments(layers, NL, n_params, -1, seg), -EINVAL);
}

struct waiting_node {
    ds_gossip *g;
    float *theta;
    const ds_gossip_io *io;
    int ret;
};

static void *waiting_round(void *p)
{
    struct waiting_node *w = p;
    w->ret = ds_gossip_round(w->g, w->theta, 0, w->io);
    return NULL;
}

/* ds_gossip_waiting, read from another thread: while node 0's exchange
 * waits for node 1 (which has not started its round), it names node 1;
 * once node 1 has run its round and both exchanges ended, nobody. */
Test(gossip, waiting_names_the_peers_still_awaited)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    ds_gossip *g[2];
    float *theta[2];
    for (uint32_t i = 0; i < 2; i++) {
        theta[i] = malloc(n_params * sizeof(float));
        ds_t_fill(theta[i], n_params, 77 + i, -1, 1);
        ds_gossip_cfg cfg = base_cfg();
        cfg.timeout_ms = 60000; /* node 0 waits in real time until node 1 runs */
        cfg.node_seed = 500 + i;
        cr_assert_eq(ds_gossip_create(&g[i], &cfg, layers, NL, n_params, theta[i]), 0);
        cr_assert_eq(ds_gossip_set_view(g[i], 2, i, 1), 0);
    }
    uint32_t peers[4] = {99, 99, 99, 99};
    cr_expect_eq(ds_gossip_waiting(g[0], peers, 4), 0, "no exchange yet");
    struct waiting_node w0 = {g[0], theta[0], ds_fakenet_io(net, 0), -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waiting_round, &w0), 0);
    int n = 0;
    for (int k = 0; k < 1000 && n == 0; k++) {
        n = ds_gossip_waiting(g[0], peers, 4);
        if (n == 0) {
            const struct timespec ts = {0, 5 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    cr_expect_eq(n, 1, "node 0 waits for %d peers", n);
    cr_expect_eq(peers[0], 1);
    cr_expect_eq(peers[1], 99, "only n entries written");
    cr_assert_eq(ds_gossip_round(g[1], theta[1], 0, ds_fakenet_io(net, 1)), 0);
    pthread_join(th, NULL);
    cr_expect_eq(w0.ret, 0);
    cr_expect_eq(ds_gossip_waiting(g[0], peers, 4), 0, "the wait ended");
    cr_expect_eq(ds_gossip_waiting(g[1], peers, 4), 0);
    for (uint32_t i = 0; i < 2; i++) {
        ds_gossip_destroy(&g[i]);
        free(theta[i]);
    }
    ds_fakenet_destroy(net);
}

Test(gossip, create_refuses_more_segments_than_parameters)
{
    /* Issue 16: refused before anything is reserved for them. */
    make_layers();
    float *a = calloc(n_params, 4);
    cr_assert_not_null(a);
    ds_gossip_cfg cfg = base_cfg();
    ds_gossip *g = NULL;
    static const int bad[] = {-1, INT32_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cfg.segments = bad[i];
        cr_expect_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, a), -EINVAL, "%d", bad[i]);
        cr_expect_null(g);
    }
    cfg.segments = (int)n_params + 1;
    cr_expect_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, a), -EINVAL);
    cfg.segments = (int)n_params; /* one parameter each: the most there can be */
    cr_assert_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, a), 0);
    cr_expect_eq(ds_gossip_n_segments(g), (int)n_params);
    ds_gossip_destroy(&g);
    free(a);
}

Test(gossip, pairwise_conserves_sum_every_method)
{
    const enum ds_sparsify_method methods[] = {
        DS_SPARSIFY_NONE, DS_SPARSIFY_RANDOM, DS_SPARSIFY_TOPK, DS_SPARSIFY_THRESHOLD,
        DS_SPARSIFY_SAGE, DS_SPARSIFY_MICRO, DS_SPARSIFY_DEFT};
    for (size_t mi = 0; mi < sizeof(methods) / sizeof(methods[0]); mi++)
        for (int topo = 0; topo < 4; topo++) {
            cluster c = {.G = 5, .rounds = 12, .noise = 1, .cfg = base_cfg()};
            c.cfg.method = methods[mi];
            c.cfg.topology = (enum ds_topo_kind)topo;
            c.cfg.segments = topo == 1 ? 4 : 0;
            run_cluster(&c);
            cr_expect_lt(c.max_sum_err, 1.0, "%s on %s: sum drifted %.2f rounding units",
                         ds_sparsify_method_name(methods[mi]), ds_topo_name(c.cfg.topology),
                         c.max_sum_err);
            const ds_gossip_stats *st = ds_gossip_get_stats(c.g[0]);
            cr_expect_eq(st->exchanges_failed, 0, "%s", ds_sparsify_method_name(methods[mi]));
            cr_expect_gt(st->exchanges_ok, 0);
            free_cluster(&c);
        }
}

/* Two groups exchange each segment once a round, not twice: the group
 * ds_topo_pair_initiator names initiates, the other answers, so each
 * group initiates half the segments and the bytes between them halve;
 * the sum holds; the exchange has the weight of the two. Two nodes that are not groups keep both directions, and
 * so does the crossover mix between two groups (it needs both). */
Test(gossip, two_groups_exchange_each_segment_once)
{
    for (int grouped = 0; grouped <= 1; grouped++) {
        cluster c = {.G = 2, .rounds = 12, .noise = 1, .cfg = base_cfg(), .groups = grouped};
        c.cfg.segments = 5;
        run_cluster(&c);
        cr_expect_lt(c.max_sum_err, 1.0, "grouped=%d: sum drifted %.2f rounding units", grouped,
                     c.max_sum_err);
        const ds_gossip_stats *a = ds_gossip_get_stats(c.g[0]), *b = ds_gossip_get_stats(c.g[1]);
        const uint64_t per_round = grouped ? 5 : 10;
        cr_expect_eq(a->exchanges_ok + b->exchanges_ok, 12 * per_round, "grouped=%d: %llu + %llu",
                     grouped, (unsigned long long)a->exchanges_ok,
                     (unsigned long long)b->exchanges_ok);
        cr_expect_eq(a->answered + b->answered, 12 * per_round);
        cr_expect_eq(a->exchanges_failed + b->exchanges_failed, 0);
        if (grouped) /* 5 segments a round, rounds 0..11: 30 each */
            cr_expect(a->exchanges_ok == 30 && b->exchanges_ok == 30, "%llu and %llu",
                      (unsigned long long)a->exchanges_ok, (unsigned long long)b->exchanges_ok);
        cr_expect_lt(c.dist[11], c.dist[0], "grouped=%d: no mixing", grouped);
        free_cluster(&c);
    }
    /* The one exchange carries the two's weight, min(2 w, 1/2): dense, w =
     * 1/3, one round averages the two groups exactly; two nodes' two
     * exchanges contract their difference to 1/3 (the distance to 1/9). */
    for (int grouped = 0; grouped <= 1; grouped++) {
        cluster c = {.G = 2, .rounds = 2, .cfg = base_cfg(), .groups = grouped};
        c.cfg.method = DS_SPARSIFY_NONE;
        c.cfg.segments = 3;
        run_cluster(&c);
        const double want = grouped ? 0.0 : c.dist[0] / 9.0;
        cr_expect(fabs(c.dist[1] - want) <= 1e-4 * c.dist[0], "grouped=%d: %g then %g, want %g",
                  grouped, c.dist[0], c.dist[1], want);
        free_cluster(&c);
    }
    cluster c = {.G = 2, .rounds = 4, .cfg = base_cfg(), .groups = 1};
    c.cfg.mix = DS_MIX_CROSSOVER;
    c.cfg.method = DS_SPARSIFY_NONE;
    run_cluster(&c);
    cr_expect_lt(c.max_sum_err, 1.0, "crossover between two groups: sum drifted");
    cr_expect_lt(c.dist[3], c.dist[0] * 1e-6 + 1e-12, "crossover between two groups: %g then %g",
                 c.dist[0], c.dist[3]);
    free_cluster(&c);
}

/* sparsify.value_format f16 and bf16: values go out rounded, and both
 * halves of an exchange are computed from the two values as sent, so the
 * sum of all models holds exactly as with f32 (the rounding residual stays
 * in the sender's own model), for sparse and dense exchanges; and dense
 * mixing still drives the models together (to within the format's
 * resolution). */
Test(gossip, narrow_values_conserve_sum_and_mix)
{
    for (int vf = DS_VALUE_F16; vf <= DS_VALUE_BF16; vf++)
        for (int dense = 0; dense <= 1; dense++) {
            cluster c = {.G = 6, .rounds = 20, .noise = !dense, .cfg = base_cfg()};
            c.cfg.value_format = (enum ds_value_format)vf;
            c.cfg.method = dense ? DS_SPARSIFY_NONE : DS_SPARSIFY_MICRO;
            run_cluster(&c);
            cr_expect_lt(c.max_sum_err, 1.0, "%s %s: sum drifted %.2f rounding units",
                         vf == DS_VALUE_F16 ? "f16" : "bf16", dense ? "dense" : "micro",
                         c.max_sum_err);
            const ds_gossip_stats *st = ds_gossip_get_stats(c.g[0]);
            cr_expect_gt(st->exchanges_ok, 0);
            cr_expect_eq(st->exchanges_failed, 0);
            /* Every REQ answered: over all nodes, a value went out once in a
             * REQ with its 4-byte index and once in a RESP, 2 bytes each
             * time (f32: 8 and 4). */
            uint64_t bytes = 0, values = 0;
            for (uint32_t i = 0; i < c.G; i++) {
                bytes += ds_gossip_get_stats(c.g[i])->bytes_sent;
                values += ds_gossip_get_stats(c.g[i])->values_sent;
            }
            cr_expect_eq(bytes, values / 2 * (4 + 2 + 2), "%llu bytes for %llu values",
                         (unsigned long long)bytes, (unsigned long long)values);
            if (dense)
                cr_expect_lt(c.dist[19], 1e-2 * c.dist[0], "%s: consensus %.3g -> %.3g",
                             vf == DS_VALUE_F16 ? "f16" : "bf16", c.dist[0], c.dist[19]);
            free_cluster(&c);
        }
}

Test(gossip, dense_pairwise_and_crossover_shrink_consensus_geometrically)
{
    for (int mix = 0; mix < 2; mix++) {
        cluster c = {.G = 8, .rounds = 20, .cfg = base_cfg()};
        c.cfg.method = DS_SPARSIFY_NONE;
        c.cfg.mix = mix ? DS_MIX_CROSSOVER : DS_MIX_PAIRWISE;
        run_cluster(&c);
        /* Every round must shrink the distance by a constant factor. */
        double worst = 0;
        for (int r = 1; r < 20; r++) {
            double ratio = c.dist[r] / c.dist[r - 1];
            if (ratio > worst)
                worst = ratio;
        }
        cr_log_info("%s: consensus %.3g -> %.3g, worst per-round ratio %.3f",
                    mix ? "crossover" : "pairwise", c.dist[0], c.dist[19], worst);
        cr_expect_lt(worst, 0.8, "%s: a round shrank the distance only by %.3f", mix ? "crossover" : "pairwise", worst);
        cr_expect_lt(c.dist[19], 1e-3 * c.dist[0]);
        if (!mix)
            cr_expect_lt(c.max_sum_err, 1.0, "pairwise conserves the sum");
        free_cluster(&c);
    }
}

Test(gossip, silent_peer_is_skipped_and_reported)
{
    cluster c = {.G = 6, .rounds = 6, .noise = 1, .cfg = base_cfg()};
    c.cfg.timeout_ms = 60;
    c.dead[2] = 1;
    run_cluster(&c);
    cr_expect_lt(c.max_sum_err, 1.0, "the live nodes' sum moved by %.2f rounding units", c.max_sum_err);
    cr_expect_gt(ds_fakenet_failures(c.net, 2), 0, "the dead node was reported");
    for (uint32_t i = 0; i < c.G; i++)
        if (i != 2)
            cr_expect_eq(ds_fakenet_failures(c.net, i), 0, "live node %u wrongly reported", i);
    uint64_t failed = 0;
    for (uint32_t i = 0; i < c.G; i++)
        if (!c.dead[i])
            failed += ds_gossip_get_stats(c.g[i])->exchanges_failed;
    cr_expect_gt(failed, 0);
    free_cluster(&c);
}

/* Peers known to be unresponsive are not waited for: rounds with a dead
 * node take no timeout at all, the live nodes' sum still holds. Measured
 * on the fake network's clock, which moves only when a wait runs out. */
Test(gossip, skipped_peer_costs_no_timeout)
{
    cluster c = {.G = 6, .rounds = 8, .noise = 1, .cfg = base_cfg(), .skip_dead = 1};
    c.cfg.timeout_ms = 2000;
    c.dead[4] = 1;
    run_cluster(&c);
    cr_expect_eq(ds_fakenet_timeouts(c.net), 0, "%llu waits ran out: someone waited for the "
                 "dead node", (unsigned long long)ds_fakenet_timeouts(c.net));
    cr_expect_eq(ds_fakenet_now_ns(c.net), 0, "8 rounds took %llu ms of the fake clock",
                 (unsigned long long)(ds_fakenet_now_ns(c.net) / 1000000u));
    for (uint32_t i = 0; i < c.G; i++)
        if (!c.dead[i])
            cr_expect_eq(ds_gossip_get_stats(c.g[i])->max_wait_ns, 0, "node %u waited", i);
    cr_expect_lt(c.max_sum_err, 1.0);
    cr_expect_eq(ds_fakenet_failures(c.net, 4), 0, "a skipped peer is not reported again");
    uint64_t skipped = 0;
    for (uint32_t i = 0; i < c.G; i++)
        if (!c.dead[i])
            skipped += ds_gossip_get_stats(c.g[i])->skipped;
    cr_expect_gt(skipped, 0);
    free_cluster(&c);
}

/* The engine reads time only through its io: a round with its partner
 * absent ends exactly one timeout later on the io's clock, and a peer that
 * is not waited for costs exactly the 10 ms grace, without being reported
 * again. Single-threaded on an instant fake clock: no real waiting. */
Test(gossip, deadlines_run_on_the_io_clock)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_instant(net, 1);
    const uint64_t t0 = 1000000000ull, ms = 1000000ull;
    ds_fakenet_advance(net, t0);
    float *a = calloc(n_params, 4);
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 50;
    ds_gossip *ga;
    cr_assert_eq(ds_gossip_create(&ga, &cfg, layers, NL, n_params, a), 0);
    ds_t_fill(a, n_params, 3, -1, 1); /* drift: REQs that are not empty */
    cr_assert_eq(ds_gossip_set_view(ga, 2, 0, 1), 0);
    cr_assert_eq(ds_gossip_round(ga, a, 0, ds_fakenet_io(net, 0)), 0);
    cr_expect_eq(ds_fakenet_now_ns(net), t0 + 50 * ms, "the round ended at %llu ns",
                 (unsigned long long)(ds_fakenet_now_ns(net) - t0));
    cr_expect_eq(ds_gossip_get_stats(ga)->wait_ns, 50 * ms);
    cr_expect_eq(ds_gossip_get_stats(ga)->max_wait_ns, 50 * ms);
    cr_expect_eq(ds_gossip_get_stats(ga)->timeouts, 1, "one wait ran out");
    const uint64_t reported = ds_fakenet_failures(net, 1);
    cr_expect_gt(reported, 0, "the absent partner was reported");

    /* A new view: round 0's exchange, still open in view 1, does not
     * make this one go out empty (which would cost no grace at all). */
    cr_assert_eq(ds_gossip_set_view(ga, 2, 0, 2), 0);
    cr_assert_eq(ds_gossip_set_nowait(ga, 1), 0);
    cr_assert_eq(ds_gossip_round(ga, a, 1, ds_fakenet_io(net, 0)), 0);
    cr_expect_eq(ds_fakenet_now_ns(net), t0 + 60 * ms, "a peer not waited for cost %llu ns",
                 (unsigned long long)(ds_fakenet_now_ns(net) - t0 - 50 * ms));
    cr_expect_eq(ds_fakenet_failures(net, 1), reported, "reported again");
    cr_expect_eq(ds_gossip_get_stats(ga)->max_wait_ns, 50 * ms);
    cr_expect_eq(ds_gossip_get_stats(ga)->timeouts, 1, "the grace is no timeout");
    /* The copy for other threads says the same as the live counters. */
    ds_gossip_stats rep;
    ds_gossip_report(ga, &rep, NULL, 0, NULL, 0);
    cr_expect_eq(memcmp(&rep, ds_gossip_get_stats(ga), sizeof(rep)), 0);
    ds_gossip_destroy(&ga);
    free(a);
    ds_fakenet_destroy(net);
}

/* gossip.min_wait_ms is the adaptive deadline's floor: in a cluster whose
 * rounds take no time on the io clock, the deadline after the first rounds
 * is the floor: 10 ms by default, the configured one, never over the
 * timeout. A 100 ms floor made every TCP retransmission on a lossy link
 * (5% loss) cost each waiting partner 100 ms: the cluster at 0.37-0.44x
 * its undisturbed rate, 0.74-0.89x at 10 ms (docs/benchmarks.md). */
Test(gossip, min_wait_is_the_deadline_floor)
{
    const int asked[] = {0, 30, 4000}, want_ms[] = {DS_GLAT_FLOOR_MS, 30, 2000};
    for (int i = 0; i < 3; i++) {
        cluster c = {.G = 4, .rounds = 8, .noise = 1, .cfg = base_cfg()};
        c.cfg.timeout_ms = 2000;
        c.cfg.min_wait_ms = asked[i];
        run_cluster(&c);
        for (uint32_t n = 0; n < c.G; n++) {
            const ds_gossip_stats *st = ds_gossip_get_stats(c.g[n]);
            cr_expect_eq(st->deadline_ns, (uint64_t)want_ms[i] * 1000000u,
                         "min_wait_ms %d: node %u's deadline %llu ns", asked[i], n,
                         (unsigned long long)st->deadline_ns);
            cr_expect_eq(st->exchanges_failed, 0);
        }
        free_cluster(&c);
    }
}

/* What gossip_net's recv answers once the node is stopping. */
static int recv_stopping(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    (void)ctx;
    (void)m;
    (void)deadline_ns;
    return -ECANCELED;
}

/* A stop request ends a round's wait at once: no time passes on the io's
 * clock, the absent partner is not reported for it, the exchange fails
 * (its values go back to the accumulator: the sum is kept) and the
 * round counts as interrupted, not as a timeout. */
Test(gossip, stop_ends_the_wait)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_instant(net, 1);
    float *a = calloc(n_params, 4);
    for (size_t i = 0; i < n_params; i++)
        a[i] = (float)i;
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 2000;
    ds_gossip *ga;
    cr_assert_eq(ds_gossip_create(&ga, &cfg, layers, NL, n_params, a), 0);
    cr_assert_eq(ds_gossip_set_view(ga, 2, 0, 1), 0);
    ds_gossip_io io = *ds_fakenet_io(net, 0);
    io.recv = recv_stopping;
    for (size_t i = 0; i < n_params; i++)
        a[i] += 1.0f;
    cr_assert_eq(ds_gossip_round(ga, a, 0, &io), 0);
    cr_expect_eq(ds_fakenet_now_ns(net), 0, "the round waited %llu ns",
                 (unsigned long long)ds_fakenet_now_ns(net));
    cr_expect_eq(ds_fakenet_failures(net, 1), 0, "the partner was blamed for our stop");
    const ds_gossip_stats *st = ds_gossip_get_stats(ga);
    cr_expect_eq(st->interrupted, 1);
    cr_expect_eq(st->timeouts, 0);
    cr_expect_gt(st->exchanges_failed, 0);
    for (size_t i = 0; i < n_params; i++)
        cr_assert_eq(a[i], (float)i + 1.0f, "param %zu changed by a failed exchange", i);
    ds_gossip_destroy(&ga);
    free(a);
    ds_fakenet_destroy(net);
}

/* The same for the all-reduce baseline: the ring step fails at once and
 * the left neighbour is not reported. */
Test(gossip, stop_ends_the_allreduce)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_instant(net, 1);
    float *a = calloc(n_params, 4), *grad = calloc(n_params, 4);
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 2000;
    ds_gossip *ga;
    cr_assert_eq(ds_gossip_create(&ga, &cfg, layers, NL, n_params, a), 0);
    cr_assert_eq(ds_gossip_set_view(ga, 2, 0, 1), 0);
    ds_gossip_io io = *ds_fakenet_io(net, 0);
    io.recv = recv_stopping;
    cr_expect_lt(ds_gossip_allreduce(ga, grad, n_params, 0, &io), 0);
    cr_expect_eq(ds_fakenet_now_ns(net), 0, "the all-reduce waited");
    cr_expect_eq(ds_fakenet_failures(net, 1), 0, "the neighbour was blamed for our stop");
    cr_expect_eq(ds_gossip_get_stats(ga)->interrupted, 1);
    cr_expect_eq(ds_gossip_get_stats(ga)->timeouts, 0);
    ds_gossip_destroy(&ga);
    free(a);
    free(grad);
    ds_fakenet_destroy(net);
}

/* A REQ for a round this node has finished is answered from its
 * snapshot when the schedule says the sender was its in-neighbour then;
 * the initiator, whose round ended at its deadline, kept the exchange
 * open and applies the reply in its next round. */
Test(gossip, late_request_is_answered_and_applied_later)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    float *a = calloc(n_params, 4), *b = calloc(n_params, 4);
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 50;
    ds_gossip *ga, *gb;
    cr_assert_eq(ds_gossip_create(&ga, &cfg, layers, NL, n_params, a), 0);
    cr_assert_eq(ds_gossip_create(&gb, &cfg, layers, NL, n_params, b), 0);
    ds_gossip_set_view(ga, 2, 0, 1);
    ds_gossip_set_view(gb, 2, 1, 1);
    /* Drift since the engines' snapshots: something to send. */
    ds_t_fill(a, n_params, 5, -1, 1);
    ds_t_fill(b, n_params, 6, -1, 1);
    /* b runs rounds 0 and 1 alone (a is absent: both time out). */
    ds_gossip_round(gb, b, 0, ds_fakenet_io(net, 1));
    ds_gossip_round(gb, b, 1, ds_fakenet_io(net, 1));
    /* a now runs round 0: b is at round 2 and answers a's round-0 REQs. */
    ds_gossip_begin(gb, b, 2);
    ds_gossip_begin(ga, a, 0);
    ds_gossip_exchange(ga, ds_fakenet_io(net, 0)); /* sends its REQs, times out on b's */
    ds_gossip_exchange(gb, ds_fakenet_io(net, 1)); /* b sees round-0 REQs: answers */
    ds_gossip_end(gb, b);
    ds_gossip_end(ga, a);
    cr_expect_gt(ds_gossip_get_stats(gb)->answered, 0);
    cr_expect_eq(ds_gossip_get_stats(gb)->stale_sent, 0);
    /* a's next round applies those replies: they were for round 0. */
    ds_gossip_round(ga, a, 1, ds_fakenet_io(net, 0));
    cr_expect_gt(ds_gossip_get_stats(ga)->late_applied, 0);
    ds_gossip_destroy(&ga);
    ds_gossip_destroy(&gb);
    cr_expect_null(ga);
    free(a);
    free(b);
    ds_fakenet_destroy(net);
}

/* Node 0 of three on an instant fake network, in round 5 of view epoch
 * `epoch` (a 50 ms timeout); *x is its model. */
static ds_gossip *node0_in_round5(ds_fakenet **net, float **x, uint64_t epoch)
{
    make_layers();
    *net = ds_fakenet_create(3);
    ds_fakenet_set_instant(*net, 1);
    *x = calloc(n_params, 4);
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 50;
    ds_gossip *g;
    cr_assert_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, *x), 0);
    cr_assert_eq(ds_gossip_set_view(g, 3, 0, epoch), 0);
    cr_assert_eq(ds_gossip_begin(g, *x, 5), 0);
    return g;
}

/* Frames that carry another view epoch than this round's, older (dropped)
 * or newer (kept for later), name their sender to peer_view_differs: the
 * engine has membership compare notes with it. Frames of this epoch do
 * not. */
Test(gossip, a_frame_of_another_view_epoch_names_its_sender)
{
    ds_fakenet *net;
    float *x;
    ds_gossip *g = node0_in_round5(&net, &x, 7);
    const uint32_t idx[1] = {0};
    const float val[1] = {1.0f};
    const uint64_t epochs[3] = {3, 9, 7}; /* older from 1, newer from 2, ours from 1 */
    const uint32_t from[3] = {1, 2, 1};
    for (int k = 0; k < 3; k++) {
        ds_gmsg m = {.type = DS_GMSG_REQ, .from = from[k], .to = 0, .epoch = epochs[k],
                     .round = 5, .round_now = 5, .segment = 0,
                     .seg_len = (uint32_t)layers[0].len, .count = 1, .idx = idx, .val = val};
        const ds_gossip_io *io = ds_fakenet_io(net, from[k]);
        cr_assert_eq(io->send(io->ctx, &m, UINT64_MAX), 0);
    }
    ds_gossip_exchange(g, ds_fakenet_io(net, 0));
    ds_gossip_end(g, x);
    cr_expect_eq(ds_fakenet_view_differs(net, 1), 1, "node 1's frames: one of another epoch");
    cr_expect_eq(ds_fakenet_view_differs(net, 2), 1, "node 2's newer epoch");
    cr_expect_eq(ds_fakenet_view_differs(net, 0), 0);
    ds_gossip_destroy(&g);
    free(x);
    ds_fakenet_destroy(net);
}

/* A REQ from a node that was not our in-neighbour in that (past) round
 * is not ours to answer: it gets STALE, and the initiator closes its
 * exchange without applying anything. */
Test(gossip, past_request_from_a_stranger_gets_stale)
{
    ds_fakenet *net;
    float *x;
    ds_gossip *g = node0_in_round5(&net, &x, 1);
    const ds_gossip_cfg cfg = base_cfg(); /* its seed and topology */
    /* Find a (round, segment) in the past where node 1 was not our
     * in-neighbour, and send its REQ from node 1. */
    uint32_t scratch[3], in[3], target, n_in = 0;
    uint64_t r = 0;
    for (; r < 5; r++) {
        const ds_topo_key key = {cfg.seed, 1, r, 0};
        cr_assert_eq(ds_topo_peers(cfg.topology, &key, 3, 0, &target, in, &n_in, 3, scratch), 0);
        if (n_in == 0 || in[0] != 1)
            break;
    }
    cr_assert_lt(r, 5, "node 1 was our in-neighbour in every round");
    const uint32_t idx[1] = {0};
    const float val[1] = {1.0f};
    ds_gmsg m = {.type = DS_GMSG_REQ, .from = 1, .to = 0, .epoch = 1, .round = r,
                 .round_now = r, .segment = 0, .seg_len = (uint32_t)layers[0].len, .count = 1,
                 .idx = idx, .val = val};
    const ds_gossip_io *io1 = ds_fakenet_io(net, 1);
    cr_assert_eq(io1->send(io1->ctx, &m, UINT64_MAX), 0);
    ds_gossip_exchange(g, ds_fakenet_io(net, 0));
    ds_gossip_end(g, x);
    cr_expect_eq(ds_gossip_get_stats(g)->stale_sent, 1);
    cr_expect_eq(ds_gossip_get_stats(g)->answered, 0);
    ds_gossip_destroy(&g);
    free(x);
    ds_fakenet_destroy(net);
}

/* Local drift before a round (what the optimizer would add), kept in the
 * expected sum s0. */
static void drift(float *x, double *s0, uint64_t *seed)
{
    for (size_t j = 0; j < n_params; j++) {
        const float d = 0.01f * (float)((int64_t)(ds_t_next(seed) >> 40) - (1 << 23)) / (1 << 23);
        x[j] += d;
        s0[j] += d;
    }
}

struct step_arg {
    ds_gossip *g;
    float *x;
    uint64_t round;
    const ds_gossip_io *io;
};

static void *step_thread(void *p)
{
    struct step_arg *s = p;
    ds_gossip_round(s->g, s->x, s->round, s->io);
    return NULL;
}

/* One node runs 3 rounds behind the other: its REQs for rounds over at
 * the other are answered from the snapshot there, the other's that it
 * answers late apply in a later round, and once both are in step again
 * (every open exchange answered) the sum of the two models is what it
 * was, to float rounding. */
Test(gossip, lagging_partner_mixes_and_the_sum_holds)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(2);
    ds_fakenet_set_instant(net, 1);
    float *x[2];
    double *s0 = malloc(n_params * sizeof(double));
    for (int i = 0; i < 2; i++) {
        x[i] = malloc(n_params * sizeof(float));
        ds_t_fill(x[i], n_params, 91 + (uint64_t)i, -1, 1);
    }
    for (size_t j = 0; j < n_params; j++)
        s0[j] = (double)x[0][j] + x[1][j];
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 50;
    ds_gossip *g[2];
    for (uint32_t i = 0; i < 2; i++) {
        cfg.node_seed = 10 + i;
        cr_assert_eq(ds_gossip_create(&g[i], &cfg, layers, NL, n_params, x[i]), 0);
        cr_assert_eq(ds_gossip_set_view(g[i], 2, i, 1), 0);
    }
    const int lag = 3, R = 12;
    uint64_t seed = 99;
    for (int r = 0; r < R; r++) {
        drift(x[0], s0, &seed);
        ds_gossip_round(g[0], x[0], (uint64_t)r, ds_fakenet_io(net, 0));
        if (r >= lag) {
            drift(x[1], s0, &seed);
            ds_gossip_round(g[1], x[1], (uint64_t)(r - lag), ds_fakenet_io(net, 1));
        }
    }
    for (int r = R - lag; r < R; r++)
        ds_gossip_round(g[1], x[1], (uint64_t)r, ds_fakenet_io(net, 1));
    /* In step: rounds with both waiting for each other, at least two,
     * until one passes with no exchange timed out on either side (on a
     * loaded machine a thread held off the CPU past the adaptive deadline
     * leaves a reply for the next round to apply: the sum holds only once
     * one has; bounded). */
    ds_fakenet_set_instant(net, 0);
    uint64_t r = R, tmo = UINT64_MAX;
    for (; r < R + 40; r++) {
        const uint64_t now = ds_gossip_get_stats(g[0])->timeouts +
                             ds_gossip_get_stats(g[1])->timeouts;
        if (r >= R + 2 && now == tmo)
            break;
        tmo = now;
        pthread_t th[2];
        struct step_arg sa[2];
        for (uint32_t i = 0; i < 2; i++) {
            sa[i] = (struct step_arg){g[i], x[i], r, ds_fakenet_io(net, i)};
            pthread_create(&th[i], NULL, step_thread, &sa[i]);
        }
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
    }
    const ds_gossip_stats *a = ds_gossip_get_stats(g[0]), *b = ds_gossip_get_stats(g[1]);
    cr_expect_gt(a->late_applied + b->late_applied, 0, "no reply came late");
    cr_expect_eq(a->late_lost + b->late_lost, 0);
    cr_expect_eq(a->late + b->late, 0, "a reply found no open exchange");
    /* Each round rounds each value a few times (drift, mixing); a lost
     * half of one exchange would move the sum by w |x_b - x_a|, some
     * 10^5 rounding units here. */
    cr_assert_lt(r, R + 40, "exchanges still timing out after 40 rounds in step");
    const double units = 8.0 * (double)(r + lag);
    double worst = 0;
    for (size_t j = 0; j < n_params; j++) {
        const double e = fabs((double)x[0][j] + x[1][j] - s0[j]) /
                         ((fabs(x[0][j]) + fabs(x[1][j])) * FLT_EPSILON * units + 1e-30);
        if (e > worst)
            worst = e;
    }
    cr_expect_lt(worst, 1.0, "the sum moved by %.2f x %.0f rounding units", worst, units);
    for (int i = 0; i < 2; i++) {
        ds_gossip_destroy(&g[i]);
        free(x[i]);
    }
    free(s0);
    ds_fakenet_destroy(net);
}

typedef struct ared_arg {
    ds_gossip *g;
    ds_fakenet *net;
    uint32_t me;
    float *grad;
    int ret;
} ared_arg;

static void *ared_work(void *p)
{
    ared_arg *a = p;
    for (int step = 0; step < 3; step++)
        a->ret |= ds_gossip_allreduce(a->g, a->grad, n_params, (uint64_t)step, ds_fakenet_io(a->net, a->me));
    return NULL;
}

Test(gossip, allreduce_gives_the_mean)
{
    make_layers();
    for (uint32_t G = 2; G <= 5; G++) {
        ds_fakenet *net = ds_fakenet_create(G);
        ared_arg args[MAXG];
        pthread_t th[MAXG];
        float *want = calloc(n_params, sizeof(float));
        ds_gossip_cfg cfg = base_cfg();
        cfg.topology = DS_TOPO_ALLREDUCE;
        for (uint32_t i = 0; i < G; i++) {
            args[i].grad = malloc(n_params * sizeof(float));
            ds_t_fill(args[i].grad, n_params, 900 + i, -1, 1);
            cr_assert_eq(ds_gossip_create(&args[i].g, &cfg, layers, NL, n_params, args[i].grad), 0);
            ds_gossip_set_view(args[i].g, G, i, 1);
            args[i].net = net;
            args[i].me = i;
            args[i].ret = 0;
        }
        /* Three steps: mean of the mean of the mean is still the mean. */
        for (size_t j = 0; j < n_params; j++) {
            double s = 0;
            for (uint32_t i = 0; i < G; i++)
                s += args[i].grad[j];
            want[j] = (float)(s / G);
        }
        for (uint32_t i = 0; i < G; i++)
            pthread_create(&th[i], NULL, ared_work, &args[i]);
        for (uint32_t i = 0; i < G; i++)
            pthread_join(th[i], NULL);
        for (uint32_t i = 0; i < G; i++) {
            cr_expect_eq(args[i].ret, 0);
            cr_expect(ds_t_close("allreduce", G, args[i].grad, want, n_params, 1e-6, 1e-5), "G=%u node %u", G, i);
            ds_gossip_destroy(&args[i].g);
            free(args[i].grad);
        }
        free(want);
        ds_fakenet_destroy(net);
    }
}

/* One node starts the all-reduce a whole deadline after the others (a
 * node whose training began late): its first reduction is lost with the
 * others', and from the next on the ring is whole again. Before, the late
 * node waited out each deadline in a step its neighbours had left while
 * they waited for it in the next: every reduction failed for good. */
typedef struct late_arg {
    ds_gossip *g;
    ds_fakenet *net;
    uint32_t me;
    float *grad;
    int late;           /* start once the others are past step 0 */
    atomic_int *past0;  /* nodes that have finished step 0 */
    int ret[6];
} late_arg;

static void *late_work(void *p)
{
    late_arg *a = p;
    while (a->late && atomic_load(a->past0) < 3)
        sched_yield();
    for (int step = 0; step < 6; step++) {
        a->ret[step] = ds_gossip_allreduce(a->g, a->grad, n_params, (uint64_t)step,
                                           ds_fakenet_io(a->net, a->me));
        if (step == 0)
            atomic_fetch_add(a->past0, 1);
    }
    return NULL;
}

Test(gossip, allreduce_recovers_from_a_late_node)
{
    make_layers();
    const uint32_t G = 4;
    ds_fakenet *net = ds_fakenet_create(G);
    ds_gossip_cfg cfg = base_cfg();
    cfg.topology = DS_TOPO_ALLREDUCE;
    cfg.timeout_ms = 100;
    /* Every wait 20x as long in real time as on the fake clock: a thread
     * the machine stalls (sanitizers, a loaded host) still delivers in
     * time; the clock, not the wall, says who missed what. */
    ds_fakenet_set_patience(net, 20);
    atomic_int past0 = 0;
    late_arg a[4];
    pthread_t th[4];
    for (uint32_t i = 0; i < G; i++) {
        a[i] = (late_arg){.net = net, .me = i, .late = i == 2, .past0 = &past0};
        a[i].grad = malloc(n_params * sizeof(float));
        ds_t_fill(a[i].grad, n_params, 700 + i, -1, 1);
        cr_assert_eq(ds_gossip_create(&a[i].g, &cfg, layers, NL, n_params, a[i].grad), 0);
        ds_gossip_set_view(a[i].g, G, i, 1);
    }
    for (uint32_t i = 0; i < G; i++)
        pthread_create(&th[i], NULL, late_work, &a[i]);
    for (uint32_t i = 0; i < G; i++)
        pthread_join(th[i], NULL);
    for (uint32_t i = 0; i < G; i++) {
        if (i != 2)
            cr_expect_lt(a[i].ret[0], 0, "node %u: step 0 without node 2", i);
        for (int step = 2; step < 6; step++)
            cr_expect_eq(a[i].ret[step], 0, "node %u: step %d failed (%d)", i, step,
                         a[i].ret[step]);
        /* The same reductions at the end: the same gradient everywhere. */
        cr_expect_eq(memcmp(a[i].grad, a[0].grad, n_params * sizeof(float)), 0, "node %u", i);
    }
    for (uint32_t i = 0; i < G; i++) {
        ds_gossip_destroy(&a[i].g);
        free(a[i].grad);
    }
    ds_fakenet_destroy(net);
}

Test(gossip, bad_arguments)
{
    make_layers();
    float *t = calloc(n_params, 4);
    ds_gossip *g;
    ds_gossip_cfg cfg = base_cfg();
    cfg.weight = 0.6f;
    cr_expect_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, t), -EINVAL);
    cfg = base_cfg();
    cfg.mix = DS_MIX_CROSSOVER; /* dense only */
    cr_expect_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, t), -EINVAL);
    cfg = base_cfg();
    cr_assert_eq(ds_gossip_create(&g, &cfg, layers, NL, n_params, t), 0);
    cr_expect_eq(ds_gossip_begin(g, t, 0), -EINVAL, "no view yet");
    cr_expect_eq(ds_gossip_set_view(g, 3, 3, 1), -EINVAL);
    cr_expect_eq(ds_gossip_set_view(g, 0, 0, 1), -EINVAL);
    ds_gossip_destroy(&g);
    free(t);
}

/* ---- latency.h: the adaptive deadline and slow partners ---------------- */

#define MS 1000000ull

static ds_glat glat_default(uint32_t G)
{
    ds_glat t;
    ds_glat_cfg cfg;
    ds_glat_cfg_default(&cfg, 2000, 0);
    cr_assert_eq(ds_glat_init(&t, &cfg), 0);
    cr_assert_eq(ds_glat_set_view(&t, G), 0);
    return t;
}

/* A seeded latency in [lo, hi) ms. */
static uint64_t seeded_ms(uint64_t *st, uint64_t lo, uint64_t hi)
{
    return lo * MS + ds_t_next(st) % ((hi - lo) * MS);
}

Test(gossip, latency_deadline_follows_the_median_within_bounds)
{
    ds_glat t = glat_default(4);
    cr_expect_eq(ds_glat_deadline_ns(&t), 2000 * MS, "no samples: the timeout");
    for (int i = 0; i < 3; i++)
        ds_glat_round(&t, 10 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 2000 * MS, "too few samples: the timeout");
    ds_glat_round(&t, 10 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 40 * MS, "4 x the median");
    for (int i = 0; i < DS_GLAT_ROUNDS; i++)
        ds_glat_round(&t, 2 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 10 * MS, "4 x 2 ms is under the floor (10 ms)");
    for (int i = 0; i < DS_GLAT_ROUNDS; i++)
        ds_glat_round(&t, 50 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 200 * MS, "4 x the median");
    /* A few rounds cut at the timeout (a crash) do not move the median. */
    for (int i = 0; i < 5; i++)
        ds_glat_round(&t, 2000 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 200 * MS);
    for (int i = 0; i < DS_GLAT_ROUNDS; i++)
        ds_glat_round(&t, 900 * MS);
    cr_expect_eq(ds_glat_deadline_ns(&t), 2000 * MS, "never over the timeout");
    ds_glat_free(&t);
}

/* Two of three partners slow: this node is the one ahead (a partition's
 * halves meet rounds apart), so nobody is flagged and it waits for them.
 * Flagging the majority let one node run alone to the end of its run. */
Test(gossip, latency_slow_majority_is_waited_for)
{
    ds_glat t = glat_default(4); /* me = 0, partners 1..3 */
    uint64_t st = 2027;
    for (int i = 0; i < DS_GLAT_PEER; i++) {
        ds_glat_peer(&t, 1, seeded_ms(&st, 1, 4));
        ds_glat_peer(&t, 2, seeded_ms(&st, 20, 60));
        ds_glat_peer(&t, 3, seeded_ms(&st, 20, 60));
    }
    for (uint32_t p = 1; p <= 3; p++)
        cr_expect_eq(ds_glat_slow(&t, p), 0, "partner %u flagged: median %llu ns", p,
                     (unsigned long long)ds_glat_peer_median(&t, p));
    ds_glat_free(&t);
}

Test(gossip, latency_slow_partner_is_found_and_forgiven)
{
    ds_glat t = glat_default(4); /* me = 0, partners 1..3 */
    uint64_t st = 2026;
    for (int i = 0; i < DS_GLAT_PEER; i++) {
        ds_glat_peer(&t, 1, seeded_ms(&st, 1, 4));
        ds_glat_peer(&t, 2, seeded_ms(&st, 1, 4));
        ds_glat_peer(&t, 3, seeded_ms(&st, 20, 60));
        if (i < 3)
            cr_expect_eq(ds_glat_slow(&t, 3), 0, "slow after %d samples", i + 1);
    }
    cr_expect_eq(ds_glat_slow(&t, 3), 1, "3: median %llu ns", 
                 (unsigned long long)ds_glat_peer_median(&t, 3));
    cr_expect_eq(ds_glat_slow(&t, 1), 0);
    cr_expect_eq(ds_glat_slow(&t, 2), 0);
    /* One fast reply does not clear it; a window of fast replies does. */
    ds_glat_peer(&t, 3, 2 * MS);
    cr_expect_eq(ds_glat_slow(&t, 3), 1);
    for (int i = 0; i < DS_GLAT_PEER - 1; i++)
        ds_glat_peer(&t, 3, seeded_ms(&st, 1, 4));
    cr_expect_eq(ds_glat_slow(&t, 3), 0, "fast again: waited for again");
    /* Hysteresis: 2.5x the others does not make it slow, but does not
     * clear a slow one either; under 1.5x does. */
    for (int i = 0; i < DS_GLAT_PEER; i++) {
        ds_glat_peer(&t, 1, 10 * MS);
        ds_glat_peer(&t, 2, 10 * MS);
    }
    const uint64_t m = 10 * MS;
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 3, m * 7 / 2);
    cr_expect_eq(ds_glat_slow(&t, 3), 1, "over 3x: slow");
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 3, m * 2);
    cr_expect_eq(ds_glat_slow(&t, 3), 1, "2x: still slow");
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 3, m * 11 / 10);
    cr_expect_eq(ds_glat_slow(&t, 3), 0, "1.1x: cleared");
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 3, m * 2);
    cr_expect_eq(ds_glat_slow(&t, 3), 0, "2x: not slow again");
    /* A new view forgets who was slow. */
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 3, 80 * MS);
    cr_expect_eq(ds_glat_slow(&t, 3), 1);
    cr_assert_eq(ds_glat_set_view(&t, 4), 0);
    cr_expect_eq(ds_glat_slow(&t, 3), 0);
    ds_glat_free(&t);
}

/* A lossy link: most replies as fast as the others', one in three held
 * 200 ms by a retransmission. Its median looks healthy, but every round
 * that waits for it pays the retransmissions: slow. */
Test(gossip, latency_lossy_partner_is_slow)
{
    ds_glat t = glat_default(4); /* me = 0, partners 1..3 */
    uint64_t st = 2028;
    for (int i = 0; i < DS_GLAT_PEER; i++) {
        ds_glat_peer(&t, 1, seeded_ms(&st, 1, 4));
        ds_glat_peer(&t, 2, seeded_ms(&st, 1, 4));
        ds_glat_peer(&t, 3, i % 3 == 1 ? 200 * MS + seeded_ms(&st, 0, 20) : seeded_ms(&st, 1, 4));
    }
    cr_expect_leq(ds_glat_peer_median(&t, 3), 4 * MS, "the median should look healthy");
    cr_expect_eq(ds_glat_slow(&t, 3), 1, "mean %llu ns",
                 (unsigned long long)ds_glat_peer_mean(&t, 3));
    cr_expect_eq(ds_glat_slow(&t, 1), 0);
    ds_glat_free(&t);
}

Test(gossip, latency_noise_and_lone_partners_are_not_slow)
{
    ds_glat t = glat_default(4);
    uint64_t st = 7;
    /* 10x the others, but all under a few milliseconds: no straggler. */
    for (int i = 0; i < DS_GLAT_PEER; i++) {
        ds_glat_peer(&t, 1, 300000 + ds_t_next(&st) % 100000);
        ds_glat_peer(&t, 2, 300000 + ds_t_next(&st) % 100000);
        ds_glat_peer(&t, 3, 4 * MS);
    }
    cr_expect_eq(ds_glat_slow(&t, 3), 0);
    ds_glat_free(&t);
    /* A single partner has nobody to be slower than. */
    t = glat_default(2);
    for (int i = 0; i < DS_GLAT_PEER; i++)
        ds_glat_peer(&t, 1, 500 * MS);
    cr_expect_eq(ds_glat_slow(&t, 1), 0);
    ds_glat_peer(&t, 7, MS); /* out of the view: ignored */
    cr_expect_eq(ds_glat_slow(&t, 7), 0);
    ds_glat_free(&t);
}

/* A link that cannot keep up gets a share of k, and earns it back. The
 * loop is closed as on a real link: partner 3's exchange takes 1 ms plus
 * its share of 40 ms (a full exchange through a slow link), rounds start
 * every 5 ms (target: 2 x that, 10 ms), partners 1 and 2 answer in 1-3
 * ms. Without the share every exchange with 3 takes 41 ms. */
Test(gossip, latency_a_slow_link_carries_a_share_and_earns_it_back)
{
    ds_glat t = glat_default(4);
    uint64_t st = 1606;
    cr_expect_eq(ds_glat_share(&t, 3), 1.0f, "no samples: the whole of k");
    double late_sum = 0;
    float lo = 1.0f, hi = 0.0f;
    for (int r = 0; r < 400; r++) {
        ds_glat_period(&t, seeded_ms(&st, 4, 6));
        ds_glat_peer(&t, 1, seeded_ms(&st, 1, 3));
        ds_glat_peer(&t, 2, seeded_ms(&st, 1, 3));
        const uint64_t l3 = MS + (uint64_t)(ds_glat_peer_share(&t, 3) * 40.0f * MS) +
                            ds_t_next(&st) % MS;
        ds_glat_peer(&t, 3, l3);
        for (uint32_t p = 1; p <= 2; p++)
            cr_assert_eq(ds_glat_share(&t, p), 1.0f, "round %d: fast partner %u cut", r, p);
        const float s3 = ds_glat_share(&t, 3);
        cr_assert_geq(s3, DS_GLAT_SHARE_MIN, "round %d", r);
        cr_assert_leq(s3, 1.0f, "round %d", r);
        if (r >= 200) {
            late_sum += (double)l3;
            lo = fminf(lo, s3);
            hi = fmaxf(hi, s3);
        }
    }
    const double mean_ms = late_sum / 200 / MS;
    cr_log_info("slow link: share %.3f..%.3f, mean exchange %.1f ms", lo, hi, mean_ms);
    cr_expect_leq(mean_ms, 20.0, "exchanges with the slow link still take %.1f ms", mean_ms);
    cr_expect_leq(hi, 0.5f, "the share came back to %.3f on a link that cannot carry it", hi);
    cr_expect_gt(lo, DS_GLAT_SHARE_MIN, "the share sank to its floor on a link that carries "
                 "a fifth of k in time");
    /* The link is fast again: the whole of k within 200 rounds (1/32
     * to 1 at 1.25x per 4 samples takes 64). */
    int back = -1;
    for (int r = 0; r < 200 && back < 0; r++) {
        ds_glat_period(&t, seeded_ms(&st, 4, 6));
        ds_glat_peer(&t, 3, seeded_ms(&st, 1, 3));
        if (ds_glat_share(&t, 3) == 1.0f)
            back = r;
    }
    cr_expect_geq(back, 0, "share %.3f after 200 fast rounds", ds_glat_peer_share(&t, 3));
    /* A new view: the partners are other nodes, every share starts whole. */
    for (int r = 0; r < 40; r++)
        ds_glat_peer(&t, 3, 200 * MS);
    cr_expect_lt(ds_glat_share(&t, 3), 1.0f);
    cr_assert_eq(ds_glat_set_view(&t, 4), 0);
    cr_expect_eq(ds_glat_peer_share(&t, 3), 1.0f);
    ds_glat_free(&t);
}

/* The trim keeps the largest |acc| entries, in order, exactly
 * ceil(share x count) of them (ties: the first), and nothing else moves;
 * seeded, with ties. */
Test(gossip, a_trimmed_exchange_keeps_the_largest_entries_in_order)
{
    uint64_t st = 42;
    enum { N = 257 };
    uint32_t idx[N], idx0[N];
    float stash[N], stash0[N], scratch[N];
    const float shares[] = {1.0f, 0.5f, 0.25f, 1.0f / 32, 0.001f, 0.9999f};
    for (size_t c = 0; c < sizeof(shares) / sizeof(shares[0]); c++) {
        for (uint32_t i = 0; i < N; i++) {
            idx0[i] = idx[i] = 3 * i + (uint32_t)(ds_t_next(&st) % 3);
            /* Magnitudes on a grid of 16 values: many ties; both signs. */
            const float m = (float)(1 + ds_t_next(&st) % 16) / 16.0f;
            stash0[i] = stash[i] = (ds_t_next(&st) & 1) ? m : -m;
        }
        const size_t k = ds_gossip_trim(idx, stash, N, shares[c], scratch);
        size_t want = (size_t)ceilf(shares[c] * (float)N);
        if (want < 1)
            want = 1;
        if (want > N)
            want = N;
        cr_assert_eq(k, want, "share %g: kept %zu", shares[c], k);
        /* A subsequence of the original, in order. */
        size_t j = 0;
        float kept_min = INFINITY;
        for (size_t i = 0; i < k; i++) {
            while (j < N && idx0[j] != idx[i])
                j++;
            cr_assert_lt(j, N, "share %g: entry %zu out of order or made up", shares[c], i);
            cr_assert_eq(stash[i], stash0[j], "share %g: value of entry %zu moved", shares[c], i);
            kept_min = fminf(kept_min, fabsf(stash[i]));
            j++;
        }
        /* Nothing left out is larger than what was kept. */
        size_t above = 0;
        for (uint32_t i = 0; i < N; i++)
            above += fabsf(stash0[i]) > kept_min;
        cr_assert_leq(above, k, "share %g: a larger entry was left out", shares[c]);
    }
    /* Nothing to cut. */
    idx[0] = 5;
    stash[0] = 1.0f;
    cr_expect_eq(ds_gossip_trim(idx, stash, 1, 0.1f, scratch), 1);
    cr_expect_eq(ds_gossip_trim(idx, stash, 0, 0.1f, scratch), 0);
}

/* Node 0's targets in a round: how many segments initiate to `to`. */
static int segments_to(uint32_t G, uint64_t round, uint32_t to)
{
    const ds_gossip_cfg cfg = base_cfg();
    int k = 0;
    for (uint32_t s = 0; s < NL; s++) {
        const ds_topo_key key = {cfg.seed, 1, round, s};
        uint32_t target, in[MAXG], n_in = 0, scratch[MAXG];
        cr_assert_eq(ds_topo_peers(cfg.topology, &key, G, 0, &target, in, &n_in, MAXG, scratch), 0);
        k += target == to;
    }
    return k;
}

/* A REQ that waited at its responder while the responder waited on
 * others: that wait is not the link's (held_us in the RESP). Three nodes
 * on the fake clock (instant: every wait runs out at once; every deadline
 * 50 ms), node 2 silent. Node 0 sends round 1's REQs at t=0 and waits to
 * 50 ms. Node 1, in round 0, queues those meant for it and waits on node
 * 2 to 100 ms: it held them 50 ms on a wait that was not node 0's. It
 * answers them when its round 1 begins and waits on node 2 again, to
 * 150 ms. Node 0 reads the replies in round 2, at 150 ms: each is a
 * 150 - 50 = 100 ms sample (150 ms without the subtraction). The other
 * samples node 0 has of node 1 are waits cut at 50 ms (rounds 1, 2). */
Test(gossip, time_held_on_others_is_not_the_link)
{
    make_layers();
    ds_fakenet *net = ds_fakenet_create(3);
    ds_fakenet_set_instant(net, 1);
    float *x[2];
    ds_gossip *g[2];
    ds_gossip_cfg cfg = base_cfg();
    cfg.timeout_ms = 50;
    for (uint32_t i = 0; i < 2; i++) {
        x[i] = malloc(n_params * sizeof(float));
        ds_t_fill(x[i], n_params, 7 + (uint64_t)i, -1, 1);
        cfg.node_seed = 30 + i;
        cr_assert_eq(ds_gossip_create(&g[i], &cfg, layers, NL, n_params, x[i]), 0);
        cr_assert_eq(ds_gossip_set_view(g[i], 3, i, 1), 0);
    }
    const int k1 = segments_to(3, 1, 1), k2 = segments_to(3, 2, 1);
    cr_assert_gt(k1, 0, "seed 42 pairs node 0 with node 1 in no segment of round 1");
    /* Local drift before each round, so that every REQ carries values. */
    double *s0 = calloc(n_params, sizeof(double));
    uint64_t seed = 5;
    drift(x[0], s0, &seed);
    ds_gossip_round(g[0], x[0], 1, ds_fakenet_io(net, 0));
    drift(x[1], s0, &seed);
    ds_gossip_round(g[1], x[1], 0, ds_fakenet_io(net, 1));
    drift(x[1], s0, &seed);
    ds_gossip_round(g[1], x[1], 1, ds_fakenet_io(net, 1));
    cr_assert_eq(ds_fakenet_now_ns(net), 150 * MS, "the fake clock at %llu ns",
                 (unsigned long long)ds_fakenet_now_ns(net));
    drift(x[0], s0, &seed);
    ds_gossip_round(g[0], x[0], 2, ds_fakenet_io(net, 0));
    free(s0);
    cr_expect_eq(ds_gossip_get_stats(g[0])->late_applied, (uint64_t)k1);
    /* The samples in order; the ring keeps the last DS_GLAT_PEER. */
    uint64_t v[3 * NL];
    int n = 0;
    for (int i = 0; i < k1; i++)
        v[n++] = 50 * MS;
    for (int i = 0; i < k1; i++)
        v[n++] = 100 * MS;
    for (int i = 0; i < k2; i++)
        v[n++] = 50 * MS;
    const int first = n > DS_GLAT_PEER ? n - DS_GLAT_PEER : 0;
    uint64_t sum = 0;
    for (int i = first; i < n; i++)
        sum += v[i];
    const uint64_t want = sum / (uint64_t)(n - first);
    cr_expect_eq(ds_gossip_partner_link_ns(g[0], 1), want, "node 1's mean: %llu ns, want %llu",
                 (unsigned long long)ds_gossip_partner_link_ns(g[0], 1),
                 (unsigned long long)want);
    for (int i = 0; i < 2; i++) {
        ds_gossip_destroy(&g[i]);
        free(x[i]);
    }
    ds_fakenet_destroy(net);
}

/* Pacing: ahead means more than `slack` rounds past the lower median of
 * the view's rounds; against a plain count on seeded views. */
Test(gossip, pacing_follows_the_view_median)
{
    uint64_t one[1] = {0};
    cr_expect_eq(ds_glat_ahead(100, one, 1, 8), 0, "alone is never ahead");
    uint64_t heal[4] = {100, 101, 40, 42}; /* a partition's halves meet */
    cr_expect_eq(ds_glat_ahead(100, heal, 4, 8), 1);
    uint64_t strag[4] = {100, 0, 99, 101}; /* one straggler */
    cr_expect_eq(ds_glat_ahead(100, strag, 4, 8), 0);
    uint64_t edge[2] = {20, 12};
    cr_expect_eq(ds_glat_ahead(20, edge, 2, 8), 0, "exactly slack ahead is in step");
    uint64_t edge2[2] = {21, 12};
    cr_expect_eq(ds_glat_ahead(21, edge2, 2, 8), 1);
    uint64_t st = 77;
    for (int t = 0; t < 2000; t++) {
        uint64_t v[MAXG + 1], c[MAXG + 1];
        const uint32_t n = 1 + (uint32_t)(ds_t_next(&st) % (MAXG + 1));
        const uint64_t mine = 1000 + ds_t_next(&st) % 64;
        v[0] = mine;
        for (uint32_t i = 1; i < n; i++)
            v[i] = 990 + ds_t_next(&st) % 84;
        memcpy(c, v, sizeof(v));
        uint32_t below = 0; /* rounds more than 8 behind mine */
        for (uint32_t i = 0; i < n; i++)
            below += c[i] + 8 < mine;
        const int want = n >= 2 && below >= (n - 1) / 2 + 1;
        cr_assert_eq(ds_glat_ahead(mine, v, n, 8), want, "case %d: n=%u below=%u", t, n, below);
    }
}

/* The engine holds a round while it is far ahead of its only partner,
 * and not while it is near. */
Test(gossip, node_far_ahead_of_its_view_holds)
{
    make_layers();
    for (int far = 0; far < 2; far++) {
        ds_fakenet *net = ds_fakenet_create(2);
        ds_fakenet_set_instant(net, 1);
        float *x[2];
        ds_gossip *g[2];
        ds_gossip_cfg cfg = base_cfg();
        cfg.timeout_ms = 50;
        for (uint32_t i = 0; i < 2; i++) {
            x[i] = malloc(n_params * sizeof(float));
            ds_t_fill(x[i], n_params, 5 + (uint64_t)i, -1, 1);
            cfg.node_seed = 20 + i;
            cr_assert_eq(ds_gossip_create(&g[i], &cfg, layers, NL, n_params, x[i]), 0);
            cr_assert_eq(ds_gossip_set_view(g[i], 2, i, 1), 0);
        }
        for (uint64_t r = 0; r < 3; r++)
            ds_gossip_round(g[1], x[1], r, ds_fakenet_io(net, 1));
        ds_gossip_round(g[0], x[0], far ? 30 : 9, ds_fakenet_io(net, 0));
        const ds_gossip_stats *a = ds_gossip_get_stats(g[0]);
        cr_expect_eq(a->paced, (uint64_t)far, "%s: paced %llu", far ? "far" : "near",
                     (unsigned long long)a->paced);
        cr_expect_eq(ds_gossip_get_stats(g[1])->paced, 0, "the node behind held");
        for (int i = 0; i < 2; i++) {
            ds_gossip_destroy(&g[i]);
            free(x[i]);
        }
        ds_fakenet_destroy(net);
    }
}

/* An io over the fake network whose waits last until their message comes
 * (up to PATIENT_MS of real time), whatever the engine's deadline: a
 * partner thread that the machine has not scheduled yet is not a wait
 * run out. As in dsbench scale, the fake clock moves only when such a
 * wait runs out. */
#define PATIENT_MS 2000u
#define STEP_G 32

static int patient_send(void *ctx, const ds_gmsg *m, uint64_t deadline_ns)
{
    const ds_gossip_io *in = ctx;
    return in->send(in->ctx, m, deadline_ns);
}

static int patient_recv(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    const ds_gossip_io *in = ctx;
    const uint64_t now = in->now_ns(in->ctx);
    if (deadline_ns > now)
        deadline_ns = now + (uint64_t)PATIENT_MS * 1000000u;
    return in->recv(in->ctx, m, deadline_ns);
}

static uint64_t patient_now(void *ctx)
{
    const ds_gossip_io *in = ctx;
    return in->now_ns(in->ctx);
}

typedef struct lockstep {
    uint32_t G;
    int rounds;
    ds_gossip *g[STEP_G];
    float *x[STEP_G];
    ds_gossip_io io[STEP_G];
    pthread_barrier_t bar;
} lockstep;

typedef struct lockstep_arg {
    lockstep *l;
    uint32_t me;
} lockstep_arg;

static void *lockstep_work(void *p)
{
    lockstep_arg *a = p;
    lockstep *l = a->l;
    uint64_t seed = 300 + a->me;
    for (int r = 0; r < l->rounds; r++) {
        for (size_t j = 0; j < n_params; j++) /* drift: REQs that are not empty */
            l->x[a->me][j] += 0.01f * (float)((int64_t)(ds_t_next(&seed) >> 40) - (1 << 23)) /
                              (1 << 23);
        pthread_barrier_wait(&l->bar);
        cr_assert_eq(ds_gossip_round(l->g[a->me], l->x[a->me], (uint64_t)r, &l->io[a->me]), 0);
    }
    return NULL;
}

/* 32 nodes in lock-step (a barrier before every round), one segment: a
 * node exchanges with two partners a round and hears from the others
 * only now and then. A partner last heard rounds ago, in step then, is
 * still in step: no node is ahead of its view, none holds a round and no
 * wait runs out. Before, a partner counted at the round it was last heard
 * in for a whole timeout, so after some 16 rounds most of a node's view
 * looked over 8 rounds behind and nodes held their rounds to the deadline
 * for partners that were not behind at all (dsbench scale's waits that
 * ran out, crossover with one segment at 64 nodes: docs/benchmarks.md,
 * "Issue 18"). */
Test(gossip, partners_heard_rounds_ago_in_step_are_not_behind)
{
    make_layers();
    lockstep l = {.G = STEP_G, .rounds = 24};
    ds_fakenet *net = ds_fakenet_create(l.G);
    ds_gossip_cfg cfg = base_cfg();
    cfg.segments = 1;
    cfg.timeout_ms = 60000; /* partners stay heard-from the whole test */
    for (uint32_t i = 0; i < l.G; i++) {
        l.x[i] = malloc(n_params * sizeof(float));
        ds_t_fill(l.x[i], n_params, 700 + i, -1, 1);
        cfg.node_seed = 900 + i;
        cr_assert_eq(ds_gossip_create(&l.g[i], &cfg, layers, NL, n_params, l.x[i]), 0);
        cr_assert_eq(ds_gossip_set_view(l.g[i], l.G, i, 1), 0);
        l.io[i] = (ds_gossip_io){.ctx = (void *)ds_fakenet_io(net, i), .send = patient_send,
                                 .recv = patient_recv, .now_ns = patient_now};
    }
    pthread_barrier_init(&l.bar, NULL, l.G);
    pthread_t th[STEP_G];
    lockstep_arg arg[STEP_G];
    for (uint32_t i = 0; i < l.G; i++) {
        arg[i] = (lockstep_arg){&l, i};
        cr_assert_eq(pthread_create(&th[i], NULL, lockstep_work, &arg[i]), 0);
    }
    for (uint32_t i = 0; i < l.G; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&l.bar);
    uint64_t paced = 0, failed = 0, ok = 0;
    for (uint32_t i = 0; i < l.G; i++) {
        const ds_gossip_stats *st = ds_gossip_get_stats(l.g[i]);
        paced += st->paced;
        failed += st->exchanges_failed;
        ok += st->exchanges_ok;
    }
    cr_expect_eq(paced, 0, "%llu rounds held for partners in step", (unsigned long long)paced);
    cr_expect_eq(ds_fakenet_timeouts(net), 0, "%llu waits ran out",
                 (unsigned long long)ds_fakenet_timeouts(net));
    cr_expect_eq(ds_fakenet_now_ns(net), 0, "%d rounds took %llu ms of the fake clock", l.rounds,
                 (unsigned long long)(ds_fakenet_now_ns(net) / 1000000u));
    cr_expect_eq(failed, 0);
    cr_expect_eq(ok, (uint64_t)l.G * (uint64_t)l.rounds, "one exchange a node and round");
    for (uint32_t i = 0; i < l.G; i++) {
        ds_gossip_destroy(&l.g[i]);
        free(l.x[i]);
    }
    ds_fakenet_destroy(net);
}

Test(gossip, latency_bad_config_refused)
{
    ds_glat t;
    ds_glat_cfg cfg;
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.floor_ns = cfg.ceil_ns + 1;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.factor = 0.5;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.slow_ratio = 1.0;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.clear_ratio = cfg.slow_ratio + 1;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.share_factor = 0;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 2000, 0);
    cfg.share_up = 1.0;
    cr_expect_eq(ds_glat_init(&t, &cfg), -EINVAL);
    ds_glat_cfg_default(&cfg, 5, 0);
    cr_expect_eq(cfg.floor_ns, 5 * MS, "the floor is never over the timeout");
    cr_expect_eq(ds_glat_init(&t, &cfg), 0);
    ds_glat_free(&t);
}
