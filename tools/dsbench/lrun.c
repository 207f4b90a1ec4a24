/*
 * tools/dsbench/lrun.c: one `dslaunch local` run under a benchmark
 * (lrun.h).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/dsbench/bench.h"
#include "tools/dsbench/lrun.h"

void ds_lrun_default_dslaunch(char *out, size_t len)
{
    char self[PATH_MAX - 64];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, len, "%s/../dslaunch/dslaunch", self);
}

void ds_lrun_sleep_ms(int ms)
{
    const struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) < 0 ? -1 : 0;
}

int ds_lrun_start(ds_lrun *r, const char *tag, const char *dslaunch, int nodes,
                  const char *const *args)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->base, sizeof(r->base), "/tmp/dsbench-%s-XXXXXX", tag);
    if (!mkdtemp(r->base)) {
        fprintf(stderr, "dsbench: mkdtemp %s: %s\n", r->base, strerror(errno));
        return -errno;
    }
    snprintf(r->out, sizeof(r->out), "%s/run", r->base);
    snprintf(r->log, sizeof(r->log), "%s/dslaunch.out", r->base);
    char n[16];
    snprintf(n, sizeof(n), "%d", nodes);
    const char *argv[64] = {dslaunch, "local", "-n", n};
    int k = 4;
    for (; args && *args && k < 60; args++)
        argv[k++] = *args;
    argv[k++] = "--out";
    argv[k++] = r->out;
    argv[k++] = "--json";
    argv[k] = NULL;
    r->pid = fork();
    if (r->pid < 0)
        return -errno;
    if (r->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (!freopen(r->log, "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return 0;
}

int ds_lrun_wait(ds_lrun *r, double timeout_s)
{
    const double t_end = ds_bench_now() + timeout_s;
    while (r->pid > 0) {
        int st;
        if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
            r->pid = 0;
            r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            return r->code;
        }
        if (ds_bench_now() > t_end)
            return -1;
        ds_lrun_sleep_ms(50);
    }
    return r->code;
}

json_t *ds_lrun_report(const ds_lrun *r)
{
    FILE *f = fopen(r->log, "r");
    if (!f)
        return NULL;
    static char line[1 << 16], last[1 << 16];
    last[0] = 0;
    while (fgets(line, sizeof(line), f))
        if (line[0] == '{')
            memcpy(last, line, sizeof(last));
    fclose(f);
    return last[0] ? json_loads(last, 0, NULL) : NULL;
}

double ds_lrun_report_num(const json_t *rep, const char *name, const char *key)
{
    const json_t *v = json_object_get(json_object_get(json_object_get(rep, "nodes"), name), key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

json_t *ds_lrun_status(const ds_lrun *r, const char *name)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s/status.json", r->out, name);
    return json_load_file(path, 0, NULL);
}

pid_t ds_lrun_node_pid(const ds_lrun *r, const char *name)
{
    char needle[PATH_MAX + 32];
    snprintf(needle, sizeof(needle), "%s/%s.ini", r->out, name);
    DIR *d = opendir("/proc");
    pid_t found = -1;
    for (struct dirent *e; d && found < 0 && (e = readdir(d));) {
        char path[300], cmd[4096];
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(cmd, 1, sizeof(cmd) - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            if (!cmd[i])
                cmd[i] = ' ';
        cmd[n] = 0;
        if (strstr(cmd, needle) && strstr(cmd, "dsnode"))
            found = (pid_t)atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

void ds_lrun_end(ds_lrun *r, int term_first)
{
    if (r->pid > 0) {
        if (term_first) {
            kill(r->pid, SIGTERM); /* dslaunch removes its namespaces */
            ds_lrun_wait(r, 20);
        }
        if (r->pid > 0) {
            kill(r->pid, SIGKILL);
            waitpid(r->pid, NULL, 0);
            r->pid = 0;
        }
    }
    for (int i = 0; i < 8; i++) {
        char name[8];
        snprintf(name, sizeof(name), "n%d", i);
        const pid_t p = ds_lrun_node_pid(r, name);
        if (p > 0)
            kill(p, SIGKILL);
    }
    const char *keep = getenv("DSBENCH_KEEP");
    if (r->base[0] && keep && *keep && strcmp(keep, "0"))
        fprintf(stderr, "dsbench: run kept in %s\n", r->base);
    else if (r->base[0])
        nftw(r->base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
