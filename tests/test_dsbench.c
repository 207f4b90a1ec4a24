/*
 * tests/test_dsbench.c: dsbench's result rows (tools/dsbench/bench.c), the
 * part every benchmark command prints through.
 *
 * Suite "dsbench_rows" (meson suite unit). A row with labels holding every
 * kind of byte that JSON must escape (quotes, backslashes, every control
 * character, DEL, bytes that are not UTF-8) must come out as one line that
 * a strict reader (jansson) parses back to the same text; numbers keep the
 * rounding the Markdown table shows; the Markdown form prints its header
 * once per table.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tools/dsbench/bench.h"

TestSuite(dsbench_rows, .timeout = 30);

/* Run fill(r) on a row of the given mode printing into memory; returns the
 * text (caller frees). */
static char *print_rows(int json, void (*fill)(ds_row *r))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    ds_row r;
    ds_row_table(&r, json);
    cr_assert_eq(r.out, stdout, "rows go to stdout by default");
    r.out = f;
    fill(&r);
    cr_assert_eq(fclose(f), 0);
    return buf;
}

/* Every control character 0x01..0x1f, DEL, quote, backslash, a lone
 * continuation byte and a valid two-byte character. */
static char hostile[64];

static void make_hostile(void)
{
    size_t k = 0;
    for (int c = 1; c < 0x20; c++)
        hostile[k++] = (char)c;
    hostile[k++] = 0x7f;
    hostile[k++] = '"';
    hostile[k++] = '\\';
    hostile[k++] = (char)0x80;
    hostile[k++] = (char)0xc3;
    hostile[k++] = (char)0xa9;
    hostile[k] = '\0';
}

static void fill_one(ds_row *r)
{
    ds_row_str(r, "label", hostile);
    ds_row_str(r, "plain", "cpu-avx512");
    ds_row_int(r, "steps", -3000);
    ds_row_num(r, "samples_per_s", 12345.678, 0);
    ds_row_num(r, "test_acc", 0.87125, 4);
    ds_row_num(r, "speedup", NAN, 2);
    cr_assert_eq(ds_row_end(r), 0);
}

Test(dsbench_rows, json_escapes_every_byte)
{
    make_hostile();
    char *text = print_rows(1, fill_one);
    /* One line, ASCII only. */
    const size_t len = strlen(text);
    cr_assert_gt(len, 1);
    cr_expect_eq(text[len - 1], '\n');
    cr_expect_null(memchr(text, '\n', len - 1), "more than one line: %s", text);
    for (size_t i = 0; i < len - 1; i++)
        cr_expect((unsigned char)text[i] >= 0x20 && (unsigned char)text[i] < 0x80,
                  "byte 0x%02x at %zu is not printable ASCII", (unsigned char)text[i], i);

    json_error_t err;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &err);
    cr_assert_not_null(o, "not valid JSON (%d:%d %s): %s", err.line, err.column, err.text, text);
    cr_assert(json_is_object(o));
    cr_expect_eq(json_object_size(o), 6);
    /* The label reads back as written, except the bytes that are not
     * UTF-8: the lone 0x80 is read as Latin-1, so the whole label is. */
    const char *label = json_string_value(json_object_get(o, "label"));
    cr_assert_not_null(label);
    cr_expect_eq(memcmp(label, hostile, 0x1f + 3), 0, "control bytes, DEL, quote, backslash");
    cr_expect_str_eq(label + 0x1f + 3, "\xc2\x80\xc3\x83\xc2\xa9");
    cr_expect_str_eq(json_string_value(json_object_get(o, "plain")), "cpu-avx512");
    cr_expect(json_is_integer(json_object_get(o, "steps")));
    cr_expect_eq(json_integer_value(json_object_get(o, "steps")), -3000);
    /* prec 0: an integer, rounded as the table shows it. */
    cr_expect(json_is_integer(json_object_get(o, "samples_per_s")));
    cr_expect_eq(json_integer_value(json_object_get(o, "samples_per_s")), 12346);
    cr_expect(json_is_real(json_object_get(o, "test_acc")));
    cr_expect_eq(json_real_value(json_object_get(o, "test_acc")), 0.8712);
    cr_expect(json_is_null(json_object_get(o, "speedup")));
    /* Keys in the order given, compact as before jansson. */
    cr_expect_eq(strncmp(text, "{\"label\":\"\\u0001", 16), 0, "%s", text);
    cr_expect_not_null(strstr(text, ",\"plain\":\"cpu-avx512\",\"steps\":-3000,"
                                    "\"samples_per_s\":12346,\"test_acc\":0.8712,"
                                    "\"speedup\":null}\n"),
                       "%s", text);
    json_decref(o);
    free(text);
}

static void fill_two(ds_row *r)
{
    for (int i = 0; i < 2; i++) {
        ds_row_str(r, "impl", i ? "torch" : "dsnode");
        ds_row_num(r, "acc", 0.5 + i * 0.25, 2);
        ds_row_num(r, "x", INFINITY, 1);
        cr_assert_eq(ds_row_end(r), 0);
    }
}

Test(dsbench_rows, json_lines_and_markdown)
{
    char *text = print_rows(1, fill_two);
    cr_expect_str_eq(text, "{\"impl\":\"dsnode\",\"acc\":0.5,\"x\":null}\n"
                           "{\"impl\":\"torch\",\"acc\":0.75,\"x\":null}\n");
    free(text);
    text = print_rows(0, fill_two);
    cr_expect_str_eq(text, "| impl | acc | x |\n|---|---|---|\n| dsnode | 0.50 | null |\n"
                           "| torch | 0.75 | null |\n");
    free(text);
}

static void fill_many(ds_row *r)
{
    char key[16];
    for (int i = 0; i < DS_ROW_MAX_FIELDS + 3; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        ds_row_int(r, key, i);
    }
    cr_assert_eq(ds_row_end(r), 0);
}

/* Fields past the limit are dropped, not written past the arrays. */
Test(dsbench_rows, fields_past_the_limit_are_dropped)
{
    char *text = print_rows(1, fill_many);
    json_error_t err;
    json_t *o = json_loads(text, 0, &err);
    cr_assert_not_null(o, "%s", err.text);
    cr_expect_eq(json_object_size(o), DS_ROW_MAX_FIELDS);
    cr_expect_null(json_object_get(o, "k32"));
    json_decref(o);
    free(text);
}
