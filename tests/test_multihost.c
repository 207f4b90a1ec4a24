/*
 * tests/test_multihost.c: `dslaunch hosts` against real OpenSSH servers
 * (issue 13, ssh). Suite `multihost` (slow; `meson test -C build
 * multihost`).
 *
 * Three "hosts": network namespaces dsmh-<test pid>-h1..h3, each with one
 * veth to a bridge dsmh<test pid>br in the root namespace, at 10.214.0.K/24
 * (the bridge has 10.214.0.254, so dslaunch, here, reaches them). Each runs
 * Debian's sshd started by the test with a private config, host key and
 * authorized_keys in the test's temp dir; the client side is an ssh_config
 * there too (User root, the test's key, a known_hosts with the three host
 * keys, StrictHostKeyChecking yes), passed with --ssh-config. The namespaces
 * share this file system, so --dsnode's path is valid "remotely", and
 * --remote-dir puts the hosts' directories in the temp dir.
 *
 * The .fini hook kills every sshd and every process in the namespaces,
 * deletes the namespaces and the bridge, and removes the temp dir (and
 * tmp_fini kills a dslaunch left running), whether the test passed or not;
 * leftovers of a test process that was SIGKILLed are removed by the next
 * one (names carry the pid). Skipped unless root with ip, sshd, ssh and
 * ssh-keygen.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

#define NHOSTS 3
#define SSHD "/usr/sbin/sshd"

static pid_t sshd_pid[NHOSTS + 1];
static int sshd_fd[NHOSTS + 1][2];
static int made; /* namespaces/bridge were (maybe partly) made */

static const char *ip_prog(void)
{
    return access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
}

static void ns_name(int k, char *buf, size_t len)
{
    snprintf(buf, len, "dsmh-%d-h%d", (int)getpid(), k);
}

/* Everything in namespace k: every process killed, then the namespace. */
static void ns_remove(const char *ns)
{
    sh(NULL, "for p in $(%s netns pids %s 2>/dev/null); do kill -9 $p; done; %s netns del %s",
       ip_prog(), ns, ip_prog(), ns);
}

/* Namespaces and bridges of test processes that are gone. */
static void reap_stale(void)
{
    char *list = NULL;
    sh(&list, "%s netns list | sed -n 's/^\\(dsmh-[0-9]*-h[0-9]*\\).*/\\1/p'; "
              "%s -o link show type bridge | sed -n 's/^[0-9]*: \\(dsmh[0-9]*br\\).*/\\1/p'",
       ip_prog(), ip_prog());
    for (char *save = NULL, *l = list ? strtok_r(list, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save)) {
        long pid = strtol(l + 4 + (l[4] == '-'), NULL, 10);
        if (pid <= 0 || (kill((pid_t)pid, 0) == 0 || errno != ESRCH))
            continue;
        if (strstr(l, "br"))
            sh(NULL, "%s link del %s", ip_prog(), l);
        else
            ns_remove(l);
    }
    free(list);
}

static void mh_init(void)
{
    tmp_init();
    if (geteuid() == 0 && access(ip_prog(), X_OK) == 0)
        reap_stale();
}

static void mh_fini(void)
{
    for (int k = 1; k <= NHOSTS; k++)
        if (sshd_pid[k] > 0) {
            kill(sshd_pid[k], SIGKILL);
            waitpid(sshd_pid[k], NULL, 0);
            close(sshd_fd[k][0]);
            close(sshd_fd[k][1]);
            sshd_pid[k] = 0;
        }
    if (made) {
        char ns[64];
        for (int k = 1; k <= NHOSTS; k++) {
            ns_name(k, ns, sizeof(ns));
            ns_remove(ns);
        }
        sh(NULL, "%s link del dsmh%dbr", ip_prog(), (int)getpid());
        made = 0;
    }
    tmp_fini();
}

TestSuite(multihost, .init = mh_init, .fini = mh_fini, .timeout = 400);

/* A skipped test does not reach .fini (Criterion), so its temp dir is
 * removed here first. */
