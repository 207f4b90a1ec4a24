/*
 * node/status/status.c: the status page and file (see status.h).
 *
 * Why a thread of its own, and why a copy. The training thread must never
 * wait for a client: publish copies the snapshot under a mutex (about
 * 100 KB, a few microseconds) and returns. The status thread takes its own
 * copy only when the generation changed, renders the JSON and the
 * Prometheus body once per generation (cached), and serves every request
 * from those buffers, so a client asking 1000 times a second costs memcpy
 * of a cached page, not a render.
 *
 * Why poll and one request per connection. A hostile client can open
 * connections and not send, send one byte a second (slowloris), send an
 * endless header, or not read the answer. Each of these is bounded here:
 * at most max_conns connections are served (the next one gets a 503 written
 * without waiting and is closed: a full server answers fast instead of
 * leaving clients in the listen backlog); the request must arrive whole
 * within request_timeout_ms counted from accept (a total, not an idle
 * timeout, so trickling bytes does not extend it) and within max_request
 * bytes (a per-slot buffer allocated at start: an attack allocates
 * nothing); the answer must be taken within write_timeout_ms. Everything
 * is non-blocking, so one slow connection never delays another. After the
 * answer the server shuts its side down and reads (and discards) what the
 * client still sends for a short while before closing: closing a socket
 * with unread input makes the kernel send a reset, which can destroy the
 * answer (a 400 for a 100 KB request line) before the client reads it.
 *
 * The file: status.file is replaced by writing PATH.tmp and renaming it
 * over PATH, by the status thread, at most once per file_interval_ms and
 * only when something new was published; destroy writes the last snapshot.
 *
 * Text from peers (member names, addresses, groups) goes into JSON and
 * Prometheus labels escaped: control characters and quotes escaped, bytes
 * that are not valid UTF-8 replaced by U+FFFD, fields read with strnlen so
 * a field the caller left unterminated cannot run past its array.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/status/status.h"

#define COMP "status"
#define LINGER_MS 1000          /* drain after the answer, then close */
#define LINGER_MAX_BYTES (1u << 20)
#define ACCEPT_BURST 64         /* accepts per wake-up */
#define BODY_MAX ((size_t)64 << 20)

/* ---- names ----------------------------------------------------------------- */

static const char *const state_names[DS_STATUS__COUNT] = {
    "joining", "training", "leaving", "done", "stopped", "failed",
};
static const char *const outcome_names[DS_XCHG__COUNT] = {
    "unknown", "ok", "failed", "skipped", "none",
};
static const char *const member_state_names[] = {"alive", "suspect", "dead", "left"};

const char *ds_status_state_name(enum ds_status_state st)
{
    return (unsigned)st < DS_STATUS__COUNT ? state_names[st] : "?";
}

const char *ds_status_outcome_name(enum ds_status_outcome o)
{
    return (unsigned)o < DS_XCHG__COUNT ? outcome_names[o] : "?";
}

const char *ds_status_member_state_name(unsigned member_state)
{
    return member_state < 4 ? member_state_names[member_state] : "?";
}

void ds_status_snapshot_init(ds_status_snapshot *s)
{
    memset(s, 0, sizeof(*s));
    s->state = DS_STATUS_JOINING;
    s->test_acc = -1;
    s->view_me = UINT32_MAX;
}

void ds_status_copy_drops(ds_status_snapshot *s, const ds_drop_counters *c)
{
    for (int r = 0; r < DS_DROP__COUNT; r++)
        s->drops[r] = c ? ds_drop_get(c, (enum ds_drop_reason)r) : 0;
}

/* ---- a growing text buffer --------------------------------------------------- */

/* Appends never fail one by one: the first allocation failure (or passing
 * BODY_MAX) sets `bad`, later appends do nothing, and the renderer returns
 * -ENOMEM once at the end. */
typedef struct sb {
    char *p;
    size_t len, cap;
    int bad;
} sb;

