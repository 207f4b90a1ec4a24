/*
 * tests/test_conf_choices.c: every choice of every enum key reaches the
 * module that consumes it, and that module takes it.
 *
 * For each enum key of conf/keys.h, every choice goes in as text through
 * ds_conf_set and comes out as the value node/ hands on; it must pass
 * ds_conf_check and be taken by the module that gives it a meaning
 * (sparsify: a sparsifier of that method runs; topology: the round's
 * schedule is drawn; kernels: an ops table is filled; base/log: a line at
 * that level is written; node/sec: a session in that mode is set up;
 * node/gossip: an engine with that mixing rule is created). So no choice
 * exists that conf accepts and its consumer refuses. The suite fails for
 * an enum key without a consumer case here. Where node/runtime maps a value
 * onto the trainer's settings (ds_run_train_cfg), each choice must also map
 * to settings of its own: a choice the mapping ignores is no choice.
 *
 * A binary of its own: it links all of node/ (CUDA and libfabric included),
 * which would slow every forked test of test_conf.
 * Run: meson test -C build conf_choices --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "conf/conf.h"
#include "helpers/conf_enum_keys.h"
#include "kernels/kernels.h"
#include "node/gossip/fake.h"
#include "node/gossip/gossip.h"
#include "node/gossip/group.h"
#include "node/runtime/hier.h"
#include "node/run/run.h"
#include "node/sec/crypto.h"
#include "node/wire/values.h"
#include "node/train/model.h"
#include "sparsify/sparsify.h"
#include "topology/topology.h"

/* A config with key set to choice i through --set; also_set (NULL or an
 * assignment) first. */
static ds_conf with_choice(const enum_key *k, size_t i, const char *also_set)
{
    ds_conf c;
    char a[256], err[DS_CONF_ERR_MAX] = "";
    ds_conf_defaults(&c);
    if (also_set)
        cr_assert_eq(ds_conf_set(&c, also_set, err, sizeof(err)), 0, "%s: %s", also_set, err);
    snprintf(a, sizeof(a), "%s=%s", k->key, k->names[i]);
    cr_assert_eq(ds_conf_set(&c, a, err, sizeof(err)), 0, "%s: %s", a, err);
    cr_assert_eq(k->get(&c), k->values[i], "%s", a);
    return c;
}

typedef struct consumer {
    const char *key;
    const char *also_set; /* NULL, or an assignment a cross-key rule needs */
    const char *(*also)(const char *name); /* NULL, or one per choice */
    void (*take)(const ds_conf *c, const char *name, int value);
    bool train_cfg;       /* consumed through ds_run_train_cfg */
} consumer;

/* base/log: ds_log_setup takes the level, and a line at that level is
 * written and carries the level's name. */
static void take_log_level(const ds_conf *c, const char *name, int value)
{
    char *text = NULL, want[64];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    ds_log_setup("t", c->node.log_level, f);
    cr_expect(ds_log_enabled(c->node.log_level), "%s", name);
    ds_log(c->node.log_level, "conf", "choice %s", name);
    ds_log_setup("t", DS_LOG_WARN, NULL);
    fclose(f);
    snprintf(want, sizeof(want), " %s t conf choice %s\n", name, name);
    cr_expect(text && strstr(text, want), "log level %s (%d) wrote '%s'", name, value, text);
    cr_expect_eq(ds_log_level_parse(name), value);
    free(text);
}

/* kernels: the trainer's backend name, as node/runtime hands it on, and the
 * value itself, both fill an ops table; cuda may find no device here. */
static void take_backend(const ds_conf *c, const char *name, int value)
{
    ds_train_cfg t;
    ds_ops ops;
    char why[256] = "";
    ds_run_train_cfg(c, &t);
    cr_expect_eq(t.backend, c->train.backend);
    int r = ds_ops_init_backend(&ops, t.backend, t.device, why, sizeof(why));
    cr_expect(r == 0 || r == -ENODEV, "backend %s: %d %s", name, r, why);
    if (r == 0)
        ds_ops_fini(&ops);
    cr_expect_str_eq(ds_ops_backend_name(c->train.backend), name);
    cr_expect_eq(ds_ops_backend_parse(name), value);
}