#define SKIP(...)                                                                                  \
    do {                                                                                           \
        tmp_fini();                                                                                \
        cr_skip_test(__VA_ARGS__);                                                                 \
    } while (0)

static void need_hosts(void)
{
    if (geteuid() != 0)
        SKIP("needs root (network namespaces, sshd)");
    if (access(ip_prog(), X_OK) < 0)
        SKIP("no ip program (iproute2)");
    if (access(SSHD, X_OK) < 0)
        SKIP("no %s (Debian: apt-get install openssh-server)", SSHD);
    if (sh(NULL, "command -v ssh && command -v ssh-keygen") != 0)
        SKIP("no ssh client (Debian: apt-get install openssh-client)");
}

static const char *host_addr(int k)
{
    static char a[NHOSTS + 1][16];
    snprintf(a[k], sizeof(a[k]), "10.214.0.%d", k);
    return a[k];
}

/* Three namespaces on one bridge, sshd in each, the client's ssh_config
 * at tmp_path("ssh_config"). */
static void hosts_up(void)
{
    const char *ip = ip_prog();
    const int me = (int)getpid();
    made = 1;
    cr_assert_eq(sh(NULL, "ssh-keygen -q -t ed25519 -N '' -C dsmh -f %s", tmp_path("id")), 0);
    cr_assert_eq(sh(NULL, "cp %s %s", tmp_path("id.pub"), tmp_path("authorized_keys")), 0);
    cr_assert_eq(sh(NULL, "%s link add dsmh%dbr type bridge && %s addr add 10.214.0.254/24 dev "
                          "dsmh%dbr && %s link set dsmh%dbr up",
                    ip, me, ip, me, ip, me), 0);
    /* The privilege separation directory Debian's sshd service makes. */
    cr_assert_eq(sh(NULL, "mkdir -p -m 0755 /run/sshd"), 0);
    FILE *kh = fopen(tmp_path("known_hosts"), "w");
    cr_assert_not_null(kh);
    for (int k = 1; k <= NHOSTS; k++) {
        char ns[64], dir[64], key[600], cfg[600];
        ns_name(k, ns, sizeof(ns));
        snprintf(dir, sizeof(dir), "h%d", k);
        cr_assert_eq(mkdir(tmp_path(dir), 0700), 0);
        cr_assert_eq(sh(NULL, "%s netns add %s && %s link add dsmh%dv%d type veth peer name eth0 "
                              "netns %s && %s link set dsmh%dv%d master dsmh%dbr up && "
                              "%s -n %s addr add %s/24 dev eth0 && %s -n %s link set eth0 up && "
                              "%s -n %s link set lo up",
                        ip, ns, ip, me, k, ns, ip, me, k, me, ip, ns, host_addr(k), ip, ns, ip,
                        ns), 0);
        snprintf(key, sizeof(key), "%s/hostkey", tmp_path(dir));
        cr_assert_eq(sh(NULL, "ssh-keygen -q -t ed25519 -N '' -C h%d -f %s", k, key), 0);
        snprintf(cfg, sizeof(cfg), "%s/sshd_config", tmp_path(dir));
        FILE *f = fopen(cfg, "w");
        cr_assert_not_null(f);
        /* ClientAlive*: a session whose client is unreachable ends after
         * 6 s on the host's side too (its nodes then get SIGTERM). */
        fprintf(f,
                "ListenAddress %s\nHostKey %s\nPidFile %s/sshd.pid\nAuthorizedKeysFile %s\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPrintMotd no\n"
                "ClientAliveInterval 2\nClientAliveCountMax 3\nLogLevel ERROR\n",
                host_addr(k), key, tmp_path(dir), tmp_path("authorized_keys"));
        cr_assert_eq(fclose(f), 0);
        char *pub = NULL;
        cr_assert_eq(sh(&pub, "cut -d' ' -f1,2 %s.pub", key), 0);
        fprintf(kh, "%s %s", host_addr(k), pub);
        free(pub);
        char logp[600];
        snprintf(logp, sizeof(logp), "%s/sshd.log", tmp_path(dir));
        char *argv[] = {(char *)ip, "netns", "exec", ns, SSHD, "-D", "-f", cfg, "-E", logp, NULL};
        char err[256];
        sshd_pid[k] = ds_proc_spawn(argv, &sshd_fd[k][0], &sshd_fd[k][1], err, sizeof(err));
        cr_assert_gt(sshd_pid[k], 0, "%s", err);
    }
    cr_assert_eq(fclose(kh), 0);
    FILE *c = fopen(tmp_path("ssh_config"), "w");
    cr_assert_not_null(c);
    fprintf(c,
            "Host 10.214.0.*\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n"
            "  UserKnownHostsFile %s\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n",
            tmp_path("id"), tmp_path("known_hosts"));
    cr_assert_eq(fclose(c), 0);
    cr_assert_eq(mkdir(tmp_path("remote"), 0700), 0);
    /* Each sshd answers within 10 s. */
    for (int k = 1; k <= NHOSTS; k++) {
        int ok = 0;
        for (int t = 0; t < 100 && !ok; t++) {
            ok = sh(NULL, "ssh -F %s -o BatchMode=yes -o ConnectTimeout=2 %s true",
                    tmp_path("ssh_config"), host_addr(k)) == 0;
            if (!ok)
                usleep(100000);
        }
        cr_assert(ok, "sshd on %s does not answer (log: %s/h%d/sshd.log)", host_addr(k),
                  tmp_path(""), k);
    }
}

