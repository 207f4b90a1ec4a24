/*
 * tools/dsbench/lrun.h: one `dslaunch local` run under a benchmark (the
 * fault benches, bench_elastic_faults.c and bench_elastic_gossip.c).
 *
 * ds_lrun_start makes a fresh directory /tmp/dsbench-TAG-XXXXXX and starts
 * `DSLAUNCH local -n N ARGS... --out DIR/run --json` as our child (stdout,
 * the --json report, to DIR/dslaunch.out; SIGKILLed if we die).
 * ds_lrun_end stops it and whatever nodes are left, and removes the
 * directory; with DSBENCH_KEEP=1 in the environment it keeps the directory
 * (configs, logs, status files) and prints where it is.
 */
#ifndef DS_TOOLS_DSBENCH_LRUN_H
#define DS_TOOLS_DSBENCH_LRUN_H

#include <jansson.h>
#include <limits.h>
#include <sys/types.h>

typedef struct ds_lrun {
    char base[PATH_MAX], out[PATH_MAX + 8], log[PATH_MAX + 16];
    pid_t pid;
    int code; /* dslaunch's exit status once it ended */
} ds_lrun;

void ds_lrun_sleep_ms(int ms);

/* The dslaunch built beside this dsbench (BUILD/tools/dslaunch/dslaunch),
 * into out (len bytes). */
void ds_lrun_default_dslaunch(char *out, size_t len);

/* args: dslaunch's options after `local -n N` (NULL-ended, at most 56). */
int ds_lrun_start(ds_lrun *r, const char *tag, const char *dslaunch, int nodes,
                  const char *const *args);

/* Up to timeout_s for dslaunch to end: its exit status, or -1. */
int ds_lrun_wait(ds_lrun *r, double timeout_s);

/* dslaunch's --json report: the last JSON line of its stdout (NULL if none). */
json_t *ds_lrun_report(const ds_lrun *r);

/* A number of node `name` in the report (NAN when missing). */
double ds_lrun_report_num(const json_t *rep, const char *name, const char *key);

/* Node `name`'s status.json (NULL when unreadable). */
json_t *ds_lrun_status(const ds_lrun *r, const char *name);

/* The pid of node `name` of the run (its command line names DIR/name.ini), or -1. */
pid_t ds_lrun_node_pid(const ds_lrun *r, const char *name);

/* Stop dslaunch (term_first: SIGTERM and 20 s to clean up, as its
 * namespaces need; else SIGKILL), SIGKILL the nodes left, remove the
 * directory (unless DSBENCH_KEEP). */
void ds_lrun_end(ds_lrun *r, int term_first);

#endif
