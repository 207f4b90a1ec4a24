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
 *   summary node=NAME status=done|stopped|failed steps=N loss=L test_acc=A
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
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/rng.h"
#include "kernels/kernels.h"
#include "node/runtime/engine.h"
#include "node/runtime/preflight.h"
#include "node/runtime/run.h"
#include "node/status/status.h"

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
    snprintf(t->dataset_dir, sizeof(t->dataset_dir), "%s", c->train.dataset_dir);
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

/* Write all of buf to fd. 0 or a negative errno. */
static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        const ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* dir's entry for a renamed file reaches the disk too. */
static int fsync_dir(const char *dir)
{
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    const int e = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return e;
}

/* The header and the parameters into tmp, flushed to the disk. */
static int write_model(const char *tmp, const float *host, size_t n)
{
    uint8_t hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -errno;
    /* The file is little-endian float32, as this host (x86-64; wire.h pins
     * the byte order for the whole node). */
    int e = write_all(fd, hdr, sizeof(hdr));
    if (!e)
        e = write_all(fd, host, n * sizeof(float));
    if (!e && fsync(fd) < 0)
        e = -errno;
    if (close(fd) < 0 && !e)
        e = -errno;
    return e;
}

int ds_run_save_model(const char *dir, const ds_trainer *t, char *err, size_t err_len)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, err_len, "%s: cannot create: %s", dir, strerror(errno));
        return -errno;
    }
    const size_t n = t->n_params;
    float *host = malloc(n * sizeof(float));
    if (!host) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    int e = t->ops.download(host, t->theta, n * sizeof(float));
    if (e < 0) {
        snprintf(err, err_len, "parameters not read from the device: %s", strerror(-e));
    } else if ((e = write_model(tmp, host, n)) < 0) {
        snprintf(err, err_len, "%s: cannot write: %s", tmp, strerror(-e));
        unlink(tmp);
    } else if (rename(tmp, path) < 0) {
        e = -errno;
        snprintf(err, err_len, "%s: cannot rename to %s: %s", tmp, path, strerror(-e));
        unlink(tmp);
    } else if ((e = fsync_dir(dir)) < 0) {
        snprintf(err, err_len, "%s: cannot flush the directory: %s", dir, strerror(-e));
    }
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
} run;

/* The engine's view of the trainer's memory (ds_engine_params): on a
 * device, the engine works on u->host, copied from and back here. */
static int pull(void *ctx, enum ds_engine_buf which)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    return t->ops.download(u->host, which == DS_ENGINE_GRAD ? t->grad : t->theta,
                           t->n_params * sizeof(float));
}

static int push(void *ctx, enum ds_engine_buf which)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    return t->ops.upload(which == DS_ENGINE_GRAD ? t->grad : t->theta, u->host,
                         t->n_params * sizeof(float));
}

/* A joiner took the cluster's model: continue from its step, momentum
 * reset. */
