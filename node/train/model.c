/*
 * node/train/model.c: forward and backward of a layer list on any backend's
 * op table.
 *
 * Dense layer:  Z = A W^T + b;  dW = dZ^T A,  db = column sums of dZ,
 *               dA = dZ W.
 * Conv layer:   the backend's conv2d_fwd / conv2d_bwd (kernels/kernels.h).
 * maxpool2:     maxpool_fwd / maxpool_bwd (the gradient goes to each
 *               window's first maximum).
 * relu:         in place; dZ = dA * (A > 0) on its own output.
 * flatten:      nothing (NCHW planes are already one vector per sample).
 * The loss is softmax cross-entropy on the last layer's output, and the
 * backward pass starts from dZ = softmax(Z) - onehot (mean over the batch).
 * It stops at the first layer with parameters: the input gradient of the
 * model is never formed (nothing needs it).
 *
 * The MLP runs exactly the kernel calls it ran before the layer list
 * existed (same order, same arguments), so its training is bit-identical.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "node/train/model.h"
#include "base/rng.h"

static size_t op_out_size(const ds_mop *o)
{
    return (size_t)o->oc * o->oh * o->ow;
}

static ds_conv_shape conv_shape(const ds_mop *o, int batch)
{
    ds_conv_shape s = {.batch = batch, .c_in = o->c, .h = o->h, .w = o->w, .c_out = o->oc,
                       .k = 0};
    return s;
}

/* Build from a checked list. */
static int build(ds_model *m, const ds_ops *ops, const ds_layerspec *sp, int c, int h, int w,
                 int n_classes, int max_batch, char *err, size_t err_len)
{
    memset(m, 0, sizeof(*m));
    m->ops = ops;
    m->input_dim = c * h * w;
    m->n_classes = n_classes;
    m->max_batch = max_batch;
    m->n_ops = sp->n;
    int n_conv = 0, n_fc = 0;
    size_t off = 0, widest = (size_t)c * h * w, col = 0;
    for (int i = 0; i < sp->n; i++) {
        const ds_lspec *l = &sp->l[i];
        ds_mop *o = &m->op[i];
        o->kind = l->kind;
        o->layer = -1;
        o->c = c, o->h = h, o->w = w;
        switch (l->kind) {
        case DS_L_CONV:
        case DS_L_LINEAR: {
            if (m->n_layers == DS_MODEL_MAX_LAYERS) {
                snprintf(err, err_len, "at most %d layers with parameters", DS_MODEL_MAX_LAYERS);
                return -EINVAL;
            }
            ds_layer *y = &m->layer[m->n_layers];
            o->layer = m->n_layers++;
            if (l->kind == DS_L_CONV) {
                snprintf(y->name, sizeof(y->name), "conv%d", ++n_conv);
                y->k = l->k;
                y->in = c * l->k * l->k;
                o->oc = l->n, o->oh = h, o->ow = w;
                ds_conv_shape s = conv_shape(o, 1);
                s.k = l->k;
                if (ds_conv_col_floats(&s) > col)
                    col = ds_conv_col_floats(&s);
            } else {
                snprintf(y->name, sizeof(y->name), "fc%d", ++n_fc);
                y->in = c * h * w;
                o->oc = l->n, o->oh = 1, o->ow = 1;
            }
            y->out = l->n;
            y->off = off;
            y->len = (size_t)y->in * y->out + (size_t)y->out;
            off += y->len;
            break;
        }
        case DS_L_MAXPOOL:
            o->oc = c, o->oh = h / 2, o->ow = w / 2;
            break;
        case DS_L_RELU:
            o->oc = c, o->oh = h, o->ow = w;
            /* The layer that wrote this buffer is followed by a ReLU. */
            for (int j = i - 1; j >= 0; j--)
                if (m->op[j].kind != DS_L_FLATTEN) {
                    if (m->op[j].layer >= 0)
                        m->layer[m->op[j].layer].relu = 1;
                    break;
                }
            break;
        case DS_L_FLATTEN:
            o->oc = c * h * w, o->oh = 1, o->ow = 1;
            break;
        }
        c = o->oc, h = o->oh, w = o->ow;
        if (op_out_size(o) > widest)
            widest = op_out_size(o);
    }
    m->n_params = off;
    /* Which ops the backend must have. */
    for (int i = 0; i < m->n_ops; i++) {
        const enum ds_lkind k = m->op[i].kind;
        if ((k == DS_L_CONV && (!ops->conv2d_fwd || !ops->conv2d_bwd)) ||
            (k == DS_L_MAXPOOL && (!ops->maxpool_fwd || !ops->maxpool_bwd))) {
            snprintf(err, err_len, "the %s backend has no %s kernels yet", ops->name,
                     k == DS_L_CONV ? "conv2d" : "max-pool");
            memset(m, 0, sizeof(*m));
            return -ENOTSUP;
        }
    }
    for (int i = 0; i < m->n_ops; i++) {
        ds_mop *o = &m->op[i];
        if (o->kind != DS_L_CONV && o->kind != DS_L_MAXPOOL && o->kind != DS_L_LINEAR)
            continue;
        if (!(o->out = ops->alloc((size_t)max_batch * op_out_size(o) * sizeof(float))))
            goto fail;
    }
    for (int i = 0; i < 2; i++)
        if (!(m->dact[i] = ops->alloc((size_t)max_batch * widest * sizeof(float))))
            goto fail;
    if (col && !(m->col = ops->alloc(col * sizeof(float))))
        goto fail;
    return 0;

fail:
    ds_model_fini(m);
    snprintf(err, err_len, "%s", strerror(ENOMEM));
    return -ENOMEM;
}