/* dsnode processes now in namespace k. */
static int dsnodes_in(int k)
{
    char ns[64], *out = NULL;
    ns_name(k, ns, sizeof(ns));
    sh(&out, "for p in $(%s netns pids %s); do cat /proc/$p/comm 2>/dev/null; done", ip_prog(),
       ns);
    int n = 0;
    for (char *p = out; p && (p = strstr(p, "dsnode")); p += 6)
        n++;
    free(out);
    return n;
}

static int none_left(void *arg)
{
    int k = (int)(intptr_t)arg, n = 0;
    for (int h = 1; h <= NHOSTS; h++)
        if (!k || h == k)
            n += dsnodes_in(h);
    return n == 0;
}

/* The host directory of host index h (0-based) under --remote-dir, or ""
 * while there is none. */
static const char *remote_dir(int h)
{
    static char path[512];
    char suffix[16];
    path[0] = '\0';
    snprintf(suffix, sizeof(suffix), "-h%d", h);
    DIR *d = opendir(tmp_path("remote"));
    if (!d)
        return path;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name), s = strlen(suffix);
        if (!strncmp(e->d_name, "dslaunch-", 9) && n > s && !strcmp(e->d_name + n - s, suffix))
            snprintf(path, sizeof(path), "%s/%s", tmp_path("remote"), e->d_name);
    }
    closedir(d);
    return path;
}

/* Node n0 (host 0) has published step >= *(long long *)arg. */
static int n0_at(void *arg)
{
    const char *d = remote_dir(0);
    if (!*d)
        return 0;
    char p[600];
    snprintf(p, sizeof(p), "%s/n0/status.json", d);
    json_error_t je;
    json_t *doc = json_load_file(p, 0, &je);
    if (!doc)
        return 0;
    long long step = status_step(doc);
    json_decref(doc);
    return step >= *(long long *)arg;
}

#define HOSTS_ARG "10.214.0.1,10.214.0.2,10.214.0.3"

