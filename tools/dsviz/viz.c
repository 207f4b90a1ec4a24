/*
 * tools/dsviz/viz.c: see viz.h.
 *
 * Decisions (docs/status.md, "dsviz"):
 *   - One document per node: when two sources report the same node name,
 *     the newer (time_unix_ms) wins, so a directory and the live page of
 *     the same run can be given together.
 *   - Edges are this round's exchanges as each node last published them.
 *     An exchange a -> b appears in a's document (initiate_to) and in b's
 *     (answer_from); it is drawn once, from a's side, with a's outcome and
 *     bytes. When only b reported, it is drawn dashed, labelled "answered".
 *     Nodes publish at their own pace, so edges of different nodes may be
 *     from neighbouring rounds: each node's label shows its round.
 *   - A member that some view lists but that did not report is drawn with
 *     a dashed outline; its colour says the worst state any view gives it
 *     (alive < suspect < left < dead).
 *   - Everything taken from a document is text from the network: it is
 *     escaped for DOT, SVG/HTML (entities) and never used as a path.
 *   - The parts that are not dsviz's own are libraries: jansson reads the
 *     documents (every field is checked for its type where it is used, so
 *     a document written by someone else cannot make dsviz misread it),
 *     libcurl fetches live pages, base/hostport.h decides what is a
 *     host:port.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "base/hostport.h"
#include "topology/topology.h"
#include "tools/dsviz/viz.h"

extern char **environ;

/* ---- small helpers ----------------------------------------------------------- */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Reading a document written by someone else: each accessor accepts NULL
 * and a value of the wrong type, and gives the default then. */
static const json_t *jget(const json_t *v, const char *key)
{
    return json_object_get(v, key); /* NULL unless v is an object with key */
}

static double jnum(const json_t *v, const char *key, double dflt)
{
    const json_t *x = jget(v, key);
    return json_is_number(x) ? json_number_value(x) : dflt;
}

static const char *jstr(const json_t *v, const char *key, const char *dflt)
{
    const char *s = json_string_value(jget(v, key)); /* NULL unless a string */
    return s ? s : dflt;
}

int ds_viz_read_file(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat sbuf;
    if (fstat(fd, &sbuf) < 0) {
        const int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(sbuf.st_mode)) {
        close(fd);
        return S_ISDIR(sbuf.st_mode) ? -EISDIR : -EINVAL;
    }
    if ((uint64_t)sbuf.st_size > max) {
        close(fd);
        return -EFBIG;
    }
    /* Read to EOF (the size may change under us): at most max bytes. */
    size_t cap = (size_t)sbuf.st_size + 1, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                free(buf);
                close(fd);
                return -EFBIG;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                close(fd);
                return -ENOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            const int e = -errno;
            free(buf);
            close(fd);
            return e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n > max) {
        free(buf);
        return -EFBIG;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

/* ---- documents ---------------------------------------------------------------- */

int ds_viz_parse_json(const char *text, size_t len, json_t **out, char *err, size_t err_len)
{
    *out = NULL;
    /* A byte order mark is not JSON, but editors write one. */
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) {
        text += 3;
        len -= 3;
    }
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!v) {
        if (json_error_code(&je) == json_error_out_of_memory) {
            snprintf(err, err_len, "out of memory");
            return -ENOMEM;
        }
        snprintf(err, err_len, "%d:%d: %s", je.line, je.column, je.text);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

void ds_viz_free(ds_viz *v)
{
    free(v->heat);
    v->heat = NULL;
    for (size_t i = 0; i < v->n_docs; i++)
        json_decref(v->docs[i].doc);
    free(v->docs);
    free(v->m);
    free(v->e);
    memset(v, 0, sizeof(*v));
}

int ds_viz_add_json(ds_viz *v, const char *text, size_t len, const char *origin, char *err,
                    size_t err_len)
{
    char perr[200];
    json_t *d = NULL;
    int e = ds_viz_parse_json(text, len, &d, perr, sizeof(perr));
    if (e < 0) {
        snprintf(err, err_len, "%s: not valid JSON: %s", origin, perr);
        return e;
    }
    const char *name = jstr(jget(d, "node"), "name", NULL);
    const double schema = jnum(d, "schema", -1);
    if (!name || !name[0] || schema != 1) {
        snprintf(err, err_len, "%s: not a dsnode status document (%s)", origin,
                 schema != 1 ? "schema is not 1" : "no node.name");
        json_decref(d);
        return -EINVAL;
    }
    const double t = jnum(d, "time_unix_ms", 0);
    for (size_t i = 0; i < v->n_docs; i++) {
        if (strcmp(v->docs[i].name, name))
            continue;
        if (t >= v->docs[i].time_unix_ms) {
            json_decref(v->docs[i].doc);
            v->docs[i].doc = d;
            v->docs[i].time_unix_ms = t;
            copy_str(v->docs[i].origin, sizeof(v->docs[i].origin), origin);
        } else {
            json_decref(d);
        }
        v->built = 0;
        return 0;
    }
    if (v->n_docs >= DS_VIZ_MAX_DOCS) {
        snprintf(err, err_len, "%s: more than %d documents", origin, DS_VIZ_MAX_DOCS);
        json_decref(d);
        return -EINVAL;
    }
    ds_viz_doc *nd = realloc(v->docs, (v->n_docs + 1) * sizeof(*nd));
    if (!nd) {
        snprintf(err, err_len, "%s: out of memory", origin);
        json_decref(d);
        return -ENOMEM;
    }
    v->docs = nd;
    ds_viz_doc *doc = &v->docs[v->n_docs++];
    memset(doc, 0, sizeof(*doc));
    doc->doc = d;
    doc->time_unix_ms = t;
    copy_str(doc->origin, sizeof(doc->origin), origin);
    copy_str(doc->name, sizeof(doc->name), name);
    v->built = 0;
    return 0;
}

static int load_file(ds_viz *v, const char *path, char *err, size_t err_len)
{
    char *text;
    size_t len;
    int e = ds_viz_read_file(path, DS_VIZ_MAX_FILE, &text, &len);
    if (e < 0) {
        if (e == -EFBIG)
            snprintf(err, err_len, "%s: larger than %zu bytes", path, DS_VIZ_MAX_FILE);
        else
            snprintf(err, err_len, "%s: cannot read: %s", path, strerror(-e));
        return e;
    }
    e = ds_viz_add_json(v, text, len, path, err, err_len);
    free(text);
    return e;
}

static int only_dirs(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

static int load_dir(ds_viz *v, const char *dir, char *err, size_t err_len)
{
    char path[4096];
    int added = 0, failed = 0;
    struct stat sbuf;
    snprintf(path, sizeof(path), "%s/status.json", dir);
    if (stat(path, &sbuf) == 0 && S_ISREG(sbuf.st_mode)) {
        if (load_file(v, path, err, err_len) < 0)
            failed = 1;
        else
            added++;
    }
    struct dirent **list = NULL;
    int n = scandir(dir, &list, only_dirs, alphasort);
    if (n < 0) {
        const int e = -errno;
        snprintf(err, err_len, "%s: cannot list: %s", dir, strerror(-e));
        return e;
    }
    char sub_err[512] = "";
    for (int i = 0; i < n; i++) {
        const int w = snprintf(path, sizeof(path), "%s/%s/status.json", dir, list[i]->d_name);
        if (w > 0 && (size_t)w < sizeof(path) && stat(path, &sbuf) == 0 &&
            S_ISREG(sbuf.st_mode)) {
            if (load_file(v, path, sub_err, sizeof(sub_err)) < 0) {
                if (!failed)
                    snprintf(err, err_len, "%s", sub_err);
                failed = 1;
            } else {
                added++;
            }
        }
        free(list[i]);
    }
    free(list);
    if (failed)
        return -EINVAL;
    if (!added) {
        snprintf(err, err_len, "%s: no status.json in it or in its subdirectories", dir);
        return -ENOENT;
    }
    return added;
}

/* host:port by the one parser (base/hostport.h), with a real port. */
static int is_hostport(const char *s)
{
    ds_hostport hp;
    return ds_hostport_parse(s, &hp) == 0 && hp.port >= 1;
}

int ds_viz_load(ds_viz *v, const char *source, int timeout_ms, char *err, size_t err_len)
{
    struct stat sbuf;
    if (stat(source, &sbuf) == 0) {
        if (S_ISDIR(sbuf.st_mode))
            return load_dir(v, source, err, err_len);
        int e = load_file(v, source, err, err_len);
        return e < 0 ? e : 1;
    }
    if (!is_hostport(source)) {
        snprintf(err, err_len, "%s: no such file or directory, and not host:port", source);
        return -ENOENT;
    }
    char *body;
    size_t len;
    int e = ds_viz_http_get(source, "/status", timeout_ms, DS_VIZ_MAX_FILE, &body, &len, err,
                            err_len);
    if (e < 0)
        return e;
    char origin[300];
    snprintf(origin, sizeof(origin), "http://%s/status", source);
    e = ds_viz_add_json(v, body, len, origin, err, err_len);
    free(body);
    return e < 0 ? e : 1;
}

/* ---- HTTP client ---------------------------------------------------------------- */

/* The body as it arrives: grown as needed, never past max bytes. */
struct sink {
    char *buf;
    size_t len, cap, max;
    int too_big;
};

static size_t sink_write(char *data, size_t size, size_t n, void *arg)
{
    struct sink *s = arg;
    const size_t k = size * n;
    if (k > s->max - s->len) {
        s->too_big = 1;
        return 0; /* libcurl stops the transfer: CURLE_WRITE_ERROR */
    }
    if (s->len + k + 1 > s->cap) {
        size_t nc = s->cap ? s->cap : 65536;
        while (nc < s->len + k + 1)
            nc *= 2;
        char *nb = realloc(s->buf, nc);
        if (!nb)
            return 0;
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, data, k);
    s->len += k;
    return k;
}

/* A failed transfer as -errno with its message in err. */
static int http_error(CURL *c, CURLcode rc, const struct sink *s, const char *hostport,
                      const char *cerr, char *err, size_t err_len)
{
    long os_errno = 0;
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(err, err_len, "%s: no answer in time", hostport);
        return -ETIMEDOUT;
    case CURLE_FILESIZE_EXCEEDED:
        snprintf(err, err_len, "%s: answer larger than %zu bytes", hostport, s->max);
        return -EFBIG;
    case CURLE_WRITE_ERROR:
        if (s->too_big) {
            snprintf(err, err_len, "%s: answer larger than %zu bytes", hostport, s->max);
            return -EFBIG;
        }
        snprintf(err, err_len, "%s: out of memory", hostport);
        return -ENOMEM;
    case CURLE_OUT_OF_MEMORY:
        snprintf(err, err_len, "%s: out of memory", hostport);
        return -ENOMEM;
    case CURLE_COULDNT_RESOLVE_HOST:
        snprintf(err, err_len, "%s: cannot resolve: %s", hostport, cerr);
        return -EHOSTUNREACH;
    case CURLE_COULDNT_CONNECT:
        /* The system's reason (refused, unreachable) says most. */
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &os_errno);
        if (os_errno > 0) {
            snprintf(err, err_len, "%s: %s", hostport, strerror((int)os_errno));
            return -(int)os_errno;
        }
        snprintf(err, err_len, "%s: %s", hostport, cerr);
        return -ECONNREFUSED;
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_GOT_NOTHING:
    case CURLE_UNSUPPORTED_PROTOCOL:
        snprintf(err, err_len, "%s: not an HTTP answer (%s)", hostport, cerr);
        return -EPROTO;
    default:
        snprintf(err, err_len, "%s: %s", hostport, cerr);
        return -EIO;
    }
}

