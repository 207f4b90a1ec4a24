/*
 * node/runtime/run.c: `dsnode run`: one node's life, from a validated config
 * to its summary line. The training loop here is one client of the engine
 * (node/runtime/engine.h): it owns the trainer and the optimizer, and hands
 * the engine its parameters; the engine does everything that makes the
 * process a member of the cluster.
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
 * Signals: the first SIGINT/SIGTERM stops training (the node evaluates,
 * leaves without lingering and prints its summary); a second one ends any
 * lingering at once. The handler only sets two flags, which the engine
 * reads through ds_engine_stop. SIGHUP re-reads the allow-list: its
 * handler only counts, and the net's worker reloads.
 *
 * The summary is the one line a launcher needs, on stdout:
 *   summary node=NAME status=done|paused|stopped|failed steps=N loss=L test_acc=A
 *           samples_per_s=S wall_s=W backend=B bytes_sent=X bytes_received=Y
 *           rounds=R
 * Everything else goes to the log (stderr). At exit the final parameters
 * go to <node.data_dir>/model.bin (see ds_run_save_model) so a launcher can
 * measure how far the nodes' models are apart. The results are never lost
 * silently: node.data_dir is checked at start, with model.bin's size
 * reserved once (preflight.h), and a final save that fails makes the run
 * failed (status=failed, exit 1), whatever training did.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "node/runtime/checkpoint.h"
#include "node/runtime/engine.h"
#include "node/runtime/preflight.h"
#include "node/runtime/run.h"
#include "node/runtime/summary.h"
#include "node/status/status.h"
#include "node/transport/transport.h"

/* Atomic, not volatile sig_atomic_t: the handler runs on whichever thread
 * the signal hits, and the engine's threads read the flags too. */
static atomic_int stop_signal, stop_count;

/* First SIGINT/SIGTERM: stop training, leave gracefully. Second: go now. */
static void on_signal(int sig)
{
    stop_signal = sig;
    stop_count++;
}

static atomic_int reload_count;

/* SIGHUP: re-read the allow-list. The handler only counts; the net's
 * worker notices the change and reloads (ds_net_allow_reload). */
static void on_reload_signal(int sig)
{
    (void)sig;
    reload_count++;
}

static void install_reload_signal(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_reload_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
}

static void install_signals(void)
{
    install_reload_signal();
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *t)
{
    ds_train_cfg_defaults(t);
    t->backend = c->train.backend;
    t->device = (int)c->train.device;
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

int ds_run_save_params(const char *dir, const float *host, size_t n, char *err, size_t err_len)
{
    uint8_t hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    /* The file is little-endian float32, as this host (x86-64; wire.h pins
     * the byte order for the whole node). */
    return ds_ckpt_write_atomic(dir, "model.bin", hdr, sizeof(hdr), host, n * sizeof(float), err,
                                err_len);
}

int ds_run_save_model(const char *dir, const ds_trainer *t, char *err, size_t err_len)
{
    const size_t n = t->n_params;
    float *host = malloc(n * sizeof(float));
    if (!host) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    int e = t->ops.download(host, t->theta, n * sizeof(float));
    if (e < 0)
        snprintf(err, err_len, "parameters not read from the device: %s", strerror(-e));
    else
        e = ds_run_save_params(dir, host, n, err, err_len);
    free(host);
    return e;
}

/* ---- the client ------------------------------------------------------------ */

/* `dsnode run`'s side: the trainer, and what its log and summary show. */
typedef struct run {
    const ds_conf *c;
    ds_engine *e;
    ds_train_cfg tc;
    ds_trainer t;
    float *host;          /* non-CPU backends: host mirror of theta or grad */
    uint64_t t_start;     /* ns */
    ds_engine_report rep; /* what the status page shows */
    double loss, test_acc, test_loss;
    uint64_t train_ns;    /* time in training steps, for samples_per_s */
    const char *resume;   /* --resume FILE, or NULL */
    int ckpt;             /* checkpoints on: at exit, on a signal, every N */
    int paused;           /* train.stop_after reached */
    int64_t own_steps;    /* optimizer steps this process took */
    int64_t adopted_past; /* a state adopted at or past train.steps: its step */
} run;

/* The engine's view of the trainer's memory (ds_engine_params): on a
 * device, the engine works on u->host, copied from and back here. */
static float *device_buf(ds_trainer *t, enum ds_engine_buf which)
{
    return which == DS_ENGINE_GRAD ? t->grad : which == DS_ENGINE_OPT ? t->mom : t->theta;
}

static int pull(void *ctx, enum ds_engine_buf which)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    return t->ops.download(u->host, device_buf(t, which), t->n_params * sizeof(float));
}

