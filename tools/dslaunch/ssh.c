/*
 * tools/dslaunch/ssh.c: the pieces of `dslaunch hosts` that are text: the
 * host list, shell quoting, the OpenSSH client's command lines, and the
 * three small POSIX sh scripts run on the far side (ship, run, collect).
 *
 * dslaunch never speaks SSH itself: it runs Debian's `ssh` client, always in
 * BatchMode (a missing key or an unknown host key is an error, never a
 * prompt). Each remote command is one string the remote login shell runs,
 * so every value in it is quoted here with single quotes.
 *
 * The run script ties the node to the ssh session: the node runs in the
 * background with stdin from /dev/null, and a watcher reads the session's
 * stdin until EOF. EOF comes when dslaunch closes its end (a stop), when
 * the local ssh dies (dslaunch killed: PDEATHSIG), or when sshd drops the
 * connection (keepalives unanswered): then SIGTERM to the node, SIGKILL 5 s
 * later if it is still there. The script's exit status is the node's as a
 * shell shows it (128 + signal when killed), and ssh passes it on.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hostport.h"
#include "tools/dslaunch/dslaunch.h"

/* One host entry: [user@]host, no blanks, not starting with '-', and the
 * host a name, an IPv4 or a bare IPv6 address (base/hostport.h: the nodes
 * on it listen and are dialled there). */
static int host_ok(const char *h)
{
    if (!*h || *h == '-' || strlen(h) >= DS_SSH_HOST_MAX)
        return 0;
    for (const char *p = h; *p; p++)
        if (isspace((unsigned char)*p) || *p == ',' || *p == '\'' || *p == '"' || *p == '\\')
            return 0;
    return ds_host_kind_of(ds_host_addr(h)) >= 0;
}

static int add_host(char (*hosts)[DS_SSH_HOST_MAX], int *n, int max, const char *h, char *err,
                    size_t len)
{
    if (!host_ok(h)) {
        snprintf(err, len, "'%s' is not a host ([user@]host: a host name, an IPv4 address or an "
                 "IPv6 address without brackets; no blanks)", h);
        return -EINVAL;
    }
    if (*n >= max) {
        snprintf(err, len, "at most %d hosts", max);
        return -EINVAL;
    }
    for (int i = 0; i < *n; i++)
        if (!strcmp(hosts[i], h)) {
            snprintf(err, len, "host %s is listed twice (use --per-host for more nodes)", h);
            return -EINVAL;
        }
    snprintf(hosts[(*n)++], DS_SSH_HOST_MAX, "%s", h);
    return 0;
}

int ds_hosts_parse(const char *arg, char (*hosts)[DS_SSH_HOST_MAX], int max, char *err,
                   size_t len)
{
    int n = 0, ret = 0;
    char *text = NULL;
    if (!arg || !*arg) {
        snprintf(err, len, "no hosts given");
        return -EINVAL;
    }
    if (strchr(arg, '/') || (!strchr(arg, ',') && access(arg, F_OK) == 0)) {
        /* A file: one host a line; blank lines and '#' comments skipped. */
        char why[128];
        int fd = ds_file_open_regular(arg, NULL, why, sizeof(why));
        FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
        if (!f) {
            snprintf(err, len, "cannot read the host file %s: %s", arg, fd < 0 ? why : "fdopen");
            return -ENOENT;
        }
        char line[512];
        while (ret == 0 && fgets(line, sizeof(line), f)) {
            char *h = line, *hash = strchr(line, '#');
            if (hash)
                *hash = '\0';
            while (isspace((unsigned char)*h))
                h++;
            char *e = h + strlen(h);
            while (e > h && isspace((unsigned char)e[-1]))
                *--e = '\0';
            if (*h)
                ret = add_host(hosts, &n, max, h, err, len);
        }
        fclose(f);
    } else {
        text = strdup(arg);
        if (!text)
            return -ENOMEM;
        char *save = NULL;
        for (char *h = strtok_r(text, ",", &save); h && ret == 0; h = strtok_r(NULL, ",", &save))
            ret = add_host(hosts, &n, max, h, err, len);
        free(text);
    }
    if (ret == 0 && n == 0) {
        snprintf(err, len, "no hosts in '%s'", arg);
        ret = -EINVAL;
    }
    return ret < 0 ? ret : n;
}

const char *ds_host_addr(const char *entry)
{
    const char *at = strrchr(entry, '@');
    return at ? at + 1 : entry;
}

