/*
 * tools/dsbench/bench_scale_cmd.c: dsbench scale (issue 18). Three tables:
 *
 *   1. fixed global batch, N = 8..64 simulated nodes, every variant, dense
 *      and with each sparsifier of --sparsifiers (MiCRO, SAGE, Top-k) at
 *      each density of --densities (1%, 0.1%) (Crossover-SGD Fig. 8,
 *      scaled down);
 *   2. fixed N, growing global batch (Fig. 7);
 *   3. the sparsifiers against the number of workers: selection time per
 *      worker and bytes per worker and step, MiCRO and DEFT partitioned
 *      against Top-k all-gather (MiCRO / DEFT's claim).
 *
 * The simulation is bench_scale.c (scale.h). --quick bounds steps and the
 * node sizes so the whole command takes about 10 minutes on 2 cores.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/splitmix.h"
#include "node/train/data.h"
#include "sparsify/sparsify.h"
#include "tools/dsbench/bench.h"
#include "tools/dsbench/scale.h"

static void sim_row(ds_row *row, const ds_scale_cfg *c, const ds_scale_result *r)
{
    ds_row_int(row, "nodes", c->N);
    ds_row_int(row, "global_batch", c->batch);
    ds_row_str(row, "model", c->cnn ? "cnn" : "mlp");
    ds_row_str(row, "variant", ds_scale_variant_name(c->variant));
    ds_row_str(row, "sparsifier", c->method == DS_SPARSIFY_NONE ? "dense"
                                                                : ds_sparsify_method_name(c->method));
    ds_row_num(row, "density", c->method == DS_SPARSIFY_NONE ? 1.0 : c->density, 3);
    ds_row_int(row, "steps", c->steps);
    ds_row_num(row, "acc_avg_model", 100.0 * r->acc_avg, 2);
    ds_row_num(row, "acc_nodes_mean", 100.0 * r->acc_nodes, 2);
    ds_row_num(row, "consensus", r->consensus, 4);
    ds_row_num(row, "kb_per_node_step", r->bytes_per_node_step / 1e3, 1);
    ds_row_num(row, "begin_us_per_node_step", r->begin_us_per_node_step, 1);
    ds_row_int(row, "diverged_at", r->diverged_step);
    ds_row_int(row, "waits_out", (int64_t)r->waits_out);
    ds_row_int(row, "late", (int64_t)r->late);
    ds_row_num(row, "wall_s", r->wall_s, 1);
}

static int sim_one(ds_row *row, ds_scale_cfg *c, const ds_dataset *train, const ds_dataset *test)
{
    ds_scale_result r;
    int e = ds_scale_run(c, train, test, &r, NULL);
    if (e < 0) {
        fprintf(stderr, "dsbench scale: N=%d %s %s: %s\n", c->N, ds_scale_variant_name(c->variant),
                ds_sparsify_method_name(c->method), strerror(-e));
        return e;
    }
    sim_row(row, c, &r);
    return ds_row_end(row);
}

/* ---- table 3: sparsifiers against workers ------------------------------- */

static void fill_worker(float *v, size_t n, uint64_t seed, uint32_t r)
{
    /* Each worker's gradient: a shared heavy-tailed signal plus its own
     * noise of the same scale (gradients of one step on different data). */
    ds_splitmix64 a = {.state = seed}, b = {.state = seed ^ (0x9e37u * (r + 1))};
    for (size_t i = 0; i < n; i++) {
        const double u = ((double)(ds_splitmix64_next(&a) >> 11) + 0.5) / 9007199254740992.0;
        const double w = ((double)(ds_splitmix64_next(&b) >> 11) + 0.5) / 9007199254740992.0;
        v[i] = (float)(tan(M_PI * (u - 0.5)) * 1e-3 + (w - 0.5) * 2e-3);
    }
}

