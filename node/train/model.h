/*
 * node/train/model.h: the model as one contiguous float32 parameter vector with a
 * layer table (design §2), and its forward/backward pass on a backend.
 *
 * Layout: each dense layer stores its weight (out x in, row-major, like
 * torch.nn.Linear) then its bias (out) in theta[off .. off+len). Gradients,
 * momentum and the gossip accumulator share that layout, and a gossip
 * segment is by default one layer (weights and bias together).
 *
 * The MLP is input -> [dense -> ReLU] x hidden -> dense -> softmax
 * cross-entropy. The model owns its activation scratch on the backend; theta
 * and grad are the caller's (backend memory).
 */
#ifndef DS_NODE_MODEL_H
#define DS_NODE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define DS_MODEL_MAX_LAYERS 9

typedef struct ds_layer {
    char name[16];     /* "fc1", "fc2", ... */
    size_t off;        /* first parameter of the layer in theta */
    size_t len;        /* in*out + out */
    int in, out;       /* weight shape is out x in */
    int relu;          /* ReLU after this layer */
} ds_layer;

typedef struct ds_model {
    const ds_ops *ops; /* borrowed; outlives the model */
    int n_layers;
    ds_layer layer[DS_MODEL_MAX_LAYERS];
    size_t n_params;
    int input_dim, n_classes, max_batch;
    /* Backend scratch, owned: act[i] is the output of layer i (max_batch x
     * out_i), dact[0..1] are ping-pong buffers for gradients w.r.t.
     * activations. */
    float *act[DS_MODEL_MAX_LAYERS];
    float *dact[2];
} ds_model;

/* Build an MLP: input_dim -> hidden[0] -> ... -> n_classes. Returns 0,
 * -EINVAL for bad shapes, -ENOMEM when backend memory runs out. */
int ds_model_init_mlp(ds_model *m, const ds_ops *ops, int input_dim, const int *hidden,
                      int n_hidden, int n_classes, int max_batch);

/* Release the scratch; NULL-safe; the struct is cleared. */
void ds_model_fini(ds_model *m);

/* Initial parameters into a HOST buffer of n_params floats: He-uniform
 * weights for layers followed by ReLU, Xavier-uniform for the last one,
 * zero biases; deterministic in `seed`. */
void ds_model_init_params(const ds_model *m, float *theta_host, uint64_t seed);

/* Forward pass over `batch` rows of x (backend memory, batch x input_dim),
 * then, when grad is non-NULL, backward into grad (overwritten, n_params,
 * gradient of the MEAN loss). Returns the SUM of per-row losses in
 * *loss_sum and the number of correct arg-max predictions in *correct. */
int ds_model_forward_backward(ds_model *m, const float *theta, float *grad, const float *x,
                              const int32_t *labels, int batch, double *loss_sum, int64_t *correct);

#endif
