/*
 * dsnode/dsnode.h: libdsnode, the engine of a dsnode node for any training
 * loop. The program brings its model and its optimizer; the engine brings
 * membership without a coordinator, the gossip rounds that mix the
 * parameters with the peers' (sparsified, with error feedback, overlapped
 * with the next step), the state transfer for joins, the authenticated
 * transport and the status page. `dsnode run` is the same engine.
 *
 * The grammar. Every function is dsnode_<verb>; a program calls them in
 * this order, each at most once unless marked:
 *
 *   dsnode_open        config file + overrides -> an engine (ABI checked)
 *   dsnode_register_copies  (optional) the program keeps its tensors
 *                      elsewhere (a GPU): the buffers below are host
 *                      mirrors, copied from and back by two callbacks
 *   dsnode_register_grad  (when dsnode_reduces says 1) the gradient buffer,
 *                      and optionally the optimizer's momentum, beside the
 *                      parameters
 *   dsnode_register    the parameters: one contiguous float buffer and its
 *                      layer table (name, offset, length)
 *   dsnode_resume      (optional) continue from a checkpoint.bin: the
 *                      parameters, the engine's gossip state and step, and
 *                      the program's own state (the restore callback)
 *   dsnode_join        listen, found or join the cluster, wait for
 *                      cluster.min_members; a late joiner fetches the
 *                      cluster's state into the buffer (the adopt callback)
 *   per training step (repeated):
 *     dsnode_ready     1: take this step; 0: not now (a joiner keeping the
 *                      cluster's pace or shadowing it), ask again
 *     (the program's forward and backward)
 *     dsnode_layer_ready (optional, with group.overlap) from inside
 *                      backward: one layer's gradient is final; its
 *                      reduction starts behind the rest of backward
 *     dsnode_reduce    (when dsnode_reduces says 1) the gradient averaged
 *                      over the group (node.group) or the view (topology
 *                      allreduce), in place
 *     (the program's optimizer step)
 *     dsnode_step      this step's gossip round on the engine's thread,
 *                      overlapped with the next step; the previous round's
 *                      deltas applied to the buffer in place; state served
 *                      to joiners that asked
 *     dsnode_report    (optional) the numbers the status page and the log
 *                      show: loss, accuracy, learning rate, samples/s
 *   dsnode_settle      (any time after join, repeatable) finish the open
 *                      round: the buffer is final until the next step
 *   dsnode_checkpoint  (any time after join, repeatable) write
 *                      <node.data_dir>/checkpoint.bin with the program's
 *                      own state bytes beside the engine's
 *   dsnode_leave       graceful leave; writes <node.data_dir>/model.bin
 *                      and prints the summary line on stdout
 *   dsnode_close       stop every thread, free everything (or
 *                      dsnode_abandon, when the process _exits next)
 *
 * Anywhere: dsnode_error (the last failure's message), dsnode_stats,
 * dsnode_stop and dsnode_stopped (stop requests, as a signal handler makes
 * them), dsnode_set_backend, dsnode_version.
 *
 * `dsnode run` is a program of this grammar (node/run/run.c): it calls
 * exactly these functions, in this order.
 *
 * Errors. Functions that can fail return 0 (or a documented positive
 * value) on success and a negative errno on failure; dsnode_error() then
 * returns the one-line message that explains it (for a bad config:
 * "FILE:LINE: section.key: expected ..., found ..."). A call in the wrong
 * order returns -EINVAL ("dsnode_step: called before dsnode_register").
 * After a failed dsnode_register or dsnode_join the engine only accepts
 * dsnode_close (-EINVAL otherwise).
 *
 * Threads. One engine is driven by one thread at a time (the program's
 * training thread); the engine runs its own threads (ds-gossip,
 * ds-membership, ds-net, ds-transport, ds-status) and never calls the
 * program from them. dsnode_stop and dsnode_stopped may be called from any
 * thread and from a signal handler. dsnode_error, dsnode_version and
 * dsnode_abi_version may be called from any thread. Several engines in one
 * process are allowed (the tests run two); the log's node name and level
 * are those of the first one opened.
 *
 * Buffers. The parameter buffer is the program's: borrowed from
 * dsnode_register until dsnode_close. The engine reads and writes it only
 * during dsnode_join, dsnode_ready, dsnode_reduce, dsnode_step,
 * dsnode_settle and dsnode_leave, on the calling thread (the gradient and
 * momentum buffers of dsnode_register_grad likewise, from that call until
 * dsnode_close); between those calls the program may
 * read and write it freely (the optimizer step). Every other pointer
 * argument is read during the call only and may be freed after it.
 * With dsnode_register_copies the buffers are host mirrors of the
 * program's own memory: the engine calls pull before it reads a mirror
 * and push after it wrote one, on the calling thread, inside those same
 * calls (and dsnode_checkpoint, dsnode_resume), so the program's memory
 * is current whenever the program runs.
 *
 * Logging goes to stderr in dsnode's format (node.log_level). The summary
 * line goes to stdout, as `dsnode run` prints it, so that `dslaunch local
 * -- CMD` shows and collects it.
 */
