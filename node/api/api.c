/*
 * node/api/api.c: libdsnode, the public API (include/dsnode/dsnode.h) over
 * the engine (node/runtime/engine.h). Nothing here is a second engine: each
 * call checks its order and arguments, turns them into the engine's calls
 * and hands back the engine's errors as a negative errno plus the message
 * the engine logged (base/log.h keeps each thread's last error line).
 *
 * The handle moves through states in one direction:
 *
 *   OPEN -> REGISTERED -> JOINED -> LEFT          (FAILED: only close)
 *
 * and every call names the state it needs in its refusal, so a program
 * that calls dsnode_step before dsnode_register learns just that.
 */
#include "config.h"

#include <dsnode/dsnode.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "conf/conf.h"
#include "node/runtime/checkpoint.h"
#include "node/runtime/engine.h"
#include "node/runtime/preflight.h"
#include "node/runtime/summary.h"
#include "node/status/status.h"
#include "node/train/model.h"

enum api_state { ST_OPEN, ST_REGISTERED, ST_JOINED, ST_LEFT, ST_FAILED };

static const char *const state_need[] = {
    [ST_OPEN] = "dsnode_open",         [ST_REGISTERED] = "dsnode_register",
    [ST_JOINED] = "dsnode_join",       [ST_LEFT] = "dsnode_leave",
    [ST_FAILED] = "(a failed call)",
};

struct dsnode {
    ds_conf c;
    ds_engine *e;
    enum api_state state;
    atomic_int stop_signal, stop_count, reload;
    float *params;
    float *grad, *opt;    /* dsnode_register_grad; NULL: none */
    int reduced;          /* dsnode_reduce ran since the last dsnode_step */
    size_t n;
    ds_layer layers[DS_MODEL_MAX_LAYERS];
    int n_layers;
    dsnode_adopt_fn adopt;
    void *adopt_ctx;
    dsnode_copy_fn pull, push; /* dsnode_register_copies; NULL: none */
    dsnode_add_fn add;         /* dsnode_register_add; NULL: none */
    void *copy_ctx;
    char *resume_path;         /* dsnode_resume's file, for a rejoin's choice */
    dsnode_restore_fn restore;
    void *restore_ctx;
    char backend[16];          /* the summary's backend= */
    int64_t step;
    int64_t logged_step;       /* the last step dsnode_report logged */
    ds_engine_report rep;
    double test_loss;
    uint64_t t_start;     /* ns, at open */
    uint64_t t_step;      /* ns, the last dsnode_step: samples_per_s fallback */
    int exit_status;
};

/* The log's node name and level are set once, by the first engine opened:
 * base/log's setup is not meant to run while other threads log. */
static pthread_mutex_t log_once = PTHREAD_MUTEX_INITIALIZER;
static int log_set;

/* The engine whose stop flags the signal handlers set. */
static _Atomic(dsnode *) signal_owner;

static _Thread_local char api_error[1024];

/* Fail with e and a message of ours. */
static int __attribute__((format(printf, 2, 3))) fail(int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(api_error, sizeof(api_error), fmt, ap);
    va_end(ap);
    return e;
}

/* Fail with the engine's e and the error line it logged. */
static int fail_logged(int e, const char *what)
{
    const char *m = ds_log_last_error();
    return fail(e, "%s: %s", what, m[0] ? m : strerror(-e));
}

static void begin_call(void)
{
    api_error[0] = 0;
    ds_log_error_clear();
}

/* The state a call needs, or the refusal that says which call is missing. */
static int need(const dsnode *d, enum api_state want, const char *fn)
{
    begin_call();
    if (!d)
        return fail(-EINVAL, "%s: the engine is NULL", fn);
    if (d->state == want)
        return 0;
    if (d->state == ST_FAILED)
        return fail(-EINVAL, "%s: the engine failed earlier; only dsnode_close is allowed", fn);
    if (d->state < want)
        return fail(-EINVAL, "%s: called before %s", fn, state_need[want]);
    return fail(-EINVAL, "%s: called after %s", fn, state_need[d->state]);
}

const char *dsnode_version(void)
{
    return DS_VERSION;
}

unsigned dsnode_abi_version(void)
{
    return DSNODE_ABI_VERSION;
}

const char *dsnode_error(void)
{
    return api_error;
}

/* ---- open --------------------------------------------------------------- */

