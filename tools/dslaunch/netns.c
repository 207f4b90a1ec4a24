/*
 * tools/dslaunch/netns.c: one network namespace per node, behind a
 * rate-limited link (`dslaunch local --netns [--netns-rate RATE]`).
 *
 * On loopback every node has the whole memory bus as its network: nothing
 * shows what a sparsifier saves. Here each node gets the network a small
 * cluster would give it: its own namespace with one Ethernet-like interface
 * (eth0, MTU 1500) at 10.213.A.B/16, cabled by a veth pair to a bridge in
 * the root namespace, which plays the switch. With a rate, a tc token bucket
 * (tbf) sits on both ends of every cable: the node's eth0 limits what it
 * sends, the root-side end limits what it receives, so every node has RATE
 * up and RATE down, as a NIC on a non-blocking switch.
 *
 *      ns dsl-<pid>-n0              root namespace                ns dsl-<pid>-n1
 *   [dsnode n0] eth0 <--veth--> dsl<tag>v0 --+                 +-- dsl<tag>v1 <--veth--> eth0 [n1]
 *   10.213.1.1  (tbf)                (tbf)  bridge dsl<tag>br  (tbf)                (tbf) 10.213.1.2
 *
 * Nothing leaves this island. The bridge has no address, no namespace has a
 * default route and nothing else is enslaved to the bridge, so the nodes can
 * reach one another and nothing else, and the root namespace gets no route
 * to 10.213.0.0/16 (two runs at once therefore never collide: each has its
 * own bridge, and equal addresses on two islands never meet).
 *
 * Names carry the dslaunch pid (<pid> in decimal for namespaces, <tag> = the
 * pid in base 36 for interfaces, which must fit IFNAMSIZ): a run cleans up
 * exactly what it made, and a later run can tell a leftover of a dslaunch
 * that was SIGKILLed (its pid gone, or now a process that is no dslaunch by
 * its comm or argv[0]) and remove it (ds_netns_reap_stale). Everything is done by running ip(8) and tc(8)
 * with fixed argument vectors built from those names, never through a
 * shell; each command's stderr is reported when it fails.
 *
 * Root is required (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`);
 * ds_netns_check says so plainly instead of failing half-way.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tools/dslaunch/dslaunch.h"

#define NETNS_CMD_MS 20000 /* one ip/tc command */

/* A program from the usual system directories, else from PATH. */
static int find_program(const char *name, char *out, size_t len)
{
    static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(out, len, "%s/%s", dirs[i], name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    const char *path = getenv("PATH");
    char *copy = path ? strdup(path) : NULL, *save = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
        if (*d != '/')
            continue; /* a relative PATH entry is no place to take a root tool from */
        snprintf(out, len, "%s/%s", d, name);
        if (access(out, X_OK) == 0) {
            free(copy);
            return 0;
        }
    }
    free(copy);
    out[0] = '\0';
    return -ENOENT;
}

int ds_netns_rate_parse(const char *s, uint64_t *bits_per_s)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -EINVAL;
    /* Plain decimal only: strtod alone would also take hex and exponents. */
    size_t len = 0;
    int dots = 0;
    while (isdigit((unsigned char)s[len]) || (s[len] == '.' && !dots++))
        len++;
    char num[32], *end;
    if (len >= sizeof(num))
        return -EINVAL;
    memcpy(num, s, len);
    num[len] = '\0';
    errno = 0;
    const double v = strtod(num, &end);
    if (errno || *end)
        return -EINVAL;
    end = (char *)s + len;
    double mult;
    if (!strcasecmp(end, "kbit"))
        mult = 1e3;
    else if (!strcasecmp(end, "mbit"))
        mult = 1e6;
    else if (!strcasecmp(end, "gbit"))
        mult = 1e9;
    else
        return -EINVAL;
    const double bps = v * mult;
    /* Below 8 kbit/s a single 1500-byte frame takes over a second; above
     * 100 Gbit/s tbf on a veth is not the bottleneck any more. */
    if (!(bps >= 8e3 && bps <= 1e11))
        return -ERANGE;
    *bits_per_s = (uint64_t)(bps + 0.5);
    return 0;
}

void ds_netns_addr(int i, char *buf, size_t len)
{
    snprintf(buf, len, "10.213.%d.%d", 1 + i / 200, 1 + i % 200);
}

void ds_netns_name(const ds_netns *ns, int i, char *buf, size_t len)
{
    snprintf(buf, len, "dsl-%d-n%d", (int)ns->owner, i);
}