static int push(void *ctx, enum ds_engine_buf which)
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

/* --resume and a joiner: the engine prefers our own checkpoint over the
 * cluster's state it adopted (ds_ckpt_choose). */
static int restore(void *ctx, int64_t *step)
{
    run *u = ctx;
    char err[1200];
    const int e = ds_ckpt_load(u->resume, u->c, &u->t, u->e, NULL, err, sizeof(err));
    if (e < 0) {
        ds_warn("node", "%s", err);
        return e;
    }
    u->adopted_past = 0;
    *step = u->t.step;
    return 0;
}

static void publish(run *u, int force)
{
    u->rep.lr = ds_trainer_lr(&u->t);
    ds_engine_report_set(u->e, &u->rep);
    ds_engine_publish(u->e, force);
}

/* Log the trainer and hand its parameters to the engine. */
static int register_trainer(run *u)
{
    ds_trainer *t = &u->t;
    ds_engine_params p = {.n = t->n_params, .layers = t->model.layer,
                          .n_layers = t->model.n_layers, .ctx = u, .adopt = adopt,
                          .restore = u->resume ? restore : NULL};
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
        p.params = t->theta;
        p.grad = t->grad;
        p.opt = t->mom;
    } else {
        if (!(u->host = malloc(t->n_params * sizeof(float)))) {
            ds_error("node", "out of memory");
            return -ENOMEM;
        }
        p.params = p.grad = p.opt = u->host;
        p.pull = pull;
        p.push = push;
    }
    char table[512];
    ds_model_describe(&t->model, table, sizeof(table));
    ds_info("train", "model=%s params=%zu layers=%d train_examples=%zu test_examples=%zu batch=%d",
            t->model_name, t->n_params, t->model.n_layers, t->train.n, t->test.n, u->tc.batch);
    ds_info("train", "layer table: %s", table);
    return ds_engine_register(u->e, &p);
}

/* Joining failed or was stopped: say so, and the summary of a run that
 * did not start. Returns the exit status. */
static int not_started(run *u, int e, const char *err)
{
    int code;
    if (e == -EINTR) {
        ds_warn("node", "stopped on signal %d before training", (int)stop_signal);
        code = 128 + (int)stop_signal;
    } else {
        ds_error("node", "%s", err);
        code = 1;
    }
    printf("summary node=%s status=%s steps=0 loss=0 test_acc=-1 samples_per_s=0 wall_s=%.1f "
           "backend=%s bytes_sent=0 bytes_received=0 rounds=0\n",
           u->c->node.name, code == 1 ? "failed" : "stopped",
           (double)(ds_now_ns() - u->t_start) * 1e-9, u->t.ops.name);
    fflush(stdout);
    return code;
}

/* The progress line every train.log_every steps; its numbers go to the
 * status page too. */
static void log_window(run *u, double loss_window, int64_t window_n, uint64_t t_window)
{
    const uint64_t now = ds_now_ns();
    const double sps = (double)window_n * u->tc.batch / ((double)(now - t_window) * 1e-9);
    ds_engine_info in;
    ds_engine_info_get(u->e, &in);
    ds_info("train", "step=%lld loss=%.4f samples_per_s=%.0f lr=%.4g rounds=%llu "
            "exchanges_ok=%llu exchanges_failed=%llu view=%u",
            (long long)u->t.step, loss_window / window_n, sps, (double)ds_trainer_lr(&u->t),
            (unsigned long long)in.rounds, (unsigned long long)in.gossip.exchanges_ok,
            (unsigned long long)in.gossip.exchanges_failed, in.view_size);
    u->rep.loss = loss_window / window_n;
    u->rep.samples_per_s = sps;
}

