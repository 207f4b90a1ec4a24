/*
 * node/status/json.c: the /status document (schema 1, docs/status.md),
 * built with jansson.
 *
 * jansson does the writing and the escaping; what is left here is the
 * document's shape and two kinds of care. Text from peers (member names,
 * addresses, groups) is read with strnlen, so a field left without a
 * terminator cannot run past its array, and bytes that are not valid
 * UTF-8 become U+FFFD first (jansson refuses invalid UTF-8 rather than
 * repairing it). Numbers: counters are JSON integers (a uint64_t past
 * INT64_MAX, which jansson's integers cannot hold, becomes a real),
 * non-finite floats are null, reals are written with 9 significant
 * digits as before.
 *
 * The counters come as metric groups in page order (metric.c): each group
 * is one object at the top, or inside an earlier group's object when it
 * names a parent (transport.drops), with an optional sum beside it
 * (drops_total).
 */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/status/internal.h"

#define REAL_DIGITS 9

size_t ds_status_utf8_len(const unsigned char *s, size_t n)
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

/* A JSON string of s[0..strnlen(s, max)), invalid UTF-8 replaced. NULL
 * when out of memory. */
static json_t *jstr(const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strnlen(s, max);
    char stack[256];
    /* Each bad byte becomes 3 bytes of U+FFFD. */
    char *buf = 3 * n + 1 <= sizeof(stack) ? stack : malloc(3 * n + 1);
    if (!buf)
        return NULL;
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n;) {
        const size_t l = ds_status_utf8_len(u + i, n - i);
        if (l == 0) {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        } else {
            memcpy(buf + o, s + i, l);
            o += l;
            i += l;
        }
    }
    json_t *j = json_stringn(buf, o);
    if (buf != stack)
        free(buf);
    return j;
}

#define F(s) (s), sizeof(s)

