/*
 * node/runtime/engine_impl.h: the engine's state, private to node/runtime.
 * engine.c (open, listen, join, close, the network and membership
 * callbacks, the failure detector), rounds.c (views, rounds, the comm
 * thread, state transfer, pacing, shadowing, lag, leaving) read it; a
 * client uses engine.h.
 *
 * Locking. `lock` with `cond` guards the thread handshakes (stop_threads,
 * comm_go/comm_done), the join outcome (joined, seed_*, refused*), and is
 * the wait for the failure detector's timer. `skip_lock` guards `skip`:
 * the net worker, the comm thread and membership's callbacks mark peers
 * there while the main thread reads it. ms, gn_ready, st_ready and
 * cur_round are atomics, read by the net worker. Everything else belongs
 * to the main thread.
 */
#ifndef DS_NODE_RUNTIME_ENGINE_IMPL_H
#define DS_NODE_RUNTIME_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "node/gossip/group.h"
#include "node/gossip/gossip_net.h"
#include "node/gossip/state.h"
#include "node/membership/membership.h"
#include "node/runtime/engine.h"
#include "node/runtime/hier.h"
#include "node/runtime/lag.h"
#include "node/runtime/leave.h"
#include "node/runtime/pace.h"
#include "node/runtime/skip.h"
#include "node/sec/crypto.h"
#include "node/status/status.h"

/* group.allreduce = auto: reductions of each algorithm member 0 times
 * (rounds.c). */
#define DS_AUTO_PROBE 8
/* The cost model's samples per algorithm: the probe's steps, each its
 * layers' buckets and its own reduction. */
#define DS_AUTO_FIT_MAX (DS_AUTO_PROBE * 32)

/* group.overlap: a reduction's tag is the group's count << 8 | its place
 * in the step (the layers in the order handed over, then the step's own
 * at 255), so the layers of a step come in order and before the next
 * step's. */
#define DS_LAYER_TAG_BITS 8
#define DS_LAYER_TAG_MAX 254

/* group.overlap: one layer's reduction, handed to the layer thread
 * (rounds.c, "layer reductions"). */
struct ds_ljob {
    size_t off, len;          /* the layer's range of the gradient */
    uint32_t pos;             /* its place in the step's order: the tag's low byte */
    int algo;                 /* enum ds_greduce_algo it was asked to run */
    int e;                    /* ds_greduce_run's return */
    ds_greduce_result res;
    uint64_t ns;              /* how long it took */
};

struct ds_engine {
    const ds_conf *c;
    ds_engine_stop stop;
    enum ds_sec_mode mode;   /* from conf, parsed once (settings_from_conf) */
    ds_gossip_cfg gcfg;      /* from conf, parsed once */
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
    /* The client's numbers (ds_engine_report). */
    int phase;                   /* enum ds_status_state */
    double st_loss, st_acc, st_sps, st_lr;
    int64_t step;                /* optimizer steps taken, as last told */
    ds_engine_params p;          /* the client's parameters */
    int registered;
    enum ds_topo_kind topo;

    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: fd thread, join and comm waits */
    int stop_threads;
    int joined;
    uint64_t seed_id;    /* the member that answered our JOIN, its round */
    char seed_addr[DS_WIRE_ADDR_MAX + 1];
    char advertise[DS_WIRE_ADDR_MAX + 1]; /* ds_preflight_advertise: what peers dial */
    uint64_t seed_round;
    int refused;         /* a seed refused our handshake: not admitted */
    char refused_by[DS_WIRE_ADDR_MAX + 1];
    int join_failed;     /* membership gave up joining (JOIN_FAILED) */
    char join_failed_why[160];
    pthread_t fd;
    int fd_up;

    /* overlap: the comm thread runs ds_gossip_exchange between begin/end */
    pthread_t comm;
    int comm_up, comm_go, comm_done;
    int round_open;      /* a round's exchange is running on the comm thread */

    /* Peers not waited for (skip.h), under skip_lock. */
    pthread_mutex_t skip_lock;
    /* Membership's news about members (its thread), for the status
     * timeline: queued under ev_lock (a leaf lock), moved into the
     * snapshot by the main thread when it publishes. */
    pthread_mutex_t ev_lock;
    ds_status_events evq;
    ds_skip_table skip;
    _Atomic uint64_t cur_round;

    ds_member_info *vbuf; /* the view of the round being set up: vcap entries */
    uint32_t vcap;
    uint64_t *vids;
    const char **vaddrs;
    uint64_t round0;     /* round = round0 + step / gossip.every */
    ds_lag lag;          /* membership's lag and the pace measured (lag.h) */
    uint64_t join_round; /* ours, from SELF_JOINED */
    ds_pace pace;        /* a joiner keeps the cluster's pace (pace.h) */
    uint64_t cluster_lag; /* the lag of the member that sent our state (0: unknown) */
    uint64_t state_asked_ms; /* when we asked for the state we adopted last */
    int refresh_pending; /* shadow the cluster's state until our join round */
    /* SELF_REJOINED (declared dead, or stopped past the suspicion timeout):
     * our new join round, taken by the training thread before its next
     * step (under lock). */
    int rejoin_pending;
    uint64_t rejoin_round;
    uint64_t rejoins;    /* rejoins taken (state fetched, shadowed) */
    int refresh_failures;
    int leaving;         /* LEAVE announced, effective at leave_round */
    uint64_t leave_round;
    uint64_t rounds;
    int resumed;           /* ds_ckpt_load ran: the client's own state */
    uint64_t resume_round; /* the round of that checkpoint */
    uint32_t last_G;
    uint64_t last_epoch;

