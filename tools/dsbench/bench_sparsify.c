/*
 * tools/dsbench/bench_sparsify.c: `dsbench sparsify`: what one selection
 * costs (sparsify/sparsify.h), for every method, beside two baselines
 * measured in the same run on the same array:
 *   read   a plain streaming read of the array (ds_ops.sum: the best any
 *          one-pass method can do),
 *   topk   our exact top-k (radix select: a histogram pass, a compaction
 *          pass, no sort), the method the threshold sparsifiers replace.
 * and, when PyTorch answers, torch.topk and numpy.argpartition on arrays
 * of the same size and distribution (tools/sparsify_torch.py, one thread
 * like ours), run first, before our arrays exist; every row then also
 * says how much faster than torch.topk it is.
 *
 * Data: gradient-like floats (Gaussian, per-entry scales over two decades),
 * fixed seed. Each method's sparsifier is created once per (n, density)
 * and called twice before timing, so SAGE, MiCRO and the hard threshold
 * are past their threshold start and every scratch buffer has grown:
 * the figures are steady-state calls. Cases alternate inside every
 * repetition and the fastest repetition of each is kept, so all see the
 * same machine load (2 shared cores here). Small arrays run several calls
 * per timed block so that a block lasts a few milliseconds.
 *
 * DEFT needs layers: the array is cut like a model's parameters, ten
 * weight layers of near-equal length, each followed by a 1000-entry bias.
 *
 *   dsbench sparsify [--sizes 1M,25M,100M] [--reps R] [--no-torch] [--gpu] [--json]
 *
 * Memory: the array plus worst-case idx / val buffers (12 bytes per entry:
 * 1.2 GB at 100M); the PyTorch script, alone before that, about 2.5 GB.
 *
 * --gpu measures on CUDA device 0 instead, with the array, idx and val in
 * device memory and the sparsifiers on the CUDA selection table: SAGE,
 * MiCRO and our exact top-k, beside two baselines in the same run
 * (bench_sparsify_gpu.cu): a kernel reading every float once (the
 * bandwidth bound of any one-pass method) and CUB's radix-sort top-k
 * (cub::DeviceRadixSort::SortPairsDescending over magnitude keys, the
 * first k taken). Rows give ms per call, the GB/s that is (the array's
 * bytes over the time), the ratio to the read and the speedup over CUB.
 * A sparsifier call returns its count on the host, so its time includes
 * the waits for its tallies; the baselines run back to back and wait once
 * per block, which is their best case. As a check, our top-k's k-th |v|
 * must equal CUB's. No torch run. Without a CUDA build or a device it
 * says why and exits 1; it never prints a number it did not measure.
 * Memory on the device: 28 bytes per entry (2.8 GB at 100M).
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/splitmix.h"
#include "kernels/cpu.h"
#include "kernels/kernels.h"
#include "kernels/select.h"
#include "sparsify/sparsify.h"
#include "tools/dsbench/bench.h"
#if HAVE_CUDA
#include "tools/dsbench/bench_gpu.h"
#endif

#define MAX_SIZES 8
#define N_DENS 2
static const double densities[N_DENS] = {0.001, 0.01};

static volatile double sink;

static uint64_t next(uint64_t *s)
{
    return ds_splitmix64_step(s);
}

/* Gaussian (Box-Muller, two at a time) times a per-entry scale in
 * [1, 10): the shape the test suite uses for gradients. */
