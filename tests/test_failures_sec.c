/*
 * tests/test_failures_sec.c: the allow-list of a running cluster changes
 * (issue 16), with dsnode processes started on loopback by dslaunch
 * (tools/dslaunch) and one more started here.
 *
 *   sec_reload/sighup_admits_then_revokes   two members share
 *       DIR/allowed_keys, which lacks a third identity ("joiner"):
 *       1. the joiner is refused (it exits 1, not admitted), a member
 *          counts the not_allowed drop, and the member's log holds the
 *          joiner's key exactly as its .pub line reads;
 *       2. the line is appended and both members get SIGHUP: they count a
 *          reload, the joiner started again joins (both members' views
 *          reach 3 with it alive), no member restarted;
 *       3. a bad file and SIGHUP: an error counted, the old list kept (the
 *          joiner stays in the views);
 *       4. the line removed and SIGHUP: both members count a revoked
 *          session, the joiner's frames are dropped and counted, and it
 *          leaves both views.
 *
 *   fabric_idle/raw_connections_counted   a dsnode process's fabric port
 *       takes raw TCP connections that send nothing: its status document
 *       counts them in transport.idle_connections while they are open;
 *       those their client does not close are closed by the node past the
 *       10 s deadline (the client reads EOF; idle_connections_closed);
 *       a connection that sent junk is never counted.
 *
 * Every wait is on what the status documents say, with a hard deadline
 * (launch_util.h); the joiner is killed and reaped on every path (and
 * tmp_fini kills whatever still names the run directory).
 *
 * Run: meson test -C build sec_reload --verbose
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

static pid_t joiner = -1;

static void joiner_stop(void)
{
    if (joiner > 0) {
        kill(joiner, SIGKILL);
        waitpid(joiner, NULL, 0);
        joiner = -1;
    }
}

static void fini(void)
{
    joiner_stop();
    tmp_fini();
}

TestSuite(sec_reload, .init = tmp_init, .fini = fini, .timeout = 400);
TestSuite(fabric_idle, .init = tmp_init, .fini = fini, .timeout = 300);

static const char *const members[] = {"n0", "n1"};

/* Run argv to the end (at most timeout_ms); its exit code, stderr in *err. */
static int run_capture(char *const *argv, int timeout_ms, char **err)
{
    char *o = NULL, errbuf[256];
    int code = -1;
    cr_assert_eq(ds_proc_capture(argv, timeout_ms, &o, err, &code, errbuf, sizeof(errbuf)), 0,
                 "%s", errbuf);
    free(o);
    return code;
}

/* The joiner's `dsnode run` argv: n1's config with its own name, port,
 * identity and data directory. */
struct joiner_cmd {
    char ini[600], listen[80], id[640], data[640], status[700];
    char *argv[24];
};

static void joiner_cmd_init(struct joiner_cmd *c, const char *out, int port)
{
    snprintf(c->ini, sizeof(c->ini), "%s/n1.ini", out);
    snprintf(c->listen, sizeof(c->listen), "node.listen=127.0.0.1:%d", port);
    snprintf(c->id, sizeof(c->id), "cluster.identity_file=%s/joiner.key", out);
    snprintf(c->data, sizeof(c->data), "node.data_dir=%s/joiner", out);
    snprintf(c->status, sizeof(c->status), "status.file=%s/joiner/status.json", out);
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/joiner", out);
    cr_assert(mkdir(dir, 0755) == 0 || errno == EEXIST, "%s: %s", dir, strerror(errno));
    char *const a[] = {(char *)bin("DSNODE"), "run", "--config", c->ini,
                       "--set", "node.name=joiner", "--set", c->listen,
                       "--set", c->id, "--set", c->data,
                       "--set", "status.listen=", "--set", c->status,
                       "--set", "cluster.min_members=1", NULL};
    memcpy(c->argv, a, sizeof(a));
}

