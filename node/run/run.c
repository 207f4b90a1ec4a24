/*
 * node/run/run.c: `dsnode run`: one node's life, from a validated config
 * to its summary line. The training loop here is a program of libdsnode's
 * public API (include/dsnode/dsnode.h), in the order its grammar gives,
 * and nothing else of the engine: it owns the trainer and the optimizer,
 * and hands the engine its parameters; the engine does everything that
 * makes the process a member of the cluster, as it does for a PyTorch
 * loop (tools/python).
 *
 * Threads: this file runs on the main thread: minibatch, forward/backward,
 * optimizer step, evaluation, and the engine calls between steps (the
 * gossip round itself when gossip.overlap = false). The engine runs the
 * comm thread (gossip.overlap = true: the round's exchanges while the main
 * thread computes the next step, design §5: x_{t+1} = mix(x_t) - lr
 * g(x_t)) and the failure detector (SWIM ticks, never behind a training
 * step, design §6); the net runs its worker and the transport's progress
 * thread.
 *
 * Signals (dsnode_handle_signals): the first SIGINT/SIGTERM stops training
 * (the node evaluates, writes its checkpoint when checkpoints are on,
 * leaves without lingering and prints its summary); a second one ends any
 * lingering at once. SIGHUP re-reads the allow-list.
 *
 * The summary is the one line a launcher needs, on stdout (dsnode_leave
 * prints it):
 *   summary node=NAME status=done|paused|stopped|failed steps=N loss=L test_acc=A
 *           samples_per_s=S wall_s=W backend=B bytes_sent=X bytes_received=Y
 *           rounds=R max_round_s=M group_max_wait_s=G group=NAME
 * Everything else goes to the log (stderr). At exit the final parameters
 * go to <node.data_dir>/model.bin so a launcher can measure how far the
 * nodes' models are apart. The results are never lost silently:
 * node.data_dir is checked at start (dsnode_register), and a final save or
 * checkpoint that fails makes the run failed (status=failed, exit 1),
 * whatever training did.
 */
#include "config.h"

#include <dsnode/dsnode.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "node/run/run.h"
#include "node/run/state.h"

int ds_run_local_rank(void)
{
    static const char *const vars[] = {"DSNODE_RANK", "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        char *end;
        errno = 0;
        const long r = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && !errno && !*end && r >= 0 && r <= INT32_MAX)
            return (int)r;
    }
    return 0;
}

void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *t)
{
    ds_train_cfg_defaults(t);
    t->backend = c->train.backend;
    int dev = 0;
    if (ds_conf_device(c->train.device, &dev) < 0)
        dev = 0; /* not reached: the config's check refused it */
    t->device = dev == DS_CONF_DEVICE_AUTO ? ds_ops_device_auto(ds_run_local_rank()) : dev;
    snprintf(t->dataset_dir, sizeof(t->dataset_dir), "%s", c->train.dataset_dir);
    snprintf(t->dataset_cache, sizeof(t->dataset_cache), "%s", c->train.dataset_cache);
    t->model = c->train.model == DS_MODEL_CNN      ? DS_TRAIN_CNN
               : c->train.model == DS_MODEL_CUSTOM ? DS_TRAIN_CUSTOM
                                                   : DS_TRAIN_MLP;
    snprintf(t->layers, sizeof(t->layers), "%s", c->train.layers);
    t->n_hidden = c->train.hidden_count;
    for (int i = 0; i < c->train.hidden_count && i < DS_TRAIN_MAX_HIDDEN; i++)
        t->hidden[i] = (int)c->train.hidden[i];
    t->batch = (int)c->train.batch_size;
    t->lr = c->train.lr;
    t->momentum = c->train.momentum;
    t->weight_decay = c->train.weight_decay;
    t->nesterov = c->train.nesterov;
    t->warmup_steps = c->train.warmup_steps;
    t->cosine = c->train.lr_schedule == DS_LR_COSINE;
    t->total_steps = c->train.steps;
    t->threads = (int)c->train.threads;
    t->init_seed = (uint64_t)c->cluster.seed;
    t->data_seed = ds_rng_hash_str((uint64_t)c->cluster.seed, c->node.name);
}

/* ---- the client ------------------------------------------------------------ */

/* `dsnode run`'s side: the trainer, and what its log and summary show. */
typedef struct run {
    const ds_conf *c;
    dsnode *d;
    ds_train_cfg tc;
    ds_trainer t;
    float *host;          /* non-CPU backends: host mirror of theta, grad or mom */
    float *delta_dev;     /* non-CPU backends: a round's deltas, on the device */
    double loss, test_acc, test_loss;
    double loss_mean, sps; /* the last log window's */
    uint64_t train_ns;    /* time in training steps, for samples_per_s */
    const char *resume;   /* --resume FILE, or NULL */
    int ckpt;             /* checkpoints on: at exit, on a signal, every N */
    int paused;           /* train.stop_after reached */
    int64_t own_steps;    /* optimizer steps this process took */
    int64_t adopted_past; /* a state adopted at or past train.steps: its step */
} run;

