/*
 * tests/test_dsviz.c: tools/dsviz, its JSON reading (jansson), its graph and its
 * outputs, and the dsviz program on files, directories and a live status
 * page (node/status in this process).
 *
 * Suite "dsviz" (meson suite unit). The dsviz binary comes from $DSVIZ.
 * SVG through Graphviz is checked when `dot` is installed and skipped
 * otherwise; the fallback (DSVIZ_DOT naming a missing program) always runs.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/runtime/hier.h"
#include "node/runtime/publish.h"
#include "node/status/status.h"
#include "tools/dsviz/viz.h"
#include "topology/topology.h"

static void setup_log(void)
{
    ds_log_setup("test", DS_LOG_ERROR, stderr);
}

TestSuite(dsviz, .init = setup_log, .timeout = 120);

/* ---- the JSON reader -------------------------------------------------------------- */

/* dsviz reads documents with jansson through ds_viz_parse_json: these check
 * the choices it makes (strict RFC 8259, a byte order mark skipped, any
 * value at the top, duplicate keys refused, errors with line and column)
 * and that UTF-8 and escapes come out decoded. */
Test(dsviz, json_reads_valid_documents)
{
    const char *t = "\xef\xbb\xbf {\"a\": [1, -2.5e3, true, false, null, \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\"],"
                    " \"b\": {\"c\": {}, \"d\": []}, \"u\": \"\\u00e9\\ud83d\\ude00\\u4e2d\","
                    " \"z\": 7, \"raw\": \"\xc3\xa9\"}  \n";
    char err[128];
    json_t *r = NULL;
    cr_assert_eq(ds_viz_parse_json(t, strlen(t), &r, err, sizeof(err)), 0, "%s", err);
    cr_expect(json_is_object(r));
    cr_expect_eq(json_object_size(r), 5);
    const json_t *a = json_object_get(r, "a");
    cr_assert(json_is_array(a));
    cr_expect_eq(json_array_size(a), 6);
    cr_expect_eq(json_number_value(json_array_get(a, 0)), 1);
    cr_expect_eq(json_number_value(json_array_get(a, 1)), -2500);
    cr_expect(json_is_true(json_array_get(a, 2)));
    cr_expect(json_is_false(json_array_get(a, 3)));
    cr_expect(json_is_null(json_array_get(a, 4)));
    cr_expect_str_eq(json_string_value(json_array_get(a, 5)), "x\"\\/\b\f\n\r\t");
    cr_expect_null(json_array_get(a, 6));
    cr_expect_eq(json_object_size(json_object_get(json_object_get(r, "b"), "c")), 0);
    cr_expect(json_is_array(json_object_get(json_object_get(r, "b"), "d")));
    cr_expect_str_eq(json_string_value(json_object_get(r, "u")),
                     "\xc3\xa9\xf0\x9f\x98\x80\xe4\xb8\xad");
    cr_expect_str_eq(json_string_value(json_object_get(r, "raw")), "\xc3\xa9");
    cr_expect_eq(json_integer_value(json_object_get(r, "z")), 7);
    /* Wrong types and missing keys give NULL, never a crash. */
    cr_expect_null(json_string_value(json_object_get(r, "z")));
    cr_expect_null(json_object_get(r, "nope"));
    cr_expect_null(json_object_get(a, "x"));
    cr_expect_eq(json_array_size(NULL), 0);
    json_decref(r);

    /* Scalars at the top, and deep nesting. */
    cr_assert_eq(ds_viz_parse_json("42", 2, &r, err, sizeof(err)), 0);
    cr_expect_eq(json_integer_value(r), 42);
    json_decref(r);
    enum { DEEP = 64 };
    char deep[2 * DEEP + 1];
    for (int i = 0; i < DEEP; i++) {
        deep[i] = '[';
        deep[2 * DEEP - 1 - i] = ']';
    }
    cr_assert_eq(ds_viz_parse_json(deep, 2 * DEEP, &r, err, sizeof(err)), 0, "%s", err);
    json_decref(r);
}

Test(dsviz, json_refuses_bad_documents)
{
    /* Each is refused with the line and column of the trouble (the words
     * are jansson's). */
    struct {
        const char *text;
        int line;
    } bad[] = {
        {"", 1},
        {"{\"a\":1,}", 1},
        {"[1,]", 1},
        {"[1 2]", 1},
        {"{\"a\" 1}", 1},
        {"{\"a\":1}\n x", 2},
        {"\"abc", 1},
        {"\"a\tb\"", 1},
        {"\"\\x\"", 1},
        {"\"\\ud800\"", 1},
        {"\"\\udc00\"", 1},
        {"\"\\u0000\"", 1},
        {"\"\\u12g4\"", 1},
        {"\"\xff\"", 1},
        {"\"\xc0\xaf\"", 1},
        {"\"\xed\xa0\x80\"", 1},
        {"01", 1},
        {"1.", 1},
        {"1e", 1},
        {"-", 1},
        {"NaN", 1},
        {"1e999", 1},
        {"tru", 1},
        {"[\n\n  nul]", 3},
        {"{\"a\":1,\"a\":2}", 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[128] = "";
        json_t *d = (json_t *)1;
        int e = ds_viz_parse_json(bad[i].text, strlen(bad[i].text), &d, err, sizeof(err));
        cr_expect_eq(e, -EINVAL, "'%s' parsed", bad[i].text);
        cr_expect_null(d);
        int line = -1, col = -1, n = 0;
        cr_expect_eq(sscanf(err, "%d:%d: %n", &line, &col, &n), 2, "'%s': '%s'", bad[i].text,
                     err);
        cr_expect_eq(line, bad[i].line, "'%s': '%s'", bad[i].text, err);
        cr_expect(n > 0 && err[n], "'%s': no reason in '%s'", bad[i].text, err);
    }
    /* Nesting far past jansson's bound is refused, not a stack overflow. */
    const size_t depth = 100000;
    char *deep = malloc(2 * depth);
    cr_assert_not_null(deep);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    char err[128];
    json_t *d = NULL;
    cr_expect_eq(ds_viz_parse_json(deep, 2 * depth, &d, err, sizeof(err)), -EINVAL);
    cr_expect_null(d);
    cr_expect_not_null(strstr(err, "depth"), "%s", err);
    free(deep);
}

/* Seeded random bytes and mutations of a real document: the reader
 * accepts or refuses, never crashes (ASan build) and never reads past len. */
Test(dsviz, json_survives_garbage)
{
    ds_status_snapshot *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    ds_status_snapshot_init(s);
    snprintf(s->name, sizeof(s->name), "n0");
    s->n_view = s->view_size = 4;
    char *doc;
    size_t len;
    cr_assert_eq(ds_status_render_json(s, 1, &doc, &len), 0);
    uint64_t seed = 0x5eed;
    char *buf = malloc(len);
    cr_assert_not_null(buf);
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, doc, len);
        const int flips = 1 + (int)(it % 8);
        for (int k = 0; k < flips; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            buf[(seed >> 33) % len] = (char)(seed >> 17);
        }
        /* Truncations too: the exact length, no terminator. */
        const size_t n = it % 5 == 0 ? (size_t)((seed >> 40) % len) : len;
        char *exact = malloc(n ? n : 1);
        cr_assert_not_null(exact);
        memcpy(exact, buf, n);
        json_t *d = NULL;
        char err[128];
        int e = ds_viz_parse_json(exact, n, &d, err, sizeof(err));
        cr_expect(e == 0 || e == -EINVAL);
        cr_expect(e == 0 ? d != NULL : d == NULL);
        json_decref(d);
        free(exact);
    }
    free(buf);
    free(doc);
    free(s);
}

/* ---- the graph -------------------------------------------------------------------- */

/* A four-node crossover round: n0..n3 in groups a (n0, n1) and b (n2, n3),
 * two segments; segment s: i initiates to (i+1+s) mod 4. n3 did not
 * report (its document is not written). */
static ds_status_snapshot *round_snapshot(int i, uint64_t round)
{
    ds_status_snapshot *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    ds_status_snapshot_init(s);
    snprintf(s->name, sizeof(s->name), "n%d", i);
    snprintf(s->addr, sizeof(s->addr), "127.0.0.1:%d", 7000 + i);
    snprintf(s->group, sizeof(s->group), "%s", i < 2 ? "a" : "b");
    s->id = 0xa0u + (uint64_t)i;
    s->state = DS_STATUS_TRAINING;
    s->step = (int64_t)round * 2;
    s->steps = 100;
    s->round = round;
    s->loss = 1.0 / (i + 1);
    ds_publish_stats ps = {0};
    ps.net.bytes_sent = 1000u * (uint64_t)(i + 1);
    cr_assert_eq(ds_publish_metrics(s, &ps), 0);
    s->view_size = s->n_view = 4;
    s->view_me = (uint32_t)i;
    for (int k = 0; k < 4; k++) {
        snprintf(s->view[k].name, sizeof(s->view[k].name), "n%d", k);
        snprintf(s->view[k].group, sizeof(s->view[k].group), "%s", k < 2 ? "a" : "b");
        s->view[k].state = k == 3 && i == 0 ? DS_STATUS_MEMBER_SUSPECT : DS_STATUS_MEMBER_ALIVE;
    }
    s->n_layers = 2;
    s->layers[0] = (ds_status_layer){.name = "conv1", .k = 3, .in = 9, .out = 4, .length = 40};
    s->layers[1] = (ds_status_layer){.name = "fc<1>", .in = 3136, .out = 10, .offset = 40,
                                     .length = 31370};
    s->n_segments = s->n_exchanges = 2;
    for (int seg = 0; seg < 2; seg++) {
        ds_status_exchange *x = &s->exchanges[seg];
        x->segment = (uint32_t)seg;
        x->length = 50;
        snprintf(x->initiate_to, sizeof(x->initiate_to), "n%d", (i + 1 + seg) % 4);
        x->n_answer_from = 1;
        snprintf(x->answer_from[0], sizeof(x->answer_from[0]), "n%d", (i + 3 - seg) % 4);
        x->outcome = seg == 1 && i == 2 ? DS_XCHG_FAILED : DS_XCHG_OK;
        x->bytes = seg == 0 ? 400 : 0;
    }
    return s;
}