#ifndef DSNODE_DSNODE_H
#define DSNODE_DSNODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes. dsnode_open passes it to the library,
 * which refuses a different one (-EPROTO) instead of misreading a struct. */
#define DSNODE_ABI_VERSION 1

/* The longest layer name kept (longer names are cut). */
#define DSNODE_LAYER_NAME_MAX 15

typedef struct dsnode dsnode;

/* One row of the layer table: a gossip segment and a row of the status
 * page's layer table. Rows lie inside the buffer, in order, without
 * overlap. */
typedef struct dsnode_layer {
    const char *name;
    size_t offset; /* in floats, from the start of the buffer */
    size_t length; /* in floats, > 0 */
} dsnode_layer;

/* Called (on the calling thread, inside dsnode_join or dsnode_ready) when
 * the engine replaced the buffer with the cluster's state, taken at the
 * cluster's optimizer step `step`: the program continues from that step
 * and resets its optimizer state (momentum). Return 0, or a negative errno
 * to fail the call. */
typedef int (*dsnode_adopt_fn)(void *ctx, int64_t step);

/* How the training ended, for dsnode_leave. A stop request (dsnode_stop)
 * makes DONE and PAUSED status=stopped, exit 128 + sig. */
enum dsnode_outcome {
    DSNODE_DONE = 0,   /* finished its steps */
    DSNODE_FAILED = 1, /* the program failed; the summary says status=failed */
    DSNODE_PAUSED = 2, /* stopped on purpose, to be resumed from a checkpoint
                        * (train.stop_after, the end of a Slurm allocation):
                        * status=paused, exit status 0 */
};

/* Which buffer a copy callback moves (dsnode_register_copies). */
enum dsnode_buffer {
    DSNODE_PARAMS = 0, /* the buffer of dsnode_register */
    DSNODE_GRAD = 1,   /* grad of dsnode_register_grad */
    DSNODE_OPT = 2,    /* opt of dsnode_register_grad */
};

/* Copy one buffer between the program's memory and its host mirror: pull
 * fills the mirror from the program's memory, push the other way. Called
 * on the calling thread, inside the dsnode calls that read or write the
 * buffers. 0, or a negative errno to fail that call. */
typedef int (*dsnode_copy_fn)(void *ctx, enum dsnode_buffer which);

/* Add delta (n floats of host memory, valid during the call) to buffer
 * `which` in the program's own memory, element by element (x + delta,
 * one rounding, as the engine would on the mirror). 0, or a negative
 * errno to fail that call. */
typedef int (*dsnode_add_fn)(void *ctx, enum dsnode_buffer which, const float *delta);

/* Called inside dsnode_resume (and again inside dsnode_join or
 * dsnode_ready when a resumed node rejoining a running cluster prefers its
 * own checkpoint over the cluster's state) with the bytes the program gave
 * dsnode_checkpoint and the step the checkpoint was taken at: check them
 * and put the program's state back (optimizer, data order), then return
 * 0. The parameter buffer already holds the checkpoint's parameters. A
 * refusal returns a negative errno and one line in why (why_len bytes),
 * which dsnode_resume's message carries; nothing of the engine changes
 * then. */
typedef int (*dsnode_restore_fn)(void *ctx, const void *state, size_t len, int64_t step,
                                 char *why, size_t why_len);

/* The numbers a native node logs and prints in its summary. */
typedef struct dsnode_stats {
    int64_t step;              /* optimizer steps taken (dsnode_step calls) */
    uint64_t rounds;           /* gossip rounds taken part in */
    uint32_t view_size;        /* members in the last round's view */
    uint64_t exchanges_ok;
    uint64_t exchanges_failed;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    double wait_s;             /* time inside gossip exchanges (on the engine thread
                                * with gossip.overlap) */
    double max_round_s;        /* the longest exchange */
} dsnode_stats;

/* "0.1.0". Any thread. */
const char *dsnode_version(void);

