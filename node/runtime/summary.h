/*
 * node/runtime/summary.h: the end of a node's run as its log and a launcher
 * see it: one `train` log line with the round counters, and the one stdout
 * line dslaunch reads (docs/dslaunch.md):
 *   summary node=NAME status=done|stopped|failed steps=N loss=L test_acc=A
 *           samples_per_s=S wall_s=W backend=B bytes_sent=X bytes_received=Y
 *           rounds=R max_round_s=M group_max_wait_s=W group=G
 * (G: node.group with auto resolved, "-" for none; dslaunch groups the
 * models by it for intra_group_consensus).
 * `dsnode run` (run.c) and libdsnode's dsnode_leave (node/api) print it.
 */
#ifndef DS_NODE_RUNTIME_SUMMARY_H
#define DS_NODE_RUNTIME_SUMMARY_H

#include <stdint.h>

#include "node/runtime/engine.h"

typedef struct ds_run_summary {
    const char *name;    /* node.name */
    const char *status;  /* "done", "stopped" or "failed" */
    const char *backend; /* the trainer's ("cpu", "cuda"), or "client" */
    int64_t steps;
    double loss, test_acc, samples_per_s, wall_s;
} ds_run_summary;

/* Both lines, from s and the engine's counters; stdout is flushed. */
void ds_run_summary_print(const ds_run_summary *s, const ds_engine_info *in);

#endif