int ds_viz_http_get(const char *hostport, const char *path, int timeout_ms, size_t max,
                    char **body, size_t *len, char *err, size_t err_len)
{
    *body = NULL;
    *len = 0;
    ds_hostport hp;
    char addr[DS_HOSTPORT_MAX + 1], url[DS_HOSTPORT_MAX + 600];
    if (ds_hostport_parse(hostport, &hp) < 0 || hp.port == 0 ||
        ds_hostport_format(hp.host, hp.port, addr, sizeof(addr)) < 0) {
        snprintf(err, err_len, "%s: expected host:port", hostport);
        return -EINVAL;
    }
    const int ul = snprintf(url, sizeof(url), "http://%s%s", addr, path);
    if (ul < 0 || (size_t)ul >= sizeof(url)) {
        snprintf(err, err_len, "%s: path too long", hostport);
        return -EINVAL;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        snprintf(err, err_len, "%s: out of memory", hostport);
        return -ENOMEM;
    }
    struct sink s = {.max = max};
    char cerr[CURL_ERROR_SIZE] = "";
    /* Plain HTTP to exactly this address: no proxy from the environment,
     * no redirect elsewhere; one deadline for everything, name resolution
     * included (the threaded resolver honours it without signals). */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 1));
    curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_0);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "dsviz");
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    const CURLcode rc = curl_easy_perform(c);
    if (!cerr[0])
        snprintf(cerr, sizeof(cerr), "%s", curl_easy_strerror(rc));
    int e = 0;
    long code = 0;
    if (rc != CURLE_OK) {
        e = http_error(c, rc, &s, hostport, cerr, err, err_len);
    } else if (curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK || code != 200) {
        snprintf(err, err_len, "%s: HTTP %ld for %s", hostport, code, path);
        e = -EPROTO;
    } else if (!s.buf && !(s.buf = malloc(1))) { /* an empty body */
        snprintf(err, err_len, "%s: out of memory", hostport);
        e = -ENOMEM;
    }
    curl_easy_cleanup(c);
    if (e < 0) {
        free(s.buf);
        return e;
    }
    s.buf[s.len] = '\0';
    *body = s.buf;
    *len = s.len;
    return 0;
}

/* ---- the graph -------------------------------------------------------------------- */

int ds_viz_find(const ds_viz *v, const char *name)
{
    for (size_t i = 0; i < v->n_m; i++)
        if (!strcmp(v->m[i].name, name))
            return (int)i;
    return -1;
}

static int state_rank(const char *s)
{
    if (!strcmp(s, "suspect"))
        return 1;
    if (!strcmp(s, "left"))
        return 2;
    if (!strcmp(s, "dead"))
        return 3;
    return 0;
}

/* Index of `name`, added when new; -E2BIG when full. */
static int member(ds_viz *v, const char *name, size_t *cap)
{
    int i = ds_viz_find(v, name);
    if (i >= 0)
        return i;
    if (v->n_m >= DS_VIZ_MAX_MEMBERS)
        return -E2BIG;
    if (v->n_m == *cap) {
        const size_t nc = *cap ? *cap * 2 : 64;
        ds_viz_member *nm = realloc(v->m, nc * sizeof(*nm));
        if (!nm)
            return -ENOMEM;
        v->m = nm;
        *cap = nc;
    }
    ds_viz_member *m = &v->m[v->n_m];
    memset(m, 0, sizeof(*m));
    copy_str(m->name, sizeof(m->name), name);
    copy_str(m->seen_state, sizeof(m->seen_state), "alive");
    m->doc = -1;
    m->test_acc = -1;
    return (int)v->n_m++;
}

static int edge(ds_viz *v, size_t *cap, const ds_viz_edge *e)
{
    if (v->n_e >= DS_VIZ_MAX_EDGES)
        return -E2BIG;
    if (v->n_e == *cap) {
        const size_t nc = *cap ? *cap * 2 : 256;
        ds_viz_edge *ne = realloc(v->e, nc * sizeof(*ne));
        if (!ne)
            return -ENOMEM;
        v->e = ne;
        *cap = nc;
    }
    v->e[v->n_e++] = *e;
    if (e->segment + 1 > v->n_segments)
        v->n_segments = e->segment + 1;
    return 0;
}

static int doc_of(const ds_viz *v, const char *name)
{
    for (size_t i = 0; i < v->n_docs; i++)
        if (!strcmp(v->docs[i].name, name))
            return (int)i;
    return -1;
}

static int cmp_docs(const void *a, const void *b)
{
    return strcmp(((const ds_viz_doc *)a)->name, ((const ds_viz_doc *)b)->name);
}

/* Fill the member of every reporting node from its own document. */
static int build_reporting(ds_viz *v, size_t *mcap)
{
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *root = v->docs[d].doc;
        const json_t *node = jget(root, "node");
        int i = member(v, v->docs[d].name, mcap);
        if (i < 0)
            return i;
        ds_viz_member *m = &v->m[i];
        const json_t *train = jget(root, "train");
        const json_t *net = jget(root, "net");
        const json_t *gossip = jget(root, "gossip");
        m->reported = 1;
        m->doc = (int)d;
        copy_str(m->addr, sizeof(m->addr), jstr(node, "addr", ""));
        copy_str(m->group, sizeof(m->group), jstr(node, "group", ""));
        copy_str(m->id, sizeof(m->id), jstr(node, "id", ""));
        copy_str(m->state, sizeof(m->state), jstr(node, "state", "?"));
        m->step = jnum(train, "step", 0);
        m->steps = jnum(train, "steps", 0);
        m->loss = jnum(train, "loss", NAN);
        m->test_acc = jnum(train, "test_acc", -1);
        m->lr = jnum(train, "lr", NAN);
        m->samples_per_s = jnum(train, "samples_per_s", 0);
        m->round = jnum(root, "round", 0);
        m->epoch = jnum(root, "epoch", 0);
        m->bytes_sent = jnum(net, "bytes_sent", 0);
        m->bytes_received = jnum(net, "bytes_received", 0);
        m->drops_total = jnum(root, "drops_total", 0);
        m->view_size = jnum(jget(root, "view"), "size", 0);
        m->time_unix_ms = jnum(root, "time_unix_ms", 0);
        m->exchanges_ok = jnum(gossip, "exchanges_ok", 0);
        m->exchanges_failed = jnum(gossip, "exchanges_failed", 0);
        m->group_size = jnum(jget(root, "group"), "size", -1);
        m->group_member = jnum(jget(root, "group"), "member", -1);
    }
    return 0;
}

/* Add every member some view lists; the worst state any view gives it. */
static int build_view_members(ds_viz *v, size_t *mcap)
{
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *members = jget(jget(v->docs[d].doc, "view"), "members");
        for (size_t k = 0; k < json_array_size(members); k++) {
            const json_t *mv = json_array_get(members, k);
            const char *name = jstr(mv, "name", NULL);
            if (!name || !name[0])
                continue;
            int i = member(v, name, mcap);
            if (i < 0)
                return i;
            ds_viz_member *m = &v->m[i];
            if (!m->reported) {
                if (!m->addr[0])
                    copy_str(m->addr, sizeof(m->addr), jstr(mv, "addr", ""));
                if (!m->group[0])
                    copy_str(m->group, sizeof(m->group), jstr(mv, "group", ""));
                if (!m->id[0])
                    copy_str(m->id, sizeof(m->id), jstr(mv, "id", ""));
            }
            const char *st = jstr(mv, "state", "alive");
            if (state_rank(st) > state_rank(m->seen_state))
                copy_str(m->seen_state, sizeof(m->seen_state), st);
        }
    }

    return 0;
}

/* Edges: initiator -> target per segment, from the initiator's document;
 * from the answerer's only when the initiator did not report. */
static int build_edges(ds_viz *v, size_t *mcap)
{
    size_t ecap = 0;
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *root = v->docs[d].doc;
        const json_t *list = jget(jget(root, "exchanges"), "list");
        const int self = ds_viz_find(v, v->docs[d].name);
        const double round = jnum(jget(root, "exchanges"), "round", jnum(root, "round", 0));
        for (size_t k = 0; k < json_array_size(list); k++) {
            const json_t *x = json_array_get(list, k);
            const double segd = jnum(x, "segment", -1);
            if (!(segd >= 0 && segd < 1e6))
                continue;
            ds_viz_edge e;
            memset(&e, 0, sizeof(e));
            e.segment = (unsigned)segd;
            e.round = round;
            const char *to = jstr(x, "initiate_to", "");
            if (to[0]) {
                int t = member(v, to, mcap);
                if (t < 0)
                    return t;
                e.from = self;
                e.to = t;
                copy_str(e.outcome, sizeof(e.outcome), jstr(x, "outcome", "unknown"));
                e.bytes = jnum(x, "bytes", 0);
                int r = edge(v, &ecap, &e);
                if (r < 0)
                    return r;
            }
            const json_t *ans = jget(x, "answer_from");
            for (size_t a = 0; a < json_array_size(ans); a++) {
                const char *from = json_string_value(json_array_get(ans, a));
                if (!from)
                    continue;
                if (!from[0] || doc_of(v, from) >= 0)
                    continue;
                int f = member(v, from, mcap);
                if (f < 0)
                    return f;
                e.from = f;
                e.to = self;
                e.bytes = 0;
                e.from_answer = 1;
                copy_str(e.outcome, sizeof(e.outcome), "answered");
                int r = edge(v, &ecap, &e);
                if (r < 0)
                    return r;
            }
        }
    }
    return 0;
}

static const struct hist_node *merged_of(const ds_viz *v, size_t d);

/* The history entry of round `round` in document d, NULL when none. */
static const json_t *hist_entry(const json_t *root, double round)
{
    const json_t *h = jget(root, "history");
    for (size_t i = 0; i < json_array_size(h); i++) {
        const json_t *e = json_array_get(h, i);
        if (jnum(e, "round", -1) == round)
            return e;
    }
    return NULL;
}

/* The round to draw: the one asked for, else the newest completed round
 * every reporting node with a history holds, else the newest any holds.
 * -1 when no document has a history. */
static double pick_round(ds_viz *v)
{
    double newest = -1, common = -1;
    int any = 0;
    v->rounds_min = -1;
    v->rounds_max = -1;
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *h = jget(v->docs[d].doc, "history");
        if (!json_array_size(h))
            continue;
        double lo = -1, hi = -1;
        /* merged by the server: valid rounds, newest first */
        const size_t nh = merged_of(v, d) ? json_array_size(h) : 0;
        if (nh) {
            hi = jnum(json_array_get(h, 0), "round", -1);
            lo = jnum(json_array_get(h, nh - 1), "round", -1);
        }
        for (size_t i = 0; !nh && i < json_array_size(h); i++) {
            const double r = jnum(json_array_get(h, i), "round", -1);
            if (r < 0)
                continue;
            if (lo < 0 || r < lo)
                lo = r;
            if (r > hi)
                hi = r;
        }
        if (hi < 0)
            continue;
        if (v->rounds_min < 0 || lo < v->rounds_min)
            v->rounds_min = lo;
        if (hi > v->rounds_max)
            v->rounds_max = hi;
        newest = hi > newest ? hi : newest;
        common = !any ? hi : (hi < common ? hi : common);
        any = 1;
    }
    if (!any)
        return -1;
    if (v->round_set)
        return v->want_round;
    /* A node DS_VIZ_STALE_ROUNDS or more behind the newest (gone, or its
     * file left over) does not hold the picture back: a node's own
     * history (32 rounds) would not reach back to its rounds either, and
     * dsviz --serve's longer one should not change the round shown. */
    if (newest - common >= DS_VIZ_STALE_ROUNDS)
        return newest;
    /* The common newest round, when every history still holds it. */
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *h = jget(v->docs[d].doc, "history");
        if (json_array_size(h) && !hist_entry(v->docs[d].doc, common))
            return newest;
    }
    return common;
}

/* Member index of view index `idx` of round R's view (epoch, G): a node
 * whose history says it was `me`, a target id some node reported, or
 * the current view of a document at the same epoch and size. -1: not
 * known. */
static int view_index_member(ds_viz *v, double R, double epoch, double G, unsigned idx,
                             size_t *mcap)
{
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *e = hist_entry(v->docs[d].doc, R);
        if (e && jnum(e, "me", -1) == idx)
            return ds_viz_find(v, v->docs[d].name);
    }
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *e = hist_entry(v->docs[d].doc, R);
        const json_t *list = jget(e, "list");
        for (size_t k = 0; k < json_array_size(list); k++) {
            const json_t *x = json_array_get(list, k);
            const char *id = jstr(x, "target_id", NULL);
            if (!id || jnum(x, "target", -1) != idx)
                continue;
            for (size_t i = 0; i < v->n_m; i++)
                if (!strcmp(v->m[i].id, id))
                    return (int)i;
        }
    }
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *root = v->docs[d].doc;
        const json_t *view = jget(root, "view");
        const json_t *members = jget(view, "members");
        if (jnum(root, "epoch", -1) != epoch || jnum(view, "size", -1) != G ||
            idx >= json_array_size(members))
            continue;
        const char *name = jstr(json_array_get(members, idx), "name", "");
        if (name[0])
            return member(v, name, mcap);
    }
    return -1;
}

