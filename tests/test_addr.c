/*
 * tests/test_addr.c: addresses end to end (issue 13, "Addresses";
 * docs/config.md, node.advertise), with real dsnode processes.
 *
 *   addr/wildcard_with_advertise       three nodes listen on 0.0.0.0 and
 *       advertise 127.0.0.1: they form the cluster through the advertised
 *       addresses (n0 founds it: its advertise address is the first seed),
 *       train, and every status document shows the advertised addresses,
 *       the node's own and its view's.
 *   addr/wildcard_default_route        two "hosts", network namespaces of
 *       the test's own cabled by a veth pair (10.77.1.1 and .2, fd77::1 and
 *       ::2, default routes via .254 and fd77::fe): n0 and n1 on the first,
 *       n2 on the second, all on 0.0.0.0 without node.advertise, advertise
 *       their default route's address, reach each other across the cable
 *       and train; a node on [::] advertises [fd77::2].
 *   addr/wildcard_without_route_fails  in a namespace with loopback only:
 *       `run` and `check-config` on 0.0.0.0 and [::] fail with the error
 *       that asks for node.advertise; with node.advertise set they start.
 *   addr/ipv6_loopback_cluster         `dslaunch local --host ::1`: three
 *       nodes on [::1] train; while they run, each status page is read
 *       over IPv6 (addr, view addresses in brackets) and dsviz draws the
 *       cluster from the three [::1]:port pages; then SIGINT stops the
 *       run and its report names the [::1] addresses.
 *
 * Every process runs under a hard deadline and dies with the test
 * (PR_SET_PDEATHSIG; the suite's .fini kills whatever names the run
 * directory). Namespaces are named dsaddr-<pid>-<tag>: .fini removes this
 * process's, .init those of test processes that no longer exist. The
 * namespace tests skip unless root with a working `ip netns`.
 *
 * Run: meson test -C build addresses --print-errorlogs
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
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

#define NS_PREFIX "dsaddr-"

static const char *ip_path(void)
{
    return access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
}

/* `ip ARGS...` (NULL-terminated, at most 16) under a 20 s deadline; its
 * exit status (-1 when it could not run). */
static int ip_run(const char *a1, ...)
{
    char *argv[18];
    int n = 0;
    argv[n++] = (char *)ip_path();
    va_list ap;
    va_start(ap, a1);
    for (const char *a = a1; a && n < 17; a = va_arg(ap, const char *))
        argv[n++] = (char *)a;
    va_end(ap);
    argv[n] = NULL;
    char *out = NULL, *etext = NULL, err[256];
    int code = -1;
    if (ds_proc_capture(argv, 20000, &out, &etext, &code, err, sizeof(err)) < 0)
        code = -1;
    free(out);
    free(etext);
    return code;
}

