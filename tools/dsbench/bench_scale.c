/*
 * tools/dsbench/bench_scale.c: dsbench scale (issue 18), the papers'
 * claims at 8 to 64 nodes, simulated in one process.
 *
 * Every simulated node is a real MLP on Fashion-MNIST (or, with --model
 * cnn, the net of train.model = cnn; node/train's model
 * and data, the CPU kernels' momentum SGD) with its own momentum buffer and
 * its own data order (sampler seeded per node), and its own gossip engine
 * (node/gossip/gossip.c, unchanged) whose io is node/gossip/fake.c's
 * in-process network; the hierarchical variant reduces inside each group
 * with node/gossip/group.c's ds_greduce over a fake network of its own. One
 * thread per node; every wait lasts until its message comes (cio_recv
 * says why), so the rounds are the same whatever the machine's load.
 *
 * The global batch is fixed: each of N nodes trains on batch / N examples
 * a step. A step of a node, all variants:
 *
 *   grad = g(theta)                      its own examples
 *   allreduce:  grad = mean over nodes   ds_gossip_allreduce (ring)
 *   gossip:     begin(theta); exchange; end(theta)   one round a step
 *   hier:       begin; exchange (segment s by member s mod size of each
 *               group, the io routes it); then ds_greduce of the gradient
 *               (mean) with each member's round delta gathered as a sparse
 *               list and summed; end(theta) applies the group's delta
 *   hier micro: as hier, but the gradient goes as group.sparsify = micro
 *               makes node/runtime/rounds.c send it: each member's MiCRO
 *               selection in its owned chunk (ds_micro_ef_step, its own
 *               residual) gathered in the same list, sum / size applied,
 *               the summed count steering every member's threshold
 *   hier deft:  as hier micro with group.sparsify = deft: each member's
 *               DEFT selection in its bin's units (ds_deft_ef_step), its
 *               squared unit norms averaged in the same reduction and fed
 *               back for the next step's bins (ds_deft_feedback)
 *   theta, mom = sgd(theta, mom, grad)   lr: 5% warm-up, cosine to 0
 *
 * so x_{t+1} = x_t - lr g(x_t) + mix(x_t), the engine's snapshot semantics.
 * A hierarchical group's members stay identical (same mean gradient, same
 * summed delta), as node/runtime/rounds.c's group_reduce keeps them; the
 * simulation leaves out what that code adds for failures (parameter slices
 * that re-sync, member 0's position), since nothing fails here.
 *
 * Measured per row: test accuracy of the nodes' average model (the whole
 * test set) and the mean over nodes of each node's own accuracy (on the
 * first eval_n test examples), the consensus distance (1/N) sum_i
 * |x_i - mean|^2, payload bytes a node sends per step (values 4 bytes,
 * indices 4 bytes, counted at the io: gossip, all-reduce and group
 * reduction alike) and the thread CPU time a node spends in
 * ds_gossip_begin per step (drift accumulation + the sparsifiers'
 * selection).
 *
 * Determinism: the schedule, the sparsifiers and the data orders come from
 * the seed; each node's arithmetic is its own thread's. With crossover and
 * exponential every delta entry gets at most two contributions (one
 * exchange initiated, one answered) and float addition is commutative, so
 * the result does not depend on the order messages arrive in: the same
 * seed gives the same bits (tests/test_scale.c checks). The random
 * topology can give a node several answered exchanges per segment whose
 * order is the threads' and so may differ in the last bits.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "kernels/kernels.h"
#include "node/gossip/fake.h"
#include "node/gossip/gossip.h"
#include "node/gossip/group.h"
#include "node/train/data.h"
#include "base/layerspec.h"
#include "node/train/model.h"
#include "sparsify/sparsify.h"
#include "tools/dsbench/bench.h"
#include "tools/dsbench/scale.h"

#define SCALE_MAX_N 256
#define SCALE_TIMEOUT_MS 20000

const char *ds_scale_variant_name(enum ds_scale_variant v)
{
    switch (v) {
    case DS_SCALE_ALLREDUCE: return "allreduce";
    case DS_SCALE_CROSSOVER: return "crossover";
    case DS_SCALE_CROSSOVER_NOSEG: return "crossover-noseg";
    case DS_SCALE_EXPONENTIAL: return "exponential";
    case DS_SCALE_RANDOM: return "random";
    case DS_SCALE_HIER: return "hier-crossover";
    case DS_SCALE_HIER_MICRO: return "hier-crossover-micro-intra";
    case DS_SCALE_HIER_DEFT: return "hier-crossover-deft-intra";
    }
    return "?";
}

void ds_scale_cfg_defaults(ds_scale_cfg *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->dataset_dir, sizeof(c->dataset_dir), "/usr/share/datasets/fashion-mnist");
    c->N = 8;
    c->variant = DS_SCALE_CROSSOVER;
    c->method = DS_SPARSIFY_NONE;
    c->density = 0.01;
    c->segments = 8;
    c->groups = 8;
    c->steps = 300;
    c->batch = 1024;
    c->hidden = 256;
    c->lr = 0.1;
    c->momentum = 0.9;
    c->weight_decay = 1e-4;
    c->seed = 1;
    c->eval_n = 1000;
}

/* ---- an io that counts payload bytes, and routes a hierarchy ------------- */