/* A round between groups (its history entries carry "groups"): the
 * member of group g that handles segment s in round R. A reporting node
 * whose entry for R says it was in g (me) as the member that owns s
 * (ds_topo_hier_owner over its group_size, the rule gossip routes by);
 * else the target_id an initiator reported for target g and segment s.
 * -1 when neither is known. */
static int group_handler_member(const ds_viz *v, double R, unsigned g, unsigned s)
{
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *e = hist_entry(v->docs[d].doc, R);
        const double size = jnum(e, "group_size", 0);
        uint32_t owner;
        if (!e || jnum(e, "me", -1) != g || !(size >= 1 && size <= UINT32_MAX) ||
            ds_topo_hier_owner(s, (uint32_t)size, &owner) < 0 ||
            jnum(e, "group_member", -1) != owner)
            continue;
        const int i = ds_viz_find(v, v->docs[d].name);
        if (i >= 0)
            return i;
    }
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *x = json_array_get(jget(hist_entry(v->docs[d].doc, R), "list"), s);
        const char *id = jstr(x, "target_id", NULL);
        if (!id || jnum(x, "target", -1) != g)
            continue;
        for (size_t i = 0; i < v->n_m; i++)
            if (!strcmp(v->m[i].id, id))
                return (int)i;
    }
    return -1;
}

/* Round R's exchanges, computed: the schedule is a pure function of
 * (topology, seed, epoch, round, segment, view size), so every pair is
 * drawn, and each initiator's reported outcome and bytes laid over it. */
static int build_schedule_edges(ds_viz *v, double R, size_t *mcap)
{
    const json_t *e0 = NULL, *sched = NULL;
    for (size_t d = 0; d < v->n_docs && !e0; d++)
        if ((e0 = hist_entry(v->docs[d].doc, R)))
            sched = jget(v->docs[d].doc, "schedule");
    if (!e0)
        return 0; /* no node holds that round: nothing to draw */
    enum ds_topo_kind kind;
    if (ds_topo_parse(jstr(sched, "topology", ""), &kind) < 0 || !ds_topo_gossips(kind))
        return 0;
    const double epoch = jnum(e0, "epoch", 0), G = jnum(e0, "view_size", 0);
    const double seed = jnum(sched, "seed", 0);
    if (!(G >= 2 && G <= DS_VIZ_MAX_MEMBERS))
        return 0;
    unsigned nseg = 0;
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *e = hist_entry(v->docs[d].doc, R);
        const unsigned n = (unsigned)json_array_size(jget(e, "list"));
        nseg = n > nseg ? n : nseg;
    }
    v->n_round_segments = nseg;
    const uint32_t g = (uint32_t)G;
    uint32_t *perm = malloc(g * sizeof(*perm));
    int *who = malloc(g * sizeof(*who));
    if (!perm || !who) {
        free(perm);
        free(who);
        return -ENOMEM;
    }
    /* Between groups the participants are groups: who[] is then, per
     * segment, the member of each group that handles it. */
    const int grouped = jnum(e0, "groups", 0) > 0;
    v->grouped_round = grouped;
    /* Two groups, pairwise mix: one exchange per segment (topology.h,
     * ds_topo_pair_initiator). A document without "mix" predates the
     * rule: both directions. */
    const int pairs = grouped && g == 2 && !strcmp(jstr(sched, "mix", ""), "pairwise");
    int rc = 0;
    for (uint32_t i = 0; i < g && rc == 0 && !grouped; i++)
        if ((who[i] = view_index_member(v, R, epoch, G, i, mcap)) == -E2BIG ||
            who[i] == -ENOMEM)
            rc = who[i];
    size_t ecap = 0;
    for (unsigned s = 0; s < nseg && rc == 0; s++) {
        if (v->segment_set && s != v->want_segment)
            continue;
        const ds_topo_key key = {.seed = (uint64_t)seed, .epoch = (uint64_t)epoch,
                                 .round = (uint64_t)R, .segment = s};
        if (ds_topo_targets(kind, &key, g, perm) < 0)
            break;
        for (uint32_t i = 0; i < g && grouped; i++)
            who[i] = group_handler_member(v, R, i, s);
        for (uint32_t a = 0; a < g && rc == 0; a++) {
            if (perm[a] == a || who[a] < 0 || who[perm[a]] < 0 ||
                (pairs && ds_topo_pair_initiator(&key) != (int)a))
                continue;
            ds_viz_edge ed;
            memset(&ed, 0, sizeof(ed));
            ed.from = who[a];
            ed.to = who[perm[a]];
            ed.segment = s;
            ed.round = R;
            copy_str(ed.outcome, sizeof(ed.outcome), "unreported");
            const ds_viz_member *m = &v->m[who[a]];
            const json_t *e = m->doc >= 0 ? hist_entry(v->docs[m->doc].doc, R) : NULL;
            const json_t *x = json_array_get(jget(e, "list"), s);
            if (x) {
                copy_str(ed.outcome, sizeof(ed.outcome), jstr(x, "outcome", "unknown"));
                ed.bytes = jnum(x, "bytes", 0);
                if (jnum(x, "target", -1) != perm[a])
                    v->n_mismatch++;
            }
            rc = edge(v, &ecap, &ed);
        }
    }
    free(perm);
    free(who);
    return rc;
}

static void merged_heat(ds_viz *v, const struct hist_node *hn, size_t from);

/* The traffic matrix from every reporting node's history: bytes it
 * initiated to each target (named by target_id). */
static int build_heat(ds_viz *v)
{
    free(v->heat);
    v->heat = calloc(v->n_m ? v->n_m * v->n_m : 1, sizeof(*v->heat));
    if (!v->heat)
        return -ENOMEM;
    for (size_t d = 0; d < v->n_docs; d++) {
        const int from = ds_viz_find(v, v->docs[d].name);
        const json_t *h = jget(v->docs[d].doc, "history");
        const struct hist_node *hn = merged_of(v, d);
        if (hn && from >= 0) {
            merged_heat(v, hn, (size_t)from);
            continue;
        }
        for (size_t i = 0; from >= 0 && i < json_array_size(h); i++) {
            const json_t *list = jget(json_array_get(h, i), "list");
            for (size_t k = 0; k < json_array_size(list); k++) {
                const json_t *x = json_array_get(list, k);
                const char *id = jstr(x, "target_id", NULL);
                if (!id)
                    continue;
                for (size_t t = 0; t < v->n_m; t++)
                    if (!strcmp(v->m[t].id, id)) {
                        v->heat[(size_t)from * v->n_m + t] += jnum(x, "bytes", 0);
                        break;
                    }
            }
        }
    }
    return 0;
}

int ds_viz_build(ds_viz *v)
{
    size_t mcap = 0;
    free(v->m);
    free(v->e);
    v->m = NULL;
    v->e = NULL;
    v->n_m = v->n_e = 0;
    v->n_segments = 0;
    v->n_mismatch = 0;
    v->from_schedule = 0;
    v->grouped_round = 0;
    /* Sorted by name: the output does not depend on the order of sources. */
    if (v->n_docs > 1)
        qsort(v->docs, v->n_docs, sizeof(*v->docs), cmp_docs);

    /* Reporting nodes first, then every view member, then the edges. */
    int e = build_reporting(v, &mcap);
    if (e == 0)
        e = build_view_members(v, &mcap);
    v->n_round_segments = 0;
    if (e == 0) {
        v->round = pick_round(v);
        if (v->round >= 0) {
            v->from_schedule = 1;
            e = build_schedule_edges(v, v->round, &mcap);
        } else {
            e = build_edges(v, &mcap);
        }
    }
    if (e == 0)
        e = build_heat(v);
    if (e < 0)
        return e;
    v->built = 1;
    return 0;
}

/* ---- text output helpers ----------------------------------------------------------- */

/* Twelve colours that stay apart on white (segment s uses s mod 12). */
static const char *const palette[12] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a",
};

static const char *seg_color(unsigned s)
{
    return palette[s % 12];
}

static const char *fill_for(const ds_viz_member *m)
{
    if (!m->reported) {
        if (!strcmp(m->seen_state, "dead"))
            return "#f4b6b6";
        if (!strcmp(m->seen_state, "suspect"))
            return "#fde0b0";
        return "#ffffff";
    }
    if (!strcmp(m->state, "training"))
        return "#d8f0d2";
    if (!strcmp(m->state, "joining"))
        return "#fff5c2";
    if (!strcmp(m->state, "leaving"))
        return "#d6e6f7";
    if (!strcmp(m->state, "done") || !strcmp(m->state, "paused"))
        return "#e6e6e6";
    return "#f4b6b6"; /* stopped, failed, unknown */
}

/* "1.2 MB" etc. */
static void human_bytes(double b, char *buf, size_t n)
{
    static const char *const unit[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (b >= 1000 && u < 5) {
        b /= 1000;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

/* Text for a DOT double-quoted string: \ and " escaped, newline as \n
 * (a DOT line break), other control characters dropped. */
static void dot_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c >= 0x20 && c != 0x7f)
            fputc(c, f);
    }
}

/* Text for XML/HTML content or attributes. */
static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default:
            if (c >= 0x20 && c != 0x7f)
                fputc(c, f);
            else if (c == '\n' || c == '\t')
                fputc(' ', f);
        }
    }
}

static void member_label(const ds_viz_member *m, char *buf, size_t n)
{
    char sent[32], recv[32];
    if (!m->reported) {
        snprintf(buf, n, "%s\n%s (no status)", m->name, m->seen_state);
        return;
    }
    human_bytes(m->bytes_sent, sent, sizeof(sent));
    human_bytes(m->bytes_received, recv, sizeof(recv));
    char acc[32];
    if (m->test_acc >= 0)
        snprintf(acc, sizeof(acc), "%.3f", m->test_acc);
    else
        snprintf(acc, sizeof(acc), "-");
    snprintf(buf, n, "%s\n%s step %.0f/%.0f round %.0f\nloss %.4g acc %s\nsent %s recv %s%s%s",
             m->name, m->state, m->step, m->steps, m->round, m->loss, acc, sent, recv,
             strcmp(m->seen_state, "alive") ? "\nseen " : "",
             strcmp(m->seen_state, "alive") ? m->seen_state : "");
}

static void edge_label(const ds_viz_edge *e, char *buf, size_t n)
{
    char b[32] = "";
    if (e->bytes > 0)
        human_bytes(e->bytes, b, sizeof(b));
    if (b[0] && !strcmp(e->outcome, "ok"))
        snprintf(buf, n, "s%u %s", e->segment, b);
    else if (b[0])
        snprintf(buf, n, "s%u %s %s", e->segment, e->outcome, b);
    else
        snprintf(buf, n, "s%u %s", e->segment, e->outcome);
}

static int edge_dashed(const ds_viz_edge *e)
{
    return e->from_answer || strcmp(e->outcome, "ok");
}

/* ---- DOT ----------------------------------------------------------------------------- */

static void dot_node(FILE *f, const ds_viz *v, size_t i, const char *indent)
{
    const ds_viz_member *m = &v->m[i];
    char label[512];
    member_label(m, label, sizeof(label));
    fprintf(f, "%sm%zu [label=\"", indent, i);
    dot_text(f, label);
    fprintf(f, "\", fillcolor=\"%s\"", fill_for(m));
    if (!m->reported)
        fputs(", style=\"rounded,filled,dashed\"", f);
    if (!strcmp(m->seen_state, "dead"))
        fputs(", color=\"#b00000\", penwidth=2", f);
    else if (!strcmp(m->seen_state, "suspect"))
        fputs(", color=\"#e08000\", penwidth=2", f);
    fputs(", tooltip=\"", f);
    dot_text(f, m->name);
    if (m->addr[0]) {
        fputs(" at ", f);
        dot_text(f, m->addr);
    }
    fputs("\"];\n", f);
}

