/*
 * tools/dsbench/bench_topology.c: `dsbench topology`: what one round's
 * schedule costs (topology/topology.h).
 *
 * For each view size G and topology, the time of ds_topo_targets() (the
 * whole schedule of one (round, segment)) and of ds_topo_peers() for one
 * node (what a node calls per segment), beside a baseline measured in the
 * same run: one plain Fisher-Yates shuffle of G items with the same
 * generator (G - 1 bounded draws, no rejection). The crossover ratio to the
 * baseline is the price of drawing a uniform derangement instead of any
 * permutation. Blocks of the baseline and of each topology alternate, and
 * the fastest block of each is reported, so both see the same machine load.
 *
 *   dsbench topology [--max-g N] [--reps R] [--json]
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dsbench/bench.h"
#include "topology/topology.h"

/* Keeps the compiler from dropping work whose result is unused. */
static volatile uint32_t sink;

/* The baseline: identity, then a descending Fisher-Yates shuffle. */
static void plain_shuffle(const ds_topo_key *key, uint32_t G, uint32_t *perm)
{
    ds_splitmix64 g;
    ds_topo_stream(&g, key);
    for (uint32_t a = 0; a < G; a++)
        perm[a] = a;
    for (uint32_t i = G - 1; i >= 1; i--) {
        uint32_t j = ds_splitmix64_below(&g, i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

enum what { W_BASELINE, W_TARGETS, W_PEERS };

/* Seconds for `iters` calls starting at round `r0`. */
static double run_block(enum what w, enum ds_topo_kind k, uint32_t G, uint64_t r0, uint64_t iters,
                        uint32_t *perm, uint32_t *scratch, uint32_t *from)
{
    double t0 = ds_bench_now();
    for (uint64_t i = 0; i < iters; i++) {
        ds_topo_key key = {.seed = 0xbe4c, .epoch = 1, .round = r0 + i, .segment = 3};
        if (w == W_BASELINE) {
            plain_shuffle(&key, G, perm);
            sink = perm[0];
        } else if (w == W_TARGETS) {
            if (ds_topo_targets(k, &key, G, perm) < 0)
                return -1;
            sink = perm[0];
        } else {
            uint32_t to, n;
            int ret = ds_topo_peers(k, &key, G, (uint32_t)(i % G), &to, from, &n, G, scratch);
            if (ret < 0)
                return -1;
            sink = to;
        }
    }
    return ds_bench_now() - t0;
}

int ds_bench_topology(int argc, char **argv)
{
    static const struct option options[] = {
        {"json", no_argument, NULL, 'j'},
        {"max-g", required_argument, NULL, 'g'},
        {"reps", required_argument, NULL, 'r'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, reps = 5, bad = 0, opt;
    uint32_t max_g = 100000;
    optind = 0; /* start afresh on this argv; messages are ours */
    opterr = 0;
    while (!bad && (opt = getopt_long(argc, argv, "+:", options, NULL)) != -1) {
        switch (opt) {
        case 'j': json = 1; break;
        case 'g': max_g = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'r': reps = atoi(optarg); break;
        default: bad = 1; /* an unknown option or a missing value */
        }
    }
    if (bad || optind < argc) {
        fprintf(stderr, "usage: dsbench topology [--max-g N] [--reps R] [--json]\n");
        return 2;
    }
    if (max_g < 2 || reps < 1) {
        fprintf(stderr, "dsbench topology: --max-g must be >= 2 and --reps >= 1\n");
        return 2;
    }

    uint32_t *perm = malloc((size_t)max_g * sizeof(uint32_t));
    uint32_t *scratch = malloc((size_t)max_g * sizeof(uint32_t));
    uint32_t *from = malloc((size_t)max_g * sizeof(uint32_t));
    if (!perm || !scratch || !from) {
        fprintf(stderr, "dsbench topology: out of memory for G=%u\n", max_g);
        free(perm);
        free(scratch);
        free(from);
        return 1;
    }

    static const uint32_t sizes[] = {2, 8, 64, 1000, 10000, 100000, 1000000};
    static const struct {
        const char *label;
        enum what w;
        enum ds_topo_kind k;
    } cases[] = {
        {"crossover targets", W_TARGETS, DS_TOPO_CROSSOVER},
        {"crossover peers", W_PEERS, DS_TOPO_CROSSOVER},
        {"random targets", W_TARGETS, DS_TOPO_RANDOM},
        {"random peers", W_PEERS, DS_TOPO_RANDOM},
        {"ring targets", W_TARGETS, DS_TOPO_RING},
        {"exponential targets", W_TARGETS, DS_TOPO_EXPONENTIAL},
        {"exponential peers", W_PEERS, DS_TOPO_EXPONENTIAL},
    };
    const size_t ncases = sizeof(cases) / sizeof(cases[0]);

    ds_row row;
    ds_row_table(&row, json);
    int rc = 0;
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]) && sizes[si] <= max_g; si++) {
        uint32_t G = sizes[si];
        /* About 20 ms per block at ~5 ns per participant. */
        uint64_t iters = 4000000 / G + 1;
        double best_base = 1e30, best[sizeof(cases) / sizeof(cases[0])];
        for (size_t c = 0; c < ncases; c++)
            best[c] = 1e30;
        for (int r = 0; r < reps; r++) {
            /* Each block draws fresh rounds: a derangement's cost depends on
             * how many attempts its stream needs. */
            uint64_t r0 = (uint64_t)r * iters;
            double t = run_block(W_BASELINE, DS_TOPO_CROSSOVER, G, r0, iters, perm, scratch, from);
            if (t < best_base)
                best_base = t;
            for (size_t c = 0; c < ncases; c++) {
                t = run_block(cases[c].w, cases[c].k, G, r0, iters, perm, scratch, from);
                if (t < 0) {
                    fprintf(stderr, "dsbench topology: %s G=%u failed\n", cases[c].label, G);
                    rc = 1;
                    goto out_free;
                }
                if (t < best[c])
                    best[c] = t;
            }
        }
        double base_ns = best_base / (double)iters * 1e9;
        for (size_t c = 0; c < ncases; c++) {
            double ns = best[c] / (double)iters * 1e9;
            ds_row_str(&row, "call", cases[c].label);
            ds_row_int(&row, "G", G);
            ds_row_num(&row, "us_per_call", ns / 1e3, 3);
            ds_row_num(&row, "ns_per_participant", ns / G, 2);
            ds_row_num(&row, "shuffle_us", base_ns / 1e3, 3);
            ds_row_num(&row, "vs_shuffle", ns / base_ns, 2);
            ds_row_end(&row);
        }
    }
out_free:
    free(perm);
    free(scratch);
    free(from);
    return rc;
}
