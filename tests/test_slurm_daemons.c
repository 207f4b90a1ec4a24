/*
 * tests/test_slurm_daemons.c: `dsnode run --slurm` and
 * tools/slurm/dsnode.sbatch on a real Slurm (issue 13, Slurm). Suite
 * `slurm` (slow; runnable alone: meson test -C build --suite slurm).
 * The tests: a 4-task job trains; a second job joins and leaves; a job
 * stopped as by its time limit is resumed by a new job (issue 11).
 *
 * Each test starts Debian's munged, slurmctld and slurmd itself, in the
 * foreground, with everything in the test's temp dir: a munge key and
 * socket, a private slurm.conf (SLURM_CONF, exported to every client the
 * test runs: sbatch, scontrol, scancel), state and spool directories, and
 * logs. One node, this host, with 8 CPUs declared whatever the machine
 * has (config_overrides, OverSubscribe=FORCE); proctrack/linuxproc and
 * task/none, so no cgroups; no system service or file touched. Ports are
 * picked from the test's pid.
 *
 * The .fini hook cancels every job, then SIGKILLs every process whose
 * environment names this test's slurm.conf (the daemons, slurmstepd,
 * the batch scripts, srun, the dsnode tasks), then removes the temp dir
 * (tmp_fini), whether the test passed or not; leftovers of a test process
 * that was SIGKILLed are removed by the next one (the conf's name carries
 * the pid). Skipped unless root with munged, slurmctld, slurmd and the
 * Slurm clients installed.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

#ifndef DS_SOURCE_ROOT
#error "meson passes DS_SOURCE_ROOT"
#endif
#define SBATCH_SCRIPT DS_SOURCE_ROOT "/tools/slurm/dsnode.sbatch"

enum { MUNGED, SLURMCTLD, SLURMD, NDAEMONS };
static pid_t daemon_pid[NDAEMONS];
static int daemon_fd[NDAEMONS][2];
static char conf_path[512]; /* this test's slurm.conf, "" before slurm_up */

/* SIGKILL every process (not us) whose environment has SLURM_CONF=value
 * for which match(value) says so. Returns how many. */
static int kill_by_conf(int (*match)(const char *value))
{
    DIR *d = opendir("/proc");
    int n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        const long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0 || pid == getpid())
            continue;
        char path[64];
        static char env[1 << 16];
        snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
        const int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        const ssize_t got = read(fd, env, sizeof(env) - 1);
        close(fd);
        if (got <= 0)
            continue;
        env[got] = '\0';
        for (char *p = env; p < env + got; p += strlen(p) + 1)
            if (!strncmp(p, "SLURM_CONF=", 11) && match(p + 11)) {
                kill((pid_t)pid, SIGKILL);
                n++;
                break;
            }
    }
    closedir(d);
    return n;
}

static int is_ours(const char *value)
{
    return conf_path[0] && !strcmp(value, conf_path);
}