/* The namespaces NS_PREFIX<pid>-* of pid (0: of dead pids) are removed. */
static void ns_remove(pid_t only)
{
    DIR *d = opendir("/run/netns");
    if (!d)
        return;
    char names[64][256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        if (strncmp(e->d_name, NS_PREFIX, strlen(NS_PREFIX)) || strlen(e->d_name) >= 64)
            continue;
        char *end;
        const long pid = strtol(e->d_name + strlen(NS_PREFIX), &end, 10);
        if (*end != '-' || pid <= 0)
            continue;
        if (only ? pid != only : (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        ip_run("netns", "del", names[i], NULL);
}

static void suite_init(void)
{
    tmp_init();
    if (geteuid() == 0)
        ns_remove(0);
}

static void suite_fini(void)
{
    tmp_fini(); /* kills every process naming the run directory first */
    if (geteuid() == 0)
        ns_remove(getpid());
}

TestSuite(addr, .init = suite_init, .fini = suite_fini, .timeout = 240);

static void need_netns(void)
{
    if (geteuid() != 0)
        cr_skip_test("network namespaces need root");
    if (access(ip_path(), X_OK) != 0)
        cr_skip_test("no ip (iproute2)");
    char name[64];
    snprintf(name, sizeof(name), NS_PREFIX "%d-probe", (int)getpid());
    if (ip_run("netns", "add", name, NULL) != 0)
        cr_skip_test("ip netns add does not work here");
    ip_run("netns", "del", name, NULL);
}

/* A namespace of this test process, NS_PREFIX<pid>-tag, into name, with
 * its loopback up. */
static void ns_make(const char *tag, char *name, size_t n)
{
    snprintf(name, n, NS_PREFIX "%d-%s", (int)getpid(), tag);
    cr_assert_eq(ip_run("netns", "add", name, NULL), 0, "ip netns add %s", name);
    cr_assert_eq(ip_run("-n", name, "link", "set", "lo", "up", NULL), 0);
}

/* Two hosts: namespaces a and b cabled by a veth pair (va in a, vb in b),
 * a at 10.77.1.1/24 and fd77::1/64, b at 10.77.1.2/24 and fd77::2/64,
 * each with default routes via 10.77.1.254 and fd77::fe (no such router:
 * a default route only has to exist). */
static void ns_pair(char *a, char *b, size_t n)
{
    ns_make("a", a, n);
    ns_make("b", b, n);
    cr_assert_eq(ip_run("link", "add", "va", "netns", a, "type", "veth", "peer", "name", "vb",
                        "netns", b, NULL), 0, "veth between %s and %s", a, b);
    const char *ns[2] = {a, b}, *dev[2] = {"va", "vb"};
    const char *v4[2] = {"10.77.1.1/24", "10.77.1.2/24"}, *v6[2] = {"fd77::1/64", "fd77::2/64"};
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(ip_run("-n", ns[k], "addr", "add", v4[k], "dev", dev[k], NULL), 0);
        cr_assert_eq(ip_run("-n", ns[k], "addr", "add", v6[k], "dev", dev[k], "nodad", NULL), 0);
        cr_assert_eq(ip_run("-n", ns[k], "link", "set", dev[k], "up", NULL), 0);
        cr_assert_eq(ip_run("-n", ns[k], "route", "add", "default", "via", "10.77.1.254", "dev",
                            dev[k], NULL), 0);
        cr_assert_eq(ip_run("-n", ns[k], "-6", "route", "add", "default", "via", "fd77::fe",
                            "dev", dev[k], NULL), 0);
    }
}

/* ---- dsnode processes ------------------------------------------------------- */

#define MAX_ARGS 48

struct cmd {
    char *argv[MAX_ARGS];
    int n;
    char buf[MAX_ARGS][640];
};

static void cmd_add(struct cmd *c, const char *fmt, ...)
{
    cr_assert_lt(c->n, MAX_ARGS - 1);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->buf[c->n], sizeof(c->buf[0]), fmt, ap);
    va_end(ap);
    c->argv[c->n] = c->buf[c->n];
    c->argv[++c->n] = NULL;
}

/* `dsnode VERB` (inside namespace ns unless NULL) with the base config
 * and the settings every node of these tests shares. */
static void cmd_dsnode(struct cmd *c, const char *ns, const char *verb)
{
    c->n = 0;
    if (ns) {
        cmd_add(c, "%s", ip_path());
        cmd_add(c, "netns");
        cmd_add(c, "exec");
        cmd_add(c, "%s", ns);
    }
    cmd_add(c, "%s", bin("DSNODE"));
    cmd_add(c, "%s", verb);
    if (!strcmp(verb, "run"))
        cmd_add(c, "--config");
    cmd_add(c, "%s", BASE_CONFIG);
    cmd_add(c, "--set");
    cmd_add(c, "cluster.key_file=%s", tmp_path("cluster.key"));
    cmd_add(c, "--set");
    cmd_add(c, "status.listen=");
    cmd_add(c, "--set");
    cmd_add(c, "train.backend=cpu");
    cmd_add(c, "--set");
    cmd_add(c, "train.eval_every=0");
    cmd_add(c, "--set");
    cmd_add(c, "train.warmup_steps=0");
}

static void cmd_set(struct cmd *c, const char *fmt, ...)
{
    char kv[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv, sizeof(kv), fmt, ap);
    va_end(ap);
    cmd_add(c, "--set");
    cmd_add(c, "%s", kv);
}

/* Settings of node `name` of a cluster: its data directory and status
 * file under the run directory (status_load reads DIR/name/status.json). */
static void cmd_node(struct cmd *c, const char *name, int steps, int members)
{
    char dir[600];
    snprintf(dir, sizeof(dir), "%s", tmp_path(name));
    mkdir(dir, 0755);
    cmd_set(c, "node.name=%s", name);
    cmd_set(c, "node.data_dir=%s", dir);
    cmd_set(c, "status.file=%s/status.json", dir);
    cmd_set(c, "train.steps=%d", steps);
    cmd_set(c, "cluster.min_members=%d", members);
}

static void make_cluster_key(void)
{
    char *argv[] = {(char *)bin("DSNODE"), "keygen", "--cluster", "--out",
                    (char *)tmp_path("cluster.key"), NULL};
    char *out = NULL, *etext = NULL, err[256];
    int code = -1;
    cr_assert_eq(ds_proc_capture(argv, 20000, &out, &etext, &code, err, sizeof(err)), 0, "%s",
                 err);
    cr_assert_eq(code, 0, "keygen: %s", etext);
    free(out);
    free(etext);
}

/* Starts c in the background, stdout and stderr to DIR/log; it dies with
 * the test process. */
static pid_t spawn(const struct cmd *c, const char *log)
{
    const pid_t parent = getpid();
    const pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        const int fd = open(tmp_path(log), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(c->argv[0], c->argv);
        _exit(127);
    }
    return pid;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to ms for pid; its exit status (128 + signal), or -1 after
 * killing it at the deadline. */
static int reap(pid_t pid, int ms)
{
    const long long end = now_ms() + ms;
    int st;
    for (;;) {
        const pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (now_ms() >= end) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        usleep(50000);
    }
}

/* c to completion under a deadline: exit status, output in *text. */
static int run_capture(const struct cmd *c, int ms, char **text)
{
    char *out = NULL, *etext = NULL, err[256];
    int code = -1;
    cr_assert_eq(ds_proc_capture(c->argv, ms, &out, &etext, &code, err, sizeof(err)), 0, "%s",
                 err);
    const size_t n = strlen(out) + strlen(etext) + 2;
    *text = malloc(n);
    cr_assert_not_null(*text);
    snprintf(*text, n, "%s%s", out, etext);
    free(out);
    free(etext);
    return code;
}

/* The status document's node.addr, and that every member of its view has
 * the address want(member name) gives. */
static void check_addresses(const json_t *doc, const char *name, const char *self_addr,
                            const char *(*want)(const char *member))
{
    cr_assert_not_null(doc, "%s wrote no status document", name);
    const char *addr = json_string_value(json_object_get(json_object_get(doc, "node"), "addr"));
    cr_assert_not_null(addr, "%s: no node.addr", name);
    cr_expect_str_eq(addr, self_addr, "%s: node.addr", name);
    const json_t *members = json_object_get(json_object_get(doc, "view"), "members");
    cr_assert(json_array_size(members) >= 1, "%s: an empty view", name);
    size_t i;
    const json_t *m;
    json_array_foreach(members, i, m) {
        const char *mn = json_string_value(json_object_get(m, "name"));
        const char *ma = json_string_value(json_object_get(m, "addr"));
        cr_assert(mn && ma, "%s: a member without name or addr", name);
        cr_expect_str_eq(ma, want(mn), "%s's view: %s", name, mn);
    }
}

static char log_tail_buf[4096];

/* The last 3 KiB of DIR/log, for failure messages. */
static const char *log_tail(const char *log)
{
    char *t = read_text(tmp_path(log));
    if (!t)
        return "(no log)";
    const size_t n = strlen(t);
    snprintf(log_tail_buf, sizeof(log_tail_buf), "%s", t + (n > 3000 ? n - 3000 : 0));
    free(t);
    return log_tail_buf;
}

/* The first status document of each node nI that showed a view of 3,
 * caught while the cluster ran. A finished node leaves, so the final
 * documents may show a smaller view: a node that finished first is gone
 * from the others' views. */
static json_t *g_full[3];

static void catch_full_views(void)
{
    for (int i = 0; i < 3; i++) {
        if (g_full[i])
            continue;
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *doc = status_load(tmp_path(""), name);
        if (doc && json_array_size(json_object_get(json_object_get(doc, "view"), "members")) == 3)
            g_full[i] = json_incref(doc);
        json_decref(doc);
    }
}

/* Three nodes n0..n2, node i in namespace ns[i] (NULL: here), listening
 * on listen_host:base+i, advertising adv_host:base+i when adv_host is not
 * NULL, seeded with seed_host:base; all must finish `steps`. Their status
 * files are rewritten every 50 ms and read every 20 ms, so that each
 * node's view of all three is caught (g_full). */
static void run_three(const char *const ns[3], const char *listen_host, const char *adv_host,
                      const char *seed_host, int base, int steps)
{
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        char name[8], log[16];
        snprintf(name, sizeof(name), "n%d", i);
        snprintf(log, sizeof(log), "n%d.log", i);
        struct cmd c;
        cmd_dsnode(&c, ns[i], "run");
        cmd_node(&c, name, steps, 3);
        cmd_set(&c, "status.file_interval_ms=50");
        cmd_set(&c, "node.listen=%s:%d", listen_host, base + i);
        if (adv_host)
            cmd_set(&c, "node.advertise=%s:%d", adv_host, base + i);
        cmd_set(&c, "cluster.seeds=%s:%d", seed_host, base);
        pids[i] = spawn(&c, log);
        g_full[i] = NULL;
    }
    const long long end = now_ms() + 150000;
    int codes[3] = {-2, -2, -2}, left = 3;
    while (left > 0) {
        catch_full_views();
        for (int i = 0; i < 3; i++) {
            int st;
            if (codes[i] != -2 || waitpid(pids[i], &st, WNOHANG) != pids[i])
                continue;
            codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            left--;
        }
        if (left > 0 && now_ms() >= end) {
            for (int i = 0; i < 3; i++)
                if (codes[i] == -2) {
                    kill(pids[i], SIGKILL);
                    waitpid(pids[i], NULL, 0);
                    codes[i] = -1;
                }
            break;
        }
        usleep(20000);
    }
    for (int i = 0; i < 3; i++) {
        char log[16];
        snprintf(log, sizeof(log), "n%d.log", i);
        cr_assert_eq(codes[i], 0, "n%d exited %d; its log ends:\n%s", i, codes[i], log_tail(log));
    }
}

static int g_base;
static const char *g_host[3];

/* What node nI must advertise: g_host[I]:g_base+I. */
static const char *addr_of(const char *member)
{
    static char buf[4][80];
    static int slot;
    char *b = buf[slot++ % 4];
    const int i = member[0] == 'n' ? atoi(member + 1) : -1;
    if (i < 0 || i > 2)
        return "(not a member of this test)";
    snprintf(b, 80, "%s:%d", g_host[i], g_base + i);
    return b;
}

static void check_three(const char *const host[3], int base, int steps)
{
    for (int i = 0; i < 3; i++)
        g_host[i] = host[i];
    g_base = base;
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        json_t *doc = status_load(tmp_path(""), name);
        cr_assert_not_null(doc);
        cr_expect_str_eq(status_state(doc), "done", "%s", name);
        cr_expect_eq(status_step(doc), steps, "%s", name);
        json_decref(doc);
        cr_assert_not_null(g_full[i], "%s: no status document showed a view of 3", name);
        check_addresses(g_full[i], name, addr_of(name), addr_of);
        json_decref(g_full[i]);
        g_full[i] = NULL;
    }
    /* n0 founded the cluster: its advertised address is the first seed. */
    char *log = read_text(tmp_path("n0.log"));
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "founding the cluster"), "n0 did not found the cluster");
    free(log);
}

