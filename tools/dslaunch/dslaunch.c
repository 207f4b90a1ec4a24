/*
 * tools/dslaunch/dslaunch.c: the dslaunch program's front door.
 *
 *   dslaunch local -n N --config base.ini [options]   a cluster on this host
 *   dslaunch --help | --version
 *
 * `hosts` and Slurm (design §9) come later; each command is a function in its
 * own file taking (argc, argv) with argv[0] the command's name, so adding
 * one is a row in the table below. dslaunch runs the `dsnode` program and
 * links nothing of node/: the contract between them is dsnode's command
 * line, its output lines and its model.bin file (docs/dslaunch.md).
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/dslaunch/dslaunch.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dslaunch local -n N --config FILE [options]   start a cluster on this host\n"
               "       dslaunch local --help                           its options\n"
               "       dslaunch hosts --hosts H1,H2,... --per-host K --config FILE [options]\n"
               "                                                       start nodes on hosts over ssh\n"
               "       dslaunch hosts --help                           its options\n"
               "       dslaunch --version\n");
}

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* Options before the command only ("+": stop at the command, whose own
     * options are its business); messages are ours (opterr = 0). */
    opterr = 0;
    for (;;) {
        const int at = optind;
        int c = getopt_long(argc, argv, "+h", options, NULL);
        if (c == -1)
            break;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'V') {
            printf("dslaunch %s\n", DS_VERSION);
            return 0;
        }
        fprintf(stderr, "dslaunch: unknown command '%s'\n", argv[at]);
        usage(stderr);
        return 2;
    }
    if (optind >= argc) { /* only "--" */
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[optind];
    if (!strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    /* Where this binary lives: the default dsnode is the one built or
     * installed beside it. */
    char self[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash)
            *slash = '\0';
    } else {
        self[0] = '\0';
    }
    if (!strcmp(cmd, "local"))
        return ds_launch_local_main(argc - optind, argv + optind, self);
    if (!strcmp(cmd, "hosts"))
        return ds_launch_hosts_main(argc - optind, argv + optind, self);
    fprintf(stderr, "dslaunch: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