/* ".../dsslurm-<pid>.conf" of a test process that is gone. */
static int is_stale(const char *value)
{
    const char *b = strrchr(value, '/');
    if (!b || strncmp(b, "/dsslurm-", 9))
        return 0;
    const long pid = strtol(b + 9, NULL, 10);
    return pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

static void sl_init(void)
{
    tmp_init();
    conf_path[0] = '\0';
    if (geteuid() == 0)
        kill_by_conf(is_stale);
}

static void sl_fini(void)
{
    if (conf_path[0]) {
        /* Jobs first (their tasks get SIGTERM and leave), then everything
         * that runs with our slurm.conf, the daemons included. */
        if (daemon_pid[SLURMCTLD] > 0)
            sh(NULL, "scancel --user=root --quiet; sleep 1");
        for (int round = 0; round < 3 && kill_by_conf(is_ours) > 0; round++)
            usleep(200000);
    }
    for (int i = 0; i < NDAEMONS; i++)
        if (daemon_pid[i] > 0) {
            kill(daemon_pid[i], SIGKILL);
            waitpid(daemon_pid[i], NULL, 0);
            close(daemon_fd[i][0]);
            close(daemon_fd[i][1]);
            daemon_pid[i] = 0;
        }
    conf_path[0] = '\0';
    tmp_fini();
}

TestSuite(slurm, .init = sl_init, .fini = sl_fini, .timeout = 400);

/* A skipped test does not reach .fini (Criterion): its temp dir first. */
#define SKIP(...)                                                                                  \
    do {                                                                                           \
        tmp_fini();                                                                                \
        cr_skip_test(__VA_ARGS__);                                                                 \
    } while (0)

static void need_slurm(void)
{
    if (geteuid() != 0)
        SKIP("needs root (slurmd runs tasks as their user)");
    const char *progs[] = {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"};
    for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++)
        if (access(progs[i], X_OK) < 0)
            SKIP("no %s (Debian: apt-get install munge slurmctld slurmd slurm-client)", progs[i]);
    if (sh(NULL, "command -v sbatch && command -v scontrol && command -v scancel && "
                 "command -v mungekey") != 0)
        SKIP("no Slurm clients or mungekey (Debian: apt-get install slurm-client munge)");
}

static void spawn(int which, const char *cmd)
{
    char *argv[] = {"/bin/sh", "-c", (char *)cmd, NULL};
    char err[256];
    daemon_pid[which] = ds_proc_spawn(argv, &daemon_fd[which][0], &daemon_fd[which][1], err,
                                      sizeof(err));
    cr_assert_gt(daemon_pid[which], 0, "%s: %s", cmd, err);
}

static int ctld_port(void)
{
    return 30000 + (int)(getpid() % 400) * 2;
}

/* dsnode's port base for job k (0, 1) of this test: 4 ports free when
 * first asked, kept for the test. Below the kernel's ephemeral range
 * (32768 and up), where the connections of tests running beside this
 * one take their local ports: a task whose port was taken fails to
 * start, and its job fails for a reason that is not the test's. */
static int node_port(int k)
{
    static int base[2];
    if (!base[k]) {
        base[k] = ds_port_find(31000 + (int)(getpid() % 200) * 8 + 4 * k, 4);
        cr_assert_gt(base[k], 0, "no 4 free ports for job %d", k);
        cr_assert_lt(base[k] + 4, 32768, "ports %d.. inside the ephemeral range", base[k]);
    }
    return base[k];
}

/* munged, slurmctld, slurmd; returns when the node is idle. */
static void slurm_up(void)
{
    char host[256];
    cr_assert_eq(gethostname(host, sizeof(host)), 0);
    /* munged wants every directory above its socket searchable by all. */
    cr_assert_eq(chmod(tmp_path(""), 0755), 0);
    cr_assert_eq(mkdir(tmp_path("munge"), 0700), 0);
    cr_assert_eq(mkdir(tmp_path("sock"), 0755), 0);
    cr_assert_eq(mkdir(tmp_path("state"), 0700), 0);
    cr_assert_eq(mkdir(tmp_path("spool"), 0700), 0);
    cr_assert_eq(mkdir(tmp_path("dsdir"), 0700), 0);
    cr_assert_eq(sh(NULL, "mungekey -c -k %s", tmp_path("munge/munge.key")), 0);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "exec /usr/sbin/munged -F --socket=%s --key-file=%s --pid-file=%s --log-file=%s "
             "--seed-file=%s >/dev/null 2>&1",
             tmp_path("sock/munge.socket.2"), tmp_path("munge/munge.key"),
             tmp_path("munge/munged.pid"), tmp_path("munge/munged.log"),
             tmp_path("munge/munged.seed"));
    spawn(MUNGED, cmd);
    int ok = 0;
    for (int t = 0; t < 100 && !ok; t++) {
        ok = sh(NULL, "echo x | munge -S %s | unmunge -S %s", tmp_path("sock/munge.socket.2"),
                tmp_path("sock/munge.socket.2")) == 0;
        if (!ok)
            usleep(100000);
    }
    cr_assert(ok, "munged does not answer (log: %s)", tmp_path("munge/munged.log"));

    snprintf(conf_path, sizeof(conf_path), "%s/dsslurm-%d.conf", tmp_path(""), (int)getpid());
    FILE *f = fopen(conf_path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "ClusterName=dstest\nSlurmctldHost=%s(127.0.0.1)\nSlurmctldPort=%d\nSlurmdPort=%d\n"
            "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=%s\n"
            "SlurmUser=root\nSlurmdUser=root\nStateSaveLocation=%s\nSlurmdSpoolDir=%s\n"
            "SlurmctldPidFile=%s\nSlurmdPidFile=%s\nSlurmctldLogFile=%s\nSlurmdLogFile=%s\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "SchedulerType=sched/builtin\nMpiDefault=none\nReturnToService=2\n"
            "SlurmdParameters=config_overrides\nJobCompType=jobcomp/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobAcctGatherType=jobacct_gather/none\nSwitchType=switch/none\n"
            "MailProg=/bin/true\nKillWait=10\nMinJobAge=600\n"
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN\n"
            "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE\n",
            host, ctld_port(), ctld_port() + 1, tmp_path("sock/munge.socket.2"),
            tmp_path("state"), tmp_path("spool"), tmp_path("slurmctld.pid"),
            tmp_path("slurmd.pid"), tmp_path("slurmctld.log"), tmp_path("slurmd.log"), host,
            host);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(setenv("SLURM_CONF", conf_path, 1), 0);
    /* -i: a fresh state (no jobs of another run). */
    snprintf(cmd, sizeof(cmd), "exec /usr/sbin/slurmctld -D -i -f %s >/dev/null 2>&1",
             conf_path);
    spawn(SLURMCTLD, cmd);
    snprintf(cmd, sizeof(cmd), "exec /usr/sbin/slurmd -D -f %s -N %s >/dev/null 2>&1",
             conf_path, host);
    spawn(SLURMD, cmd);
    ok = 0;
    for (int t = 0; t < 300 && !ok; t++) {
        char *out = NULL;
        ok = sh(&out, "sinfo -h -o %%t") == 0 && out && !strncmp(out, "idle", 4);
        free(out);
        if (!ok)
            usleep(100000);
    }
    cr_assert(ok, "the Slurm node is not idle after 30 s (logs: %s, %s)",
              tmp_path("slurmctld.log"), tmp_path("slurmd.log"));
}

