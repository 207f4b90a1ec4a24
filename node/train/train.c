/* node/train/train.c: see train.h. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/train/train.h"

void ds_train_cfg_defaults(ds_train_cfg *c)
{
    memset(c, 0, sizeof(*c));
    c->backend = DS_OPS_AUTO;
    c->model = DS_TRAIN_MLP;
    snprintf(c->dataset_dir, sizeof(c->dataset_dir), "/usr/share/datasets/fashion-mnist");
    c->hidden[0] = c->hidden[1] = 256;
    c->n_hidden = 2;
    c->batch = 64;
    c->lr = 0.05;
    c->momentum = 0.9;
    c->weight_decay = 1e-4;
    c->cosine = 1;
    c->total_steps = 3000;
    c->threads = 1;
    c->init_seed = 1;
    c->data_seed = 1;
}

/* The model of cfg->model on t->ops (see ds_trainer_init for -ENOTSUP). */
static int build_model(ds_trainer *t, int input, int max_batch, char *err, size_t err_len)
{
    const ds_train_cfg *cfg = &t->cfg;
    char why[256] = "";
    int ret;
    if (cfg->model == DS_TRAIN_MLP) {
        t->model_name = "mlp";
        ret = ds_model_init_mlp(&t->model, &t->ops, input, cfg->hidden, cfg->n_hidden,
                                DS_DATA_CLASSES, max_batch);
        if (ret < 0)
            snprintf(err, err_len, "cannot build the model: %s", strerror(-ret));
        return ret;
    }
    if (cfg->model != DS_TRAIN_CNN && cfg->model != DS_TRAIN_CUSTOM) {
        snprintf(err, err_len, "train.model: unknown model %d", (int)cfg->model);
        return -EINVAL;
    }
    const int cnn = cfg->model == DS_TRAIN_CNN;
    const char *spec = cnn ? DS_LAYERSPEC_CNN : cfg->layers;
    t->model_name = cnn ? "cnn" : "custom";
    ret = ds_model_init_layers(&t->model, &t->ops, spec, 1, t->train.rows, t->train.cols,
                               DS_DATA_CLASSES, max_batch, why, sizeof(why));
    if (ret == -ENOTSUP && cfg->backend == DS_OPS_AUTO) {
        /* auto chose a device whose table lacks an op of this model. */
        ds_ops_fini(&t->ops);
        ds_ops_init_cpu(&t->ops);
        ds_blas_set_threads(cfg->threads);
        snprintf(t->backend_note, sizeof(t->backend_note),
                 "backend=%s (auto: train.model = %s: %s)", t->ops.name, t->model_name, why);
        ret = ds_model_init_layers(&t->model, &t->ops, spec, 1, t->train.rows, t->train.cols,
                                   DS_DATA_CLASSES, max_batch, why, sizeof(why));
    }
    if (ret == -ENOTSUP)
        snprintf(err, err_len, "train.model = %s: not yet on %s: %s (use train.backend = cpu)",
                 t->model_name, ds_ops_backend_name(cfg->backend), why);
    else if (ret == -EINVAL && !cnn)
        snprintf(err, err_len, "train.layers: %s", why);
    else if (ret < 0)
        snprintf(err, err_len, "cannot build the model: %s", why);
    return ret;
}

static void free_data(ds_trainer *t)
{
    for (int i = 0; i < 2; i++) {
        t->ops.free(t->img_dev[i]);
        t->ops.free(t->lab_dev[i]);
        t->img_dev[i] = t->lab_dev[i] = NULL;
    }
    t->ops.free(t->idx_dev);
    t->idx_dev = NULL;
}

/* On a device with gather_images: both data sets' images and labels go
 * up once (Fashion-MNIST: 47 MB and 7.8 MB), so a step moves its 64
 * indices, not 200 KB of floats. The CPU gathers from host memory as
 * before. 0, or -ENOMEM / -EIO with err. */
static int upload_data(ds_trainer *t, int max_batch, char *err, size_t err_len)
{
    if (t->ops.kind == DS_BACKEND_CPU || !t->ops.gather_images)
        return 0;
    const ds_dataset *d[2] = {&t->train, &t->test};
    for (int i = 0; i < 2; i++) {
        const size_t ib = d[i]->n * (size_t)d[i]->rows * d[i]->cols;
        t->img_dev[i] = t->ops.alloc(ib);
        t->lab_dev[i] = t->ops.alloc(d[i]->n);
        if (!t->img_dev[i] || !t->lab_dev[i]) {
            snprintf(err, err_len, "out of device memory for the %s set's images (%zu bytes)",
                     i ? "test" : "training", ib);
            return -ENOMEM;
        }
        if (t->ops.upload(t->img_dev[i], d[i]->images, ib) < 0 ||
            t->ops.upload(t->lab_dev[i], d[i]->labels, d[i]->n) < 0) {
            snprintf(err, err_len, "cannot upload the %s set: %s", i ? "test" : "training",
                     t->ops.error && t->ops.error() ? t->ops.error() : "copy failed");
            return -EIO;
        }
    }
    if (!(t->idx_dev = t->ops.alloc((size_t)max_batch * sizeof(uint32_t)))) {
        snprintf(err, err_len, "out of device memory for a batch's indices");
        return -ENOMEM;
    }
    return 0;
}

