/*
 * tools/dsbench/bench.c: result rows and helpers shared by the commands.
 *
 * A row keeps each field as the text a Markdown table shows and, for JSON,
 * what kind of value it is. The JSON line is built with jansson from the
 * same text, so both forms carry the same rounded numbers, and every
 * string is escaped by jansson (quotes, backslashes, control characters;
 * bytes that are not UTF-8 are read as Latin-1 by ds_json_text): whatever
 * a label holds, the line is valid JSON.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/dsbench/bench.h"
#include "tools/dslaunch/dslaunch.h"

void ds_row_table(ds_row *r, int json)
{
    memset(r, 0, sizeof(*r));
    r->json = json;
    r->out = stdout;
}

static void add(ds_row *r, const char *key, const char *val, enum ds_row_kind kind, int64_t ival)
{
    if (r->n >= DS_ROW_MAX_FIELDS)
        return;
    snprintf(r->key[r->n], sizeof(r->key[0]), "%s", key);
    snprintf(r->val[r->n], sizeof(r->val[0]), "%s", val);
    r->kind[r->n] = kind;
    r->ival[r->n] = ival;
    r->n++;
}

void ds_row_str(ds_row *r, const char *key, const char *val)
{
    add(r, key, val, DS_ROW_STR, 0);
}

void ds_row_int(ds_row *r, const char *key, int64_t val)
{
    char b[32];
    snprintf(b, sizeof(b), "%lld", (long long)val);
    add(r, key, b, DS_ROW_INT, val);
}

void ds_row_num(ds_row *r, const char *key, double val, int prec)
{
    char b[64];
    if (isfinite(val))
        snprintf(b, sizeof(b), "%.*f", prec, val);
    else
        snprintf(b, sizeof(b), "null");
    add(r, key, b, DS_ROW_NUM, 0);
}

/* Field i as a JSON value (new reference; NULL when out of memory). */
static json_t *field_json(const ds_row *r, int i)
{
    switch (r->kind[i]) {
    case DS_ROW_STR:
        return ds_json_text(r->val[i]);
    case DS_ROW_INT:
        return json_integer((json_int_t)r->ival[i]);
    case DS_ROW_NUM:
    default:
        /* "%.*f" text: an integer when prec was 0, else the rounded real. */
        return strcmp(r->val[i], "null") ? ds_json_text_or_number(r->val[i]) : json_null();
    }
}

static int end_json(ds_row *r)
{
    json_t *o = json_object();
    int e = o ? 0 : -ENOMEM;
    for (int i = 0; e == 0 && i < r->n; i++)
        e = ds_json_set(o, r->key[i], field_json(r, i));
    if (e == 0)
        e = ds_json_write_line(r->out, o, 1);
    json_decref(o);
    return e;
}

static int end_markdown(ds_row *r)
{
    FILE *f = r->out;
    if (!r->header_done) {
        for (int i = 0; i < r->n; i++)
            fprintf(f, "| %s ", r->key[i]);
        fputs("|\n", f);
        for (int i = 0; i < r->n; i++)
            fputs("|---", f);
        fputs("|\n", f);
        r->header_done = 1;
    }
    for (int i = 0; i < r->n; i++)
        fprintf(f, "| %s ", r->val[i]);
    fputs("|\n", f);
    return ferror(f) ? -EIO : 0;
}

int ds_row_end(ds_row *r)
{
    int e = r->json ? end_json(r) : end_markdown(r);
    if (fflush(r->out) != 0 && e == 0)
        e = -EIO;
    r->n = 0;
    return e;
}

double ds_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *ds_bench_tools_dir(void)
{
    const char *d = getenv("DS_TOOLS_DIR");
    return d && *d ? d : DS_SOURCE_TOOLS_DIR;
}
