/*
 * node/main.c: the dsnode program.
 *
 *   dsnode run --config FILE [--slurm] [--resume CHECKPOINT] [--set section.key=value]...
 *       (--slurm: name, group, listen port and seeds from the Slurm task's
 *       environment, conf/slurm.h; --set values win)
 *   dsnode check-config [--offline] [--slurm] FILE [--set section.key=value]...
 *       (without --offline it also checks the key files, the dataset,
 *       node.data_dir, status.file's directory and the listen ports:
 *       node/runtime/preflight.h)
 *   dsnode keygen [--cluster] --out FILE
 *   dsnode help-config | --help | --version
 *
 * The subcommand comes first, its options after it (getopt_long, so
 * `--set X` and `--set=X` both work). Exit status: 0 success; 1 runtime
 * failure; 2 usage or config error; 128 + signal when a run was stopped
 * by SIGINT / SIGTERM.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/hostport.h"
#include "base/log.h"
#include "conf/conf.h"
#include "conf/slurm.h"
#include "kernels/cpu.h"
#include "kernels/kernels.h"
#include "node/runtime/preflight.h"
#include "node/run/run.h"
#include "node/sec/keygen.h"

#define MAX_SETS 256

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsnode run --config FILE [--slurm] [--resume CHECKPOINT] [--set section.key=value]...\n"
            "       dsnode check-config [--offline] [--slurm] FILE [--set section.key=value]...\n"
            "       dsnode keygen [--cluster] --out FILE\n"
            "       dsnode help-config    every config key, its type, default and meaning\n"
            "       dsnode --version\n");
}

/* Defaults, the file, then every --set in order, relative paths made
 * absolute (the file's against its directory, the rest against the
 * working directory), then the cross-key checks.
 * On error prints the one-line message and returns -1. */
static int load_config(ds_conf *c, const char *path, int nset, char **sets)
{
    char err[DS_CONF_ERR_MAX];
    ds_conf_defaults(c);
    if (path && ds_conf_load(c, path, err, sizeof(err)) < 0)
        goto fail;
    for (int i = 0; i < nset; i++)
        if (ds_conf_set(c, sets[i], err, sizeof(err)) < 0)
            goto fail;
    if (ds_conf_resolve_paths(c, err, sizeof(err)) < 0)
        goto fail;
    if (ds_conf_check(c, err, sizeof(err)) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "dsnode: %s\n", err);
    return -1;
}

/* A subcommand's options: --config FILE, --set section.key=value (any
 * number, kept in order) and, where positional_ok, FILE as the first
 * argument that is not an option. argv[0] is the subcommand. Prints what
 * it does not understand and returns -1. */
static int parse_common(int argc, char **argv, int positional_ok, const char **path, char **sets,
                        int *nset, int *offline, int *slurm, const char **resume)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"resume", required_argument, NULL, 'r'},
        {"set", required_argument, NULL, 's'},
        {"offline", no_argument, NULL, 'o'},
        {"slurm", no_argument, NULL, 'S'},
        {NULL, 0, NULL, 0},
    };
    *nset = 0;
    *path = NULL;
    optind = 1;
    opterr = 0; /* our message, not getopt's */
    /* "-": arguments that are not options come back in order, as 1. */
    int ch, done = optind; /* arguments taken so far */
    while ((ch = getopt_long(argc, argv, "-", opts, NULL)) != -1) {
        done = optind;
        switch (ch) {
        case 'c':
            *path = optarg;
            break;
        case 's':
            sets[(*nset)++] = optarg;
            break;
        case 'o':
            if (offline) {
                *offline = 1;
                break;
            }
            fprintf(stderr, "dsnode %s: unexpected argument '--offline'\n", argv[0]);
            return -1;
        case 'r':
            if (resume && !*resume) {
                *resume = optarg;
                break;
            }
            fprintf(stderr, "dsnode %s: unexpected argument '--resume'\n", argv[0]);
            return -1;
        case 'S':
            if (slurm) {
                *slurm = 1;
                break;
            }
            fprintf(stderr, "dsnode %s: unexpected argument '--slurm'\n", argv[0]);
            return -1;
        case 1:
            if (positional_ok && optarg[0] != '-' && !*path) {
                *path = optarg;
                break;
            }
            fprintf(stderr, "dsnode %s: unexpected argument '%s'\n", argv[0], optarg);
            return -1;
        default:
            fprintf(stderr, "dsnode %s: unexpected argument '%s'\n", argv[0], argv[optind - 1]);
            return -1;
        }
    }
    /* getopt skips a "--" and stops there; we never took one. */
    if (optind > done) {
        fprintf(stderr, "dsnode %s: unexpected argument '--'\n", argv[0]);
        return -1;
    }
    return 0;
}

