/*
 * tools/dsviz/viz.h: dsviz's parts, a library so tests call them directly.
 *
 * Data flow: sources (status.json files, directories of them, host:port
 * status pages) -> documents, one kept per node name (the newest by
 * time_unix_ms) -> a graph: members (every node that reported, plus every
 * member some node's view lists), grouped by node.group, and this round's
 * exchanges as edges initiator -> target per segment -> DOT, SVG (through
 * Graphviz `dot` when installed) and a self-contained HTML page.
 *
 * dsviz links nothing of node/ (design §1): the status schema
 * (docs/status.md) is the interface. Documents are read with jansson,
 * live pages fetched with libcurl, host:port sources parsed by
 * base/hostport.h (the one parser, so dsviz accepts the addresses a node's
 * status.listen accepts).
 *
 * Not thread-safe: a ds_viz belongs to one thread at a time.
 */
#ifndef DS_TOOLS_DSVIZ_VIZ_H
#define DS_TOOLS_DSVIZ_VIZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#define DS_VIZ_MAX_DOCS 4096
#define DS_VIZ_MAX_MEMBERS 4096
#define DS_VIZ_MAX_EDGES 65536
/* A node whose newest completed round is this far behind the newest any
 * node reports does not hold back the round drawn by default (a node's own
 * history holds 32 rounds: it would not reach back that far either). */
#define DS_VIZ_STALE_ROUNDS 32
#define DS_VIZ_MAX_FILE ((size_t)16 << 20) /* a status document, from a file or a page */

typedef struct ds_viz_member {
    char name[64], addr[128], group[32], id[17];
    char seen_state[8];   /* worst member state any view gives it ("alive"...) */
    int reported;         /* a status document of this node was loaded */
    int doc;              /* its document (index), -1 when none */
    /* from its own document, when reported */
    char state[12];       /* "training", ... */
    double step, steps, round, epoch, loss, test_acc, lr, samples_per_s;
    double bytes_sent, bytes_received, drops_total, view_size, time_unix_ms;
    double exchanges_ok, exchanges_failed;
    double group_size, group_member; /* its /status "group": size, member
                                      * (its index in the group, as the node
                                      * numbered it); -1 when not given */
} ds_viz_member;

typedef struct ds_viz_edge {
    int from, to;          /* member indices */
    unsigned segment;
    char outcome[12];      /* "ok", "failed", "skipped", "unknown", "answered" */
    double bytes;          /* 0 = unknown */
    double round;
    int from_answer;       /* seen only in the answerer's document */
} ds_viz_edge;

typedef struct ds_viz_doc {
    json_t *doc;           /* owned (one reference) */
    char origin[256];      /* where it came from */
    char name[64];
    double time_unix_ms;
} ds_viz_doc;

typedef struct ds_viz {
    ds_viz_doc *docs;
    size_t n_docs;
    ds_viz_member *m;
    size_t n_m;
    ds_viz_edge *e;
    size_t n_e;
    unsigned n_segments;    /* largest segment index + 1 among edges */
    int built;
    /* what to draw (set before ds_viz_build) */
    int round_set;          /* 0: the newest completed round every
                             * history holds (else the newest any holds) */
    double want_round;      /* with round_set: this round */
    int segment_set;        /* 0: every segment */
    unsigned want_segment;  /* with segment_set: only this one */
    /* what was drawn (after build) */
    int from_schedule;      /* 1: round `round` computed with topology/ from
                             * the documents' history; 0: no document has a
                             * history, edges from each one's "exchanges" */
    int grouped_round;      /* from_schedule: the round was between groups
                             * (node.group): its schedule's participants are
                             * the groups, each segment drawn between the
                             * members that handle it */
    double round;           /* the round drawn (from_schedule) */
    double rounds_min, rounds_max; /* completed rounds in the histories */
    size_t n_mismatch;      /* nodes whose reported target differs from the
                             * schedule (a bug, or a different view) */
    unsigned n_round_segments; /* segments of the round drawn (from_schedule) */
    /* traffic: heat[i * n_m + j] = payload bytes member i initiated to
     * member j over every completed round of the histories (after build) */
    double *heat;
    /* dsviz --serve's own history, once merged into the documents
     * (ds_viz_hist_merge sets it; borrowed): build reads each merged
     * node's rounds held and bytes per target from it instead of walking
     * its whole history again. NULL: from the documents. */
    const struct ds_viz_hist *hist;
} ds_viz;

