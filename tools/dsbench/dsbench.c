/*
 * tools/dsbench/dsbench.c: benchmark driver. `dsbench <command> [--json]`.
 * Each command lives in bench_<command>.c and reads its own options
 * (argv[0] its name); results are Markdown rows for
 * docs/benchmarks.md, or JSON lines with --json. dsbench is white-box by
 * declaration (tools/dsbench/meson.build): it links the rooms it measures.
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tools/dsbench/bench.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"train", ds_bench_train, "samples/s and accuracy of one node vs PyTorch (same MLP or CNN, batch; --gpu: on CUDA too)"},
    {"topology", ds_bench_topology, "cost of one round's schedule per view size, vs a plain shuffle"},
    {"sparsify", ds_bench_sparsify, "time per call of every sparsifier vs exact top-k and a plain read (--gpu: on CUDA, vs CUB top-k)"},
    {"wire", ds_bench_wire, "sparse index encodings by density, seal/open MB/s per mode and cipher, handshake"},
    {"elastic", ds_bench_elastic, "membership (--fake: simulated network): detection, dissemination, slow nodes"},
    {"transport", ds_bench_transport, "loopback goodput through node/net (none, auth, encrypt) and the bare transport vs fi_pingpong"},
    {"scale", ds_bench_scale, "8-64 simulated nodes in one process (real model, gossip engine, fake network): each variant's accuracy, consensus, bytes, selection time; sparsifiers vs workers"},
    {"status", ds_bench_status, "scrapes from one address while another floods the status server with idle connections"},
    {"cluster", ds_bench_cluster, "4-node clusters per variant on loopback and rate-limited namespaces vs PyTorch DDP; bytes/node/round at 2-8 nodes"},
    {"hier", ds_bench_hier, "8 nodes as 2 hosts x 4 (namespaces, rate-limited link between hosts): flat gossip vs one group per host vs flat all-reduce"},
    {"allreduce", ds_bench_allreduce, "one group of real processes: its reduction by algorithm (direct, ring, butterfly), with and without group.overlap; step time, exposed and hidden reduction"},
    {"viz", ds_bench_viz, "dsviz --serve's page refresh with 64 simulated members (sim.h) and 1,000 rounds of history vs 8 members and 32 rounds"},
    {"torch", ds_bench_torch, "4 PyTorch processes under dsnode gossip (libdsnode) vs PyTorch DDP (gloo) vs native dsnode; the binding's cost per step"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: dsbench <command> [options] [--json]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int main(int argc, char **argv)
{
    ds_blas_reexec_if_needed(argv);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* Options before the command only ("+": stop at the command). */
    opterr = 0;
    for (;;) {
        const int at = optind;
        int c = getopt_long(argc, argv, "+h", options, NULL);
        if (c == -1)
            break;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        fprintf(stderr, "dsbench: unknown command '%s'\n", argv[at]);
        usage(stderr);
        return 2;
    }
    if (optind >= argc) { /* only "--" */
        usage(stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[optind], commands[i].name))
            return commands[i].fn(argc - optind, argv + optind);
    fprintf(stderr, "dsbench: unknown command '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
}
