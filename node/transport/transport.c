/*
 * node/transport/transport.c: see transport.h for the contract. This essay says how.
 *
 * Threads. One progress thread per transport owns the libfabric objects and
 * every structure marked "progress thread" below. Application threads touch
 * only what t->lock guards: the submission queue, the peer slots' identity
 * (state, generation, address) and the request flags. They queue work, write
 * the eventfd, and return. Callbacks run on the progress thread without the
 * lock, so a callback may send, add or remove peers, or ask for a reset.
 *
 * Wire. Every libfabric message is one chunk: a 40-byte little-endian header
 * and the sender's own address, then at most chunk_bytes of payload.
 *
 *    0       4    5     6        8                16               24
 *    +-------+----+-----+--------+----------------+----------------+
 *    | magic |ver |flags|name_len|    stream      |      seq       |
 *    +-------+----+-----+--------+-------+--------+----------------+
 *    |   total_len (u64)         | chunk_idx     | chunk_size     |
 *    +---------------------------+---------------+----------------+
 *    24                          32              36               40
 *    | name (name_len bytes: the sender's raw libfabric address) | payload
 *
 * `stream` is a random id the sender draws per peer slot and endpoint
 * incarnation; `seq` counts that stream's messages from 1, assigned when the
 * message's first chunk is posted, so every seq that reaches the wire is
 * either posted whole or followed by an ABORT chunk (flags bit 0, no
 * payload). The receiver keeps up to four streams per peer (a new stream
 * from a known address: the sender restarted or reset, or someone forges
 * its address), places chunks by index with a bitmap (libfabric reports
 * completions in any order: ofi_rxm's rendezvous reads finish after later
 * eager sends), and delivers messages strictly by seq. Carrying the
 * sender's address in every chunk makes each chunk self-describing, so a
 * first message from an unknown address can be answered (libfabric's
 * FI_SOURCE cannot name a sender that is not yet in the address vector) and
 * a chunk never waits for another to be attributed.
 *
 * Grants. Chunks of up to 16 KiB on the wire (ofi_rxm's eager limit) go
 * unsolicited into a pool of small receive buffers (tag 1). A larger chunk
 * is sent only on a grant: the receiver posts a chunk-sized buffer under a
 * unique tag (bit 62 | 48-bit id) and tells the sender the id (control
 * chunks, flags bit 1, seq 0: REQ "I need n", GRANT "ids, for your stream
 * s", RELEASE "ids back", VOID "I reset, forget my grants"). So no large
 * message is ever unexpected at ofi_rxm, which 1.17 does not survive when
 * the sender's connection closes (see TP_EAGER_MAX), and a frozen sender
 * pins only the buffers granted to it. Grants are standing credit, up to a
 * window per peer and rx_large_bufs in all: a sender gives them back after
 * 5 s unused, a receiver takes back those unused for 15 s (dead senders),
 * and both forget them across a reset (the grant message names the sender
 * stream it was for, so grants issued to an earlier incarnation are never
 * used). A receiver repeats outstanding grants when asked again, because
 * the first message sent to a peer that just reopened its endpoint is lost
 * with the dead connection; the sender ignores ids it holds or used.
 *
 * A message that arrives in order in one chunk is handed to on_recv
 * straight from its receive buffer; a fresh one replaces it if the callback
 * keeps it. Larger messages are copied chunk by chunk into one allocation.
 *
 * Liveness (design §7). Sends have deadlines, scanned whenever the earliest
 * one falls due; the wait in the progress loop never sleeps past it. A send
 * that times out is reported at once but its chunks stay owned here until
 * libfabric completes them. When those abandoned sends pass stuck_max_ops or
 * stuck_max_bytes, the whole libfabric stack is closed (fi_close discards
 * outstanding operations, so their buffers are free again) and reopened on
 * the same address; peers are re-inserted and get new streams. Whatever
 * libfabric failed (or we cancelled) is quarantined, context and buffer,
 * for TP_QUARANTINE_GRACE_MS, since ofi_rxm may report it again.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/clock.h"
#include "base/hostport.h"
#include "base/log.h"
#include "node/transport/transport.h"

#define COMP "transport"

#define TP_MAGIC 0x50545344u /* bytes "DSTP" */
#define TP_VERSION 1
#define TP_HDR_FIXED 40
#define TP_NAME_MAX 128
#define TP_HDR_MAX (TP_HDR_FIXED + TP_NAME_MAX)
#define TP_F_ABORT 0x01
#define TP_F_CTRL 0x02 /* transport control: grant traffic, never delivered */

/* Only messages of at most TP_EAGER_MAX wire bytes travel unsolicited
 * (ofi_rxm's eager limit). A larger chunk is sent only with a grant: the
 * tag of a receive buffer the receiver has posted for that sender. ofi_rxm
 * 1.17 crashes when a receive is posted that matches an *unexpected*
 * message above its eager limit whose connection has closed (it uses the
 * freed connection: reproduced standalone, 16384 bytes survive, 16385
 * crash), so with grants a large chunk is never unexpected. */
#define TP_TAG_SMALL 1u
#define TP_TAG_GRANT (1ull << 62)
#define TP_GRANT_MASK ((1ull << 48) - 1)
#define TP_EAGER_MAX 16384u
#define TP_SMALL_BUF TP_EAGER_MAX
#define TP_GRANT_RING 256      /* grants a sender holds per peer, at most */
#define TP_GRANTS_PER_MSG 64
#define TP_REQ_REFRESH_MS 250  /* re-ask for grants that did not come */
#define TP_GRANT_IDLE_MS 5000   /* a sender gives back grants unused this long */
/* A receiver takes back a grant unused for this long: its sender would
 * have given it back if alive, so it is dead or frozen (a frozen one that
 * resumes sends on a withdrawn tag: never matched, its send times out). */
#define TP_GRANT_RECLAIM_MS (3 * TP_GRANT_IDLE_MS)
/* What libfabric failed or we cancelled is kept this long before its
 * memory is reused: ofi_rxm may report such an operation again (seen
 * within milliseconds), so the context and buffer must stay valid. */
#define TP_QUARANTINE_GRACE_MS 60000
enum ctrl_kind { CTRL_REQ = 1, CTRL_GRANT = 2, CTRL_RELEASE = 3, CTRL_VOID = 4 };

#define TP_RX_HELD_MAX 65536  /* out-of-order messages held per peer */
#define TP_RX_COPY_MAX 16384  /* held messages up to this size are copied
                               * out of their 64 KiB pool buffer */
#define TP_RX_WINDOW 65536    /* how far ahead of rx_next a seq may be */
#define TP_STREAMS 4          /* sender streams tracked per peer (LRU) */
#define TP_CQ_BATCH 32
#define TP_POST_BUDGET 64     /* chunks posted per loop iteration */
#define TP_TICK_MS 100        /* longest sleep of the progress loop */
#define TP_FRESH_GAP_MS 200   /* gap before the first delivery of a stream */
#define TP_CACHE_SLOTS 64     /* large buffers kept for reuse */
#define TP_CACHE_MIN (64u << 10)
#define TP_CACHE_BYTES ((size_t)256 << 20)
#define TP_MIN_CHUNK 4096u
#define TP_MAX_CHUNK (64u << 20)

enum ctx_kind { CTX_RX = 1, CTX_TX = 2 };

/* Every libfabric context starts with this, so a completion's op_context
 * tells what it belongs to. */
struct tp_ctx {
    struct fi_context2 fi;
    uint8_t kind;
};

struct tp_op;

struct tp_chunk {
    struct tp_ctx ctx;
    struct tp_op *op;
    uint32_t wire;   /* header + payload bytes, charged to inflight */
    uint8_t posted;  /* a completion is expected */
    uint8_t hdr[TP_HDR_MAX];
};

enum op_where { OP_NOWHERE = 0, OP_TXQ, OP_INFLIGHT, OP_CTRLQ };

struct tp_op {
    struct tp_op *next, *prev;
    uint32_t slot;
    uint8_t is_abort;
    uint8_t is_ctrl;                  /* control message (payload in copy) */
    uint8_t where;
    uint8_t reported;
    uint8_t abandoned;
    uint8_t tainted;                  /* libfabric failed a chunk: quarantine */
    uint64_t q_ms;                    /* quarantined at */
    const uint8_t *data;              /* the caller's buf (or copy): released */
    size_t len;                       /* head + body + tail */
    size_t body_len;
    uint16_t head_len, tail_len;      /* edge[0..head_len), then the tail */
    uint8_t edge[DS_TRANSPORT_EDGE_MAX];
    uint8_t *flat;                    /* the whole message in one piece, for a
                                       * provider with too few iovecs */
    void *copy;                       /* our own copy (release == NULL) */
    ds_transport_release_fn release;
    void *release_arg;
    ds_transport_done_fn done;
    void *done_arg;
    uint64_t deadline_ms;
    uint64_t stream, seq;
    uint32_t chunk_size, nchunks, next_chunk, pending, completed;
    uint64_t pending_bytes;           /* wire bytes posted, not completed */
    struct tp_chunk *chunks;
};

struct op_list {
    struct tp_op *head, *tail;
};

enum rx_state { RX_PARTIAL = 0, RX_COMPLETE, RX_SKIP };

struct tp_rxmsg {
    struct tp_rxmsg *next;
    uint64_t seq;
    uint8_t state;
    uint8_t pooled;      /* base is a receive pool buffer */
    uint8_t *base;       /* allocation holding data */
    uint8_t *data;
    uint64_t len;
    uint32_t chunk_size, nchunks, got;
    uint8_t *bitmap;
    uint64_t last_ms;
    uint64_t mem;        /* bytes charged to rx_mem */
};

/* One sender stream (a sender's endpoint incarnation) as we receive it.
 * The stream id in a chunk is not authenticated, so a forged one must not
 * be able to evict the genuine stream for good: a peer keeps several, the
 * least recently active makes room, and a stream that comes back after
 * being evicted simply starts over (a short gap wait, then in order). */
struct tp_rxs {
    uint64_t id;                       /* 0: unused */
    uint64_t next;                     /* next seq to deliver */
    uint8_t resync;                    /* after our reset: next seq is the base */
    uint8_t fresh;                     /* nothing delivered on it yet */
    struct tp_rxmsg *held, *held_tail; /* sorted by seq */
    unsigned nheld;
    uint64_t gap_since_ms;
    uint64_t last_use;                 /* t->rx_tick at its last chunk (LRU) */
};

enum peer_state { PEER_FREE = 0, PEER_LIVE, PEER_REMOVING, PEER_DRAINING };

struct tp_peer {
    /* under t->lock */
    uint8_t state;
    uint8_t need_av;
    uint16_t gen;
    char addr[DS_TRANSPORT_ADDR_MAX]; /* canonical "host:port": the key */
    uint8_t raw[TP_NAME_MAX];
    size_t rawlen;

    /* progress thread */
    fi_addr_t fa;
    uint8_t in_av;
    uint8_t unresponsive;
    uint8_t in_busy;
    uint32_t misses;
    uint64_t tx_stream, tx_seq;
    struct op_list txq, inflight;
    uint64_t inflight_bytes;
    struct tp_rxs rxs[TP_STREAMS];   /* its senders' streams */

    /* grants, as a sender: receive buffers it posted for us */
    uint64_t gr[TP_GRANT_RING];
    unsigned gr_head, gr_n;
    uint64_t used[TP_GRANT_RING];     /* grants we used lately: a repeated
                                       * GRANT for one of them is stale */
    unsigned used_pos;
    uint32_t need_sent;               /* grants asked for and not yet come */
    uint8_t req_pending;              /* a REQ is queued or in flight */
    uint64_t req_ms;                  /* when we last asked */
    struct op_list ctrlq;             /* control messages, posted first */
    uint64_t large_ms;                /* last time a large chunk was queued/posted */
    /* grants, as a receiver: buffers we posted for it */
    uint64_t grant_stream;            /* its stream our grants belong to */
    unsigned grants_out;
    uint32_t need;                    /* grants it asked for, not yet given */
    uint64_t gbatch[TP_GRANTS_PER_MSG];
    unsigned gbatch_n;
    uint32_t busy_next;               /* busy list link: slot+1, 0 = end */
};

/* One posted receive. A fresh one replaces it in its pool slot whenever
 * libfabric fails it, because ofi_rxm may report the same failed receive
 * more than once (seen when a sender's connection breaks mid-rendezvous):
 * the failed posting, buffer and context, stays untouched in quarantine
 * until the next stack close, so a late report can neither complete a
 * newer posting nor land in reused memory. */
struct tp_rxbuf {
    struct tp_ctx ctx;
    uint8_t *buf;
    size_t cap;
    uint64_t tag;
    uint32_t slot;
    uint8_t posted;     /* libfabric holds it */
    uint8_t canceling;  /* fi_cancel issued (grants only), no completion yet */
    uint8_t is_grant;   /* a buffer granted to one sender (not a pool slot) */
    uint32_t grant_slot;
    uint16_t grant_gen;
    uint64_t grant_id;
    uint64_t grant_stream; /* the sender stream that asked for it */
    uint64_t q_ms;      /* quarantined at */
    uint64_t since_ms;  /* posted at, or cancel issued at */
    struct tp_rxbuf *qnext;
    struct tp_rxbuf *gnext, *gprev; /* the transport's list of grants */
};

struct tp_stats_atomic {
    _Atomic uint64_t msgs_sent, bytes_sent, msgs_recv, bytes_recv;
    _Atomic uint64_t send_timeouts, send_errors, eagain;
    _Atomic uint64_t stuck_ops, stuck_bytes, queued_bytes, resets;
    _Atomic uint64_t quarantined_bytes, dup_completions;
    _Atomic uint64_t drops[DS_TP_DROP_COUNT];
};

struct ds_transport {
    ds_transport_opts o;
    char *provider, *listen_host, *listen_port, *advertise;

    /* libfabric stack (progress thread once started) */
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    int cq_fd;
    uint8_t name[TP_NAME_MAX];   /* what goes in every header */
    size_t namelen;
    char addr_text[DS_TRANSPORT_ADDR_MAX];
    uint32_t addr_format;
    size_t iov_limit;            /* the provider's, for sends */
    int broken;                  /* stack closed, reopen pending */
    uint64_t reopen_at_ms;

