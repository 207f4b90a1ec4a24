/*
 * tests/test_results.c: results are never lost silently (issue 16), through
 * the real dsnode program (slow suite, test 'results').
 *
 * - node.data_dir on a read-only file system, or on one too small for
 *   model.bin: `dsnode run` refuses at start, naming the key, before any
 *   step (it used to train the whole run and exit 0 with status=done).
 * - node.data_dir that fills up while the node trains: the final save
 *   fails, and the run says so: exit 1, summary status=failed, and the
 *   status file's last document in state "failed".
 * - check-config checks the file system and the ports: a missing key
 *   file, a missing dataset, an unwritable data_dir, a busy port; with
 *   --offline the same configs pass.
 *
 * The file systems are tmpfs mounts made by the test (root only; the tests
 * skip otherwise) and unmounted on every path by the suite's fini. Every
 * dsnode runs under a hard timeout and is killed and reaped on every path.
 *
 * Run: meson test -C build results --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

#define SINGLE DS_CONF_EXAMPLES_DIR "/single.ini"
#define REFUSE_MS 30000
#define RUN_MS 240000

static char mounts[4][PATH_MAX];
static int n_mounts;
static pid_t child = -1;

static void results_fini(void)
{
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = -1;
    }
    while (n_mounts > 0)
        umount2(mounts[--n_mounts], MNT_DETACH);
    tmp_fini();
}

TestSuite(results, .init = tmp_init, .fini = results_fini, .timeout = 400);

/* A tmpfs of size bytes at tmp/name (flags: 0 or MS_RDONLY); skips the
 * test when this process may not mount. */
static const char *make_tmpfs(const char *name, size_t size, unsigned long flags)
{
    const char *dir = tmp_path(name);
    cr_assert_eq(mkdir(dir, 0755), 0, "mkdir %s: %s", dir, strerror(errno));
    char opts[64];
    snprintf(opts, sizeof(opts), "size=%zu,mode=0755", size);
    if (geteuid() != 0 || mount("tmpfs", dir, "tmpfs", flags, opts) < 0)
        cr_skip_test("cannot mount a tmpfs (%s): root needed", strerror(errno));
    snprintf(mounts[n_mounts++], PATH_MAX, "%s", dir);
    return dir;
}

/* `dsnode run` of the single-node example with data_dir, a few steps. */
static struct result run_with_data_dir(const char *dir)
{
    char data[PATH_MAX + 32];
    snprintf(data, sizeof(data), "node.data_dir=%s", dir);
    return run_dsnode(REFUSE_MS, (const char *const[]){"run", "--config", SINGLE, "--set", data,
                                                   "--set", listen_free(), "--set",
                                                   "train.steps=20", "--set", "train.eval_every=0",
                                                   NULL});
}

Test(results, read_only_data_dir_refused_at_start)
{
    const char *dir = make_tmpfs("ro", 1 << 20, MS_RDONLY);
    struct result r = run_with_data_dir(dir);
    /* Refused before the first step: no step line, no summary of a run. */
    expect_result(&r, 1, (const char *const[]){"node.data_dir: ", dir, "Read-only file system", NULL},
           (const char *const[]){"step=", NULL});
}

Test(results, data_dir_too_small_for_the_model_refused_at_start)
{
    const char *dir = make_tmpfs("small", 256 << 10, 0); /* model.bin is about 1 MiB */
    struct result r = run_with_data_dir(dir);
    expect_result(&r, 1, (const char *const[]){"node.data_dir: ", "no room for model.bin", NULL},
           (const char *const[]){"step=", NULL});
}

Test(results, data_dir_a_file_refused_at_start)
{
    const char *file = tmp_path("plain");
    write_bytes(file, "x", 1);
    struct result r = run_with_data_dir(file);
    expect_result(&r, 1, (const char *const[]){"node.data_dir: ", "expected a directory", NULL}, NULL);
}

/* Fill dir's file system: write zeros into a file until ENOSPC. */
static void fill(const char *dir)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/fill", dir);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    static char zeros[64 << 10];
    ssize_t w;
    while ((w = write(fd, zeros, sizeof(zeros))) > 0)
        ;
    cr_assert(w < 0 && errno == ENOSPC, "filling %s: %s", dir, strerror(errno));
    close(fd);
}

