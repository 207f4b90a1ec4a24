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
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/dsviz/viz.h"

#define DOT_TIMEOUT_MS 60000

static void usage(FILE *f)
{
    fputs("usage: dsviz [--out PREFIX] [--format dot|svg|html|all] [--timeout-ms N] "
          "SOURCE...\n"
          "\n"
          "Draw the cluster's topology from its nodes' status: members grouped by\n"
          "node.group, this round's exchanges per segment (edge colour = segment),\n"
          "traffic per node.\n"
          "\n"
          "  SOURCE             a status.json file; a directory (DIR/status.json and\n"
          "                     DIR/*/status.json, e.g. a dslaunch run directory); or\n"
          "                     host:port of a node's status.listen (GET /status)\n"
          "  --out PREFIX       write PREFIX.dot, PREFIX.svg, PREFIX.html (default\n"
          "                     'dsviz'); '-' writes the one --format asked for to stdout\n"
          "  --format F         dot, svg (needs Graphviz), html, or all (default; the\n"
          "                     .svg is skipped with a note when Graphviz is missing)\n"
          "  --timeout-ms N     per host:port source (default 5000)\n"
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

int main(int argc, char **argv)
{
    const char *out = "dsviz", *format = "all";
    int timeout_ms = 5000, first_src = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--out") || !strcmp(a, "--format") || !strcmp(a, "--timeout-ms")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsviz: %s needs a value\n", a);
                return 2;
            }
            const char *val = argv[++i];
            if (!strcmp(a, "--out")) {
                out = val;
            } else if (!strcmp(a, "--format")) {
                format = val;
            } else {
                char *end;
                long t = strtol(val, &end, 10);
                if (*end || t < 1 || t > 600000) {
                    fprintf(stderr, "dsviz: --timeout-ms: expected 1..600000, found '%s'\n",
                            val);
                    return 2;
                }
                timeout_ms = (int)t;
            }
            continue;
        }
        if (!strcmp(a, "--")) {
            first_src = i + 1;
            break;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dsviz: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        first_src = i;
        break;
    }
    int what;
    if (!strcmp(format, "dot"))
        what = F_DOT;
    else if (!strcmp(format, "svg"))
        what = F_SVG;
    else if (!strcmp(format, "html"))
        what = F_HTML;
    else if (!strcmp(format, "all"))
        what = F_DOT | F_SVG | F_HTML;
    else {
        fprintf(stderr, "dsviz: --format: expected dot, svg, html or all, found '%s'\n", format);
        return 2;
    }
    if (first_src < 0 || first_src >= argc) {
        fprintf(stderr, "dsviz: no SOURCE given\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(out, "-") && what == (F_DOT | F_SVG | F_HTML)) {
        fprintf(stderr, "dsviz: --out - writes one format: give --format dot, svg or html\n");
        return 2;
    }
    if (!out[0]) {
        fprintf(stderr, "dsviz: --out: empty prefix\n");
        return 2;
    }

    ds_viz v = {0};
    int status = 0;
    for (int i = first_src; i < argc; i++) {
        char err[600];
        int e = ds_viz_load(&v, argv[i], timeout_ms, err, sizeof(err));
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

    const char *dot_prog = getenv("DSVIZ_DOT");
    if (!dot_prog || !dot_prog[0])
        dot_prog = "dot";
    char *svg = NULL;
    if (what & (F_SVG | F_HTML)) {
        e = make_svg(&v, dot_prog, &svg);
        if (e < 0 && what == F_SVG)
            status = 1;
        else if (e < 0)
            fprintf(stderr, "dsviz: %sthe HTML page has dsviz's own drawing\n",
                    (what & F_SVG) ? "no .svg; " : "");
    }
    const size_t plen = strlen(out) + 8;
    char *path = malloc(plen);
    if (!path) {
        free(svg);
        ds_viz_free(&v);
        return 1;
    }
    const int to_stdout = !strcmp(out, "-");
    if (what & F_DOT) {
        snprintf(path, plen, to_stdout ? "-" : "%s.dot", out);
        if (write_to(path, &v, F_DOT, NULL) < 0)
            status = 1;
    }
    if ((what & F_SVG) && svg) {
        snprintf(path, plen, to_stdout ? "-" : "%s.svg", out);
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
    if (what & F_HTML) {
        snprintf(path, plen, to_stdout ? "-" : "%s.html", out);
        if (write_to(path, &v, F_HTML, svg) < 0)
            status = 1;
    }
    if (!to_stdout)
        fprintf(stderr, "dsviz: %zu members (%zu reporting), %zu exchanges\n", v.n_m, v.n_docs,
                v.n_e);
    free(path);
    free(svg);
    ds_viz_free(&v);
    return status;
}