static int adopt(void *ctx, int64_t step)
{
    run *u = ctx;
    ds_trainer *t = &u->t;
    t->ops.memzero(t->mom, t->n_params * sizeof(float));
    t->step = step;
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
                          .n_layers = t->model.n_layers, .ctx = u, .adopt = adopt};
    ds_info("train", "%s", t->backend_note);
    if (t->ops.kind == DS_BACKEND_CPU) {
        ds_info("train", "openblas_kernels=%s threads=%d", ds_blas_corename(), u->tc.threads);
        p.params = t->theta;
        p.grad = t->grad;
    } else {
        if (!(u->host = malloc(t->n_params * sizeof(float)))) {
            ds_error("node", "out of memory");
            return -ENOMEM;
        }
        p.params = p.grad = u->host;
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

/* Train until train.steps or a stop signal. 0, or the negative errno of
 * a failed step or evaluation. */
static int train_loop(run *u)
{
    const ds_conf *c = u->c;
    ds_trainer *t = &u->t;
    const int64_t steps = c->train.steps;
    double loss_window = 0;
    int64_t window_n = 0;
    uint64_t t_window = ds_now_ns();
    int e;

    while (t->step < steps && !stop_signal) {
        if (ds_engine_before_step(u->e))
            continue; /* a joiner shadowing the cluster: no step of ours */
        const uint64_t t0 = ds_now_ns();
        if ((e = ds_trainer_compute_grad(t, &u->loss, NULL)) < 0) {
            ds_error("train", "step %lld failed: %s", (long long)t->step, strerror(-e));
            return e;
        }
        ds_engine_reduce(u->e, t->step);
        ds_trainer_apply_grad(t);
        ds_engine_step(u->e, t->step);
        u->train_ns += ds_now_ns() - t0;
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
                ds_error("eval", "evaluation failed: %s", strerror(-e));
                return e;
            }
            ds_info("eval", "step=%lld test_loss=%.4f test_acc=%.4f", (long long)t->step,
                    u->test_loss, u->test_acc);
            u->rep.test_acc = u->test_acc;
        }
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
    if (stop_signal && ret == 0) {
        ds_warn("train", "stopping on signal %d at step %lld", (int)stop_signal, (long long)t->step);
        if (ds_trainer_evaluate(t, &u->test_loss, &u->test_acc) < 0)
            u->test_acc = -1;
    }
    ds_engine_leave(u->e);

    ds_engine_info in;
    ds_engine_info_get(u->e, &in);
    const ds_gossip_stats *gs = &in.gossip;
    const double wall = (double)(ds_now_ns() - u->t_start) * 1e-9;
    const double sps = u->train_ns ? (double)t->samples / ((double)u->train_ns * 1e-9) : 0;
    /* The model first: a run whose result could not be kept failed. */
    if (ds_run_save_model(c->node.data_dir, t, err, sizeof(err)) < 0) {
        ds_error("train", "final model not saved: %s", err);
        ret = ret < 0 ? ret : -EIO;
    }
    const char *status = ret < 0 ? "failed" : stop_signal ? "stopped" : "done";
    u->rep.phase = ret < 0 ? DS_STATUS_FAILED : stop_signal ? DS_STATUS_STOPPED : DS_STATUS_DONE;
    u->rep.test_acc = u->test_acc;
    publish(u, 1);
    ds_info("train", "summary status=%s steps=%lld test_acc=%.4f rounds=%llu exchanges_ok=%llu "
            "exchanges_failed=%llu stale=%llu late=%llu dropped=%llu wait_s=%.2f "
            "max_round_s=%.3f values_sent=%llu",
            status, (long long)t->step, u->test_acc, (unsigned long long)in.rounds,
            (unsigned long long)gs->exchanges_ok, (unsigned long long)gs->exchanges_failed,
            (unsigned long long)gs->stale_received, (unsigned long long)gs->late,
            (unsigned long long)gs->dropped, (double)gs->wait_ns * 1e-9,
            (double)gs->max_wait_ns * 1e-9, (unsigned long long)gs->values_sent);
    printf("summary node=%s status=%s steps=%lld loss=%.4f test_acc=%.4f samples_per_s=%.0f "
           "wall_s=%.1f backend=%s bytes_sent=%llu bytes_received=%llu rounds=%llu "
           "max_round_s=%.3f\n",
           c->node.name, status, (long long)t->step, u->loss, u->test_acc, sps, wall, t->ops.name,
           (unsigned long long)in.net.bytes_sent, (unsigned long long)in.net.bytes_recv,
           (unsigned long long)in.rounds, (double)gs->max_wait_ns * 1e-9);
    fflush(stdout);
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

int ds_node_run(const ds_conf *c, unsigned flags)
{
    run u = {.c = c, .t_start = ds_now_ns(), .test_acc = -1,
             .rep = {.phase = DS_STATUS_JOINING, .test_acc = -1}};
    const ds_engine_stop stop = {.signal = &stop_signal, .count = &stop_count,
                                 .reload = &reload_count};
    char err[1024];
    int code = 1, e;

    install_signals();
    ds_run_train_cfg(c, &u.tc);
    if (ds_engine_open(&u.e, c, &stop) < 0)
        return 1;
    if (ds_trainer_init(&u.t, &u.tc, err, sizeof(err)) < 0) {
        ds_error("node", "cannot start: %s", err);
        goto close_engine;
    }
    if (check_outputs(&u) < 0 || register_trainer(&u) < 0 || ds_engine_listen(u.e) < 0)
        goto fini_trainer;
    publish(&u, 1);
    if ((e = ds_engine_join(u.e, err, sizeof(err))) < 0) {
        code = not_started(&u, e, err);
        goto fini_trainer;
    }
    if ((e = ds_engine_start(u.e)) < 0) {
        code = e == -EINTR ? 128 + (int)stop_signal : 1;
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
