/*
 * node/runtime/run.c: one node's life, from a validated config to its summary line.
 *
 * Threads:
 *   main           training: minibatch, forward/backward, optimizer step,
 *                  and (gossip.overlap = false) the gossip round itself;
 *   comm           (gossip.overlap = true) the round's exchanges, while the
 *                  main thread computes the next step (design §5: x_{t+1} =
 *                  mix(x_t) - lr g(x_t));
 *   failure det.   SWIM ticks (node/membership), never behind a training
 *                  step (design §6);
 *   net worker     opens and dispatches received frames (node/net);
 *   transport      libfabric progress (node/transport).
 *
 * Start: the node opens its endpoint, then founds the cluster when it has
 * no seeds or its own address is the first seed, else joins through the
 * seeds (retrying with backoff). It trains once cluster.min_members members
 * are alive. A member enters the gossip view at the effective round its
 * join was given, the same round on every node (node/membership/membership.h).
 *
 * Round r happens after optimizer step r * gossip.every. Its view (members,
 * epoch) comes from membership for round r; the gossip engine's view indices
 * map to node ids through node/gossip_net.
 *
 * The summary is the one line a launcher needs, on stdout:
 *   summary node=NAME status=done|stopped|failed steps=N loss=L test_acc=A
 *           samples_per_s=S wall_s=W backend=B bytes_sent=X bytes_received=Y
 *           rounds=R
 * Everything else goes to the log (stderr). At exit the final parameters
 * go to <node.data_dir>/model.bin (see ds_run_save_model) so a launcher can
 * measure how far the nodes' models are apart.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "kernels/kernels.h"
#include "node/sec/crypto.h"
#include "node/gossip/gossip.h"
#include "node/gossip/gossip_net.h"
#include "base/log.h"
#include "node/membership/membership.h"
#include "node/net/net.h"
#include "base/rng.h"
#include "node/runtime/publish.h"
#include "node/runtime/run.h"
#include "node/gossip/state.h"
#include "node/status/status.h"

static volatile sig_atomic_t stop_signal, stop_count;

/* First SIGINT/SIGTERM: stop training, leave gracefully. Second: go now. */
static void on_signal(int sig)
{
    stop_signal = sig;
    stop_count++;
}

void ds_run_train_cfg(const ds_conf *c, ds_train_cfg *t)
{
    ds_train_cfg_defaults(t);
    snprintf(t->backend, sizeof(t->backend), "%s", c->train.backend);
    snprintf(t->dataset_dir, sizeof(t->dataset_dir), "%s", c->train.dataset_dir);
    t->n_hidden = c->train.hidden_count;
    for (int i = 0; i < c->train.hidden_count && i < DS_TRAIN_MAX_HIDDEN; i++)
        t->hidden[i] = (int)c->train.hidden[i];
    t->batch = (int)c->train.batch_size;
    t->lr = c->train.lr;
    t->momentum = c->train.momentum;
    t->weight_decay = c->train.weight_decay;
    t->nesterov = c->train.nesterov;
    t->warmup_steps = c->train.warmup_steps;
    t->cosine = !strcmp(c->train.lr_schedule, "cosine");
    t->total_steps = c->train.steps;
    t->threads = (int)c->train.threads;
    t->init_seed = (uint64_t)c->cluster.seed;
    t->data_seed = ds_rng_hash_str((uint64_t)c->cluster.seed, c->node.name);
}

int ds_run_save_model(const char *dir, const ds_trainer *t, char *err, size_t err_len)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, err_len, "%s: cannot create: %s", dir, strerror(errno));
        return -errno;
    }
    const size_t n = t->n_params;
    float *host = malloc(n * sizeof(float));
    if (!host) {
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    int ret = t->ops.download(host, t->theta, n * sizeof(float));
    FILE *f = ret == 0 ? fopen(tmp, "wb") : NULL;
    if (!f) {
        ret = ret ? ret : -errno;
        snprintf(err, err_len, "%s: cannot write: %s", tmp, strerror(-ret));
        free(host);
        return ret;
    }
    uint8_t hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (uint8_t)((uint64_t)n >> (8 * i));
    /* The file is little-endian float32, as this host (x86-64; wire.h pins
     * the byte order for the whole node). */
    int ok = fwrite(hdr, 1, 16, f) == 16 && fwrite(host, sizeof(float), n, f) == n;
    ok = (fclose(f) == 0) && ok;
    free(host);
    if (!ok || rename(tmp, path) < 0) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        return -EIO;
    }
    return 0;
}

/* ---- the runtime ---------------------------------------------------------- */

typedef struct rt {
    const ds_conf *c;
    ds_identity id;
    ds_cluster_key ck;
    int have_ck;
    ds_allowlist *allow;
    ds_net *net;
    _Atomic(ds_membership *) ms;
    ds_gnet *gn;
    _Atomic int gn_ready; /* gn exists: the net worker may hand it frames */
    ds_gossip *gossip;
    ds_state *st;
    _Atomic int st_ready;
    ds_status *status;           /* status.listen / status.file; NULL: off */
    ds_status_snapshot *snap;
    uint64_t last_publish_ms;
    int phase;                   /* enum ds_status_state */
    double st_loss, st_acc, st_sps;
    ds_trainer t;
    int trainer_up;
    enum ds_topo_kind topo;

    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: fd thread, join and comm waits */
    int stop_threads;
    int joined;
    uint64_t seed_id;    /* the member that answered our JOIN, its round */
    char seed_addr[DS_WIRE_ADDR_MAX + 1];
    uint64_t seed_round;
    int refused;         /* a seed refused our handshake: not admitted */
    char refused_by[DS_WIRE_ADDR_MAX + 1];
    pthread_t fd;
    int fd_up;

    /* overlap: the comm thread runs ds_gossip_exchange between begin/end */
    pthread_t comm;
    int comm_up, comm_go, comm_done;

    /* Peers that missed a deadline and have not been heard from since: the
     * gossip rounds do not wait for them (design §5: skipped, reported). */
    pthread_mutex_t skip_lock;
    uint64_t skip_ids[64];
    uint64_t skip_until[64]; /* first round it is tried again; UINT64_MAX: until heard */
    uint32_t skip_fails[64]; /* consecutive misses: the skip window doubles */
    uint8_t skip_hard[64];   /* 1: not sent to either (a verdict, a stuck transport) */
    int n_skip;
    _Atomic uint64_t cur_round;

    ds_member_info *vbuf; /* the view of the round being set up: vcap entries */
    uint32_t vcap;
    uint64_t *vids;
    const char **vaddrs;
    float *host_theta;   /* host mirror of theta for the CUDA backend */
    uint64_t round0;     /* round = round0 + step / gossip.every */
    uint64_t lag;        /* membership's lag: rounds until a change applies */
    uint64_t lag_t0_ms, lag_r0; /* rate window for the lag */
    double lag_rate;            /* rounds/s the lag is sized for (decaying peak) */
    double rate;         /* rounds per second, last measured */
    uint64_t join_round; /* ours, from SELF_JOINED */
    /* A joiner trains alone until its join round; it keeps the cluster's
     * pace meanwhile (rounds at pace_rate from pace_r0 at pace_t0_ns) so that
     * it enters the view in step with the others, not seconds ahead. */
    uint64_t pace_t0_ns, pace_r0;
    double pace_rate;
    int refresh_pending; /* shadow the cluster's state until our join round */
    int refresh_failures;
    int leaving;         /* LEAVE announced, effective at leave_round */
    uint64_t leave_round;
    uint64_t rounds;
    uint32_t last_G;
    uint64_t last_epoch;
} rt;