/* ---- the tests ------------------------------------------------------------------ */

Test(addr, wildcard_with_advertise)
{
    make_cluster_key();
    const int base = ds_port_find_at("0.0.0.0", 43000 + (int)(getpid() % 4000) * 3, 3);
    cr_assert_geq(base, 1024);
    const char *const here[3] = {NULL, NULL, NULL};
    run_three(here, "0.0.0.0", "127.0.0.1", "127.0.0.1", base, 1000);
    const char *const lo[3] = {"127.0.0.1", "127.0.0.1", "127.0.0.1"};
    check_three(lo, base, 1000);
}

Test(addr, wildcard_default_route)
{
    need_netns();
    make_cluster_key();
    char a[64], b[64];
    ns_pair(a, b, sizeof(a));
    /* n0 and n1 on host a, n2 on host b; nothing else listens there. A
     * node that bound loopback instead of every interface (libfabric's
     * choice for 0.0.0.0 before fabric.c kept the wildcard) could not be
     * reached from the other host. */
    const int base = 7000;
    const char *const ns[3] = {a, a, b};
    run_three(ns, "0.0.0.0", NULL, "10.77.1.1", base, 1000);
    const char *const hosts[3] = {"10.77.1.1", "10.77.1.1", "10.77.1.2"};
    check_three(hosts, base, 1000);
    char *log = read_text(tmp_path("n1.log"));
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "node.listen = 0.0.0.0:7001 is a wildcard address: advertising "
                                   "10.77.1.1:7001 (va, the interface of the IPv4 default route)"),
                       "n1's log:\n%s", log_tail("n1.log"));
    free(log);

    /* check-config says what a wildcard node will advertise. */
    struct cmd c;
    cmd_dsnode(&c, b, "check-config");
    cmd_set(&c, "node.data_dir=%s", tmp_path("n2"));
    cmd_set(&c, "node.listen=0.0.0.0:7200");
    char *text;
    int cc = run_capture(&c, 60000, &text);
    cr_expect_eq(cc, 0, "check-config: exit %d\n%s", cc, text);
    cr_expect_not_null(strstr(text, "node.listen = 0.0.0.0:7200 is a wildcard address: peers will "
                                    "be told 10.77.1.2:7200 (vb, the interface of the IPv4 default "
                                    "route)"),
                       "check-config:\n%s", text);
    free(text);

    /* [::]: the IPv6 default route's interface, a global address. */
    cmd_dsnode(&c, b, "run");
    cmd_node(&c, "v6", 20, 1);
    cmd_set(&c, "node.listen=[::]:7100");
    cmd_set(&c, "cluster.seeds=");
    const pid_t pid = spawn(&c, "v6.log");
    const int code = reap(pid, 120000);
    cr_assert_eq(code, 0, "v6 exited %d:\n%s", code, log_tail("v6.log"));
    json_t *doc = status_load(tmp_path(""), "v6");
    cr_assert_not_null(doc);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "node"), "addr")),
                     "[fd77::2]:7100");
    json_decref(doc);
}

