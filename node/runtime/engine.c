/*
 * node/runtime/engine.c: the engine's life outside the rounds: open (keys,
 * settings), register (the gossip engine over the client's layers), listen
 * (endpoint, adapters, status), join (found or join, wait for the
 * cluster), close; and what the other threads call into: the net worker's
 * frames and events, membership's sends and events, and the failure
 * detector's thread. rounds.c holds the rounds and the policies that run
 * between training steps. See engine.h for the API, engine_impl.h for the
 * state and its locks.
 *
 * Start: the node opens its endpoint, then founds the cluster when it has
 * no seeds or its own address is the first seed, else joins through the
 * seeds (retrying with backoff). It trains once cluster.min_members members
 * are alive. A member enters the gossip view at the effective round its
 * join was given, the same round on every node (node/membership/membership.h).
 *
 * Skips: what the network, gossip and membership say about a peer goes to
 * the skip table (skip.h) here, under skip_lock, from whichever thread
 * says it; rounds.c reads the table when it sets up a round's view.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/hostport.h"
#include "node/runtime/engine_impl.h"
#include "node/runtime/preflight.h"
#include "node/runtime/publish.h"
#include "node/transport/transport.h"
#include "kernels/kernels.h"
#include "topology/topology.h"

/* Neither stop request made: for a client that passes none. */
static const atomic_int never;

void ds_rt_timed_wait(rt *r, uint64_t until_ms)
{
    const struct timespec ts = {(time_t)(until_ms / 1000), (long)(until_ms % 1000) * 1000000L};
    pthread_cond_timedwait(&r->cond, &r->lock, &ts);
}

/* ---- settings ------------------------------------------------------------ */

/* The conf keys that name a choice (security.mode, gossip.mix,
 * gossip.topology, sparsify.method; parsed once, by conf/) into the
 * settings the engine's parts take. */
static void settings_from_conf(rt *r)
{
    const ds_conf *c = r->c;
    r->mode = c->security.mode;
    r->gcfg = (ds_gossip_cfg){
        .topology = c->gossip.topology,
        .mix = c->gossip.mix,
        .method = c->sparsify.method,
        .weight = (float)c->gossip.weight,
        .segments = (int)c->gossip.segments,
        .density = c->sparsify.density,
        .error_feedback = c->sparsify.error_feedback,
        .value_format = c->sparsify.value_format,
        .threshold = (float)c->sparsify.threshold,
        .seed = (uint64_t)c->cluster.seed,
        .node_seed = ds_rng_hash_str((uint64_t)c->cluster.seed ^ 0x73707273ull, c->node.name),
        .timeout_ms = (int)c->gossip.timeout_ms,
        .min_wait_ms = (int)c->gossip.min_wait_ms,
    };
    r->topo = r->gcfg.topology;
    /* A peer that cost a full deadline is not waited for again before as
     * long has passed (skip.h). */
    r->skip.min_ms = (uint32_t)c->gossip.timeout_ms;
}

/* ---- peers not waited for (skip.h) ------------------------------------- */

static void note_new(int fresh, uint64_t id)
{
    if (fresh == 1)
        ds_debug("gossip", "peer %016llx unresponsive: not waited for", (unsigned long long)id);
}

/* A missed deadline in the current round: skip.h's window. */
static void peer_missed(rt *r, uint64_t id, int hard)
{
    pthread_mutex_lock(&r->skip_lock);
    const int fresh = ds_skip_missed(&r->skip, id, atomic_load(&r->cur_round), ds_now_ms(),
                                     hard);
    pthread_mutex_unlock(&r->skip_lock);
    note_new(fresh, id);
}

/* A membership verdict: until heard from. */
static void peer_hold(rt *r, uint64_t id)
{
    pthread_mutex_lock(&r->skip_lock);
    const int fresh = ds_skip_hold(&r->skip, id);
    pthread_mutex_unlock(&r->skip_lock);
    note_new(fresh, id);
}

static void peer_heard(rt *r, uint64_t id)
{
    pthread_mutex_lock(&r->skip_lock);
    ds_skip_heard(&r->skip, id);
    pthread_mutex_unlock(&r->skip_lock);
}

/* ---- callbacks from the net worker and membership ----------------------- */

static void heard_hook(void *ctx, uint64_t id)
{
    peer_heard(ctx, id);
}

static void gossip_failed_hook(void *ctx, uint64_t id)
{
    rt *r = ctx;
    ds_membership *ms = atomic_load(&r->ms);
    if (ms)
        ds_membership_hint(ms, id, ds_now_ms());
    peer_missed(r, id, 0);
}

/* A peer ran a round with another view than ours: one of us has not heard
 * of a change yet (a heal: the other side's refutations, or a join).
 * Membership probes it early (at most once a period): the PING and the ACK
 * carry each side's recent records. After a 2|2 heal a member learned of
 * the other side 1.3 s after its own partner did, dropping that partner's
 * frames as "other view epoch" the whole time (docs/membership.md). */
static void view_differs_hook(void *ctx, uint64_t id)
{
    rt *r = ctx;
    ds_membership *ms = atomic_load(&r->ms);
    if (ms)
        ds_membership_hint(ms, id, ds_now_ms());
}