static int load_conf(ds_conf *c, const char *path, const char *const *sets, size_t n_sets)
{
    char err[1024];
    ds_conf_defaults(c);
    if (path && ds_conf_load(c, path, err, sizeof(err)) < 0)
        return fail(-EINVAL, "%s", err);
    for (size_t i = 0; i < n_sets; i++) {
        if (!sets[i])
            return fail(-EINVAL, "override %zu is NULL", i);
        if (ds_conf_set(c, sets[i], err, sizeof(err)) < 0)
            return fail(-EINVAL, "override '%s': %s", sets[i], err);
    }
    if (ds_conf_resolve_paths(c, err, sizeof(err)) < 0 || ds_conf_check(c, err, sizeof(err)) < 0)
        return fail(-EINVAL, "%s", err);
    return 0;
}

int dsnode_open_abi(dsnode **out, const char *config, const char *const *overrides,
                    size_t n_overrides, unsigned abi)
{
    begin_call();
    if (!out)
        return fail(-EINVAL, "dsnode_open: out is NULL");
    *out = NULL;
    if (abi != DSNODE_ABI_VERSION)
        return fail(-EPROTO, "dsnode_open: built for ABI %u, this libdsnode has ABI %u", abi,
                    (unsigned)DSNODE_ABI_VERSION);
    if (n_overrides && !overrides)
        return fail(-EINVAL, "dsnode_open: %zu overrides but the list is NULL", n_overrides);
    dsnode *d = calloc(1, sizeof(*d));
    if (!d)
        return fail(-ENOMEM, "dsnode_open: out of memory");
    d->t_start = ds_now_ns();
    d->exit_status = 1;
    d->rep = (ds_engine_report){.phase = DS_STATUS_JOINING, .test_acc = -1};
    d->test_loss = -1;
    d->logged_step = -1;
    snprintf(d->backend, sizeof(d->backend), "client");
    int e = load_conf(&d->c, config, overrides, n_overrides);
    if (e < 0) {
        free(d);
        return e;
    }
    pthread_mutex_lock(&log_once);
    if (!log_set)
        ds_log_setup(d->c.node.name, d->c.node.log_level, NULL);
    log_set = 1;
    pthread_mutex_unlock(&log_once);
    const ds_engine_stop stop = {.signal = &d->stop_signal, .count = &d->stop_count,
                                 .reload = &d->reload};
    if ((e = ds_engine_open(&d->e, &d->c, &stop)) < 0) {
        free(d);
        return fail_logged(e, "dsnode_open");
    }
    *out = d;
    return 0;
}

const char *dsnode_name(const dsnode *d)
{
    return d ? d->c.node.name : "";
}

/* ---- register ------------------------------------------------------------ */

static int adopt_hook(void *ctx, int64_t step)
{
    dsnode *d = ctx;
    d->step = step;
    return d->adopt(d->adopt_ctx, step);
}

static int check_table(dsnode *d, size_t n, const dsnode_layer *layers, size_t n_layers)
{
    if (n_layers == 0 || n_layers > DS_MODEL_MAX_LAYERS)
        return fail(-EINVAL, "dsnode_register: %zu layers; expected 1 to %d", n_layers,
                    DS_MODEL_MAX_LAYERS);
    size_t end = 0;
    for (size_t i = 0; i < n_layers; i++) {
        const dsnode_layer *l = &layers[i];
        if (l->length == 0 || l->offset < end || l->offset > n || l->length > n - l->offset)
            return fail(-EINVAL, "dsnode_register: layer %zu ('%s'): offset %zu length %zu: "
                        "expected a non-empty range after the previous layer (ends at %zu) "
                        "inside the %zu floats", i, l->name ? l->name : "", l->offset,
                        l->length, end, n);
        end = l->offset + l->length;
        ds_layer *o = &d->layers[i];
        memset(o, 0, sizeof(*o));
        if (l->name && l->name[0])
            snprintf(o->name, sizeof(o->name), "%.*s", DSNODE_LAYER_NAME_MAX, l->name);
        else
            snprintf(o->name, sizeof(o->name), "layer%zu", i);
        o->off = l->offset;
        o->len = l->length;
    }
    d->n_layers = (int)n_layers;
    return 0;
}

