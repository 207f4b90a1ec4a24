/*
 * tools/dsviz/dsviz.c: `dsviz [--out PREFIX] [--format dot|svg|html|all]
 * [--timeout-ms N] SOURCE...` -- draw a running (or finished) cluster from
 * its nodes' status (design §9, docs/status.md).
 *
 * A SOURCE is a status.json file, a directory (its status.json and every
 * DIR/x/status.json below it: a dslaunch run directory whose nodes had
 * status.file on), or host:port (GET /status). Sources that fail are
 * reported and the rest is still drawn; the exit status is then 1.
 *
 * SVG comes from Graphviz `dot` (DSVIZ_DOT names another program). Without
 * it, --format svg fails, --format all skips the .svg with a note, and the
 * HTML page carries dsviz's own drawing instead.
 *
 * The command line is read with getopt_long (options before the sources;
 * "--opt VALUE" or "--opt=VALUE"); live pages are fetched with libcurl
 * (viz.c), whose global state main sets up once.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "tools/dsviz/viz.h"

#define DOT_TIMEOUT_MS 60000

static void usage(FILE *f)
{
    fputs("usage: dsviz [--out PREFIX] [--format dot|svg|html|all] [--timeout-ms N]\n"
          "             [--round R] [--segment S] SOURCE...\n"
          "       dsviz --serve HOST:PORT [--refresh-s N] [--history N] [--timeout-ms N]\n"
          "             SOURCE...\n"
          "\n"
          "Draw the cluster's topology from its nodes' status: members grouped by\n"
          "node.group and one completed round's exchanges per segment (edge colour =\n"
          "segment), computed from the schedule with the outcomes and bytes the\n"
          "nodes report for that round laid over them.\n"
          "\n"
          "  SOURCE             a status.json file; a directory (DIR/status.json and\n"
          "                     DIR/*/status.json, e.g. a dslaunch run directory); or\n"
          "                     host:port of a node's status.listen (GET /status)\n"
          "  --out PREFIX       write PREFIX.dot, PREFIX.svg, PREFIX.html (default\n"
          "                     'dsviz'); '-' writes the one --format asked for to stdout\n"
          "  --format F         dot, svg (needs Graphviz), html, or all (default; the\n"
          "                     .svg is skipped with a note when Graphviz is missing)\n"
          "  --timeout-ms N     per host:port source (default 5000)\n"
          "  --round R          the round to draw (default: the newest completed round\n"
          "                     every node's history holds)\n"
          "  --segment S        draw segment S only (default: every segment)\n"
          "  --serve HOST:PORT  serve a live page at http://HOST:PORT/ until SIGINT or\n"
          "                     SIGTERM: the sources are read again at each request;\n"
          "                     round slider, segment filter, traffic heatmap, membership\n"
          "  --refresh-s N      the live page reloads itself every N s (default 5; 0: never)\n"
          "  --history N        --serve keeps the newest N completed rounds of each node\n"
          "                     it has seen over its refreshes (default 1000; 1..100000)\n"
          "\n"
          "Environment: DSVIZ_DOT names the Graphviz program (default 'dot').\n"
          "Exit status: 0; 1 when a source or an output failed (what loaded is still\n"
          "drawn); 2 on a usage error.\n",
          f);
}

enum { F_DOT = 1, F_SVG = 2, F_HTML = 4 };

static int write_to(const char *path, const ds_viz *v, int what, const char *svg)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "dsviz: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    int e = what == F_DOT ? ds_viz_write_dot(v, f) : ds_viz_write_html(v, f, svg);
    if (f != stdout) {
        if (fclose(f) != 0)
            e = -EIO;
    } else if (fflush(f) != 0) {
        e = -EIO;
    }
    if (e < 0) {
        fprintf(stderr, "dsviz: writing %s failed\n", path);
        return -1;
    }
    if (f != stdout)
        fprintf(stderr, "dsviz: wrote %s\n", path);
    return 0;
}

/* SVG through Graphviz: DOT to a temporary file, dot -Tsvg, read back.
 * *svg receives the text (caller frees), or NULL with the reason printed. */