/* Member i's cluster (its group's, numbered in order of first appearance
 * as ds_viz_write_dot writes them), -1 for a member without a group. */
static int cluster_of(const ds_viz *v, size_t i)
{
    if (!v->m[i].group[0])
        return -1;
    int cl = 0;
    for (size_t j = 0; j < i; j++) {
        if (!v->m[j].group[0])
            continue;
        size_t k = 0;
        while (k < j && strcmp(v->m[k].group, v->m[j].group))
            k++;
        if (k < j)
            continue; /* not its group's first member */
        if (!strcmp(v->m[j].group, v->m[i].group))
            return cl;
        cl++;
    }
    return cl;
}

/* The edges of one ordered pair of clusters (groups), for the compact
 * drawings of a round between groups. */
struct group_edge {
    int from, to;   /* the first edge's members */
    int ca, cb;     /* their clusters (-1: a member without a group) */
    int n, bad;     /* edges; some did not succeed */
    double bytes;   /* reported by their initiators */
    char segs[128]; /* "s0,s2" */
    char tip[1024]; /* "s0 n1 -> n3 ok; ..." */
};

/* Edge k and every later edge not yet done between the same two clusters
 * (edge k alone when its initiator has no group) into *g; marks them
 * done. */
static void group_edge_collect(const ds_viz *v, char *done, size_t k, struct group_edge *g)
{
    memset(g, 0, sizeof(*g));
    g->from = v->e[k].from;
    g->to = v->e[k].to;
    g->ca = cluster_of(v, (size_t)g->from);
    g->cb = cluster_of(v, (size_t)g->to);
    size_t sl = 0, tl = 0;
    for (size_t j = k; j < v->n_e; j++) {
        const ds_viz_edge *x = &v->e[j];
        if (done[j] || cluster_of(v, (size_t)x->from) != g->ca ||
            cluster_of(v, (size_t)x->to) != g->cb || (g->ca < 0 && j != k))
            continue;
        done[j] = 1;
        g->n++;
        g->bytes += x->bytes;
        g->bad |= edge_dashed(x);
        if (sl < sizeof(g->segs))
            sl += (size_t)snprintf(g->segs + sl, sizeof(g->segs) - sl, "%ss%u",
                                   g->n > 1 ? "," : "", x->segment);
        if (tl < sizeof(g->tip))
            tl += (size_t)snprintf(g->tip + tl, sizeof(g->tip) - tl, "%ss%u %s \u2192 %s %s",
                                   g->n > 1 ? "; " : "", x->segment, v->m[x->from].name,
                                   v->m[x->to].name, x->outcome);
    }
}

static void group_edge_label(const struct group_edge *g, char *label, size_t n)
{
    if (g->bytes > 0) {
        char b[32];
        human_bytes(g->bytes, b, sizeof(b));
        snprintf(label, n, "%s %s", g->segs, b);
    } else {
        snprintf(label, n, "%s", g->segs);
    }
}

/* Members of member i's group (1 without a group). */
static size_t group_size_of(const ds_viz *v, size_t i)
{
    if (!v->m[i].group[0])
        return 1;
    size_t size = 0;
    for (size_t j = 0; j < v->n_m; j++)
        size += !strcmp(v->m[j].group, v->m[i].group);
    return size;
}

/* A round between groups, drawn compactly (no --segment): one edge per
 * ordered pair of groups, between the two group boxes (compound edges),
 * labelled with its segments and the bytes their initiators reported;
 * the tooltip says which member handled which segment. Edges of members
 * without a group are drawn as usual. */
static void dot_group_edges(const ds_viz *v, FILE *f)
{
    char *done = calloc(v->n_e ? v->n_e : 1, 1);
    if (!done)
        return;
    for (size_t k = 0; k < v->n_e; k++) {
        if (done[k])
            continue;
        struct group_edge g;
        group_edge_collect(v, done, k, &g);
        char label[192];
        group_edge_label(&g, label, sizeof(label));
        fprintf(f, "  m%d -> m%d [color=\"#444444\", penwidth=%d, label=\"", g.from, g.to,
                g.n > 1 ? 2 : 1);
        dot_text(f, label);
        fputs("\"", f);
        if (g.ca >= 0)
            fprintf(f, ", ltail=cluster_%d", g.ca);
        if (g.cb >= 0)
            fprintf(f, ", lhead=cluster_%d", g.cb);
        if (g.bad)
            fputs(", style=dashed", f);
        fputs(", tooltip=\"", f);
        dot_text(f, g.tip);
        fputs("\"];\n", f);
    }
    free(done);
}

int ds_viz_write_dot(const ds_viz *v, FILE *f)
{
    const int compact = v->from_schedule && v->grouped_round && !v->segment_set;
    fputs("digraph dsviz {\n", f);
    char what[96] = "";
    if (v->from_schedule)
        snprintf(what, sizeof(what), " of round %.0f (from the schedule)", v->round);
    fprintf(f, "  graph [fontname=\"Helvetica\", labelloc=t, label=\"dsviz: %zu members, %zu "
               "reporting, %zu exchanges%s%s\", rankdir=LR, nodesep=0.4, "
               "ranksep=1.0%s];\n",
            v->n_m, v->n_docs, v->n_e, what,
            compact ? " between groups (an edge: the segments one group sends another)"
                    : " (edge colour = segment)",
            compact ? ", compound=true" : "");
    fputs("  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
          "fontsize=10];\n",
          f);
    fputs("  edge [fontname=\"Helvetica\", fontsize=9, arrowsize=0.7];\n", f);

    /* Groups as clusters, in order of first appearance; "" = no cluster. */
    char *done = calloc(v->n_m ? v->n_m : 1, 1);
    if (!done)
        return -EIO;
    int cl = 0;
    for (size_t i = 0; i < v->n_m; i++) {
        if (done[i] || !v->m[i].group[0])
            continue;
        fprintf(f, "  subgraph cluster_%d {\n    label=\"group ", cl++);
        dot_text(f, v->m[i].group);
        if (compact && group_size_of(v, i) > 1)
            fprintf(f, "\\nall-reduce inside, every step (%zu members)", group_size_of(v, i));
        fputs("\"; style=\"rounded,dashed\"; color=\"#888888\";\n", f);
        for (size_t j = i; j < v->n_m; j++) {
            if (done[j] || strcmp(v->m[j].group, v->m[i].group))
                continue;
            done[j] = 1;
            dot_node(f, v, j, "    ");
        }
        fputs("  }\n", f);
    }
    for (size_t i = 0; i < v->n_m; i++)
        if (!done[i])
            dot_node(f, v, i, "  ");
    free(done);

    if (compact) {
        dot_group_edges(v, f);
        fputs("}\n", f);
        return ferror(f) ? -EIO : 0;
    }
    for (size_t k = 0; k < v->n_e; k++) {
        const ds_viz_edge *e = &v->e[k];
        char label[96];
        edge_label(e, label, sizeof(label));
        fprintf(f, "  m%d -> m%d [color=\"%s\", fontcolor=\"%s\", label=\"", e->from, e->to,
                seg_color(e->segment), seg_color(e->segment));
        dot_text(f, label);
        fputs("\"", f);
        if (edge_dashed(e))
            fputs(", style=dashed", f);
        /* Graphviz's own tooltip would be the DOT ids (m0->m1). */
        fputs(", tooltip=\"", f);
        dot_text(f, v->m[e->from].name);
        fputs(" \u2192 ", f);
        dot_text(f, v->m[e->to].name);
        fputs(": ", f);
        dot_text(f, label);
        fputs("\"];\n", f);
    }
    fputs("}\n", f);
    return ferror(f) ? -EIO : 0;
}

/* ---- own SVG (no Graphviz) ------------------------------------------------------------ */

/* Member i's box (120 x 44) centred on (x, y). */
static void svg_member(FILE *f, const ds_viz *v, size_t i, double x, double y)
{
    const ds_viz_member *m = &v->m[i];
    const char *stroke = !strcmp(m->seen_state, "dead")      ? "#b00000"
                         : !strcmp(m->seen_state, "suspect") ? "#e08000"
                                                             : "#444444";
    fprintf(f, "<g><title>");
    xml_text(f, m->name);
    if (m->addr[0]) {
        fputs(" at ", f);
        xml_text(f, m->addr);
    }
    fprintf(f, "</title><rect x=\"%.1f\" y=\"%.1f\" width=\"120\" height=\"44\" rx=\"8\" "
               "fill=\"%s\" stroke=\"%s\"%s/>\n",
            x - 60, y - 22, fill_for(m), stroke, m->reported ? "" : " stroke-dasharray=\"4,3\"");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-weight=\"bold\">", x,
            y - 6);
    xml_text(f, m->name);
    if (m->group[0]) {
        fputs(" [", f);
        xml_text(f, m->group);
        fputs("]", f);
    }
    fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
               "font-size=\"9\">",
            x, y + 10);
    if (m->reported)
        fprintf(f, "%s r%.0f s%.0f", strlen(m->state) < 12 ? m->state : "?", m->round, m->step);
    else
        xml_text(f, m->seen_state);
    fputs("</text></g>\n", f);
}

/* A group's box in dsviz's own drawing: GBOX_W wide, a header of two
 * lines, then its members' boxes (44 high) every 50. */
#define GBOX_W 180.0
#define GBOX_HEAD 32.0

static double gbox_h(size_t members)
{
    return GBOX_HEAD + 50.0 * (double)members + 8;
}

/* The fraction of (dx, dy), from a group box's centre, at which the line
 * leaves the box (half height hh); 0 when it never does within it. */
static double box_exit(double dx, double dy, double hh)
{
    const double tx = fabs(dx) > 1e-9 ? GBOX_W / 2 / fabs(dx) : 1e9;
    const double ty = fabs(dy) > 1e-9 ? hh / fabs(dy) : 1e9;
    const double t = tx < ty ? tx : ty;
    return t < 1 ? t : 0;
}

/* dsviz's own drawing of a round between groups (no --segment): each
 * group a box on a circle, its members stacked inside and its reduction
 * said once in its title; one arrow per ordered pair of groups that
 * exchange, box to box, labelled with its segments and bytes. A member
 * without a group is a box of its own. */
