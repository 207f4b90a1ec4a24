/*
 * node/main.c: the dsnode program.
 *
 *   dsnode run --config FILE [--set section.key=value]...
 *   dsnode check-config FILE [--set section.key=value]...
 *   dsnode keygen [--cluster] --out FILE
 *   dsnode help-config | --help | --version
 *
 * Exit status: 0 success; 1 runtime failure; 2 usage or config error;
 * 128 + signal when a run was stopped by SIGINT / SIGTERM.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "conf/conf.h"
#include "kernels/cpu.h"
#include "kernels/kernels.h"
#include "node/sec/keygen.h"
#include "base/log.h"
#include "node/runtime/run.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsnode run --config FILE [--set section.key=value]...\n"
            "       dsnode check-config FILE [--set section.key=value]...\n"
            "       dsnode keygen [--cluster] --out FILE\n"
            "       dsnode help-config    every config key, its type, default and meaning\n"
            "       dsnode --version\n");
}

/* Defaults, the file, then every --set in order, then the cross-key checks.
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
    if (ds_conf_check(c, err, sizeof(err)) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "dsnode: %s\n", err);
    return -1;
}

/* Collect --config/positional FILE and --set options. */
static int parse_common(int argc, char **argv, int positional_ok, const char **path, char **sets,
                        int *nset)
{
    *nset = 0;
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            *path = argv[++i];
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            sets[(*nset)++] = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            sets[(*nset)++] = argv[i] + 6;
        } else if (positional_ok && argv[i][0] != '-' && !*path) {
            *path = argv[i];
        } else {
            fprintf(stderr, "dsnode %s: unexpected argument '%s'\n", argv[0], argv[i]);
            return -1;
        }
    }
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    const char *path;
    char *sets[256];
    int nset;
    ds_conf c;
    if (argc > 256 || parse_common(argc, argv, 0, &path, sets, &nset) < 0) {
        usage(stderr);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "dsnode run: --config FILE is required\n");
        return 2;
    }
    if (load_config(&c, path, nset, sets) < 0)
        return 2;
    ds_log_setup(c.node.name, c.node.log_level, NULL);
    if (ds_cpu_mask_error())
        ds_warn("kernels", "%s", ds_cpu_mask_error());
    return ds_node_run(&c);
}

static int cmd_check_config(int argc, char **argv)
{
    const char *path;
    char *sets[256];
    int nset;
    ds_conf c;
    if (argc > 256 || parse_common(argc, argv, 1, &path, sets, &nset) < 0) {
        usage(stderr);
        return 2;
    }
    if (!path) {
        fprintf(stderr, "dsnode check-config: FILE is required\n");
        return 2;
    }
    if (load_config(&c, path, nset, sets) < 0)
        return 2;
    if (ds_conf_dump(&c, stdout) < 0)
        return 1;
    fprintf(stderr, "dsnode: %s: valid\n", path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("dsnode %s\n", DS_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "help-config")) {
        ds_conf_help(stdout);
        return 0;
    }
    if (!strcmp(cmd, "keygen"))
        return ds_keygen_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "check-config"))
        return cmd_check_config(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) {
        ds_blas_reexec_if_needed(argv);
        return cmd_run(argc - 1, argv + 1);
    }
    fprintf(stderr, "dsnode: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
