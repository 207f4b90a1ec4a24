/*
 * tests/launch_util.c: the helpers of tests/launch_util.h.
 *
 * Moved out of tests/test_dslaunch.c when its cluster and elastic suites
 * went to a file of their own; the hand-written JSON reader it carried
 * gave way to jansson, and the waits on log lines gave way to waits on the
 * nodes' status documents. Failures are Criterion assertions, so a helper
 * that cannot do its job ends the test that called it with the reason.
 */
#include "launch_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/dslaunch/dslaunch.h"

/* ---- the run directory and the processes in it ------------------------------ */

static char tmpdir[64];
static pid_t launched = -1; /* a dslaunch still to be killed on failure */

void tmp_init(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ds_test_dslaunch.XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

int procs_with(const char *needle, pid_t *out, int max)
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

void tmp_fini(void)
{
    if (launched > 0) {
        kill(launched, SIGKILL);
        waitpid(launched, NULL, 0);
        launched = -1;
    }
    /* Nodes die with dslaunch (PDEATHSIG); make sure of it. A node a test
     * stopped (SIGSTOP) takes SIGKILL all the same. */
    if (tmpdir[0]) {
        pid_t left[64];
        int n = procs_with(tmpdir, left, 64);
        for (int i = 0; i < n; i++)
            kill(left[i], SIGKILL);
    }
    /* DS_TEST_KEEP=1: leave the directory (logs, outputs) to read. */
    const char *keep = getenv("DS_TEST_KEEP");
    if (tmpdir[0] && keep && *keep && strcmp(keep, "0") != 0) {
        fprintf(stderr, "launch_util: kept %s (DS_TEST_KEEP)\n", tmpdir);
        return;
    }
    if (tmpdir[0] && nftw(tmpdir, remove_one, 8, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "launch_util: could not remove %s\n", tmpdir);
}

const char *tmp_path(const char *name)
{
    static char path[16][512];
    static int slot;
    char *p = path[slot++ % 16];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

char *read_text(const char *path)
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

int alive(pid_t pid)
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

pid_t node_pid(const char *out, const char *name)
{
    char needle[600];
    pid_t p[4];
    snprintf(needle, sizeof(needle), "%s/%s.ini", out, name);
    return procs_with(needle, p, 4) > 0 ? p[0] : -1;
}

/* ---- dslaunch, to completion ---------------------------------------------------- */

const char *bin(const char *env)
{
    const char *p = getenv(env);
    cr_assert(p && *p, "meson sets %s", env);
    return p;
}

void result_free(struct result *r)
{
    free(r->out);
    free(r->err);
}

/* argv for dslaunch: the program, then args. */
static void dslaunch_argv(char **argv, int max, const char *const *args)
{
    int n = 0;
    argv[n++] = (char *)bin("DSLAUNCH");
    for (; *args && n < max - 1; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
}

struct result run_dslaunch(int timeout_ms, const char *const *args)
{
    char *argv[64];
    dslaunch_argv(argv, 64, args);
    struct result r = {0};
    char err[256];
    int ret = ds_proc_capture(argv, timeout_ms, &r.out, &r.err, &r.code, err, sizeof(err));
    cr_assert(ret == 0, "dslaunch: %s\nstderr:\n%s", err, r.err ? r.err : "");
    return r;
}

struct result run_dsnode(int timeout_ms, const char *const *args)
{
    char *argv[64], err[256];
    int n = 0;
    argv[n++] = (char *)bin("DSNODE");
    for (; *args && n < 63; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    struct result r = {0};
    int ret = ds_proc_capture(argv, timeout_ms, &r.out, &r.err, &r.code, err, sizeof(err));
    cr_assert_neq(ret, -ETIMEDOUT, "dsnode %s did not return within %d ms\nstderr:\n%s", argv[1],
                  timeout_ms, r.err ? r.err : "");
    cr_assert_eq(ret, 0, "dsnode: %s", err);
    return r;
}

void expect_result(struct result *r, int code, const char *const *want, const char *const *not)
{
    cr_expect_eq(r->code, code, "exit %d, expected %d\nstderr:\n%s", r->code, code, r->err);
    for (; want && *want; want++)
        cr_expect_not_null(strstr(r->err, *want), "stderr lacks '%s':\n%s", *want, r->err);
    for (; not && *not; not++)
        cr_expect_null(strstr(r->err, *not), "stderr has '%s':\n%s", *not, r->err);
    result_free(r);
}

const char *listen_free(void)
{
    static char set[64];
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    snprintf(set, sizeof(set), "node.listen=127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return set;
}

json_t *last_json(const char *out)
{
    const char *end = out + strlen(out);
    while (end > out && end[-1] == '\n')
        end--;
    const char *start = end;
    while (start > out && start[-1] != '\n')
        start--;
    char *line = strndup(start, (size_t)(end - start));
    cr_assert_not_null(line);
    json_error_t e;
    json_t *v = json_loads(line, JSON_REJECT_DUPLICATES, &e);
    cr_assert(v && json_is_object(v), "the last line of stdout is not one JSON object (%s): %s",
              v ? "not an object" : e.text, line);
    free(line);
    return v;
}

double jnum(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "JSON key '%s' is not a number", key);
    return json_number_value(v);
}

const char *jstr(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    cr_assert(json_is_string(v), "JSON key '%s' is not a string", key);
    return json_string_value(v);
}

const json_t *jnode(const json_t *report, const char *name)
{
    const json_t *n = json_object_get(json_object_get(report, "nodes"), name);
    cr_assert(json_is_object(n), "node %s missing from the JSON", name);
    return n;
}

/* ---- dslaunch, watched while it runs ---------------------------------------------- */

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

void live_start(struct live *l, const char *const *args)
{
    char *argv[64];
    dslaunch_argv(argv, 64, args);
    char err[256];
    memset(l, 0, sizeof(*l));
    l->pid = ds_proc_spawn(argv, &l->fo, &l->fe, err, sizeof(err));
    cr_assert_gt(l->pid, 0, "%s", err);
    launched = l->pid;
}

int live_wait(struct live *l, int ms, int (*pred)(void *), void *arg)
{
    for (int t = 0; t < ms; t += 50) {
        slurp(l->fo, &l->out, &l->ol);
        slurp(l->fe, &l->err, &l->el);
        if (pred(arg))
            return 1;
        /* Exited (not reaped: WNOWAIT leaves that to live_end): what we
         * wait for can no longer come. */
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (l->pid > 0 && waitid(P_PID, (id_t)l->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == l->pid) {
            l->exited = 1;
            return pred(arg);
        }
        usleep(50000);
    }
    return 0;
}

int live_end(struct live *l, int ms)
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

void live_free(struct live *l)
{
    free(l->out);
    free(l->err);
    l->out = l->err = NULL;
}

void no_process_left(const char *dir, const json_t *nodes)
{
    pid_t left[16];
    int n = procs_with(dir, left, 16);
    cr_assert_eq(n, 0, "%d processes still name %s (first pid %d)", n, dir, n ? (int)left[0] : 0);
    const char *name;
    const json_t *node;
    json_object_foreach((json_t *)nodes, name, node) {
        const json_t *pid = json_object_get(node, "pid");
        cr_assert(json_is_integer(pid), "node %s has no pid", name);
        cr_assert(!alive((pid_t)json_integer_value(pid)), "node %s (pid %d) is still alive", name,
                  (int)json_integer_value(pid));
    }
}

/* ---- node configs ------------------------------------------------------------- */

char *config_valid(const char *path)
{
    /* --offline: the config's own validity. Its port may be in use by a node
     * that is running, or its address may live in a namespace not yet made. */
    char *argv[] = {(char *)bin("DSNODE"), "check-config", "--offline", (char *)path, NULL};
    char *out, *etext, err[256];
    int code;
    cr_assert_eq(ds_proc_capture(argv, 30000, &out, &etext, &code, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(code, 0, "dsnode check-config %s: %s", path, etext);
    free(etext);
    return out;
}

void dump_value(const char *dump, const char *key, char *val, size_t len)
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

void check_node_ok(const json_t *nodes, const char *name, double min_acc)
{
    const json_t *n = json_object_get(nodes, name);
    cr_assert(json_is_object(n), "node %s missing from the JSON", name);
    cr_assert_eq(jnum(n, "exit_status"), 0, "%s exit status", name);
    cr_assert_str_eq(jstr(n, "status"), "done");
    cr_assert_gt(jnum(n, "test_acc"), min_acc, "%s test_acc %.4f", name, jnum(n, "test_acc"));
    cr_assert_geq(jnum(n, "bytes_sent"), 0);
    cr_assert_geq(jnum(n, "bytes_received"), 0);
}

/* ---- status documents ------------------------------------------------------------ */

json_t *status_load(const char *out, const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s/status.json", out, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        /* Not written yet: the node has not started. */
        cr_assert_eq(errno, ENOENT, "%s: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t e;
    json_t *doc = json_loadf(f, JSON_REJECT_DUPLICATES, &e);
    fclose(f);
    cr_assert_not_null(doc, "%s is not valid JSON: %d:%d: %s", path, e.line, e.column, e.text);
    cr_assert(json_is_object(doc) && json_integer_value(json_object_get(doc, "schema")) == 1,
              "%s is not a schema 1 status document", path);
    return doc;
}

long long status_step(const json_t *doc)
{
    const json_t *v = json_object_get(json_object_get(doc, "train"), "step");
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

const char *status_state(const json_t *doc)
{
    const char *s = json_string_value(json_object_get(json_object_get(doc, "node"), "state"));
    return s ? s : "";
}

long long status_view_size(const json_t *doc)
{
    const json_t *v = json_object_get(json_object_get(doc, "view"), "size");
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

const char *status_member(const json_t *doc, const char *name)
{
    const json_t *members = json_object_get(json_object_get(doc, "view"), "members");
    size_t i;
    const json_t *m;
    json_array_foreach(members, i, m) {
        const char *n = json_string_value(json_object_get(m, "name"));
        if (n && !strcmp(n, name)) {
            const char *s = json_string_value(json_object_get(m, "state"));
            return s ? s : "";
        }
    }
    return NULL;
}

double status_num(const json_t *doc, const char *path)
{
    char part[64];
    const json_t *v = doc;
    for (const char *p = path; v && *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        cr_assert_lt(n, sizeof(part));
        memcpy(part, p, n);
        part[n] = '\0';
        v = json_object_get(v, part);
        p += n + (dot != NULL);
    }
    cr_assert(json_is_number(v), "status document: '%s' is not a number", path);
    return json_number_value(v);
}

struct step_wait {
    const char *out, *name;
    long long step, seen;
};

static int reached_step(void *arg)
{
    struct step_wait *w = arg;
    json_t *doc = status_load(w->out, w->name);
    if (doc)
        w->seen = status_step(doc);
    json_decref(doc);
    return w->seen >= w->step;
}

void wait_for_step(struct live *l, const char *out, const char *name, long long step, int ms)
{
    struct step_wait w = {out, name, step, -1};
    cr_assert(live_wait(l, ms, reached_step, &w),
              "%s did not reach step %lld within %d s (last step seen %lld%s); stderr:\n%s", name,
              step, ms / 1000, w.seen, l->exited ? ", dslaunch exited" : "", l->err ? l->err : "");
}

int sh(char **out, const char *fmt, ...)
{
    char cmd[4096], *o = NULL, *e = NULL, err[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int code = -1;
    if (ds_proc_capture(argv, 60000, &o, &e, &code, err, sizeof(err)) < 0 && !o) {
        cr_log_warn("%s: %s", cmd, err);
        return -1;
    }
    if (code != 0 && e && *e)
        cr_log_info("%s: %s", cmd, e);
    free(e);
    if (out)
        *out = o;
    else
        free(o);
    return code;
}
