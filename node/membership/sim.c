/*
 * node/membership/sim.c: the simulated network of sim.h: many real
 * membership instances in one process, over a network and a clock that
 * only exist here.
 *
 * This is product code, not a test helper: it is what `dsbench elastic
 * --fake` runs (tools/dsbench/bench_elastic.c, docs/bench/elastic.md) to
 * measure detection and convergence at cluster sizes no single machine can
 * start as processes, and the membership tests run the same simulations.
 * It moved here from tests/ so the tool links it from the library instead
 * of compiling test sources. It uses only the public API of membership.h,
 * like any other owner of an instance.
 *
 * Discrete events: the clock jumps to the earliest of (next frame arrival,
 * next protocol deadline of any running node, next round boundary). Frames
 * wait in a binary heap ordered by (arrival time, send order), so equal
 * times are delivered in the order they were sent and runs repeat exactly.
 * Each node's next deadline is cached and refreshed after every call into
 * it. All randomness (delays, losses, protocol seeds) comes from one
 * xoshiro stream seeded by opts.seed.
 */
#include "config.h"

#include "node/membership/sim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

struct pending {
    uint64_t t, order;
    uint32_t from, to;
    uint8_t *frame;
    size_t len;
};

struct fnode {
    ds_swimnet *net;
    uint32_t idx;
    ds_membership *m;
    char name[16], addr[32];
    uint8_t pk[32];
    uint64_t id;
    int started, crashed, frozen, side, joined;
    uint32_t slow_ms;
    uint64_t deadline;
    struct pending *held; /* frames that arrived while frozen */
    size_t n_held, cap_held;
};

struct ds_swimnet {
    ds_swimnet_opts o;
    ds_rng rng;
    uint64_t now, round, order;
    struct fnode *nodes;
    double *link_drop; /* n*n, lazily allocated; < 0 = use opts.drop */
    struct pending *heap;
    size_t n_heap, cap_heap;
    ds_swimnet_ev *ev;
    size_t n_ev, cap_ev;
    ds_swimnet_round_fn on_round;
    void *on_round_ctx;
    ds_swimnet_stats st;
};

/* ---- heap ---------------------------------------------------------------------- */

static int before(const struct pending *a, const struct pending *b)
{
    return a->t < b->t || (a->t == b->t && a->order < b->order);
}

static int heap_push(ds_swimnet *net, const struct pending *p)
{
    if (net->n_heap == net->cap_heap) {
        size_t nc = net->cap_heap ? 2 * net->cap_heap : 256;
        struct pending *v = realloc(net->heap, nc * sizeof(*v));
        if (!v)
            return -ENOMEM;
        net->heap = v;
        net->cap_heap = nc;
    }
    size_t i = net->n_heap++;
    net->heap[i] = *p;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(&net->heap[i], &net->heap[up]))
            break;
        struct pending t = net->heap[i];
        net->heap[i] = net->heap[up];
        net->heap[up] = t;
        i = up;
    }
    return 0;
}

static struct pending heap_pop(ds_swimnet *net)
{
    struct pending top = net->heap[0];
    net->heap[0] = net->heap[--net->n_heap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, b = i;
        if (l < net->n_heap && before(&net->heap[l], &net->heap[b]))
            b = l;
        if (r < net->n_heap && before(&net->heap[r], &net->heap[b]))
            b = r;
        if (b == i)
            break;
        struct pending t = net->heap[i];
        net->heap[i] = net->heap[b];
        net->heap[b] = t;
        i = b;
    }
    return top;
}

/* ---- nodes ----------------------------------------------------------------------- */

static int running(const struct fnode *f)
{
    return f->started && !f->crashed && !f->frozen;
}

static void refresh(struct fnode *f)
{
    f->deadline = running(f) ? ds_membership_next_deadline(f->m) : UINT64_MAX;
}

int ds_swimnet_index(const ds_swimnet *net, uint64_t id)
{
    for (uint32_t i = 0; i < net->o.n; i++)
        if (net->nodes[i].id == id)
            return (int)i;
    return -1;
}

static int index_by_addr(const ds_swimnet *net, const char *addr)
{
    for (uint32_t i = 0; i < net->o.n; i++)
        if (!strcmp(net->nodes[i].addr, addr))
            return (int)i;
    return -1;
}