/* sbatch the example script; its job id. extra: more sbatch options
 * before the script ("" for none), env: more environment ("" for none). */
static long submit(const char *env, const char *opts, int port_base, int steps,
                   const char *more_sets)
{
    char *out = NULL;
    const int code =
        sh(&out,
           "cd %s && %s DSNODE_DIR=%s DSNODE=%s sbatch --parsable %s %s %s "
           "--set train.steps=%d --set train.eval_every=0 --set slurm.port_base=%d "
           "--set status.listen= --set status.file_interval_ms=100 %s",
           tmp_path(""), env, tmp_path("dsdir"), bin("DSNODE"), opts, SBATCH_SCRIPT,
           BASE_CONFIG, steps, port_base, more_sets);
    cr_assert_eq(code, 0, "sbatch exited %d", code);
    const long id = strtol(out, NULL, 10);
    cr_assert_gt(id, 0, "sbatch printed '%s'", out);
    free(out);
    return id;
}

/* JobState and ExitCode of a job ("" while scontrol does not know it). */
static void job_state(long id, char *state, size_t sn, char *exit_code, size_t en)
{
    char *out = NULL;
    state[0] = exit_code[0] = '\0';
    if (sh(&out, "scontrol show job %ld", id) == 0 && out) {
        const char *s = strstr(out, "JobState="), *x = strstr(out, "ExitCode=");
        if (s)
            snprintf(state, sn, "%.*s", (int)strcspn(s + 9, " \n"), s + 9);
        if (x)
            snprintf(exit_code, en, "%.*s", (int)strcspn(x + 9, " \n"), x + 9);
    }
    free(out);
}