int ds_trainer_init(ds_trainer *t, const ds_train_cfg *cfg, char *err, size_t err_len)
{
    int ret;
    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    if (cfg->batch <= 0 || cfg->n_hidden < 0 || cfg->n_hidden > DS_TRAIN_MAX_HIDDEN) {
        snprintf(err, err_len, "bad training shape: batch %d, %d hidden layers", cfg->batch,
                 cfg->n_hidden);
        return -EINVAL;
    }
    if ((ret = ds_dataset_load_fmnist(&t->train, &t->test, cfg->dataset_dir, cfg->dataset_cache,
                                      err, err_len)) < 0) {
        /* Name the config key the directory came from. */
        char what[1024];
        snprintf(what, sizeof(what), "%s", err);
        snprintf(err, err_len, "train.dataset_dir: %.*s", (int)(sizeof(what) - 32), what);
        return ret;
    }
    if ((ret = ds_ops_init_backend(&t->ops, cfg->backend, cfg->device, t->backend_note, sizeof(t->backend_note))) < 0) {
        snprintf(err, err_len, "%s", t->backend_note);
        goto fail_data;
    }
    if (t->ops.kind == DS_BACKEND_CPU)
        ds_blas_set_threads(cfg->threads);

    const int input = t->train.rows * t->train.cols;
    const int max_batch = cfg->batch > DS_TRAIN_EVAL_BATCH ? cfg->batch : DS_TRAIN_EVAL_BATCH;
    if ((ret = build_model(t, input, max_batch, err, err_len)) < 0)
        goto fail_ops;
    t->n_params = t->model.n_params;
    const size_t pbytes = t->n_params * sizeof(float);
    t->theta = t->ops.alloc(pbytes);
    t->grad = t->ops.alloc(pbytes);
    t->mom = t->ops.alloc(pbytes);
    t->x_dev = t->ops.alloc((size_t)max_batch * input * sizeof(float));
    t->y_dev = t->ops.alloc((size_t)max_batch * sizeof(int32_t));
    t->idx = malloc((size_t)max_batch * sizeof(uint32_t));
    if (t->ops.kind == DS_BACKEND_CPU) {
        t->x_host = t->x_dev;
        t->y_host = t->y_dev;
    } else {
        t->x_host = malloc((size_t)max_batch * input * sizeof(float));
        t->y_host = malloc((size_t)max_batch * sizeof(int32_t));
    }
    if (!t->theta || !t->grad || !t->mom || !t->x_dev || !t->y_dev || !t->idx || !t->x_host ||
        !t->y_host) {
        snprintf(err, err_len, "out of memory for %zu parameters", t->n_params);
        ret = -ENOMEM;
        goto fail_bufs;
    }
    if ((ret = upload_data(t, max_batch, err, err_len)) < 0)
        goto fail_bufs;
    if ((ret = ds_sampler_init(&t->sampler, t->train.n, cfg->data_seed)) < 0) {
        snprintf(err, err_len, "cannot build the sampler: %s", strerror(-ret));
        goto fail_bufs;
    }

    float *init = malloc(pbytes);
    if (!init) {
        snprintf(err, err_len, "out of memory for %zu parameters", t->n_params);
        ret = -ENOMEM;
        goto fail_sampler;
    }
    ds_model_init_params(&t->model, init, cfg->init_seed);
    ret = t->ops.upload(t->theta, init, pbytes);
    free(init);
    if (ret < 0) {
        snprintf(err, err_len, "cannot upload the initial parameters");
        goto fail_sampler;
    }
    return 0;

fail_sampler:
    ds_sampler_free(&t->sampler);
fail_bufs:
    free_data(t);
    if (t->ops.kind != DS_BACKEND_CPU) {
        free(t->x_host);
        free(t->y_host);
    }
    free(t->idx);
    t->ops.free(t->theta);
    t->ops.free(t->grad);
    t->ops.free(t->mom);
    t->ops.free(t->x_dev);
    t->ops.free(t->y_dev);
    ds_model_fini(&t->model);
fail_ops:
    ds_ops_fini(&t->ops);
fail_data:
    ds_dataset_free(&t->train);
    ds_dataset_free(&t->test);
    return ret;
}