static void hosts_args(const char **a, int *k, const char *steps)
{
    static char out[512], dsnode[512];
    snprintf(out, sizeof(out), "%s", tmp_path("run"));
    snprintf(dsnode, sizeof(dsnode), "%s", bin("DSNODE"));
    const char *fixed[] = {"hosts", "--hosts", HOSTS_ARG, "--per-host", "2", "--config",
                           BASE_CONFIG, "--set", steps, "--set", "train.eval_every=100",
                           "--set", STATUS_FILE_ON, "--ssh-config", tmp_path("ssh_config"),
                           "--remote-dir", tmp_path("remote"), "--out", out, "--dsnode", dsnode,
                           "--json"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        a[(*k)++] = fixed[i];
}

/* 2 nodes on each of 3 hosts train 300 steps and finish; groups are the
 * hosts; models come back; the hosts' directories are removed. */
Test(multihost, train)
{
    need_hosts();
    hosts_up();
    const char *a[64];
    int k = 0;
    hosts_args(a, &k, "train.steps=300");
    a[k++] = "--timeout";
    a[k++] = "240";
    a[k] = NULL;
    struct result r = run_dslaunch(300000, a);
    cr_assert_eq(r.code, 0, "dslaunch hosts exited %d:\n%s", r.code, r.err);
    json_t *rep = last_json(r.out);
    cr_assert_str_eq(jstr(rep, "net"), "ssh");
    const json_t *nodes = json_object_get(rep, "nodes");
    for (int i = 0; i < 6; i++) {
        char name[8], conf[64], host[32], grp[64];
        snprintf(name, sizeof(name), "n%d", i);
        /* MLP on Fashion-MNIST, 300 steps: 0.85 measured (6 nodes, one
         * run); 0.7 leaves room for a slow shared machine's fewer rounds. */
        check_node_ok(nodes, name, 0.7);
        const json_t *nd = jnode(rep, name);
        snprintf(host, sizeof(host), "%s", host_addr(1 + i / 2));
        cr_assert_str_eq(jstr(nd, "host"), host);
        char listen[48];
        snprintf(listen, sizeof(listen), "%s:%d", host, 7000 + i % 2);
        cr_assert_str_eq(jstr(nd, "listen"), listen);
        cr_assert(json_is_string(json_object_get(nd, "model")), "%s: no model came back", name);
        snprintf(conf, sizeof(conf), "run/%s.ini", name);
        /* The node config as shipped (its paths are the host's, removed by
         * now, so read as text): node.group is the host. */
        char *ini = read_text(tmp_path(conf));
        cr_assert_not_null(ini);
        snprintf(grp, sizeof(grp), "\ngroup = %s\n", host);
        cr_assert(strstr(ini, grp), "%s: no '%s' in %s", name, grp + 1, conf);
        free(ini);
    }
    cr_assert_eq(jnum(rep, "consensus_models"), 6);
    for (int h = 0; h < NHOSTS; h++)
        cr_assert_str_eq(remote_dir(h), "", "host %d's directory is still there", h);
    cr_assert(none_left(0), "a dsnode is still running on a host");
    json_decref(rep);
    result_free(&r);
}

/* Host 3's link goes down mid-run: its sessions are lost (ssh's
 * keepalives), the other four nodes finish; dslaunch exits 1. On host 3
 * sshd drops the sessions too (ClientAlive), and its nodes are stopped. */
Test(multihost, link_down)
{
    need_hosts();
    hosts_up();
    const char *a[64];
    int k = 0;
    hosts_args(a, &k, "train.steps=1500");
    a[k++] = "--timeout";
    a[k++] = "300";
    a[k] = NULL;
    struct live l;
    live_start(&l, a);
    long long step = 100;
    cr_assert(live_wait(&l, 120000, n0_at, &step), "n0 did not reach step 100:\n%s", l.err);
    char ns[64];
    ns_name(3, ns, sizeof(ns));
    cr_assert_eq(sh(NULL, "%s -n %s link set eth0 down", ip_prog(), ns), 0);
    const int code = live_end(&l, 300000);
    cr_assert_eq(code, 1, "dslaunch exited %d:\n%s", code, l.err);
    json_t *rep = last_json(l.out);
    const json_t *nodes = json_object_get(rep, "nodes");
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        check_node_ok(nodes, name, 0.7);
    }
    for (int i = 4; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const json_t *nd = jnode(rep, name);
        cr_assert_eq(jnum(nd, "exit_status"), 255, "%s", name);
        cr_assert_str_eq(jstr(nd, "status"), "lost", "%s", name);
    }
    cr_assert(strstr(l.err, "n4 exited: lost(255)"), "%s", l.err);
    /* Within sshd's 6 s of ClientAlive plus the watcher's 5 s. */
    int ok = 0;
    for (int t = 0; t < 300 && !(ok = none_left((void *)(intptr_t)3)); t++)
        usleep(100000);
    cr_assert(ok, "host 3's nodes outlived their sessions by 30 s");
    json_decref(rep);
    live_free(&l);
}

