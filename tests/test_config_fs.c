/*
 * tests/test_config_fs.c: the config cases of issue 16 through the real
 * dsnode program (slow suite, test 'config_fs').
 *
 * - A FIFO named by a config key (cluster.identity_file, cluster.key_file,
 *   cluster.allowed_keys, a dataset file) or given as the config file is
 *   refused at once, naming the key: `dsnode run` used to block in open(2)
 *   waiting for a writer (and dslaunch, given a FIFO as its base config). Every process here runs under a hard timeout
 *   (ds_proc_capture kills it), so a hang fails the test instead of
 *   stalling the suite.
 * - gossip.segments: 1e9 and 2^63-1 are refused by check-config and run at
 *   the file's line; above the model's parameter count, run refuses it
 *   before gossip reserves anything, naming the key.
 * - train.warmup_steps above train.steps is refused by both.
 * - Relative paths are resolved against the config file's directory:
 *   check-config prints the same absolute paths from any working
 *   directory, and a run writes its model where the config says.
 *
 * Run: meson test -C build config_fs --verbose
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch_util.h"
#include "tools/dslaunch/dslaunch.h"

#define SINGLE DS_CONF_EXAMPLES_DIR "/single.ini"
/* A refusal takes well under a second; a run of a few steps a few. */
#define REFUSE_MS 20000
#define RUN_MS 120000

TestSuite(config_fs, .init = tmp_init, .fini = tmp_fini, .timeout = 300);

/* dsnode with args (NULL-terminated), in directory cwd (NULL: the run
 * directory, so nothing a run writes to "." lands in the source tree),
 * under a hard timeout that fails the test. */
