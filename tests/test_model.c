/*
 * tests/test_model.c: finite-difference gradient checks of every layer op
 * (softmax cross-entropy alone, a dense layer alone, dense + ReLU) and of
 * the whole MLP loss, on the reference and the fastest CPU tables.
 * Run: meson test -C build model --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "kernels/cpu/cpu_kernels.h"
#include "node/train/model.h"
#include "testutil.h"

/* Central differences of the mean loss w.r.t. every parameter, in double
 * bookkeeping over float evaluations; compare with the analytic gradient. */
static void gradcheck_model(ds_model *mp, const ds_ops *ops, int batch, uint64_t seed, float eps);

static void gradcheck(const ds_ops *ops, int input, const int *hidden, int n_hidden, int classes,
                      int batch, uint64_t seed)
{
    ds_model m;
    cr_assert_eq(ds_model_init_mlp(&m, ops, input, hidden, n_hidden, classes, batch), 0);
    gradcheck_model(&m, ops, batch, seed, 1e-2f);
}

static void gradcheck_model(ds_model *mp, const ds_ops *ops, int batch, uint64_t seed, float eps)
{
    ds_model m = *mp;
    const int input = m.input_dim, classes = m.n_classes;
    float *theta = calloc(m.n_params, sizeof(float));
    float *grad = calloc(m.n_params, sizeof(float));
    float *x = calloc((size_t)batch * input, sizeof(float));
    int32_t *y = calloc((size_t)batch, sizeof(int32_t));
    ds_model_init_params(&m, theta, seed);
    /* Non-zero biases so their gradients are exercised away from zero. */
    for (int l = 0; l < m.n_layers; l++)
        ds_t_fill(theta + m.layer[l].off + (size_t)m.layer[l].in * m.layer[l].out, m.layer[l].out,
                  seed + 100 + l, -0.3f, 0.3f);
    ds_t_fill(x, (size_t)batch * input, seed + 1, -1, 1);
    for (int b = 0; b < batch; b++)
        y[b] = b % classes;

    double loss;
    int64_t good;
    cr_assert_eq(ds_model_forward_backward(&m, theta, grad, x, y, batch, &loss, &good), 0);

    int bad = 0;
    for (size_t i = 0; i < m.n_params; i++) {
        const float keep = theta[i];
        double lp, lm;
        theta[i] = keep + eps;
        ds_model_forward_backward(&m, theta, NULL, x, y, batch, &lp, &good);
        theta[i] = keep - eps;
        ds_model_forward_backward(&m, theta, NULL, x, y, batch, &lm, &good);
        theta[i] = keep;
        const double num = (lp - lm) / (2.0 * eps) / batch;
        const double d = fabs(num - grad[i]);
        if (d > 2e-3 + 2e-2 * fabs(num)) {
            if (bad < 10)
                cr_log_error("%s seed=%llu param %zu: analytic %.6g numeric %.6g", ops->name,
                             (unsigned long long)seed, i, grad[i], num);
            bad++;
        }
    }
    cr_expect_eq(bad, 0, "%d of %zu gradients differ (%s)", bad, m.n_params, ops->name);
    free(theta);
    free(grad);
    free(x);
    free(y);
    ds_model_fini(mp);
}

static void each_table(void (*fn)(const ds_ops *))
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    fn(&o);
    ds_ops_fill_cpu(&o, ds_cpu_detect());
    fn(&o);
}

static void softmax_only(const ds_ops *o)
{
    /* With no hidden layer and the identity input, the check covers the
     * softmax cross-entropy gradient and the dense layer's dW and db. */
    gradcheck(o, 6, NULL, 0, 5, 7, 11);
}

static void one_hidden(const ds_ops *o)
{
    const int h[] = {9};
    gradcheck(o, 5, h, 1, 4, 6, 12);
}

static void whole_mlp(const ds_ops *o)
{
    const int h[] = {16, 11};
    gradcheck(o, 13, h, 2, 10, 8, 13);
}

