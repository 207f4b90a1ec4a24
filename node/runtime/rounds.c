/*
 * node/runtime/rounds.c: what the engine does between the client's
 * training steps: set up each round's view, run the gossip round (here, or
 * on the comm thread with gossip.overlap) and apply its deltas, average
 * gradients for topology allreduce, give our state to joiners and take the
 * cluster's when we join, and leave at the end. The policies it follows
 * are pure modules of their own, tested alone: skip windows (skip.h), the
 * lag (lag.h), a joiner's pace (pace.h) and shadowing (shadow.h), and
 * leaving (leave.h); this file holds the locking, the clock and the waits
 * around them.
 *
 * Round r happens after optimizer step (r - round0) * gossip.every. Its
 * view (members, epoch) comes from membership for round r; the gossip
 * engine's view indices map to node ids through node/gossip/gossip_net.
 *
 * Threads: everything here runs on the client's thread except comm_main,
 * which only runs ds_gossip_exchange between a round's begin and end.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/runtime/checkpoint.h"
#include "node/runtime/engine_impl.h"
#include "node/runtime/leave.h"
#include "node/runtime/shadow.h"
#include "topology/topology.h"

/* ---- views ------------------------------------------------------------------ */

/* The view at `round`, into r->vbuf / r->vids. */
static int view_at(rt *r, uint64_t round, uint32_t *G, uint32_t *me, uint64_t *epoch)
{
    ds_membership *ms = atomic_load(&r->ms);
    if (!r->vcap) {
        r->vbuf = malloc(16 * sizeof(*r->vbuf));
        r->vids = malloc(16 * sizeof(*r->vids));
        r->vaddrs = malloc(16 * sizeof(*r->vaddrs));
        r->vorder = malloc(16 * sizeof(*r->vorder));
        r->vgidx = malloc(16 * sizeof(*r->vgidx));
        r->gmembers = calloc(16, sizeof(*r->gmembers));
        r->gskip = malloc(16);
        if (!r->vbuf || !r->vids || !r->vaddrs || !r->vorder || !r->vgidx || !r->gmembers ||
            !r->gskip)
            return -ENOMEM;
        r->vcap = 16;
    }
    for (;;) {
        int e = ds_membership_view_at(ms, round, r->vbuf, r->vcap, G, me, epoch);
        if (e == 0)
            break;
        if (e != -ENOSPC)
            return e;
        const uint32_t cap = *G + 16;
        ds_member_info *nb = realloc(r->vbuf, cap * sizeof(*nb));
        if (nb)
            r->vbuf = nb;
        uint64_t *ni = realloc(r->vids, cap * sizeof(*ni));
        if (ni)
            r->vids = ni;
        const char **na = realloc(r->vaddrs, cap * sizeof(*na));
        if (na)
            r->vaddrs = na;
        uint32_t *no = realloc(r->vorder, cap * sizeof(*no));
        if (no)
            r->vorder = no;
        uint32_t *ng = realloc(r->vgidx, cap * sizeof(*ng));
        if (ng)
            r->vgidx = ng;
        uint64_t *nm = realloc(r->gmembers, cap * sizeof(*nm));
        if (nm)
            r->gmembers = nm;
        uint8_t *nk = realloc(r->gskip, cap);
        if (nk)
            r->gskip = nk;
        if (!nb || !ni || !na || !no || !ng || !nm || !nk)
            return -ENOMEM;
        r->vcap = cap;
    }
    for (uint32_t i = 0; i < *G; i++)
        r->vids[i] = r->vbuf[i].id;
    return 0;
}

/* Tell the gossip engine which peers this round does not wait for. */
static void set_round_skips(rt *r, uint32_t G, uint32_t me, uint64_t round)
{
    const uint64_t now = ds_now_ms();
    pthread_mutex_lock(&r->skip_lock);
    for (uint32_t i = 0; i < G; i++) {
        const enum ds_skip_verdict u =
            i != me ? ds_skip_check(&r->skip, r->vids[i], round, now) : DS_SKIP_WAIT;
        if (u == DS_SKIP_ALL)
            ds_gossip_set_skip(r->gossip, i);
        else if (u == DS_SKIP_NOWAIT)
            ds_gossip_set_nowait(r->gossip, i);
    }
    pthread_mutex_unlock(&r->skip_lock);
}

/* Put r->vbuf (G entries) in the order ds_hier_form gave (r->vorder), so
 * that entry k is in group r->vgidx[k]. 0 or -ENOMEM. */
static int sort_view(rt *r, uint32_t G)
{
    ds_member_info *t = malloc((size_t)G * sizeof(*t));
    if (!t)
        return -ENOMEM;
    for (uint32_t k = 0; k < G; k++)
        t[k] = r->vbuf[r->vorder[k]];
    memcpy(r->vbuf, t, (size_t)G * sizeof(*t));
    free(t);
    return 0;
}

/* The segments member `m` of a group of `size` handles. */
static uint32_t segments_owned(const rt *r, uint32_t m, uint32_t size)
{
    const int n = ds_gossip_n_segments(r->gossip);
    uint32_t k = 0;
    for (int s = 0; s < n; s++) {
        uint32_t owner;
        k += ds_topo_hier_owner((uint32_t)s, size, &owner) == 0 && owner == m;
    }
    return k;
}

/* The view has groups (hier.h): the gossip engine's participants are the
 * groups, the adapter sends segment s to member s mod |h| of group h, and
 * this node handles its share of the segments. A group of one is skipped
 * as a lone node is; a group of several is never skipped whole (one dead
 * member does not make the others so), but not waited for while one of
 * its members is in a skip window: its live members' replies are still
 * used when they come in time, or late. 0 or 1 as set_round_view. */
static int set_group_view(rt *r, uint64_t round, uint32_t G, uint64_t epoch, const ds_hier *h)
{
    if (sort_view(r, G) < 0)
        return -ENOMEM;
    r->grouped = 1;
    r->last_nodes = G;
    r->rg_groups = h->n_groups;
    r->rg_group = h->group;
    r->rg_member = h->member;
    r->rg_size = h->size;
    for (uint32_t k = 0; k < G; k++) {
        const ds_member_info *m = &r->vbuf[k];
        r->vids[k] = m->id;
        r->vaddrs[k] = m->id == r->id.id ? NULL : m->addr;
    }
    int e = ds_gnet_set_groups(r->gn, r->vids, r->vaddrs, G, r->vgidx, h->n_groups);
    if (e < 0 || (e = ds_gossip_set_view(r->gossip, h->n_groups, h->group, epoch)) < 0 ||
        (e = ds_gossip_set_share(r->gossip, h->member, h->size)) < 0)
        return e;
    if (G != r->last_G || epoch != r->last_epoch) {
        ds_info("gossip", "round=%llu view_size=%u groups=%u group=%u member=%u/%u epoch=%llu",
                (unsigned long long)round, G, h->n_groups, h->group, h->member, h->size,
                (unsigned long long)epoch);
        r->last_G = G;
        r->last_epoch = epoch;
    }
    r->gst.segments_owned = segments_owned(r, h->member, h->size);
    const uint64_t now = ds_now_ms();
    pthread_mutex_lock(&r->skip_lock);
    for (uint32_t k = 0; k < G; k++) {
        const uint32_t grp = r->vgidx[k];
        if (grp == h->group)
            continue;
        const int alone = (k == 0 || r->vgidx[k - 1] != grp) &&
                          (k + 1 == G || r->vgidx[k + 1] != grp);
        const enum ds_skip_verdict u = ds_skip_check(&r->skip, r->vids[k], round, now);
        if (u == DS_SKIP_ALL && alone)
            ds_gossip_set_skip(r->gossip, grp);
        else if (u != DS_SKIP_WAIT)
            ds_gossip_set_nowait(r->gossip, grp);
    }
    pthread_mutex_unlock(&r->skip_lock);
    return h->n_groups < 2 ? 1 : 0;
}

/* Point the gossip engine and the adapter at round `round`'s view.
 * 0: a round to run; 1: alone, no round; < 0: error. */
static int set_round_view(rt *r, uint64_t round)
{
    uint32_t G, me;
    uint64_t epoch;
    ds_membership_set_round(atomic_load(&r->ms), round, ds_now_ms());
    atomic_store(&r->cur_round, round);
    int e = view_at(r, round, &G, &me, &epoch);
    if (e < 0)
        return e;
    if (me == DS_MEMBERSHIP_NOT_IN_VIEW || G == 0) {
        /* Not (yet, or no longer) in the view: a round of one. */
        G = 1;
        me = 0;
        r->vids[0] = r->id.id;
    }
    if (me != DS_MEMBERSHIP_NOT_IN_VIEW && G > 1) {
        ds_hier h;
        if (ds_hier_form(r->vbuf, G, r->id.id, r->vorder, r->vgidx, &h) == 0 && h.any)
            return set_group_view(r, round, G, epoch, &h);
    }
    if (G != r->last_G || epoch != r->last_epoch) {
        ds_info("gossip", "round=%llu view_size=%u epoch=%llu me=%u", (unsigned long long)round,
                G, (unsigned long long)epoch, me);
        r->last_G = G;
        r->last_epoch = epoch;
    }
    r->grouped = 0;
    r->last_nodes = G;
    for (uint32_t i = 0; i < G; i++)
        r->vaddrs[i] = r->vids[i] == r->id.id ? NULL : r->vbuf[i].addr;
    if ((e = ds_gnet_set_view(r->gn, r->vids, r->vaddrs, G)) < 0)
        return e;
    if ((e = ds_gossip_set_view(r->gossip, G, me, epoch)) < 0)
        return e;
    set_round_skips(r, G, me, round);
    /* Alone: no round at all. snap keeps the last mixed state, so the next
     * real round's begin() still sees all the drift since then. */
    return G < 2 ? 1 : 0;
}

/* ---- rounds ----------------------------------------------------------------- */

/* The client's parameters as host memory. */
static float *params_host(rt *r)
{
    if (r->p.pull)
        r->p.pull(r->p.ctx, DS_ENGINE_PARAMS);
    return r->p.params;
}

static void params_push(rt *r)
{
    if (r->p.push)
        r->p.push(r->p.ctx, DS_ENGINE_PARAMS);
}