/* Start dsnode run in the background, stdout and stderr to files. */
static pid_t start_node(const char *data_dir, const char *status_file, const char *out,
                        const char *err)
{
    char data[PATH_MAX + 32], st[PATH_MAX + 32];
    snprintf(data, sizeof(data), "node.data_dir=%s", data_dir);
    snprintf(st, sizeof(st), "status.file=%s", status_file);
    const char *listen = listen_free();
    const pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        const int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(127);
        execl(bin("DSNODE"), "dsnode", "run", "--config", SINGLE, "--set", data, "--set", st,
              "--set", listen, "--set", "train.steps=5000", "--set",
              "train.eval_every=0", "--set", "train.log_every=10", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static long long file_step(const char *status_file)
{
    json_error_t je;
    json_t *doc = json_load_file(status_file, 0, &je);
    const long long s = doc ? status_step(doc) : -1;
    json_decref(doc);
    return s;
}

/* Wait (bounded) for child to exit; its raw wait status. */
static int wait_child(int ms)
{
    int ws;
    for (int t = 0; t < ms; t += 20) {
        const pid_t p = waitpid(child, &ws, WNOHANG);
        if (p == child) {
            child = -1;
            return ws;
        }
        const struct timespec d = {0, 20 * 1000000L};
        nanosleep(&d, NULL);
    }
    cr_assert_fail("dsnode did not exit within %d ms", ms);
    return -1;
}

Test(results, data_dir_full_at_the_end_fails_the_run)
{
    const char *dir = make_tmpfs("full", 4 << 20, 0);
    const char *sf = tmp_path("status.json");
    child = start_node(dir, sf, tmp_path("out"), tmp_path("err"));
    /* Training has begun (the start checks passed): then fill the disk. */
    int t = 0;
    for (; t < RUN_MS && file_step(sf) < 1; t += 20) {
        cr_assert_eq(waitpid(child, NULL, WNOHANG), 0, "dsnode exited early:\n%s",
                     read_text(tmp_path("err")));
        const struct timespec d = {0, 20 * 1000000L};
        nanosleep(&d, NULL);
    }
    cr_assert_lt(t, RUN_MS, "no step published");
    fill(dir);
    /* The disk must be full before the node's last step: 5000 steps take
     * seconds (400 took 0.4 s once the node got fast: it ended first). */
    cr_assert_lt(file_step(sf), 5000, "the node finished before the disk was full");
    const int ws = wait_child(RUN_MS);
    char *out = read_text(tmp_path("out")), *err = read_text(tmp_path("err"));
    cr_expect(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "wait status %d\n%s", ws, err);
    cr_expect_not_null(strstr(out, "status=failed"), "summary: %s", out);
    cr_expect_not_null(strstr(err, "final model not saved"), "%s", err);
    json_error_t je;
    json_t *doc = json_load_file(sf, 0, &je);
    cr_assert_not_null(doc, "%s: %s", sf, je.text);
    cr_expect_str_eq(status_state(doc), "failed");
    json_decref(doc);
    free(out);
    free(err);
}

/* ---- check-config ------------------------------------------------------------- */

/* check-config of the single example with sets: refused naming want, and
 * accepted with --offline. */
static void check_refused(const char *const *sets, int nsets, const char *want)
{
    const char *argv[32] = {"check-config", SINGLE, "--set", listen_free()};
    int n = 4;
    for (int i = 0; i < nsets; i++) {
        argv[n++] = "--set";
        argv[n++] = sets[i];
    }
    argv[n] = NULL;
    struct result r = run_dsnode(REFUSE_MS, argv);
    expect_result(&r, 2, (const char *const[]){want, NULL}, NULL);
    for (int i = n; i > 1; i--)
        argv[i] = argv[i - 1];
    argv[1] = "--offline";
    argv[n + 1] = NULL;
    r = run_dsnode(REFUSE_MS, argv);
    cr_expect_eq(r.code, 0, "--offline: exit %d\n%s", r.code, r.err);
    result_free(&r);
}

Test(results, check_config_checks_the_file_system)
{
    char data[PATH_MAX + 32], key[PATH_MAX + 64], ds[PATH_MAX + 32];
    snprintf(data, sizeof(data), "node.data_dir=%s", tmp_path("data"));
    struct result ok = run_dsnode(REFUSE_MS, (const char *const[]){"check-config", SINGLE, "--set",
                                                               listen_free(), "--set", data,
                                                               NULL});
    cr_expect_eq(ok.code, 0, "a good config: exit %d\n%s", ok.code, ok.err);
    result_free(&ok);

    snprintf(key, sizeof(key), "cluster.identity_file=%s", tmp_path("missing.key"));
    check_refused((const char *const[]){data, key}, 2, "cluster.identity_file: ");
    snprintf(ds, sizeof(ds), "train.dataset_dir=%s", tmp_path("nodata"));
    check_refused((const char *const[]){data, ds}, 2, "train.dataset_dir: ");
    snprintf(data, sizeof(data), "node.data_dir=%s/sub", make_tmpfs("ro", 1 << 20, MS_RDONLY));
    check_refused((const char *const[]){data}, 1, "node.data_dir: ");
}

Test(results, check_config_checks_the_ports)
{
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 1) == 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    char data[PATH_MAX + 32], port[64];
    snprintf(data, sizeof(data), "node.data_dir=%s", tmp_path("data"));
    snprintf(port, sizeof(port), "node.listen=127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    check_refused((const char *const[]){data, port}, 2, "node.listen: ");
    snprintf(port, sizeof(port), "status.listen=127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    check_refused((const char *const[]){data, port}, 2, "status.listen: ");
    close(fd);
}
