/*
 * node/runtime/engine.h: the engine of a node: everything that makes a
 * training process a member of a decentralized cluster, behind one
 * internal API. A client brings the model and its optimizer; the engine
 * brings the identity and keys, the secured network, membership (SWIM),
 * the gossip rounds that mix the client's parameters with the peers', the
 * model state transfer for joins, the elasticity policies and the status
 * page. `dsnode run`'s training loop (node/runtime/run.c) is one client;
 * a later issue publishes this API as a library.
 *
 * A client's life, in order:
 *
 *   ds_engine_open       from a validated ds_conf: crypto, identity, keys
 *   ds_engine_register   the parameters: one contiguous float buffer and
 *                        its layer table (the gossip segments)
 *   ds_engine_listen     open the endpoint, the gossip and state adapters
 *                        and the status page
 *   ds_engine_join       found or join the cluster; wait for
 *                        cluster.min_members
 *   ds_engine_start      a late joiner fetches the cluster's state (the
 *                        client adopts it through params.adopt); the
 *                        others agree on the first round
 *   per training step:
 *     ds_engine_before_step   keep a joiner's pace; shadow the cluster
 *                             until the join round (1: do not train now)
 *     ds_engine_reduce        topology allreduce: mean gradient of the view
 *     ds_engine_step          after the optimizer step: this step's gossip
 *                             round (on the engine's thread when
 *                             gossip.overlap), deltas applied in place;
 *                             serve state to joiners; size the lag
 *     ds_engine_settle        finish an open round now (before reading the
 *                             parameters: evaluation, the end)
 *   ds_engine_leave      announce the leave, linger until it applies, drain
 *   ds_engine_close      (or ds_engine_abandon when the process ends next)
 *
 * Threads. Every function is called from one thread, the client's (the
 * "main" thread below). The engine runs its own: the failure detector
 * (SWIM ticks, ds-membership), the comm thread (ds-gossip, gossip.overlap:
 * a round's exchanges while the client computes the next step), and,
 * inside the net, the net worker and the transport progress thread. The
 * client's buffers are touched only during its calls into the engine:
 * with overlap the exchange works on the gossip engine's own snapshot, and
 * its result is applied to the parameters in ds_engine_step or
 * ds_engine_settle.
 *
 * Errors: 0 or a negative errno. Each function logs its own failures (the
 * messages `dsnode` has always printed); ds_engine_join also fills err
 * with the one line the client reports.
 *
 * The status snapshot is filled from the engine's state by
 * ds_engine_publish (through node/runtime/publish.h); the client supplies
 * the training numbers it shows with ds_engine_report_set.
 */
#ifndef DS_NODE_RUNTIME_ENGINE_H
#define DS_NODE_RUNTIME_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "conf/conf.h"
#include "node/gossip/gossip.h"
#include "node/net/net.h"
#include "node/runtime/hier.h"
#include "node/train/model.h"

typedef struct ds_engine ds_engine;

/* The client's stop requests, as a signal handler sets them: the engine
 * only reads them. signal: nonzero (the signal number) once the client
 * wants to stop: waits end early, no lingering, a short drain. count:
 * how many stop requests came; from 2 on, lingering ends at once. */
typedef struct ds_engine_stop {
    const atomic_int *signal;
    const atomic_int *count;
    /* May be NULL. A counter of reload requests (SIGHUP): each change
     * makes the net re-read cluster.allowed_keys (ds_net_allow_reload). */
    const atomic_int *reload;
} ds_engine_stop;

enum ds_engine_buf {
    DS_ENGINE_PARAMS = 0,
    DS_ENGINE_GRAD = 1,
    DS_ENGINE_OPT = 2,
};

/* The client's parameters. Buffers are host memory of n floats, borrowed
 * for the engine's life. When the client keeps its parameters elsewhere
 * (a GPU), params and grad are host mirrors and pull/push copy between
 * them and the client's own memory; the engine calls pull before it reads
 * a buffer and push after it wrote one. */