/* What the live page shows besides the drawing (dsviz --serve). */
typedef struct ds_viz_live {
    int refresh_s;          /* the page reloads itself this often; 0: never */
} ds_viz_live;

/* Zero-initialise a ds_viz (= {0}) before use; ds_viz_free releases it. */
void ds_viz_free(ds_viz *v);

/* Parse one JSON text text[0..len) the way dsviz reads status documents:
 * jansson, strict RFC 8259 (invalid UTF-8, lone surrogates, \u0000,
 * duplicate keys, trailing text and numbers outside double range are
 * errors); any value at the top; a UTF-8 byte order mark skipped. On
 * success *out is the value (caller owns; json_decref). Returns 0, -EINVAL
 * (err holds "LINE:COL: what", *out NULL) or -ENOMEM. */
int ds_viz_parse_json(const char *text, size_t len, json_t **out, char *err, size_t err_len)
    __attribute__((warn_unused_result));

/* Add one status document (text[0..len), origin for messages). A document
 * for a node already loaded replaces it when it is newer. 0, -EINVAL
 * (err: "ORIGIN: why") or -ENOMEM. */
int ds_viz_add_json(ds_viz *v, const char *text, size_t len, const char *origin, char *err,
                    size_t err_len) __attribute__((warn_unused_result));

/* Load a source: a status.json path, a directory (DIR/status.json and
 * every DIR/x/status.json, sorted), or host:port by base/hostport.h with a
 * port >= 1 (GET /status, at most timeout_ms). Returns the number of
 * documents added (>= 1), or -errno with err set (-ENOENT: a directory
 * without any status.json). */
int ds_viz_load(ds_viz *v, const char *source, int timeout_ms, char *err, size_t err_len)
    __attribute__((warn_unused_result));

/* HTTP GET http://hostport/path (libcurl; plain HTTP only, no proxy, no
 * redirects) into a new buffer (*body, caller frees, NUL-terminated) of
 * *len bytes; a body of at most max bytes, timeout_ms in all (name
 * resolution included). 0, or -errno with err set: -EINVAL (not
 * host:port), -ETIMEDOUT, -EFBIG, -EPROTO (not HTTP, or a code other than
 * 200), the connect error (-ECONNREFUSED ...), -EHOSTUNREACH (no such
 * host) or -ENOMEM. */
int ds_viz_http_get(const char *hostport, const char *path, int timeout_ms, size_t max,
                    char **body, size_t *len, char *err, size_t err_len)
    __attribute__((warn_unused_result));

/* Build members and edges from the loaded documents (again after more are
 * added). 0 or -ENOMEM / -E2BIG (over DS_VIZ_MAX_MEMBERS or _EDGES). */
int ds_viz_build(ds_viz *v) __attribute__((warn_unused_result));

/* Index of the member named `name`, -1 if none (after build). */
int ds_viz_find(const ds_viz *v, const char *name);

/* The member that handles segment `segment` for group `group` (a
 * node.group name, not ""): topology/'s ds_topo_hier_owner of the group's
 * size gives the member index, and the member is the reporting node of
 * that group whose /status "group" gives that index (the node's own
 * numbering). -1 when no node of the group reported one (after build). */
int ds_viz_group_handler(const ds_viz *v, const char *group, unsigned segment);

/* Writers (after build). Return 0 or -EIO. */
int ds_viz_write_dot(const ds_viz *v, FILE *f);
/* svg: the SVG from Graphviz (its <svg> element is inlined), or NULL:
 * dsviz draws its own circle layout. */
int ds_viz_write_html(const ds_viz *v, FILE *f, const char *svg);
/* The live page of dsviz --serve: the HTML page with a round slider over
 * the histories, a segment filter (a GET form on `/`: ?round=R&segment=S),
 * auto-refresh, the node x node traffic heatmap and the membership table;
 * dsviz's own drawing. */