/* The engine's view of the trainer's memory (dsnode_register_copies): on a
 * device, the engine works on u->host, copied from and back here. */
static float *device_buf(ds_trainer *t, enum dsnode_buffer which)
{
    return which == DSNODE_GRAD ? t->grad : which == DSNODE_OPT ? t->mom : t->theta;
}

static int pull(void *ctx, enum dsnode_buffer which)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    return t->ops.download(u->host, device_buf(t, which), t->n_params * sizeof(float));
}

/* A round's deltas (host memory) added to the parameters on the device:
 * one upload and an axpy, instead of a download, the add on the mirror
 * and an upload (dsnode_register_add). x + 1 * d is x + d, one rounding,
 * as on the host. */
static int add(void *ctx, enum dsnode_buffer which, const float *delta)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    const int e = t->ops.upload(u->delta_dev, delta, t->n_params * sizeof(float));
    if (e < 0)
        return e;
    t->ops.axpy(t->n_params, 1.0f, u->delta_dev, device_buf(t, which));
    return 0;
}

static int push(void *ctx, enum dsnode_buffer which)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    return t->ops.upload(device_buf(t, which), u->host, t->n_params * sizeof(float));
}

/* A joiner took the cluster's model: continue from its step, momentum
 * reset. */
static int adopt(void *ctx, int64_t step)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    t->ops.memzero(t->mom, t->n_params * sizeof(float));
    t->step = step;
    if (step >= u->c->train.steps)
        u->adopted_past = step;
    return 0;
}

/* --resume, and a resumed joiner that keeps its own checkpoint: the
 * parameters are back; the momentum, sample count and data order here. */
static int restore(void *ctx, const void *state, size_t len, int64_t step, char *why,
                   size_t why_len)
{
    run *u = ctx;
    const int e = ds_run_state_load(&u->t, state, len, step, why, why_len);
    if (e == 0)
        u->adopted_past = 0;
    return e;
}

/* Log the trainer. */
static void describe_trainer(run *u)
{
    ds_trainer *t = &u->t;
    ds_info("train", "%s", t->backend_note);
    for (int i = 0; i < 2; i++) {
        const ds_dataset *d = i ? &t->test : &t->train;
        if (d->cache == DS_DATA_CACHE_FAILED)
            ds_warn("train", "train.dataset_cache %s: %s; the %s images were inflated without it",
                    u->c->train.dataset_cache, d->cache_note, i ? "test" : "training");
        else if (d->cache != DS_DATA_CACHE_OFF)
            ds_info("train", "train.dataset_cache: the %s images %s", i ? "test" : "training",
                    d->cache == DS_DATA_CACHE_HIT ? "mapped from the cache"
                                                  : "inflated and written to the cache");
    }
    if (t->ops.kind == DS_BACKEND_CPU) {
        ds_info("train", "openblas_kernels=%s threads=%d", ds_blas_corename(), u->tc.threads);
        /* A user's OPENBLAS_CORETYPE wins over our re-exec (decisions.md),
         * even when it names weaker kernels than this CPU runs: say so,
         * since it can cost a third of a step (docs/benchmarks.md, "The CNN
         * on one CPU node"). */
        const char *better = ds_blas_wanted_coretype();
        if (better)
            ds_info("train", "OpenBLAS runs its %s kernels%s; its %s kernels suit this CPU "
                    "better (unset OPENBLAS_CORETYPE to let dsnode choose)",
                    ds_blas_corename(), getenv("OPENBLAS_CORETYPE") ?
                    " (OPENBLAS_CORETYPE from the environment)" : "", better);
    }
    char table[512];
    ds_model_describe(&t->model, table, sizeof(table));
    ds_info("train", "model=%s params=%zu layers=%d train_examples=%zu test_examples=%zu batch=%d",
            t->model_name, t->n_params, t->model.n_layers, t->train.n, t->test.n, u->tc.batch);
    ds_info("train", "layer table: %s", table);
}

/* Backward wrote one layer's gradient (model.h, grad_ready). */
static void layer_ready(void *ctx, int layer)
{
    run *u = ctx;
    if (dsnode_layer_ready(u->d, (size_t)layer) < 0)
        ds_log_rl(DS_LOG_WARN, "node", "%s", dsnode_error());
}

/* Hand the trainer's memory to the engine: its own on the CPU, host
 * mirrors of a device's. 0, or -1 with the failure logged. */