static int own_svg_groups(const ds_viz *v, FILE *f)
{
    const size_t n = v->n_m;
    int *slot = malloc((n ? n : 1) * sizeof(*slot));
    size_t *rank = malloc((n ? n : 1) * sizeof(*rank));
    size_t *first = malloc((n ? n : 1) * sizeof(*first));
    double *sx = malloc((n ? n : 1) * sizeof(*sx)), *sy = malloc((n ? n : 1) * sizeof(*sy));
    size_t *ssize = calloc(n ? n : 1, sizeof(*ssize));
    char *done = calloc(v->n_e ? v->n_e : 1, 1);
    int rc = 0;
    if (!slot || !rank || !first || !sx || !sy || !ssize || !done) {
        rc = -EIO;
        goto out;
    }
    /* Slots: a group's members share one, in order of first appearance
     * (the clusters' order); a member without a group has its own. */
    size_t ns = 0, tallest = 1;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < i && (!v->m[i].group[0] || strcmp(v->m[j].group, v->m[i].group)))
            j++;
        if (j < i) {
            slot[i] = slot[j];
        } else {
            slot[i] = (int)ns;
            first[ns++] = i;
        }
        rank[i] = ssize[slot[i]]++;
        tallest = ssize[slot[i]] > tallest ? ssize[slot[i]] : tallest;
    }
    const double bh = gbox_h(tallest); /* the tallest box */
    double R = 90.0 * (double)ns / M_PI + bh / 2;
    R = R < 200 ? 200 : R;
    const double W = 2 * R + 360, H = 2 * R + bh + 120, cx = W / 2, cy = H / 2;
    for (size_t k = 0; k < ns; k++) {
        const double a = -M_PI / 2 + 2 * M_PI * (double)k / (double)ns;
        sx[k] = ns == 1 ? cx : cx + R * cos(a);
        sy[k] = ns == 1 ? cy : cy + R * sin(a);
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
               "font-size=\"11\">\n<defs><marker id=\"garrow\" viewBox=\"0 0 10 10\" "
               "refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" "
               "orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#444444\"/></marker>"
               "</defs>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
            W, H, W, H);
    /* The group boxes, under everything. */
    for (size_t k = 0; k < ns; k++) {
        const size_t i = first[k];
        if (!v->m[i].group[0])
            continue;
        const double h = gbox_h(ssize[k]);
        fprintf(f, "<g><title>group ");
        xml_text(f, v->m[i].group);
        fprintf(f, "</title><rect x=\"%.1f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" "
                   "rx=\"10\" fill=\"#f4f4f4\" stroke=\"#888888\" stroke-dasharray=\"6,3\"/>\n"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" "
                   "font-weight=\"bold\">group ",
                sx[k] - GBOX_W / 2, sy[k] - h / 2, GBOX_W, h, sx[k], sy[k] - h / 2 + 13);
        xml_text(f, v->m[i].group);
        fputs("</text>\n", f);
        if (ssize[k] > 1)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"9\">"
                       "all-reduce inside, every step (%zu)</text>\n",
                    sx[k], sy[k] - h / 2 + 26, ssize[k]);
        fputs("</g>\n", f);
    }
    /* One arrow per ordered pair of slots, centre to centre, bent so the
     * two directions of a pair stay apart, stopped at the target's box. */
    for (size_t k = 0; k < v->n_e; k++) {
        if (done[k])
            continue;
        struct group_edge g;
        group_edge_collect(v, done, k, &g);
        const int a = slot[g.from], b = slot[g.to];
        const double cx1 = sx[a], cy1 = sy[a], x2 = sx[b], y2 = sy[b];
        const double mx = (cx1 + x2) / 2, my = (cy1 + y2) / 2;
        const double qx = mx + (y2 - cy1) * 0.18, qy = my - (x2 - cx1) * 0.18;
        /* From where the line to q leaves the source's box to where the
         * line from q enters the target's. */
        const double t1 = box_exit(qx - cx1, qy - cy1, gbox_h(ssize[a]) / 2);
        const double x1 = cx1 + (qx - cx1) * t1, y1 = cy1 + (qy - cy1) * t1;
        const double t2 = box_exit(x2 - qx, y2 - qy, gbox_h(ssize[b]) / 2);
        const double ex = x2 - (x2 - qx) * t2, ey = y2 - (y2 - qy) * t2;
        char label[192];
        group_edge_label(&g, label, sizeof(label));
        fprintf(f, "<path d=\"M%.1f,%.1f Q%.1f,%.1f %.1f,%.1f\" fill=\"none\" stroke=\"#444444\" "
                   "stroke-width=\"%d\"%s marker-end=\"url(#garrow)\"><title>",
                x1, y1, qx, qy, ex, ey, g.n > 1 ? 2 : 1,
                g.bad ? " stroke-dasharray=\"5,3\"" : "");
        xml_text(f, g.tip);
        const double lx = 0.25 * x1 + 0.5 * qx + 0.25 * ex;
        const double ly = 0.25 * y1 + 0.5 * qy + 0.25 * ey;
        fprintf(f, "</title></path>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"#222222\" "
                   "font-size=\"9\" text-anchor=\"middle\" stroke=\"#ffffff\" "
                   "stroke-width=\"3\" paint-order=\"stroke\">",
                lx, ly);
        xml_text(f, label);
        fputs("</text>\n", f);
    }
    for (size_t i = 0; i < n; i++) {
        const size_t k = (size_t)slot[i];
        const double top = sy[k] - gbox_h(ssize[k]) / 2;
        svg_member(f, v, i, sx[k],
                   v->m[i].group[0] ? top + GBOX_HEAD + 22 + 50.0 * (double)rank[i] : sy[k]);
    }
    fputs("</svg>\n", f);
    rc = ferror(f) ? -EIO : 0;
out:
    free(slot);
    free(rank);
    free(first);
    free(sx);
    free(sy);
    free(ssize);
    free(done);
    return rc;
}

int ds_viz_write_own_svg(const ds_viz *v, FILE *f)
{
    if (v->from_schedule && v->grouped_round && !v->segment_set)
        return own_svg_groups(v, f);
    /* Members on a circle, grouped (members of a group next to each other,
     * in name order), edges as quadratic curves bent towards the centre by
     * an amount that depends on the segment, so segments between the same
     * two nodes stay apart. */
    const size_t n = v->n_m;
    const double R = n < 8 ? 180 : 180 + (double)(n - 8) * 14;
    const double W = 2 * R + 320, H = 2 * R + 200, cx = W / 2, cy = H / 2;
    size_t *order = malloc((n ? n : 1) * sizeof(*order));
    double *px = malloc((n ? n : 1) * sizeof(*px)), *py = malloc((n ? n : 1) * sizeof(*py));
    char *done = calloc(n ? n : 1, 1);
    if (!order || !px || !py || !done) {
        free(order);
        free(px);
        free(py);
        free(done);
        return -EIO;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        for (size_t j = i; j < n; j++)
            if (!done[j] && !strcmp(v->m[j].group, v->m[i].group)) {
                done[j] = 1;
                order[k++] = j;
            }
    }
    for (size_t p = 0; p < n; p++) {
        const double a = -M_PI / 2 + 2 * M_PI * (double)p / (double)(n ? n : 1);
        px[order[p]] = n == 1 ? cx : cx + R * cos(a);
        py[order[p]] = n == 1 ? cy : cy + R * sin(a);
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, sans-serif\" "
               "font-size=\"11\">\n",
            W, H, W, H);
    fputs("<defs>\n", f);
    for (int c = 0; c < 12; c++)
        fprintf(f, "<marker id=\"arrow%d\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" "
                   "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 "
                   "L0,10 z\" fill=\"%s\"/></marker>\n",
                c, palette[c]);
    fputs("</defs>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n", f);
    for (size_t e = 0; e < v->n_e; e++) {
        const ds_viz_edge *ed = &v->e[e];
        const double x1 = px[ed->from], y1 = py[ed->from], x2 = px[ed->to], y2 = py[ed->to];
        const double mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
        const double bend = 0.15 + 0.12 * (double)(ed->segment % 6);
        double qx = mx + (cx - mx) * bend, qy = my + (cy - my) * bend;
        if (fabs(mx - cx) < 1 && fabs(my - cy) < 1) { /* a diameter: bend sideways */
            qx += (y2 - y1) * bend * 0.5;
            qy -= (x2 - x1) * bend * 0.5;
        }
        /* Stop short of the target's box so the arrow head shows. */
        const double dx = x2 - qx, dy = y2 - qy, dl = sqrt(dx * dx + dy * dy);
        const double ex = dl > 40 ? x2 - dx / dl * 34 : x2, ey = dl > 40 ? y2 - dy / dl * 22 : y2;
        char label[96];
        edge_label(ed, label, sizeof(label));
        fprintf(f, "<path d=\"M%.1f,%.1f Q%.1f,%.1f %.1f,%.1f\" fill=\"none\" stroke=\"%s\" "
                   "stroke-width=\"1.5\"%s marker-end=\"url(#arrow%u)\"><title>",
                x1, y1, qx, qy, ex, ey, seg_color(ed->segment),
                edge_dashed(ed) ? " stroke-dasharray=\"5,3\"" : "", ed->segment % 12);
        xml_text(f, v->m[ed->from].name);
        fputs(" -&gt; ", f);
        xml_text(f, v->m[ed->to].name);
        fputs(": ", f);
        xml_text(f, label);
        /* The label sits on the curve at a point that depends on the
         * segment, so the labels of one pair's segments do not overlap. */
        const double t = 0.25 + 0.5 * (double)(ed->segment % 5) / 4.0;
        const double lx = (1 - t) * (1 - t) * x1 + 2 * (1 - t) * t * qx + t * t * ex;
        const double ly = (1 - t) * (1 - t) * y1 + 2 * (1 - t) * t * qy + t * t * ey;
        fprintf(f, "</title></path>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" font-size=\"9\" "
                   "text-anchor=\"middle\" stroke=\"#ffffff\" stroke-width=\"3\" "
                   "paint-order=\"stroke\">",
                lx, ly, seg_color(ed->segment));
        xml_text(f, label);
        fputs("</text>\n", f);
    }
    for (size_t i = 0; i < n; i++)
        svg_member(f, v, i, px[i], py[i]);
    fputs("</svg>\n", f);
    free(order);
    free(px);
    free(py);
    free(done);
    return ferror(f) ? -EIO : 0;
}

/* ---- HTML ------------------------------------------------------------------------------ */

/* x with `prec` digits after the point, or "-" when not a number. */
static void html_num(FILE *f, double x, int prec)
{
    if (isfinite(x))
        fprintf(f, "%.*f", prec, x);
    else
        fputs("-", f);
}

/* The model's layer table ("model.layers", docs/status.md) of the newest
 * document that has one: every node trains the same model. Nothing when no
 * document has one (an older dsnode). */
static void model_table(const ds_viz *v, FILE *f)
{
    const json_t *layers = NULL;
    const char *from = NULL;
    double newest = -1;
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *l = jget(jget(v->docs[d].doc, "model"), "layers");
        if (json_is_array(l) && json_array_size(l) > 0 && v->docs[d].time_unix_ms > newest) {
            layers = l;
            from = v->docs[d].name;
            newest = v->docs[d].time_unix_ms;
        }
    }
    if (!layers)
        return;
    fputs("<h2>Model</h2>\n<p>Layer table of ", f);
    xml_text(f, from);
    fputs(" (one gossip segment per layer when gossip.segments = 0).</p>\n"
          "<table><tr><th>layer</th><th>kind</th><th>shape</th><th>offset</th>"
          "<th>parameters</th></tr>\n",
          f);
    double total = 0;
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *l = json_array_get(layers, i);
        const double k = jnum(l, "k", 0), in = jnum(l, "in", 0), out = jnum(l, "out", 0);
        const double len = jnum(l, "length", 0);
        total += len;
        fputs("<tr><td class=\"l\">", f);
        xml_text(f, jstr(l, "name", "?"));
        fputs("</td><td class=\"l\">", f);
        xml_text(f, jstr(l, "kind", "?"));
        if (k > 0)
            fprintf(f, "</td><td class=\"l\">%.0fx%.0f, %.0f &rarr; %.0f", k, k, in / (k * k),
                    out);
        else
            fprintf(f, "</td><td class=\"l\">%.0f &rarr; %.0f", in, out);
        fprintf(f, "</td><td>%.0f</td><td>%.0f</td></tr>\n", jnum(l, "offset", 0), len);
    }
    fprintf(f, "<tr><td class=\"l\">all</td><td></td><td></td><td></td><td>%.0f</td></tr>\n"
               "</table>\n",
            total);
}

/* The live page's controls: a GET form on / with the round slider and
 * the segment filter (submitted on change; the one script of the page is
 * that attribute). */
static void live_controls(const ds_viz *v, FILE *f, const ds_viz_live *o)
{
    fputs("<form method=\"get\" action=\"/\">\n", f);
    if (v->from_schedule && v->rounds_max >= v->rounds_min && v->rounds_min >= 0)
        fprintf(f, "<label>round <input type=\"range\" name=\"round\" min=\"%.0f\" "
                   "max=\"%.0f\" value=\"%.0f\" onchange=\"this.form.submit()\"> %.0f</label> "
                   "(history %.0f..%.0f)\n",
                v->rounds_min, v->rounds_max, v->round, v->round, v->rounds_min,
                v->rounds_max);
    else
        fputs("<span>no round history in the documents</span>\n", f);
    fputs("<label>segment <select name=\"segment\" onchange=\"this.form.submit()\">"
          "<option value=\"\">all</option>",
          f);
    for (unsigned sgi = 0; sgi < v->n_round_segments; sgi++)
        fprintf(f, "<option value=\"%u\"%s>%u</option>", sgi,
                v->segment_set && v->want_segment == sgi ? " selected" : "", sgi);
    fputs("</select></label>\n<noscript><input type=\"submit\" value=\"show\"></noscript>\n"
          "</form>\n",
          f);
    if (o->refresh_s > 0)
        fprintf(f, "<p>This page reloads every %d s%s.</p>\n", o->refresh_s,
                v->round_set ? " (the round stays as chosen)" : " (newest round)");
}

