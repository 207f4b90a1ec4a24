/*
 * node/gossip/gossip.c: the gossip engine (see gossip.h for the data flow).
 *
 * Round pacing (design §5). A node in round r sends its REQs, then serves
 * messages until it has a reply to each of its REQs and every REQ the
 * schedule says it will receive, or until the round's deadline (latency.h:
 * a few times the median round, never over gossip.timeout_ms). Partners
 * that are slow (latency.h) or already past round r are not waited for.
 * Messages for a later round are kept (bounded) and served when this node
 * gets there; a REQ for a round that is over here is answered from snap
 * when its sender was our in-neighbour then, else it gets STALE, so the
 * initiator stops waiting at once instead of at its deadline. A peer that
 * misses the deadline is reported through io->peer_failed.
 *
 * Time comes only from the io (io->now_ns): deadlines, the grace for
 * peers not waited for and the wait counters are all on the io's clock.
 * Under node/gossip/fake.c that clock moves only when a wait runs out, so
 * a test can tell "nobody waited for the dead peer" from the clock itself.
 *
 * Departures from the papers, and why:
 * - An exchange still open when its round ends is kept open (struct late):
 *   its reply, whenever it comes, is applied in the round we are in then,
 *   from the same two floats the responder used, so the sum stays exact.
 *   Only a slot given up (late_lost) can leave a reply without its
 *   exchange (counted as late). docs/gossip.md, "Stragglers".
 * - Error feedback at gossip level: the values sent are parameters, not
 *   drift; acc only decides WHICH coordinates to mix (the largest local
 *   drift) and forgets them once mixed. A failed exchange gives the drift
 *   back so the coordinates are chosen again.
 * - The AllReduce-SGD baseline uses the same seam and queue: a ring
 *   reduce-scatter then all-gather of the dense gradient, averaged.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu.h"
#include "node/gossip/gossip.h"
#include "node/gossip/latency.h"
#include "node/wire/values.h"
#include "base/log.h"

enum { OUT_NONE = 0, OUT_PENDING, OUT_OK, OUT_FAILED, OUT_SKIPPED };

#define WAIT_NAMED 16 /* peers ds_gossip_waiting can name */
enum { SKIP_NONE = 0, SKIP_NOWAIT, SKIP_ALL }; /* g->skip[] */
#define NOWAIT_GRACE_NS 10000000u /* 10 ms: a reply from a peer back on time */
#define LATE_SLOTS 4      /* exchanges kept open past their round, per segment */
#define LATE_TIMEOUTS 4   /* given up after this many gossip timeouts */
#define PACE_ROUNDS 8     /* how far ahead of its view's median a node may run */

struct gout {
    uint32_t target; /* == me: nothing initiated */
    int state;
    size_t count, cap;
    uint32_t *idx;   /* S (segment-relative) */
    float *val;      /* snap[S]: what we sent */
    float *stash;    /* acc[S] before it was zeroed */
    uint64_t sent_ns; /* when the REQ went out (io clock) */
    uint64_t latency_ns; /* sent to RESP (pairwise) or the CROSS's send; 0: not ok */
};

/* A pairwise exchange still open after its round ended (docs/gossip.md,
 * "Stragglers"): what we sent, so that its reply, whenever it comes,
 * adds our half w (theirs - ours) from the same two floats the responder
 * used for its half. The sum stays exact however late the reply. */
struct late {
    int used;
    uint64_t epoch, round, sent_ns;
    uint32_t target;
    float w; /* the exchange's weight (exchange_weight when it was sent) */
    size_t count;
    uint32_t *idx; /* out[s].cap entries */
    float *val;
};

/* A message kept for a later round (owned copies of its arrays). */
struct qmsg {
    ds_gmsg m;
    uint64_t waited_at; /* g->waited_ns when it was queued */
    uint32_t *idx;
    float *val;
};

struct ds_gossip {
    ds_gossip_cfg cfg;
    size_t n;
    int n_seg;
    ds_gseg *seg;
    size_t max_len;
    float *acc, *snap, *delta;
    /* Where delta may be non-zero: the indices the exchanges wrote
     * (duplicates allowed), so that ds_gossip_apply visits those alone;
     * or "anywhere" (delta_dense: a crossover mix, the caller's own writes
     * through ds_gossip_delta, more indices than the list holds). */
    uint32_t *touched;
    size_t n_touched, touched_cap;
    int delta_dense;
    ds_sparsifier **sp;
    ds_select_ops sel;
    struct gout *out;
    uint32_t max_in;
    uint32_t *in_from;   /* n_seg x max_in */
    uint8_t *in_done;    /* n_seg x max_in */
    uint32_t *in_n;      /* n_seg */
    uint32_t *scratch;   /* G entries for the topology */
    uint8_t *skip;       /* G entries: peers not waited for this round
                          * (SKIP_ALL: nor sent to; SKIP_NOWAIT: sent to) */
    uint8_t *ahead;      /* G entries: peers seen past this round already */
    uint8_t *slow;       /* G entries: partners too slow to wait for (latency.h) */
    uint64_t *peer_round; /* G entries: the latest round each partner was in */
    uint64_t *peer_at;    /* G entries: our round when that was last heard */
    uint64_t *peer_seen;  /* G entries: when a message last came (io clock; 0: never) */
    uint64_t *pace_buf;   /* G entries: the view's rounds, for their median */
    uint32_t *chk_in;    /* max_in entries: a past round's initiators */
    float *resp;         /* max_len: values of a reply */
    uint32_t G, me;
    uint64_t epoch, round;
    uint32_t next_G, next_me;
    uint64_t next_epoch;
    int view_set;
    /* Hierarchy: this node handles segment s iff s mod share_size ==
     * share_member (ds_gossip_set_share; 1 and 0: every segment). */
    uint32_t share_member, share_size;
    uint32_t next_share_member, next_share_size;
    /* next_grouped: the participants are groups (ds_gossip_set_share).
     * pairs: between two of them, one exchange per segment
     * (ds_topo_pair_initiator) with the two's weight (exchange_weight). */
    int pairs, next_grouped;
    struct qmsg *q;
    int qn, qcap;
    struct qmsg held; /* a queued message being served (arrays owned) */
    int ared_stopped; /* this all-reduce's recv answered an error */
    struct late *late;  /* n_seg x LATE_SLOTS (pairwise only) */
    ds_glat lat;        /* the adaptive deadline and slow partners */
    uint64_t lat_epoch; /* view the partners' latencies are of */
    uint32_t lat_G;
    uint64_t t0;        /* this exchange's start (io clock) */
    uint64_t waited_ns; /* all time spent in recv waits, this node's own */
    uint64_t held_ns;   /* the REQ being served waited this long on them */
    ds_gossip_stats st;

    /* What another thread may read (ds_gossip_report): a copy of st and
     * of each segment's exchange, taken under pub_lock by the thread that
     * runs the round at the end of begin, exchange, end, all-reduce and
     * reset. The live fields above belong to the round's thread. */
    pthread_mutex_t pub_lock;
    ds_gossip_stats pub_st;
    ds_gossip_xinfo *pub_x;   /* n_seg; in_from unset */
    uint32_t *pub_in;         /* n_seg x pub_max_in */
    uint32_t pub_max_in;
    /* the peers the exchange in progress still waits for (view indices,
     * the first WAIT_NAMED of pub_wait_n), as of its last message */
    uint32_t pub_wait[WAIT_NAMED];
    uint32_t pub_wait_n;
};

/* ---- segments ----------------------------------------------------------- */

int ds_gossip_segments(const ds_layer *layers, int n_layers, size_t n, int want, ds_gseg *out)
{
    if (n_layers <= 0 || n == 0 || want < 0)
        return -EINVAL;
    if (want == 0) {
        for (int i = 0; i < n_layers; i++) {
            out[i].off = layers[i].off;
            out[i].len = layers[i].len;
        }
        return n_layers;
    }
    if ((size_t)want > n)
        want = (int)n;
    const size_t ideal = n / (size_t)want;
    size_t prev = 0;
    int k = 0;
    for (int s = 1; s <= want; s++) {
        size_t cut = s == want ? n : (size_t)((double)n * s / want);
        if (s < want) {
            /* Move the cut to the nearest layer boundary within a quarter
             * segment, so a layer is not split when it need not be. */
            size_t best = cut, bestd = ideal / 4 + 1;
            for (int i = 1; i < n_layers; i++) {
                const size_t b = layers[i].off;
                const size_t d = b > cut ? b - cut : cut - b;
                if (d < bestd && b > prev) {
                    best = b;
                    bestd = d;
                }
            }
            cut = best;
        }
        if (cut <= prev)
            continue;
        out[k].off = prev;
        out[k].len = cut - prev;
        prev = cut;
        k++;
    }
    return k;
}