/* DSNODE_ABI_VERSION of the library (not of the header compiled against). */
unsigned dsnode_abi_version(void);

/* The message of the last call that failed on this thread; "" when none
 * did. Valid until the next dsnode call on this thread. Any thread. */
const char *dsnode_error(void);

/* Open an engine: defaults, then the config file at `config` (NULL: none),
 * then each override "section.key=value" in order (as `dsnode run --set`),
 * relative paths taken from the file's directory, and the whole checked.
 * Keys, identity and allow-list are loaded; nothing listens yet. On success
 * *out is the caller's (dsnode_close it); on failure *out is NULL.
 * -EPROTO: abi is not the library's ABI; -EINVAL: the config is refused
 * (dsnode_error names file, line, key, what was expected and found);
 * -ENOENT, -EACCES...: a key file. Use the macro, which passes the ABI. */
int dsnode_open_abi(dsnode **out, const char *config, const char *const *overrides,
                    size_t n_overrides, unsigned abi) __attribute__((warn_unused_result));
#define dsnode_open(out, config, overrides, n_overrides) \
    dsnode_open_abi((out), (config), (overrides), (n_overrides), DSNODE_ABI_VERSION)

/* node.name of the config. Valid until dsnode_close. */
const char *dsnode_name(const dsnode *d);

/* 1 when the config averages gradients every step (node.group set, or
 * gossip.topology = allreduce): the program then calls
 * dsnode_register_grad before dsnode_register, and dsnode_reduce between
 * its backward and its optimizer step. 0 otherwise (pure gossip: both are
 * then allowed and do nothing). -EINVAL: d is NULL. Any time after open. */
int dsnode_reduces(const dsnode *d);

/* 1 when dsnode_layer_ready starts reductions (group.overlap in a group,
 * no dsnode_register_copies so far): a program may then hand its layers
 * over from inside its backward. 0 otherwise; -EINVAL: d is NULL. Any
 * time after open (after dsnode_register_copies for its final answer). */
int dsnode_overlaps(const dsnode *d);

/* The program keeps its tensors elsewhere (a GPU): the buffers of
 * dsnode_register_grad and dsnode_register are host mirrors, copied by
 * pull and push (dsnode_copy_fn; both required) with ctx. The mirrors may
 * then be one buffer: the engine pulls a buffer before it reads the
 * mirror and pushes it right after it wrote it. Once, after dsnode_open
 * and before dsnode_register_grad and dsnode_register. -EINVAL: a NULL
 * callback or order. */
int dsnode_register_copies(dsnode *d, dsnode_copy_fn pull, dsnode_copy_fn push, void *ctx)
    __attribute__((warn_unused_result));

/* Optional, with dsnode_register_copies: where the engine only adds to
 * the parameters (a gossip round's end: its deltas), it hands the deltas
 * to add (ctx: register_copies') instead of pulling the parameters and
 * pushing them back, so one vector crosses instead of two. Once, after
 * dsnode_register_copies and before dsnode_register. -EINVAL: NULL,
 * order, or twice. */
int dsnode_register_add(dsnode *d, dsnode_add_fn add) __attribute__((warn_unused_result));

/* The gradient buffer `grad` and, optionally, the optimizer's momentum
 * `opt` (NULL: none), each as long as the parameter buffer of the coming
 * dsnode_register (n floats, in the same layout), borrowed until
 * dsnode_close. dsnode_reduce averages grad in place. In a group, members
 * stay bit-identical when they start alike and take the same optimizer
 * step on the same averaged gradient; a member that missed a reduction or
 * joined late is re-synced a slice of the parameters (and of opt, when
 * given) per step; without opt its momentum is reset by adopt and differs
 * from the others' until it decays. Once, after dsnode_open and before
 * dsnode_register. -EINVAL: grad NULL, grad == opt, or order. */
int dsnode_register_grad(dsnode *d, float *grad, float *opt) __attribute__((warn_unused_result));

/* Register the parameters: `params`, n floats, borrowed until dsnode_close
 * and mixed in place; the layer table (copied) cuts it into segments.
 * adopt is required (see dsnode_adopt_fn); ctx is passed to it. Checks
 * that node.data_dir can take model.bin. Once, after dsnode_open. -EINVAL:
 * a bad table or order, or dsnode_reduces says 1 and no
 * dsnode_register_grad came first. */
int dsnode_register(dsnode *d, float *params, size_t n, const dsnode_layer *layers,
                    size_t n_layers, dsnode_adopt_fn adopt, void *ctx)
    __attribute__((warn_unused_result));