typedef struct cio {
    ds_gossip_io io;
    const ds_gossip_io *in;
    uint32_t size; /* hier: members per group, view index = group; 0: flat */
    uint64_t bytes;
} cio;

static int cio_send(void *ctx, const ds_gmsg *m, uint64_t deadline_ns)
{
    cio *c = ctx;
    ds_gmsg x = *m;
    c->bytes += (uint64_t)m->count * 4u * (1u + (m->idx != NULL));
    if (c->size)
        x.to = m->to * c->size + m->segment % c->size;
    return c->in->send(c->in->ctx, &x, deadline_ns);
}

/* A wait (deadline in the future) lasts until the message comes, up to
 * SCALE_TIMEOUT_MS: the simulated network has no stragglers and no
 * losses, and the engine's adaptive deadline (latency.h: at least 100 ms)
 * would otherwise cut rounds whenever 64 threads on two busy cores leave a
 * partner unscheduled that long. The fake clock still moves only when a
 * wait runs out, which never happens in a healthy run (a failed exchange
 * fails the run: node_step). A poll (deadline now) stays a poll. */
static int cio_recv(void *ctx, ds_gmsg *m, uint64_t deadline_ns)
{
    cio *c = ctx;
    const uint64_t now = c->in->now_ns(c->in->ctx);
    if (deadline_ns > now)
        deadline_ns = now + (uint64_t)SCALE_TIMEOUT_MS * 1000000u;
    int r = c->in->recv(c->in->ctx, m, deadline_ns);
    if (r == 1 && c->size)
        m->from /= c->size;
    return r;
}

static uint64_t cio_now(void *ctx)
{
    cio *c = ctx;
    return c->in->now_ns(c->in->ctx);
}

static void cio_init(cio *c, const ds_gossip_io *in, uint32_t size)
{
    memset(c, 0, sizeof(*c));
    c->in = in;
    c->size = size;
    c->io = (ds_gossip_io){.ctx = c, .send = cio_send, .recv = cio_recv, .now_ns = cio_now};
}

/* ---- the simulation --------------------------------------------------------- */

typedef struct snode {
    struct sim *s;
    uint32_t me;
    ds_model model;
    float *theta, *grad, *mom, *x;
    int32_t *y;
    uint32_t *idx;
    ds_sampler sampler;
    ds_gossip *g;
    ds_greduce *gr;
    uint32_t *lidx;  /* hier: the round delta's nonzeros (micro: after the
                        selection, indices + n) */
    float *lval;
    ds_sparsifier *gsp; /* hier micro: the member's sparsifier, residual, sums */
    float *gres, *gsout;
    cio gio, rio;    /* gossip io, group-reduction io */
    uint64_t begin_ns;
    int err;
} snode;