static int sparsify_table(int json, size_t n, double d, int reps, const int *workers, int nw)
{
    ds_row row;
    ds_row_table(&row, json);
    float *v = malloc(n * sizeof(float));
    uint32_t *idx = malloc(n * sizeof(uint32_t));
    float *val = malloc(n * sizeof(float));
    uint8_t *seen = malloc(n);
    enum { L = 10 };
    uint32_t layer_off[L + 1];
    for (int l = 0; l <= L; l++)
        layer_off[l] = (uint32_t)(n * (size_t)l / L);
    int rc = 0;
    if (!v || !idx || !val || !seen) {
        rc = -ENOMEM;
        goto out;
    }
    const size_t k = ds_sparsify_k(n, d);
    for (int wi = 0; wi < nw && rc == 0; wi++) {
        const unsigned W = (unsigned)workers[wi];
        static const enum ds_sparsify_method methods[] = {DS_SPARSIFY_MICRO, DS_SPARSIFY_DEFT,
                                                           DS_SPARSIFY_TOPK};
        for (int mi = 0; mi < 3 && rc == 0; mi++) {
            const enum ds_sparsify_method m = methods[mi];
            double t_sum = 0;
            size_t sent = 0;
            memset(seen, 0, n);
            size_t uni = 0;
            uint32_t unit_off[L * 256 + 1];
            size_t n_units = 0, k_unit[L * 256];
            uint32_t bin[L * 256];
            double norms[L * 256];
            if (m == DS_SPARSIFY_DEFT &&
                (rc = ds_deft_units(layer_off, L, W, unit_off, L * 256 + 1, &n_units)) < 0)
                break;
            if (m == DS_SPARSIFY_DEFT) {
                /* The allocation and the packing must be the same on every
                 * member, or some units are selected twice and others by
                 * nobody: they come from the group's unit norms (an
                 * all-reduce of n_units numbers), here the root mean square
                 * of the workers' own. */
                memset(norms, 0, n_units * sizeof(*norms));
                for (unsigned r = 0; r < W; r++) {
                    fill_worker(v, n, 4242, r);
                    for (size_t u = 0; u < n_units; u++)
                        for (uint32_t i = unit_off[u]; i < unit_off[u + 1]; i++)
                            norms[u] += (double)v[i] * v[i];
                }
                for (size_t u = 0; u < n_units; u++)
                    norms[u] = sqrt(norms[u] / W);
                if (ds_deft_alloc(unit_off, n_units, norms, k, k_unit) < 0 ||
                    ds_deft_pack(unit_off, k_unit, n_units, W, bin, NULL) < 0) {
                    rc = -EINVAL;
                    break;
                }
            }
            for (unsigned r = 0; r < W && rc == 0; r++) {
                fill_worker(v, n, 4242, r);
                ds_sparsify_cfg sc;
                ds_sparsify_cfg_defaults(&sc, m == DS_SPARSIFY_DEFT ? DS_SPARSIFY_TOPK : m);
                sc.seed = 42 + r;
                ds_sparsifier *s = NULL;
                if ((rc = ds_sparsifier_create(&s, &sc, n, NULL)) < 0)
                    break;
                double best = 1e30;
                ds_sparsify_result res = {0};
                for (int rep = 0; rep < reps + 1 && rc == 0; rep++) {
                    const double t0 = ds_bench_now();
                    if (m == DS_SPARSIFY_MICRO)
                        rc = ds_micro_select_owned(s, v, n, W, r, 0, d, idx, val, n, &res);
                    else if (m == DS_SPARSIFY_DEFT)
                        rc = ds_deft_select_owned(s, v, unit_off, n_units, k_unit, bin, W, r, 0,
                                                  idx, val, n, &res);
                    else
                        rc = ds_sparsify_select(s, v, n, d, idx, val, n, &res);
                    const double t = ds_bench_now() - t0;
                    if (rep > 0 && t < best) /* the first call starts micro's threshold */
                        best = t;
                }
                ds_sparsifier_destroy(&s);
                if (rc < 0)
                    break;
                t_sum += best;
                sent += res.count;
                for (size_t j = 0; j < res.count; j++) {
                    /* Every method's indices are into the whole vector
                     * (micro's too: ds_micro_select_owned). Before this was
                     * fixed, micro's were shifted by its chunk's offset a
                     * second time and the table showed half the union. */
                    const size_t i = idx[j];
                    if (i < n && !seen[i]) {
                        seen[i] = 1;
                        uni++;
                    }
                }
            }
            if (rc < 0)
                break;
            const int gather = m == DS_SPARSIFY_TOPK;
            ds_row_int(&row, "workers", W);
            ds_row_str(&row, "method", m == DS_SPARSIFY_TOPK ? "topk all-gather"
                                       : m == DS_SPARSIFY_MICRO ? "micro partitioned"
                                                                : "deft partitioned");
            ds_row_int(&row, "n", (int64_t)n);
            ds_row_num(&row, "density", d, 3);
            ds_row_num(&row, "select_us_per_worker", 1e6 * t_sum / W, 1);
            ds_row_num(&row, "selected_per_worker", (double)sent / W, 0);
            ds_row_num(&row, "kb_sent_per_worker", (double)sent / W * 8 / 1e3, 1);
            /* all-gather: every worker receives every other's list; the
             * partitioned methods reduce one list of the union. */
            ds_row_num(&row, "kb_recv_per_worker",
                       gather ? (double)sent / W * 8 * (W - 1) / 1e3 : (double)uni * 8 / 1e3, 1);
            ds_row_num(&row, "union_over_k", (double)uni / (double)k, 2);
            if ((rc = ds_row_end(&row)) < 0)
                break;
        }
    }
out:
    if (rc < 0)
        fprintf(stderr, "dsbench scale: sparsifier table: %s\n", strerror(-rc));
    free(v);
    free(idx);
    free(val);
    free(seen);
    return rc;
}

