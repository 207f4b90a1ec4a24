/*
 * node/train/train.h: one node's local training: backend, model, data, optimizer.
 *
 * The trainer owns theta (parameters), grad and the momentum buffer in the
 * backend's memory, all in the model's layout (node/train/model.h). A step is
 * split in two so the gossip and group layers can act in between:
 *   ds_trainer_compute_grad()   next minibatch -> forward/backward -> grad
 *   ds_trainer_apply_grad()     SGD (momentum, weight decay, Nesterov,
 *                               linear warm-up, cosine decay) on theta
 */
#ifndef DS_NODE_TRAIN_H
#define DS_NODE_TRAIN_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "node/train/data.h"
#include "node/train/model.h"

#define DS_TRAIN_MAX_HIDDEN 8
#define DS_TRAIN_EVAL_BATCH 500

/* The model kinds (train.model's choices, mapped by node/runtime). */
enum ds_train_model {
    DS_TRAIN_MLP = 0,    /* hidden[0..n_hidden) */
    DS_TRAIN_CNN = 1,    /* DS_LAYERSPEC_CNN (base/layerspec.h) */
    DS_TRAIN_CUSTOM = 2, /* layers */
};

typedef struct ds_train_cfg {
    enum ds_ops_backend backend; /* kernels/kernels.h: auto, cpu, cuda */
    int device;                  /* CUDA device index (cuda, auto) */
    char dataset_dir[1024];
    char dataset_cache[1024];    /* "" none; node/train/data.h */
    enum ds_train_model model;
    int hidden[DS_TRAIN_MAX_HIDDEN]; /* mlp */
    int n_hidden;
    char layers[256];            /* custom: the layer list (base/layerspec.h) */
    int batch;
    double lr, momentum, weight_decay;
    int nesterov;
    int64_t warmup_steps;
    int cosine;             /* 1: cosine decay of lr to 0 at total_steps */
    int64_t total_steps;
    int threads;            /* BLAS threads on the CPU backend */
    uint64_t init_seed;     /* parameter init: the same on every node */
    uint64_t data_seed;     /* this node's shuffle: differs per node */
} ds_train_cfg;

typedef struct ds_trainer {
    ds_train_cfg cfg;
    ds_ops ops;
    ds_model model;
    ds_dataset train, test;
    ds_sampler sampler;
    size_t n_params;
    float *theta, *grad, *mom;       /* backend memory, n_params each */
    float *x_dev;                    /* backend: max batch x input */
    int32_t *y_dev;
    float *x_host;                   /* == x_dev on the CPU backend */
    int32_t *y_host;
    uint32_t *idx;
    /* On a device: the data sets' images and labels, uploaded once
     * (train 0, test 1), and a batch's indices; NULL on the CPU. */
    uint8_t *img_dev[2], *lab_dev[2];
    uint32_t *idx_dev;
    int64_t step;                    /* optimizer steps taken */
    uint64_t samples;                /* training samples consumed */
    char backend_note[256];          /* why this backend, for the log */
    const char *model_name;          /* "mlp", "cnn" or "custom" */
} ds_trainer;

/* Defaults matching conf's: MLP 256,256, batch 64, lr 0.05, momentum 0.9. */
void ds_train_cfg_defaults(ds_train_cfg *c);

/* Load data, pick the backend, build the model, initialise theta.
 * 0 or a negative errno with one line in err. A model that needs kernels
 * the backend's table lacks (conv2d or max-pool; today every table has
 * them) is refused with -ENOTSUP when the backend was asked for, and runs
 * on the CPU (said in backend_note) when it was auto. */
int ds_trainer_init(ds_trainer *t, const ds_train_cfg *cfg, char *err, size_t err_len);
void ds_trainer_fini(ds_trainer *t);

/* Forward/backward on the next minibatch into t->grad. Mean loss and
 * batch accuracy go to *loss and *acc (either may be NULL). */
int ds_trainer_compute_grad(ds_trainer *t, double *loss, double *acc);

/* Learning rate of the next optimizer step: linear warm-up over
 * warmup_steps, then constant or cosine decay from lr to 0 at total_steps. */
float ds_trainer_lr(const ds_trainer *t);

/* One optimizer step on theta with t->grad; t->step++. */
void ds_trainer_apply_grad(ds_trainer *t);

/* Mean loss and accuracy over the whole test set. */
int ds_trainer_evaluate(ds_trainer *t, double *loss, double *acc);

#endif