Test(addr, wildcard_without_route_fails)
{
    need_netns();
    make_cluster_key();
    char ns[64];
    ns_make("bare", ns, sizeof(ns));
    static const struct {
        const char *listen, *family, *file;
    } cases[] = {
        {"0.0.0.0:7000", "IPv4", "/proc/net/route"},
        {"[::]:7000", "IPv6", "/proc/net/ipv6_route"},
    };
    for (size_t k = 0; k < 2; k++) {
        char want[300];
        snprintf(want, sizeof(want),
                 "node.listen = %s is a wildcard address and no %s default route was found "
                 "(%s); set node.advertise = host:port, the address peers dial",
                 cases[k].listen, cases[k].family, cases[k].file);
        /* run: exit 1, the error on its own line. */
        struct cmd c;
        cmd_dsnode(&c, ns, "run");
        cmd_node(&c, "lone", 20, 1);
        cmd_set(&c, "node.listen=%s", cases[k].listen);
        cmd_set(&c, "cluster.seeds=");
        char *text;
        int code = run_capture(&c, 60000, &text);
        cr_expect_eq(code, 1, "run on %s: exit %d\n%s", cases[k].listen, code, text);
        cr_expect_not_null(strstr(text, "cannot start: "), "%s", text);
        cr_expect_not_null(strstr(text, want), "run on %s:\n%s", cases[k].listen, text);
        free(text);
        /* check-config (not --offline): exit 2, the same words. */
        cmd_dsnode(&c, ns, "check-config");
        cmd_set(&c, "node.data_dir=%s", tmp_path("lone"));
        cmd_set(&c, "node.listen=%s", cases[k].listen);
        code = run_capture(&c, 60000, &text);
        cr_expect_eq(code, 2, "check-config on %s: exit %d\n%s", cases[k].listen, code, text);
        cr_expect_not_null(strstr(text, want), "check-config on %s:\n%s", cases[k].listen, text);
        free(text);
    }
    /* With node.advertise set, the same node starts and trains. */
    struct cmd c;
    cmd_dsnode(&c, ns, "run");
    cmd_node(&c, "lone", 20, 1);
    cmd_set(&c, "node.listen=0.0.0.0:7000");
    cmd_set(&c, "node.advertise=127.0.0.1:7000");
    cmd_set(&c, "cluster.seeds=127.0.0.1:7000");
    const pid_t pid = spawn(&c, "lone.log");
    const int code = reap(pid, 120000);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, log_tail("lone.log"));
    json_t *doc = status_load(tmp_path(""), "lone");
    cr_assert_not_null(doc);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "node"), "addr")),
                     "127.0.0.1:7000");
    json_decref(doc);
}

