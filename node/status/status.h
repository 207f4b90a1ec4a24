/*
 * node/status/status.h: what a running node says about itself (design §10): an
 * HTTP page on status.listen (/status as JSON, /metrics in Prometheus text
 * format) and the same JSON in status.file.
 *
 * The node runtime fills a ds_status_snapshot once per round and hands it
 * to ds_status_publish, which copies it under a mutex and returns: nothing
 * here ever reads another module's memory, so a slow or hostile HTTP client
 * can cost the status thread time but never the training thread. The
 * snapshot is plain data (fixed arrays, value copies of the other modules'
 * stats structs), so it is filled with assignments, snprintf and memcpy.
 *
 * One thread per ds_status serves HTTP and rewrites the file. HTTP:
 * GET only, HTTP/1.0 and 1.1, one request per connection (Connection:
 * close), bounded request size, bounded concurrent connections, a deadline
 * per connection for reading the request and one for writing the answer;
 * a request that is too large or malformed gets 400, a method other than
 * GET 405, a path other than /status and /metrics 404, a connection over
 * the limit 503. The file is written to PATH.tmp and renamed over PATH, at
 * most once per file_interval_ms, so a reader sees a whole document and a
 * round every few milliseconds does not turn into a disk write each.
 *
 * The JSON schema and the metric names are documented in docs/status.md.
 */
#ifndef DS_NODE_STATUS_H
#define DS_NODE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "node/gossip/gossip.h"
#include "node/gossip/gossip_net.h"
#include "node/membership/membership.h"
#include "node/net/net.h"
#include "node/transport/transport.h"
#include "node/wire/wire.h"

/* ---- the snapshot ------------------------------------------------------------ */

#define DS_STATUS_MAX_VIEW 256    /* members listed; view_size may be larger */
#define DS_STATUS_MAX_SEGMENTS 64 /* exchanges listed; n_segments may be larger */
#define DS_STATUS_MAX_ANSWERS 8   /* answer_from names per segment */

#define DS_STATUS_NAME_LEN (DS_WIRE_NAME_MAX + 1)
#define DS_STATUS_ADDR_LEN (DS_WIRE_ADDR_MAX + 1)
#define DS_STATUS_GROUP_LEN (DS_WIRE_GROUP_MAX + 1)

/* This node's life, as in the summary line plus the phases before it. */
enum ds_status_state {
    DS_STATUS_JOINING = 0,  /* started; not training yet */
    DS_STATUS_TRAINING = 1,
    DS_STATUS_LEAVING = 2,  /* LEAVE announced, waiting for it to apply */
    DS_STATUS_DONE = 3,     /* finished its steps */
    DS_STATUS_STOPPED = 4,  /* stopped by a signal */
    DS_STATUS_FAILED = 5,
    DS_STATUS__COUNT
};

/* What happened to this node's own exchange of a segment this round. */
enum ds_status_outcome {
    DS_XCHG_UNKNOWN = 0, /* not known (yet) */
    DS_XCHG_OK = 1,
    DS_XCHG_FAILED = 2,  /* timed out, refused or STALE */
    DS_XCHG_SKIPPED = 3, /* not tried: peer known to be unresponsive */
    DS_XCHG_NONE = 4,    /* nothing to initiate this round (target == me) */
    DS_XCHG__COUNT
};

/* One member of the view at this round. */
typedef struct ds_status_member {
    uint64_t id;                     /* node id (ds_wire_node_id of its key) */
    char name[DS_STATUS_NAME_LEN];
    char addr[DS_STATUS_ADDR_LEN];
    char group[DS_STATUS_GROUP_LEN]; /* "" = a group of one */
    uint8_t state;                   /* enum ds_member_state */
} ds_status_member;

/* One segment's exchanges this round. */
typedef struct ds_status_exchange {
    uint32_t segment;
    uint64_t offset, length;             /* floats into theta */
    char initiate_to[DS_STATUS_NAME_LEN]; /* "" when none */
    uint32_t n_answer_from;              /* answerers in all; the first
                                          * DS_STATUS_MAX_ANSWERS are named */
    char answer_from[DS_STATUS_MAX_ANSWERS][DS_STATUS_NAME_LEN];
    uint8_t outcome;                     /* enum ds_status_outcome */
    uint64_t bytes;                      /* payload bytes of the exchange
                                          * this node initiated; 0 = unknown */
} ds_status_exchange;

/*
 * Everything /status and /metrics show. About 100 KB: allocate it (calloc)
 * rather than putting it on a thread's stack, and keep one for the node's
 * life; ds_status_snapshot_init sets the "nothing known" values.
 */