static int make_svg(const ds_viz *v, const char *dot_prog, char **svg)
{
    *svg = NULL;
    char dot_path[] = "/tmp/dsviz-XXXXXX.dot";
    char svg_path[] = "/tmp/dsviz-XXXXXX.svg";
    int fd = mkstemps(dot_path, 4);
    if (fd < 0) {
        fprintf(stderr, "dsviz: temporary file: %s\n", strerror(errno));
        return -errno;
    }
    int sfd = mkstemps(svg_path, 4);
    if (sfd < 0) {
        const int e = -errno;
        fprintf(stderr, "dsviz: temporary file: %s\n", strerror(-e));
        close(fd);
        unlink(dot_path);
        return e;
    }
    close(sfd);
    FILE *f = fdopen(fd, "w");
    int e = f ? ds_viz_write_dot(v, f) : -EIO;
    if (f && fclose(f) != 0)
        e = -EIO;
    if (!f)
        close(fd);
    if (e == 0)
        e = ds_viz_run_dot(dot_prog, dot_path, svg_path, DOT_TIMEOUT_MS);
    if (e == 0) {
        size_t len;
        e = ds_viz_read_file(svg_path, DS_VIZ_MAX_FILE * 4, svg, &len);
    }
    unlink(dot_path);
    unlink(svg_path);
    if (e == -ENOENT)
        fprintf(stderr, "dsviz: Graphviz '%s' not found (Debian: apt-get install graphviz)\n",
                dot_prog);
    else if (e == -ETIMEDOUT)
        fprintf(stderr, "dsviz: '%s' took longer than %d s\n", dot_prog, DOT_TIMEOUT_MS / 1000);
    else if (e < 0)
        fprintf(stderr, "dsviz: '%s -Tsvg' failed\n", dot_prog);
    return e;
}

/* The command line, checked. */
struct args {
    const char *out;
    int what;        /* F_* bits */
    int timeout_ms;
    int first_src;   /* argv index of the first SOURCE */
    int round_set, segment_set;
    double round;
    unsigned segment;
    const char *serve;
    int refresh_s;
    int history_set;
    unsigned history;
};

/* getopt_long over argv: options first, then SOURCE... ("+": the first
 * element that is not an option starts the sources, as "--" does, so a
 * source named like an option can follow "--"). Returns -1 to go on, or
 * the exit status (0 after --help, 2 on a usage error, said). */