/* ---- IPv6 loopback cluster ---------------------------------------------------------- */

/* The body of GET path from [::1]:port over an IPv6 socket (asserts a
 * 200), malloc'd; NULL when there is no answer (not serving yet). */
static char *get_body6(int port, const char *path)
{
    const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
    a.sin6_addr = in6addr_loopback;
    const struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(fd);
        return NULL;
    }
    char req[128];
    const int rn = snprintf(req, sizeof(req),
                            "GET %s HTTP/1.0\r\nHost: [::1]:%d\r\n\r\n", path, port);
    cr_assert_eq(write(fd, req, (size_t)rn), rn);
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, buf + len, cap - len - 1)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = '\0';
    const char *body = strstr(buf, "\r\n\r\n");
    cr_assert_not_null(body, "no HTTP answer from [::1]:%d: %.200s", port, buf);
    cr_assert_not_null(strstr(buf, " 200 "), "[::1]:%d: %.200s", port, buf);
    char *out = strdup(body + 4);
    cr_assert_not_null(out);
    free(buf);
    return out;
}

/* GET /status, the body parsed; NULL when there is no answer. */
static json_t *get_status6(int port)
{
    char *body = get_body6(port, "/status");
    if (!body)
        return NULL;
    json_error_t e;
    json_t *doc = json_loads(body, 0, &e);
    cr_assert_not_null(doc, "[::1]:%d: not JSON: %s", port, e.text);
    free(body);
    return doc;
}