/* Continue from the checkpoint at path (written by dsnode_checkpoint,
 * this node's or another's): checks its header, checksum, version, the
 * config keys that must match (the message names the key and both
 * values) and its shapes against the registered buffer; then puts the
 * parameters into the buffer, calls restore (required) with the
 * program's bytes, and, when it returns 0, the engine's gossip state and
 * step (adopt is not called: the program's restore did its part). The
 * node then joins as a restarted member (a known node comes back under a
 * new incarnation) and keeps its own state when the cluster's is not
 * newer than the cluster's lag, else takes the cluster's (adopt). Logs
 * "resumed from PATH at step N". Once, after dsnode_register and before
 * dsnode_join. 0; -ENOENT, -EIO: unreadable; -EBADMSG: not a checkpoint,
 * truncated or corrupt; -EPROTO: another version; -EINVAL: another config
 * or shape, restore's refusal (its errno), or order. Nothing changes on
 * failure but the buffer. */
int dsnode_resume(dsnode *d, const char *path, dsnode_restore_fn restore, void *ctx)
    __attribute__((warn_unused_result));

/* Listen (node.listen), start the status page, found the cluster or join
 * it through cluster.seeds, wait for cluster.min_members, and agree on the
 * first round (a late joiner fetches the cluster's state). Blocks. -EINTR:
 * stopped (dsnode_stop); -EACCES: not admitted; -ETIMEDOUT: no seed let
 * us in, or fewer than cluster.min_members alive, within
 * cluster.join_timeout_s; -EADDRINUSE...: the endpoint. On failure the summary line of a
 * run that did not start is printed (status=failed, or stopped), as
 * dsnode_leave would. */
int dsnode_join(dsnode *d) __attribute__((warn_unused_result));

/* Before each training step: 1 when the program trains this step, 0 when
 * not now (a joiner keeping the cluster's pace or shadowing it until its
 * join round; it may have adopted a fresh state). Negative errno: order. */
int dsnode_ready(dsnode *d);

/* After backward and before the optimizer step, when dsnode_reduces says
 * 1: this step's reduction. node.group: waits for the open round, then
 * one reduction with the group's members; grad becomes the members' mean
 * gradient, and the round deltas of the members' exchanges with other
 * groups, a re-synced slice of the parameters (and of opt) are applied,
 * so that every member takes the same optimizer step; may call adopt (a
 * member apart takes member 0's step). gossip.topology = allreduce: grad
 * becomes the mean over the view. Bounded by gossip.timeout_ms; a
 * reduction that did not complete leaves the local gradient (logged,
 * counted). dsnode_reduces 0: nothing. 0, or -EINVAL (order). */
int dsnode_reduce(dsnode *d);

/* group.overlap: from inside the program's backward, after layer `layer`
 * of the table (its index in dsnode_register's) has its final gradient
 * in the gradient buffer and before the layers below it run: that layer's
 * reduction over the group starts now, on an engine thread, behind the
 * rest of backward. Training thread, between dsnode_ready and
 * dsnode_reduce; each layer at most once a step. Every member of a group
 * must hand over the same layers in the same order (as one backward pass
 * does: last layer first). The program does not write that layer's range
 * of the gradient again until dsnode_reduce returns; dsnode_reduce reduces
 * the layers not handed over, waits for all, and returns with the group's
 * mean gradient as without overlap. Does nothing (returns 0) without
 * group.overlap, in a step with no group to reduce with, and with
 * dsnode_register_copies (the mirrors are copied whole inside
 * dsnode_reduce). 0; -EINVAL: order, or layer not in the table;
 * -EALREADY: that layer was handed over already this step. */
int dsnode_layer_ready(dsnode *d, size_t layer);

/* After the optimizer step: counts the step, finishes the round still
 * open (its deltas added to the buffer) and starts this step's round
 * (every gossip.every steps; on the engine's thread when gossip.overlap,
 * else here, applied at once), serves our state to joiners that asked.
 * 0, or -EINVAL (order; also when dsnode_reduces says 1 and this step had
 * no dsnode_reduce). */
int dsnode_step(dsnode *d);

/* Finish the round still open, if any: the buffer is final until the next
 * dsnode_step (evaluate, save). 0, or -EINVAL (order). */
int dsnode_settle(dsnode *d);

