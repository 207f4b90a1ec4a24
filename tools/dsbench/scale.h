/*
 * tools/dsbench/scale.h: the in-process simulation behind dsbench scale
 * (bench_scale.c): N nodes, each a real MLP with its own optimizer and data
 * order, mixing through the real gossip engine over node/gossip/fake.c.
 * Also linked by tests/test_scale.c (determinism, all-reduce identity).
 *
 * Not thread-safe: one ds_scale_run at a time per process (it sets the
 * BLAS thread count).
 */
#ifndef DS_TOOLS_SCALE_H
#define DS_TOOLS_SCALE_H

#include <stddef.h>
#include <stdint.h>

#include "node/train/data.h"
#include "sparsify/sparsify.h"

enum ds_scale_variant {
    DS_SCALE_ALLREDUCE,       /* exact mean of the gradients, ring all-reduce */
    DS_SCALE_CROSSOVER,       /* crossover topology, `segments` segments */
    DS_SCALE_CROSSOVER_NOSEG, /* crossover, one segment (the ablation) */
    DS_SCALE_EXPONENTIAL,     /* SGP's one-peer exponential graph */
    DS_SCALE_RANDOM,          /* random unbalanced targets (no fairness) */
    DS_SCALE_HIER,            /* `groups` groups, crossover between them */
    DS_SCALE_HIER_MICRO,      /* as HIER, MiCRO inside the groups (group.sparsify = micro) */
    DS_SCALE_HIER_DEFT,       /* as HIER, DEFT inside the groups (group.sparsify = deft) */
};

typedef struct ds_scale_cfg {
    char dataset_dir[1024];
    int N;                    /* simulated nodes, 2..256 */
    enum ds_scale_variant variant;
    enum ds_sparsify_method method; /* none: dense */
    double density;
    int segments, groups;
    int steps, batch;         /* batch: the global batch, a multiple of N */
    int hidden;               /* MLP 784-hidden-hidden-10 */
    int cnn;                  /* 1: train.model = cnn's net instead of the MLP */
    double lr, momentum, weight_decay;
    uint64_t seed;
    size_t eval_n;            /* test examples each node's own accuracy uses */
} ds_scale_cfg;

typedef struct ds_scale_result {
    double acc_avg;           /* the nodes' average model, whole test set */
    double acc_nodes;         /* mean of the nodes' accuracies on eval_n examples */
    double consensus;         /* (1/N) sum_i |x_i - mean|^2 */
    double bytes_per_node_step;
    double begin_us_per_node_step; /* thread CPU time in ds_gossip_begin */
    double wall_s;
    size_t n_params;
    int identical;            /* every node ends with the same bits */
    uint64_t waits_out;       /* waits that ran out (fake network timeouts) */
    uint64_t late;            /* late replies + deferred + STALE, all nodes */
    int diverged_step;        /* -1, or the step at which every node stopped
                               * because one's loss was not finite */
} ds_scale_result;

void ds_scale_cfg_defaults(ds_scale_cfg *c);
const char *ds_scale_variant_name(enum ds_scale_variant v);

/* One simulated run. theta0_out (n_params floats, may be NULL) receives
 * node 0's final parameters. 0, or -EINVAL (bad shape), -ENOMEM,
 * -ETIMEDOUT (an exchange or reduction failed: never expected here). */
int ds_scale_run(const ds_scale_cfg *c, const ds_dataset *train, const ds_dataset *test,
                 ds_scale_result *out, float *theta0_out);

#endif