int ds_model_init_mlp(ds_model *m, const ds_ops *ops, int input_dim, const int *hidden,
                      int n_hidden, int n_classes, int max_batch)
{
    char err[128];
    memset(m, 0, sizeof(*m));
    if (input_dim <= 0 || n_classes <= 1 || max_batch <= 0 || n_hidden < 0 ||
        n_hidden + 1 > DS_MODEL_MAX_LAYERS || 2 + 2 * n_hidden > DS_MODEL_MAX_OPS)
        return -EINVAL;
    ds_layerspec sp = {.n = 0};
    sp.l[sp.n++].kind = DS_L_FLATTEN;
    for (int i = 0; i <= n_hidden; i++) {
        const int out = i < n_hidden ? hidden[i] : n_classes;
        if (out <= 0)
            return -EINVAL;
        sp.l[sp.n].kind = DS_L_LINEAR;
        sp.l[sp.n++].n = out;
        if (i < n_hidden)
            sp.l[sp.n++].kind = DS_L_RELU;
    }
    return build(m, ops, &sp, input_dim, 1, 1, n_classes, max_batch, err, sizeof(err));
}

int ds_model_init_layers(ds_model *m, const ds_ops *ops, const char *spec, int c, int h, int w,
                         int n_classes, int max_batch, char *err, size_t err_len)
{
    ds_layerspec sp;
    ds_layerspec_err e;
    memset(m, 0, sizeof(*m));
    if (c <= 0 || h <= 0 || w <= 0 || n_classes <= 1 || max_batch <= 0) {
        snprintf(err, err_len, "bad model shape");
        return -EINVAL;
    }
    int r = ds_layerspec_parse(spec, &sp, &e);
    if (r == 0)
        r = ds_layerspec_check(&sp, c, h, w, n_classes, &e);
    if (r < 0) {
        const char *s = spec ? spec : "";
        if (e.index > 0)
            snprintf(err, err_len, "expected %s, found '%.*s' (layer %d)", e.expected, (int)e.len,
                     s + e.at, e.index);
        else
            snprintf(err, err_len, "expected %s, found '%.*s'", e.expected, (int)e.len, s + e.at);
        return r;
    }
    return build(m, ops, &sp, c, h, w, n_classes, max_batch, err, err_len);
}

void ds_model_fini(ds_model *m)
{
    if (!m || !m->ops)
        return;
    for (int i = 0; i < m->n_ops; i++)
        m->ops->free(m->op[i].out);
    for (int i = 0; i < 2; i++)
        m->ops->free(m->dact[i]);
    m->ops->free(m->col);
    memset(m, 0, sizeof(*m));
}