static void fill(float *v, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = ((next(&s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        const double u2 = (next(&s) >> 11) * (1.0 / 9007199254740992.0);
        const double r = sqrt(-2.0 * log(u1)) * 1e-3;
        const double sc0 = exp(2.3 * (double)(i * 2654435761u % 1000) / 1000.0);
        v[i] = (float)(r * cos(6.283185307179586 * u2) * sc0);
        if (i + 1 < n) {
            const double sc1 = exp(2.3 * (double)((i + 1) * 2654435761u % 1000) / 1000.0);
            v[i + 1] = (float)(r * sin(6.283185307179586 * u2) * sc1);
        }
    }
}

/* "1M", "25M", "100000" -> entries; 0 on error. */
static size_t parse_size(const char *s)
{
    char *end;
    double x = strtod(s, &end);
    if (end == s || x <= 0)
        return 0;
    if (*end == 'M' || *end == 'm')
        x *= 1e6, end++;
    else if (*end == 'K' || *end == 'k')
        x *= 1e3, end++;
    if (*end || x > (double)UINT32_MAX)
        return 0;
    return (size_t)x;
}

enum { C_READ, C_TOPK, C_FIRST_METHOD };
static const enum ds_sparsify_method bench_methods[] = {
    DS_SPARSIFY_SAGE, DS_SPARSIFY_MICRO, DS_SPARSIFY_THRESHOLD, DS_SPARSIFY_RANDOM,
    DS_SPARSIFY_DEFT, DS_SPARSIFY_NONE,
};
#define N_METHODS (sizeof(bench_methods) / sizeof(bench_methods[0]))
#define N_CASES (C_FIRST_METHOD + N_METHODS)

typedef struct result {
    double ms, density;
} result;

/* PyTorch / numpy figures, collected before our own runs (so the two never
 * hold memory at the same time) and printed beside ours. */
#define MAX_TORCH 64
typedef struct torch_row {
    char method[32];
    size_t n;
    double density, ms, achieved;
} torch_row;

/* torch_ms is torch.topk's time for this (n, density), NAN without it. */
static void emit(ds_row *row, const char *method, const char *kernels, size_t n, double d, double ms,
                 double achieved, double topk_ms, double read_ms, double torch_ms)
{
    ds_row_str(row, "method", method);
    ds_row_str(row, "kernels", kernels);
    ds_row_int(row, "n", (int64_t)n);
    ds_row_num(row, "density", d, 3);
    ds_row_num(row, "ms", ms, 3);
    ds_row_num(row, "achieved_density", achieved, 5);
    ds_row_num(row, "speedup_vs_topk", topk_ms / ms, 2);
    ds_row_num(row, "ratio_vs_read", ms / read_ms, 2);
    ds_row_num(row, "speedup_vs_torch_topk", torch_ms / ms, 1);
    ds_row_end(row);
}

/* One (n, density): returns 0 or 1 on failure (printed). */
static int bench_one(size_t n, double d, int reps, const float *v, uint32_t *idx, float *val,
                     const ds_ops *ops, const ds_select_ops *sel, result *out)
{
    ds_sparsifier *sp[N_CASES] = {0};
    int rc = 1;
    /* Ten weight layers, each followed by a 1000-entry bias (DEFT only). */
    uint32_t units[21];
    const size_t bias = n >= 20000 ? 1000 : 0, w = (n - 10 * bias) / 10;
    units[0] = 0;
    for (int l = 0; l < 10; l++) {
        units[2 * l + 1] = units[2 * l] + (uint32_t)(l == 9 ? n - 10 * bias - 9 * w : w);
        units[2 * l + 2] = units[2 * l + 1] + (uint32_t)bias;
    }
    for (size_t c = C_TOPK; c < N_CASES; c++) {
        ds_sparsify_cfg cfg;
        ds_sparsify_cfg_defaults(&cfg, c == C_TOPK ? DS_SPARSIFY_TOPK : bench_methods[c - C_FIRST_METHOD]);
        cfg.seed = 42;
        if (cfg.method == DS_SPARSIFY_DEFT) {
            cfg.unit_off = units;
            cfg.n_units = 20;
        }
        int ret = ds_sparsifier_create(&sp[c], &cfg, n, sel);
        if (ret < 0) {
            fprintf(stderr, "dsbench sparsify: create %s: %s\n", ds_sparsify_method_name(cfg.method), strerror(-ret));
            goto out;
        }
    }
    /* Steady state: threshold starts done, scratch grown. */
    for (size_t c = C_TOPK; c < N_CASES; c++)
        for (int i = 0; i < 2; i++) {
            ds_sparsify_result r;
            int ret = ds_sparsify_select(sp[c], v, n, d, idx, val, n, &r);
            if (ret < 0) {
                fprintf(stderr, "dsbench sparsify: %s n=%zu: %s\n",
                        ds_sparsify_method_name(ds_sparsifier_method(sp[c])), n, strerror(-ret));
                goto out;
            }
        }
    /* Blocks of at least ~4M entries of work. */
    const int iters = n >= 4000000 ? 1 : (int)(4000000 / n);
    double best[N_CASES], selected_sum[N_CASES];
    for (size_t c = 0; c < N_CASES; c++) {
        best[c] = 1e30;
        selected_sum[c] = 0;
    }
    for (int rep = 0; rep < reps; rep++) {
        for (size_t c = 0; c < N_CASES; c++) {
            size_t selected = 0;
            const double t0 = ds_bench_now();
            for (int it = 0; it < iters; it++) {
                if (c == C_READ) {
                    sink = ops->sum(n, v);
                    continue;
                }
                ds_sparsify_result r;
                if (ds_sparsify_select(sp[c], v, n, d, idx, val, n, &r) < 0)
                    goto out;
                selected += r.count;
            }
            const double t = (ds_bench_now() - t0) / iters;
            if (t < best[c])
                best[c] = t;
            selected_sum[c] += (double)selected;
        }
    }
    /* Achieved density: the mean over every timed call (SAGE's varies from
     * call to call with its sampled mean). */
    for (size_t c = 0; c < N_CASES; c++) {
        out[c].ms = best[c] * 1e3;
        out[c].density = c == C_READ ? 1.0 : selected_sum[c] / ((double)reps * iters) / (double)n;
    }
    rc = 0;
out:
    for (size_t c = 0; c < N_CASES; c++)
        ds_sparsifier_destroy(&sp[c]);
    return rc;
}

/* Run tools/sparsify_torch.py; returns how many rows it gave (0 when
 * PyTorch / numpy are missing: a note goes to stderr, our rows still come). */
static size_t torch_collect(const size_t *sizes, size_t nsizes, int reps, torch_row *out)
{
    char cmd[1024], list[256] = "";
    size_t at = 0, got = 0;
    for (size_t i = 0; i < nsizes && at < sizeof(list) - 24; i++)
        at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%zu", i ? "," : "", sizes[i]);
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/sparsify_torch.py --sizes %s --densities %g,%g --reps %d",
             ds_bench_tools_dir(), list, densities[0], densities[1], reps);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "dsbench sparsify: cannot run %s\n", cmd);
        return 0;
    }
    char line[512];
    while (fgets(line, sizeof(line), p)) {
        torch_row t;
        /* {"method": "torch.topk", "n": 1000000, "density": 0.001, "ms": 1.2, "achieved_density": 0.001} */
        if (sscanf(line, "{\"method\": \"%31[^\"]\", \"n\": %zu, \"density\": %lf, \"ms\": %lf, \"achieved_density\": %lf",
                   t.method, &t.n, &t.density, &t.ms, &t.achieved) != 5) {
            fprintf(stderr, "dsbench sparsify: torch: %s", line);
            continue;
        }
        if (got < MAX_TORCH)
            out[got++] = t;
    }
    int st = pclose(p);
    if (st != 0)
        fprintf(stderr, "dsbench sparsify: %s exited with status %d\n", cmd, st);
    return got;
}