static void on_net_recv(void *ctx, ds_net_rx *rx)
{
    rt *r = ctx;
    const unsigned type = rx->hdr.type;
    if (type == DS_MSG_ALLREDUCE && atomic_load(&r->gn_grp_ready)) {
        ds_gnet_on_frame(r->gn_grp, rx); /* our group's reductions */
        return;
    }
    if (ds_gnet_handles(type)) {
        if (atomic_load(&r->gn_ready))
            ds_gnet_on_frame(r->gn, rx);
        return;
    }
    if (type == DS_MSG_STATE_REQ || type == DS_MSG_STATE_CHUNK) {
        if (atomic_load(&r->st_ready)) {
            if (type == DS_MSG_STATE_REQ)
                ds_state_on_req(r->st, rx);
            else
                ds_state_on_chunk(r->st, rx);
        }
        return;
    }
    ds_membership *ms = atomic_load(&r->ms);
    if (type >= DS_MSG_PING && type <= DS_MSG_LEAVE) {
        if (ms)
            (void)ds_membership_recv(ms, ds_now_ms(), rx->addr, rx->frame, rx->len);
        return;
    }
    ds_log_rl(DS_LOG_INFO, "net", "dropped %s from %s: not handled by this node",
              ds_msg_type_name(type), rx->name);
}

static void on_net_event(void *ctx, const ds_net_event *ev)
{
    rt *r = ctx;
    ds_membership *ms = atomic_load(&r->ms);
    switch (ev->kind) {
    case DS_NET_EV_PEER_UP:
        ds_debug("net", "session up with %s (%s)", ev->name, ev->addr);
        break;
    case DS_NET_EV_HANDSHAKE_FAILED:
        ds_log_rl(DS_LOG_WARN, "net", "handshake with %s %s failed: %s", ev->name, ev->addr,
                  strerror(-ev->status));
        if (ev->status == -EACCES) {
            pthread_mutex_lock(&r->lock);
            if (!r->joined) {
                r->refused = 1;
                snprintf(r->refused_by, sizeof(r->refused_by), "%s", ev->addr);
                pthread_cond_broadcast(&r->cond);
            }
            pthread_mutex_unlock(&r->lock);
        }
        break;
    case DS_NET_EV_PEER_REVOKED:
        /* Its key left the allow-list: not waited for, and membership
         * probes it now (the probe is refused, so it is declared dead). */
        ds_warn("net", "%s %s removed from the allow-list: session closed", ev->name, ev->addr);
        /* fall through */
    case DS_NET_EV_PEER_UNRESPONSIVE:
        if (ms && ev->peer)
            ds_membership_hint(ms, ev->peer, ds_now_ms());
        if (ev->peer)
            peer_missed(r, ev->peer, 1);
        break;
    case DS_NET_EV_PEER_RESPONSIVE:
        /* Not evidence enough to wait for it again: a send "completes" as
         * soon as the kernel takes it, even to a frozen process. Only a
         * frame from the peer itself (heard_hook) or membership's verdict
         * brings it back. */
        break;
    case DS_NET_EV_RESET:
        ds_warn("net", "transport endpoint reset (%d stuck operations discarded)", ev->status);
        break;
    }
}

static void ms_send(void *ctx, uint64_t to_id, const char *to_addr, const uint8_t *frame,
                    size_t len)
{
    rt *r = ctx;
    const ds_net_send_opts o = {.deadline_ms =
                                    ds_now_ms() + (uint64_t)r->c->transport.op_timeout_ms};
    int e = ds_net_send_frame(r->net, to_id, to_addr, frame, len, &o);
    if (e < 0)
        ds_debug("membership", "send to %s failed: %s", to_addr ? to_addr : "?", strerror(-e));
}

