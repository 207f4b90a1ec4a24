/*
 * node/train/model.c: MLP forward and backward on any backend's op table.
 *
 * Forward, layer i:  A_i = act(A_{i-1} W_i^T + b_i)      (batch x out_i)
 * Backward, from dZ_L = softmax(Z_L) - onehot (mean over the batch):
 *   dW_i = dZ_i^T A_{i-1},  db_i = column sums of dZ_i,
 *   dA_{i-1} = dZ_i W_i,    dZ_{i-1} = dA_{i-1} * (A_{i-1} > 0).
 * The input gradient of the first layer is never formed (nothing needs it).
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "node/train/model.h"
#include "base/rng.h"

int ds_model_init_mlp(ds_model *m, const ds_ops *ops, int input_dim, const int *hidden,
                      int n_hidden, int n_classes, int max_batch)
{
    memset(m, 0, sizeof(*m));
    if (input_dim <= 0 || n_classes <= 1 || max_batch <= 0 || n_hidden < 0 ||
        n_hidden + 1 > DS_MODEL_MAX_LAYERS)
        return -EINVAL;
    m->ops = ops;
    m->input_dim = input_dim;
    m->n_classes = n_classes;
    m->max_batch = max_batch;
    m->n_layers = n_hidden + 1;
    int in = input_dim;
    size_t off = 0;
    int widest = n_classes;
    for (int i = 0; i < m->n_layers; i++) {
        ds_layer *l = &m->layer[i];
        const int out = i < n_hidden ? hidden[i] : n_classes;
        if (out <= 0)
            return -EINVAL;
        snprintf(l->name, sizeof(l->name), "fc%d", i + 1);
        l->in = in;
        l->out = out;
        l->off = off;
        l->len = (size_t)in * out + (size_t)out;
        l->relu = i < n_hidden;
        off += l->len;
        if (out > widest)
            widest = out;
        in = out;
    }
    m->n_params = off;
    for (int i = 0; i < m->n_layers; i++) {
        m->act[i] = ops->alloc((size_t)max_batch * m->layer[i].out * sizeof(float));
        if (!m->act[i])
            goto fail;
    }
    for (int i = 0; i < 2; i++) {
        m->dact[i] = ops->alloc((size_t)max_batch * widest * sizeof(float));
        if (!m->dact[i])
            goto fail;
    }
    return 0;

fail:
    ds_model_fini(m);
    return -ENOMEM;
}

void ds_model_fini(ds_model *m)
{
    if (!m || !m->ops)
        return;
    for (int i = 0; i < m->n_layers; i++)
        m->ops->free(m->act[i]);
    for (int i = 0; i < 2; i++)
        m->ops->free(m->dact[i]);
    memset(m, 0, sizeof(*m));
}

void ds_model_init_params(const ds_model *m, float *theta, uint64_t seed)
{
    ds_rng r;
    ds_rng_seed(&r, seed);
    for (int i = 0; i < m->n_layers; i++) {
        const ds_layer *l = &m->layer[i];
        /* He-uniform keeps the activation variance through ReLU layers;
         * Xavier-uniform suits the linear output layer. */
        const double bound = l->relu ? sqrt(6.0 / l->in) : sqrt(6.0 / (l->in + l->out));
        float *w = theta + l->off;
        for (size_t j = 0; j < (size_t)l->in * l->out; j++)
            w[j] = (float)((2.0 * ds_rng_unit(&r) - 1.0) * bound);
        memset(w + (size_t)l->in * l->out, 0, (size_t)l->out * sizeof(float));
    }
}

int ds_model_forward_backward(ds_model *m, const float *theta, float *grad, const float *x,
                              const int32_t *labels, int batch, double *loss_sum, int64_t *correct)
{
    const ds_ops *o = m->ops;
    if (batch <= 0 || batch > m->max_batch)
        return -EINVAL;

    const float *in = x;
    for (int i = 0; i < m->n_layers; i++) {
        const ds_layer *l = &m->layer[i];
        const float *w = theta + l->off, *b = w + (size_t)l->in * l->out;
        o->gemm(0, 1, batch, l->out, l->in, 1.0f, in, l->in, w, l->in, 0.0f, m->act[i], l->out);
        o->bias_add(m->act[i], b, batch, l->out);
        if (l->relu)
            o->relu_fwd(m->act[i], m->act[i], (size_t)batch * l->out);
        in = m->act[i];
    }

    const int last = m->n_layers - 1;
    float *dz = grad ? m->dact[0] : NULL;
    o->softmax_xent(dz, m->act[last], labels, batch, m->n_classes, loss_sum, correct);
    if (!grad)
        return 0;

    int cur = 0;
    for (int i = last; i >= 0; i--) {
        const ds_layer *l = &m->layer[i];
        const float *a_prev = i ? m->act[i - 1] : x;
        const float *w = theta + l->off;
        float *dw = grad + l->off, *db = dw + (size_t)l->in * l->out;
        dz = m->dact[cur];
        o->gemm(1, 0, l->out, l->in, batch, 1.0f, dz, l->out, a_prev, l->in, 0.0f, dw, l->in);
        o->bias_grad(db, dz, batch, l->out);
        if (i == 0)
            break;
        float *da = m->dact[cur ^ 1];
        o->gemm(0, 0, batch, l->in, l->out, 1.0f, dz, l->out, w, l->in, 0.0f, da, l->in);
        /* Layer i-1 ends in ReLU (only the last layer does not). */
        o->relu_bwd(da, da, m->act[i - 1], (size_t)batch * l->in);
        cur ^= 1;
    }
    return 0;
}