    int evfd;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t lock;
    /* under lock */
    struct op_list subq;
    int stop;
    int reset_req;
    int peers_dirty;            /* some slot needs an AV insert or removal */
    struct tp_peer *peers;
    unsigned npeers;

    /* progress thread */
    struct tp_rxbuf **rx;        /* pool slots: the current posting of each */
    unsigned nrx, rx_unposted;
    struct tp_rxbuf *q_rx;       /* failed receives, kept until stack close */
    struct tp_rxbuf *grants;     /* posted grant buffers */
    unsigned ngrants;
    unsigned grants_per_peer;    /* a window's worth of chunks */
    uint64_t next_grant_id;
    uint64_t next_quarantine_ms; /* next look for quarantine past its grace */
    struct tp_op *q_ops;         /* ops with failed chunks, same */
    uint64_t rx_mem;
    uint32_t busy_head;         /* peers with txq/inflight/held work */
    uint64_t next_due_ms;
    int eagain_seen;
    uint64_t last_work_ns;
    uint64_t rx_tick;           /* chunks received: the streams' LRU clock */
    uint64_t last_stream;       /* one-entry cache of stream -> slot, index */
    uint32_t last_slot, last_sidx;

    /* Freed large buffers kept for reuse: a fresh 1-64 MiB allocation is
     * mapped anew by malloc and faults in page by page, which measured
     * about as costly as copying it. Any thread (own lock). */
    pthread_mutex_t cache_lock;
    void *cache_buf[TP_CACHE_SLOTS];
    size_t cache_cap[TP_CACHE_SLOTS];
    unsigned cache_n;
    size_t cache_bytes;

    struct tp_stats_atomic st;
};

static const char *const drop_names[DS_TP_DROP_COUNT] = {
#define DS_TP_DROP_NAME_(e, name, text) name,
    DS_TP_DROP_LIST(DS_TP_DROP_NAME_)
#undef DS_TP_DROP_NAME_
};

const char *ds_transport_drop_name(enum ds_transport_drop reason)
{
    return (unsigned)reason < DS_TP_DROP_COUNT ? drop_names[reason] : "unknown";
}

#define ST_ADD(t, f, n) atomic_fetch_add_explicit(&(t)->st.f, (uint64_t)(n), memory_order_relaxed)
#define ST_SUB(t, f, n) atomic_fetch_sub_explicit(&(t)->st.f, (uint64_t)(n), memory_order_relaxed)

/* ---- small helpers ---------------------------------------------------- */

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = ds_now_ns() * 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

/* libfabric errors are errno values below 256 (FI_ETRUNC etc. above). */
static int fi_to_errno(int fierr)
{
    if (fierr < 0)
        fierr = -fierr;
    if (fierr > 0 && fierr < 256)
        return -fierr;
    return -EIO;
}

static void drop(ds_transport *t, enum ds_transport_drop why)
{
    ST_ADD(t, drops[why], 1);
}

static ds_transport_peer peer_handle(const ds_transport *t, uint32_t slot)
{
    return ((uint32_t)t->peers[slot].gen << 16) | (slot + 1);
}

void *ds_transport_buf_get(ds_transport *t, size_t size)
{
    if (t && size >= TP_CACHE_MIN) {
        pthread_mutex_lock(&t->cache_lock);
        int best = -1;
        for (unsigned i = 0; i < t->cache_n; i++)
            if (t->cache_cap[i] >= size && t->cache_cap[i] <= 2 * size &&
                (best < 0 || t->cache_cap[i] < t->cache_cap[best]))
                best = (int)i;
        void *b = NULL;
        if (best >= 0) {
            b = t->cache_buf[best];
            t->cache_bytes -= t->cache_cap[best];
            t->cache_n--;
            t->cache_buf[best] = t->cache_buf[t->cache_n];
            t->cache_cap[best] = t->cache_cap[t->cache_n];
        }
        pthread_mutex_unlock(&t->cache_lock);
        if (b)
            return b;
    }
    return malloc(size ? size : 1);
}

void ds_transport_buf_put(ds_transport *t, void *buf)
{
    if (!buf)
        return;
    size_t cap = malloc_usable_size(buf);
    if (t && cap >= TP_CACHE_MIN) {
        pthread_mutex_lock(&t->cache_lock);
        if (t->cache_n < TP_CACHE_SLOTS && t->cache_bytes + cap <= TP_CACHE_BYTES) {
            t->cache_buf[t->cache_n] = buf;
            t->cache_cap[t->cache_n++] = cap;
            t->cache_bytes += cap;
            buf = NULL;
        }
        pthread_mutex_unlock(&t->cache_lock);
    }
    free(buf);
}

static void wake(ds_transport *t)
{
    uint64_t one = 1;
    ssize_t r = write(t->evfd, &one, sizeof(one));
    (void)r; /* EAGAIN: the counter is already non-zero, a wake-up is pending */
}

/* host:port (base/hostport.h) as the host and port texts fi_getinfo takes. */
static int split_hostport(const char *s, char *host, size_t hn, char *port, size_t pn)
{
    ds_hostport hp;
    if (!s || !host || !port || ds_hostport_parse(s, &hp))
        return -EINVAL;
    const int l = snprintf(host, hn, "%s", hp.host);
    if (l < 0 || (size_t)l >= hn || snprintf(port, pn, "%u", (unsigned)hp.port) >= (int)pn)
        return -EINVAL;
    return 0;
}

/* Canonical text of a raw libfabric address for our address format, and
 * the check that a raw name from the wire is one we can insert. Returns 0
 * or -EINVAL. */
static int addr_canon(uint32_t fmt, const uint8_t *raw, size_t len, char *out, size_t n)
{
    char ip[INET6_ADDRSTRLEN];
    if (fmt == FI_SOCKADDR_IN || fmt == FI_SOCKADDR_IN6 || fmt == FI_SOCKADDR) {
        sa_family_t fam;
        if (len < sizeof(fam))
            return -EINVAL;
        memcpy(&fam, raw, sizeof(fam));
        if (fam == AF_INET && len == sizeof(struct sockaddr_in) && fmt != FI_SOCKADDR_IN6) {
            struct sockaddr_in a;
            memcpy(&a, raw, sizeof(a));
            if (a.sin_addr.s_addr == htonl(INADDR_ANY) || a.sin_port == 0)
                return -EINVAL;
            inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
            snprintf(out, n, "%s:%u", ip, ntohs(a.sin_port));
            return 0;
        }
        if (fam == AF_INET6 && len == sizeof(struct sockaddr_in6) && fmt != FI_SOCKADDR_IN) {
            struct sockaddr_in6 a;
            memcpy(&a, raw, sizeof(a));
            if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) || a.sin6_port == 0)
                return -EINVAL;
            inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof(ip));
            snprintf(out, n, "[%s]:%u", ip, ntohs(a.sin6_port));
            return 0;
        }
        return -EINVAL;
    }
    if (fmt == FI_ADDR_STR) {
        /* e.g. "fi_ns://127.0.0.1:5000" from shm: printable, NUL inside. */
        size_t sl = strnlen((const char *)raw, len);
        if (sl == 0 || sl == len)
            return -EINVAL;
        for (size_t i = 0; i < sl; i++)
            if (raw[i] < 0x21 || raw[i] > 0x7e)
                return -EINVAL;
        const char *s = (const char *)raw;
        const char *sep = strstr(s, "://");
        snprintf(out, n, "%s", sep ? sep + 3 : s);
        return 0;
    }
    /* Other formats (InfiniBand, ...): hex is canonical enough. */
    if (len == 0 || len * 2 + 1 > n)
        return -EINVAL;
    for (size_t i = 0; i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* ---- options ----------------------------------------------------------- */

void ds_transport_opts_default(ds_transport_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->provider = "tcp";
    o->listen = "127.0.0.1:0";
    /* 1 MiB of payload plus room for the secured layer's frame header,
     * chunk prefix and tag, so that a 1 MiB message is one libfabric
     * message (delivered without a copy) rather than 1 MiB and a sliver. */
    o->chunk_bytes = (1u << 20) + 4096;
    /* Small on purpose: a receiver must set aside every buffer it matched
     * to a rendezvous from a peer that then froze, and this bounds how many
     * that can be per peer (8 with 1 MiB chunks). Loopback and datacenter
     * bandwidth-delay products are well below it. */
    o->max_inflight_bytes = 8u << 20;
    o->max_queued_bytes = (size_t)2 << 30;
    o->max_msg_bytes = (size_t)1 << 30;
    o->rx_mem_bytes = (size_t)2 << 30;
    o->rx_small_bufs = 64;
    o->rx_large_bufs = 64;
    o->max_peers = 1024;
    o->rx_timeout_ms = 10000;
    o->miss_limit = 1;
    o->stuck_max_ops = 1024;
    o->stuck_max_bytes = 256u << 20;
}

static int opts_check(const ds_transport_opts *o)
{
#define BAD(...) do { ds_error(COMP, __VA_ARGS__); return -EINVAL; } while (0)
    if (!o->on_recv)
        BAD("on_recv callback is required");
    if (!o->listen || !*o->listen)
        BAD("listen address is empty");
    if (o->chunk_bytes < TP_MIN_CHUNK || o->chunk_bytes > TP_MAX_CHUNK)
        BAD("chunk_bytes=%zu outside [%u, %u]", o->chunk_bytes, TP_MIN_CHUNK, TP_MAX_CHUNK);
    if (o->max_inflight_bytes < o->chunk_bytes + TP_HDR_MAX)
        BAD("max_inflight_bytes=%zu must hold one chunk (%zu)", o->max_inflight_bytes,
            o->chunk_bytes + TP_HDR_MAX);
    if (o->max_queued_bytes == 0 || o->max_msg_bytes == 0 || o->rx_mem_bytes == 0)
        BAD("max_queued_bytes, max_msg_bytes and rx_mem_bytes must be > 0");
    if (o->rx_small_bufs == 0 || o->rx_large_bufs == 0 || o->rx_small_bufs > 4096 ||
        o->rx_large_bufs > 4096)
        BAD("rx_small_bufs=%u rx_large_bufs=%u: each in [1, 4096]", o->rx_small_bufs,
            o->rx_large_bufs);
    if (o->max_peers == 0 || o->max_peers > 65535)
        BAD("max_peers=%u outside [1, 65535]", o->max_peers);
    if (o->rx_timeout_ms == 0)
        BAD("rx_timeout_ms must be > 0");
    if (o->miss_limit == 0 || o->stuck_max_ops == 0 || o->stuck_max_bytes == 0)
        BAD("miss_limit, stuck_max_ops and stuck_max_bytes must be > 0");
#undef BAD
    return 0;
}

/* ---- the libfabric stack --------------------------------------------- */

static void stack_close(ds_transport *t)
{
    if (t->ep)
        fi_close(&t->ep->fid);
    if (t->av)
        fi_close(&t->av->fid);
    if (t->cq)
        fi_close(&t->cq->fid);
    if (t->domain)
        fi_close(&t->domain->fid);
    if (t->fabric)
        fi_close(&t->fabric->fid);
    if (t->info)
        fi_freeinfo(t->info);
    t->ep = NULL;
    t->av = NULL;
    t->cq = NULL;
    t->domain = NULL;
    t->fabric = NULL;
    t->info = NULL;
    t->cq_fd = -1;
}

static struct fi_info *make_hints(const char *provider)
{
    struct fi_info *h = fi_allocinfo();
    if (!h)
        return NULL;
    h->caps = FI_TAGGED;
    h->mode = FI_CONTEXT | FI_CONTEXT2;
    h->ep_attr->type = FI_EP_RDM;
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->domain_attr->mr_mode = 0; /* we register nothing: providers that need it are skipped */
    h->fabric_attr->prov_name = strdup(provider);
    if (!h->fabric_attr->prov_name) {
        fi_freeinfo(h);
        return NULL;
    }
    return h;
}

static int map_getinfo_err(int r)
{
    if (r == -FI_ENODATA)
        return -ENODATA;
    return fi_to_errno(r);
}

/* Open fabric, domain, CQ, AV and endpoint, bound to listen_host:port. */
static int stack_open(ds_transport *t, const char *port)
{
    int r;
    struct fi_info *hints = make_hints(t->provider);
    if (!hints)
        return -ENOMEM;
    r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), t->listen_host, port,
                   FI_SOURCE, hints, &t->info);
    fi_freeinfo(hints);
    if (r) {
        ds_error(COMP, "fi_getinfo provider=%s listen=%s:%s: %s", t->provider, t->listen_host,
                 port, fi_strerror(-r));
        t->info = NULL;
        return map_getinfo_err(r);
    }
    t->addr_format = t->info->addr_format;
    t->iov_limit = t->info->tx_attr ? t->info->tx_attr->iov_limit : 1;
    const char *step = "fi_fabric";
    r = fi_fabric(t->info->fabric_attr, &t->fabric, NULL);
    if (r)
        goto fail;
    step = "fi_domain";
    r = fi_domain(t->fabric, t->info, &t->domain, NULL);
    if (r)
        goto fail;

    /* A CQ with a file descriptor lets the progress thread sleep in poll();
     * shm has none, and then the loop naps in 1 ms steps instead. */
    struct fi_cq_attr ca = {
        .format = FI_CQ_FORMAT_TAGGED,
        .size = 4096,
        .wait_obj = FI_WAIT_FD,
    };
    step = "fi_cq_open";
    r = fi_cq_open(t->domain, &ca, &t->cq, NULL);
    if (r) {
        t->cq = NULL;
        ca.wait_obj = FI_WAIT_NONE;
        r = fi_cq_open(t->domain, &ca, &t->cq, NULL);
        if (r)
            goto fail;
    } else if (fi_control(&t->cq->fid, FI_GETWAIT, &t->cq_fd)) {
        t->cq_fd = -1;
    }
    struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = t->o.max_peers};
    step = "fi_av_open";
    r = fi_av_open(t->domain, &aa, &t->av, NULL);
    if (r) {
        /* shm refuses counts above its own limit (256 peers): let it size
         * the table itself; inserts past its limit then fail visibly. */
        t->av = NULL;
        aa.count = 0;
        r = fi_av_open(t->domain, &aa, &t->av, NULL);
        if (r)
            goto fail;
    }
    step = "fi_endpoint";
    r = fi_endpoint(t->domain, t->info, &t->ep, NULL);
    if (r)
        goto fail;
    step = "fi_ep_bind(cq)";
    r = fi_ep_bind(t->ep, &t->cq->fid, FI_TRANSMIT | FI_RECV);
    if (r)
        goto fail;
    step = "fi_ep_bind(av)";
    r = fi_ep_bind(t->ep, &t->av->fid, 0);
    if (r)
        goto fail;
    step = "fi_enable";
    r = fi_enable(t->ep);
    if (r)
        goto fail;
    return 0;