typedef struct ds_engine_params {
    size_t n;
    const ds_layer *layers; /* the layer table: offsets into the buffers */
    int n_layers;
    float *params;          /* mixed in place by the gossip rounds */
    float *grad;            /* averaged in place by ds_engine_reduce */
    /* May be NULL: the optimizer's state (momentum), n floats. When a
     * group re-syncs its members (design §5) it is averaged with params,
     * so members step alike again; NULL: params only. */
    float *opt;
    void *ctx;
    /* Both NULL, or both set. Return 0 or a negative errno. */
    int (*pull)(void *ctx, enum ds_engine_buf which);
    int (*push)(void *ctx, enum ds_engine_buf which);
    /* May be NULL; only with pull/push. Adds delta (n floats) to the
     * client's own buffer: a round's end hands its deltas here instead of
     * pull, add on the mirror, push. */
    int (*add)(void *ctx, enum ds_engine_buf which, const float *delta);
    /* Required. The engine replaced params with the cluster's state taken
     * at optimizer step `step` (a joiner), or its group re-synced to a
     * member at another step: the client continues from that step, its
     * optimizer state reset (a group re-sync then pushes the group's mean
     * into opt). 0 or a negative errno. */
    int (*adopt)(void *ctx, int64_t step);
    /* May be NULL. The client resumed from its own checkpoint
     * (node/runtime/checkpoint.h) and, as a joiner, adopted the cluster's
     * state; the engine prefers the client's own when it is recent
     * (ds_ckpt_choose): put it back whole (params, optimizer, data order,
     * the gossip state through ds_ckpt_load) and tell its step. 0 or a
     * negative errno (the cluster's state is kept then). */
    int (*restore)(void *ctx, int64_t *step);
} ds_engine_params;

/* The training numbers the status page shows, from the client. */
typedef struct ds_engine_report {
    int phase;            /* enum ds_status_state: JOINING, TRAINING, DONE... */
    double loss;          /* mean over the last log window */
    double test_acc;      /* last evaluation; -1: none yet */
    double lr;            /* the next step's learning rate */
    double samples_per_s; /* over the last log window */
} ds_engine_report;

/* What the client's log lines and summary show. */
typedef struct ds_engine_info {
    uint64_t rounds;           /* rounds taken part in (and all-reduces) */
    uint32_t view_size;        /* of the last round set up */
    ds_gossip_stats gossip;
    ds_net_stats net;
    ds_group_stats group;      /* the node's group (size 1: none) */
    char group_name[32];       /* node.group, "auto" resolved; "" for none */
} ds_engine_info;

/* Open an engine for the node `c` describes (validated by ds_conf_check;
 * borrowed for the engine's life): libsodium, the identity, the cluster
 * key and allow-list. stop is copied. The caller owns *out (close or
 * abandon it). */
int ds_engine_open(ds_engine **out, const ds_conf *c, const ds_engine_stop *stop)
    __attribute__((warn_unused_result));

/* After the last step of a node in a group, before ds_engine_leave: one
 * last reduction of the parameters, their mean over the group, so that
 * the members end as one model even when a reduction of the last steps
 * missed a chunk (rounds.c says more). Nothing outside a group, alone, or
 * when stopped. The client skips it when its training failed (its
 * parameters are not to be averaged into the others'). */
void ds_engine_final_sync(ds_engine *e);

/* The client installs (or puts back) signal handlers between these two:
 * libfabric's loading on the warm-up thread (ds_engine_open starts it)
 * saves and restores every disposition under the same lock, so it never
 * puts back what it saved over the client's new ones. */
void ds_engine_signals_lock(void);
void ds_engine_signals_unlock(void);

/* Register the parameters (copied; the buffers are borrowed) and create
 * the gossip engine over their layers. Once, before ds_engine_listen. */
int ds_engine_register(ds_engine *e, const ds_engine_params *p)
    __attribute__((warn_unused_result));