void ds_trainer_fini(ds_trainer *t)
{
    if (!t || !t->ops.alloc)
        return;
    ds_sampler_free(&t->sampler);
    free_data(t);
    if (t->ops.kind != DS_BACKEND_CPU) {
        free(t->x_host);
        free(t->y_host);
    }
    free(t->idx);
    t->ops.free(t->theta);
    t->ops.free(t->grad);
    t->ops.free(t->mom);
    t->ops.free(t->x_dev);
    t->ops.free(t->y_dev);
    ds_model_fini(&t->model);
    ds_ops_fini(&t->ops);
    ds_dataset_free(&t->train);
    ds_dataset_free(&t->test);
    memset(t, 0, sizeof(*t));
}

/* Stage rows (idx, or first..first+batch) on the backend. */
static int stage_batch(ds_trainer *t, const ds_dataset *d, const uint32_t *idx, size_t first,
                       int batch)
{
    const int input = t->model.input_dim;
    const int which = d == &t->test;
    if (t->img_dev[which]) {
        /* On the device: only the indices go up. */
        if (idx && t->ops.upload(t->idx_dev, idx, (size_t)batch * sizeof(uint32_t)) < 0)
            return -EIO;
        float scale, shift;
        ds_dataset_norm(&scale, &shift);
        t->ops.gather_images(t->x_dev, t->y_dev, t->img_dev[which], t->lab_dev[which],
                             idx ? t->idx_dev : NULL, first, batch, (size_t)input, scale, shift);
        return 0;
    }
    ds_dataset_gather(d, idx, first, batch, t->x_host, t->y_host);
    if (t->ops.kind == DS_BACKEND_CPU)
        return 0;
    int ret = t->ops.upload(t->x_dev, t->x_host, (size_t)batch * input * sizeof(float));
    if (ret == 0)
        ret = t->ops.upload(t->y_dev, t->y_host, (size_t)batch * sizeof(int32_t));
    return ret;
}

int ds_trainer_compute_grad(ds_trainer *t, double *loss, double *acc)
{
    const int b = t->cfg.batch;
    ds_sampler_next(&t->sampler, t->idx, b);
    int ret = stage_batch(t, &t->train, t->idx, 0, b);
    if (ret < 0)
        return ret;
    double ls;
    int64_t good;
    ret = ds_model_forward_backward(&t->model, t->theta, t->grad, t->x_dev, t->y_dev, b, &ls, &good);
    /* A device fault (the last step's optimizer included) fails the step
     * here: nothing goes on from a failed kernel's leftovers. */
    if (ret == 0)
        ret = t->ops.sync();
    if (ret < 0)
        return ret;
    t->samples += (uint64_t)b;
    if (loss)
        *loss = ls / b;
    if (acc)
        *acc = (double)good / b;
    return 0;
}

float ds_trainer_lr(const ds_trainer *t)
{
    const int64_t w = t->cfg.warmup_steps, total = t->cfg.total_steps;
    if (w > 0 && t->step < w)
        return (float)(t->cfg.lr * (double)(t->step + 1) / (double)w);
    if (t->cfg.cosine && total > w) {
        const double p = (double)(t->step - w) / (double)(total - w);
        return p >= 1 ? 0.0f : (float)(t->cfg.lr * 0.5 * (1.0 + cos(M_PI * p)));
    }
    return (float)t->cfg.lr;
}

void ds_trainer_apply_grad(ds_trainer *t)
{
    const ds_sgd_params p = {
        .lr = ds_trainer_lr(t),
        .momentum = (float)t->cfg.momentum,
        .weight_decay = (float)t->cfg.weight_decay,
        .nesterov = t->cfg.nesterov,
    };
    t->ops.sgd(t->theta, t->mom, t->grad, t->n_params, &p);
    t->step++;
}

int ds_trainer_evaluate(ds_trainer *t, double *loss, double *acc)
{
    double ls_total = 0;
    int64_t good_total = 0;
    for (size_t first = 0; first < t->test.n; first += DS_TRAIN_EVAL_BATCH) {
        int b = (int)(t->test.n - first < DS_TRAIN_EVAL_BATCH ? t->test.n - first
                                                              : DS_TRAIN_EVAL_BATCH);
        int ret = stage_batch(t, &t->test, NULL, first, b);
        if (ret < 0)
            return ret;
        double ls;
        int64_t good;
        ret = ds_model_forward_backward(&t->model, t->theta, NULL, t->x_dev, t->y_dev, b, &ls,
                                        &good);
        if (ret == 0)
            ret = t->ops.sync();
        if (ret < 0)
            return ret;
        ls_total += ls;
        good_total += good;
    }
    if (loss)
        *loss = ls_total / (double)t->test.n;
    if (acc)
        *acc = (double)good_total / (double)t->test.n;
    return 0;
}