static int sb_reserve(sb *b, size_t more)
{
    if (b->bad)
        return -1;
    if (b->len + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *np = cap <= BODY_MAX ? realloc(b->p, cap) : NULL;
    if (!np) {
        b->bad = 1;
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static void sb_put(sb *b, const char *s, size_t n)
{
    if (sb_reserve(b, n) < 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_puts(sb *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof(tmp)) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    if (sb_reserve(b, (size_t)n) < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s[0..n), 0 if it is not one
 * (overlongs, surrogates and values past U+10FFFF are not valid). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    size_t len;
    unsigned min;
    uint32_t v;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of s[0..strnlen(s, max)), quotes included. */
static void sb_json_str(sb *b, const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strnlen(s, max);
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        if (c == '"' || c == '\\') {
            const char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            sb_printf(b, "\\u%04x", c);
            i++;
        } else {
            const size_t l = utf8_len(u + i, n - i);
            if (l == 0) {
                sb_puts(b, "\\ufffd");
                i++;
            } else {
                sb_put(b, s + i, l);
                i += l;
            }
        }
    }
    sb_put(b, "\"", 1);
}

/* A Prometheus label value (without the quotes): \\, \" and \n escaped,
 * other control characters and invalid UTF-8 replaced. */
static void sb_prom_val(sb *b, const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strnlen(s, max);
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        if (c == '"' || c == '\\') {
            const char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
            i++;
        } else if (c == '\n') {
            sb_puts(b, "\\n");
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            sb_put(b, "?", 1);
            i++;
        } else {
            const size_t l = utf8_len(u + i, n - i);
            if (l == 0) {
                sb_puts(b, "\xef\xbf\xbd");
                i++;
            } else {
                sb_put(b, s + i, l);
                i += l;
            }
        }
    }
}

/* A JSON number: finite doubles with 9 significant digits, else null. */
static void sb_json_num(sb *b, double v)
{
    if (isfinite(v))
        sb_printf(b, "%.9g", v);
    else
        sb_puts(b, "null");
}

/* ---- /status ------------------------------------------------------------------- */

#define F(s) (s), sizeof(s)

static void json_key(sb *b, const char *key, int *first)
{
    if (!*first)
        sb_put(b, ",", 1);
    *first = 0;
    sb_printf(b, "\"%s\":", key);
}

static void json_u(sb *b, const char *key, uint64_t v, int *first)
{
    json_key(b, key, first);
    sb_printf(b, "%llu", (unsigned long long)v);
}

static void json_d(sb *b, const char *key, double v, int *first)
{
    json_key(b, key, first);
    sb_json_num(b, v);
}

static void json_reasons(sb *b, const char *key, const uint64_t *v, int n, int skip0,
                         const char *(*name)(int), int *first)
{
    json_key(b, key, first);
    sb_put(b, "{", 1);
    int f = 1;
    for (int i = skip0 ? 1 : 0; i < n; i++)
        json_u(b, name(i), v[i], &f);
    sb_put(b, "}", 1);
}

static const char *wire_drop_name(int r)
{
    return ds_drop_name((enum ds_drop_reason)r);
}

static const char *tp_drop_name(int r)
{
    return ds_transport_drop_name((enum ds_transport_drop)r);
}

static const char *ms_drop_name(int r)
{
    return ds_mship_drop_name((enum ds_mship_drop)r);
}

static uint64_t drops_total(const uint64_t *v, int n, int skip0)
{
    uint64_t t = 0;
    for (int i = skip0 ? 1 : 0; i < n; i++)
        t += v[i];
    return t;
}

static void render_json(sb *b, const ds_status_snapshot *s, uint64_t now_unix_ms)
{
    int f = 1, g;
    sb_put(b, "{", 1);
    json_u(b, "schema", 1, &f);
    json_u(b, "time_unix_ms", now_unix_ms, &f);

    json_key(b, "node", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_key(b, "name", &g);
    sb_json_str(b, F(s->name));
    json_key(b, "addr", &g);
    sb_json_str(b, F(s->addr));
    json_key(b, "group", &g);
    sb_json_str(b, F(s->group));
    json_key(b, "id", &g);
    sb_printf(b, "\"%016llx\"", (unsigned long long)s->id);
    json_key(b, "state", &g);
    sb_printf(b, "\"%s\"", ds_status_state_name((enum ds_status_state)s->state));
    sb_put(b, "}", 1);

    json_key(b, "train", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_key(b, "step", &g);
    sb_printf(b, "%lld", (long long)s->step);
    json_key(b, "steps", &g);
    sb_printf(b, "%lld", (long long)s->steps);
    json_d(b, "loss", s->loss, &g);
    json_d(b, "test_acc", s->test_acc < 0 ? NAN : s->test_acc, &g);
    json_d(b, "lr", s->lr, &g);
    json_d(b, "samples_per_s", s->samples_per_s, &g);
    sb_put(b, "}", 1);

    json_u(b, "round", s->round, &f);
    json_u(b, "epoch", s->epoch, &f);

    const uint32_t n_view = s->n_view < DS_STATUS_MAX_VIEW ? s->n_view : DS_STATUS_MAX_VIEW;
    json_key(b, "view", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "size", s->view_size, &g);
    json_key(b, "me", &g);
    if (s->view_me == UINT32_MAX)
        sb_puts(b, "null");
    else
        sb_printf(b, "%u", s->view_me);
    json_key(b, "truncated", &g);
    sb_puts(b, n_view < s->view_size ? "true" : "false");
    json_key(b, "members", &g);
    sb_put(b, "[", 1);
    for (uint32_t i = 0; i < n_view; i++) {
        const ds_status_member *m = &s->view[i];
        int h = 1;
        sb_puts(b, i ? ",{" : "{");
        json_key(b, "id", &h);
        sb_printf(b, "\"%016llx\"", (unsigned long long)m->id);
        json_key(b, "name", &h);
        sb_json_str(b, F(m->name));
        json_key(b, "addr", &h);
        sb_json_str(b, F(m->addr));
        json_key(b, "group", &h);
        sb_json_str(b, F(m->group));
        json_key(b, "state", &h);
        sb_printf(b, "\"%s\"", ds_status_member_state_name(m->state));
        sb_put(b, "}", 1);
    }
    sb_puts(b, "]}");

    const uint32_t n_x =
        s->n_exchanges < DS_STATUS_MAX_SEGMENTS ? s->n_exchanges : DS_STATUS_MAX_SEGMENTS;
    json_key(b, "exchanges", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "round", s->round, &g);
    json_u(b, "segments", s->n_segments, &g);
    json_key(b, "truncated", &g);
    sb_puts(b, n_x < s->n_segments ? "true" : "false");
    json_key(b, "list", &g);
    sb_put(b, "[", 1);
    for (uint32_t i = 0; i < n_x; i++) {
        const ds_status_exchange *x = &s->exchanges[i];
        int h = 1;
        sb_puts(b, i ? ",{" : "{");
        json_u(b, "segment", x->segment, &h);
        json_u(b, "offset", x->offset, &h);
        json_u(b, "length", x->length, &h);
        json_key(b, "initiate_to", &h);
        sb_json_str(b, F(x->initiate_to));
        json_key(b, "answer_from", &h);
        sb_put(b, "[", 1);
        const uint32_t na =
            x->n_answer_from < DS_STATUS_MAX_ANSWERS ? x->n_answer_from : DS_STATUS_MAX_ANSWERS;
        for (uint32_t a = 0; a < na; a++) {
            if (a)
                sb_put(b, ",", 1);
            sb_json_str(b, F(x->answer_from[a]));
        }
        sb_put(b, "]", 1);
        json_u(b, "answer_from_count", x->n_answer_from, &h);
        json_key(b, "outcome", &h);
        sb_printf(b, "\"%s\"", ds_status_outcome_name((enum ds_status_outcome)x->outcome));
        json_u(b, "bytes", x->bytes, &h);
        sb_put(b, "}", 1);
    }
    sb_puts(b, "]}");

    const ds_net_stats *ns = &s->net;
    json_key(b, "net", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "frames_sent", ns->frames_sent, &g);
    json_u(b, "bytes_sent", ns->bytes_sent, &g);
    json_u(b, "frames_received", ns->frames_recv, &g);
    json_u(b, "bytes_received", ns->bytes_recv, &g);
    json_u(b, "handshakes_ok", ns->handshakes_ok, &g);
    json_u(b, "handshakes_failed", ns->handshakes_failed, &g);
    json_u(b, "sessions", ns->sessions, &g);
    json_u(b, "pending_frames", ns->pending_frames, &g);
    json_u(b, "send_failures", ns->send_failures, &g);
    sb_put(b, "}", 1);

    json_reasons(b, "drops", s->drops, DS_DROP__COUNT, 1, wire_drop_name, &f);
    json_u(b, "drops_total", drops_total(s->drops, DS_DROP__COUNT, 1), &f);

    const ds_gossip_stats *gs = &s->gossip;
    json_key(b, "gossip", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "rounds", gs->rounds, &g);
    json_u(b, "exchanges_ok", gs->exchanges_ok, &g);
    json_u(b, "exchanges_failed", gs->exchanges_failed, &g);
    json_u(b, "answered", gs->answered, &g);
    json_u(b, "missed", gs->missed, &g);
    json_u(b, "skipped", gs->skipped, &g);
    json_u(b, "stale_sent", gs->stale_sent, &g);
    json_u(b, "stale_received", gs->stale_received, &g);
    json_u(b, "late", gs->late, &g);
    json_u(b, "queued", gs->queued, &g);
    json_u(b, "dropped", gs->dropped, &g);
    json_u(b, "values_sent", gs->values_sent, &g);
    json_u(b, "values_received", gs->values_received, &g);
    json_u(b, "payload_bytes_sent", gs->bytes_sent, &g);
    json_u(b, "payload_bytes_received", gs->bytes_received, &g);
    json_d(b, "wait_s", (double)gs->wait_ns * 1e-9, &g);
    json_d(b, "max_round_s", (double)gs->max_wait_ns * 1e-9, &g);
    sb_put(b, "}", 1);

    json_key(b, "gossip_net", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "queued", s->gnet.queued, &g);
    json_u(b, "dropped_full", s->gnet.dropped_full, &g);
    json_u(b, "dropped_decode", s->gnet.dropped_decode, &g);
    json_u(b, "dropped_not_in_view", s->gnet.dropped_not_in_view, &g);
    json_u(b, "send_failed", s->gnet.send_failed, &g);
    sb_put(b, "}", 1);

    const ds_transport_stats *t = &ns->transport;
    json_key(b, "transport", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "msgs_sent", t->msgs_sent, &g);
    json_u(b, "bytes_sent", t->bytes_sent, &g);
    json_u(b, "msgs_received", t->msgs_recv, &g);
    json_u(b, "bytes_received", t->bytes_recv, &g);
    json_u(b, "send_timeouts", t->send_timeouts, &g);
    json_u(b, "send_errors", t->send_errors, &g);
    json_u(b, "eagain", t->eagain, &g);
    json_u(b, "stuck_ops", t->stuck_ops, &g);
    json_u(b, "stuck_bytes", t->stuck_bytes, &g);
    json_u(b, "queued_bytes", t->queued_bytes, &g);
    json_u(b, "resets", t->resets, &g);
    json_u(b, "quarantined_bytes", t->quarantined_bytes, &g);
    json_u(b, "dup_completions", t->dup_completions, &g);
    json_u(b, "pinned_bufs", t->pinned_bufs, &g);
    json_reasons(b, "drops", t->drops, DS_TP_DROP_COUNT, 0, tp_drop_name, &g);
    sb_put(b, "}", 1);

    const ds_membership_stats *ms = &s->membership;
    json_key(b, "membership", &f);
    g = 1;
    sb_put(b, "{", 1);
    json_u(b, "alive", ms->alive, &g);
    json_u(b, "suspect", ms->suspect, &g);
    json_u(b, "dead", ms->dead, &g);
    json_u(b, "left", ms->left, &g);
    json_u(b, "lhm", ms->lhm, &g);
    json_u(b, "round", ms->round, &g);
    json_u(b, "epoch", ms->epoch, &g);
    json_u(b, "msgs_sent", ms->msgs_sent, &g);
    json_u(b, "bytes_sent", ms->bytes_sent, &g);
    json_u(b, "msgs_received", ms->msgs_recv, &g);
    json_u(b, "bytes_received", ms->bytes_recv, &g);
    json_u(b, "probes", ms->probes, &g);
    json_u(b, "probes_failed", ms->probes_failed, &g);
    json_u(b, "pings_sent", ms->pings_sent, &g);
    json_u(b, "acks_sent", ms->acks_sent, &g);
    json_u(b, "ping_reqs_sent", ms->ping_reqs_sent, &g);
    json_u(b, "nacks_sent", ms->nacks_sent, &g);
    json_u(b, "nacks_received", ms->nacks_received, &g);
    json_u(b, "acks_unmatched", ms->acks_unmatched, &g);
    json_u(b, "joins_sent", ms->joins_sent, &g);
    json_u(b, "members_sent", ms->members_sent, &g);
    json_u(b, "leaves_sent", ms->leaves_sent, &g);
    json_u(b, "updates_sent", ms->updates_sent, &g);
    json_u(b, "suspicions", ms->suspicions, &g);
    json_u(b, "deaths", ms->deaths, &g);
    json_u(b, "refutations", ms->refutations, &g);
    json_u(b, "rejoins", ms->rejoins, &g);
    json_u(b, "late_changes", ms->late_changes, &g);
    json_reasons(b, "drops", ms->drops, DS_MSHIP_DROP__COUNT, 0, ms_drop_name, &g);
    json_reasons(b, "wire_drops", ms->wire, DS_DROP__COUNT, 1, wire_drop_name, &g);
    sb_put(b, "}", 1);

    sb_puts(b, "}\n");
}

static int finish(sb *b, char **out, size_t *len)
{
    if (b->bad || !b->p) {
        free(b->p);
        *out = NULL;
        *len = 0;
        return -ENOMEM;
    }
    *out = b->p;
    *len = b->len;
    return 0;
}

int ds_status_render_json(const ds_status_snapshot *s, uint64_t now_unix_ms, char **out,
                          size_t *len)
{
    sb b = {0};
    render_json(&b, s, now_unix_ms);
    return finish(&b, out, len);
}

/* ---- /metrics ------------------------------------------------------------------- */

/* One metric family: HELP and TYPE, then its samples, each with node="..."
 * first. A family's samples must be contiguous in the text format. */
typedef struct prom {
    sb *b;
    const ds_status_snapshot *s;
} prom;

static void p_family(prom *p, const char *name, const char *type, const char *help)
{
    sb_printf(p->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void p_labels_open(prom *p, const char *name)
{
    sb_puts(p->b, name);
    sb_puts(p->b, "{node=\"");
    sb_prom_val(p->b, F(p->s->name));
    sb_put(p->b, "\"", 1);
}

static void p_label(prom *p, const char *key, const char *val, size_t max)
{
    sb_printf(p->b, ",%s=\"", key);
    sb_prom_val(p->b, val, max);
    sb_put(p->b, "\"", 1);
}

static void p_value_u(prom *p, uint64_t v)
{
    sb_printf(p->b, "} %llu\n", (unsigned long long)v);
}

static void p_value_d(prom *p, double v)
{
    if (isnan(v))
        sb_puts(p->b, "} NaN\n");
    else if (isinf(v))
        sb_puts(p->b, v > 0 ? "} +Inf\n" : "} -Inf\n");
    else
        sb_printf(p->b, "} %.17g\n", v);
}

/* A family with one unlabelled (node only) sample. */
static void p_one_u(prom *p, const char *name, const char *type, const char *help, uint64_t v)
{
    p_family(p, name, type, help);
    p_labels_open(p, name);
    p_value_u(p, v);
}

static void p_one_d(prom *p, const char *name, const char *type, const char *help, double v)
{
    p_family(p, name, type, help);
    p_labels_open(p, name);
    p_value_d(p, v);
}

/* A family with one sample per value of label `key`. */
static void p_by(prom *p, const char *name, const char *type, const char *help, const char *key,
                 const char *const *vals, const uint64_t *v, int n)
{
    p_family(p, name, type, help);
    for (int i = 0; i < n; i++) {
        p_labels_open(p, name);
        p_label(p, key, vals[i], 64);
        p_value_u(p, v[i]);
    }
}

static void p_reasons(prom *p, const char *name, const char *help, const uint64_t *v, int n,
                      int skip0, const char *(*rname)(int))
{
    p_family(p, name, "counter", help);
    for (int i = skip0 ? 1 : 0; i < n; i++) {
        p_labels_open(p, name);
        p_label(p, "reason", rname(i), 64);
        p_value_u(p, v[i]);
    }
}

static void render_metrics(sb *b, const ds_status_snapshot *s)
{
    prom p = {b, s};
    char id[17];
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)s->id);

    p_family(&p, "dsnode_info", "gauge", "Constant 1, labelled with the node's identity.");
    p_labels_open(&p, "dsnode_info");
    p_label(&p, "addr", F(s->addr));
    p_label(&p, "group", F(s->group));
    p_label(&p, "id", F(id));
    p_value_u(&p, 1);

    p_family(&p, "dsnode_state", "gauge", "1 for the node's current state, 0 for the others.");
    for (int i = 0; i < DS_STATUS__COUNT; i++) {
        p_labels_open(&p, "dsnode_state");
        p_label(&p, "state", state_names[i], 16);
        p_value_u(&p, s->state == i);
    }

    p_one_d(&p, "dsnode_step", "gauge", "Optimizer steps done.", (double)s->step);
    p_one_d(&p, "dsnode_steps", "gauge", "Optimizer steps configured (train.steps).",
            (double)s->steps);
    p_one_u(&p, "dsnode_round", "gauge", "Current gossip round.", s->round);
    p_one_u(&p, "dsnode_view_epoch", "gauge", "View epoch of the current round.", s->epoch);
    p_one_u(&p, "dsnode_view_size", "gauge", "Members in the view of the current round.",
            s->view_size);
    p_one_u(&p, "dsnode_in_view", "gauge", "1 when this node is in the current view.",
            s->view_me != UINT32_MAX);
    p_one_d(&p, "dsnode_loss", "gauge", "Training loss, mean over the last log window.", s->loss);
    p_family(&p, "dsnode_test_accuracy", "gauge",
             "Test accuracy at the last evaluation (absent before the first).");
    if (s->test_acc >= 0) {
        p_labels_open(&p, "dsnode_test_accuracy");
        p_value_d(&p, s->test_acc);
    }
    p_one_d(&p, "dsnode_learning_rate", "gauge", "Current learning rate.", s->lr);
    p_one_d(&p, "dsnode_samples_per_second", "gauge", "Training throughput.", s->samples_per_s);
    p_one_u(&p, "dsnode_segments", "gauge", "Segments the model is cut into for gossip.",
            s->n_segments);

    const uint32_t n_x =
        s->n_exchanges < DS_STATUS_MAX_SEGMENTS ? s->n_exchanges : DS_STATUS_MAX_SEGMENTS;
    p_family(&p, "dsnode_segment_length", "gauge", "Floats in each listed segment.");
    for (uint32_t i = 0; i < n_x; i++) {
        char seg[16];
        snprintf(seg, sizeof(seg), "%u", s->exchanges[i].segment);
        p_labels_open(&p, "dsnode_segment_length");
        p_label(&p, "segment", F(seg));
        p_value_u(&p, s->exchanges[i].length);
    }
    p_family(&p, "dsnode_exchange", "gauge",
             "1 per segment this node initiates an exchange of this round, by peer and outcome.");
    for (uint32_t i = 0; i < n_x; i++) {
        const ds_status_exchange *x = &s->exchanges[i];
        if (!x->initiate_to[0])
            continue;
        char seg[16];
        snprintf(seg, sizeof(seg), "%u", x->segment);
        p_labels_open(&p, "dsnode_exchange");
        p_label(&p, "segment", F(seg));
        p_label(&p, "peer", F(x->initiate_to));
        p_label(&p, "outcome", ds_status_outcome_name((enum ds_status_outcome)x->outcome), 16);
        p_value_u(&p, 1);
    }

    const ds_net_stats *ns = &s->net;
    static const char *const dir[2] = {"sent", "received"};
    uint64_t v[8];
    p_one_u(&p, "dsnode_frames_sent_total", "counter", "Sealed frames handed to the transport.",
            ns->frames_sent);
    p_one_u(&p, "dsnode_frames_received_total", "counter", "Frames opened and delivered.",
            ns->frames_recv);
    p_one_u(&p, "dsnode_bytes_sent_total", "counter", "Bytes of sealed frames sent.",
            ns->bytes_sent);
    p_one_u(&p, "dsnode_bytes_received_total", "counter", "Bytes of frames received.",
            ns->bytes_recv);
    static const char *const hs[2] = {"ok", "failed"};
    v[0] = ns->handshakes_ok, v[1] = ns->handshakes_failed;
    p_by(&p, "dsnode_handshakes_total", "counter", "Handshakes by result.", "result", hs, v, 2);
    p_one_u(&p, "dsnode_sessions", "gauge", "Secure sessions up now.", ns->sessions);
    p_one_u(&p, "dsnode_pending_frames", "gauge", "Frames waiting for a session now.",
            ns->pending_frames);
    p_one_u(&p, "dsnode_send_failures_total", "counter", "Frame sends that failed.",
            ns->send_failures);
    p_reasons(&p, "dsnode_drops_total", "Frames dropped by the secured layer, by reason.",
              s->drops, DS_DROP__COUNT, 1, wire_drop_name);

    const ds_gossip_stats *gs = &s->gossip;
    p_one_u(&p, "dsnode_gossip_rounds_total", "counter", "Gossip rounds taken part in.",
            gs->rounds);
    static const char *const xo[3] = {"ok", "failed", "skipped"};
    v[0] = gs->exchanges_ok, v[1] = gs->exchanges_failed, v[2] = gs->skipped;
    p_by(&p, "dsnode_gossip_exchanges_total", "counter",
         "Exchanges this node initiated, by outcome.", "outcome", xo, v, 3);
    p_one_u(&p, "dsnode_gossip_answered_total", "counter", "Requests answered.", gs->answered);
    p_one_u(&p, "dsnode_gossip_missed_total", "counter", "Expected requests that never came.",
            gs->missed);
    v[0] = gs->stale_sent, v[1] = gs->stale_received;
    p_by(&p, "dsnode_gossip_stale_total", "counter", "STALE replies.", "direction", dir, v, 2);
    p_one_u(&p, "dsnode_gossip_late_total", "counter", "Replies for a round already over.",
            gs->late);
    p_one_u(&p, "dsnode_gossip_queued_total", "counter",
            "Messages for a future round, kept.", gs->queued);
    p_one_u(&p, "dsnode_gossip_dropped_total", "counter",
            "Gossip messages dropped (malformed, unexpected, over the queue bound).", gs->dropped);
    v[0] = gs->values_sent, v[1] = gs->values_received;
    p_by(&p, "dsnode_gossip_values_total", "counter", "Parameter values exchanged.", "direction",
         dir, v, 2);
    v[0] = gs->bytes_sent, v[1] = gs->bytes_received;
    p_by(&p, "dsnode_gossip_payload_bytes_total", "counter",
         "Gossip payload bytes (indices and values).", "direction", dir, v, 2);
    p_one_d(&p, "dsnode_gossip_wait_seconds_total", "counter",
            "Time spent waiting inside gossip exchanges.", (double)gs->wait_ns * 1e-9);
    p_one_d(&p, "dsnode_gossip_max_round_seconds", "gauge",
            "Longest single exchange phase so far.", (double)gs->max_wait_ns * 1e-9);

    static const char *const gq[3] = {"queue_full", "decode", "not_in_view"};
    v[0] = s->gnet.dropped_full, v[1] = s->gnet.dropped_decode, v[2] = s->gnet.dropped_not_in_view;
    p_by(&p, "dsnode_gossip_net_dropped_total", "counter",
         "Gossip frames dropped before the engine, by reason.", "reason", gq, v, 3);
    p_one_u(&p, "dsnode_gossip_net_queued_total", "counter", "Gossip frames queued.",
            s->gnet.queued);
    p_one_u(&p, "dsnode_gossip_net_send_failed_total", "counter", "Gossip sends that failed.",
            s->gnet.send_failed);

    const ds_transport_stats *t = &ns->transport;
    v[0] = t->msgs_sent, v[1] = t->msgs_recv;
    p_by(&p, "dsnode_transport_messages_total", "counter", "Transport messages.", "direction",
         dir, v, 2);
    v[0] = t->bytes_sent, v[1] = t->bytes_recv;
    p_by(&p, "dsnode_transport_bytes_total", "counter", "Transport message bytes.", "direction",
         dir, v, 2);
    p_one_u(&p, "dsnode_transport_send_timeouts_total", "counter", "Sends past their deadline.",
            t->send_timeouts);
    p_one_u(&p, "dsnode_transport_send_errors_total", "counter", "Sends failed by the provider.",
            t->send_errors);
    p_one_u(&p, "dsnode_transport_eagain_total", "counter", "-FI_EAGAIN from libfabric posts.",
            t->eagain);
    p_one_u(&p, "dsnode_transport_resets_total", "counter", "Endpoint resets.", t->resets);
    p_one_u(&p, "dsnode_transport_dup_completions_total", "counter",
            "Repeated completions for one operation.", t->dup_completions);
    p_one_u(&p, "dsnode_transport_stuck_ops", "gauge", "Abandoned operations pending now.",
            t->stuck_ops);
    p_one_u(&p, "dsnode_transport_stuck_bytes", "gauge", "Bytes of abandoned operations now.",
            t->stuck_bytes);
    p_one_u(&p, "dsnode_transport_queued_bytes", "gauge", "Bytes accepted, not yet released.",
            t->queued_bytes);
    p_one_u(&p, "dsnode_transport_quarantined_bytes", "gauge",
            "Bytes failed by libfabric, kept until the next reset.", t->quarantined_bytes);
    p_one_u(&p, "dsnode_transport_pinned_buffers", "gauge",
            "Receive buffers held by stalled transfers.", t->pinned_bufs);
    p_reasons(&p, "dsnode_transport_drops_total", "Transport messages dropped, by reason.",
              t->drops, DS_TP_DROP_COUNT, 0, tp_drop_name);

    const ds_membership_stats *ms = &s->membership;
    v[0] = ms->alive, v[1] = ms->suspect, v[2] = ms->dead, v[3] = ms->left;
    p_by(&p, "dsnode_members", "gauge", "Member table entries by state (self included).", "state",
         member_state_names, v, 4);
    p_one_u(&p, "dsnode_membership_local_health", "gauge",
            "Lifeguard local health multiplier (0 = healthy).", ms->lhm);
    v[0] = ms->msgs_sent, v[1] = ms->msgs_recv;
    p_by(&p, "dsnode_membership_messages_total", "counter", "Membership messages.", "direction",
         dir, v, 2);
    v[0] = ms->bytes_sent, v[1] = ms->bytes_recv;
    p_by(&p, "dsnode_membership_bytes_total", "counter", "Membership bytes.", "direction", dir, v,
         2);
    p_one_u(&p, "dsnode_membership_probes_total", "counter", "Probes started.", ms->probes);
    p_one_u(&p, "dsnode_membership_probes_failed_total", "counter", "Probes without an answer.",
            ms->probes_failed);
    p_one_u(&p, "dsnode_membership_suspicions_total", "counter",
            "Suspicions raised by this node's probes.", ms->suspicions);
    p_one_u(&p, "dsnode_membership_deaths_total", "counter",
            "Deaths declared by this node's suspicion timers.", ms->deaths);
    p_one_u(&p, "dsnode_membership_refutations_total", "counter",
            "Suspicions about this node refuted.", ms->refutations);
    p_one_u(&p, "dsnode_membership_rejoins_total", "counter",
            "Rejoins after being declared dead or left.", ms->rejoins);
    p_one_u(&p, "dsnode_membership_late_changes_total", "counter",
            "Changes that arrived after their effective round.", ms->late_changes);
    p_reasons(&p, "dsnode_membership_drops_total", "Membership frames dropped, by reason.",
              ms->drops, DS_MSHIP_DROP__COUNT, 0, ms_drop_name);
    p_reasons(&p, "dsnode_membership_wire_drops_total",
              "Membership frames refused by the wire decoder, by reason.", ms->wire,
              DS_DROP__COUNT, 1, wire_drop_name);
}

int ds_status_render_metrics(const ds_status_snapshot *s, char **out, size_t *len)
{
    sb b = {0};
    render_metrics(&b, s);
    return finish(&b, out, len);
}

/* The server's own counters, appended to the cached snapshot metrics. */
static void render_server_metrics(sb *b, const ds_status_snapshot *s, const ds_status_stats *st)
{
    prom p = {b, s};
    static const char *const codes[5] = {"200", "400", "404", "405", "503"};
    const uint64_t v[5] = {st->resp_200, st->resp_400, st->resp_404, st->resp_405,
                           st->refused_full};
    p_by(&p, "dsnode_status_responses_total", "counter",
         "Answers of this status server, by HTTP code.", "code", codes, v, 5);
    p_one_u(&p, "dsnode_status_connections_total", "counter", "Connections accepted.",
            st->accepted);
    p_one_u(&p, "dsnode_status_timeouts_total", "counter",
            "Connections dropped for being too slow.", st->timeouts);
    p_one_u(&p, "dsnode_status_file_writes_total", "counter", "status.file rewrites.",
            st->file_writes);
    p_one_u(&p, "dsnode_status_file_errors_total", "counter", "status.file write failures.",
            st->file_errors);
}

/* ---- the server ----------------------------------------------------------------- */

enum conn_phase { C_FREE = 0, C_READ, C_WRITE, C_LINGER };

typedef struct conn {
    int fd;
    enum conn_phase phase;
    uint64_t deadline;     /* ds_now_ms() */
    char *req;             /* max_request + 1 bytes, allocated at start */
    size_t req_len;
    char *out;             /* the answer (malloc) */
    size_t out_len, out_off;
    size_t drained;
    char peer[64];
} conn;

struct ds_status {
    ds_status_opts o;
    char *listen, *file, *tmp;
    int lfd;
    char addr[64];
    int wake[2];
    pthread_t thread;
    int thread_up;

    pthread_mutex_t mu;        /* guards pub, pub_gen, pub_unix_ms, stop, stats */
    ds_status_snapshot *pub;
    uint64_t pub_gen, pub_unix_ms;
    int stop;
    ds_status_stats stats;

    /* status thread only (and destroy, after the join) */
    ds_status_snapshot *cur;
    uint64_t cur_gen, cur_unix_ms;
    char *json, *metrics;
    size_t json_len, metrics_len;
    uint64_t json_gen, metrics_gen;
    uint64_t file_gen, file_last_ms;
    uint64_t accept_pause_until;
    conn *conns;
    struct pollfd *pfd;
    int *pfd_conn;
};

void ds_status_opts_default(ds_status_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_conns = 16;
    o->max_request = 8192;
    o->request_timeout_ms = 5000;
    o->write_timeout_ms = 5000;
    o->file_interval_ms = 500;
}

static uint64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#define BUMP(st, field) \
    do { \
        pthread_mutex_lock(&(st)->mu); \
        (st)->stats.field++; \
        pthread_mutex_unlock(&(st)->mu); \
    } while (0)

/* Take the published snapshot when it is newer than ours. */
static void refresh(ds_status *st)
{
    pthread_mutex_lock(&st->mu);
    if (st->pub_gen != st->cur_gen) {
        memcpy(st->cur, st->pub, sizeof(*st->cur));
        st->cur_gen = st->pub_gen;
        st->cur_unix_ms = st->pub_unix_ms;
    }
    pthread_mutex_unlock(&st->mu);
}

static int cached_json(ds_status *st)
{
    refresh(st);
    if (st->json && st->json_gen == st->cur_gen)
        return 0;
    free(st->json);
    st->json = NULL;
    int e = ds_status_render_json(st->cur, st->cur_unix_ms, &st->json, &st->json_len);
    if (e == 0)
        st->json_gen = st->cur_gen;
    return e;
}

static int cached_metrics(ds_status *st)
{
    refresh(st);
    if (st->metrics && st->metrics_gen == st->cur_gen)
        return 0;
    free(st->metrics);
    st->metrics = NULL;
    int e = ds_status_render_metrics(st->cur, &st->metrics, &st->metrics_len);
    if (e == 0)
        st->metrics_gen = st->cur_gen;
    return e;
}

/* ---- the file ---- */

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void write_file(ds_status *st)
{
    int e = cached_json(st);
    if (e == 0) {
        int fd = open(st->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            e = -errno;
        } else {
            e = write_all(fd, st->json, st->json_len);
            if (close(fd) < 0 && e == 0)
                e = -errno;
            if (e == 0 && rename(st->tmp, st->file) < 0)
                e = -errno;
            if (e < 0)
                unlink(st->tmp);
        }
    }
    st->file_last_ms = ds_now_ms();
    if (e < 0) {
        BUMP(st, file_errors);
        ds_log_rl(DS_LOG_WARN, COMP, "cannot write %s: %s", st->file, strerror(-e));
        return;
    }
    st->file_gen = st->cur_gen;
    BUMP(st, file_writes);
}

/* 1 when something new was published since the file was last written. */
static int file_dirty(ds_status *st)
{
    pthread_mutex_lock(&st->mu);
    const int d = st->pub_gen != st->file_gen;
    pthread_mutex_unlock(&st->mu);
    return d;
}

/* ---- connections ---- */

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->phase = C_FREE;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = c->req_len = c->drained = 0;
}

static const char *reason_phrase(int code)
{
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
    default: return "Internal Server Error";
    }
}

/* Build the whole answer in c->out and switch to writing it. */
static void conn_answer(ds_status *st, conn *c, int code, const char *ctype, const char *body,
                        size_t body_len, const char *body2, size_t body2_len)
{
    char head[320];
    int hn = snprintf(head, sizeof(head),
                      "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                      "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n",
                      code, reason_phrase(code), ctype, body_len + body2_len,
                      code == 405 ? "Allow: GET\r\n" : "");
    c->out = malloc((size_t)hn + body_len + body2_len);
    if (!c->out) {
        ds_log_rl(DS_LOG_WARN, COMP, "out of memory answering %s", c->peer);
        conn_close(c);
        return;
    }
    memcpy(c->out, head, (size_t)hn);
    if (body_len)
        memcpy(c->out + hn, body, body_len);
    if (body2_len)
        memcpy(c->out + hn + body_len, body2, body2_len);
    c->out_len = (size_t)hn + body_len + body2_len;
    c->out_off = 0;
    c->phase = C_WRITE;
    c->deadline = ds_now_ms() + (uint64_t)st->o.write_timeout_ms;
    pthread_mutex_lock(&st->mu);
    switch (code) {
    case 200: st->stats.resp_200++; break;
    case 400: st->stats.resp_400++; break;
    case 404: st->stats.resp_404++; break;
    case 405: st->stats.resp_405++; break;
    default: break;
    }
    pthread_mutex_unlock(&st->mu);
}

static void conn_text(ds_status *st, conn *c, int code, const char *text)
{
    conn_answer(st, c, code, "text/plain; charset=utf-8", text, strlen(text), NULL, 0);
}

static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Parse the request in c->req[0..end) (request line and headers, without
 * the blank line) and answer it. */
static void conn_handle(ds_status *st, conn *c, size_t end)
{
    const unsigned char *r = (const unsigned char *)c->req;
    size_t i = 0;
    const char *why = NULL;

    if (memchr(r, 0, end)) {
        why = "NUL byte";
        goto bad;
    }
    /* method SP target SP HTTP/1.x (CR)LF */
    const size_t m0 = i;
    while (i < end && is_tchar(r[i]))
        i++;
    const size_t mlen = i - m0;
    if (mlen == 0 || i >= end || r[i] != ' ') {
        why = "malformed method";
        goto bad;
    }
    i++;
    const size_t t0 = i;
    while (i < end && r[i] > 0x20 && r[i] < 0x7f)
        i++;
    const size_t tlen = i - t0;
    if (tlen == 0 || i >= end || r[i] != ' ' || r[t0] != '/') {
        why = "malformed target";
        goto bad;
    }
    i++;
    if (end - i < 8 || (memcmp(r + i, "HTTP/1.0", 8) && memcmp(r + i, "HTTP/1.1", 8))) {
        why = "not HTTP/1.0 or 1.1";
        goto bad;
    }
    i += 8;
    if (i < end && r[i] == '\r')
        i++;
    if (i < end && r[i] != '\n') {
        why = "junk after the version";
        goto bad;
    }
    /* Headers: each a name token, ':', a value without control characters
     * (tab allowed); obsolete line folding is refused. */
    while (i < end) {
        i++; /* the '\n' ending the previous line */
        const size_t h0 = i;
        while (i < end && r[i] != '\n')
            i++;
        size_t hend = i;
        if (hend > h0 && r[hend - 1] == '\r')
            hend--;
        if (hend == h0)
            break; /* the blank line (excluded from end, but be safe) */
        size_t k = h0;
        while (k < hend && is_tchar(r[k]))
            k++;
        if (k == h0 || k >= hend || r[k] != ':') {
            why = "malformed header";
            goto bad;
        }
        for (k++; k < hend; k++)
            if ((r[k] < 0x20 && r[k] != '\t') || r[k] == 0x7f) {
                why = "control character in a header";
                goto bad;
            }
    }

    if (mlen != 3 || memcmp(r + m0, "GET", 3)) {
        conn_text(st, c, 405, "only GET is served\n");
        return;
    }
    size_t plen = 0;
    while (plen < tlen && r[t0 + plen] != '?' && r[t0 + plen] != '#')
        plen++;
    if (plen == 7 && !memcmp(r + t0, "/status", 7)) {
        if (cached_json(st) < 0) {
            conn_close(c);
            return;
        }
        conn_answer(st, c, 200, "application/json", st->json, st->json_len, NULL, 0);
        return;
    }
    if (plen == 8 && !memcmp(r + t0, "/metrics", 8)) {
        if (cached_metrics(st) < 0) {
            conn_close(c);
            return;
        }
        ds_status_stats ss;
        pthread_mutex_lock(&st->mu);
        ss = st->stats;
        pthread_mutex_unlock(&st->mu);
        ss.resp_200++; /* this answer */
        sb extra = {0};
        render_server_metrics(&extra, st->cur, &ss);
        if (extra.bad) {
            free(extra.p);
            conn_close(c);
            return;
        }
        conn_answer(st, c, 200, "text/plain; version=0.0.4; charset=utf-8", st->metrics,
                    st->metrics_len, extra.p, extra.len);
        free(extra.p);
        return;
    }
    conn_text(st, c, 404, "not found: try /status or /metrics\n");
    return;
bad:
    ds_log_rl(DS_LOG_INFO, COMP, "bad request from %s: %s", c->peer, why);
    conn_text(st, c, 400, "bad request\n");
}

/* End of the header block in req[0..len): the offset of the blank line's
 * start, with *skip its length; or SIZE_MAX when not there yet. */
static size_t find_end(const char *req, size_t len, size_t from)
{
    size_t i = from > 3 ? from - 3 : 0;
    for (; i < len; i++) {
        if (req[i] != '\n')
            continue;
        if (i + 1 < len && req[i + 1] == '\n')
            return i;
        if (i + 2 < len && req[i + 1] == '\r' && req[i + 2] == '\n')
            return i;
    }
    return SIZE_MAX;
}

static void conn_read(ds_status *st, conn *c)
{
    for (;;) {
        const size_t room = st->o.max_request - c->req_len;
        if (room == 0)
            break;
        ssize_t n = recv(c->fd, c->req + c->req_len, room, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            conn_close(c);
            return;
        }
        if (n == 0) {
            conn_close(c); /* gone before a whole request: nobody to answer */
            return;
        }
        const size_t from = c->req_len;
        c->req_len += (size_t)n;
        const size_t end = find_end(c->req, c->req_len, from);
        if (end != SIZE_MAX) {
            conn_handle(st, c, end);
            return;
        }
    }
    ds_log_rl(DS_LOG_INFO, COMP, "bad request from %s: over %zu bytes", c->peer,
              st->o.max_request);
    conn_text(st, c, 400, "request too large\n");
}

static void conn_write(ds_status *st, conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            conn_close(c);
            return;
        }
        c->out_off += (size_t)n;
    }
    free(c->out);
    c->out = NULL;
    shutdown(c->fd, SHUT_WR);
    c->phase = C_LINGER;
    c->deadline = ds_now_ms() + LINGER_MS;
    (void)st;
}

static void conn_linger(conn *c)
{
    char junk[4096];
    for (int k = 0; k < 64; k++) {
        ssize_t n = recv(c->fd, junk, sizeof(junk), MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            conn_close(c);
            return;
        }
        c->drained += (size_t)n;
        if (c->drained > LINGER_MAX_BYTES) {
            conn_close(c);
            return;
        }
    }
}

static void peer_name(const struct sockaddr_in *a, char *buf, size_t n)
{
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    snprintf(buf, n, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
}

static void accept_some(ds_status *st)
{
    static const char busy[] =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        "Content-Length: 5\r\nConnection: close\r\nRetry-After: 1\r\n\r\nbusy\n";
    for (int k = 0; k < ACCEPT_BURST; k++) {
        struct sockaddr_in a;
        socklen_t al = sizeof(a);
        int fd = accept4(st->lfd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The listen socket stays readable: pause accepting for a
                 * moment instead of spinning. */
                ds_log_rl(DS_LOG_WARN, COMP, "accept: %s", strerror(errno));
                st->accept_pause_until = ds_now_ms() + 100;
            }
            return;
        }
        char peer[64];
        peer_name(&a, peer, sizeof(peer));
        conn *c = NULL;
        for (int i = 0; i < st->o.max_conns && !c; i++)
            if (st->conns[i].phase == C_FREE)
                c = &st->conns[i];
        if (!c) {
            /* Full: say so without waiting (the socket buffer of a fresh
             * connection takes this) and close. */
            ssize_t w = send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            (void)w;
            shutdown(fd, SHUT_WR);
            /* Read what the request already brought: closing with unread
             * input would send a reset that can destroy the 503. */
            char junk[4096];
            for (int j = 0; j < 16 && recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; j++) {
            }
            close(fd);
            BUMP(st, refused_full);
            ds_log_rl(DS_LOG_INFO, COMP, "refused %s: %d connections busy", peer,
                      st->o.max_conns);
            continue;
        }
        c->fd = fd;
        c->phase = C_READ;
        c->req_len = 0;
        c->deadline = ds_now_ms() + (uint64_t)st->o.request_timeout_ms;
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        BUMP(st, accepted);
    }
}

static void *status_main(void *arg)
{
    ds_status *st = arg;
    pthread_setname_np(pthread_self(), "ds-status");
    const int nc = st->o.max_conns;
    for (;;) {
        pthread_mutex_lock(&st->mu);
        const int stop = st->stop;
        pthread_mutex_unlock(&st->mu);
        if (stop)
            break;

        uint64_t now = ds_now_ms();
        int64_t timeout = 1000;
        int np = 0;
        st->pfd[np++] = (struct pollfd){.fd = st->wake[0], .events = POLLIN};
        if (st->lfd >= 0 && now >= st->accept_pause_until)
            st->pfd[np++] = (struct pollfd){.fd = st->lfd, .events = POLLIN};
        else if (st->lfd >= 0)
            timeout = (int64_t)(st->accept_pause_until - now);
        for (int i = 0; i < nc; i++) {
            conn *c = &st->conns[i];
            if (c->phase == C_FREE)
                continue;
            st->pfd_conn[np] = i;
            st->pfd[np++] = (struct pollfd){.fd = c->fd,
                                            .events = c->phase == C_WRITE ? POLLOUT : POLLIN};
            const int64_t left = c->deadline > now ? (int64_t)(c->deadline - now) : 0;
            if (left < timeout)
                timeout = left;
        }
        if (st->file) {
            const uint64_t due = st->file_last_ms + (uint64_t)st->o.file_interval_ms;
            const int64_t left = due > now ? (int64_t)(due - now) : 0;
            /* publish does not wake this thread (it must stay a memcpy):
             * look for news at least every max(interval, 20 ms). */
            const int64_t check = st->o.file_interval_ms > 20 ? st->o.file_interval_ms : 20;
            if (file_dirty(st)) {
                if (left < timeout)
                    timeout = left;
            } else if (check < timeout) {
                timeout = check;
            }
        }

        int n = poll(st->pfd, (nfds_t)np, (int)timeout);
        if (n < 0 && errno != EINTR) {
            ds_log_rl(DS_LOG_WARN, COMP, "poll: %s", strerror(errno));
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (n > 0 && (st->pfd[0].revents & POLLIN)) {
            char junk[64];
            while (read(st->wake[0], junk, sizeof(junk)) > 0) {
            }
        }
        int k = 1;
        if (st->lfd >= 0 && np > 1 && st->pfd[1].fd == st->lfd) {
            if (n > 0 && (st->pfd[1].revents & POLLIN))
                accept_some(st);
            k = 2;
        }
        for (; n > 0 && k < np; k++) {
            if (!st->pfd[k].revents)
                continue;
            conn *c = &st->conns[st->pfd_conn[k]];
            if (c->fd != st->pfd[k].fd)
                continue;
            if (c->phase == C_READ)
                conn_read(st, c);
            else if (c->phase == C_WRITE)
                conn_write(st, c);
            else if (c->phase == C_LINGER)
                conn_linger(c);
        }
        now = ds_now_ms();
        for (int i = 0; i < nc; i++) {
            conn *c = &st->conns[i];
            if (c->phase == C_FREE || now < c->deadline)
                continue;
            if (c->phase != C_LINGER) {
                BUMP(st, timeouts);
                ds_log_rl(DS_LOG_INFO, COMP, "dropped %s: %s took longer than %d ms", c->peer,
                          c->phase == C_READ ? "request" : "answer",
                          c->phase == C_READ ? st->o.request_timeout_ms
                                             : st->o.write_timeout_ms);
            }
            conn_close(c);
        }
        if (st->file && now >= st->file_last_ms + (uint64_t)st->o.file_interval_ms &&
            file_dirty(st))
            write_file(st);
    }
    return NULL;
}

/* ---- life cycle ---- */

static int open_listener(ds_status *st)
{
    const char *colon = strrchr(st->listen, ':');
    if (!colon || colon == st->listen || !colon[1] || strlen(colon + 1) > 5) {
        ds_error(COMP, "status.listen: expected host:port, found '%s'", st->listen);
        return -EINVAL;
    }
    char host[256], port[8];
    const size_t hl = (size_t)(colon - st->listen);
    if (hl >= sizeof(host)) {
        ds_error(COMP, "status.listen: host name too long in '%s'", st->listen);
        return -EINVAL;
    }
    memcpy(host, st->listen, hl);
    host[hl] = 0;
    snprintf(port, sizeof(port), "%s", colon + 1);
    char *endp;
    long pv = strtol(port, &endp, 10);
    if (*endp || pv < 0 || pv > 65535 || port[0] < '0' || port[0] > '9') {
        ds_error(COMP, "status.listen: expected a port 0..65535, found '%s'", port);
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0 || !ai) {
        ds_error(COMP, "status.listen: cannot resolve '%s': %s", host, gai_strerror(g));
        if (ai)
            freeaddrinfo(ai);
        return -EINVAL;
    }
    int e = 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        e = -errno;
        goto out;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
        e = -errno;
        close(fd);
        goto out;
    }
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    if (getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
        e = -errno;
        close(fd);
        goto out;
    }
    peer_name(&a, st->addr, sizeof(st->addr));
    st->lfd = fd;
out:
    freeaddrinfo(ai);
    if (e < 0)
        ds_error(COMP, "cannot serve status on %s: %s", st->listen, strerror(-e));
    return e;
}

/* The file's directory must take PATH.tmp: find out now, not at the first
 * write in the middle of training. */
static int check_file(ds_status *st)
{
    int fd = open(st->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        const int e = -errno;
        ds_error(COMP, "status.file: cannot create %s: %s", st->tmp, strerror(-e));
        return e;
    }
    close(fd);
    unlink(st->tmp);
    return 0;
}

static void status_free(ds_status *st)
{
    if (st->conns) {
        for (int i = 0; i < st->o.max_conns; i++) {
            conn_close(&st->conns[i]);
            free(st->conns[i].req);
        }
    }
    if (st->lfd >= 0)
        close(st->lfd);
    if (st->wake[0] >= 0)
        close(st->wake[0]);
    if (st->wake[1] >= 0)
        close(st->wake[1]);
    pthread_mutex_destroy(&st->mu);
    free(st->conns);
    free(st->pfd);
    free(st->pfd_conn);
    free(st->pub);
    free(st->cur);
    free(st->json);
    free(st->metrics);
    free(st->listen);
    free(st->file);
    free(st->tmp);
    free(st);
}

int ds_status_create_opts(ds_status **out, const ds_status_opts *o)
{
    *out = NULL;
    const int want_http = o->listen && o->listen[0];
    const int want_file = o->file && o->file[0];
    if (!want_http && !want_file)
        return 0;
    if (o->max_conns < 1 || o->max_conns > 4096 || o->max_request < 64 ||
        o->max_request > ((size_t)1 << 20) || o->request_timeout_ms < 1 ||
        o->write_timeout_ms < 1 || o->file_interval_ms < 0) {
        ds_error(COMP, "invalid status server options");
        return -EINVAL;
    }
    ds_status *st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->o = *o;
    st->lfd = -1;
    st->wake[0] = st->wake[1] = -1;
    pthread_mutex_init(&st->mu, NULL);
    int e = -ENOMEM;
    st->pub = malloc(sizeof(*st->pub));
    st->cur = malloc(sizeof(*st->cur));
    st->conns = calloc((size_t)o->max_conns, sizeof(*st->conns));
    st->pfd = calloc((size_t)o->max_conns + 2, sizeof(*st->pfd));
    st->pfd_conn = calloc((size_t)o->max_conns + 2, sizeof(*st->pfd_conn));
    if (!st->pub || !st->cur || !st->conns || !st->pfd || !st->pfd_conn)
        goto fail_free;
    for (int i = 0; i < o->max_conns; i++) {
        st->conns[i].fd = -1;
        if (!(st->conns[i].req = malloc(o->max_request + 1)))
            goto fail_free;
    }
    ds_status_snapshot_init(st->pub);
    st->pub_gen = 1; /* the thread starts at generation 0: it copies this */
    st->pub_unix_ms = unix_ms();
    if (want_http && !(st->listen = strdup(o->listen)))
        goto fail_free;
    if (want_file) {
        const size_t n = strlen(o->file) + 5;
        st->file = strdup(o->file);
        st->tmp = malloc(n);
        if (!st->file || !st->tmp)
            goto fail_free;
        snprintf(st->tmp, n, "%s.tmp", o->file);
        if ((e = check_file(st)) < 0)
            goto fail_free;
    }
    st->o.listen = st->listen;
    st->o.file = st->file;
    if (pipe2(st->wake, O_NONBLOCK | O_CLOEXEC) < 0) {
        e = -errno;
        goto fail_free;
    }
    if (want_http && (e = open_listener(st)) < 0)
        goto fail_free;
    if ((e = pthread_create(&st->thread, NULL, status_main, st)) != 0) {
        e = -e;
        ds_error(COMP, "cannot start the status thread: %s", strerror(-e));
        goto fail_free;
    }
    st->thread_up = 1;
    if (want_http)
        ds_info(COMP, "serving /status and /metrics on http://%s", st->addr);
    *out = st;
    return 0;

fail_free:
    status_free(st);
    return e;
}

int ds_status_create(ds_status **out, const char *listen, const char *file)
{
    ds_status_opts o;
    ds_status_opts_default(&o);
    o.listen = listen;
    o.file = file;
    return ds_status_create_opts(out, &o);
}

void ds_status_publish(ds_status *st, const ds_status_snapshot *s)
{
    if (!st || !s)
        return;
    const uint64_t t = unix_ms();
    pthread_mutex_lock(&st->mu);
    memcpy(st->pub, s, sizeof(*s));
    st->pub_gen++;
    st->pub_unix_ms = t;
    st->stats.publishes++;
    pthread_mutex_unlock(&st->mu);
}

int ds_status_addr(const ds_status *st, char *buf, size_t n)
{
    if (!st || st->lfd < 0)
        return -ENOENT;
    const int w = snprintf(buf, n, "%s", st->addr);
    return w < 0 || (size_t)w >= n ? -ENOSPC : 0;
}

void ds_status_stats_get(ds_status *st, ds_status_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!st)
        return;
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    pthread_mutex_unlock(&st->mu);
}

void ds_status_destroy(ds_status **pst)
{
    ds_status *st = pst ? *pst : NULL;
    if (!st)
        return;
    *pst = NULL;
    if (st->thread_up) {
        pthread_mutex_lock(&st->mu);
        st->stop = 1;
        pthread_mutex_unlock(&st->mu);
        const char one = 1;
        ssize_t w = write(st->wake[1], &one, 1);
        (void)w;
        pthread_join(st->thread, NULL);
    }
    /* The thread is gone: its fields are ours. The last state (done,
     * stopped) must reach the file even inside the rate limit. */
    if (st->file && file_dirty(st))
        write_file(st);
    status_free(st);
}