static void fn_send(void *ctx, uint64_t to_id, const char *to_addr, const uint8_t *frame,
                    size_t len)
{
    struct fnode *f = ctx;
    ds_swimnet *net = f->net;
    int to = to_id ? ds_swimnet_index(net, to_id) : -1;
    if (to < 0 && to_addr)
        to = index_by_addr(net, to_addr);
    net->st.sent++;
    net->st.bytes += len;
    double p = net->o.drop;
    if (to >= 0 && net->link_drop && net->link_drop[f->idx * net->o.n + (uint32_t)to] >= 0)
        p = net->link_drop[f->idx * net->o.n + (uint32_t)to];
    /* Draw both numbers for every frame so that a change of loss rate does
     * not shift the delays of the frames after it. */
    const double u = ds_rng_unit(&net->rng);
    const uint32_t span = net->o.delay_max_ms - net->o.delay_min_ms + 1;
    const uint64_t d = net->o.delay_min_ms + ds_rng_below(&net->rng, span);
    if (to < 0 || u < p) {
        net->st.lost++;
        return;
    }
    struct pending pd = {
        .t = net->now + d + f->slow_ms + net->nodes[to].slow_ms,
        .order = net->order++,
        .from = f->idx,
        .to = (uint32_t)to,
        .len = len,
    };
    pd.frame = malloc(len ? len : 1);
    if (!pd.frame) {
        net->st.lost++;
        return;
    }
    memcpy(pd.frame, frame, len);
    if (heap_push(net, &pd)) {
        free(pd.frame);
        net->st.lost++;
    }
}

static void fn_event(void *ctx, const ds_membership_event *e)
{
    struct fnode *f = ctx;
    ds_swimnet *net = f->net;
    if (net->n_ev == net->cap_ev) {
        size_t nc = net->cap_ev ? 2 * net->cap_ev : 1024;
        ds_swimnet_ev *v = realloc(net->ev, nc * sizeof(*v));
        if (!v)
            return;
        net->ev = v;
        net->cap_ev = nc;
    }
    if (e->kind == DS_MEV_SELF_JOINED)
        f->joined = 1;
    ds_swimnet_ev *x = &net->ev[net->n_ev++];
    x->t = net->now;
    x->node = f->idx;
    x->kind = e->kind;
    x->subject = e->member.id ? ds_swimnet_index(net, e->member.id) : -1;
    x->incarnation = e->member.incarnation;
    x->round = e->round;
    x->epoch = e->epoch;
    x->join_round = e->join_round;
    x->view_size = e->view_size;
    x->in_view = e->in_view;
}

void ds_swimnet_opts_default(ds_swimnet_opts *o, uint32_t n, uint64_t seed)
{
    memset(o, 0, sizeof(*o));
    o->n = n;
    o->seed = seed;
    ds_membership_cfg_default(&o->cfg);
    o->delay_min_ms = 1;
    o->delay_max_ms = 10;
    o->drop = 0;
    o->round_ms = o->cfg.period_ms;
}

int ds_swimnet_create(const ds_swimnet_opts *o, ds_swimnet **out)
{
    if (!o || !out || !o->n || o->n > 4096 || o->delay_max_ms < o->delay_min_ms)
        return -EINVAL;
    *out = NULL;
    ds_swimnet *net = calloc(1, sizeof(*net));
    if (!net)
        return -ENOMEM;
    net->o = *o;
    ds_rng_seed(&net->rng, o->seed);
    net->nodes = calloc(o->n, sizeof(*net->nodes));
    if (!net->nodes) {
        free(net);
        return -ENOMEM;
    }
    const ds_membership_io io0 = {.send = fn_send, .event = fn_event};
    uint64_t ks = o->seed ^ 0x6b6579736b657973ull;
    for (uint32_t i = 0; i < o->n; i++) {
        struct fnode *f = &net->nodes[i];
        f->net = net;
        f->idx = i;
        snprintf(f->name, sizeof(f->name), "n%03u", i);
        snprintf(f->addr, sizeof(f->addr), "10.%u.%u.%u:7946", (i >> 16) & 255, (i >> 8) & 255,
                 i & 255);
        for (int b = 0; b < 32; b += 8) {
            uint64_t w = ds_splitmix64_step(&ks);
            memcpy(f->pk + b, &w, 8);
        }
        f->id = ds_wire_node_id(f->pk);
        f->deadline = UINT64_MAX;
        ds_membership_cfg c = o->cfg;
        c.cluster_id = ds_wire_cluster_id(DS_SWIMNET_CLUSTER);
        c.name = f->name;
        c.addr = f->addr;
        c.group = "";
        memcpy(c.pk, f->pk, 32);
        c.seed = ds_rng_next(&net->rng);
        ds_membership_io io = io0;
        io.ctx = f;
        int rc = ds_membership_create(&c, &io, &f->m);
        if (rc) {
            ds_swimnet_destroy(&net);
            return rc;
        }
    }
    *out = net;
    return 0;
}