/* "[::1]:P" of status.listen (or node.listen) in dslaunch's node config. */
static int port_of(const char *ini, const char *key)
{
    char *dump = config_valid(ini);
    char val[128];
    dump_value(dump, key, val, sizeof(val));
    free(dump);
    cr_assert_eq(strncmp(val, "[::1]:", 6), 0, "%s: %s = '%s'", ini, key, val);
    return atoi(val + 6);
}

static int g_node_port[3];

static const char *addr6_of(const char *member)
{
    static char buf[4][40];
    static int slot;
    char *b = buf[slot++ % 4];
    const int i = member[0] == 'n' ? atoi(member + 1) : 0;
    snprintf(b, 40, "[::1]:%d", i >= 0 && i < 3 ? g_node_port[i] : -1);
    return b;
}

struct scrape {
    int port[3];
    int seen; /* pages with all three members alive */
};

/* Every page answers, with its node's addr and a view of three. */
static int pages_ready(void *arg)
{
    struct scrape *s = arg;
    for (int i = 0; i < 3; i++) {
        json_t *doc = get_status6(s->port[i]);
        if (!doc)
            return 0;
        const size_t nm =
            json_array_size(json_object_get(json_object_get(doc, "view"), "members"));
        json_decref(doc);
        if (nm != 3)
            return 0;
    }
    return 1;
}