static int register_trainer(run *u)
{
    ds_trainer *t = &u->t;
    float *params = t->theta, *grad = t->grad, *opt = t->mom;
    int e = 0;
    if (t->ops.kind != DS_BACKEND_CPU) {
        /* Pinned on a device: the engine's pulls and pushes are DMA. */
        if (!(u->host = t->ops.host_alloc(t->n_params * sizeof(float)))) {
            ds_error("node", "out of memory");
            return -1;
        }
        params = grad = opt = u->host;
        if (!(u->delta_dev = t->ops.alloc(t->n_params * sizeof(float)))) {
            ds_error("node", "out of device memory");
            return -1;
        }
        e = dsnode_register_copies(u->d, pull, push, u);
        if (e == 0)
            e = dsnode_register_add(u->d, add);
    }
    dsnode_layer layers[DS_MODEL_MAX_LAYERS];
    for (int i = 0; i < t->model.n_layers; i++)
        layers[i] = (dsnode_layer){.name = t->model.layer[i].name,
                                   .offset = t->model.layer[i].off,
                                   .length = t->model.layer[i].len};
    if (e == 0 && dsnode_reduces(u->d) == 1)
        e = dsnode_register_grad(u->d, grad, opt);
    if (e == 0)
        e = dsnode_register(u->d, params, t->n_params, layers, (size_t)t->model.n_layers, adopt,
                            u);
    if (e == 0)
        e = dsnode_set_backend(u->d, t->ops.name);
    if (e < 0) {
        ds_error("node", "cannot start: %s", dsnode_error());
        return -1;
    }
    /* group.overlap: each layer's gradient leaves as backward writes it
     * (on the CPU; a device's mirrors are copied whole at the reduce). */
    if (dsnode_reduces(u->d) == 1 && t->ops.kind == DS_BACKEND_CPU) {
        t->model.grad_ready = layer_ready;
        t->model.grad_ctx = u;
    }
    return 0;
}

/* The progress numbers at the end of a train.log_every window. */
static void close_window(run *u, double loss_window, int64_t window_n, uint64_t t_window)
{
    const uint64_t now = ds_now_ns();
    u->sps = (double)window_n * u->tc.batch / ((double)(now - t_window) * 1e-9);
    u->loss_mean = loss_window / (double)window_n;
}

/* <node.data_dir>/checkpoint.bin now, with the trainer's state. */
static int save_checkpoint(run *u)
{
    char err[512];
    uint8_t *state = NULL;
    size_t len = 0;
    int e = ds_run_state_save(&u->t, &state, &len, err, sizeof(err));
    if (e < 0) {
        ds_error("train", "checkpoint not saved: %s", err);
        return e;
    }
    if ((e = dsnode_checkpoint(u->d, state, len)) < 0)
        ds_error("train", "%s", dsnode_error());
    free(state);
    return e;
}

/* ": what failed" from the backend (a CUDA fault), or "". */
static const char *backend_error(ds_trainer *t)
{
    static char buf[200];
    const char *e = t->ops.error ? t->ops.error() : NULL;
    if (!e)
        return "";
    snprintf(buf, sizeof(buf), ": %s", e);
    return buf;
}

/* Train until train.steps or a stop request. 0, or the negative errno of
 * a failed step, evaluation or checkpoint. */
static int train_loop(run *u)
{
    const ds_conf *c = u->c;
    ds_trainer *t = &u->t;
    dsnode *d = u->d;
    const int64_t steps = c->train.steps;
    const int64_t every = c->train.checkpoint_every;
    double loss_window = 0;
    int64_t window_n = 0;
    uint64_t t_window = ds_now_ns();
    int e;

    while (t->step < steps && !dsnode_stopped(d)) {
        if (c->train.stop_after > 0 && u->own_steps >= c->train.stop_after) {
            u->paused = 1;
            break;
        }
        if ((e = dsnode_ready(d)) == 0)
            continue; /* a joiner shadowing the cluster: no step of ours */
        if (e < 0) {
            ds_error("node", "%s", dsnode_error());
            return e;
        }
        const uint64_t t0 = ds_now_ns();
        if ((e = ds_trainer_compute_grad(t, &u->loss, NULL)) < 0) {
            ds_error("train", "step %lld failed: %s%s", (long long)t->step, strerror(-e),
                     backend_error(t));
            return e;
        }
        if ((e = dsnode_reduce(d)) < 0) {
            ds_error("node", "%s", dsnode_error());
            return e;
        }
        ds_trainer_apply_grad(t);
        if ((e = dsnode_step(d)) < 0) {
            ds_error("node", "%s", dsnode_error());
            return e;
        }
        u->train_ns += ds_now_ns() - t0;
        u->own_steps++;
        loss_window += u->loss;
        window_n++;

        if (t->step % c->train.log_every == 0 || t->step == steps) {
            close_window(u, loss_window, window_n, t_window);
            loss_window = 0;
            window_n = 0;
            t_window = ds_now_ns();
        }
        /* Logs the progress line at the window's end; the status page. */
        dsnode_report(d, u->loss_mean, u->test_acc, (double)ds_trainer_lr(t), u->sps);
        if ((c->train.eval_every > 0 && t->step % c->train.eval_every == 0) || t->step == steps) {
            dsnode_settle(d);
            if ((e = ds_trainer_evaluate(t, &u->test_loss, &u->test_acc)) < 0) {
                ds_error("eval", "evaluation failed: %s%s", strerror(-e), backend_error(t));
                return e;
            }
            dsnode_report_eval(d, u->test_loss, u->test_acc);
        }
        if (every > 0 && t->step % every == 0 && t->step < steps &&
            (e = save_checkpoint(u)) < 0)
            return e;
    }
    return 0;
}

