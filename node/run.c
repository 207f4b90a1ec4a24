/*
 * node/run.c: the training loop of one node: step, log, evaluate, stop on a
 * signal, summarise.
 *
 * The summary is the one line a launcher needs, on stdout:
 *   summary node=NAME status=done|stopped|failed steps=N loss=L test_acc=A
 *           samples_per_s=S wall_s=W backend=B bytes_sent=X bytes_received=Y
 *           rounds=R
 * Everything else goes to the log (stderr). At exit the final parameters
 * go to <node.data_dir>/model.bin (see ds_run_save_model) so a launcher can
 * measure how far the nodes' models are apart.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/kernels.h"
#include "node/log.h"
#include "node/rng.h"
#include "node/run.h"

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig)
{
    stop_signal = sig;
}

void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *t)
{
    ds_train_cfg_defaults(t);
    snprintf(t->backend, sizeof(t->backend), "%s", c->train.backend);
    snprintf(t->dataset_dir, sizeof(t->dataset_dir), "%s", c->train.dataset_dir);
    t->n_hidden = c->train.hidden_count;
    for (int i = 0; i < c->train.hidden_count && i < DS_TRAIN_MAX_HIDDEN; i++)
        t->hidden[i] = (int)c->train.hidden[i];
    t->batch = (int)c->train.batch_size;
    t->lr = c->train.lr;
    t->momentum = c->train.momentum;
    t->weight_decay = c->train.weight_decay;
    t->nesterov = c->train.nesterov;
    t->warmup_steps = c->train.warmup_steps;
    t->cosine = !strcmp(c->train.lr_schedule, "cosine");
    t->total_steps = c->train.steps;
    t->threads = (int)c->train.threads;
    t->init_seed = (uint64_t)c->cluster.seed;
    t->data_seed = ds_rng_hash_str((uint64_t)c->cluster.seed, c->node.name);
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
    int ret = t->ops.download(host, t->theta, n * sizeof(float));
    FILE *f = ret == 0 ? fopen(tmp, "wb") : NULL;
    if (!f) {
        ret = ret ? ret : -errno;
        snprintf(err, err_len, "%s: cannot write: %s", tmp, strerror(-ret));
        free(host);
        return ret;
    }
    uint8_t hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    /* The file is little-endian float32; this host is too (x86-64, and the
     * static_assert in wire.h pins the byte order for the whole node). */
    int ok = fwrite(hdr, 1, 16, f) == 16 && fwrite(host, sizeof(float), n, f) == n;
    ok = (fclose(f) == 0) && ok;
    free(host);
    if (!ok || rename(tmp, path) < 0) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        return -EIO;
    }
    return 0;
}

int ds_node_run(const ds_conf *c)
{
    ds_trainer t;
    ds_train_cfg tc;
    char err[512];
    const uint64_t t_start = ds_now_ns();

    ds_run_train_cfg(c, &tc);
    if (ds_trainer_init(&t, &tc, err, sizeof(err)) < 0) {
        ds_error("train", "cannot start: %s", err);
        return 1;
    }
    ds_info("train", "%s", t.backend_note);
    if (t.ops.kind == DS_BACKEND_CPU)
        ds_info("train", "openblas_kernels=%s threads=%d", ds_blas_corename(), tc.threads);
    ds_info("train", "model=mlp params=%zu layers=%d train_examples=%zu test_examples=%zu batch=%d",
            t.n_params, t.model.n_layers, t.train.n, t.test.n, tc.batch);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    const int64_t steps = c->train.steps;
    double loss = 0, loss_window = 0, test_acc = -1, test_loss = 0;
    int64_t window_n = 0;
    uint64_t t_window = ds_now_ns(), train_ns = 0;
    int ret = 0;

    while (t.step < steps && !stop_signal) {
        const uint64_t t0 = ds_now_ns();
        if ((ret = ds_trainer_compute_grad(&t, &loss, NULL)) < 0) {
            ds_error("train", "step %lld failed: %s", (long long)t.step, strerror(-ret));
            break;
        }
        ds_trainer_apply_grad(&t);
        train_ns += ds_now_ns() - t0;
        loss_window += loss;
        window_n++;

        if (t.step % c->train.log_every == 0 || t.step == steps) {
            const uint64_t now = ds_now_ns();
            ds_info("train", "step=%lld loss=%.4f samples_per_s=%.0f lr=%.4g", (long long)t.step,
                    loss_window / window_n,
                    (double)window_n * tc.batch / ((double)(now - t_window) * 1e-9),
                    (double)ds_trainer_lr(&t));
            loss_window = 0;
            window_n = 0;
            t_window = now;
        }
        if ((c->train.eval_every > 0 && t.step % c->train.eval_every == 0) || t.step == steps) {
            if ((ret = ds_trainer_evaluate(&t, &test_loss, &test_acc)) < 0) {
                ds_error("eval", "evaluation failed: %s", strerror(-ret));
                break;
            }
            ds_info("eval", "step=%lld test_loss=%.4f test_acc=%.4f", (long long)t.step, test_loss,
                    test_acc);
        }
    }
    if (stop_signal && ret == 0) {
        ds_warn("train", "stopping on signal %d at step %lld", (int)stop_signal, (long long)t.step);
        if (ds_trainer_evaluate(&t, &test_loss, &test_acc) < 0)
            test_acc = -1;
    }

    const double wall = (double)(ds_now_ns() - t_start) * 1e-9;
    const double sps = train_ns ? (double)t.samples / ((double)train_ns * 1e-9) : 0;
    const char *status = ret < 0 ? "failed" : stop_signal ? "stopped" : "done";
    ds_info("train", "summary status=%s steps=%lld test_acc=%.4f", status, (long long)t.step,
            test_acc);
    if (ds_run_save_model(c->node.data_dir, &t, err, sizeof(err)) < 0)
        ds_warn("train", "final model not saved: %s", err);
    printf("summary node=%s status=%s steps=%lld loss=%.4f test_acc=%.4f samples_per_s=%.0f "
           "wall_s=%.1f backend=%s bytes_sent=%llu bytes_received=%llu rounds=%llu\n",
           c->node.name, status, (long long)t.step, loss, test_acc, sps, wall, t.ops.name,
           0ull, 0ull, 0ull);
    fflush(stdout);
    ds_trainer_fini(&t);
    if (ret < 0)
        return 1;
    return stop_signal ? 128 + (int)stop_signal : 0;
}