void ds_model_init_params(const ds_model *m, float *theta, uint64_t seed)
{
    ds_rng r;
    ds_rng_seed(&r, seed);
    for (int i = 0; i < m->n_layers; i++) {
        const ds_layer *l = &m->layer[i];
        /* He-uniform keeps the activation variance through ReLU layers;
         * Xavier-uniform suits a linear output layer. A conv's fan-out is
         * c_out * k * k (its fan-in, l->in, already counts the window). */
        const int fan_out = l->k ? l->out * l->k * l->k : l->out;
        const double bound = l->relu ? sqrt(6.0 / l->in) : sqrt(6.0 / (l->in + fan_out));
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

    /* in[i]: the input of op i; the output of the last op is in[n_ops]. */
    const float *in[DS_MODEL_MAX_OPS + 1];
    in[0] = x;
    for (int i = 0; i < m->n_ops; i++) {
        const ds_mop *op = &m->op[i];
        const size_t n_in = (size_t)batch * op->c * op->h * op->w;
        switch (op->kind) {
        case DS_L_LINEAR: {
            const ds_layer *l = &m->layer[op->layer];
            const float *w = theta + l->off, *b = w + (size_t)l->in * l->out;
            o->gemm(0, 1, batch, l->out, l->in, 1.0f, in[i], l->in, w, l->in, 0.0f, op->out,
                    l->out);
            o->bias_add(op->out, b, batch, l->out);
            in[i + 1] = op->out;
            break;
        }
        case DS_L_CONV: {
            const ds_layer *l = &m->layer[op->layer];
            const float *w = theta + l->off, *b = w + (size_t)l->in * l->out;
            ds_conv_shape s = conv_shape(op, batch);
            s.k = l->k;
            o->conv2d_fwd(op->out, in[i], w, b, &s, m->col);
            in[i + 1] = op->out;
            break;
        }
        case DS_L_MAXPOOL:
            o->maxpool_fwd(op->out, in[i], batch * op->c, op->h, op->w);
            in[i + 1] = op->out;
            break;
        case DS_L_RELU:
            /* In place: the list never puts a relu on the model's input. */
            o->relu_fwd((float *)in[i], in[i], n_in);
            in[i + 1] = in[i];
            break;
        case DS_L_FLATTEN:
            in[i + 1] = in[i];
            break;
        }
    }

    float *dz = grad ? m->dact[0] : NULL;
    o->softmax_xent(dz, in[m->n_ops], labels, batch, m->n_classes, loss_sum, correct);
    if (!grad)
        return 0;

    int first = 0;
    while (first < m->n_ops && m->op[first].layer < 0)
        first++;
    int cur = 0;
    for (int i = m->n_ops - 1; i >= first; i--) {
        const ds_mop *op = &m->op[i];
        const int need_dx = i > first;
        dz = m->dact[cur];
        switch (op->kind) {
        case DS_L_LINEAR: {
            const ds_layer *l = &m->layer[op->layer];
            const float *w = theta + l->off;
            float *dw = grad + l->off, *db = dw + (size_t)l->in * l->out;
            o->gemm(1, 0, l->out, l->in, batch, 1.0f, dz, l->out, in[i], l->in, 0.0f, dw, l->in);
            o->bias_grad(db, dz, batch, l->out);
            if (m->grad_ready)
                m->grad_ready(m->grad_ctx, op->layer);
            if (need_dx) {
                o->gemm(0, 0, batch, l->in, l->out, 1.0f, dz, l->out, w, l->in, 0.0f,
                        m->dact[cur ^ 1], l->in);
                cur ^= 1;
            }
            break;
        }
        case DS_L_CONV: {
            const ds_layer *l = &m->layer[op->layer];
            const float *w = theta + l->off;
            float *dw = grad + l->off, *db = dw + (size_t)l->in * l->out;
            ds_conv_shape s = conv_shape(op, batch);
            s.k = l->k;
            o->conv2d_bwd(need_dx ? m->dact[cur ^ 1] : NULL, dw, db, dz, in[i], w, &s, m->col);
            if (m->grad_ready)
                m->grad_ready(m->grad_ctx, op->layer);
            if (need_dx)
                cur ^= 1;
            break;
        }
        case DS_L_MAXPOOL:
            o->maxpool_bwd(m->dact[cur ^ 1], dz, in[i], batch * op->c, op->h, op->w);
            cur ^= 1;
            break;
        case DS_L_RELU:
            o->relu_bwd(dz, dz, in[i + 1], (size_t)batch * op->c * op->h * op->w);
            break;
        case DS_L_FLATTEN:
            break;
        }
    }
    return 0;
}

void ds_model_describe(const ds_model *m, char *out, size_t n)
{
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < m->n_layers && o < n; i++) {
        const ds_layer *l = &m->layer[i];
        if (l->k)
            o += (size_t)snprintf(out + o, n - o, "%s%s %dx%d %d->%d (%zu)", i ? ", " : "",
                                  l->name, l->k, l->k, l->in / (l->k * l->k), l->out, l->len);
        else
            o += (size_t)snprintf(out + o, n - o, "%s%s %d->%d (%zu)", i ? ", " : "", l->name,
                                  l->in, l->out, l->len);
    }
}
