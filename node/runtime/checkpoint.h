/*
 * node/runtime/checkpoint.h: a node's training state in one file,
 * <node.data_dir>/checkpoint.bin (libdsnode's dsnode_checkpoint and
 * dsnode_resume; `dsnode run --resume FILE`; docs/design.md,
 * "Checkpoints and resume").
 *
 * A checkpoint holds what the next step depends on, so that a run stopped
 * at step s and resumed goes on exactly as the run that never stopped (a
 * single node's model.bin is byte-identical):
 *   - the step and the parameters;
 *   - the gossip engine between rounds: the accumulator (the
 *     error-feedback residual), the round snapshot, and each segment's
 *     sparsifier state (generator, threshold and what steers it);
 *   - the engine's round numbering (round0, the round), which a rejoining
 *     node compares with the cluster's;
 *   - the program's own state, bytes the engine does not read (`dsnode
 *     run`'s: the optimizer's momentum and sample count, the data order,
 *     node/run/state.c);
 *   - the config keys that must match (ds_ckpt_conf_text) and their hash.
 * Not in it: exchanges kept open past their round (their stash is back in
 * the accumulator by then; only the reply's half is lost), the partners'
 * latencies and the lag (measured again), the counters.
 *
 * The file, little-endian (as model.bin; x86-64):
 *
 *    0  magic "DSCKPT\r\n"           8 bytes
 *    8  version (2)                   u32
 *   12  header length (40)            u32
 *   16  file length                   u64
 *   24  config hash (FNV-1a 64 of the text of the CONF section)   u64
 *   32  CRC-32 (zlib) of bytes 40 .. file length                  u32
 *   36  zero                          u32
 *   40  sections, in this order, each: tag (4 ASCII bytes), u32 zero,
 *       u64 length, then its bytes:
 *       CONF  "section.key = value\n" lines
 *       PARM  step u64, n u64, params f32[n]
 *       GOSP  round0 u64, round u64, n u64, segments u32, zero u32,
 *             acc f32[n], snap f32[n], per segment: present u32, zero
 *             u32, then (present) rng u64, started i32, delta f32,
 *             mean_prev f64, micro_ratio f64, micro_fed i32, zero u32,
 *             group_count u64, k_group u64 (56 bytes)
 *       PROG  the program's bytes (any length, 0 included)
 * (Version 1, before libdsnode took checkpoints over, held the trainer's
 * sections TRNR and DATA where PARM and PROG are; it is refused.)
 *
 * Written by temporary file + fsync + rename + fsync of the directory
 * (ds_ckpt_write_atomic), so a crash leaves the old checkpoint or the new
 * one, never a torn file. The client's thread only, between steps, with
 * no round open (after ds_engine_settle).
 */
#ifndef DS_NODE_RUNTIME_CHECKPOINT_H
#define DS_NODE_RUNTIME_CHECKPOINT_H
#include <stddef.h>
#include <stdint.h>
#include "conf/conf.h"
#include "node/runtime/engine.h"

#define DS_CKPT_MAGIC "DSCKPT\r\n"
#define DS_CKPT_VERSION 2u
#define DS_CKPT_HEADER 40u
#define DS_CKPT_NAME "checkpoint.bin"

/* The keys a resumed run must share with the checkpoint, one
 * "section.key = value\n" line each as ds_conf_dump writes them:
 * cluster.seed (the topology's schedule), the model (train.model,
 * hidden, layers), the optimizer (batch_size, lr, momentum, weight_decay,
 * nesterov, lr_schedule, warmup_steps, and train.steps when the schedule
 * is cosine: it sets the decay), and the gossip state's shape and meaning
 * (sparsify.method, sparsify.error_feedback, gossip.segments, gossip.mix).
 * Others (train.steps under a constant rate, eval_every, density, the
 * network) may change between a run and its resume; so may node.name,
 * which seeds only the data order and the node's sparsifier streams, both
 * restored from the checkpoint (a resumed Slurm job names its tasks after
 * the new job). Into out (cap
 * bytes); the length or a negative errno. */
int ds_ckpt_conf_text(const ds_conf *c, char *out, size_t cap);

/* Write hdr then body to dir/name through dir/name.tmp, fsync, rename,
 * fsync dir; creates dir. 0 or a negative errno with one line in err
 * (the temporary file is removed). */
int ds_ckpt_write_atomic(const char *dir, const char *name, const void *hdr, size_t hdr_len,
                         const void *body, size_t body_len, char *err, size_t err_len);

/* Write dir/model.bin: "DSMODEL1", u64 LE float count, float32 LE values
 * (n host floats), atomically as above; creates dir. 0 or a negative
 * errno with one line in err. */
int ds_ckpt_write_model(const char *dir, const float *host, size_t n, char *err, size_t err_len);

/* Write <node.data_dir>/checkpoint.bin from the engine (no round open;
 * its parameters pulled first) at `step`, with prog_len bytes of the
 * program's. 0 or a negative errno with one line in err. */
int ds_ckpt_save(ds_engine *e, int64_t step, const void *prog, size_t prog_len, char *err,
                 size_t err_len);

/* A checkpoint read whole and checked against an engine: its parts point
 * into buf (ds_ckpt_free). */
typedef struct ds_ckpt {
    uint8_t *buf;
    int64_t step;
    uint64_t round0, round;
    const void *params;  /* n floats, unaligned */
    const uint8_t *gosp; /* the GOSP section */
    const void *prog;    /* the program's bytes */
    size_t prog_len;
} ds_ckpt;

/* Read path and check it against the engine's config and shapes (after
 * ds_engine_register, before ds_engine_start). Changes nothing. 0, or
 * -ENOENT/-EIO (cannot read), -EBADMSG (bad magic, truncated, corrupt),
 * -EPROTO (another version), -EINVAL (config or shapes differ), -ENOMEM;
 * err has one line naming the file and what differs. */
int ds_ckpt_read(const char *path, ds_engine *e, ds_ckpt *k, char *err, size_t err_len);

/* The checkpoint's parameters into the engine's buffer, pushed to the
 * client's memory. 0 or the push's negative errno (err set). */
int ds_ckpt_put_params(ds_engine *e, const ds_ckpt *k, char *err, size_t err_len);

/* The engine's part of a checked checkpoint: gossip state, step, round
 * numbering; marks the engine resumed (ds_ckpt_choose). */
void ds_ckpt_apply(ds_engine *e, const ds_ckpt *k);

void ds_ckpt_free(ds_ckpt *k);

/* ds_engine_start, a resumed node joining a running cluster, after it
 * took the cluster's state: keep it when our own checkpoint is older than
 * the cluster's lag (its round plus the lag is behind the cluster's
 * round; the lag is lag.h's, DS_LAG_SECONDS of rounds at the pace the
 * cluster's snapshot told). Otherwise put our own state back
 * (params.restore), number our rounds as the cluster does from its
 * current round, and train on, at the cluster's pace until our join
 * round, without shadowing it. A node restarted after a crash keeps its
 * old join round (membership: a known member rejoins under a new
 * incarnation), so it is in the views again at once. Logs the choice. */
void ds_ckpt_choose(ds_engine *e);

#endif