/* --sizes LIST into sizes[0..*n). 0, or -EINVAL (said). */
static int parse_sizes(const char *arg, size_t *sizes, size_t *n)
{
    *n = 0;
    char *list = strdup(arg), *save = NULL;
    if (!list)
        return -ENOMEM;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t v = parse_size(tok);
        if (!v || *n == MAX_SIZES) {
            fprintf(stderr, "dsbench sparsify: bad size '%s' (1..2^32-1, suffix K or M, at most %d)\n",
                    tok, MAX_SIZES);
            free(list);
            return -EINVAL;
        }
        sizes[(*n)++] = v;
    }
    free(list);
    return 0;
}

/* ---- --gpu: the sparsifiers on device memory ----------------------------- */

#if HAVE_CUDA
enum { G_READ, G_CUB, G_TOPK, G_SAGE, G_MICRO, G_CASES };
static const enum ds_sparsify_method gpu_methods[G_CASES] = {
    [G_TOPK] = DS_SPARSIFY_TOPK, [G_SAGE] = DS_SPARSIFY_SAGE, [G_MICRO] = DS_SPARSIFY_MICRO,
};

static void emit_gpu(ds_row *row, const char *method, const char *kernels, size_t n, double d,
                     double ms, double achieved, double read_ms, double cub_ms)
{
    ds_row_str(row, "method", method);
    ds_row_str(row, "kernels", kernels);
    ds_row_int(row, "n", (int64_t)n);
    ds_row_num(row, "density", d, 3);
    ds_row_num(row, "ms", ms, 4);
    ds_row_num(row, "gb_per_s", (double)n * sizeof(float) / (ms * 1e-3) / 1e9, 1);
    ds_row_num(row, "achieved_density", achieved, 5);
    ds_row_num(row, "ratio_vs_read", ms / read_ms, 2);
    ds_row_num(row, "speedup_vs_cub_topk", cub_ms / ms, 2);
    ds_row_end(row);
}