/* While the nodes run, the files on the hosts are 0600 in a 0700
 * directory; SIGINT to dslaunch stops every node (their summaries still
 * come back: stopped, 143), and no dsnode is left on any host. */
Test(multihost, sigint)
{
    need_hosts();
    hosts_up();
    const char *a[64];
    int k = 0;
    hosts_args(a, &k, "train.steps=100000000");
    a[k] = NULL;
    struct live l;
    live_start(&l, a);
    long long step = 20;
    cr_assert(live_wait(&l, 120000, n0_at, &step), "n0 did not reach step 20:\n%s", l.err);
    for (int h = 0; h < NHOSTS; h++) {
        const char *d = remote_dir(h);
        struct stat st;
        cr_assert_eq(stat(d, &st), 0, "%s", d);
        cr_assert_eq(st.st_mode & 0777, 0700, "%s: %o", d, st.st_mode & 0777);
        const char *files[] = {"cluster.key", "allowed_keys", ".ini", ".key"};
        for (size_t f = 0; f < sizeof(files) / sizeof(files[0]); f++) {
            char name[32], p[600];
            if (files[f][0] == '.')
                snprintf(name, sizeof(name), "n%d%s", 2 * h, files[f]);
            else
                snprintf(name, sizeof(name), "%s", files[f]);
            snprintf(p, sizeof(p), "%s/%s", d, name);
            cr_assert_eq(stat(p, &st), 0, "%s", p);
            cr_assert_eq(st.st_mode & 0777, 0600, "%s: %o", p, st.st_mode & 0777);
        }
    }
    cr_assert_eq(kill(l.pid, SIGINT), 0);
    const int code = live_end(&l, 60000);
    cr_assert_eq(code, 130, "dslaunch exited %d:\n%s", code, l.err);
    json_t *rep = last_json(l.out);
    for (int i = 0; i < 6; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const json_t *nd = jnode(rep, name);
        cr_assert_str_eq(jstr(nd, "status"), "stopped", "%s", name);
        cr_assert_eq(jnum(nd, "exit_status"), 143, "%s", name);
    }
    cr_assert(none_left(0), "a dsnode outlived dslaunch's SIGINT");
    json_decref(rep);
    live_free(&l);
}

/* dslaunch SIGKILLed: its ssh clients die with it (PDEATHSIG), each
 * session's stdin closes, and the nodes on every host are stopped. */
Test(multihost, dslaunch_killed)
{
    need_hosts();
    hosts_up();
    const char *a[64];
    int k = 0;
    hosts_args(a, &k, "train.steps=100000000");
    a[k] = NULL;
    struct live l;
    live_start(&l, a);
    long long step = 20;
    cr_assert(live_wait(&l, 120000, n0_at, &step), "n0 did not reach step 20:\n%s", l.err);
    cr_assert_gt(dsnodes_in(1) + dsnodes_in(2) + dsnodes_in(3), 0);
    cr_assert_eq(kill(l.pid, SIGKILL), 0);
    cr_assert_eq(live_end(&l, 10000), 128 + SIGKILL);
    /* SIGTERM at once, SIGKILL 5 s later from the watcher. */
    int ok = 0;
    for (int t = 0; t < 200 && !(ok = none_left(0)); t++)
        usleep(100000);
    cr_assert(ok, "nodes outlived a SIGKILLed dslaunch by 20 s");
    live_free(&l);
}
