/*
 * node/gossip/latency.h: how long a gossip round waits, and which partner
 * it does not wait for, from the exchange times it measured. A pure
 * module: the caller passes every time in nanoseconds; no clock, no lock,
 * no global. The gossip engine (gossip.c) feeds it and asks it once per
 * round.
 *
 * The rules (docs/gossip.md, "Stragglers"), and why:
 * - The adaptive deadline. A round waits at most factor x the median of
 *   the last DS_GLAT_ROUNDS rounds' waits (the time until the last
 *   awaited exchange of the round finished; a round cut at its deadline
 *   counts its full wait), clamped to [floor, gossip.timeout_ms] (the
 *   floor is gossip.min_wait_ms, 10 ms: every TCP retransmission on a
 *   lossy partner's link cut a round at the floor, so at 100 ms 5% loss
 *   on one node's link slowed the others to 0.42x). With
 *   too few samples it is the timeout. A dead partner then costs a few
 *   median rounds instead of gossip.timeout_ms, and under load the median
 *   grows with the rounds, so a busy machine does not cut healthy rounds.
 * - The slow partner. Each partner's recent latencies (request sent to
 *   reply received, less the time the request sat queued at the partner
 *   while the partner waited on others, which the reply reports; a reply
 *   that comes rounds late counts its whole wait, a wait cut at the
 *   deadline what it waited) keep a mean. Without the subtraction, a
 *   cluster in lockstep behind one lossy link saw every partner about as
 *   slow as that link, each having waited for it. A mean: a lossy link
 *   whose replies are mostly fast but one in a few held by a TCP
 *   retransmission costs every round that waits for it, and its median
 *   hides that. A partner whose mean is over slow_ratio x the median of
 *   all partners' means (its own included, so only a minority can be
 *   slow: when most
 *   partners look slow, this node is the one ahead in rounds and must
 *   wait), and over floor_slow_ns, is slow: the round does not wait for
 *   it, and an exchange it has not finished is kept open into later
 *   rounds (gossip.c). It stays slow until its mean is under
 *   clear_ratio x the others' (hysteresis): waited for less, its link
 *   drains and its latency drops, and a single threshold made the verdict
 *   flap, the rounds waiting for it every other window. A 10 Mbit/s link made every round wait for the one
 *   slow node (issue 16: 4.2x slower for everyone) without ever missing
 *   the 2 s deadline. Since the slow partner's replies are still measured
 *   when they come late, a partner that is fast again is waited for again.
 * - The share of a slow link (ds_glat_share). A partner whose mean
 *   exchange takes longer than share_factor (2) x this node's median
 *   round interval gets a share of k in each exchange (gossip.c,
 *   ds_gossip_trim), down by the ratio while too slow, back up by 1.25x
 *   while under half the target (1.08x cut 3-5x fewer rounds at the
 *   deadline on the way up, the others' rate 0.90x against 0.84x, and
 *   lost more accuracy: -0.29 pt against -0.22; docs/benchmarks.md).
 *   At 10 Mbit/s a full MiCRO 1% exchange needed four to eight rounds of
 *   the link: exchanges queued in the token bucket, came rounds late, and
 *   the slow node's model sat 10x further from the others' (issue 16);
 *   with the share, 2x closer.
 */
#ifndef DS_NODE_GOSSIP_LATENCY_H
#define DS_NODE_GOSSIP_LATENCY_H

#include <stdint.h>

#define DS_GLAT_ROUNDS 32 /* round waits kept */
#define DS_GLAT_PEER 8    /* latencies kept per partner */

typedef struct ds_glat_cfg {
    uint64_t floor_ns;      /* the deadline is never below this */
    uint64_t ceil_ns;       /* nor above (gossip.timeout_ms) */
    double factor;          /* deadline = factor x median round wait */
    double slow_ratio;      /* slow: mean over slow_ratio x the partners' median mean */
    double clear_ratio;     /* slow until under clear_ratio x (1 < clear <= slow) */
    uint64_t floor_slow_ns; /* and over this (microsecond noise is no straggler) */
    uint32_t min_samples;   /* samples before either rule applies */
    double share_factor;    /* ds_glat_share's target: this x the median round period */
    double share_up;        /* its step up (> 1) while well under the target */
} ds_glat_cfg;