/* The root-side end of node i's cable. */
static void veth_name(const ds_netns *ns, int i, char *buf, size_t len)
{
    snprintf(buf, len, "dsl%sv%d", ns->tag, i);
}

static void base36(unsigned long v, char *buf, size_t len)
{
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
        v /= 36;
    } while (v && n < (int)sizeof(tmp));
    size_t k = 0;
    while (n > 0 && k + 1 < len)
        buf[k++] = tmp[--n];
    buf[k] = '\0';
}

int ds_netns_check(char *err, size_t len)
{
    char ip[PATH_MAX], tc[PATH_MAX];
    if (geteuid() != 0) {
        snprintf(err, len, "--netns needs root (it creates network namespaces, a bridge and "
                           "veth pairs); run dslaunch as root, or leave --netns out");
        return -EPERM;
    }
    if (find_program("ip", ip, sizeof(ip)) < 0) {
        snprintf(err, len, "--netns needs the ip program (iproute2), not found");
        return -ENOENT;
    }
    if (find_program("tc", tc, sizeof(tc)) < 0) {
        snprintf(err, len, "--netns needs the tc program (iproute2), not found");
        return -ENOENT;
    }
    char *argv[] = {ip, "netns", "list", NULL};
    char *out = NULL, *etext = NULL, why[256];
    int code = 0;
    int ret = ds_proc_capture(argv, NETNS_CMD_MS, &out, &etext, &code, why, sizeof(why));
    if (ret < 0 || code != 0) {
        snprintf(err, len, "--netns: `ip netns list` does not work here: %s",
                 ret < 0 ? why : etext && *etext ? etext : "no message");
        free(out);
        free(etext);
        return -EOPNOTSUPP;
    }
    free(out);
    free(etext);
    return 0;
}

int ds_netns_init(ds_netns *ns, pid_t owner, int n, uint64_t rate_bps, char *err, size_t len)
{
    memset(ns, 0, sizeof(*ns));
    if (n < 1 || n > DS_NETNS_MAX) {
        snprintf(err, len, "--netns: 1..%d nodes, not %d", DS_NETNS_MAX, n);
        return -EINVAL;
    }
    if (find_program("ip", ns->ip, sizeof(ns->ip)) < 0 ||
        find_program("tc", ns->tc, sizeof(ns->tc)) < 0) {
        snprintf(err, len, "--netns needs the ip and tc programs (iproute2)");
        return -ENOENT;
    }
    ns->owner = owner;
    ns->n = n;
    ns->rate_bps = rate_bps;
    base36((unsigned long)owner, ns->tag, sizeof(ns->tag));
    snprintf(ns->bridge, sizeof(ns->bridge), "dsl%sbr", ns->tag);
    return 0;
}

/* Runs argv; 0, or -EIO with "what: its stderr" in err. */
static int run_cmd(char *const argv[], char *err, size_t len)
{
    char *out = NULL, *etext = NULL, why[256];
    int code = 0;
    int ret = ds_proc_capture(argv, NETNS_CMD_MS, &out, &etext, &code, why, sizeof(why));
    if (ret == 0 && code == 0) {
        free(out);
        free(etext);
        return 0;
    }
    char cmd[512];
    size_t w = 0;
    cmd[0] = '\0';
    for (int i = 0; argv[i] && w < sizeof(cmd); i++)
        w += (size_t)snprintf(cmd + w, sizeof(cmd) - w, "%s%s", i ? " " : "",
                              i ? argv[i] : strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                                                  : argv[0]);
    if (etext) { /* one line is enough */
        char *nl = strchr(etext, '\n');
        if (nl)
            *nl = '\0';
    }
    snprintf(err, len, "`%s` failed: %s", cmd,
             ret < 0 ? why : etext && *etext ? etext : "no message");
    free(out);
    free(etext);
    return -EIO;
}

/* tbf on dev (in namespace nsname, or the root one when NULL). */
static int add_tbf(const ds_netns *ns, const char *nsname, const char *dev, char *err,
                   size_t len)
{
    char rate[32], burst[32];
    snprintf(rate, sizeof(rate), "%llubit", (unsigned long long)ns->rate_bps);
    /* The bucket holds 2 ms at the rate, at least 64 KiB: a GSO frame of a
     * veth (up to 64 KiB) then passes whole instead of being cut up by tbf,
     * and bursts stay far below a round's traffic, so the long-run rate is
     * the configured one. 50 ms of queue absorbs a round's burst of sends. */
    uint64_t b = ns->rate_bps / 8 / 500;
    if (b < 65536)
        b = 65536;
    snprintf(burst, sizeof(burst), "%llu", (unsigned long long)b);
    char *a[] = {(char *)ns->tc, "-n", (char *)nsname, "qdisc", "add", "dev", (char *)dev,
                 "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms", NULL};
    char *r[] = {(char *)ns->tc, "qdisc", "add", "dev", (char *)dev, "root", "tbf", "rate",
                 rate, "burst", burst, "latency", "50ms", NULL};
    return run_cmd(nsname ? a : r, err, len);
}