Test(model, gradcheck_dense_softmax) { each_table(softmax_only); }
Test(model, gradcheck_dense_relu) { each_table(one_hidden); }
Test(model, gradcheck_whole_mlp) { each_table(whole_mlp); }

Test(model, softmax_xent_gradient_numeric)
{
    /* The fused op alone: d(mean loss)/d logits by central differences. */
    const int rows = 5, cols = 7;
    float logits[35], d[35];
    int32_t labels[5] = {0, 6, 3, 3, 1};
    ds_t_fill(logits, 35, 99, -3, 3);
    double loss, lp, lm;
    int64_t good;
    ds_softmax_xent_c(d, logits, labels, rows, cols, &loss, &good);
    for (int i = 0; i < 35; i++) {
        const float keep = logits[i];
        logits[i] = keep + 1e-2f;
        ds_softmax_xent_c(NULL, logits, labels, rows, cols, &lp, &good);
        logits[i] = keep - 1e-2f;
        ds_softmax_xent_c(NULL, logits, labels, rows, cols, &lm, &good);
        logits[i] = keep;
        const double num = (lp - lm) / 2e-2 / rows;
        cr_expect(fabs(num - d[i]) < 1e-4 + 1e-3 * fabs(num), "[%d] analytic %g numeric %g", i, d[i], num);
    }
}

/* L = sum(r * op(x)) for fixed random r, so dL/dy = r: central differences
 * of L w.r.t. every input and parameter against the op's backward. */
static double conv_loss(const ds_ops *o, const ds_conv_shape *s, const float *x, const float *w,
                        const float *b, const float *r, float *y, float *col)
{
    o->conv2d_fwd(y, x, w, b, s, col);
    double l = 0;
    for (size_t i = 0; i < (size_t)s->batch * s->c_out * s->h * s->w; i++)
        l += (double)r[i] * y[i];
    return l;
}

static int fd_compare(const char *what, const ds_ops *o, float *v, size_t n, const float *g,
                      double (*loss)(void *), void *ctx)
{
    const float eps = 1e-2f;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float keep = v[i];
        v[i] = keep + eps;
        const double lp = loss(ctx);
        v[i] = keep - eps;
        const double lm = loss(ctx);
        v[i] = keep;
        const double num = (lp - lm) / (2.0 * eps);
        if (fabs(num - g[i]) > 2e-3 + 1e-2 * fabs(num)) {
            if (bad < 10)
                cr_log_error("%s %s [%zu]: analytic %.6g numeric %.6g", o->name, what, i, g[i], num);
            bad++;
        }
    }
    return bad;
}

typedef struct conv_ctx {
    const ds_ops *o;
    const ds_conv_shape *s;
    float *x, *w, *b, *r, *y, *col;
} conv_ctx;

static double conv_ctx_loss(void *p)
{
    conv_ctx *c = p;
    return conv_loss(c->o, c->s, c->x, c->w, c->b, c->r, c->y, c->col);
}