Test(addr, ipv6_loopback_cluster)
{
    const char *out = tmp_path("run");
    /* A run far longer than the test: it is stopped (SIGINT) once the
     * pages and dsviz are checked. With 400 steps the nodes could finish
     * before all three pages had been read (seen in CI). */
    const char *args[] = {"local", "-n", "3", "--host", "::1", "--config", BASE_CONFIG,
                          "--set", "train.steps=100000", "--set", "train.eval_every=0",
                          "--set", "train.backend=cpu", "--set", "train.warmup_steps=0",
                          "--set", STATUS_FILE_ON, "--out", out, "--json",
                          "--timeout", "180", "--dsnode", bin("DSNODE"), NULL};
    struct live l;
    live_start(&l, args);
    wait_for_step(&l, out, "n0", 1, 120000);
    struct scrape s;
    for (int i = 0; i < 3; i++) {
        char ini[600];
        snprintf(ini, sizeof(ini), "%s/n%d.ini", out, i);
        g_node_port[i] = port_of(ini, "\nlisten = ");
        s.port[i] = port_of(ini, "\n[status]\nlisten = ");
    }
    cr_assert(live_wait(&l, 60000, pages_ready, &s),
              "the three status pages on [::1] did not all show a view of 3; stderr:\n%s", l.err);
    /* Each page: its own advertised address and its view's, in brackets. */
    for (int i = 0; i < 3; i++) {
        json_t *doc = get_status6(s.port[i]);
        cr_assert_not_null(doc);
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "node"), "name")),
                         name);
        cr_expect_str_eq(json_string_value(json_object_get(json_object_get(doc, "node"), "addr")),
                         addr6_of(name));
        const json_t *members = json_object_get(json_object_get(doc, "view"), "members");
        size_t k;
        const json_t *m;
        json_array_foreach(members, k, m) {
            const char *mn = json_string_value(json_object_get(m, "name"));
            cr_assert_not_null(mn);
            cr_expect_str_eq(json_string_value(json_object_get(m, "addr")), addr6_of(mn),
                             "%s's view: %s", name, mn);
        }
        json_decref(doc);
    }
    /* dsviz reads the three live pages over IPv6 and draws every node. */
    char src[3][32];
    for (int i = 0; i < 3; i++)
        snprintf(src[i], sizeof(src[i]), "[::1]:%d", s.port[i]);
    char *viz[] = {(char *)bin("DSVIZ"), "--format", "dot", "--out", "-", src[0], src[1], src[2],
                   NULL};
    char *vout = NULL, *verr = NULL, err[256];
    int vcode = -1;
    cr_assert_eq(ds_proc_capture(viz, 30000, &vout, &verr, &vcode, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(vcode, 0, "dsviz exit %d: %s", vcode, verr);
    cr_expect_not_null(strstr(vout, "3 members, 3 reporting"), "dsviz:\n%s", vout);
    for (int i = 0; i < 3; i++) {
        char q[64];
        snprintf(q, sizeof(q), "label=\"n%d\\n", i);
        cr_expect_not_null(strstr(vout, q), "dsviz's dot lacks %s:\n%s", q, vout);
        snprintf(q, sizeof(q), "tooltip=\"n%d at [::1]:%d\"", i, g_node_port[i]);
        cr_expect_not_null(strstr(vout, q), "dsviz's dot lacks %s:\n%s", q, vout);
    }
    /* The round is drawn from the schedule (the nodes publish their
     * completed rounds), and every node's reported targets agree with it. */
    cr_expect_not_null(strstr(vout, "(from the schedule)"), "dsviz:\n%s", vout);
    cr_expect_null(strstr(verr, "other than the schedule"), "%s", verr);
    free(vout);
    free(verr);

    /* The page at / links the others; /metrics passes promtool's check
     * (Debian's prometheus package, ds.sh TEST_PKGS). */
    char *html = get_body6(s.port[0], "/");
    cr_assert_not_null(html);
    cr_expect_not_null(strstr(html, "<a href=\"/metrics\">"), "%s", html);
    free(html);
    char *metrics = get_body6(s.port[0], "/metrics");
    cr_assert_not_null(metrics);
    const char *mpath = tmp_path("metrics.txt");
    FILE *mf = fopen(mpath, "w");
    cr_assert_not_null(mf);
    cr_assert_eq(fputs(metrics, mf) >= 0 && fclose(mf) == 0, 1);
    /* The rounds drawn above had exchanges that completed over the real
     * transport: the latency histogram counted them, and they took time. */
    const char *lc = strstr(metrics, "dsnode_exchange_latency_seconds_count{node=\"n0\"} ");
    const char *ls = strstr(metrics, "dsnode_exchange_latency_seconds_sum{node=\"n0\"} ");
    cr_assert(lc && ls, "%s", metrics);
    cr_expect_gt(strtoull(strchr(lc, '}') + 2, NULL, 10), 0, "%s", metrics);
    cr_expect_gt(strtod(strchr(ls, '}') + 2, NULL), 0, "%s", metrics);
    free(metrics);
    char shcmd[700];
    snprintf(shcmd, sizeof(shcmd), "promtool check metrics < '%s'", mpath);
    char *pc[] = {"/bin/sh", "-c", shcmd, NULL};
    char *pout = NULL, *perr = NULL;
    int pcode = -1;
    cr_assert_eq(ds_proc_capture(pc, 30000, &pout, &perr, &pcode, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(pcode, 0, "promtool check metrics (exit %d):\n%s%s", pcode, pout, perr);
    free(pout);
    free(perr);

    cr_assert_eq(kill(l.pid, SIGINT), 0);
    const int code = live_end(&l, 60000);
    cr_assert_eq(code, 128 + SIGINT, "dslaunch exit %d\nstdout:\n%s\nstderr:\n%s", code, l.out,
                 l.err);
    json_t *report = last_json(l.out);
    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const json_t *nd = jnode(report, name);
        cr_expect_str_eq(jstr(nd, "status"), "stopped", "%s", name);
        cr_expect_gt(jnum(nd, "steps"), 0, "%s", name);
        cr_expect_str_eq(jstr(nd, "listen"), addr6_of(name), "%s", name);
    }
    json_decref(report);
}