fail:
    ds_error(COMP, "opening provider=%s on %s:%s failed at %s: %s", t->provider, t->listen_host,
             port, step, fi_strerror(r < 0 ? -r : r));
    stack_close(t);
    return r == -FI_EADDRINUSE ? -EADDRINUSE : fi_to_errno(r);
}

/* After the first open: learn our bound name, the real port, and the name
 * we advertise in headers. */
static int learn_name(ds_transport *t)
{
    uint8_t bound[TP_NAME_MAX];
    size_t blen = sizeof(bound);
    int r = fi_getname(&t->ep->fid, bound, &blen);
    if (r) {
        ds_error(COMP, "fi_getname: %s", fi_strerror(-r));
        return fi_to_errno(r);
    }
    char text[DS_TRANSPORT_ADDR_MAX];
    int bound_ok = addr_canon(t->addr_format, bound, blen, text, sizeof(text)) == 0;

    /* Remember the real port for reopening after a reset. */
    if (bound_ok) {
        char h[DS_TRANSPORT_ADDR_MAX], p[8];
        if (split_hostport(text, h, sizeof(h), p, sizeof(p)) == 0) {
            free(t->listen_port);
            t->listen_port = strdup(p);
            if (!t->listen_port)
                return -ENOMEM;
        }
    }

    if (!t->advertise) {
        if (!bound_ok) {
            ds_error(COMP, "listen address %s:%s cannot be advertised (wildcard?); "
                     "set an advertise address", t->listen_host, t->listen_port);
            return -EINVAL;
        }
        memcpy(t->name, bound, blen);
        t->namelen = blen;
        snprintf(t->addr_text, sizeof(t->addr_text), "%s", text);
        return 0;
    }
    /* Resolve the advertised address like a peer's. */
    char h[DS_TRANSPORT_ADDR_MAX], p[8];
    if (split_hostport(t->advertise, h, sizeof(h), p, sizeof(p)))
        return -EINVAL;
    struct fi_info *hints = make_hints(t->provider), *di = NULL;
    if (!hints)
        return -ENOMEM;
    r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), h, p, 0, hints, &di);
    fi_freeinfo(hints);
    if (r || !di->dest_addr || di->dest_addrlen > TP_NAME_MAX ||
        addr_canon(t->addr_format, di->dest_addr, di->dest_addrlen, text, sizeof(text))) {
        ds_error(COMP, "advertise address %s does not resolve for provider %s", t->advertise,
                 t->provider);
        if (!r)
            fi_freeinfo(di);
        return -EINVAL;
    }
    memcpy(t->name, di->dest_addr, di->dest_addrlen);
    t->namelen = di->dest_addrlen;
    snprintf(t->addr_text, sizeof(t->addr_text), "%s", text);
    fi_freeinfo(di);
    return 0;
}

/* ---- lists ---------------------------------------------------------- */

static void list_push_tail(struct op_list *l, struct tp_op *op)
{
    op->next = NULL;
    op->prev = l->tail;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
}

static void list_push_head(struct op_list *l, struct tp_op *op)
{
    op->prev = NULL;
    op->next = l->head;
    if (l->head)
        l->head->prev = op;
    else
        l->tail = op;
    l->head = op;
}

static void list_unlink(struct op_list *l, struct tp_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        l->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        l->tail = op->prev;
    op->next = op->prev = NULL;
}

static void mark_busy(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (p->in_busy)
        return;
    p->in_busy = 1;
    p->busy_next = t->busy_head;
    t->busy_head = slot + 1;
}

/* ---- send path ------------------------------------------------------ */

static void peer_free_slot(ds_transport *t, uint32_t slot);
static void av_insert(ds_transport *t, uint32_t slot);

static void op_free(ds_transport *t, struct tp_op *op)
{
    if (op->is_ctrl) {
        if (op->data && op->data[0] == CTRL_REQ)
            t->peers[op->slot].req_pending = 0;
        free(op->copy);
    } else if (!op->is_abort) {
        if (op->release)
            op->release(op->release_arg, (void *)op->data);
        ds_transport_buf_put(t, op->copy);
        ds_transport_buf_put(t, op->flat);
        ST_SUB(t, queued_bytes, op->len);
    }
    free(op->chunks);
    free(op);
}

static void event(ds_transport *t, enum ds_transport_event_kind kind, uint32_t slot, int status)
{
    if (!t->o.on_event)
        return;
    ds_transport_event ev = {
        .kind = kind,
        .peer = slot == UINT32_MAX ? 0 : peer_handle(t, slot),
        .misses = slot == UINT32_MAX ? 0 : t->peers[slot].misses,
        .status = status,
    };
    t->o.on_event(t->o.cb_ctx, &ev);
}

static void peer_alive(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    p->misses = 0;
    if (p->unresponsive) {
        p->unresponsive = 0;
        ds_info(COMP, "peer %s responsive again", p->addr);
        event(t, DS_TRANSPORT_EV_PEER_RESPONSIVE, slot, 0);
    }
}

/* Report an op's outcome to its owner, once. */
static void op_report(ds_transport *t, struct tp_op *op, int status)
{
    if (op->reported || op->is_abort)
        return;
    op->reported = 1;
    struct tp_peer *p = &t->peers[op->slot];
    if (status == 0) {
        ST_ADD(t, msgs_sent, 1);
        ST_ADD(t, bytes_sent, op->len);
        peer_alive(t, op->slot);
    } else if (status != -ECANCELED && status != -ENETRESET) {
        /* A missed deadline or a provider error is the peer's miss; a
         * removal or our own reset is not. */
        if (status == -ETIMEDOUT)
            ST_ADD(t, send_timeouts, 1);
        else
            ST_ADD(t, send_errors, 1);
        p->misses++;
        if (p->misses >= t->o.miss_limit && !p->unresponsive && p->state == PEER_LIVE) {
            p->unresponsive = 1;
            ds_log_rl(DS_LOG_WARN, COMP, "peer %s unresponsive misses=%u", p->addr, p->misses);
            event(t, DS_TRANSPORT_EV_PEER_UNRESPONSIVE, op->slot, status);
        }
    }
    if (op->done)
        op->done(op->done_arg, status);
}

/* The op has no chunk left in libfabric and nothing more will be posted:
 * unlink and free it. */
static void op_retire(ds_transport *t, struct tp_op *op)
{
    struct tp_peer *p = &t->peers[op->slot];
    if (op->where == OP_TXQ)
        list_unlink(&p->txq, op);
    else if (op->where == OP_INFLIGHT)
        list_unlink(&p->inflight, op);
    else if (op->where == OP_CTRLQ)
        list_unlink(&p->ctrlq, op);
    op->where = OP_NOWHERE;
    if (op->abandoned) {
        ST_SUB(t, stuck_ops, 1);
        op->abandoned = 0;
    }
    uint32_t slot = op->slot;
    if (op->tainted) {
        /* libfabric failed a chunk of it; ofi_rxm may report a failure
         * twice, so its contexts and buffer stay valid for the grace
         * period (or until the stack is closed). */
        op->next = t->q_ops;
        op->q_ms = ds_now_ms();
        t->q_ops = op;
        ST_ADD(t, quarantined_bytes, op->len);
    } else {
        op_free(t, op);
    }
    if (p->state == PEER_DRAINING && !p->txq.head && !p->inflight.head && !p->ctrlq.head)
        peer_free_slot(t, slot);
}

/* Free what has sat in quarantine past its grace period. */
static void quarantine_age(ds_transport *t, uint64_t now)
{
    for (struct tp_op **pp = &t->q_ops; *pp;) {
        struct tp_op *op = *pp;
        if (now - op->q_ms >= TP_QUARANTINE_GRACE_MS) {
            *pp = op->next;
            ST_SUB(t, quarantined_bytes, op->len);
            op_free(t, op);
        } else {
            pp = &op->next;
        }
    }
    for (struct tp_rxbuf **pp = &t->q_rx; *pp;) {
        struct tp_rxbuf *rb = *pp;
        if (now - rb->q_ms >= TP_QUARANTINE_GRACE_MS) {
            *pp = rb->qnext;
            ST_SUB(t, quarantined_bytes, rb->cap);
            free(rb->buf);
            free(rb);
        } else {
            pp = &rb->qnext;
        }
    }
}

/* After the stack is closed nothing in quarantine can be touched again. */
static void quarantine_free(ds_transport *t)
{
    while (t->q_ops) {
        struct tp_op *op = t->q_ops;
        t->q_ops = op->next;
        op_free(t, op);
    }
    while (t->q_rx) {
        struct tp_rxbuf *rb = t->q_rx;
        t->q_rx = rb->qnext;
        free(rb->buf);
        free(rb);
    }
    atomic_store(&t->st.quarantined_bytes, 0);
}

static struct tp_op *abort_op_new(uint32_t slot, uint64_t stream, uint64_t seq)
{
    struct tp_op *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    a->is_abort = 1;
    a->slot = slot;
    a->stream = stream;
    a->seq = seq;
    a->nchunks = 1;
    a->reported = 1;
    return a;
}

/* An op failed (deadline, error, removal) with status. Stop posting it; if
 * part of it reached the wire, tell the receiver with an ABORT; keep it
 * while libfabric still holds chunks of it. */
static void op_fail(ds_transport *t, struct tp_op *op, int status)
{
    struct tp_peer *p = &t->peers[op->slot];
    op_report(t, op, status);
    if (op->is_abort)
        return;
    int partly_posted = op->next_chunk > 0 && op->next_chunk < op->nchunks;
    if (op->where == OP_TXQ) {
        list_unlink(&p->txq, op);
        op->where = OP_NOWHERE;
        if (partly_posted) {
            struct tp_op *a = abort_op_new(op->slot, op->stream, op->seq);
            if (a) {
                list_push_head(&p->txq, a);
                a->where = OP_TXQ;
            }
        }
        if (op->pending) {
            list_push_tail(&p->inflight, op);
            op->where = OP_INFLIGHT;
        }
    }
    op->next_chunk = op->nchunks; /* nothing more goes out */
    if (op->pending == 0) {
        op_retire(t, op);
        return;
    }
    if (!op->abandoned) {
        op->abandoned = 1;
        ST_ADD(t, stuck_ops, 1);
        ST_ADD(t, stuck_bytes, op->pending_bytes);
    }
}

static void chunk_header(ds_transport *t, struct tp_op *op, uint32_t idx, uint8_t *h)
{
    put_le32(h, TP_MAGIC);
    h[4] = TP_VERSION;
    h[5] = op->is_abort ? TP_F_ABORT : op->is_ctrl ? TP_F_CTRL : 0;
    h[6] = (uint8_t)(t->namelen & 0xff);
    h[7] = (uint8_t)(t->namelen >> 8);
    put_le64(h + 8, op->stream);
    put_le64(h + 16, op->seq);
    put_le64(h + 24, op->len);
    put_le32(h + 32, idx);
    put_le32(h + 36, op->chunk_size);
    memcpy(h + TP_HDR_FIXED, t->name, t->namelen);
}

/* ---- grants (see TP_EAGER_MAX) -------------------------------------- */

static int gr_known(const struct tp_peer *p, uint64_t id)
{
    for (unsigned i = 0; i < p->gr_n; i++)
        if (p->gr[(p->gr_head + i) % TP_GRANT_RING] == id)
            return 1;
    for (unsigned i = 0; i < TP_GRANT_RING; i++)
        if (p->used[i] == id)
            return 1;
    return 0;
}

/* A grant from the peer; one we hold or used already is ignored (the
 * receiver repeats outstanding grants when we ask again, because a GRANT
 * message can be lost: the first send to a peer that just reopened its
 * endpoint vanishes with the dead connection). */
static void gr_push_back(struct tp_peer *p, uint64_t id)
{
    if (gr_known(p, id))
        return;
    if (p->gr_n < TP_GRANT_RING) {
        p->gr[(p->gr_head + p->gr_n) % TP_GRANT_RING] = id;
        p->gr_n++;
    }
}

static void gr_push_front(struct tp_peer *p, uint64_t id)
{
    if (p->gr_n < TP_GRANT_RING) {
        p->gr_head = (p->gr_head + TP_GRANT_RING - 1) % TP_GRANT_RING;
        p->gr[p->gr_head] = id;
        p->gr_n++;
    }
}

static uint64_t gr_pop(struct tp_peer *p)
{
    uint64_t id = p->gr[p->gr_head];
    p->gr_head = (p->gr_head + 1) % TP_GRANT_RING;
    p->gr_n--;
    return id;
}

/* Queue a control message (kind, then body) for the peer; control goes
 * out before data, outside the window, so grants flow even while our own
 * data waits for the peer's. */
static int ctrl_send(ds_transport *t, uint32_t slot, uint8_t kind, const void *body, size_t blen)
{
    struct tp_peer *p = &t->peers[slot];
    struct tp_op *op = calloc(1, sizeof(*op));
    uint8_t *pl = malloc(4 + blen);
    if (!op || !pl) {
        free(op);
        free(pl);
        return -ENOMEM;
    }
    pl[0] = kind;
    pl[1] = pl[2] = pl[3] = 0;
    if (blen)
        memcpy(pl + 4, body, blen);
    op->is_ctrl = 1;
    op->slot = slot;
    op->copy = pl;
    op->data = pl;
    op->len = 4 + blen;
    op->body_len = op->len;
    op->nchunks = 1;
    op->chunk_size = (uint32_t)op->len;
    op->reported = 1;
    list_push_tail(&p->ctrlq, op);
    op->where = OP_CTRLQ;
    mark_busy(t, slot);
    return 0;
}

/* Send grant ids as one message per TP_GRANTS_PER_MSG: u32 n, u64 epoch
 * (for GRANT: the sender stream the grants are for, so that grants issued
 * to an incarnation that has since reset are never used; else 0), ids. */