static void conv_gradcheck(const ds_ops *o)
{
    const ds_conv_shape shapes[] = {
        {.batch = 2, .c_in = 3, .h = 5, .w = 7, .c_out = 4, .k = 3},
        {.batch = 3, .c_in = 2, .h = 4, .w = 3, .c_out = 3, .k = 5},
        {.batch = 1, .c_in = 1, .h = 3, .w = 3, .c_out = 2, .k = 1},
    };
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        const ds_conv_shape *s = &shapes[t];
        const size_t nx = (size_t)s->batch * s->c_in * s->h * s->w;
        const size_t ny = (size_t)s->batch * s->c_out * s->h * s->w;
        const size_t nw = (size_t)s->c_out * s->c_in * s->k * s->k;
        conv_ctx c = {.o = o, .s = s, .x = malloc(nx * 4), .w = malloc(nw * 4),
                      .b = malloc((size_t)s->c_out * 4), .r = malloc(ny * 4),
                      .y = malloc(ny * 4), .col = malloc(ds_conv_col_floats(s) * 4)};
        float *dx = malloc(nx * 4), *dw = malloc(nw * 4), *db = malloc((size_t)s->c_out * 4);
        ds_t_fill(c.x, nx, 40 + t, -1, 1);
        ds_t_fill(c.w, nw, 50 + t, -1, 1);
        ds_t_fill(c.b, (size_t)s->c_out, 60 + t, -1, 1);
        ds_t_fill(c.r, ny, 70 + t, -1, 1);
        o->conv2d_bwd(dx, dw, db, c.r, c.x, c.w, s, c.col);
        int bad = fd_compare("conv2d dx", o, c.x, nx, dx, conv_ctx_loss, &c);
        bad += fd_compare("conv2d dw", o, c.w, nw, dw, conv_ctx_loss, &c);
        bad += fd_compare("conv2d db", o, c.b, (size_t)s->c_out, db, conv_ctx_loss, &c);
        cr_expect_eq(bad, 0, "conv2d shape %zu: %d gradients differ (%s)", t, bad, o->name);
        free(c.x), free(c.w), free(c.b), free(c.r), free(c.y), free(c.col);
        free(dx), free(dw), free(db);
    }
}

typedef struct pool_ctx {
    const ds_ops *o;
    int planes, h, w;
    float *x, *r, *y;
} pool_ctx;

static double pool_ctx_loss(void *p)
{
    pool_ctx *c = p;
    c->o->maxpool_fwd(c->y, c->x, c->planes, c->h, c->w);
    double l = 0;
    for (size_t i = 0; i < (size_t)c->planes * (c->h / 2) * (c->w / 2); i++)
        l += (double)c->r[i] * c->y[i];
    return l;
}

static void pool_gradcheck(const ds_ops *o)
{
    /* Odd sizes (a dropped row and column). Random inputs are spread
     * enough that no window has two values within eps of each other
     * (checked below), where the max-pool gradient is not defined. */
    pool_ctx c = {.o = o, .planes = 3, .h = 5, .w = 7};
    const size_t nx = (size_t)c.planes * c.h * c.w, ny = (size_t)c.planes * 2 * 3;
    c.x = malloc(nx * 4), c.r = malloc(ny * 4), c.y = malloc(ny * 4);
    float *dx = malloc(nx * 4);
    for (size_t i = 0; i < nx; i++) /* distinct values 0.05 apart, shuffled */
        c.x[i] = 0.05f * (float)((i * 37) % nx) - 1.0f;
    ds_t_fill(c.r, ny, 81, -1, 1);
    o->maxpool_bwd(dx, c.r, c.x, c.planes, c.h, c.w);
    cr_expect_eq(fd_compare("maxpool dx", o, c.x, nx, dx, pool_ctx_loss, &c), 0, "%s", o->name);
    free(c.x), free(c.r), free(c.y), free(dx);
}

Test(model, gradcheck_conv2d) { each_table(conv_gradcheck); }
Test(model, gradcheck_maxpool) { each_table(pool_gradcheck); }

/* The MLP pass as model.c ran it before layer lists existed (the same
 * kernel calls in the same order), kept here to hold the MLP to it. */