/* Node x node payload bytes over the histories, one cell per pair. */
int ds_viz_group_handler(const ds_viz *v, const char *group, unsigned segment)
{
    if (!group[0])
        return -1;
    for (size_t i = 0; i < v->n_m; i++) {
        const ds_viz_member *m = &v->m[i];
        uint32_t owner;
        if (!m->reported || strcmp(m->group, group) || !(m->group_size >= 1) ||
            m->group_size > UINT32_MAX ||
            ds_topo_hier_owner(segment, (uint32_t)m->group_size, &owner) < 0)
            continue;
        for (size_t j = 0; j < v->n_m; j++)
            if (v->m[j].reported && !strcmp(v->m[j].group, group) &&
                v->m[j].group_member == (double)owner)
                return (int)j;
    }
    return -1;
}

/* Groups (node.group): which member handles which segment. */
static void groups_table(const ds_viz *v, FILE *f)
{
    unsigned nseg = v->from_schedule ? v->n_round_segments : v->n_segments;
    if (nseg > 64)
        nseg = 64;
    int any = 0;
    for (size_t i = 0; i < v->n_m && !any; i++)
        any = v->m[i].group[0] && v->m[i].group_size > 1;
    if (!any || !nseg)
        return;
    fputs("<h2>Groups: the member that handles each segment</h2>\n"
          "<p>Segment s of a group is exchanged with the other groups by its member s mod "
          "(group size), numbered by node id, which then shares the result inside the "
          "group.</p>\n<table><tr><th>group</th><th>size</th>",
          f);
    for (unsigned s = 0; s < nseg; s++)
        fprintf(f, "<th><span class=\"sw\" style=\"background:%s\"></span>%u</th>",
                seg_color(s), s);
    fputs("</tr>\n", f);
    for (size_t i = 0; i < v->n_m; i++) {
        const char *g = v->m[i].group;
        int first = g[0] != 0;
        for (size_t k = 0; first && k < i; k++)
            first = strcmp(v->m[k].group, g) != 0;
        if (!first)
            continue;
        double size = -1;
        for (size_t k = 0; k < v->n_m; k++)
            if (v->m[k].reported && !strcmp(v->m[k].group, g) && v->m[k].group_size > size)
                size = v->m[k].group_size;
        fputs("<tr><td class=\"l\">", f);
        xml_text(f, g);
        if (size >= 1)
            fprintf(f, "</td><td>%.0f</td>", size);
        else
            fputs("</td><td>?</td>", f);
        for (unsigned s = 0; s < nseg; s++) {
            const int h = ds_viz_group_handler(v, g, s);
            fputs("<td class=\"l\">", f);
            xml_text(f, h >= 0 ? v->m[h].name : "?");
            fputs("</td>", f);
        }
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

static void heat_table(const ds_viz *v, FILE *f)
{
    if (!v->heat)
        return;
    double max = 0;
    for (size_t i = 0; i < v->n_m * v->n_m; i++)
        max = v->heat[i] > max ? v->heat[i] : max;
    fputs("<h2>Traffic: initiator (row) to target (column)</h2>\n", f);
    if (max <= 0) {
        fputs("<p>No bytes in the round histories.</p>\n", f);
        return;
    }
    fputs("<p>Payload bytes each node initiated to each other over the completed rounds its "
          "history holds; darker is more.</p>\n<table class=\"heat\"><tr><th></th>",
          f);
    for (size_t j = 0; j < v->n_m; j++) {
        fputs("<th>", f);
        xml_text(f, v->m[j].name);
        fputs("</th>", f);
    }
    fputs("<th>sum</th></tr>\n", f);
    for (size_t i = 0; i < v->n_m; i++) {
        fputs("<tr><th>", f);
        xml_text(f, v->m[i].name);
        fputs("</th>", f);
        double row = 0;
        for (size_t j = 0; j < v->n_m; j++) {
            const double b = v->heat[i * v->n_m + j];
            row += b;
            char hb[32] = "";
            if (b > 0)
                human_bytes(b, hb, sizeof(hb));
            const int shade = (int)(255 - 175 * (b / max));
            fprintf(f, "<td style=\"background:rgb(%d,%d,255)\" title=\"", shade, shade);
            xml_text(f, v->m[i].name);
            fputs(" &rarr; ", f);
            xml_text(f, v->m[j].name);
            fprintf(f, ": %.0f bytes\">%s</td>", b, hb);
        }
        char rb[32];
        human_bytes(row, rb, sizeof(rb));
        fprintf(f, "<td>%s</td></tr>\n", rb);
    }
    fputs("</table>\n", f);
}

static int cmp_member_ptr(const void *a, const void *b)
{
    return strcmp((*(const ds_viz_member *const *)a)->name,
                  (*(const ds_viz_member *const *)b)->name);
}

/* Each member's state as each reporting node's current view gives it. */
static void membership_table(const ds_viz *v, FILE *f)
{
    fputs("<h2>Membership: each member as each reporting node sees it now</h2>\n"
          "<table><tr><th>member</th>",
          f);
    for (size_t d = 0; d < v->n_docs; d++) {
        fputs("<th>", f);
        xml_text(f, v->docs[d].name);
        fputs("</th>", f);
    }
    fputs("<th>its history</th></tr>\n", f);
    /* st[i * n_docs + d]: member i's state in document d's view (the last
     * entry naming it), "-" when that view does not list it; members found
     * by name through a sorted index (names are unique among members). */
    const size_t nd = v->n_docs;
    const char **st = malloc((v->n_m * nd + 1) * sizeof(*st));
    const ds_viz_member **by = malloc((v->n_m + 1) * sizeof(*by));
    if (!st || !by) {
        free(st);
        free(by);
        fputs("</table>\n", f);
        return;
    }
    for (size_t i = 0; i < v->n_m; i++)
        by[i] = &v->m[i];
    qsort(by, v->n_m, sizeof(*by), cmp_member_ptr);
    for (size_t i = 0; i < v->n_m * nd; i++)
        st[i] = "-";
    for (size_t d = 0; d < nd; d++) {
        const json_t *members = jget(jget(v->docs[d].doc, "view"), "members");
        for (size_t k = 0; k < json_array_size(members); k++) {
            const json_t *mv = json_array_get(members, k);
            const char *name = jstr(mv, "name", "");
            ds_viz_member key;
            const ds_viz_member *kp = &key;
            if (strlen(name) >= sizeof(key.name))
                continue; /* no member has a longer name */
            copy_str(key.name, sizeof(key.name), name);
            const ds_viz_member **hit = bsearch(&kp, by, v->n_m, sizeof(*by), cmp_member_ptr);
            if (hit)
                st[(size_t)(*hit - v->m) * nd + d] = jstr(mv, "state", "?");
        }
    }
    for (size_t i = 0; i < v->n_m; i++) {
        fputs("<tr><td class=\"l\">", f);
        xml_text(f, v->m[i].name);
        fputs("</td>", f);
        for (size_t d = 0; d < nd; d++) {
            fputs("<td class=\"l\">", f);
            xml_text(f, st[i * nd + d]);
            fputs("</td>", f);
        }
        const json_t *h =
            v->m[i].doc >= 0 ? jget(v->docs[v->m[i].doc].doc, "history") : NULL;
        const size_t nh = json_array_size(h);
        if (nh)
            fprintf(f, "<td>rounds %.0f..%.0f</td></tr>\n",
                    jnum(json_array_get(h, nh - 1), "round", 0),
                    jnum(json_array_get(h, 0), "round", 0));
        else
            fputs("<td>-</td></tr>\n", f);
    }
    fputs("</table>\n", f);
    free(st);
    free(by);
}

/* One line of the membership timeline: an event as the first node to
 * report it saw it, and how many reporting nodes list it. */
struct tl_row {
    const char *member, *event, *first; /* borrowed from the documents */
    double eff;                         /* its join / removal round; -1: none */
    double t, round;                    /* the first report's time and round */
    int seen;
};

/* Same event: member, kind and effective round; suspect and alive
 * (no round) match reports within TL_SAME_MS of each other. */
#define TL_SAME_MS 10000.0
#define TL_MAX_ROWS 100

static int cmp_tl(const void *a, const void *b)
{
    const struct tl_row *x = a, *y = b;
    int c = strcmp(x->member, y->member);
    if (!c)
        c = strcmp(x->event, y->event);
    if (!c)
        c = (x->eff > y->eff) - (x->eff < y->eff);
    if (!c)
        c = (x->t > y->t) - (x->t < y->t);
    return c;
}

static int cmp_tl_time(const void *a, const void *b)
{
    const struct tl_row *x = a, *y = b;
    return (x->t < y->t) - (x->t > y->t); /* newest first */
}

/* The membership timeline: every reporting node's "events" (membership's
 * news about the others, docs/status.md) merged: one line per event, at
 * the time and round its first reporter learned it, with how many nodes
 * list it; the newest TL_MAX_ROWS. */
static void timeline_table(const ds_viz *v, FILE *f)
{
    size_t n = 0;
    for (size_t d = 0; d < v->n_docs; d++)
        n += json_array_size(jget(v->docs[d].doc, "events"));
    if (!n)
        return;
    struct tl_row *rows = malloc(n * sizeof(*rows));
    if (!rows)
        return;
    size_t k = 0;
    for (size_t d = 0; d < v->n_docs; d++) {
        const json_t *ev = jget(v->docs[d].doc, "events");
        for (size_t i = 0; i < json_array_size(ev); i++) {
            const json_t *e = json_array_get(ev, i);
            rows[k++] = (struct tl_row){
                .member = jstr(e, "member", "?"), .event = jstr(e, "event", "?"),
                .first = v->docs[d].name, .eff = jnum(e, "effective_round", -1),
                .t = jnum(e, "time_unix_ms", 0), .round = jnum(e, "round", -1), .seen = 1};
        }
    }
    qsort(rows, k, sizeof(*rows), cmp_tl);
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        struct tl_row *last = m ? &rows[m - 1] : NULL;
        if (last && !strcmp(last->member, rows[i].member) &&
            !strcmp(last->event, rows[i].event) && last->eff == rows[i].eff &&
            (rows[i].eff >= 0 || rows[i].t - last->t <= TL_SAME_MS)) {
            last->seen++; /* sorted by time: last holds the first report */
            continue;
        }
        rows[m++] = rows[i];
    }
    qsort(rows, m, sizeof(*rows), cmp_tl_time);
    fprintf(f, "<h2>Membership timeline: what the reporting nodes learned, newest first</h2>\n"
               "<p>Each line is one event as the first node to report it learned it (its "
               "time and round), with how many of the %zu reporting nodes list it; the join "
               "or removal round is the round from which the member is in, or out of, the "
               "views. Nodes keep their last 64 events.</p>\n"
               "<table><tr><th>time (UTC)</th><th>round</th><th>member</th><th>event</th>"
               "<th>join / removal round</th><th>first reported by</th><th>listed by</th></tr>\n",
            v->n_docs);
    for (size_t i = 0; i < m && i < TL_MAX_ROWS; i++) {
        const struct tl_row *r = &rows[i];
        const time_t secs = (time_t)(r->t / 1000);
        struct tm tmv;
        char when[32] = "?";
        if (gmtime_r(&secs, &tmv))
            snprintf(when, sizeof(when), "%02d:%02d:%02d.%03d", tmv.tm_hour, tmv.tm_min,
                     tmv.tm_sec, (int)fmod(r->t, 1000));
        fprintf(f, "<tr><td>%s</td><td>", when);
        html_num(f, r->round >= 0 ? r->round : NAN, 0);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, r->member);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, r->event);
        fputs("</td><td>", f);
        html_num(f, r->eff >= 0 ? r->eff : NAN, 0);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, r->first);
        fprintf(f, "</td><td>%d of %zu</td></tr>\n", r->seen, v->n_docs);
    }
    fputs("</table>\n", f);
    free(rows);
}