static void ctrl_send_ids(ds_transport *t, uint32_t slot, uint8_t kind, uint64_t epoch,
                          const uint64_t *ids, unsigned n)
{
    while (n) {
        unsigned k = n < TP_GRANTS_PER_MSG ? n : TP_GRANTS_PER_MSG;
        uint8_t body[12 + 8 * TP_GRANTS_PER_MSG];
        put_le32(body, k);
        put_le64(body + 4, epoch);
        for (unsigned i = 0; i < k; i++)
            put_le64(body + 12 + 8 * i, ids[i]);
        ctrl_send(t, slot, kind, body, 12 + 8 * (size_t)k);
        ids += k;
        n -= k;
    }
}

/* As a receiver: post buffers for what the peer asked for (up to a
 * window per peer and rx_large_bufs in all) and tell it their tags. */
static void grant_more(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (t->broken || p->state != PEER_LIVE)
        return;
    while (p->need && p->grants_out < t->grants_per_peer && t->ngrants < t->o.rx_large_bufs) {
        struct tp_rxbuf *rb = calloc(1, sizeof(*rb));
        if (!rb)
            break;
        rb->cap = t->o.chunk_bytes + TP_HDR_MAX;
        rb->buf = ds_transport_buf_get(t, rb->cap);
        if (!rb->buf) {
            free(rb);
            break;
        }
        rb->is_grant = 1;
        rb->grant_slot = slot;
        rb->grant_gen = p->gen;
        rb->grant_id = t->next_grant_id++ & TP_GRANT_MASK;
        rb->grant_stream = p->grant_stream;
        rb->tag = TP_TAG_GRANT | rb->grant_id;
        rb->ctx.kind = CTX_RX;
        ssize_t r = fi_trecv(t->ep, rb->buf, rb->cap, NULL, FI_ADDR_UNSPEC, rb->tag, 0, &rb->ctx);
        if (r) {
            ds_transport_buf_put(t, rb->buf);
            free(rb);
            break; /* -FI_EAGAIN: the next chunk that arrives retries */
        }
        rb->posted = 1;
        rb->since_ms = ds_now_ms();
        rb->gnext = t->grants;
        if (t->grants)
            t->grants->gprev = rb;
        t->grants = rb;
        t->ngrants++;
        p->grants_out++;
        p->need--;
        p->gbatch[p->gbatch_n++] = rb->grant_id;
        if (p->gbatch_n == TP_GRANTS_PER_MSG) {
            ctrl_send_ids(t, slot, CTRL_GRANT, p->grant_stream, p->gbatch, p->gbatch_n);
            p->gbatch_n = 0;
        }
    }
    if (p->gbatch_n) {
        ctrl_send_ids(t, slot, CTRL_GRANT, p->grant_stream, p->gbatch, p->gbatch_n);
        p->gbatch_n = 0;
    }
}

static void grant_unlink(ds_transport *t, struct tp_rxbuf *rb)
{
    if (rb->gprev)
        rb->gprev->gnext = rb->gnext;
    else
        t->grants = rb->gnext;
    if (rb->gnext)
        rb->gnext->gprev = rb->gprev;
    rb->gnext = rb->gprev = NULL;
    t->ngrants--;
}

/* Cancel our grants to a peer: all of them, or those in ids[0..n). Unused
 * ones come back FI_ECANCELED; one in use completes as it will. */
static void grants_cancel(ds_transport *t, uint32_t slot, const uint64_t *ids, unsigned n)
{
    if (t->broken)
        return;
    for (struct tp_rxbuf *rb = t->grants; rb; rb = rb->gnext) {
        if (rb->grant_slot != slot || rb->grant_gen != t->peers[slot].gen || rb->canceling)
            continue;
        int hit = ids == NULL;
        for (unsigned i = 0; i < n && !hit; i++)
            hit = ids[i] == rb->grant_id;
        if (hit && fi_cancel(&t->ep->fid, &rb->ctx) == 0)
            rb->canceling = 1;
    }
}

/* Take back grants left unused past TP_GRANT_RECLAIM_MS (dead senders). */
static void grants_reclaim(ds_transport *t, uint64_t now)
{
    if (t->broken)
        return;
    for (struct tp_rxbuf *rb = t->grants; rb; rb = rb->gnext)
        if (rb->posted && !rb->canceling && now - rb->since_ms >= TP_GRANT_RECLAIM_MS &&
            fi_cancel(&t->ep->fid, &rb->ctx) == 0)
            rb->canceling = 1;
}

/* After a stack close: every grant buffer is ours again. */
static void grants_free(ds_transport *t)
{
    while (t->grants) {
        struct tp_rxbuf *rb = t->grants;
        grant_unlink(t, rb);
        ds_transport_buf_put(t, rb->buf);
        free(rb);
    }
    t->ngrants = 0;
}

/* Large chunks still to post to the peer (stops counting at `cap`). */
static uint32_t large_chunks_queued(ds_transport *t, struct tp_peer *p, uint32_t cap)
{
    size_t hl = TP_HDR_FIXED + t->namelen;
    uint32_t n = 0;
    for (struct tp_op *op = p->txq.head; op && n < cap; op = op->next) {
        if (op->is_abort)
            continue;
        uint64_t cs = op->chunks ? op->chunk_size : t->o.chunk_bytes;
        uint64_t nch = op->len ? (op->len + cs - 1) / cs : 1;
        uint64_t last = op->len - (nch - 1) * cs;
        for (uint64_t k = op->next_chunk; k < nch && n < cap; k++)
            n += hl + (k + 1 == nch ? last : cs) > TP_EAGER_MAX;
    }
    return n;
}

/* As a sender blocked on grants: ask (once at a time; again after
 * TP_REQ_REFRESH_MS if nothing came, e.g. across a reset). */
static void ask_grants(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    uint64_t now = ds_now_ms();
    uint64_t due = p->req_ms + TP_REQ_REFRESH_MS;
    if (p->req_pending || (p->need_sent && now < due)) {
        if (due < t->next_due_ms)
            t->next_due_ms = due;
        return;
    }
    uint32_t need = large_chunks_queued(t, p, 2 * t->grants_per_peer);
    if (!need)
        return;
    p->large_ms = now;
    uint8_t body[4];
    put_le32(body, need);
    if (ctrl_send(t, slot, CTRL_REQ, body, sizeof(body)))
        return;
    p->req_pending = 1;
    p->need_sent = need;
    p->req_ms = now;
    if (now + TP_REQ_REFRESH_MS < t->next_due_ms)
        t->next_due_ms = now + TP_REQ_REFRESH_MS;
}

/* Give back grants we hold and no longer need. */
static void release_grants(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    uint64_t ids[TP_GRANT_RING];
    unsigned n = 0;
    while (p->gr_n)
        ids[n++] = gr_pop(p);
    ctrl_send_ids(t, slot, CTRL_RELEASE, 0, ids, n);
    p->need_sent = 0;
}

/* The iovecs of bytes [off, off + len) of op's message (head || body ||
 * tail, or its flat copy) into iov[0..3); returns how many. */
static int op_iov(const struct tp_op *op, uint64_t off, size_t len, struct iovec *iov)
{
    const uint8_t *base[3] = {op->edge, op->data, op->edge + op->head_len};
    size_t size[3] = {op->head_len, op->body_len, op->tail_len};
    if (op->flat) {
        base[0] = op->flat;
        size[0] = op->len;
        size[1] = size[2] = 0;
    }
    const uint64_t end = off + len;
    uint64_t at = 0;
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const uint64_t lo = at > off ? at : off;
        const uint64_t hi = at + size[i] < end ? at + size[i] : end;
        if (lo < hi) {
            iov[n].iov_base = (void *)(base[i] + (lo - at));
            iov[n].iov_len = (size_t)(hi - lo);
            n++;
        }
        at += size[i];
    }
    return n;
}

/* A chunk needs up to four iovecs (its header and three pieces); with a
 * provider that takes fewer, an op with pieces goes out from one flat
 * copy instead (the caller's buffer is still released with the op). */
static int op_flatten(ds_transport *t, struct tp_op *op)
{
    if (op->flat || (!op->head_len && !op->tail_len) || t->iov_limit >= 4)
        return 0;
    uint8_t *f = ds_transport_buf_get(t, op->len ? op->len : 1);
    if (!f)
        return -ENOMEM;
    memcpy(f, op->edge, op->head_len);
    if (op->body_len)
        memcpy(f + op->head_len, op->data, op->body_len);
    memcpy(f + op->head_len + op->body_len, op->edge + op->head_len, op->tail_len);
    op->flat = f;
    return 0;
}

/* Post one chunk of op with tag; 0 or the libfabric error. */
static ssize_t post_chunk(ds_transport *t, struct tp_peer *p, struct tp_op *op, uint32_t idx,
                          uint64_t tag)
{
    uint64_t off = (uint64_t)idx * op->chunk_size;
    size_t clen = op->is_abort ? 0 : (size_t)(op->len - off < op->chunk_size ? op->len - off
                                                                            : op->chunk_size);
    struct tp_chunk *c = &op->chunks[idx];
    size_t hl = TP_HDR_FIXED + t->namelen;
    c->ctx.kind = CTX_TX;
    c->op = op;
    c->posted = 1;
    chunk_header(t, op, idx, c->hdr);
    struct iovec iov[4] = {{.iov_base = c->hdr, .iov_len = hl}};
    int niov = 1 + (clen ? op_iov(op, off, clen, iov + 1) : 0);
    ssize_t r = fi_tsendv(t->ep, iov, NULL, (size_t)niov, p->fa, tag, &c->ctx);
    if (r)
        c->posted = 0;
    if (r == -FI_EAGAIN) {
        ST_ADD(t, eagain, 1);
        t->eagain_seen = 1;
    }
    return r;
}

/* Post what the peer's queues, window and grants allow. Returns chunks
 * posted. */
static int post_peer(ds_transport *t, uint32_t slot, int budget)
{
    struct tp_peer *p = &t->peers[slot];
    int posted = 0;
    if (!p->in_av || t->broken)
        return 0;
    if (!p->tx_stream)
        p->tx_stream = random_u64();
    while (p->ctrlq.head && posted < budget) {
        struct tp_op *op = p->ctrlq.head;
        if (!op->chunks) {
            op->chunks = calloc(1, sizeof(*op->chunks));
            if (!op->chunks)
                return posted;
        }
        op->stream = p->tx_stream;
        op->chunks[0].wire = (uint32_t)(TP_HDR_FIXED + t->namelen + op->len);
        ssize_t r = post_chunk(t, p, op, 0, TP_TAG_SMALL);
        if (r == -FI_EAGAIN)
            return posted;
        list_unlink(&p->ctrlq, op);
        op->where = OP_NOWHERE;
        if (r) {
            op_free(t, op);
            continue;
        }
        posted++;
        op->pending = 1;
        op->pending_bytes = op->chunks[0].wire;
        op->next_chunk = 1;
        list_push_tail(&p->inflight, op);
        op->where = OP_INFLIGHT;
    }
    while (p->txq.head && posted < budget) {
        struct tp_op *op = p->txq.head;
        if (!op->chunks) {
            if (!op->is_abort) {
                if (op_flatten(t, op))
                    return posted; /* retry on the next pass */
                op->chunk_size = (uint32_t)t->o.chunk_bytes;
                op->nchunks = op->len ? (uint32_t)((op->len + op->chunk_size - 1) / op->chunk_size) : 1;
            }
            op->chunks = calloc(op->nchunks, sizeof(*op->chunks));
            if (!op->chunks)
                return posted; /* retry on the next pass */
        }
        uint32_t idx = op->next_chunk;
        if (!op->is_abort && idx == 0) {
            /* The seq is taken for good only when chunk 0 is accepted, so
             * every seq on the wire is followed by all its chunks or an
             * ABORT, and the receiver never waits for a number that was
             * never sent. */
            op->stream = p->tx_stream;
            op->seq = p->tx_seq + 1;
        }
        uint64_t off = (uint64_t)idx * op->chunk_size;
        size_t clen = op->is_abort ? 0 : (size_t)(op->len - off < op->chunk_size ? op->len - off
                                                                                : op->chunk_size);
        struct tp_chunk *c = &op->chunks[idx];
        c->wire = (uint32_t)(TP_HDR_FIXED + t->namelen + clen);
        if (p->inflight_bytes && p->inflight_bytes + c->wire > t->o.max_inflight_bytes)
            break; /* window full: wait for completions */
        uint64_t tag = TP_TAG_SMALL, gid = 0;
        int granted = 0;
        if (c->wire > TP_EAGER_MAX) {
            if (!p->gr_n) {
                ask_grants(t, slot);
                break;
            }
            gid = gr_pop(p);
            granted = 1;
            tag = TP_TAG_GRANT | gid;
            p->large_ms = ds_now_ms();
            p->used[p->used_pos++ % TP_GRANT_RING] = gid;
        }
        ssize_t r = post_chunk(t, p, op, idx, tag);
        if (r == -FI_EAGAIN) {
            if (granted)
                gr_push_front(p, gid);
            break;
        }
        if (r) {
            if (granted)
                ctrl_send_ids(t, slot, CTRL_RELEASE, 0, &gid, 1);
            if (!op->is_abort && idx == 0)
                op->seq = 0;
            ds_log_rl(DS_LOG_WARN, COMP, "fi_tsendv to %s: %s", p->addr, fi_strerror((int)-r));
            if (op->is_abort) {
                list_unlink(&p->txq, op);
                op->where = OP_NOWHERE;
                if (op->pending == 0)
                    op_free(t, op);
                else {
                    list_push_tail(&p->inflight, op);
                    op->where = OP_INFLIGHT;
                }
            } else {
                op_fail(t, op, fi_to_errno((int)r));
            }
            continue;
        }
        posted++;
        ds_debug(COMP, "posted to %s stream=%016" PRIx64 " seq=%" PRIu64 " chunk=%u/%u bytes=%u%s",
                 p->addr, op->stream, op->seq, idx, op->nchunks, c->wire,
                 op->is_abort ? " ABORT" : granted ? " granted" : "");
        if (!op->is_abort && idx == 0)
            p->tx_seq = op->seq;
        op->pending++;
        op->pending_bytes += c->wire;
        op->next_chunk++;
        p->inflight_bytes += c->wire;
        if (op->next_chunk == op->nchunks) {
            list_unlink(&p->txq, op);
            list_push_tail(&p->inflight, op);
            op->where = OP_INFLIGHT;
        }
    }
    /* Grants are standing credit; they go back only after a long idle
     * spell (taking them back costs the receiver a cancel and a quarantine,
     * see TP_QUARANTINE_GRACE_MS). */
    if (p->gr_n && ds_now_ms() - p->large_ms >= TP_GRANT_IDLE_MS && !large_chunks_queued(t, p, 1))
        release_grants(t, slot);
    return posted;
}