static struct result dsnode(const char *cwd, int timeout_ms, const char *const *args)
{
    char *argv[64], here[PATH_MAX], err[256];
    int n = 0;
    argv[n++] = (char *)bin("DSNODE");
    for (; *args && n < 63; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    cr_assert_not_null(getcwd(here, sizeof(here)));
    if (!cwd)
        cwd = tmp_path("");
    cr_assert_eq(chdir(cwd), 0, "chdir %s: %s", cwd, strerror(errno));
    struct result r = {0};
    int ret = ds_proc_capture(argv, timeout_ms, &r.out, &r.err, &r.code, err, sizeof(err));
    cr_assert_eq(chdir(here), 0);
    cr_assert_neq(ret, -ETIMEDOUT, "dsnode %s did not return within %d ms (blocked?)\nstderr:\n%s",
                  argv[1], timeout_ms, r.err ? r.err : "");
    cr_assert_eq(ret, 0, "dsnode: %s", err);
    return r;
}

/* The command failed with `code` and its stderr holds every string of want. */
static void expect_refused(struct result *r, int code, const char *const *want)
{
    cr_expect_eq(r->code, code, "exit %d, expected %d\nstderr:\n%s", r->code, code, r->err);
    for (; *want; want++)
        cr_expect_not_null(strstr(r->err, *want), "stderr lacks '%s':\n%s", *want, r->err);
    result_free(r);
}

static const char *make_fifo(const char *name)
{
    const char *p = tmp_path(name);
    cr_assert_eq(mkfifo(p, 0600), 0, "mkfifo %s: %s", p, strerror(errno));
    return p;
}

/* ---- non-regular files ------------------------------------------------------- */

/* A run with one --set naming fifo under key: exit 1 at once, naming it. */
static void run_refuses_fifo(const char *key, const char *fifo, const char *why)
{
    char set[600], data[600];
    snprintf(set, sizeof(set), "%s=%s", key, fifo);
    snprintf(data, sizeof(data), "node.data_dir=%s", tmp_path("data"));
    struct result r = dsnode(NULL, REFUSE_MS,
                             (const char *const[]){"run", "--config", SINGLE, "--set", set,
                                                   "--set", data, "--set", "train.steps=1",
                                                   NULL});
    char named[300];
    snprintf(named, sizeof(named), "%s: ", key);
    expect_refused(&r, 1, (const char *const[]){named, why, NULL});
}

Test(config_fs, fifo_as_identity_file)
{
    const char *fifo = make_fifo("id.fifo");
    run_refuses_fifo("cluster.identity_file", fifo, "not a regular file (a FIFO)");
    /* check-config returns too (whether it opens key files or not). */
    char set[600];
    snprintf(set, sizeof(set), "cluster.identity_file=%s", fifo);
    struct result r = dsnode(NULL, REFUSE_MS,
                             (const char *const[]){"check-config", SINGLE, "--set", set, NULL});
    if (r.code != 0)
        cr_expect_not_null(strstr(r.err, "cluster.identity_file"), "%s", r.err);
    result_free(&r);
}

Test(config_fs, fifo_as_key_file_and_allow_list)
{
    const char *fifo = make_fifo("k.fifo");
    run_refuses_fifo("cluster.key_file", fifo, "not a regular file (a FIFO)");
    run_refuses_fifo("cluster.allowed_keys", fifo, "not a regular file (a FIFO)");
}

Test(config_fs, fifo_in_the_dataset)
{
    cr_assert_eq(mkdir(tmp_path("ds"), 0755), 0);
    make_fifo("ds/train-images-idx3-ubyte.gz");
    run_refuses_fifo("train.dataset_dir", tmp_path("ds"), "not a regular file (a FIFO)");
}

Test(config_fs, fifo_as_the_config_file)
{
    const char *fifo = make_fifo("config.fifo");
    struct result r = dsnode(NULL, REFUSE_MS, (const char *const[]){"check-config", fifo, NULL});
    expect_refused(&r, 2, (const char *const[]){"cannot open: not a regular file (a FIFO)", NULL});
    r = dsnode(NULL, REFUSE_MS, (const char *const[]){"run", "--config", fifo, NULL});
    expect_refused(&r, 2, (const char *const[]){"cannot open: not a regular file (a FIFO)", NULL});
    /* dslaunch opens the base config itself first. */
    r = run_dslaunch(REFUSE_MS, (const char *const[]){"local", "-n", "2", "--config", fifo,
                                                      "--out", tmp_path("run"), NULL});
    expect_refused(&r, 2, (const char *const[]){"not a regular file (a FIFO)", NULL});
}

/* ---- bounds ------------------------------------------------------------------ */

Test(config_fs, segments_bounds)
{
    static const char *const bad[] = {"1000000000", "9223372036854775807"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[256], want[512];
        snprintf(text, sizeof(text), "[gossip]\n; issue 16\nsegments = %s\n", bad[i]);
        const char *path = tmp_path("segments.ini");
        write_bytes(path, text, strlen(text));
        snprintf(want, sizeof(want),
                 "%s:3: gossip.segments: expected an integer in 0..65536, found '%s'", path,
                 bad[i]);
        struct result r = dsnode(NULL, REFUSE_MS,
                                 (const char *const[]){"check-config", path, NULL});
        expect_refused(&r, 2, (const char *const[]){want, NULL});
        r = dsnode(NULL, REFUSE_MS, (const char *const[]){"run", "--config", path, NULL});
        expect_refused(&r, 2, (const char *const[]){want, NULL});
    }
    /* Within the static bound, above this model's 805 parameters (784 -> 1
     * -> 10): check-config cannot know the model; run refuses it. */
    const char *const sets[] = {"--set", "train.hidden=1", "--set", "gossip.segments=1000",
                                NULL};
    struct result r = dsnode(NULL, REFUSE_MS,
                             (const char *const[]){"check-config", SINGLE, sets[0], sets[1],
                                                   sets[2], sets[3], NULL});
    cr_expect_eq(r.code, 0, "%s", r.err);
    result_free(&r);
    char data[600];
    snprintf(data, sizeof(data), "node.data_dir=%s", tmp_path("data"));
    r = dsnode(NULL, REFUSE_MS,
               (const char *const[]){"run", "--config", SINGLE, sets[0], sets[1], sets[2], sets[3],
                                     "--set", data, NULL});
    expect_refused(&r, 1,
                   (const char *const[]){"gossip.segments: expected at most the model's 805 "
                                         "parameters, found 1000",
                                         NULL});
}

Test(config_fs, warmup_above_steps)
{
    /* data_dir in the run directory: a dsnode without the rule trains and
     * writes its model there, not into the working directory. */
    char data[600];
    snprintf(data, sizeof(data), "node.data_dir=%s", tmp_path("data"));
    const char *const args[][10] = {
        {"check-config", SINGLE, "--set", "train.steps=50", "--set", "train.warmup_steps=51",
         NULL},
        {"run", "--config", SINGLE, "--set", "train.steps=50", "--set", "train.warmup_steps=51",
         "--set", data, NULL},
    };
    for (int i = 0; i < 2; i++) {
        struct result r = dsnode(NULL, REFUSE_MS, args[i]);
        expect_refused(&r, 2,
                       (const char *const[]){"train.warmup_steps: expected at most train.steps "
                                             "(50), found 51",
                                             NULL});
    }
}

/* ---- relative paths ---------------------------------------------------------- */

Test(config_fs, relative_paths_follow_the_config_file)
{
    cr_assert_eq(mkdir(tmp_path("cfg"), 0755), 0);
    cr_assert_eq(mkdir(tmp_path("elsewhere"), 0755), 0);
    static const char ini[] = "[node]\nname = rel\ndata_dir = out\n"
                              "[train]\nsteps = 3\neval_every = 0\nlog_every = 1\n"
                              "backend = cpu\nhidden = 16\n";
    write_bytes(tmp_path("cfg/node.ini"), ini, strlen(ini));
    char dir[PATH_MAX], want[PATH_MAX + 32];
    cr_assert_not_null(realpath(tmp_path("cfg"), dir));
    snprintf(want, sizeof(want), "\ndata_dir = %s/out\n", dir);

    /* The same dump from three working directories. */
    struct result a = dsnode(tmp_path(""), REFUSE_MS,
                             (const char *const[]){"check-config", "cfg/node.ini", NULL});
    struct result b = dsnode(tmp_path("cfg"), REFUSE_MS,
                             (const char *const[]){"check-config", "node.ini", NULL});
    struct result c = dsnode("/", REFUSE_MS,
                             (const char *const[]){"check-config", tmp_path("cfg/node.ini"),
                                                   NULL});
    cr_assert_eq(a.code, 0, "%s", a.err);
    cr_assert_eq(b.code, 0, "%s", b.err);
    cr_assert_eq(c.code, 0, "%s", c.err);
    cr_expect_not_null(strstr(a.out, want), "want '%s' in:\n%s", want + 1, a.out);
    cr_expect_str_eq(a.out, b.out);
    cr_expect_str_eq(a.out, c.out);
    result_free(&a);
    result_free(&b);
    result_free(&c);

    /* A run from another directory writes its model next to the config. */
    char model[PATH_MAX + 32];
    snprintf(model, sizeof(model), "%s/out/model.bin", dir);
    struct result r = dsnode(tmp_path("elsewhere"), RUN_MS,
                             (const char *const[]){"run", "--config", "../cfg/node.ini", NULL});
    cr_expect_eq(r.code, 0, "stderr:\n%s", r.err);
    result_free(&r);
    struct stat st;
    cr_expect_eq(stat(model, &st), 0, "%s: %s", model, strerror(errno));
    cr_expect_neq(stat(tmp_path("elsewhere/out"), &st), 0, "written to the working directory");

    /* A relative --set is the working directory's. */
    r = dsnode(tmp_path("elsewhere"), REFUSE_MS,
               (const char *const[]){"check-config", "../cfg/node.ini", "--set",
                                     "node.data_dir=mine", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_assert_not_null(realpath(tmp_path("elsewhere"), dir));
    snprintf(want, sizeof(want), "\ndata_dir = %s/mine\n", dir);
    cr_expect_not_null(strstr(r.out, want), "want '%s' in:\n%s", want + 1, r.out);
    result_free(&r);
}