/* Whether JobState is a final one. A positive list: a running job shows
 * more states than PENDING and RUNNING (CONFIGURING, COMPLETING, and
 * SIGNALING while slurmctld delivers a --signal before the time limit,
 * the tasks still running). */
static int job_state_final(const char *state)
{
    static const char *const final[] = {"COMPLETED", "FAILED",    "CANCELLED",
                                        "TIMEOUT",   "NODE_FAIL", "OUT_OF_MEMORY",
                                        "PREEMPTED", "BOOT_FAIL", "DEADLINE"};
    for (size_t i = 0; i < sizeof(final) / sizeof(final[0]); i++)
        if (!strcmp(state, final[i]))
            return 1;
    return 0;
}

/* Waits up to ms for the job to end; its final state. */
static void job_wait(long id, int ms, char *state, size_t sn, char *exit_code, size_t en)
{
    for (int t = 0; t < ms / 200; t++) {
        job_state(id, state, sn, exit_code, en);
        if (job_state_final(state))
            return;
        usleep(200000);
    }
    cr_assert_fail("job %ld still %s after %d ms (output: %s/dsnode-%ld.out)", id, state, ms,
                   tmp_path(""), id);
}

/* The status document of task `task` of job `job`, or NULL. */
static json_t *task_status(long job, int task)
{
    char dir[600], name[16];
    snprintf(dir, sizeof(dir), "%s/job-%ld", tmp_path("dsdir"), job);
    snprintf(name, sizeof(name), "%d", task);
    return status_load(dir, name);
}

struct view_want {
    long job;         /* whose task 0 looks */
    long step;        /* at least this step */
    const char *names[8];
    const char *state; /* each of names in this state */
};

static int view_is(void *arg)
{
    const struct view_want *w = arg;
    json_t *doc = task_status(w->job, 0);
    if (!doc)
        return 0;
    int ok = status_step(doc) >= w->step;
    for (int i = 0; ok && w->names[i]; i++) {
        const char *s = status_member(doc, w->names[i]);
        ok = s && !strcmp(s, w->state);
    }
    json_decref(doc);
    return ok;
}

static int wait_for(int ms, int (*pred)(void *), void *arg)
{
    for (int t = 0; t < ms / 100; t++) {
        if (pred(arg))
            return 1;
        usleep(100000);
    }
    return pred(arg);
}

/* Up to 3 KiB of the warn and error lines that task `node` (e.g. "1-0")
 * wrote into the job's output text, into out: what a failed status came
 * from, in the assertion's message. */
static void task_complaints(const char *text, const char *node, char *out, size_t n)
{
    char warn[64], error[64];
    snprintf(warn, sizeof(warn), " warn %s ", node);
    snprintf(error, sizeof(error), " error %s ", node);
    size_t at = 0;
    out[0] = '\0';
    for (const char *l = text; l && *l && at + 1 < n;) {
        const char *end = strchr(l, '\n');
        const size_t len = end ? (size_t)(end - l) : strlen(l);
        if (memmem(l, len, warn, strlen(warn)) || memmem(l, len, error, strlen(error))) {
            const int w = snprintf(out + at, n - at, "\n    %.*s", (int)len, l);
            at = w < 0 || (size_t)w >= n - at ? n - 1 : at + (size_t)w;
        }
        l = end ? end + 1 : NULL;
    }
}

/* The job's output has a summary line for each of its n tasks with this
 * status, and test accuracy of at least min_acc (< 0: not checked). */