static int write_page(const ds_viz *v, FILE *f, const char *svg, const ds_viz_live *live);

int ds_viz_write_html(const ds_viz *v, FILE *f, const char *svg)
{
    return write_page(v, f, svg, NULL);
}

int ds_viz_write_live(const ds_viz *v, FILE *f, const ds_viz_live *o)
{
    return write_page(v, f, NULL, o);
}

static int write_page(const ds_viz *v, FILE *f, const char *svg, const ds_viz_live *live)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n", f);
    if (live && live->refresh_s > 0)
        fprintf(f, "<meta http-equiv=\"refresh\" content=\"%d\">\n", live->refresh_s);
    fputs("<title>dsviz</title>\n<style>\n"
          "body{font-family:Helvetica,Arial,sans-serif;margin:1.5em;color:#222}\n"
          "table{border-collapse:collapse;margin:0.5em 0 1.5em}\n"
          "th,td{border:1px solid #ccc;padding:2px 8px;text-align:right;font-size:13px}\n"
          "th{background:#f0f0f0}td.l{text-align:left}\n"
          ".graph{overflow:auto;border:1px solid #ddd;padding:4px}\n"
          ".sw{display:inline-block;width:1.6em;height:0.7em;margin-right:0.3em}\n"
          "table.heat td{min-width:3.5em}\n"
          "</style></head><body>\n",
          f);
    fprintf(f, "<h1>dsviz: %zu members, %zu reporting", v->n_m, v->n_docs);
    if (v->from_schedule)
        fprintf(f, ", round %.0f%s", v->round, v->segment_set ? "" : ", every segment");
    if (v->from_schedule && v->segment_set)
        fprintf(f, ", segment %u", v->want_segment);
    fputs("</h1>\n", f);
    if (live)
        live_controls(v, f, live);
    fputs("<p>Sources:", f);
    for (size_t d = 0; d < v->n_docs; d++) {
        fputs(d ? ", " : " ", f);
        xml_text(f, v->docs[d].origin);
    }
    fputs(".</p>\n<div class=\"graph\">\n", f);
    if (svg) {
        /* Inline from the <svg> element on: drop the XML prolog and the
         * DOCTYPE, which are not allowed inside HTML. */
        const char *s = strstr(svg, "<svg");
        fputs(s ? s : "", f);
    } else {
        if (ds_viz_write_own_svg(v, f) < 0)
            return -EIO;
    }
    fputs("</div>\n<h2>Nodes</h2>\n<table><tr><th>name</th><th>group</th><th>address</th>"
          "<th>state</th><th>seen as</th><th>step</th><th>round</th><th>epoch</th>"
          "<th>view</th><th>loss</th><th>test acc</th><th>samples/s</th><th>sent</th>"
          "<th>received</th><th>exchanges ok</th><th>failed</th><th>drops</th></tr>\n",
          f);
    for (size_t i = 0; i < v->n_m; i++) {
        const ds_viz_member *m = &v->m[i];
        fputs("<tr><td class=\"l\">", f);
        xml_text(f, m->name);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, m->group);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, m->addr);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, m->reported ? m->state : "(no status)");
        fputs("</td><td class=\"l\">", f);
        xml_text(f, m->seen_state);
        fputs("</td>", f);
        if (m->reported) {
            char s[32], r[32];
            human_bytes(m->bytes_sent, s, sizeof(s));
            human_bytes(m->bytes_received, r, sizeof(r));
            fprintf(f, "<td>%.0f/%.0f</td><td>%.0f</td><td>%.0f</td><td>%.0f</td><td>", m->step,
                    m->steps, m->round, m->epoch, m->view_size);
            html_num(f, m->loss, 4);
            fputs("</td><td>", f);
            html_num(f, m->test_acc >= 0 ? m->test_acc : NAN, 4);
            fputs("</td><td>", f);
            html_num(f, m->samples_per_s, 0);
            fprintf(f, "</td><td>%s</td><td>%s</td><td>%.0f</td><td>%.0f</td><td>%.0f</td></tr>\n",
                    s, r, m->exchanges_ok, m->exchanges_failed, m->drops_total);
        } else {
            fputs("<td colspan=\"12\"></td></tr>\n", f);
        }
    }
    fputs("</table>\n", f);
    groups_table(v, f);
    heat_table(v, f);
    membership_table(v, f);
    timeline_table(v, f);
    model_table(v, f);
    fputs("<h2>Exchanges of the round drawn</h2>\n<table><tr><th>segment</th><th>from</th>"
          "<th>to</th><th>round</th><th>outcome</th><th>bytes</th></tr>\n",
          f);
    for (size_t k = 0; k < v->n_e; k++) {
        const ds_viz_edge *e = &v->e[k];
        fprintf(f, "<tr><td><span class=\"sw\" style=\"background:%s\"></span>%u</td>"
                   "<td class=\"l\">",
                seg_color(e->segment), e->segment);
        xml_text(f, v->m[e->from].name);
        fputs("</td><td class=\"l\">", f);
        xml_text(f, v->m[e->to].name);
        fprintf(f, "</td><td>%.0f</td><td class=\"l\">", e->round);
        xml_text(f, e->outcome);
        fputs("</td><td>", f);
        if (e->bytes > 0)
            fprintf(f, "%.0f", e->bytes);
        else
            fputs("-", f);
        fputs("</td></tr>\n", f);
    }
    fputs("</table>\n<p>Edges: initiator &rarr; target, one per segment, coloured by segment; "
          "dashed when the exchange did not succeed or is known only from the answering "
          "side. Dashed boxes: members listed in a view that did not report. With round "
          "histories, the pairs are the round's schedule, computed: per segment a fresh "
          "random derangement (crossover) in which every node initiates exactly one exchange "
          "and answers exactly one.</p>\n",
          f);
    if (v->from_schedule && v->grouped_round)
        fputs("<p>This round is between groups: the derangement is over the groups (each "
              "group initiates one exchange per segment and answers one), and segment s of a "
              "group is exchanged by its member s mod (group size), so the members split the "
              "segments between them; inside a group the members average their gradients "
              "and what they received every step (all-reduce), so they hold one model. The "
              "drawing shows one arrow per pair of groups; pick a segment to see which member "
              "sent it to which.</p>\n",
              f);
    fputs("</body></html>\n", f);
    return ferror(f) ? -EIO : 0;
}

/* ---- Graphviz ---------------------------------------------------------------------------- */

