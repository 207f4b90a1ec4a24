/*
 * node/status/status.h: what a running node says about itself (design §10): an
 * HTTP page on status.listen (/status as JSON, /metrics in Prometheus text
 * format) and the same JSON in status.file.
 *
 * The node runtime fills a ds_status_snapshot once per round and hands it
 * to ds_status_publish, which copies it under a mutex and returns: nothing
 * here ever reads another module's memory, so a slow or hostile HTTP client
 * can cost the status thread time but never the training thread. The
 * snapshot is plain data: fixed arrays for the node, its view and this
 * round's exchanges, and the other modules' counters as metric groups
 * (base/metric.h: a table of descriptors of static storage, plus the
 * values copied out of the module's stats struct). This module knows no
 * other module of node/: the runtime (node/runtime/publish.h) hands it the
 * tables and the values.
 *
 * A publish happens between steps, so a node blocked inside one (on an
 * overlapped round, its group's reduction, min_members) would show
 * nothing while blocked. ds_status_set_wait hands the server a small
 * record of what it waits on (plain data too: a kind, names, times),
 * again one copy under the mutex; the status thread shows it as
 * "waiting" and keeps the file current while it lasts.
 *
 * One thread per ds_status serves HTTP (libmicrohttpd, driven by that
 * thread) and rewrites the file. HTTP: GET and HEAD, HTTP/1.0 and 1.1, one
 * request per connection (Connection: close), bounded request size,
 * bounded connections in all and per client address, a deadline per
 * connection for the whole request and one for the answer. Answers: 200
 * for / (an HTML page), /status and /metrics; 404 for another path; 405 for another method;
 * 400 for a malformed request; 414 or 431 for a request line or headers
 * over max_request; 505 for a version other than HTTP/1.x; 503 for a
 * connection over max_conns. The file is written to PATH.tmp and renamed
 * over PATH, at most once per file_interval_ms, so a reader sees a whole
 * document and a round every few milliseconds does not turn into a disk
 * write each.
 *
 * The JSON schema, the metric names and the decisions are in
 * docs/status.md.
 */
#ifndef DS_NODE_STATUS_H
#define DS_NODE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "base/metric.h"

/* ---- the snapshot ------------------------------------------------------------ */

#define DS_STATUS_MAX_VIEW 256    /* members listed; view_size may be larger */
#define DS_STATUS_MAX_SEGMENTS 64 /* exchanges listed; n_segments may be larger */
#define DS_STATUS_MAX_ANSWERS 8   /* answer_from names per segment */
#define DS_STATUS_MAX_GROUPS 16   /* metric groups */
#define DS_STATUS_MAX_VALUES 512  /* metric values in all groups */
#define DS_STATUS_MAX_LAYERS 16   /* the model's layer table (all of it:
                                   * node/train's DS_MODEL_MAX_LAYERS) */
#define DS_STATUS_HISTORY 32      /* completed rounds kept (a ring) */
#define DS_STATUS_HIST_SEGMENTS 32 /* segments kept per completed round */
#define DS_STATUS_ROUND_BUCKETS 12 /* round duration histogram buckets */
#define DS_STATUS_XCHG_BUCKETS 15  /* exchange latency histogram buckets */
#define DS_STATUS_PEER_SERIES 8    /* peers with their own bytes series */

/* Text fields, terminator included (the wire's limits + 1; the runtime
 * checks they agree). */
#define DS_STATUS_NAME_LEN 64
#define DS_STATUS_ADDR_LEN 128
#define DS_STATUS_GROUP_LEN 32