/* ---- create / destroy ---------------------------------------------------- */

static void free_queue(ds_gossip *g)
{
    for (int i = 0; i < g->qn; i++) {
        free(g->q[i].idx);
        free(g->q[i].val);
    }
    g->qn = 0;
}

void ds_gossip_destroy(ds_gossip **gp)
{
    if (!gp || !*gp)
        return;
    ds_gossip *g = *gp;
    for (int s = 0; g->sp && s < g->n_seg; s++)
        ds_sparsifier_destroy(&g->sp[s]);
    for (int s = 0; g->out && s < g->n_seg; s++) {
        free(g->out[s].idx);
        free(g->out[s].val);
        free(g->out[s].stash);
    }
    for (int i = 0; g->late && i < g->n_seg * LATE_SLOTS; i++) {
        free(g->late[i].idx);
        free(g->late[i].val);
    }
    free(g->late);
    ds_glat_free(&g->lat);
    free_queue(g);
    free(g->q);
    free(g->held.idx);
    free(g->held.val);
    free(g->sp);
    free(g->out);
    free(g->seg);
    free(g->acc);
    free(g->snap);
    free(g->delta);
    free(g->touched);
    free(g->in_from);
    free(g->in_done);
    free(g->in_n);
    free(g->scratch);
    free(g->skip);
    free(g->ahead);
    free(g->slow);
    free(g->peer_round);
    free(g->peer_at);
    free(g->peer_seen);
    free(g->pace_buf);
    free(g->chk_in);
    free(g->resp);
    free(g->pub_x);
    free(g->pub_in);
    pthread_mutex_destroy(&g->pub_lock);
    free(g);
    *gp = NULL;
}

/* Layer boundaries inside [off, off+len), relative to off, as DEFT units. */
static size_t segment_units(const ds_layer *layers, int n_layers, const ds_gseg *sg,
                            uint32_t *unit_off)
{
    size_t u = 0;
    unit_off[u++] = 0;
    for (int i = 0; i < n_layers; i++) {
        const size_t end = layers[i].off + layers[i].len;
        if (end > sg->off && end < sg->off + sg->len)
            unit_off[u++] = (uint32_t)(end - sg->off);
    }
    unit_off[u] = (uint32_t)sg->len;
    return u;
}

/* The open-exchange slots, each as large as its segment's REQ. */
static int late_alloc(ds_gossip *g)
{
    g->late = calloc((size_t)g->n_seg * LATE_SLOTS, sizeof(*g->late));
    if (!g->late)
        return -ENOMEM;
    for (int s = 0; s < g->n_seg; s++)
        for (int k = 0; k < LATE_SLOTS; k++) {
            struct late *l = &g->late[s * LATE_SLOTS + k];
            const size_t cap = g->out[s].cap ? g->out[s].cap : 1;
            l->idx = malloc(cap * sizeof(uint32_t));
            l->val = malloc(cap * sizeof(float));
            if (!l->idx || !l->val)
                return -ENOMEM;
        }
    return 0;
}

int ds_gossip_create(ds_gossip **out, const ds_gossip_cfg *cfg, const ds_layer *layers,
                     int n_layers, size_t n_params, const float *theta)
{
    *out = NULL;
    if (!cfg || !layers || n_layers <= 0 || n_params == 0 || !theta || cfg->weight <= 0 ||
        cfg->weight > 0.5f || cfg->timeout_ms <= 0)
        return -EINVAL;
    if (cfg->mix != DS_MIX_PAIRWISE && cfg->mix != DS_MIX_CROSSOVER)
        return -EINVAL;
    if (cfg->mix == DS_MIX_CROSSOVER && cfg->method != DS_SPARSIFY_NONE)
        return -EINVAL;
    if (!ds_wire_vfmt_width((unsigned)cfg->value_format))
        return -EINVAL;
    if (cfg->segments < 0 || (size_t)cfg->segments > n_params)
        return -EINVAL; /* more segments than parameters: refused, not reserved */
    ds_gossip *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    pthread_mutex_init(&g->pub_lock, NULL);
    g->cfg = *cfg;
    g->n = n_params;
    const int max_seg = cfg->segments > n_layers ? cfg->segments : n_layers;
    g->seg = calloc((size_t)max_seg, sizeof(*g->seg));
    if (!g->seg)
        goto nomem;
    g->n_seg = ds_gossip_segments(layers, n_layers, n_params, cfg->segments, g->seg);
    if (g->n_seg <= 0) {
        ds_gossip_destroy(&g);
        return -EINVAL;
    }
    for (int s = 0; s < g->n_seg; s++)
        if (g->seg[s].len > g->max_len)
            g->max_len = g->seg[s].len;
    if (g->max_len > UINT32_MAX) {
        ds_gossip_destroy(&g);
        return -EOVERFLOW;
    }

    g->acc = calloc(n_params, sizeof(float));
    g->snap = malloc(n_params * sizeof(float));
    g->delta = calloc(n_params, sizeof(float));
    /* A quarter of the vector: past that the dense pass costs no more. */
    g->touched_cap = n_params / 4 + 1;
    g->touched = malloc(g->touched_cap * sizeof(uint32_t));
    g->resp = malloc(g->max_len * sizeof(float));
    g->sp = calloc((size_t)g->n_seg, sizeof(*g->sp));
    g->out = calloc((size_t)g->n_seg, sizeof(*g->out));
    g->in_n = calloc((size_t)g->n_seg, sizeof(*g->in_n));
    g->pub_x = calloc((size_t)g->n_seg, sizeof(*g->pub_x));
    if (!g->acc || !g->snap || !g->delta || !g->touched || !g->resp || !g->sp || !g->out ||
        !g->in_n || !g->pub_x)
        goto nomem;
    memcpy(g->snap, theta, n_params * sizeof(float));
    ds_select_ops_init(&g->sel, ds_cpu_flags());
    ds_glat_cfg lc;
    ds_glat_cfg_default(&lc, cfg->timeout_ms, cfg->min_wait_ms);
    if (ds_glat_init(&g->lat, &lc) < 0) {
        ds_gossip_destroy(&g);
        return -EINVAL;
    }
    g->lat_G = 0;

    uint32_t *units = malloc(((size_t)n_layers + 2) * sizeof(uint32_t));
    if (!units)
        goto nomem;
    for (int s = 0; s < g->n_seg; s++) {
        const size_t len = g->seg[s].len;
        struct gout *o = &g->out[s];
        if (cfg->mix == DS_MIX_PAIRWISE) {
            ds_sparsify_cfg sc;
            ds_sparsify_cfg_defaults(&sc, cfg->method);
            sc.seed = ds_splitmix64_mix(cfg->node_seed ^ ds_splitmix64_mix((uint64_t)s + 1));
            sc.threshold = cfg->threshold;
            if (cfg->method == DS_SPARSIFY_DEFT) {
                sc.n_units = segment_units(layers, n_layers, &g->seg[s], units);
                sc.unit_off = units;
            }
            int r = ds_sparsifier_create(&g->sp[s], &sc, len, &g->sel);
            if (r < 0) {
                free(units);
                ds_gossip_destroy(&g);
                return r;
            }
            o->cap = ds_sparsify_capacity(g->sp[s], len, cfg->density);
        } else {
            o->cap = len;
        }
        o->idx = malloc((o->cap ? o->cap : 1) * sizeof(uint32_t));
        o->val = malloc((o->cap ? o->cap : 1) * sizeof(float));
        o->stash = malloc((o->cap ? o->cap : 1) * sizeof(float));
        if (!o->idx || !o->val || !o->stash) {
            free(units);
            goto nomem;
        }
    }
    free(units);
    if (cfg->mix == DS_MIX_PAIRWISE && late_alloc(g) < 0)
        goto nomem;
    *out = g;
    return 0;

nomem:
    ds_gossip_destroy(&g);
    return -ENOMEM;
}

/* ---- the copy other threads read -------------------------------------------- */

static const enum ds_gossip_outcome outcome_of[] = {DS_GOUT_NONE, DS_GOUT_PENDING, DS_GOUT_OK,
                                                    DS_GOUT_FAILED, DS_GOUT_SKIPPED};

static void xinfo_fill(const ds_gossip *g, int s, ds_gossip_xinfo *out)
{
    const struct gout *o = &g->out[s];
    out->target = o->target;
    out->outcome = outcome_of[o->state];
    out->bytes = o->state == OUT_NONE
                     ? 0
                     : (uint64_t)o->count * (g->cfg.mix == DS_MIX_CROSSOVER ? 4u : 8u);
    out->latency_ns = o->state == OUT_OK ? o->latency_ns : 0;
    out->n_in = g->in_n ? g->in_n[s] : 0;
    out->in_from = g->in_from ? g->in_from + (size_t)s * g->max_in : NULL;
}