/* <node.data_dir>/checkpoint.bin now (no round open after the settle). */
static int save_checkpoint(run *u)
{
    char err[1024];
    ds_engine_settle(u->e);
    const int e = ds_ckpt_save(u->c, &u->t, u->e, err, sizeof(err));
    if (e < 0)
        ds_error("train", "checkpoint not saved: %s", err);
    else
        ds_info("train", "checkpoint saved at step %lld", (long long)u->t.step);
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

/* Train until train.steps or a stop signal. 0, or the negative errno of
 * a failed step or evaluation. */
static int train_loop(run *u)
{
    const ds_conf *c = u->c;
    ds_trainer *t = &u->t;
    const int64_t steps = c->train.steps;
    const int64_t every = c->train.checkpoint_every;
    double loss_window = 0;
    int64_t window_n = 0;
    uint64_t t_window = ds_now_ns();
    int e;

    while (t->step < steps && !stop_signal) {
        if (c->train.stop_after > 0 && u->own_steps >= c->train.stop_after) {
            u->paused = 1;
            break;
        }
        if (ds_engine_before_step(u->e))
            continue; /* a joiner shadowing the cluster: no step of ours */
        const uint64_t t0 = ds_now_ns();
        if ((e = ds_trainer_compute_grad(t, &u->loss, NULL)) < 0) {
            ds_error("train", "step %lld failed: %s%s", (long long)t->step, strerror(-e),
                     backend_error(t));
            return e;
        }
        ds_engine_reduce(u->e, t->step);
        ds_trainer_apply_grad(t);
        ds_engine_step(u->e, t->step);
        u->train_ns += ds_now_ns() - t0;
        u->own_steps++;
        loss_window += u->loss;
        window_n++;

        if (t->step % c->train.log_every == 0 || t->step == steps) {
            log_window(u, loss_window, window_n, t_window);
            loss_window = 0;
            window_n = 0;
            t_window = ds_now_ns();
        }
        if ((c->train.eval_every > 0 && t->step % c->train.eval_every == 0) || t->step == steps) {
            ds_engine_settle(u->e);
            if ((e = ds_trainer_evaluate(t, &u->test_loss, &u->test_acc)) < 0) {
                ds_error("eval", "evaluation failed: %s%s", strerror(-e), backend_error(t));
                return e;
            }
            ds_info("eval", "step=%lld test_loss=%.4f test_acc=%.4f", (long long)t->step,
                    u->test_loss, u->test_acc);
            u->rep.test_acc = u->test_acc;
        }
        if (every > 0 && t->step % every == 0 && t->step < steps &&
            (e = save_checkpoint(u)) < 0)
            return e;
        publish(u, 0);
    }
    return 0;
}

/* After the loop (ret: its outcome): evaluate when stopped, leave, the
 * summary lines, the model file. Returns the exit status. */
static int finish(run *u, int ret)
{
    const ds_conf *c = u->c;
    ds_trainer *t = &u->t;
    char err[1024];
    ds_engine_settle(u->e);
    if (ret == 0 && u->own_steps == 0 && u->adopted_past) {
        ds_error("train", "the cluster is at step %lld, past this node's train.steps = %lld: "
                 "nothing to train (give this node at least the cluster's train.steps)",
                 (long long)u->adopted_past, (long long)c->train.steps);
        ret = -ERANGE;
    }
    if ((stop_signal || u->paused) && ret == 0) {
        if (u->paused)
            ds_info("train", "pausing at step %lld after train.stop_after = %lld steps",
                    (long long)t->step, (long long)c->train.stop_after);
        else
            ds_warn("train", "stopping on signal %d at step %lld", (int)stop_signal,
                    (long long)t->step);
        if (ds_trainer_evaluate(t, &u->test_loss, &u->test_acc) < 0)
            u->test_acc = -1;
    }
    ds_engine_leave(u->e);

    ds_engine_info in;
    ds_engine_info_get(u->e, &in);
    const double wall = (double)(ds_now_ns() - u->t_start) * 1e-9;
    const double sps = u->train_ns ? (double)t->samples / ((double)u->train_ns * 1e-9) : 0;
    /* The model first: a run whose result could not be kept failed. */
    if (ds_run_save_model(c->node.data_dir, t, err, sizeof(err)) < 0) {
        ds_error("train", "final model not saved: %s", err);
        ret = ret < 0 ? ret : -EIO;
    }
    if (u->ckpt && ret == 0 && save_checkpoint(u) < 0)
        ret = -EIO;
    const char *status = ret < 0        ? "failed"
                         : stop_signal ? "stopped"
                         : u->paused   ? "paused"
                                       : "done";
    u->rep.phase = ret < 0        ? DS_STATUS_FAILED
                   : stop_signal ? DS_STATUS_STOPPED
                   : u->paused   ? DS_STATUS_PAUSED
                                 : DS_STATUS_DONE;
    u->rep.test_acc = u->test_acc;
    publish(u, 1);
    const ds_run_summary sum = {.name = c->node.name, .status = status, .backend = t->ops.name,
                                .steps = t->step, .loss = u->loss, .test_acc = u->test_acc,
                                .samples_per_s = sps, .wall_s = wall};
    ds_run_summary_print(&sum, &in);
    const int sig = (int)stop_signal;
    return ret < 0 ? 1 : sig ? 128 + sig : 0;
}

/* node.data_dir can take model.bin (header + float32 parameters). */
static int check_outputs(run *u)
{
    char err[1024];
    const uint64_t bytes = 16 + (uint64_t)u->t.n_params * sizeof(float);
    if (ds_preflight_outputs(u->c, bytes, err, sizeof(err)) < 0) {
        ds_error("node", "cannot start: %s", err);
        return -1;
    }
    return 0;
}

/* --resume: the checkpoint's state into the trainer and the engine,
 * before the node listens. */
static int resume(run *u)
{
    char err[1200];
    ds_ckpt_info in;
    const int e = ds_ckpt_load(u->resume, u->c, &u->t, u->e, &in, err, sizeof(err));
    if (e < 0) {
        ds_error("node", "cannot resume: %s", err);
        return e;
    }
    ds_info("train", "resumed from %s at step %lld (round %llu)", u->resume, (long long)in.step,
            (unsigned long long)in.round);
    return 0;
}

int ds_node_run(const ds_conf *c, const char *resume_path, unsigned flags)
{
    run u = {.c = c, .t_start = ds_now_ns(), .test_acc = -1, .resume = resume_path,
             .ckpt = c->train.checkpoint_every > 0 || c->train.stop_after > 0 || resume_path,
             .rep = {.phase = DS_STATUS_JOINING, .test_acc = -1}};
    const ds_engine_stop stop = {.signal = &stop_signal, .count = &stop_count,
                                 .reload = &reload_count};
    char err[1024];
    int code = 1, e;

    install_signals();
    ds_run_train_cfg(c, &u.tc);
    if (ds_engine_open(&u.e, c, &stop) < 0)
        return 1;
    /* libfabric loads, initialises and opens the endpoint while the
     * dataset loads, so a joiner is in the view that much sooner
     * (docs/benchmarks.md, "Start-up"). The engine's open takes the
     * endpoint over: the same provider, address and default peer count. */
    ds_transport_opts warm;
    ds_transport_opts_default(&warm);
    warm.provider = c->transport.provider;
    warm.listen = c->node.listen;
    ds_transport_warm(&warm);
    if (ds_trainer_init(&u.t, &u.tc, err, sizeof(err)) < 0) {
        ds_error("node", "cannot start: %s", err);
        goto close_engine;
    }
    if (check_outputs(&u) < 0 || register_trainer(&u) < 0 || (u.resume && resume(&u) < 0) ||
        ds_engine_listen(u.e) < 0)
        goto fini_trainer;
    publish(&u, 1);
    /* Refused, timed out, or admitted and given no state: one summary line
     * and exit status for all of them. */
    if ((e = ds_engine_join(u.e, err, sizeof(err))) < 0 ||
        (e = ds_engine_start(u.e, err, sizeof(err))) < 0) {
        code = not_started(&u, e, err);
        goto fini_trainer;
    }
    u.rep.phase = DS_STATUS_TRAINING;
    u.rep.test_acc = -1;
    publish(&u, 1);

    code = finish(&u, train_loop(&u));
    if (flags & DS_RUN_PROCESS_EXITS) {
        /* The caller ends the process next (node/main.c says why): the
         * endpoint and what the net's threads touch stay as they are. */
        ds_engine_abandon(&u.e);
        return code;
    }
fini_trainer:
    ds_trainer_fini(&u.t);
    free(u.host);
close_engine:
    ds_engine_close(&u.e);
    return code;
}