static int parse_list(const char *s, int *out, int max)
{
    int k = 0;
    while (*s && k < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 2 || v > 256)
            return -1;
        out[k++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return k;
}

/* Sparsifier names (sparsify.h), comma-separated; none is the dense row,
 * always run. Returns the count, or -1 on a name that is not a method. */
static int parse_methods(const char *s, enum ds_sparsify_method *out, int max)
{
    int k = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const int m = ds_sparsify_method_parse(t);
        if (m < 0 || m == DS_SPARSIFY_NONE || k >= max)
            return -1;
        out[k++] = (enum ds_sparsify_method)m;
    }
    return k > 0 ? k : -1;
}

/* Densities in (0, 1), comma-separated. Returns the count, or -1. */
static int parse_densities(const char *s, double *out, int max)
{
    int k = 0;
    while (*s && k < max) {
        char *end;
        const double v = strtod(s, &end);
        if (end == s || !(v > 0.0 && v < 1.0) || (*end && *end != ','))
            return -1;
        out[k++] = v;
        s = *end == ',' ? end + 1 : end;
    }
    return k > 0 && !*s ? k : -1;
}

/* name is one of the comma-separated items of list. */
static int listed(const char *list, const char *name)
{
    const size_t len = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, len) && (p[len] == ',' || p[len] == 0))
            return 1;
    return 0;
}