static void mlp_before_layer_lists(const ds_model *m, const float *theta, float *grad,
                                   const float *x, const int32_t *labels, int batch,
                                   double *loss_sum, int64_t *correct)
{
    const ds_ops *o = m->ops;
    float *act[DS_MODEL_MAX_LAYERS] = {0}, *dact[2];
    int widest = m->n_classes;
    for (int i = 0; i < m->n_layers; i++) {
        act[i] = calloc((size_t)batch * m->layer[i].out, sizeof(float));
        if (m->layer[i].out > widest)
            widest = m->layer[i].out;
    }
    dact[0] = calloc((size_t)batch * widest, sizeof(float));
    dact[1] = calloc((size_t)batch * widest, sizeof(float));
    const float *in = x;
    for (int i = 0; i < m->n_layers; i++) {
        const ds_layer *l = &m->layer[i];
        const float *w = theta + l->off, *b = w + (size_t)l->in * l->out;
        o->gemm(0, 1, batch, l->out, l->in, 1.0f, in, l->in, w, l->in, 0.0f, act[i], l->out);
        o->bias_add(act[i], b, batch, l->out);
        if (l->relu)
            o->relu_fwd(act[i], act[i], (size_t)batch * l->out);
        in = act[i];
    }
    const int last = m->n_layers - 1;
    o->softmax_xent(dact[0], act[last], labels, batch, m->n_classes, loss_sum, correct);
    int cur = 0;
    for (int i = last; i >= 0; i--) {
        const ds_layer *l = &m->layer[i];
        const float *a_prev = i ? act[i - 1] : x;
        const float *w = theta + l->off;
        float *dw = grad + l->off, *db = dw + (size_t)l->in * l->out, *dz = dact[cur];
        o->gemm(1, 0, l->out, l->in, batch, 1.0f, dz, l->out, a_prev, l->in, 0.0f, dw, l->in);
        o->bias_grad(db, dz, batch, l->out);
        if (i == 0)
            break;
        float *da = dact[cur ^ 1];
        o->gemm(0, 0, batch, l->in, l->out, 1.0f, dz, l->out, w, l->in, 0.0f, da, l->in);
        o->relu_bwd(da, da, act[i - 1], (size_t)batch * l->in);
        cur ^= 1;
    }
    for (int i = 0; i < m->n_layers; i++)
        free(act[i]);
    free(dact[0]);
    free(dact[1]);
}

static void mlp_bit_identical(const ds_ops *o)
{
    const int h[] = {37, 21};
    const int input = 53, classes = 10, batch = 19;
    ds_model m;
    cr_assert_eq(ds_model_init_mlp(&m, o, input, h, 2, classes, batch), 0);
    float *theta = calloc(m.n_params, 4), *g0 = calloc(m.n_params, 4), *g1 = calloc(m.n_params, 4);
    float *x = calloc((size_t)batch * input, 4);
    int32_t y[19];
    ds_model_init_params(&m, theta, 3);
    ds_t_fill(x, (size_t)batch * input, 4, -1, 1);
    for (int b = 0; b < batch; b++)
        y[b] = (b * 7) % classes;
    double l0, l1;
    int64_t c0, c1;
    cr_assert_eq(ds_model_forward_backward(&m, theta, g1, x, y, batch, &l1, &c1), 0);
    mlp_before_layer_lists(&m, theta, g0, x, y, batch, &l0, &c0);
    cr_expect_eq(memcmp(&l0, &l1, sizeof(l0)), 0, "%s: loss %.17g vs %.17g", o->name, l1, l0);
    cr_expect_eq(c0, c1);
    cr_expect_eq(memcmp(g0, g1, m.n_params * 4), 0, "%s: gradients differ", o->name);
    free(theta), free(g0), free(g1), free(x);
    ds_model_fini(&m);
}

Test(model, mlp_runs_the_same_kernel_calls_as_before) { each_table(mlp_bit_identical); }

/* Every op of the list in one small model on an odd image (2 x 7 x 5):
 * conv (3x3 and 1x1), relu, maxpool2 dropping a row, flatten, linear. */
static void small_cnn(const ds_ops *o)
{
    ds_model m;
    char err[256] = "";
    cr_assert_eq(ds_model_init_layers(&m, o,
                                      "conv3x3:3, relu, maxpool2, conv1x1:4, relu, flatten, "
                                      "linear:6, relu, linear:5",
                                      2, 7, 5, 5, 3, err, sizeof(err)),
                 0, "%s", err);
    cr_expect_eq(m.n_layers, 4);
    /* A conv weight moves every output of its plane: a smaller step than
     * the MLP's keeps the ReLU and max-pool kinks out of the differences. */
    gradcheck_model(&m, o, 3, 21, 1e-3f);
}