/* --slurm's host-list expansion: `scontrol show hostnames LIST` (Slurm's
 * own rules), or conf/slurm.c's parser when scontrol is missing, fails or
 * prints more than 64 KiB (it then dies of SIGPIPE when we stop reading).
 * Called before any thread of ours starts. */
static int slurm_hosts(const char *list, ds_slurm_host *hosts, int max, char *err,
                       size_t err_len)
{
    int fd[2] = {-1, -1}; /* pipe() leaves them when it fails */
    pid_t pid = -1;
    if (pipe(fd) == 0 && (pid = fork()) == 0) {
        const int null = open("/dev/null", O_WRONLY);
        dup2(fd[1], 1);
        if (null >= 0)
            dup2(null, 2);
        execlp("scontrol", "scontrol", "show", "hostnames", list, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) {
        close(fd[1]);
        char buf[1 << 16];
        size_t got = 0;
        for (;;) {
            const ssize_t k = read(fd[0], buf + got, sizeof(buf) - 1 - got);
            if (k > 0)
                got += (size_t)k;
            if ((k < 0 && errno != EINTR) || k == 0 || got == sizeof(buf) - 1)
                break;
        }
        close(fd[0]);
        buf[got] = '\0';
        int st = -1;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0 && got < sizeof(buf) - 1) {
            int n = 0;
            for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l && n < max;
                 l = strtok_r(NULL, "\n", &save))
                if (strlen(l) <= DS_HOST_MAX)
                    snprintf(hosts[n++], sizeof(hosts[0]), "%s", l);
            if (n > 0)
                return n;
        }
    } else if (pid < 0 && fd[0] >= 0) {
        close(fd[0]);
        close(fd[1]);
    }
    return ds_slurm_hostlist(list, hosts, max, err, err_len);
}

/* --slurm's seed addresses: the host's first address (getaddrinfo). */
static int slurm_resolve(const char *host, char *addr, size_t addr_len, char *err,
                         size_t err_len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    const int g = getaddrinfo(host, NULL, &hints, &ai);
    if (g != 0 || !ai) {
        snprintf(err, err_len, "cannot resolve it: %s", gai_strerror(g));
        return -1;
    }
    const void *a = ai->ai_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                        : (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    const int ok = inet_ntop(ai->ai_family, a, addr, (socklen_t)addr_len) != NULL;
    freeaddrinfo(ai);
    if (!ok) {
        snprintf(err, err_len, "cannot format its address");
        return -1;
    }
    return 0;
}

/* Apply what --slurm derives to the keys no --set named, then check again. */
/* The Slurm task's assignments applied over c (keys the command line set
 * explicitly win); those applied are appended to extra (*n_extra of
 * them, pointing into static storage: one call per process), so that
 * `run` can hand the same overrides to dsnode_open. */
static int apply_slurm(ds_conf *c, const char *path, int nset, char **sets, const char **extra,
                       int *n_extra)
{
    static ds_slurm_sets d;
    char err[DS_CONF_ERR_MAX];
    if (ds_slurm_derive(c, (ds_slurm_getenv_fn)getenv, slurm_hosts, slurm_resolve, &d, err,
                        sizeof(err)) < 0)
        goto fail;
    ds_conf next = *c;
    for (int i = 0; i < d.n; i++) {
        const size_t klen = strcspn(d.set[i], "=");
        int explicit_set = 0;
        for (int j = 0; j < nset; j++) {
            const char *k = sets[j];
            while (*k == ' ' || *k == '\t')
                k++;
            const size_t l = strcspn(k, "= \t");
            explicit_set |= l == klen && !strncmp(k, d.set[i], klen);
        }
        if (explicit_set)
            continue;
        if (ds_conf_set(&next, d.set[i], err, sizeof(err)) < 0)
            goto fail;
        if (extra)
            extra[(*n_extra)++] = d.set[i];
    }
    if (ds_conf_check(&next, err, sizeof(err)) < 0)
        goto fail;
    *c = next;
    return 0;
fail:
    fprintf(stderr, "dsnode: %s: %s\n", path, err);
    return -1;
}

/* Seconds since this process was started (/proc/self/stat's starttime
 * against CLOCK_BOOTTIME; 10 ms ticks), or -1 when unknown. */
static double process_age_s(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold anything */
    unsigned long long start = 0;
    /* After ")": state is field 3, starttime field 22. */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                            "%*d %*d %*d %llu", &start) != 1)
        return -1;
    struct timespec now;
    const long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) < 0)
        return -1;
    const double age = (double)now.tv_sec + (double)now.tv_nsec * 1e-9 - (double)start / (double)hz;
    return age >= 0 ? age : -1;
}