/* Start the joiner in the background, its output in DIR/joiner.log. */
static void joiner_start(struct joiner_cmd *c, const char *out)
{
    char log[600];
    snprintf(log, sizeof(log), "%s/joiner.log", out);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        const int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(127);
        execv(c->argv[0], c->argv);
        _exit(127);
    }
    joiner = pid;
}

/* Send sig to both members. */
static void members_signal(const char *out, int sig)
{
    for (int i = 0; i < 2; i++) {
        const pid_t p = node_pid(out, members[i]);
        cr_assert_gt(p, 0, "%s is not running", members[i]);
        cr_assert_eq(kill(p, sig), 0);
    }
}

/* What a wait looks for in both members' documents. */
struct sec_watch {
    const char *out;
    double reloads, errors, revoked; /* at least, each member */
    int view;                        /* view.size, 0: any */
    int joiner_alive;                /* 1: listed alive; 0: not alive; -1: any */
    double last_drop[2];             /* refused frames seen: not_allowed + unknown_sender */
};

static int member_ok(struct sec_watch *w, int i)
{
    json_t *doc = status_load(w->out, members[i]);
    if (!doc)
        return 0;
    int ok = status_num(doc, "net.allow_reloads") >= w->reloads &&
             status_num(doc, "net.allow_reload_errors") >= w->errors &&
             status_num(doc, "net.sessions_revoked") >= w->revoked &&
             (!w->view || status_view_size(doc) == w->view);
    const char *st = status_member(doc, "joiner");
    const int alive_now = st && !strcmp(st, "alive");
    if (w->joiner_alive >= 0)
        ok &= alive_now == w->joiner_alive;
    w->last_drop[i] = status_num(doc, "drops.not_allowed") + status_num(doc, "drops.unknown_sender");
    json_decref(doc);
    return ok;
}

static int members_ok(void *arg)
{
    struct sec_watch *w = arg;
    return member_ok(w, 0) & member_ok(w, 1);
}

static int joiner_training(void *arg)
{
    json_t *doc = status_load(arg, "joiner");
    if (!doc)
        return 0;
    const int ok = !strcmp(status_state(doc), "training") && status_view_size(doc) == 3;
    json_decref(doc);
    return ok;
}

static int refused_counted(void *arg)
{
    const char *out = arg;
    double n = 0;
    for (int i = 0; i < 2; i++) {
        json_t *doc = status_load(out, members[i]);
        if (doc) {
            n += status_num(doc, "drops.not_allowed");
            json_decref(doc);
        }
    }
    return n >= 1;
}

/* The joiner's .pub line ("<hex> joiner"), from keygen's stdout. */
static void keygen_joiner(const char *out, char *line, size_t cap)
{
    char key[600], errbuf[256];
    snprintf(key, sizeof(key), "%s/joiner.key", out);
    char *const kg[] = {(char *)bin("DSNODE"), "keygen", "--out", key, "--name", "joiner", NULL};
    char *o = NULL, *e = NULL;
    int code = -1;
    cr_assert_eq(ds_proc_capture(kg, 20000, &o, &e, &code, errbuf, sizeof(errbuf)), 0, "%s",
                 errbuf);
    cr_assert_eq(code, 0, "keygen: %s", e);
    snprintf(line, cap, "%.*s", (int)strcspn(o, "\n"), o);
    free(o);
    free(e);
}

/* 1 when a member's log holds `line` as the refused key's allow-list line. */
static int logged_key_line(const char *out, const char *line)
{
    char want[400];
    snprintf(want, sizeof(want), "to admit it, add this line: %s\n", line);
    int found = 0;
    for (int i = 0; i < 2 && !found; i++) {
        char path[600];
        snprintf(path, sizeof(path), "%s/%s.log", out, members[i]);
        char *log = read_text(path);
        found = log && strstr(log, want);
        free(log);
    }
    return found;
}