/* This node's life, as in the summary line plus the phases before it. */
enum ds_status_state {
    DS_STATUS_JOINING = 0,  /* started; not training yet */
    DS_STATUS_TRAINING = 1,
    DS_STATUS_LEAVING = 2,  /* LEAVE announced, waiting for it to apply */
    DS_STATUS_DONE = 3,     /* finished its steps */
    DS_STATUS_STOPPED = 4,  /* stopped by a signal */
    DS_STATUS_FAILED = 5,
    DS_STATUS_PAUSED = 6,   /* train.stop_after reached, checkpoint written */
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

/* A member's state in the view (the same values as membership's). */
enum ds_status_member_state {
    DS_STATUS_MEMBER_ALIVE = 0,
    DS_STATUS_MEMBER_SUSPECT = 1,
    DS_STATUS_MEMBER_DEAD = 2,
    DS_STATUS_MEMBER_LEFT = 3,
    DS_STATUS_MEMBER__COUNT
};

/* One member of the view at this round. */
typedef struct ds_status_member {
    uint64_t id;                     /* node id */
    char name[DS_STATUS_NAME_LEN];
    char addr[DS_STATUS_ADDR_LEN];
    char group[DS_STATUS_GROUP_LEN]; /* "" = a group of one */
    uint8_t state;                   /* enum ds_status_member_state */
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

/* One segment of a completed round, as this node saw it. */
typedef struct ds_status_seg_done {
    uint32_t target;   /* view index this node initiated to; == me: none */
    uint32_t n_in;     /* initiators that reached this node */
    uint64_t target_id; /* node id of target; 0: none */
    uint64_t bytes;    /* payload bytes of the exchange this node initiated */
    uint64_t latency_ns; /* that exchange's latency (ds_gossip_xinfo); 0 unless ok */
    uint8_t outcome;   /* enum ds_status_outcome, final (never unknown) */
} ds_status_seg_done;

/* One completed round (node/runtime records it at the round's end, so a
 * round in flight is never shown). The schedule is not copied: it is a
 * pure function of (topology, seed, epoch, round, segment, view size)
 * that a reader computes with topology/; `me` and the targets' ids map
 * the view's indices to nodes. */
typedef struct ds_status_round {
    uint64_t round, epoch;
    uint32_t view_size, me;      /* this node's index in that view */
    /* A round between groups (node.group, the hierarchy): its participants
     * are the groups, so view_size counts groups, me and each segment's
     * target are group indices, and target_id names the member of the
     * target group that handles the segment. groups: 0 for a round between
     * nodes, else the number of groups (== view_size); group_member and
     * group_size: this node's index in its group and the group's size in
     * that round (the member handles segments s with s mod size == member). */
    uint32_t groups, group_member, group_size;
    uint64_t end_unix_ms;        /* wall clock at the round's end */
    uint64_t duration_ns;        /* begin to end */
    uint32_t n_segments, n_listed; /* segments in the round / kept below */
    ds_status_seg_done seg[DS_STATUS_HIST_SEGMENTS];
} ds_status_round;

/* The last completed rounds: a ring of DS_STATUS_HISTORY, plus every
 * round's duration in a histogram (cumulative since the start). */
typedef struct ds_status_history {
    uint32_t n;                  /* rounds held (<= DS_STATUS_HISTORY) */
    uint32_t next;               /* slot the next round goes to */
    ds_status_round r[DS_STATUS_HISTORY];
    uint64_t dur_count, dur_sum_ns;
    uint64_t dur_bucket[DS_STATUS_ROUND_BUCKETS]; /* not cumulative: by slot */
    /* the latency of every ok exchange this node initiated, same way */
    uint64_t lat_count, lat_sum_ns;
    uint64_t lat_bucket[DS_STATUS_XCHG_BUCKETS];
    /* payload bytes this node initiated, by peer: the first
     * DS_STATUS_PEER_SERIES peers get a slot for the node's life, every
     * later one counts in other_bytes (so every series only grows) */
    uint32_t n_peers;
    uint64_t peer_id[DS_STATUS_PEER_SERIES];
    char peer_name[DS_STATUS_PEER_SERIES][DS_STATUS_NAME_LEN];
    uint64_t peer_bytes[DS_STATUS_PEER_SERIES];
    uint64_t other_bytes;
} ds_status_history;

/* The process, as the kernel reports it (/proc/self): Prometheus's
 * standard process metrics. valid: 0 when it could not be read. */
typedef struct ds_status_process {
    int valid;
    double cpu_seconds;        /* user + system */
    double start_time_seconds; /* since the Unix epoch */
    uint64_t resident_bytes, virtual_bytes;
    uint64_t open_fds, max_fds;
} ds_status_process;

/* Read this process's figures into *p (valid = 1), from /proc/self/stat,
 * /proc/self/statm, /proc/self/fd, /proc/stat's btime and RLIMIT_NOFILE.
 * 0, or a negative errno (valid = 0). */
int ds_status_process_read(ds_status_process *p);

/* One histogram of durations, by slot (not cumulative), over the
 * exchange latency buckets (ds_status_xchg_bounds: 100 us .. 2.5 s). */
typedef struct ds_status_times {
    uint64_t count, sum_ns;
    uint64_t bucket[DS_STATUS_XCHG_BUCKETS];
} ds_status_times;

/* A node in a group, every step (node/runtime records them): the group
 * reduction, what the step waited for (exposed), and with group.overlap
 * what its layers' reductions ran behind backward (hidden); the exchange
 * between groups, split into what the step waited for (exposed) and
 * what ran behind its compute (hidden). */
typedef struct ds_status_group_times {
    ds_status_times reduce, reduce_hidden, exchange_exposed, exchange_hidden;
} ds_status_group_times;

/* Add one duration to t. */
void ds_status_times_add(ds_status_times *t, uint64_t ns);

/* Upper bounds (seconds) of the round duration buckets; the last is
 * +Inf. */
extern const double ds_status_round_bounds[DS_STATUS_ROUND_BUCKETS];
/* Upper bounds (seconds) of the exchange latency buckets; the last is
 * +Inf. */
extern const double ds_status_xchg_bounds[DS_STATUS_XCHG_BUCKETS];

/* Add a completed round to h: the oldest is dropped when full. names
 * (may be NULL) gives the name of each segment's target, for the bytes
 * by peer. */
void ds_status_history_add(ds_status_history *h, const ds_status_round *r);
void ds_status_history_add_named(ds_status_history *h, const ds_status_round *r,
                                 const char *const *names);

/* The i-th newest completed round (0 = newest), NULL when i >= h->n. */
const ds_status_round *ds_status_history_get(const ds_status_history *h, uint32_t i);

/* One layer with parameters of the model (node/train's layer table). */
typedef struct ds_status_layer {
    char name[16];           /* "conv1", "fc1", ... */
    uint32_t k;              /* conv: kernel size; 0 for a dense layer */
    uint32_t in, out;        /* weight shape out x in (a conv's in is c_in*k*k) */
    uint64_t offset, length; /* floats into theta: weights, then biases */
} ds_status_layer;

/* What this node is blocked on now (ds_status_set_wait), shown as
 * /status's "waiting". */
enum ds_status_wait_kind {
    DS_WAIT_NONE = 0,    /* not waiting: "waiting" is null */
    DS_WAIT_ROUND = 1,   /* the overlapped gossip round's exchanges (peers:
                          * those it still waits for) */
    DS_WAIT_GROUP = 2,   /* the group's reduction (peers: the members it
                          * reduces with) */
    DS_WAIT_MEMBERS = 3, /* cluster.min_members at join (alive of want) */
    DS_WAIT__COUNT
};

#define DS_STATUS_WAIT_PEERS 8 /* peers named; n_peers may be larger */

typedef struct ds_status_wait {
    uint8_t kind;            /* enum ds_status_wait_kind */
    uint64_t since_unix_ms;  /* wall clock when the wait began */
    uint64_t round;          /* DS_WAIT_ROUND: the round waited for */
    uint32_t alive, want;    /* DS_WAIT_MEMBERS: members alive / needed */
    uint32_t n_peers;        /* peers waited for in all; the first
                              * DS_STATUS_WAIT_PEERS named */
    char peers[DS_STATUS_WAIT_PEERS][DS_STATUS_NAME_LEN];
} ds_status_wait;

/* What membership told this node about a member, for the timeline
 * (/status "events"). */
enum ds_status_event_kind {
    DS_EV_JOINED = 1,   /* appeared alive: new, or back after dead/left */
    DS_EV_SUSPECT = 2,
    DS_EV_ALIVE = 3,    /* a suspicion refuted */
    DS_EV_DEAD = 4,
    DS_EV_LEFT = 5,
    DS_EV__COUNT
};

#define DS_STATUS_EVENTS 64 /* the newest kept (a ring) */

typedef struct ds_status_event {
    uint8_t kind;            /* enum ds_status_event_kind */
    uint64_t unix_ms;        /* when this node learned it */
    uint64_t round;          /* this node's round then */
    uint64_t effective_round; /* joined: its join round; dead, left: its
                              * removal round; UINT64_MAX: none given */
    char member[DS_STATUS_NAME_LEN];
} ds_status_event;

/* The newest DS_STATUS_EVENTS events, and how many there were. */
typedef struct ds_status_events {
    uint32_t n, next;
    uint64_t total;
    ds_status_event ev[DS_STATUS_EVENTS];
} ds_status_events;

/* Add an event to the ring (the oldest is dropped when full). */
void ds_status_events_add(ds_status_events *e, const ds_status_event *ev);

/* The i-th newest event (0 = newest), NULL when i >= e->n. */
const ds_status_event *ds_status_events_get(const ds_status_events *e, uint32_t i);

/* "joined", "suspect", "alive", "dead", "left"; "?" otherwise. */
const char *ds_status_event_name(enum ds_status_event_kind k);

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
    uint64_t samples;                /* training samples this process trained on
                                      * (its steps x train.batch_size; a joiner's
                                      * adopted steps are not counted) */

    /* the view at `round`: view_size members, the first n_view listed */
    uint32_t view_size, n_view;
    uint32_t view_me;                /* index of this node; UINT32_MAX: not in it */
    ds_status_member view[DS_STATUS_MAX_VIEW];

    /* the model's layer table (set once the trainer is registered) */
    uint32_t n_layers;
    ds_status_layer layers[DS_STATUS_MAX_LAYERS];

    /* this round's exchanges: n_segments in the model, n_exchanges listed */
    uint32_t n_segments, n_exchanges;
    ds_status_exchange exchanges[DS_STATUS_MAX_SEGMENTS];

    /* the schedule's inputs besides the view (any reader recomputes every
     * round's pairs from them with topology/) */
    char topology[16];               /* gossip.topology's name */
    char mix[16];                    /* gossip.mix's name (two groups: pairwise exchanges once) */
    uint64_t seed;                   /* cluster.seed */
    char version[32], backend[16];   /* build info */
    ds_status_process process;       /* read at each publish */

    /* the last completed rounds */
    ds_status_history hist;

    /* membership's news about other members, newest last */
    ds_status_events events;

    /* a node in a group (group[0] set): its steps' reduction and exchange
     * times (shown on /metrics while group is set) */
    ds_status_group_times gtimes;

    /* what the node is blocked on: the server shows the record of
     * ds_status_set_wait here, whatever a published snapshot holds */
    ds_status_wait wait;

    /* the other modules' counters, group by group in page order (filled by
     * ds_status_add_group; the descriptor tables are of static storage,
     * so the snapshot stays a plain copyable value) */
    uint32_t n_groups, n_values;
    const ds_metric_group *groups[DS_STATUS_MAX_GROUPS];
    uint32_t first[DS_STATUS_MAX_GROUPS]; /* group i's values start here */
    uint64_t values[DS_STATUS_MAX_VALUES]; /* raw: U32 widened, NS in ns */
} ds_status_snapshot;

/* The snapshot functions below work on the caller's snapshot only (no
 * shared state): any thread, one at a time per snapshot. */

/* Zero everything, then test_acc = -1, view_me = UINT32_MAX, state =
 * joining, no metric groups. */
void ds_status_snapshot_init(ds_status_snapshot *s);

/* Forget the metric groups (before adding this round's). */
void ds_status_clear_groups(ds_status_snapshot *s);

/* Append group g (static storage, borrowed for the snapshot's life) with
 * its values read from the struct at src (borrowed for the call) through
 * g's descriptors. A group with a parent must come after the parent.
 * Returns 0, -EINVAL (g malformed, or its parent not added yet) or
 * -ENOSPC (DS_STATUS_MAX_GROUPS or DS_STATUS_MAX_VALUES reached). */
int ds_status_add_group(ds_status_snapshot *s, const ds_metric_group *g, const void *src)
    __attribute__((warn_unused_result));

/* "joining", ..., "failed"; "?" when out of range. */
const char *ds_status_state_name(enum ds_status_state st);
/* "unknown", "ok", "failed", "skipped", "none"; "?" when out of range. */
const char *ds_status_outcome_name(enum ds_status_outcome o);
/* "alive", "suspect", "dead", "left"; "?" when out of range. */
const char *ds_status_member_state_name(unsigned member_state);
/* "none", "round", "group", "members"; "?" when out of range. */
const char *ds_status_wait_name(enum ds_status_wait_kind k);

/* ---- rendering (also used by tests and the file writer) ----------------------- */

/* Pure functions of their arguments: any thread. */

/* The /status document for s, NUL-terminated, into a new buffer (*out,
 * caller frees) of *len bytes. now_unix_ms stamps "time_unix_ms". Returns 0
 * or -ENOMEM. */
int ds_status_render_json(const ds_status_snapshot *s, uint64_t now_unix_ms, char **out,
                          size_t *len) __attribute__((warn_unused_result));

/* The /metrics page for s (without the server's own counters), like
 * ds_status_render_json. */
int ds_status_render_metrics(const ds_status_snapshot *s, char **out, size_t *len)
    __attribute__((warn_unused_result));

/* The page at `/` for s (HTML: identity, links to /status and /metrics,
 * the view and the last completed round), like ds_status_render_metrics. */
int ds_status_render_html(const ds_status_snapshot *s, char **out, size_t *len)
    __attribute__((warn_unused_result));

/* The Markdown table docs/status.md shows for group g (one row per
 * descriptor: JSON key, metric with its label, type, meaning), into a new
 * NUL-terminated buffer (*out, caller frees). Returns 0 or -ENOMEM. */
int ds_status_doc_table(const ds_metric_group *g, char **out)
    __attribute__((warn_unused_result));

/* ---- the server and the file writer ------------------------------------------- */

typedef struct ds_status ds_status;

typedef struct ds_status_opts {
    const char *listen;         /* "host:port" (base/hostport.h; port 0 = any
                                 * free port); NULL or "" = no HTTP */
    const char *file;           /* path; NULL or "" = no file */
    int max_conns;              /* connections served at once; 16. As many
                                 * again are taken to be answered 503. */
    int max_conns_per_ip;       /* connections from one client address;
                                 * 8; 0 = no limit */
    size_t max_request;         /* bytes of request line + headers; 8192 */
    int request_timeout_ms;     /* to receive the whole request; 5000 */
    int write_timeout_ms;       /* to send the whole answer; 5000 */
    int file_interval_ms;       /* the file is rewritten at most this often; 500 */
    const ds_status_snapshot *initial; /* shown until the first publish (copied
                                 * at create; its metric groups make the
                                 * first document carry every key); NULL:
                                 * a ds_status_snapshot_init one */
} ds_status_opts;

/* The defaults above, listen, file and initial NULL. */
void ds_status_opts_default(ds_status_opts *o);

/* The server's own counters: one list (base/metric.h) gives the members,
 * their /metrics families and their docs/status.md rows. They are not in
 * /status. */
#define DS_STATUS_HELP_RESP "Answers of this status server, by HTTP code."
#define DS_STATUS_STATS(X) \
    X(U64, resp_200, NULL, "dsnode_status_responses_total", COUNTER, "code", "200", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_400, NULL, "dsnode_status_responses_total", COUNTER, "code", "400", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_404, NULL, "dsnode_status_responses_total", COUNTER, "code", "404", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_405, NULL, "dsnode_status_responses_total", COUNTER, "code", "405", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_414, NULL, "dsnode_status_responses_total", COUNTER, "code", "414", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_431, NULL, "dsnode_status_responses_total", COUNTER, "code", "431", \
      DS_STATUS_HELP_RESP) \
    X(U64, refused_full, NULL, "dsnode_status_responses_total", COUNTER, "code", "503", \
      DS_STATUS_HELP_RESP) \
    X(U64, resp_505, NULL, "dsnode_status_responses_total", COUNTER, "code", "505", \
      DS_STATUS_HELP_RESP) \
    X(U64, accepted, NULL, "dsnode_status_connections_total", COUNTER, NULL, NULL, \
      "Connections accepted.") \
    X(U64, timeouts, NULL, "dsnode_status_timeouts_total", COUNTER, NULL, NULL, \
      "Connections dropped for being too slow.") \
    X(U64, file_writes, NULL, "dsnode_status_file_writes_total", COUNTER, NULL, NULL, \
      "status.file rewrites.") \
    X(U64, file_errors, NULL, "dsnode_status_file_errors_total", COUNTER, NULL, NULL, \
      "status.file write failures.") \
    X(U64, publishes, NULL, NULL, COUNTER, NULL, NULL, "Snapshots published by the node.")

typedef struct ds_status_stats {
    DS_STATUS_STATS(DS_METRIC_FIELD)
} ds_status_stats;

/* The group of ds_status_stats (for docs and tests). */
extern const ds_metric_group ds_status_stats_group;

/* Start serving: bind status.listen (when set) and start the status
 * thread. Until the first publish, /status shows o->initial, or an
 * initialised snapshot (state joining, no name, no counters). The option
 * strings are copied. When neither
 * listen nor file is set, *out is NULL and 0 is returned: every other
 * function accepts a NULL ds_status and does nothing.
 * Returns 0, -EINVAL (bad host:port or options), -EADDRINUSE, -EACCES,
 * another negative errno from socket/bind/listen or from creating
 * file.tmp (the directory must exist and be writable), -EIO (the HTTP
 * library refused to start), or -ENOMEM; the reason is logged. The caller
 * owns *out (ds_status_destroy). */
int ds_status_create_opts(ds_status **out, const ds_status_opts *o)
    __attribute__((warn_unused_result));

/* ds_status_create_opts with the default limits. */
int ds_status_create(ds_status **out, const char *listen, const char *file)
    __attribute__((warn_unused_result));

/* Copy *s (borrowed for the call) as the current status. Takes a mutex
 * for one memcpy; never does I/O and never waits for a client. NULL-safe.
 * Any thread; one publisher at a time is the expected use. */
void ds_status_publish(ds_status *st, const ds_status_snapshot *s);

/* What the node is blocked on, for as long as it is (a wait between two
 * publishes is otherwise never seen): *w is copied (borrowed for the
 * call) under the mutex, like publish, and shown as "waiting" by /status
 * and status.file until ds_status_clear_wait, whatever is published
 * meanwhile. /status shows it at the next request; the status thread
 * rewrites the file within file_interval_ms and keeps rewriting it while
 * the wait lasts (at most every max(file_interval_ms,
 * DS_STATUS_WAIT_TICK_MS)), so for_s grows. w->since_unix_ms = 0 stamps the call's wall clock. Calling it
 * again while waiting replaces the record (peers that answered meanwhile
 * drop out). Never does I/O and never renders. NULL-safe; any thread. */
void ds_status_set_wait(ds_status *st, const ds_status_wait *w);
/* Not waiting any more ("waiting": null). NULL-safe; any thread. */
void ds_status_clear_wait(ds_status *st);

#define DS_STATUS_WAIT_TICK_MS 100 /* a shown wait's for_s is this fresh */

/* The bound HTTP address "host:port" (the real port when listen asked for
 * 0). 0, -ENOENT when there is no HTTP server, -ENOSPC when n is too small. */
int ds_status_addr(const ds_status *st, char *buf, size_t n);

/* Counters of the server itself (they also appear in /metrics). Any
 * thread. */
void ds_status_stats_get(ds_status *st, ds_status_stats *out);

/* Stop the thread, close every connection, write the last published
 * snapshot to the file if it has not been written yet, free. NULL-safe;
 * clears *st. */
void ds_status_destroy(ds_status **st);

#endif