static void check_summaries(long job, int n, const char *status, double min_acc)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/dsnode-%ld.out", tmp_path(""), job);
    char *text = read_text(path);
    cr_assert_not_null(text, "no %s", path);
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof(key), "summary node=%ld-%d status=", job, i);
        const char *l = strstr(text, key);
        cr_assert_not_null(l, "no '%s' line in %s", key, path);
        l += strlen(key);
        if (strncmp(l, status, strlen(status))) {
            char node[40], why[3072];
            snprintf(node, sizeof(node), "%ld-%d", job, i);
            task_complaints(text, node, why, sizeof(why));
            cr_expect_fail("task %d of job %ld: status %.*s, expected %s; its warnings and "
                           "errors:%s", i, job, (int)strcspn(l, " "), l, status,
                           why[0] ? why : " none");
        }
        if (min_acc >= 0) {
            const char *a = strstr(l, "test_acc=");
            cr_assert_not_null(a);
            const double acc = strtod(a + 9, NULL);
            cr_log_info("job %ld task %d: test accuracy %.4f", job, i, acc);
            cr_expect_geq(acc, min_acc, "task %d of job %ld: test accuracy %.4f, expected >= %.2f",
                          i, job, acc, min_acc);
        }
    }
    free(text);
}

/* sbatch with 4 tasks: one cluster of 4 (task 0's view lists all four
 * alive), 1000 steps, every task exits 0 with status done; test accuracy
 * >= 0.85 (issue 13's target; measured with 4 tasks on 2 shared cores:
 * 0.855 after 300 steps, 0.877 after 1000, 0.894 after 4000). */
Test(slurm, sbatch_trains)
{
    need_slurm();
    slurm_up();
    const long id = submit("", "", node_port(0), 1000, "--set cluster.min_members=4");
    struct view_want w = {id, 1, {NULL}, "alive"};
    char names[4][32];
    for (int i = 0; i < 4; i++) {
        snprintf(names[i], sizeof(names[i]), "%ld-%d", id, i);
        w.names[i] = names[i];
    }
    cr_assert(wait_for(120000, view_is, &w), "job %ld's task 0 never saw its 4 tasks alive "
              "(output: %s/dsnode-%ld.out)", id, tmp_path(""), id);
    char state[32], code[32];
    job_wait(id, 240000, state, sizeof(state), code, sizeof(code));
    cr_assert_str_eq(state, "COMPLETED", "job %ld ended %s, exit code %s", id, state, code);
    cr_assert_str_eq(code, "0:0");
    check_summaries(id, 4, "done", 0.85);
    /* Each task's group is its Slurm node, its port base + local id. */
    json_t *doc = task_status(id, 3);
    cr_assert_not_null(doc);
    char host[256], addr[64];
    cr_assert_eq(gethostname(host, sizeof(host)), 0);
    const json_t *node = json_object_get(doc, "node");
    cr_expect_str_eq(json_string_value(json_object_get(node, "group")), host);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", node_port(0) + 3);
    cr_expect_str_eq(json_string_value(json_object_get(node, "addr")), addr);
    json_decref(doc);
}

/* A second job joins the running cluster through its seeds (the first
 * job's task 0; the script SIGHUPs the first job so its allow-list takes
 * the new keys), trains with it, and leaves when cancelled (SIGTERM, what
 * Slurm sends at a time limit): the first job sees it leave, not fail,
 * and finishes on its own. */
/* 600 s, not the suite's 400: job a's 8000 steps (which must outlast b's
 * join) took over 400 s in all at a load average of 15 (a CI run beside
 * two other sessions' builds); about 100 s on a quiet machine. */