void ds_swimnet_destroy(ds_swimnet **pnet)
{
    if (!pnet || !*pnet)
        return;
    ds_swimnet *net = *pnet;
    for (uint32_t i = 0; net->nodes && i < net->o.n; i++) {
        ds_membership_destroy(&net->nodes[i].m);
        for (size_t k = 0; k < net->nodes[i].n_held; k++)
            free(net->nodes[i].held[k].frame);
        free(net->nodes[i].held);
    }
    for (size_t k = 0; k < net->n_heap; k++)
        free(net->heap[k].frame);
    free(net->heap);
    free(net->nodes);
    free(net->link_drop);
    free(net->ev);
    free(net);
    *pnet = NULL;
}

int ds_swimnet_bootstrap(ds_swimnet *net, uint32_t i)
{
    if (i >= net->o.n)
        return -EINVAL;
    struct fnode *f = &net->nodes[i];
    f->started = 1;
    ds_membership_set_round(f->m, net->round, net->now);
    int rc = ds_membership_bootstrap(f->m, net->now);
    refresh(f);
    return rc;
}

int ds_swimnet_join(ds_swimnet *net, uint32_t i, const uint32_t *seeds, size_t n_seeds)
{
    if (i >= net->o.n || n_seeds > 64)
        return -EINVAL;
    const char *addrs[64];
    for (size_t k = 0; k < n_seeds; k++) {
        if (seeds[k] >= net->o.n)
            return -EINVAL;
        addrs[k] = net->nodes[seeds[k]].addr;
    }
    struct fnode *f = &net->nodes[i];
    f->started = 1;
    ds_membership_set_round(f->m, net->round, net->now);
    int rc = ds_membership_join(f->m, net->now, addrs, n_seeds);
    refresh(f);
    return rc;
}

/* ---- the event loop ------------------------------------------------------------------- */

static void deliver(ds_swimnet *net, struct pending *p)
{
    struct fnode *src = &net->nodes[p->from], *dst = &net->nodes[p->to];
    if (!dst->started || dst->crashed || src->side != dst->side) {
        net->st.lost++;
        free(p->frame);
        return;
    }
    if (dst->frozen) {
        if (dst->n_held == dst->cap_held) {
            size_t nc = dst->cap_held ? 2 * dst->cap_held : 64;
            struct pending *v = realloc(dst->held, nc * sizeof(*v));
            if (!v) {
                net->st.lost++;
                free(p->frame);
                return;
            }
            dst->held = v;
            dst->cap_held = nc;
        }
        dst->held[dst->n_held++] = *p;
        return;
    }
    net->st.delivered++;
    (void)ds_membership_recv(dst->m, net->now, src->addr, p->frame, p->len);
    free(p->frame);
    refresh(dst);
}

void ds_swimnet_run_until(ds_swimnet *net, uint64_t until)
{
    for (;;) {
        uint64_t t = UINT64_MAX;
        if (net->n_heap)
            t = net->heap[0].t;
        for (uint32_t i = 0; i < net->o.n; i++)
            if (net->nodes[i].deadline < t)
                t = net->nodes[i].deadline;
        uint64_t t_round = net->o.round_ms ? (net->round + 1) * net->o.round_ms : UINT64_MAX;
        if (t_round < t)
            t = t_round;
        if (t < net->now)
            t = net->now;
        if (t > until) {
            net->now = until;
            return;
        }
        net->now = t;
        if (t == t_round) {
            net->round++;
            for (uint32_t i = 0; i < net->o.n; i++) {
                struct fnode *f = &net->nodes[i];
                if (running(f)) {
                    ds_membership_set_round(f->m, net->round, net->now);
                    refresh(f);
                }
            }
            if (net->on_round)
                net->on_round(net->on_round_ctx, net, net->round);
        }
        while (net->n_heap && net->heap[0].t <= net->now) {
            struct pending p = heap_pop(net);
            deliver(net, &p);
        }
        for (uint32_t i = 0; i < net->o.n; i++) {
            struct fnode *f = &net->nodes[i];
            if (f->deadline <= net->now) {
                ds_membership_tick(f->m, net->now);
                refresh(f);
                /* A deadline tick() does not move would spin forever. */
                if (f->deadline <= net->now)
                    f->deadline = net->now + 1;
            }
        }
    }
}