int ds_viz_write_live(const ds_viz *v, FILE *f, const ds_viz_live *o);

/* dsviz --serve's own round history: nodes keep their last 32 completed
 * rounds (DS_STATUS_HISTORY), the server keeps, per node name, every
 * completed round it has seen in that node's documents over its refreshes,
 * keyed by round number: the newest max_rounds of them (older ones are
 * dropped). A round seen twice is kept once, from the newer document. */
#define DS_VIZ_HISTORY_DEFAULT 1000
#define DS_VIZ_HISTORY_MAX 100000
typedef struct ds_viz_hist ds_viz_hist;
/* max_rounds 1..DS_VIZ_HISTORY_MAX. 0, -EINVAL or -ENOMEM. */
int ds_viz_hist_new(ds_viz_hist **out, unsigned max_rounds) __attribute__((warn_unused_result));
void ds_viz_hist_free(ds_viz_hist **h);
/* Merge the "history" of every document loaded in v into h, then give each
 * of those documents h's merged history for its node (newest first), so
 * ds_viz_build draws from it. Entries without a whole "round" >= 0 are
 * left out. Documents without a history and without rounds in h are left
 * as they are. Call before ds_viz_build. 0, -ENOMEM, or -E2BIG (more than
 * DS_VIZ_MAX_DOCS node names: the newcomers' documents keep their own). */
int ds_viz_hist_merge(ds_viz_hist *h, ds_viz *v) __attribute__((warn_unused_result));
/* Rounds h holds for node `name` (0 when none); *lo and *hi (may be NULL)
 * the oldest and newest. */
size_t ds_viz_hist_held(const ds_viz_hist *h, const char *name, double *lo, double *hi);

/* One GET / of dsviz --serve, without HTTP: load the n sources afresh
 * (timeout_ms each), merge them into hist (may be NULL: the documents' own
 * histories only), build with round/segment (< 0: not asked for) and write
 * the live page into a new buffer (*body, caller frees, *len bytes).
 * 0, or -ENOMEM / -E2BIG (no page). */
int ds_viz_live_page(ds_viz_hist *hist, char *const *sources, int n, int timeout_ms,
                     int refresh_s, double round, double segment, char **body, size_t *len)
    __attribute__((warn_unused_result));

/* The server of dsviz --serve: libmicrohttpd on listen ("host:port",
 * base/hostport.h; port 0: any free port), one thread; each GET / loads
 * the n sources (ds_viz_load, timeout_ms each) afresh and answers the
 * live page for ?round= and ?segment= (ds_viz_live_page), its history
 * merged into the server's own of history_rounds rounds per node
 * (ds_viz_hist); another path is 404. Sources are borrowed for the
 * server's life. 0 and *out, or -errno (said in err). */
typedef struct ds_viz_server ds_viz_server;
int ds_viz_serve_start(ds_viz_server **out, const char *listen, char *const *sources, int n,
                       int timeout_ms, int refresh_s, unsigned history_rounds, char *err,
                       size_t err_len)
    __attribute__((warn_unused_result));
/* "host:port" actually bound. */
int ds_viz_serve_addr(const ds_viz_server *s, char *buf, size_t n);
void ds_viz_serve_stop(ds_viz_server **s);
/* The server's own history (for ds_viz_hist_held; not while it serves a
 * request on its thread: read it between requests). */
const ds_viz_hist *ds_viz_serve_hist(const ds_viz_server *s);

/* dsviz's own SVG drawing (used by the HTML page without Graphviz). */
int ds_viz_write_own_svg(const ds_viz *v, FILE *f);

/* Run `dot_prog -Tsvg -o svg_path dot_path`, at most timeout_ms (killed
 * after). 0, -ENOENT (no such program), -ETIMEDOUT, or -EIO (it failed;
 * its stderr went to ours). */
int ds_viz_run_dot(const char *dot_prog, const char *dot_path, const char *svg_path,
                   int timeout_ms);

/* Read a whole file of at most max bytes into a new NUL-terminated buffer.
 * 0, -EFBIG, or -errno. */
int ds_viz_read_file(const char *path, size_t max, char **out, size_t *len)
    __attribute__((warn_unused_result));

#endif
