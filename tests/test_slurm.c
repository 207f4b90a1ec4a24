/*
 * tests/test_slurm.c: `dsnode run --slurm`'s derivation (conf/slurm.h),
 * suite unit: Slurm's compressed host lists, every variable's error, the
 * seeds rule, the same expansion as `scontrol show hostnames` (when
 * installed), and the real dsnode's check-config --slurm (explicit --set
 * values win). The daemons test is tests/test_slurm_daemons.c (slow).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/conf.h"
#include "conf/slurm.h"
#include "tools/dslaunch/dslaunch.h"

/* ---- host lists --------------------------------------------------------- */

static void expect_hosts(const char *list, int max, const char *want)
{
    ds_slurm_host h[DS_SLURM_HOSTS_MAX];
    char err[512] = "", got[4096] = "";
    const int n = ds_slurm_hostlist(list, h, max, err, sizeof(err));
    cr_assert_geq(n, 0, "'%s': %s", list, err);
    for (int i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", i ? " " : "", h[i]);
    cr_expect_str_eq(got, want, "'%s' (max %d): expected '%s', found '%s'", list, max, want, got);
}

static void expect_bad(const char *list, const char *want_err)
{
    ds_slurm_host h[4];
    char err[512] = "";
    cr_expect_lt(ds_slurm_hostlist(list, h, 4, err, sizeof(err)), 0, "'%s' accepted", list);
    cr_expect(strstr(err, want_err), "'%s': expected an error with '%s', found '%s'", list,
              want_err, err);
}

Test(slurm, hostlist_expands)
{
    expect_hosts("vm", 16, "vm");
    expect_hosts("node[01-03,07]", 16, "node01 node02 node03 node07");
    expect_hosts("a[1-2],b,c[9-10]", 16, "a1 a2 b c9 c10");
    expect_hosts("rack[1-2]-n[0-1]", 16, "rack1-n0 rack1-n1 rack2-n0 rack2-n1");
    expect_hosts("n[001-100]", 3, "n001 n002 n003");
    expect_hosts("x[5]", 16, "x5");
    /* A huge range stops at max: nothing is expanded past it. */
    expect_hosts("big[0-99999999999]", 2, "big0 big1");
}

Test(slurm, hostlist_refuses)
{
    expect_bad("", "expected host names");
    expect_bad("n[1-3", "balanced");
    expect_bad("n[[1]]", "balanced");
    expect_bad("n[]", "expected '[ranges]'");
    expect_bad("n[3-1]", "expected a range like 01-03");
    expect_bad("n[a-b]", "expected a range like 01-03");
    expect_bad("a,,b", "expected a host name, found ''");
}

/* What `scontrol show hostnames` says, when Slurm's client is installed. */
Test(slurm, hostlist_same_as_scontrol)
{
    if (system("command -v scontrol >/dev/null 2>&1") != 0)
        cr_skip_test("no scontrol (Debian: apt-get install slurm-client)");
    /* scontrol reads a slurm.conf even for this: a minimal one, removed
     * before any assertion can end the test. */
    char conf[] = "/tmp/ds-slurm-conf-XXXXXX";
    const int fd = mkstemp(conf);
    cr_assert_geq(fd, 0);
    const char text[] = "ClusterName=t\nSlurmctldHost=localhost\n";
    const ssize_t wrote = write(fd, text, sizeof(text) - 1);
    close(fd);
    const char *lists[] = {"node[01-03,07]", "a[1-2],b,c[9-10]", "rack[1-2]-n[0-1]", "vm"};
    enum { NL = sizeof(lists) / sizeof(lists[0]) };
    char *outs[NL] = {NULL}, *errs[NL] = {NULL}, err[NL][256];
    int codes[NL], rcs[NL];
    for (int i = 0; i < NL; i++) {
        char cmd[256];
        snprintf(cmd, sizeof(cmd), "SLURM_CONF=%s scontrol show hostnames '%s'", conf, lists[i]);
        char *argv[] = {"/bin/sh", "-c", cmd, NULL};
        codes[i] = -1;
        rcs[i] = ds_proc_capture(argv, 20000, &outs[i], &errs[i], &codes[i], err[i],
                                 sizeof(err[i]));
    }
    unlink(conf);
    cr_assert_eq(wrote, (ssize_t)sizeof(text) - 1);
    for (int i = 0; i < NL; i++) {
        cr_assert_eq(rcs[i], 0, "%s", err[i]);
        cr_assert_eq(codes[i], 0, "scontrol show hostnames %s: %s", lists[i], errs[i]);
        char *out = outs[i];
        for (char *p = out; *p; p++)
            if (*p == '\n')
                *p = ' ';
        size_t n = strlen(out);
        while (n && out[n - 1] == ' ')
            out[--n] = '\0';
        expect_hosts(lists[i], 16, out);
        free(out);
        free(errs[i]);
    }
}

/* ---- the derivation ----------------------------------------------------- */

static const char *const *cur_env;
static const char *table_env(const char *name)
{
    for (int i = 0; cur_env[i]; i += 2)
        if (!strcmp(cur_env[i], name))
            return cur_env[i + 1];
    return NULL;
}

/* Every host "resolves" to 10.0.0.<the digits at its end>. */
static int fake_resolve(const char *host, char *addr, size_t len, char *err, size_t elen)
{
    const char *d = host + strlen(host);
    while (d > host && d[-1] >= '0' && d[-1] <= '9')
        d--;
    if (!*d) {
        snprintf(err, elen, "no such host");
        return -1;
    }
    snprintf(addr, len, "10.0.0.%d", atoi(d));
    return 0;
}

#define BASE_ENV                                                                                 \
    "SLURM_JOB_ID", "77", "SLURM_NTASKS", "8", "SLURM_STEP_NODELIST", "node[01-03,07]"

static int derive(const char *const *env, ds_conf *c, ds_slurm_sets *d, char *err, size_t n)
{
    cur_env = env;
    return ds_slurm_derive(c, table_env, ds_slurm_hostlist, fake_resolve, d, err, n);
}

static void expect_sets(const char *const *env, const char *const *conf_sets,
                        const char *const *want)
{
    ds_conf c;
    ds_conf_defaults(&c);
    char err[DS_CONF_ERR_MAX] = "";
    for (int i = 0; conf_sets && conf_sets[i]; i++)
        cr_assert_eq(ds_conf_set(&c, conf_sets[i], err, sizeof(err)), 0, "%s", err);
    ds_slurm_sets d;
    cr_assert_eq(derive(env, &c, &d, err, sizeof(err)), 0, "%s", err);
    int n = 0;
    while (n < DS_SLURM_SETS_MAX && want[n])
        n++;
    cr_assert_eq(d.n, n);
    for (int i = 0; i < n; i++)
        cr_expect_str_eq(d.set[i], want[i]);
    /* Every assignment is one the loader takes. */
    for (int i = 0; i < n; i++)
        cr_expect_eq(ds_conf_set(&c, d.set[i], err, sizeof(err)), 0, "%s", err);
}

Test(slurm, derive_task_on_a_later_host)
{
    const char *env[] = {BASE_ENV, "SLURM_PROCID", "5", "SLURM_LOCALID", "1", "SLURM_NODEID",
                         "2", "SLURMD_NODENAME", "node03", NULL};
    const char *want[] = {"node.name=77-5", "node.group=node03", "node.listen=127.0.0.1:7001",
                          "cluster.seeds=10.0.0.1:7000", NULL};
    expect_sets(env, NULL, want);
    /* slurm.seeds = 3: the first three hosts; listen's host kept. */
    const char *sets[] = {"slurm.seeds=3", "slurm.port_base=9000", "node.listen=0.0.0.0:1",
                          NULL};
    const char *want3[] = {"node.name=77-5", "node.group=node03", "node.listen=0.0.0.0:9001",
                           "cluster.seeds=10.0.0.1:9000,10.0.0.2:9000,10.0.0.3:9000", NULL};
    /* A set node.advertise keeps its host and follows the port. */
    const char *seta[] = {"node.listen=0.0.0.0:1", "node.advertise=gw.example:1",
                          "status.listen=127.0.0.1:9100", NULL};
    const char *wanta[] = {"node.name=77-5",
                           "node.group=node03",
                           "node.listen=0.0.0.0:7001",
                           "cluster.seeds=10.0.0.1:7000",
                           "node.advertise=gw.example:7001",
                           "status.listen=127.0.0.1:9101",
                           NULL};
    expect_sets(env, seta, wanta);
    expect_sets(env, sets, want3);
}

Test(slurm, derive_first_seed_starts_the_cluster)
{
    const char *env[] = {BASE_ENV, "SLURM_PROCID", "0", "SLURM_LOCALID", "0", "SLURM_NODEID",
                         "0", "SLURMD_NODENAME", "node01", NULL};
    const char *want[] = {"node.name=77-0", "node.group=node01", "node.listen=127.0.0.1:7000",
                          "cluster.seeds=", NULL};
    const char *sets[] = {"slurm.seeds=3", NULL};
    expect_sets(env, sets, want);
    /* Its second task joins through it. */
    const char *env1[] = {BASE_ENV, "SLURM_PROCID", "1", "SLURM_LOCALID", "1", "SLURM_NODEID",
                          "0", "SLURMD_NODENAME", "node01", NULL};
    const char *want1[] = {"node.name=77-1", "node.group=node01", "node.listen=127.0.0.1:7001",
                           "cluster.seeds=10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000", NULL};
    expect_sets(env1, sets, want1);
}

/* train.device: the local id among the GPUs Slurm shows the task
 * (CUDA_VISIBLE_DEVICES): all four of a host's, one bound to the task, or
 * none ("NoDevFiles", or no variable: train.device left as configured). */
Test(slurm, derive_device_from_local_id)
{
    const char *all4[] = {BASE_ENV, "SLURM_PROCID", "5", "SLURM_LOCALID", "1", "SLURM_NODEID",
                          "2", "SLURMD_NODENAME", "node03", "CUDA_VISIBLE_DEVICES", "0,1,2,3",
                          NULL};
    const char *want[] = {"node.name=77-5", "node.group=node03", "node.listen=127.0.0.1:7001",
                          "cluster.seeds=10.0.0.1:7000", "train.device=1", NULL};
    expect_sets(all4, NULL, want);
    const char *wrap[] = {BASE_ENV, "SLURM_PROCID", "5", "SLURM_LOCALID", "5", "SLURM_NODEID",
                          "2", "SLURMD_NODENAME", "node03", "CUDA_VISIBLE_DEVICES", "4,5,6",
                          NULL};
    const char *want_wrap[] = {"node.name=77-5", "node.group=node03",
                               "node.listen=127.0.0.1:7005", "cluster.seeds=10.0.0.1:7000",
                               "train.device=2", NULL};
    expect_sets(wrap, NULL, want_wrap);
    const char *bound[] = {BASE_ENV, "SLURM_PROCID", "5", "SLURM_LOCALID", "3", "SLURM_NODEID",
                           "2", "SLURMD_NODENAME", "node03", "CUDA_VISIBLE_DEVICES", "7", NULL};
    const char *want_bound[] = {"node.name=77-5", "node.group=node03",
                                "node.listen=127.0.0.1:7003", "cluster.seeds=10.0.0.1:7000",
                                "train.device=0", NULL};
    expect_sets(bound, NULL, want_bound);
    const char *none[] = {BASE_ENV, "SLURM_PROCID", "5", "SLURM_LOCALID", "3", "SLURM_NODEID",
                          "2", "SLURMD_NODENAME", "node03", "CUDA_VISIBLE_DEVICES", "NoDevFiles",
                          NULL};
    const char *want_none[] = {"node.name=77-5", "node.group=node03",
                               "node.listen=127.0.0.1:7003", "cluster.seeds=10.0.0.1:7000", NULL};
    expect_sets(none, NULL, want_none);
}

Test(slurm, derive_a_seed_is_not_its_own_seed)
{
    const char *env[] = {BASE_ENV, "SLURM_PROCID", "2", "SLURM_LOCALID", "0", "SLURM_NODEID",
                         "1", "SLURMD_NODENAME", "node02", NULL};
    const char *sets[] = {"slurm.seeds=3", "node.listen=[::1]:7000", NULL};
    const char *want[] = {"node.name=77-2", "node.group=node02", "node.listen=[::1]:7000",
                          "cluster.seeds=10.0.0.1:7000,10.0.0.3:7000", NULL};
    expect_sets(env, sets, want);
}

Test(slurm, derive_job_nodelist_when_no_step_list)
{
    const char *env[] = {"SLURM_JOB_ID", "9", "SLURM_NTASKS", "2", "SLURM_JOB_NODELIST",
                         "gpu[4-5]", "SLURM_PROCID", "1", "SLURM_LOCALID", "0", "SLURM_NODEID",
                         "1", "SLURMD_NODENAME", "gpu5", NULL};
    const char *want[] = {"node.name=9-1", "node.group=gpu5", "node.listen=127.0.0.1:7000",
                          "cluster.seeds=10.0.0.4:7000", NULL};
    expect_sets(env, NULL, want);
}

static void expect_error(const char *const *env, const char *const *conf_sets, const char *want)
{
    ds_conf c;
    ds_conf_defaults(&c);
    char err[DS_CONF_ERR_MAX] = "";
    for (int i = 0; conf_sets && conf_sets[i]; i++)
        cr_assert_eq(ds_conf_set(&c, conf_sets[i], err, sizeof(err)), 0, "%s", err);
    ds_slurm_sets d;
    cr_expect_lt(derive(env, &c, &d, err, sizeof(err)), 0, "accepted, expected '%s'", want);
    cr_expect_str_eq(err, want);
}

#define NOT_IN " is not set (expected in a task started by srun inside a Slurm allocation)"

Test(slurm, derive_names_what_is_missing_or_wrong)
{
    /* Each variable missing in turn. */
    const char *vars[] = {"SLURM_JOB_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                          "SLURM_NTASKS", "SLURMD_NODENAME"};
    for (size_t v = 0; v < sizeof(vars) / sizeof(vars[0]); v++) {
        const char *full[] = {"SLURM_JOB_ID", "7", "SLURM_PROCID", "0", "SLURM_LOCALID", "0",
                              "SLURM_NODEID", "0", "SLURM_NTASKS", "1", "SLURMD_NODENAME", "n1",
                              "SLURM_STEP_NODELIST", "n1", NULL};
        const char *env[16];
        int k = 0;
        for (int i = 0; full[i]; i += 2)
            if (strcmp(full[i], vars[v])) {
                env[k++] = full[i];
                env[k++] = full[i + 1];
            }
        env[k] = NULL;
        char want[256];
        snprintf(want, sizeof(want), "--slurm: %s" NOT_IN, vars[v]);
        expect_error(env, NULL, want);
    }
    const char *nolist[] = {"SLURM_JOB_ID", "7", "SLURM_PROCID", "0", "SLURM_LOCALID", "0",
                            "SLURM_NODEID", "0", "SLURM_NTASKS", "1", "SLURMD_NODENAME", "n1",
                            NULL};
    expect_error(nolist, NULL,
                 "--slurm: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set (expected in a "
                 "task started by srun inside a Slurm allocation)");
    const char *badint[] = {BASE_ENV, "SLURM_PROCID", "x1", "SLURM_LOCALID", "0", "SLURM_NODEID",
                            "0", "SLURMD_NODENAME", "node01", NULL};
    expect_error(badint, NULL, "--slurm: SLURM_PROCID: expected a non-negative integer, found 'x1'");
    const char *past[] = {BASE_ENV, "SLURM_PROCID", "8", "SLURM_LOCALID", "0", "SLURM_NODEID",
                          "0", "SLURMD_NODENAME", "node01", NULL};
    expect_error(past, NULL, "--slurm: SLURM_PROCID: expected less than SLURM_NTASKS = 8, found 8");
    const char *port[] = {BASE_ENV, "SLURM_PROCID", "1", "SLURM_LOCALID", "2", "SLURM_NODEID",
                          "0", "SLURMD_NODENAME", "node01", NULL};
    const char *hi[] = {"slurm.port_base=65534", NULL};
    expect_error(port, hi, "--slurm: slurm.port_base + SLURM_LOCALID: expected a port <= 65535, "
                           "found 65534 + 2");
    const char *wrongnode[] = {BASE_ENV, "SLURM_PROCID", "1", "SLURM_LOCALID", "1",
                               "SLURM_NODEID", "1", "SLURMD_NODENAME", "node03", NULL};
    expect_error(wrongnode, NULL,
                 "--slurm: SLURM_NODEID = 1: expected the index of SLURMD_NODENAME 'node03' in "
                 "SLURM_STEP_NODELIST 'node[01-03,07]', found host 'node02' there");
    const char *badlist[] = {"SLURM_JOB_ID", "7", "SLURM_PROCID", "0", "SLURM_LOCALID", "0",
                             "SLURM_NODEID", "0", "SLURM_NTASKS", "1", "SLURMD_NODENAME", "n1",
                             "SLURM_STEP_NODELIST", "n[1-", NULL};
    expect_error(badlist, NULL, "--slurm: SLURM_STEP_NODELIST: host list 'n[1-': expected "
                                "balanced, unnested brackets");
    const char *badname[] = {BASE_ENV, "SLURM_PROCID", "1", "SLURM_LOCALID", "1", "SLURM_NODEID",
                             "0", "SLURMD_NODENAME", "node 01", NULL};
    expect_error(badname, NULL, "--slurm: SLURMD_NODENAME: expected a name of 1..63 characters "
                                "from A-Z a-z 0-9 _ . - (it becomes node.group), found 'node 01'");
    const char *unres[] = {"SLURM_JOB_ID", "7", "SLURM_PROCID", "1", "SLURM_LOCALID", "1",
                           "SLURM_NODEID", "0", "SLURM_NTASKS", "2", "SLURMD_NODENAME", "nx",
                           "SLURM_STEP_NODELIST", "nx", NULL};
    expect_error(unres, NULL, "--slurm: seed host 'nx' of SLURM_STEP_NODELIST: no such host");
}

/* ---- the real dsnode ----------------------------------------------------- */

static const char *dsnode(void)
{
    const char *p = getenv("DSNODE");
    cr_assert_not_null(p, "DSNODE not set (meson sets it)");
    return p;
}

/* dsnode check-config --offline --slurm with exactly the given environment. */
static int check_config(const char *const *extra, char **out, char **errt)
{
    char *argv[64];
    int k = 0;
    argv[k++] = "/usr/bin/env";
    argv[k++] = "-i";
    argv[k++] = "SLURM_JOB_ID=31";
    argv[k++] = "SLURM_PROCID=3";
    argv[k++] = "SLURM_LOCALID=3";
    argv[k++] = "SLURM_NODEID=0";
    argv[k++] = "SLURM_NTASKS=4";
    argv[k++] = "SLURMD_NODENAME=localhost";
    argv[k++] = "SLURM_STEP_NODELIST=localhost";
    argv[k++] = (char *)dsnode();
    argv[k++] = "check-config";
    argv[k++] = "--offline";
    argv[k++] = "--slurm";
    argv[k++] = DS_CONF_EXAMPLES_DIR "/cluster.ini";
    for (int i = 0; extra && extra[i]; i++)
        argv[k++] = (char *)extra[i];
    argv[k] = NULL;
    char err[256];
    int code = -1;
    cr_assert_eq(ds_proc_capture(argv, 30000, out, errt, &code, err, sizeof(err)), 0, "%s", err);
    return code;
}

Test(slurm, cli_derives_and_set_wins)
{
    char *out, *errt;
    cr_assert_eq(check_config(NULL, &out, &errt), 0, "%s", errt);
    cr_expect(strstr(out, "\nname = 31-3\n"), "no name = 31-3 in:\n%s", out);
    cr_expect(strstr(out, "\ngroup = localhost\n"), "no group = localhost in:\n%s", out);
    cr_expect(strstr(out, "\nlisten = 127.0.0.1:7003\n"), "no listen :7003 in:\n%s", out);
    /* cluster.ini's status.listen is 127.0.0.1:9100. */
    cr_expect(strstr(out, "\nlisten = 127.0.0.1:9103\n"), "no status listen :9103 in:\n%s", out);
    cr_expect(strstr(out, "\nseeds = 127.0.0.1:7000\n") || strstr(out, "\nseeds = [::1]:7000\n"),
              "no seeds = localhost's address:7000 in:\n%s", out);
    free(out);
    free(errt);
    const char *sets[] = {"--set", "node.name=mine", "--set", " cluster.seeds = 10.1.1.1:7000",
                          "--set", "slurm.port_base=8000", NULL};
    cr_assert_eq(check_config(sets, &out, &errt), 0, "%s", errt);
    cr_expect(strstr(out, "\nname = mine\n"), "--set node.name lost:\n%s", out);
    cr_expect(strstr(out, "\nseeds = 10.1.1.1:7000\n"), "--set cluster.seeds lost:\n%s", out);
    cr_expect(strstr(out, "\nlisten = 127.0.0.1:8003\n"), "port_base not used:\n%s", out);
    cr_expect(strstr(out, "\ngroup = localhost\n"), "group not derived:\n%s", out);
    free(out);
    free(errt);
}

Test(slurm, cli_outside_slurm_is_refused)
{
    char *argv[] = {"/usr/bin/env", "-i", (char *)dsnode(), "run", "--slurm", "--config",
                    DS_CONF_EXAMPLES_DIR "/cluster.ini", NULL};
    char *out = NULL, *errt = NULL, err[256];
    int code = -1;
    cr_assert_eq(ds_proc_capture(argv, 30000, &out, &errt, &code, err, sizeof(err)), 0, "%s", err);
    cr_expect_eq(code, 2, "exit %d, stderr:\n%s", code, errt);
    cr_expect(strstr(errt, "--slurm: SLURM_JOB_ID" NOT_IN), "stderr:\n%s", errt);
    free(out);
    free(errt);
    /* Other subcommands do not take it. */
    char *argv2[] = {(char *)dsnode(), "keygen", "--slurm", NULL};
    cr_assert_eq(ds_proc_capture(argv2, 30000, &out, &errt, &code, err, sizeof(err)), 0, "%s",
                 err);
    cr_expect_eq(code, 2, "keygen --slurm: exit %d", code);
    free(out);
    free(errt);
}