/* One (n, density) on the device: returns 0, or 1 on failure (printed). */
static int gpu_bench_one(size_t n, double d, int reps, const float *dv, uint32_t *didx,
                         float *dval, const ds_select_ops *sel, ds_gpu_bench *gb, result *out)
{
    ds_sparsifier *sp[G_CASES] = {0};
    int rc = 1;
    const size_t k = ds_sparsify_k(n, d);
    for (int c = G_TOPK; c < G_CASES; c++) {
        ds_sparsify_cfg cfg;
        ds_sparsify_cfg_defaults(&cfg, gpu_methods[c]);
        cfg.seed = 42;
        int ret = ds_sparsifier_create(&sp[c], &cfg, n, sel);
        if (ret < 0) {
            fprintf(stderr, "dsbench sparsify --gpu: create %s: %s\n",
                    ds_sparsify_method_name(cfg.method), strerror(-ret));
            goto out;
        }
    }
    /* Steady state, as on the CPU: threshold starts done, scratch grown;
     * and the check that our top-k finds CUB's k-th magnitude. */
    float topk_threshold = 0.0f;
    for (int c = G_TOPK; c < G_CASES; c++)
        for (int i = 0; i < 2; i++) {
            ds_sparsify_result r;
            int ret = ds_sparsify_select(sp[c], dv, n, d, didx, dval, n, &r);
            if (ret < 0) {
                fprintf(stderr, "dsbench sparsify --gpu: %s n=%zu: %s\n",
                        ds_sparsify_method_name(gpu_methods[c]), n, strerror(-ret));
                goto out;
            }
            if (c == G_TOPK)
                topk_threshold = r.threshold;
        }
    uint32_t cub_kth = 0;
    double sum = 0;
    if (ds_gpu_bench_cub_topk(gb, dv, n, k, 1, &cub_kth) < 0 || ds_gpu_bench_read(gb, dv, n, 1, &sum) < 0)
        goto out;
    if (ds_sel_key(topk_threshold) != cub_kth) {
        fprintf(stderr, "dsbench sparsify --gpu: n=%zu d=%g: our top-k's k-th |v| is %.9g, CUB's %.9g\n", n, d,
                (double)topk_threshold, (double)ds_sel_key_value(cub_kth));
        goto out;
    }
    /* Blocks of at least ~200M entries of work, at least two calls. */
    const int iters = n >= 100000000 ? 2 : (int)(200000000 / n);
    double best[G_CASES], selected_sum[G_CASES];
    for (int c = 0; c < G_CASES; c++) {
        best[c] = 1e30;
        selected_sum[c] = 0;
    }
    for (int rep = 0; rep < reps; rep++) {
        for (int c = 0; c < G_CASES; c++) {
            size_t selected = 0;
            const double t0 = ds_bench_now();
            if (c == G_READ) {
                if (ds_gpu_bench_read(gb, dv, n, iters, &sum) < 0)
                    goto out;
            } else if (c == G_CUB) {
                if (ds_gpu_bench_cub_topk(gb, dv, n, k, iters, &cub_kth) < 0)
                    goto out;
                selected = k * (size_t)iters;
            } else {
                for (int it = 0; it < iters; it++) {
                    ds_sparsify_result r;
                    if (ds_sparsify_select(sp[c], dv, n, d, didx, dval, n, &r) < 0) {
                        fprintf(stderr, "dsbench sparsify --gpu: %s n=%zu failed\n",
                                ds_sparsify_method_name(gpu_methods[c]), n);
                        goto out;
                    }
                    selected += r.count;
                }
            }
            const double t = (ds_bench_now() - t0) / iters;
            if (t < best[c])
                best[c] = t;
            selected_sum[c] += (double)selected;
        }
    }
    for (int c = 0; c < G_CASES; c++) {
        out[c].ms = best[c] * 1e3;
        out[c].density = c == G_READ ? 1.0 : selected_sum[c] / ((double)reps * iters) / (double)n;
    }
    rc = sel->sync() < 0;
    if (rc)
        fprintf(stderr, "dsbench sparsify --gpu: a selection kernel failed\n");
out:
    for (int c = 0; c < G_CASES; c++)
        ds_sparsifier_destroy(&sp[c]);
    return rc;
}
#endif