void ds_swimnet_run_for(ds_swimnet *net, uint64_t dt)
{
    ds_swimnet_run_until(net, net->now + dt);
}

uint64_t ds_swimnet_now(const ds_swimnet *net)
{
    return net->now;
}

uint64_t ds_swimnet_round(const ds_swimnet *net)
{
    return net->round;
}

/* ---- faults ---------------------------------------------------------------------------- */

void ds_swimnet_crash(ds_swimnet *net, uint32_t i)
{
    if (i >= net->o.n)
        return;
    net->nodes[i].crashed = 1;
    refresh(&net->nodes[i]);
}

void ds_swimnet_set_slow(ds_swimnet *net, uint32_t i, uint32_t extra_ms)
{
    if (i < net->o.n)
        net->nodes[i].slow_ms = extra_ms;
}

void ds_swimnet_freeze(ds_swimnet *net, uint32_t i, int frozen)
{
    if (i >= net->o.n)
        return;
    struct fnode *f = &net->nodes[i];
    if (f->frozen == !!frozen)
        return;
    f->frozen = !!frozen;
    if (frozen) {
        refresh(f);
        return;
    }
    /* SIGCONT: the clock jumped; the timers see it before the backlog. */
    ds_membership_set_round(f->m, net->round, net->now);
    ds_membership_tick(f->m, net->now);
    for (size_t k = 0; k < f->n_held; k++) {
        net->st.delivered++;
        (void)ds_membership_recv(f->m, net->now, net->nodes[f->held[k].from].addr,
                                 f->held[k].frame, f->held[k].len);
        free(f->held[k].frame);
    }
    f->n_held = 0;
    refresh(f);
}

void ds_swimnet_set_side(ds_swimnet *net, uint32_t i, int side)
{
    if (i < net->o.n)
        net->nodes[i].side = side;
}

int ds_swimnet_set_link_drop(ds_swimnet *net, uint32_t a, uint32_t b, double p)
{
    const uint32_t n = net->o.n;
    if (a >= n || b >= n)
        return -EINVAL;
    if (!net->link_drop) {
        net->link_drop = malloc((size_t)n * n * sizeof(*net->link_drop));
        if (!net->link_drop)
            return -ENOMEM;
        for (size_t k = 0; k < (size_t)n * n; k++)
            net->link_drop[k] = -1;
    }
    net->link_drop[(size_t)a * n + b] = p;
    return 0;
}

int ds_swimnet_inject(ds_swimnet *net, uint32_t i, const char *from_addr, const uint8_t *frame,
                      size_t len)
{
    if (i >= net->o.n)
        return -EINVAL;
    int rc = ds_membership_recv(net->nodes[i].m, net->now, from_addr, frame, len);
    refresh(&net->nodes[i]);
    return rc;
}

/* ---- introspection --------------------------------------------------------------------- */

uint32_t ds_swimnet_size(const ds_swimnet *net)
{
    return net->o.n;
}

ds_membership *ds_swimnet_node(ds_swimnet *net, uint32_t i)
{
    return i < net->o.n ? net->nodes[i].m : NULL;
}

uint64_t ds_swimnet_id(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n ? net->nodes[i].id : 0;
}

const char *ds_swimnet_addr(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n ? net->nodes[i].addr : NULL;
}

const char *ds_swimnet_name(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n ? net->nodes[i].name : NULL;
}

const uint8_t *ds_swimnet_pk(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n ? net->nodes[i].pk : NULL;
}

int ds_swimnet_joined(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n && net->nodes[i].joined;
}

uint64_t ds_swimnet_cluster(const ds_swimnet *net)
{
    (void)net;
    return ds_wire_cluster_id(DS_SWIMNET_CLUSTER);
}

