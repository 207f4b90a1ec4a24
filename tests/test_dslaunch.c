/*
 * tests/test_dslaunch.c: dslaunch, the cluster launcher (tools/dslaunch).
 *
 * Suites in one binary, registered separately in meson:
 *
 *   dslaunch_parts  (unit)  the pieces on their own: key=value and log-line
 *                           parsing, JSON output, the consensus distance on
 *                           model files with known answers and on corrupt
 *                           files, spawning (exec errors, capture, timeouts,
 *                           a child that dies with its parent), port probing.
 *   dslaunch_cli    (unit)  the real dslaunch binary on bad input: every
 *                           error is clear and exits 2, nothing is started.
 *   dslaunch_run    (slow)  real clusters of dsnode processes: two nodes
 *                           train and report in JSON with every file in
 *                           place; SIGINT stops and reaps every node; a
 *                           SIGKILLed node does not stop the others;
 *                           --timeout; --add-at.
 *   dslaunch_netns  (slow)  --netns / --netns-rate, as root only (skipped
 *                           otherwise): rate-limited nodes train, every
 *                           namespace goes at the end, on SIGINT, and
 *                           when a dead run left some.
 *
 * Every run goes to a fresh directory under /tmp. dslaunch is started with
 * PR_SET_PDEATHSIG (ds_proc_spawn), so it dies with the test, and its nodes
 * die with it; the suite's fini also SIGKILLs any process whose command line
 * names the run directory, so nothing outlives a failed test.
 *
 * meson passes the binaries in DSLAUNCH and DSNODE (env), and the examples
 * directory as DS_CONF_EXAMPLES_DIR.
 * Run: meson test -C build dslaunch_parts dslaunch_cli dslaunch_run --verbose
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "node/sec/crypto.h"
#include "testutil.h"
#include "tools/dslaunch/dslaunch.h"

#ifndef DS_CONF_EXAMPLES_DIR
#error "meson passes DS_CONF_EXAMPLES_DIR"
#endif
#define BASE_CONFIG DS_CONF_EXAMPLES_DIR "/cluster.ini"

/* ---- temp directory and cleanup ------------------------------------------- */

static char tmpdir[64];
static pid_t launched = -1; /* a dslaunch still to be killed on failure */