typedef struct ds_status_snapshot {
    /* identity */
    char name[DS_STATUS_NAME_LEN];
    char addr[DS_STATUS_ADDR_LEN];   /* this node's transport address */
    char group[DS_STATUS_GROUP_LEN];
    uint64_t id;
    uint8_t state;                   /* enum ds_status_state */

    /* training */
    int64_t step, steps;             /* done so far / configured */
    uint64_t round, epoch;           /* gossip round and its view epoch */
    double loss;                     /* mean over the last log window */
    double test_acc;                 /* last evaluation; -1 = none yet */
    double lr;
    double samples_per_s;

    /* the view at `round`: view_size members, the first n_view listed */
    uint32_t view_size, n_view;
    uint32_t view_me;                /* index of this node; UINT32_MAX: not in it */
    ds_status_member view[DS_STATUS_MAX_VIEW];

    /* this round's exchanges: n_segments in the model, n_exchanges listed */
    uint32_t n_segments, n_exchanges;
    ds_status_exchange exchanges[DS_STATUS_MAX_SEGMENTS];

    /* counters, copied whole from their modules */
    ds_gossip_stats gossip;          /* *ds_gossip_get_stats() */
    ds_gnet_stats gnet;              /* ds_gnet_stats_get() */
    ds_net_stats net;                /* ds_net_stats_get(): frames, bytes,
                                      * handshakes and .transport */
    ds_membership_stats membership;  /* ds_membership_stats_get() */
    uint64_t drops[DS_DROP__COUNT];  /* ds_status_copy_drops(ds_net_drops()) */
} ds_status_snapshot;

/* Zero everything, then test_acc = -1, view_me = UINT32_MAX, state =
 * joining. */
void ds_status_snapshot_init(ds_status_snapshot *s);

/* Copy the atomic drop counters into s->drops (plain numbers). c may be
 * NULL (all zero). */
void ds_status_copy_drops(ds_status_snapshot *s, const ds_drop_counters *c);

/* "joining", ..., "failed"; "?" when out of range. */
const char *ds_status_state_name(enum ds_status_state st);
/* "unknown", "ok", "failed", "skipped", "none"; "?" when out of range. */
const char *ds_status_outcome_name(enum ds_status_outcome o);
/* "alive", "suspect", "dead", "left"; "?" when out of range. */
const char *ds_status_member_state_name(unsigned member_state);

/* ---- rendering (also used by tests and the file writer) ----------------------- */

/* The /status document for s, NUL-terminated, into a new buffer (*out,
 * caller frees) of *len bytes. now_unix_ms stamps "time_unix_ms". Returns 0
 * or -ENOMEM. */
int ds_status_render_json(const ds_status_snapshot *s, uint64_t now_unix_ms, char **out,
                          size_t *len) __attribute__((warn_unused_result));

/* The /metrics page for s, like ds_status_render_json. */
int ds_status_render_metrics(const ds_status_snapshot *s, char **out, size_t *len)
    __attribute__((warn_unused_result));

/* ---- the server and the file writer ------------------------------------------- */

typedef struct ds_status ds_status;

typedef struct ds_status_opts {
    const char *listen;         /* "host:port" (IPv4 or a name; port 0 = any
                                 * free port); NULL or "" = no HTTP */
    const char *file;           /* path; NULL or "" = no file */
    int max_conns;              /* connections served at once; 16 */
    size_t max_request;         /* bytes of request line + headers; 8192 */
    int request_timeout_ms;     /* to receive the whole request; 5000 */
    int write_timeout_ms;       /* to send the whole answer; 5000 */
    int file_interval_ms;       /* the file is rewritten at most this often; 500 */
} ds_status_opts;

/* The defaults above, listen and file NULL. */
void ds_status_opts_default(ds_status_opts *o);

typedef struct ds_status_stats {
    uint64_t accepted;          /* connections taken */
    uint64_t refused_full;      /* answered 503: max_conns busy */
    uint64_t timeouts;          /* dropped: request or answer too slow */
    uint64_t resp_200, resp_400, resp_404, resp_405;
    uint64_t file_writes, file_errors;
    uint64_t publishes;
} ds_status_stats;

/* Start serving: bind status.listen (when set) and start the status
 * thread. Until the first publish, /status shows an initialised snapshot
 * (state joining, no name). The option strings are copied. When neither
 * listen nor file is set, *out is NULL and 0 is returned: every other
 * function accepts a NULL ds_status and does nothing.
 * Returns 0, -EINVAL (bad host:port or options), -EADDRINUSE, -EACCES,
 * another negative errno from socket/bind/listen or from creating
 * file.tmp (the directory must exist and be writable), or -ENOMEM; the
 * reason is logged. The caller owns *out (ds_status_destroy). */
int ds_status_create_opts(ds_status **out, const ds_status_opts *o)
    __attribute__((warn_unused_result));

/* ds_status_create_opts with the default limits. */
int ds_status_create(ds_status **out, const char *listen, const char *file)
    __attribute__((warn_unused_result));

/* Copy *s (borrowed for the call) as the current status. Takes a mutex
 * for one memcpy; never does I/O and never waits for a client. NULL-safe. */
void ds_status_publish(ds_status *st, const ds_status_snapshot *s);

/* The bound HTTP address "host:port" (the real port when listen asked for
 * 0). 0, -ENOENT when there is no HTTP server, -ENOSPC when n is too small. */
int ds_status_addr(const ds_status *st, char *buf, size_t n);

/* Counters of the server itself (they also appear in /metrics). */
void ds_status_stats_get(ds_status *st, ds_status_stats *out);

/* Stop the thread, close every connection, write the last published
 * snapshot to the file if it has not been written yet, free. NULL-safe;
 * clears *st. */
void ds_status_destroy(ds_status **st);

#endif
