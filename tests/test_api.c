/*
 * tests/test_api.c: libdsnode's public API (include/dsnode/dsnode.h),
 * linked as a program would link it (the shared library), on the
 * in-process transport (transport.provider = inproc).
 *
 * Suite "api" (meson suite unit):
 *   - the ABI check at open, version strings;
 *   - open: a config file with a bad value names file:line and key; a bad
 *     override names itself; a missing file, a missing key file; a good
 *     config without a file; close twice (the second does nothing);
 *   - every call before its turn says which call is missing; every call
 *     after a failure is refused; register refuses bad layer tables, NULL
 *     buffers, topology allreduce, an unusable node.data_dir; leave
 *     refuses an unknown outcome;
 *   - join: stopped before it (-EINTR), a seed nobody runs (-ETIMEDOUT);
 *   - dsnode_handle_signals: SIGTERM stops the engine, a second engine
 *     is refused (-EBUSY), close puts the program's handler back;
 *   - two engines in one process (two threads, as two programs): open,
 *     register, join, 300 steps each drifting its own way, leave, close;
 *     the gossip rounds keep the sum of the two models and hold them
 *     together (under half the distance they drift apart alone); model.bin is written; the
 *     stats count rounds and exchanges; the exit status is 0;
 *   - host mirrors (dsnode_register_copies) of a "device" the engine never
 *     sees: it pulls before it reads and pushes after it writes; model.bin
 *     and the checkpoint hold the device's parameters; order and buffer
 *     checks;
 *   - dsnode_checkpoint and dsnode_resume: the program's bytes and step
 *     come back to its restore; a refusal, a missing file, a second call,
 *     calls out of order; DSNODE_PAUSED exits 0; a failing pull at leave
 *     fails the run; dsnode_set_backend; dsnode_abandon.
 */
#include <criterion/criterion.h>
#include <dsnode/dsnode.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/sec/crypto.h"
#include "node/sec/keys.h"

static char g_dir[256];
static char g_key[300];

static void setup(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/ds_test_api.XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_key, sizeof(g_key), "%s/cluster.key", g_dir);
    cr_assert_eq(ds_crypto_init(), 0);
    ds_cluster_key k;
    char err[256];
    cr_assert_eq(ds_cluster_key_generate(&k), 0);
    cr_assert_eq(ds_cluster_key_save(&k, g_key, 0, err, sizeof(err)), 0, "%s", err);
}

static void teardown(void)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(api, .init = setup, .fini = teardown, .timeout = 120);

/* A node on the in-process transport: name, port, the founder's port,
 * min_members, and extra overrides. */
#define NODE_SETS_MAX 24

typedef struct node_sets {
    char s[NODE_SETS_MAX][512];
    const char *p[NODE_SETS_MAX];
    size_t n;
} node_sets;

static void add(node_sets *ns, const char *key, const char *value)
{
    if (ns->n == NODE_SETS_MAX)
        abort(); /* a test asking for more: raise NODE_SETS_MAX */
    snprintf(ns->s[ns->n], sizeof(ns->s[0]), "%s=%s", key, value);
    ns->p[ns->n] = ns->s[ns->n];
    ns->n++;
}

static void node_sets_init(node_sets *ns, const char *name, int port, int seed_port, int min)
{
    char v[400];
    ns->n = 0;
    add(ns, "node.name", name);
    snprintf(v, sizeof(v), "127.0.0.1:%d", port);
    add(ns, "node.listen", v);
    snprintf(v, sizeof(v), "127.0.0.1:%d", seed_port);
    add(ns, "cluster.seeds", v);
    snprintf(v, sizeof(v), "%d", min);
    add(ns, "cluster.min_members", v);
    snprintf(v, sizeof(v), "%s/%s", g_dir, name);
    add(ns, "node.data_dir", v);
    add(ns, "cluster.key_file", g_key);
    add(ns, "transport.provider", "inproc");
    add(ns, "cluster.id", "apitest");
    add(ns, "node.log_level", "warn");
    add(ns, "train.steps", "300");
    add(ns, "train.warmup_steps", "0");
    add(ns, "gossip.timeout_ms", "500");
    add(ns, "sparsify.density", "0.1");
}

static int open_node(dsnode **d, const char *name, int port, int seed_port, int min)
{
    node_sets ns;
    node_sets_init(&ns, name, port, seed_port, min);
    return dsnode_open(d, NULL, ns.p, ns.n);
}

static int adopt_count;

static int adopt_cb(void *ctx, int64_t step)
{
    (void)ctx;
    (void)step;
    adopt_count++;
    return 0;
}

#define N 1000
static const dsnode_layer two_layers[] = {{"fc1", 0, 600}, {"fc2", 600, 400}};

Test(api, abi_and_version)
{
    cr_assert_eq(dsnode_abi_version(), DSNODE_ABI_VERSION);
    cr_assert_str_not_empty(dsnode_version());
    dsnode *d = (dsnode *)1;
    cr_assert_eq(dsnode_open_abi(&d, NULL, NULL, 0, DSNODE_ABI_VERSION + 1), -EPROTO);
    cr_assert_null(d);
    cr_assert(strstr(dsnode_error(), "ABI"), "%s", dsnode_error());
}

Test(api, bad_config_file_names_file_line_and_key)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/bad.ini", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "[node]\nname = x\n\n[gossip]\nweight = banana\n");
    fclose(f);
    dsnode *d = NULL;
    cr_assert_eq(dsnode_open(&d, path, NULL, 0), -EINVAL);
    cr_assert_null(d);
    char want[320];
    snprintf(want, sizeof(want), "%s:5", path);
    cr_assert(strstr(dsnode_error(), want), "'%s' lacks '%s'", dsnode_error(), want);
    cr_assert(strstr(dsnode_error(), "gossip.weight"), "%s", dsnode_error());
    cr_assert(strstr(dsnode_error(), "banana"), "%s", dsnode_error());
}

