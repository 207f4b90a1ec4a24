/*
 * tests/test_scale.c: dsbench scale's simulation (tools/dsbench/scale.h):
 * the same seed gives the same bits, and all-reduce keeps every node's
 * model identical. Small (4 nodes, 20 steps) but the real MLP, data, gossip
 * engine and group reduction over the fake network.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "tools/dsbench/scale.h"

static ds_dataset train, test;

static void setup(void)
{
    ds_log_setup("test", DS_LOG_ERROR, NULL);
    char err[1200];
    ds_scale_cfg c;
    ds_scale_cfg_defaults(&c);
    cr_assert_eq(ds_dataset_load_fmnist(&train, &test, c.dataset_dir, NULL, err, sizeof(err)), 0, "%s",
                 err);
}

static void teardown(void)
{
    ds_dataset_free(&train);
    ds_dataset_free(&test);
}

TestSuite(scale, .init = setup, .fini = teardown, .timeout = 300);

static ds_scale_cfg small(enum ds_scale_variant v, enum ds_sparsify_method m)
{
    ds_scale_cfg c;
    ds_scale_cfg_defaults(&c);
    c.N = 4;
    c.variant = v;
    c.method = m;
    c.steps = 20;
    c.batch = 64;
    c.hidden = 32;
    c.groups = 2;
    c.eval_n = 500;
    c.seed = 7;
    return c;
}

static void twice_same(ds_scale_cfg c)
{
    ds_scale_result a, b;
    float *ta = malloc(1 << 22), *tb = malloc(1 << 22);
    cr_assert(ta && tb);
    cr_assert_eq(ds_scale_run(&c, &train, &test, &a, ta), 0);
    cr_assert_eq(ds_scale_run(&c, &train, &test, &b, tb), 0);
    cr_expect_eq(a.diverged_step, -1);
    cr_expect_eq(a.waits_out, 0, "%llu waits ran out", (unsigned long long)a.waits_out);
    cr_expect_eq(a.late, 0, "%llu replies late, deferred or STALE in lock-step",
                 (unsigned long long)a.late);
    cr_expect_eq(memcmp(ta, tb, a.n_params * sizeof(float)), 0, "%s: same seed, other bits",
                 ds_scale_variant_name(c.variant));
    cr_expect_eq(a.acc_avg, b.acc_avg);
    cr_expect_eq(a.consensus, b.consensus);
    cr_expect_gt(a.acc_avg, 0.3, "%s learned nothing: %.3f", ds_scale_variant_name(c.variant),
                 a.acc_avg);
    /* Another seed: other data orders, other bits. */
    c.seed = 8;
    cr_assert_eq(ds_scale_run(&c, &train, &test, &b, tb), 0);
    cr_expect_neq(memcmp(ta, tb, a.n_params * sizeof(float)), 0, "the seed changed nothing");
    free(ta);
    free(tb);
}

Test(scale, crossover_micro_same_seed_same_bits)
{
    twice_same(small(DS_SCALE_CROSSOVER, DS_SPARSIFY_MICRO));
}

Test(scale, hier_same_seed_same_bits_members_alike)
{
    twice_same(small(DS_SCALE_HIER, DS_SPARSIFY_MICRO));
}

Test(scale, allreduce_models_identical)
{
    ds_scale_cfg c = small(DS_SCALE_ALLREDUCE, DS_SPARSIFY_NONE);
    ds_scale_result r;
    cr_assert_eq(ds_scale_run(&c, &train, &test, &r, NULL), 0);
    cr_expect(r.identical, "all-reduce left the nodes' models different");
    cr_expect_eq(r.consensus, 0.0);
    twice_same(c);
}

Test(scale, crossover_dense_models_differ)
{
    /* The identity check can fail: gossip leaves the models apart. */
    ds_scale_cfg c = small(DS_SCALE_CROSSOVER, DS_SPARSIFY_MICRO);
    ds_scale_result r;
    cr_assert_eq(ds_scale_run(&c, &train, &test, &r, NULL), 0);
    cr_expect(!r.identical);
    cr_expect_gt(r.consensus, 0.0);
}

/* --model cnn: the same engine with train.model = cnn's net; the same seed
 * gives the same bits, and it learns. */
Test(scale, cnn_same_seed_same_bits)
{
    ds_scale_cfg c = small(DS_SCALE_CROSSOVER, DS_SPARSIFY_MICRO);
    c.cnn = 1;
    c.lr = 0.05;
    twice_same(c);
}

/* DEFT inside the groups: the same seed gives the same bits. */
Test(scale, hier_deft_same_seed_same_bits)
{
    twice_same(small(DS_SCALE_HIER_DEFT, DS_SPARSIFY_MICRO));
}