/* The round's thread: refresh what ds_gossip_report hands out. */
static void publish(ds_gossip *g)
{
    pthread_mutex_lock(&g->pub_lock);
    g->pub_st = g->st;
    const uint32_t m = g->max_in < g->pub_max_in ? g->max_in : g->pub_max_in;
    for (int s = 0; s < g->n_seg; s++) {
        xinfo_fill(g, s, &g->pub_x[s]);
        if (g->pub_x[s].n_in > m)
            g->pub_x[s].n_in = m;
        if (m && g->in_from)
            memcpy(g->pub_in + (size_t)s * g->pub_max_in, g->in_from + (size_t)s * g->max_in,
                   m * sizeof(uint32_t));
        g->pub_x[s].in_from = NULL;
    }
    pthread_mutex_unlock(&g->pub_lock);
}

void ds_gossip_report(ds_gossip *g, ds_gossip_stats *st, ds_gossip_xinfo *x, int max_x,
                      uint32_t *in_from, uint32_t in_cap)
{
    pthread_mutex_lock(&g->pub_lock);
    if (st)
        *st = g->pub_st;
    for (int s = 0; x && s < max_x && s < g->n_seg; s++) {
        x[s] = g->pub_x[s];
        x[s].in_from = in_from + (size_t)s * in_cap;
        const uint32_t k = x[s].n_in < in_cap ? x[s].n_in : in_cap;
        if (k)
            memcpy(in_from + (size_t)s * in_cap, g->pub_in + (size_t)s * g->pub_max_in,
                   k * sizeof(uint32_t));
    }
    pthread_mutex_unlock(&g->pub_lock);
}

void ds_gossip_reset(ds_gossip *g, const float *theta)
{
    memcpy(g->snap, theta, g->n * sizeof(float));
    memset(g->acc, 0, g->n * sizeof(float));
    memset(g->delta, 0, g->n * sizeof(float));
    g->n_touched = 0;
    g->delta_dense = 0;
    for (int s = 0; g->sp && s < g->n_seg; s++)
        if (g->sp[s])
            ds_sparsifier_reset(g->sp[s]);
    for (int i = 0; g->late && i < g->n_seg * LATE_SLOTS; i++)
        g->late[i].used = 0;
    g->lat_G = 0; /* partners' latencies and rounds start over at begin */
    free_queue(g);
    publish(g);
}

int ds_gossip_set_view(ds_gossip *g, uint32_t G, uint32_t me, uint64_t epoch)
{
    if (G == 0 || me >= G)
        return -EINVAL;
    const uint32_t max_in = g->cfg.topology == DS_TOPO_RANDOM ? G : 1;
    if (!g->scratch || G > g->next_G || max_in > g->max_in) {
        uint32_t *sc = realloc(g->scratch, (size_t)G * sizeof(uint32_t));
        if (!sc)
            return -ENOMEM;
        g->scratch = sc;
        uint8_t *sk = realloc(g->skip, G);
        if (!sk)
            return -ENOMEM;
        g->skip = sk;
        uint8_t *ah = realloc(g->ahead, G);
        if (!ah)
            return -ENOMEM;
        g->ahead = ah;
        uint8_t *sl = realloc(g->slow, G);
        if (!sl)
            return -ENOMEM;
        g->slow = sl;
        memset(sl, 0, G);
        uint64_t *pr = realloc(g->peer_round, (size_t)G * sizeof(uint64_t));
        if (!pr)
            return -ENOMEM;
        g->peer_round = pr;
        memset(pr, 0, (size_t)G * sizeof(uint64_t));
        uint64_t *pa = realloc(g->peer_at, (size_t)G * sizeof(uint64_t));
        if (!pa)
            return -ENOMEM;
        g->peer_at = pa;
        memset(pa, 0, (size_t)G * sizeof(uint64_t));
        uint64_t *ps = realloc(g->peer_seen, (size_t)G * sizeof(uint64_t));
        if (!ps)
            return -ENOMEM;
        g->peer_seen = ps;
        memset(ps, 0, (size_t)G * sizeof(uint64_t));
        uint64_t *pb = realloc(g->pace_buf, (size_t)G * sizeof(uint64_t));
        if (!pb)
            return -ENOMEM;
        g->pace_buf = pb;
        uint32_t *ci = realloc(g->chk_in, (size_t)max_in * sizeof(uint32_t));
        if (!ci)
            return -ENOMEM;
        g->chk_in = ci;
        uint32_t *f = realloc(g->in_from, (size_t)g->n_seg * max_in * sizeof(uint32_t));
        if (!f)
            return -ENOMEM;
        g->in_from = f;
        uint8_t *d = realloc(g->in_done, (size_t)g->n_seg * max_in);
        if (!d)
            return -ENOMEM;
        g->in_done = d;
        pthread_mutex_lock(&g->pub_lock); /* a reader may be copying pub_in */
        uint32_t *pi = realloc(g->pub_in, (size_t)g->n_seg * max_in * sizeof(uint32_t));
        if (pi) {
            g->pub_in = pi;
            g->pub_max_in = max_in;
        }
        pthread_mutex_unlock(&g->pub_lock);
        if (!pi)
            return -ENOMEM;
        g->max_in = max_in;
    }
    g->next_G = G;
    g->next_me = me;
    g->next_epoch = epoch;
    g->view_set = 1;
    g->next_share_member = 0;
    g->next_share_size = 1;
    g->next_grouped = 0;
    memset(g->skip, 0, G);
    return 0;
}

int ds_gossip_set_share(ds_gossip *g, uint32_t member, uint32_t size)
{
    if (!g->view_set || size == 0 || member >= size)
        return -EINVAL;
    g->next_share_member = member;
    g->next_share_size = size;
    g->next_grouped = 1;
    return 0;
}

int ds_gossip_set_skip(ds_gossip *g, uint32_t peer)
{
    if (!g->view_set || peer >= g->next_G || peer == g->next_me)
        return -EINVAL;
    g->skip[peer] = SKIP_ALL;
    return 0;
}

int ds_gossip_set_nowait(ds_gossip *g, uint32_t peer)
{
    if (!g->view_set || peer >= g->next_G || peer == g->next_me)
        return -EINVAL;
    if (g->skip[peer] != SKIP_ALL)
        g->skip[peer] = SKIP_NOWAIT;
    return 0;
}

/* Exchanges still open that we wait for. */
static int outstanding(const ds_gossip *g)
{
    int n = 0;
    for (int s = 0; s < g->n_seg; s++) {
        const uint32_t t = g->out[s].target;
        n += g->out[s].state == OUT_PENDING && !g->skip[t] && !g->slow[t] && !g->ahead[t];
        for (uint32_t i = 0; i < g->in_n[s]; i++) {
            const size_t k = (size_t)s * g->max_in + i;
            const uint32_t p = g->in_from[k];
            n += !g->in_done[k] && !g->skip[p] && !g->ahead[p] && !g->slow[p];
        }
    }
    return n;
}

/* Hand ds_gossip_waiting the peers outstanding() counts, each once
 * (clear: none). */
static void note_waiting(ds_gossip *g, int clear)
{
    uint32_t p[WAIT_NAMED], n = 0;
    for (int s = 0; !clear && s < g->n_seg; s++) {
        const uint32_t t = g->out[s].target;
        const uint32_t in_n = g->in_n[s];
        for (uint32_t i = 0; i <= in_n; i++) {
            uint32_t q;
            if (i == in_n) {
                if (g->out[s].state != OUT_PENDING || g->skip[t] || g->slow[t] || g->ahead[t])
                    continue;
                q = t;
            } else {
                const size_t k = (size_t)s * g->max_in + i;
                q = g->in_from[k];
                if (g->in_done[k] || g->skip[q] || g->ahead[q] || g->slow[q])
                    continue;
            }
            uint32_t j = 0;
            while (j < n && j < WAIT_NAMED && p[j] != q)
                j++;
            if (j < n && j < WAIT_NAMED)
                continue; /* named already */
            if (n < WAIT_NAMED)
                p[n] = q;
            n++;
        }
    }
    pthread_mutex_lock(&g->pub_lock);
    memcpy(g->pub_wait, p, (n < WAIT_NAMED ? n : WAIT_NAMED) * sizeof(*p));
    g->pub_wait_n = n;
    pthread_mutex_unlock(&g->pub_lock);
}

int ds_gossip_waiting(ds_gossip *g, uint32_t *peers, int cap)
{
    pthread_mutex_lock(&g->pub_lock);
    const int n = (int)g->pub_wait_n;
    for (int i = 0; i < n && i < cap && i < WAIT_NAMED; i++)
        peers[i] = g->pub_wait[i];
    pthread_mutex_unlock(&g->pub_lock);
    return n;
}

