/*
 * node/runtime/run.h: `dsnode run`: one node's life from a validated config to its
 * summary line. The training loop is a client of the engine
 * (node/runtime/engine.h).
 */
#ifndef DS_NODE_RUN_H
#define DS_NODE_RUN_H

#include "conf/conf.h"
#include "node/train/train.h"

/* Map the [train] and [cluster] keys onto the trainer's settings: the
 * initial parameters are seeded by cluster.seed (the same model on every
 * node), the data shuffle by cluster.seed and node.name (different data
 * order per node). */
void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *out);

/* Write the trainer's parameters to dir/model.bin (created atomically:
 * "DSMODEL1", u64 LE float count, float32 LE values); creates dir. 0 or a
 * negative errno with one line in err. */
int ds_run_save_model(const char *dir, const ds_trainer *t, char *err, size_t err_len);

/* The same for n host floats (libdsnode's dsnode_leave). */
int ds_run_save_params(const char *dir, const float *host, size_t n, char *err, size_t err_len);

/* ds_node_run flag: the caller ends the process (_exit) as soon as
 * ds_node_run returns. A run that trained then leaves its endpoint open
 * and its memory in place (ds_engine_abandon) instead of closing them:
 * see node/main.c for why. Without it everything is closed and freed. */
#define DS_RUN_PROCESS_EXITS 1u

/* Train as the config says. Installs SIGINT/SIGTERM handlers (first:
 * stop training and leave; second: stop lingering). Logs progress to
 * stderr and prints the summary line to stdout. Returns the process exit
 * status: 0 when training finished or paused (train.stop_after), 1 on an
 * error (a checkpoint or model not saved among them), 128 + signal when
 * stopped by SIGINT or SIGTERM. resume: a checkpoint.bin to continue from
 * (node/runtime/checkpoint.h), or NULL. Checkpoints are on when
 * train.checkpoint_every or train.stop_after is set or when resuming: then
 * one is written every train.checkpoint_every steps and at the end
 * (finished, paused or stopped by a signal). */
int ds_node_run(const ds_conf *c, const char *resume, unsigned flags);

#endif