int ds_sh_quote(const char *s, char *buf, size_t len)
{
    size_t w = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (w + 1 >= len)                                                                          \
            return -ENAMETOOLONG;                                                                  \
        buf[w++] = (c);                                                                            \
    } while (0)
    PUT('\'');
    for (const char *p = s; *p; p++) {
        if (*p == '\'') { /* close, escaped quote, reopen */
            PUT('\'');
            PUT('\\');
            PUT('\'');
        }
        PUT(*p);
    }
    PUT('\'');
#undef PUT
    buf[w] = '\0';
    return (int)w;
}

int ds_ssh_argv(const ds_ssh *s, const char *host, const char *cmd, char **argv, int max)
{
    /* ssh takes the first value it gets for an option, command line before
     * the config file: BatchMode first so nothing can turn it off, then the
     * user's options, then dslaunch's defaults for what the user left. */
    static const char *const defaults[] = {
        "ServerAliveInterval=5",
        "ServerAliveCountMax=3",
        "ConnectTimeout=10",
    };
    const int need = 3 + 2 + 2 * s->nopts + 2 * 3 + 4;
    if (need > max)
        return -E2BIG;
    int k = 0;
    argv[k++] = (char *)(s->program ? s->program : "ssh");
    if (s->config) {
        argv[k++] = "-F";
        argv[k++] = (char *)s->config;
    }
    argv[k++] = "-o";
    argv[k++] = "BatchMode=yes";
    for (int i = 0; i < s->nopts; i++) {
        argv[k++] = "-o";
        argv[k++] = (char *)s->opts[i];
    }
    for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
        argv[k++] = "-o";
        argv[k++] = (char *)defaults[i];
    }
    argv[k++] = "--";
    argv[k++] = (char *)host;
    argv[k++] = (char *)cmd;
    argv[k] = NULL;
    return k;
}

int ds_ssh_ship_cmd(const char *dir, char *buf, size_t len)
{
    char q[DS_SSH_PATH_MAX + 64];
    if (ds_sh_quote(dir, q, sizeof(q)) < 0)
        return -ENAMETOOLONG;
    /* mkdir without -p: the directory is new, so nothing of another run is
     * overwritten; umask and chmod: every file 0600, directories 0700. */
    int n = snprintf(buf, len,
                     "umask 077 && mkdir -- %s && tar -x --no-same-owner -m -C %s -f - && "
                     "chmod -R go-rwx -- %s",
                     q, q, q);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

int ds_ssh_run_cmd(const char *dsnode, const char *conf, char *buf, size_t len)
{
    char qd[DS_SSH_PATH_MAX + 64], qc[DS_SSH_PATH_MAX + 64];
    if (ds_sh_quote(dsnode, qd, sizeof(qd)) < 0 || ds_sh_quote(conf, qc, sizeof(qc)) < 0)
        return -ENAMETOOLONG;
    /* A non-interactive shell gives background jobs /dev/null as stdin, so
     * the watcher reads the session's stdin through fd 3. Its own output
     * goes to /dev/null: the session ends when the node's does. After the
     * node exits, the watcher is killed before it could signal a pid the
     * system may reuse. */
    int n = snprintf(buf, len,
                     "exec 3<&0 </dev/null; %s run --config %s 3<&- & p=$!; "
                     "{ cat <&3 >/dev/null; kill -TERM $p; sleep 5; kill -KILL $p; } "
                     ">/dev/null 2>&1 & w=$!; exec 3<&-; "
                     "wait $p; rc=$?; kill $w 2>/dev/null; exit $rc",
                     qd, qc);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}

int ds_ssh_collect_cmd(const char *dir, const char *const *names, int n, char *buf, size_t len)
{
    char q[DS_SSH_PATH_MAX + 64];
    if (ds_sh_quote(dir, q, sizeof(q)) < 0)
        return -ENAMETOOLONG;
    int w = snprintf(buf, len, "cd %s && tar -c -f -", q);
    for (int i = 0; i < n && w > 0 && (size_t)w < len; i++)
        w += snprintf(buf + w, len - (size_t)w, " %s", names[i]);
    return w < 0 || (size_t)w >= len ? -ENAMETOOLONG : w;
}

int ds_ssh_remove_cmd(const char *dir, char *buf, size_t len)
{
    char q[DS_SSH_PATH_MAX + 64];
    if (ds_sh_quote(dir, q, sizeof(q)) < 0)
        return -ENAMETOOLONG;
    int n = snprintf(buf, len, "rm -rf -- %s", q);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : n;
}