typedef struct sim {
    ds_scale_cfg c;
    ds_ops ops;
    const ds_dataset *train;
    size_t n;
    int b;           /* per-node batch */
    uint32_t size;   /* hier: members per group (1: flat) */
    ds_fakenet *net;
    ds_fakenet *gnet[SCALE_MAX_N];
    snode *nodes;
    pthread_barrier_t bar;
    int diverged;         /* a node's loss was not finite: every node stops */
    int diverged_step;
} sim;

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static float lr_at(const ds_scale_cfg *c, int step)
{
    const int w = c->steps / 20;
    if (w > 0 && step < w)
        return (float)(c->lr * (step + 1) / w);
    const double p = (double)(step - w) / (double)(c->steps - w);
    return (float)(c->lr * 0.5 * (1.0 + cos(M_PI * p)));
}

/* hier micro and hier deft: the group's step of group.sparsify = micro
 * or deft (rounds.c, group_reduce, less the slices and position that only
 * failures need): the member's selection then its round delta's nonzeros
 * (indices + n) in one list, a vector whose first nu floats are DEFT's
 * squared unit norms (averaged; none for MiCRO) and then the count
 * (summed), one reduction; grad = sum / size, delta = the summed deltas;
 * the momentum is zeroed where grad has an entry (masking, rounds.c). */
static int hier_sparse(snode *nd, int step)
{
    sim *s = nd->s;
    const size_t n = s->n;
    const int deft = s->c.variant == DS_SCALE_HIER_DEFT;
    const size_t nu = deft ? ds_deft_group_units(nd->gsp, s->size) : 0;
    float v[SCALE_MAX_N + 1] = {0};
    if (nu + 1 > SCALE_MAX_N)
        return -EINVAL;
    ds_sparsify_result sr;
    int e = deft ? ds_deft_ef_step(nd->gsp, nd->gres, nd->grad, n, s->size, nd->me % s->size,
                                   (uint64_t)step, s->c.density, nd->lidx, nd->lval, n, v, &sr)
                 : ds_micro_ef_step(nd->gsp, nd->gres, nd->grad, n, s->size, nd->me % s->size,
                                    (uint64_t)step, s->c.density, nd->lidx, nd->lval, n, &sr);
    if (e < 0)
        return e;
    uint32_t k = (uint32_t)sr.count;
    float *d = ds_gossip_delta(nd->g);
    for (size_t i = 0; i < n; i++)
        if (d[i] != 0.0f) {
            nd->lidx[k] = (uint32_t)(i + n);
            nd->lval[k++] = d[i];
        }
    v[nu] = (float)sr.count;
    const size_t vn = nu + 1 > s->size ? nu + 1 : s->size;
    const ds_gsparse sp = {.idx = nd->lidx, .val = nd->lval, .count = k, .out = nd->gsout,
                           .n_out = 2 * n};
    ds_greduce_result res;
    const uint64_t dl = nd->rio.io.now_ns(nd->rio.io.ctx) + (uint64_t)SCALE_TIMEOUT_MS * 1000000u;
    e = ds_greduce_run(nd->gr, &nd->rio.io, v, vn, nu, s->size, nd->me % s->size, NULL,
                       (uint64_t)step, dl, &sp, &res);
    if (e < 0)
        return e;
    if (!res.complete)
        return -ETIMEDOUT;
    const float G = (float)s->size;
    for (size_t i = 0; i < n; i++) {
        nd->grad[i] = nd->gsout[i] / G;
        if (nd->grad[i] != 0.0f)
            nd->mom[i] = 0.0f; /* momentum factor masking, as rounds.c */
    }
    memcpy(d, nd->gsout + n, n * sizeof(float));
    if (deft)
        ds_deft_feedback(nd->gsp, s->size, v, nu);
    else
        ds_micro_feedback(nd->gsp, (size_t)v[0]);
    return 0;
}