/* node/runtime -> node/train: the model kind and its list reach the
 * trainer's settings, and node/train builds that model (on the CPU table,
 * from the settings as ds_trainer_init reads them). */
static void take_model(const ds_conf *c, const char *name, int value)
{
    ds_train_cfg t;
    ds_ops ops;
    ds_model m;
    char err[256] = "";
    ds_run_train_cfg(c, &t);
    const enum ds_train_model want = value == DS_MODEL_CNN      ? DS_TRAIN_CNN
                                     : value == DS_MODEL_CUSTOM ? DS_TRAIN_CUSTOM
                                                                : DS_TRAIN_MLP;
    cr_expect_eq(t.model, want, "%s", name);
    ds_ops_init_cpu(&ops);
    int r;
    if (t.model == DS_TRAIN_MLP)
        r = ds_model_init_mlp(&m, &ops, 784, t.hidden, t.n_hidden, 10, 4);
    else
        r = ds_model_init_layers(&m, &ops, t.model == DS_TRAIN_CNN ? DS_LAYERSPEC_CNN : t.layers,
                                 1, 28, 28, 10, 4, err, sizeof(err));
    cr_expect_eq(r, 0, "train.model %s: %s", name, err);
    if (r == 0)
        ds_model_fini(&m);
}

/* custom needs a layer list (ds_conf_check); the others refuse one. */
static const char *model_also(const char *name)
{
    return strcmp(name, "custom") ? NULL : "train.layers=conv3x3:4, relu, flatten, linear:10";
}

/* node/runtime -> node/train: the schedule becomes the trainer's cosine
 * flag (and each schedule a different trainer, checked below). */
static void take_lr_schedule(const ds_conf *c, const char *name, int value)
{
    ds_train_cfg t;
    ds_run_train_cfg(c, &t);
    cr_expect_eq(t.cosine, c->train.lr_schedule == DS_LR_COSINE, "%s", name);
}

/* sparsify: a sparsifier of that method is created and runs one call. */
static void take_method(const ds_conf *c, const char *name, int value)
{
    ds_sparsify_cfg sc;
    ds_sparsifier *sp = NULL;
    float v[64], val[64];
    uint32_t idx[64];
    ds_sparsify_result res;
    for (int i = 0; i < 64; i++)
        v[i] = (float)((i * 37) % 64) - 31.5f;
    ds_sparsify_cfg_defaults(&sc, c->sparsify.method);
    sc.threshold = (float)c->sparsify.threshold;
    cr_assert_eq(ds_sparsifier_create(&sp, &sc, 64, NULL), 0, "sparsify.method %s", name);
    cr_expect_eq(ds_sparsifier_method(sp), c->sparsify.method);
    cr_expect_eq(ds_sparsify_select(sp, v, 64, c->sparsify.density, idx, val, 64, &res), 0, "%s",
                 name);
    ds_sparsifier_destroy(&sp);
    cr_expect_str_eq(ds_sparsify_method_name(value), name);
    cr_expect_eq(ds_sparsify_method_parse(name), value);
}

/* topology: the schedule of a round, as a whole and for one node. */
static void take_topology(const ds_conf *c, const char *name, int value)
{
    const ds_topo_key key = {.seed = (uint64_t)c->cluster.seed, .epoch = 1, .round = 3};
    uint32_t perm[8], scratch[8], answer[8], to, n;
    cr_expect_eq(ds_topo_targets(c->gossip.topology, &key, 8, perm), 0, "topology %s", name);
    cr_expect_eq(ds_topo_peers(c->gossip.topology, &key, 8, 2, &to, answer, &n, 8, scratch), 0,
                 "topology %s", name);
    enum ds_topo_kind k;
    cr_expect_eq(ds_topo_parse(name, &k), 0);
    cr_expect_eq((int)k, value);
    cr_expect_str_eq(ds_topo_name(c->gossip.topology), name);
}