/* Write <node.data_dir>/checkpoint.bin (temporary file, fsync, rename,
 * fsync of the directory: a crash leaves the old file or the new one):
 * the round settled first, the parameters (pulled), the step, the
 * engine's gossip state (error-feedback residuals, round snapshot, each
 * segment's sparsifier state, the round numbering), the config keys that
 * must match at resume, and state: len bytes of the program's own (its
 * optimizer, data order, generators; NULL with len 0: none), handed back
 * to dsnode_resume's restore. 0, or a negative errno (-ENOSPC, -EACCES,
 * ...): not saved, the previous checkpoint is intact. After dsnode_join,
 * before dsnode_leave, repeatable. */
int dsnode_checkpoint(dsnode *d, const void *state, size_t len)
    __attribute__((warn_unused_result));

/* The training numbers for the status page (status.listen, status.file)
 * and the log: loss (mean over the last steps), test_acc (last
 * evaluation, -1 none), lr, samples_per_s (the last reported goes into
 * the summary line). Logs the progress line every train.log_every steps
 * and at train.steps, once per step, as `dsnode run` does. 0 or
 * -EINVAL. */
int dsnode_report(dsnode *d, double loss, double test_acc, double lr, double samples_per_s);

/* Log an evaluation ("eval step=N test_loss=L test_acc=A", as dsnode run)
 * and show test_acc on the status page. 0 or -EINVAL. */
int dsnode_report_eval(dsnode *d, double test_loss, double test_acc);

/* What the summary line shows as backend= ("cpu", "cuda"; at most 15
 * characters kept; default "client"). Any time before dsnode_leave.
 * -EINVAL: NULL or empty name, or after dsnode_leave. */
int dsnode_set_backend(dsnode *d, const char *name);

/* Fill *out. Any time after dsnode_open; same thread as the other calls. */
int dsnode_stats_get(dsnode *d, dsnode_stats *out);

/* Ask the engine to stop, as SIGINT does to `dsnode run`: waits end early
 * (dsnode_join returns -EINTR), dsnode_leave does not linger; a second
 * request ends any lingering at once. sig (> 0) is what dsnode_stopped
 * returns and what the exit status reports (128 + sig). Async-signal-safe;
 * any thread. */
void dsnode_stop(dsnode *d, int sig);

/* The first stop request's sig, 0 when none. Any thread. */
int dsnode_stopped(const dsnode *d);

/* Install SIGINT and SIGTERM handlers that call dsnode_stop(d, sig) (and
 * ignore SIGPIPE), as `dsnode run` does, under the lock that libfabric's
 * loading (which dsnode_open starts on a thread of its own, and which
 * puts back the signal dispositions its libraries change) holds from its
 * save to its restore, so the load never undoes them; SIGHUP re-reads
 * cluster.allowed_keys. One engine per process at a time (-EBUSY while
 * another has them); dsnode_close puts back the handlers it replaced. */
int dsnode_handle_signals(dsnode *d);

/* After training: settle; in a group (node.group), unless how is
 * DSNODE_FAILED or a stop was requested, one last reduction averages the
 * members' parameters into the buffer, so the group ends as one model;
 * announce the leave, keep taking part in rounds
 * until it applies (not when stopped), let it spread; then write the
 * buffer (pulled) to <node.data_dir>/model.bin (fsynced) and print the
 * summary line on stdout: status=failed (how FAILED, or model.bin not
 * written), stopped (a stop request), paused (how PAUSED) or done. Once.
 * 0; -EIO: model.bin not written; -EINVAL: order. */
int dsnode_leave(dsnode *d, enum dsnode_outcome how);

/* The exit status a program should end with, as `dsnode run`'s: 0 done
 * or paused, 1 failed, 128 + sig stopped. Before dsnode_leave: 1. */
int dsnode_exit_status(const dsnode *d);

/* Stop the engine's threads and free everything, secrets wiped. NULL-safe
 * (also *d == NULL); clears *d, so a second close does nothing. Without
 * dsnode_leave the peers see this node fail (they carry on). */
void dsnode_close(dsnode **d);

/* dsnode_close for a program that ends its process with _exit right
 * after (`dsnode run` does): stops the engine's own threads (gossip,
 * membership, status), wipes its secrets and puts back the signal
 * handlers, but leaves the network's threads, the endpoint and the memory
 * they touch as they are; the kernel closes the sockets. Why: libfabric
 * 1.17 can crash closing a tcp endpoint into which a peer is still
 * sending a large message (peers that finish together). The network's
 * threads still run, so the program must not go through exit() (its
 * handlers and library destructors would run under them): it flushes its
 * stdio and calls _exit. Clears *d. NULL-safe. */
void dsnode_abandon(dsnode **d);

#ifdef __cplusplus
}
#endif

#endif