/* The simulated nodes' model: the MLP of c->hidden, or with c->cnn the
 * net of train.model = cnn (base/layerspec.h) on the images' shape. */
static int build_model(ds_model *m, const ds_ops *ops, const ds_scale_cfg *c,
                       const ds_dataset *train, int max_batch)
{
    if (c->cnn) {
        char why[256];
        return ds_model_init_layers(m, ops, DS_LAYERSPEC_CNN, 1, train->rows, train->cols,
                                    DS_DATA_CLASSES, max_batch, why, sizeof(why));
    }
    const int hidden[2] = {c->hidden, c->hidden};
    return ds_model_init_mlp(m, ops, train->rows * train->cols, hidden, 2, DS_DATA_CLASSES,
                             max_batch);
}

static int node_step(snode *nd, int step)
{
    sim *s = nd->s;
    const ds_scale_cfg *c = &s->c;
    double ls;
    int64_t good;
    ds_sampler_next(&nd->sampler, nd->idx, s->b);
    ds_dataset_gather(s->train, nd->idx, 0, s->b, nd->x, nd->y);
    int e = ds_model_forward_backward(&nd->model, nd->theta, nd->grad, nd->x, nd->y, s->b, &ls,
                                      &good);
    if (e < 0)
        return e;
    if (!isfinite(ls)) {
        __atomic_store_n(&s->diverged, 1, __ATOMIC_RELAXED);
        return 0;
    }
    if (c->variant == DS_SCALE_ALLREDUCE) {
        if ((e = ds_gossip_allreduce(nd->g, nd->grad, s->n, (uint64_t)step, &nd->gio.io)) < 0)
            return e;
    } else {
        const uint64_t t0 = thread_cpu_ns();
        if ((e = ds_gossip_begin(nd->g, nd->theta, (uint64_t)step)) < 0)
            return e;
        nd->begin_ns += thread_cpu_ns() - t0;
        if ((e = ds_gossip_exchange(nd->g, &nd->gio.io)) < 0)
            return e;
        if (s->size > 1 && nd->gsp) {
            if ((e = hier_sparse(nd, step)) < 0)
                return e;
        } else if (s->size > 1) {
            float *d = ds_gossip_delta(nd->g);
            uint32_t k = 0;
            for (size_t i = 0; i < s->n; i++)
                if (d[i] != 0.0f) {
                    nd->lidx[k] = (uint32_t)i;
                    nd->lval[k++] = d[i];
                }
            const ds_gsparse sp = {.idx = nd->lidx, .val = nd->lval, .count = k, .out = d,
                                   .n_out = s->n};
            ds_greduce_result res;
            const uint64_t dl = nd->rio.io.now_ns(nd->rio.io.ctx) +
                                (uint64_t)SCALE_TIMEOUT_MS * 1000000u;
            e = ds_greduce_run(nd->gr, &nd->rio.io, nd->grad, s->n, s->n, s->size,
                               nd->me % s->size, NULL, (uint64_t)step, dl, &sp, &res);
            if (e < 0)
                return e;
            if (!res.complete)
                return -ETIMEDOUT;
        }
        ds_gossip_end(nd->g, nd->theta);
        if (ds_gossip_get_stats(nd->g)->exchanges_failed)
            return -ETIMEDOUT;
    }
    const ds_sgd_params p = {.lr = lr_at(c, step), .momentum = (float)c->momentum,
                             .weight_decay = (float)c->weight_decay};
    s->ops.sgd(nd->theta, nd->mom, nd->grad, s->n, &p);
    return 0;
}

static void *node_main(void *arg)
{
    snode *nd = arg;
    sim *s = nd->s;
    /* Steps in lock-step: after the barrier every node sees the same
     * verdict, so a diverged run stops everywhere at the same step instead
     * of leaving partners waiting for a node that left. */
    for (int t = 0; t < s->c.steps && !nd->err; t++) {
        pthread_barrier_wait(&s->bar);
        if (__atomic_load_n(&s->diverged, __ATOMIC_RELAXED)) {
            if (nd->me == 0)
                s->diverged_step = t;
            break;
        }
        nd->err = node_step(nd, t);
    }
    return NULL;
}