static int cmd_run(int argc, char **argv)
{
    const char *path;
    char *sets[MAX_SETS];
    const char *resume = NULL;
    int nset, slurm = 0;
    ds_conf c;
    if (argc > MAX_SETS ||
        parse_common(argc, argv, 0, &path, sets, &nset, NULL, &slurm, &resume) < 0) {
        usage(stderr);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "dsnode run: --config FILE is required\n");
        return 2;
    }
    if (load_config(&c, path, nset, sets) < 0)
        return 2;
    /* dsnode_open reads the file again with the same overrides: --set's,
     * then Slurm's. */
    const char *all[MAX_SETS + DS_SLURM_SETS_MAX];
    int n_all = 0;
    for (int i = 0; i < nset; i++)
        all[n_all++] = sets[i];
    if (slurm && apply_slurm(&c, path, nset, sets, all, &n_all) < 0)
        return 2;
    ds_log_setup(c.node.name, c.node.log_level, NULL);
    /* The first line, with how long ago the process was started: the
     * program's loading (shared libraries and their constructors) comes
     * before any log line. dsbench elastic times a joiner from the exec. */
    ds_info("node", "dsnode %s starting: pid %d, config %s, since_exec_s=%.2f", DS_VERSION,
            (int)getpid(), path, process_age_s());
    if (ds_cpu_mask_error())
        ds_warn("kernels", "%s", ds_cpu_mask_error());
    const int code = ds_node_run(&c, path, all, (size_t)n_all, resume, DS_RUN_PROCESS_EXITS);
    /* The process ends here, without closing the libfabric endpoint: a run
     * leaves it to the kernel (DS_RUN_PROCESS_EXITS, dsnode_abandon). fi_close on a
     * tcp;ofi_rxm endpoint into which a peer is still sending a large
     * message (a peer's last dense segment, when nodes finish together)
     * crashed libfabric 1.17 with SIGSEGV (dsbench cluster, crossover-dense
     * at 100 Mbit/s: one node in two runs). Our last frames have been
     * drained by then and the kernel flushes and closes the sockets. The
     * net's threads are still running, so the process must not go through
     * exit(): its handlers and library destructors (libfabric's among them)
     * would run under them. Flush stdio ourselves, then _exit. */
    fflush(NULL);
    _exit(code);
}

static int cmd_check_config(int argc, char **argv)
{
    const char *path;
    char *sets[MAX_SETS];
    int nset, offline = 0, slurm = 0;
    ds_conf c;
    char err[1024];
    if (argc > MAX_SETS || parse_common(argc, argv, 1, &path, sets, &nset, &offline, &slurm, NULL) < 0) {
        usage(stderr);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "dsnode check-config: FILE is required\n");
        return 2;
    }
    if (load_config(&c, path, nset, sets) < 0)
        return 2;
    if (slurm && apply_slurm(&c, path, nset, sets, NULL, NULL) < 0)
        return 2;
    if (!offline && ds_preflight_all(&c, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsnode: %s: %s\n", path, err);
        return 2;
    }
    if (ds_conf_dump(&c, stdout) < 0)
        return 1;
    char adv[DS_HOSTPORT_MAX + 1], how[96];
    if (!offline && !c.node.advertise[0] &&
        ds_preflight_advertise(&c, adv, sizeof(adv), how, sizeof(how), err, sizeof(err)) == 0 &&
        how[0])
        fprintf(stderr, "dsnode: %s: node.listen = %s is a wildcard address: peers will be "
                "told %s (%s)\n", path, c.node.listen, adv, how);
    fprintf(stderr, "dsnode: %s: valid\n", path);
    return 0;
}

static char **prog_argv; /* main's argv, for the OpenBLAS re-exec */

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    usage(stdout);
    return 0;
}

static int cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("dsnode %s\n", DS_VERSION);
    return 0;
}

static int cmd_help_config(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    ds_conf_help(stdout);
    return 0;
}

static int cmd_run_reexec(int argc, char **argv)
{
    ds_blas_reexec_if_needed(prog_argv);
    return cmd_run(argc, argv);
}

/* The subcommands; each gets its own argv (argv[0] = its name). */
static const struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
} commands[] = {
    {"--help", cmd_help},
    {"-h", cmd_help},
    {"help", cmd_help},
    {"--version", cmd_version},
    {"help-config", cmd_help_config},
    {"keygen", ds_keygen_main},
    {"check-config", cmd_check_config},
    {"run", cmd_run_reexec},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    prog_argv = argv;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsnode: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
