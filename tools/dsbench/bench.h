/*
 * tools/dsbench/bench.h: what every dsbench command shares.
 *
 * A command is `int ds_bench_<name>(int argc, char **argv)` (argv[0] is the
 * command name), registered in dsbench.c. Results go out as rows: Markdown
 * table rows by default (pasted into docs/benchmarks.md), or with --json one
 * JSON object per row on its own line. A row is built with ds_row_* calls;
 * keys must come in the same order for every row of one table.
 */
#ifndef DS_TOOLS_BENCH_H
#define DS_TOOLS_BENCH_H

#include <stdint.h>

#define DS_ROW_MAX_FIELDS 32

typedef struct ds_row {
    int json;          /* 1: JSON lines; 0: Markdown */
    int header_done;   /* Markdown header printed for this table */
    int n;
    char key[DS_ROW_MAX_FIELDS][48];
    char val[DS_ROW_MAX_FIELDS][96];
    int quoted[DS_ROW_MAX_FIELDS];
} ds_row;

/* Start a new table (prints the header again in Markdown mode). */
void ds_row_table(ds_row *r, int json);
void ds_row_str(ds_row *r, const char *key, const char *val);
void ds_row_int(ds_row *r, const char *key, int64_t val);
/* A number with `prec` digits after the point (JSON gets the same text). */
void ds_row_num(ds_row *r, const char *key, double val, int prec);
/* Print the row and clear it for the next one. */
void ds_row_end(ds_row *r);

/* Monotonic seconds. */
double ds_bench_now(void);

/* Common flag parsing: returns 1 and consumes argv[*i] when it is --json. */
int ds_bench_flag_json(const char *arg, int *json);

/* Path of the directory holding tools/ scripts (from DS_TOOLS_DIR, else the
 * source tree's tools/ directory compiled in). */
const char *ds_bench_tools_dir(void);

/* Commands. */
int ds_bench_train(int argc, char **argv);
int ds_bench_topology(int argc, char **argv);
int ds_bench_sparsify(int argc, char **argv);
int ds_bench_wire(int argc, char **argv);
int ds_bench_elastic(int argc, char **argv);
int ds_bench_transport(int argc, char **argv);
int ds_bench_cluster(int argc, char **argv);

#endif