/* After the loop (ret: its outcome): evaluate when stopped or paused, the
 * last checkpoint, leave (model.bin, the summary line). Returns the exit
 * status. */
static int finish(run *u, int ret)
{
    const ds_conf *c = u->c;
    ds_trainer *t = &u->t;
    dsnode *d = u->d;
    const int stopped = dsnode_stopped(d);
    dsnode_settle(d);
    if (ret == 0 && u->own_steps == 0 && u->adopted_past) {
        ds_error("train", "the cluster is at step %lld, past this node's train.steps = %lld: "
                 "nothing to train (give this node at least the cluster's train.steps)",
                 (long long)u->adopted_past, (long long)c->train.steps);
        ret = -ERANGE;
    }
    if ((stopped || u->paused) && ret == 0) {
        if (u->paused)
            ds_info("train", "pausing at step %lld after train.stop_after = %lld steps",
                    (long long)t->step, (long long)c->train.stop_after);
        else
            ds_warn("train", "stopping on signal %d at step %lld", stopped, (long long)t->step);
        if (ds_trainer_evaluate(t, &u->test_loss, &u->test_acc) < 0)
            u->test_acc = -1;
    }
    /* The summary's numbers: the last step's loss, samples/s over every
     * step this process took. */
    const double sps = u->train_ns ? (double)t->samples / ((double)u->train_ns * 1e-9) : 0;
    dsnode_report(d, u->loss, u->test_acc, (double)ds_trainer_lr(t), sps);
    if (u->ckpt && ret == 0 && save_checkpoint(u) < 0)
        ret = -EIO;
    dsnode_leave(d, ret < 0 ? DSNODE_FAILED : u->paused ? DSNODE_PAUSED : DSNODE_DONE);
    return dsnode_exit_status(d);
}

int ds_node_run(const ds_conf *c, const char *path, const char *const *sets, size_t n_sets,
                const char *resume, unsigned flags)
{
    run u = {.c = c, .test_acc = -1, .resume = resume,
             .ckpt = c->train.checkpoint_every > 0 || c->train.stop_after > 0 || resume};
    char err[1024];
    int code = 1;

    ds_run_train_cfg(c, &u.tc);
    /* The config was checked by the caller: what can fail here is the
     * engine's (keys, identity), which it logged. */
    if (dsnode_open(&u.d, path, sets, n_sets) < 0)
        return 1;
    if (dsnode_handle_signals(u.d) < 0) {
        ds_error("node", "%s", dsnode_error());
        goto close;
    }
    /* libfabric warms up (dsnode_open) while the dataset loads. */
    if (ds_trainer_init(&u.t, &u.tc, err, sizeof(err)) < 0) {
        ds_error("node", "cannot start: %s", err);
        goto close;
    }
    describe_trainer(&u);
    if (register_trainer(&u) < 0)
        goto fini_trainer;
    if (u.resume && dsnode_resume(u.d, u.resume, restore, &u) < 0) {
        ds_error("node", "cannot resume: %s", dsnode_error());
        goto fini_trainer;
    }
    /* Refused, timed out, stopped, or admitted and given no state: the
     * engine logged it and printed the summary of a run that did not
     * start. */
    if (dsnode_join(u.d) < 0) {
        code = dsnode_exit_status(u.d);
        goto fini_trainer;
    }
    code = finish(&u, train_loop(&u));
    if (flags & DS_RUN_PROCESS_EXITS) {
        /* The caller ends the process next (node/main.c says why). */
        dsnode_abandon(&u.d);
        return code;
    }
fini_trainer:
    if (u.host)
        u.t.ops.host_free(u.host);
    if (u.delta_dev)
        u.t.ops.free(u.delta_dev);
    ds_trainer_fini(&u.t);
close:
    dsnode_close(&u.d);
    return code;
}