/* 0 when a gossip engine is created from c's keys (one 64-value layer). */
static int gossip_created(const ds_conf *c)
{
    ds_layer layer = {.name = "fc1", .off = 0, .len = 64, .in = 7, .out = 8};
    float theta[64] = {0};
    ds_gossip_cfg gc = {
        .topology = c->gossip.topology,
        .mix = c->gossip.mix,
        .weight = (float)c->gossip.weight,
        .segments = (int)c->gossip.segments,
        .method = c->sparsify.method,
        .density = c->sparsify.density,
        .error_feedback = c->sparsify.error_feedback,
        .value_format = c->sparsify.value_format,
        .seed = (uint64_t)c->cluster.seed,
        .timeout_ms = (int)c->gossip.timeout_ms,
    };
    ds_gossip *g = NULL;
    const int r = ds_gossip_create(&g, &gc, &layer, 1, 64, theta);
    ds_gossip_destroy(&g);
    return r;
}

/* node/gossip: an engine is created with that mixing rule. */
static void take_mix(const ds_conf *c, const char *name, int value)
{
    cr_expect_eq(gossip_created(c), 0, "gossip.mix %s", name);
    cr_expect_str_eq(ds_mix_name(c->gossip.mix), name);
}

/* node/gossip and node/wire: an engine is created with that value format,
 * and a REQ in that format carries its values in the format's width and
 * decodes to what the engine rounds them to. */
static void take_value_format(const ds_conf *c, const char *name, int value)
{
    cr_expect_eq(gossip_created(c), 0, "value_format %s", name);
    float v[3] = {1.0f / 3.0f, -2.5f, 1e-3f}, q[3];
    memcpy(q, v, sizeof(q));
    ds_wire_values_round((unsigned)c->sparsify.value_format, q, 3);
    ds_wire_msg m = {.h = {.type = DS_MSG_GOSSIP_RESP, .count = 3,
                           .flags = (uint16_t)((unsigned)value << DS_WF_VAL_SHIFT)},
                     .u.values = {.val = v}};
    uint8_t f[256];
    size_t len = 0;
    cr_assert_eq(ds_wire_encode(f, sizeof(f), &m, &len), 0, "value_format %s", name);
    cr_expect_eq(len, DS_WIRE_HDR_SIZE + 8 + 3 * ds_wire_vfmt_width((unsigned)value));
    float got[3];
    ds_wire_limits lim;
    ds_wire_limits_default(&lim);
    ds_wire_msg out;
    cr_assert_eq(ds_wire_decode(f, len, &lim, &(ds_wire_bufs){.val = got, .val_cap = 3}, &out,
                                NULL),
                 DS_DROP_NONE);
    cr_expect_eq(memcmp(got, q, sizeof(q)), 0, "value_format %s", name);
    cr_expect_str_eq(ds_wire_vfmt_name((unsigned)c->sparsify.value_format), name);
}

/* node/runtime: the group's sparsifier of that mode is made (none: no
 * sparsifier, the dense mean) and a member step of that method runs with
 * it. */
static void take_group_sparsify(const ds_conf *c, const char *name, int value)
{
    ds_sparsifier *sp = NULL;
    const uint32_t layers[3] = {0, 40, 64};
    cr_assert_eq(ds_hier_sparsifier_create(c->group.sparsify, 64, layers, 2, &sp), 0, "%s", name);
    if (value == DS_GROUP_SPARSIFY_NONE) {
        cr_expect_null(sp, "group.sparsify none makes no sparsifier");
        return;
    }
    cr_assert_not_null(sp);
    float g[64], res[64] = {0}, val[64], sq[16];
    uint32_t idx[64];
    for (int i = 0; i < 64; i++)
        g[i] = (float)((i * 37) % 64) - 31.5f;
    ds_sparsify_result r;
    if (value == DS_GROUP_SPARSIFY_MICRO) {
        cr_expect_eq(ds_sparsifier_method(sp), DS_SPARSIFY_MICRO);
        cr_expect_eq(ds_micro_ef_step(sp, res, g, 64, 2, 1, 0, c->group.density, idx, val, 64,
                                      &r), 0, "%s", name);
    } else {
        cr_expect_eq(value, DS_GROUP_SPARSIFY_DEFT);
        cr_expect_eq(ds_sparsifier_method(sp), DS_SPARSIFY_DEFT);
        cr_expect_eq(ds_deft_group_units(sp, 2), 3, "the 40-entry layer cut in two");
        cr_expect_eq(ds_deft_ef_step(sp, res, g, 64, 2, 1, 0, c->group.density, idx, val, 64, sq,
                                     &r), 0, "%s", name);
    }
    cr_expect_gt(r.count, 0);
    ds_sparsifier_destroy(&sp);
}