static void tx_complete(ds_transport *t, struct tp_chunk *c, int err)
{
    if (!c->posted) {
        ST_ADD(t, dup_completions, 1);
        return;
    }
    c->posted = 0;
    struct tp_op *op = c->op;
    struct tp_peer *p = &t->peers[op->slot];
    if (err)
        op->tainted = 1;
    op->pending--;
    op->pending_bytes -= c->wire;
    if (!op->is_ctrl)
        p->inflight_bytes -= c->wire;
    if (op->abandoned)
        ST_SUB(t, stuck_bytes, c->wire);
    if (err) {
        if (!op->is_abort && !op->reported) {
            ds_log_rl(DS_LOG_WARN, COMP, "send to %s failed: %s", p->addr, fi_strerror(err));
            op_fail(t, op, fi_to_errno(err));
            return; /* op_fail retired it if nothing is pending */
        }
    } else {
        op->completed++;
        if (op->completed == op->nchunks)
            op_report(t, op, 0);
    }
    if (op->pending == 0 && op->next_chunk == op->nchunks)
        op_retire(t, op);
}

/* ---- receive path --------------------------------------------------- */

static void rxmsg_free(ds_transport *t, struct tp_rxmsg *m)
{
    t->rx_mem -= m->mem;
    ds_transport_buf_put(t, m->base);
    free(m->bitmap);
    free(m);
}

static void rxs_clear(ds_transport *t, struct tp_rxs *s, enum ds_transport_drop why)
{
    while (s->held) {
        struct tp_rxmsg *m = s->held;
        s->held = m->next;
        if (m->state != RX_SKIP)
            drop(t, why);
        rxmsg_free(t, m);
    }
    s->nheld = 0;
    s->held_tail = NULL;
    s->gap_since_ms = 0;
}

/* Forget every stream of a peer. */
static void rx_clear(ds_transport *t, struct tp_peer *p, enum ds_transport_drop why)
{
    for (int i = 0; i < TP_STREAMS; i++) {
        rxs_clear(t, &p->rxs[i], why);
        memset(&p->rxs[i], 0, sizeof(p->rxs[i]));
        p->rxs[i].next = 1;
    }
    t->last_stream = 0;
}

static int peer_holds(const struct tp_peer *p)
{
    for (int i = 0; i < TP_STREAMS; i++)
        if (p->rxs[i].held)
            return 1;
    return 0;
}

static struct tp_rxmsg *held_pop(struct tp_rxs *s)
{
    struct tp_rxmsg *m = s->held;
    s->held = m->next;
    if (!s->held)
        s->held_tail = NULL;
    s->nheld--;
    return m;
}

static void deliver(ds_transport *t, uint32_t slot, struct tp_rxs *s, uint8_t *base,
                    const uint8_t *data, uint64_t len, int pooled, int *taken)
{
    ds_transport_msg msg = {
        .peer = peer_handle(t, slot),
        .data = data,
        .len = (size_t)len,
        .base_ = base,
    };
    (void)pooled;
    ST_ADD(t, msgs_recv, 1);
    ST_ADD(t, bytes_recv, len);
    s->fresh = 0;
    t->o.on_recv(t->o.cb_ctx, &msg);
    *taken = msg.taken_;
}

/* How long a hole in the order may wait. A stream we have delivered
 * nothing from yet may be one we joined late (we removed the peer and it
 * came back, or we started after it): its first message is then not seq 1,
 * and waiting rx_timeout for messages we will never see would stall it;
 * 200 ms still absorbs the reordering of its first messages. */
static uint64_t gap_ms(const ds_transport *t, const struct tp_rxs *s)
{
    return s->fresh && TP_FRESH_GAP_MS < t->o.rx_timeout_ms ? TP_FRESH_GAP_MS
                                                             : t->o.rx_timeout_ms;
}

/* Deliver every message at the head of the held list that is next in
 * order; skip what was aborted or dropped. */
static void deliver_ready(ds_transport *t, uint32_t slot, struct tp_rxs *s)
{
    struct tp_peer *p = &t->peers[slot];
    while (s->held && s->held->seq == s->next && s->held->state != RX_PARTIAL) {
        struct tp_rxmsg *m = held_pop(s);
        s->next++;
        s->gap_since_ms = 0;
        if (m->state == RX_COMPLETE && p->state == PEER_LIVE) {
            int taken = 0;
            deliver(t, slot, s, m->base, m->data, m->len, m->pooled, &taken);
            if (taken)
                m->base = NULL; /* the application frees it */
        } else if (m->state == RX_COMPLETE) {
            drop(t, DS_TP_DROP_REMOVED_PEER);
        }
        rxmsg_free(t, m);
    }
    if (s->held && s->held->seq != s->next && !s->gap_since_ms)
        s->gap_since_ms = ds_now_ms();
    if (s->held) {
        uint64_t due = s->gap_since_ms ? s->gap_since_ms + gap_ms(t, s)
                                       : s->held->last_ms + t->o.rx_timeout_ms;
        if (due < t->next_due_ms)
            t->next_due_ms = due;
        mark_busy(t, slot);
    }
}

static struct tp_rxmsg *held_find(struct tp_rxs *s, uint64_t seq, struct tp_rxmsg ***link)
{
    /* Messages mostly complete in order: try the tail first. */
    if (s->held_tail && seq >= s->held_tail->seq) {
        *link = &s->held_tail->next;
        return seq == s->held_tail->seq ? s->held_tail : NULL;
    }
    struct tp_rxmsg **pp = &s->held;
    while (*pp && (*pp)->seq < seq)
        pp = &(*pp)->next;
    *link = pp;
    return (*pp && (*pp)->seq == seq) ? *pp : NULL;
}

static struct tp_rxmsg *held_insert(ds_transport *t, uint32_t slot, struct tp_rxs *s,
                                    struct tp_rxmsg **link, uint64_t seq, uint8_t state)
{
    if (s->nheld >= TP_RX_HELD_MAX)
        return NULL;
    struct tp_rxmsg *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->seq = seq;
    m->state = state;
    m->last_ms = ds_now_ms();
    m->next = *link;
    *link = m;
    if (!m->next)
        s->held_tail = m;
    s->nheld++;
    mark_busy(t, slot);
    return m;
}

/* Find the peer and stream a chunk belongs to, creating the peer for an
 * unknown address and the stream state for a new stream. Returns the slot
 * (and *sidx) or UINT32_MAX (dropped, counted). */
static uint32_t rx_peer(ds_transport *t, uint64_t stream, const uint8_t *name, size_t namelen,
                        unsigned *sidx)
{
    if (stream == t->last_stream && t->last_slot < t->npeers &&
        t->peers[t->last_slot].state == PEER_LIVE &&
        t->peers[t->last_slot].rxs[t->last_sidx].id == stream) {
        *sidx = t->last_sidx;
        return t->last_slot;
    }
    for (uint32_t i = 0; i < t->npeers; i++) {
        if (t->peers[i].state != PEER_LIVE)
            continue;
        for (unsigned k = 0; k < TP_STREAMS; k++)
            if (t->peers[i].rxs[k].id == stream) {
                t->last_stream = stream;
                t->last_slot = i;
                t->last_sidx = k;
                *sidx = k;
                return i;
            }
    }

    char key[DS_TRANSPORT_ADDR_MAX];
    if (addr_canon(t->addr_format, name, namelen, key, sizeof(key))) {
        drop(t, DS_TP_DROP_BAD_ADDR);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: sender address invalid for %s",
                  t->provider);
        return UINT32_MAX;
    }
    uint32_t slot = UINT32_MAX, free_slot = UINT32_MAX;
    int created = 0;
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->npeers; i++) {
        if (t->peers[i].state == PEER_LIVE && !strcmp(t->peers[i].addr, key)) {
            slot = i;
            break;
        }
        if (t->peers[i].state == PEER_FREE && free_slot == UINT32_MAX)
            free_slot = i;
    }
    if (slot == UINT32_MAX && free_slot != UINT32_MAX) {
        struct tp_peer *p = &t->peers[free_slot];
        p->state = PEER_LIVE;
        p->gen++;
        snprintf(p->addr, sizeof(p->addr), "%s", key);
        memcpy(p->raw, name, namelen);
        p->rawlen = namelen;
        p->need_av = 0; /* inserted below, on this (the progress) thread */
        slot = free_slot;
        created = 1;
    }
    pthread_mutex_unlock(&t->lock);
    if (slot == UINT32_MAX) {
        drop(t, DS_TP_DROP_PEERS_FULL);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped message from %s: all %u peer slots in use", key,
                  t->o.max_peers);
        return UINT32_MAX;
    }
    struct tp_peer *p = &t->peers[slot];
    if (created && !t->broken)
        av_insert(t, slot);
    /* A new stream from this address (the sender restarted or reset, or
     * someone forges its address): a free entry, else the one idle the
     * longest, whose held messages are dropped. */
    unsigned k = 0;
    for (unsigned i = 0; i < TP_STREAMS; i++) {
        if (!p->rxs[i].id) {
            k = i;
            break;
        }
        if (p->rxs[i].last_use < p->rxs[k].last_use)
            k = i;
    }
    struct tp_rxs *s = &p->rxs[k];
    if (!created) {
        /* A new incarnation of the sender (or a forgery): the grants it
         * gave us may be gone; ask again rather than use them. */
        p->gr_n = 0;
        p->need_sent = 0;
    }
    if (s->id) {
        rxs_clear(t, s, DS_TP_DROP_STALE_STREAM);
        ds_debug(COMP, "peer %s: stream %016" PRIx64 " replaces %016" PRIx64, p->addr, stream,
                 s->id);
    }
    memset(s, 0, sizeof(*s));
    s->id = stream;
    s->next = 1;
    s->fresh = 1;
    t->last_stream = stream;
    t->last_slot = slot;
    t->last_sidx = k;
    *sidx = k;
    if (created) {
        ds_info(COMP, "new peer %s (first message)", key);
        event(t, DS_TRANSPORT_EV_PEER_NEW, slot, 0);
    }
    return slot;
}

/* A control message from the peer in slot. 1 when well-formed. */
static int rx_ctrl(ds_transport *t, uint32_t slot, uint64_t stream, const uint8_t *b, size_t len)
{
    struct tp_peer *p = &t->peers[slot];
    if (len < 8)
        return 0;
    uint32_t n = get_le32(b + 4);
    ds_debug(COMP, "control %u n=%u from %s", b[0], n, p->addr);
    switch (b[0]) {
    case CTRL_REQ:
        if (len != 8)
            return 0;
        if (stream != p->grant_stream) {
            /* A new incarnation of the sender asks: the grants its old one
             * held will not be used (a sender drops its grants when it
             * resets), so take them back and start over. */
            if (p->grant_stream && p->grants_out)
                grants_cancel(t, slot, NULL, 0);
            p->grant_stream = stream;
            p->grants_out = 0;
        }
        p->need = n < (1u << 20) ? n : (1u << 20);
        ds_debug(COMP, "grants for %s: need=%u out=%u all=%u of %u", p->addr, p->need,
                 p->grants_out, t->ngrants, t->o.rx_large_bufs);
        /* Repeat what is outstanding (the GRANT may have been lost; the
         * sender ignores ids it has), then add what it still needs. */
        {
            uint64_t ids[TP_GRANT_RING];
            unsigned k = 0;
            for (struct tp_rxbuf *rb = t->grants; rb && k < TP_GRANT_RING; rb = rb->gnext)
                if (rb->grant_slot == slot && rb->grant_gen == p->gen &&
                    rb->grant_stream == p->grant_stream && !rb->canceling)
                    ids[k++] = rb->grant_id;
            if (k)
                ctrl_send_ids(t, slot, CTRL_GRANT, p->grant_stream, ids, k);
        }
        grant_more(t, slot);
        return 1;
    case CTRL_GRANT:
    case CTRL_RELEASE: {
        if (n == 0 || n > TP_GRANTS_PER_MSG || len != 16 + 8 * (size_t)n)
            return 0;
        uint64_t epoch = get_le64(b + 8);
        uint64_t ids[TP_GRANTS_PER_MSG];
        for (uint32_t i = 0; i < n; i++)
            ids[i] = get_le64(b + 16 + 8 * i) & TP_GRANT_MASK;
        if (b[0] == CTRL_RELEASE) {
            grants_cancel(t, slot, ids, n);
            return 1;
        }
        if (epoch != p->tx_stream)
            return 1; /* issued to our previous incarnation, since cancelled */
        for (uint32_t i = 0; i < n; i++)
            gr_push_back(p, ids[i]);
        p->need_sent = p->need_sent > n ? p->need_sent - n : 0;
        mark_busy(t, slot);
        return 1;
    }
    case CTRL_VOID:
        /* The peer reset: the grants it gave us are gone. */
        p->gr_n = 0;
        p->need_sent = 0;
        mark_busy(t, slot);
        return 1;
    default:
        return 0;
    }
}