Test(api, bad_override_and_missing_files)
{
    dsnode *d = NULL;
    const char *bad[] = {"gossip.nosuchkey=1"};
    cr_assert_eq(dsnode_open(&d, NULL, bad, 1), -EINVAL);
    cr_assert(strstr(dsnode_error(), "gossip.nosuchkey"), "%s", dsnode_error());
    cr_assert_eq(dsnode_open(&d, NULL, NULL, 1), -EINVAL);
    char path[300];
    snprintf(path, sizeof(path), "%s/absent.ini", g_dir);
    cr_assert_eq(dsnode_open(&d, path, NULL, 0), -EINVAL);
    cr_assert(strstr(dsnode_error(), "absent.ini"), "%s", dsnode_error());
    const char *nokey[] = {"cluster.key_file=/nonexistent/cluster.key"};
    cr_assert_lt(dsnode_open(&d, NULL, nokey, 1), 0);
    cr_assert_null(d);
    cr_assert(strstr(dsnode_error(), "cluster.key_file"), "%s", dsnode_error());
}

Test(api, open_close_twice)
{
    dsnode *d = NULL;
    cr_assert_eq(open_node(&d, "solo", 7300, 7300, 1), 0, "%s", dsnode_error());
    cr_assert_str_eq(dsnode_error(), "");
    cr_assert_str_eq(dsnode_name(d), "solo");
    cr_assert_eq(dsnode_stopped(d), 0);
    cr_assert_eq(dsnode_exit_status(d), 1);
    dsnode_close(&d);
    cr_assert_null(d);
    dsnode_close(&d); /* the second close does nothing */
    dsnode_close(NULL);
}

static volatile sig_atomic_t own_handler_ran;

static void own_handler(int sig)
{
    own_handler_ran = sig;
}

/* dsnode_handle_signals: SIGTERM stops the engine instead of the process;
 * a second engine cannot take the signals; close puts our handler back. */
Test(api, signals_stop_the_engine_and_close_restores_the_handler)
{
    signal(SIGTERM, own_handler);
    dsnode *a = NULL, *b = NULL;
    cr_assert_eq(open_node(&a, "siga", 7340, 7340, 1), 0, "%s", dsnode_error());
    cr_assert_eq(open_node(&b, "sigb", 7341, 7341, 1), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_handle_signals(a), 0);
    cr_assert_eq(dsnode_handle_signals(b), -EBUSY);
    cr_assert_eq(raise(SIGTERM), 0);
    cr_assert_eq(dsnode_stopped(a), SIGTERM);
    cr_assert_eq(dsnode_stopped(b), 0);
    cr_assert_eq(own_handler_ran, 0);
    dsnode_close(&b); /* not the owner: changes nothing */
    cr_assert_eq(raise(SIGTERM), 0);
    cr_assert_eq(own_handler_ran, 0);
    dsnode_close(&a);
    cr_assert_eq(raise(SIGTERM), 0);
    cr_assert_eq(own_handler_ran, SIGTERM);
}

Test(api, calls_out_of_order_say_what_is_missing)
{
    dsnode *d = NULL;
    float p[N] = {0};
    cr_assert_eq(open_node(&d, "order", 7310, 7310, 1), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_step(d), -EINVAL);
    cr_assert(strstr(dsnode_error(), "dsnode_step: called before dsnode_join"), "%s",
              dsnode_error());
    cr_assert_eq(dsnode_ready(d), -EINVAL);
    cr_assert_eq(dsnode_settle(d), -EINVAL);
    cr_assert_eq(dsnode_report(d, 1, -1, 0.1, 1), -EINVAL);
    cr_assert_eq(dsnode_report_eval(d, 1, 0.5), -EINVAL);
    cr_assert_eq(dsnode_leave(d, DSNODE_DONE), -EINVAL);
    cr_assert_eq(dsnode_join(d), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called before dsnode_register"), "%s", dsnode_error());
    cr_assert_eq(dsnode_step(NULL), -EINVAL);
    cr_assert_eq(dsnode_stats_get(d, NULL), -EINVAL);

    /* Bad registrations change nothing. */
    cr_assert_eq(dsnode_register(d, NULL, N, two_layers, 2, adopt_cb, NULL), -EINVAL);
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, NULL, NULL), -EINVAL);
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 0, adopt_cb, NULL), -EINVAL);
    const dsnode_layer overlap[] = {{"a", 0, 600}, {"b", 500, 500}};
    cr_assert_eq(dsnode_register(d, p, N, overlap, 2, adopt_cb, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "layer 1 ('b')"), "%s", dsnode_error());
    const dsnode_layer outside[] = {{"a", 0, 600}, {"b", 600, 401}};
    cr_assert_eq(dsnode_register(d, p, N, outside, 2, adopt_cb, NULL), -EINVAL);
    const dsnode_layer empty[] = {{"a", 0, 0}};
    cr_assert_eq(dsnode_register(d, p, N, empty, 1, adopt_cb, NULL), -EINVAL);

    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called after dsnode_register"), "%s", dsnode_error());
    cr_assert_eq(dsnode_step(d), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called before dsnode_join"), "%s", dsnode_error());
    dsnode_stats st;
    cr_assert_eq(dsnode_stats_get(d, &st), 0);
    cr_assert_eq(st.step, 0);
    dsnode_close(&d);
}