static void timed_wait(rt *r, uint64_t until_ms)
{
    const struct timespec ts = {(time_t)(until_ms / 1000), (long)(until_ms % 1000) * 1000000L};
    pthread_cond_timedwait(&r->cond, &r->lock, &ts);
}

/* A peer missed a deadline (gossip): do not wait for it for a few rounds,
 * then try again -- if we were the slow one (frozen, overloaded), both
 * sides would otherwise skip each other for good. Membership's verdicts
 * (suspect, dead) hold until the peer is heard from again.
 *
 * Two strengths. A missed gossip deadline is soft: we still send the peer
 * its requests, we only stop waiting for it. A skip that also stopped our
 * sends made the peer, which expected our request, wait out its own
 * timeout, then skip us in turn, and so on: after a crash in a 9-node
 * cluster the rounds ran at one timeout each for seconds (measured). A
 * verdict, or a transport that cannot deliver to it, is hard: nothing is
 * sent to it either. */
#define SKIP_ROUNDS 4

/* A missed deadline: skip the peer for SKIP_ROUNDS << (misses in a row - 1)
 * rounds (at most 64x), then try again; until == UINT64_MAX: until heard. */
static void mark_unresponsive_until(rt *r, uint64_t id, uint64_t until, int hard)
{
    pthread_mutex_lock(&r->skip_lock);
    int i = 0;
    while (i < r->n_skip && r->skip_ids[i] != id)
        i++;
    if (i == r->n_skip) {
        if (r->n_skip == 64) {
            pthread_mutex_unlock(&r->skip_lock);
            return;
        }
        r->skip_ids[i] = id;
        r->skip_until[i] = 0;
        r->skip_fails[i] = 0;
        r->skip_hard[i] = 0;
        r->n_skip++;
        ds_debug("gossip", "peer %016llx unresponsive: not waited for", (unsigned long long)id);
    }
    if (until != UINT64_MAX) {
        const uint32_t f = r->skip_fails[i] < 6 ? r->skip_fails[i] : 6;
        const uint64_t now_round = until - 1 - SKIP_ROUNDS;
        until = now_round + 1 + ((uint64_t)SKIP_ROUNDS << f);
        r->skip_fails[i]++;
    }
    if (until > r->skip_until[i])
        r->skip_until[i] = until;
    if (hard || until == UINT64_MAX)
        r->skip_hard[i] = 1;
    pthread_mutex_unlock(&r->skip_lock);
}

static void mark_unresponsive(rt *r, uint64_t id)
{
    mark_unresponsive_until(r, id, UINT64_MAX, 1);
}

static void mark_responsive(rt *r, uint64_t id)
{
    pthread_mutex_lock(&r->skip_lock);
    for (int i = 0; i < r->n_skip; i++)
        if (r->skip_ids[i] == id) {
            r->n_skip--;
            r->skip_ids[i] = r->skip_ids[r->n_skip];
            r->skip_until[i] = r->skip_until[r->n_skip];
            r->skip_fails[i] = r->skip_fails[r->n_skip];
            r->skip_hard[i] = r->skip_hard[r->n_skip];
            break;
        }
    pthread_mutex_unlock(&r->skip_lock);
}

/* 0: wait for it; 1: send, do not wait; 2: neither. */
static int is_unresponsive(rt *r, uint64_t id, uint64_t round)
{
    pthread_mutex_lock(&r->skip_lock);
    int found = 0;
    for (int i = 0; i < r->n_skip && !found; i++)
        if (r->skip_ids[i] == id && round < r->skip_until[i])
            found = r->skip_hard[i] ? 2 : 1;
    pthread_mutex_unlock(&r->skip_lock);
    return found;
}

static void heard_hook(void *ctx, uint64_t id)
{
    mark_responsive(ctx, id);
}