/* The engine's buffer names as the public header has them. */
static enum dsnode_buffer public_buf(enum ds_engine_buf which)
{
    return which == DS_ENGINE_GRAD ? DSNODE_GRAD : which == DS_ENGINE_OPT ? DSNODE_OPT
                                                                         : DSNODE_PARAMS;
}

static int pull_hook(void *ctx, enum ds_engine_buf which)
{
    dsnode *d = ctx;
    return d->pull(d->copy_ctx, public_buf(which));
}

static int push_hook(void *ctx, enum ds_engine_buf which)
{
    dsnode *d = ctx;
    return d->push(d->copy_ctx, public_buf(which));
}

static int add_hook(void *ctx, enum ds_engine_buf which, const float *delta)
{
    dsnode *d = ctx;
    return d->add(d->copy_ctx, public_buf(which), delta);
}

static int restore_hook(void *ctx, int64_t *step);

int dsnode_register_copies(dsnode *d, dsnode_copy_fn pull, dsnode_copy_fn push, void *ctx)
{
    int e = need(d, ST_OPEN, "dsnode_register_copies");
    if (e < 0)
        return e;
    if (!pull || !push)
        return fail(-EINVAL, "dsnode_register_copies: pull and push are required");
    if (d->pull)
        return fail(-EINVAL, "dsnode_register_copies: called twice");
    if (d->grad)
        return fail(-EINVAL, "dsnode_register_copies: called after dsnode_register_grad");
    d->pull = pull;
    d->push = push;
    d->copy_ctx = ctx;
    return 0;
}

int dsnode_register_add(dsnode *d, dsnode_add_fn add)
{
    int e = need(d, ST_OPEN, "dsnode_register_add");
    if (e < 0)
        return e;
    if (!add)
        return fail(-EINVAL, "dsnode_register_add: add is required");
    if (!d->pull)
        return fail(-EINVAL, "dsnode_register_add: expected dsnode_register_copies first");
    if (d->add)
        return fail(-EINVAL, "dsnode_register_add: called twice");
    d->add = add;
    return 0;
}

/* The config averages gradients every step. */
static int reduces(const dsnode *d)
{
    return d->c.node.group[0] != 0 || !ds_topo_gossips(d->c.gossip.topology);
}

/* What averages the gradients, for messages. */
static void reducer_text(const dsnode *d, char *buf, size_t len)
{
    if (d->c.node.group[0])
        snprintf(buf, len, "node.group = %s", d->c.node.group);
    else
        snprintf(buf, len, "gossip.topology = %s", ds_topo_name(d->c.gossip.topology));
}

int dsnode_reduces(const dsnode *d)
{
    begin_call();
    if (!d)
        return fail(-EINVAL, "dsnode_reduces: the engine is NULL");
    return reduces(d);
}

int dsnode_overlaps(const dsnode *d)
{
    begin_call();
    if (!d)
        return fail(-EINVAL, "dsnode_overlaps: the engine is NULL");
    return d->c.node.group[0] != 0 && d->c.group.overlap && !d->pull;
}

int dsnode_register_grad(dsnode *d, float *grad, float *opt)
{
    int e = need(d, ST_OPEN, "dsnode_register_grad");
    if (e < 0)
        return e;
    if (!grad)
        return fail(-EINVAL, "dsnode_register_grad: grad is required");
    if (grad == opt && !d->pull)
        return fail(-EINVAL, "dsnode_register_grad: grad and opt are one buffer; expected two "
                    "(or host mirrors: dsnode_register_copies first)");
    if (d->grad)
        return fail(-EINVAL, "dsnode_register_grad: called twice");
    d->grad = grad;
    d->opt = opt;
    return 0;
}