int ds_viz_run_dot(const char *dot_prog, const char *dot_path, const char *svg_path,
                   int timeout_ms)
{
    char *argv[] = {(char *)dot_prog, "-Tsvg", "-o", (char *)svg_path, (char *)dot_path, NULL};
    pid_t pid;
    int e = posix_spawnp(&pid, dot_prog, NULL, NULL, argv, environ);
    if (e != 0)
        return e == ENOENT || e == EACCES ? -ENOENT : -e;
    const uint64_t deadline = mono_ms() + (uint64_t)timeout_ms;
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            return -errno;
        if (mono_ms() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            return -ETIMEDOUT;
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* posix_spawnp reports a missing program through the child on glibc
     * (exit 127). */
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return -ENOENT;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/* ---- dsviz --serve's history ----------------------------------------------------------- */

/* Payload bytes a node initiated to one target id over the rounds held. */
typedef struct hist_sum {
    uint64_t key; /* FNV-1a of id: compared first */
    char id[17];
    double bytes;
} hist_sum;

typedef struct hist_node {
    char name[64];
    json_t *rounds; /* array, newest first, one per round, at most max entries */
    double *r;      /* r[i]: the round of rounds[i] */
    hist_sum *sum;  /* over `rounds`, kept as rounds come and go */
    size_t n_sum, cap_sum;
} hist_node;

struct ds_viz_hist {
    unsigned max;
    hist_node *n;
    size_t count, cap;
};

int ds_viz_hist_new(ds_viz_hist **out, unsigned max_rounds)
{
    *out = NULL;
    if (max_rounds < 1 || max_rounds > DS_VIZ_HISTORY_MAX)
        return -EINVAL;
    ds_viz_hist *h = calloc(1, sizeof(*h));
    if (!h)
        return -ENOMEM;
    h->max = max_rounds;
    *out = h;
    return 0;
}

void ds_viz_hist_free(ds_viz_hist **ph)
{
    ds_viz_hist *h = *ph;
    if (!h)
        return;
    for (size_t i = 0; i < h->count; i++) {
        json_decref(h->n[i].rounds);
        free(h->n[i].r);
        free(h->n[i].sum);
    }
    free(h->n);
    free(h);
    *ph = NULL;
}

static hist_node *hist_find(const ds_viz_hist *h, const char *name)
{
    for (size_t i = 0; h && i < h->count; i++)
        if (!strcmp(h->n[i].name, name))
            return &h->n[i];
    return NULL;
}

/* A history entry's round: a whole number >= 0, else -1. */
static double hist_round(const json_t *e)
{
    const double r = jnum(e, "round", -1);
    return r >= 0 && r <= 9007199254740992.0 && r == floor(r) ? r : -1;
}

/* Add sign x the bytes of entry e to hn's sums (as build_heat reads them:
 * target_id a string of at most 16 characters, bytes a number or 0).
 * 0, 1 when a value is not a whole number 0..2^53 (sums in another order
 * could differ: the caller sums again from scratch), or -ENOMEM. */
static int sum_entry(hist_node *hn, const json_t *e, double sign)
{
    const json_t *list = jget(e, "list");
    int inexact = 0;
    for (size_t k = 0; k < json_array_size(list); k++) {
        const json_t *x = json_array_get(list, k);
        const char *id = jstr(x, "target_id", NULL);
        if (!id || strlen(id) > 16)
            continue;
        const double b = jnum(x, "bytes", 0);
        if (!(b >= 0 && b <= 9007199254740992.0 && b == floor(b)))
            inexact = 1;
        uint64_t key = 14695981039346656037ull;
        for (const char *c = id; *c; c++)
            key = (key ^ (unsigned char)*c) * 1099511628211ull;
        size_t i = 0;
        while (i < hn->n_sum && (hn->sum[i].key != key || strcmp(hn->sum[i].id, id)))
            i++;
        if (i == hn->n_sum) {
            if (hn->n_sum == hn->cap_sum) {
                const size_t nc = hn->cap_sum ? hn->cap_sum * 2 : 16;
                hist_sum *ns = realloc(hn->sum, nc * sizeof(*ns));
                if (!ns)
                    return -ENOMEM;
                hn->sum = ns;
                hn->cap_sum = nc;
            }
            copy_str(hn->sum[i].id, sizeof(hn->sum[i].id), id);
            hn->sum[i].key = key;
            hn->sum[i].bytes = 0;
            hn->n_sum++;
        }
        hn->sum[i].bytes += sign * b;
    }
    return inexact;
}

/* hn's sums from scratch over its rounds, in build_heat's order. */
static int sum_all(hist_node *hn)
{
    hn->n_sum = 0;
    for (size_t i = 0; i < json_array_size(hn->rounds); i++) {
        const int e = sum_entry(hn, json_array_get(hn->rounds, i), 1);
        if (e < 0)
            return e;
    }
    return 0;
}

typedef struct hist_item {
    double round;
    size_t order; /* the newer document's entries first among equal rounds */
    json_t *e;
} hist_item;

static int cmp_items(const void *a, const void *b)
{
    const hist_item *x = a, *y = b;
    if (x->round != y->round)
        return x->round > y->round ? -1 : 1; /* newest first */
    return x->order < y->order ? -1 : x->order > y->order;
}

/* fresh (may be NULL) merged over hn's rounds into hn: at most max entries,
 * newest first, one per round, fresh's entry kept for a round both hold;
 * hn's sums follow (what came in added, what went out taken off). 0 or
 * -ENOMEM (hn unchanged). */
static int hist_union(hist_node *hn, const json_t *fresh, unsigned max)
{
    const json_t *old = hn->rounds;
    const size_t nf = json_array_size(fresh), no = json_array_size(old);
    hist_item *it = malloc((nf + no + 1) * sizeof(*it));
    unsigned char *took = calloc(nf + no + 1, 1);
    double *rr = malloc(((nf + no) < max ? nf + no : max) * sizeof(*rr) + sizeof(*rr));
    json_t *out = json_array();
    if (!it || !took || !rr || !out) {
        free(it);
        free(took);
        free(rr);
        json_decref(out);
        return -ENOMEM;
    }
    /* fresh's valid entries, then old's (valid, sorted, one per round) */
    size_t n = 0;
    int sorted = 1;
    for (size_t i = 0; i < nf; i++) {
        json_t *e = json_array_get(fresh, i);
        const double r = hist_round(e);
        if (r < 0)
            continue;
        if (n > 0 && !(r < it[n - 1].round))
            sorted = 0;
        it[n++] = (hist_item){.round = r, .order = i, .e = e};
    }
    const size_t nfv = n; /* fresh's valid entries: it[0..nfv) */
    for (size_t i = 0; i < no; i++) /* valid, from an earlier pass */
        it[n++] = (hist_item){.round = hn->r[i], .order = nf + i, .e = json_array_get(old, i)};
    int rc = 0;
    if (sorted) {
        /* Both newest first: one pass. */
        size_t a = 0, b = nfv;
        while ((a < nfv || b < n) && json_array_size(out) < max && rc == 0) {
            size_t pick;
            if (b >= n || (a < nfv && it[a].round >= it[b].round)) {
                pick = a;
                if (b < n && it[b].round == it[a].round)
                    b++; /* fresh replaces old's entry of that round */
                a++;
            } else {
                pick = b++;
            }
            took[pick] = 1;
            rr[json_array_size(out)] = it[pick].round;
            rc = json_array_append(out, it[pick].e) < 0 ? -ENOMEM : 0;
        }
    } else {
        qsort(it, n, sizeof(*it), cmp_items);
        for (size_t i = 0; i < n && json_array_size(out) < max && rc == 0; i++) {
            if (i > 0 && it[i].round == it[i - 1].round)
                continue;
            rr[json_array_size(out)] = it[i].round;
            rc = json_array_append(out, it[i].e) < 0 ? -ENOMEM : 0;
        }
    }
    if (rc < 0) {
        free(it);
        free(took);
        free(rr);
        json_decref(out);
        return rc;
    }
    /* The sums: incrementally when the pass knew what came and went. */
    int redo = !sorted;
    for (size_t i = 0; i < n && !redo && rc >= 0; i++) {
        if (i < nfv && took[i])
            rc = sum_entry(hn, it[i].e, 1);
        else if (i >= nfv && !took[i])
            rc = sum_entry(hn, it[i].e, -1);
        redo = rc == 1;
    }
    free(it);
    free(took);
    json_decref(hn->rounds);
    hn->rounds = out;
    free(hn->r);
    hn->r = rr;
    if (rc < 0 || redo)
        rc = sum_all(hn);
    return rc < 0 ? rc : 0;
}

int ds_viz_hist_merge(ds_viz_hist *h, ds_viz *v)
{
    int rc = 0;
    for (size_t d = 0; d < v->n_docs; d++) {
        json_t *doc = v->docs[d].doc;
        const json_t *fresh = json_is_array(json_object_get(doc, "history"))
                                  ? json_object_get(doc, "history")
                                  : NULL;
        hist_node *hn = hist_find(h, v->docs[d].name);
        if (!fresh && !hn)
            continue;
        if (!hn) {
            if (h->count >= DS_VIZ_MAX_DOCS) {
                rc = -E2BIG;
                continue;
            }
            if (h->count == h->cap) {
                const size_t nc = h->cap ? h->cap * 2 : 64;
                hist_node *nn = realloc(h->n, nc * sizeof(*nn));
                if (!nn)
                    return -ENOMEM;
                h->n = nn;
                h->cap = nc;
            }
            hn = &h->n[h->count++];
            memset(hn, 0, sizeof(*hn));
            copy_str(hn->name, sizeof(hn->name), v->docs[d].name);
        }
        if (hist_union(hn, fresh, h->max) < 0 ||
            json_object_set(doc, "history", hn->rounds) < 0)
            return -ENOMEM;
        v->built = 0;
    }
    v->hist = h;
    return rc;
}

/* Document d's history as the server merged it, NULL when it is not. */
static const struct hist_node *merged_of(const ds_viz *v, size_t d)
{
    const hist_node *hn = hist_find(v->hist, v->docs[d].name);
    return hn && json_object_get(v->docs[d].doc, "history") == hn->rounds ? hn : NULL;
}

/* build_heat's row `from` from the merged node's sums. */
static void merged_heat(ds_viz *v, const struct hist_node *hn, size_t from)
{
    for (size_t i = 0; i < hn->n_sum; i++)
        for (size_t t = 0; t < v->n_m; t++)
            if (!strcmp(v->m[t].id, hn->sum[i].id)) {
                v->heat[from * v->n_m + t] += hn->sum[i].bytes;
                break;
            }
}

size_t ds_viz_hist_held(const ds_viz_hist *h, const char *name, double *lo, double *hi)
{
    const hist_node *hn = hist_find(h, name);
    const size_t n = hn ? json_array_size(hn->rounds) : 0;
    if (lo)
        *lo = n ? hist_round(json_array_get(hn->rounds, n - 1)) : -1;
    if (hi)
        *hi = n ? hist_round(json_array_get(hn->rounds, 0)) : -1;
    return n;
}

/* ---- dsviz --serve ------------------------------------------------------------------- */

static int listen_fd(int fd)
{
    return listen(fd, 64);
}

struct ds_viz_server {
    struct MHD_Daemon *d;
    int fd;
    char *const *sources;
    int n, timeout_ms, refresh_s;
    ds_viz_hist *hist; /* the rounds seen over the refreshes */
    char addr[80];
};

/* A query value as a whole number 0..max; -1 when absent or not one. */
static double query_num(struct MHD_Connection *c, const char *key, double max)
{
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    if (!q || !q[0] || strlen(q) > 16)
        return -1;
    for (const char *p = q; *p; p++)
        if (*p < '0' || *p > '9')
            return -1;
    const double x = strtod(q, NULL);
    return x <= max ? x : -1;
}

static enum MHD_Result serve_text(struct MHD_Connection *c, unsigned code, const char *type,
                                  char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    const enum MHD_Result e = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return e;
}

int ds_viz_live_page(ds_viz_hist *hist, char *const *sources, int n, int timeout_ms,
                     int refresh_s, double r, double sg, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    ds_viz v = {0};
    v.round_set = r >= 0;
    v.want_round = r;
    v.segment_set = sg >= 0;
    v.want_segment = sg >= 0 ? (unsigned)sg : 0;
    char *errs = NULL;
    size_t errs_len = 0;
    FILE *ef = open_memstream(&errs, &errs_len);
    for (int i = 0; i < n; i++) {
        char err[600];
        if (ds_viz_load(&v, sources[i], timeout_ms, err, sizeof(err)) < 0 && ef) {
            xml_text(ef, err);
            fputs("<br>\n", ef);
        }
    }
    if (ef)
        fclose(ef);
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    int e = f ? 0 : -ENOMEM;
    if (e == 0 && hist) {
        e = ds_viz_hist_merge(hist, &v);
        if (e == -E2BIG)
            e = 0; /* past DS_VIZ_MAX_DOCS names: those keep their own */
    }
    if (e == 0 && v.n_docs && (e = ds_viz_build(&v)) == 0) {
        const ds_viz_live o = {.refresh_s = refresh_s};
        e = ds_viz_write_live(&v, f, &o);
        if (errs && errs[0])
            fprintf(f, "<p>Sources that failed:<br>\n%s</p>\n", errs);
    } else if (e == 0) {
        if (refresh_s > 0)
            fprintf(f, "<!DOCTYPE html>\n<html><head><meta http-equiv=\"refresh\" "
                       "content=\"%d\"><title>dsviz</title></head><body>",
                    refresh_s);
        else
            fputs("<!DOCTYPE html>\n<html><head><title>dsviz</title></head><body>", f);
        fprintf(f, "<p>No status document loaded yet.</p><p>%s</p></body></html>\n",
                errs ? errs : "");
    }
    free(errs);
    ds_viz_free(&v);
    if (f && fclose(f) != 0)
        e = -ENOMEM;
    if (e < 0) {
        free(body);
        return e;
    }
    *out = body;
    *out_len = len;
    return 0;
}

static enum MHD_Result serve_request(void *cls, struct MHD_Connection *c, const char *url,
                                     const char *method, const char *version,
                                     const char *upload, size_t *upload_size, void **ctx)
{
    ds_viz_server *s = cls;
    (void)version;
    (void)upload;
    if (*ctx) { /* a body: ignored */
        *upload_size = 0;
        return MHD_YES;
    }
    *ctx = s;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return serve_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8",
                          strdup("only GET and HEAD\n"), 18);
    if (strcmp(url, "/"))
        return serve_text(c, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8",
                          strdup("not found: try /\n"), 17);
    const double r = query_num(c, "round", 9007199254740992.0);
    const double sg = query_num(c, "segment", 65535);
    char *body = NULL;
    size_t len = 0;
    if (ds_viz_live_page(s->hist, s->sources, s->n, s->timeout_ms, s->refresh_s, r, sg, &body,
                         &len) < 0)
        return serve_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8",
                          strdup("could not draw\n"), 15);
    return serve_text(c, MHD_HTTP_OK, "text/html; charset=utf-8", body, len);
}

int ds_viz_serve_start(ds_viz_server **out, const char *listen, char *const *sources, int n,
                       int timeout_ms, int refresh_s, unsigned history_rounds, char *err,
                       size_t err_len)
{
    *out = NULL;
    if (history_rounds < 1 || history_rounds > DS_VIZ_HISTORY_MAX) {
        snprintf(err, err_len, "--history: expected 1..%d, found %u", DS_VIZ_HISTORY_MAX,
                 history_rounds);
        return -EINVAL;
    }
    ds_hostport hp;
    if (ds_hostport_parse(listen, &hp) < 0) {
        snprintf(err, err_len, "--serve: expected host:port, found '%s'", listen);
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)hp.port);
    const int g = getaddrinfo(hp.host, port, &hints, &ai);
    if (g != 0) {
        snprintf(err, err_len, "--serve %s: %s", listen, gai_strerror(g));
        return -EHOSTUNREACH;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen_fd(fd) < 0) {
        const int e = -errno;
        snprintf(err, err_len, "--serve %s: %s", listen, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return e;
    }
    freeaddrinfo(ai);
    ds_viz_server *s = calloc(1, sizeof(*s));
    if (!s) {
        close(fd);
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    if (ds_viz_hist_new(&s->hist, history_rounds) < 0) {
        close(fd);
        free(s);
        snprintf(err, err_len, "out of memory");
        return -ENOMEM;
    }
    s->fd = fd;
    s->sources = sources;
    s->n = n;
    s->timeout_ms = timeout_ms;
    s->refresh_s = refresh_s;
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(sa);
    char host[64] = "?";
    unsigned bound = 0;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0) {
        if (sa.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, host, sizeof(host));
            bound = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
        } else {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, host, sizeof(host));
            bound = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        }
    }
    if (ds_hostport_format(host, (uint16_t)bound, s->addr, sizeof(s->addr)) < 0)
        snprintf(s->addr, sizeof(s->addr), "?");
    /* One internal thread serves every connection: the handler needs no
     * lock, and a slow source costs the page time, never the nodes. */
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                            serve_request, s, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (!s->d) {
        close(fd);
        ds_viz_hist_free(&s->hist);
        free(s);
        snprintf(err, err_len, "--serve %s: libmicrohttpd did not start", listen);
        return -EIO;
    }
    *out = s;
    return 0;
}

int ds_viz_serve_addr(const ds_viz_server *s, char *buf, size_t n)
{
    if ((size_t)snprintf(buf, n, "%s", s->addr) >= n)
        return -ENOSPC;
    return 0;
}

const ds_viz_hist *ds_viz_serve_hist(const ds_viz_server *s)
{
    return s->hist;
}

void ds_viz_serve_stop(ds_viz_server **ps)
{
    ds_viz_server *s = *ps;
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    close(s->fd);
    ds_viz_hist_free(&s->hist);
    free(s);
    *ps = NULL;
}