/* Open the endpoint (node.listen), the gossip and state adapters and, when
 * configured, the status page and file. Logs "listening on ...". */
int ds_engine_listen(ds_engine *e) __attribute__((warn_unused_result));

/* Found the cluster (no seeds, or we are the first) or join it through the
 * seeds, then wait until cluster.min_members members are alive. -EINTR:
 * stopped by the client; -EACCES: refused by a seed; err has the line. */
int ds_engine_join(ds_engine *e, char *err, size_t err_len) __attribute__((warn_unused_result));

/* Before the first step. A node that joined a cluster already training
 * fetches its state (params, then params.adopt) and shadows it until its
 * join round; the initial members agree on the first round. Starts the
 * comm thread (gossip.overlap). -EINTR: stopped by the client; otherwise
 * err has the line (a joiner admitted by a cluster that then gave it no
 * state, having finished: "cannot join cluster 'ID': admitted, but ..."). */
int ds_engine_start(ds_engine *e, char *err, size_t err_len) __attribute__((warn_unused_result));

/* Before each training step: keeps a joiner's pace and, while it shadows
 * the cluster, waits and fetches a fresh snapshot (adopted through
 * params.adopt). Returns 1 when the client must not train now (ask again),
 * 0 when it trains this step. */
int ds_engine_before_step(ds_engine *e);

/* topology = allreduce: replace grad (of optimizer step `step`, before it
 * is applied) by the mean over the view. Other topologies: nothing. An
 * incomplete reduction leaves the local gradient (logged). */
void ds_engine_reduce(ds_engine *e, int64_t step);

/* group.overlap, between ds_engine_before_step and ds_engine_reduce of
 * optimizer step `step`: layer `layer` of the table has its final
 * gradient in p.grad; its reduction over the group starts now on the
 * layer thread (rounds.c, "layer reductions"). Every member hands over
 * the same layers in the same order (one backward pass: last first); the
 * client does not write that range again before ds_engine_reduce, which
 * reduces the layers not handed over and waits for all. 0 (also: no
 * overlap, no group this step, pull/push mirrors, a layer out of range);
 * -EALREADY: handed over already this step. */
int ds_engine_layer_ready(ds_engine *e, int64_t step, int layer);

/* After the optimizer took step number `step` (1, 2, ...): finish the
 * round still open (its deltas added to params), start this step's round
 * when step % gossip.every == 0 (on the comm thread with gossip.overlap,
 * else here, applied at once), serve our state to joiners that asked,
 * and resize the lag. */
void ds_engine_step(ds_engine *e, int64_t step);

/* Finish the round still open, if any: params are final after this. */
void ds_engine_settle(ds_engine *e);

/* After training (finished or stopped): announce our leave, keep taking
 * part in the rounds until it applies (not when stopped: see leave.h),
 * then let it spread and our last frames leave. */
void ds_engine_leave(ds_engine *e);

/* Copy the client's numbers for the status page. */
void ds_engine_report_set(ds_engine *e, const ds_engine_report *r);

void ds_engine_info_get(ds_engine *e, ds_engine_info *out);

/* Fill the status snapshot from the engine's state and the last report and
 * publish it (status.listen, status.file): at most every 200 ms unless
 * force (phase changes, the end). Nothing happens when status is off. */
void ds_engine_publish(ds_engine *e, int force);

/* NULL-safe; clears the caller's pointer. Stops the engine's threads and
 * closes everything, the endpoint too. Secrets are wiped. */
void ds_engine_close(ds_engine **e);

/* For a process that ends right after (with _exit): stop the status page
 * and the engine's own threads and wipe the secrets, but leave the
 * endpoint open and the engine's memory to the end of the process (see
 * node/main.c for why). The net's threads still run: the process must
 * not return from main or call exit handlers after this. NULL-safe;
 * clears the caller's pointer. */
void ds_engine_abandon(ds_engine **e);

#endif