int dsnode_register(dsnode *d, float *params, size_t n, const dsnode_layer *layers,
                    size_t n_layers, dsnode_adopt_fn adopt, void *ctx)
{
    int e = need(d, ST_OPEN, "dsnode_register");
    if (e < 0)
        return e;
    if (!params || !n || !layers || !adopt)
        return fail(-EINVAL, "dsnode_register: params, n, layers and adopt are required");
    if (reduces(d) && !d->grad) {
        char what[320];
        reducer_text(d, what, sizeof(what));
        return fail(-EINVAL, "dsnode_register: %s averages gradients every step; expected "
                    "dsnode_register_grad (the gradient buffer) before dsnode_register", what);
    }
    if (!d->pull && (d->grad == params || (d->opt && d->opt == params)))
        return fail(-EINVAL, "dsnode_register: params is the buffer given as grad or opt; "
                    "expected three distinct buffers (or host mirrors: "
                    "dsnode_register_copies first)");
    if ((e = check_table(d, n, layers, n_layers)) < 0)
        return e;
    char err[1024];
    if ((e = ds_preflight_outputs(&d->c, 16 + (uint64_t)n * sizeof(float), err, sizeof(err))) < 0)
        return fail(e, "dsnode_register: %s", err);
    d->params = params;
    d->n = n;
    d->adopt = adopt;
    d->adopt_ctx = ctx;
    /* Without a reduction the engine never reads or writes grad (gossip
     * topologies outside a group): params stands in. */
    const int red = reduces(d);
    const ds_engine_params p = {.n = n, .layers = d->layers, .n_layers = d->n_layers,
                                .params = params, .grad = red ? d->grad : params,
                                .opt = red ? d->opt : NULL, .ctx = d, .adopt = adopt_hook,
                                .pull = d->pull ? pull_hook : NULL,
                                .push = d->push ? push_hook : NULL,
                                .add = d->add ? add_hook : NULL, .restore = restore_hook};
    if ((e = ds_engine_register(d->e, &p)) < 0) {
        d->state = ST_FAILED;
        return fail_logged(e, "dsnode_register");
    }
    d->state = ST_REGISTERED;
    return 0;
}

/* ---- resume ---------------------------------------------------------------- */

/* Read and check path, put the parameters back, let the program restore
 * its part, then the engine's. *k is the checkpoint read: the caller
 * frees it after a success (nothing to free after a failure). The message
 * of a failure goes to api_error, after fn. */
static int resume_from(dsnode *d, const char *path, const char *fn, ds_ckpt *k)
{
    char err[1200];
    int e = ds_ckpt_read(path, d->e, k, err, sizeof(err));
    if (e < 0)
        return fail(e, "%s: %s", fn, err);
    if ((e = ds_ckpt_put_params(d->e, k, err, sizeof(err))) < 0) {
        ds_ckpt_free(k);
        return fail(e, "%s: %s", fn, err);
    }
    char why[512] = "";
    e = d->restore(d->restore_ctx, k->prog, k->prog_len, k->step, why, sizeof(why));
    if (e < 0) {
        ds_ckpt_free(k);
        return fail(e, "%s: %s: %s", fn, path, why[0] ? why : "the program refused its state");
    }
    ds_ckpt_apply(d->e, k);
    d->step = k->step;
    return 0;
}

int dsnode_resume(dsnode *d, const char *path, dsnode_restore_fn restore, void *ctx)
{
    int e = need(d, ST_REGISTERED, "dsnode_resume");
    if (e < 0)
        return e;
    if (!path || !restore)
        return fail(-EINVAL, "dsnode_resume: path and restore are required");
    if (d->resume_path)
        return fail(-EINVAL, "dsnode_resume: called twice");
    if (!(d->resume_path = strdup(path)))
        return fail(-ENOMEM, "dsnode_resume: out of memory");
    d->restore = restore;
    d->restore_ctx = ctx;
    ds_ckpt k;
    if ((e = resume_from(d, path, "dsnode_resume", &k)) < 0) {
        free(d->resume_path);
        d->resume_path = NULL;
        return e;
    }
    ds_info("train", "resumed from %s at step %lld (round %llu)", path, (long long)k.step,
            (unsigned long long)k.round);
    ds_ckpt_free(&k);
    return 0;
}

/* The engine prefers our own checkpoint over the cluster's state it
 * adopted (ds_ckpt_choose): read it again, all of it put back. */
static int restore_hook(void *ctx, int64_t *step)
{
    dsnode *d = ctx;
    if (!d->resume_path)
        return -ENOENT;
    ds_ckpt k;
    const int e = resume_from(d, d->resume_path, "checkpoint", &k);
    if (e < 0) {
        ds_warn("state", "%s", api_error);
        return e;
    }
    *step = k.step;
    ds_ckpt_free(&k);
    return 0;
}

/* ---- join ------------------------------------------------------------------ */

static void publish(dsnode *d, int force)
{
    ds_engine_report_set(d->e, &d->rep);
    ds_engine_publish(d->e, force);
}