/* Own exchanges still open with peers we do not wait for. */
static int nowait_pending(const ds_gossip *g)
{
    for (int s = 0; s < g->n_seg; s++)
        if (g->out[s].state == OUT_PENDING && g->out[s].count &&
            g->skip[g->out[s].target] == SKIP_NOWAIT && !g->slow[g->out[s].target])
            return 1;
    return 0;
}

/* ---- begin / end ---------------------------------------------------------- */

/* Note that delta[off + idx[j]] (j < count) was written. */
static void touch(ds_gossip *g, size_t off, const uint32_t *idx, size_t count)
{
    if (g->delta_dense)
        return;
    if (count > g->touched_cap - g->n_touched) {
        g->delta_dense = 1;
        return;
    }
    uint32_t *t = g->touched + g->n_touched;
    for (size_t j = 0; j < count; j++)
        t[j] = (uint32_t)(off + idx[j]);
    g->n_touched += count;
}

/* The pairwise weight of this round's exchanges: gossip.weight, or between
 * two groups, where one exchange stands for the two the swap would make,
 * their combined 2 w, at most 1/2 (an exact average of the coordinates
 * exchanged). Per coordinate it contracts the pair's difference by
 * |1 - 4 w| as the two exchanges did where both selected it (w <= 1/4),
 * and by 0 where they overshot (w > 1/4). The same on both sides of an
 * exchange: they are in the same view epoch, which fixes the groups. */
static float exchange_weight(const ds_gossip *g)
{
    const float w = g->cfg.weight;
    return g->pairs ? fminf(2.0f * w, 0.5f) : w;
}