/* node/gossip: a group reduction with that algorithm runs on the fake
 * network, three members, and every member ends with the mean. */
struct algo_member {
    ds_fakenet *net;
    uint32_t me;
    enum ds_greduce_algo algo;
    float v[30];
    int ret, complete;
};

static void *algo_member_main(void *p)
{
    struct algo_member *m = p;
    ds_greduce *r;
    if ((m->ret = ds_greduce_create(&r, 30)) < 0)
        return NULL;
    ds_greduce_set_algo(r, m->algo);
    ds_greduce_result res;
    m->ret = ds_greduce_run(r, ds_fakenet_io(m->net, m->me), m->v, 30, 30, 3, m->me, NULL, 0,
                            1000000000ull, NULL, &res);
    m->complete = res.complete;
    ds_greduce_destroy(&r);
    return NULL;
}

static void take_group_allreduce(const ds_conf *c, const char *name, int value)
{
    cr_expect_str_eq(ds_greduce_algo_name((enum ds_greduce_algo)c->group.allreduce), name);
    cr_expect_eq((int)c->group.allreduce, value);
    ds_fakenet *net = ds_fakenet_create(3);
    struct algo_member m[3];
    pthread_t th[3];
    for (uint32_t i = 0; i < 3; i++) {
        m[i] = (struct algo_member){.net = net, .me = i,
                                    .algo = (enum ds_greduce_algo)c->group.allreduce};
        for (int j = 0; j < 30; j++)
            m[i].v[j] = (float)(i * 3);
        pthread_create(&th[i], NULL, algo_member_main, &m[i]);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    ds_fakenet_destroy(net);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(m[i].ret, 0, "group.allreduce %s", name);
        cr_expect(m[i].complete, "group.allreduce %s: member %d incomplete", name, i);
        cr_expect_eq(m[i].v[29], 3.0f, "group.allreduce %s: the mean of 0, 3, 6", name);
    }
}

/* node/sec: a session in that mode is set up, and the mode's name is the
 * one logs and tools use. */
static void take_sec_mode(const ds_conf *c, const char *name, int value)
{
    ds_session_params p = {.mode = c->security.mode, .aead = DS_AEAD_XCHACHA20};
    ds_session s;
    cr_assert_eq(ds_crypto_init(), 0);
    cr_expect_eq(ds_session_init(&s, &p, NULL, NULL), 0, "security.mode %s", name);
    ds_session_wipe(&s);
    cr_expect_str_eq(ds_sec_mode_name(c->security.mode), name);
    cr_expect_eq(ds_sec_mode_parse(name), value);
}

static const consumer consumers[] = {
    {"node.log_level", NULL, NULL, take_log_level, false},
    {"train.backend", NULL, NULL, take_backend, true},
    {"train.model", NULL, model_also, take_model, true},
    {"train.lr_schedule", NULL, NULL, take_lr_schedule, true},
    {"sparsify.method", NULL, NULL, take_method, false},
    {"gossip.topology", NULL, NULL, take_topology, false},
    /* crossover mixing is dense only (ds_conf_check). */
    {"gossip.mix", "sparsify.method=none", NULL, take_mix, false},
    {"security.mode", NULL, NULL, take_sec_mode, false},
    {"sparsify.value_format", NULL, NULL, take_value_format, false},
    {"group.sparsify", NULL, NULL, take_group_sparsify, false},
    {"group.allreduce", NULL, NULL, take_group_allreduce, false},
};
#define NCONSUMERS (sizeof(consumers) / sizeof(consumers[0]))