int ds_netns_setup(ds_netns *ns, char *err, size_t len)
{
    int ret;
    char *ip = ns->ip;
    if (!ns->bridge_made) {
        char *add[] = {ip, "link", "add", ns->bridge, "type", "bridge", NULL};
        if ((ret = run_cmd(add, err, len)) < 0)
            return ret;
        ns->bridge_made = 1;
        char *up[] = {ip, "link", "set", ns->bridge, "up", NULL};
        if ((ret = run_cmd(up, err, len)) < 0)
            return ret;
    }
    while (ns->made < ns->n) {
        const int i = ns->made;
        char name[64], veth[32], addr[48];
        ds_netns_name(ns, i, name, sizeof(name));
        veth_name(ns, i, veth, sizeof(veth));
        ds_netns_addr(i, addr, sizeof(addr));
        strcat(addr, "/16");
        /* Counted before it exists, so teardown also removes a half-made one. */
        ns->made++;
        char *nsadd[] = {ip, "netns", "add", name, NULL};
        char *pair[] = {ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                        "netns", name, NULL};
        char *plug[] = {ip, "link", "set", veth, "master", ns->bridge, "up", NULL};
        char *lo[] = {ip, "-n", name, "link", "set", "lo", "up", NULL};
        char *addr_[] = {ip, "-n", name, "addr", "add", addr, "dev", "eth0", NULL};
        char *up[] = {ip, "-n", name, "link", "set", "eth0", "up", NULL};
        char *const *steps[] = {nsadd, pair, plug, lo, addr_, up};
        for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++)
            if ((ret = run_cmd(steps[k], err, len)) < 0)
                return ret;
        if (ns->rate_bps && ((ret = add_tbf(ns, NULL, veth, err, len)) < 0 ||
                             (ret = add_tbf(ns, name, "eth0", err, len)) < 0))
            return ret;
    }
    return 0;
}

void ds_netns_exec_prefix(const ds_netns *ns, int i, char *name, size_t name_len,
                          char *argv[4])
{
    ds_netns_name(ns, i, name, name_len);
    argv[0] = (char *)ns->ip;
    argv[1] = "netns";
    argv[2] = "exec";
    argv[3] = name;
}

int ds_netns_link_bytes(const ds_netns *ns, int i, uint64_t *out_bytes)
{
    char veth[32], path[96];
    veth_name(ns, i, veth, sizeof(veth));
    /* The root side receives what the namespace sends out. */
    snprintf(path, sizeof(path), "/sys/class/net/%s/statistics/rx_bytes", veth);
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    unsigned long long v;
    const int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (!ok)
        return -EIO;
    *out_bytes = v;
    return 0;
}

int ds_netns_teardown(ds_netns *ns, FILE *warn)
{
    int failed = 0;
    char err[600];
    /* The root-side veth first: deleting it removes its peer at once,
     * while a namespace's own devices go with it only when the kernel gets
     * round to destroying it. Then the namespace, then the bridge. */
    for (int i = ns->made - 1; i >= 0; i--) {
        char name[64], veth[32];
        ds_netns_name(ns, i, name, sizeof(name));
        veth_name(ns, i, veth, sizeof(veth));
        char *dv[] = {ns->ip, "link", "del", veth, NULL};
        char *dn[] = {ns->ip, "netns", "del", name, NULL};
        (void)run_cmd(dv, err, sizeof(err)); /* absent when setup stopped before it */
        if (run_cmd(dn, err, sizeof(err)) < 0) {
            char path[128];
            snprintf(path, sizeof(path), "/run/netns/%s", name);
            if (access(path, F_OK) == 0) { /* it exists and would not go */
                failed++;
                if (warn)
                    fprintf(warn, "dslaunch: --netns teardown: %s\n", err);
            }
        }
    }
    ns->made = 0;
    if (ns->bridge_made) {
        char *db[] = {ns->ip, "link", "del", ns->bridge, NULL};
        if (run_cmd(db, err, sizeof(err)) < 0) {
            failed++;
            if (warn)
                fprintf(warn, "dslaunch: --netns teardown: %s\n", err);
        }
        ns->bridge_made = 0;
    }
    return failed ? -EIO : 0;
}