static void tmp_init(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ds_test_dslaunch.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

/* The pids of every process whose command line contains `needle`. */
static int procs_with(const char *needle, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid())
            continue;
        char path[64], buf[8192];
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (r <= 0)
            continue;
        for (ssize_t i = 0; i < r; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[r] = '\0';
        if (strstr(buf, needle) && n < max)
            out[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

static void tmp_fini(void)
{
    if (launched > 0) {
        kill(launched, SIGKILL);
        waitpid(launched, NULL, 0);
        launched = -1;
    }
    /* Nodes die with dslaunch (PDEATHSIG); make sure of it. */
    if (tmpdir[0]) {
        pid_t left[64];
        int n = procs_with(tmpdir, left, 64);
        for (int i = 0; i < n; i++)
            kill(left[i], SIGKILL);
    }
    if (tmpdir[0] && nftw(tmpdir, remove_one, 8, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "test_dslaunch: could not remove %s\n", tmpdir);
}

static const char *tmp_path(const char *name)
{
    static char path[16][512]; /* a test uses at most 16 at once */
    static int slot;
    char *p = path[slot++ % 16];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A model file: header with count hdr_n, then the n floats given. */
static void write_model(const char *path, uint64_t hdr_n, const float *v, size_t n)
{
    unsigned char hdr[16] = "DSMODEL1";
    for (int i = 0; i < 8; i++)
        hdr[8 + i] = (unsigned char)(hdr_n >> (8 * i));
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(hdr, 1, 16, f), 16);
    cr_assert_eq(fwrite(v, sizeof(float), n, f), n);
    cr_assert_eq(fclose(f), 0);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (len + 2 > cap) {
            cap = cap ? 2 * cap : 4096;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        buf[len++] = (char)c;
    }
    fclose(f);
    if (!buf)
        buf = calloc(1, 1);
    else
        buf[len] = '\0';
    return buf;
}

/* ---- a small strict JSON reader, to check dslaunch's output ---------------- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    enum jtype t;
    double num;
    int b;
    char *str;
    int n;
    char **keys; /* J_OBJ */
    struct jv **items;
} jv;

static void jfree(jv *v)
{
    if (!v)
        return;
    for (int i = 0; i < v->n; i++) {
        if (v->keys)
            free(v->keys[i]);
        jfree(v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v->str);
    free(v);
}

static void jws(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r')
        (*p)++;
}

static jv *jparse(const char **p, int depth);

static char *jstring(const char **p)
{
    if (**p != '"')
        return NULL;
    (*p)++;
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    while (s && **p != '"') {
        unsigned char c = (unsigned char)**p;
        if (!c || c < 0x20) {
            free(s);
            return NULL;
        }
        if (c == '\\') {
            (*p)++;
            char e = **p;
            if (e == 'u') {
                unsigned v = 0;
                for (int i = 1; i <= 4; i++) {
                    char h = (*p)[i];
                    int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (d < 0) {
                        free(s);
                        return NULL;
                    }
                    v = v * 16 + (unsigned)d;
                }
                c = v < 0x80 ? (unsigned char)v : '?';
                *p += 4;
            } else {
                const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
                const char *k = e ? strchr(from, e) : NULL;
                if (!k) {
                    free(s);
                    return NULL;
                }
                c = (unsigned char)to[k - from];
            }
        }
        if (len + 2 > cap) {
            char *ns = realloc(s, cap *= 2);
            if (!ns) {
                free(s);
                return NULL;
            }
            s = ns;
        }
        s[len++] = (char)c;
        (*p)++;
    }
    if (!s)
        return NULL;
    (*p)++;
    s[len] = '\0';
    return s;
}

static int jpush(jv *v, char *key, jv *item)
{
    char **nk = v->t == J_OBJ ? realloc(v->keys, (size_t)(v->n + 1) * sizeof(char *)) : NULL;
    if (v->t == J_OBJ) {
        if (!nk)
            return -1;
        v->keys = nk;
        v->keys[v->n] = key;
    }
    jv **ni = realloc(v->items, (size_t)(v->n + 1) * sizeof(jv *));
    if (!ni)
        return -1;
    v->items = ni;
    v->items[v->n++] = item;
    return 0;
}

static jv *jparse(const char **p, int depth)
{
    jws(p);
    jv *v = calloc(1, sizeof(*v));
    if (!v || depth > 32)
        goto fail;
    if (**p == '{' || **p == '[') {
        const char close = **p == '{' ? '}' : ']';
        v->t = **p == '{' ? J_OBJ : J_ARR;
        (*p)++;
        jws(p);
        if (**p == close) {
            (*p)++;
            return v;
        }
        for (;;) {
            char *key = NULL;
            jws(p);
            if (v->t == J_OBJ) {
                if (!(key = jstring(p)))
                    goto fail;
                jws(p);
                if (**p != ':') {
                    free(key);
                    goto fail;
                }
                (*p)++;
            }
            jv *item = jparse(p, depth + 1);
            if (!item || jpush(v, key, item) < 0) {
                free(key);
                jfree(item);
                goto fail;
            }
            jws(p);
            if (**p == ',') {
                (*p)++;
                continue;
            }
            if (**p != close)
                goto fail;
            (*p)++;
            return v;
        }
    }
    if (**p == '"') {
        v->t = J_STR;
        if (!(v->str = jstring(p)))
            goto fail;
        return v;
    }
    if (!strncmp(*p, "null", 4)) {
        *p += 4;
        return v;
    }
    if (!strncmp(*p, "true", 4) || !strncmp(*p, "false", 5)) {
        v->t = J_BOOL;
        v->b = **p == 't';
        *p += v->b ? 4 : 5;
        return v;
    }
    /* a number: its text must pass the JSON grammar on its own */
    const char *start = *p;
    while (**p && strchr("+-0123456789.eE", **p))
        (*p)++;
    char num[64];
    size_t nl = (size_t)(*p - start);
    if (nl == 0 || nl >= sizeof(num))
        goto fail;
    memcpy(num, start, nl);
    num[nl] = '\0';
    if (!ds_json_is_number(num))
        goto fail;
    v->t = J_NUM;
    v->num = strtod(num, NULL);
    return v;
fail:
    jfree(v);
    return NULL;
}

/* The whole text must be one JSON value. */
static jv *jparse_all(const char *text)
{
    const char *p = text;
    jv *v = jparse(&p, 0);
    if (!v)
        return NULL;
    jws(&p);
    if (*p) {
        jfree(v);
        return NULL;
    }
    return v;
}

static const jv *jget(const jv *o, const char *key)
{
    if (!o || o->t != J_OBJ)
        return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key))
            return o->items[i];
    return NULL;
}

static double jnum(const jv *o, const char *key)
{
    const jv *v = jget(o, key);
    cr_assert(v && v->t == J_NUM, "JSON key '%s' is not a number", key);
    return v->num;
}

static const char *jstr(const jv *o, const char *key)
{
    const jv *v = jget(o, key);
    cr_assert(v && v->t == J_STR, "JSON key '%s' is not a string", key);
    return v->str;
}

/* ================================================================================ */
/* dslaunch_parts                                                                   */
/* ================================================================================ */

TestSuite(dslaunch_parts, .init = tmp_init, .fini = tmp_fini, .timeout = 60);

Test(dslaunch_parts, kv_parse)
{
    ds_kvline l;
    cr_assert_eq(ds_kv_parse("summary node=n3 status=done steps=3000 junk =x y= a=b=c "
                             "test_acc=0.8700 steps=1",
                             &l), 6);
    cr_assert_str_eq(ds_kv_get(&l, "node"), "n3");
    cr_assert_str_eq(ds_kv_get(&l, "steps"), "3000", "the first value of a repeated key wins");
    cr_assert_str_eq(ds_kv_get(&l, "y"), "");
    cr_assert_str_eq(ds_kv_get(&l, "a"), "b=c");
    cr_assert_null(ds_kv_get(&l, "junk"));
    cr_assert_null(ds_kv_get(&l, ""));
    double d;
    cr_assert_eq(ds_kv_get_double(&l, "test_acc", &d), 0);
    cr_assert_eq(d, 0.87);
    cr_assert_eq(ds_kv_get_double(&l, "status", &d), -EINVAL);
    cr_assert_eq(ds_kv_get_double(&l, "y", &d), -EINVAL);
    cr_assert_eq(ds_kv_get_double(&l, "missing", &d), -ENOENT);

    /* numbers strtod would take but dsnode never writes */
    const char *bad[] = {"x=0x10", "x=inf", "x=nan", "x=1.", "x=.5", "x=+1", "x=1e", "x=01"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ds_kv_parse(bad[i], &l);
        cr_assert_eq(ds_kv_get_double(&l, "x", &d), -EINVAL, "%s", bad[i]);
    }
    /* long values are cut, long keys dropped, and the pair count bounded */
    char big[600];
    memset(big, 'v', sizeof(big));
    memcpy(big, "k=", 2);
    big[sizeof(big) - 1] = '\0';
    cr_assert_eq(ds_kv_parse(big, &l), 1);
    cr_assert_eq(strlen(ds_kv_get(&l, "k")), DS_KV_VAL_MAX - 1);
    memset(big, 'k', 100);
    strcpy(big + 100, "=1");
    cr_assert_eq(ds_kv_parse(big, &l), 0);
    char many[4096] = "";
    for (int i = 0; i < DS_KV_MAX + 10; i++)
        sprintf(many + strlen(many), "k%d=%d ", i, i);
    cr_assert_eq(ds_kv_parse(many, &l), DS_KV_MAX);
}

Test(dslaunch_parts, logline_split)
{
    char a[] = "2026-12-02T16:43:23.628Z info n3 train step=200 loss=0.6894 samples_per_s=54001";
    ds_logline ll;
    cr_assert_eq(ds_logline_split(a, &ll), 0);
    cr_assert_str_eq(ll.level, "info");
    cr_assert_str_eq(ll.node, "n3");
    cr_assert_str_eq(ll.component, "train");
    cr_assert_str_eq(ll.msg, "step=200 loss=0.6894 samples_per_s=54001");

    char b[] = "2026-12-02T16:43:23.628Z warn n3 eval";
    cr_assert_eq(ds_logline_split(b, &ll), 0);
    cr_assert_str_eq(ll.component, "eval");
    cr_assert_str_eq(ll.msg, "");

    const char *bad[] = {"summary node=n3 status=done steps=1", "2026 loud n3 train x=1",
                         "2026 info n3", "", "   ", "x info n3 train step=1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char buf[128];
        snprintf(buf, sizeof(buf), "%s", bad[i]);
        cr_assert_eq(ds_logline_split(buf, &ll), -EINVAL, "'%s'", bad[i]);
        cr_assert_str_eq(buf, bad[i], "a refused line is left as it was");
    }
}

Test(dslaunch_parts, json_output)
{
    const char *good[] = {"0", "-0", "12", "0.87", "-1.5e-3", "1E+9", "60000"};
    const char *bad[] = {"", "-", "01", "1.", ".5", "+1", "1e", "inf", "nan", "0x1", "1 ", "cpu"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_assert(ds_json_is_number(good[i]), "%s", good[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert(!ds_json_is_number(bad[i]), "%s", bad[i]);

    /* dsnode's text as JSON values: control bytes escaped, UTF-8 kept (as
     * \u escapes: the output is ASCII), bytes that are not UTF-8 read as
     * Latin-1, numbers passed through when the whole value is one. */
    json_t *a = json_array();
    cr_assert_not_null(a);
    cr_assert_eq(json_array_append_new(a, ds_json_text("a\"b\\c\n\x01\xc3\xa9")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text("\xff\x7f")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_number(0.25)), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_number(NAN)), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_number(INFINITY)), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_number(1.0 / 3)), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text_or_number("cpu-avx512")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text_or_number("123")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text_or_number("0.8712")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text_or_number("99999999999999999999")), 0);
    cr_assert_eq(json_array_append_new(a, ds_json_text_or_number("1e999")), 0);
    json_t *o = json_object();
    cr_assert_not_null(o);
    cr_assert_eq(ds_json_set(o, "k\xff", ds_json_text(NULL)), 0);
    cr_assert_eq(json_array_append_new(a, o), 0);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(ds_json_write_line(f, a, 0), 0);
    fclose(f);
    cr_assert_str_eq(buf, "[\"a\\\"b\\\\c\\n\\u0001\\u00E9\", \"\\u00FF\x7f\", 0.25, null, null, "
                          "0.3333333333, \"cpu-avx512\", 123, 0.8712, 1e20, \"1e999\", "
                          "{\"k\\u00FF\": null}]\n");
    /* jansson reads back what it wrote, to the same values. */
    json_error_t jerr;
    json_t *back = json_loads(buf, 0, &jerr);
    cr_assert_not_null(back, "%s", jerr.text);
    cr_assert_str_eq(json_string_value(json_array_get(back, 0)), "a\"b\\c\n\x01\xc3\xa9");
    cr_assert(json_equal(back, a));
    json_decref(back);
    free(buf);

    /* compact: no blanks */
    buf = NULL;
    f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(ds_json_write_line(f, o, 1), 0);
    fclose(f);
    cr_assert_str_eq(buf, "{\"k\\u00FF\":null}\n");
    free(buf);
    json_decref(a);
}

Test(dslaunch_parts, consensus_known_values)
{
    const float a[2] = {3, 4}, b[2] = {1, 0};
    write_model(tmp_path("a.bin"), 2, a, 2);
    write_model(tmp_path("b.bin"), 2, b, 2);
    const char *paths[2] = {tmp_path("a.bin"), tmp_path("b.bin")};
    int st[2];
    ds_consensus c;
    cr_assert_eq(ds_consensus_compute(paths, 2, st, &c, NULL), 0);
    /* mean (2,2); each model sqrt(5) from it; |mean| = 2 sqrt(2) */
    cr_assert_eq(c.n_models, 2);
    cr_assert_eq(c.n_params, 2);
    cr_assert(ds_t_close_d(c.abs, sqrt(5.0), 1e-12, 1e-12), "abs %.17g", c.abs);
    cr_assert(ds_t_close_d(c.mean_norm, 2 * sqrt(2.0), 1e-12, 1e-12));
    cr_assert(ds_t_close_d(c.rel, sqrt(5.0) / (2 * sqrt(2.0)), 1e-12, 1e-12), "rel %.17g", c.rel);

    /* identical models: distance 0 */
    const char *same[2] = {paths[0], paths[0]};
    cr_assert_eq(ds_consensus_compute(same, 2, NULL, &c, NULL), 0);
    cr_assert_eq(c.rel, 0.0);

    /* zero mean: relative distance undefined, absolute still there */
    const float p[2] = {1, 0}, m[2] = {-1, 0};
    write_model(tmp_path("p.bin"), 2, p, 2);
    write_model(tmp_path("m.bin"), 2, m, 2);
    const char *pm[2] = {tmp_path("p.bin"), tmp_path("m.bin")};
    cr_assert_eq(ds_consensus_compute(pm, 2, NULL, &c, NULL), 0);
    cr_assert(isnan(c.rel));
    cr_assert(ds_t_close_d(c.abs, 1.0, 1e-12, 0));

    /* one model: nothing to compare */
    cr_assert_eq(ds_consensus_compute(paths, 1, NULL, &c, NULL), 0);
    cr_assert_eq(c.n_models, 1);
    cr_assert(isnan(c.rel) && isnan(c.abs));
}

Test(dslaunch_parts, consensus_streams_large_models)
{
    /* Longer than two chunks and odd, against a direct computation. */
    enum { N = 40001, M = 3 };
    static float v[M][N];
    const char *paths[M];
    for (int i = 0; i < M; i++) {
        char name[16];
        snprintf(name, sizeof(name), "L%d.bin", i);
        ds_t_fill(v[i], N, 1000 + (uint64_t)i, -1.0f + (float)i * 0.1f, 1.0f);
        paths[i] = strdup(tmp_path(name));
        write_model(paths[i], N, v[i], N);
    }
    double norm2 = 0, dist[M] = {0};
    for (size_t j = 0; j < N; j++) {
        double mean = 0;
        for (int i = 0; i < M; i++)
            mean += v[i][j];
        mean /= M;
        norm2 += mean * mean;
        for (int i = 0; i < M; i++)
            dist[i] += (v[i][j] - mean) * (v[i][j] - mean);
    }
    double want = 0;
    for (int i = 0; i < M; i++)
        want += sqrt(dist[i]);
    want /= M;
    ds_consensus c;
    cr_assert_eq(ds_consensus_compute(paths, M, NULL, &c, NULL), 0);
    cr_assert_eq(c.n_models, M);
    cr_assert_eq(c.n_params, N);
    cr_assert(ds_t_close_d(c.abs, want, 0, 1e-10), "abs %.17g want %.17g", c.abs, want);
    cr_assert(ds_t_close_d(c.rel, want / sqrt(norm2), 0, 1e-10), "rel %.17g", c.rel);
    for (int i = 0; i < M; i++)
        free((void *)paths[i]);
}

Test(dslaunch_parts, consensus_leaves_out_bad_files)
{
    const float a[5] = {1, 2, 3, 4, 5}, b[5] = {2, 2, 2, 2, 2}, six[6] = {0};
    const float nan5[5] = {1, 2, NAN, 4, 5};
    write_model(tmp_path("a"), 5, a, 5);
    write_model(tmp_path("b"), 5, b, 5);
    unsigned char magic[16 + 20] = "DSMODEL2"; /* right size for 5 values, wrong magic */
    magic[8] = 5;
    write_bytes(tmp_path("magic"), magic, sizeof(magic));
    write_model(tmp_path("short"), 5, a, 4);
    write_model(tmp_path("long"), 5, six, 6);
    write_model(tmp_path("nan"), 5, nan5, 5);
    write_model(tmp_path("six"), 6, six, 6);
    write_bytes(tmp_path("tiny"), "DSMO", 4);
    const char *paths[] = {tmp_path("a"),    tmp_path("magic"), tmp_path("short"),
                           tmp_path("long"), tmp_path("nan"),   tmp_path("six"),
                           NULL,             tmp_path("absent"), tmp_path("tiny")};
    const int want[] = {0, -EPROTO, -EMSGSIZE, -EMSGSIZE, -EDOM, -EXDEV, -ENOENT, -ENOENT, -EPROTO};
    enum { N = sizeof(paths) / sizeof(paths[0]) };
    const char *with_b[N + 1];
    memcpy(with_b, paths, sizeof(paths));
    with_b[N] = tmp_path("b");
    int st[N + 1];
    ds_consensus c;
    char *msgs = NULL;
    size_t ml = 0;
    FILE *warn = open_memstream(&msgs, &ml);
    cr_assert_eq(ds_consensus_compute(with_b, N + 1, st, &c, warn), 0);
    fclose(warn);
    for (int i = 0; i < N; i++)
        cr_assert_eq(st[i], want[i], "file %d (%s): status %d, want %d", i,
                     paths[i] ? paths[i] : "NULL", st[i], want[i]);
    cr_assert_eq(st[N], 0);
    cr_assert_eq(c.n_models, 2);
    /* a and b: mean (1.5,2,2.5,3,3.5); each 0.5*|(-1,0,1,2,3)| = 0.5*sqrt(15) away */
    cr_assert(ds_t_close_d(c.abs, 0.5 * sqrt(15.0), 1e-12, 1e-12), "abs %.17g", c.abs);
    cr_assert_not_null(strstr(msgs, "not finite"), "messages: %s", msgs);
    cr_assert_not_null(strstr(msgs, "no DSMODEL1 header"), "messages: %s", msgs);
    free(msgs);

    uint64_t n;
    char err[256];
    cr_assert_eq(ds_model_check(tmp_path("short"), &n, err, sizeof(err)), -EMSGSIZE);
    cr_assert_not_null(strstr(err, "header says 5 values"), "%s", err);
}

Test(dslaunch_parts, spawn_capture_and_exec_errors)
{
    char err[256], *out, *etext;
    int code, fo, fe;
    char *missing[] = {"/nonexistent/dsnode", "run", NULL};
    cr_assert_eq(ds_proc_spawn(missing, &fo, &fe, err, sizeof(err)), -ENOENT);
    cr_assert_not_null(strstr(err, "cannot run /nonexistent/dsnode"), "%s", err);

    char *sh[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    cr_assert_eq(ds_proc_capture(sh, 10000, &out, &etext, &code, err, sizeof(err)), 0, "%s", err);
    cr_assert_str_eq(out, "out\n");
    cr_assert_str_eq(etext, "err\n");
    cr_assert_eq(code, 3);
    free(out);
    free(etext);

    char *slow[] = {"/bin/sh", "-c", "echo early; exec sleep 30", NULL};
    cr_assert_eq(ds_proc_capture(slow, 300, &out, &etext, &code, err, sizeof(err)), -ETIMEDOUT);
    cr_assert_str_eq(out, "early\n");
    cr_assert_eq(code, 128 + SIGKILL);
    free(out);
    free(etext);

    char *selfkill[] = {"/bin/sh", "-c", "kill -TERM $$", NULL};
    cr_assert_eq(ds_proc_capture(selfkill, 10000, &out, &etext, &code, err, sizeof(err)), 0);
    cr_assert_eq(code, 128 + SIGTERM);
    free(out);
    free(etext);
}

static int alive(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t r = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[r] = '\0';
    const char *close = strrchr(buf, ')');
    return !(close && close[1] == ' ' && close[2] == 'Z');
}

Test(dslaunch_parts, child_dies_with_its_parent)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t mid = fork();
    cr_assert_geq(mid, 0);
    if (mid == 0) {
        char err[256];
        int fo, fe;
        char *argv[] = {"/bin/sleep", "30", NULL};
        pid_t c = ds_proc_spawn(argv, &fo, &fe, err, sizeof(err));
        if (write(p[1], &c, sizeof(c)) != sizeof(c))
            _exit(2);
        _exit(0); /* dies with its child still running */
    }
    close(p[1]);
    pid_t child = -1;
    cr_assert_eq(read(p[0], &child, sizeof(child)), (ssize_t)sizeof(child));
    close(p[0]);
    waitpid(mid, NULL, 0);
    cr_assert_gt(child, 0);
    int gone = 0;
    for (int i = 0; i < 250 && !gone; i++) {
        gone = !alive(child);
        if (!gone)
            usleep(20000);
    }
    if (!gone)
        kill(child, SIGKILL);
    cr_assert(gone, "the grandchild %d outlived its parent by 5 s", (int)child);
}

Test(dslaunch_parts, ports)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(s, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t al = sizeof(a);
    cr_assert_eq(getsockname(s, (struct sockaddr *)&a, &al), 0);
    const int busy = ntohs(a.sin_port);
    cr_assert_eq(ds_port_range_free(busy, 1), 0);
    int base = ds_port_find(busy, 3);
    cr_assert_geq(base, 1024);
    cr_assert(busy < base || busy >= base + 3, "block %d..%d holds the busy port %d", base,
              base + 2, busy);
    cr_assert_eq(ds_port_range_free(base, 3), 1);
    cr_assert_eq(ds_port_range_free(65535, 2), 0, "ports past 65535 do not exist");
    close(s);
}

Test(dslaunch_parts, netns_rates_names_and_addresses)
{
    uint64_t bps = 0;
    cr_assert_eq(ds_netns_rate_parse("100mbit", &bps), 0);
    cr_assert_eq(bps, 100000000ull);
    cr_assert_eq(ds_netns_rate_parse("1Gbit", &bps), 0);
    cr_assert_eq(bps, 1000000000ull);
    cr_assert_eq(ds_netns_rate_parse("1.5gbit", &bps), 0);
    cr_assert_eq(bps, 1500000000ull);
    cr_assert_eq(ds_netns_rate_parse("8kbit", &bps), 0);
    cr_assert_eq(bps, 8000ull);
    static const char *const bad[] = {"", "100", "mbit", "100 mbit", "100mb", "-1mbit",
                                      "1e3mbit", "0x10mbit", "1..5mbit", "nanmbit"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(ds_netns_rate_parse(bad[i], &bps), -EINVAL, "'%s' accepted", bad[i]);
    cr_assert_eq(ds_netns_rate_parse(NULL, &bps), -EINVAL);
    cr_assert_eq(ds_netns_rate_parse("7kbit", &bps), -ERANGE);
    cr_assert_eq(ds_netns_rate_parse("101gbit", &bps), -ERANGE);

    /* addresses: distinct, all inside 10.213.0.0/16, never .0 or .255 */
    char a[48], b[48];
    ds_netns_addr(0, a, sizeof(a));
    cr_assert_str_eq(a, "10.213.1.1");
    ds_netns_addr(199, a, sizeof(a));
    cr_assert_str_eq(a, "10.213.1.200");
    ds_netns_addr(200, a, sizeof(a));
    cr_assert_str_eq(a, "10.213.2.1");
    for (int i = 0; i < DS_NETNS_MAX; i++) {
        ds_netns_addr(i, a, sizeof(a));
        unsigned x, y;
        cr_assert_eq(sscanf(a, "10.213.%u.%u", &x, &y), 2, "%s", a);
        cr_assert(x >= 1 && x <= 254 && y >= 1 && y <= 254, "%s", a);
        for (int j = 0; j < i; j += 37) {
            ds_netns_addr(j, b, sizeof(b));
            cr_assert_str_neq(a, b);
        }
    }

    /* names: a run's own namespaces and bridge map back to its pid, and
     * nothing else is taken for ours */
    ds_netns ns;
    char err[256];
    int ret = ds_netns_init(&ns, 4194303, 3, 0, err, sizeof(err));
    if (ret == -ENOENT)
        cr_skip_test("no ip/tc programs: %s", err);
    cr_assert_eq(ret, 0, "%s", err);
    cr_assert_lt(strlen(ns.bridge), 16, "interface names fit IFNAMSIZ: %s", ns.bridge);
    long pid = 0;
    cr_assert_eq(ds_netns_stale_owner(ns.bridge, &pid), 1, "%s", ns.bridge);
    cr_assert_eq(pid, 4194303);
    ds_netns_name(&ns, 2, a, sizeof(a));
    cr_assert_str_eq(a, "dsl-4194303-n2");
    pid = 0;
    cr_assert_eq(ds_netns_stale_owner(a, &pid), 1);
    cr_assert_eq(pid, 4194303);
    static const char *const others[] = {"docker0", "dsl-", "dsl-12", "dsl-12-n", "dsl-12-nx",
                                         "dsl-x-n1", "dslbr", "dsl_ab_br", "dslABbr", "eth0",
                                         "dsl-12-n1x", "br-1234"};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        cr_assert_eq(ds_netns_stale_owner(others[i], &pid), 0, "'%s' taken for ours", others[i]);
    cr_assert_eq(ds_netns_init(&ns, 1, 0, 0, err, sizeof(err)), -EINVAL);
    cr_assert_eq(ds_netns_init(&ns, 1, DS_NETNS_MAX + 1, 0, err, sizeof(err)), -EINVAL);
}

/* ================================================================================ */
/* running the binary                                                               */
/* ================================================================================ */

static const char *bin(const char *env)
{
    const char *p = getenv(env);
    cr_assert(p && *p, "meson sets %s", env);
    return p;
}

struct result {
    int code;
    char *out, *err;
};

static void result_free(struct result *r)
{
    free(r->out);
    free(r->err);
}

/* dslaunch with args (NULL-terminated), to completion. */
static struct result run_dslaunch(int timeout_ms, const char *const *args)
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)bin("DSLAUNCH");
    for (; *args && n < 63; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    struct result r = {0};
    char err[256];
    int ret = ds_proc_capture(argv, timeout_ms, &r.out, &r.err, &r.code, err, sizeof(err));
    cr_assert(ret == 0, "dslaunch: %s\nstderr:\n%s", err, r.err ? r.err : "");
    return r;
}

/* The last line of stdout, parsed. */
static jv *last_json(const char *out)
{
    const char *end = out + strlen(out);
    while (end > out && end[-1] == '\n')
        end--;
    const char *start = end;
    while (start > out && start[-1] != '\n')
        start--;
    char *line = strndup(start, (size_t)(end - start));
    cr_assert_not_null(line);
    jv *v = jparse_all(line);
    cr_assert_not_null(v, "the last line of stdout is not one JSON value: %s", line);
    free(line);
    return v;
}

/* ================================================================================ */
/* dslaunch_cli                                                                     */
/* ================================================================================ */

TestSuite(dslaunch_cli, .init = tmp_init, .fini = tmp_fini, .timeout = 60);

static void expect_error(const char *const *args, int code, const char *text)
{
    struct result r = run_dslaunch(30000, args);
    cr_assert_eq(r.code, code, "exit %d, want %d; stderr:\n%s", r.code, code, r.err);
    cr_assert_not_null(strstr(r.err, text), "stderr lacks '%s':\n%s", text, r.err);
    result_free(&r);
}

Test(dslaunch_cli, help_and_usage)
{
    const char *h[] = {"--help", NULL};
    struct result r = run_dslaunch(10000, h);
    cr_assert_eq(r.code, 0);
    cr_assert_not_null(strstr(r.out, "dslaunch local"));
    result_free(&r);
    const char *lh[] = {"local", "--help", NULL};
    r = run_dslaunch(10000, lh);
    cr_assert_eq(r.code, 0);
    cr_assert_not_null(strstr(r.out, "--add-at STEP:COUNT"));
    cr_assert_not_null(strstr(r.out, "--json"));
    result_free(&r);
    const char *none[] = {NULL};
    expect_error(none, 2, "usage: dslaunch local");
    const char *unk[] = {"cluster", NULL};
    expect_error(unk, 2, "unknown command 'cluster'");
}

Test(dslaunch_cli, bad_arguments)
{
    const char *out = tmp_path("run");
    const char *no_n[] = {"local", "--config", BASE_CONFIG, "--out", out, NULL};
    expect_error(no_n, 2, "-n N is required");
    const char *no_conf[] = {"local", "-n", "2", "--out", out, NULL};
    expect_error(no_conf, 2, "--config FILE is required");
    const char *zero[] = {"local", "-n", "0", "--config", BASE_CONFIG, NULL};
    expect_error(zero, 2, "-n expects a node count in 1..256, found '0'");
    const char *many[] = {"local", "-n", "257", "--config", BASE_CONFIG, NULL};
    expect_error(many, 2, "found '257'");
    const char *junk[] = {"local", "-n", "2x", "--config", BASE_CONFIG, NULL};
    expect_error(junk, 2, "found '2x'");
    const char *unknown[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--bogus", NULL};
    expect_error(unknown, 2, "unknown argument '--bogus'");
    const char *set[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--set", "train.lr", NULL};
    expect_error(set, 2, "--set expects section.key=value");
    const char *add[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--add-at", "5", NULL};
    expect_error(add, 2, "--add-at expects STEP:COUNT");
    const char *add0[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--add-at", "0:1", NULL};
    expect_error(add0, 2, "STEP >= 1");
    const char *addmany[] = {"local", "-n", "200", "--config", BASE_CONFIG, "--add-at", "5:100",
                             NULL};
    expect_error(addmany, 2, "300 nodes in all");
    const char *tmo[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--timeout", "-1", NULL};
    expect_error(tmo, 2, "--timeout expects seconds > 0");
    const char *port[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--port-base", "80", NULL};
    expect_error(port, 2, "--port-base expects a port in 1024..65535");
    struct stat st;
    cr_assert(stat(out, &st) < 0, "nothing was created for a refused command line");
}

Test(dslaunch_cli, bad_files_and_programs)
{
    const char *out = tmp_path("run");
    const char *dsnode = bin("DSNODE");
    const char *noconf[] = {"local", "-n", "2", "--config", "/nonexistent/base.ini", "--out", out,
                            "--dsnode", dsnode, NULL};
    expect_error(noconf, 2, "cannot read the config /nonexistent/base.ini: No such file");
    const char *nobin[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--dsnode",
                           "/nonexistent/dsnode", NULL};
    expect_error(nobin, 2, "--dsnode /nonexistent/dsnode: No such file or directory");
    /* A value dsnode refuses: dsnode's own message comes through. No
     * --dsnode: this also finds the dsnode built beside dslaunch. */
    const char *badset[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--set",
                            "train.lr=abc", NULL};
    expect_error(badset, 2, "train.lr: expected a number in (0, 10], found 'abc'");
    const char *badkey[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--set",
                            "train.lrr=1", "--dsnode", dsnode, NULL};
    expect_error(badkey, 2, "unknown key 'lrr' in [train]; did you mean 'lr'?");
    const char *late[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--set",
                          "train.steps=200", "--add-at", "201:1", "--dsnode", dsnode, NULL};
    expect_error(late, 2, "the nodes stop at train.steps = 200");
    struct stat st;
    cr_assert(stat(out, &st) < 0, "nothing was created for a refused config");

    /* a run directory that is not empty */
    cr_assert_eq(mkdir(out, 0755), 0);
    write_bytes(tmp_path("run/old"), "x", 1);
    const char *used[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--dsnode",
                          dsnode, NULL};
    expect_error(used, 2, "is not empty; give a new --out");
}

/* ================================================================================ */
/* dslaunch_run: real clusters                                                      */
/* ================================================================================ */

TestSuite(dslaunch_run, .init = tmp_init, .fini = tmp_fini, .timeout = 200);

static int file_mode(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s: %s", path, strerror(errno));
    return (int)(st.st_mode & 07777);
}

/* `dsnode check-config FILE` accepts it; returns its dump (caller frees). */
static char *config_valid(const char *path)
{
    char *argv[] = {(char *)bin("DSNODE"), "check-config", (char *)path, NULL};
    char *out, *etext, err[256];
    int code;
    cr_assert_eq(ds_proc_capture(argv, 30000, &out, &etext, &code, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(code, 0, "dsnode check-config %s: %s", path, etext);
    free(etext);
    return out;
}

static void dump_value(const char *dump, const char *key, char *val, size_t len)
{
    const char *p = strstr(dump, key);
    cr_assert_not_null(p, "no '%s' in\n%s", key, dump);
    p += strlen(key);
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    cr_assert_lt(n, len);
    memcpy(val, p, n);
    val[n] = '\0';
}

static void check_node_ok(const jv *nodes, const char *name, double min_acc)
{
    const jv *n = jget(nodes, name);
    cr_assert_not_null(n, "node %s missing from the JSON", name);
    cr_assert_eq(jnum(n, "exit_status"), 0, "%s exit status", name);
    cr_assert_str_eq(jstr(n, "status"), "done");
    cr_assert_gt(jnum(n, "test_acc"), min_acc, "%s test_acc %.4f", name, jnum(n, "test_acc"));
    cr_assert_geq(jnum(n, "bytes_sent"), 0);
    cr_assert_geq(jnum(n, "bytes_received"), 0);
}

Test(dslaunch_run, two_nodes_train_and_report)
{
    const char *out = tmp_path("run");
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=200", "--set", "train.eval_every=100",
                          "--set", "train.backend=cpu", "--out", out, "--json",
                          "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct result r = run_dslaunch(180000, args);
    cr_assert_eq(r.code, 0, "dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    jv *j = last_json(r.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->t == J_OBJ && nodes->n == 2, "two nodes in the JSON");
    check_node_ok(nodes, "n0", 0.7);
    check_node_ok(nodes, "n1", 0.7);
    cr_assert_eq(jnum(jget(nodes, "n0"), "steps"), 200);
    cr_assert_eq(jnum(jget(nodes, "n1"), "steps"), 200);
    cr_assert_eq(jnum(j, "consensus_models"), 2);
    cr_assert_geq(jnum(j, "consensus_distance"), 0);
    cr_assert_gt(jnum(j, "mean_test_acc"), 0.7);
    cr_assert_eq(jnum(j, "exit_status"), 0);
    cr_assert_eq(jget(j, "stopped_by")->t, J_NULL);
    cr_assert_not_null(strstr(r.out, "consensus distance (relative"), "%s", r.out);

    /* keys: secrets 0600, the allow-list holds both public keys under the
     * nodes' names */
    char p[512], err[512];
    snprintf(p, sizeof(p), "%s/cluster.key", out);
    cr_assert_eq(file_mode(p), 0600);
    ds_allowlist *al = NULL;
    snprintf(p, sizeof(p), "%s/allowed_keys", out);
    cr_assert_eq(ds_allowlist_load(&al, p, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_allowlist_count(al), 2);
    const char *names[2] = {"n0", "n1"};
    char listen[2][64], seeds[2][300], sl[2][64], dump_data[512];
    for (int i = 0; i < 2; i++) {
        ds_identity id;
        snprintf(p, sizeof(p), "%s/%s.key", out, names[i]);
        cr_assert_eq(file_mode(p), 0600, "%s", p);
        cr_assert_eq(ds_identity_load(&id, p, err, sizeof(err)), 0, "%s", err);
        cr_assert_eq(ds_allowlist_check(al, id.pk, names[i]), 0);
        cr_assert_eq(ds_allowlist_check(al, id.pk, names[1 - i]), -EPERM);
        ds_identity_wipe(&id);
        snprintf(p, sizeof(p), "%s/%s.key.pub", out, names[i]);
        cr_assert_eq(file_mode(p) & 0600, 0600);

        /* the config loads in dsnode, with this node's keys in it */
        snprintf(p, sizeof(p), "%s/%s.ini", out, names[i]);
        char *dump = config_valid(p);
        char v[300];
        dump_value(dump, "\nname = ", v, sizeof(v));
        cr_assert_str_eq(v, names[i]);
        dump_value(dump, "\nlisten = ", listen[i], sizeof(listen[i]));
        dump_value(dump, "\nseeds = ", seeds[i], sizeof(seeds[i]));
        dump_value(dump, "\ndata_dir = ", dump_data, sizeof(dump_data));
        snprintf(v, sizeof(v), "%s/%s", out, names[i]);
        cr_assert_str_eq(dump_data, v);
        dump_value(dump, "\nidentity_file = ", v, sizeof(v));
        cr_assert_not_null(strstr(v, ".key"));
        dump_value(dump, "\nsteps = ", v, sizeof(v));
        cr_assert_str_eq(v, "200", "the user's --set is in every node's config");
        /* cluster.ini serves a status page: each node gets its own port */
        dump_value(dump, "\n[status]\nlisten = ", sl[i], sizeof(sl[i]));
        free(dump);

        /* the final model and the log */
        uint64_t n;
        snprintf(p, sizeof(p), "%s/%s/model.bin", out, names[i]);
        cr_assert_eq(ds_model_check(p, &n, err, sizeof(err)), 0, "%s", err);
        cr_assert_gt(n, 0);
        snprintf(p, sizeof(p), "%s/%s.log", out, names[i]);
        char *log = read_text(p);
        cr_assert_not_null(log);
        cr_assert_not_null(strstr(log, " eval step=200 "), "log:\n%s", log);
        cr_assert_not_null(strstr(log, "summary node="), "the stdout line is in the log too");
        free(log);
    }
    ds_allowlist_free(&al);
    cr_assert_str_neq(listen[0], listen[1]);
    /* n0 founds the cluster: its own address comes first in its seeds;
     * n1 joins through n0. */
    char want[200];
    snprintf(want, sizeof(want), "%s, %s", listen[0], listen[1]);
    cr_assert_str_eq(seeds[0], want, "n0 is seeded with itself first, then n1");
    cr_assert_str_eq(seeds[1], listen[0], "n1 is seeded with n0");
    cr_assert_str_neq(sl[0], sl[1]);
    jfree(j);
    result_free(&r);
}

/* Reads whatever fd has without blocking; appends to *buf. */
static void slurp(int fd, char **buf, size_t *len)
{
    char tmp[4096];
    ssize_t r;
    while (fd >= 0 && (r = read(fd, tmp, sizeof(tmp))) > 0) {
        char *nb = realloc(*buf, *len + (size_t)r + 1);
        cr_assert_not_null(nb);
        *buf = nb;
        memcpy(*buf + *len, tmp, (size_t)r);
        *len += (size_t)r;
        (*buf)[*len] = '\0';
    }
}

/* A started dslaunch whose output we keep reading while we wait. */
struct live {
    pid_t pid;
    int fo, fe;
    char *out, *err;
    size_t ol, el;
};

static void live_start(struct live *l, const char *const *args)
{
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)bin("DSLAUNCH");
    for (; *args && n < 63; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    char err[256];
    memset(l, 0, sizeof(*l));
    l->pid = ds_proc_spawn(argv, &l->fo, &l->fe, err, sizeof(err));
    cr_assert_gt(l->pid, 0, "%s", err);
    launched = l->pid;
}

/* Waits up to ms for `pred` (polls every 50 ms, reading output meanwhile). */
static int live_wait(struct live *l, int ms, int (*pred)(void *), void *arg)
{
    for (int t = 0; t < ms; t += 50) {
        slurp(l->fo, &l->out, &l->ol);
        slurp(l->fe, &l->err, &l->el);
        if (pred(arg))
            return 1;
        usleep(50000);
    }
    return 0;
}

static int log_has_steps(void *arg)
{
    char *log = read_text((const char *)arg);
    int ok = log && strstr(log, " train step=");
    free(log);
    return ok;
}

/* Waits for dslaunch to exit (reading its output), up to ms. Exit code or -1. */
static int live_end(struct live *l, int ms)
{
    int ws;
    for (int t = 0; t < ms; t += 50) {
        slurp(l->fo, &l->out, &l->ol);
        slurp(l->fe, &l->err, &l->el);
        pid_t r = waitpid(l->pid, &ws, WNOHANG);
        if (r == l->pid) {
            launched = -1;
            usleep(10000);
            slurp(l->fo, &l->out, &l->ol);
            slurp(l->fe, &l->err, &l->el);
            close(l->fo);
            close(l->fe);
            l->fo = l->fe = -1;
            if (!l->out)
                l->out = calloc(1, 1);
            if (!l->err)
                l->err = calloc(1, 1);
            return ds_proc_exit_code(ws);
        }
        usleep(50000);
    }
    return -1;
}

static void no_process_left(const char *dir, const jv *nodes)
{
    pid_t left[16];
    int n = procs_with(dir, left, 16);
    cr_assert_eq(n, 0, "%d processes still name %s (first pid %d)", n, dir, n ? (int)left[0] : 0);
    for (int i = 0; i < nodes->n; i++) {
        const jv *pid = jget(nodes->items[i], "pid");
        cr_assert(pid && pid->t == J_NUM);
        cr_assert(!alive((pid_t)pid->num), "node %s (pid %d) is still alive", nodes->keys[i],
                  (int)pid->num);
    }
}

Test(dslaunch_run, sigint_stops_and_reaps_every_node)
{
    const char *out = tmp_path("run");
    char log0[512], log1[512];
    snprintf(log0, sizeof(log0), "%s/n0.log", out);
    snprintf(log1, sizeof(log1), "%s/n1.log", out);
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000000", "--set", "train.log_every=10",
                          "--set", "train.backend=cpu", "--out", out, "--json",
                          "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    cr_assert(live_wait(&l, 120000, log_has_steps, log0) && live_wait(&l, 60000, log_has_steps, log1),
              "the nodes never trained; stderr:\n%s", l.err ? l.err : "");
    cr_assert_eq(kill(l.pid, SIGINT), 0);
    int code = live_end(&l, 60000);
    cr_assert_eq(code, 128 + SIGINT, "dslaunch exit %d; stderr:\n%s", code, l.err);
    jv *j = last_json(l.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->n == 2);
    for (int i = 0; i < 2; i++) {
        const jv *n = nodes->items[i];
        cr_assert_neq(jnum(n, "exit_status"), 0, "a stopped node does not exit 0");
        cr_assert_eq(jnum(n, "exit_status"), 128 + SIGTERM, "dslaunch stops nodes with SIGTERM");
        cr_assert_str_eq(jstr(n, "status"), "stopped");
    }
    cr_assert_str_eq(jstr(j, "stopped_by"), "SIGINT");
    no_process_left(out, nodes);
    jfree(j);
    free(l.out);
    free(l.err);
}

/* The pid of the dsnode process whose command line names `conf`, or -1. */
static int find_node_pid(void *arg)
{
    pid_t p[4];
    return procs_with((const char *)arg, p, 4) == 1 ? (int)p[0] : -1;
}

static int node_pid_known(void *arg)
{
    return find_node_pid(arg) > 0;
}

Test(dslaunch_run, a_killed_node_does_not_stop_the_others)
{
    const char *out = tmp_path("run");
    char log1[512], conf1[512];
    snprintf(log1, sizeof(log1), "%s/n1.log", out);
    snprintf(conf1, sizeof(conf1), "%s/n1.ini", out);
    const char *args[] = {"local", "-n", "3", "--config", BASE_CONFIG,
                          "--set", "train.steps=1500", "--set", "train.log_every=10",
                          "--set", "train.eval_every=0", "--set", "train.backend=cpu",
                          "--out", out, "--json", "--timeout", "150",
                          "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    cr_assert(live_wait(&l, 120000, log_has_steps, log1) &&
              live_wait(&l, 5000, node_pid_known, conf1),
              "n1 never trained; stderr:\n%s", l.err ? l.err : "");
    cr_assert_eq(kill((pid_t)find_node_pid(conf1), SIGKILL), 0);
    int code = live_end(&l, 150000);
    cr_assert_eq(code, 1, "a failed node makes dslaunch exit 1, got %d; stderr:\n%s", code, l.err);
    jv *j = last_json(l.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->n == 3);
    const jv *n1 = jget(nodes, "n1");
    cr_assert_eq(jnum(n1, "exit_status"), 128 + SIGKILL);
    cr_assert_str_eq(jstr(n1, "status"), "killed");
    cr_assert_eq(jget(n1, "steps")->t, J_NULL, "no summary line from a SIGKILLed node");
    for (int i = 0; i < 3; i += 2) {
        const jv *n = jget(nodes, i ? "n2" : "n0");
        cr_assert_eq(jnum(n, "exit_status"), 0, "the others finish");
        cr_assert_eq(jnum(n, "steps"), 1500);
    }
    cr_assert_eq(jnum(j, "consensus_models"), 2, "n1 left no model; the others' are compared");
    cr_assert_eq(jget(j, "stopped_by")->t, J_NULL);
    cr_assert_not_null(strstr(l.err, "n1 exited: killed(137)"), "stderr:\n%s", l.err);
    no_process_left(out, nodes);
    jfree(j);
    free(l.out);
    free(l.err);
}

Test(dslaunch_run, timeout_stops_the_run)
{
    const char *out = tmp_path("run");
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000000", "--set", "train.backend=cpu",
                          "--out", out, "--json", "--timeout", "4",
                          "--dsnode", bin("DSNODE"), NULL};
    struct result r = run_dslaunch(120000, args);
    cr_assert_eq(r.code, 1, "exit %d; stderr:\n%s", r.code, r.err);
    jv *j = last_json(r.out);
    cr_assert_str_eq(jstr(j, "stopped_by"), "timeout");
    const jv *nodes = jget(j, "nodes");
    for (int i = 0; i < nodes->n; i++)
        cr_assert_eq(jnum(nodes->items[i], "exit_status"), 128 + SIGTERM);
    cr_assert_not_null(strstr(r.err, "--timeout 4 s reached"), "%s", r.err);
    no_process_left(out, nodes);
    jfree(j);
    result_free(&r);
}

Test(dslaunch_run, add_at_starts_more_nodes)
{
    const char *out = tmp_path("run");
    /* Long enough for n2 to start and join while the others train: it
     * joins through them and takes their model state. */
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=1500", "--set", "train.log_every=20",
                          "--set", "train.eval_every=0", "--set", "train.backend=cpu",
                          "--add-at", "100:1", "--out", out, "--json",
                          "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct result r = run_dslaunch(180000, args);
    cr_assert_eq(r.code, 0, "exit %d; stderr:\n%s", r.code, r.err);
    jv *j = last_json(r.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert_eq(nodes->n, 3, "every node that ran is listed");
    const jv *n2 = jget(nodes, "n2");
    cr_assert_not_null(n2);
    cr_assert_eq(jnum(n2, "exit_status"), 0);
    cr_assert_eq(jnum(n2, "added_at_step"), 100);
    cr_assert_eq(jnum(n2, "steps"), 1500, "a newcomer adopts the cluster's step and ends with it");
    cr_assert_eq(jget(jget(nodes, "n0"), "added_at_step")->t, J_NULL);
    cr_assert_not_null(strstr(r.err, "--add-at 100:1"), "%s", r.err);

    /* n2 is seeded with nodes that were running, and its key is admitted */
    char p[512];
    snprintf(p, sizeof(p), "%s/n2.ini", out);
    char *dump = config_valid(p), seeds[300], l0[64], l1[64];
    dump_value(dump, "\nseeds = ", seeds, sizeof(seeds));
    free(dump);
    snprintf(p, sizeof(p), "%s/n0.ini", out);
    dump = config_valid(p);
    dump_value(dump, "\nlisten = ", l0, sizeof(l0));
    free(dump);
    snprintf(p, sizeof(p), "%s/n1.ini", out);
    dump = config_valid(p);
    dump_value(dump, "\nlisten = ", l1, sizeof(l1));
    free(dump);
    cr_assert(strstr(seeds, l0) || strstr(seeds, l1), "n2 seeds '%s'", seeds);
    ds_allowlist *al = NULL;
    char err[256];
    snprintf(p, sizeof(p), "%s/allowed_keys", out);
    cr_assert_eq(ds_allowlist_load(&al, p, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_allowlist_count(al), 3, "the allow-list had n2 from the start");
    ds_allowlist_free(&al);
    no_process_left(out, nodes);
    jfree(j);
    result_free(&r);
}

/* A dsnode that ignores SIGTERM (as a node stuck in a hung call would):
 * dslaunch must SIGKILL it after the grace period. The stand-in runs the
 * real dsnode for everything but `run`. Its `sleep` child keeps the pipes
 * open for up to a second after the kill, which dslaunch must not wait on
 * forever either. */
Test(dslaunch_run, stubborn_node_is_killed_after_the_grace_period)
{
    const char *script = tmp_path("stubborn-dsnode");
    const char *text = "#!/bin/sh\n"
                       "if [ \"$1\" = run ]; then\n"
                       "  trap '' TERM INT\n"
                       "  echo \"2026-01-01T00:00:00.000Z info n0 train step=1 loss=2.3 "
                       "samples_per_s=1 lr=0.1\" >&2\n"
                       "  while :; do sleep 1; done\n"
                       "fi\n"
                       "exec \"$DSNODE\" \"$@\"\n";
    write_bytes(script, text, strlen(text));
    cr_assert_eq(chmod(script, 0755), 0);
    const char *out = tmp_path("run");
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--out", out, "--json",
                          "--timeout", "1", "--dsnode", script, NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct result r = run_dslaunch(60000, args);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double took = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert_eq(r.code, 1, "exit %d; stderr:\n%s", r.code, r.err);
    cr_assert_not_null(strstr(r.err, "SIGKILL to 2 nodes still running"), "%s", r.err);
    cr_assert_geq(took, 5.0, "the grace period is 5 s, the run took %.1f s", took);
    jv *j = last_json(r.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert_eq(nodes->n, 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(jnum(nodes->items[i], "exit_status"), 128 + SIGKILL);
        cr_assert_str_eq(jstr(nodes->items[i], "status"), "killed");
    }
    cr_assert_eq(jnum(j, "consensus_models"), 0);
    cr_assert_eq(jget(j, "consensus_distance")->t, J_NULL);
    no_process_left(out, nodes);
    jfree(j);
    result_free(&r);
}

static int all_gone(void *arg)
{
    pid_t p[16];
    return procs_with((const char *)arg, p, 16) == 0;
}

static int log_has_model(void *arg)
{
    char *log = read_text((const char *)arg);
    int ok = log && strstr(log, " model=mlp ");
    free(log);
    return ok;
}

/* SIGKILL leaves dslaunch no chance to clean up: the nodes go anyway,
 * through PR_SET_PDEATHSIG. They log nothing once training has started
 * (log_every and eval_every out of reach), so it is not a write to the
 * closed pipe (SIGPIPE) that ends them. */
Test(dslaunch_run, nodes_die_with_a_killed_dslaunch)
{
    const char *out = tmp_path("run");
    char log0[512], log1[512];
    snprintf(log0, sizeof(log0), "%s/n0.log", out);
    snprintf(log1, sizeof(log1), "%s/n1.log", out);
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000000", "--set", "train.log_every=100000000",
                          "--set", "train.eval_every=0", "--set", "train.backend=cpu",
                          "--out", out, "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    cr_assert(live_wait(&l, 120000, log_has_model, log0) && live_wait(&l, 60000, log_has_model, log1),
              "the nodes never started training; stderr:\n%s", l.err ? l.err : "");
    cr_assert_eq(kill(l.pid, SIGKILL), 0);
    cr_assert_eq(live_end(&l, 10000), 128 + SIGKILL);
    cr_assert(live_wait(&l, 20000, all_gone, (void *)out), "nodes outlived dslaunch by 20 s");
    free(l.out);
    free(l.err);
}

/* ================================================================================ */
/* cluster: decentralized training across real processes (issue 5)                  */
/* ================================================================================ */

TestSuite(cluster, .init = tmp_init, .fini = tmp_fini, .timeout = 280);

/* Four dsnode processes on loopback, the given gossip settings, `steps`
 * steps. Every node must finish, clear min_acc and have exchanged data;
 * returns the parsed JSON (caller frees). */
static jv *run_cluster(const char *topology, const char *mix, const char *method, int steps,
                       double min_acc)
{
    const char *out = tmp_path(topology);
    char s_steps[64], s_topo[64], s_mix[64], s_method[64];
    snprintf(s_steps, sizeof(s_steps), "train.steps=%d", steps);
    snprintf(s_topo, sizeof(s_topo), "gossip.topology=%s", topology);
    snprintf(s_mix, sizeof(s_mix), "gossip.mix=%s", mix);
    snprintf(s_method, sizeof(s_method), "sparsify.method=%s", method);
    const char *args[] = {"local", "-n", "4", "--config", BASE_CONFIG,
                          "--set", s_steps, "--set", "train.eval_every=0",
                          "--set", "train.backend=cpu", "--set", s_topo, "--set", s_mix,
                          "--set", s_method, "--set", "sparsify.density=0.01",
                          "--set", "gossip.timeout_ms=2000",
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct result r = run_dslaunch(260000, args);
    cr_assert_eq(r.code, 0, "%s/%s/%s: dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", topology, mix,
                 method, r.code, r.out, r.err);
    jv *j = last_json(r.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->t == J_OBJ && nodes->n == 4, "four nodes in the JSON");
    const char *names[4] = {"n0", "n1", "n2", "n3"};
    for (int i = 0; i < 4; i++) {
        check_node_ok(nodes, names[i], min_acc);
        cr_assert_eq(jnum(jget(nodes, names[i]), "steps"), steps);
        /* Membership alone is a few KB; gossip of 1% of 269k parameters
         * each round is far more. */
        cr_assert_gt(jnum(jget(nodes, names[i]), "bytes_sent"), 1e6, "%s/%s: %s sent %.0f bytes",
                     topology, mix, names[i], jnum(jget(nodes, names[i]), "bytes_sent"));
    }
    cr_log_info("%s/%s/%s, %d steps: mean test_acc %.4f, consensus distance %.4f", topology,
                mix, method, steps, jnum(j, "mean_test_acc"), jnum(j, "consensus_distance"));
    result_free(&r);
    return j;
}

Test(cluster, crossover_micro_reaches_80_percent_and_agrees)
{
    jv *j = run_cluster("crossover", "pairwise", "micro", 600, 0.80);
    /* Gossip keeps the models close: they drift apart by a few percent of
     * their norm at most (independent runs differ by far more, ~100%). */
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1);
    jfree(j);
}

Test(cluster, every_topology_and_mixing_rule_trains)
{
    static const char *const runs[][3] = {
        {"ring", "pairwise", "micro"},
        {"exponential", "pairwise", "sage"},
        {"random", "pairwise", "topk"},
        {"crossover", "crossover", "none"},
        {"allreduce", "pairwise", "none"},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        jv *j = run_cluster(runs[i][0], runs[i][1], runs[i][2], 300, 0.70);
        jfree(j);
    }
}

/* ================================================================================ */
/* dslaunch_netns: --netns, one network namespace per node (root only)              */
/* ================================================================================ */

/* Whatever a failed test left (its dslaunch is SIGKILLed by tmp_fini, so
 * its pid is gone) is removed as a stale leftover. */
static void netns_fini(void)
{
    tmp_fini();
    if (geteuid() == 0)
        ds_netns_reap_stale(NULL);
}

TestSuite(dslaunch_netns, .init = tmp_init, .fini = netns_fini, .timeout = 200);

static void need_netns(void)
{
    char why[512];
    if (geteuid() != 0)
        cr_skip_test("--netns needs root");
    if (ds_netns_check(why, sizeof(why)) < 0)
        cr_skip_test("%s", why);
}

/* stdout of `ip ARGS...` (NULL-terminated, at most 8; caller frees). */
static char *ip_out(const char *a1, ...)
{
    char path[64], *argv[10];
    snprintf(path, sizeof(path), access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip");
    int n = 0;
    argv[n++] = path;
    va_list ap;
    va_start(ap, a1);
    for (const char *a = a1; a && n < 9; a = va_arg(ap, const char *))
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    char *out, *etext, err[256];
    int code;
    cr_assert_eq(ds_proc_capture(argv, 20000, &out, &etext, &code, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(code, 0, "ip %s: %s", a1, etext);
    free(etext);
    return out;
}

/* How many namespaces and bridges are named for dslaunch `pid`. */
static int netns_left(pid_t pid)
{
    int n = 0;
    char *text[2] = {ip_out("netns", "list", NULL),
                     ip_out("-o", "link", "show", "type", "bridge", NULL)};
    for (int which = 0; which < 2; which++) {
        for (char *save = NULL, *line = strtok_r(text[which], "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            /* "NAME (id: N)" / "N: NAME: <FLAGS> ..." */
            const char *p = line;
            if (which) {
                p = strchr(line, ':');
                p = p ? p + 2 : line;
            }
            char name[64];
            size_t k = 0;
            while (p[k] && p[k] != ' ' && p[k] != ':' && k + 1 < sizeof(name)) {
                name[k] = p[k];
                k++;
            }
            name[k] = '\0';
            long owner;
            if (ds_netns_stale_owner(name, &owner) && owner == (long)pid)
                n++;
        }
        free(text[which]);
    }
    return n;
}

struct qdisc_probe {
    pid_t owner;
    int seen; /* tbf at 100Mbit on n0's eth0 */
};

static int has_tbf(void *arg)
{
    struct qdisc_probe *q = arg;
    char name[64], path[64];
    snprintf(name, sizeof(name), "dsl-%d-n0", (int)q->owner);
    snprintf(path, sizeof(path), access("/usr/sbin/tc", X_OK) == 0 ? "/usr/sbin/tc" : "/sbin/tc");
    char *argv[] = {path, "-n", name, "qdisc", "show", "dev", "eth0", NULL};
    char *out = NULL, *etext = NULL, err[256];
    int code = 1;
    if (ds_proc_capture(argv, 10000, &out, &etext, &code, err, sizeof(err)) == 0 && code == 0 &&
        strstr(out, "tbf") && strstr(out, "rate 100Mbit"))
        q->seen = 1;
    free(out);
    free(etext);
    return q->seen;
}

Test(dslaunch_netns, rate_limited_nodes_train_and_every_namespace_goes)
{
    need_netns();
    const char *out = tmp_path("run");
    char log1[512];
    snprintf(log1, sizeof(log1), "%s/n1.log", out);
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=200", "--set", "train.eval_every=0",
                          "--set", "train.log_every=10", "--set", "train.backend=cpu",
                          "--netns-rate", "100mbit", "--out", out, "--json",
                          "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    const pid_t owner = l.pid;
    /* While it trains: both ends of n0's link carry the token bucket. */
    struct qdisc_probe q = {owner, 0};
    cr_assert(live_wait(&l, 120000, log_has_steps, log1), "n1 never trained; stderr:\n%s",
              l.err ? l.err : "");
    cr_assert(live_wait(&l, 10000, has_tbf, &q), "no tbf at 100Mbit on n0's eth0");
    int code = live_end(&l, 150000);
    cr_assert_eq(code, 0, "dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", code, l.out, l.err);
    jv *j = last_json(l.out);
    cr_assert_str_eq(jstr(j, "net"), "netns 100mbit");
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->n == 2);
    check_node_ok(nodes, "n0", 0.7);
    check_node_ok(nodes, "n1", 0.7);
    const char *l0 = jstr(jget(nodes, "n0"), "listen"), *l1 = jstr(jget(nodes, "n1"), "listen");
    cr_assert(l0 && !strncmp(l0, "10.213.1.1:", 11), "n0 listens on %s", l0 ? l0 : "?");
    cr_assert(l1 && !strncmp(l1, "10.213.1.2:", 11), "n1 listens on %s", l1 ? l1 : "?");
    /* The gossip went over the veths: the nodes exchanged real traffic. */
    cr_assert_gt(jnum(jget(nodes, "n0"), "bytes_sent"), 1e6);
    /* The configs say so too, and load in dsnode (security stays on:
     * dsnode refuses security.mode = none off loopback). */
    char p[512], v[300];
    snprintf(p, sizeof(p), "%s/n1.ini", out);
    char *dump = config_valid(p);
    dump_value(dump, "\nlisten = ", v, sizeof(v));
    cr_assert_str_eq(v, l1);
    dump_value(dump, "\nseeds = ", v, sizeof(v));
    cr_assert(!strncmp(v, "10.213.1.1:", 11), "n1 seeds %s", v);
    free(dump);
    cr_assert_eq(netns_left(owner), 0, "namespaces or the bridge of dslaunch %d remain",
                 (int)owner);
    no_process_left(out, nodes);
    jfree(j);
    free(l.out);
    free(l.err);
}

Test(dslaunch_netns, sigint_and_stale_leftovers_are_cleaned_up)
{
    need_netns();
    /* Leftovers of a dslaunch that died without cleaning up: a pid that
     * is certainly gone (our own reaped child). */
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0)
        _exit(0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    ds_netns stale;
    char err[512];
    cr_assert_eq(ds_netns_init(&stale, dead, 1, 0, err, sizeof(err)), 0, "%s", err);
    int made = ds_netns_setup(&stale, err, sizeof(err));
    if (made < 0) {
        ds_netns_teardown(&stale, NULL);
        cr_assert_fail("cannot make the stale namespace: %s", err);
    }
    cr_assert_eq(netns_left(dead), 2, "the stale namespace and bridge exist");

    const char *out = tmp_path("run");
    char log0[512], log1[512];
    snprintf(log0, sizeof(log0), "%s/n0.log", out);
    snprintf(log1, sizeof(log1), "%s/n1.log", out);
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000000", "--set", "train.log_every=10",
                          "--set", "train.backend=cpu", "--netns", "--out", out, "--json",
                          "--timeout", "150", "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    const pid_t owner = l.pid;
    cr_assert(live_wait(&l, 120000, log_has_steps, log0) && live_wait(&l, 60000, log_has_steps, log1),
              "the nodes never trained; stderr:\n%s", l.err ? l.err : "");
    /* (Any dslaunch --netns starting meanwhile may be the one that removes
     * them and says so: only their absence is checked.) */
    cr_assert_eq(netns_left(dead), 0, "the stale leftovers were removed at start");
    cr_assert_eq(netns_left(owner), 3, "two namespaces and a bridge while running");
    cr_assert_eq(kill(l.pid, SIGINT), 0);
    int code = live_end(&l, 60000);
    cr_assert_eq(code, 128 + SIGINT, "dslaunch exit %d; stderr:\n%s", code, l.err);
    jv *j = last_json(l.out);
    cr_assert_str_eq(jstr(j, "net"), "netns");
    const jv *nodes = jget(j, "nodes");
    for (int i = 0; i < nodes->n; i++)
        cr_assert_str_eq(jstr(nodes->items[i], "status"), "stopped");
    cr_assert_eq(netns_left(owner), 0, "namespaces of dslaunch %d remain after SIGINT",
                 (int)owner);
    no_process_left(out, nodes);
    jfree(j);
    free(l.out);
    free(l.err);
}

Test(dslaunch_netns, bad_rates_and_no_root)
{
    const char *out = tmp_path("run");
    const char *bad[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--netns-rate", "fast",
                         "--out", out, NULL};
    expect_error(bad, 2, "--netns-rate expects a rate such as 100mbit or 1gbit");
    const char *slow[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--netns-rate", "1kbit",
                          "--out", out, NULL};
    expect_error(slow, 2, "found '1kbit'");
    if (geteuid() == 0) {
        struct stat st;
        cr_assert(stat(out, &st) < 0, "nothing was created for a refused command line");
        return;
    }
    const char *ns[] = {"local", "-n", "2", "--config", BASE_CONFIG, "--netns", "--out", out,
                        NULL};
    expect_error(ns, 2, "--netns needs root");
    struct stat st;
    cr_assert(stat(out, &st) < 0, "nothing was created for a refused command line");
}

/* ================================================================================ */
/* elastic: joins, crashes, freezes and leaves while the cluster trains (issue 6)   */
/* ================================================================================ */

TestSuite(elastic, .init = tmp_init, .fini = tmp_fini, .timeout = 290);

/* The pid of node `name` of the cluster in `out`, or -1. */
static pid_t node_pid(const char *out, const char *name)
{
    char needle[600];
    pid_t p[4];
    snprintf(needle, sizeof(needle), "%s/%s.ini", out, name);
    return procs_with(needle, p, 4) > 0 ? p[0] : -1;
}

struct step_wait {
    char log[600];
    long step;
};

/* The last "train step=N" the node logged, or -1. */
static long last_step(const char *log_path)
{
    char *log = read_text(log_path);
    long last = -1;
    for (const char *p = log; p && (p = strstr(p, " train step=")); p++)
        last = strtol(p + 12, NULL, 10);
    free(log);
    return last;
}

static int reached_step(void *arg)
{
    const struct step_wait *w = arg;
    return last_step(w->log) >= w->step;
}

/* Wait (up to 200 s) until node `name` of the run in `out` has logged
 * step `step`; fails the test otherwise. */
static void wait_for_step(struct live *l, const char *out, const char *name, long step)
{
    struct step_wait w;
    snprintf(w.log, sizeof(w.log), "%s/%s.log", out, name);
    w.step = step;
    cr_assert(live_wait(l, 200000, reached_step, &w), "%s never reached step %ld", name, step);
}

/* The value of `key=` in the node's summary line (its log), or -1. */
static double summary_value(const char *out, const char *name, const char *key)
{
    char path[600], pat[64];
    snprintf(path, sizeof(path), "%s/%s.log", out, name);
    snprintf(pat, sizeof(pat), " %s=", key);
    char *log = read_text(path);
    const char *s = log ? strstr(log, "summary node=") : NULL;
    const char *p = s ? strstr(s, pat) : NULL;
    double v = p ? strtod(p + strlen(pat), NULL) : -1;
    free(log);
    return v;
}

/* test_acc of the node's eval line at `step`, or -1. */
static double eval_at(const char *out, const char *name, long step)
{
    char path[600], pat[64];
    snprintf(path, sizeof(path), "%s/%s.log", out, name);
    snprintf(pat, sizeof(pat), " eval step=%ld ", step);
    char *log = read_text(path);
    const char *p = log ? strstr(log, pat) : NULL;
    p = p ? strstr(p, "test_acc=") : NULL;
    double v = p ? strtod(p + 9, NULL) : -1;
    free(log);
    return v;
}

static int log_has(const char *out, const char *name, const char *text)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s.log", out, name);
    char *log = read_text(path);
    int has = log && strstr(log, text);
    free(log);
    return has;
}

#define EL_STEPS "train.steps=500"

static const char *const el_common[] = {
    "--set", "train.backend=cpu", "--set", "train.log_every=10", "--set", "gossip.timeout_ms=2000",
};

/* args for dslaunch: local -n N --config ... common --set extra... --out out --json */
static void el_args(const char **args, int n_nodes, const char *out, const char *const *extra)
{
    static char nbuf[8];
    int k = 0;
    snprintf(nbuf, sizeof(nbuf), "%d", n_nodes);
    args[k++] = "local";
    args[k++] = "-n";
    args[k++] = nbuf;
    args[k++] = "--config";
    args[k++] = BASE_CONFIG;
    for (size_t i = 0; i < sizeof(el_common) / sizeof(el_common[0]); i++)
        args[k++] = el_common[i];
    for (; extra && *extra; extra++)
        args[k++] = *extra;
    args[k++] = "--out";
    args[k++] = out;
    args[k++] = "--json";
    args[k++] = "--timeout";
    args[k++] = "240";
    args[k++] = "--dsnode";
    args[k++] = bin("DSNODE");
    args[k] = NULL;
}

Test(elastic, nodes_added_mid_run_get_the_state_and_catch_up)
{
    const char *out = tmp_path("join");
    /* Long enough that the newcomers join while the others still train. */
    const char *extra[] = {"--set", "train.steps=1500", "--set", "train.eval_every=50",
                           "--add-at", "150:2", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct result r = run_dslaunch(280000, args);
    cr_assert_eq(r.code, 0, "dslaunch exit %d\nstderr:\n%s", r.code, r.err);
    jv *j = last_json(r.out);
    const jv *nodes = jget(j, "nodes");
    cr_assert(nodes && nodes->n == 6, "six nodes ran");
    for (int i = 4; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_assert(log_has(out, name, "model state received: step="), "%s got no state", name);
        /* The step it trains from: it shadows the cluster (fresh state,
         * no training) until its join round, then says so. */
        char path[600];
        snprintf(path, sizeof(path), "%s/%s.log", out, name);
        char *log = read_text(path);
        const char *key = "shadowed the cluster up to step ";
        const char *p = strstr(log, key);
        if (!p) {
            key = "model state received: step=";
            p = strstr(log, key);
        }
        const long from = strtol(p + strlen(key), NULL, 10);
        free(log);
        /* Issue 6: within 1 pt of the others' test accuracy within 200
         * steps: at some evaluation in (from, from + 200]. One node against
         * the others' mean at one evaluation moves by about 1 pt by itself
         * (the original nodes differ that much), so the first evaluation
         * alone would be a coin toss near the bound. */
        int evals = 0, close = 0;
        double best = 1;
        for (long st = ((from + 50) / 50) * 50; st <= from + 200 && st <= 1500; st += 50) {
            const double mine = eval_at(out, name, st);
            if (mine < 0)
                continue;
            double others = 0;
            int no = 0;
            for (int o = 0; o < 4; o++) {
                char on[8];
                snprintf(on, sizeof(on), "n%d", o);
                const double v = eval_at(out, on, st);
                if (v >= 0) {
                    others += v;
                    no++;
                }
            }
            if (!no)
                continue;
            others /= no;
            evals++;
            close += fabs(mine - others) <= 0.01;
            if (fabs(mine - others) < best)
                best = fabs(mine - others);
            cr_log_info("%s (training from step %ld): test_acc %.4f at step %ld, the others %.4f",
                        name, from, mine, st, others);
        }
        cr_assert_gt(evals, 0, "%s never evaluated in the 200 steps after step %ld", name, from);
        cr_expect(close > 0, "%s not within 1 pt of the others at any of %d evaluations in the 200 "
                  "steps after step %ld (closest %.4f apart)", name, evals, from, best);
    }
    jfree(j);
    result_free(&r);
}

/* 6 nodes, 2 SIGKILLed mid-run: the others finish, no round waits longer
 * than the gossip timeout + 1 s, and the final accuracy is within 1 pt of
 * the same cluster undisturbed. */
Test(elastic, two_crashes_out_of_six)
{
    const char *extra[] = {"--set", EL_STEPS, "--set", "train.eval_every=0", NULL};
    const char *args[40];

    const char *calm = tmp_path("calm");
    el_args(args, 6, calm, extra);
    struct result r0 = run_dslaunch(280000, args);
    cr_assert_eq(r0.code, 0, "undisturbed run: exit %d\nstderr:\n%s", r0.code, r0.err);
    jv *j0 = last_json(r0.out);
    double calm_acc = 0;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        calm_acc += jnum(jget(jget(j0, "nodes"), name), "test_acc") / 4;
    }

    const char *out = tmp_path("crash");
    el_args(args, 6, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150);
    for (int i = 4; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const pid_t p = node_pid(out, name);
        cr_assert_gt(p, 0, "%s not found", name);
        cr_assert_eq(kill(p, SIGKILL), 0);
    }
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 1, "dslaunch reports the two killed nodes: exit %d\n%s", code, l.err);
    jv *j = last_json(l.out);
    double acc = 0;
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const jv *n = jget(jget(j, "nodes"), name);
        cr_assert_eq(jnum(n, "exit_status"), 0, "%s exit", name);
        acc += jnum(n, "test_acc") / 4;
        const double max_round = summary_value(out, name, "max_round_s");
        cr_expect(max_round >= 0 && max_round <= 2.0 + 1.0, "%s: a round took %.3f s", name,
                  max_round);
    }
    cr_log_info("2 of 6 killed at step 150: survivors' accuracy %.4f, undisturbed %.4f", acc,
                calm_acc);
    cr_expect(fabs(acc - calm_acc) <= 0.01, "accuracy %.4f vs undisturbed %.4f", acc, calm_acc);
    jfree(j);
    jfree(j0);
    free(l.out);
    free(l.err);
    result_free(&r0);
}

/* A node frozen for 5 s (SIGSTOP, then SIGCONT): the others go on, it
 * comes back, catches up, and everyone finishes. */
Test(elastic, frozen_node_comes_back)
{
    const char *out = tmp_path("stop");
    /* Long enough that the others still train when it wakes up. */
    const char *extra[] = {"--set", "train.steps=2000", "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150);
    const pid_t p = node_pid(out, "n3");
    cr_assert_gt(p, 0);
    cr_assert_eq(kill(p, SIGSTOP), 0);
    /* The others keep training meanwhile. */
    char n0log[600];
    snprintf(n0log, sizeof(n0log), "%s/n0.log", out);
    const long before = last_step(n0log);
    usleep(5000000);
    const long during = last_step(n0log);
    cr_assert_eq(kill(p, SIGCONT), 0);
    cr_expect_gt(during, before, "n0 made no progress while n3 was frozen");
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 0, "exit %d\n%s", code, l.err);
    jv *j = last_json(l.out);
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const double max_round = summary_value(out, name, "max_round_s");
        cr_expect(max_round >= 0 && max_round <= 3.0, "%s: a round took %.3f s", name, max_round);
    }
    cr_expect_eq(jnum(jget(jget(j, "nodes"), "n3"), "steps"), 2000, "n3 finished");
    cr_expect_lt(jnum(j, "consensus_distance"), 0.1, "n3 mixes with the others again");
    jfree(j);
    free(l.out);
    free(l.err);
}

/* SIGTERM: the node stops training, announces its leave for a future round,
 * keeps taking part until then, and exits; the others see it LEFT (not
 * dead) and finish. */
Test(elastic, graceful_leave)
{
    const char *out = tmp_path("leave");
    const char *extra[] = {"--set", EL_STEPS, "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 4, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 150);
    const pid_t p = node_pid(out, "n3");
    cr_assert_gt(p, 0);
    cr_assert_eq(kill(p, SIGTERM), 0);
    const int code = live_end(&l, 240000);
    cr_assert_eq(code, 1, "dslaunch reports n3 stopped: exit %d\n%s", code, l.err);
    jv *j = last_json(l.out);
    const jv *n3 = jget(jget(j, "nodes"), "n3");
    cr_expect_eq(jnum(n3, "exit_status"), 128 + SIGTERM);
    cr_expect(log_has(out, "n3", "leaving: effective at round"), "n3 announced its leave");
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_expect_eq(jnum(jget(jget(j, "nodes"), name), "exit_status"), 0, "%s", name);
        cr_expect(log_has(out, name, "member left name=n3"), "%s saw n3 leave", name);
        cr_expect(!log_has(out, name, "member dead name=n3"), "%s took n3 for dead", name);
    }
    jfree(j);
    free(l.out);
    free(l.err);
}

/* A node whose cluster key is not the cluster's asks to join: the seed
 * refuses its handshake (HELLO_REJECT), it exits at once with a clear
 * error, and the cluster goes on as if nothing happened. */
Test(elastic, wrong_key_is_refused)
{
    const char *out = tmp_path("intruder");
    /* Long enough to still be training when the intruder knocks. */
    const char *extra[] = {"--set", "train.steps=4000", "--set", "train.eval_every=0", NULL};
    const char *args[40];
    el_args(args, 2, out, extra);
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n1", 30);

    char bad_key[600], bad_id[600], n1ini[600], s_key[700], s_id[700], s_seed[400], s_data[700],
        s_listen[64];
    const int port = ds_port_find(40000 + (int)(getpid() % 20000), 1);
    cr_assert_gt(port, 0, "no free port");
    snprintf(s_listen, sizeof(s_listen), "node.listen=127.0.0.1:%d", port);
    snprintf(bad_key, sizeof(bad_key), "%s/bad.key", out);
    snprintf(bad_id, sizeof(bad_id), "%s/bad.id", out);
    snprintf(n1ini, sizeof(n1ini), "%s/n1.ini", out);
    char *kg1[] = {(char *)bin("DSNODE"), "keygen", "--cluster", "--out", bad_key, NULL};
    char *kg2[] = {(char *)bin("DSNODE"), "keygen", "--out", bad_id, NULL};
    char *o = NULL, *e = NULL, errbuf[256];
    int code;
    cr_assert_eq(ds_proc_capture(kg1, 20000, &o, &e, &code, errbuf, sizeof(errbuf)), 0);
    cr_assert_eq(code, 0, "%s", e);
    free(o);
    free(e);
    cr_assert_eq(ds_proc_capture(kg2, 20000, &o, &e, &code, errbuf, sizeof(errbuf)), 0);
    cr_assert_eq(code, 0, "%s", e);
    free(o);
    free(e);

    /* n0's address: the first seed of n1's config. */
    char *dump = config_valid(n1ini), seeds[300];
    dump_value(dump, "\nseeds = ", seeds, sizeof(seeds));
    free(dump);
    snprintf(s_seed, sizeof(s_seed), "cluster.seeds=%s", seeds);
    snprintf(s_key, sizeof(s_key), "cluster.key_file=%s", bad_key);
    snprintf(s_id, sizeof(s_id), "cluster.identity_file=%s", bad_id);
    snprintf(s_data, sizeof(s_data), "node.data_dir=%s/intruder", out);
    char *run[] = {(char *)bin("DSNODE"), "run", "--config", n1ini, "--set", "node.name=intruder",
                   "--set", s_listen, "--set", "status.listen=",
                   "--set", "status.file=", "--set", "cluster.min_members=1",
                   "--set", s_seed, "--set", s_key, "--set", s_id, "--set", s_data, NULL};
    const uint64_t t0 = (uint64_t)time(NULL);
    cr_assert_eq(ds_proc_capture(run, 60000, &o, &e, &code, errbuf, sizeof(errbuf)), 0, "%s\n%s", errbuf, e ? e : "");
    cr_expect_eq(code, 1, "the refused node exits 1 (got %d)\n%s", code, e);
    cr_expect(strstr(e, "is not admitted to cluster"), "a clear error:\n%s", e);
    cr_expect_lt((uint64_t)time(NULL) - t0, 30, "refused quickly, not after retries");
    free(o);
    free(e);

    cr_assert_eq(live_end(&l, 200000), 0, "the cluster finishes: %s", l.err);
    jv *j = last_json(l.out);
    for (int i = 0; i < 2; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_expect_eq(jnum(jget(jget(j, "nodes"), name), "exit_status"), 0, "%s", name);
        cr_expect(!log_has(out, name, "member joined name=intruder"), "%s admitted the intruder", name);
    }
    cr_expect(log_has(out, "n0", "reason=not_allowed") || log_has(out, "n0", "reason=bad_mac"),
              "n0 logged the refusal with its reason");
    jfree(j);
    free(l.out);
    free(l.err);
}