    /* Hierarchy (rounds.c, design §5). group: node.group resolved ("auto":
     * the host name); empty: no group. Main thread, but gn_grp_ready. */
    char group[DS_WIRE_GROUP_MAX + 1];
    ds_gnet *gn_grp;           /* the group's reduction frames (ALLREDUCE) */
    _Atomic int gn_grp_ready;
    ds_greduce *gred;
    float *gvec;               /* ds_hier_vec_len(n) floats */
    float *gcarry;             /* n: round deltas not yet sent to the group */
    float *addbuf;             /* n zeros between rounds: with p.add, a round's deltas */
    uint32_t *glist_idx;       /* glist_cap: this step's (index, value) pairs */
    float *glist_val;
    uint32_t glist_cap;
    /* group.sparsify = micro (rounds.c, group_reduce): the sparsifier,
     * this member's error-feedback residual (n) and the gathered sums,
     * [gradient (n) | round deltas (n)]. NULL: the dense mean. */
    ds_sparsifier *gsp;
    float *gres;
    float *gsout;
    uint32_t *vorder, *vgidx;  /* vcap each: the view sorted by group */
    uint64_t *gmembers;        /* vcap: the step's group, by member index */
    uint8_t *gskip;            /* vcap: members not waited for this step */
    uint32_t gsize, gmember;
    uint64_t gseq;             /* the group's reduction count: message tags */
    int gpending;              /* a round's exchange ended, its delta not yet summed */
    uint64_t gexch_t0;         /* when that exchange started (ns) */
    int grouped;               /* the last round's view had groups: vbuf sorted by
                                * group, vgidx each entry's */
    uint32_t last_nodes;       /* nodes in the last round's view */
    /* group.allreduce = auto (rounds.c, auto_next): the algorithm of the
     * next reduction, as member 0 published it in the last one; member
     * 0's reductions since the group formed, its timings of each
     * algorithm in the probe (index: enum ds_greduce_algo) and its choice. */
    int galgo, gauto_choice;
    uint32_t gauto_n;
    uint64_t gauto_ns[3][DS_AUTO_PROBE];
    uint32_t gauto_cnt[3];
    /* With group.overlap: member 0's samples in the probe (length in
     * floats, ms) of direct [0] and the butterfly [1], layers and steps
     * alike; the cost model fitted to them, which member 0 publishes in
     * every reduction (gcost_ok: one came), and from which each member
     * picks each layer's algorithm (ds_greduce_pick). */
    double gfit_x[2][DS_AUTO_FIT_MAX], gfit_y[2][DS_AUTO_FIT_MAX];
    uint32_t gfit_n[2];
    ds_greduce_cost gcost, gcost_pub;
    int gcost_ok, gcost_pub_ok;
    ds_group_stats gst;
    /* group.overlap (rounds.c, "layer reductions"): the layer thread
     * reduces each layer's gradient as the client's backward hands it over
     * (ds_engine_layer_ready), and the step's reduction waits for those.
     * lq_n and lq_done are under `lock` (`cond` wakes both sides); while
     * lq_done < lq_n the layer thread owns gred, lgseq and the jobs from
     * lq_done on, the main thread the rest (it writes lq[lq_n] before it
     * raises lq_n). lopen: 0 no layer handed over yet this step, 1 the
     * step's layers are on their way, -1 this step reduces its gradient
     * whole in its own reduction (no group, or lok is 0). lok: this
     * member's last step reduction, and its layers, completed since the
     * group formed; until then the layers wait (rounds.c, layer_open). */
    pthread_t lth;
    int lth_up;
    int lopen;
    int lok;
    struct ds_ljob *lq;       /* p.n_layers */
    uint8_t *lsent;           /* p.n_layers: handed over this step */
    uint32_t lq_n, lq_done;
    size_t lb_off, lb_len;    /* layers gathered, not yet handed to the thread */
    uint64_t lgseq;           /* the group's count as the layer thread runs it */
    uint64_t ldeadline_ns;    /* the step's layers' deadline */
    int ldoubt;               /* a member in doubt: each layer runs direct */
    uint64_t lwaited_ns;      /* the step waited this long for its layers */
    uint64_t hist_round, hist_t0_ns; /* the round in progress, for the status history */
    /* The round in progress between groups (set_group_view), for the
     * history: its groups (rg_*: count, ours, our member index and group
     * size) and, copied at its begin (the step's group_at may reload vbuf
     * before it ends), its nodes sorted by group and each one's group. */
    uint32_t rg_groups, rg_group, rg_member, rg_size;
    int hist_grouped;
    uint32_t hist_n, hist_cap;
    uint64_t *hist_ids;
    uint32_t *hist_gidx;
    uint64_t steps_here;  /* ds_engine_step calls: steps this process trained */
    ds_round_clock rclock; /* when the last training rounds began: lingering's pace */
};

/* The name the runtime's functions have always used for it. */
typedef struct ds_engine rt;

/* The status page's history of completed rounds (engine.c): mark a
 * round's begin, then record it once it has ended (the round's thread,
 * after ds_gossip_end). */
void ds_rt_round_began(rt *r, uint64_t round);
void ds_rt_round_ended(rt *r);

/* Wait on r->cond (r->lock held) until woken or until_ms (ds_now_ms). */
void ds_rt_timed_wait(rt *r, uint64_t until_ms);

/* The client's stop requests (ds_engine_stop). */
static inline int ds_rt_stop_signal(const rt *r)
{
    return (int)*r->stop.signal;
}

static inline int ds_rt_stop_count(const rt *r)
{
    return (int)*r->stop.count;
}

#endif
