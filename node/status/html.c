/*
 * node/status/html.c: the page at `/`, for a person with a browser: who
 * this node is, links to /status and /metrics, and a snapshot of its own
 * view (the members and their states) and of its last completed round.
 *
 * Plain HTML written to an open_memstream stream, like prom.c; no script,
 * no style sheet, nothing loaded from elsewhere. Text from peers (names,
 * addresses, groups) is escaped as HTML; bytes that are not valid UTF-8
 * become U+FFFD.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/status/internal.h"

#define F(s) (s), sizeof(s)

static void text(FILE *f, const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = strnlen(s, max);
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        const char *ent = c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;"
                          : c == '"' ? "&quot;" : c == '\'' ? "&#39;" : NULL;
        if (ent) {
            fputs(ent, f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fputc('?', f);
            i++;
        } else {
            const size_t l = ds_status_utf8_len(u + i, n - i);
            if (l == 0) {
                fputs("\xef\xbf\xbd", f);
                i++;
            } else {
                fwrite(s + i, 1, l, f);
                i += l;
            }
        }
    }
}

static void view_part(FILE *f, const ds_status_snapshot *s)
{
    const uint32_t n = s->n_view < DS_STATUS_MAX_VIEW ? s->n_view : DS_STATUS_MAX_VIEW;
    fprintf(f, "<h2 id=\"view\">View at round %llu (epoch %llu): %u members</h2>\n",
            (unsigned long long)s->round, (unsigned long long)s->epoch, s->view_size);
    fputs("<table border=\"1\" cellpadding=\"3\">\n<tr><th>#</th><th>name</th><th>address</th>"
          "<th>group</th><th>state</th></tr>\n",
          f);
    for (uint32_t i = 0; i < n; i++) {
        const ds_status_member *m = &s->view[i];
        fprintf(f, "<tr><td>%u%s</td><td>", i, i == s->view_me ? " (me)" : "");
        text(f, F(m->name));
        fputs("</td><td>", f);
        text(f, F(m->addr));
        fputs("</td><td>", f);
        text(f, F(m->group));
        fprintf(f, "</td><td>%s</td></tr>\n", ds_status_member_state_name(m->state));
    }
    fputs("</table>\n", f);
    if (n < s->view_size)
        fprintf(f, "<p>The first %u of %u members are listed.</p>\n", n, s->view_size);
}

static void round_part(FILE *f, const ds_status_snapshot *s)
{
    const ds_status_round *r = ds_status_history_get(&s->hist, 0);
    if (!r) {
        fputs("<h2 id=\"round\">Last completed round</h2>\n<p>None yet.</p>\n", f);
        return;
    }
    fprintf(f, "<h2 id=\"round\">Last completed round: %llu</h2>\n<p>%.3f ms; %u segments; "
               "this node is %u of a view of %u.</p>\n",
            (unsigned long long)r->round, (double)r->duration_ns * 1e-6, r->n_segments, r->me,
            r->view_size);
    fputs("<table border=\"1\" cellpadding=\"3\">\n<tr><th>segment</th><th>initiated to</th>"
          "<th>outcome</th><th>bytes</th><th>answered</th></tr>\n",
          f);
    const uint32_t nl = r->n_listed < DS_STATUS_HIST_SEGMENTS ? r->n_listed
                                                              : DS_STATUS_HIST_SEGMENTS;
    for (uint32_t k = 0; k < nl; k++) {
        const ds_status_seg_done *d = &r->seg[k];
        fprintf(f, "<tr><td>%u</td><td>", k);
        const char *name = "";
        const uint32_t n = s->n_view < DS_STATUS_MAX_VIEW ? s->n_view : DS_STATUS_MAX_VIEW;
        for (uint32_t i = 0; d->target_id && i < n; i++)
            if (s->view[i].id == d->target_id)
                name = s->view[i].name;
        if (name[0])
            text(f, name, DS_STATUS_NAME_LEN);
        else if (d->target_id)
            fprintf(f, "view index %u", d->target);
        else
            fputs("-", f);
        fprintf(f, "</td><td>%s</td><td>%llu</td><td>%u</td></tr>\n",
                ds_status_outcome_name((enum ds_status_outcome)d->outcome),
                (unsigned long long)d->bytes, d->n_in);
    }
    fputs("</table>\n", f);
}

int ds_status_render_html(const ds_status_snapshot *s, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f)
        return -ENOMEM;
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>dsnode ",
          f);
    text(f, F(s->name));
    fputs("</title>\n</head>\n<body>\n<h1>dsnode ", f);
    text(f, F(s->name));
    fprintf(f, "</h1>\n<p>%s, step %lld of %lld, round %llu. Version ",
            ds_status_state_name((enum ds_status_state)s->state), (long long)s->step,
            (long long)s->steps, (unsigned long long)s->round);
    text(f, F(s->version));
    fputs(", backend ", f);
    text(f, F(s->backend));
    fputs(", topology ", f);
    text(f, F(s->topology));
    fputs(".</p>\n<ul>\n<li><a href=\"/status\">/status</a>: everything, as JSON "
          "(docs/status.md)</li>\n<li><a href=\"/metrics\">/metrics</a>: Prometheus "
          "text</li>\n<li><a href=\"#view\">this node's view</a> and its <a href=\"#round\">last "
          "completed round</a> (below; the page is a snapshot: reload for a newer one)</li>\n"
          "</ul>\n",
          f);
    view_part(f, s);
    round_part(f, s);
    fputs("</body>\n</html>\n", f);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad || !buf) {
        free(buf);
        return -ENOMEM;
    }
    *out = buf;
    *len = blen;
    return 0;
}