/* dsbench sparsify --gpu: 0, or 1 (said why). */
static int gpu_run(const size_t *sizes, size_t nsizes, int reps, int json)
{
#if !HAVE_CUDA
    (void)sizes;
    (void)nsizes;
    (void)reps;
    (void)json;
    fprintf(stderr, "dsbench sparsify --gpu: this build has no CUDA backend (configured without nvcc "
                    "or with -Dcuda=disabled); nothing measured\n");
    return 1;
#else
    char why[256];
    ds_select_ops sel;
    if (ds_select_ops_init_cuda(&sel, 0, why, sizeof(why)) < 0) {
        fprintf(stderr, "dsbench sparsify --gpu: no CUDA device to measure on: %s; nothing measured\n", why);
        return 1;
    }
    size_t n_max = 0;
    for (size_t si = 0; si < nsizes; si++)
        n_max = sizes[si] > n_max ? sizes[si] : n_max;
    int rc = 1;
    ds_gpu_bench *gb = NULL;
    float *h = malloc(n_max * sizeof(float));
    float *dv = sel.alloc(n_max * sizeof(float)), *dval = sel.alloc(n_max * sizeof(float));
    uint32_t *didx = sel.alloc(n_max * sizeof(uint32_t));
    if (!h || !dv || !dval || !didx) {
        fprintf(stderr, "dsbench sparsify --gpu: out of %s memory for n=%zu\n", h ? "device" : "host", n_max);
        goto out;
    }
    if (ds_gpu_bench_open(&gb, sel.device, n_max, why, sizeof(why)) < 0) {
        fprintf(stderr, "dsbench sparsify --gpu: %s\n", why);
        goto out;
    }
    ds_row row;
    ds_row_table(&row, json);
    for (size_t si = 0; si < nsizes; si++) {
        const size_t n = sizes[si];
        fill(h, n, 7);
        if (sel.upload(dv, h, n * sizeof(float)) < 0) {
            fprintf(stderr, "dsbench sparsify --gpu: upload of n=%zu failed\n", n);
            goto out;
        }
        for (int di = 0; di < N_DENS; di++) {
            result res[G_CASES];
            const double d = densities[di];
            if (gpu_bench_one(n, d, reps, dv, didx, dval, &sel, gb, res))
                goto out;
            const double read = res[G_READ].ms, cub = res[G_CUB].ms;
            emit_gpu(&row, "read (device)", "one pass, float4 loads", n, d, read, 1.0, read, cub);
            emit_gpu(&row, "cub_topk", "cub::DeviceRadixSort pairs, first k", n, d, cub, res[G_CUB].density,
                     read, cub);
            for (int c = G_TOPK; c < G_CASES; c++)
                emit_gpu(&row, ds_sparsify_method_name(gpu_methods[c]), sel.name, n, d, res[c].ms,
                         res[c].density, read, cub);
        }
    }
    rc = 0;
out:
    ds_gpu_bench_close(&gb);
    sel.free(dv);
    sel.free(dval);
    sel.free(didx);
    free(h);
    ds_select_cuda_fini(&sel);
    return rc;
#endif
}