static void on_net_recv(void *ctx, ds_net_rx *rx)
{
    rt *r = ctx;
    const unsigned type = rx->hdr.type;
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
    case DS_NET_EV_PEER_UNRESPONSIVE:
        if (ms && ev->peer)
            ds_membership_hint(ms, ev->peer, ds_now_ms());
        if (ev->peer)
            mark_unresponsive_until(r, ev->peer, atomic_load(&r->cur_round) + 1 + SKIP_ROUNDS, 1);
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

static void ms_event(void *ctx, const ds_membership_event *ev)
{
    rt *r = ctx;
    const ds_member_info *m = &ev->member;
    switch (ev->kind) {
    case DS_MEV_MEMBER_JOINED:
        ds_info("membership", "member joined name=%s addr=%s round=%lld", m->name, m->addr,
                ev->round == DS_MEMBERSHIP_NO_ROUND ? -1LL : (long long)ev->round);
        mark_responsive(r, m->id);
        break;
    case DS_MEV_MEMBER_SUSPECTED:
        ds_info("membership", "member suspected name=%s", m->name);
        mark_unresponsive(r, m->id);
        break;
    case DS_MEV_MEMBER_ALIVE:
        ds_info("membership", "member alive again name=%s incarnation=%u", m->name,
                m->incarnation);
        mark_responsive(r, m->id);
        break;
    case DS_MEV_MEMBER_DEAD:
        mark_unresponsive(r, m->id);
        ds_warn("membership", "member dead name=%s removal_round=%llu", m->name,
                (unsigned long long)ev->round);
        break;
    case DS_MEV_MEMBER_LEFT:
        /* Gone for good, or lingering until its leave applies: either way
         * nobody waits for it; what it still sends is served. */
        mark_unresponsive(r, m->id);
        ds_info("membership", "member left name=%s removal_round=%llu", m->name,
                (unsigned long long)ev->round);
        break;
    case DS_MEV_VIEW_CHANGED:
        ds_info("membership", "view changed round=%llu epoch=%llu size=%u in_view=%d",
                (unsigned long long)ev->round, (unsigned long long)ev->epoch, ev->view_size,
                ev->in_view);
        break;
    case DS_MEV_SELF_JOINED:
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
        break;
    case DS_MEV_JOIN_RETRY:
        /* Nodes started together race the founder: the first few retries
         * are expected; say so at warn only when it goes on. */
        ds_log(ev->attempt <= 4 ? DS_LOG_INFO : DS_LOG_WARN, "membership",
               "no reachable seed yet: trying %s next (attempt %u)", m->addr, ev->attempt);
        break;
    case DS_MEV_SELF_REFUTED:
        ds_warn("membership", "suspected by peers: refuted with incarnation %u", m->incarnation);
        break;
    case DS_MEV_SELF_REJOINED:
        ds_warn("membership", "declared dead by peers: out of the view from round %llu, back "
                "from %llu", (unsigned long long)ev->round, (unsigned long long)ev->join_round);
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
            timed_wait(r, next);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

static void gossip_failed_hook(void *ctx, uint64_t id)
{
    rt *r = ctx;
    ds_membership *ms = atomic_load(&r->ms);
    if (ms)
        ds_membership_hint(ms, id, ds_now_ms());
    mark_unresponsive_until(r, id, atomic_load(&r->cur_round) + 1 + SKIP_ROUNDS, 0);
}

/* The comm thread: one ds_gossip_exchange per begin(). */
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

/* The view at `round`, into r->vbuf / r->vids. */
static int view_at(rt *r, uint64_t round, uint32_t *G, uint32_t *me, uint64_t *epoch)
{
    ds_membership *ms = atomic_load(&r->ms);
    if (!r->vcap) {
        r->vbuf = malloc(16 * sizeof(*r->vbuf));
        r->vids = malloc(16 * sizeof(*r->vids));
        r->vaddrs = malloc(16 * sizeof(*r->vaddrs));
        if (!r->vbuf || !r->vids || !r->vaddrs)
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
        if (!nb || !ni || !na)
            return -ENOMEM;
        r->vcap = cap;
    }
    for (uint32_t i = 0; i < *G; i++)
        r->vids[i] = r->vbuf[i].id;
    return 0;
}

/* Point the gossip engine and the adapter at round `round`'s view. */
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
    if (G != r->last_G || epoch != r->last_epoch) {
        ds_info("gossip", "round=%llu view_size=%u epoch=%llu me=%u", (unsigned long long)round,
                G, (unsigned long long)epoch, me);
        r->last_G = G;
        r->last_epoch = epoch;
    }
    for (uint32_t i = 0; i < G; i++)
        r->vaddrs[i] = r->vids[i] == r->id.id ? NULL : r->vbuf[i].addr;
    if ((e = ds_gnet_set_view(r->gn, r->vids, r->vaddrs, G)) < 0)
        return e;
    if ((e = ds_gossip_set_view(r->gossip, G, me, epoch)) < 0)
        return e;
    for (uint32_t i = 0; i < G; i++) {
        const int u = i != me ? is_unresponsive(r, r->vids[i], round) : 0;
        if (u == 2)
            ds_gossip_set_skip(r->gossip, i);
        else if (u == 1)
            ds_gossip_set_nowait(r->gossip, i);
    }
    /* Alone: no round at all. snap keeps the last mixed state, so the next
     * real round's begin() still sees all the drift since then. */
    return G < 2 ? 1 : 0;
}

/* theta as host memory for the gossip engine. */
static float *host_theta(rt *r)
{
    if (r->t.ops.kind == DS_BACKEND_CPU)
        return r->t.theta;
    r->t.ops.download(r->host_theta, r->t.theta, r->t.n_params * sizeof(float));
    return r->host_theta;
}

static void push_theta(rt *r)
{
    if (r->t.ops.kind != DS_BACKEND_CPU)
        r->t.ops.upload(r->t.theta, r->host_theta, r->t.n_params * sizeof(float));
}

/* 0: a round began; 1: no round (alone); < 0: error. */
static int round_begin(rt *r, uint64_t round)
{
    int e = set_round_view(r, round);
    if (e == 0)
        e = ds_gossip_begin(r->gossip, host_theta(r), round);
    if (e < 0)
        ds_error("gossip", "round %llu cannot start: %s", (unsigned long long)round, strerror(-e));
    return e;
}

static void round_end(rt *r)
{
    ds_gossip_end(r->gossip, host_theta(r));
    push_theta(r);
    r->rounds++;
}

static void comm_start(rt *r)
{
    pthread_mutex_lock(&r->lock);
    r->comm_done = 0;
    r->comm_go = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

static void comm_wait(rt *r)
{
    pthread_mutex_lock(&r->lock);
    while (!r->comm_done)
        pthread_cond_wait(&r->cond, &r->lock);
    pthread_mutex_unlock(&r->lock);
}

static int load_keys(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    int e;
    if (c->cluster.identity_file[0]) {
        if ((e = ds_identity_load(&r->id, c->cluster.identity_file, err, err_len)) < 0)
            return e;
    } else {
        if ((e = ds_identity_generate(&r->id)) < 0) {
            snprintf(err, err_len, "cannot generate an identity");
            return e;
        }
        ds_info("security", "no cluster.identity_file: using a fresh identity for this run");
    }
    if (c->cluster.key_file[0]) {
        if ((e = ds_cluster_key_load(&r->ck, c->cluster.key_file, err, err_len)) < 0)
            return e;
        r->have_ck = 1;
    }
    if (c->cluster.allowed_keys[0] &&
        (e = ds_allowlist_load(&r->allow, c->cluster.allowed_keys, err, err_len)) < 0)
        return e;
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

static int open_net(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    ds_net_cfg nc;
    ds_net_cfg_default(&nc);
    nc.identity = &r->id;
    nc.name = c->node.name;
    nc.cluster = c->cluster.id;
    nc.cluster_key = r->have_ck ? &r->ck : NULL;
    nc.allow = r->allow;
    const int mode = ds_sec_mode_parse(c->security.mode);
    if (mode < 0) {
        snprintf(err, err_len, "security.mode: unknown '%s'", c->security.mode);
        return -EINVAL;
    }
    nc.mode = (enum ds_sec_mode)mode;
    nc.transport.provider = c->transport.provider;
    nc.transport.listen = c->node.listen;
    nc.transport.max_inflight_bytes = (size_t)c->transport.max_inflight_mb << 20;
    /* A frame carries at most one segment of indices and values. */
    size_t max_seg = 0;
    for (int i = 0; i < ds_gossip_n_segments(r->gossip); i++)
        if (ds_gossip_segment(r->gossip, i)->len > max_seg)
            max_seg = ds_gossip_segment(r->gossip, i)->len;
    ds_wire_limits_default(&nc.limits);
    nc.limits.max_segment = (uint32_t)(max_seg > r->t.n_params ? max_seg : r->t.n_params);
    nc.limits.max_count = nc.limits.max_segment;
    nc.on_recv = on_net_recv;
    nc.on_event = on_net_event;
    nc.cb_ctx = r;
    int e = ds_net_open(&nc, &r->net);
    if (e < 0)
        snprintf(err, err_len, "cannot listen on %s (provider %s): %s", c->node.listen,
                 c->transport.provider, strerror(-e));
    return e;
}

static int start_membership(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    ds_membership_cfg mc;
    ds_membership_cfg_default(&mc);
    mc.cluster_id = ds_wire_cluster_id(c->cluster.id);
    mc.name = c->node.name;
    mc.addr = c->node.listen;
    mc.group = c->node.group;
    memcpy(mc.pk, r->id.pk, sizeof(mc.pk));
    mc.seed = ds_rng_hash_str((uint64_t)c->cluster.seed ^ 0x6d656d62ull, c->node.name);
    /* Nodes of a cluster start together: a seed may not have founded the
     * cluster yet when the first JOIN reaches it, so retry soon. */
    mc.join_timeout_ms = 500;
    r->lag = mc.lag_rounds;
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
    if (c->cluster.seeds_count == 0 || !strcmp(seeds[0], c->node.listen)) {
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
    uint64_t last_log = 0;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (stop_signal) {
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
        if (r->joined) {
            ds_membership_stats st;
            ds_membership_stats_get(atomic_load(&r->ms), &st);
            if ((int64_t)st.alive >= want)
                break;
            const uint64_t now = ds_now_ms();
            if (now - last_log >= 2000) {
                ds_info("membership", "waiting for members: %u of %lld alive", st.alive,
                        (long long)want);
                last_log = now;
            }
        }
        timed_wait(r, ds_now_ms() + 50);
    }
    pthread_mutex_unlock(&r->lock);
    return 0;
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

/* Does any other member still count on us: one alive or suspected (not
 * leaving, not dead)? When every other member has announced its leave
 * (the end of a run: all finish together), nobody waits for our rounds
 * and lingering until our leave round would only cost seconds. */
static int others_count_on_us(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    uint32_t n = 0;
    ds_membership_members(ms, NULL, 0, &n);
    ds_member_info *all = calloc(n ? n : 1, sizeof(*all));
    int any = !all; /* when in doubt, linger */
    if (all && ds_membership_members(ms, all, n, &n) == 0)
        for (uint32_t i = 0; i < n && !any; i++)
            any = all[i].id != r->id.id &&
                  (all[i].state == DS_MEMBER_ALIVE || all[i].state == DS_MEMBER_SUSPECT);
    free(all);
    return any;
}

static void stop_threads(rt *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop_threads = 1;
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->lock);
    if (r->comm_up)
        pthread_join(r->comm, NULL);
    if (r->fd_up)
        pthread_join(r->fd, NULL);
    r->comm_up = r->fd_up = 0;
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

/* Let the leave spread; flush what we still send. */
static void leave_and_drain(rt *r)
{
    ds_membership *ms = atomic_load(&r->ms);
    const uint64_t until = ds_now_ms() + (stop_signal ? 1000 : 3000);
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

static void rt_fini(rt *r)
{
    ds_status_destroy(&r->status);
    free(r->snap);
    r->snap = NULL;
    stop_threads(r);
    ds_net_close(&r->net);
    atomic_store(&r->gn_ready, 0);
    atomic_store(&r->st_ready, 0);
    ds_state_destroy(&r->st);
    ds_membership *ms = atomic_exchange(&r->ms, NULL);
    ds_membership_destroy(&ms);
    ds_gnet_destroy(&r->gn);
    ds_gossip_destroy(&r->gossip);
    if (r->trainer_up)
        ds_trainer_fini(&r->t);
    ds_allowlist_free(&r->allow);
    ds_identity_wipe(&r->id);
    ds_cluster_key_wipe(&r->ck);
    free(r->vbuf);
    free(r->vids);
    free(r->vaddrs);
    free(r->host_theta);
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->skip_lock);
    pthread_cond_destroy(&r->cond);
}

static int make_gossip(rt *r, char *err, size_t err_len)
{
    const ds_conf *c = r->c;
    ds_gossip_cfg gc = {
        .mix = !strcmp(c->gossip.mix, "crossover") ? DS_MIX_CROSSOVER : DS_MIX_PAIRWISE,
        .weight = (float)c->gossip.weight,
        .segments = (int)c->gossip.segments,
        .density = c->sparsify.density,
        .error_feedback = c->sparsify.error_feedback,
        .threshold = (float)c->sparsify.threshold,
        .seed = (uint64_t)c->cluster.seed,
        .node_seed = ds_rng_hash_str((uint64_t)c->cluster.seed ^ 0x73707273ull, c->node.name),
        .timeout_ms = (int)c->gossip.timeout_ms,
    };
    if (ds_topo_parse(c->gossip.topology, &gc.topology) < 0 ||
        ds_sparsify_method_parse(c->sparsify.method) < 0) {
        snprintf(err, err_len, "unknown gossip.topology or sparsify.method");
        return -EINVAL;
    }
    gc.method = (enum ds_sparsify_method)ds_sparsify_method_parse(c->sparsify.method);
    r->topo = gc.topology;
    float *theta = host_theta(r);
    int e = ds_gossip_create(&r->gossip, &gc, r->t.model.layer, r->t.model.n_layers,
                             r->t.n_params, theta);
    if (e < 0)
        snprintf(err, err_len, "cannot set up gossip: %s", strerror(-e));
    return e;
}

static uint64_t current_round(const rt *r)
{
    return r->round0 + (uint64_t)(r->t.step / r->c->gossip.every);
}

/* What a shadowing joiner allows for one state fetch (request, the
 * server's next round boundary, 1 MB in chunks): 17-46 ms measured at 8
 * nodes on loopback, 310 ms for the first one (connection set-up). */
#define SHADOW_FETCH_S 0.15

/* Give a snapshot of our model to the nodes that asked (between steps). */
static void serve_state(rt *r)
{
    const float *theta = r->t.theta;
    if (r->t.ops.kind != DS_BACKEND_CPU) {
        r->t.ops.download(r->host_theta, r->t.theta, r->t.n_params * sizeof(float));
        theta = r->host_theta;
    }
    ds_state_serve(r->st, theta, (uint64_t)r->t.step, r->round0, current_round(r), r->rate,
                   ds_now_ms() + 4 * (uint64_t)r->c->transport.op_timeout_ms);
}

/* A late joiner: ask the member that admitted us for its model, step and
 * rounds, and start from them; retry a few times. */
static int fetch_state(rt *r, int attempts, uint64_t attempt_ms)
{
    ds_trainer *t = &r->t;
    float *theta = malloc(t->n_params * sizeof(float));
    if (!theta)
        return -ENOMEM;
    int e = -ETIMEDOUT;
    for (int attempt = 1; attempt <= attempts && !stop_signal; attempt++) {
        const uint64_t t0 = ds_now_ms();
        const uint64_t deadline = t0 + attempt_ms;
        ds_debug("state", "asking %s for the model state (attempt %d)", r->seed_addr, attempt);
        if ((e = ds_state_request(r->st, r->seed_id, r->seed_addr, deadline)) < 0)
            continue;
        ds_state_info info;
        do
            e = ds_state_wait(r->st, ds_now_ms() + 200, theta, &info);
        while (e == -ETIMEDOUT && ds_now_ms() < deadline && !stop_signal);
        if (e < 0) {
            ds_warn("state", "state transfer from %s failed: %s", r->seed_addr, strerror(-e));
            continue;
        }
        if ((e = t->ops.upload(t->theta, theta, t->n_params * sizeof(float))) < 0)
            break;
        t->ops.memzero(t->mom, t->n_params * sizeof(float));
        t->step = (int64_t)info.step;
        r->round0 = info.round0;
        ds_gossip_reset(r->gossip, theta);
        ds_membership_set_round(atomic_load(&r->ms), info.round, ds_now_ms());
        r->pace_t0_ns = ds_now_ns();
        r->pace_r0 = info.round;
        r->pace_rate = info.rounds_per_s;
        ds_info("state", "model state received: step=%llu round=%llu bytes=%zu in %llu ms; "
                "keeping the cluster's pace of %.1f rounds/s until round %llu",
                (unsigned long long)info.step, (unsigned long long)info.round, info.bytes,
                (unsigned long long)(ds_now_ms() - t0), info.rounds_per_s,
                (unsigned long long)r->join_round);
        break;
    }
    free(theta);
    return stop_signal ? -EINTR : e;
}

/* Changes (joins, leaves, deaths) apply LAG_SECONDS after they are
 * decided, in rounds at the rate this node runs: at tens of rounds a second
 * a fixed 32 rounds is shorter than SWIM needs to tell every member
 * (measured: a join reached 8 nodes in 1.5 s, 64 in ~4 periods), and nodes
 * then ran a round or two on different views. Never below 32 rounds. */
#define LAG_SECONDS 5
static void update_lag(rt *r)
{
    const uint64_t now = ds_now_ms(), round = atomic_load(&r->cur_round);
    if (!r->lag_t0_ms) {
        r->lag_t0_ms = now;
        r->lag_r0 = round;
        return;
    }
    if (now - r->lag_t0_ms < 2000)
        return;
    const double rate = (double)(round - r->lag_r0) * 1000.0 / (double)(now - r->lag_t0_ms);
    r->rate = rate;
    /* The lag follows the rate the cluster can run at, not a stall's: the
     * rounds after a crash wait out their timeouts until the suspicion
     * spreads, and a lag sized then (32 rounds) was under half a second
     * once the death was declared and the rounds ran again, so members
     * applied it late. The peak decays by a fifth per window. */
    r->lag_rate = rate > r->lag_rate * 0.8 ? rate : r->lag_rate * 0.8;
    uint64_t lag = (uint64_t)(r->lag_rate * LAG_SECONDS + 0.5);
    if (lag < 32)
        lag = 32;
    if (lag > (1u << 20))
        lag = 1u << 20;
    if (lag > r->lag * 5 / 4 || lag < r->lag * 3 / 4) {
        ds_membership_set_lag(atomic_load(&r->ms), (uint32_t)lag);
        ds_debug("membership", "lag %llu rounds (%.1f rounds/s)", (unsigned long long)lag, rate);
        r->lag = lag;
    }
    r->lag_t0_ms = now;
    r->lag_r0 = round;
}

/* A joiner alone before its join round: do not run ahead of the cluster. */
static void keep_pace(rt *r)
{
    const uint64_t round = current_round(r);
    if (r->pace_rate <= 0 || round >= r->join_round || round <= r->pace_r0)
        return;
    const uint64_t due = r->pace_t0_ns + (uint64_t)((double)(round - r->pace_r0) / r->pace_rate * 1e9);
    const uint64_t now = ds_now_ns();
    if (due > now) {
        const uint64_t ns = due - now;
        const struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
        nanosleep(&ts, NULL);
    }
}

/* Publish the status snapshot (node/runtime/publish.h): at most every
 * 200 ms unless forced (phase changes, the end). */
static void publish_status(rt *r, int force)
{
    if (!r->status || !r->snap)
        return;
    const uint32_t G = r->last_G < r->vcap ? r->last_G : r->vcap;
    const ds_publish_src src = {
        .state = r->leaving && r->phase == DS_STATUS_TRAINING ? DS_STATUS_LEAVING : r->phase,
        .step = r->t.step,
        .steps = r->c->train.steps,
        .round = atomic_load(&r->cur_round),
        .epoch = r->last_epoch,
        .loss = r->st_loss,
        .test_acc = r->st_acc,
        .lr = ds_trainer_lr(&r->t),
        .samples_per_s = r->st_sps,
        .view = r->vbuf,
        .view_len = G,
        .view_size = r->last_G,
        .self_id = r->id.id,
        .gossip = r->gossip,
        .gnet = r->gn,
        .net = r->net,
        .membership = atomic_load(&r->ms),
    };
    ds_publish_status(r->status, r->snap, &r->last_publish_ms, force, &src);
}

/* Training is over (or stopped) but our leave is not effective yet: keep
 * taking part in the rounds, without training, until it is -- the others
 * still count on us. Bounded: 10 s, or a second signal. */
static void linger(rt *r)
{
    announce_leave(r);
    /* Stopped by a signal, a launcher waits only a few seconds before
     * SIGKILL: no lingering then; the leave still spreads, and the others
     * skip us after one timeout until it applies. */
    if (!r->leaving || stop_signal)
        return;
    const uint64_t until = ds_now_ms() + 10000;
    uint64_t round = current_round(r) + 1;
    const int gossiping = ds_topo_gossips(r->topo);
    float *zero = NULL;
    if (round < r->leave_round)
        ds_info("membership", "taking part in rounds %llu..%llu until the leave takes effect",
                (unsigned long long)round, (unsigned long long)r->leave_round - 1);
    for (; round < r->leave_round && stop_count < 2 && ds_now_ms() < until; round++) {
        if (gossiping) {
            if (round_begin(r, round) == 0) {
                ds_gossip_exchange(r->gossip, ds_gnet_io(r->gn));
                round_end(r);
            }
        } else if (set_round_view(r, round) == 0) {
            /* AllReduce: contribute a zero gradient (the others' mean is
             * scaled by (G-1)/G for these last rounds: documented). */
            if (!zero && !(zero = calloc(r->t.n_params, sizeof(float))))
                break;
            memset(zero, 0, r->t.n_params * sizeof(float));
            ds_gossip_allreduce(r->gossip, zero, r->t.n_params, round, ds_gnet_io(r->gn));
        }
        /* Checked after the round, not before: the others may be in this
         * round with us already, sending (dense segments are large), and a
         * node that closed its endpoint under them saw libfabric 1.17
         * crash in fi_close. */
        if (!others_count_on_us(r)) {
            ds_info("membership", "every other member is leaving too: done after round %llu",
                    (unsigned long long)round);
            break;
        }
    }
    free(zero);
}

int ds_node_run(const ds_conf *c)
{
    rt r;
    ds_train_cfg tc;
    char err[1024];
    const uint64_t t_start = ds_now_ns();
    int ret = 0, e;

    memset(&r, 0, sizeof(r));
    r.c = c;
    pthread_mutex_init(&r.lock, NULL);
    pthread_mutex_init(&r.skip_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r.cond, &ca);
    pthread_condattr_destroy(&ca);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    ds_run_train_cfg(c, &tc);
    if (ds_crypto_init() < 0) {
        ds_error("security", "libsodium failed to initialise");
        rt_fini(&r);
        return 1;
    }
    if ((e = load_keys(&r, err, sizeof(err))) < 0 ||
        (e = ds_trainer_init(&r.t, &tc, err, sizeof(err))) < 0) {
        ds_error("node", "cannot start: %s", err);
        rt_fini(&r);
        return 1;
    }
    r.trainer_up = 1;
    ds_trainer *t = &r.t;
    ds_info("train", "%s", t->backend_note);
    if (t->ops.kind == DS_BACKEND_CPU)
        ds_info("train", "openblas_kernels=%s threads=%d", ds_blas_corename(), tc.threads);
    else if (!(r.host_theta = malloc(t->n_params * sizeof(float)))) {
        ds_error("node", "out of memory");
        rt_fini(&r);
        return 1;
    }
    ds_info("train", "model=mlp params=%zu layers=%d train_examples=%zu test_examples=%zu batch=%d",
            t->n_params, t->model.n_layers, t->train.n, t->test.n, tc.batch);

    if ((e = make_gossip(&r, err, sizeof(err))) < 0) {
        ds_error("node", "cannot start: %s", err);
        rt_fini(&r);
        return 1;
    }
    if ((e = open_net(&r, err, sizeof(err))) < 0) {
        ds_error("net", "%s", err);
        rt_fini(&r);
        return 1;
    }
    size_t max_seg = 0;
    for (int i = 0; i < ds_gossip_n_segments(r.gossip); i++)
        if (ds_gossip_segment(r.gossip, i)->len > max_seg)
            max_seg = ds_gossip_segment(r.gossip, i)->len;
    if ((e = ds_gnet_create(&r.gn, r.net, (uint32_t)(max_seg > t->n_params ? max_seg : t->n_params),
                            (size_t)256 << 20)) < 0) {
        ds_error("node", "cannot start: out of memory");
        rt_fini(&r);
        return 1;
    }
    ds_gnet_set_failure_hook(r.gn, gossip_failed_hook, &r);
    ds_gnet_set_heard_hook(r.gn, heard_hook, &r);
    atomic_store(&r.gn_ready, 1);
    if ((e = ds_state_create(&r.st, r.net, t->n_params, 1u << 20)) < 0) {
        ds_error("node", "cannot start: out of memory");
        rt_fini(&r);
        return 1;
    }
    atomic_store(&r.st_ready, 1);
    if (c->status.listen[0] || c->status.file[0]) {
        if (!(r.snap = calloc(1, sizeof(*r.snap)))) {
            ds_error("node", "cannot start: out of memory");
            rt_fini(&r);
            return 1;
        }
        ds_status_snapshot_init(r.snap);
        if ((e = ds_publish_open(&r.status, c->status.listen, c->status.file, r.snap)) < 0) {
            ds_error("status", "cannot serve status on '%s' / write '%s': %s", c->status.listen,
                     c->status.file, strerror(-e));
            rt_fini(&r);
            return 1;
        }
        snprintf(r.snap->name, sizeof(r.snap->name), "%.63s", c->node.name);
        ds_net_addr(r.net, r.snap->addr, sizeof(r.snap->addr));
        snprintf(r.snap->group, sizeof(r.snap->group), "%.31s", c->node.group);
        r.snap->id = r.id.id;
        r.st_acc = -1;
        r.phase = DS_STATUS_JOINING;
        publish_status(&r, 1);
    }
    char addr[128] = "";
    ds_net_addr(r.net, addr, sizeof(addr));
    ds_info("node", "listening on %s id=%016llx security=%s gossip=%s/%s sparsify=%s density=%g",
            addr, (unsigned long long)r.id.id, c->security.mode, c->gossip.topology,
            c->gossip.mix, c->sparsify.method, c->sparsify.density);

    if ((e = start_membership(&r, err, sizeof(err))) < 0 ||
        (e = wait_for_cluster(&r, err, sizeof(err))) < 0) {
        if (e == -EINTR) {
            ds_warn("node", "stopped on signal %d before training", (int)stop_signal);
            ret = 128 + (int)stop_signal;
        } else {
            ds_error("node", "%s", err);
            ret = 1;
        }
        printf("summary node=%s status=%s steps=0 loss=0 test_acc=-1 samples_per_s=0 wall_s=%.1f "
               "backend=%s bytes_sent=0 bytes_received=0 rounds=0\n",
               c->node.name, ret == 1 ? "failed" : "stopped",
               (double)(ds_now_ns() - t_start) * 1e-9, t->ops.name);
        fflush(stdout);
        stop_threads(&r);
        rt_fini(&r);
        return ret;
    }
    if (r.seed_round > 0) {
        /* The cluster is already training: start from its model. */
        r.refresh_pending = 1;
        if ((e = fetch_state(&r, 5, 4 * (uint64_t)c->transport.op_timeout_ms)) < 0) {
            ds_error("state", "no model state from the cluster: %s", strerror(-e));
            stop_threads(&r);
            rt_fini(&r);
            return e == -EINTR ? 128 + (int)stop_signal : 1;
        }
    } else {
        r.round0 = first_round(&r);
        ds_info("gossip", "training starts at round %llu with %lld members",
                (unsigned long long)r.round0, (long long)c->cluster.min_members);
    }
    r.phase = DS_STATUS_TRAINING;
    r.st_acc = -1;
    publish_status(&r, 1);
    if (c->gossip.overlap && ds_topo_gossips(r.topo)) {
        if ((e = pthread_create(&r.comm, NULL, comm_main, &r)) != 0) {
            ds_error("gossip", "cannot start the communication thread: %s", strerror(e));
            rt_fini(&r);
            return 1;
        }
        r.comm_up = 1;
    }

    const int64_t steps = c->train.steps, every = c->gossip.every;
    const int gossiping = ds_topo_gossips(r.topo);
    double loss = 0, loss_window = 0, test_acc = -1, test_loss = 0;
    int64_t window_n = 0;
    uint64_t t_window = ds_now_ns(), train_ns = 0;
    int round_open = 0; /* overlap: a round's exchange is running */

    while (t->step < steps && !stop_signal) {
        keep_pace(&r);
        /* Before our join round (the lag is seconds of rounds) we would
         * train alone, and our solo steps only drift from the cluster's
         * model. So we shadow the cluster instead: take its model, step and
         * rounds every half second, and train only the last few rounds
         * before we enter the view, at its pace. */
        if (r.refresh_pending) {
            /* Our join round can still move earlier (membership: two
             * admitting members, the smaller round wins). */
            ds_member_info self_info;
            if (ds_membership_member(atomic_load(&r.ms), r.id.id, &self_info) == 0 &&
                self_info.join_round != DS_MEMBERSHIP_NO_ROUND && self_info.join_round < r.join_round)
                r.join_round = self_info.join_round;
            const uint64_t margin = 4 + (uint64_t)(r.pace_rate * 0.05);
            /* Time until the cluster (at its pace since our last fetch)
             * is margin rounds before our join round. The last fetch must
             * land before then: one that lands after the join round leaves
             * the rounds with us waiting out their timeouts, and the
             * cluster stalled for seconds (measured: 10-28 s at 8 nodes).
             * So the wait before the next fetch shrinks to fit, and when
             * no fetch fits we train the remaining rounds ourselves. */
            double slack_s = 1e9;
            if (r.pace_rate > 0 && r.join_round > r.pace_r0 + margin)
                slack_s = (double)(r.join_round - margin - r.pace_r0) / r.pace_rate -
                          (double)(ds_now_ns() - r.pace_t0_ns) * 1e-9;
            if (current_round(&r) + margin < r.join_round && slack_s > SHADOW_FETCH_S) {
                double wait_s = slack_s - SHADOW_FETCH_S;
                if (wait_s > 0.5)
                    wait_s = 0.5;
                for (double w = 0; w < wait_s && !stop_signal; w += 0.05)
                    usleep(wait_s - w < 0.05 ? (useconds_t)((wait_s - w) * 1e6) : 50000);
                const int got = stop_signal ? -EINTR : fetch_state(&r, 1, 2000);
                r.refresh_failures = got == 0 ? 0 : r.refresh_failures + 1;
                if (r.refresh_failures >= 3) {
                    /* The cluster may be gone (it finished, or we were
                     * cut off): go on from the last state we have. */
                    ds_warn("state", "no model state for 3 tries: training on alone from step %lld",
                            (long long)t->step);
                    r.refresh_pending = 0;
                }
                if (ds_state_pending(r.st))
                    serve_state(&r);
                continue;
            }
            r.refresh_pending = 0;
            ds_info("state", "shadowed the cluster up to step %lld (round %llu); training on to "
                    "our join round %llu", (long long)t->step,
                    (unsigned long long)current_round(&r), (unsigned long long)r.join_round);
        }
        const uint64_t t0 = ds_now_ns();
        if ((e = ds_trainer_compute_grad(t, &loss, NULL)) < 0) {
            ds_error("train", "step %lld failed: %s", (long long)t->step, strerror(-e));
            ret = e;
            break;
        }
        if (!gossiping) {
            /* AllReduce-SGD: the mean gradient of the view, every step. */
            const uint64_t round = r.round0 + (uint64_t)t->step;
            if (set_round_view(&r, round) == 0) { /* 1: alone, nothing to average */
                float *g = t->grad;
                if (t->ops.kind != DS_BACKEND_CPU) {
                    t->ops.download(r.host_theta, t->grad, t->n_params * sizeof(float));
                    g = r.host_theta;
                }
                if (ds_gossip_allreduce(r.gossip, g, t->n_params, round, ds_gnet_io(r.gn)) < 0)
                    ds_log_rl(DS_LOG_WARN, "gossip", "all-reduce of step %llu incomplete: "
                              "local gradient used", (unsigned long long)round);
                if (t->ops.kind != DS_BACKEND_CPU)
                    t->ops.upload(t->grad, g, t->n_params * sizeof(float));
                r.rounds++;
            }
        }
        ds_trainer_apply_grad(t);
        if (round_open) {
            comm_wait(&r);
            round_end(&r);
            round_open = 0;
        }
        if (gossiping && t->step % every == 0 && round_begin(&r, r.round0 + (uint64_t)(t->step / every)) == 0) {
            if (r.comm_up) {
                comm_start(&r);
                round_open = 1;
            } else {
                ds_gossip_exchange(r.gossip, ds_gnet_io(r.gn));
                round_end(&r);
            }
        }
        if (ds_state_pending(r.st))
            serve_state(&r);
        if (!r.leaving)
            update_lag(&r);
        train_ns += ds_now_ns() - t0;
        loss_window += loss;
        window_n++;

        if (t->step % c->train.log_every == 0 || t->step == steps) {
            const uint64_t now = ds_now_ns();
            const ds_gossip_stats *gs = ds_gossip_get_stats(r.gossip);
            ds_info("train", "step=%lld loss=%.4f samples_per_s=%.0f lr=%.4g rounds=%llu "
                    "exchanges_ok=%llu exchanges_failed=%llu view=%u",
                    (long long)t->step, loss_window / window_n,
                    (double)window_n * tc.batch / ((double)(now - t_window) * 1e-9),
                    (double)ds_trainer_lr(t), (unsigned long long)r.rounds,
                    (unsigned long long)gs->exchanges_ok, (unsigned long long)gs->exchanges_failed,
                    r.last_G);
            r.st_loss = loss_window / window_n;
            r.st_sps = (double)window_n * tc.batch / ((double)(now - t_window) * 1e-9);
            loss_window = 0;
            window_n = 0;
            t_window = now;
        }
        if ((c->train.eval_every > 0 && t->step % c->train.eval_every == 0) || t->step == steps) {
            if (round_open) {
                comm_wait(&r);
                round_end(&r);
                round_open = 0;
            }
            if ((e = ds_trainer_evaluate(t, &test_loss, &test_acc)) < 0) {
                ds_error("eval", "evaluation failed: %s", strerror(-e));
                ret = e;
                break;
            }
            ds_info("eval", "step=%lld test_loss=%.4f test_acc=%.4f", (long long)t->step,
                    test_loss, test_acc);
            r.st_acc = test_acc;
        }
        publish_status(&r, 0);
    }
    if (round_open) {
        comm_wait(&r);
        round_end(&r);
    }
    if (stop_signal && ret == 0) {
        ds_warn("train", "stopping on signal %d at step %lld", (int)stop_signal, (long long)t->step);
        if (ds_trainer_evaluate(t, &test_loss, &test_acc) < 0)
            test_acc = -1;
    }
    linger(&r);
    leave_and_drain(&r);

    ds_net_stats ns;
    ds_net_stats_get(r.net, &ns);
    const ds_gossip_stats *gs = ds_gossip_get_stats(r.gossip);
    const double wall = (double)(ds_now_ns() - t_start) * 1e-9;
    const double sps = train_ns ? (double)t->samples / ((double)train_ns * 1e-9) : 0;
    const char *status = ret < 0 ? "failed" : stop_signal ? "stopped" : "done";
    r.phase = ret < 0 ? DS_STATUS_FAILED : stop_signal ? DS_STATUS_STOPPED : DS_STATUS_DONE;
    r.st_acc = test_acc;
    publish_status(&r, 1);
    ds_info("train", "summary status=%s steps=%lld test_acc=%.4f rounds=%llu exchanges_ok=%llu "
            "exchanges_failed=%llu stale=%llu late=%llu dropped=%llu wait_s=%.2f "
            "max_round_s=%.3f",
            status, (long long)t->step, test_acc, (unsigned long long)r.rounds,
            (unsigned long long)gs->exchanges_ok, (unsigned long long)gs->exchanges_failed,
            (unsigned long long)gs->stale_received, (unsigned long long)gs->late,
            (unsigned long long)gs->dropped, (double)gs->wait_ns * 1e-9,
            (double)gs->max_wait_ns * 1e-9);
    if (ds_run_save_model(c->node.data_dir, t, err, sizeof(err)) < 0)
        ds_warn("train", "final model not saved: %s", err);
    printf("summary node=%s status=%s steps=%lld loss=%.4f test_acc=%.4f samples_per_s=%.0f "
           "wall_s=%.1f backend=%s bytes_sent=%llu bytes_received=%llu rounds=%llu "
           "max_round_s=%.3f\n",
           c->node.name, status, (long long)t->step, loss, test_acc, sps, wall, t->ops.name,
           (unsigned long long)ns.bytes_sent, (unsigned long long)ns.bytes_recv,
           (unsigned long long)r.rounds, (double)gs->max_wait_ns * 1e-9);
    fflush(stdout);
    const int sig = (int)stop_signal;
    const int code = ret < 0 ? 1 : sig ? 128 + sig : 0;
    /* The process ends here, and the libfabric endpoint is left to the
     * kernel rather than closed: fi_close on a tcp;ofi_rxm endpoint into
     * which a peer is still sending a large message (a peer's last dense
     * segment, when nodes finish together) crashed libfabric 1.17 with
     * SIGSEGV (dsbench cluster, crossover-dense at 100 Mbit/s: one node in
     * two runs). Our last frames have been drained above; the kernel
     * flushes and closes the sockets. Everything else is torn down as
     * usual, secrets wiped. */
    ds_status_destroy(&r.status);
    stop_threads(&r);
    ds_identity_wipe(&r.id);
    ds_cluster_key_wipe(&r.ck);
    fflush(NULL);
    _exit(code);
}