static char *snapshot_json(int i, uint64_t round, uint64_t t, size_t *len)
{
    ds_status_snapshot *s = round_snapshot(i, round);
    char *text;
    cr_assert_eq(ds_status_render_json(s, t, &text, len), 0);
    free(s);
    return text;
}

static void add_node(ds_viz *v, int i, uint64_t round, uint64_t t)
{
    size_t len;
    char *text = snapshot_json(i, round, t, &len);
    char err[256], origin[16];
    snprintf(origin, sizeof(origin), "doc%d", i);
    cr_assert_eq(ds_viz_add_json(v, text, len, origin, err, sizeof(err)), 0, "%s", err);
    free(text);
}

static int find_edge(const ds_viz *v, const char *from, const char *to, unsigned seg)
{
    const int f = ds_viz_find(v, from), t = ds_viz_find(v, to);
    for (size_t k = 0; k < v->n_e; k++)
        if (v->e[k].from == f && v->e[k].to == t && v->e[k].segment == seg)
            return (int)k;
    return -1;
}

Test(dsviz, builds_members_and_edges)
{
    ds_viz v = {0};
    for (int i = 0; i < 3; i++)
        add_node(&v, i, 10, 1000);
    cr_assert_eq(ds_viz_build(&v), 0);
    cr_expect_eq(v.n_docs, 3);
    cr_expect_eq(v.n_m, 4);
    cr_expect_eq(v.n_segments, 2);
    const int n3 = ds_viz_find(&v, "n3");
    cr_assert_geq(n3, 0);
    cr_expect_eq(v.m[n3].reported, 0);
    cr_expect_str_eq(v.m[n3].seen_state, "suspect");
    cr_expect_str_eq(v.m[n3].group, "b");
    const int n1 = ds_viz_find(&v, "n1");
    cr_expect_eq(v.m[n1].reported, 1);
    cr_expect_str_eq(v.m[n1].state, "training");
    cr_expect_eq(v.m[n1].bytes_sent, 2000);
    /* 3 reporting nodes x 2 segments initiated, plus n3's exchanges known
     * only from their targets: n3 -> n0 (s0) and n3 -> n1 (s1). Each
     * exchange once. */
    cr_expect_eq(v.n_e, 8);
    int k = find_edge(&v, "n0", "n1", 0);
    cr_assert_geq(k, 0);
    cr_expect_str_eq(v.e[k].outcome, "ok");
    cr_expect_eq(v.e[k].bytes, 400);
    cr_expect_eq(v.e[k].from_answer, 0);
    k = find_edge(&v, "n2", "n0", 1);
    cr_assert_geq(k, 0);
    cr_expect_str_eq(v.e[k].outcome, "failed");
    k = find_edge(&v, "n3", "n0", 0);
    cr_assert_geq(k, 0);
    cr_expect_eq(v.e[k].from_answer, 1);
    cr_expect_geq(find_edge(&v, "n3", "n1", 1), 0);
    cr_expect_lt(find_edge(&v, "n1", "n0", 0), 0);

    /* A newer document of n1 replaces the old one; an older one does not. */
    add_node(&v, 1, 11, 2000);
    add_node(&v, 1, 9, 500);
    cr_assert_eq(ds_viz_build(&v), 0);
    cr_expect_eq(v.n_docs, 3);
    cr_expect_eq(v.m[ds_viz_find(&v, "n1")].round, 11);

    /* Not a status document. */
    char err[256];
    cr_expect_eq(ds_viz_add_json(&v, "{\"a\":1}", 7, "x.json", err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, "x.json: not a dsnode status document (schema is not 1)");
    cr_expect_eq(ds_viz_add_json(&v, "{\"schema\":1,", 12, "y.json", err, sizeof(err)), -EINVAL);
    cr_expect_str_eq(err, "y.json: not valid JSON: 1:12: string or '}' expected near end of file");
    ds_viz_free(&v);
}

/* noinline: inlined, gcc 12 takes its open_memstream buffer for a local
 * that the result dangles from (-Wdangling-pointer). */
__attribute__((noinline)) static char *write_mem(int (*fn)(const ds_viz *, FILE *), const ds_viz *v)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    cr_assert_eq(fn(v, f), 0);
    fclose(f);
    return buf;
}

static int html_no_svg(const ds_viz *v, FILE *f);

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

Test(dsviz, dot_output)
{
    ds_viz v = {0};
    for (int i = 0; i < 3; i++)
        add_node(&v, i, 10, 1000);
    cr_assert_eq(ds_viz_build(&v), 0);
    char *dot = write_mem(ds_viz_write_dot, &v);
    cr_expect_eq(strncmp(dot, "digraph dsviz {", 15), 0);
    cr_expect_eq(count(dot, "subgraph cluster_"), 2);
    cr_expect_eq(count(dot, "label=\"group a\""), 1);
    cr_expect_eq(count(dot, "label=\"group b\""), 1);
    cr_expect_eq(count(dot, " -> "), 8);
    const int n0 = ds_viz_find(&v, "n0"), n1 = ds_viz_find(&v, "n1");
    char want[128];
    snprintf(want, sizeof(want), "m%d -> m%d [color=\"#1f77b4\", fontcolor=\"#1f77b4\", "
                                 "label=\"s0 400 B\", tooltip=\"n0 \u2192 n1: s0 400 B\"];",
             n0, n1);
    cr_expect_not_null(strstr(dot, want), "no '%s' in\n%s", want, dot);
    cr_expect_not_null(strstr(dot, "label=\"s1 failed\", style=dashed"));
    cr_expect_not_null(strstr(dot, "label=\"s0 answered\", style=dashed"));
    cr_expect_not_null(strstr(dot, "n3\\nsuspect (no status)"));
    cr_expect_not_null(strstr(dot, "style=\"rounded,filled,dashed\""));
    cr_expect_eq(dot[strlen(dot) - 2], '}');
    free(dot);
    ds_viz_free(&v);
}