/* 0: a round began; 1: no round (alone); < 0: error. */
static int round_begin(rt *r, uint64_t round)
{
    int e = set_round_view(r, round);
    if (e == 0)
        e = ds_gossip_begin(r->gossip, params_host(r), round);
    if (e == 0)
        ds_rt_round_began(r, round);
    if (e < 0)
        ds_error("gossip", "round %llu cannot start: %s", (unsigned long long)round, strerror(-e));
    return e;
}

static void round_end(rt *r)
{
    if (!r->p.add) {
        ds_gossip_end(r->gossip, params_host(r));
        ds_rt_round_ended(r);
        params_push(r);
        r->rounds++;
        return;
    }
    /* The round's deltas on zeros are the deltas (0 + d = d, a zero's
     * sign aside); the client adds them where the parameters live, one
     * rounding as on the mirror, so the parameters are not pulled. */
    ds_gossip_end(r->gossip, r->addbuf);
    ds_rt_round_ended(r);
    if (r->p.add(r->p.ctx, DS_ENGINE_PARAMS, r->addbuf) < 0)
        ds_log_rl(DS_LOG_WARN, "gossip", "a round's deltas could not be added to the "
                  "parameters (the client's add failed)");
    memset(r->addbuf, 0, r->p.n * sizeof(float));
    r->rounds++;
}