static int cmp_desc(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

size_t ds_gossip_trim(uint32_t *idx, float *stash, size_t count, float share, float *scratch)
{
    if (!(share < 1.0f) || count < 2)
        return count;
    size_t m = (size_t)ceilf(share * (float)count);
    if (m >= count)
        return count;
    if (m < 1)
        m = 1;
    for (size_t i = 0; i < count; i++)
        scratch[i] = fabsf(stash[i]);
    qsort(scratch, count, sizeof(*scratch), cmp_desc);
    const float thr = scratch[m - 1];
    size_t ties = 0;
    for (size_t i = 0; i < m; i++)
        ties += scratch[i] == thr; /* of the m kept, those at the threshold */
    size_t k = 0;
    for (size_t i = 0; i < count; i++) {
        const float v = fabsf(stash[i]);
        if (v > thr || (v == thr && ties && ties--)) {
            idx[k] = idx[i];
            stash[k] = stash[i];
            k++;
        }
    }
    return k;
}

int ds_gossip_begin(ds_gossip *g, const float *theta, uint64_t round)
{
    if (!g->view_set)
        return -EINVAL;
    g->G = g->next_G;
    g->me = g->next_me;
    g->epoch = g->next_epoch;
    g->share_member = g->next_share_member;
    g->share_size = g->next_share_size ? g->next_share_size : 1;
    /* Pairwise only: a crossover mix needs both directions to average. */
    g->pairs = g->next_grouped && g->G == 2 && g->cfg.mix == DS_MIX_PAIRWISE;
    g->round = round;
    if (g->lat_G != g->G || g->lat_epoch != g->epoch) {
        /* Other nodes behind the view indices now: their latencies go. */
        if (ds_glat_set_view(&g->lat, g->G) < 0)
            return -ENOMEM;
        g->lat_G = g->G;
        g->lat_epoch = g->epoch;
        memset(g->peer_round, 0, (size_t)g->G * sizeof(uint64_t));
        memset(g->peer_at, 0, (size_t)g->G * sizeof(uint64_t));
        memset(g->peer_seen, 0, (size_t)g->G * sizeof(uint64_t));
    }

    /* acc += theta - snap: the optimizer's drift since the last mix. */
    const size_t n = g->n;
    float *acc = g->acc, *snap = g->snap;
    if (g->cfg.error_feedback) {
        for (size_t i = 0; i < n; i++)
            acc[i] += theta[i] - snap[i];
    } else {
        for (size_t i = 0; i < n; i++)
            acc[i] = theta[i] - snap[i];
    }
    /* A copy after the loop, not a store inside it: measured 2x faster
     * (the loop and memcpy 69-105 us, one fused loop 148-188 us, on the
     * MLP's 269k floats from a cold cache). */
    memcpy(snap, theta, n * sizeof(float));

    memset(g->ahead, 0, g->G);
    const int gossips = ds_topo_gossips(g->cfg.topology);
    for (int s = 0; s < g->n_seg; s++) {
        struct gout *o = &g->out[s];
        const ds_gseg *sg = &g->seg[s];
        o->state = OUT_NONE;
        o->latency_ns = 0;
        o->count = 0;
        o->target = g->me;
        g->in_n[s] = 0;
        if (!gossips || g->G < 2)
            continue;
        uint32_t owner = 0;
        ds_topo_hier_owner((uint32_t)s, g->share_size, &owner);
        if (owner != g->share_member) {
            /* Another member of our group handles this segment; its
             * drift is that member's to send (the members' models are
             * the same), so ours is forgotten. */
            memset(acc + sg->off, 0, sg->len * sizeof(float));
            continue;
        }
        const ds_topo_key key = {g->cfg.seed, g->epoch, round, (uint32_t)s};
        uint32_t n_in = 0;
        int r = ds_topo_peers(g->cfg.topology, &key, g->G, g->me, &o->target,
                              g->in_from + (size_t)s * g->max_in, &n_in, g->max_in, g->scratch);
        if (r < 0)
            return r;
        if (g->pairs) {
            /* Two groups: one exchange of this segment, not two. */
            if (ds_topo_pair_initiator(&key) == (int)g->me)
                n_in = 0;
            else
                o->target = g->me;
        }
        g->in_n[s] = n_in;
        memset(g->in_done + (size_t)s * g->max_in, 0, g->max_in);
        if (o->target == g->me)
            continue;
        if (g->cfg.mix == DS_MIX_CROSSOVER) {
            o->count = sg->len;
            memcpy(o->val, snap + sg->off, sg->len * sizeof(float));
        } else {
            ds_sparsify_result res;
            r = ds_sparsify_select(g->sp[s], acc + sg->off, sg->len, g->cfg.density, o->idx,
                                   o->stash, o->cap, &res);
            if (r < 0)
                return r;
            /* A link that cannot keep up carries a share (latency.h);
             * val is free until the gather. */
            o->count = ds_gossip_trim(o->idx, o->stash, res.count,
                                      ds_glat_peer_share(&g->lat, o->target), o->val);
            g->st.trimmed += o->count < res.count;
            g->sel.gather(o->val, snap + sg->off, o->idx, o->count);
            g->sel.zero_at(acc + sg->off, o->idx, o->count);
        }
        /* What the peer will decode: our half uses it too (answer_req). */
        ds_wire_values_round(g->cfg.value_format, o->val, o->count);
        o->state = OUT_PENDING;
    }
    publish(g);
    return 0;
}

void ds_gossip_end(ds_gossip *g, float *theta)
{
    for (int s = 0; s < g->n_seg; s++) {
        struct gout *o = &g->out[s];
        if ((o->state == OUT_FAILED || o->state == OUT_PENDING || o->state == OUT_SKIPPED) &&
            g->cfg.mix == DS_MIX_PAIRWISE)
            g->sel.scatter_add(g->acc + g->seg[s].off, o->idx, o->stash, o->count, 1.0f);
    }
    ds_gossip_apply(g, theta);
    if (!g->cfg.error_feedback)
        memset(g->acc, 0, g->n * sizeof(float));
    g->st.rounds++;
    publish(g);
}

float *ds_gossip_delta(ds_gossip *g)
{
    g->delta_dense = 1; /* the caller may write anywhere */
    return g->delta;
}

void ds_gossip_apply(ds_gossip *g, float *theta)
{
    float *d = g->delta, *snap = g->snap;
    if (g->delta_dense) {
        const size_t n = g->n;
        for (size_t i = 0; i < n; i++) {
            theta[i] += d[i];
            snap[i] += d[i];
            d[i] = 0.0f;
        }
    } else {
        /* Only the indices written; a repeated one adds the 0 left by
         * its first visit. */
        const uint32_t *t = g->touched;
        for (size_t j = 0; j < g->n_touched; j++) {
            const uint32_t i = t[j];
            theta[i] += d[i];
            snap[i] += d[i];
            d[i] = 0.0f;
        }
    }
    g->n_touched = 0;
    g->delta_dense = 0;
}

/* ---- exchange ---------------------------------------------------------------- */

static uint64_t payload_bytes(const ds_gmsg *m)
{
    return (uint64_t)m->count * ((m->idx ? 4u : 0u) + ds_wire_vfmt_width(m->vfmt));
}

static int send_msg(ds_gossip *g, const ds_gossip_io *io, ds_gmsg *m, uint64_t deadline)
{
    m->from = g->me;
    m->epoch = g->epoch;
    m->round_now = g->round;
    m->vfmt = m->type == DS_GMSG_REQ || m->type == DS_GMSG_RESP || m->type == DS_GMSG_CROSS
                  ? (uint8_t)g->cfg.value_format
                  : (uint8_t)DS_VALUE_F32;
    int r = io->send(io->ctx, m, deadline);
    if (r == 0) {
        g->st.bytes_sent += payload_bytes(m);
        g->st.values_sent += m->count;
    }
    return r;
}

/* A reply's send deadline: one timeout from now, whatever is left of
 * our own round. */
static uint64_t reply_deadline(const ds_gossip *g, const ds_gossip_io *io)
{
    return io->now_ns(io->ctx) + (uint64_t)g->cfg.timeout_ms * 1000000u;
}

/* Keep m for a later round; its arrays are copied. 0, or -1 when it was
 * dropped (queue full, no memory). */
static int enqueue(ds_gossip *g, const ds_gmsg *m)
{
    if (g->qcap == 0) {
        g->qcap = 8 * g->n_seg * (int)(g->max_in + 1) + 64;
        g->q = calloc((size_t)g->qcap, sizeof(*g->q));
    }
    if (!g->q || g->qn >= g->qcap) {
        g->st.dropped++;
        ds_log_rl(DS_LOG_WARN, "gossip", "future-round queue full: dropped type=%u from=%u round=%llu",
                  m->type, m->from, (unsigned long long)m->round);
        return -1;
    }
    struct qmsg *q = &g->q[g->qn];
    q->m = *m;
    q->waited_at = g->waited_ns;
    q->idx = NULL;
    q->val = NULL;
    if (m->idx && m->count) {
        q->idx = malloc((size_t)m->count * sizeof(uint32_t));
        if (!q->idx)
            goto fail;
        memcpy(q->idx, m->idx, (size_t)m->count * sizeof(uint32_t));
    }
    if (m->val && m->count) {
        q->val = malloc((size_t)m->count * sizeof(float));
        if (!q->val)
            goto fail;
        memcpy(q->val, m->val, (size_t)m->count * sizeof(float));
    }
    q->m.idx = q->idx;
    q->m.val = q->val;
    g->qn++;
    g->st.queued++;
    return 0;
fail:
    free(q->idx);
    g->st.dropped++;
    return -1;
}

/* Indices strictly increasing and inside a segment of len entries. */
static int indices_ok(const uint32_t *idx, uint32_t count, size_t len)
{
    for (uint32_t j = 0; j < count; j++)
        if (idx[j] >= len || (j && idx[j] <= idx[j - 1]))
            return 0;
    return 1;
}

static int expected_in(ds_gossip *g, uint32_t s, uint32_t from, uint8_t **done)
{
    for (uint32_t i = 0; i < g->in_n[s]; i++)
        if (g->in_from[(size_t)s * g->max_in + i] == from) {
            *done = &g->in_done[(size_t)s * g->max_in + i];
            return 1;
        }
    return 0;
}

static void drop(ds_gossip *g, const ds_gmsg *m, const char *why)
{
    g->st.dropped++;
    ds_log_rl(DS_LOG_WARN, "gossip", "dropped type=%u from=%u round=%llu segment=%u: %s", m->type,
              m->from, (unsigned long long)m->round, m->segment, why);
}

static int req_ok(const ds_gmsg *m, size_t len)
{
    return m->count <= len && (!m->count || (m->idx && m->val)) &&
           indices_ok(m->idx, m->count, len);
}

/* An exchange's round trip less the time its REQ waited at the responder
 * while the responder itself waited on other partners: what the slow rule
 * measures (latency.h). Without the subtraction a cluster in lockstep
 * behind one lossy link showed every partner as slow as that link. */
static uint64_t link_time(uint64_t rtt_ns, const ds_gmsg *resp)
{
    const uint64_t held = (uint64_t)resp->held_us * 1000u;
    return rtt_ns > held ? rtt_ns - held : 0;
}

/* Answer a REQ from snap and apply our half: d += w (theirs - mine) on S.
 * Our half is applied only once the reply is on its way, so a refused
 * send leaves both sides untouched. The reply gets a deadline of its
 * own: a REQ that came in time but is served just after our round's
 * deadline (a starved thread) still deserves its answer, and the
 * requester waits on its own clock; with our deadline the send failed at
 * once and the requester waited out its timeout. */
static void answer_req(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    const ds_gseg *sg = &g->seg[m->segment];
    const float *mine = g->snap + sg->off;
    float *d = g->delta + sg->off, *acc = g->acc + sg->off;
    const float w = exchange_weight(g);
    for (uint32_t j = 0; j < m->count; j++)
        g->resp[j] = mine[m->idx[j]];
    /* Both halves from the two values as sent (sparsify.value_format):
     * the pair's sum stays exact, our rounding residual stays in theta. */
    ds_wire_values_round(g->cfg.value_format, g->resp, m->count);
    const uint64_t held_us = g->held_ns / 1000u;
    ds_gmsg r = {.type = DS_GMSG_RESP, .to = m->from, .round = m->round,
                 .segment = m->segment, .count = m->count, .val = g->resp,
                 .held_us = held_us > UINT32_MAX ? UINT32_MAX : (uint32_t)held_us};
    if (send_msg(g, io, &r, reply_deadline(g, io)) < 0) {
        g->st.missed++;
        return;
    }
    for (uint32_t j = 0; j < m->count; j++) {
        const uint32_t i = m->idx[j];
        d[i] += w * (m->val[j] - g->resp[j]);
        acc[i] = 0.0f;
    }
    touch(g, sg->off, m->idx, m->count);
    g->st.answered++;
    g->st.values_received += m->count;
    g->st.bytes_received += payload_bytes(m);
}

/* A REQ of this view for a round over here: answered now from snap when
 * its sender was our in-neighbour in that round (its initiator keeps the
 * exchange open, docs/gossip.md "Stragglers"), so a partner rounds
 * behind still mixes. 1 when answered, 0 when it is not ours to answer. */
static int answer_past_req(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    if (g->cfg.mix != DS_MIX_PAIRWISE || m->segment >= (uint32_t)g->n_seg ||
        m->from >= g->G || !req_ok(m, g->seg[m->segment].len))
        return 0;
    const ds_topo_key key = {g->cfg.seed, g->epoch, m->round, m->segment};
    uint32_t target, n_in = 0;
    if (ds_topo_peers(g->cfg.topology, &key, g->G, g->me, &target, g->chk_in, &n_in, g->max_in,
                      g->scratch) < 0)
        return 0;
    if (g->pairs && ds_topo_pair_initiator(&key) != (int)m->from)
        return 0;
    for (uint32_t i = 0; i < n_in && i < g->max_in; i++)
        if (g->chk_in[i] == m->from) {
            answer_req(g, io, m);
            return 1;
        }
    return 0;
}

/* Serve one message of the current round. Returns 1 when it completed an
 * expected exchange (in or out), else 0. */
static int handle_current(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    const uint32_t s = m->segment;
    if (s >= (uint32_t)g->n_seg) {
        drop(g, m, "segment out of range");
        return 0;
    }
    const ds_gseg *sg = &g->seg[s];
    struct gout *o = &g->out[s];
    uint8_t *done;
    const float w = exchange_weight(g);

    switch (m->type) {
    case DS_GMSG_REQ: {
        if (g->cfg.mix != DS_MIX_PAIRWISE || !expected_in(g, s, m->from, &done) || *done) {
            drop(g, m, "REQ not expected from this peer");
            return 0;
        }
        if (!req_ok(m, sg->len)) {
            drop(g, m, "REQ indices malformed");
            return 0;
        }
        *done = 1;
        answer_req(g, io, m);
        return 1;
    }
    case DS_GMSG_RESP:
        if (o->state != OUT_PENDING || o->target != m->from || m->count != o->count ||
            (m->count && !m->val)) {
            drop(g, m, "RESP does not match our REQ");
            return 0;
        }
        for (size_t j = 0; j < o->count; j++)
            g->delta[sg->off + o->idx[j]] += w * (m->val[j] - o->val[j]);
        touch(g, sg->off, o->idx, o->count);
        o->latency_ns = io->now_ns(io->ctx) - o->sent_ns;
        ds_glat_peer(&g->lat, o->target, link_time(o->latency_ns, m));
        o->state = OUT_OK;
        g->st.exchanges_ok++;
        g->st.values_received += m->count;
        g->st.bytes_received += payload_bytes(m);
        return 1;
    case DS_GMSG_STALE:
        if (o->state != OUT_PENDING || o->target != m->from) {
            drop(g, m, "STALE does not match our REQ");
            return 0;
        }
        o->state = OUT_FAILED;
        g->st.exchanges_failed++;
        g->st.stale_received++;
        return 1;
    case DS_GMSG_CROSS: {
        if (g->cfg.mix != DS_MIX_CROSSOVER || !expected_in(g, s, m->from, &done) || *done ||
            m->count != sg->len || !m->val) {
            drop(g, m, "CROSS not expected or wrong length");
            return 0;
        }
        /* The paper's rule: theta[s] = (theta[s] + received) / 2. */
        const float *mine = g->snap + sg->off;
        float *d = g->delta + sg->off;
        for (size_t i = 0; i < sg->len; i++)
            d[i] += 0.5f * (m->val[i] - mine[i]);
        g->delta_dense = 1;
        *done = 1;
        g->st.answered++;
        g->st.values_received += m->count;
        g->st.bytes_received += payload_bytes(m);
        return 1;
    }
    default:
        drop(g, m, "unexpected type");
        return 0;
    }
}

/* ---- exchanges kept open past their round ----------------------------------- */

static struct late *late_find(ds_gossip *g, uint32_t s, uint64_t epoch, uint64_t round,
                              uint32_t target)
{
    for (int k = 0; g->late && k < LATE_SLOTS; k++) {
        struct late *l = &g->late[s * LATE_SLOTS + k];
        if (l->used && l->epoch == epoch && l->target == target &&
            (round == UINT64_MAX || l->round == round))
            return l;
    }
    return NULL;
}

/* Our exchange of segment s is still open at the end of the round: keep
 * what we sent, evicting the oldest slot when all are taken. */
static void late_keep(ds_gossip *g, int s, const struct gout *o)
{
    struct late *slot = NULL;
    for (int k = 0; k < LATE_SLOTS; k++) {
        struct late *l = &g->late[s * LATE_SLOTS + k];
        if (!l->used) {
            slot = l;
            break;
        }
        if (!slot || l->sent_ns < slot->sent_ns)
            slot = l;
    }
    if (slot->used)
        g->st.late_lost++;
    slot->used = 1;
    slot->epoch = g->epoch;
    slot->round = g->round;
    slot->sent_ns = o->sent_ns;
    slot->target = o->target;
    slot->w = exchange_weight(g);
    slot->count = o->count;
    memcpy(slot->idx, o->idx, o->count * sizeof(uint32_t));
    memcpy(slot->val, o->val, o->count * sizeof(float));
}

/* Slots nobody answered within LATE_TIMEOUTS timeouts are given up. */
static void late_expire(ds_gossip *g, uint64_t now)
{
    const uint64_t max = (uint64_t)LATE_TIMEOUTS * (uint64_t)g->cfg.timeout_ms * 1000000u;
    for (int i = 0; g->late && i < g->n_seg * LATE_SLOTS; i++)
        if (g->late[i].used && now - g->late[i].sent_ns > max) {
            g->late[i].used = 0;
            g->st.late_lost++;
        }
}

/* A RESP or STALE for a round that is over here. 1 when it answered an
 * exchange kept open (a RESP's values applied now), else 0. */
static int late_answer(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    if (m->segment >= (uint32_t)g->n_seg)
        return 0;
    struct late *l = late_find(g, m->segment, m->epoch, m->round, m->from);
    if (!l)
        return 0;
    l->used = 0;
    if (m->type == DS_GMSG_STALE) {
        g->st.stale_received++;
        return 1;
    }
    if (m->count != l->count || (m->count && !m->val)) {
        drop(g, m, "late RESP does not match our REQ");
        g->st.late_lost++;
        return 1;
    }
    float *d = g->delta + g->seg[m->segment].off;
    const float w = l->w;
    for (size_t j = 0; j < l->count; j++)
        d[l->idx[j]] += w * (m->val[j] - l->val[j]);
    touch(g, g->seg[m->segment].off, l->idx, l->count);
    g->st.late_applied++;
    g->st.values_received += m->count;
    g->st.bytes_received += payload_bytes(m);
    if (m->epoch == g->epoch)
        ds_glat_peer(&g->lat, m->from, link_time(io->now_ns(io->ctx) - l->sent_ns, m));
    return 1;
}

/* A REQ we cannot keep: STALE, so its initiator closes the exchange. */
static void refuse(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    ds_gmsg st = {.type = DS_GMSG_STALE, .to = m->from, .round = m->round,
                  .segment = m->segment};
    if (send_msg(g, io, &st, reply_deadline(g, io)) == 0)
        g->st.stale_sent++;
}

/* Route one received gossip message: now, later, or STALE. */
static int dispatch(ds_gossip *g, const ds_gossip_io *io, const ds_gmsg *m)
{
    if (m->type == DS_GMSG_ARED) {
        drop(g, m, "all-reduce chunk outside an all-reduce");
        return 0;
    }
    /* A peer already past this round will not send anything more for it
     * (what it sent for it is queued or lost): stop waiting for it. This is
     * what lets a node that fell behind -- frozen, overloaded -- catch up
     * at compute speed instead of one timeout per round. */
    if (m->from < g->G && (m->round_now > g->round || m->epoch > g->epoch))
        g->ahead[m->from] = 1;
    if (m->from < g->G && m->epoch == g->epoch) {
        /* The partner's latest round and ours when we heard it: how far
         * behind or ahead of us it was then (ahead_of_view). An older
         * round arriving late says nothing newer. */
        if (m->round_now >= g->peer_round[m->from]) {
            g->peer_round[m->from] = m->round_now;
            g->peer_at[m->from] = g->round;
        }
        g->peer_seen[m->from] = io->now_ns(io->ctx) + 1;
    }
    const int answer = m->type == DS_GMSG_RESP || m->type == DS_GMSG_STALE;
    if (answer && (m->epoch != g->epoch || m->round < g->round) && late_answer(g, io, m))
        return 0;
    if (m->epoch != g->epoch) {
        if (io->peer_view_differs && m->from < g->G)
            io->peer_view_differs(io->ctx, m->from);
        if (m->epoch > g->epoch && m->type != DS_GMSG_STALE) {
            if (enqueue(g, m) < 0 && m->type == DS_GMSG_REQ)
                refuse(g, io, m);
        } else {
            drop(g, m, "other view epoch");
        }
        return 0;
    }
    if (m->round > g->round) {
        if (m->type == DS_GMSG_REQ || m->type == DS_GMSG_CROSS) {
            if (enqueue(g, m) < 0 && m->type == DS_GMSG_REQ)
                refuse(g, io, m);
        } else {
            drop(g, m, "reply for a future round");
        }
        return 0;
    }
    if (m->round < g->round) {
        if (m->type == DS_GMSG_REQ) {
            if (!answer_past_req(g, io, m))
                refuse(g, io, m);
        } else if (m->count) {
            g->st.late++; /* an empty reply loses nothing */
        }
        return 0;
    }
    return handle_current(g, io, m);
}

/* Partners too slow to wait for this round (latency.h). */
static void mark_slow(ds_gossip *g)
{
    uint32_t n = 0, cut = 0;
    for (uint32_t p = 0; p < g->G; p++) {
        /* A share: how much the partner's link carries (latency.h). A
         * trimmed partner is still waited for like any other: not
         * waiting for it (measured) left its model apart, at 2-5x the
         * consensus distance. */
        cut += p != g->me && ds_glat_share(&g->lat, p) < 1.0f;
        g->slow[p] = p != g->me && g->skip[p] != SKIP_ALL && ds_glat_slow(&g->lat, p);
        n += g->slow[p];
        if (g->peer_round[p] > g->round)
            g->ahead[p] = 1; /* seen past this round already */
    }
    g->st.slow_peers = n;
    g->st.trimmed_peers = cut;
}

/* Send this round's REQs (or CROSS). An exchange with a partner that
 * still has an earlier one of ours open in that segment goes out empty:
 * its drift goes back to acc and leaves with a later exchange, so a slow
 * link carries at most one open exchange per segment from us. */
static void send_requests(ds_gossip *g, const ds_gossip_io *io, uint64_t deadline)
{
    for (int s = 0; s < g->n_seg; s++) {
        struct gout *o = &g->out[s];
        if (o->state != OUT_PENDING)
            continue;
        if (g->skip[o->target] == SKIP_ALL) {
            /* Known unresponsive: that exchange does not happen this round,
             * and nobody waits for it (design §5: skipped). */
            o->state = OUT_SKIPPED;
            g->st.exchanges_failed++;
            g->st.skipped++;
            continue;
        }
        if (g->late && o->count && late_find(g, (uint32_t)s, g->epoch, UINT64_MAX, o->target)) {
            g->sel.scatter_add(g->acc + g->seg[s].off, o->idx, o->stash, o->count, 1.0f);
            o->count = 0;
            g->st.deferred++;
        }
        ds_gmsg m = {
            .type = g->cfg.mix == DS_MIX_CROSSOVER ? DS_GMSG_CROSS : DS_GMSG_REQ,
            .to = o->target,
            .round = g->round,
            .segment = (uint32_t)s,
            .seg_len = (uint32_t)g->seg[s].len,
            .count = (uint32_t)o->count,
            .idx = g->cfg.mix == DS_MIX_CROSSOVER ? NULL : o->idx,
            .val = o->val,
        };
        o->sent_ns = io->now_ns(io->ctx);
        if (send_msg(g, io, &m, deadline) < 0) {
            o->state = OUT_FAILED;
            g->st.exchanges_failed++;
            if (io->peer_failed)
                io->peer_failed(io->ctx, o->target);
            continue;
        }
        if (g->cfg.mix == DS_MIX_CROSSOVER) {
            /* Nothing comes back for a CROSS: it is done once sent. */
            o->latency_ns = io->now_ns(io->ctx) - o->sent_ns;
            o->state = OUT_OK;
            g->st.exchanges_ok++;
        }
    }
}

/* Serve what arrived early for this round, oldest first. */
static void serve_queued(ds_gossip *g, const ds_gossip_io *io)
{
    int kept = 0;
    const int qn = g->qn;
    for (int i = 0; i < qn; i++) {
        struct qmsg *q = &g->q[i];
        if (q->m.epoch == g->epoch && q->m.round == g->round) {
            g->held_ns = g->waited_ns - q->waited_at;
            handle_current(g, io, &q->m);
            g->held_ns = 0;
            free(q->idx);
            free(q->val);
        } else if (q->m.epoch < g->epoch || (q->m.epoch == g->epoch && q->m.round < g->round)) {
            free(q->idx);
            free(q->val);
            g->st.dropped++;
        } else {
            if (q->m.from < g->G)
                g->ahead[q->m.from] = 1; /* it is already past this round */
            g->q[kept++] = *q;
        }
    }
    g->qn = kept;
}

/* Pacing (latency.h, ds_glat_ahead): over this node's round and those of
 * the partners heard from within a timeout and not skipped. A partner
 * counts at the round it was last heard in moved on by the rounds we took
 * since: as far behind (or ahead) as it was then, not further behind
 * with every round we take without hearing from it. A node hears from
 * only its few partners of each round: with one segment among 64 nodes,
 * two a round, so most of its view was last heard rounds ago, and
 * counted as it was then, nodes in lock-step looked over 8 rounds behind
 * and held rounds to their deadline for them (issue 18). */
static int ahead_of_view(ds_gossip *g, uint64_t now)
{
    const uint64_t fresh = (uint64_t)g->cfg.timeout_ms * 1000000u;
    uint64_t *v = g->pace_buf;
    uint32_t k = 0;
    v[k++] = g->round;
    for (uint32_t p = 0; p < g->G; p++)
        if (p != g->me && g->skip[p] != SKIP_ALL && g->peer_seen[p] &&
            now + 1 - g->peer_seen[p] <= fresh)
            v[k++] = g->peer_round[p] +
                     (g->round > g->peer_at[p] ? g->round - g->peer_at[p] : 0);
    return ds_glat_ahead(g->round, v, k, PACE_ROUNDS);
}

/* io->recv, counting the time it waited in g->waited_ns: a REQ queued
 * meanwhile was held by our waits on others, not by us (link_time). */
static int timed_recv(ds_gossip *g, const ds_gossip_io *io, ds_gmsg *m, uint64_t deadline)
{
    const uint64_t t = io->now_ns(io->ctx);
    const int r = io->recv(io->ctx, m, deadline);
    g->waited_ns += io->now_ns(io->ctx) - t;
    return r;
}

/* Wait until nothing awaited is open or the deadline, then give peers
 * not waited for a short grace. 1 when a stop request ended the wait. */
static int wait_round(ds_gossip *g, const ds_gossip_io *io, uint64_t deadline)
{
    /* A recv error (-ECANCELED: the node is stopping) ends the waits at
     * once; what is still open then fails as at the deadline, but nobody
     * is blamed for it. */
    int stopped = 0;
    while (outstanding(g) > 0) {
        ds_gmsg m;
        note_waiting(g, 0);
        int r = timed_recv(g, io, &m, deadline);
        stopped = r < 0;
        if (r <= 0)
            break;
        dispatch(g, io, &m);
    }
    note_waiting(g, 1);
    if (!stopped)
        ds_glat_round(&g->lat, io->now_ns(io->ctx) - g->t0);
    /* Pacing: a node too far ahead of its view serves what comes until
     * the view is near again, or until the deadline. Partners behind do
     * not wait for it (they see its round); they catch up at their own
     * pace while it holds. Without this, a node ahead finds every partner
     * late, keeps every exchange open, and runs on alone (issue 16: the
     * partition runaway). */
    if (!stopped && ahead_of_view(g, io->now_ns(io->ctx))) {
        const uint64_t p0 = io->now_ns(io->ctx);
        g->st.paced++;
        while (ahead_of_view(g, io->now_ns(io->ctx))) {
            ds_gmsg m;
            int r = timed_recv(g, io, &m, deadline);
            stopped = r < 0;
            if (r <= 0)
                break;
            dispatch(g, io, &m);
        }
        g->st.pace_ns += io->now_ns(io->ctx) - p0;
    }
    /* Replies from peers we did not wait for: a short grace, so that one
     * back on time completes its exchange in this round. */
    uint64_t grace = io->now_ns(io->ctx) + NOWAIT_GRACE_NS;
    if (grace > deadline)
        grace = deadline;
    while (!stopped && nowait_pending(g)) {
        ds_gmsg m;
        int r = timed_recv(g, io, &m, grace);
        stopped = r < 0;
        if (r <= 0)
            break;
        dispatch(g, io, &m);
    }
    /* What has arrived already, without waiting: late replies to apply,
     * past REQs to answer, even in a round that waited for nobody. */
    while (!stopped) {
        ds_gmsg m;
        int r = timed_recv(g, io, &m, io->now_ns(io->ctx));
        stopped = r < 0;
        if (r <= 0)
            break;
        dispatch(g, io, &m);
    }
    return stopped;
}

/* Whatever is still open missed the deadline: a pairwise exchange is
 * kept open for its late reply; partners we waited for in vain are
 * reported and their wait counts as a latency. */
static void close_round(ds_gossip *g, const ds_gossip_io *io, int stopped)
{
    const uint64_t now = io->now_ns(io->ctx);
    for (int s = 0; s < g->n_seg; s++) {
        struct gout *o = &g->out[s];
        if (o->state == OUT_PENDING) {
            const uint32_t t = o->target;
            const int waited = !stopped && !g->skip[t] && !g->slow[t] && !g->ahead[t];
            if (g->late && o->count && !stopped)
                late_keep(g, s, o);
            o->state = OUT_FAILED;
            g->st.exchanges_failed++;
            if (waited) {
                ds_glat_peer(&g->lat, o->target, now - o->sent_ns);
                if (io->peer_failed)
                    io->peer_failed(io->ctx, o->target);
            }
        }
        for (uint32_t i = 0; i < g->in_n[s]; i++) {
            const size_t k = (size_t)s * g->max_in + i;
            if (g->in_done[k])
                continue;
            g->st.missed++;
            const uint32_t p = g->in_from[k];
            if (stopped || g->skip[p] || g->ahead[p] || g->slow[p])
                continue;
            if (io->peer_failed)
                io->peer_failed(io->ctx, p);
        }
    }
}

int ds_gossip_exchange(ds_gossip *g, const ds_gossip_io *io)
{
    const uint64_t t0 = io->now_ns(io->ctx);
    const uint64_t wait = ds_glat_deadline_ns(&g->lat);
    const uint64_t deadline = t0 + wait;
    if (g->t0 && t0 > g->t0)
        ds_glat_period(&g->lat, t0 - g->t0);
    g->t0 = t0;
    g->st.deadline_ns = wait;
    late_expire(g, t0);
    mark_slow(g);
    send_requests(g, io, t0 + (uint64_t)g->cfg.timeout_ms * 1000000u);
    serve_queued(g, io);
    const int stopped = wait_round(g, io, deadline);
    if (stopped)
        g->st.interrupted++;
    else if (io->now_ns(io->ctx) >= deadline)
        g->st.timeouts++;
    close_round(g, io, stopped);
    const uint64_t took = io->now_ns(io->ctx) - t0;
    g->st.wait_ns += took;
    if (took > g->st.max_wait_ns)
        g->st.max_wait_ns = took;
    publish(g);
    return 0;
}

int ds_gossip_round(ds_gossip *g, float *theta, uint64_t round, const ds_gossip_io *io)
{
    int r = ds_gossip_begin(g, theta, round);
    if (r < 0)
        return r;
    r = ds_gossip_exchange(g, io);
    ds_gossip_end(g, theta);
    return r;
}

/* ---- AllReduce-SGD baseline -------------------------------------------------- */

/* Chunk c of n cut into G near-equal ranges. */
static void chunk(size_t n, uint32_t G, uint32_t c, size_t *off, size_t *len)
{
    const size_t base = n / G, extra = n % G;
    *off = (size_t)c * base + (c < extra ? c : extra);
    *len = base + (c < extra ? 1 : 0);
}

/* Wait for ring step `rs` of `step` from the left neighbour; messages of
 * later steps are kept. Returns the message, or NULL at the deadline or as
 * soon as the left neighbour is seen on a later step (*behind = 1).
 *
 * That neighbour moves on only once it is done with `step`, done or
 * failed; what it sent of `step` came before (one connection, in order),
 * so a later step's message from it means that the chunk awaited here
 * will never come. Waiting out the deadline anyway kept this node one
 * reduction behind for good: the others failed each step waiting for it
 * while it waited for a step they had left, every reduction of the run
 * (8 nodes, one of which started training 2 s after the rest: every
 * all-reduce incomplete). Failing at once, it starts the next step while
 * the others still wait in it, and the ring is whole again. */
static const ds_gmsg *await_ared(ds_gossip *g, const ds_gossip_io *io, uint64_t step,
                                 uint32_t rs, uint32_t left, uint64_t deadline, ds_gmsg *buf,
                                 int *behind)
{
    int later = 0;
    for (int i = 0; i < g->qn; i++) {
        ds_gmsg *m = &g->q[i].m;
        if (m->type != DS_GMSG_ARED || m->from != left)
            continue;
        if (m->round == step && m->segment == rs) {
            free(g->held.idx);
            free(g->held.val);
            g->held = g->q[i];
            g->q[i] = g->q[--g->qn];
            *buf = g->held.m;
            return buf;
        }
        later |= m->round > step;
    }
    if (later) {
        *behind = 1;
        return NULL;
    }
    for (;;) {
        int r = io->recv(io->ctx, buf, deadline);
        if (r < 0)
            g->ared_stopped = 1;
        if (r <= 0)
            return NULL;
        if (buf->type != DS_GMSG_ARED) {
            dispatch(g, io, buf);
            continue;
        }
        if (buf->round == step && buf->segment == rs && buf->from == left)
            return buf;
        if (buf->round > step || (buf->round == step && buf->segment > rs)) {
            enqueue(g, buf);
            if (buf->round > step && buf->from == left) {
                *behind = 1;
                return NULL;
            }
        } else {
            g->st.late++;
        }
    }
}

/* Queued chunks of reductions before `step`: never used now. */
static void drop_past_ared(ds_gossip *g, uint64_t step)
{
    for (int i = 0; i < g->qn;) {
        struct qmsg *q = &g->q[i];
        if (q->m.type == DS_GMSG_ARED && q->m.round < step) {
            free(q->idx);
            free(q->val);
            g->q[i] = g->q[--g->qn];
            g->st.late++;
        } else {
            i++;
        }
    }
}

int ds_gossip_allreduce(ds_gossip *g, float *grad, size_t n, uint64_t step,
                        const ds_gossip_io *io)
{
    if (!g->view_set)
        return -EINVAL;
    g->G = g->next_G;
    g->me = g->next_me;
    g->epoch = g->next_epoch;
    const uint32_t G = g->G, me = g->me;
    if (G < 2)
        return 0;
    const uint32_t right = (me + 1) % G, left = (me + G - 1) % G;
    const uint64_t t0 = io->now_ns(io->ctx);
    const uint64_t deadline = t0 + (uint64_t)g->cfg.timeout_ms * 1000000u;
    float *work = g->delta; /* n floats of scratch, zero outside rounds */
    if (n > g->n)
        return -EINVAL;
    memcpy(work, grad, n * sizeof(float));
    g->ared_stopped = 0;
    drop_past_ared(g, step);
    int ret = 0, behind = 0;
    ds_gmsg in;

    /* Reduce-scatter: after G-1 steps, chunk (me+1) mod G holds the sum. */
    for (uint32_t i = 0; i < G - 1 && !ret; i++) {
        size_t off, len;
        chunk(n, G, (me + G - i) % G, &off, &len);
        ds_gmsg m = {.type = DS_GMSG_ARED, .to = right, .round = step, .segment = i,
                     .count = (uint32_t)len, .val = work + off};
        if (send_msg(g, io, &m, deadline) < 0) {
            ret = -ETIMEDOUT;
            break;
        }
        const ds_gmsg *r = await_ared(g, io, step, i, left, deadline, &in, &behind);
        chunk(n, G, (me + 2 * G - i - 1) % G, &off, &len);
        if (!r || r->count != len) {
            ret = -ETIMEDOUT;
            break;
        }
        for (size_t j = 0; j < len; j++)
            work[off + j] += r->val[j];
    }
    /* All-gather: pass the finished chunks around. */
    for (uint32_t i = 0; i < G - 1 && !ret; i++) {
        size_t off, len;
        chunk(n, G, (me + 1 + G - i) % G, &off, &len);
        ds_gmsg m = {.type = DS_GMSG_ARED, .to = right, .round = step, .segment = G - 1 + i,
                     .count = (uint32_t)len, .val = work + off};
        if (send_msg(g, io, &m, deadline) < 0) {
            ret = -ETIMEDOUT;
            break;
        }
        const ds_gmsg *r = await_ared(g, io, step, G - 1 + i, left, deadline, &in, &behind);
        chunk(n, G, (me + G - i) % G, &off, &len);
        if (!r || r->count != len) {
            ret = -ETIMEDOUT;
            break;
        }
        memcpy(work + off, r->val, len * sizeof(float));
    }
    if (ret == 0) {
        const float inv = 1.0f / (float)G;
        for (size_t j = 0; j < n; j++)
            grad[j] = work[j] * inv;
        g->st.exchanges_ok++;
    } else {
        g->st.exchanges_failed++;
        g->st.interrupted += g->ared_stopped != 0;
        /* Stopping, or we were the late one (await_ared): nobody to blame. */
        if (!g->ared_stopped && !behind) {
            if (io->now_ns(io->ctx) >= deadline)
                g->st.timeouts++;
            if (io->peer_failed)
                io->peer_failed(io->ctx, left);
        }
    }
    memset(work, 0, n * sizeof(float));
    g->st.rounds++;
    const uint64_t took = io->now_ns(io->ctx) - t0;
    g->st.wait_ns += took;
    if (took > g->st.max_wait_ns)
        g->st.max_wait_ns = took;
    publish(g);
    return ret;
}

/* ---- accessors ------------------------------------------------------------ */

uint64_t ds_gossip_partner_link_ns(const ds_gossip *g, uint32_t peer)
{
    return ds_glat_peer_mean(&g->lat, peer);
}

const ds_gossip_stats *ds_gossip_get_stats(const ds_gossip *g)
{
    return &g->st;
}

int ds_gossip_n_segments(const ds_gossip *g)
{
    return g->n_seg;
}

const ds_gseg *ds_gossip_segment(const ds_gossip *g, int s)
{
    return &g->seg[s];
}

uint32_t ds_gossip_target(const ds_gossip *g, int s)
{
    return g->out[s].target;
}

int ds_gossip_xinfo_get(const ds_gossip *g, int s, ds_gossip_xinfo *out)
{
    if (s < 0 || s >= g->n_seg)
        return -EINVAL;
    xinfo_fill(g, s, out);
    return 0;
}

const float *ds_gossip_acc(const ds_gossip *g)
{
    return g->acc;
}

/* ---- checkpoints -------------------------------------------------------------- */

float *ds_gossip_acc_mut(ds_gossip *g)
{
    return g->acc;
}

float *ds_gossip_snap_mut(ds_gossip *g)
{
    return g->snap;
}

ds_sparsifier *ds_gossip_sparsifier(ds_gossip *g, int s)
{
    return g->sp && s >= 0 && s < g->n_seg ? g->sp[s] : NULL;
}

void ds_gossip_drop_late(ds_gossip *g)
{
    for (int i = 0; g->late && i < g->n_seg * LATE_SLOTS; i++)
        g->late[i].used = 0;
}