Test(model, gradcheck_small_cnn) { each_table(small_cnn); }

/* One input channel, as Fashion-MNIST has: the first conv takes the ISA's
 * direct loops (forward and weight gradient, no input gradient), on an
 * image wider than an AVX2 vector so full and masked vectors both run. */
static void small_cnn_one_channel(const ds_ops *o)
{
    ds_model m;
    char err[256] = "";
    cr_assert_eq(ds_model_init_layers(&m, o, "conv3x3:3, relu, maxpool2, flatten, linear:5",
                                      1, 5, 11, 5, 3, err, sizeof(err)),
                 0, "%s", err);
    gradcheck_model(&m, o, 3, 23, 1e-3f);
}

Test(model, gradcheck_small_cnn_one_channel) { each_table(small_cnn_one_channel); }

Test(model, cnn_layer_table)
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    ds_model m;
    char err[256] = "";
    cr_assert_eq(ds_model_init_layers(&m, &o, DS_LAYERSPEC_CNN, 1, 28, 28, 10, 4, err, sizeof(err)),
                 0, "%s", err);
    static const struct {
        const char *name;
        int in, out, k, relu;
        size_t len;
    } want[] = {{"conv1", 9, 32, 3, 1, 320},
                {"conv2", 32 * 9, 64, 3, 1, 64 * 288 + 64},
                {"fc1", 64 * 7 * 7, 128, 0, 1, 3136 * 128 + 128},
                {"fc2", 128, 10, 0, 0, 1290}};
    cr_assert_eq(m.n_layers, 4);
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        const ds_layer *l = &m.layer[i];
        cr_expect_str_eq(l->name, want[i].name);
        cr_expect_eq(l->in, want[i].in, "%s in", l->name);
        cr_expect_eq(l->out, want[i].out, "%s out", l->name);
        cr_expect_eq(l->k, want[i].k, "%s k", l->name);
        cr_expect_eq(l->relu, want[i].relu, "%s relu", l->name);
        cr_expect_eq(l->len, want[i].len, "%s len", l->name);
        cr_expect_eq(l->off, off, "%s off", l->name);
        off += l->len;
    }
    cr_expect_eq(m.n_params, off);
    cr_expect_eq(m.n_params, (size_t)421642);
    ds_model_fini(&m);

    /* A bad list is refused with the item. */
    cr_expect_eq(ds_model_init_layers(&m, &o, "conv3x3:8, flatten, linear:9", 1, 28, 28, 10, 4,
                                      err, sizeof(err)),
                 -EINVAL);
    cr_expect_str_eq(err, "expected the last layer to be linear:10 (one output per class), found "
                          "'linear:9' (layer 3)");
}

Test(model, cnn_ref_and_blas_agree)
{
    /* The whole CNN forward/backward on both CPU tables: same loss and
     * gradients up to float rounding. */
    if (!ds_cpu_detect())
        return;
    ds_ops r, f;
    ds_ops_fill_cpu(&r, 0);
    ds_ops_fill_cpu(&f, ds_cpu_detect());
    ds_model a, b;
    char err[256];
    const int batch = 3;
    cr_assert_eq(ds_model_init_layers(&a, &r, DS_LAYERSPEC_CNN, 1, 28, 28, 10, batch, err, 256), 0);
    cr_assert_eq(ds_model_init_layers(&b, &f, DS_LAYERSPEC_CNN, 1, 28, 28, 10, batch, err, 256), 0);
    float *theta = calloc(a.n_params, 4), *ga = calloc(a.n_params, 4), *gb = calloc(a.n_params, 4);
    float x[3 * 784];
    int32_t y[3] = {1, 7, 4};
    ds_model_init_params(&a, theta, 9);
    ds_t_fill(x, sizeof(x) / 4, 10, 0, 1);
    double la, lb;
    int64_t ca, cb;
    cr_assert_eq(ds_model_forward_backward(&a, theta, ga, x, y, batch, &la, &ca), 0);
    cr_assert_eq(ds_model_forward_backward(&b, theta, gb, x, y, batch, &lb, &cb), 0);
    cr_expect(ds_t_close_d(lb, la, 1e-5, 1e-5), "loss %g vs %g", lb, la);
    cr_expect(ds_t_close("cnn grad", 9, gb, ga, a.n_params, 1e-5, 1e-3));
    free(theta), free(ga), free(gb);
    ds_model_fini(&a);
    ds_model_fini(&b);
}

