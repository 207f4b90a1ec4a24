/*
 * tools/dsbench/bench_train.c: `dsbench train`: samples/s and final test
 * accuracy of one dsnode CPU node (the MLP 784-256-256-10, or with --model
 * cnn the CNN of train.model = cnn; batch 64, one BLAS thread), beside
 * PyTorch training the same net with the same data, batch, initialisation
 * rule and optimizer on one thread (tools/torch_mlp.py), measured in the
 * same run. Rounds alternate dsnode and PyTorch so both see the same
 * machine load; the best round of each is reported, and the ratio of the
 * two.
 *
 *   dsbench train [--model mlp|cnn] [--steps N] [--rounds R] [--batch B] [--lr LR]
 *                 [--gpu] [--no-torch] [--json]
 *
 * --gpu: dsnode on CUDA device 0 too, its row beside the CPU's (the same
 * steps, data and initialisation; the accuracies should agree within
 * noise). Without a CUDA build or device it fails (exit 1) saying why.
 *
 * --lr: the peak learning rate of both (default the node's, 0.05; the CNN
 * does best at about 0.03, docs/benchmarks.md).
 *
 * OpenBLAS's kernels are those dsbench re-executed itself with (the best
 * for this CPU), or those OPENBLAS_CORETYPE names when the environment
 * sets it; PyTorch inherits the same variable. Rows say which (`openblas`);
 * a warning says when they are weaker than the CPU's.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "node/sec/crypto.h"
#include "node/train/train.h"
#include "node/wire/wire.h"
#include "tools/dsbench/bench.h"

typedef struct run_result {
    double samples_per_s, test_acc, train_s;
    char backend[96];
} run_result;

static int run_dsnode(int cnn, int gpu, int steps, int batch, double lr, run_result *r)
{
    ds_train_cfg c;
    ds_trainer t;
    char err[512];
    ds_train_cfg_defaults(&c);
    c.model = cnn ? DS_TRAIN_CNN : DS_TRAIN_MLP;
    c.backend = gpu ? DS_OPS_CUDA : DS_OPS_CPU;
    c.device = 0;
    c.batch = batch;
    c.threads = 1;
    c.total_steps = steps;
    if (lr > 0)
        c.lr = lr;
    if (ds_trainer_init(&t, &c, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsbench train: %s\n", err);
        return -1;
    }
    const double t0 = ds_bench_now();
    for (int s = 0; s < steps; s++) {
        if (ds_trainer_compute_grad(&t, NULL, NULL) < 0) {
            fprintf(stderr, "dsbench train: step %d failed\n", s);
            ds_trainer_fini(&t);
            return -1;
        }
        ds_trainer_apply_grad(&t);
    }
    if (t.ops.sync() < 0) {
        fprintf(stderr, "dsbench train: %s failed: %s\n", t.ops.name,
                t.ops.error ? t.ops.error() : "?");
        ds_trainer_fini(&t);
        return -1;
    }
    r->train_s = ds_bench_now() - t0;
    r->samples_per_s = (double)steps * batch / r->train_s;
    snprintf(r->backend, sizeof(r->backend), "%s", t.ops.name);
    if (ds_trainer_evaluate(&t, NULL, &r->test_acc) < 0) {
        fprintf(stderr, "dsbench train: evaluation on %s failed\n", t.ops.name);
        ds_trainer_fini(&t);
        return -1;
    }
    fprintf(stderr, "dsnode  (%s, OpenBLAS %s): %.0f samples/s, test_acc %.4f\n", t.ops.name,
            ds_blas_corename(), r->samples_per_s, r->test_acc);
    ds_trainer_fini(&t);
    return 0;
}

static int run_torch(int cnn, int steps, int batch, double lr, run_result *r)
{
    char cmd[1024], line[1024], lr_arg[64] = "";
    if (lr > 0)
        snprintf(lr_arg, sizeof(lr_arg), " --lr %.17g", lr);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 %s/torch_mlp.py --model %s --steps %d --batch %d --threads 1%s",
             ds_bench_tools_dir(), cnn ? "cnn" : "mlp", steps, batch, lr_arg);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    int ok = 0;
    while (fgets(line, sizeof(line), p)) {
        const char *a = strstr(line, "\"samples_per_s\": ");
        const char *b = strstr(line, "\"test_acc\": ");
        const char *c = strstr(line, "\"train_s\": ");
        if (a && b && c) {
            r->samples_per_s = strtod(a + 17, NULL);
            r->test_acc = strtod(b + 12, NULL);
            r->train_s = strtod(c + 11, NULL);
            ok = 1;
        }
    }
    int st = pclose(p);
    if (!ok || st != 0) {
        fprintf(stderr, "dsbench train: PyTorch baseline failed (%s)\n", cmd);
        return -1;
    }
    fprintf(stderr, "pytorch (cpu, 1 thread): %.0f samples/s, test_acc %.4f\n", r->samples_per_s,
            r->test_acc);
    return 0;
}

int ds_bench_train(int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"steps", required_argument, NULL, 's'},
        {"rounds", required_argument, NULL, 'r'},
        {"batch", required_argument, NULL, 'b'},
        {"no-torch", no_argument, NULL, 'T'},
        {"model", required_argument, NULL, 'm'},
        {"lr", required_argument, NULL, 'l'},
        {"gpu", no_argument, NULL, 'g'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, steps = 3000, rounds = 2, batch = 64, torch = 1, cnn = 0, gpu = 0, bad = 0, opt;
    double lr = 0;
    char *end;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = 1; break;
        case 's': steps = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'T': torch = 0; break;
        case 'g': gpu = 1; break;
        case 'l':
            lr = strtod(optarg, &end);
            bad = end == optarg || *end || !(lr > 0 && lr < 10);
            break;
        case 'm':
            if (!strcmp(optarg, "cnn"))
                cnn = 1;
            else if (strcmp(optarg, "mlp"))
                bad = 1;
            break;
        default: bad = 1; /* an unknown option or a missing value */
        }
    }
    if (bad || optind < argc) {
        fprintf(stderr, "usage: dsbench train [--model mlp|cnn] [--steps N] [--rounds R] [--batch B] "
                        "[--lr LR (0 < LR < 10)] [--gpu] [--no-torch] [--json]\n");
        return 2;
    }
    if (steps < 1 || rounds < 1 || batch < 1) {
        fprintf(stderr, "dsbench train: steps, rounds and batch must be >= 1\n");
        return 2;
    }
    ds_log_setup("dsbench", DS_LOG_WARN, NULL);
    const char *want = ds_blas_wanted_coretype(), *env = getenv("OPENBLAS_CORETYPE");
    if (want)
        fprintf(stderr, "dsbench train: warning: OpenBLAS runs its %s kernels (OPENBLAS_CORETYPE=%s); "
                        "this CPU's best are %s: unset OPENBLAS_CORETYPE to measure with them\n",
                ds_blas_corename(), env ? env : "", want);

    if (gpu) {
        char why[256];
        ds_ops probe;
        if (ds_ops_init_cuda(&probe, 0, why, sizeof(why)) < 0) {
            fprintf(stderr, "dsbench train: --gpu: %s\n", why);
            return 1;
        }
        ds_ops_fini(&probe);
    }

    run_result best_ds = {0}, best_gpu = {0}, best_pt = {0};
    for (int r = 0; r < rounds; r++) {
        run_result a, g, b = {0};
        if (run_dsnode(cnn, 0, steps, batch, lr, &a) < 0)
            return 1;
        if (a.samples_per_s > best_ds.samples_per_s)
            best_ds = a;
        if (gpu) {
            if (run_dsnode(cnn, 1, steps, batch, lr, &g) < 0)
                return 1;
            if (g.samples_per_s > best_gpu.samples_per_s)
                best_gpu = g;
        }
        if (torch) {
            if (run_torch(cnn, steps, batch, lr, &b) < 0)
                return 1;
            if (b.samples_per_s > best_pt.samples_per_s)
                best_pt = b;
        }
    }

    ds_row row;
    ds_row_table(&row, json);
    const run_result *rows[3] = {&best_ds, gpu ? &best_gpu : NULL, torch ? &best_pt : NULL};
    static const char *const impl[3] = {"dsnode", "dsnode", "pytorch"};
    for (int i = 0; i < 3; i++) {
        if (!rows[i])
            continue;
        ds_row_str(&row, "impl", impl[i]);
        ds_row_str(&row, "backend", i == 2 ? "cpu, 1 thread" : rows[i]->backend);
        ds_row_str(&row, "model", cnn ? "cnn" : "mlp");
        ds_row_str(&row, "openblas", i == 1 ? "-" : ds_blas_corename());
        ds_row_int(&row, "steps", steps);
        ds_row_int(&row, "batch", batch);
        ds_row_num(&row, "samples_per_s", rows[i]->samples_per_s, 0);
        ds_row_num(&row, "test_acc", rows[i]->test_acc, 4);
        ds_row_num(&row, "speedup_vs_torch",
                   torch ? rows[i]->samples_per_s / best_pt.samples_per_s : NAN, 2);
        ds_row_end(&row);
    }
    return 0;
}