Test(slurm, second_job_joins_and_leaves, .timeout = 600)
{
    need_slurm();
    slurm_up();
    /* Long enough that job a still trains when b's tasks have joined and
     * trained (4 tasks on 2 cores did 3000 steps in about 27 s, less than a
     * join under load took). */
    const int steps = 8000;
    const long a = submit("", "", node_port(0), steps, "--set cluster.min_members=4");
    struct view_want wa = {a, 100, {NULL}, "alive"};
    char an[32];
    snprintf(an, sizeof(an), "%ld-0", a);
    wa.names[0] = an;
    cr_assert(wait_for(120000, view_is, &wa), "job %ld did not reach step 100", a);
    char env[64], opts[] = "--ntasks=2", sets[128];
    snprintf(env, sizeof(env), "DSNODE_JOIN=%ld", a);
    snprintf(sets, sizeof(sets), "--set cluster.seeds=127.0.0.1:%d", node_port(0));
    const long b = submit(env, opts, node_port(1), steps, sets);
    char bn[2][32];
    struct view_want wb = {a, 0, {NULL}, "alive"};
    for (int i = 0; i < 2; i++) {
        snprintf(bn[i], sizeof(bn[i]), "%ld-%d", b, i);
        wb.names[i] = bn[i];
    }
    cr_assert(wait_for(120000, view_is, &wb), "job %ld's tasks never alive in job %ld's view "
              "(outputs: %s/dsnode-%ld.out, dsnode-%ld.out)", b, a, tmp_path(""), a, b);
    /* They train: the joiners' own documents show steps past their join. */
    json_t *doc = task_status(b, 1);
    cr_assert_not_null(doc);
    const long long joined_at = status_step(doc);
    json_decref(doc);
    struct view_want wt = {b, joined_at + 20, {NULL}, "alive"};
    cr_assert(wait_for(60000, view_is, &wt), "job %ld's task 0 did not train 20 steps", b);
    cr_assert_eq(sh(NULL, "scancel %ld", b), 0);
    wb.state = "left";
    cr_assert(wait_for(60000, view_is, &wb), "job %ld's tasks did not leave job %ld's view", b,
              a);
    char state[32], code[32];
    job_wait(b, 60000, state, sizeof(state), code, sizeof(code));
    cr_expect_str_eq(state, "CANCELLED", "job %ld ended %s", b, state);
    check_summaries(b, 2, "stopped", -1);
    job_wait(a, 300000, state, sizeof(state), code, sizeof(code));
    cr_assert_str_eq(state, "COMPLETED", "job %ld ended %s, exit code %s", a, state, code);
    cr_assert_str_eq(code, "0:0");
    check_summaries(a, 4, "done", 0.85);
}

/* How many lines of the shared allow-list name job `job`'s tasks. */
static int allowed_of(long job)
{
    char path[600], key[40];
    snprintf(path, sizeof(path), "%s/allowed_keys", tmp_path("dsdir"));
    snprintf(key, sizeof(key), " %ld-", job);
    char *text = read_text(path);
    int n = 0;
    for (const char *p = text; p && (p = strstr(p, key)); p++)
        n++;
    free(text);
    return n;
}

static int task_steps_at_least(void *arg)
{
    const long *w = arg; /* job, step */
    json_t *doc = task_status(w[0], 0);
    const int ok = doc && status_step(doc) >= w[1];
    json_decref(doc);
    return ok;
}

/* After job `a` (2 tasks) was stopped by SIGTERM: a "stopped" summary
 * and a checkpoint per task, its keys out of the allow-list; each task's
 * step (>= min_step) into stopped. */
static void check_stopped(long a, long long min_step, long long stopped[2])
{
    check_summaries(a, 2, "stopped", -1);
    cr_expect_eq(allowed_of(a), 0, "job %ld's keys still in the allow-list after it ended", a);
    for (int i = 0; i < 2; i++) {
        char ck[700];
        snprintf(ck, sizeof(ck), "%s/job-%ld/%d/checkpoint.bin", tmp_path("dsdir"), a, i);
        cr_assert_eq(access(ck, R_OK), 0, "no %s", ck);
        json_t *doc = task_status(a, i);
        cr_assert_not_null(doc);
        stopped[i] = status_step(doc);
        json_decref(doc);
        cr_assert_geq(stopped[i], min_step);
    }
}

/* A new job with DSNODE_RESUME=a continues each task from its checkpoint
 * and pauses 50 steps later (train.stop_after): COMPLETED, exit 0, status
 * paused, keys out of the allow-list. Both tasks run on one Slurm node, so
 * they are one group (node.group = the node's name), and a group trains at
 * one step: the SIGTERM can reach them a step apart, and on resuming the
 * member behind takes member 0's step. So each ends 50 steps past one of
 * the checkpoints, both at the same step. */