static void node_free(snode *nd)
{
    free(nd->theta);
    free(nd->grad);
    free(nd->mom);
    free(nd->x);
    free(nd->y);
    free(nd->idx);
    free(nd->lidx);
    free(nd->lval);
    ds_sampler_free(&nd->sampler);
    ds_gossip_destroy(&nd->g);
    ds_greduce_destroy(&nd->gr);
    ds_sparsifier_destroy(&nd->gsp);
    free(nd->gres);
    free(nd->gsout);
    if (nd->model.ops)
        ds_model_fini(&nd->model);
}

static enum ds_topo_kind topo_of(enum ds_scale_variant v)
{
    switch (v) {
    case DS_SCALE_ALLREDUCE: return DS_TOPO_ALLREDUCE;
    case DS_SCALE_EXPONENTIAL: return DS_TOPO_EXPONENTIAL;
    case DS_SCALE_RANDOM: return DS_TOPO_RANDOM;
    default: return DS_TOPO_CROSSOVER;
    }
}

/* Accuracy of theta on test[0..n). */
static int eval(ds_model *m, const ds_dataset *test, size_t n, const float *theta, float *x,
                int32_t *y, double *acc)
{
    int64_t good_total = 0;
    for (size_t first = 0; first < n; first += 500) {
        const int b = (int)(n - first < 500 ? n - first : 500);
        ds_dataset_gather(test, NULL, first, b, x, y);
        double ls;
        int64_t good;
        int e = ds_model_forward_backward(m, theta, NULL, x, y, b, &ls, &good);
        if (e < 0)
            return e;
        good_total += good;
    }
    *acc = (double)good_total / (double)n;
    return 0;
}