static void must_wait(struct live *l, int ms, struct sec_watch *w, const char *what)
{
    if (!live_wait(l, ms, members_ok, w)) {
        joiner_stop();
        cr_assert_fail("%s (within %d ms)\n%s", what, ms, l->err);
    }
}

Test(sec_reload, sighup_admits_then_revokes)
{
    const char *out = tmp_path("reload");
    const char *args[] = {"local", "-n", "2", "--config", BASE_CONFIG,
                          "--set", "train.backend=cpu", "--set", "train.steps=1000000",
                          "--set", "train.eval_every=0", "--set", "train.log_every=10",
                          "--set", "gossip.timeout_ms=2000", "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "360", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n1", 20, 120000);

    char line[300], allowed[600], *err = NULL;
    keygen_joiner(out, line, sizeof(line));
    snprintf(allowed, sizeof(allowed), "%s/allowed_keys", out);
    char *orig = read_text(allowed);
    cr_assert_not_null(orig, "%s", allowed);
    const int port = ds_port_find(41000 + (int)(getpid() % 20000), 1);
    cr_assert_gt(port, 0, "no free port");
    struct joiner_cmd jc;
    joiner_cmd_init(&jc, out, port);

    /* 1. Refused: exits 1; counted; its key logged as an allow-list line. */
    const int code = run_capture(jc.argv, 60000, &err);
    cr_expect_eq(code, 1, "the unlisted joiner exits 1 (got %d)\n%s", code, err);
    cr_expect(strstr(err, "not admitted"), "a clear error:\n%s", err);
    free(err);
    cr_assert(live_wait(&l, 20000, refused_counted, (void *)out), "no member counts not_allowed");
    cr_expect(logged_key_line(out, line), "no member log holds the line '%s'", line);

    /* 2. Appended, SIGHUP: reloaded; the joiner joins, no member restarts. */
    const pid_t p0 = node_pid(out, "n0"), p1 = node_pid(out, "n1");
    char *more = malloc(strlen(orig) + strlen(line) + 2);
    cr_assert(more);
    sprintf(more, "%s%s\n", orig, line);
    write_bytes(allowed, more, strlen(more));
    free(more);
    members_signal(out, SIGHUP);
    struct sec_watch w = {.out = out, .reloads = 1, .joiner_alive = -1};
    must_wait(&l, 20000, &w, "members did not count the reload");
    joiner_start(&jc, out);
    w.view = 3;
    w.joiner_alive = 1;
    must_wait(&l, 90000, &w, "the joiner is not alive in both views of 3");
    if (!live_wait(&l, 90000, joiner_training, (void *)out)) {
        joiner_stop();
        cr_assert_fail("the joiner is not training in a view of 3");
    }
    cr_expect_eq(node_pid(out, "n0"), p0, "n0 restarted");
    cr_expect_eq(node_pid(out, "n1"), p1, "n1 restarted");

    /* 3. A bad file: error counted, the old list stays (joiner still in). */
    write_bytes(allowed, "not-a-key\n", 10);
    members_signal(out, SIGHUP);
    w.errors = 1;
    must_wait(&l, 20000, &w, "members did not count the bad reload");
    char want[700], path[600];
    snprintf(want, sizeof(want), "allow-list not reloaded, the previous one stays: %s:1:", allowed);
    snprintf(path, sizeof(path), "%s/n0.log", out);
    char *log0 = read_text(path);
    cr_expect(log0 && strstr(log0, want), "n0's log names file and line: '%s'", want);
    free(log0);

    /* 4. Removed, SIGHUP: sessions revoked, frames dropped, out of views. */
    write_bytes(allowed, orig, strlen(orig));
    members_signal(out, SIGHUP);
    w.reloads = 2;
    w.revoked = 1;
    w.view = 0;
    w.joiner_alive = -1;
    must_wait(&l, 20000, &w, "members did not revoke the joiner's sessions");
    const double drops_at_revoke = w.last_drop[0] + w.last_drop[1];
    w.view = 2;
    w.joiner_alive = 0;
    must_wait(&l, 90000, &w, "the joiner did not leave both views");
    cr_expect_gt(w.last_drop[0] + w.last_drop[1], drops_at_revoke,
                 "the joiner's frames after the revocation were not dropped and counted");

    joiner_stop();
    free(orig);
    members_signal(out, SIGTERM);
    live_end(&l, 60000);
    live_free(&l);
}

