/* tools/dsbench/bench.c: result rows and helpers shared by the commands. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tools/dsbench/bench.h"

void ds_row_table(ds_row *r, int json)
{
    memset(r, 0, sizeof(*r));
    r->json = json;
}

static void add(ds_row *r, const char *key, const char *val, int quoted)
{
    if (r->n >= DS_ROW_MAX_FIELDS)
        return;
    snprintf(r->key[r->n], sizeof(r->key[0]), "%s", key);
    snprintf(r->val[r->n], sizeof(r->val[0]), "%s", val);
    r->quoted[r->n] = quoted;
    r->n++;
}

void ds_row_str(ds_row *r, const char *key, const char *val)
{
    add(r, key, val, 1);
}

void ds_row_int(ds_row *r, const char *key, int64_t val)
{
    char b[32];
    snprintf(b, sizeof(b), "%lld", (long long)val);
    add(r, key, b, 0);
}

void ds_row_num(ds_row *r, const char *key, double val, int prec)
{
    char b[64];
    if (isfinite(val))
        snprintf(b, sizeof(b), "%.*f", prec, val);
    else
        snprintf(b, sizeof(b), "null");
    add(r, key, b, 0);
}

void ds_row_end(ds_row *r)
{
    if (r->json) {
        fputc('{', stdout);
        for (int i = 0; i < r->n; i++) {
            printf("%s\"%s\":", i ? "," : "", r->key[i]);
            if (r->quoted[i]) {
                fputc('"', stdout);
                for (const char *p = r->val[i]; *p; p++) {
                    if (*p == '"' || *p == '\\')
                        fputc('\\', stdout);
                    fputc(*p, stdout);
                }
                fputc('"', stdout);
            } else {
                fputs(r->val[i], stdout);
            }
        }
        fputs("}\n", stdout);
    } else {
        if (!r->header_done) {
            for (int i = 0; i < r->n; i++)
                printf("| %s ", r->key[i]);
            puts("|");
            for (int i = 0; i < r->n; i++)
                printf("|---");
            puts("|");
            r->header_done = 1;
        }
        for (int i = 0; i < r->n; i++)
            printf("| %s ", r->val[i]);
        puts("|");
    }
    fflush(stdout);
    r->n = 0;
}

double ds_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int ds_bench_flag_json(const char *arg, int *json)
{
    if (!strcmp(arg, "--json")) {
        *json = 1;
        return 1;
    }
    return 0;
}

const char *ds_bench_tools_dir(void)
{
    const char *d = getenv("DS_TOOLS_DIR");
    return d && *d ? d : DS_SOURCE_TOOLS_DIR;
}