/* Names from the network in DOT and HTML: quotes, backslashes, markup. */
Test(dsviz, hostile_names_are_escaped)
{
    ds_status_snapshot *s = round_snapshot(0, 1);
    snprintf(s->view[1].name, sizeof(s->view[1].name), "x\"];evil[\\");
    snprintf(s->exchanges[0].initiate_to, sizeof(s->exchanges[0].initiate_to), "x\"];evil[\\");
    snprintf(s->group, sizeof(s->group), "<script>g");
    snprintf(s->view[2].name, sizeof(s->view[2].name), "<img src=x onerror=1>");
    char *text;
    size_t len;
    cr_assert_eq(ds_status_render_json(s, 1, &text, &len), 0);
    ds_viz v = {0};
    char err[256];
    cr_assert_eq(ds_viz_add_json(&v, text, len, "h", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_viz_build(&v), 0);
    char *dot = write_mem(ds_viz_write_dot, &v);
    cr_expect_not_null(strstr(dot, "label=\"x\\\"];evil[\\\\"));
    /* Every quote before "];evil" is escaped. */
    cr_expect_eq(count(dot, "\"];evil"), count(dot, "\\\"];evil"));
    char *html = NULL;
    size_t hl = 0;
    FILE *f = open_memstream(&html, &hl);
    cr_assert_eq(ds_viz_write_html(&v, f, NULL), 0);
    fclose(f);
    cr_expect_null(strstr(html, "<script"));
    cr_expect_null(strstr(html, "<img"));
    cr_expect_not_null(strstr(html, "&lt;img src=x onerror=1&gt;"));
    cr_expect_not_null(strstr(html, "x&quot;];evil["));
    free(html);
    free(dot);
    free(text);
    free(s);
    ds_viz_free(&v);
}

/* ---- the program -------------------------------------------------------------------- */

static const char *dsviz_bin(void)
{
    const char *p = getenv("DSVIZ");
    cr_assert(p && *p, "DSVIZ is not set (run through meson test)");
    return p;
}

/* Run argv with DSVIZ_DOT=dot_env (NULL: inherited), stdout and stderr to
 * files under dir; at most 60 s. Returns the exit status. */
static int run(const char *dir, const char *dot_env, char *const argv[], char **out, char **err)
{
    char op[512], ep[512];
    snprintf(op, sizeof(op), "%s/stdout", dir);
    snprintf(ep, sizeof(ep), "%s/stderr", dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* Its own process group: a timeout ends what it started too. */
        setpgid(0, 0);
        int o = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0)
            _exit(126);
        dup2(o, 1);
        dup2(e, 2);
        if (dot_env)
            setenv("DSVIZ_DOT", dot_env, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    setpgid(pid, pid); /* either side may run first; one of them succeeds */
    int status = 0;
    const uint64_t deadline = ds_now_ms() + 60000;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (ds_now_ms() > deadline) {
            /* SIGTERM first: playwright closes the browser it launched (in
             * a process group of its own) on SIGTERM; then SIGKILL. */
            kill(-pid, SIGTERM);
            const uint64_t grace = ds_now_ms() + 5000;
            while (waitpid(pid, &status, WNOHANG) == 0 && ds_now_ms() < grace) {
                struct timespec ts = {0, 20 * 1000000L};
                nanosleep(&ts, NULL);
            }
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("%s did not finish in 60 s", argv[0]);
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    size_t len;
    if (out)
        cr_assert_eq(ds_viz_read_file(op, 64 << 20, out, &len), 0);
    if (err)
        cr_assert_eq(ds_viz_read_file(ep, 1 << 20, err, &len), 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void write_text(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(text, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

/* A dslaunch-like run directory: DIR/nI/status.json for n0..n2. */
static void make_run_dir(char *dir)
{
    cr_assert_not_null(mkdtemp(dir));
    for (int i = 0; i < 3; i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/n%d", dir, i);
        cr_assert_eq(mkdir(p, 0755), 0);
        size_t len;
        char *text = snapshot_json(i, 10, 1000, &len);
        snprintf(p, sizeof(p), "%s/n%d/status.json", dir, i);
        write_text(p, text, len);
        free(text);
    }
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

static int have_dot(void)
{
    return system("command -v dot >/dev/null 2>&1") == 0;
}

static char *slurp(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    char *t;
    size_t len;
    int e = ds_viz_read_file(p, 64 << 20, &t, &len);
    cr_assert_eq(e, 0, "%s: %s", p, strerror(-e));
    return t;
}

/* An HTML page that loads nothing: no scripts, no external references. */
static void expect_self_contained(const char *html)
{
    cr_expect_eq(strncmp(html, "<!DOCTYPE html>", 15), 0);
    cr_expect_null(strstr(html, "<script"));
    cr_expect_null(strstr(html, "src="));
    cr_expect_null(strstr(html, "href=\"http"));
    cr_expect_null(strstr(html, "@import"));
    cr_expect_null(strstr(html, "<?xml"));
    cr_expect_null(strstr(html, "<!DOCTYPE svg"));
    cr_expect_eq(count(html, "<svg"), 1);
    cr_expect_not_null(strstr(html, "</html>"));
}

Test(dsviz, program_on_a_run_directory_without_graphviz)
{
    char dir[] = "/tmp/ds-dsviz-XXXXXX";
    make_run_dir(dir);
    char prefix[512];
    snprintf(prefix, sizeof(prefix), "%s/out", dir);
    char *argv[] = {(char *)dsviz_bin(), "--out", prefix, dir, NULL};
    char *err;
    int st = run(dir, "/nonexistent/dot", argv, NULL, &err);
    cr_expect_eq(st, 0, "exit %d: %s", st, err);
    cr_expect_not_null(strstr(err, "not found"), "%s", err);
    cr_expect_not_null(strstr(err, "the HTML page has dsviz's own drawing"), "%s", err);
    char p[600];
    snprintf(p, sizeof(p), "%s.svg", prefix);
    struct stat sb;
    cr_expect_neq(stat(p, &sb), 0, "an .svg was written without Graphviz");
    char *dot = slurp(dir, "out.dot");
    cr_expect_eq(count(dot, " -> "), 8);
    char *html = slurp(dir, "out.html");
    expect_self_contained(html);
    cr_expect_eq(count(html, "<path d=\"M"), 8 + 12); /* 8 edges, 12 arrow heads */
    cr_expect_not_null(strstr(html, "<h1>dsviz: 4 members, 3 reporting</h1>"));
    cr_expect_not_null(strstr(html, "(no status)"));
    /* The layer table, names escaped. */
    cr_expect_not_null(strstr(html, "<h2>Model</h2>"));
    cr_expect_not_null(strstr(html, "<tr><td class=\"l\">conv1</td><td class=\"l\">conv</td>"
                                    "<td class=\"l\">3x3, 1 &rarr; 4</td><td>0</td><td>40</td>"
                                    "</tr>"),
                       "%s", html);
    cr_expect_not_null(strstr(html, "fc&lt;1&gt;</td><td class=\"l\">linear</td>"
                                    "<td class=\"l\">3136 &rarr; 10</td><td>40</td><td>31370</td>"));
    cr_expect_not_null(strstr(html, "<td>31410</td></tr>"));
    free(html);
    free(dot);
    free(err);

    /* --format svg needs Graphviz: an error, not a silent nothing. */
    char *argv2[] = {(char *)dsviz_bin(), "--format", "svg", "--out", prefix, dir, NULL};
    st = run(dir, "/nonexistent/dot", argv2, NULL, &err);
    cr_expect_eq(st, 1);
    cr_expect_not_null(strstr(err, "Graphviz '/nonexistent/dot' not found"), "%s", err);
    free(err);
    rm_rf(dir);
}

Test(dsviz, program_with_graphviz)
{
    if (!have_dot())
        cr_skip("Graphviz 'dot' is not installed");
    char dir[] = "/tmp/ds-dsviz-XXXXXX";
    make_run_dir(dir);
    char prefix[512];
    snprintf(prefix, sizeof(prefix), "%s/out", dir);
    char *argv[] = {(char *)dsviz_bin(), "--out", prefix, dir, NULL};
    char *err;
    int st = run(dir, NULL, argv, NULL, &err);
    cr_expect_eq(st, 0, "exit %d: %s", st, err);
    char *svg = slurp(dir, "out.svg");
    cr_expect_not_null(strstr(svg, "<svg"));
    cr_expect_eq(count(svg, "class=\"edge\""), 8);
    cr_expect_eq(count(svg, "class=\"cluster\""), 2);
    char *html = slurp(dir, "out.html");
    expect_self_contained(html);
    cr_expect_eq(count(html, "class=\"edge\""), 8);
    free(svg);
    free(html);
    free(err);

    /* Hostile names still make a DOT file that Graphviz accepts. */
    ds_status_snapshot *s = round_snapshot(0, 1);
    snprintf(s->view[1].name, sizeof(s->view[1].name), "x\"];evil[\\");
    snprintf(s->exchanges[0].initiate_to, sizeof(s->exchanges[0].initiate_to), "a\\nb\\");
    char *text;
    size_t len;
    cr_assert_eq(ds_status_render_json(s, 1, &text, &len), 0);
    char p[600];
    snprintf(p, sizeof(p), "%s/evil.json", dir);
    write_text(p, text, len);
    char *argv2[] = {(char *)dsviz_bin(), "--format", "svg", "--out", "-", p, NULL};
    char *out;
    st = run(dir, NULL, argv2, &out, &err);
    cr_expect_eq(st, 0, "exit %d: %s", st, err);
    cr_expect_not_null(strstr(out, "<svg"));
    free(out);
    free(err);
    free(text);
    free(s);
    rm_rf(dir);
}

Test(dsviz, program_reads_a_live_status_page)
{
    char dir[] = "/tmp/ds-dsviz-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    ds_status *st = NULL;
    cr_assert_eq(ds_status_create(&st, "127.0.0.1:0", NULL), 0);
    ds_status_snapshot *s = round_snapshot(1, 42);
    ds_status_publish(st, s);
    char addr[64];
    cr_assert_eq(ds_status_addr(st, addr, sizeof(addr)), 0);
    char *argv[] = {(char *)dsviz_bin(), "--format", "dot", "--out", "-", addr, NULL};
    char *out, *err;
    int rc = run(dir, NULL, argv, &out, &err);
    cr_expect_eq(rc, 0, "exit %d: %s", rc, err);
    cr_expect_not_null(strstr(out, "n1\\ntraining step 84/100 round 42"), "%s", out);
    cr_expect_eq(count(out, " -> "), 4); /* 2 initiated + 2 answered by silent peers */
    free(out);
    free(err);

    /* A page that is not /status (a port with no server: refused). */
    ds_status_destroy(&st);
    char *argv2[] = {(char *)dsviz_bin(), "--format", "dot", "--out", "-", "--timeout-ms",
                     "2000", addr, NULL};
    rc = run(dir, NULL, argv2, &out, &err);
    cr_expect_eq(rc, 1);
    cr_expect_not_null(strstr(err, addr), "%s", err);
    free(out);
    free(err);
    free(s);
    rm_rf(dir);
}

Test(dsviz, program_reports_bad_sources)
{
    char dir[] = "/tmp/ds-dsviz-XXXXXX";
    make_run_dir(dir);
    char bad[600], empty[600], prefix[600];
    snprintf(bad, sizeof(bad), "%s/bad.json", dir);
    const char *trunc = "{\"schema\": 1, \"node\": {\"name\": \"zz\"";
    write_text(bad, trunc, strlen(trunc));
    snprintf(empty, sizeof(empty), "%s/empty", dir);
    cr_assert_eq(mkdir(empty, 0755), 0);
    snprintf(prefix, sizeof(prefix), "%s/o", dir);
    char n0[600];
    snprintf(n0, sizeof(n0), "%s/n0/status.json", dir);

    /* Failing sources are named; what loaded is still drawn; exit 1. */
    char *argv[] = {(char *)dsviz_bin(), "--format", "dot", "--out", prefix, n0, bad, empty,
                    "/no/such/path", "not a source", NULL};
    char *err;
    int rc = run(dir, NULL, argv, NULL, &err);
    cr_expect_eq(rc, 1);
    cr_expect_not_null(strstr(err, "bad.json: not valid JSON: 1:35: '}' expected near end of file"),
                       "%s", err);
    cr_expect_not_null(strstr(err, "empty: no status.json"), "%s", err);
    cr_expect_not_null(strstr(err, "/no/such/path: no such file or directory, and not host:port"),
                       "%s", err);
    cr_expect_not_null(strstr(err, "not a source: no such file"), "%s", err);
    free(err);
    char *dot = slurp(dir, "o.dot");
    cr_expect_not_null(strstr(dot, "n0\\ntraining"));
    free(dot);

    /* Nothing loaded: exit 1, nothing written. */
    char *argv2[] = {(char *)dsviz_bin(), "--out", prefix, bad, NULL};
    rc = run(dir, NULL, argv2, NULL, &err);
    cr_expect_eq(rc, 1);
    cr_expect_not_null(strstr(err, "nothing to draw"), "%s", err);
    free(err);

    /* Usage errors: 2. */
    char *u1[] = {(char *)dsviz_bin(), NULL};
    char *u2[] = {(char *)dsviz_bin(), "--format", "png", dir, NULL};
    char *u3[] = {(char *)dsviz_bin(), "--out", "-", dir, NULL};
    char *u4[] = {(char *)dsviz_bin(), "--bogus", dir, NULL};
    char *u5[] = {(char *)dsviz_bin(), "--timeout-ms", "0", dir, NULL};
    char **us[] = {u1, u2, u3, u4, u5};
    for (int i = 0; i < 5; i++) {
        rc = run(dir, NULL, us[i], NULL, &err);
        cr_expect_eq(rc, 2, "usage case %d: exit %d (%s)", i, rc, err);
        free(err);
    }
    char *h[] = {(char *)dsviz_bin(), "--help", NULL};
    char *out;
    rc = run(dir, NULL, h, &out, &err);
    cr_expect_eq(rc, 0);
    cr_expect_not_null(strstr(out, "usage: dsviz"));
    free(out);
    free(err);
    rm_rf(dir);
}

/* A node of a 5-member view whose history holds rounds 100..104 of
 * topology `kind`, each segment initiated as the schedule says (bytes
 * 100 * i + s, outcome ok), except node 2's segment 1 of round 102. */
/* Render s as its node would and load it into v; frees s. */
static void viz_add_snapshot(ds_viz *v, ds_status_snapshot *s)
{
    char *text, err[256];
    size_t len;
    cr_assert_eq(ds_status_render_json(s, 1000, &text, &len), 0);
    cr_assert_eq(ds_viz_add_json(v, text, len, "doc", err, sizeof(err)), 0, "%s", err);
    free(text);
    free(s);
}

/* Node i (named nI, id id0 + i) of a view of n members nK, training at
 * `round` of `epoch` with topology `kind` and seed `seed`. */
static ds_status_snapshot *view_snapshot(int i, int n, uint64_t id0, enum ds_topo_kind kind,
                                         uint64_t round, uint64_t epoch, uint64_t seed)
{
    ds_status_snapshot *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    ds_status_snapshot_init(s);
    snprintf(s->name, sizeof(s->name), "n%d", i);
    s->id = id0 + (uint64_t)i;
    s->state = DS_STATUS_TRAINING;
    s->round = round;
    s->epoch = epoch;
    snprintf(s->topology, sizeof(s->topology), "%s", ds_topo_name(kind));
    s->seed = seed;
    s->view_size = s->n_view = (uint32_t)n;
    s->view_me = (uint32_t)i;
    for (int k = 0; k < n; k++) {
        snprintf(s->view[k].name, sizeof(s->view[k].name), "n%d", k);
        s->view[k].id = id0 + (uint64_t)k;
        s->view[k].state = DS_STATUS_MEMBER_ALIVE;
    }
    return s;
}

static ds_status_snapshot *history_snapshot(int i, enum ds_topo_kind kind)
{
    ds_status_snapshot *s = view_snapshot(i, 5, 0xb0u, kind, 105, 3, 7);
    if (i == 0)
        s->view[4].state = DS_STATUS_MEMBER_LEFT;
    for (uint64_t r = 100; r < 105; r++) {
        ds_status_round h;
        memset(&h, 0, sizeof(h));
        h.round = r;
        h.epoch = 3;
        h.view_size = 5;
        h.me = (uint32_t)i;
        h.n_segments = h.n_listed = 3;
        for (uint32_t seg = 0; seg < 3; seg++) {
            uint32_t perm[5];
            const ds_topo_key key = {.seed = 7, .epoch = 3, .round = r, .segment = seg};
            cr_assert_eq(ds_topo_targets(kind, &key, 5, perm), 0);
            ds_status_seg_done *d = &h.seg[seg];
            d->target = perm[i];
            d->target_id = perm[i] == (uint32_t)i ? 0 : 0xb0u + perm[i];
            d->outcome = perm[i] == (uint32_t)i ? DS_XCHG_NONE : DS_XCHG_OK;
            if (r == 102 && i == 2 && seg == 1)
                d->outcome = DS_XCHG_FAILED;
            d->bytes = 100u * (uint64_t)i + seg;
        }
        ds_status_history_add(&s->hist, &h);
    }
    return s;
}

/* The round drawn is the schedule of that round, computed by dsviz with
 * topology/, for every topology that gossips: every pair, each with the
 * outcome and bytes its initiator reported; a node that did not report
 * still has its pairs (named through the target ids the others report). */
Test(dsviz, draws_a_round_from_the_schedule)
{
    for (int kind = 0; kind < DS_TOPO_KIND_COUNT; kind++) {
        if (!ds_topo_gossips((enum ds_topo_kind)kind))
            continue;
        ds_viz v = {0};
        for (int i = 0; i < 4; i++) /* n4 does not report */
            viz_add_snapshot(&v, history_snapshot(i, (enum ds_topo_kind)kind));
        v.round_set = 1;
        v.want_round = 102;
        cr_assert_eq(ds_viz_build(&v), 0);
        cr_expect(v.from_schedule);
        cr_expect_eq(v.round, 102);
        cr_expect_eq(v.rounds_min, 100);
        cr_expect_eq(v.rounds_max, 104);
        cr_expect_eq(v.n_mismatch, 0);
        size_t want = 0;
        for (uint32_t seg = 0; seg < 3; seg++) {
            uint32_t perm[5];
            const ds_topo_key key = {.seed = 7, .epoch = 3, .round = 102, .segment = seg};
            cr_assert_eq(ds_topo_targets((enum ds_topo_kind)kind, &key, 5, perm), 0);
            for (uint32_t a = 0; a < 5; a++) {
                if (perm[a] == a)
                    continue;
                want++;
                char from[8], to[8];
                snprintf(from, sizeof(from), "n%u", a);
                snprintf(to, sizeof(to), "n%u", perm[a]);
                const int k = find_edge(&v, from, to, seg);
                cr_assert_geq(k, 0, "%s: no %s -> %s s%u", ds_topo_name(kind), from, to, seg);
                const ds_viz_edge *e = &v.e[k];
                if (a == 4) {
                    cr_expect_str_eq(e->outcome, "unreported");
                } else {
                    cr_expect_str_eq(e->outcome, a == 2 && seg == 1 ? "failed" : "ok");
                    cr_expect_eq(e->bytes, 100.0 * a + seg);
                }
            }
        }
        cr_expect_eq(v.n_e, want, "%s: %zu edges, want %zu", ds_topo_name(kind), v.n_e, want);

        /* One segment alone; the default round is the newest every node holds. */
        v.round_set = 0;
        v.segment_set = 1;
        v.want_segment = 2;
        cr_assert_eq(ds_viz_build(&v), 0);
        cr_expect_eq(v.round, 104);
        for (size_t k = 0; k < v.n_e; k++)
            cr_expect_eq(v.e[k].segment, 2);
        cr_expect_gt(v.n_e, 0);
        /* n4 left: it says so, not "suspect". */
        char *dot = write_mem(ds_viz_write_dot, &v);
        cr_expect_not_null(strstr(dot, "n4\\nleft (no status)"), "%s", dot);
        free(dot);
        ds_viz_free(&v);
    }
}

/* Rounds between groups: n0..n5 in groups g0 = {n0, n1, n2}, g1 = {n3,
 * n4}, g2 = {n5} (members numbered in that order). The history of node
 * i holds rounds 200..202 of topology `kind` over the 3 groups, 4
 * segments: the segments its member index owns in its group
 * (ds_topo_hier_owner) initiated to the member of the target group that
 * owns them (bytes 1000 * i + s, ok), the others not initiated. */
static const int grp_of[6] = {0, 0, 0, 1, 1, 2}, grp_mem[6] = {0, 1, 2, 0, 1, 0},
                 grp_size[3] = {3, 2, 1}, grp_first[3] = {0, 3, 5};

static int grp_handler(int g, uint32_t seg)
{
    uint32_t owner;
    cr_assert_eq(ds_topo_hier_owner(seg, (uint32_t)grp_size[g], &owner), 0);
    return grp_first[g] + (int)owner;
}

static ds_status_snapshot *group_history_snapshot(int i, enum ds_topo_kind kind)
{
    ds_status_snapshot *s = view_snapshot(i, 6, 0xc0u, kind, 203, 9, 11);
    snprintf(s->group, sizeof(s->group), "g%d", grp_of[i]);
    for (int k = 0; k < 6; k++)
        snprintf(s->view[k].group, sizeof(s->view[k].group), "g%d", grp_of[k]);
    for (uint64_t r = 200; r < 203; r++) {
        ds_status_round h;
        memset(&h, 0, sizeof(h));
        h.round = r;
        h.epoch = 9;
        h.view_size = h.groups = 3;
        h.me = (uint32_t)grp_of[i];
        h.group_member = (uint32_t)grp_mem[i];
        h.group_size = (uint32_t)grp_size[grp_of[i]];
        h.n_segments = h.n_listed = 4;
        for (uint32_t seg = 0; seg < 4; seg++) {
            uint32_t perm[3];
            const ds_topo_key key = {.seed = 11, .epoch = 9, .round = r, .segment = seg};
            cr_assert_eq(ds_topo_targets(kind, &key, 3, perm), 0);
            ds_status_seg_done *d = &h.seg[seg];
            const uint32_t g = h.me, t = perm[g];
            d->target = g;
            d->outcome = DS_XCHG_NONE;
            if (grp_handler((int)g, seg) != i || t == g)
                continue;
            d->target = t;
            d->target_id = 0xc0u + (uint64_t)grp_handler((int)t, seg);
            d->outcome = DS_XCHG_OK;
            d->bytes = 1000u * (uint64_t)i + seg;
        }
        ds_status_history_add(&s->hist, &h);
    }
    return s;
}

/* Two groups, g0 = {n0, n1} and g1 = {n2, n3}, 4 segments, round 300:
 * with the pairwise mix each segment is exchanged once, initiated by the
 * group ds_topo_pair_initiator names (the member that handles it), and
 * dsviz draws that one edge per segment, the initiator's outcome on it;
 * a document without "mix" (older nodes) keeps both directions. */
static ds_status_snapshot *two_group_snapshot(int i, const char *mix)
{
    ds_status_snapshot *s = view_snapshot(i, 4, 0xd0u, DS_TOPO_CROSSOVER, 301, 5, 3);
    snprintf(s->mix, sizeof(s->mix), "%s", mix);
    snprintf(s->group, sizeof(s->group), "g%d", i / 2);
    for (int k = 0; k < 4; k++)
        snprintf(s->view[k].group, sizeof(s->view[k].group), "g%d", k / 2);
    ds_status_round h;
    memset(&h, 0, sizeof(h));
    h.round = 300;
    h.epoch = 5;
    h.view_size = h.groups = 2;
    h.me = (uint32_t)i / 2;
    h.group_member = (uint32_t)i % 2;
    h.group_size = 2;
    h.n_segments = h.n_listed = 4;
    for (uint32_t seg = 0; seg < 4; seg++) {
        const ds_topo_key key = {.seed = 3, .epoch = 5, .round = 300, .segment = seg};
        ds_status_seg_done *d = &h.seg[seg];
        d->target = h.me;
        d->outcome = DS_XCHG_NONE;
        const int initiates = !*mix || ds_topo_pair_initiator(&key) == (int)h.me;
        if (seg % 2 != h.group_member || !initiates)
            continue;
        d->target = 1 - h.me;
        d->target_id = 0xd0u + 2 * (1 - h.me) + seg % 2;
        d->outcome = DS_XCHG_OK;
        d->bytes = 100u * (uint64_t)i + seg;
    }
    ds_status_history_add(&s->hist, &h);
    return s;
}

Test(dsviz, two_groups_draw_one_exchange_per_segment)
{
    for (int old = 0; old <= 1; old++) {
        ds_viz v = {0};
        for (int i = 0; i < 4; i++)
            viz_add_snapshot(&v, two_group_snapshot(i, old ? "" : "pairwise"));
        v.round_set = 1;
        v.want_round = 300;
        cr_assert_eq(ds_viz_build(&v), 0);
        cr_expect(v.grouped_round);
        cr_expect_eq(v.n_mismatch, 0);
        cr_expect_eq(v.n_e, old ? 8u : 4u, "old=%d: %zu edges", old, v.n_e);
        for (uint32_t seg = 0; seg < 4; seg++) {
            const ds_topo_key key = {.seed = 3, .epoch = 5, .round = 300, .segment = seg};
            const int a = ds_topo_pair_initiator(&key);
            char from[8], to[8];
            snprintf(from, sizeof(from), "n%u", 2 * a + seg % 2);
            snprintf(to, sizeof(to), "n%u", 2 * (1 - a) + seg % 2);
            const int k = find_edge(&v, from, to, seg);
            cr_assert_geq(k, 0, "old=%d: no %s -> %s s%u", old, from, to, seg);
            cr_expect_str_eq(v.e[k].outcome, "ok");
            cr_expect_eq(v.e[k].bytes, 100.0 * (2 * a + seg % 2) + seg);
            cr_expect_eq(find_edge(&v, to, from, seg) >= 0, old, "old=%d: %s -> %s s%u", old,
                         to, from, seg);
        }
        ds_viz_free(&v);
    }
}

/* A round between groups is drawn from the schedule over the groups:
 * each segment's pair of groups becomes an edge between the two members
 * that handle the segment, with the initiator's outcome and bytes; n4
 * does not report, and is still found through the target ids. */
Test(dsviz, draws_a_round_between_groups)
{
    for (int kind = 0; kind < DS_TOPO_KIND_COUNT; kind++) {
        if (!ds_topo_gossips((enum ds_topo_kind)kind))
            continue;
        ds_viz v = {0};
        for (int i = 0; i < 6; i++) /* n4 does not report */
            if (i != 4)
                viz_add_snapshot(&v, group_history_snapshot(i, (enum ds_topo_kind)kind));
        v.round_set = 1;
        v.want_round = 201;
        cr_assert_eq(ds_viz_build(&v), 0);
        cr_expect(v.from_schedule);
        cr_expect(v.grouped_round);
        cr_expect_eq(v.round, 201);
        cr_expect_eq(v.n_mismatch, 0);
        size_t want = 0;
        for (uint32_t seg = 0; seg < 4; seg++) {
            uint32_t perm[3];
            const ds_topo_key key = {.seed = 11, .epoch = 9, .round = 201, .segment = seg};
            cr_assert_eq(ds_topo_targets((enum ds_topo_kind)kind, &key, 3, perm), 0);
            for (uint32_t a = 0; a < 3; a++) {
                if (perm[a] == a)
                    continue;
                want++;
                const int hf = grp_handler((int)a, seg), ht = grp_handler((int)perm[a], seg);
                char from[8], to[8];
                snprintf(from, sizeof(from), "n%d", hf);
                snprintf(to, sizeof(to), "n%d", ht);
                const int k = find_edge(&v, from, to, seg);
                cr_assert_geq(k, 0, "%s: no %s -> %s s%u", ds_topo_name(kind), from, to, seg);
                if (hf == 4) {
                    cr_expect_str_eq(v.e[k].outcome, "unreported");
                } else {
                    cr_expect_str_eq(v.e[k].outcome, "ok");
                    cr_expect_eq(v.e[k].bytes, 1000.0 * hf + seg);
                }
            }
        }
        cr_expect_eq(v.n_e, want, "%s: %zu edges, want %zu", ds_topo_name(kind), v.n_e, want);
        /* Drawn compactly: one edge per ordered pair of groups that
         * exchange in the round, box to box, and each group's reduction
         * said once, in its box. */
        int pairs[3][3] = {{0}};
        for (uint32_t seg = 0; seg < 4; seg++) {
            uint32_t perm[3];
            const ds_topo_key key = {.seed = 11, .epoch = 9, .round = 201, .segment = seg};
            cr_assert_eq(ds_topo_targets((enum ds_topo_kind)kind, &key, 3, perm), 0);
            for (uint32_t a = 0; a < 3; a++)
                if (perm[a] != a)
                    pairs[a][perm[a]] = 1;
        }
        char *dot = write_mem(ds_viz_write_dot, &v);
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                char want_attr[64];
                snprintf(want_attr, sizeof(want_attr), "ltail=cluster_%d, lhead=cluster_%d", a, b);
                cr_expect_eq(strstr(dot, want_attr) != NULL, pairs[a][b], "%s: g%d -> g%d\n%s",
                             ds_topo_name(kind), a, b, dot);
            }
        cr_expect_not_null(strstr(dot, "group g0\\nall-reduce inside, every step (3 members)"),
                           "%s", dot);
        cr_expect_null(strstr(dot, "group g2\\nall-reduce"), "a group of one reduces nothing");
        free(dot);
        /* dsviz's own drawing (no Graphviz): the same, group boxes with
         * one arrow per pair of groups. */
        int npairs = 0;
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++)
                npairs += pairs[a][b];
        char *svg = write_mem(ds_viz_write_own_svg, &v);
        int arrows = 0;
        for (const char *p = svg; (p = strstr(p, "url(#garrow)")); p++)
            arrows++;
        cr_expect_eq(arrows, npairs, "%s: %d arrows, %d pairs of groups", ds_topo_name(kind),
                     arrows, npairs);
        cr_expect_not_null(strstr(svg, "all-reduce inside, every step (3)"));
        cr_expect_not_null(strstr(svg, "all-reduce inside, every step (2)"));
        cr_expect_null(strstr(svg, "every step (1)"), "a group of one reduces nothing");
        free(svg);
        char *page = write_mem(html_no_svg, &v);
        cr_expect_not_null(strstr(page, "This round is between groups"), "the page explains");
        free(page);
        ds_viz_free(&v);
    }
}

static int html_no_svg(const ds_viz *v, FILE *f)
{
    return ds_viz_write_html(v, f, NULL);
}

/* The membership timeline merges the nodes' events: one line per event,
 * at its first report, with how many nodes list it; a suspicion reported
 * twice a minute apart is two lines, the same death reported by two
 * nodes one. Newest first. */
Test(dsviz, membership_timeline_merges_the_nodes_events)
{
    /* (node, member, kind, time, round, effective round) */
    static const struct {
        int node;
        const char *member;
        int kind;
        uint64_t t, round, eff;
    } evs[] = {
        {0, "n4", DS_EV_SUSPECT, 1000, 30, UINT64_MAX},
        {1, "n4", DS_EV_SUSPECT, 1200, 31, UINT64_MAX},
        {0, "n4", DS_EV_DEAD, 5000, 40, 52},
        {1, "n4", DS_EV_DEAD, 5100, 41, 52},
        {2, "n4", DS_EV_DEAD, 4900, 39, 52},
        {2, "n3", DS_EV_SUSPECT, 70000, 90, UINT64_MAX},
        {2, "n3", DS_EV_SUSPECT, 2000, 32, UINT64_MAX},
    };
    ds_viz v = {0};
    for (int i = 0; i < 3; i++) {
        ds_status_snapshot *s = view_snapshot(i, 5, 0xd0u, DS_TOPO_CROSSOVER, 100, 3, 7);
        for (size_t k = 0; k < sizeof(evs) / sizeof(evs[0]); k++) {
            if (evs[k].node != i)
                continue;
            ds_status_event e = {.kind = (uint8_t)evs[k].kind, .unix_ms = evs[k].t,
                                 .round = evs[k].round, .effective_round = evs[k].eff};
            snprintf(e.member, sizeof(e.member), "%s", evs[k].member);
            ds_status_events_add(&s->events, &e);
        }
        viz_add_snapshot(&v, s);
    }
    cr_assert_eq(ds_viz_build(&v), 0);
    char *html = write_mem(html_no_svg, &v);
    const char *want[] = {
        "<tr><td>00:01:10.000</td><td>90</td><td class=\"l\">n3</td><td class=\"l\">suspect"
        "</td><td>-</td><td class=\"l\">n2</td><td>1 of 3</td></tr>",
        "<tr><td>00:00:04.900</td><td>39</td><td class=\"l\">n4</td><td class=\"l\">dead</td>"
        "<td>52</td><td class=\"l\">n2</td><td>3 of 3</td></tr>",
        "<tr><td>00:00:02.000</td><td>32</td><td class=\"l\">n3</td><td class=\"l\">suspect"
        "</td><td>-</td><td class=\"l\">n2</td><td>1 of 3</td></tr>",
        "<tr><td>00:00:01.000</td><td>30</td><td class=\"l\">n4</td><td class=\"l\">suspect"
        "</td><td>-</td><td class=\"l\">n0</td><td>2 of 3</td></tr>",
    };
    const char *h2 = strstr(html, "<h2>Membership timeline");
    cr_assert_not_null(h2, "%s", html);
    size_t off = (size_t)(h2 - html);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *p = strstr(html + off, want[i]);
        cr_expect_not_null(p, "no line %zu: %s\nin:\n%s", i, want[i], html + off);
        if (p)
            off = (size_t)(p - html); /* in this order */
    }
    free(html);
    ds_viz_free(&v);
}

/* dsviz --serve's server, in this process: the live page over a run
 * directory of nodes with round histories: a slider over the history, the
 * round and segment asked for, and the traffic heatmap's sums. */
/* dir/nI/status.json for n0..n3 of history_snapshot (ring). */
static void write_history_dir_of(const char *dir, enum ds_topo_kind kind)
{
    for (int i = 0; i < 4; i++) {
        ds_status_snapshot *s = history_snapshot(i, kind);
        char *text, p[128];
        size_t len;
        cr_assert_eq(ds_status_render_json(s, 1000, &text, &len), 0);
        snprintf(p, sizeof(p), "%s/n%d", dir, i);
        cr_assert_eq(mkdir(p, 0700), 0);
        snprintf(p, sizeof(p), "%s/n%d/status.json", dir, i);
        FILE *f = fopen(p, "w");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(text, 1, len, f), len);
        cr_assert_eq(fclose(f), 0);
        free(text);
        free(s);
    }
}

static void write_history_dir(const char *dir)
{
    write_history_dir_of(dir, DS_TOPO_RING);
}

Test(dsviz, live_page_served)
{
    char dir[] = "/tmp/dsviz-live-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_history_dir(dir);
    char *srcs[] = {dir};
    ds_viz_server *sv = NULL;
    char err[600], addr[80];
    cr_assert_eq(ds_viz_serve_start(&sv, "127.0.0.1:0", srcs, 1, 5000, 5, DS_VIZ_HISTORY_DEFAULT, err,
                                    sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(ds_viz_serve_addr(sv, addr, sizeof(addr)), 0);
    char *body;
    size_t len;
    cr_assert_eq(ds_viz_http_get(addr, "/", 10000, 1 << 24, &body, &len, err, sizeof(err)), 0,
                 "%s", err);
    cr_expect_not_null(strstr(body, "<meta http-equiv=\"refresh\" content=\"5\">"));
    cr_expect_not_null(strstr(body, "type=\"range\" name=\"round\" min=\"100\" max=\"104\" "
                                    "value=\"104\""), "%s", body);
    cr_expect_not_null(strstr(body, "round 104, every segment"));
    /* Ring: n1 initiates to n2 in every round and segment: 5 rounds x
     * (100 + 101 + 102) bytes. */
    cr_expect_not_null(strstr(body, "n1 &rarr; n2: 1515 bytes"), "%s", body);
    cr_expect_not_null(strstr(body, "<h2>Membership"));
    /* n4 as each reporting node's view gives it (n0's: left) */
    cr_expect_not_null(strstr(body, "<tr><td class=\"l\">n4</td><td class=\"l\">left</td>"
                                    "<td class=\"l\">alive</td><td class=\"l\">alive</td>"
                                    "<td class=\"l\">alive</td><td>-</td></tr>"),
                       "%s", body);
    free(body);
    cr_assert_eq(ds_viz_http_get(addr, "/?round=102&segment=1", 10000, 1 << 24, &body, &len, err,
                                 sizeof(err)),
                 0, "%s", err);
    cr_expect_not_null(strstr(body, "round 102, segment 1"), "%s", body);
    cr_expect_not_null(strstr(body, "<option value=\"1\" selected>"));
    cr_expect_null(strstr(body, "<td><span class=\"sw\" style=\"background:#1f77b4\"></span>0"));
    free(body);
    cr_expect_eq(ds_viz_http_get(addr, "/nope", 10000, 1 << 20, &body, &len, err, sizeof(err)),
                 -EPROTO);
    ds_viz_serve_stop(&sv);
    cr_expect_null(sv);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* The live page in a real browser: Debian's chromium, headless, renders
 * round 102 with every pair of the schedule drawn (ring over 5 members,
 * 3 segments: 15 arrows) and the slider at 102; a screenshot is left in
 * the working directory (dsviz-live.png) as the test's artifact. Skipped
 * when chromium is not installed (ds.sh TEST_PKGS has it). */
Test(dsviz, live_page_in_chromium)
{
    if (access("/usr/bin/chromium", X_OK) != 0)
        cr_skip_test("chromium is not installed");
    char dir[] = "/tmp/dsviz-chromium-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    write_history_dir(dir);
    char *srcs[] = {dir};
    ds_viz_server *sv = NULL;
    char err[600], addr[80], url[160], prof[128], shot[300], cwd[200];
    cr_assert_eq(ds_viz_serve_start(&sv, "127.0.0.1:0", srcs, 1, 5000, 0, DS_VIZ_HISTORY_DEFAULT, err,
                                    sizeof(err)), 0,
                 "%s", err);
    cr_assert_eq(ds_viz_serve_addr(sv, addr, sizeof(addr)), 0);
    snprintf(url, sizeof(url), "http://%s/?round=102", addr);
    snprintf(prof, sizeof(prof), "--user-data-dir=%s/profile", dir);
    cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
    snprintf(shot, sizeof(shot), "--screenshot=%s/dsviz-live.png", cwd);
    char *dom_argv[] = {"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                        prof, "--dump-dom", url, NULL};
    char *out = NULL, *errs = NULL;
    const int code = run(dir, NULL, dom_argv, &out, &errs);
    cr_assert_eq(code, 0, "chromium exit %d: %s", code, errs);
    cr_expect_not_null(strstr(out, "round 102, every segment"), "%s", out);
    cr_expect_not_null(strstr(out, "value=\"102\""), "%s", out);
    cr_expect_eq(count(out, "marker-end=\"url(#arrow"), 15, "%s", out);
    free(out);
    free(errs);
    char *shot_argv[] = {"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                         prof, "--window-size=1400,1800", shot, url, NULL};
    cr_expect_eq(run(dir, NULL, shot_argv, NULL, NULL), 0);
    ds_viz_serve_stop(&sv);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* The slider, moved in a real browser: playwright-core (tests/browser,
 * installed by ds.sh with npm ci) drives Debian's chromium to the live
 * page, moves the round slider from the newest round to 101 as a user
 * does (the page submits its form on change), and the page then shows
 * round 101 with exactly that round's schedule (crossover over 5 members,
 * 3 segments, nodes n0..n3 reporting: a fresh derangement per round and
 * segment, so another round's pairs would differ). Skipped without chromium,
 * node or the installed playwright-core. */
Test(dsviz, slider_moved_in_chromium)
{
    if (access("/usr/bin/chromium", X_OK) != 0)
        cr_skip_test("chromium is not installed");
    if (access(DS_SOURCE_ROOT "/tests/browser/node_modules/playwright-core/package.json", R_OK))
        cr_skip_test("playwright-core is not installed (ds.sh test runs npm ci in tests/browser)");
    char dir[] = "/tmp/dsviz-slider-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char *ver[] = {"/usr/bin/env", "node", "--version", NULL};
    if (run(dir, NULL, ver, NULL, NULL) != 0)
        cr_skip_test("node is not installed");
    write_history_dir_of(dir, DS_TOPO_CROSSOVER);
    char *srcs[] = {dir};
    ds_viz_server *sv = NULL;
    char err[600], addr[80], url[160], outp[300];
    cr_assert_eq(ds_viz_serve_start(&sv, "127.0.0.1:0", srcs, 1, 5000, 0, DS_VIZ_HISTORY_DEFAULT,
                                    err, sizeof(err)),
                 0, "%s", err);
    cr_assert_eq(ds_viz_serve_addr(sv, addr, sizeof(addr)), 0);
    snprintf(url, sizeof(url), "http://%s/", addr);
    snprintf(outp, sizeof(outp), "%s/slider.json", dir);
    char *argv[] = {"/usr/bin/env", "node", DS_SOURCE_ROOT "/tests/browser/slider.mjs", url,
                    "101", outp, NULL};
    char *errs = NULL;
    const int code = run(dir, NULL, argv, NULL, &errs);
    cr_assert_eq(code, 0, "slider.mjs exit %d: %s", code, errs);
    free(errs);
    json_error_t je;
    json_t *res = json_load_file(outp, 0, &je);
    cr_assert_not_null(res, "%s: %s", outp, je.text);
    const char *end = json_string_value(json_object_get(res, "url"));
    cr_expect(end && strstr(end, "round=101"), "the browser ended on %s", end ? end : "?");
    cr_expect_str_eq(json_string_value(json_object_get(res, "slider")), "101");
    const char *h1 = json_string_value(json_object_get(res, "heading"));
    cr_expect(h1 && strstr(h1, "round 101"), "heading %s", h1 ? h1 : "?");
    const json_t *titles = json_object_get(res, "titles");
    size_t want = 0;
    for (uint32_t seg = 0; seg < 3; seg++) {
        uint32_t perm[5];
        const ds_topo_key key = {.seed = 7, .epoch = 3, .round = 101, .segment = seg};
        cr_assert_eq(ds_topo_targets(DS_TOPO_CROSSOVER, &key, 5, perm), 0);
        for (uint32_t a = 0; a < 5; a++) {
            if (perm[a] == a)
                continue;
            want++;
            char pre[48];
            snprintf(pre, sizeof(pre), "n%u -> n%u: s%u ", a, perm[a], seg);
            int found = 0;
            for (size_t k = 0; k < json_array_size(titles) && !found; k++) {
                const char *t = json_string_value(json_array_get(titles, k));
                found = t && !strncmp(t, pre, strlen(pre));
            }
            cr_expect(found, "round 101 lacks %s", pre);
        }
    }
    cr_expect_eq(json_array_size(titles), want, "%zu exchanges drawn, the schedule has %zu",
                 json_array_size(titles), want);
    json_decref(res);
    ds_viz_serve_stop(&sv);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Groups: 7 members in two groups and two of their own, ids not in name
 * order. Each node's document carries its group size and index as the
 * runtime computes them (ds_hier_form); the member dsviz names for each
 * group and segment is the one the product routes the segment to:
 * ds_hier_form's order, member ds_topo_hier_owner(s, size) of the group. */
Test(dsviz, group_members_handle_segments_as_the_node_computes)
{
    enum { G = 7, NSEG = 8 };
    static const char *const grp[G] = {"rackB", "rackA", "rackB", "rackA", "rackB", "", ""};
    static const uint64_t ids[G] = {0x50, 0x20, 0x10, 0x60, 0x30, 0x40, 0x70};
    ds_member_info mi[G];
    memset(mi, 0, sizeof(mi));
    for (int k = 0; k < G; k++) {
        mi[k].id = ids[k];
        snprintf(mi[k].name, sizeof(mi[k].name), "n%d", k);
        snprintf(mi[k].group, sizeof(mi[k].group), "%s", grp[k]);
    }
    ds_viz v = {0};
    uint32_t order[G], gidx[G];
    for (int i = 0; i < G; i++) {
        ds_hier h;
        cr_assert_eq(ds_hier_form(mi, G, ids[i], order, gidx, &h), 0);
        ds_status_snapshot *s = calloc(1, sizeof(*s));
        cr_assert_not_null(s);
        ds_status_snapshot_init(s);
        snprintf(s->name, sizeof(s->name), "n%d", i);
        snprintf(s->group, sizeof(s->group), "%s", grp[i]);
        s->id = ids[i];
        s->state = DS_STATUS_TRAINING;
        s->view_size = s->n_view = G;
        s->view_me = (uint32_t)i;
        for (int k = 0; k < G; k++) {
            snprintf(s->view[k].name, sizeof(s->view[k].name), "n%d", k);
            snprintf(s->view[k].group, sizeof(s->view[k].group), "%s", grp[k]);
            s->view[k].id = ids[k];
        }
        s->n_segments = s->n_exchanges = NSEG;
        for (uint32_t seg = 0; seg < NSEG; seg++) {
            s->exchanges[seg].segment = seg;
            snprintf(s->exchanges[seg].initiate_to, sizeof(s->exchanges[seg].initiate_to),
                     "n%d", (i + 1) % G);
            s->exchanges[seg].outcome = DS_XCHG_OK;
        }
        ds_publish_stats ps;
        memset(&ps, 0, sizeof(ps));
        ps.group.size = h.size;
        ps.group.member = h.member;
        cr_assert_eq(ds_publish_metrics(s, &ps), 0);
        char *text, err[256];
        size_t len;
        cr_assert_eq(ds_status_render_json(s, 1000, &text, &len), 0);
        cr_assert_eq(ds_viz_add_json(&v, text, len, "doc", err, sizeof(err)), 0, "%s", err);
        free(text);
        free(s);
    }
    cr_assert_eq(ds_viz_build(&v), 0);
    int checked = 0;
    for (uint32_t k = 0; k < G; k++) {
        const char *g = mi[order[k]].group;
        if (!g[0] || (k > 0 && gidx[k] == gidx[k - 1]))
            continue; /* the first entry of each named group */
        uint32_t size = 0;
        while (k + size < G && gidx[k + size] == gidx[k])
            size++;
        for (uint32_t seg = 0; seg < NSEG; seg++) {
            uint32_t owner;
            cr_assert_eq(ds_topo_hier_owner(seg, size, &owner), 0);
            const char *want = mi[order[k + owner]].name;
            const int h = ds_viz_group_handler(&v, g, seg);
            cr_assert_geq(h, 0, "group %s segment %u: no handler", g, seg);
            cr_expect_str_eq(v.m[h].name, want, "group %s segment %u", g, seg);
            checked++;
        }
    }
    cr_expect_eq(checked, 2 * NSEG);
    cr_expect_eq(ds_viz_group_handler(&v, "", 0), -1, "no group, no handler");
    cr_expect_eq(ds_viz_group_handler(&v, "rackC", 0), -1);

    /* The page (static and live share it) draws the table. */
    char *page = NULL;
    size_t plen = 0;
    FILE *f = open_memstream(&page, &plen);
    cr_assert_not_null(f);
    cr_assert_eq(ds_viz_write_html(&v, f, NULL), 0);
    fclose(f);
    cr_expect_not_null(strstr(page, "<h2>Groups: the member that handles each segment</h2>"));
    /* rackA is n1 (0x20) and n3 (0x60): segment 0 n1, segment 1 n3. */
    cr_expect_not_null(strstr(page, "<tr><td class=\"l\">rackA</td><td>2</td>"
                                    "<td class=\"l\">n1</td><td class=\"l\">n3</td>"),
                       "%s", page);
    free(page);
    ds_viz_free(&v);
}

/* Node n<i>'s document at time t whose history holds rounds lo..hi-1 (its
 * ring keeps the newest DS_STATUS_HISTORY of them); each segment's bytes
 * say which document it came from (tag). */
static char *ranged_json(int i, uint64_t lo, uint64_t hi, uint64_t t, uint64_t tag, size_t *len)
{
    ds_status_snapshot *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    ds_status_snapshot_init(s);
    snprintf(s->name, sizeof(s->name), "n%d", i);
    s->id = 0xc0u + (uint64_t)i;
    s->state = DS_STATUS_TRAINING;
    s->round = hi;
    snprintf(s->topology, sizeof(s->topology), "ring");
    s->view_size = s->n_view = 4;
    s->view_me = (uint32_t)i;
    for (int k = 0; k < 4; k++) {
        snprintf(s->view[k].name, sizeof(s->view[k].name), "n%d", k);
        s->view[k].id = 0xc0u + (uint64_t)k;
    }
    for (uint64_t r = lo; r < hi; r++) {
        ds_status_round h;
        memset(&h, 0, sizeof(h));
        h.round = r;
        h.view_size = 4;
        h.me = (uint32_t)i;
        h.n_segments = h.n_listed = 2;
        for (uint32_t seg = 0; seg < 2; seg++) {
            uint32_t perm[4];
            const ds_topo_key key = {.round = r, .segment = seg};
            cr_assert_eq(ds_topo_targets(DS_TOPO_RING, &key, 4, perm), 0);
            h.seg[seg].target = perm[i];
            h.seg[seg].target_id = 0xc0u + perm[i];
            h.seg[seg].outcome = DS_XCHG_OK;
            h.seg[seg].bytes = tag;
        }
        ds_status_history_add(&s->hist, &h);
    }
    char *text;
    cr_assert_eq(ds_status_render_json(s, t, &text, len), 0);
    free(s);
    return text;
}

/* The doc of node `name` in v (after add), NULL when none. */
static const json_t *doc_history(const ds_viz *v, const char *name)
{
    for (size_t d = 0; d < v->n_docs; d++)
        if (!strcmp(v->docs[d].name, name))
            return json_object_get(v->docs[d].doc, "history");
    return NULL;
}

/* The page of v (built from documents the server merged: rounds held and
 * bytes per target read from its history) is the page the same documents
 * give when read afresh (every history walked). */
static void expect_same_page_unmerged(ds_viz *v)
{
    ds_viz w = {0};
    for (size_t d = 0; d < v->n_docs; d++) {
        char *text = json_dumps(v->docs[d].doc, JSON_COMPACT);
        char err[256];
        cr_assert_not_null(text);
        cr_assert_eq(ds_viz_add_json(&w, text, strlen(text), v->docs[d].origin, err,
                                     sizeof(err)), 0,
                     "%s", err);
        free(text);
    }
    cr_assert_eq(ds_viz_build(&w), 0);
    cr_assert_null(w.hist);
    cr_assert_not_null(v->hist);
    cr_assert_eq(w.n_m, v->n_m);
    for (size_t i = 0; i < v->n_m * v->n_m; i++)
        cr_expect_eq(w.heat[i], v->heat[i], "cell %zu: %.0f read afresh, %.0f merged", i,
                     w.heat[i], v->heat[i]);
    const ds_viz_live o = {.refresh_s = 5};
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *f = open_memstream(&a, &la);
    cr_assert_eq(ds_viz_write_live(v, f, &o), 0);
    fclose(f);
    f = open_memstream(&b, &lb);
    cr_assert_eq(ds_viz_write_live(&w, f, &o), 0);
    fclose(f);
    cr_expect_eq(la, lb);
    cr_expect(la == lb && !memcmp(a, b, la), "the merged page differs from the page read afresh");
    cr_expect_not_null(strstr(a, "bytes\">"));
    free(a);
    free(b);
    ds_viz_free(&w);
}

/* The server's own history (dsviz --serve --history N): documents that each
 * hold the node's last 32 rounds, 16 rounds apart (every round in two
 * documents), merged over five refreshes into at most N = 60 rounds per
 * node: one entry per round, newest first, no gap, the oldest dropped, a
 * round both documents hold taken from the newer one; a node absent from a
 * refresh keeps what was merged; the page's slider covers the merged
 * rounds. */
Test(dsviz, serve_history_merges_bounded_newest)
{
    ds_viz_hist *h = NULL;
    cr_assert_eq(ds_viz_hist_new(&h, 0), -EINVAL);
    cr_assert_eq(ds_viz_hist_new(&h, DS_VIZ_HISTORY_MAX + 1), -EINVAL);
    cr_assert_eq(ds_viz_hist_new(&h, 60), 0);
    for (uint64_t k = 0; k < 5; k++) {
        const uint64_t lo = 16 * k, hi = lo + 32; /* rounds lo..hi-1 */
        ds_viz v = {0};
        for (int i = 0; i < 2; i++) {
            if (k == 3 && i == 1)
                continue; /* n1 did not answer this refresh */
            size_t len;
            char err[256];
            char *text = ranged_json(i, lo, hi, 1000 + k, 1000 * (k + 1) + (uint64_t)i, &len);
            cr_assert_eq(ds_viz_add_json(&v, text, len, "doc", err, sizeof(err)), 0, "%s", err);
            free(text);
        }
        cr_assert_eq(ds_viz_hist_merge(h, &v), 0);
        for (int i = 0; i < 2; i++) {
            const char *name = i ? "n1" : "n0";
            /* n1 missed refresh 3: it holds what refresh 2 left */
            const uint64_t top = (k == 3 && i == 1) ? hi - 16 : hi;
            const size_t want = top < 60 ? top : 60;
            double rlo, rhi;
            cr_expect_eq(ds_viz_hist_held(h, name, &rlo, &rhi), want, "refresh %lu %s",
                         (unsigned long)k, name);
            cr_expect_eq(rhi, (double)(top - 1));
            cr_expect_eq(rlo, (double)(top - want));
            const json_t *arr = doc_history(&v, name);
            if (k == 3 && i == 1) {
                cr_expect_null(arr);
                continue;
            }
            cr_assert_eq(json_array_size(arr), want);
            for (size_t j = 0; j < want; j++) {
                const json_t *e = json_array_get(arr, j);
                const double r = json_number_value(json_object_get(e, "round"));
                cr_assert_eq(r, (double)(top - 1 - j), "refresh %lu %s entry %zu: round %.0f",
                             (unsigned long)k, name, j, r);
                /* the entry of the newest document that held round r */
                const json_t *seg = json_array_get(json_object_get(e, "list"), 0);
                const double b = json_number_value(json_object_get(seg, "bytes"));
                uint64_t newest = (uint64_t)r / 16; /* the last document holding r */
                if (newest > k)
                    newest = k;
                if (i == 1 && k >= 3 && newest == 3)
                    newest = 2; /* n1 sent no document at refresh 3 */
                cr_expect_eq(b, 1000.0 * (double)(newest + 1) + i, "round %.0f bytes %.0f", r, b);
            }
        }
        cr_assert_eq(ds_viz_build(&v), 0);
        cr_expect_eq(v.rounds_max, (double)(hi - 1));
        cr_expect_eq(v.rounds_min, (double)(hi - (hi < 60 ? hi : 60)));
        expect_same_page_unmerged(&v);
        ds_viz_free(&v);
    }
    ds_viz_hist_free(&h);
    cr_expect_null(h);
}

/* Entries without a whole round >= 0 are left out of the merged history;
 * a document without a history and without merged rounds stays as it is. */
Test(dsviz, serve_history_skips_bad_rounds)
{
    ds_viz_hist *h = NULL;
    cr_assert_eq(ds_viz_hist_new(&h, 10), 0);
    const char *doc = "{\"schema\": 1, \"node\": {\"name\": \"a\"}, \"history\": ["
                      "{\"round\": 5}, {\"round\": -1}, {\"round\": 2.5}, {\"round\": \"3\"}, "
                      "{}, 7, {\"round\": 4}, {\"round\": 5}]}";
    const char *bare = "{\"schema\": 1, \"node\": {\"name\": \"b\"}}";
    ds_viz v = {0};
    char err[256];
    cr_assert_eq(ds_viz_add_json(&v, doc, strlen(doc), "a", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_viz_add_json(&v, bare, strlen(bare), "b", err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(ds_viz_hist_merge(h, &v), 0);
    double lo, hi;
    cr_expect_eq(ds_viz_hist_held(h, "a", &lo, &hi), 2);
    cr_expect_eq(lo, 4);
    cr_expect_eq(hi, 5);
    cr_expect_eq(ds_viz_hist_held(h, "b", NULL, NULL), 0);
    cr_expect_null(doc_history(&v, "b"));
    cr_expect_eq(json_array_size(doc_history(&v, "a")), 2);
    ds_viz_free(&v);
    ds_viz_hist_free(&h);
}

/* --history: a number of rounds 1..100000, for --serve only. */
Test(dsviz, program_refuses_bad_history)
{
    char dir[] = "/tmp/ds-dsviz-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    const char *bad[] = {"0", "-5", "abc", "", "100001", "12x"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        char *argv[] = {(char *)dsviz_bin(), "--serve", "127.0.0.1:0", "--history",
                        (char *)bad[k], dir, NULL};
        char *err;
        cr_expect_eq(run(dir, NULL, argv, NULL, &err), 2, "--history '%s'", bad[k]);
        char want[128];
        snprintf(want, sizeof(want), "--history: expected a number of rounds 1..100000, found '%s'",
                 bad[k]);
        cr_expect_not_null(strstr(err, want), "%s", err);
        free(err);
    }
    char *argv[] = {(char *)dsviz_bin(), "--history", "50", "--out", "-", "--format", "dot", dir,
                    NULL};
    char *err;
    cr_expect_eq(run(dir, NULL, argv, NULL, &err), 2);
    cr_expect_not_null(strstr(err, "--history is for --serve"), "%s", err);
    free(err);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}