/* The summary of a run that did not start (refused, timed out, stopped). */
static void summary_not_started(dsnode *d, const char *status)
{
    const ds_engine_info in = {0};
    const ds_run_summary sum = {.name = d->c.node.name, .status = status, .backend = d->backend,
                                .test_acc = -1,
                                .wall_s = (double)(ds_now_ns() - d->t_start) * 1e-9};
    ds_run_summary_print(&sum, &in);
}

int dsnode_join(dsnode *d)
{
    int e = need(d, ST_REGISTERED, "dsnode_join");
    if (e < 0)
        return e;
    char err[1024] = "";
    if ((e = ds_engine_listen(d->e)) < 0) {
        d->state = ST_FAILED;
        e = fail_logged(e, "dsnode_join");
        summary_not_started(d, "failed");
        return e;
    }
    publish(d, 1);
    /* Refused, timed out, or admitted and given no state: err says which. */
    if ((e = ds_engine_join(d->e, err, sizeof(err))) < 0 ||
        (e = ds_engine_start(d->e, err, sizeof(err))) < 0) {
        d->state = ST_FAILED;
        if (e == -EINTR) {
            ds_warn("node", "stopped on signal %d before training", (int)d->stop_signal);
            summary_not_started(d, "stopped");
            d->exit_status = 128 + (int)d->stop_signal;
            return fail(e, "dsnode_join: stopped (signal %d) before training",
                        (int)d->stop_signal);
        }
        ds_error("node", "%s", err);
        summary_not_started(d, "failed");
        return fail(e, "dsnode_join: %s", err);
    }
    d->state = ST_JOINED;
    d->rep.phase = DS_STATUS_TRAINING;
    d->t_step = ds_now_ns();
    publish(d, 1);
    return 0;
}

/* ---- steps ------------------------------------------------------------------ */

int dsnode_ready(dsnode *d)
{
    int e = need(d, ST_JOINED, "dsnode_ready");
    if (e < 0)
        return e;
    return ds_engine_before_step(d->e) ? 0 : 1;
}

int dsnode_reduce(dsnode *d)
{
    int e = need(d, ST_JOINED, "dsnode_reduce");
    if (e < 0)
        return e;
    if (!reduces(d))
        return 0;
    if (d->reduced)
        return fail(-EINVAL, "dsnode_reduce: called twice for one step; expected dsnode_step "
                    "in between");
    ds_engine_reduce(d->e, d->step);
    d->reduced = 1;
    return 0;
}

int dsnode_layer_ready(dsnode *d, size_t layer)
{
    int e = need(d, ST_JOINED, "dsnode_layer_ready");
    if (e < 0)
        return e;
    if (!reduces(d))
        return 0;
    if (d->reduced)
        return fail(-EINVAL, "dsnode_layer_ready: called after dsnode_reduce; expected it "
                    "between dsnode_ready and dsnode_reduce");
    if (layer >= (size_t)d->n_layers)
        return fail(-EINVAL, "dsnode_layer_ready: layer %zu: expected an index of the %zu "
                    "registered layers", layer, (size_t)d->n_layers);
    if (ds_engine_layer_ready(d->e, d->step, (int)layer) < 0)
        return fail(-EALREADY, "dsnode_layer_ready: layer %zu handed over twice in one step",
                    layer);
    return 0;
}

int dsnode_step(dsnode *d)
{
    int e = need(d, ST_JOINED, "dsnode_step");
    if (e < 0)
        return e;
    if (reduces(d) && !d->reduced) {
        char what[320];
        reducer_text(d, what, sizeof(what));
        return fail(-EINVAL, "dsnode_step: %s averages gradients every step; expected "
                    "dsnode_reduce before the optimizer step", what);
    }
    d->reduced = 0;
    d->step++;
    ds_engine_step(d->e, d->step);
    publish(d, 0);
    return 0;
}

int dsnode_settle(dsnode *d)
{
    int e = need(d, ST_JOINED, "dsnode_settle");
    if (e < 0)
        return e;
    ds_engine_settle(d->e);
    return 0;
}

