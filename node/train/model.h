/*
 * node/train/model.h: the model as one contiguous float32 parameter vector with a
 * layer table (design §2), and its forward/backward pass on a backend.
 *
 * A model is a list of ops (base/layerspec.h: conv, maxpool2, relu,
 * flatten, linear) ending in softmax cross-entropy. Images are NCHW; the
 * input is batch x (c*h*w) floats. The ops with parameters are the LAYERS:
 * a dense layer stores its weight (out x in, row-major, like
 * torch.nn.Linear) then its bias (out); a conv layer its weight (c_out x
 * c_in x k x k, like torch.nn.Conv2d) then its bias (c_out); each in
 * theta[off .. off+len), in list order. Gradients, momentum and the gossip
 * accumulator share that layout, and a gossip segment is by default one
 * layer (weights and bias together). relu runs in place on the output of
 * the op before it; flatten is a reshape (no copy).
 *
 * The MLP of train.hidden is flatten -> [linear -> relu] x hidden ->
 * linear. The model owns its activation scratch on the backend; theta and
 * grad are the caller's (backend memory).
 */
#ifndef DS_NODE_MODEL_H
#define DS_NODE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/layerspec.h"
#include "kernels/kernels.h"

#define DS_MODEL_MAX_LAYERS DS_LAYERSPEC_MAX_PARAM /* layers with parameters */
#define DS_MODEL_MAX_OPS DS_LAYERSPEC_MAX

typedef struct ds_layer {
    char name[16];     /* "conv1", "fc1", ... (each kind counted on its own) */
    size_t off;        /* first parameter of the layer in theta */
    size_t len;        /* in*out + out */
    int in, out;       /* weight shape is out x in; a conv's in is c_in*k*k,
                        * its out c_out */
    int relu;          /* ReLU after this layer (a flatten between allowed) */
    int k;             /* conv: kernel size; 0 for a dense layer */
} ds_layer;

/* One op of the forward pass. Shapes per sample; a vector is c x 1 x 1. */
typedef struct ds_mop {
    enum ds_lkind kind;
    int layer;         /* conv, linear: index into layer[]; else -1 */
    int c, h, w;       /* input */
    int oc, oh, ow;    /* output */
    float *out;        /* conv, maxpool2, linear: owned output (max_batch x
                        * oc*oh*ow); NULL for relu and flatten, whose output
                        * is their input's buffer */
} ds_mop;

typedef struct ds_model {
    const ds_ops *ops; /* borrowed; outlives the model */
    int n_layers;
    ds_layer layer[DS_MODEL_MAX_LAYERS];
    size_t n_params;
    int input_dim, n_classes, max_batch;
    int n_ops;
    ds_mop op[DS_MODEL_MAX_OPS];
    /* Backend scratch, owned: dact[0..1] are ping-pong buffers for
     * gradients w.r.t. activations; col is one image's im2col matrix for
     * the largest conv (NULL without conv). */
    float *dact[2];
    float *col;
    /* May be NULL (the default): backward calls it as soon as layer i's
     * gradient (weight and bias) is written, last layer first, before the
     * layers below it run; the caller may start reducing that range
     * (group.overlap). On a device backend the kernels are only enqueued
     * by then. Set by the caller after init; fini clears it. */
    void (*grad_ready)(void *ctx, int layer);
    void *grad_ctx;
} ds_model;

/* Build an MLP: input_dim -> hidden[0] -> ... -> n_classes. Returns 0,
 * -EINVAL for bad shapes, -ENOMEM when backend memory runs out. */
int ds_model_init_mlp(ds_model *m, const ds_ops *ops, int input_dim, const int *hidden,
                      int n_hidden, int n_classes, int max_batch);

/* Build the model of a layer list (base/layerspec.h) for c x h x w inputs.
 * Returns 0; -EINVAL for a list the grammar or the shapes refuse, with
 * "expected ..., found '<item>' (layer i)" in err; -ENOTSUP when the list
 * needs an op the backend's table lacks (conv2d or max-pool, NULL in the
 * table), with the op in err; -ENOMEM. */
int ds_model_init_layers(ds_model *m, const ds_ops *ops, const char *spec, int c, int h, int w,
                         int n_classes, int max_batch, char *err, size_t err_len);

/* Release the scratch; NULL-safe; the struct is cleared. */
void ds_model_fini(ds_model *m);

/* Initial parameters into a HOST buffer of n_params floats: He-uniform
 * weights for layers followed by ReLU, Xavier-uniform for the others (a
 * conv's fans count its k x k window), zero biases; deterministic in
 * `seed`. */
void ds_model_init_params(const ds_model *m, float *theta_host, uint64_t seed);

/* Forward pass over `batch` rows of x (backend memory, batch x input_dim),
 * then, when grad is non-NULL, backward into grad (overwritten, n_params,
 * gradient of the MEAN loss; m->grad_ready, when set, hears of each
 * layer's as it is written). Returns the SUM of per-row losses in
 * *loss_sum and the number of correct arg-max predictions in *correct. */
int ds_model_forward_backward(ds_model *m, const float *theta, float *grad, const float *x,
                              const int32_t *labels, int batch, double *loss_sum, int64_t *correct);

/* The layer table as one line, for the log: "conv1 3x3 1->32 (320), ..." */
void ds_model_describe(const ds_model *m, char *out, size_t n);

#endif