int ds_bench_scale(int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"quick", no_argument, NULL, 'q'},
        {"nodes", required_argument, NULL, 'n'},
        {"steps", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},
        {"table", required_argument, NULL, 't'},
        {"seed", required_argument, NULL, 'S'},
        {"dataset", required_argument, NULL, 'd'},
        {"variant", required_argument, NULL, 'v'},
        {"sparsifiers", required_argument, NULL, 'm'},
        {"densities", required_argument, NULL, 'D'},
        {"model", required_argument, NULL, 'M'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, quick = 0, bad = 0, opt, steps = 0, batch = 1024;
    int nodes[8] = {8, 16, 32, 64}, n_nodes = 4;
    /* Issue 18: every variant dense and with MiCRO, SAGE and Top-k at 1%
     * and at 0.1%. */
    enum ds_sparsify_method methods[8] = {DS_SPARSIFY_MICRO, DS_SPARSIFY_SAGE, DS_SPARSIFY_TOPK};
    int n_methods = 3;
    double densities[8] = {0.01, 0.001};
    int n_densities = 2;
    const char *table = "all", *only = NULL;
    ds_scale_cfg base;
    ds_scale_cfg_defaults(&base);
    optind = 0;
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = 1; break;
        case 'q': quick = 1; break;
        case 'n': bad = (n_nodes = parse_list(optarg, nodes, 8)) <= 0; break;
        case 's': steps = atoi(optarg); bad = steps < 1; break;
        case 'b': batch = atoi(optarg); bad = batch < 2; break;
        case 't': table = optarg; break;
        case 'S': base.seed = strtoull(optarg, NULL, 10); break;
        case 'v': only = optarg; break;
        case 'm':
            if ((bad = (n_methods = parse_methods(optarg, methods, 8)) <= 0))
                fprintf(stderr, "dsbench scale: --sparsifiers expects up to 8 of random, topk, "
                                "threshold, sage, micro, deft, comma-separated; found '%s'\n",
                        optarg);
            break;
        case 'D':
            if ((bad = (n_densities = parse_densities(optarg, densities, 8)) <= 0))
                fprintf(stderr, "dsbench scale: --densities expects up to 8 numbers in (0, 1), "
                                "comma-separated; found '%s'\n",
                        optarg);
            break;
        case 'd': snprintf(base.dataset_dir, sizeof(base.dataset_dir), "%s", optarg); break;
        case 'M':
            base.cnn = !strcmp(optarg, "cnn");
            if ((bad = !base.cnn && strcmp(optarg, "mlp") != 0))
                fprintf(stderr, "dsbench scale: --model expects mlp or cnn; found '%s'\n",
                        optarg);
            break;
        default: bad = 1;
        }
    }
    const int t_train = !strcmp(table, "all") || !strcmp(table, "nodes");
    const int t_batch = !strcmp(table, "all") || !strcmp(table, "batch");
    const int t_sparse = !strcmp(table, "all") || !strcmp(table, "sparsify");
    if (bad || optind < argc || !(t_train || t_batch || t_sparse)) {
        fprintf(stderr, "usage: dsbench scale [--quick] [--json] [--nodes 8,16,32,64] [--steps S] "
                        "[--batch B] [--table all|nodes|batch|sparsify] [--seed X] [--dataset DIR] [--variant NAME[,NAME...]]\n"
                        "                     [--sparsifiers micro,sage,topk,...] [--densities 0.01,0.001] [--model mlp|cnn]\n");
        return 2;
    }
    for (int i = 0; i < n_nodes; i++)
        if (batch % nodes[i]) {
            fprintf(stderr, "dsbench scale: --batch %d is not a multiple of %d nodes\n", batch,
                    nodes[i]);
            return 2;
        }
    ds_log_setup("dsbench", DS_LOG_ERROR, NULL);
    base.steps = steps ? steps : quick ? 150 : 600;
    base.batch = batch;
    base.hidden = quick ? 128 : 256;
    base.eval_n = quick ? 1000 : 10000;
    int rc = 0;
    ds_dataset train = {0}, test = {0};
    char err[1200];
    if ((t_train || t_batch) &&
        ds_dataset_load_fmnist(&train, &test, base.dataset_dir, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsbench scale: %s\n", err);
        return 1;
    }
    ds_row row;
    if (t_train) {
        ds_row_table(&row, json);
        static const enum ds_scale_variant vs[] = {DS_SCALE_ALLREDUCE, DS_SCALE_CROSSOVER,
                                                   DS_SCALE_CROSSOVER_NOSEG, DS_SCALE_EXPONENTIAL,
                                                   DS_SCALE_RANDOM, DS_SCALE_HIER,
                                                   DS_SCALE_HIER_MICRO, DS_SCALE_HIER_DEFT};
        for (int i = 0; i < n_nodes && rc == 0; i++)
            for (size_t v = 0; v < sizeof(vs) / sizeof(vs[0]) && rc == 0; v++)
                for (int sp = 0; sp <= n_methods * n_densities && rc == 0; sp++) {
                    /* sp 0: dense; then each sparsifier at each density. */
                    ds_scale_cfg c = base;
                    c.N = nodes[i];
                    c.variant = vs[v];
                    c.method = sp ? methods[(sp - 1) / n_densities] : DS_SPARSIFY_NONE;
                    c.density = sp ? densities[(sp - 1) % n_densities] : base.density;
                    if (only && !listed(only, ds_scale_variant_name(vs[v])))
                        continue;
                    if (vs[v] == DS_SCALE_ALLREDUCE && sp)
                        continue; /* all-reduce is dense */
                    if ((vs[v] == DS_SCALE_HIER || vs[v] == DS_SCALE_HIER_MICRO ||
                         vs[v] == DS_SCALE_HIER_DEFT) &&
                        c.N <= c.groups)
                        continue; /* groups of one: flat crossover */
                    if (quick && sp == 0 && vs[v] != DS_SCALE_ALLREDUCE &&
                        vs[v] != DS_SCALE_CROSSOVER)
                        continue; /* --quick: the ablations sparse only */
                    rc = sim_one(&row, &c, &train, &test);
                }
    }
    if (t_batch && rc == 0) {
        ds_row_table(&row, json);
        static const int batches[] = {256, 1024, 4096};
        for (int b = 0; b < 3 && rc == 0; b++)
            for (int v = 0; v < 2 && rc == 0; v++) {
                ds_scale_cfg c = base;
                c.N = 16;
                c.batch = batches[b];
                c.variant = v ? DS_SCALE_CROSSOVER : DS_SCALE_ALLREDUCE;
                c.method = v ? DS_SPARSIFY_MICRO : DS_SPARSIFY_NONE;
                c.lr = base.lr * sqrt((double)batches[b] / base.batch);
                rc = sim_one(&row, &c, &train, &test);
            }
    }
    if (t_sparse && rc == 0) {
        static const int ws[] = {8, 16, 32, 64};
        rc = sparsify_table(json, quick ? (size_t)1 << 20 : (size_t)1 << 23, 0.01, quick ? 3 : 5,
                            ws, 4);
    }
    ds_dataset_free(&train);
    ds_dataset_free(&test);
    return rc < 0 ? 1 : 0;
}