/* Handle one received chunk in rb. May take rb->buf (sets it NULL). */
static void rx_chunk(ds_transport *t, struct tp_rxbuf *rb, size_t len)
{
    const uint8_t *h = rb->buf;
    if (len < TP_HDR_FIXED || get_le32(h) != TP_MAGIC || h[4] != TP_VERSION) {
        drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: bad header (len=%zu)", len);
        return;
    }
    uint8_t flags = h[5];
    size_t namelen = (size_t)h[6] | ((size_t)h[7] << 8);
    uint64_t stream = get_le64(h + 8), seq = get_le64(h + 16), total = get_le64(h + 24);
    uint32_t idx = get_le32(h + 32), csize = get_le32(h + 36);
    size_t hl = TP_HDR_FIXED + namelen;
    int ctrl = (flags & TP_F_CTRL) != 0;
    if (namelen == 0 || namelen > TP_NAME_MAX || hl > len || stream == 0 ||
        (seq == 0) != ctrl || (flags & ~(TP_F_ABORT | TP_F_CTRL)) ||
        (ctrl && (flags & TP_F_ABORT))) {
        drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk: bad header fields");
        return;
    }
    uint64_t plen = len - hl;
    unsigned sidx = 0;
    uint32_t slot = rx_peer(t, stream, h + TP_HDR_FIXED, namelen, &sidx);
    if (slot == UINT32_MAX)
        return;
    struct tp_peer *p = &t->peers[slot];
    struct tp_rxs *s = &p->rxs[sidx];
    s->last_use = ++t->rx_tick;
    if (ctrl) {
        if (total != plen || idx != 0 || !rx_ctrl(t, slot, stream, h + hl, (size_t)plen)) {
            drop(t, DS_TP_DROP_BAD_HEADER);
            ds_log_rl(DS_LOG_WARN, COMP, "dropped control chunk from %s: malformed", p->addr);
        }
        return;
    }
    ds_debug(COMP, "chunk from %s stream=%016" PRIx64 " seq=%" PRIu64 " (next %" PRIu64
             ") chunk=%u total=%" PRIu64 "%s", p->addr, stream, seq, s->next, idx, total,
             (flags & TP_F_ABORT) ? " ABORT" : "");
    peer_alive(t, slot);

    if (s->resync) {
        s->resync = 0;
        if (seq > s->next)
            s->next = seq;
    }
    if (seq < s->next) {
        drop(t, DS_TP_DROP_LATE);
        return;
    }
    if (seq - s->next >= TP_RX_WINDOW) {
        drop(t, DS_TP_DROP_BACKLOG);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk from %s: seq %" PRIu64 " far ahead of %" PRIu64,
                  p->addr, seq, s->next);
        return;
    }
    struct tp_rxmsg **link;
    struct tp_rxmsg *m = held_find(s, seq, &link);

    if (flags & TP_F_ABORT) {
        if (plen) {
            drop(t, DS_TP_DROP_BAD_HEADER);
            return;
        }
        drop(t, DS_TP_DROP_ABORTED);
        if (m) {
            t->rx_mem -= m->mem;
            free(m->base);
            free(m->bitmap);
            m->base = m->bitmap = NULL;
            m->mem = 0;
            m->state = RX_SKIP;
        } else if (!held_insert(t, slot, s, link, seq, RX_SKIP)) {
            drop(t, DS_TP_DROP_BACKLOG);
        }
        deliver_ready(t, slot, s);
        return;
    }

    /* Geometry checks before anything is allocated or copied. */
    uint64_t nchunks;
    if (total == 0) {
        nchunks = 1;
    } else {
        if (csize == 0) {
            drop(t, DS_TP_DROP_BAD_HEADER);
            return;
        }
        nchunks = (total + csize - 1) / csize;
    }
    uint64_t expect = total == 0 ? 0 : (idx + 1 == nchunks ? total - (uint64_t)idx * csize : csize);
    if (idx >= nchunks || nchunks > UINT32_MAX || plen != expect) {
        drop(t, DS_TP_DROP_BAD_HEADER);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped chunk from %s: geometry idx=%u size=%u total=%" PRIu64
                  " len=%" PRIu64, p->addr, idx, csize, total, plen);
        return;
    }
    if (total > t->o.max_msg_bytes) {
        drop(t, DS_TP_DROP_TOO_BIG);
        ds_log_rl(DS_LOG_WARN, COMP, "dropped message from %s: %" PRIu64 " bytes > max %zu",
                  p->addr, total, t->o.max_msg_bytes);
        if (!m)
            m = held_insert(t, slot, s, link, seq, RX_SKIP);
        if (m && m->state == RX_PARTIAL) {
            t->rx_mem -= m->mem;
            free(m->base);
            free(m->bitmap);
            m->base = m->bitmap = NULL;
            m->mem = 0;
            m->state = RX_SKIP;
        }
        deliver_ready(t, slot, s);
        return;
    }

    if (!m) {
        if (nchunks == 1) {
            uint8_t *base = rb->buf;
            if (seq == s->next) {
                /* The common case: in order, one chunk. Zero copy. */
                int taken = 0;
                s->next++;
                deliver(t, slot, s, base, base + hl, plen, 1, &taken);
                if (taken)
                    rb->buf = NULL;
                deliver_ready(t, slot, s);
                return;
            }
            /* Out of order: hold it. A small one is copied to its own
             * allocation (thousands may wait behind one large message
             * whose rendezvous chunks complete late); a large one keeps
             * its pool buffer. */
            int copy = plen <= TP_RX_COPY_MAX;
            uint64_t cost = (copy ? plen : rb->cap) + sizeof(*m);
            if (t->rx_mem + cost > t->o.rx_mem_bytes) {
                drop(t, DS_TP_DROP_NO_MEMORY);
                held_insert(t, slot, s, link, seq, RX_SKIP);
                deliver_ready(t, slot, s);
                return;
            }
            m = held_insert(t, slot, s, link, seq, RX_COMPLETE);
            if (!m) {
                drop(t, DS_TP_DROP_BACKLOG);
                return;
            }
            if (copy) {
                m->base = malloc(plen ? plen : 1);
                if (!m->base) {
                    m->state = RX_SKIP;
                    drop(t, DS_TP_DROP_NO_MEMORY);
                    deliver_ready(t, slot, s);
                    return;
                }
                memcpy(m->base, base + hl, plen);
                m->data = m->base;
            } else {
                m->base = base;
                m->pooled = 1;
                m->data = base + hl;
                rb->buf = NULL;
            }
            m->len = plen;
            m->mem = cost;
            t->rx_mem += m->mem;
            deliver_ready(t, slot, s);
            return;
        }
        uint64_t bm = (nchunks + 7) / 8;
        if (t->rx_mem + total + bm > t->o.rx_mem_bytes) {
            drop(t, DS_TP_DROP_NO_MEMORY);
            ds_log_rl(DS_LOG_WARN, COMP, "dropped %" PRIu64 "-byte message from %s: rx memory bound",
                      total, p->addr);
            if (held_insert(t, slot, s, link, seq, RX_SKIP))
                deliver_ready(t, slot, s);
            return;
        }
        m = held_insert(t, slot, s, link, seq, RX_PARTIAL);
        if (!m) {
            drop(t, DS_TP_DROP_BACKLOG);
            return;
        }
        m->base = ds_transport_buf_get(t, total);
        m->bitmap = calloc(bm, 1);
        if (!m->base || !m->bitmap) {
            free(m->base);
            free(m->bitmap);
            m->base = m->bitmap = NULL;
            m->state = RX_SKIP;
            drop(t, DS_TP_DROP_NO_MEMORY);
            deliver_ready(t, slot, s);
            return;
        }
        m->data = m->base;
        m->len = total;
        m->chunk_size = csize;
        m->nchunks = (uint32_t)nchunks;
        m->mem = total + bm;
        t->rx_mem += m->mem;
        uint64_t due = m->last_ms + t->o.rx_timeout_ms;
        if (due < t->next_due_ms)
            t->next_due_ms = due;
    }
    if (m->state != RX_PARTIAL) {
        drop(t, m->state == RX_SKIP ? DS_TP_DROP_LATE : DS_TP_DROP_DUPLICATE);
        return;
    }
    if (m->len != total || m->chunk_size != csize) {
        drop(t, DS_TP_DROP_BAD_HEADER);
        return;
    }
    if (m->bitmap[idx / 8] & (1u << (idx % 8))) {
        drop(t, DS_TP_DROP_DUPLICATE);
        return;
    }
    m->bitmap[idx / 8] |= (uint8_t)(1u << (idx % 8));
    memcpy(m->base + (uint64_t)idx * csize, rb->buf + hl, plen);
    m->got++;
    m->last_ms = ds_now_ms();
    if (m->got == m->nchunks) {
        m->state = RX_COMPLETE;
        free(m->bitmap);
        m->bitmap = NULL;
        deliver_ready(t, slot, s);
    }
}

static int post_receives(ds_transport *t)
{
    int n = 0;
    if (!t->rx_unposted || t->broken)
        return 0;
    for (unsigned i = 0; i < t->nrx && t->rx_unposted; i++) {
        struct tp_rxbuf *rb = t->rx[i];
        if (rb->posted)
            continue;
        if (!rb->buf) {
            rb->buf = ds_transport_buf_get(t, rb->cap);
            if (!rb->buf)
                break;
        }
        rb->ctx.kind = CTX_RX;
        ssize_t r = fi_trecv(t->ep, rb->buf, rb->cap, NULL, FI_ADDR_UNSPEC, rb->tag, 0, &rb->ctx);
        if (r == -FI_EAGAIN)
            break;
        if (r) {
            ds_log_rl(DS_LOG_ERROR, COMP, "fi_trecv: %s", fi_strerror((int)-r));
            break;
        }
        rb->posted = 1;
        rb->since_ms = ds_now_ms();
        t->rx_unposted--;
        n++;
    }
    return n;
}

static void grant_complete(ds_transport *t, struct tp_rxbuf *rb, size_t len, int err)
{
    rb->posted = 0;
    grant_unlink(t, rb);
    uint32_t slot = rb->grant_slot;
    struct tp_peer *p = &t->peers[slot];
    int same = p->state != PEER_FREE && p->gen == rb->grant_gen;
    if (same && p->grants_out && rb->grant_stream == p->grant_stream)
        p->grants_out--;
    if (err) {
        /* Cancelled or failed: ofi_rxm may report it again, and after a
         * cancel may even still write into it. Keep both untouched. */
        rb->qnext = t->q_rx;
        rb->q_ms = ds_now_ms();
        t->q_rx = rb;
        ST_ADD(t, quarantined_bytes, rb->cap);
        if (err != FI_ECANCELED) {
            drop(t, DS_TP_DROP_RX_ERROR);
            ds_log_rl(DS_LOG_WARN, COMP, "granted receive failed: %s", fi_strerror(err));
        }
    } else {
        rx_chunk(t, rb, len);
        ds_transport_buf_put(t, rb->buf);
        free(rb);
    }
    if (same && p->state == PEER_LIVE)
        grant_more(t, slot);
}

static void rx_complete(ds_transport *t, struct tp_rxbuf *rb, size_t len, int err)
{
    if (!rb->posted) {
        /* A second report for a receive already completed or failed. */
        ST_ADD(t, dup_completions, 1);
        return;
    }
    if (rb->is_grant) {
        grant_complete(t, rb, len, err);
        return;
    }
    rb->posted = 0;
    t->rx_unposted++;
    if (err) {
        struct tp_rxbuf *fresh = calloc(1, sizeof(*fresh));
        if (fresh) {
            fresh->cap = rb->cap;
            fresh->tag = rb->tag;
            fresh->slot = rb->slot;
            t->rx[rb->slot] = fresh;
            rb->qnext = t->q_rx;
            rb->q_ms = ds_now_ms();
            t->q_rx = rb;
            ST_ADD(t, quarantined_bytes, rb->cap);
        }
        /* (without memory for a fresh posting the old one is reused:
         * the lesser risk than stopping receives) */
        if (err != FI_ECANCELED) {
            drop(t, err == FI_ETRUNC ? DS_TP_DROP_TOO_BIG : DS_TP_DROP_RX_ERROR);
            ds_log_rl(DS_LOG_WARN, COMP, "receive error: %s%s", fi_strerror(err),
                      err == FI_ETRUNC ? " (peers must share transport.chunk_kb)" : "");
        }
        return;
    }
    rx_chunk(t, rb, len);
}

/* ---- completion queue ----------------------------------------------- */

static int read_cq(ds_transport *t)
{
    struct fi_cq_tagged_entry e[TP_CQ_BATCH];
    int total = 0;
    for (int round = 0; round < 4; round++) {
        ssize_t n = fi_cq_read(t->cq, e, TP_CQ_BATCH);
        if (n == -FI_EAGAIN)
            break;
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry ee;
            memset(&ee, 0, sizeof(ee));
            ssize_t r = fi_cq_readerr(t->cq, &ee, 0);
            if (r != 1)
                break;
            total++;
            struct tp_ctx *c = ee.op_context;
            if (!c)
                continue;
            if (c->kind == CTX_RX)
                rx_complete(t, (struct tp_rxbuf *)c, ee.len, ee.err ? ee.err : FI_EIO);
            else
                tx_complete(t, (struct tp_chunk *)c, ee.err ? ee.err : FI_EIO);
            continue;
        }
        if (n < 0) {
            ds_log_rl(DS_LOG_ERROR, COMP, "fi_cq_read: %s", fi_strerror((int)-n));
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            struct tp_ctx *c = e[i].op_context;
            if (c->kind == CTX_RX)
                rx_complete(t, (struct tp_rxbuf *)c, e[i].len, 0);
            else
                tx_complete(t, (struct tp_chunk *)c, 0);
        }
        total += (int)n;
        if (n < TP_CQ_BATCH)
            break;
    }
    return total;
}

/* ---- requests from application threads ------------------------------ */

static void av_insert(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    fi_addr_t fa = FI_ADDR_NOTAVAIL;
    int r = fi_av_insert(t->av, p->raw, 1, &fa, 0, NULL);
    if (r != 1) {
        ds_log_rl(DS_LOG_ERROR, COMP, "fi_av_insert %s failed (%d)", p->addr, r);
        p->in_av = 0;
        return;
    }
    p->fa = fa;
    p->in_av = 1;
}

static void peer_fresh(struct tp_peer *p)
{
    p->in_av = 0;
    p->unresponsive = 0;
    p->misses = 0;
    p->tx_stream = 0;
    p->tx_seq = 0;
    memset(p->rxs, 0, sizeof(p->rxs)); /* (held lists were emptied before) */
    for (int i = 0; i < TP_STREAMS; i++)
        p->rxs[i].next = 1;
    p->gr_head = p->gr_n = 0;
    memset(p->used, 0, sizeof(p->used));
    p->used_pos = 0;
    p->need_sent = 0;
    p->req_pending = 0;
    p->req_ms = 0;
    p->grants_out = 0;
    p->need = 0;
    p->gbatch_n = 0;
    p->grant_stream = 0;
    p->large_ms = 0;
}