static int parse_args(int argc, char **argv, struct args *a)
{
    enum { O_OUT = 256, O_FORMAT, O_TIMEOUT, O_ROUND, O_SEGMENT, O_SERVE, O_REFRESH, O_HISTORY };
    static const struct option options[] = {
        {"help", no_argument, NULL, 'h'},
        {"out", required_argument, NULL, O_OUT},
        {"format", required_argument, NULL, O_FORMAT},
        {"timeout-ms", required_argument, NULL, O_TIMEOUT},
        {"round", required_argument, NULL, O_ROUND},
        {"segment", required_argument, NULL, O_SEGMENT},
        {"serve", required_argument, NULL, O_SERVE},
        {"refresh-s", required_argument, NULL, O_REFRESH},
        {"history", required_argument, NULL, O_HISTORY},
        {NULL, 0, NULL, 0},
    };
    const char *format = "all";
    a->out = "dsviz";
    a->timeout_ms = 5000;
    a->refresh_s = 5;
    a->history = DS_VIZ_HISTORY_DEFAULT;
    opterr = 0; /* the messages are ours */
    for (;;) {
        const int at = optind; /* the element being read */
        const int c = getopt_long(argc, argv, "+:h", options, NULL);
        if (c == -1)
            break;
        char *end;
        long t;
        switch (c) {
        case 'h':
            usage(stdout);
            return 0;
        case O_OUT:
            a->out = optarg;
            break;
        case O_FORMAT:
            format = optarg;
            break;
        case O_TIMEOUT:
            t = strtol(optarg, &end, 10);
            if (*end || t < 1 || t > 600000) {
                fprintf(stderr, "dsviz: --timeout-ms: expected 1..600000, found '%s'\n", optarg);
                return 2;
            }
            a->timeout_ms = (int)t;
            break;
        case O_SERVE:
            a->serve = optarg;
            break;
        case O_REFRESH:
            t = strtol(optarg, &end, 10);
            if (!optarg[0] || *end || t < 0 || t > 3600) {
                fprintf(stderr, "dsviz: --refresh-s: expected 0..3600, found '%s'\n", optarg);
                return 2;
            }
            a->refresh_s = (int)t;
            break;
        case O_HISTORY:
            t = strtol(optarg, &end, 10);
            if (!optarg[0] || *end || t < 1 || t > DS_VIZ_HISTORY_MAX) {
                fprintf(stderr, "dsviz: --history: expected a number of rounds 1..%d, found '%s'\n",
                        DS_VIZ_HISTORY_MAX, optarg);
                return 2;
            }
            a->history_set = 1;
            a->history = (unsigned)t;
            break;
        case O_ROUND:
        case O_SEGMENT: {
            errno = 0;
            const unsigned long long u = strtoull(optarg, &end, 10);
            if (!optarg[0] || *end || optarg[0] == '-' || errno ||
                (c == O_SEGMENT && u > 65535) || (c == O_ROUND && u > (1ull << 53))) {
                fprintf(stderr, "dsviz: %s: expected 0..%s, found '%s'\n",
                        c == O_ROUND ? "--round" : "--segment",
                        c == O_ROUND ? "2^53" : "65535", optarg);
                return 2;
            }
            if (c == O_ROUND) {
                a->round_set = 1;
                a->round = (double)u;
            } else {
                a->segment_set = 1;
                a->segment = (unsigned)u;
            }
            break;
        }
        case ':':
            fprintf(stderr, "dsviz: %s needs a value\n", argv[at]);
            return 2;
        default:
            fprintf(stderr, "dsviz: unknown option '%s'\n", argv[at]);
            usage(stderr);
            return 2;
        }
    }
    a->first_src = optind;
    if (!strcmp(format, "dot"))
        a->what = F_DOT;
    else if (!strcmp(format, "svg"))
        a->what = F_SVG;
    else if (!strcmp(format, "html"))
        a->what = F_HTML;
    else if (!strcmp(format, "all"))
        a->what = F_DOT | F_SVG | F_HTML;
    else {
        fprintf(stderr, "dsviz: --format: expected dot, svg, html or all, found '%s'\n", format);
        return 2;
    }
    if (a->first_src >= argc) {
        fprintf(stderr, "dsviz: no SOURCE given\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(a->out, "-") && a->what == (F_DOT | F_SVG | F_HTML)) {
        fprintf(stderr, "dsviz: --out - writes one format: give --format dot, svg or html\n");
        return 2;
    }
    if (a->history_set && !a->serve) {
        fprintf(stderr, "dsviz: --history is for --serve (a drawing shows the documents' own "
                        "history)\n");
        return 2;
    }
    if (!a->out[0]) {
        fprintf(stderr, "dsviz: --out: empty prefix\n");
        return 2;
    }
    return -1;
}

/* Write what a->what asks for (svg: Graphviz's drawing, or NULL). 0, or 1
 * when an output failed (said). */
static int write_outputs(const struct args *a, const ds_viz *v, const char *svg)
{
    int status = 0;
    const size_t plen = strlen(a->out) + 8;
    char *path = malloc(plen);
    if (!path)
        return 1;
    const int to_stdout = !strcmp(a->out, "-");
    if (a->what & F_DOT) {
        snprintf(path, plen, to_stdout ? "-" : "%s.dot", a->out);
        if (write_to(path, v, F_DOT, NULL) < 0)
            status = 1;
    }
    if ((a->what & F_SVG) && svg) {
        snprintf(path, plen, to_stdout ? "-" : "%s.svg", a->out);
        FILE *f = to_stdout ? stdout : fopen(path, "w");
        int bad = !f;
        if (f) {
            bad = fputs(svg, f) < 0;
            bad = (f != stdout ? fclose(f) : fflush(f)) != 0 || bad;
        }
        if (bad) {
            fprintf(stderr, "dsviz: cannot write %s: %s\n", path, strerror(errno));
            status = 1;
        } else if (!to_stdout) {
            fprintf(stderr, "dsviz: wrote %s\n", path);
        }
    }
    if (a->what & F_HTML) {
        snprintf(path, plen, to_stdout ? "-" : "%s.html", a->out);
        if (write_to(path, v, F_HTML, svg) < 0)
            status = 1;
    }
    free(path);
    return status;
}

/* Everything after the command line; the exit status. */
static int draw(const struct args *a, int argc, char **argv)
{
    ds_viz v = {0};
    v.round_set = a->round_set;
    v.want_round = a->round;
    v.segment_set = a->segment_set;
    v.want_segment = a->segment;
    int status = 0;
    for (int i = a->first_src; i < argc; i++) {
        char err[600];
        int e = ds_viz_load(&v, argv[i], a->timeout_ms, err, sizeof(err));
        if (e < 0) {
            fprintf(stderr, "dsviz: %s\n", err);
            status = 1;
        }
    }
    if (v.n_docs == 0) {
        fprintf(stderr, "dsviz: no status document loaded: nothing to draw\n");
        ds_viz_free(&v);
        return 1;
    }
    int e = ds_viz_build(&v);
    if (e < 0) {
        fprintf(stderr, "dsviz: %s\n", e == -E2BIG ? "too many members or exchanges"
                                                  : "out of memory");
        ds_viz_free(&v);
        return 1;
    }
    if (v.from_schedule && v.n_e == 0)
        fprintf(stderr, "dsviz: round %.0f: no node's history holds it (rounds %.0f..%.0f)\n",
                v.round, v.rounds_min, v.rounds_max);
    if (v.n_mismatch)
        fprintf(stderr,
                "dsviz: round %.0f: %zu exchanges reported a target other than the schedule's\n",
                v.round, v.n_mismatch);
    const char *dot_prog = getenv("DSVIZ_DOT");
    if (!dot_prog || !dot_prog[0])
        dot_prog = "dot";
    char *svg = NULL;
    if (a->what & (F_SVG | F_HTML)) {
        e = make_svg(&v, dot_prog, &svg);
        if (e < 0 && a->what == F_SVG)
            status = 1;
        else if (e < 0)
            fprintf(stderr, "dsviz: %sthe HTML page has dsviz's own drawing\n",
                    (a->what & F_SVG) ? "no .svg; " : "");
    }
    if (write_outputs(a, &v, svg) != 0)
        status = 1;
    if (strcmp(a->out, "-"))
        fprintf(stderr, "dsviz: %zu members (%zu reporting), %zu exchanges\n", v.n_m, v.n_docs,
                v.n_e);
    free(svg);
    ds_viz_free(&v);
    return status;
}

/* dsviz --serve: until SIGINT or SIGTERM. */
static int serve(const struct args *a, int argc, char **argv)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before the server's thread */
    ds_viz_server *s = NULL;
    char err[600];
    if (ds_viz_serve_start(&s, a->serve, argv + a->first_src, argc - a->first_src,
                           a->timeout_ms, a->refresh_s, a->history, err, sizeof(err)) < 0) {
        fprintf(stderr, "dsviz: %s\n", err);
        return 1;
    }
    char addr[80];
    if (ds_viz_serve_addr(s, addr, sizeof(addr)) == 0)
        fprintf(stderr, "dsviz: serving http://%s/\n", addr);
    int sig = 0;
    sigwait(&set, &sig);
    ds_viz_serve_stop(&s);
    return 0;
}

int main(int argc, char **argv)
{
    struct args a;
    const int st = parse_args(argc, argv, &a);
    if (st >= 0)
        return st;
    /* Once, before any thread: libcurl's global state for the live pages. */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "dsviz: cannot initialise libcurl\n");
        return 1;
    }
    const int status = a.serve ? serve(&a, argc, argv) : draw(&a, argc, argv);
    curl_global_cleanup();
    return status;
}