int dsnode_report(dsnode *d, double loss, double test_acc, double lr, double samples_per_s)
{
    int e = need(d, ST_JOINED, "dsnode_report");
    if (e < 0)
        return e;
    d->rep.loss = loss;
    d->rep.test_acc = test_acc;
    d->rep.lr = lr;
    d->rep.samples_per_s = samples_per_s;
    if (d->step > 0 && d->step != d->logged_step &&
        (d->step % d->c.train.log_every == 0 || d->step == d->c.train.steps)) {
        d->logged_step = d->step;
        /* The progress line of `dsnode run` (dslaunch follows it). */
        ds_engine_info in;
        ds_engine_info_get(d->e, &in);
        ds_info("train", "step=%lld loss=%.4f samples_per_s=%.0f lr=%.4g rounds=%llu "
                "exchanges_ok=%llu exchanges_failed=%llu view=%u",
                (long long)d->step, loss, samples_per_s, lr, (unsigned long long)in.rounds,
                (unsigned long long)in.gossip.exchanges_ok,
                (unsigned long long)in.gossip.exchanges_failed, in.view_size);
    }
    publish(d, 0);
    return 0;
}

int dsnode_report_eval(dsnode *d, double test_loss, double test_acc)
{
    int e = need(d, ST_JOINED, "dsnode_report_eval");
    if (e < 0)
        return e;
    d->test_loss = test_loss;
    d->rep.test_acc = test_acc;
    ds_info("eval", "step=%lld test_loss=%.4f test_acc=%.4f", (long long)d->step, test_loss,
            test_acc);
    publish(d, 1);
    return 0;
}

int dsnode_checkpoint(dsnode *d, const void *state, size_t len)
{
    int e = need(d, ST_JOINED, "dsnode_checkpoint");
    if (e < 0)
        return e;
    if (len && !state)
        return fail(-EINVAL, "dsnode_checkpoint: state is NULL with %zu bytes", len);
    ds_engine_settle(d->e);
    char err[1024];
    if ((e = ds_ckpt_save(d->e, d->step, state, len, err, sizeof(err))) < 0)
        return fail(e, "checkpoint not saved: %s", err);
    ds_info("train", "checkpoint saved at step %lld", (long long)d->step);
    return 0;
}

int dsnode_set_backend(dsnode *d, const char *name)
{
    begin_call();
    if (!d || !name || !name[0])
        return fail(-EINVAL, "dsnode_set_backend: the engine and a non-empty name are required");
    if (d->state == ST_LEFT)
        return fail(-EINVAL, "dsnode_set_backend: called after dsnode_leave");
    snprintf(d->backend, sizeof(d->backend), "%s", name);
    return 0;
}

int dsnode_stats_get(dsnode *d, dsnode_stats *out)
{
    begin_call();
    if (!d || !out)
        return fail(-EINVAL, "dsnode_stats_get: engine and out are required");
    ds_engine_info in;
    ds_engine_info_get(d->e, &in);
    *out = (dsnode_stats){
        .step = d->step,
        .rounds = in.rounds,
        .view_size = in.view_size,
        .exchanges_ok = in.gossip.exchanges_ok,
        .exchanges_failed = in.gossip.exchanges_failed,
        .bytes_sent = in.net.bytes_sent,
        .bytes_received = in.net.bytes_recv,
        .wait_s = (double)in.gossip.wait_ns * 1e-9,
        .max_round_s = (double)in.gossip.max_wait_ns * 1e-9,
    };
    return 0;
}

/* ---- stopping ---------------------------------------------------------------- */

void dsnode_stop(dsnode *d, int sig)
{
    if (!d)
        return;
    int zero = 0;
    atomic_compare_exchange_strong(&d->stop_signal, &zero, sig > 0 ? sig : SIGTERM);
    atomic_fetch_add(&d->stop_count, 1);
}

int dsnode_stopped(const dsnode *d)
{
    return d ? atomic_load(&d->stop_signal) : 0;
}

static void on_signal(int sig)
{
    dsnode_stop(atomic_load(&signal_owner), sig);
}

static void on_hup(int sig)
{
    (void)sig;
    dsnode *d = atomic_load(&signal_owner);
    if (d)
        atomic_fetch_add(&d->reload, 1);
}

/* The handlers dsnode_handle_signals replaced, put back by dsnode_close. */
static struct sigaction old_int, old_term, old_hup;

static void set_handler(int sig, void (*fn)(int), int flags, struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, old);
}