/* ---- idle connections on the fabric port ---------------------------------- */

struct idle_watch {
    const char *out;
    const char *key;
    double want;
    double seen;
};

static int idle_is(void *arg)
{
    struct idle_watch *w = arg;
    json_t *doc = status_load(w->out, "n0");
    if (!doc)
        return 0;
    w->seen = status_num(doc, w->key);
    json_decref(doc);
    return w->seen == w->want;
}

/* A raw TCP connection to 127.0.0.1:port that writes `junk` bytes. */
static int raw_connect(int port, size_t junk)
{
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s",
                 strerror(errno));
    if (junk)
        cr_assert_eq(write(fd, "\x7f\x7f\x7f\x7f", junk), (ssize_t)junk);
    return fd;
}

/* n0's fabric port, from its status document. */
static int n0_port(const char *out)
{
    json_t *doc = status_load(out, "n0");
    cr_assert_not_null(doc);
    const char *addr = json_string_value(json_object_get(json_object_get(doc, "node"), "addr"));
    cr_assert(addr && strrchr(addr, ':'), "no node.addr in n0's status");
    const int port = atoi(strrchr(addr, ':') + 1);
    json_decref(doc);
    cr_assert_gt(port, 0);
    return port;
}

/* N silent connections and K more that their client closes early are
 * counted while open; the N are closed by the node past its 10 s deadline
 * (the clients read EOF, idle_connections_closed counts them); a
 * connection that sent junk is never counted. */
Test(fabric_idle, raw_connections_counted)
{
    const char *out = tmp_path("idle");
    const char *args[] = {"local", "-n", "1", "--config", BASE_CONFIG,
                          "--set", "train.backend=cpu", "--set", "train.steps=1000000",
                          "--set", "train.eval_every=0", "--set", "cluster.min_members=1",
                          "--set", STATUS_FILE_ON,
                          "--out", out, "--json", "--timeout", "240", "--dsnode", bin("DSNODE"),
                          NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 10, 120000);
    const int port = n0_port(out);
    enum { N = 8, K = 3 };
    int fds[N + K + 1];
    for (int i = 0; i < N + K; i++)
        fds[i] = raw_connect(port, 0);
    fds[N + K] = raw_connect(port, 3);
    struct idle_watch w = {.out = out, .key = "transport.idle_connections", .want = N + K};
    const int counted = live_wait(&l, 8000, idle_is, &w);
    for (int i = N; i <= N + K; i++)
        close(fds[i]);
    cr_expect(counted, "n0 counts %.0f silent connections, not %d", w.seen, N + K);
    w.want = N;
    cr_expect(live_wait(&l, 8000, idle_is, &w), "%.0f silent connections after %d closed",
              w.seen, K);
    w.key = "transport.idle_connections_closed";
    cr_expect(live_wait(&l, 30000, idle_is, &w), "n0 closed %.0f, not %d", w.seen, N);
    for (int i = 0; i < N; i++) {
        const struct timeval tv = {.tv_sec = 5};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        char c;
        cr_expect_eq(read(fds[i], &c, 1), 0, "connection %d: EOF expected", i);
        close(fds[i]);
    }
    w.key = "transport.idle_connections";
    w.want = 0;
    cr_expect(live_wait(&l, 10000, idle_is, &w), "still %.0f silent connections", w.seen);
    const pid_t p0 = node_pid(out, "n0");
    if (p0 > 0)
        kill(p0, SIGTERM);
    live_end(&l, 60000);
    live_free(&l);
}