static json_t *ju(uint64_t v)
{
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *jd(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *jid(uint64_t id)
{
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
    return json_string(hex);
}

/* Builders fail as a whole: an allocation that fails gives NULL, adding
 * NULL fails, and the renderer sees b->bad once at the end. The *_new
 * calls take the value's reference even when they fail. */
typedef struct jb {
    int bad;
} jb;

static void put(jb *b, json_t *obj, const char *key, json_t *v)
{
    if (!obj) {
        json_decref(v);
        b->bad = 1;
    } else if (json_object_set_new(obj, key, v) < 0) {
        b->bad = 1;
    }
}

static void push(jb *b, json_t *arr, json_t *v)
{
    if (!arr) {
        json_decref(v);
        b->bad = 1;
    } else if (json_array_append_new(arr, v) < 0) {
        b->bad = 1;
    }
}

static json_t *node_obj(jb *b, const ds_status_snapshot *s)
{
    json_t *o = json_object();
    put(b, o, "name", jstr(F(s->name)));
    put(b, o, "addr", jstr(F(s->addr)));
    put(b, o, "group", jstr(F(s->group)));
    put(b, o, "id", jid(s->id));
    put(b, o, "state", json_string(ds_status_state_name((enum ds_status_state)s->state)));
    put(b, o, "version", jstr(F(s->version)));
    put(b, o, "backend", jstr(F(s->backend)));
    return o;
}

static json_t *train_obj(jb *b, const ds_status_snapshot *s)
{
    json_t *o = json_object();
    put(b, o, "step", json_integer(s->step));
    put(b, o, "steps", json_integer(s->steps));
    put(b, o, "loss", jd(s->loss));
    put(b, o, "test_acc", jd(s->test_acc < 0 ? NAN : s->test_acc));
    put(b, o, "lr", jd(s->lr));
    put(b, o, "samples_per_s", jd(s->samples_per_s));
    put(b, o, "samples", ju(s->samples));
    return o;
}

static json_t *view_obj(jb *b, const ds_status_snapshot *s)
{
    const uint32_t n_view = s->n_view < DS_STATUS_MAX_VIEW ? s->n_view : DS_STATUS_MAX_VIEW;
    json_t *o = json_object();
    put(b, o, "size", ju(s->view_size));
    put(b, o, "me", s->view_me == UINT32_MAX ? json_null() : ju(s->view_me));
    put(b, o, "truncated", json_boolean(n_view < s->view_size));
    json_t *list = json_array();
    for (uint32_t i = 0; i < n_view; i++) {
        const ds_status_member *m = &s->view[i];
        json_t *e = json_object();
        put(b, e, "id", jid(m->id));
        put(b, e, "name", jstr(F(m->name)));
        put(b, e, "addr", jstr(F(m->addr)));
        put(b, e, "group", jstr(F(m->group)));
        put(b, e, "state", json_string(ds_status_member_state_name(m->state)));
        push(b, list, e);
    }
    put(b, o, "members", list);
    return o;
}

static json_t *model_obj(jb *b, const ds_status_snapshot *s)
{
    const uint32_t n = s->n_layers < DS_STATUS_MAX_LAYERS ? s->n_layers : DS_STATUS_MAX_LAYERS;
    json_t *o = json_object();
    uint64_t params = 0;
    json_t *list = json_array();
    for (uint32_t i = 0; i < n; i++) {
        const ds_status_layer *l = &s->layers[i];
        json_t *e = json_object();
        put(b, e, "name", jstr(F(l->name)));
        put(b, e, "kind", json_string(l->k ? "conv" : "linear"));
        put(b, e, "k", ju(l->k));
        put(b, e, "in", ju(l->in));
        put(b, e, "out", ju(l->out));
        put(b, e, "offset", ju(l->offset));
        put(b, e, "length", ju(l->length));
        params += l->length;
        push(b, list, e);
    }
    put(b, o, "params", ju(params));
    put(b, o, "layers", list);
    return o;
}

static json_t *exchanges_obj(jb *b, const ds_status_snapshot *s)
{
    const uint32_t n_x =
        s->n_exchanges < DS_STATUS_MAX_SEGMENTS ? s->n_exchanges : DS_STATUS_MAX_SEGMENTS;
    json_t *o = json_object();
    put(b, o, "round", ju(s->round));
    put(b, o, "segments", ju(s->n_segments));
    put(b, o, "truncated", json_boolean(n_x < s->n_segments));
    json_t *list = json_array();
    for (uint32_t i = 0; i < n_x; i++) {
        const ds_status_exchange *x = &s->exchanges[i];
        json_t *e = json_object();
        put(b, e, "segment", ju(x->segment));
        put(b, e, "offset", ju(x->offset));
        put(b, e, "length", ju(x->length));
        put(b, e, "initiate_to", jstr(F(x->initiate_to)));
        json_t *from = json_array();
        const uint32_t na =
            x->n_answer_from < DS_STATUS_MAX_ANSWERS ? x->n_answer_from : DS_STATUS_MAX_ANSWERS;
        for (uint32_t a = 0; a < na; a++)
            push(b, from, jstr(F(x->answer_from[a])));
        put(b, e, "answer_from", from);
        put(b, e, "answer_from_count", ju(x->n_answer_from));
        put(b, e, "outcome",
            json_string(ds_status_outcome_name((enum ds_status_outcome)x->outcome)));
        put(b, e, "bytes", ju(x->bytes));
        push(b, list, e);
    }
    put(b, o, "list", list);
    return o;
}

/* The name of the view member with node id `id`, "" when none. */
static const char *view_name(const ds_status_snapshot *s, uint64_t id)
{
    const uint32_t n_view = s->n_view < DS_STATUS_MAX_VIEW ? s->n_view : DS_STATUS_MAX_VIEW;
    for (uint32_t i = 0; id && i < n_view; i++)
        if (s->view[i].id == id)
            return s->view[i].name;
    return "";
}

/* The last completed rounds, newest first. */
static json_t *history_arr(jb *b, const ds_status_snapshot *s)
{
    json_t *list = json_array();
    for (uint32_t i = 0; i < s->hist.n && i < DS_STATUS_HISTORY; i++) {
        const ds_status_round *r = ds_status_history_get(&s->hist, i);
        json_t *o = json_object();
        put(b, o, "round", ju(r->round));
        put(b, o, "epoch", ju(r->epoch));
        put(b, o, "view_size", ju(r->view_size));
        put(b, o, "me", ju(r->me));
        if (r->groups) {
            put(b, o, "groups", ju(r->groups));
            put(b, o, "group_member", ju(r->group_member));
            put(b, o, "group_size", ju(r->group_size));
        }
        put(b, o, "end_unix_ms", ju(r->end_unix_ms));
        put(b, o, "duration_s", jd((double)r->duration_ns * 1e-9));
        put(b, o, "segments", ju(r->n_segments));
        json_t *segs = json_array();
        const uint32_t nl =
            r->n_listed < DS_STATUS_HIST_SEGMENTS ? r->n_listed : DS_STATUS_HIST_SEGMENTS;
        for (uint32_t k = 0; k < nl; k++) {
            const ds_status_seg_done *d = &r->seg[k];
            json_t *e = json_object();
            put(b, e, "segment", ju(k));
            put(b, e, "target", ju(d->target));
            put(b, e, "target_id", d->target_id ? jid(d->target_id) : json_null());
            put(b, e, "peer", jstr(view_name(s, d->target_id), DS_STATUS_NAME_LEN));
            put(b, e, "outcome",
                json_string(ds_status_outcome_name((enum ds_status_outcome)d->outcome)));
            put(b, e, "bytes", ju(d->bytes));
            put(b, e, "latency_s", jd((double)d->latency_ns * 1e-9));
            put(b, e, "answered", ju(d->n_in));
            push(b, segs, e);
        }
        put(b, o, "list", segs);
        push(b, list, o);
    }
    return list;
}

/* The bytes-by-peer counters of /metrics (dsnode_gossip_peer_bytes_total)
 * and the count of completed rounds they and history were taken from. */
static json_t *traffic_obj(jb *b, const ds_status_snapshot *s)
{
    const ds_status_history *h = &s->hist;
    json_t *o = json_object();
    put(b, o, "rounds", ju(h->dur_count));
    json_t *list = json_array();
    for (uint32_t p = 0; p < h->n_peers && p < DS_STATUS_PEER_SERIES; p++) {
        json_t *e = json_object();
        put(b, e, "peer", jstr(F(h->peer_name[p])));
        put(b, e, "id", jid(h->peer_id[p]));
        put(b, e, "bytes", ju(h->peer_bytes[p]));
        push(b, list, e);
    }
    put(b, o, "peers", list);
    put(b, o, "other_bytes", ju(h->other_bytes));
    return o;
}

/* Membership's news, newest first. */
static json_t *events_arr(jb *b, const ds_status_snapshot *s)
{
    json_t *list = json_array();
    for (uint32_t i = 0; i < s->events.n && i < DS_STATUS_EVENTS; i++) {
        const ds_status_event *e = ds_status_events_get(&s->events, i);
        json_t *o = json_object();
        put(b, o, "time_unix_ms", ju(e->unix_ms));
        put(b, o, "round", ju(e->round));
        put(b, o, "event",
            json_string(ds_status_event_name((enum ds_status_event_kind)e->kind)));
        put(b, o, "member", jstr(e->member, DS_STATUS_NAME_LEN));
        put(b, o, "effective_round",
            e->effective_round == UINT64_MAX ? json_null() : ju(e->effective_round));
        push(b, list, o);
    }
    return list;
}

static json_t *schedule_obj(jb *b, const ds_status_snapshot *s)
{
    json_t *o = json_object();
    put(b, o, "topology", jstr(F(s->topology)));
    put(b, o, "mix", jstr(F(s->mix)));
    put(b, o, "seed", ju(s->seed));
    return o;
}

/* The metric groups: each an object of its JSON rows, at the top or in
 * its parent's object, with its total beside it when it has one. */
/* What the node is blocked on now; null when nothing. for_s is as of
 * time_unix_ms (the status thread restamps a shown wait's document). */
static json_t *waiting_obj(jb *b, const ds_status_snapshot *s, uint64_t now_unix_ms)
{
    const ds_status_wait *w = &s->wait;
    if (w->kind == DS_WAIT_NONE)
        return json_null();
    json_t *o = json_object();
    put(b, o, "on", json_string(ds_status_wait_name((enum ds_status_wait_kind)w->kind)));
    put(b, o, "since_unix_ms", ju(w->since_unix_ms));
    put(b, o, "for_s",
        jd(now_unix_ms > w->since_unix_ms ? (double)(now_unix_ms - w->since_unix_ms) / 1e3 : 0));
    if (w->kind == DS_WAIT_ROUND)
        put(b, o, "round", ju(w->round));
    if (w->kind == DS_WAIT_MEMBERS) {
        put(b, o, "alive", ju(w->alive));
        put(b, o, "want", ju(w->want));
    }
    put(b, o, "n_peers", ju(w->n_peers));
    json_t *list = json_array();
    const uint32_t n = w->n_peers < DS_STATUS_WAIT_PEERS ? w->n_peers : DS_STATUS_WAIT_PEERS;
    for (uint32_t i = 0; i < n; i++)
        push(b, list, jstr(F(w->peers[i])));
    put(b, o, "peers", list);
    return o;
}

static void groups(jb *b, json_t *root, const ds_status_snapshot *s)
{
    json_t *objs[DS_STATUS_MAX_GROUPS] = {0};
    const uint32_t ng = s->n_groups < DS_STATUS_MAX_GROUPS ? s->n_groups : DS_STATUS_MAX_GROUPS;
    for (uint32_t gi = 0; gi < ng; gi++) {
        const ds_metric_group *g = s->groups[gi];
        if (!g->json)
            continue;
        json_t *where = root;
        if (g->parent) {
            where = NULL;
            for (uint32_t k = 0; k < gi && !where; k++)
                if (objs[k] && s->groups[k]->json && !strcmp(s->groups[k]->json, g->parent))
                    where = objs[k];
            if (!where)
                continue; /* ds_status_add_group refuses this */
        }
        json_t *o = json_object();
        uint64_t total = 0;
        for (uint32_t i = 0; i < g->n; i++) {
            const ds_metric_desc *d = &g->desc[i];
            if (!d->json)
                continue;
            const uint64_t v = s->values[s->first[gi] + i];
            total += v;
            put(b, o, d->json, d->type == DS_METRIC_T_NS ? jd(ds_status_value_d(s, gi, i)) : ju(v));
        }
        objs[gi] = o;
        put(b, where, g->json, json_incref(o));
        json_decref(o);
        if (g->total)
            put(b, where, g->total, ju(total));
    }
}

int ds_status_render_json(const ds_status_snapshot *s, uint64_t now_unix_ms, char **out,
                          size_t *len)
{
    jb b = {0};
    *out = NULL;
    *len = 0;
    json_t *root = json_object();
    put(&b, root, "schema", json_integer(1));
    put(&b, root, "time_unix_ms", ju(now_unix_ms));
    put(&b, root, "node", node_obj(&b, s));
    put(&b, root, "train", train_obj(&b, s));
    put(&b, root, "round", ju(s->round));
    put(&b, root, "epoch", ju(s->epoch));
    put(&b, root, "view", view_obj(&b, s));
    put(&b, root, "model", model_obj(&b, s));
    put(&b, root, "exchanges", exchanges_obj(&b, s));
    put(&b, root, "schedule", schedule_obj(&b, s));
    put(&b, root, "history", history_arr(&b, s));
    put(&b, root, "events", events_arr(&b, s));
    put(&b, root, "events_total", ju(s->events.total));
    put(&b, root, "traffic", traffic_obj(&b, s));
    put(&b, root, "waiting", waiting_obj(&b, s, now_unix_ms));
    groups(&b, root, s);
    char *text = b.bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(REAL_DIGITS));
    json_decref(root);
    if (!text)
        return -ENOMEM;
    /* The document ends with a newline, like every text file. jansson's
     * buffer comes from malloc (the default allocator), so realloc is
     * allowed. */
    const size_t n = strlen(text);
    char *t = realloc(text, n + 2);
    if (!t) {
        free(text);
        return -ENOMEM;
    }
    t[n] = '\n';
    t[n + 1] = 0;
    *out = t;
    *len = n + 1;
    return 0;
}
