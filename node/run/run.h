/*
 * node/run/run.h: `dsnode run`: one node's life from a validated config to
 * its summary line. The training loop is a program of libdsnode's public
 * API (include/dsnode/dsnode.h), the one a PyTorch loop uses too: it
 * brings the trainer and its optimizer, the engine does the rest.
 */
#ifndef DS_NODE_RUN_H
#define DS_NODE_RUN_H

#include <stddef.h>

#include "conf/conf.h"
#include "node/train/train.h"

/* Map the [train] and [cluster] keys onto the trainer's settings: the
 * initial parameters are seeded by cluster.seed (the same model on every
 * node), the data shuffle by cluster.seed and node.name (different data
 * order per node). */
void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *out);

/* This node's rank among the nodes of its host, for train.device = auto:
 * the first of DSNODE_RANK (dslaunch local), SLURM_LOCALID and LOCAL_RANK
 * (torchrun's) that holds a non-negative integer; 0 without one. */
int ds_run_local_rank(void);

/* ds_node_run flag: the caller ends the process (_exit) as soon as
 * ds_node_run returns: the engine is abandoned (dsnode_abandon), not
 * closed (node/main.c says why). Without it everything is closed and
 * freed. */
#define DS_RUN_PROCESS_EXITS 1u

/* Train as the config says. c is the config the engine opens from path
 * and the overrides sets (n_sets of them, in order), already loaded and
 * checked by the caller: the trainer reads it, dsnode_open reads path and
 * sets again. Installs SIGINT/SIGTERM handlers (first: stop training and
 * leave; second: stop lingering). Logs progress to stderr and prints the
 * summary line to stdout. Returns the process exit status: 0 when
 * training finished or paused (train.stop_after), 1 on an error (a
 * checkpoint or model not saved among them), 128 + signal when stopped by
 * SIGINT or SIGTERM. resume: a checkpoint.bin to continue from, or NULL.
 * Checkpoints are on when train.checkpoint_every or train.stop_after is
 * set or when resuming: then one is written every train.checkpoint_every
 * steps and at the end (finished, paused or stopped by a signal). */
int ds_node_run(const ds_conf *c, const char *path, const char *const *sets, size_t n_sets,
                const char *resume, unsigned flags);

#endif