struct ds_glat_peer {
    uint64_t s[DS_GLAT_PEER];
    uint32_t n, pos;
    int slow;      /* the last verdict */
    uint32_t fresh; /* samples since the share last moved */
    float share;   /* of k an exchange with it carries (ds_glat_share) */
};

/* Zero it, then ds_glat_init. Owned by the caller; not thread-safe. */
typedef struct ds_glat {
    ds_glat_cfg cfg;
    uint64_t round[DS_GLAT_ROUNDS];
    uint32_t n, pos;
    uint64_t period[DS_GLAT_ROUNDS]; /* intervals between round starts */
    uint32_t pn, ppos;
    struct ds_glat_peer *peer; /* G entries, by view index */
    uint32_t G;
} ds_glat;

/* The deadline's floor when none is given: gossip.min_wait_ms's default. */
#define DS_GLAT_FLOOR_MS 10

/* The engine's defaults for a timeout of timeout_ms and a floor of
 * floor_ms (<= 0: DS_GLAT_FLOOR_MS; never over the timeout) (gossip.c). */
void ds_glat_cfg_default(ds_glat_cfg *cfg, int timeout_ms, int floor_ms);

/* 0, or -EINVAL (floor > ceil, factor < 1, not 1 < clear_ratio <=
 * slow_ratio, share_factor <= 0, share_up <= 1). */
int ds_glat_init(ds_glat *t, const ds_glat_cfg *cfg);
void ds_glat_free(ds_glat *t);

/* A new view of G members: the partners' samples are forgotten (view
 * indices name other nodes now), the round waits kept. 0 or -ENOMEM. */
int ds_glat_set_view(ds_glat *t, uint32_t G);

/* A round waited wait_ns for its awaited exchanges. */
void ds_glat_round(ds_glat *t, uint64_t wait_ns);

/* Partner `peer` (view index) took ns for one exchange. */
void ds_glat_peer(ds_glat *t, uint32_t peer, uint64_t ns);

/* A round started period_ns after the one before. */
void ds_glat_period(ds_glat *t, uint64_t period_ns);

/* The share of k (in [DS_GLAT_SHARE_MIN, 1]) an exchange with partner
 * `peer` carries, updated: it moves once DS_GLAT_PEER / 2 new samples
 * came since it last could, down by target / mean (at most halved) while
 * the partner's mean exchange takes longer than target = share_factor x
 * the median round period (at least floor_slow_ns), up by share_up
 * (1.25; to 1 at most) while it takes under half of that; with fewer than
 * min_samples samples or periods it stays. Call it once a round. */
float ds_glat_share(ds_glat *t, uint32_t peer);
#define DS_GLAT_SHARE_MIN (1.0f / 32.0f)
/* The share as it stands (1 for an unknown partner). */
float ds_glat_peer_share(const ds_glat *t, uint32_t peer);

/* The next round's deadline, from its start. */
uint64_t ds_glat_deadline_ns(const ds_glat *t);

/* 1 when partner `peer` is slow (rule above), else 0; the verdict is
 * kept for the hysteresis. */
int ds_glat_slow(ds_glat *t, uint32_t peer);

/* The median of partner `peer`'s samples; 0 without any. */
uint64_t ds_glat_peer_median(const ds_glat *t, uint32_t peer);
/* The mean of its samples (what the slow rule compares), 0 when none. */
uint64_t ds_glat_peer_mean(const ds_glat *t, uint32_t peer);

/* Pacing (docs/gossip.md, "Pacing"): whether a node in round `mine` runs
 * more than `slack` rounds ahead of its view, i.e. of the lower median of
 * rounds[0..n) (this node's own round and the rounds of the partners it
 * has heard from lately; the array is sorted in place). A median, so that
 * one straggler or a frozen member holds nobody back, while a node ahead
 * of most of its view waits for it. With n < 2 it is never ahead. */
int ds_glat_ahead(uint64_t mine, uint64_t *rounds, uint32_t n, uint64_t slack);

#endif