Test(model, image_ops_missing_from_the_table_is_enotsup)
{
    /* A table without conv2d or max-pool kernels (as the CUDA one was
     * before issue 11): the model says which op is missing. */
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    snprintf(o.name, sizeof(o.name), "cuda:0 test");
    o.conv2d_fwd = NULL;
    o.conv2d_bwd = NULL;
    ds_model m;
    char err[256] = "";
    cr_expect_eq(ds_model_init_layers(&m, &o, DS_LAYERSPEC_CNN, 1, 28, 28, 10, 4, err, sizeof(err)),
                 -ENOTSUP);
    cr_expect_str_eq(err, "the cuda:0 test backend has no conv2d kernels yet");
    ds_ops_fill_cpu(&o, 0);
    o.maxpool_fwd = NULL;
    cr_expect_eq(ds_model_init_layers(&m, &o, "maxpool2, flatten, linear:10", 1, 28, 28, 10, 4, err,
                                      sizeof(err)),
                 -ENOTSUP);
    cr_expect(strstr(err, "no max-pool kernels"), "%s", err);
    /* The MLP needs neither. */
    const int h[] = {8};
    cr_expect_eq(ds_model_init_mlp(&m, &o, 784, h, 1, 10, 4), 0);
    ds_model_fini(&m);
}

Test(model, layout_is_contiguous_layer_table)
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    ds_model m;
    const int h[] = {256, 256};
    cr_assert_eq(ds_model_init_mlp(&m, &o, 784, h, 2, 10, 64), 0);
    cr_expect_eq(m.n_layers, 3);
    cr_expect_eq(m.n_params, (size_t)784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10);
    size_t off = 0;
    for (int i = 0; i < m.n_layers; i++) {
        cr_expect_eq(m.layer[i].off, off);
        off += m.layer[i].len;
    }
    cr_expect_str_eq(m.layer[2].name, "fc3");
    cr_expect_eq(m.layer[2].relu, 0);
    ds_model_fini(&m);
    const int bad[] = {0};
    cr_expect_eq(ds_model_init_mlp(&m, &o, 784, bad, 1, 10, 64), -EINVAL);
}

Test(model, init_is_deterministic_and_bounded)
{
    ds_ops o;
    ds_ops_fill_cpu(&o, 0);
    ds_model m;
    const int h[] = {32};
    cr_assert_eq(ds_model_init_mlp(&m, &o, 100, h, 1, 10, 4), 0);
    float *a = calloc(m.n_params, 4), *b = calloc(m.n_params, 4);
    ds_model_init_params(&m, a, 5);
    ds_model_init_params(&m, b, 5);
    cr_expect_eq(memcmp(a, b, m.n_params * 4), 0);
    ds_model_init_params(&m, b, 6);
    cr_expect_neq(memcmp(a, b, m.n_params * 4), 0);
    const float bound = sqrtf(6.0f / 100);
    for (size_t i = 0; i < (size_t)100 * 32; i++)
        cr_expect(fabsf(a[i]) <= bound);
    for (size_t i = 100 * 32; i < 100 * 32 + 32; i++)
        cr_expect_eq(a[i], 0.0f);
    free(a);
    free(b);
    ds_model_fini(&m);
}