/* 1 when pid is a running dslaunch or dsbench (then its namespaces are in
 * use: dsbench makes the namespaces of its PyTorch DDP rows itself). */
static int owner_alive(long pid)
{
    if (pid <= 0 || pid > INT_MAX)
        return 0;
    if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
        return 0;
    char path[64], comm[64] = "";
    snprintf(path, sizeof(path), "/proc/%ld/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = '\0';
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    if (!strcmp(comm, "dslaunch") || !strcmp(comm, "dsbench"))
        return 1;
    /* Started through a link of another name: its argv[0] still says. */
    char argv0[PATH_MAX] = "";
    snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
    if (!(f = fopen(path, "r")))
        return 0;
    size_t n = fread(argv0, 1, sizeof(argv0) - 1, f);
    fclose(f);
    argv0[n] = '\0'; /* the first NUL ends argv[0] */
    const char *base = strrchr(argv0, '/');
    base = base ? base + 1 : argv0;
    return strstr(base, "dslaunch") != NULL || strstr(base, "dsbench") != NULL;
}

int ds_netns_stale_owner(const char *name, long *pid)
{
    char *end;
    if (!strncmp(name, "dsl-", 4) && isdigit((unsigned char)name[4])) {
        /* namespace: dsl-<decimal pid>-n<decimal> */
        long p = strtol(name + 4, &end, 10);
        if (end[0] != '-' || end[1] != 'n' || !isdigit((unsigned char)end[2]))
            return 0;
        for (const char *q = end + 2; *q; q++)
            if (!isdigit((unsigned char)*q))
                return 0;
        *pid = p;
        return 1;
    }
    size_t n = strlen(name);
    if (n > 5 && !strncmp(name, "dsl", 3) && !strcmp(name + n - 2, "br")) {
        /* bridge: dsl<base-36 pid>br */
        long p = 0;
        for (size_t i = 3; i < n - 2; i++) {
            const char c = name[i];
            if (!isdigit((unsigned char)c) && !(c >= 'a' && c <= 'z'))
                return 0;
            if (p > (long)INT_MAX / 36)
                return 0;
            p = p * 36 + (isdigit((unsigned char)c) ? c - '0' : c - 'a' + 10);
        }
        *pid = p;
        return 1;
    }
    return 0;
}

int ds_netns_reap_stale(FILE *note)
{
    char ip[PATH_MAX], err[600];
    if (find_program("ip", ip, sizeof(ip)) < 0)
        return -ENOENT;
    int reaped = 0;
    char *namespaces[] = {ip, "netns", "list", NULL};
    char *bridges[] = {ip, "-o", "link", "show", "type", "bridge", NULL};
    for (int which = 0; which < 2; which++) {
        char *out = NULL, *etext = NULL, why[256];
        int code = 0;
        char **argv = which == 0 ? namespaces : bridges;
        if (ds_proc_capture(argv, NETNS_CMD_MS, &out, &etext, &code, why, sizeof(why)) < 0 ||
            code != 0) {
            free(out);
            free(etext);
            continue;
        }
        for (char *save = NULL, *line = strtok_r(out, "\n", &save); line;
             line = strtok_r(NULL, "\n", &save)) {
            char name[64];
            /* `ip netns list`: "NAME" or "NAME (id: N)";
             * `ip -o link`: "N: NAME: <FLAGS> ..." */
            const char *p = line;
            if (which == 1) {
                p = strchr(line, ':');
                if (!p)
                    continue;
                p++;
                while (*p == ' ')
                    p++;
            }
            size_t k = 0;
            while (p[k] && p[k] != ' ' && p[k] != ':' && p[k] != '@' && k + 1 < sizeof(name)) {
                name[k] = p[k];
                k++;
            }
            name[k] = '\0';
            long pid;
            if (!ds_netns_stale_owner(name, &pid) || owner_alive(pid))
                continue;
            char *del_ns[] = {ip, "netns", "del", name, NULL};
            char *del_br[] = {ip, "link", "del", name, NULL};
            if (run_cmd(which == 0 ? del_ns : del_br, err, sizeof(err)) == 0) {
                reaped++;
                if (note)
                    fprintf(note, "dslaunch: removed %s %s left by dslaunch %ld, which is gone\n",
                            which == 0 ? "network namespace" : "bridge", name, pid);
            }
        }
        free(out);
        free(etext);
    }
    return reaped;
}