int ds_scale_run(const ds_scale_cfg *cfg, const ds_dataset *train, const ds_dataset *test,
                 ds_scale_result *out, float *theta0_out)
{
    const ds_scale_cfg *c = cfg;
    memset(out, 0, sizeof(*out)); /* late is a sum over the nodes */
    if (c->N < 2 || c->N > SCALE_MAX_N || c->batch % c->N || c->steps < 1 || c->hidden < 1)
        return -EINVAL;
    sim s = {.c = *cfg, .train = train, .b = c->batch / c->N, .size = 1};
    if (c->variant == DS_SCALE_HIER || c->variant == DS_SCALE_HIER_MICRO ||
        c->variant == DS_SCALE_HIER_DEFT) {
        if (c->groups < 2 || c->N % c->groups)
            return -EINVAL;
        s.size = (uint32_t)(c->N / c->groups);
    }
    ds_ops_init_cpu(&s.ops);
    ds_blas_set_threads(1);
    const int input = train->rows * train->cols;
    const uint32_t N = (uint32_t)c->N;
    int ret = 0;
    s.nodes = calloc(N, sizeof(snode));
    s.net = ds_fakenet_create(N);
    if (!s.nodes || !s.net) {
        ret = -ENOMEM;
        goto out;
    }
    float *init = NULL;
    for (uint32_t i = 0; i < N && !ret; i++) {
        snode *nd = &s.nodes[i];
        nd->s = &s;
        nd->me = i;
        if ((ret = build_model(&nd->model, &s.ops, c, train, s.b)) < 0)
            break;
        s.n = nd->model.n_params;
        const size_t pb = s.n * sizeof(float);
        nd->theta = malloc(pb);
        nd->grad = malloc(pb);
        nd->mom = calloc(s.n, sizeof(float));
        nd->x = malloc((size_t)s.b * input * sizeof(float));
        nd->y = malloc((size_t)s.b * sizeof(int32_t));
        nd->idx = malloc((size_t)s.b * sizeof(uint32_t));
        if (!nd->theta || !nd->grad || !nd->mom || !nd->x || !nd->y || !nd->idx) {
            ret = -ENOMEM;
            break;
        }
        if (!init) {
            if (!(init = malloc(pb))) {
                ret = -ENOMEM;
                break;
            }
            ds_model_init_params(&nd->model, init, c->seed);
        }
        memcpy(nd->theta, init, pb);
        if ((ret = ds_sampler_init(&nd->sampler, train->n, c->seed * 1000003u + 17u + i)) < 0)
            break;
        const ds_gossip_cfg gc = {
            .topology = topo_of(c->variant),
            .mix = DS_MIX_PAIRWISE,
            .weight = 0.5f,
            .segments = c->variant == DS_SCALE_CROSSOVER_NOSEG ? 1 : c->segments,
            .method = c->method,
            .density = c->method == DS_SPARSIFY_NONE ? 1.0 : c->density,
            .error_feedback = 1,
            .value_format = DS_VALUE_F32,
            .seed = c->seed,
            .node_seed = c->seed * 7919u + i,
            .timeout_ms = SCALE_TIMEOUT_MS,
        };
        if ((ret = ds_gossip_create(&nd->g, &gc, nd->model.layer, nd->model.n_layers, s.n,
                                    nd->theta)) < 0)
            break;
        if (s.size > 1)
            ret = ds_gossip_set_view(nd->g, N / s.size, i / s.size, 1);
        else
            ret = ds_gossip_set_view(nd->g, N, i, 1);
        if (ret < 0)
            break;
        cio_init(&nd->gio, ds_fakenet_io(s.net, i), s.size > 1 ? s.size : 0);
        if (s.size > 1) {
            const uint32_t grp = i / s.size;
            if (!s.gnet[grp] && !(s.gnet[grp] = ds_fakenet_create(s.size))) {
                ret = -ENOMEM;
                break;
            }
            cio_init(&nd->rio, ds_fakenet_io(s.gnet[grp], i % s.size), 0);
            /* micro, deft: the selection and the delta's nonzeros */
            const int hsp = c->variant == DS_SCALE_HIER_MICRO || c->variant == DS_SCALE_HIER_DEFT;
            const size_t lists = hsp ? 2 : 1;
            nd->lidx = malloc(lists * s.n * sizeof(uint32_t));
            nd->lval = malloc(lists * pb);
            if (!nd->lidx || !nd->lval ||
                (ret = ds_greduce_create(&nd->gr, 2 * lists * s.n)) < 0) {
                ret = ret < 0 ? ret : -ENOMEM;
                break;
            }
            if (hsp) {
                ds_sparsify_cfg sc;
                uint32_t loff[16];
                ds_sparsify_cfg_defaults(&sc, c->variant == DS_SCALE_HIER_DEFT
                                                  ? DS_SPARSIFY_DEFT : DS_SPARSIFY_MICRO);
                if (c->variant == DS_SCALE_HIER_DEFT) {
                    /* DEFT's units start from the MLP's layers. */
                    for (int l = 0; l < nd->model.n_layers && l < 15; l++)
                        loff[l] = (uint32_t)nd->model.layer[l].off;
                    loff[nd->model.n_layers] = (uint32_t)s.n;
                    sc.unit_off = loff;
                    sc.n_units = (size_t)nd->model.n_layers;
                }
                if ((ret = ds_sparsifier_create(&nd->gsp, &sc, s.n, NULL)) < 0)
                    break;
                if (!(nd->gres = calloc(s.n, sizeof(float))) ||
                    !(nd->gsout = malloc(2 * pb))) {
                    ret = -ENOMEM;
                    break;
                }
            }
        }
    }
    free(init);
    if (ret < 0)
        goto out;
    /* The share holds until the next set_view (the view never changes here). */
    if (s.size > 1) {
        for (uint32_t i = 0; i < N; i++)
            ds_gossip_set_share(s.nodes[i].g, i % s.size, s.size);
    }
    if (pthread_barrier_init(&s.bar, NULL, N) != 0) {
        ret = -ENOMEM;
        goto out;
    }
    const double t0 = ds_bench_now();
    pthread_t th[SCALE_MAX_N];
    uint32_t started = 0;
    for (; started < N; started++)
        if (pthread_create(&th[started], NULL, node_main, &s.nodes[started]) != 0)
            break;
    if (started < N) {
        /* The barrier holds the ones started: nothing can free them. */
        fprintf(stderr, "dsbench scale: cannot start %u threads\n", N);
        abort();
    }
    for (uint32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&s.bar);
    out->diverged_step = s.diverged ? s.diverged_step : -1;
    out->wall_s = ds_bench_now() - t0;
    for (uint32_t i = 0; i < N; i++)
        if (s.nodes[i].err) {
            ret = s.nodes[i].err;
            goto out;
        }
    /* The average model, the consensus distance. */
    float *avg = calloc(s.n, sizeof(float));
    ds_model em;
    float *ex = malloc((size_t)500 * input * sizeof(float));
    int32_t *ey = malloc(500 * sizeof(int32_t));
    if (!avg || !ex || !ey ||
        build_model(&em, &s.ops, c, train, 500) < 0) {
        free(avg);
        free(ex);
        free(ey);
        ret = -ENOMEM;
        goto out;
    }
    double cons = 0;
    for (size_t j = 0; j < s.n; j++) {
        double m = 0;
        for (uint32_t i = 0; i < N; i++)
            m += s.nodes[i].theta[j];
        m /= N;
        avg[j] = (float)m;
        for (uint32_t i = 0; i < N; i++) {
            const double d = s.nodes[i].theta[j] - m;
            cons += d * d;
        }
    }
    out->consensus = cons / N;
    ret = eval(&em, test, test->n, avg, ex, ey, &out->acc_avg);
    double sum = 0;
    const size_t en = c->eval_n < test->n ? c->eval_n : test->n;
    for (uint32_t i = 0; i < N && ret == 0; i++) {
        double a = 0;
        ret = eval(&em, test, en, s.nodes[i].theta, ex, ey, &a);
        sum += a;
    }
    out->acc_nodes = sum / N;
    uint64_t bytes = 0, bns = 0;
    for (uint32_t i = 0; i < N; i++) {
        bytes += s.nodes[i].gio.bytes + s.nodes[i].rio.bytes;
        bns += s.nodes[i].begin_ns;
    }
    out->bytes_per_node_step = (double)bytes / N / c->steps;
    out->begin_us_per_node_step = (double)bns / 1e3 / N / c->steps;
    out->n_params = s.n;
    out->waits_out = ds_fakenet_timeouts(s.net);
    for (uint32_t g = 0; g < SCALE_MAX_N; g++)
        if (s.gnet[g])
            out->waits_out += ds_fakenet_timeouts(s.gnet[g]);
    for (uint32_t i = 0; i < N; i++) {
        const ds_gossip_stats *st = ds_gossip_get_stats(s.nodes[i].g);
        out->late += st->late + st->deferred + st->stale_received;
    }
    out->identical = 1;
    for (uint32_t i = 1; i < N; i++)
        if (memcmp(s.nodes[i].theta, s.nodes[0].theta, s.n * sizeof(float)))
            out->identical = 0;
    if (theta0_out)
        memcpy(theta0_out, s.nodes[0].theta, s.n * sizeof(float));
    ds_model_fini(&em);
    free(avg);
    free(ex);
    free(ey);
out:
    for (uint32_t i = 0; s.nodes && i < N; i++)
        node_free(&s.nodes[i]);
    free(s.nodes);
    ds_fakenet_destroy(s.net);
    for (uint32_t g = 0; g < SCALE_MAX_N; g++)
        if (s.gnet[g])
            ds_fakenet_destroy(s.gnet[g]);
    ds_ops_fini(&s.ops);
    return ret;
}