int dsnode_handle_signals(dsnode *d)
{
    begin_call();
    if (!d)
        return fail(-EINVAL, "dsnode_handle_signals: the engine is NULL");
    dsnode *none = NULL;
    if (!atomic_compare_exchange_strong(&signal_owner, &none, d))
        return fail(-EBUSY, "dsnode_handle_signals: another engine of this process handles "
                    "the signals");
    /* libfabric loading on the warm-up's thread would put back the
     * dispositions it saved, over ours (a dslaunch SIGTERM then killed a
     * node outright): install under its lock. */
    ds_engine_signals_lock();
    set_handler(SIGINT, on_signal, 0, &old_int);
    set_handler(SIGTERM, on_signal, 0, &old_term);
    set_handler(SIGHUP, on_hup, SA_RESTART, &old_hup);
    signal(SIGPIPE, SIG_IGN);
    ds_engine_signals_unlock();
    return 0;
}

/* ---- leave and close ------------------------------------------------------------ */

static void print_summary(dsnode *d, const char *status)
{
    ds_engine_info in;
    ds_engine_info_get(d->e, &in);
    const ds_run_summary sum = {.name = d->c.node.name, .status = status, .backend = d->backend,
                                .steps = d->step, .loss = d->rep.loss,
                                .test_acc = d->rep.test_acc,
                                .samples_per_s = d->rep.samples_per_s,
                                .wall_s = (double)(ds_now_ns() - d->t_start) * 1e-9};
    ds_run_summary_print(&sum, &in);
}

int dsnode_leave(dsnode *d, enum dsnode_outcome how)
{
    int e = need(d, ST_JOINED, "dsnode_leave");
    if (e < 0)
        return e;
    if (how != DSNODE_DONE && how != DSNODE_FAILED && how != DSNODE_PAUSED)
        return fail(-EINVAL, "dsnode_leave: outcome %d: expected DSNODE_DONE, DSNODE_FAILED or "
                    "DSNODE_PAUSED", (int)how);
    ds_engine_settle(d->e);
    if (how != DSNODE_FAILED)
        ds_engine_final_sync(d->e); /* a group ends as one model */
    ds_engine_leave(d->e);
    d->state = ST_LEFT;
    char err[1024];
    int ret = 0;
    if (d->pull && (e = d->pull(d->copy_ctx, DSNODE_PARAMS)) < 0) {
        ds_error("train", "final model not saved: parameters not read from the device: %s",
                 strerror(-e));
        ret = fail(-EIO, "dsnode_leave: final model not saved: parameters not read from the "
                   "device: %s", strerror(-e));
    } else if (ds_ckpt_write_model(d->c.node.data_dir, d->params, d->n, err, sizeof(err)) < 0) {
        ds_error("train", "final model not saved: %s", err);
        ret = fail(-EIO, "dsnode_leave: final model not saved: %s", err);
    }
    const int sig = dsnode_stopped(d);
    const int failed = ret < 0 || how == DSNODE_FAILED;
    const int paused = how == DSNODE_PAUSED;
    const char *status = failed ? "failed" : sig ? "stopped" : paused ? "paused" : "done";
    d->rep.phase = failed   ? DS_STATUS_FAILED
                   : sig    ? DS_STATUS_STOPPED
                   : paused ? DS_STATUS_PAUSED
                            : DS_STATUS_DONE;
    publish(d, 1);
    print_summary(d, status);
    d->exit_status = failed ? 1 : sig ? 128 + sig : 0;
    return ret;
}

int dsnode_exit_status(const dsnode *d)
{
    return d ? d->exit_status : 1;
}

/* Put back the handlers dsnode_handle_signals replaced, if d has them. */
static void release_signals(dsnode *d)
{
    if (atomic_load(&signal_owner) == d) {
        ds_engine_signals_lock();
        sigaction(SIGINT, &old_int, NULL);
        sigaction(SIGTERM, &old_term, NULL);
        sigaction(SIGHUP, &old_hup, NULL);
        ds_engine_signals_unlock();
        atomic_store(&signal_owner, NULL);
    }
}

void dsnode_close(dsnode **dp)
{
    if (!dp || !*dp)
        return;
    dsnode *d = *dp;
    release_signals(d);
    ds_engine_close(&d->e);
    free(d->resume_path);
    free(d);
    *dp = NULL;
}

void dsnode_abandon(dsnode **dp)
{
    if (!dp || !*dp)
        return;
    dsnode *d = *dp;
    release_signals(d);
    /* What the net's threads may still touch stays, d (which holds the
     * config the engine reads) with it. */
    ds_engine_abandon(&d->e);
    *dp = NULL;
}