Test(api, register_wants_a_gradient_buffer_when_gradients_are_averaged_and_a_good_data_dir)
{
    dsnode *d = NULL;
    static float p[N], g[N];
    node_sets ns;
    node_sets_init(&ns, "ar", 7320, 7320, 1);
    add(&ns, "gossip.topology", "allreduce");
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_reduces(d), 1);
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "gossip.topology = allreduce averages gradients"), "%s",
              dsnode_error());
    cr_assert(strstr(dsnode_error(), "dsnode_register_grad"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, NULL, NULL), -EINVAL);
    cr_assert_eq(dsnode_register_grad(d, g, g), -EINVAL);
    cr_assert_eq(dsnode_register_grad(d, g, NULL), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, g, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "twice"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, g, N, two_layers, 2, adopt_cb, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "three distinct"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, g, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called after dsnode_register"), "%s", dsnode_error());
    cr_assert_eq(dsnode_reduce(d), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called before dsnode_join"), "%s", dsnode_error());
    dsnode_close(&d);

    node_sets_init(&ns, "gr", 7322, 7322, 1);
    add(&ns, "node.group", "g0");
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_reduces(d), 1);
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), -EINVAL);
    cr_assert(strstr(dsnode_error(), "node.group = g0 averages gradients"), "%s",
              dsnode_error());
    dsnode_close(&d);
    cr_assert_eq(dsnode_reduces(NULL), -EINVAL);

    char file[300], dir[320];
    snprintf(file, sizeof(file), "%s/a_file", g_dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/sub", file);
    node_sets_init(&ns, "dd", 7321, 7321, 1);
    add(&ns, "node.data_dir", dir);
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_lt(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0);
    cr_assert(strstr(dsnode_error(), "node.data_dir"), "%s", dsnode_error());
    dsnode_close(&d);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

Test(api, join_stopped_and_join_timeout_then_only_close)
{
    dsnode *d = NULL;
    float p[N] = {0};
    cr_assert_eq(open_node(&d, "stopped", 7330, 7330, 2), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    dsnode_stop(d, 15);
    cr_assert_eq(dsnode_stopped(d), 15);
    cr_assert_eq(dsnode_join(d), -EINTR);
    cr_assert(strstr(dsnode_error(), "stopped"), "%s", dsnode_error());
    cr_assert_eq(dsnode_step(d), -EINVAL);
    cr_assert(strstr(dsnode_error(), "only dsnode_close"), "%s", dsnode_error());
    dsnode_close(&d);

    /* A seed nobody runs: membership gives up after join_timeout_s. */
    node_sets ns;
    node_sets_init(&ns, "lonely", 7331, 7339, 1);
    add(&ns, "cluster.join_timeout_s", "1");
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    cr_assert_eq(dsnode_join(d), -ETIMEDOUT);
    cr_assert(strstr(dsnode_error(), "cannot join cluster 'apitest'"), "%s", dsnode_error());
    dsnode_close(&d);

    /* A founder whose other members never come (or came and finished):
     * the wait for cluster.min_members is bounded by join_timeout_s too. */
    node_sets_init(&ns, "founder", 7332, 7332, 2);
    add(&ns, "cluster.join_timeout_s", "1");
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, p, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    const uint64_t t0 = mono_ms();
    cr_assert_eq(dsnode_join(d), -ETIMEDOUT);
    const uint64_t took = mono_ms() - t0;
    cr_assert(strstr(dsnode_error(), "only 1 of cluster.min_members=2 members alive after "
                                     "cluster.join_timeout_s=1"), "%s", dsnode_error());
    cr_assert(took >= 1000 && took < 10000, "%llu ms", (unsigned long long)took);
    dsnode_close(&d);
}

/* ---- two engines ------------------------------------------------------------------- */

#define STEPS 300

typedef struct peer {
    const char *name;
    int port;
    float init; /* its drift per step */
    float p[N];
    dsnode_stats st;
    int rc_join, rc_leave, exit_status, steps_ready, bad_calls;
    int drifts; /* steps that added this node's drift */
    char err[1024];
    /* The parameters on a "device" (p, which the engine never sees): a
     * host mirror, copies and dsnode_register_add, which counts. */
    int mirror;
    float host[N];
    int pulls, adds;
} peer;

static int peer_pull(void *ctx, enum dsnode_buffer which)
{
    peer *pe = ctx;
    pe->pulls += which == DSNODE_PARAMS;
    memcpy(pe->host, pe->p, sizeof(pe->p));
    return 0;
}

static int peer_push(void *ctx, enum dsnode_buffer which)
{
    peer *pe = ctx;
    (void)which;
    memcpy(pe->p, pe->host, sizeof(pe->p));
    return 0;
}

static int peer_add(void *ctx, enum dsnode_buffer which, const float *delta)
{
    peer *pe = ctx;
    if (which != DSNODE_PARAMS)
        return -EINVAL;
    pe->adds++;
    for (int i = 0; i < N; i++)
        pe->p[i] += delta[i];
    return 0;
}

/* Peers whose dsnode_join returned: drift starts when both have. The one
 * that joins second takes the other's parameters (the state transfer):
 * a drift the first had taken by then would be in both models, and the
 * sum would hold more than the drifts taken (1 run in 10 or so, when the
 * first node's steps ran ahead of the second's join). */
static atomic_int peers_joined;

/* Criterion's asserts belong to the test's thread: a peer counts. */
#define CHECK(pe, cond) ((pe)->bad_calls += !(cond))

static void *peer_main(void *arg)
{
    peer *pe = arg;
    dsnode *d = NULL;
    for (int i = 0; i < N; i++)
        pe->p[i] = (float)(1 + i % 7);
    pe->rc_join = -1;
    if (open_node(&d, pe->name, pe->port, pe->port & ~1, 2) < 0 ||
        (pe->mirror && (dsnode_register_copies(d, peer_pull, peer_push, pe) < 0 ||
                        dsnode_register_add(d, peer_add) < 0)) ||
        dsnode_register(d, pe->mirror ? pe->host : pe->p, N, two_layers, 2, adopt_cb, NULL) < 0 ||
        (pe->rc_join = dsnode_join(d)) < 0) {
        snprintf(pe->err, sizeof(pe->err), "%s", dsnode_error());
        dsnode_close(&d);
        atomic_fetch_add(&peers_joined, 1);
        return NULL;
    }
    atomic_fetch_add(&peers_joined, 1);
    for (int s = 0; s < STEPS; s++) {
        if (dsnode_ready(d) != 1)
            continue;
        pe->steps_ready++;
        CHECK(pe, dsnode_reduces(d) == 0 && dsnode_reduce(d) == 0); /* nothing to average */
        /* The "optimizer step": a drift of this node's own, once both
         * hold the same start. */
        if (atomic_load(&peers_joined) == 2) {
            for (int i = 0; i < N; i++)
                pe->p[i] += pe->init * (float)(1 + i % 5);
            pe->drifts++;
        }
        CHECK(pe, dsnode_step(d) == 0);
        CHECK(pe, dsnode_report(d, 1.0, -1, 0.1, 100) == 0);
    }
    CHECK(pe, dsnode_settle(d) == 0);
    CHECK(pe, dsnode_report_eval(d, 0.5, 0.9) == 0);
    pe->rc_leave = dsnode_leave(d, DSNODE_DONE);
    pe->exit_status = dsnode_exit_status(d);
    dsnode_stats_get(d, &pe->st);
    CHECK(pe, dsnode_step(d) == -EINVAL); /* after leave */
    dsnode_close(&d);
    dsnode_close(&d);
    return NULL;
}

static double dist(const float *a, const float *b)
{
    double s = 0;
    for (int i = 0; i < N; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

/* Two engines gossip STEPS steps; their sum is conserved and they come
 * together. mirror: each keeps its parameters on a "device" behind host
 * mirrors, and a round's end adds its deltas there (dsnode_register_add)
 * instead of pulling and pushing the parameters: one pull a round. */
static void two_engines(int port, int mirror)
{
    static peer a, b;
    a = (peer){.name = "alpha", .port = port, .init = 0.01f, .mirror = mirror};
    b = (peer){.name = "beta", .port = port + 1, .init = -0.02f, .mirror = mirror};
    atomic_store(&peers_joined, 0);
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, peer_main, &a), 0);
    cr_assert_eq(pthread_create(&tb, NULL, peer_main, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    /* Where the two would be without gossip, and their sum either way. */
    static float a0[N], b0[N];
    double sum0 = 0;
    for (int i = 0; i < N; i++) {
        a0[i] = (float)(1 + i % 7) + (float)a.drifts * a.init * (float)(1 + i % 5);
        b0[i] = (float)(1 + i % 7) + (float)b.drifts * b.init * (float)(1 + i % 5);
        sum0 += (double)a0[i] + b0[i];
    }
    cr_assert_eq(a.rc_join, 0, "alpha: %s", a.err);
    cr_assert_eq(b.rc_join, 0, "beta: %s", b.err);
    cr_assert_gt(a.drifts, STEPS / 2, "alpha drifted in %d steps", a.drifts);
    cr_assert_gt(b.drifts, STEPS / 2, "beta drifted in %d steps", b.drifts);
    cr_assert_eq(a.bad_calls + b.bad_calls, 0);
    cr_assert_eq(a.rc_leave, 0);
    cr_assert_eq(b.rc_leave, 0);
    cr_assert_eq(a.exit_status, 0);
    cr_assert_eq(a.steps_ready, STEPS);
    cr_assert_eq(a.st.step, STEPS);
    cr_assert_gt(a.st.rounds, 100, "rounds %llu", (unsigned long long)a.st.rounds);
    cr_assert_gt(a.st.exchanges_ok, 0);
    cr_assert_gt(a.st.bytes_sent, 0);

    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += (double)a.p[i] + b.p[i];
    cr_assert_lt(fabs(sum - sum0), 1e-3 * fabs(sum0), "sum %g, was %g", sum, sum0);
    const double d0 = dist(a0, b0), d1 = dist(a.p, b.p);
    cr_assert_lt(d1, 0.5 * d0, "distance %g, was %g", d1, d0);

    char path[400];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/alpha/model.bin", g_dir);
    cr_assert_eq(stat(path, &sb), 0, "%s missing", path);
    cr_assert_eq(sb.st_size, 16 + N * 4);
    if (mirror) {
        /* every round's end went through add; the parameters were pulled
         * once a round (its begin), plus a few times around the run */
        cr_assert_eq((uint64_t)a.adds, a.st.rounds, "adds %d, rounds %llu", a.adds,
                     (unsigned long long)a.st.rounds);
        cr_assert_lt((uint64_t)a.pulls, a.st.rounds + 10, "pulls %d, rounds %llu", a.pulls,
                     (unsigned long long)a.st.rounds);
    }
}

Test(api, two_engines_gossip_conserve_the_sum_and_converge, .timeout = 180)
{
    two_engines(7400, 0);
}

Test(api, two_engines_on_devices_add_each_rounds_deltas, .timeout = 180)
{
    two_engines(7460, 1);
}

/* ---- a group of two, and allreduce --------------------------------------------------- */

#define GSTEPS 200

/* With group.overlap the members register a layer 1 large enough for a
 * bucket of its own (LAYER_BUCKET_MIN, 64 Ki floats, in rounds.c), so the
 * layer thread reduces it; a smaller one would ride with layer 0 in the
 * step's own reduction. */
#define NM (1000 + 66000)
static const dsnode_layer member_layers[] = {{"fc1", 0, 1000}, {"fc2", 1000, 66000}};

typedef struct member {
    const char *name;
    int port, seed;
    const char *key, *value; /* what makes the config average gradients */
    float sign;              /* this member's own gradient: sign * (1 + i % 3) / 64 */
    float apart;             /* added to its parameters after its last step */
    float start;             /* added to its parameters before its first step */
    int overlap;             /* group.overlap: hands its layers over from "backward" */
    int timeout_ms;          /* gossip.timeout_ms with overlap (0: 5000) */
    int late_ms;             /* sleeps this long before its first step */
    int members;             /* cluster.min_members (0: 2) */
    int64_t s;               /* the step: member 0's when the group gives it (adopt) */
    char tmo[16];
    size_t n;                /* floats registered: N, with overlap NM (small: N) */
    int small;               /* with overlap, the two small layers of N */
    float p[NM], g[NM];
    float last[NM];          /* its parameters after its last step, before the leave */
    int rc_join, rc_leave, bad_calls, steps, no_reduce_refused;
    dsnode_stats st;
    char err[1024];
} member;

/* Member 0's step (a member apart: the group's reduction gives it), or a
 * state taken: the loop continues from it, as dsnode run's does. */
static int member_adopt(void *ctx, int64_t step)
{
    ((member *)ctx)->s = step;
    return 0;
}

static pthread_barrier_t g_joined;

static void *member_main(void *arg)
{
    member *m = arg;
    dsnode *d = NULL;
    const int big = m->overlap && !m->small;
    m->n = big ? NM : N;
    for (size_t i = 0; i < m->n; i++)
        m->p[i] = (float)(1 + i % 7) + m->start;
    node_sets ns;
    node_sets_init(&ns, m->name, m->port, m->seed, m->members ? m->members : 2);
    add(&ns, m->key, m->value);
    char status[400];
    if (m->overlap) {
        add(&ns, "group.overlap", "true");
        /* No failure here: a layer's deadline (half a timeout) must not
         * pass on a loaded machine, where 250 ms did once (one bucket
         * kept its own values, and the members ended half a step off). */
        snprintf(m->tmo, sizeof(m->tmo), "%d", m->timeout_ms ? m->timeout_ms : 5000);
        add(&ns, "gossip.timeout_ms", m->tmo);
        snprintf(status, sizeof(status), "%s/%s.status.json", g_dir, m->name);
        add(&ns, "status.file", status);
    }
    m->rc_join = -1;
    if (dsnode_open(&d, NULL, ns.p, ns.n) < 0 || dsnode_register_grad(d, m->g, NULL) < 0 ||
        dsnode_register(d, m->p, m->n, big ? member_layers : two_layers, 2, member_adopt, m) < 0 ||
        (m->rc_join = dsnode_join(d)) < 0) {
        snprintf(m->err, sizeof(m->err), "%s", dsnode_error());
        dsnode_close(&d);
        pthread_barrier_wait(&g_joined);
        return NULL;
    }
    CHECK(m, dsnode_reduces(d) == 1);
    /* Every member has joined before any trains (a member still joining
     * while the others finished would wait for its cluster for good). */
    pthread_barrier_wait(&g_joined);
    if (m->late_ms)
        usleep((useconds_t)m->late_ms * 1000u);
    for (m->s = 0; m->s < GSTEPS; m->s++) {
        if (dsnode_ready(d) != 1)
            continue;
        /* "backward": this member's own gradient, apart from the other's. */
        for (size_t i = 0; i < m->n; i++)
            m->g[i] = m->sign * (float)(1 + i % 3) / 64.0f;
        if (m->overlap) {
            /* As backward writes them: the last layer first. */
            CHECK(m, dsnode_layer_ready(d, 1) == 0);
            CHECK(m, dsnode_layer_ready(d, 1) == -EALREADY); /* once a step */
            CHECK(m, dsnode_layer_ready(d, 2) == -EINVAL);   /* no such layer */
            CHECK(m, dsnode_layer_ready(d, 0) == 0);
        }
        if (m->steps == 0) {
            /* The optimizer step may not come before the reduction. */
            m->no_reduce_refused = dsnode_step(d) == -EINVAL &&
                                   strstr(dsnode_error(), "expected dsnode_reduce");
        }
        CHECK(m, dsnode_reduce(d) == 0);
        CHECK(m, dsnode_reduce(d) == -EINVAL); /* once a step */
        CHECK(m, dsnode_layer_ready(d, 0) == -EINVAL); /* not after the reduction */
        /* The optimizer: plain SGD, lr 0.5, on the averaged gradient. */
        for (size_t i = 0; i < m->n; i++)
            m->p[i] -= 0.5f * m->g[i];
        CHECK(m, dsnode_step(d) == 0);
        m->steps++;
    }
    /* A member apart after the last step (as a chunk missed in the last
     * reductions leaves it): the group's final sync at leave averages. */
    CHECK(m, dsnode_settle(d) == 0);
    memcpy(m->last, m->p, sizeof(m->p));
    for (size_t i = 0; m->apart != 0.0f && i < m->n; i++)
        m->p[i] += m->apart;
    m->rc_leave = dsnode_leave(d, DSNODE_DONE);
    dsnode_stats_get(d, &m->st);
    dsnode_close(&d);
    return NULL;
}

/* Two members whose own gradients are opposite (+1 and -1 times one
 * pattern, and 3 times it): after every reduction both hold the mean, so
 * both take the same steps and end bit for bit alike, where they would be
 * without the reduction is far apart. */
/* overlap: 0 none, 1 group.overlap with a layer 1 of its own bucket, 2
 * group.overlap with the two small layers. timeout_ms: gossip.timeout_ms
 * with overlap (0: 5000). late_ms: the last member sleeps this long
 * before its first step. start: added to every odd member's parameters
 * before the first step (the slices re-sync them; checked before the
 * final sync at leave, which would hide them). */
static void members_late(int G, const char *key, const char *value, int port, float apart,
                         int overlap, int timeout_ms, int late_ms, float start)
{
    static const char *names[] = {"ma", "mb", "mc", "md"};
    static member ms[4];
    pthread_t t[4];
    cr_assert_eq(pthread_barrier_init(&g_joined, NULL, (unsigned)G), 0);
    /* Signs 1 and 3 by turns: the mean is 2. The last member is late. */
    for (int k = 0; k < G; k++) {
        ms[k] = (member){.name = names[k], .port = port + k, .seed = port, .key = key,
                         .value = value, .sign = k % 2 ? 3.0f : 1.0f,
                         .apart = k % 2 ? apart : 0.0f, .start = k % 2 ? start : 0.0f,
                         .overlap = overlap != 0,
                         .small = overlap == 2,
                         .timeout_ms = timeout_ms, .late_ms = k == G - 1 ? late_ms : 0,
                         .members = G};
        cr_assert_eq(pthread_create(&t[k], NULL, member_main, &ms[k]), 0);
    }
    for (int k = 0; k < G; k++)
        pthread_join(t[k], NULL);
    pthread_barrier_destroy(&g_joined);
    for (int k = 0; k < G; k++) {
        const member *m = &ms[k];
        cr_assert_eq(m->rc_join, 0, "%s: %s", m->name, m->err);
        cr_assert_eq(m->bad_calls, 0, "%s", m->name);
        cr_assert(m->no_reduce_refused, "%s", m->name);
        cr_assert_eq(m->rc_leave, 0, "%s", m->name);
        /* (A late member takes member 0's step: fewer of its own.) */
        cr_assert(late_ms ? m->steps > 0 : m->steps == GSTEPS, "%s: %d steps", m->name,
                  m->steps);
        cr_assert_eq(memcmp(ms[0].p, m->p, sizeof(m->p)), 0, "ma's and %s's parameters differ",
                     m->name);
        for (size_t i = 0; start != 0.0f && i < m->n; i++)
            cr_assert_eq(ms[0].last[i], m->last[i], "after the last step, before the final "
                         "sync: ma's p[%zu] = %g, %s's %g", i, ms[0].last[i], m->name, m->last[i]);
    }
    /* The mean of sign 1 and 3 is 2: each step took 0.5 * 2 * pattern / 64
     * (exact in binary, whatever the order of the sums). A member late to
     * its first step misses a reduction or two: one model, not this one. */
    for (size_t i = 0; !late_ms && i < ms[0].n; i++) {
        const float want = (float)(1 + i % 7) - GSTEPS * 0.5f * 2.0f * (float)(1 + i % 3) / 64.0f +
                           apart / 2.0f + start / 2.0f;
        cr_assert_float_eq(ms[0].p[i], want, 1e-4f, "p[%zu] = %g, want %g", i, ms[0].p[i], want);
    }
}

static void two_members_average(const char *key, const char *value, int port, float apart,
                                int overlap)
{
    members_late(2, key, value, port, apart, overlap, 0, 0, 0.0f);
}

Test(api, a_group_of_two_reduces_to_one_model, .timeout = 180)
{
    two_members_average("node.group", "g0", 7410, 0.0f, 0);
}

/* A group count from a member's last status document (-1: none). */
static double group_count(const char *name, const char *key)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/%s.status.json", g_dir, name);
    json_t *doc = json_load_file(path, 0, NULL);
    const json_t *v = json_object_get(json_object_get(doc, "group"), key);
    const double n = json_is_number(v) ? json_number_value(v) : -1;
    json_decref(doc);
    return n;
}

static double layer_reductions(const char *name)
{
    return group_count(name, "layer_reductions");
}

/* group.overlap: each member hands its layers over as "backward" writes
 * them (last first); layer 1 is reduced on the engine's layer thread,
 * layer 0 with the step's reduction. The same bytes as without overlap,
 * every order error refused, and the layer thread did the work (its
 * count in the status document: one layer reduction a step). */
Test(api, a_group_of_two_reduces_layer_by_layer_with_overlap, .timeout = 180)
{
    two_members_average("node.group", "g0", 7440, 0.0f, 1);
    /* The first step goes whole: layers only after one complete step. */
    cr_assert_eq(layer_reductions("ma"), GSTEPS - 1, "ma: %g layer reductions",
                 layer_reductions("ma"));
    cr_assert_eq(layer_reductions("mb"), GSTEPS - 1, "mb: %g layer reductions",
                 layer_reductions("mb"));
}

/* Four members apart in time at the start: the last begins its first
 * step 0.7 s after the others, longer than a layer's deadline (half of
 * gossip.timeout_ms, 0.5 s), as a first reduction over fresh connections
 * can be. The first step goes whole (its deadline is the whole timeout),
 * where they meet; then every step goes layer by layer and nothing is
 * missed. When the layers began at the first step, the three that began
 * together missed the late one's layer and their steps' reductions (three
 * incomplete; behind 1 Gbit/s links, where the first reduction took about
 * a second, the members stayed apart: every reduction incomplete, every
 * step at the deadlines, in 3 of 5 runs). */
Test(api, members_apart_at_the_start_meet_and_reduce_layer_by_layer, .timeout = 60)
{
    static const char *names[] = {"ma", "mb", "mc", "md"};
    members_late(4, "node.group", "g0", 7450, 0.0f, 1, 1000, 700, 0.0f);
    for (int k = 0; k < 4; k++) {
        const double inc = group_count(names[k], "incomplete");
        cr_assert_eq(inc, 0, "%s: %g incomplete reductions", names[k], inc);
        cr_assert_eq(layer_reductions(names[k]), GSTEPS - 1, "%s: %g layer reductions",
                     names[k], layer_reductions(names[k]));
    }
}

/* group.overlap with a layer 1 too small for a bucket of its own (400
 * floats): it rides with layer 0 in the step's own reduction, so the layer
 * thread reduces nothing, and the mean is the same bytes (members_late
 * checks the exact trajectory). */
Test(api, a_small_last_layer_rides_with_layer_0, .timeout = 180)
{
    members_late(2, "node.group", "g0", 7470, 0.0f, 2, 0, 0, 0.0f);
    cr_assert_eq(layer_reductions("ma"), 0, "ma: %g layer reductions", layer_reductions("ma"));
    cr_assert_eq(layer_reductions("mb"), 0, "mb: %g layer reductions", layer_reductions("mb"));
    cr_assert_eq(group_count("ma", "incomplete"), 0);
}

/* Members that start apart are one model again within GROUP_SYNC_SLICES
 * steps, before the final sync: the slices of parameters travel in the
 * step's own reduction, with group.overlap (where the layers go on the
 * layer thread) and without. */
Test(api, members_that_start_apart_are_one_model_by_the_slices_with_overlap, .timeout = 180)
{
    members_late(2, "node.group", "g0", 7480, 0.0f, 1, 0, 0, 0.25f);
    cr_assert_eq(layer_reductions("ma"), GSTEPS - 1);
}

Test(api, members_that_start_apart_are_one_model_by_the_slices, .timeout = 180)
{
    members_late(2, "node.group", "g0", 7490, 0.0f, 0, 0, 0, 0.25f);
}

Test(api, a_group_ends_as_one_model_after_a_last_step_apart, .timeout = 180)
{
    two_members_average("node.group", "g0", 7430, 0.25f, 0);
}

Test(api, allreduce_averages_the_gradients, .timeout = 180)
{
    two_members_average("gossip.topology", "allreduce", 7420, 0.0f, 0);
}

/* ---- checkpoints, host mirrors, outcomes ------------------------------------------ */

/* The "device" of dsnode_register_copies: memory the engine never sees,
 * copied into and out of a host mirror by the callbacks, which count. */
typedef struct device {
    float params[N], grad[N], opt[N];
    float *mirror;
    int pulls[3], pushes[3], fail_pull;
} device;

static float *dev_buf(device *v, enum dsnode_buffer which)
{
    return which == DSNODE_GRAD ? v->grad : which == DSNODE_OPT ? v->opt : v->params;
}

static int dev_pull(void *ctx, enum dsnode_buffer which)
{
    device *v = ctx;
    if (v->fail_pull)
        return -EIO;
    v->pulls[which]++;
    memcpy(v->mirror, dev_buf(v, which), sizeof(float) * N);
    return 0;
}

static int dev_push(void *ctx, enum dsnode_buffer which)
{
    device *v = ctx;
    v->pushes[which]++;
    memcpy(dev_buf(v, which), v->mirror, sizeof(float) * N);
    return 0;
}

/* What dsnode_resume's restore saw, and whether it refuses. */
typedef struct prog {
    char state[64];
    size_t len;
    int64_t step;
    int calls, refuse;
} prog;

static int restore_cb(void *ctx, const void *state, size_t len, int64_t step, char *why,
                      size_t why_len)
{
    prog *g = ctx;
    g->calls++;
    if (g->refuse) {
        snprintf(why, why_len, "the program wants %d bytes, found %zu", 99, len);
        return -EINVAL;
    }
    if (len > sizeof(g->state))
        return -EINVAL;
    memcpy(g->state, state, len);
    g->len = len;
    g->step = step;
    return 0;
}

static float *read_model(const char *dir, size_t *n)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    unsigned char hdr[16];
    cr_assert_eq(fread(hdr, 1, 16, f), 16u);
    cr_assert_eq(memcmp(hdr, "DSMODEL1", 8), 0);
    uint64_t cnt = 0;
    memcpy(&cnt, hdr + 8, 8);
    float *m = malloc(cnt * sizeof(float));
    cr_assert_eq(fread(m, sizeof(float), cnt, f), cnt);
    fclose(f);
    *n = (size_t)cnt;
    return m;
}

/* One node (a cluster of one) that keeps its parameters on a "device":
 * the engine reads and writes them only through the mirror and the
 * callbacks; a checkpoint holds the device's parameters and the program's
 * bytes; a paused leave exits 0; a second engine resumes from the
 * checkpoint: the parameters are pushed to its device, restore gets the
 * bytes and the step, the step counter goes on from there. */
Test(api, checkpoint_resume_and_host_mirrors)
{
    static device v1, v2;
    static float mirror[N];
    static prog g;
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/solo", g_dir);
    for (int i = 0; i < N; i++)
        v1.params[i] = (float)i * 0.5f;
    v1.mirror = mirror;
    v2.mirror = mirror;

    dsnode *d = NULL;
    cr_assert_eq(open_node(&d, "solo", 7500, 7500, 1), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, NULL, dev_push, &v1), -EINVAL);
    cr_assert_eq(dsnode_checkpoint(d, "x", 1), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called before dsnode_join"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, dev_pull, dev_push, &v1), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, dev_pull, dev_push, &v1), -EINVAL);
    cr_assert(strstr(dsnode_error(), "twice"), "%s", dsnode_error());
    /* One host mirror for every buffer. */
    cr_assert_eq(dsnode_register(d, mirror, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    cr_assert_eq(dsnode_set_backend(d, ""), -EINVAL);
    cr_assert_eq(dsnode_set_backend(d, "fakegpu"), 0);
    cr_assert_eq(dsnode_join(d), 0, "%s", dsnode_error());
    for (int s = 0; s < 20; s++) {
        cr_assert_eq(dsnode_ready(d), 1);
        for (int i = 0; i < N; i++)
            v1.params[i] += 0.25f; /* the optimizer runs on the device */
        cr_assert_eq(dsnode_step(d), 0, "%s", dsnode_error());
    }
    cr_assert_eq(dsnode_checkpoint(d, NULL, 3), -EINVAL);
    const char state[] = "momentum+data order";
    const int pulls_before = v1.pulls[DSNODE_PARAMS];
    cr_assert_eq(dsnode_checkpoint(d, state, sizeof(state)), 0, "%s", dsnode_error());
    cr_assert_gt(v1.pulls[DSNODE_PARAMS], pulls_before, "the checkpoint pulled the parameters");
    static float at_ckpt[N];
    memcpy(at_ckpt, v1.params, sizeof(at_ckpt));
    for (int s = 0; s < 5; s++) {
        cr_assert_eq(dsnode_ready(d), 1);
        for (int i = 0; i < N; i++)
            v1.params[i] += 1.0f;
        cr_assert_eq(dsnode_step(d), 0);
    }
    /* model.bin is the device's memory, pulled at leave, not the mirror's. */
    memset(mirror, 0, sizeof(mirror));
    cr_assert_eq(dsnode_leave(d, DSNODE_PAUSED), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_exit_status(d), 0);
    cr_assert_eq(dsnode_set_backend(d, "late"), -EINVAL);
    cr_assert_eq(dsnode_checkpoint(d, state, sizeof(state)), -EINVAL);
    size_t n = 0;
    float *m = read_model(dir, &n);
    cr_assert_eq(n, (size_t)N);
    cr_assert_eq(memcmp(m, v1.params, sizeof(float) * N), 0, "model.bin holds the device's");
    free(m);
    dsnode_abandon(&d);
    cr_assert_null(d);
    dsnode_abandon(&d);

    /* Resume on another engine (another port: the first left its endpoint
     * open, as a process that _exits next does). */
    char path[700];
    snprintf(path, sizeof(path), "%s/checkpoint.bin", dir);
    cr_assert_eq(open_node(&d, "solo", 7501, 7501, 1), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_resume(d, path, restore_cb, &g), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called before dsnode_register"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, dev_pull, dev_push, &v2), 0);
    cr_assert_eq(dsnode_register(d, mirror, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    cr_assert_eq(dsnode_resume(d, path, NULL, &g), -EINVAL);
    char missing[700];
    snprintf(missing, sizeof(missing), "%s/none.bin", g_dir);
    cr_assert_eq(dsnode_resume(d, missing, restore_cb, &g), -ENOENT);
    cr_assert(strstr(dsnode_error(), "none.bin"), "%s", dsnode_error());
    g.refuse = 1;
    cr_assert_eq(dsnode_resume(d, path, restore_cb, &g), -EINVAL);
    cr_assert(strstr(dsnode_error(), "the program wants 99 bytes, found 20"), "%s",
              dsnode_error());
    dsnode_stats st;
    cr_assert_eq(dsnode_stats_get(d, &st), 0);
    cr_assert_eq(st.step, 0, "a refused resume leaves the step");
    g.refuse = 0;
    cr_assert_eq(dsnode_resume(d, path, restore_cb, &g), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_resume(d, path, restore_cb, &g), -EINVAL);
    cr_assert(strstr(dsnode_error(), "twice"), "%s", dsnode_error());
    cr_assert_eq(g.step, 20);
    cr_assert_eq(g.len, sizeof(state));
    cr_assert_str_eq(g.state, state);
    cr_assert_eq(memcmp(v2.params, at_ckpt, sizeof(at_ckpt)), 0,
                 "the checkpoint's parameters were pushed to the device");
    cr_assert_eq(dsnode_stats_get(d, &st), 0);
    cr_assert_eq(st.step, 20);
    cr_assert_eq(dsnode_join(d), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_ready(d), 1);
    cr_assert_eq(dsnode_step(d), 0);
    cr_assert_eq(dsnode_stats_get(d, &st), 0);
    cr_assert_eq(st.step, 21);
    v2.fail_pull = 1; /* the device fails: the run failed, model.bin not written */
    cr_assert_eq(dsnode_leave(d, DSNODE_DONE), -EIO);
    cr_assert(strstr(dsnode_error(), "parameters not read from the device"), "%s",
              dsnode_error());
    cr_assert_eq(dsnode_exit_status(d), 1);
    dsnode_close(&d);
}

/* Copies come before the buffers; without them, one buffer for all is
 * refused. */
Test(api, host_mirrors_order_and_distinct_buffers)
{
    static device v;
    static float a[N], b[N];
    dsnode *d = NULL;
    node_sets ns;
    node_sets_init(&ns, "mirrors", 7510, 7510, 1);
    add(&ns, "node.group", "g");
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, a, a), -EINVAL);
    cr_assert(strstr(dsnode_error(), "dsnode_register_copies first"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, a, b), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, dev_pull, dev_push, &v), -EINVAL);
    cr_assert(strstr(dsnode_error(), "after dsnode_register_grad"), "%s", dsnode_error());
    dsnode_close(&d);

    v.mirror = a;
    cr_assert_eq(dsnode_open(&d, NULL, ns.p, ns.n), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_add(d, peer_add), -EINVAL);
    cr_assert(strstr(dsnode_error(), "dsnode_register_copies first"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_copies(d, dev_pull, dev_push, &v), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_add(d, NULL), -EINVAL);
    cr_assert_eq(dsnode_register_add(d, peer_add), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register_add(d, peer_add), -EINVAL);
    cr_assert(strstr(dsnode_error(), "called twice"), "%s", dsnode_error());
    cr_assert_eq(dsnode_register_grad(d, a, a), 0, "%s", dsnode_error());
    cr_assert_eq(dsnode_register(d, a, N, two_layers, 2, adopt_cb, NULL), 0, "%s",
                 dsnode_error());
    dsnode_close(&d);
}