int ds_bench_sparsify(int argc, char **argv)
{
    int json = 0, reps = 5, torch = 1, gpu = 0;
    size_t sizes[MAX_SIZES] = {1000000, 25000000, 100000000};
    size_t nsizes = 3;
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"reps", required_argument, NULL, 'r'},
        {"no-torch", no_argument, NULL, 'T'},
        {"sizes", required_argument, NULL, 's'},
        {"gpu", no_argument, NULL, 'g'},
        {NULL, 0, NULL, 0},
    };
    int bad = 0, opt;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = 1; break;
        case 'r': reps = atoi(optarg); break;
        case 'T': torch = 0; break;
        case 'g': gpu = 1; break;
        case 's':
            if (parse_sizes(optarg, sizes, &nsizes) < 0)
                return 2;
            break;
        default: bad = 1; /* an unknown option or a missing value */
        }
    }
    if (bad || optind < argc) {
        fprintf(stderr, "usage: dsbench sparsify [--sizes 1M,25M,100M] [--reps R] [--no-torch] [--gpu] [--json]\n"
                        "  --gpu: SAGE, MiCRO and top-k on CUDA device 0 against a device read and CUB's top-k\n");
        return 2;
    }
    if (reps < 1 || nsizes == 0) {
        fprintf(stderr, "dsbench sparsify: --reps must be >= 1 and --sizes non-empty\n");
        return 2;
    }

    if (gpu)
        return gpu_run(sizes, nsizes, reps, json);

    torch_row trows[MAX_TORCH];
    const size_t ntorch = torch ? torch_collect(sizes, nsizes, reps > 3 ? 3 : reps, trows) : 0;

    ds_ops ops;
    ds_select_ops sel;
    ds_ops_init_cpu(&ops);
    ds_select_ops_init(&sel, ds_cpu_flags());
    ds_row row;
    ds_row_table(&row, json);
    int rc = 0;
    for (size_t si = 0; si < nsizes; si++) {
        const size_t n = sizes[si];
        float *v = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float));
        uint32_t *idx = malloc(n * sizeof(uint32_t));
        if (!v || !val || !idx) {
            fprintf(stderr, "dsbench sparsify: out of memory for n=%zu\n", n);
            free(v);
            free(val);
            free(idx);
            return 1;
        }
        fill(v, n, 7);
        /* Fewer repetitions for the largest arrays keep the run short. */
        const int r = n >= 50000000 && reps > 3 ? 3 : reps;
        for (int di = 0; di < N_DENS; di++) {
            result res[N_CASES];
            if (bench_one(n, densities[di], r, v, idx, val, &ops, &sel, res)) {
                rc = 1;
                break;
            }
            const double topk = res[C_TOPK].ms, read = res[C_READ].ms, d = densities[di];
            double torch_ms = NAN;
            for (size_t t = 0; t < ntorch; t++)
                if (trows[t].n == n && fabs(trows[t].density - d) < 1e-12 && !strcmp(trows[t].method, "torch.topk"))
                    torch_ms = trows[t].ms;
            emit(&row, "read", ops.name, n, d, read, res[C_READ].density, topk, read, torch_ms);
            emit(&row, "topk", sel.name, n, d, topk, res[C_TOPK].density, topk, read, torch_ms);
            for (size_t c = C_FIRST_METHOD; c < N_CASES; c++)
                emit(&row, ds_sparsify_method_name(bench_methods[c - C_FIRST_METHOD]), sel.name, n, d,
                     res[c].ms, res[c].density, topk, read, torch_ms);
            for (size_t t = 0; t < ntorch; t++)
                if (trows[t].n == n && fabs(trows[t].density - d) < 1e-12)
                    emit(&row, trows[t].method, "python, 1 thread", n, d, trows[t].ms, trows[t].achieved, topk,
                         read, torch_ms);
        }
        free(v);
        free(val);
        free(idx);
        if (rc)
            return rc;
    }
    return rc;
}