/* The comm thread: one ds_gossip_exchange per comm_start(). */
static void *comm_main(void *arg)
{
    rt *r = arg;
    pthread_setname_np(pthread_self(), "ds-gossip");
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->comm_go && !r->stop_threads)
            pthread_cond_wait(&r->cond, &r->lock);
        if (r->stop_threads)
            break;
        r->comm_go = 0;
        pthread_mutex_unlock(&r->lock);
        ds_gossip_exchange(r->gossip, ds_gnet_io(r->gn));
        pthread_mutex_lock(&r->lock);
        r->comm_done = 1;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void comm_start(rt *r)
{
    pthread_mutex_lock(&r->lock);
    r->comm_done = 0;
    r->comm_go = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

/* ---- what the status page says the node waits on ---------------------------- */

/* How often a wait for the overlapped round looks at whom it still waits
 * for; a shorter wait is never shown. A round cut at the adaptive
 * deadline's floor (gossip.min_wait_ms, 10 ms, node/gossip/latency.c)
 * ends before it shows; one held longer (the first rounds wait the whole
 * gossip.timeout_ms, a loaded host's median raises the deadline) shows.
 * A wake costs a mutex and a copy of a few names. */
#define WAIT_LOOK_MS 50

/* Member `id`'s name into out (DS_STATUS_NAME_LEN): its node id in hex
 * when membership no longer knows it; id 0 is a group of several
 * (gossip between groups: which member is not known there). */
static void peer_name(rt *r, uint64_t id, char *out)
{
    ds_member_info mi;
    if (id && ds_membership_member(atomic_load(&r->ms), id, &mi) == 0)
        snprintf(out, DS_STATUS_NAME_LEN, "%s", mi.name);
    else if (id)
        snprintf(out, DS_STATUS_NAME_LEN, "%016llx", (unsigned long long)id);
    else
        snprintf(out, DS_STATUS_NAME_LEN, "(a group)");
}

/* Show the peers the overlapped round still waits for (the comm thread's
 * exchange, ds_gossip_waiting), the wait having begun at since. */
static void show_round_wait(rt *r, uint64_t since_unix_ms)
{
    ds_status_wait w = {.kind = DS_WAIT_ROUND, .since_unix_ms = since_unix_ms,
                        .round = r->hist_round};
    uint32_t idx[DS_STATUS_WAIT_PEERS];
    const int n = ds_gossip_waiting(r->gossip, idx, DS_STATUS_WAIT_PEERS);
    w.n_peers = n > 0 ? (uint32_t)n : 0;
    for (uint32_t i = 0; i < w.n_peers && i < DS_STATUS_WAIT_PEERS; i++)
        peer_name(r, ds_gnet_view_id(r->gn, idx[i]), w.peers[i]);
    ds_status_set_wait(r->status, &w);
}

/* Wait for the comm thread's exchange. With a status page, wake every
 * WAIT_LOOK_MS to show whom it still waits for (the training semantics
 * are the same: the round is waited for to its end either way). */
static void comm_wait(rt *r)
{
    const uint64_t since = r->status ? ds_unix_ms() : 0;
    int shown = 0;
    pthread_mutex_lock(&r->lock);
    while (!r->comm_done) {
        if (!r->status) {
            pthread_cond_wait(&r->cond, &r->lock);
            continue;
        }
        ds_rt_timed_wait(r, ds_now_ms() + WAIT_LOOK_MS);
        if (r->comm_done)
            break;
        pthread_mutex_unlock(&r->lock);
        show_round_wait(r, since);
        shown = 1;
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    if (shown)
        ds_status_clear_wait(r->status);
}

static uint64_t current_round(const rt *r)
{
    return r->round0 + (uint64_t)(r->step / r->c->gossip.every);
}

/* A node in a group (node.group set): the delta of its round is summed
 * with its group's at the next reduction (group_reduce), so the round is
 * only waited for here. */
static int in_group(const rt *r)
{
    return r->group[0] != 0;
}

void ds_engine_settle(ds_engine *r)
{
    if (!r->round_open)
        return;
    comm_wait(r);
    r->round_open = 0;
    if (in_group(r)) {
        r->gpending = 1;
        return;
    }
    round_end(r);
}

/* ---- groups (design §5, "Hierarchy") ------------------------------------- */

/* This step's group, from the view of `round`: r->gmembers, gsize,
 * gmember; the group's adapter follows it. A change of members makes the
 * group re-sync. 0 or a negative errno. */
static int group_at(rt *r, uint64_t round)
{
    uint32_t G, me;
    uint64_t epoch;
    int e = view_at(r, round, &G, &me, &epoch);
    if (e < 0)
        return e;
    ds_hier h = {.size = 1};
    if (me == DS_MEMBERSHIP_NOT_IN_VIEW || G == 0 ||
        ds_hier_form(r->vbuf, G, r->id.id, r->vorder, r->vgidx, &h) < 0)
        h = (ds_hier){.size = 1};
    else if (sort_view(r, G) < 0)
        return -ENOMEM;
    int changed = h.size != r->gsize || h.member != r->gmember;
    for (uint32_t k = 0; k < h.size && !changed; k++)
        changed = r->gmembers[k] != r->vbuf[h.first + k].id;
    if (!changed)
        return 0;
    const char **addrs = r->vaddrs;
    for (uint32_t k = 0; k < h.size; k++) {
        const ds_member_info *m = &r->vbuf[h.first + k];
        r->gmembers[k] = m->id;
        addrs[k] = m->id == r->id.id ? NULL : m->addr;
    }
    if (h.size == 1)
        r->gmembers[0] = r->id.id;
    if ((e = ds_gnet_set_view(r->gn_grp, r->gmembers, addrs, h.size)) < 0)
        return e;
    ds_info("group", "group %s: %u member(s), this node is member %u (round %llu)", r->group,
            h.size, h.member, (unsigned long long)round);
    r->gsize = h.size;
    r->gmember = h.member;
    r->lok = 0; /* a new group: one whole reduction before layers */
    r->gst.size = h.size;
    r->gst.member = h.member;
    /* group.allreduce = auto: a new group times the algorithms again. */
    r->galgo = r->gauto_choice = DS_GREDUCE_DIRECT;
    r->gauto_n = 0;
    memset(r->gauto_cnt, 0, sizeof(r->gauto_cnt)); /* (gauto_ns is read up to these) */
    return 0;
}

/* ---- group.allreduce = auto ---------------------------------------------- */

/* Member 0 decides, every member follows, so the group runs one algorithm
 * per reduction without a message of its own: member 0 puts the next
 * reduction's algorithm in this one (a summed float the others leave at
 * 0: the result says it on every member alike, as it says member 0's
 * step). Member 0 counts its reductions since the group formed: the
 * first AUTO_WARM run direct (connections, first pages), the next
 * 2 AUTO_PROBE alternate direct and the butterfly, one more runs direct
 * while it compares their median times (its own reductions' wall times,
 * complete ones that ran what was asked), and the faster runs until
 * AUTO_EVERY reductions have passed, when the timing starts over. Only
 * those two: in the latency+bandwidth model direct is never dearer than
 * the ring, and the measured ring never beat it (docs/gossip.md). */
#define AUTO_WARM 16u
#define AUTO_PROBE ((uint32_t)DS_AUTO_PROBE)
#define AUTO_EVERY 2000u

static int cmp_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The lower median of algorithm a's timings, in ms (0: none). The
 * median, not the mean: an algorithm's first reductions also pay for its
 * first large frames (fresh pages, grants), which the warm-up's direct
 * reductions did not. */
static double auto_median_ms(rt *r, int a)
{
    const uint32_t n = r->gauto_cnt[a];
    if (!n)
        return 0;
    qsort(r->gauto_ns[a], n, sizeof(uint64_t), cmp_u64);
    return (double)r->gauto_ns[a][(n - 1) / 2] / 1e6;
}

static void auto_choose(rt *r)
{
    const uint32_t nd = r->gauto_cnt[DS_GREDUCE_DIRECT], nb = r->gauto_cnt[DS_GREDUCE_BUTTERFLY];
    const double md = auto_median_ms(r, DS_GREDUCE_DIRECT);
    const double mb = auto_median_ms(r, DS_GREDUCE_BUTTERFLY);
    const int butterfly = nd && nb && mb < md;
    ds_info("group", "group.allreduce auto: %s (median of %u direct reductions %.3f ms, of %u "
            "butterfly %.3f ms)", butterfly ? "butterfly" : "direct", nd, md, nb, mb);
    r->gauto_choice = butterfly ? DS_GREDUCE_BUTTERFLY : DS_GREDUCE_DIRECT;
}

/* Member 0: the algorithm of reduction number n since the group formed. */
static int auto_next(rt *r, uint32_t n)
{
    if (n < AUTO_WARM || n == AUTO_WARM + 2 * AUTO_PROBE)
        return DS_GREDUCE_DIRECT;
    if (n > AUTO_WARM + 2 * AUTO_PROBE)
        return r->gauto_choice;
    return (n - AUTO_WARM) % 2 ? DS_GREDUCE_BUTTERFLY : DS_GREDUCE_DIRECT;
}

/* group.overlap with group.allreduce = auto: the layers' reductions and
 * the step's own pick their algorithm by length from a cost model (group.h,
 * ds_greduce_cost) rather than one for the whole step. */
static int cost_model_on(const rt *r)
{
    return r->lq && r->c->group.allreduce == DS_GROUP_ALLREDUCE_AUTO;
}

/* Floats of the model in a reduction's tail, after `next`: whether to use
 * it, then alpha and beta of direct and of the butterfly. */
#define AUTO_MODEL_FLOATS 5

/* Member 0 in the probe: a complete reduction of `floats` that ran what
 * it was asked (direct or butterfly) took `ns`: a sample for the model. */
static void cost_sample(rt *r, int algo, size_t floats, uint64_t ns)
{
    const int a = algo == DS_GREDUCE_BUTTERFLY ? 1 : algo == DS_GREDUCE_DIRECT ? 0 : -1;
    if (!cost_model_on(r) || r->gmember != 0 || a < 0 || r->gauto_n < AUTO_WARM ||
        r->gauto_n >= AUTO_WARM + 2 * AUTO_PROBE || r->gfit_n[a] >= DS_AUTO_FIT_MAX)
        return;
    r->gfit_x[a][r->gfit_n[a]] = (double)floats;
    r->gfit_y[a][r->gfit_n[a]++] = (double)ns / 1e6;
}

/* Member 0 at the probe's end: the model from its samples. */
static void cost_fit(rt *r)
{
    ds_greduce_cost c;
    if (ds_greduce_fit(r->gfit_x[0], r->gfit_y[0], r->gfit_n[0], &c.alpha_ms[0],
                       &c.beta_ms[0]) < 0 ||
        ds_greduce_fit(r->gfit_x[1], r->gfit_y[1], r->gfit_n[1], &c.alpha_ms[1],
                       &c.beta_ms[1]) < 0)
        return;
    r->gcost_pub = c;
    r->gcost_pub_ok = 1;
    ds_info("group", "group.allreduce auto: cost model from %u direct and %u butterfly "
            "reductions: direct %.3f ms + %.3g ms/float, butterfly %.3f ms + %.3g ms/float "
            "(butterfly from %s)", r->gfit_n[0], r->gfit_n[1], c.alpha_ms[0], c.beta_ms[0],
            c.alpha_ms[1], c.beta_ms[1],
            c.beta_ms[1] >= c.beta_ms[0] && c.alpha_ms[1] < c.alpha_ms[0] ? "small sizes"
            : c.beta_ms[1] < c.beta_ms[0] && c.alpha_ms[1] >= c.alpha_ms[0] ? "large sizes"
            : c.alpha_ms[1] + c.beta_ms[1] < c.alpha_ms[0] + c.beta_ms[0] ? "every size"
                                                                         : "no size");
}

/* Member 0's model into a reduction's tail m (the others write zeros). */
static void cost_publish(rt *r, float *m)
{
    memset(m, 0, AUTO_MODEL_FLOATS * sizeof(float));
    if (r->gmember != 0 || !r->gcost_pub_ok || r->gauto_n < AUTO_WARM + 2 * AUTO_PROBE)
        return;
    m[0] = 1.0f;
    m[1] = r->gcost_pub.alpha_ms[0];
    m[2] = r->gcost_pub.beta_ms[0];
    m[3] = r->gcost_pub.alpha_ms[1];
    m[4] = r->gcost_pub.beta_ms[1];
}

/* Every member takes member 0's model from the reduced tail: the same
 * floats, so the same algorithm for each length everywhere. */
static void cost_take(rt *r, const float *m)
{
    r->gcost_ok = m[0] == 1.0f && m[1] >= 0 && m[2] >= 0 && m[3] >= 0 && m[4] >= 0;
    if (r->gcost_ok)
        r->gcost = (ds_greduce_cost){{m[1], m[3]}, {m[2], m[4]}};
}

/* The algorithm of a reduction of `floats` under auto: the model's once
 * member 0 published one (counted), else the step's (the probe's
 * alternation). Main thread. */
static int auto_algo(rt *r, size_t floats)
{
    if (!cost_model_on(r) || !r->gcost_ok)
        return r->galgo;
    r->gst.model_picks++;
    return (int)ds_greduce_pick(&r->gcost, floats);
}

/* Before a reduction: member 0's choice for the next one, into its slot
 * (the others leave it 0). */
static float auto_publish(rt *r)
{
    if (r->c->group.allreduce != DS_GROUP_ALLREDUCE_AUTO || r->gmember != 0)
        return 0.0f;
    if (r->gauto_n == AUTO_WARM + 2 * AUTO_PROBE) {
        /* The probe's last reduction is timed by now. Fewer than half of
         * either algorithm's reductions complete and as asked (failures
         * ran direct): time them again rather than choose on that. */
        if (2 * r->gauto_cnt[DS_GREDUCE_DIRECT] < AUTO_PROBE ||
            2 * r->gauto_cnt[DS_GREDUCE_BUTTERFLY] < AUTO_PROBE) {
            ds_log_rl(DS_LOG_INFO, "group", "group.allreduce auto: %u direct and %u butterfly "
                      "reductions timed of %u each: timing them again",
                      r->gauto_cnt[DS_GREDUCE_DIRECT], r->gauto_cnt[DS_GREDUCE_BUTTERFLY],
                      AUTO_PROBE);
            memset(r->gauto_cnt, 0, sizeof(r->gauto_cnt));
            memset(r->gfit_n, 0, sizeof(r->gfit_n));
            r->gauto_n = AUTO_WARM - 1; /* the next is the probe's first */
            return (float)(auto_next(r, AUTO_WARM) + 1);
        }
        /* With the model the step's own choice stays for reductions
         * without layers (a device's mirrors). */
        auto_choose(r);
        if (cost_model_on(r))
            cost_fit(r);
    }
    return (float)(auto_next(r, r->gauto_n + 1) + 1);
}

/* After it (e: group_run's return): member 0 times it (in the probe, when
 * complete and run as asked); every member takes what member 0 put in
 * the slot (next, as reduced) as the next reduction's algorithm. */
static void auto_after(rt *r, int e, const ds_greduce_result *res, uint64_t took, float next,
                       size_t floats, const float *model)
{
    if (r->c->group.allreduce != DS_GROUP_ALLREDUCE_AUTO)
        return;
    const uint32_t n = r->gauto_n;
    if (r->gmember == 0 && e == 0 && res->complete && res->ran == r->galgo && n >= AUTO_WARM &&
        n < AUTO_WARM + 2 * AUTO_PROBE) {
        if (r->gauto_cnt[r->galgo] < AUTO_PROBE)
            r->gauto_ns[r->galgo][r->gauto_cnt[r->galgo]++] = took;
    }
    if (cost_model_on(r)) {
        if (e == 0 && res->complete && res->ran == r->galgo)
            cost_sample(r, res->ran, floats, took);
        if (e == 0 && model)
            cost_take(r, model);
    }
    /* 1 or 3: direct or butterfly; anything else (0: member 0's chunk did
     * not come; more: two members took themselves for member 0) keeps
     * the algorithm. */
    if (e == 0 && (next == 1.0f || next == 3.0f))
        r->galgo = (int)next - 1;
    if (++r->gauto_n == AUTO_EVERY) {
        r->gauto_n = AUTO_WARM;
        memset(r->gauto_cnt, 0, sizeof(r->gauto_cnt));
        memset(r->gfit_n, 0, sizeof(r->gfit_n));
    }
}

/* Show the reduction about to run (ds_greduce_run blocks): the members
 * it reduces with (not skipped). Which of them is late is not known from
 * here; the reduction's time is in the group's counters. */
static void show_group_wait(rt *r, const uint8_t *skip)
{
    if (!r->status || r->gsize < 2)
        return;
    ds_status_wait w = {.kind = DS_WAIT_GROUP};
    for (uint32_t k = 0; k < r->gsize; k++) {
        if (k == r->gmember || skip[k])
            continue;
        if (w.n_peers < DS_STATUS_WAIT_PEERS)
            peer_name(r, r->gmembers[k], w.peers[w.n_peers]);
        w.n_peers++;
    }
    ds_status_set_wait(r->status, &w);
}

/* The step's skip verdict for each member of the group into r->gskip
 * (the verdict itself: one not waited for is still sent to, group.h).
 * Returns 1 when a member is in doubt (listed: it missed and has not been
 * heard from since). */
static int group_skips(rt *r, uint64_t round)
{
    int doubt = 0;
    const uint64_t now = ds_now_ms();
    pthread_mutex_lock(&r->skip_lock);
    for (uint32_t k = 0; k < r->gsize; k++) {
        r->gskip[k] = k == r->gmember
                          ? DS_GREDUCE_SKIP_WAIT
                          : (uint8_t)ds_skip_check(&r->skip, r->gmembers[k], round, now);
        doubt |= k != r->gmember && ds_skip_listed(&r->skip, r->gmembers[k]);
    }
    pthread_mutex_unlock(&r->skip_lock);
    return doubt;
}

/* Count a reduction by the algorithm it ran. */
static void count_ran(rt *r, int ran)
{
    if (ran == DS_GREDUCE_BUTTERFLY)
        r->gst.ran_butterfly++;
    else if (ran == DS_GREDUCE_RING)
        r->gst.ran_ring++;
    else
        r->gst.ran_direct++;
}

/* One reduction of the group over r->gvec (n floats, the first n_mean
 * averaged) and the sparse lists sp, tagged with the group's count; until
 * deadline_ns. whole: the mean of the members' whole vectors instead
 * (ds_greduce_mean_all; n_mean == n, no sp), the final sync's. *took_ns:
 * how long it took. */
static int group_run(rt *r, size_t n, size_t n_mean, uint64_t round, uint64_t deadline_ns,
                     const ds_gsparse *sp, int whole, ds_greduce_result *res,
                     uint64_t *took_ns)
{
    uint8_t *skip = r->gskip;
    const int doubt = group_skips(r, round);
    /* A member that missed and has not been heard from since: the ring
     * and the butterfly would wait on it at every step (group.h). */
    if (doubt)
        ds_greduce_direct_once(r->gred);
    const uint64_t t0 = ds_now_ns();
    show_group_wait(r, skip);
    if (r->c->group.allreduce == DS_GROUP_ALLREDUCE_AUTO)
        ds_greduce_set_algo(r->gred, (enum ds_greduce_algo)auto_algo(r, n));
    /* group.overlap: the step's own reduction comes after its layers'. */
    const int bits = r->lq ? DS_LAYER_TAG_BITS : 0;
    const uint64_t tag = bits ? r->gseq << bits | 255u : r->gseq;
    int e = whole ? ds_greduce_mean_all(r->gred, ds_gnet_io(r->gn_grp), r->gvec, n, r->gsize,
                                        r->gmember, skip, tag, deadline_ns, res)
                  : ds_greduce_run(r->gred, ds_gnet_io(r->gn_grp), r->gvec, n, n_mean,
                                   r->gsize, r->gmember, skip, tag, deadline_ns, sp, res);
    ds_status_clear_wait(r->status);
    if (e == 0)
        count_ran(r, res->ran);
    /* Tags: the next count, or a member's if it is ahead (a joiner, or
     * members apart after a miss, meet again so). */
    const uint64_t seen = res->max_tag >> bits;
    r->gseq = seen >= r->gseq + 1 ? seen : r->gseq + 1;
    r->gst.reductions++;
    r->gst.incomplete += e == 0 && !res->complete;
    r->gst.orphaned += e == 0 && res->orphans > 0;
    const uint64_t took = ds_now_ns() - t0;
    *took_ns = took;
    /* With group.overlap the step also waited for its layers: exposed. */
    r->gst.reduce_ns += took + r->lwaited_ns;
    if (r->snap)
        ds_status_times_add(&r->snap->gtimes.reduce, took + r->lwaited_ns);
    r->lwaited_ns = 0;
    if (e == 0 && !res->complete && !res->stopped)
        ds_log_rl(DS_LOG_WARN, "group", "reduction %llu incomplete: %u chunk(s) missing "
                  "(the slices re-sync them)", (unsigned long long)r->gseq - 1,
                  res->chunks_missing);
    return e;
}

/* Copy a client buffer into (or out of) the reduction vector. */
static void pull_into(rt *r, enum ds_engine_buf which, const float *buf, float *dst)
{
    if (r->p.pull)
        r->p.pull(r->p.ctx, which);
    memcpy(dst, buf, r->p.n * sizeof(float));
}

static void push_from(rt *r, enum ds_engine_buf which, float *buf, const float *src)
{
    memcpy(buf, src, r->p.n * sizeof(float));
    if (r->p.push)
        r->p.push(r->p.ctx, which);
}

/* The slice of parameters and momentum a reduction re-syncs: slice
 * gseq mod GROUP_SYNC_SLICES. A member that missed a chunk (or a joiner)
 * is back in step with its group within that many steps. */

static void sync_slice(const rt *r, size_t *off, size_t *len)
{
    const size_t n = r->p.n;
    const size_t per = (n + GROUP_SYNC_SLICES - 1) / GROUP_SYNC_SLICES;
    *off = (size_t)(r->gseq % GROUP_SYNC_SLICES) * per;
    if (*off > n)
        *off = n;
    *len = n - *off < per ? n - *off : per;
}

/* Member 0's step and round0 at v[0..4), 24 bits a float (exact), summed:
 * the others put zeros there. Members apart in steps (a rejoin, a run of
 * misses) take member 0's, so they step alike and end together. */
static void put_position(const rt *r, float *v, int64_t step)
{
    memset(v, 0, 4 * sizeof(float));
    if (r->gmember != 0)
        return;
    v[0] = (float)((uint64_t)step >> 24);
    v[1] = (float)((uint64_t)step & 0xffffff);
    v[2] = (float)(r->round0 >> 24);
    v[3] = (float)(r->round0 & 0xffffff);
}

static void take_position(rt *r, const float *v, int64_t step)
{
    const int64_t step0 = (int64_t)(((uint64_t)v[0] << 24) | (uint64_t)v[1]);
    const uint64_t round0 = ((uint64_t)v[2] << 24) | (uint64_t)v[3];
    if (step0 <= 0 || step0 == step)
        return;
    ds_info("group", "taking member 0's step %lld (was %lld) and round0 %llu", (long long)step0,
            (long long)step, (unsigned long long)round0);
    r->p.adopt(r->p.ctx, step0); /* resets the momentum; the slices re-sync it */
    r->step = step0;
    r->gst.steps_taken++;
    r->round0 = round0;
    /* Our round jumps with the step: not a pace (lag.h). */
    ds_lag_restart(&r->lag, ds_now_ms(), round0 + (uint64_t)(step0 / r->c->gossip.every));
}

_Static_assert((int)DS_GREDUCE_SKIP_NOWAIT == (int)DS_SKIP_NOWAIT &&
                   (int)DS_GREDUCE_SKIP_ALL == (int)DS_SKIP_ALL,
               "group.h's skip values are skip.h's verdicts");

/* This step's sparse list from glist[from]: the nonzeros of the carry
 * (the round deltas not yet sent), their indices plus `base`, up to
 * r->glist_cap pairs in all; those go, the rest wait for the next step (no
 * member applies them before then, so members stay alike, and nothing is
 * lost). Returns how many it took. */
static uint32_t take_list(rt *r, uint32_t from, size_t base)
{
    float *carry = r->gcarry;
    uint32_t k = from;
    for (size_t i = 0; i < r->p.n && k < r->glist_cap; i++)
        if (carry[i] != 0.0f) {
            r->glist_idx[k] = (uint32_t)(i + base);
            r->glist_val[k++] = carry[i];
            carry[i] = 0.0f;
        }
    return k - from;
}

/* group.sparsify = micro or deft: this member's selection with error
 * feedback (docs/gossip.md, "Hierarchy"): its gradient joins its
 * residual, it selects inside what it owns at this reduction (MiCRO:
 * ds_micro_chunk, (gseq + member) mod G; DEFT: the units of its bin,
 * ds_deft_ef_step) into glist[0..), and those entries leave its residual.
 * sq (DEFT, nu floats, may be NULL): this member's squared unit norms for
 * the group's mean; zeros when the selection was refused. Returns the count; 0 when
 * the selection was refused (the gradient then waits in the residual, or
 * was not added). */
static uint32_t group_select(rt *r, int deft, float *sq, size_t nu)
{
    if (r->p.pull)
        r->p.pull(r->p.ctx, DS_ENGINE_GRAD);
    ds_sparsify_result res;
    int e;
    if (deft) {
        if (sq)
            memset(sq, 0, nu * sizeof(float));
        e = ds_deft_ef_step(r->gsp, r->gres, r->p.grad, r->p.n, r->gsize, r->gmember, r->gseq,
                            r->c->group.density, r->glist_idx, r->glist_val, r->glist_cap, sq,
                            &res);
    } else {
        e = ds_micro_ef_step(r->gsp, r->gres, r->p.grad, r->p.n, r->gsize, r->gmember, r->gseq,
                             r->c->group.density, r->glist_idx, r->glist_val, r->glist_cap,
                             &res);
    }
    if (e < 0) {
        ds_log_rl(DS_LOG_WARN, "group", "%s selection refused (%s): nothing sent this step",
                  deft ? "DEFT" : "MiCRO", strerror(-e));
        return 0;
    }
    return (uint32_t)res.count;
}

/* ---- layer reductions (group.overlap) -------------------------------------- */

/* With group.overlap the gradient leaves by layer: as the client's
 * backward writes layer l's gradient (last layer first) it hands it over
 * (ds_engine_layer_ready) and the layer thread reduces that range of
 * p.grad in place, the mean over the group, while backward goes on with
 * the layers below. Layer 0, the last backward writes (nothing runs
 * after it to hide a reduction behind), stays with the step's own
 * reduction (group_reduce), which waits for the other layers (handing
 * over, last first, any the client did not) and reduces layer 0's
 * gradient with the slices, the position and the round deltas: one
 * reduction fewer a step. Adjacent small layers go together (buckets,
 * layer_add). Each bucket is a reduction of its own, tagged with the
 * group's count and its place in the step (DS_LAYER_TAG_BITS), so every
 * member must hand over the same layers in the same order: the order of
 * one backward pass. A step's buckets share one deadline, half of
 * gossip.timeout_ms from the first, inside the step's own (which starts
 * before it waits for them). A bucket that did not complete keeps the
 * member's own values where chunks are missing, as the dense reduction
 * does, and the slices re-sync the members; only the step's own
 * reduction reports a member that did not answer (io->peer_failed:
 * membership, skip windows). With layers reporting too, members of a
 * group of three skipped each other in windows that never lined up after
 * one of them was frozen for 5 s (docs/gossip.md, "Layer by layer"). */

static void layer_run(rt *r, struct ds_ljob *j)
{
    const uint64_t tag = r->lgseq << DS_LAYER_TAG_BITS | j->pos;
    if (r->ldoubt)
        ds_greduce_direct_once(r->gred);
    if (r->c->group.allreduce == DS_GROUP_ALLREDUCE_AUTO)
        ds_greduce_set_algo(r->gred, (enum ds_greduce_algo)j->algo);
    const uint64_t t0 = ds_now_ns();
    /* A member missing here is the step's own reduction's to report
     * (its deadline, its skip windows): a layer only keeps that member's
     * chunk as ours. */
    ds_gossip_io io = *ds_gnet_io(r->gn_grp);
    io.peer_failed = NULL;
    j->e = ds_greduce_run(r->gred, &io, r->p.grad + j->off, j->len, j->len, r->gsize, r->gmember,
                          r->gskip, tag, r->ldeadline_ns, NULL, &j->res);
    j->ns = ds_now_ns() - t0;
    /* Members ahead (a joiner, a miss): the next layer meets them. */
    if (j->e == 0 && j->res.max_tag >> DS_LAYER_TAG_BITS > r->lgseq)
        r->lgseq = j->res.max_tag >> DS_LAYER_TAG_BITS;
}

static void *layer_main(void *arg)
{
    rt *r = arg;
    pthread_setname_np(pthread_self(), "ds-layers");
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (r->lq_done == r->lq_n && !r->stop_threads)
            pthread_cond_wait(&r->cond, &r->lock);
        if (r->stop_threads)
            break;
        struct ds_ljob *j = &r->lq[r->lq_done];
        pthread_mutex_unlock(&r->lock);
        layer_run(r, j);
        pthread_mutex_lock(&r->lock);
        r->lq_done++;
        pthread_cond_broadcast(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* Layer reductions run for this member: the thread is up and p.grad is
 * the gradient itself (with pull and push it is a mirror, copied whole
 * inside ds_engine_reduce: the step reduces it whole there). */
static int layers_on(const rt *r)
{
    return r->lth_up && !r->p.pull;
}

/* The step's first layer: its group, who is not waited for, its
 * deadline. 1: layers go; 0: this step's gradient goes whole with the
 * step's own reduction (no group, or lok is 0).
 *
 * Layers wait for one complete step reduction (lok) since the group
 * formed, and stop after a step whose reduction or layers missed a
 * chunk. The layers' deadline is half a timeout from the member's own
 * first layer, so members apart in time (a first reduction over fresh
 * connections that took longer than that, a freeze) miss each other's
 * layers, start their step reductions apart, miss those too, and stayed
 * so: 3 of 5 runs of 4 members behind 1 Gbit/s links ran every step at
 * the two deadlines (docs/gossip.md, "Layer by layer"). A
 * step reduced whole is the path that brings members back together, as
 * without group.overlap. Members that disagree for a step (one with
 * layers, one without) reduce vectors of different lengths: both miss
 * chunks, both go whole the next step. */
static int layer_open(rt *r, int64_t step)
{
    const uint64_t round = r->round0 + (uint64_t)(step / r->c->gossip.every);
    if (group_at(r, round) < 0 || r->gsize < 2 || !r->lok) {
        r->lopen = -1;
        return 0;
    }
    r->ldoubt = group_skips(r, round);
    r->lgseq = r->gseq;
    r->ldeadline_ns = ds_now_ns() + (uint64_t)r->c->gossip.timeout_ms * 500000u;
    r->lopen = 1;
    return 1;
}

/* A bucket smaller than this (floats: 256 KiB) waits for the layer below
 * it, as PyTorch's DDP fills buckets: each reduction costs two message
 * latencies or more, which a layer of a few thousand floats does not
 * repay. */
#define LAYER_BUCKET_MIN 65536u

/* Hand the bucket of layers gathered so far to the layer thread. */
static void bucket_post(rt *r)
{
    if (!r->lb_len)
        return;
    struct ds_ljob *j = &r->lq[r->lq_n];
    j->off = r->lb_off;
    j->len = r->lb_len;
    j->pos = r->lq_n;
    j->algo = auto_algo(r, j->len);
    r->lb_len = 0;
    pthread_mutex_lock(&r->lock);
    r->lq_n++;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

/* Layer `layer` (>= 1) joins the bucket when it lies just below it in the
 * buffer (one backward pass hands them over so), else starts one; the
 * bucket goes once it is large enough. What is left at the end (layer 1
 * and the small layers above it) rides with layer 0 in the step's own
 * reduction (layer_finish): after layer 1 only layer 0's backward runs,
 * too little to hide a reduction behind, and a reduction of its own would
 * wait behind the layers before it and cost its own latencies. */
static void layer_add(rt *r, int layer)
{
    const ds_layer *l = &r->p.layers[layer];
    r->lsent[layer] = 1;
    if (r->lb_len && l->off + l->len != r->lb_off)
        bucket_post(r);
    r->lb_off = l->off;
    r->lb_len += l->len;
    if (r->lb_len >= LAYER_BUCKET_MIN)
        bucket_post(r);
}

int ds_engine_layer_ready(ds_engine *r, int64_t step, int layer)
{
    if (!layers_on(r) || layer < 0 || layer >= r->p.n_layers)
        return 0;
    if (r->lsent[layer])
        return -EALREADY; /* (also in a step that goes whole) */
    r->lsent[layer] = 1;
    if (r->lopen < 0 || (!r->lopen && !layer_open(r, step)))
        return 0;
    if (layer == 0)
        return 0; /* it goes with the step's reduction */
    layer_add(r, layer);
    return 0;
}

/* Until the layer thread has reduced every bucket handed to it. */
static void layer_wait(rt *r)
{
    pthread_mutex_lock(&r->lock);
    while (r->lq_done < r->lq_n && !r->stop_threads)
        pthread_cond_wait(&r->cond, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

/* In the step's reduction: hand over the layers the client did not (last
 * first; layer 0 is the step's reduction's), wait for all, and count
 * them. Returns the time waited (ns): the layers' exposed part. */
static uint64_t layer_finish(rt *r, size_t *tail)
{
    for (int l = r->p.n_layers - 1; l >= 1; l--)
        if (!r->lsent[l])
            layer_add(r, l);
    /* A last bucket just above layer 0 goes with it (layer_add). */
    *tail = 0;
    if (r->lb_len && r->lb_off == r->p.layers[0].off + r->p.layers[0].len) {
        *tail = r->lb_len;
        r->lb_len = 0;
    }
    bucket_post(r);
    const uint64_t t0 = ds_now_ns();
    layer_wait(r);
    const uint64_t waited = ds_now_ns() - t0;
    uint64_t busy = 0;
    uint32_t missing = 0;
    for (uint32_t i = 0; i < r->lq_done; i++) {
        const struct ds_ljob *j = &r->lq[i];
        busy += j->ns;
        r->gst.layer_reductions++;
        r->gst.orphaned += j->e == 0 && j->res.orphans > 0;
        if (j->e < 0) {
            r->lok = 0;
            continue;
        }
        if (!j->res.complete && !j->res.stopped) {
            r->lok = 0;
            r->gst.incomplete++;
            missing += j->res.chunks_missing;
        } else if (j->res.complete && j->res.ran == j->algo) {
            cost_sample(r, j->algo, j->len, j->ns);
        }
        count_ran(r, j->res.ran);
    }
    if (missing)
        ds_log_rl(DS_LOG_WARN, "group", "layer reductions of count %llu incomplete: %u "
                  "chunk(s) missing (the slices re-sync them)", (unsigned long long)r->lgseq,
                  missing);
    r->gseq = r->lgseq;
    const uint64_t hidden = busy > waited ? busy - waited : 0;
    r->gst.reduce_hidden_ns += hidden;
    if (r->snap)
        ds_status_times_add(&r->snap->gtimes.reduce_hidden, hidden);
    return waited;
}

/* The step is over (every path of group_reduce): the next one starts
 * with no layer handed over. */
static void layer_close(rt *r)
{
    if (!r->lq)
        return;
    pthread_mutex_lock(&r->lock);
    r->lq_n = r->lq_done = 0;
    pthread_mutex_unlock(&r->lock);
    memset(r->lsent, 0, (size_t)r->p.n_layers);
    r->lb_len = 0;
    r->lopen = 0;
}

/* Wait for the layers handed over and not yet reduced, then close the
 * step: a client that handed some over and left the step without
 * dsnode_reduce (a failed step, a stop) must not have the layer thread
 * on gred while the final sync or the close uses it. */
static void layer_drain(rt *r)
{
    layer_wait(r);
    layer_close(r);
}

/* Every step of a node in a group: wait for the round's exchange, then
 * one reduction of
 *
 *   [gradient (n) | params slice | momentum slice | position (4) | next (1)]
 *    mean           mean           mean             member 0's     member 0's
 *
 * with, gathered beside it, each member's round delta as (index, value)
 * pairs, summed in member order. Every member then applies the same mean
 * gradient, the same sum of the members' deltas (each member exchanged its
 * own segments with the other groups) and the same slice of parameters
 * and momentum: members stay identical, and members that differ (a missed
 * chunk, a joiner) are identical again after GROUP_SYNC_SLICES clean
 * steps. One reduction of one length per step: members pair reductions by
 * their count alone. Bounded by gossip.timeout_ms.
 *
 * group.sparsify = micro drops the dense gradient from the vector:
 *
 *   [params slice | momentum slice | position (4) | count (1) | next (1)]
 *    mean           mean             member 0's     summed      member 0's
 *
 * (next: group.allreduce = auto's algorithm for the next reduction,
 * auto_publish) and the gathered list carries, before the member's deltas (indices
 * shifted by n), its MiCRO selection (group_select): the members' chunks
 * are disjoint, so the sum over members is each owner's value, and every
 * member applies that sum / G as the gradient. The summed count steers
 * every member's threshold by the group's total (ds_micro_feedback). Still
 * one reduction of one length per step.
 *
 * group.sparsify = deft selects in the units of the member's bin instead
 * (group_select), and adds its squared unit norms to the averaged part:
 *
 *   [params slice | momentum slice | unit norms^2 (nu) | position (4) | count (1) | next (1)]
 *
 * The mean comes back the same on every member and decides the next
 * step's per-unit k and bins (ds_deft_feedback), so the members' units
 * never overlap without a message of their own.
 *
 * group.overlap (dense): the other layers were reduced by the layer
 * thread (above), so the gradient part is layer 0's only:
 *
 *   [layer 0's gradient | params slice | momentum slice | position (4) | next (1)] */
static void group_reduce(rt *r, int64_t step)
{
    const uint64_t t0 = ds_now_ns();
    const uint64_t round = r->round0 + (uint64_t)(step / r->c->gossip.every);
    const uint64_t timeout_ns = (uint64_t)r->c->gossip.timeout_ms * 1000000u;
    const int was_open = r->round_open;
    ds_engine_settle(r);
    const uint64_t t1 = ds_now_ns();
    r->gst.exchange_wait_ns += t1 - t0;
    if (was_open)
        r->gst.exchange_ns += t1 - r->gexch_t0;
    if (r->snap) {
        ds_status_times_add(&r->snap->gtimes.exchange_exposed, t1 - t0);
        if (was_open)
            ds_status_times_add(&r->snap->gtimes.exchange_hidden,
                                t1 - r->gexch_t0 > t1 - t0 ? (t0 - r->gexch_t0) : 0);
    }
    const size_t n = r->p.n;
    if (r->gpending) {
        /* The round's delta joins what waits to be sent. */
        float *d = ds_gossip_delta(r->gossip);
        for (size_t i = 0; i < n; i++)
            r->gcarry[i] += d[i];
        memset(d, 0, n * sizeof(float));
    }
    /* group.overlap: the layers, if backward handed none over. */
    const int lay = layers_on(r) && (r->lopen == 1 || (r->lopen == 0 && layer_open(r, step)));
    size_t tail = 0; /* the layers above layer 0 that go with it */
    if (lay)
        r->lwaited_ns = layer_finish(r, &tail);
    layer_close(r);
    if (group_at(r, round) < 0 || r->gsize < 2) {
        /* Alone: what waits is ours to apply. */
        memcpy(ds_gossip_delta(r->gossip), r->gcarry, n * sizeof(float));
        memset(r->gcarry, 0, n * sizeof(float));
        if (r->gpending) {
            round_end(r);
        } else {
            ds_gossip_apply(r->gossip, params_host(r));
            params_push(r);
        }
        r->gpending = 0;
        return;
    }
    const int sparse = r->gsp != NULL;
    /* The dense gradient's floats, from g0: all of it, or with
     * group.overlap layer 0's (the others are reduced already). */
    const size_t gn = sparse ? 0 : lay ? r->p.layers[0].len + tail : n;
    const size_t g0 = lay ? r->p.layers[0].off : 0;
    size_t soff, slen;
    sync_slice(r, &soff, &slen);
    const size_t mlen = r->p.opt ? slen : 0;
    const int deft = sparse && ds_sparsifier_method(r->gsp) == DS_SPARSIFY_DEFT;
    size_t nu = deft ? ds_deft_group_units(r->gsp, r->gsize) : 0;
    if (gn + slen + mlen + nu + 6 > ds_hier_vec_len(n))
        nu = 0; /* a model with fewer parameters than units: k by length */
    float *v = r->gvec, *ps = v + gn, *ms = ps + slen, *sq = ms + mlen, *pos = sq + nu;
    float *next = pos + 4 + sparse; /* member 0's algorithm for the next reduction (auto) */
    /* group.overlap with auto: member 0's cost model after it */
    const size_t model = lay && cost_model_on(r) ? AUTO_MODEL_FLOATS : 0;
    uint32_t gk = 0;
    if (sparse)
        gk = group_select(r, deft, nu ? sq : NULL, nu);
    else if (lay)
        memcpy(v, r->p.grad + g0, gn * sizeof(float));
    else
        pull_into(r, DS_ENGINE_GRAD, r->p.grad, v);
    memcpy(ps, params_host(r) + soff, slen * sizeof(float));
    if (mlen) {
        if (r->p.pull)
            r->p.pull(r->p.ctx, DS_ENGINE_OPT);
        memcpy(ms, r->p.opt + soff, mlen * sizeof(float));
    }
    put_position(r, pos, step);
    if (sparse)
        pos[4] = (float)gk;
    *next = auto_publish(r);
    if (model)
        cost_publish(r, next + 1);
    const ds_gsparse sp = {.idx = r->glist_idx, .val = r->glist_val,
                           .count = gk + take_list(r, gk, sparse ? n : 0),
                           .out = sparse ? r->gsout : ds_gossip_delta(r->gossip),
                           .n_out = sparse ? 2 * n : n};
    ds_greduce_result res;
    /* (With group.overlap the wait for the layers, which end at half a
     * timeout from the first, is inside this deadline.) */
    uint64_t deadline = t0 + timeout_ns;
    if (deadline < t1 + 100000000u)
        deadline = t1 + 100000000u;
    uint64_t red_ns = 0;
    const size_t vlen = gn + slen + mlen + nu + 5 + (size_t)sparse + model;
    const int ge = group_run(r, vlen,
                             gn + slen + mlen + nu, round, deadline, &sp, 0, &res, &red_ns);
    auto_after(r, ge, &res, red_ns, *next, vlen, model ? next + 1 : NULL);
    /* The next step's layers: only after a whole step (layer_open). */
    r->lok = ge == 0 && res.complete && (!lay || r->lok);
    if (ge < 0) {
        /* Not sent: what the list held waits for the next step (a
         * selected gradient entry back in the residual, where it was
         * zeroed; the step then applies no gradient: all of it waits). */
        for (uint32_t j = 0; j < gk; j++)
            r->gres[sp.idx[j]] = sp.val[j];
        for (uint32_t j = gk; j < sp.count; j++)
            r->gcarry[sp.idx[j] - (sparse ? n : 0)] += sp.val[j];
        if (sparse) {
            memset(r->p.grad, 0, n * sizeof(float));
            if (r->p.push)
                r->p.push(r->p.ctx, DS_ENGINE_GRAD);
        }
        if (r->gpending) {
            ds_gossip_end(r->gossip, params_host(r));
            ds_rt_round_ended(r);
            params_push(r);
            r->rounds++;
        }
        r->gpending = 0;
        return;
    }
    if (sparse) {
        /* The same sum on every member, the same division. */
        const float G = (float)r->gsize;
        for (size_t i = 0; i < n; i++)
            r->p.grad[i] = r->gsout[i] / G;
        if (r->p.push)
            r->p.push(r->p.ctx, DS_ENGINE_GRAD);
        memcpy(ds_gossip_delta(r->gossip), r->gsout + n, n * sizeof(float));
        if (!deft)
            ds_micro_feedback(r->gsp, (size_t)pos[4]);
        else if (nu)
            ds_deft_feedback(r->gsp, r->gsize, sq, nu);
    } else if (lay) {
        memcpy(r->p.grad + g0, v, gn * sizeof(float));
    } else {
        push_from(r, DS_ENGINE_GRAD, r->p.grad, v);
    }
    take_position(r, pos, step);
    const int mask = sparse && r->p.opt;
    if (mlen || mask) {
        /* One pull and push of the optimizer state for both. */
        if (r->p.pull)
            r->p.pull(r->p.ctx, DS_ENGINE_OPT);
        memcpy(r->p.opt + soff, ms, mlen * sizeof(float));
        /* Momentum factor masking (DGC), after the slice so the slice
         * does not bring back what it zeroes: where the group's sparse
         * gradient has an entry (an owner's accumulated residual, a burst
         * many steps' worth), the momentum restarts from it instead of
         * carrying the burst on for ~1/(1 - momentum) steps. The same
         * indices on every member: members stay identical. Without it a
         * group of 8 went unstable (docs/gossip.md, "Sparse inside a
         * group"). */
        if (mask)
            for (size_t i = 0; i < n; i++)
                if (r->gsout[i] != 0.0f)
                    r->p.opt[i] = 0.0f;
        if (r->p.push)
            r->p.push(r->p.ctx, DS_ENGINE_OPT);
    }
    float *theta = params_host(r);
    memcpy(theta + soff, ps, slen * sizeof(float));
    /* gossip's delta now holds the group's summed delta (sp.out). */
    if (r->gpending) {
        ds_gossip_end(r->gossip, theta);
        ds_rt_round_ended(r);
        r->rounds++;
    } else {
        ds_gossip_apply(r->gossip, theta);
    }
    params_push(r);
    r->gpending = 0;
    const uint64_t took = ds_now_ns() - t0;
    if (took > r->gst.max_wait_ns)
        r->gst.max_wait_ns = took;
}

void ds_engine_reduce(ds_engine *r, int64_t step)
{
    if (in_group(r)) {
        group_reduce(r, step);
        return;
    }
    if (ds_topo_gossips(r->topo))
        return;
    /* AllReduce-SGD: the mean gradient of the view, every step. */
    const uint64_t round = r->round0 + (uint64_t)step;
    if (set_round_view(r, round) != 0) /* 1: alone, nothing to average */
        return;
    if (r->p.pull)
        r->p.pull(r->p.ctx, DS_ENGINE_GRAD);
    if (ds_gossip_allreduce(r->gossip, r->p.grad, r->p.n, round, ds_gnet_io(r->gn)) < 0)
        ds_log_rl(DS_LOG_WARN, "gossip", "all-reduce of step %llu incomplete: "
                  "local gradient used", (unsigned long long)round);
    if (r->p.push)
        r->p.push(r->p.ctx, DS_ENGINE_GRAD);
    r->rounds++;
}

/* ---- state transfer --------------------------------------------------------- */

/* Give a snapshot of our model to the nodes that asked (between steps). */
static void serve_state(rt *r)
{
    ds_state_serve(r->st, params_host(r), (uint64_t)r->step, r->round0, current_round(r),
                   r->lag.rate, r->lag.lag,
                   ds_now_ms() + 4 * (uint64_t)r->c->transport.op_timeout_ms);
}

/* Take a snapshot that arrived: the client's params and step, our rounds
 * and the cluster's pace. */
static int adopt_state(rt *r, const float *theta, const ds_state_info *info, uint64_t t0)
{
    memcpy(r->p.params, theta, r->p.n * sizeof(float));
    int e = r->p.push ? r->p.push(r->p.ctx, DS_ENGINE_PARAMS) : 0;
    if (e < 0)
        return e;
    r->p.adopt(r->p.ctx, (int64_t)info->step);
    r->step = (int64_t)info->step;
    r->round0 = info->round0;
    ds_gossip_reset(r->gossip, theta);
    ds_membership_set_round(atomic_load(&r->ms), info->round, ds_now_ms());
    ds_pace_set(&r->pace, ds_now_ns(), info->round, info->rounds_per_s);
    r->cluster_lag = info->lag_rounds;
    r->state_asked_ms = t0;
    ds_info("state", "model state received: step=%llu round=%llu bytes=%zu in %llu ms; "
            "keeping the cluster's pace of %.1f rounds/s until round %llu",
            (unsigned long long)info->step, (unsigned long long)info->round, info->bytes,
            (unsigned long long)(ds_now_ms() - t0), info->rounds_per_s,
            (unsigned long long)r->join_round);
    return 0;
}

static int pick_member(rt *r, uint64_t before, int same_group_only);

/* The member asked for the state has left or is dead (membership's
 * verdict): its answer will not come. */
static int asked_gone(rt *r)
{
    ds_member_info mi;
    return r->seed_id && ds_membership_member(atomic_load(&r->ms), r->seed_id, &mi) == 0 &&
           (mi.state == DS_MEMBER_LEFT || mi.state == DS_MEMBER_DEAD);
}

/* A late joiner: ask the member that admitted us for its model, step and
 * rounds, and start from them; retry a few times (each retry asks a member
 * in the views before round `before`). */
static int fetch_state(rt *r, int attempts, uint64_t attempt_ms, uint64_t before)
{
    float *theta = malloc(r->p.n * sizeof(float));
    if (!theta)
        return -ENOMEM;
    int e = -ETIMEDOUT;
    for (int attempt = 1; attempt <= attempts && !ds_rt_stop_signal(r); attempt++) {
        /* A retry asks a member alive now (our group's first; in the
         * views before round `before`, as the first was chosen), not the
         * one that failed: a joiner admitted by a cluster that is
         * finishing would otherwise wait out every attempt on a node
         * that has left. None left: the cluster is gone. */
        if (attempt > 1 && !pick_member(r, before, 0)) {
            e = -EHOSTUNREACH;
            break;
        }
        const uint64_t t0 = ds_now_ms();
        const uint64_t deadline = t0 + attempt_ms;
        ds_debug("state", "asking %s for the model state (attempt %d)", r->seed_addr, attempt);
        if ((e = ds_state_request(r->st, r->seed_id, r->seed_addr, deadline)) < 0)
            continue;
        ds_state_info info;
        /* An attempt lasts up to 4 x transport.op_timeout_ms (a model on a
         * slow link), but not past the asked member's leave or death: a
         * joiner admitted by a cluster that was finishing asked a member
         * that exited without answering and waited out the 20 s (CI 46,
         * members_faults/late_joiner_gives_up: n3 ran 20.7 s). */
        int gone = 0;
        do
            e = ds_state_wait(r->st, ds_now_ms() + 200, theta, &info);
        while (e == -ETIMEDOUT && ds_now_ms() < deadline && !ds_rt_stop_signal(r) &&
               !(gone = asked_gone(r)));
        if (e == -ETIMEDOUT && gone) {
            ds_info("state", "%s left the cluster before it sent the state", r->seed_addr);
            continue;
        }
        if (e < 0) {
            ds_warn("state", "state transfer from %s failed: %s", r->seed_addr, strerror(-e));
            continue;
        }
        e = adopt_state(r, theta, &info, t0);
        break;
    }
    free(theta);
    return ds_rt_stop_signal(r) ? -EINTR : e;
}

/* A member to take the state from: alive, in the views before round
 * `before`, other than us, and of our group when we have one and one of
 * it qualifies (design §5: a joiner takes its group's state, so it starts
 * at its group's step). same_group_only: only such a member. 1 when found
 * (r->seed_id, r->seed_addr), else 0. */
static int pick_member(rt *r, uint64_t before, int same_group_only)
{
    ds_membership *ms = atomic_load(&r->ms);
    uint32_t n = 0;
    ds_membership_members(ms, NULL, 0, &n);
    ds_member_info *all = calloc(n ? n : 1, sizeof(*all));
    int found = 0;
    if (all && ds_membership_members(ms, all, n, &n) == 0) {
        const uint32_t start = (uint32_t)(r->rounds % (n ? n : 1));
        for (int pass = in_group(r) ? 0 : 1; pass < (same_group_only ? 1 : 2) && !found; pass++)
            for (uint32_t k = 0; k < n && !found; k++) {
                const ds_member_info *m = &all[(start + k) % n];
                if (m->id == r->id.id || m->state != DS_MEMBER_ALIVE ||
                    m->join_round == DS_MEMBERSHIP_NO_ROUND || m->join_round >= before ||
                    (pass == 0 && strcmp(m->group, r->group) != 0))
                    continue;
                r->seed_id = m->id;
                snprintf(r->seed_addr, sizeof(r->seed_addr), "%s", m->addr);
                found = 1;
            }
    }
    free(all);
    return found;
}

/* ---- start ------------------------------------------------------------------ */

/* With the cluster's state in hand, a joiner need not wait out the full lag
 * the seed gave its join round: bring it forward (lag.h). */
static void advance_join(rt *r)
{
    const uint64_t now = ds_now_ms();
    const uint64_t lag = ds_join_lag_rounds(r->cluster_lag, r->pace.rate,
                                            now > r->state_asked_ms ? now - r->state_asked_ms : 0);
    uint64_t j;
    if (lag && ds_membership_advance_join(atomic_load(&r->ms), (uint32_t)lag, now, &j) == 1)
        r->join_round = j;
}

/* The first round everyone trains in: the latest join round among the
 * members alive now. Every initial member knows the same records once all
 * are alive, so all compute the same round, and all are in its view from
 * the first step (an AllReduce-SGD run must not start with members apart). */
static uint64_t first_round(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    uint32_t n = 0;
    ds_membership_members(ms, NULL, 0, &n);
    ds_member_info *all = calloc(n ? n : 1, sizeof(*all));
    uint64_t first = 0;
    if (all && ds_membership_members(ms, all, n, &n) == 0)
        for (uint32_t i = 0; i < n; i++)
            if (all[i].state == DS_MEMBER_ALIVE && all[i].join_round != DS_MEMBERSHIP_NO_ROUND &&
                all[i].join_round > first)
                first = all[i].join_round;
    free(all);
    return first;
}

int ds_engine_start(ds_engine *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    int e;
    if (r->seed_round > 0) {
        /* The cluster is already training: start from its model (our
         * group's, when the group trains already). */
        r->refresh_pending = 1;
        if (in_group(r) && pick_member(r, UINT64_MAX, 1))
            ds_info("state", "taking the state from %s, of our group %s", r->seed_addr, r->group);
        if ((e = fetch_state(r, 5, 4 * (uint64_t)c->transport.op_timeout_ms, UINT64_MAX)) < 0) {
            snprintf(err, err_len, "cannot join cluster '%s': admitted, but no model state came "
                     "from the cluster (%s); it may have finished", c->cluster.id,
                     e == -EHOSTUNREACH ? "no member left to ask" : strerror(-e));
            return e;
        }
        ds_ckpt_choose(r);
        advance_join(r);
    } else {
        r->round0 = first_round(r);
        ds_info("gossip", "training starts at round %llu with %lld members",
                (unsigned long long)r->round0, (long long)c->cluster.min_members);
    }
    if (r->lq) {
        if ((e = pthread_create(&r->lth, NULL, layer_main, r)) != 0) {
            snprintf(err, err_len, "cannot start the layer reduction thread: %s", strerror(e));
            return -e;
        }
        r->lth_up = 1;
    }
    if (c->gossip.overlap && ds_topo_gossips(r->topo)) {
        if ((e = pthread_create(&r->comm, NULL, comm_main, r)) != 0) {
            snprintf(err, err_len, "cannot start the communication thread: %s", strerror(e));
            return -e;
        }
        r->comm_up = 1;
    }
    return 0;
}

/* ---- between steps ---------------------------------------------------------- */

/* A joiner alone before its join round: do not run ahead of the cluster. */
static void keep_pace(rt *r)
{
    const uint64_t ns = ds_pace_wait_ns(&r->pace, current_round(r), r->join_round, ds_now_ns());
    if (ns) {
        const struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

/* Before our join round (the lag is seconds of rounds) we would train
 * alone, and our solo steps only drift from the cluster's model. So we
 * shadow the cluster instead (shadow.h). 1: shadowed, 0: train now. */
static int shadow(rt *r)
{
    /* Our join round can still move earlier (membership: two admitting
     * members, the smaller round wins). */
    ds_member_info self_info;
    if (ds_membership_member(atomic_load(&r->ms), r->id.id, &self_info) == 0)
        r->join_round = ds_shadow_join_round(r->join_round, self_info.join_round);
    double wait_s;
    if (!ds_shadow_next(&r->pace, current_round(r), r->join_round, ds_now_ns(), &wait_s)) {
        r->refresh_pending = 0;
        ds_info("state", "shadowed the cluster up to step %lld (round %llu); training on to "
                "our join round %llu", (long long)r->step,
                (unsigned long long)current_round(r), (unsigned long long)r->join_round);
        return 0;
    }
    for (double w = 0; w < wait_s && !ds_rt_stop_signal(r); w += 0.05)
        usleep(wait_s - w < 0.05 ? (useconds_t)((wait_s - w) * 1e6) : 50000);
    const int got = ds_rt_stop_signal(r) ? -EINTR : fetch_state(r, 1, 2000, UINT64_MAX);
    if (ds_shadow_fetched(&r->refresh_failures, got == 0)) {
        /* The cluster may be gone (it finished, or we were cut off): go
         * on from the last state we have. */
        ds_warn("state", "no model state for 3 tries: training on alone from step %lld",
                (long long)r->step);
        r->refresh_pending = 0;
    }
    if (ds_state_pending(r->st))
        serve_state(r);
    return 1;
}

/* A member to take the state from after a rejoin: one alive in the view
 * at its own join round, other than us. 0 when there is none. */
static int pick_state_peer(rt *r)
{
    return pick_member(r, r->rejoin_round, 0);
}

/* Declared dead, or stopped past the suspicion timeout: our model is stale
 * and we are out of the views until our new join round. As a fresh joiner
 * does: fetch the cluster's state (model, step, rounds), then shadow it
 * until the join round. Our stale parameters never reach a partner: we are
 * in no view before the join round, and by then they are replaced. */
static void start_rejoin(rt *r)
{
    pthread_mutex_lock(&r->lock);
    const int pending = r->rejoin_pending;
    const uint64_t join_round = r->rejoin_round;
    r->rejoin_pending = 0;
    pthread_mutex_unlock(&r->lock);
    if (!pending || r->leaving)
        return;
    ds_engine_settle(r);
    r->join_round = join_round;
    r->refresh_pending = 1;
    r->refresh_failures = 0;
    r->rejoins++;
    if (!pick_state_peer(r)) {
        ds_warn("state", "rejoining at round %llu: no member to take the state from yet",
                (unsigned long long)join_round);
        return;
    }
    ds_info("state", "rejoining at round %llu: taking the state from %s",
            (unsigned long long)join_round, r->seed_addr);
    if (fetch_state(r, 3, 2 * (uint64_t)r->c->transport.op_timeout_ms, r->join_round) < 0)
        ds_warn("state", "no state from %s yet: shadowing retries", r->seed_addr);
}

int ds_engine_before_step(ds_engine *r)
{
    start_rejoin(r);
    keep_pace(r);
    return r->refresh_pending ? shadow(r) : 0;
}

/* Changes (joins, leaves, deaths) apply lag rounds after they are decided
 * (lag.h). */
static void update_lag(rt *r)
{
    if (ds_lag_update(&r->lag, ds_now_ms(), atomic_load(&r->cur_round))) {
        ds_membership_set_lag(atomic_load(&r->ms), (uint32_t)r->lag.lag);
        ds_debug("membership", "lag %llu rounds (%.1f rounds/s)", (unsigned long long)r->lag.lag,
                 r->lag.rate);
    }
}

void ds_engine_step(ds_engine *r, int64_t step)
{
    const int64_t every = r->c->gossip.every;
    r->step = step;
    r->steps_here++;
    ds_engine_settle(r);
    if (ds_topo_gossips(r->topo) && step % every == 0 &&
        round_begin(r, r->round0 + (uint64_t)(step / every)) == 0) {
        r->gexch_t0 = ds_now_ns();
        ds_round_clock_tick(&r->rclock, r->round0 + (uint64_t)(step / every), r->gexch_t0);
        if (r->comm_up) {
            comm_start(r);
            r->round_open = 1;
        } else {
            ds_gossip_exchange(r->gossip, ds_gnet_io(r->gn));
            if (in_group(r))
                r->gpending = 1; /* summed with the group's at the next step */
            else
                round_end(r);
        }
    }
    if (ds_state_pending(r->st))
        serve_state(r);
    if (!r->leaving)
        update_lag(r);
}

/* ---- leaving ----------------------------------------------------------------- */

/* Does any other member still count on us (leave.h)? */
static int others_count_on_us(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    uint32_t n = 0;
    ds_membership_members(ms, NULL, 0, &n);
    ds_member_info *all = calloc(n ? n : 1, sizeof(*all));
    int any = !all; /* when in doubt, linger */
    if (all && ds_membership_members(ms, all, n, &n) == 0)
        any = ds_leave_others_count_on_us(all, n, r->id.id);
    free(all);
    return any;
}

/* Announce a graceful leave, effective lag rounds from now (design §6):
 * every node drops us from its view at that same round, and until then we
 * keep taking part in the rounds. */
static void announce_leave(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    uint64_t eff;
    if (r->leaving || !ms || ds_membership_leave(ms, ds_now_ms(), &eff) < 0)
        return;
    r->leaving = 1;
    r->leave_round = eff;
    ds_info("membership", "leaving: effective at round %llu", (unsigned long long)eff);
}

/* One round while lingering, without training. 0, or -ENOMEM. */
static int linger_round(rt *r, uint64_t round, float **zero)
{
    if (ds_topo_gossips(r->topo)) {
        if (round_begin(r, round) == 0) {
            ds_gossip_exchange(r->gossip, ds_gnet_io(r->gn));
            /* In a group, members could not sum this delta in step (they
             * no longer train): the rounds serve the partners but leave
             * the model as the group's last step made it. */
            if (in_group(r))
                memset(ds_gossip_delta(r->gossip), 0, r->p.n * sizeof(float));
            round_end(r);
        }
    } else if (set_round_view(r, round) == 0) {
        /* AllReduce: contribute a zero gradient (the others' mean is
         * scaled by (G-1)/G for these last rounds: documented). */
        if (!*zero && !(*zero = calloc(r->p.n, sizeof(float))))
            return -ENOMEM;
        memset(*zero, 0, r->p.n * sizeof(float));
        ds_gossip_allreduce(r->gossip, *zero, r->p.n, round, ds_gnet_io(r->gn));
    }
    return 0;
}

/* Wait for l->next_round's time at lingering's pace, in slices that
 * watch for a second stop signal. 1: run the round; 0: stop lingering.
 * The others' leaves are checked after each round only (leave.h). */
static int linger_wait(rt *r, const ds_linger *l)
{
    for (;;) {
        uint64_t ns = ds_linger_wait_ns(l, ds_now_ns());
        if (!ns)
            return 1;
        if (!ds_linger_more(l, ds_rt_stop_count(r), ds_now_ms()))
            return 0;
        if (ns > 20000000u)
            ns = 20000000u;
        const struct timespec ts = {0, (long)ns};
        nanosleep(&ts, NULL);
    }
}

/* Training is over (or stopped) but our leave is not effective yet: keep
 * taking part in the rounds, without training, until it is -- the others
 * still count on us (leave.h). */
static void linger(rt *r)
{
    announce_leave(r);
    ds_linger l;
    if (!ds_linger_start(&l, r->leaving, ds_rt_stop_signal(r), current_round(r), r->leave_round,
                         ds_now_ms()))
        return;
    /* At the pace training had, never faster (leave.h), from now: the
     * time since the last training round (a final evaluation, the
     * checkpoint) is not rounds owed. */
    uint64_t last_round = 0, last_ns = 0;
    const uint64_t pace = ds_round_clock_pace(
        &r->rclock, (uint64_t)r->c->gossip.timeout_ms * 1000000u, &last_round, &last_ns);
    ds_linger_pace(&l, l.next_round, ds_now_ns(), pace);
    float *zero = NULL;
    if (l.next_round < l.leave_round)
        ds_info("membership", "taking part in rounds %llu..%llu until the leave takes effect, "
                "one per %.1f ms at most (training's pace)",
                (unsigned long long)l.next_round, (unsigned long long)l.leave_round - 1,
                (double)pace / 1e6);
    for (; ds_linger_more(&l, ds_rt_stop_count(r), ds_now_ms()); l.next_round++) {
        if (!linger_wait(r, &l))
            break;
        if (linger_round(r, l.next_round, &zero) < 0)
            break;
        /* Checked after the round, not before (leave.h). */
        if (!others_count_on_us(r)) {
            ds_info("membership", "every other member is leaving too: done after round %llu",
                    (unsigned long long)l.next_round);
            break;
        }
    }
    free(zero);
}

/* Let the leave spread; flush what we still send. */
static void leave_and_drain(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    const uint64_t until = ds_leave_drain_until(ds_rt_stop_signal(r), ds_now_ms());
    announce_leave(r);
    if (r->leaving) {
        ds_membership_set_round(ms, r->leave_round, ds_now_ms());
        while (!ds_membership_leave_done(ms) && ds_now_ms() < until)
            usleep(20000);
        ds_info("membership", "left the cluster at round %llu", (unsigned long long)r->leave_round);
    }
    /* Give the transport time to deliver the last replies. */
    while (ds_now_ms() < until) {
        ds_net_stats st;
        ds_net_stats_get(r->net, &st);
        if (st.transport.queued_bytes == 0 && st.pending_frames == 0)
            break;
        usleep(10000);
    }
}

/* ds_engine_final_sync: training is over in a group: one last reduction of the parameters
 * themselves, their mean, so that the members end as one model even when
 * a reduction of the last GROUP_SYNC_SLICES steps missed a chunk (a
 * member stalled past the deadline, or skipped by one member and not by
 * the other), which the slices had no steps left to re-sync. Members that
 * are alike stay so (the same sum on every member; with two the mean is
 * exact). The snapshot moves with theta, so the lingering rounds do not
 * send the change as a drift. Not when stopped (no waiting then); a
 * member that does not come costs one deadline, as any reduction. Not a
 * step: the group's step counters and max_wait are left alone. The client
 * calls it (engine.h), and not when its training failed. */
void ds_engine_final_sync(ds_engine *r)
{
    layer_drain(r);
    if (!in_group(r) || r->gsize < 2 || !r->gred || ds_rt_stop_signal(r))
        return;
    const size_t n = r->p.n;
    float *theta = params_host(r);
    memcpy(r->gvec, theta, n * sizeof(float));
    const uint64_t deadline = ds_now_ns() + (uint64_t)r->c->gossip.timeout_ms * 1000000u;
    ds_greduce_result res;
    uint64_t took = 0;
    /* The whole vectors when they fit (the same choice on every member:
     * it depends on the group's size and the model's only): no member
     * owns a part, so a member that died and is still in the view costs
     * nothing of the result, where direct left its chunk as each member's
     * own and the survivors ended a few 1e-7 apart (CI 56). */
    const int whole = (size_t)r->gsize * n <= DS_GREDUCE_WHOLE_MAX;
    const int e = group_run(r, n, n, current_round(r), deadline, NULL, whole, &res, &took);
    if (e < 0)
        return;
    /* Not through gossip's delta and ds_gossip_apply: the delta may hold
     * the last round's, pending, which no member applies. */
    float *snap = ds_gossip_snap_mut(r->gossip);
    for (size_t i = 0; i < n; i++) {
        const float d = r->gvec[i] - theta[i];
        theta[i] = r->gvec[i];
        snap[i] += d;
    }
    params_push(r);
    if (res.complete)
        ds_info("group", "final sync: the members' parameters averaged (%u members)",
                r->gsize);
    else if (whole)
        ds_warn("group", "final sync: the parameters of %u of %u members averaged (the "
                "others did not come, or are held dead); members that had the same ones "
                "hold the same parameters", res.contributions, r->gsize);
    else
        ds_warn("group", "final sync incomplete: %u chunk(s) missing; this member's "
                "parameters may differ from its group's", res.chunks_missing);
}

void ds_engine_leave(ds_engine *r)
{
    layer_drain(r);
    linger(r);
    leave_and_drain(r);
}
