/*
 * tools/dsbench/bench.h: what every dsbench command shares.
 *
 * A command is `int ds_bench_<name>(int argc, char **argv)` (argv[0] is the
 * command name), registered in dsbench.c; it reads its own options with
 * getopt_long (optind = 0 first, opterr = 0: the messages are its own).
 * Results go out as rows: Markdown table rows by default
 * (pasted into docs/benchmarks.md), or with --json one JSON object per row
 * on its own line (jansson; every string escaped, so any bytes give valid
 * JSON). A row is built with ds_row_* calls; keys must come in the same
 * order for every row of one table.
 *
 * Not thread-safe: one thread builds and prints a row.
 */
#ifndef DS_TOOLS_BENCH_H
#define DS_TOOLS_BENCH_H

#include <stdint.h>
#include <stdio.h>

#define DS_ROW_MAX_FIELDS 32

enum ds_row_kind { DS_ROW_STR, DS_ROW_INT, DS_ROW_NUM };

/* One table's state and the row being built. Plain value; the caller owns
 * it (usually on its stack). Fields past DS_ROW_MAX_FIELDS are dropped;
 * keys are cut at 47 bytes, string values at 95. */
typedef struct ds_row {
    int json;          /* 1: JSON lines; 0: Markdown */
    int header_done;   /* Markdown header printed for this table */
    FILE *out;         /* where rows go: stdout (ds_row_table), a test may change it */
    int n;
    char key[DS_ROW_MAX_FIELDS][48];
    char val[DS_ROW_MAX_FIELDS][96];   /* the text Markdown shows */
    enum ds_row_kind kind[DS_ROW_MAX_FIELDS];
    int64_t ival[DS_ROW_MAX_FIELDS];   /* DS_ROW_INT */
} ds_row;

/* Start a new table (prints the header again in Markdown mode); rows go to
 * stdout. */
void ds_row_table(ds_row *r, int json);
void ds_row_str(ds_row *r, const char *key, const char *val);
void ds_row_int(ds_row *r, const char *key, int64_t val);
/* A number with `prec` digits after the point; JSON gets the same rounded
 * value (an integer when prec is 0), null when not finite. */
void ds_row_num(ds_row *r, const char *key, double val, int prec);
/* Print the row and clear it for the next one. 0, or -ENOMEM / -EIO (the
 * row was not printed whole). */
int ds_row_end(ds_row *r);

/* Monotonic seconds. */
double ds_bench_now(void);

/* Path of the directory holding tools/ scripts (from DS_TOOLS_DIR, else the
 * source tree's tools/ directory compiled in). */
const char *ds_bench_tools_dir(void);

/* Commands. */
int ds_bench_train(int argc, char **argv);
int ds_bench_topology(int argc, char **argv);
int ds_bench_sparsify(int argc, char **argv);
int ds_bench_wire(int argc, char **argv);
int ds_bench_elastic(int argc, char **argv);
/* dsbench elastic --faults (bench_elastic_faults.c): issue 16's scenarios. */
int ds_bench_elastic_faults(int argc, char **argv);
/* dsbench elastic --gossip-faults (bench_elastic_gossip.c): a straggler and
 * a crash against the gossip rounds (issue 16). */
int ds_bench_elastic_gossip(int argc, char **argv);
int ds_bench_transport(int argc, char **argv);
int ds_bench_cluster(int argc, char **argv);
/* dsbench torch (bench_cluster.c): PyTorch under libdsnode vs DDP vs native. */
int ds_bench_torch(int argc, char **argv);
/* dsbench hier (bench_cluster.c): 2 hosts x 4 nodes, flat vs groups. */
int ds_bench_hier(int argc, char **argv);
/* dsbench allreduce (bench_allreduce.c): one group's reduction by
 * algorithm, with and without group.overlap (issue 10). */
int ds_bench_allreduce(int argc, char **argv);
int ds_bench_status(int argc, char **argv);
/* dsbench scale (bench_scale_cmd.c, simulation in bench_scale.c): issue 18. */
int ds_bench_scale(int argc, char **argv);

/* dsbench viz (bench_viz.c): dsviz --serve's page with many members and a
 * long history (issue 15). One case: members simulated (sim.h) for rounds
 * rounds, served with history rounds kept, then refreshes timed GET /. */
typedef struct ds_bench_viz_opts {
    unsigned members, rounds, history, refreshes, segments;
    uint64_t seed;
} ds_bench_viz_opts;
typedef struct ds_bench_viz_result {
    unsigned joins, deaths, feeds; /* feeds: GET / while the rounds ran */
    uint64_t rounds;               /* rounds recorded */
    size_t held_max, docs;         /* most rounds the server holds for a node;
                                    * nodes it holds rounds for */
    size_t page_bytes, direct_bytes; /* the last page, over HTTP and built directly */
    double median_ms, max_ms;      /* GET / over HTTP (libcurl to the server) */
    double page_median_ms, page_max_ms; /* ds_viz_live_page in this thread */
    double page_cpu_median_ms;     /* its thread CPU time */
    double max_rss_mb;             /* the process's peak after the case */
} ds_bench_viz_result;
/* 0 or -errno. *page (may be NULL): the last page timed (caller frees).
 * libcurl's global state must be set up (curl_global_init). */
int ds_bench_viz_case(const ds_bench_viz_opts *o, ds_bench_viz_result *res, char **page);
int ds_bench_viz(int argc, char **argv);

#endif