Test(choices, every_enum_key_has_a_consumer)
{
    for (size_t e = 0; e < NENUM; e++) {
        int n = 0;
        for (size_t j = 0; j < NCONSUMERS; j++)
            n += !strcmp(enum_keys[e].key, consumers[j].key);
        cr_expect_eq(n, 1, "%s has %d consumer cases in tests/test_conf.c (want 1)",
                     enum_keys[e].key, n);
    }
    cr_expect_eq(NCONSUMERS, NENUM, "consumer cases for keys that are not enum keys");
}

Test(choices, every_choice_is_taken_by_its_consumer)
{
    for (size_t j = 0; j < NCONSUMERS; j++) {
        const consumer *u = &consumers[j];
        const enum_key *k = NULL;
        for (size_t e = 0; e < NENUM; e++)
            if (!strcmp(enum_keys[e].key, u->key))
                k = &enum_keys[e];
        cr_assert_not_null(k, "%s is not an enum key", u->key);
        ds_train_cfg seen[32];
        cr_assert_leq(k->n, 32);
        for (size_t i = 0; i < k->n; i++) {
            const char *also = u->also ? u->also(k->names[i]) : u->also_set;
            ds_conf c = with_choice(k, i, also);
            char err[DS_CONF_ERR_MAX] = "";
            cr_expect_eq(ds_conf_check(&c, err, sizeof(err)), 0, "%s=%s: %s", k->key, k->names[i],
                         err);
            u->take(&c, k->names[i], k->values[i]);
            if (!u->train_cfg)
                continue;
            ds_run_train_cfg(&c, &seen[i]);
            for (size_t m = 0; m < i; m++)
                cr_expect(memcmp(&seen[m], &seen[i], sizeof(seen[i])) != 0,
                          "%s: %s and %s give the trainer the same settings", k->key,
                          k->names[m], k->names[i]);
        }
    }
}

/* train.device = auto: the local rank from the environment (DSNODE_RANK,
 * then SLURM_LOCALID, then LOCAL_RANK; a value that is not a non-negative
 * integer is passed over) modulo the devices, 0 without a device (this
 * build or machine may have none); an index is taken as it is. */
Test(conf_choices, train_device_auto_is_the_local_rank_modulo_the_devices)
{
    const char *vars[] = {"DSNODE_RANK", "SLURM_LOCALID", "LOCAL_RANK"};
    for (int i = 0; i < 3; i++)
        unsetenv(vars[i]);
    cr_assert_eq(ds_run_local_rank(), 0);
    setenv("LOCAL_RANK", "3", 1);
    cr_assert_eq(ds_run_local_rank(), 3);
    setenv("SLURM_LOCALID", "x2", 1);
    cr_assert_eq(ds_run_local_rank(), 3, "a bad SLURM_LOCALID is passed over");
    setenv("SLURM_LOCALID", "2", 1);
    cr_assert_eq(ds_run_local_rank(), 2);
    setenv("DSNODE_RANK", "-1", 1);
    cr_assert_eq(ds_run_local_rank(), 2, "a negative DSNODE_RANK is passed over");
    setenv("DSNODE_RANK", "5", 1);
    cr_assert_eq(ds_run_local_rank(), 5);

    const int n = ds_ops_cuda_devices();
    cr_assert_geq(n, 0);
    cr_assert_eq(ds_ops_device_auto(5), n ? 5 % n : 0);
    cr_assert_eq(ds_ops_device_auto(0), 0);
    ds_conf c;
    ds_conf_defaults(&c);
    ds_train_cfg t;
    char err[256];
    cr_assert_str_eq(c.train.device, "auto", "the default");
    ds_run_train_cfg(&c, &t);
    cr_assert_eq(t.device, n ? 5 % n : 0);
    cr_assert_eq(ds_conf_set(&c, "train.device=7", err, sizeof(err)), 0, "%s", err);
    ds_run_train_cfg(&c, &t);
    cr_assert_eq(t.device, 7);
    for (int i = 0; i < 3; i++)
        unsetenv(vars[i]);
}