static void peer_free_slot(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    if (p->in_av && t->av)
        fi_av_remove(t->av, &p->fa, 1, 0);
    peer_fresh(p);
    pthread_mutex_lock(&t->lock);
    p->state = PEER_FREE;
    p->addr[0] = 0;
    pthread_mutex_unlock(&t->lock);
}

/* Removal: fail what is queued, forget what was received, free the slot
 * once libfabric holds nothing of it. */
static void peer_drain(ds_transport *t, uint32_t slot)
{
    struct tp_peer *p = &t->peers[slot];
    while (p->txq.head) {
        struct tp_op *op = p->txq.head;
        if (op->is_abort) {
            list_unlink(&p->txq, op);
            op->where = OP_NOWHERE;
            op_free(t, op);
            continue;
        }
        op_fail(t, op, -ECANCELED);
    }
    for (struct tp_op *op = p->inflight.head; op; op = op->next)
        if (!op->reported)
            op_fail(t, op, -ECANCELED);
    rx_clear(t, p, DS_TP_DROP_REMOVED_PEER);
    /* Grants: ours to it are cancelled, its to us handed back (the slot
     * stays until that message is out). */
    grants_cancel(t, slot, NULL, 0);
    p->need = 0;
    if (p->gr_n)
        release_grants(t, slot);
    if (!p->inflight.head && !p->ctrlq.head)
        peer_free_slot(t, slot);
}

static int take_requests(ds_transport *t, int *stop, int *reset)
{
    struct op_list q;
    int dirty;
    pthread_mutex_lock(&t->lock);
    q = t->subq;
    t->subq.head = t->subq.tail = NULL;
    *stop = t->stop;
    *reset = t->reset_req;
    t->reset_req = 0;
    dirty = t->peers_dirty;
    t->peers_dirty = 0;
    pthread_mutex_unlock(&t->lock);

    int n = 0;
    if (dirty) {
        for (uint32_t i = 0; i < t->npeers; i++) {
            struct tp_peer *p = &t->peers[i];
            pthread_mutex_lock(&t->lock);
            uint8_t state = p->state, need_av = p->need_av;
            p->need_av = 0;
            if (state == PEER_REMOVING)
                p->state = PEER_DRAINING;
            pthread_mutex_unlock(&t->lock);
            if (state == PEER_LIVE && need_av) {
                if (!t->broken)
                    av_insert(t, i);
            } else if (state == PEER_REMOVING) {
                peer_drain(t, i);
            }
        }
        n++;
    }
    while (q.head) {
        struct tp_op *op = q.head;
        q.head = op->next;
        struct tp_peer *p = &t->peers[op->slot];
        if (p->state != PEER_LIVE) {
            op_report(t, op, -ECANCELED);
            op_free(t, op);
            continue;
        }
        list_push_tail(&p->txq, op);
        op->where = OP_TXQ;
        mark_busy(t, op->slot);
        if (op->deadline_ms < t->next_due_ms)
            t->next_due_ms = op->deadline_ms;
        n++;
    }
    return n;
}

/* ---- deadlines, held-message timeouts, busy list -------------------- */

static int scan_due(ds_transport *t, uint64_t now)
{
    int work = 0;
    uint64_t next = UINT64_MAX;
    uint32_t *link = &t->busy_head;
    while (*link) {
        uint32_t slot = *link - 1;
        struct tp_peer *p = &t->peers[slot];
        struct tp_op *op, *nx;
        for (op = p->txq.head; op; op = nx) {
            nx = op->next;
            if (op->is_abort || op->reported)
                continue;
            if (op->deadline_ms <= now) {
                op_fail(t, op, -ETIMEDOUT);
                work++;
                nx = p->txq.head; /* the list may have changed (abort pushed) */
            } else if (op->deadline_ms < next) {
                next = op->deadline_ms;
            }
        }
        for (op = p->inflight.head; op; op = nx) {
            nx = op->next;
            if (op->reported)
                continue;
            if (op->deadline_ms <= now) {
                op_fail(t, op, -ETIMEDOUT);
                work++;
            } else if (op->deadline_ms < next) {
                next = op->deadline_ms;
            }
        }
        /* Held messages: a partial head or a gap that waited too long. */
        for (int k = 0; k < TP_STREAMS; k++) {
            struct tp_rxs *s = &p->rxs[k];
            if (!s->held)
                continue;
            struct tp_rxmsg *h = s->held;
            uint64_t since = h->seq == s->next ? h->last_ms : s->gap_since_ms;
            uint64_t wait = h->seq == s->next ? t->o.rx_timeout_ms : gap_ms(t, s);
            if (since && since + wait <= now) {
                if (h->seq == s->next) {
                    held_pop(s);
                    if (h->state == RX_PARTIAL)
                        drop(t, DS_TP_DROP_RX_TIMEOUT);
                    rxmsg_free(t, h);
                    s->next++;
                } else {
                    drop(t, DS_TP_DROP_RX_TIMEOUT);
                    s->next = h->seq;
                }
                s->gap_since_ms = 0;
                ds_log_rl(DS_LOG_WARN, COMP, "peer %s: skipped a message after %" PRIu64
                          " ms without chunks", p->addr, wait);
                deliver_ready(t, slot, s);
                work++;
            }
            if (s->held) {
                struct tp_rxmsg *h2 = s->held;
                uint64_t s2 = h2->seq == s->next ? h2->last_ms : s->gap_since_ms;
                uint64_t w2 = h2->seq == s->next ? t->o.rx_timeout_ms : gap_ms(t, s);
                if (!s2)
                    s2 = now;
                if (s2 + w2 < next)
                    next = s2 + w2;
            }
        }
        if (p->state == PEER_DRAINING && !p->inflight.head && !p->txq.head && !p->ctrlq.head)
            peer_free_slot(t, slot);
        /* Leave the busy list when nothing is left to watch. */
        if (!p->txq.head && !p->inflight.head && !p->ctrlq.head && !p->gr_n && !peer_holds(p)) {
            *link = p->busy_next;
            p->in_busy = 0;
            p->busy_next = 0;
        } else {
            link = &p->busy_next;
        }
    }
    t->next_due_ms = next;
    return work;
}

static int post_sends(ds_transport *t)
{
    int n = 0;
    t->eagain_seen = 0;
    for (uint32_t b = t->busy_head; b; b = t->peers[b - 1].busy_next) {
        struct tp_peer *p = &t->peers[b - 1];
        if (p->txq.head || p->ctrlq.head || p->gr_n)
            n += post_peer(t, b - 1, TP_POST_BUDGET);
    }
    return n;
}

/* ---- reset ---------------------------------------------------------- */

static void rx_pool_unpost_all(ds_transport *t)
{
    for (unsigned i = 0; i < t->nrx; i++) {
        t->rx[i]->posted = 0;
    }
    t->rx_unposted = t->nrx;
    quarantine_free(t);
}

/* Close the stack (libfabric discards everything outstanding), settle every
 * op, reopen on the same address. */
static void do_reset(ds_transport *t, const char *why)
{
    uint64_t stuck = atomic_load(&t->st.stuck_ops);
    ds_warn(COMP, "resetting endpoint %s: %s stuck_ops=%" PRIu64 " stuck_bytes=%" PRIu64,
            t->addr_text, why, stuck, (uint64_t)atomic_load(&t->st.stuck_bytes));
    stack_close(t);
    rx_pool_unpost_all(t);
    grants_free(t);
    for (uint32_t slot = 0; slot < t->npeers; slot++) {
        struct tp_peer *p = &t->peers[slot];
        if (p->state == PEER_FREE)
            continue;
        while (p->ctrlq.head) {
            struct tp_op *cop = p->ctrlq.head;
            list_unlink(&p->ctrlq, cop);
            cop->where = OP_NOWHERE;
            op_free(t, cop);
        }
        /* Nothing is pending in libfabric any more. */
        while (p->inflight.head) {
            struct tp_op *op = p->inflight.head;
            op->pending = 0;
            op->pending_bytes = 0;
            op->tainted = 0; /* the stack is closed: nothing can touch it */
            if (!op->reported)
                op_report(t, op, -ENETRESET);
            op_retire(t, op);
        }
        struct tp_op *op = p->txq.head, *nx;
        for (; op; op = nx) {
            nx = op->next;
            if (op->is_abort || op->next_chunk > 0) {
                /* partly posted: its stream is gone */
                op->pending = 0;
                op->pending_bytes = 0;
                op->tainted = 0;
                if (!op->reported)
                    op_report(t, op, -ENETRESET);
                op_retire(t, op);
            } else {
                free(op->chunks);
                op->chunks = NULL;
                op->seq = 0;
            }
        }
        p->inflight_bytes = 0;
        p->tx_stream = 0; /* a fresh one at the next post */
        p->tx_seq = 0;
        /* The peer does not know we reset: its stream goes on, minus what
         * was in flight on the closed connection. Resynchronise on the
         * next seq it sends rather than wait for the lost ones. */
        for (int k = 0; k < TP_STREAMS; k++) {
            rxs_clear(t, &p->rxs[k], DS_TP_DROP_STALE_STREAM);
            p->rxs[k].resync = 1;
        }
        p->in_av = 0;
        /* Grants: the buffers we posted for it are gone (tell it, so it
         * stops using their tags); those it posted for us still stand. */
        int had = p->grants_out > 0;
        p->grants_out = 0;
        p->need = 0;
        p->gbatch_n = 0;
        p->grant_stream = 0;
        /* and the grants we held: our new stream asks again, and the
         * receiver takes back those our old one held */
        p->gr_head = p->gr_n = 0;
        p->need_sent = 0;
        p->req_pending = 0;
        if (p->state == PEER_DRAINING)
            peer_free_slot(t, slot);
        else if (had) {
            static const uint8_t zero[4];
            ctrl_send(t, slot, CTRL_VOID, zero, sizeof(zero)); /* posted after the reopen */
        }
    }
    atomic_store(&t->st.stuck_ops, 0);
    atomic_store(&t->st.stuck_bytes, 0);
    ST_ADD(t, resets, 1);
    t->last_stream = 0;
    t->broken = 1;
    t->reopen_at_ms = 0;
    event(t, DS_TRANSPORT_EV_RESET, UINT32_MAX, (int)stuck);
}

static void try_reopen(ds_transport *t)
{
    uint64_t now = ds_now_ms();
    if (now < t->reopen_at_ms)
        return;
    int r = stack_open(t, t->listen_port);
    if (r) {
        ds_log_rl(DS_LOG_ERROR, COMP, "reopen on %s:%s failed (%d); retrying", t->listen_host,
                  t->listen_port, r);
        t->reopen_at_ms = now + 200;
        return;
    }
    t->broken = 0;
    for (uint32_t slot = 0; slot < t->npeers; slot++)
        if (t->peers[slot].state == PEER_LIVE)
            av_insert(t, slot);
    ds_info(COMP, "endpoint %s reopened", t->addr_text);
}

/* ---- progress thread ------------------------------------------------ */

static void wait_for_work(ds_transport *t, uint64_t now)
{
    int timeout = TP_TICK_MS;
    if (t->next_due_ms != UINT64_MAX) {
        uint64_t d = t->next_due_ms > now ? t->next_due_ms - now : 0;
        if (d < (uint64_t)timeout)
            timeout = (int)d;
    }
    if (t->eagain_seen || t->broken)
        timeout = timeout > 1 ? 1 : timeout;
    struct pollfd pf[2] = {{.fd = t->evfd, .events = POLLIN}, {.fd = -1, .events = POLLIN}};
    nfds_t n = 1;
    if (t->cq_fd >= 0 && !t->broken) {
        struct fid *f = &t->cq->fid;
        if (fi_trywait(t->fabric, &f, 1) != FI_SUCCESS)
            return; /* libfabric has work to do first */
        pf[1].fd = t->cq_fd;
        n = 2;
    } else if (timeout > 1) {
        timeout = 1; /* no wait object: the provider needs us to poll */
    }
    if (poll(pf, n, timeout) > 0 && (pf[0].revents & POLLIN)) {
        uint64_t v;
        ssize_t r = read(t->evfd, &v, sizeof(v));
        (void)r;
    }
}

static void shutdown_all(ds_transport *t)
{
    /* Fail everything not yet reported, then close the stack so libfabric
     * lets go of every buffer, then release them. */
    for (uint32_t slot = 0; slot < t->npeers; slot++) {
        struct tp_peer *p = &t->peers[slot];
        for (struct tp_op *op = p->txq.head; op; op = op->next)
            op_report(t, op, -ECANCELED);
        for (struct tp_op *op = p->inflight.head; op; op = op->next)
            op_report(t, op, -ECANCELED);
    }
    stack_close(t);
    grants_free(t);
    for (uint32_t slot = 0; slot < t->npeers; slot++) {
        struct tp_peer *p = &t->peers[slot];
        while (p->ctrlq.head) {
            struct tp_op *op = p->ctrlq.head;
            list_unlink(&p->ctrlq, op);
            op->where = OP_NOWHERE;
            op_free(t, op);
        }
        while (p->txq.head) {
            struct tp_op *op = p->txq.head;
            list_unlink(&p->txq, op);
            op->where = OP_NOWHERE;
            op_free(t, op);
        }
        while (p->inflight.head) {
            struct tp_op *op = p->inflight.head;
            list_unlink(&p->inflight, op);
            op->where = OP_NOWHERE;
            op_free(t, op);
        }
        rx_clear(t, p, DS_TP_DROP_REMOVED_PEER);
    }
    quarantine_free(t);
}