int ds_swimnet_is_up(const ds_swimnet *net, uint32_t i)
{
    return i < net->o.n && net->nodes[i].started && !net->nodes[i].crashed;
}

const ds_swimnet_ev *ds_swimnet_events(const ds_swimnet *net, size_t *n)
{
    *n = net->n_ev;
    return net->ev;
}

uint64_t ds_swimnet_first(const ds_swimnet *net, enum ds_membership_event_kind kind,
                          int32_t subject, uint64_t since)
{
    for (size_t k = 0; k < net->n_ev; k++) {
        const ds_swimnet_ev *e = &net->ev[k];
        if (e->t >= since && e->kind == kind && e->subject == subject)
            return e->t;
    }
    return UINT64_MAX;
}

uint64_t ds_swimnet_first_at(const ds_swimnet *net, uint32_t node,
                             enum ds_membership_event_kind kind, int32_t subject, uint64_t since)
{
    for (size_t k = 0; k < net->n_ev; k++) {
        const ds_swimnet_ev *e = &net->ev[k];
        if (e->t >= since && e->node == node && e->kind == kind && e->subject == subject)
            return e->t;
    }
    return UINT64_MAX;
}

size_t ds_swimnet_count(const ds_swimnet *net, enum ds_membership_event_kind kind,
                        int32_t subject, uint64_t since)
{
    size_t c = 0;
    for (size_t k = 0; k < net->n_ev; k++) {
        const ds_swimnet_ev *e = &net->ev[k];
        c += e->t >= since && e->kind == kind && (subject == -2 || e->subject == subject);
    }
    return c;
}

uint32_t ds_swimnet_view_mismatch(ds_swimnet *net, uint64_t round, uint32_t *G, uint64_t *epoch)
{
    const uint32_t n = net->o.n;
    uint64_t *ref = calloc(n, sizeof(*ref)), *cur = calloc(n, sizeof(*cur));
    ds_member_info *buf = calloc(n, sizeof(*buf));
    uint32_t bad = 0, ref_g = 0;
    uint64_t ref_e = 0;
    int have_ref = 0;
    if (!ref || !cur || !buf) {
        bad = n;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        struct fnode *f = &net->nodes[i];
        if (!running(f) || !f->joined)
            continue;
        uint32_t g = 0, me = 0;
        uint64_t ep = 0;
        if (ds_membership_view_at(f->m, round, buf, n, &g, &me, &ep)) {
            bad++;
            continue;
        }
        for (uint32_t k = 0; k < g; k++)
            cur[k] = buf[k].id;
        if (!have_ref) {
            have_ref = 1;
            ref_g = g;
            ref_e = ep;
            memcpy(ref, cur, g * sizeof(*cur));
        } else if (g != ref_g || ep != ref_e || memcmp(ref, cur, g * sizeof(*cur))) {
            bad++;
        }
    }
out:
    if (G)
        *G = ref_g;
    if (epoch)
        *epoch = ref_e;
    free(ref);
    free(cur);
    free(buf);
    return bad;
}

int ds_swimnet_form(ds_swimnet *net, uint32_t count, uint64_t max_ms)
{
    if (count == 0 || count > net->o.n)
        return -EINVAL;
    int rc = ds_swimnet_bootstrap(net, 0);
    const uint32_t seed0 = 0;
    for (uint32_t i = 1; i < count && !rc; i++)
        rc = ds_swimnet_join(net, i, &seed0, 1);
    if (rc)
        return rc;
    const uint64_t stop = net->now + max_ms, step = net->o.cfg.period_ms;
    while (net->now < stop) {
        ds_swimnet_run_for(net, step);
        uint32_t G = 0;
        uint64_t ep = 0;
        if (ds_swimnet_view_mismatch(net, net->round, &G, &ep) == 0 && G == count) {
            int all = 1;
            for (uint32_t i = 0; i < count && all; i++) {
                ds_membership_stats st;
                ds_membership_stats_get(net->nodes[i].m, &st);
                all = st.alive == count;
            }
            if (all)
                return 0;
        }
    }
    return -ETIMEDOUT;
}

void ds_swimnet_on_round(ds_swimnet *net, ds_swimnet_round_fn fn, void *ctx)
{
    net->on_round = fn;
    net->on_round_ctx = ctx;
}

void ds_swimnet_stats_get(const ds_swimnet *net, ds_swimnet_stats *st)
{
    *st = net->st;
}