static void check_resumed(long a, const long long stopped[2], int steps)
{
    char env[64], state[32], code[32];
    snprintf(env, sizeof(env), "DSNODE_RESUME=%ld", a);
    const long b = submit(env, "--ntasks=2", node_port(1), steps,
                          "--set cluster.min_members=2 --set train.stop_after=50");
    job_wait(b, 240000, state, sizeof(state), code, sizeof(code));
    cr_assert_str_eq(state, "COMPLETED", "job %ld ended %s, exit code %s", b, state, code);
    cr_assert_str_eq(code, "0:0");
    check_summaries(b, 2, "paused", -1);
    long long ended[2];
    for (int i = 0; i < 2; i++) {
        json_t *doc = task_status(b, i);
        cr_assert_not_null(doc);
        ended[i] = status_step(doc);
        json_decref(doc);
    }
    cr_expect_eq(ended[0], ended[1], "tasks ended at steps %lld and %lld", ended[0], ended[1]);
    cr_expect(ended[0] == stopped[0] + 50 || ended[0] == stopped[1] + 50,
              "ended at step %lld, stopped at %lld and %lld", ended[0], stopped[0], stopped[1]);
    cr_expect_eq(allowed_of(b), 0, "job %ld's keys still in the allow-list after it ended", b);
}

/* A job stopped as by its time limit (`scancel --signal=TERM`: SIGTERM to
 * the tasks, what `#SBATCH --signal=TERM@60` sends before the limit)
 * leaves a checkpoint per task and its keys leave the allow-list; a new
 * job with DSNODE_RESUME continues each task from its checkpoint and
 * pauses 50 steps later (train.stop_after): exit 0, status paused, the
 * group's two members at one step. */
Test(slurm, stopped_job_resumed_by_a_new_job)
{
    need_slurm();
    slurm_up();
    const int steps = 100000;
    const long a = submit("", "--ntasks=2", node_port(0), steps, "--set cluster.min_members=2");
    long wa[2] = {a, 100};
    cr_assert(wait_for(120000, task_steps_at_least, wa), "job %ld did not reach step 100", a);
    cr_expect_eq(allowed_of(a), 2, "job %ld's keys in the allow-list while it runs", a);
    cr_assert_eq(sh(NULL, "scancel --signal=TERM %ld", a), 0);
    char state[32], code[32];
    job_wait(a, 120000, state, sizeof(state), code, sizeof(code));
    long long stopped[2];
    check_stopped(a, 100, stopped);
    check_resumed(a, stopped, steps);
}

/* A job stopped by its real time limit: --time=1 (Slurm's smallest) with
 * --signal=TERM@15 (overriding the script's TERM@60, as long as the job):
 * slurmctld itself sends SIGTERM to the tasks 15 s before the limit, or up
 * to 30 s earlier (it checks on a 30 s timer and sends early rather than
 * late): 15 to 45 s into the job, while the tasks train. Each task
 * checkpoints, leaves gracefully and prints its summary before the limit.
 * A new job with DSNODE_RESUME continues from the checkpoints. While the
 * signal is delivered the job shows JobState=SIGNALING (job_state_final). */
Test(slurm, job_stopped_by_its_time_limit_resumed_by_a_new_job)
{
    need_slurm();
    slurm_up();
    const int steps = 100000;
    const long a = submit("", "--ntasks=2 --time=1 --signal=TERM@15", node_port(0), steps,
                          "--set cluster.min_members=2");
    char state[32], code[32];
    /* The limit is 60 s; slurmctld ends a job over it on its timer (30 s)
     * plus KillWait (10 s): bounded by 180 s. */
    job_wait(a, 180000, state, sizeof(state), code, sizeof(code));
    /* Ended by its tasks (srun passes on their 143, the SIGTERM status),
     * not by Slurm at the limit (TIMEOUT). */
    cr_expect_str_eq(state, "FAILED", "job %ld ended %s, exit code %s", a, state, code);
    cr_expect_str_eq(code, "143:0");
    long long stopped[2];
    check_stopped(a, 1, stopped);
    check_resumed(a, stopped, steps);
}