static void *progress_main(void *arg)
{
    ds_transport *t = arg;
    pthread_setname_np(pthread_self(), "ds-transport");
    t->last_work_ns = ds_now_ns();
    for (;;) {
        int stop = 0, reset = 0;
        int work = take_requests(t, &stop, &reset);
        if (stop)
            break;
        if (reset && !t->broken)
            do_reset(t, "requested");
        if (t->broken) {
            try_reopen(t);
            if (t->broken) {
                uint64_t now = ds_now_ms();
                if (now >= t->next_due_ms)
                    scan_due(t, now);
                wait_for_work(t, now);
                continue;
            }
        }
        work += post_receives(t);
        work += post_sends(t);
        work += read_cq(t);
        uint64_t now = ds_now_ms();
        if (now >= t->next_due_ms)
            work += scan_due(t, now);
        if (now >= t->next_quarantine_ms) {
            quarantine_age(t, now);
            grants_reclaim(t, now);
            t->next_quarantine_ms = now + 1000;
        }
        if (atomic_load_explicit(&t->st.stuck_ops, memory_order_relaxed) >= t->o.stuck_max_ops ||
            atomic_load_explicit(&t->st.stuck_bytes, memory_order_relaxed) +
                    atomic_load_explicit(&t->st.quarantined_bytes, memory_order_relaxed) >=
                t->o.stuck_max_bytes) {
            do_reset(t, "abandoned sends past the bound");
            continue;
        }
        uint64_t ns = ds_now_ns();
        if (work) {
            t->last_work_ns = ns;
            continue;
        }
        /* Spin briefly after activity: the next completion is usually
         * microseconds away and a sleep/wake costs more than that. */
        uint64_t spin_ns = t->cq_fd >= 0 ? 50000u : 500000u;
        if (ns - t->last_work_ns < spin_ns)
            continue;
        wait_for_work(t, now);
    }
    shutdown_all(t);
    return NULL;
}

/* ---- public API ----------------------------------------------------- */

static void transport_free(ds_transport *t)
{
    if (!t)
        return;
    stack_close(t);
    grants_free(t);
    quarantine_free(t);
    if (t->rx) {
        for (unsigned i = 0; i < t->nrx; i++)
            if (t->rx[i]) {
                free(t->rx[i]->buf);
                free(t->rx[i]);
            }
        free(t->rx);
    }
    free(t->peers);
    if (t->evfd >= 0)
        close(t->evfd);
    pthread_mutex_destroy(&t->lock);
    for (unsigned i = 0; i < t->cache_n; i++)
        free(t->cache_buf[i]);
    pthread_mutex_destroy(&t->cache_lock);
    free(t->provider);
    free(t->listen_host);
    free(t->listen_port);
    free(t->advertise);
    free(t);
}

int ds_transport_open(const ds_transport_opts *o, ds_transport **out)
{
    if (!o || !out)
        return -EINVAL;
    *out = NULL;
    int r = opts_check(o);
    if (r)
        return r;
    char host[DS_TRANSPORT_ADDR_MAX], port[8];
    if (split_hostport(o->listen, host, sizeof(host), port, sizeof(port))) {
        ds_error(COMP, "listen address '%s' is not host:port", o->listen);
        return -EINVAL;
    }
    if (o->advertise) {
        char h2[DS_TRANSPORT_ADDR_MAX], p2[8];
        if (split_hostport(o->advertise, h2, sizeof(h2), p2, sizeof(p2))) {
            ds_error(COMP, "advertise address '%s' is not host:port", o->advertise);
            return -EINVAL;
        }
    }
    ds_transport *t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->evfd = -1;
    t->cq_fd = -1;
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->cache_lock, NULL);
    t->o = *o;
    const char *prov = o->provider && *o->provider ? o->provider : "tcp";
    /* "tcp" alone names the msg-endpoint provider; RDM needs rxm on top. */
    t->provider = strdup(!strcmp(prov, "tcp") ? "tcp;ofi_rxm" : prov);
    t->listen_host = strdup(host);
    t->listen_port = strdup(port);
    t->advertise = o->advertise ? strdup(o->advertise) : NULL;
    t->o.provider = NULL;
    t->o.listen = NULL;
    t->o.advertise = NULL;
    t->next_due_ms = UINT64_MAX;
    if (!t->provider || !t->listen_host || !t->listen_port || (o->advertise && !t->advertise)) {
        r = -ENOMEM;
        goto fail;
    }
    /* Debian's shm provider hangs on messages above its inline size when
     * cross-memory attach is refused (containers without ptrace rights);
     * its shared-memory bounce path works everywhere. The user's own
     * setting wins. */
    if (!strncmp(t->provider, "shm", 3))
        setenv("FI_SHM_DISABLE_CMA", "1", 0);

    t->npeers = o->max_peers;
    t->peers = calloc(t->npeers, sizeof(*t->peers));
    t->nrx = o->rx_small_bufs; /* chunk-sized buffers are granted per sender */
    t->rx = calloc(t->nrx, sizeof(*t->rx));
    if (!t->peers || !t->rx) {
        r = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < t->npeers; i++)
        peer_fresh(&t->peers[i]);
    for (unsigned i = 0; i < t->nrx; i++) {
        t->rx[i] = calloc(1, sizeof(**t->rx));
        if (!t->rx[i]) {
            r = -ENOMEM;
            goto fail;
        }
        t->rx[i]->cap = TP_SMALL_BUF;
        t->rx[i]->tag = TP_TAG_SMALL;
        t->rx[i]->slot = i;
    }
    {
        size_t w = (o->max_inflight_bytes + o->chunk_bytes - 1) / o->chunk_bytes;
        t->grants_per_peer = w < 2 ? 2 : w > 128 ? 128 : (unsigned)w;
    }
    t->next_grant_id = random_u64();
    t->rx_unposted = t->nrx;
    t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->evfd < 0) {
        r = -errno;
        goto fail;
    }
    r = stack_open(t, t->listen_port);
    if (r)
        goto fail;
    r = learn_name(t);
    if (r)
        goto fail;
    if (t->namelen > TP_NAME_MAX) {
        r = -EINVAL;
        goto fail;
    }
    r = pthread_create(&t->thread, NULL, progress_main, t);
    if (r) {
        r = -r;
        goto fail;
    }
    t->thread_started = 1;
    ds_info(COMP, "listening on %s provider=%s chunk=%zu wait=%s", t->addr_text, t->provider,
            o->chunk_bytes, t->cq_fd >= 0 ? "fd" : "poll");
    *out = t;
    return 0;
fail:
    transport_free(t);
    return r;
}

void ds_transport_close(ds_transport **tp)
{
    if (!tp || !*tp)
        return;
    ds_transport *t = *tp;
    *tp = NULL;
    if (t->thread_started) {
        pthread_mutex_lock(&t->lock);
        t->stop = 1;
        pthread_mutex_unlock(&t->lock);
        wake(t);
        pthread_join(t->thread, NULL);
        /* Anything submitted after the thread's last look. */
        while (t->subq.head) {
            struct tp_op *op = t->subq.head;
            t->subq.head = op->next;
            op_report(t, op, -ECANCELED);
            op_free(t, op);
        }
    }
    transport_free(t);
}

int ds_transport_addr(ds_transport *t, char *buf, size_t n)
{
    if (!t || !buf || !n)
        return -EINVAL;
    if ((size_t)snprintf(buf, n, "%s", t->addr_text) >= n)
        return -ENOSPC;
    return 0;
}

static int peer_slot(ds_transport *t, ds_transport_peer p, uint32_t *slot)
{
    uint32_t s = (p & 0xffffu);
    if (s == 0 || s > t->npeers)
        return -ENOENT;
    s--;
    if (t->peers[s].state != PEER_LIVE || t->peers[s].gen != (uint16_t)(p >> 16))
        return -ENOENT;
    *slot = s;
    return 0;
}

int ds_transport_peer_add(ds_transport *t, const char *hostport, ds_transport_peer *out)
{
    if (!t || !hostport || !out)
        return -EINVAL;
    char h[DS_TRANSPORT_ADDR_MAX], port[8], key[DS_TRANSPORT_ADDR_MAX];
    if (split_hostport(hostport, h, sizeof(h), port, sizeof(port)))
        return -EINVAL;
    struct fi_info *hints = make_hints(t->provider), *di = NULL;
    if (!hints)
        return -ENOMEM;
    int r = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), h, port, 0, hints, &di);
    fi_freeinfo(hints);
    if (r) {
        ds_warn(COMP, "peer address %s does not resolve: %s", hostport, fi_strerror(-r));
        return -ENOENT;
    }
    if (!di->dest_addr || di->dest_addrlen > TP_NAME_MAX ||
        addr_canon(t->addr_format, di->dest_addr, di->dest_addrlen, key, sizeof(key))) {
        ds_warn(COMP, "peer address %s is not usable with provider %s", hostport, t->provider);
        fi_freeinfo(di);
        return -EINVAL;
    }
    uint32_t slot = UINT32_MAX, free_slot = UINT32_MAX;
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->npeers; i++) {
        if (t->peers[i].state == PEER_LIVE && !strcmp(t->peers[i].addr, key)) {
            slot = i;
            break;
        }
        if (t->peers[i].state == PEER_FREE && free_slot == UINT32_MAX)
            free_slot = i;
    }
    if (slot == UINT32_MAX && free_slot != UINT32_MAX) {
        struct tp_peer *p = &t->peers[free_slot];
        p->state = PEER_LIVE;
        p->gen++;
        snprintf(p->addr, sizeof(p->addr), "%s", key);
        memcpy(p->raw, di->dest_addr, di->dest_addrlen);
        p->rawlen = di->dest_addrlen;
        p->need_av = 1;
        t->peers_dirty = 1;
        slot = free_slot;
    }
    if (slot != UINT32_MAX)
        *out = peer_handle(t, slot);
    pthread_mutex_unlock(&t->lock);
    fi_freeinfo(di);
    if (slot == UINT32_MAX)
        return -ENOSPC;
    wake(t);
    return 0;
}

int ds_transport_peer_remove(ds_transport *t, ds_transport_peer p)
{
    if (!t)
        return -EINVAL;
    uint32_t slot;
    pthread_mutex_lock(&t->lock);
    int r = peer_slot(t, p, &slot);
    if (!r) {
        t->peers[slot].state = PEER_REMOVING;
        t->peers_dirty = 1;
    }
    pthread_mutex_unlock(&t->lock);
    if (!r)
        wake(t);
    return r;
}

int ds_transport_peer_addr(ds_transport *t, ds_transport_peer p, char *buf, size_t n)
{
    if (!t || !buf || !n)
        return -EINVAL;
    uint32_t slot;
    pthread_mutex_lock(&t->lock);
    int r = peer_slot(t, p, &slot);
    if (!r && (size_t)snprintf(buf, n, "%s", t->peers[slot].addr) >= n)
        r = -ENOSPC;
    pthread_mutex_unlock(&t->lock);
    return r;
}

int ds_transport_send(ds_transport *t, ds_transport_peer p, const ds_transport_send_args *a)
{
    if (!t || !a || (a->len && !a->buf) || (a->head_len && !a->head) ||
        (a->tail_len && !a->tail) || a->head_len > DS_TRANSPORT_EDGE_MAX ||
        a->tail_len > DS_TRANSPORT_EDGE_MAX - a->head_len)
        return -EINVAL;
    if (a->deadline_ms <= ds_now_ms())
        return -ETIMEDOUT;
    struct tp_op *op = calloc(1, sizeof(*op));
    if (!op)
        return -ENOMEM;
    if (a->head_len)
        memcpy(op->edge, a->head, a->head_len);
    if (a->tail_len)
        memcpy(op->edge + a->head_len, a->tail, a->tail_len);
    op->head_len = (uint16_t)a->head_len;
    op->tail_len = (uint16_t)a->tail_len;
    op->body_len = a->len;
    const size_t total = a->len + a->head_len + a->tail_len;
    if (a->release) {
        op->data = a->buf;
        op->release = a->release;
        op->release_arg = a->release_arg;
    } else if (a->len) {
        op->copy = ds_transport_buf_get(t, a->len);
        if (!op->copy) {
            free(op);
            return -ENOMEM;
        }
        memcpy(op->copy, a->buf, a->len);
        op->data = op->copy;
    }
    op->len = total;
    op->deadline_ms = a->deadline_ms;
    op->done = a->done;
    op->done_arg = a->done_arg;

    uint32_t slot;
    int r;
    pthread_mutex_lock(&t->lock);
    if (t->stop) {
        r = -ECANCELED;
    } else if ((r = peer_slot(t, p, &slot)) == 0) {
        uint64_t q = atomic_load(&t->st.queued_bytes);
        if (q + total > t->o.max_queued_bytes) {
            r = -ENOBUFS;
        } else {
            ST_ADD(t, queued_bytes, total);
            op->slot = slot;
            list_push_tail(&t->subq, op);
        }
    }
    pthread_mutex_unlock(&t->lock);
    if (r) {
        free(op->copy);
        free(op);
        return r;
    }
    wake(t);
    return 0;
}

struct send_waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    int done;
    int status;
};

static void send_waiter_done(void *arg, int status)
{
    struct send_waiter *w = arg;
    pthread_mutex_lock(&w->m);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
}

int ds_transport_send_wait(ds_transport *t, ds_transport_peer p, const void *buf, size_t len,
                           uint64_t deadline_ms)
{
    struct send_waiter w = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};
    ds_transport_send_args a = {
        .buf = buf, .len = len, .deadline_ms = deadline_ms,
        .done = send_waiter_done, .done_arg = &w,
    };
    int r = ds_transport_send(t, p, &a);
    if (r)
        return r;
    /* done runs exactly once, at the latest one progress tick after the
     * deadline or when the transport closes; w must outlive it. */
    pthread_mutex_lock(&w.m);
    while (!w.done)
        pthread_cond_wait(&w.c, &w.m);
    pthread_mutex_unlock(&w.m);
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
    return w.status;
}

void *ds_transport_msg_take(ds_transport_msg *msg)
{
    if (!msg || msg->taken_)
        return NULL;
    msg->taken_ = 1;
    return msg->base_;
}

int ds_transport_reset(ds_transport *t)
{
    if (!t)
        return -EINVAL;
    pthread_mutex_lock(&t->lock);
    t->reset_req = 1;
    pthread_mutex_unlock(&t->lock);
    wake(t);
    return 0;
}

void ds_transport_stats_get(ds_transport *t, ds_transport_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!t)
        return;
#define LD(f) st->f = atomic_load_explicit(&t->st.f, memory_order_relaxed)
    LD(msgs_sent);
    LD(bytes_sent);
    LD(msgs_recv);
    LD(bytes_recv);
    LD(send_timeouts);
    LD(send_errors);
    LD(eagain);
    LD(stuck_ops);
    LD(stuck_bytes);
    LD(queued_bytes);
    LD(resets);
    LD(quarantined_bytes);
    LD(dup_completions);
    for (int i = 0; i < DS_TP_DROP_COUNT; i++)
        st->drops[i] = atomic_load_explicit(&t->st.drops[i], memory_order_relaxed);
#undef LD
}