static void ms_self_joined(rt *r, const ds_membership_event *ev)
{
    const ds_member_info *m = &ev->member;
    ds_info("membership", "joined through %s: %u members, their round %llu, our join round %llu",
            m->name, ev->view_size, (unsigned long long)ev->round,
            (unsigned long long)ev->join_round);
    pthread_mutex_lock(&r->lock);
    r->joined = 1;
    r->seed_id = m->id;
    snprintf(r->seed_addr, sizeof(r->seed_addr), "%s", m->addr);
    r->seed_round = ev->round;
    r->join_round = ev->join_round;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

static void ms_join_failed(rt *r, const ds_membership_event *ev)
{
    pthread_mutex_lock(&r->lock);
    r->join_failed = 1;
    if (ev->finishing >= ev->n_seeds)
        snprintf(r->join_failed_why, sizeof(r->join_failed_why),
                 "cluster finishing: all %u seed(s) are leaving; nothing to join", ev->n_seeds);
    else
        snprintf(r->join_failed_why, sizeof(r->join_failed_why),
                 "no seed let this node in within cluster.join_timeout_s=%lld (%u JOIN "
                 "attempts; %u of %u seeds answered \"cluster finishing\")",
                 (long long)r->c->cluster.join_timeout_s, ev->attempt, ev->finishing,
                 ev->n_seeds);
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

/* Queue membership's news about a member for the status timeline
 * (membership's thread; ds_engine_publish moves it into the snapshot). */
static void note_event(rt *r, enum ds_status_event_kind kind, const ds_membership_event *ev,
                       int with_round)
{
    if (!r->status)
        return;
    ds_status_event e = {.kind = (uint8_t)kind,
                         .unix_ms = ds_unix_ms(),
                         .round = atomic_load(&r->cur_round),
                         .effective_round = with_round && ev->round != DS_MEMBERSHIP_NO_ROUND
                                                ? ev->round
                                                : UINT64_MAX};
    snprintf(e.member, sizeof(e.member), "%s", ev->member.name);
    pthread_mutex_lock(&r->ev_lock);
    ds_status_events_add(&r->evq, &e);
    pthread_mutex_unlock(&r->ev_lock);
}

static void ms_event(void *ctx, const ds_membership_event *ev)
{
    rt *r = ctx;
    const ds_member_info *m = &ev->member;
    static const uint8_t kinds[] = {
        [DS_MEV_MEMBER_JOINED] = DS_EV_JOINED, [DS_MEV_MEMBER_SUSPECTED] = DS_EV_SUSPECT,
        [DS_MEV_MEMBER_ALIVE] = DS_EV_ALIVE,   [DS_MEV_MEMBER_DEAD] = DS_EV_DEAD,
        [DS_MEV_MEMBER_LEFT] = DS_EV_LEFT,
    };
    if ((unsigned)ev->kind < sizeof(kinds) && kinds[ev->kind])
        note_event(r, (enum ds_status_event_kind)kinds[ev->kind], ev,
                   ev->kind != DS_MEV_MEMBER_SUSPECTED && ev->kind != DS_MEV_MEMBER_ALIVE);
    switch (ev->kind) {
    case DS_MEV_MEMBER_JOINED:
        ds_info("membership", "member joined name=%s addr=%s round=%lld", m->name, m->addr,
                ev->round == DS_MEMBERSHIP_NO_ROUND ? -1LL : (long long)ev->round);
        peer_heard(r, m->id);
        break;
    case DS_MEV_MEMBER_SUSPECTED:
        ds_info("membership", "member suspected name=%s", m->name);
        peer_hold(r, m->id);
        break;
    case DS_MEV_MEMBER_ALIVE:
        ds_info("membership", "member alive again name=%s incarnation=%u", m->name,
                m->incarnation);
        peer_heard(r, m->id);
        break;
    case DS_MEV_MEMBER_DEAD:
        peer_hold(r, m->id);
        ds_warn("membership", "member dead name=%s removal_round=%llu", m->name,
                (unsigned long long)ev->round);
        break;
    case DS_MEV_MEMBER_LEFT:
        /* Gone for good, or lingering until its leave applies: either way
         * nobody waits for it; what it still sends is served. */
        peer_hold(r, m->id);
        ds_info("membership", "member left name=%s removal_round=%llu", m->name,
                (unsigned long long)ev->round);
        break;
    case DS_MEV_VIEW_CHANGED:
        ds_info("membership", "view changed round=%llu epoch=%llu size=%u in_view=%d",
                (unsigned long long)ev->round, (unsigned long long)ev->epoch, ev->view_size,
                ev->in_view);
        break;
    case DS_MEV_SELF_JOINED:
        ms_self_joined(r, ev);
        break;
    case DS_MEV_JOIN_RETRY:
        /* Nodes started together race the founder: the first few retries
         * are expected; say so at warn only when it goes on. */
        ds_log(ev->attempt <= 4 ? DS_LOG_INFO : DS_LOG_WARN, "membership",
               "no reachable seed yet: trying %s next (attempt %u)", m->addr, ev->attempt);
        break;
    case DS_MEV_JOIN_FINISHING:
        ds_warn("membership", "seed %s answers: cluster finishing (it is leaving; %u of %u "
                "seeds so far)", m->addr, ev->finishing, ev->n_seeds);
        break;
    case DS_MEV_JOIN_FAILED:
        ms_join_failed(r, ev);
        break;
    case DS_MEV_SELF_REFUTED:
        ds_warn("membership", "suspected by peers: refuted with incarnation %u", m->incarnation);
        break;
    case DS_MEV_SELF_REJOINED:
        ds_warn("membership", "out of the view from round %llu: rejoining at round %llu with "
                "the cluster's state", (unsigned long long)ev->round,
                (unsigned long long)ev->join_round);
        pthread_mutex_lock(&r->lock);
        r->rejoin_pending = 1;
        r->rejoin_round = ev->join_round;
        pthread_mutex_unlock(&r->lock);
        break;
    }
}

/* The failure detector: SWIM timers, on their own thread. */
static void *fd_main(void *arg)
{
    rt *r = arg;
    pthread_setname_np(pthread_self(), "ds-membership");
    ds_membership *ms = atomic_load(&r->ms);
    pthread_mutex_lock(&r->lock);
    while (!r->stop_threads) {
        pthread_mutex_unlock(&r->lock);
        const uint64_t now = ds_now_ms();
        ds_membership_tick(ms, now);
        uint64_t next = ds_membership_next_deadline(ms);
        if (next > now + 50)
            next = now + 50;
        pthread_mutex_lock(&r->lock);
        if (!r->stop_threads && next > ds_now_ms())
            ds_rt_timed_wait(r, next);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* The comm thread and the failure detector. */
static void stop_threads(rt *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop_threads = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    if (r->comm_up)
        pthread_join(r->comm, NULL);
    if (r->lth_up)
        pthread_join(r->lth, NULL);
    r->lth_up = 0;
    if (r->fd_up)
        pthread_join(r->fd, NULL);
    r->comm_up = r->fd_up = 0;
}

/* ---- open ----------------------------------------------------------------- */

/* Put the config key in front of the error of the file it names. */
static int key_error(const char *key, int e, char *err, size_t err_len)
{
    char what[1024];
    snprintf(what, sizeof(what), "%s", err);
    snprintf(err, err_len, "%s: %.*s", key, (int)(sizeof(what) - 64), what);
    return e;
}

static int load_keys(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    int e;
    if (c->cluster.identity_file[0]) {
        if ((e = ds_identity_load(&r->id, c->cluster.identity_file, err, err_len)) < 0)
            return key_error("cluster.identity_file", e, err, err_len);
    } else {
        if ((e = ds_identity_generate(&r->id)) < 0) {
            snprintf(err, err_len, "cannot generate an identity");
            return e;
        }
        ds_info("security", "no cluster.identity_file: using a fresh identity for this run");
    }
    if (c->cluster.key_file[0]) {
        if ((e = ds_cluster_key_load(&r->ck, c->cluster.key_file, err, err_len)) < 0)
            return key_error("cluster.key_file", e, err, err_len);
        r->have_ck = 1;
    }
    if (c->cluster.allowed_keys[0] &&
        (e = ds_allowlist_load(&r->allow, c->cluster.allowed_keys, err, err_len)) < 0)
        return key_error("cluster.allowed_keys", e, err, err_len);
    if (!r->have_ck && !r->allow) {
        /* No admission policy: this node admits nobody (an empty
         * allow-list), which is right for a node alone and said loudly
         * for anything else. */
        if ((e = ds_allowlist_parse(&r->allow, "", 0, "(none)", err, err_len)) < 0)
            return e;
        if (c->cluster.seeds_count > 0 || c->cluster.min_members > 1)
            ds_warn("security", "neither cluster.key_file nor cluster.allowed_keys is set: no "
                    "peer can be admitted");
    }
    return 0;
}

/* node.group, with "auto" resolved to the host name (cut to the wire's
 * 31 bytes, which the log says). */
static int resolve_group(rt *r)
{
    const char *g = r->c->node.group;
    if (strcmp(g, "auto") != 0) {
        snprintf(r->group, sizeof(r->group), "%.31s", g);
        return 0;
    }
    char host[256];
    if (gethostname(host, sizeof(host)) < 0 || !host[0]) {
        ds_error("node", "cannot start: node.group = auto: no host name");
        return -EINVAL;
    }
    host[sizeof(host) - 1] = 0;
    if (strlen(host) >= sizeof(r->group))
        ds_warn("node", "node.group = auto: host name '%s' cut to its first %zu bytes", host,
                sizeof(r->group) - 1);
    memcpy(r->group, host, sizeof(r->group) - 1);
    r->group[sizeof(r->group) - 1] = 0;
    ds_info("node", "node.group = auto: group %s", r->group);
    return 0;
}

int ds_engine_open(ds_engine **out, const ds_conf *c, const ds_engine_stop *stop)
{
    char err[1024];
    int e;
    *out = NULL;
    rt *r = calloc(1, sizeof(*r));
    if (!r) {
        ds_error("node", "cannot start: out of memory");
        return -ENOMEM;
    }
    r->c = c;
    r->stop.signal = stop && stop->signal ? stop->signal : &never;
    r->stop.count = stop && stop->count ? stop->count : &never;
    r->stop.reload = stop ? stop->reload : NULL;
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->skip_lock, NULL);
    pthread_mutex_init(&r->ev_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (ds_crypto_init() < 0) {
        ds_error("security", "libsodium failed to initialise");
        e = -EIO;
        goto fail;
    }
    if ((e = load_keys(r, err, sizeof(err))) < 0) {
        ds_error("node", "cannot start: %s", err);
        goto fail;
    }
    settings_from_conf(r);
    if ((e = resolve_group(r)) < 0)
        goto fail;
    r->gst.size = 1;
    /* libfabric loads, initialises and opens the endpoint on a thread of
     * its own while the client loads its data, so a joiner is in the view
     * that much sooner (docs/benchmarks.md, "Start-up"). ds_engine_listen
     * takes the endpoint over: the same provider, address and default
     * peer count. Once per process (a second engine opens its own). */
    ds_transport_opts warm;
    ds_transport_opts_default(&warm);
    warm.provider = c->transport.provider;
    warm.listen = c->node.listen;
    ds_transport_warm(&warm);
    *out = r;
    return 0;
fail:
    ds_engine_close(&r);
    return e;
}

void ds_engine_signals_lock(void)
{
    ds_transport_signals_lock();
}

void ds_engine_signals_unlock(void)
{
    ds_transport_signals_unlock();
}

/* ---- register --------------------------------------------------------------- */

int ds_engine_register(ds_engine *r, const ds_engine_params *p)
{
    if (r->registered || !p || !p->params || !p->grad || !p->layers || !p->adopt ||
        !p->pull != !p->push || (p->add && !p->pull))
        return -EINVAL;
    /* gossip.segments is bounded statically by conf/; the model's size is
     * known only now, and is checked before gossip reserves a segment. */
    if ((uint64_t)r->c->gossip.segments > p->n) {
        ds_error("node", "cannot start: gossip.segments: expected at most the model's %zu "
                 "parameters, found %lld", p->n, (long long)r->c->gossip.segments);
        return -EINVAL;
    }
    if (p->add && !(r->addbuf = calloc(p->n, sizeof(float))))
        return -ENOMEM;
    r->p = *p;
    r->registered = 1;
    if (r->p.pull)
        r->p.pull(r->p.ctx, DS_ENGINE_PARAMS);
    int e = ds_gossip_create(&r->gossip, &r->gcfg, p->layers, p->n_layers, p->n, p->params);
    if (e < 0)
        ds_error("node", "cannot start: cannot set up gossip: %s", strerror(-e));
    return e;
}

/* ---- listen ------------------------------------------------------------------- */

/* The largest count one frame carries: a segment of the model, at least
 * the whole model (a state chunk is cut to fit). */
static size_t max_segment(const rt *r)
{
    size_t max_seg = 0;
    for (int i = 0; i < ds_gossip_n_segments(r->gossip); i++)
        if (ds_gossip_segment(r->gossip, i)->len > max_seg)
            max_seg = ds_gossip_segment(r->gossip, i)->len;
    max_seg = max_seg > r->p.n ? max_seg : r->p.n;
    /* A group's frames: a chunk of its vector with its count, or a
     * member's (index, value) pairs, up to the vector's length. */
    const size_t chunk = ds_hier_vec_len(r->p.n) + 2;
    return r->group[0] && chunk > max_seg ? chunk : max_seg;
}

/* A node in a group: the adapter, reducer and vector of its group's
 * reductions (rounds.c). */
static int open_group(rt *r)
{
    if (!r->group[0])
        return 0;
    const size_t n = ds_hier_vec_len(r->p.n);
    int e = ds_gnet_create(&r->gn_grp, r->net, (uint32_t)max_segment(r), (size_t)256 << 20);
    if (e == 0)
        e = ds_greduce_create(&r->gred, n);
    /* auto starts direct: rounds.c sets each reduction's algorithm. */
    if (e == 0)
        ds_greduce_set_algo(r->gred, (enum ds_greduce_algo)r->c->group.allreduce);
    /* A list of (index, value) pairs travels as 2 floats a pair in one
     * frame: at most half the longest vector (the rest waits a step). */
    r->glist_cap = (uint32_t)(n / 2);
    /* group.overlap: a layer thread's jobs (rounds.c); a layer's place
     * in the step travels in a tag's low byte. */
    if (e == 0 && r->c->group.overlap && r->p.n_layers > DS_LAYER_TAG_MAX) {
        ds_error("node", "cannot start: group.overlap: expected at most %d layers, found %d",
                 DS_LAYER_TAG_MAX, r->p.n_layers);
        return -EINVAL;
    }
    if (e == 0 && r->c->group.overlap &&
        (!(r->lq = calloc((size_t)r->p.n_layers, sizeof(*r->lq))) ||
         !(r->lsent = calloc((size_t)r->p.n_layers, 1))))
        e = -ENOMEM;
    if (e == 0 && (!(r->gvec = malloc(n * sizeof(float))) ||
                   !(r->gcarry = calloc(r->p.n, sizeof(float))) ||
                   !(r->glist_idx = malloc(r->glist_cap * sizeof(uint32_t))) ||
                   !(r->glist_val = malloc(r->glist_cap * sizeof(float)))))
        e = -ENOMEM;
    if (e == 0 && r->c->group.sparsify != DS_GROUP_SPARSIFY_NONE) {
        /* DEFT's units start from the layers: their boundaries, in order. */
        const size_t nl = r->p.layers ? (size_t)r->p.n_layers : 0;
        uint32_t *loff = nl ? malloc((nl + 1) * sizeof(*loff)) : NULL;
        if (nl && !loff) {
            e = -ENOMEM;
        } else {
            for (size_t i = 0; i < nl; i++)
                loff[i] = (uint32_t)r->p.layers[i].off;
            if (nl)
                loff[nl] = (uint32_t)r->p.n;
            e = ds_hier_sparsifier_create(r->c->group.sparsify, r->p.n, loff, nl, &r->gsp);
            free(loff);
            if (e == -EINVAL) {
                ds_error("node", "cannot start: group.sparsify = %s: the layer table does not "
                         "cover the %zu parameters in order from 0",
                         ds_group_sparsify_name(r->c->group.sparsify), r->p.n);
                return e;
            }
        }
        if (e == 0 && (!(r->gres = calloc(r->p.n, sizeof(float))) ||
                       !(r->gsout = malloc(2 * r->p.n * sizeof(float)))))
            e = -ENOMEM;
    }
    if (e < 0) {
        ds_error("node", "cannot start: out of memory");
        return e;
    }
    if (r->gsp)
        ds_info("group", "group.sparsify %s: gradients sparse inside the group, density %g",
                ds_group_sparsify_name(r->c->group.sparsify), r->c->group.density);
    if (r->gsp && !r->p.opt)
        ds_warn("group", "group.sparsify %s without the optimizer's momentum (no opt "
                "registered): the engine cannot mask it where an owner's accumulated "
                "residual lands; an optimizer with momentum may diverge (docs/gossip.md, "
                "\"Momentum factor masking\"); plain SGD is unaffected",
                ds_group_sparsify_name(r->c->group.sparsify));
    if (r->c->group.allreduce == DS_GROUP_ALLREDUCE_AUTO)
        ds_info("group", "group.allreduce auto: direct or butterfly, as member 0 times them");
    else if (r->c->group.allreduce != DS_GROUP_ALLREDUCE_DIRECT)
        ds_info("group", "group.allreduce %s",
                ds_greduce_algo_name((enum ds_greduce_algo)r->c->group.allreduce));
    ds_gnet_set_heard_hook(r->gn_grp, heard_hook, r);
    ds_gnet_set_failure_hook(r->gn_grp, gossip_failed_hook, r);
    ds_gnet_set_stop(r->gn_grp, r->stop.signal);
    atomic_store(&r->gn_grp_ready, 1);
    return 0;
}

static int open_net(rt *r)
{
    const ds_conf *c = r->c;
    ds_net_cfg nc;
    ds_net_cfg_default(&nc);
    nc.identity = &r->id;
    nc.name = c->node.name;
    nc.cluster = c->cluster.id;
    nc.cluster_key = r->have_ck ? &r->ck : NULL;
    nc.allow = r->allow;
    /* SIGHUP: the net's worker re-reads the allow-list (without one, the
     * empty list of load_keys stays: there is no file to re-read). */
    nc.allow_file = c->cluster.allowed_keys[0] ? c->cluster.allowed_keys : NULL;
    nc.allow_reload = r->stop.reload;
    nc.mode = r->mode;
    nc.transport.provider = c->transport.provider;
    nc.transport.listen = c->node.listen;
    /* The transport advertises its bound address unless told otherwise:
     * node.advertise, or the default route's address for a wildcard. */
    ds_hostport hp;
    if (c->node.advertise[0] ||
        (ds_hostport_parse(c->node.listen, &hp) == 0 && ds_host_is_wildcard(hp.host)))
        nc.transport.advertise = r->advertise;
    nc.transport.max_inflight_bytes = (size_t)c->transport.max_inflight_mb << 20;
    /* A frame carries at most one segment of indices and values. */
    ds_wire_limits_default(&nc.limits);
    nc.limits.max_segment = (uint32_t)max_segment(r);
    nc.limits.max_count = nc.limits.max_segment;
    nc.on_recv = on_net_recv;
    nc.on_event = on_net_event;
    nc.cb_ctx = r;
    int e = ds_net_open(&nc, &r->net);
    if (e < 0)
        ds_error("net", "cannot listen on %s (provider %s): %s", c->node.listen,
                 c->transport.provider, strerror(-e));
    return e;
}

static int open_status(rt *r)
{
    const ds_conf *c = r->c;
    if (!c->status.listen[0] && !c->status.file[0])
        return 0;
    if (!(r->snap = calloc(1, sizeof(*r->snap)))) {
        ds_error("node", "cannot start: out of memory");
        return -ENOMEM;
    }
    ds_status_snapshot_init(r->snap);
    snprintf(r->snap->topology, sizeof(r->snap->topology), "%s",
             ds_topo_name(c->gossip.topology));
    r->snap->seed = (uint64_t)c->cluster.seed;
    snprintf(r->snap->mix, sizeof(r->snap->mix), "%s", ds_mix_name(c->gossip.mix));
    snprintf(r->snap->version, sizeof(r->snap->version), "%s", DS_VERSION);
    snprintf(r->snap->backend, sizeof(r->snap->backend), "%s",
             ds_ops_backend_name(c->train.backend));
    int e = ds_publish_open(&r->status, c->status.listen, c->status.file,
                            (int)c->status.file_interval_ms, r->snap);
    if (e < 0) {
        ds_error("status", "cannot serve status on '%s' / write '%s': %s", c->status.listen,
                 c->status.file, strerror(-e));
        return e;
    }
    snprintf(r->snap->name, sizeof(r->snap->name), "%.63s", c->node.name);
    ds_net_addr(r->net, r->snap->addr, sizeof(r->snap->addr));
    snprintf(r->snap->group, sizeof(r->snap->group), "%.31s", r->group);
    r->snap->id = r->id.id;
    return 0;
}

int ds_engine_listen(ds_engine *r)
{
    const ds_conf *c = r->c;
    int e;
    if (!r->registered)
        return -EINVAL;
    char how[96], err[512];
    if ((e = ds_preflight_advertise(c, r->advertise, sizeof(r->advertise), how, sizeof(how), err,
                                    sizeof(err))) < 0) {
        ds_error("node", "cannot start: %s", err);
        return e;
    }
    if (how[0])
        ds_info("node", "node.listen = %s is a wildcard address: advertising %s (%s)",
                c->node.listen, r->advertise, how);
    if ((e = open_net(r)) < 0)
        return e;
    if ((e = ds_gnet_create(&r->gn, r->net, (uint32_t)max_segment(r), (size_t)256 << 20)) < 0) {
        ds_error("node", "cannot start: out of memory");
        return e;
    }
    ds_gnet_set_failure_hook(r->gn, gossip_failed_hook, r);
    ds_gnet_set_view_differs_hook(r->gn, view_differs_hook, r);
    ds_gnet_set_heard_hook(r->gn, heard_hook, r);
    ds_gnet_set_stop(r->gn, r->stop.signal);
    atomic_store(&r->gn_ready, 1);
    if ((e = open_group(r)) < 0)
        return e;
    if ((e = ds_state_create(&r->st, r->net, r->p.n, 1u << 20)) < 0) {
        ds_error("node", "cannot start: out of memory");
        return e;
    }
    atomic_store(&r->st_ready, 1);
    if ((e = open_status(r)) < 0)
        return e;
    char addr[128] = "";
    ds_net_addr(r->net, addr, sizeof(addr));
    ds_info("node", "listening on %s id=%016llx security=%s gossip=%s/%s sparsify=%s density=%g",
            addr, (unsigned long long)r->id.id, ds_sec_mode_name(c->security.mode),
            ds_topo_name(c->gossip.topology), ds_mix_name(c->gossip.mix),
            ds_sparsify_method_name(c->sparsify.method), c->sparsify.density);
    return 0;
}

/* ---- join --------------------------------------------------------------------- */

static int start_membership(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    ds_membership_cfg mc;
    ds_membership_cfg_default(&mc);
    mc.cluster_id = ds_wire_cluster_id(c->cluster.id);
    mc.name = c->node.name;
    mc.addr = r->advertise;
    mc.group = r->group;
    memcpy(mc.pk, r->id.pk, sizeof(mc.pk));
    mc.seed = ds_rng_hash_str((uint64_t)c->cluster.seed ^ 0x6d656d62ull, c->node.name);
    /* Nodes of a cluster start together: a seed may not have founded the
     * cluster yet when the first JOIN reaches it, so retry soon. */
    mc.join_timeout_ms = 500;
    mc.join_give_up_ms = (uint64_t)c->cluster.join_timeout_s * 1000u;
    ds_lag_init(&r->lag, mc.lag_rounds);
    const ds_membership_io io = {.ctx = r, .send = ms_send, .event = ms_event};
    ds_membership *ms;
    int e = ds_membership_create(&mc, &io, &ms);
    if (e < 0) {
        snprintf(err, err_len, "cannot start membership: %s", strerror(-e));
        return e;
    }
    atomic_store(&r->ms, ms);
    if ((e = pthread_create(&r->fd, NULL, fd_main, r)) != 0) {
        snprintf(err, err_len, "cannot start the failure detector: %s", strerror(e));
        return -e;
    }
    r->fd_up = 1;

    /* Found the cluster when there is no seed or we are the first one. */
    const char *seeds[DS_CONF_LIST_MAX];
    for (int i = 0; i < c->cluster.seeds_count; i++)
        seeds[i] = c->cluster.seeds[i];
    const uint64_t now = ds_now_ms();
    if (c->cluster.seeds_count == 0 || !strcmp(seeds[0], c->node.listen) ||
        !strcmp(seeds[0], r->advertise)) {
        ds_info("membership", "founding the cluster '%s'", c->cluster.id);
        e = ds_membership_bootstrap(ms, now);
        pthread_mutex_lock(&r->lock);
        r->joined = 1;
        pthread_mutex_unlock(&r->lock);
    } else {
        ds_info("membership", "joining through %d seed(s), first %s", c->cluster.seeds_count,
                seeds[0]);
        e = ds_membership_join(ms, now, seeds, (size_t)c->cluster.seeds_count);
    }
    if (e < 0)
        snprintf(err, err_len, "cannot %s: %s", c->cluster.seeds_count ? "join" : "bootstrap",
                 strerror(-e));
    return e;
}

/* Wait until joined and cluster.min_members members are alive. */
static int wait_for_cluster(rt *r, char *err, size_t err_len)
{
    const int64_t want = r->c->cluster.min_members;
    /* Members that never come (or came and have finished) must not keep
     * a node waiting for good: the wait is bounded as the join is. */
    const uint64_t give_up = ds_now_ms() + (uint64_t)r->c->cluster.join_timeout_s * 1000u;
    uint64_t last_log = 0;
    ds_status_wait wait = {0}; /* shown while too few are alive */
    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (ds_rt_stop_signal(r)) {
            pthread_mutex_unlock(&r->lock);
            return -EINTR;
        }
        if (r->refused) {
            pthread_mutex_unlock(&r->lock);
            snprintf(err, err_len, "refused by %s: this node is not admitted to cluster '%s' "
                     "(check cluster.key_file and cluster.allowed_keys)", r->refused_by,
                     r->c->cluster.id);
            return -EACCES;
        }
        if (r->join_failed) {
            pthread_mutex_unlock(&r->lock);
            snprintf(err, err_len, "cannot join cluster '%s': %s", r->c->cluster.id,
                     r->join_failed_why);
            return -ETIMEDOUT;
        }
        if (r->joined) {
            ds_membership_stats st;
            ds_membership_stats_get(atomic_load(&r->ms), &st);
            if ((int64_t)st.alive >= want)
                break;
            const uint64_t now = ds_now_ms();
            if (now >= give_up) {
                pthread_mutex_unlock(&r->lock);
                snprintf(err, err_len, "only %u of cluster.min_members=%lld members alive after "
                         "cluster.join_timeout_s=%lld", st.alive, (long long)want,
                         (long long)r->c->cluster.join_timeout_s);
                return -ETIMEDOUT;
            }
            if (now - last_log >= 2000) {
                ds_info("membership", "waiting for members: %u of %lld alive", st.alive,
                        (long long)want);
                last_log = now;
            }
            if (st.alive != wait.alive || !wait.kind) {
                if (!wait.kind)
                    wait.since_unix_ms = ds_unix_ms();
                wait.kind = DS_WAIT_MEMBERS;
                wait.alive = st.alive;
                wait.want = (uint32_t)want;
                ds_status_set_wait(r->status, &wait);
            }
        }
        ds_rt_timed_wait(r, ds_now_ms() + 50);
    }
    pthread_mutex_unlock(&r->lock);
    return 0;
}

int ds_engine_join(ds_engine *r, char *err, size_t err_len)
{
    if (!r->net)
        return -EINVAL;
    int e = start_membership(r, err, err_len);
    if (e == 0)
        e = wait_for_cluster(r, err, err_len);
    ds_status_clear_wait(r->status); /* what wait_for_cluster showed */
    return e;
}

/* ---- the client's numbers, and ours ---------------------------------------------- */

void ds_engine_report_set(ds_engine *r, const ds_engine_report *rep)
{
    r->phase = rep->phase;
    r->st_loss = rep->loss;
    r->st_acc = rep->test_acc;
    r->st_lr = rep->lr;
    r->st_sps = rep->samples_per_s;
}

void ds_engine_publish(ds_engine *r, int force)
{
    if (!r->status || !r->snap)
        return;
    /* Membership's news since the last publish, oldest first. */
    pthread_mutex_lock(&r->ev_lock);
    for (uint32_t i = r->evq.n; i-- > 0;)
        ds_status_events_add(&r->snap->events, ds_status_events_get(&r->evq, i));
    r->snap->events.total += r->evq.total - r->evq.n; /* news the queue dropped */
    r->evq.n = r->evq.next = 0;
    r->evq.total = 0;
    pthread_mutex_unlock(&r->ev_lock);
    const uint32_t G = r->last_nodes < r->vcap ? r->last_nodes : r->vcap;
    const ds_publish_src src = {
        .state = r->leaving && r->phase == DS_STATUS_TRAINING ? DS_STATUS_LEAVING : r->phase,
        .step = r->step,
        .steps = r->c->train.steps,
        .round = atomic_load(&r->cur_round),
        .epoch = r->last_epoch,
        .loss = r->st_loss,
        .test_acc = r->st_acc,
        .lr = r->st_lr,
        .samples_per_s = r->st_sps,
        .samples = r->steps_here * (uint64_t)r->c->train.batch_size,
        .view = r->vbuf,
        .view_len = G,
        .view_size = r->last_nodes,
        .view_group = r->grouped ? r->vgidx : NULL,
        .group = &r->gst,
        .self_id = r->id.id,
        .gossip = r->gossip,
        .gnet = r->gn,
        .net = r->net,
        .membership = atomic_load(&r->ms),
        .layers = r->registered ? r->p.layers : NULL,
        .n_layers = r->registered ? r->p.n_layers : 0,
    };
    ds_publish_status(r->status, r->snap, &r->last_publish_ms, force, &src);
}

void ds_rt_round_began(rt *r, uint64_t round)
{
    r->hist_round = round;
    r->hist_t0_ns = ds_now_ns();
    r->hist_grouped = 0;
    if (!r->snap || !r->grouped)
        return;
    /* Between groups: keep the round's nodes and their groups (vids and
     * vgidx, sorted by group by set_group_view) until it ends. */
    const uint32_t n = r->last_nodes < r->vcap ? r->last_nodes : r->vcap;
    if (n > r->hist_cap) {
        uint64_t *ids = realloc(r->hist_ids, n * sizeof(*ids));
        if (ids)
            r->hist_ids = ids;
        uint32_t *gi = realloc(r->hist_gidx, n * sizeof(*gi));
        if (gi)
            r->hist_gidx = gi;
        if (!ids || !gi)
            return; /* the history skips this round */
        r->hist_cap = n;
    }
    memcpy(r->hist_ids, r->vids, n * sizeof(*r->hist_ids));
    memcpy(r->hist_gidx, r->vgidx, n * sizeof(*r->hist_gidx));
    r->hist_n = n;
    r->hist_grouped = 1;
}

void ds_rt_round_ended(rt *r)
{
    if (!r->snap)
        return;
    if (r->hist_grouped) {
        /* Between groups: the participants are the groups; each segment's
         * target is the member of the target group that handles it. */
        const ds_publish_round_src src = {
            .round = r->hist_round,
            .epoch = r->last_epoch,
            .view_size = r->rg_groups,
            .me = r->rg_group,
            .view = r->vbuf,
            .n_view = r->hist_n,
            .begin_ns = r->hist_t0_ns,
            .gossip = r->gossip,
            .node_ids = r->hist_ids,
            .node_group = r->hist_gidx,
            .n_nodes = r->hist_n,
            .group_member = r->rg_member,
            .group_size = r->rg_size,
        };
        ds_publish_round(r->snap, &src);
        return;
    }
    if (r->grouped)
        return; /* began between groups without its copy (no memory), or
                 * between nodes and the view has groups since: skipped */
    const uint32_t G = r->last_G < r->vcap ? r->last_G : r->vcap;
    uint32_t me = G;
    for (uint32_t i = 0; i < G; i++)
        if (r->vids[i] == r->id.id)
            me = i;
    const ds_publish_round_src src = {
        .round = r->hist_round,
        .epoch = r->last_epoch,
        .view_size = G,
        .me = me,
        .vids = r->vids,
        .view = r->vbuf,
        .begin_ns = r->hist_t0_ns,
        .gossip = r->gossip,
    };
    ds_publish_round(r->snap, &src);
}

void ds_engine_info_get(ds_engine *r, ds_engine_info *out)
{
    memset(out, 0, sizeof(*out));
    out->rounds = r->rounds;
    out->view_size = r->last_G;
    out->group = r->gst;
    snprintf(out->group_name, sizeof(out->group_name), "%s", r->group);
    if (r->gossip)
        ds_gossip_report(r->gossip, &out->gossip, NULL, 0, NULL, 0);
    if (r->net)
        ds_net_stats_get(r->net, &out->net);
}

/* ---- close ------------------------------------------------------------------- */

void ds_engine_close(ds_engine **ep)
{
    if (!ep || !*ep)
        return;
    rt *r = *ep;
    stop_threads(r);
    ds_net_close(&r->net);
    atomic_store(&r->gn_ready, 0);
    atomic_store(&r->gn_grp_ready, 0);
    atomic_store(&r->st_ready, 0);
    ds_state_destroy(&r->st);
    ds_membership *ms = atomic_exchange(&r->ms, NULL);
    ds_membership_destroy(&ms);
    /* After every thread that writes into them (the net worker and
     * membership's thread note events in the status; ThreadSanitizer saw
     * a frame from a peer still training land in a status being freed). */
    ds_status_destroy(&r->status);
    free(r->snap);
    r->snap = NULL;
    ds_gnet_destroy(&r->gn);
    ds_gnet_destroy(&r->gn_grp);
    ds_greduce_destroy(&r->gred);
    free(r->gvec);
    free(r->lq);
    free(r->lsent);
    free(r->gcarry);
    free(r->addbuf);
    free(r->glist_idx);
    free(r->glist_val);
    ds_sparsifier_destroy(&r->gsp);
    free(r->gres);
    free(r->gsout);
    free(r->vorder);
    free(r->vgidx);
    free(r->hist_ids);
    free(r->hist_gidx);
    free(r->gmembers);
    free(r->gskip);
    ds_gossip_destroy(&r->gossip);
    ds_allowlist_free(&r->allow);
    ds_identity_wipe(&r->id);
    ds_cluster_key_wipe(&r->ck);
    free(r->vbuf);
    free(r->vids);
    free(r->vaddrs);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->skip_lock);
    pthread_mutex_destroy(&r->ev_lock);
    pthread_cond_destroy(&r->cond);
    free(r);
    *ep = NULL;
}

void ds_engine_abandon(ds_engine **ep)
{
    if (!ep || !*ep)
        return;
    rt *r = *ep;
    /* What the net's threads may still touch (the net, gn, st, ms, r
     * itself) stays; everything of our own stops, secrets are wiped. */
    ds_status_destroy(&r->status);
    stop_threads(r);
    ds_identity_wipe(&r->id);
    ds_cluster_key_wipe(&r->ck);
    *ep = NULL;
}
