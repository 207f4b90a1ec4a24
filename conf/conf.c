/*
 * conf/conf.c: the configuration loader, validator, dumper and help text.
 *
 * One table drives everything. conf/keys.h is expanded into keys[], one
 * row per key holding its section, name, type, where it lives in ds_conf,
 * its default (as text), its constraint and its help. The ini handler looks
 * the key up in that table and calls parse_value(); ds_conf_defaults() runs
 * every default text through the same parse_value(); ds_conf_check()
 * validates a struct by formatting each field and parsing it back; the dump
 * and the help print the table. So a constraint is written once and the
 * parser, the validator, the dump and the --help text cannot disagree.
 *
 * Enum keys. keys.h names each enum key's choice list, the X-macro that the
 * module consuming the key generates its enum and names from (see
 * conf/choices.h for where each list lives). The table takes the key's
 * (value, name) pairs from that list, so conf accepts exactly the names the
 * module knows, stores the module's own enum value, and prints the names
 * in the list's order in the help and in "expected one of a|b|c". Only the
 * lists are used: conf/ links none of those modules.
 *
 * Parsing a file. inih does the ini grammar (sections, "key = value" and
 * "key: value", ';'/'#' comment lines, ';' inline comments after a blank,
 * the UTF-8 BOM). We read the whole file into memory first (bounded by
 * DS_CONF_FILE_MAX) and hand it to inih line by line through our own reader,
 * which does four things inih cannot:
 *   - it counts lines, so the handler knows the line of every key (Debian's
 *     libinih is built without INI_HANDLER_LINENO);
 *   - it refuses lines longer than DS_CONF_LINE_MAX and NUL bytes, instead
 *     of letting inih split a long line into two silently;
 *   - it strips leading blanks, so an indented "key = value" is a key and
 *     not a continuation of the previous value (multi-line values would make
 *     "seeds =" followed by an indented key a single, surprising value);
 *   - it checks section headers when it reads them, so "[trian]" is
 *     reported on its own line even when no key follows.
 * Debian's inih exposes its compile-time options as variables (ini_max_line,
 * ini_stop_on_first_error, ...). When meson finds them we set them for the
 * parse: a heap line buffer that grows to our line limit, stop at the first
 * error. Without them inih's fixed line buffer (INI_MAX_LINE) is the limit,
 * and we stop reading after our first error ourselves.
 *
 * Errors. Loading stops at the first error, which is either one we found
 * (unknown section, unknown or duplicate key, bad value) or an inih syntax
 * error; whichever comes first in the file is reported. The file is loaded
 * into a copy of the caller's struct, committed only when all of it is good.
 * Text quoted from the input is escaped (control characters as \xNN) and cut
 * to QUOTE_MAX characters, so one error is always one readable line.
 *
 * Paths. keys.h marks the path keys (PATH, PATH_OR_EMPTY). Once a file
 * has loaded, the relative values it wrote for them are joined to the
 * file's directory (realpath of it); ds_conf_resolve_paths joins what is
 * left relative (defaults, --set) to the working directory. The joined
 * text goes through parse_value like any value, so it must fit the key.
 * The config file itself is opened with base/file.h: never blocking, a
 * regular file only.
 *
 * Empty values. "key =" is an error ("empty value") unless an empty value
 * means something for that key: the str keys documented as "empty = off"
 * (check ANY, NAME_OR_EMPTY, HOSTPORT_OR_EMPTY) and lists that may have no
 * items. That keeps "lr =" from silently meaning anything, and lets the dump
 * write "group =" for an empty group and load it back.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "base/file.h"
#include "base/hostport.h"
#include "base/layerspec.h"
#include "conf/conf.h"

#ifndef DS_INIH_RUNTIME_OPTIONS
#define DS_INIH_RUNTIME_OPTIONS 0
#endif

/* Characters of input text shown in an error before it is cut with "...". */
#define QUOTE_MAX 64
/* Longest name (node.name, node.group, cluster.id). */
#define NAME_MAX_LEN 63

enum ktype { T_STR, T_INT, T_FLOAT, T_BOOL, T_ENUM, T_ILIST, T_SLIST };

static const char *const type_names[] = {"str", "int", "float", "bool", "enum",
                                         "int list", "str list"};

/* What a str value (or a str list item) must look like beyond "text". */
enum kcheck {
    CHK_ANY,               /* any text, empty included */
    CHK_NONEMPTY,          /* any non-empty text */
    CHK_NAME,              /* 1..63 of [A-Za-z0-9_.-] */
    CHK_NAME_OR_EMPTY,     /* "" or a NAME */
    CHK_HOSTPORT,          /* ds_hostport_parse() accepts it, port >= 1 */
    CHK_HOSTPORT_OR_EMPTY, /* "" or a HOSTPORT */
    CHK_PATH,              /* a non-empty path, resolved when loaded */
    CHK_PATH_OR_EMPTY,     /* "" (off) or a PATH */
    CHK_LAYERS_OR_EMPTY,   /* "" or a layer list (base/layerspec.h) that
                            * fits the Fashion-MNIST image */
    CHK_DEVICE,            /* "auto" or a device index 0..DS_CONF_DEVICE_MAX */
};

/* One choice of an enum key: its value and its name. */
typedef struct choice {
    int value;
    const char *name;
} choice;

typedef struct kdesc {
    const char *section;
    const char *name;
    const char *def;
    const char *help;
    enum ktype type;
    size_t off;       /* offsetof(ds_conf, section.key) */
    size_t count_off; /* lists: offsetof(ds_conf, section.key_count) */
    size_t size;      /* str/enum: bytes of the field */
    enum kcheck check;
    int64_t imin, imax;    /* int, int list items */
    double fmin, fmax;     /* float; fmax == DBL_MAX: no upper bound */
    const char *bounds;    /* float: "[]", "(]", "[)" or "()" */
    int cmin, cmax;        /* lists: item count */
    const choice *choices; /* enum: the key's list, in its order */
    size_t n_choices;
} kdesc;

#define KEY_ROW_(sec, key, def_, help_, ...) \
    {.section = #sec, .name = #key, .def = def_, .help = help_, \
     .off = offsetof(ds_conf, sec.key), __VA_ARGS__},
#define ENTRY_STR(sec, key, def, chk, help) \
    KEY_ROW_(sec, key, def, help, .type = T_STR, .size = sizeof(((ds_conf *)0)->sec.key), \
             .check = CHK_##chk)
#define ENTRY_INT(sec, key, def, lo, hi, help) \
    KEY_ROW_(sec, key, def, help, .type = T_INT, .imin = (lo), .imax = (hi))
#define ENTRY_FLOAT(sec, key, def, lo, hi, bnd, help) \
    KEY_ROW_(sec, key, def, help, .type = T_FLOAT, .fmin = (lo), .fmax = (hi), .bounds = bnd)
#define ENTRY_BOOL(sec, key, def, help) KEY_ROW_(sec, key, def, help, .type = T_BOOL)
#define ENTRY_ENUM(sec, key, def, etype, list, help) \
    KEY_ROW_(sec, key, def, help, .type = T_ENUM, .size = sizeof(((ds_conf *)0)->sec.key), \
             .choices = choices_##sec##_##key, \
             .n_choices = sizeof(choices_##sec##_##key) / sizeof(choice))
#define ENTRY_ILIST(sec, key, def, lo, hi, clo, chi, help) \
    KEY_ROW_(sec, key, def, help, .type = T_ILIST, .count_off = offsetof(ds_conf, sec.key##_count), \
             .imin = (lo), .imax = (hi), .cmin = (clo), .cmax = (chi))
#define ENTRY_SLIST(sec, key, def, chk, cl, chi, help) \
    KEY_ROW_(sec, key, def, help, .type = T_SLIST, .count_off = offsetof(ds_conf, sec.key##_count), \
             .size = DS_CONF_STR_MAX, .check = CHK_##chk, .cmin = (cl), .cmax = (chi))
#define ENTRY_(type, sec, key, def, ...) ENTRY_##type(sec, key, def, __VA_ARGS__)
#define SECTION_KEYS_(sec, X) DS_CONF_KEYS_##sec(X)
#define SECTION_NAME_(sec, X) #sec,

/* Each enum key's choices, choices_<section>_<key>[], from its list. */
#define CHOICE_ROW_(e, v, name) {(int)(e), name},
#define CHOICES_STR(sec, key, def, chk, help)
#define CHOICES_INT(sec, key, def, lo, hi, help)
#define CHOICES_FLOAT(sec, key, def, lo, hi, bnd, help)
#define CHOICES_BOOL(sec, key, def, help)
#define CHOICES_ENUM(sec, key, def, etype, list, help) \
    static const choice choices_##sec##_##key[] = {list(CHOICE_ROW_)};
#define CHOICES_ILIST(sec, key, def, lo, hi, clo, chi, help)
#define CHOICES_SLIST(sec, key, def, chk, clo, chi, help)
#define CHOICES_(type, sec, key, def, ...) CHOICES_##type(sec, key, def, __VA_ARGS__)
DS_CONF_SECTIONS(SECTION_KEYS_, CHOICES_)

static const kdesc keys[] = {DS_CONF_SECTIONS(SECTION_KEYS_, ENTRY_)};
static const char *const sections[] = {DS_CONF_SECTIONS(SECTION_NAME_, ~)};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))
#define NSECTIONS (sizeof(sections) / sizeof(sections[0]))

/* What the compiler can check about the list itself. (Defaults are checked
 * by ds_conf_defaults(), which aborts on a bad one; every test run starts
 * with it. An enum value is stored as an int, hence the size check.) */
#define ASSERT_STR(sec, key, def, chk, help)
#define ASSERT_INT(sec, key, def, lo, hi, help) \
    _Static_assert((lo) <= (hi), #sec "." #key ": min > max");
#define ASSERT_FLOAT(sec, key, def, lo, hi, bnd, help)
#define ASSERT_BOOL(sec, key, def, help)
#define ASSERT_ENUM(sec, key, def, etype, list, help) \
    _Static_assert(sizeof(((ds_conf *)0)->sec.key) == sizeof(int), \
                   #sec "." #key ": the enum is not int-sized");
#define ASSERT_ILIST(sec, key, def, lo, hi, clo, chi, help) \
    _Static_assert((lo) <= (hi) && 0 <= (clo) && (clo) <= (chi) && (chi) <= DS_CONF_LIST_MAX, \
                   #sec "." #key ": bad bounds");
#define ASSERT_SLIST(sec, key, def, chk, clo, chi, help) \
    _Static_assert(0 <= (clo) && (clo) <= (chi) && (chi) <= DS_CONF_LIST_MAX, \
                   #sec "." #key ": bad count bounds");
#define ASSERT_(type, sec, key, def, ...) ASSERT_##type(sec, key, def, __VA_ARGS__)
DS_CONF_SECTIONS(SECTION_KEYS_, ASSERT_)

/* ---- error text --------------------------------------------------------- */

/* Where the text being parsed came from: a file line or a --set argument. */
typedef struct where {
    const char *file; /* file path, or NULL */
    int line;
    const char *set;  /* the --set assignment, or NULL */
} where;

/* Copy s[0..n) into dst so it can be shown between quotes on one line:
 * control characters, backslash and the quote become escapes; input is cut
 * with "..." after max characters. */
static void quote_max(char *dst, size_t dst_len, const char *s, size_t n, size_t max)
{
    size_t o = 0;
    if (dst_len == 0)
        return;
    for (size_t i = 0; i < n && o + 5 < dst_len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (i == max) {
            o += (size_t)snprintf(dst + o, dst_len - o, "...");
            break;
        }
        if (ch < 0x20 || ch == 0x7f)
            o += (size_t)snprintf(dst + o, dst_len - o, "\\x%02x", ch);
        else if (ch == '\\' || ch == '\'')
            o += (size_t)snprintf(dst + o, dst_len - o, "\\%c", ch);
        else
            dst[o++] = (char)ch;
    }
    dst[o < dst_len ? o : dst_len - 1] = '\0';
}

/* Quoted input text: QUOTE_MAX characters at most. dst: QUOTE_BUF bytes. */
#define QUOTE_BUF (4 * QUOTE_MAX + 16)
static void quote(char *dst, size_t dst_len, const char *s, size_t n)
{
    quote_max(dst, dst_len, s, n, QUOTE_MAX);
}

/* Write "<where>: <message>" into err; returns -EINVAL so callers can
 * "return fail(...)". */
__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t err_len, const where *w, const char *fmt, ...)
{
    /* A path is the user's own words: escaped, but cut only when absurd. */
    char q[4 * DS_CONF_STR_MAX + 16];
    char prefix[sizeof(q) + 32] = "";
    if (!err || err_len == 0)
        return -EINVAL;
    if (w && w->file) {
        quote_max(q, sizeof(q), w->file, strlen(w->file), DS_CONF_STR_MAX);
        if (w->line > 0)
            snprintf(prefix, sizeof(prefix), "%s:%d: ", q, w->line);
        else
            snprintf(prefix, sizeof(prefix), "%s: ", q);
    } else if (w && w->set) {
        quote(q, sizeof(q), w->set, strlen(w->set));
        snprintf(prefix, sizeof(prefix), "--set %s: ", q);
    }
    size_t o = (size_t)snprintf(err, err_len, "%s", prefix);
    if (o < err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + o, err_len - o, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* ---- small helpers ------------------------------------------------------ */

static bool is_blank(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\f' || ch == '\v';
}

/* Trim blanks from both ends of s[0..*n): returns the new start. */
static const char *trim(const char *s, size_t *n)
{
    while (*n && is_blank(s[0]))
        s++, (*n)--;
    while (*n && is_blank(s[*n - 1]))
        (*n)--;
    return s;
}

static bool ieq(const char *a, const char *b, size_t bn)
{
    return strlen(a) == bn && strncasecmp(a, b, bn) == 0;
}

/* Optimal string alignment distance (edits: insert, delete, substitute,
 * swap two neighbours), case-insensitive; 99 for strings too long to care. */
static int edit_distance(const char *a, const char *b)
{
    enum { M = 48 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= M || m >= M)
        return 99;
    int d[M][M];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 &&
                tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == tolower((unsigned char)b[j - 1]) &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[n][m];
}

/* A suggestion is worth making within 2 edits, and only when fewer edits
 * than the typed word has characters ("x" is not a typo of "lr"). */
static bool close_enough(const char *typed, int dist)
{
    return dist <= 2 && (size_t)dist < strlen(typed);
}

static int find_section(const char *s)
{
    for (size_t i = 0; i < NSECTIONS; i++)
        if (!strcmp(sections[i], s))
            return (int)i;
    return -1;
}

static int find_key(const char *section, const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name))
            return (int)i;
    return -1;
}

/* The single key named name in any section, or -1 (none, or several). */
static int find_key_any_section(const char *name)
{
    int found = -1;
    for (size_t i = 0; i < NKEYS; i++) {
        if (!strcmp(keys[i].name, name)) {
            if (found >= 0)
                return -1;
            found = (int)i;
        }
    }
    return found;
}

/* "; did you mean [train]?" for an unknown section, or "". */
static void suggest_section(char *out, size_t out_len, const char *typed)
{
    char t[DS_CONF_STR_MAX];
    size_t n = strlen(typed);
    const char *s = trim(typed, &n);
    int best = -1, best_d = 99;
    out[0] = '\0';
    snprintf(t, sizeof(t), "%.*s", (int)n, s);
    for (size_t i = 0; i < NSECTIONS; i++) {
        int d = edit_distance(t, sections[i]);
        if (d < best_d)
            best = (int)i, best_d = d;
    }
    if (best >= 0 && (best_d == 0 || close_enough(t, best_d)))
        snprintf(out, out_len, "; did you mean [%s]?", sections[best]);
}

/* "; did you mean 'lr'?" for an unknown key of a known section, or, when
 * nothing there is close but the key exists in exactly one other section,
 * "; 'method' is in [sparsify]". */
static void suggest_key(char *out, size_t out_len, const char *section, const char *typed)
{
    int best = -1, best_d = 99;
    out[0] = '\0';
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(keys[i].section, section))
            continue;
        int d = edit_distance(typed, keys[i].name);
        if (d < best_d)
            best = (int)i, best_d = d;
    }
    if (best >= 0 && close_enough(typed, best_d)) {
        snprintf(out, out_len, "; did you mean '%s'?", keys[best].name);
        return;
    }
    int other = find_key_any_section(typed);
    if (other >= 0)
        snprintf(out, out_len, "; '%s' is in [%s]", keys[other].name, keys[other].section);
}

/* ---- describing constraints --------------------------------------------- */

/* Shortest decimal text that strtod() turns back into exactly v; whole
 * numbers of a sane size without an exponent ("10", not "1e+01"). */
static void format_double(double v, char *out, size_t n)
{
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(out, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}


static void describe_str_check(enum kcheck chk, char *out, size_t n)
{
    static const char *const d[] = {
        [CHK_ANY] = "text",
        [CHK_NONEMPTY] = "non-empty text",
        [CHK_NAME] = "a name of 1..63 characters from A-Z a-z 0-9 _ . -",
        [CHK_NAME_OR_EMPTY] = "empty or a name of 1..63 characters from A-Z a-z 0-9 _ . -",
        [CHK_HOSTPORT] = "host:port (IPv4 address, [IPv6] address or hostname; port 1..65535)",
        [CHK_HOSTPORT_OR_EMPTY] = "empty or host:port (IPv4 address, [IPv6] address or hostname; port 1..65535)",
        [CHK_PATH] = "a non-empty path",
        [CHK_PATH_OR_EMPTY] = "empty or a path",
        [CHK_LAYERS_OR_EMPTY] = "empty or a layer list",
        [CHK_DEVICE] = "auto or a device index in 0..1023",
    };
    snprintf(out, n, "%s", d[chk]);
}

static void describe_int_range(const kdesc *k, char *out, size_t n)
{
    if (k->imax == INT64_MAX)
        snprintf(out, n, ">= %" PRId64, k->imin);
    else
        snprintf(out, n, "in %" PRId64 "..%" PRId64, k->imin, k->imax);
}

static void describe_float_range(const kdesc *k, char *out, size_t n)
{
    bool lo_open = k->bounds[0] == '(', hi_open = k->bounds[1] == ')';
    char lo[32], hi[32];
    format_double(k->fmin, lo, sizeof(lo));
    format_double(k->fmax, hi, sizeof(hi));
    if (k->fmax == DBL_MAX)
        snprintf(out, n, "%s %s", lo_open ? ">" : ">=", lo);
    else
        snprintf(out, n, "in %c%s, %s%c", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']');
}

/* The names of enum key k in its list's order, "a|b|c". */
static void join_choices(const kdesc *k, char *out, size_t n)
{
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < k->n_choices && o < n; i++)
        o += (size_t)snprintf(out + o, n - o, "%s%s", i ? "|" : "", k->choices[i].name);
}

/* The <what> of "expected <what>": the whole constraint of the key. */
static void describe(const kdesc *k, char *out, size_t n)
{
    char r[128];
    switch (k->type) {
    case T_STR:
        describe_str_check(k->check, out, n);
        break;
    case T_INT:
        describe_int_range(k, r, sizeof(r));
        snprintf(out, n, "an integer %s", r);
        break;
    case T_FLOAT:
        describe_float_range(k, r, sizeof(r));
        snprintf(out, n, "a number %s", r);
        break;
    case T_BOOL:
        snprintf(out, n, "a boolean (true/false, yes/no, on/off, 1/0)");
        break;
    case T_ENUM: {
        size_t o = (size_t)snprintf(out, n, "one of ");
        if (o < n)
            join_choices(k, out + o, n - o);
        break;
    }
    case T_ILIST:
        describe_int_range(k, r, sizeof(r));
        snprintf(out, n, "%d..%d comma-separated integers %s", k->cmin, k->cmax, r);
        break;
    case T_SLIST:
        describe_str_check(k->check, r, sizeof(r));
        snprintf(out, n, "%d..%d comma-separated items, each %s", k->cmin, k->cmax, r);
        break;
    }
}

/* The str checks, short, for the help's constraint column. */
static void constraint_str_check(enum kcheck chk, char *out, size_t n)
{
    static const char *const d[] = {
        [CHK_ANY] = "any text",
        [CHK_NONEMPTY] = "non-empty",
        [CHK_NAME] = "[A-Za-z0-9_.-]{1,63}",
        [CHK_NAME_OR_EMPTY] = "empty or [A-Za-z0-9_.-]{1,63}",
        [CHK_HOSTPORT] = "host:port",
        [CHK_HOSTPORT_OR_EMPTY] = "empty or host:port",
        [CHK_PATH] = "path",
        [CHK_PATH_OR_EMPTY] = "empty or path",
        [CHK_LAYERS_OR_EMPTY] = "empty or layer list",
        [CHK_DEVICE] = "auto|0..1023",
    };
    snprintf(out, n, "%s", d[chk]);
}

/* The short constraint column of the help. */
static void constraint(const kdesc *k, char *out, size_t n)
{
    char r[128];
    switch (k->type) {
    case T_STR:
        constraint_str_check(k->check, out, n);
        break;
    case T_INT:
        describe_int_range(k, out, n);
        break;
    case T_FLOAT:
        describe_float_range(k, out, n);
        break;
    case T_BOOL:
        snprintf(out, n, "true|false");
        break;
    case T_ENUM:
        join_choices(k, out, n);
        break;
    case T_ILIST:
        describe_int_range(k, r, sizeof(r));
        snprintf(out, n, "%d..%d items, each %s", k->cmin, k->cmax, r);
        break;
    case T_SLIST:
        constraint_str_check(k->check, r, sizeof(r));
        snprintf(out, n, "%d..%d items, each %s", k->cmin, k->cmax, r);
        break;
    }
}

/* ---- parsing one value -------------------------------------------------- */

static bool empty_ok(const kdesc *k)
{
    switch (k->type) {
    case T_STR:
        return k->check == CHK_ANY || k->check == CHK_NAME_OR_EMPTY ||
               k->check == CHK_HOSTPORT_OR_EMPTY || k->check == CHK_PATH_OR_EMPTY ||
               k->check == CHK_LAYERS_OR_EMPTY;
    case T_ILIST:
    case T_SLIST:
        return k->cmin == 0;
    default:
        return false;
    }
}

/* "expected <what>, found '<text>'<tail>" for key k. */
static int expected(char *err, size_t err_len, const where *w, const kdesc *k, const char *what,
                    const char *s, size_t n, const char *tail)
{
    char q[QUOTE_BUF];
    quote(q, sizeof(q), s, n);
    return fail(err, err_len, w, "%s.%s: expected %s, found '%s'%s", k->section, k->name, what, q,
                tail ? tail : "");
}

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > NAME_MAX_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

int ds_conf_device(const char *s, int *device)
{
    if (!strcmp(s, "auto")) {
        if (device)
            *device = DS_CONF_DEVICE_AUTO;
        return 0;
    }
    if (!*s || strlen(s) > 4)
        return -EINVAL;
    int v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (*p - '0');
    }
    if (v > DS_CONF_DEVICE_MAX)
        return -EINVAL;
    if (device)
        *device = v;
    return 0;
}

static bool check_str(enum kcheck chk, const char *s, size_t n)
{
    char buf[DS_CONF_STR_MAX];
    switch (chk) {
    case CHK_ANY:
    case CHK_PATH_OR_EMPTY:
    case CHK_LAYERS_OR_EMPTY: /* the list itself: parse_layers() */
        return true;
    case CHK_NONEMPTY:
    case CHK_PATH:
        return n > 0;
    case CHK_NAME_OR_EMPTY:
        if (n == 0)
            return true;
        /* fall through */
    case CHK_NAME:
        return name_ok(s, n);
    case CHK_HOSTPORT_OR_EMPTY:
        if (n == 0)
            return true;
        /* fall through */
    case CHK_HOSTPORT:
        if (n >= sizeof(buf))
            return false;
        memcpy(buf, s, n);
        buf[n] = '\0';
        ds_hostport hp;
        return ds_hostport_parse(buf, &hp) == 0 && hp.port >= 1;
    case CHK_DEVICE:
        if (n >= sizeof(buf))
            return false;
        memcpy(buf, s, n);
        buf[n] = '\0';
        return ds_conf_device(buf, NULL) == 0;
    }
    return false;
}

/* A train.layers list: the grammar and the shapes from the Fashion-MNIST
 * image, refused with the item that is wrong ("found 'rleu' (layer 2)"). */
static int parse_layers(const kdesc *k, const char *s, size_t n, char *err, size_t err_len,
                        const where *w)
{
    char buf[DS_CONF_STR_MAX], tail[32];
    ds_layerspec sp;
    ds_layerspec_err e;
    memcpy(buf, s, n);
    buf[n] = '\0';
    int r = ds_layerspec_parse(buf, &sp, &e);
    if (r == 0)
        r = ds_layerspec_check(&sp, DS_FMNIST_C, DS_FMNIST_H, DS_FMNIST_W, DS_FMNIST_CLASSES, &e);
    if (r == 0)
        return 0;
    if (e.index > 0)
        snprintf(tail, sizeof(tail), " (layer %d)", e.index);
    else
        tail[0] = '\0';
    return expected(err, err_len, w, k, e.expected, buf + e.at, e.len, tail);
}

/* Rules every str value and str list item obeys, then its check. Returns 0
 * or the error (tail is appended to the message, e.g. " (item 2)"). */
static int parse_str_item(const kdesc *k, const char *s, size_t n, char *out, char *err,
                          size_t err_len, const where *w, const char *tail)
{
    char t[64];
    if (n >= DS_CONF_STR_MAX) {
        snprintf(t, sizeof(t), " (%zu characters)%s", n, tail ? tail : "");
        return expected(err, err_len, w, k, "at most 255 characters", s, n, t);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f)
            return expected(err, err_len, w, k, "no control characters", s, n, tail);
        /* inih cuts a value at a ';' after a blank (an inline comment), so
         * such a value could not be written back into an ini file. */
        if (ch == ';' && i > 0 && is_blank(s[i - 1]))
            return expected(err, err_len, w, k, "no ';' after a blank (it starts a comment)", s,
                            n, tail);
    }
    if (!check_str(k->check, s, n)) {
        char what[160];
        describe_str_check(k->check, what, sizeof(what));
        return expected(err, err_len, w, k, what, s, n, tail);
    }
    if (k->check == CHK_LAYERS_OR_EMPTY && n > 0) {
        int r = parse_layers(k, s, n, err, err_len, w);
        if (r)
            return r;
    }
    memset(out, 0, DS_CONF_STR_MAX);
    memcpy(out, s, n);
    return 0;
}

/* Decimal integer, optional sign, nothing else. */
static bool parse_int(const char *s, size_t n, int64_t *v)
{
    char buf[32];
    if (n == 0 || n >= sizeof(buf))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (i == 0 && (s[i] == '-' || s[i] == '+'))))
            return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno || end != buf + n)
        return false;
    *v = (int64_t)x;
    return true;
}

/* Decimal floating point ("0.05", "1e-4", "+3"), finite; no hex, inf, nan. */
static bool parse_float(const char *s, size_t n, double *v)
{
    char buf[64];
    bool digit = false;
    if (n == 0 || n >= sizeof(buf))
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch >= '0' && ch <= '9')
            digit = true;
        else if (ch != '.' && ch != 'e' && ch != 'E' && ch != '+' && ch != '-')
            return false;
    }
    if (!digit)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    double x = strtod(buf, &end);
    if (end != buf + n || !isfinite(x))
        return false;
    *v = x == 0 ? 0.0 : x; /* -0 is 0: one spelling of zero */
    return true;
}

static bool int_in_range(const kdesc *k, int64_t v)
{
    return v >= k->imin && v <= k->imax;
}

static bool float_in_range(const kdesc *k, double v)
{
    bool lo_open = k->bounds[0] == '(', hi_open = k->bounds[1] == ')';
    if (lo_open ? !(v > k->fmin) : !(v >= k->fmin))
        return false;
    if (hi_open ? !(v < k->fmax) : !(v <= k->fmax))
        return false;
    return true;
}

static const struct {
    const char *word;
    bool value;
} bool_words[] = {{"true", true}, {"false", false}, {"yes", true}, {"no", false},
                  {"on", true},   {"off", false},   {"1", true},   {"0", false}};

/* Parse text s (already trimmed, NUL-terminated) as the value of key k and,
 * only when all of it is good, store it in *c. Returns 0 or -EINVAL with the
 * error in err; on error *c is untouched. */
static int parse_value(const kdesc *k, const char *s, ds_conf *c, char *err, size_t err_len,
                       const where *w)
{
    char *field = (char *)c + k->off;
    char what[256];
    size_t n = strlen(s);
    if (n == 0 && !empty_ok(k))
        return fail(err, err_len, w, "%s.%s: empty value", k->section, k->name);
    describe(k, what, sizeof(what));

    switch (k->type) {
    case T_STR:
        return parse_str_item(k, s, n, field, err, err_len, w, NULL);
    case T_INT: {
        int64_t v;
        if (!parse_int(s, n, &v) || !int_in_range(k, v))
            return expected(err, err_len, w, k, what, s, n, NULL);
        memcpy(field, &v, sizeof(v));
        return 0;
    }
    case T_FLOAT: {
        double v;
        if (!parse_float(s, n, &v) || !float_in_range(k, v))
            return expected(err, err_len, w, k, what, s, n, NULL);
        memcpy(field, &v, sizeof(v));
        return 0;
    }
    case T_BOOL:
        for (size_t i = 0; i < sizeof(bool_words) / sizeof(bool_words[0]); i++) {
            if (ieq(bool_words[i].word, s, n)) {
                memcpy(field, &bool_words[i].value, sizeof(bool));
                return 0;
            }
        }
        return expected(err, err_len, w, k, what, s, n, NULL);
    case T_ENUM:
        /* Any case; what is stored is the value, which the dump writes
         * back in the list's spelling. */
        for (size_t i = 0; i < k->n_choices; i++) {
            if (ieq(k->choices[i].name, s, n)) {
                memcpy(field, &k->choices[i].value, sizeof(int));
                return 0;
            }
        }
        return expected(err, err_len, w, k, what, s, n, NULL);
    case T_ILIST:
    case T_SLIST: {
        /* Parse into locals, commit at the end. */
        int64_t ints[DS_CONF_LIST_MAX] = {0};
        char strs[DS_CONF_LIST_MAX][DS_CONF_STR_MAX];
        int count = 0;
        char tail[48];
        if (n > 0) {
            int items = 1;
            for (size_t i = 0; i < n; i++)
                items += s[i] == ',';
            if (items < k->cmin || items > k->cmax) {
                snprintf(tail, sizeof(tail), " (%d items)", items);
                return expected(err, err_len, w, k, what, s, n, tail);
            }
        } else if (k->cmin > 0) {
            return fail(err, err_len, w, "%s.%s: empty value", k->section, k->name);
        }
        memset(strs, 0, sizeof(strs));
        for (const char *p = s; n > 0;) {
            size_t len = strcspn(p, ",");
            size_t in = len;
            const char *item = trim(p, &in);
            snprintf(tail, sizeof(tail), " (item %d)", count + 1);
            if (in == 0)
                return expected(err, err_len, w, k, what, item, in, tail);
            if (k->type == T_ILIST) {
                if (!parse_int(item, in, &ints[count]) || !int_in_range(k, ints[count]))
                    return expected(err, err_len, w, k, what, item, in, tail);
            } else {
                int rc = parse_str_item(k, item, in, strs[count], err, err_len, w, tail);
                if (rc)
                    return rc;
            }
            count++;
            if (!p[len])
                break;
            p += len + 1;
        }
        if (k->type == T_ILIST)
            memcpy(field, ints, sizeof(ints));
        else
            memcpy(field, strs, sizeof(strs));
        memcpy((char *)c + k->count_off, &count, sizeof(count));
        return 0;
    }
    }
    return -EINVAL;
}

/* ---- formatting one value ----------------------------------------------- */

/* The value of key k in *c as the text the loader accepts. out must hold
 * DS_CONF_LINE_MAX bytes. Returns -EINVAL when the field cannot be formatted
 * (a string without its NUL, a list count out of range), and -ERANGE for an
 * enum value that is not in the key's list (out then holds the number, for
 * the error message). */
static int format_value(const kdesc *k, const ds_conf *c, char *out, size_t n)
{
    const char *field = (const char *)c + k->off;
    size_t o = 0;
    out[0] = '\0';
    switch (k->type) {
    case T_STR:
        if (!memchr(field, '\0', k->size))
            return -EINVAL;
        snprintf(out, n, "%s", field);
        return 0;
    case T_ENUM: {
        int v;
        memcpy(&v, field, sizeof(v));
        for (size_t i = 0; i < k->n_choices; i++) {
            if (k->choices[i].value == v) {
                snprintf(out, n, "%s", k->choices[i].name);
                return 0;
            }
        }
        snprintf(out, n, "%d", v);
        return -ERANGE;
    }
    case T_INT: {
        int64_t v;
        memcpy(&v, field, sizeof(v));
        snprintf(out, n, "%" PRId64, v);
        return 0;
    }
    case T_FLOAT: {
        double v;
        memcpy(&v, field, sizeof(v));
        format_double(v, out, n);
        return 0;
    }
    case T_BOOL: {
        bool v;
        memcpy(&v, field, sizeof(v));
        snprintf(out, n, "%s", v ? "true" : "false");
        return 0;
    }
    case T_ILIST:
    case T_SLIST: {
        int count;
        memcpy(&count, (const char *)c + k->count_off, sizeof(count));
        if (count < 0 || count > DS_CONF_LIST_MAX)
            return -EINVAL;
        for (int i = 0; i < count && o < n; i++) {
            const char *sep = i ? ", " : "";
            if (k->type == T_ILIST) {
                int64_t v;
                memcpy(&v, field + (size_t)i * sizeof(int64_t), sizeof(v));
                o += (size_t)snprintf(out + o, n - o, "%s%" PRId64, sep, v);
            } else {
                const char *item = field + (size_t)i * DS_CONF_STR_MAX;
                if (!memchr(item, '\0', DS_CONF_STR_MAX))
                    return -EINVAL;
                o += (size_t)snprintf(out + o, n - o, "%s%s", sep, item);
            }
        }
        return 0;
    }
    }
    return -EINVAL;
}

/* ---- defaults ----------------------------------------------------------- */

void ds_conf_defaults(ds_conf *c)
{
    char err[DS_CONF_ERR_MAX];
    const where w = {.file = "conf/keys.h (default)"};
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < NKEYS; i++) {
        /* A default that does not parse is a bug in keys.h, caught by the
         * first test that runs; there is no sane way to carry on. */
        if (parse_value(&keys[i], keys[i].def, c, err, sizeof(err), &w)) {
            fprintf(stderr, "dsnode: bad default in conf/keys.h: %s\n", err);
            abort();
        }
    }
}

/* ---- --set -------------------------------------------------------------- */

int ds_conf_set(ds_conf *c, const char *assignment, char *err, size_t err_len)
{
    const where w = {.set = assignment ? assignment : "(null)"};
    char name[DS_CONF_STR_MAX], sec[DS_CONF_STR_MAX], q[4 * QUOTE_MAX + 16], hint[128];
    char value[DS_CONF_LINE_MAX];
    if (!c || !assignment)
        return fail(err, err_len, &w, "expected section.key=value, found nothing");
    const char *eq = strchr(assignment, '=');
    if (!eq)
        return fail(err, err_len, &w, "expected section.key=value, found no '='");
    size_t kn = (size_t)(eq - assignment);
    const char *key = trim(assignment, &kn);
    const char *dot = memchr(key, '.', kn);
    if (!dot || dot == key || dot == key + kn - 1) {
        quote(q, sizeof(q), key, kn);
        hint[0] = '\0';
        snprintf(name, sizeof(name), "%.*s", (int)(kn < sizeof(name) - 1 ? kn : sizeof(name) - 1),
                 key);
        int any = find_key_any_section(name);
        if (any >= 0)
            snprintf(hint, sizeof(hint), "; did you mean '%s.%s'?", keys[any].section,
                     keys[any].name);
        return fail(err, err_len, &w, "expected section.key before '=', found '%s'%s", q, hint);
    }
    size_t sn = (size_t)(dot - key), nn = kn - sn - 1;
    if (sn >= sizeof(sec) || nn >= sizeof(name)) {
        quote(q, sizeof(q), key, kn);
        return fail(err, err_len, &w, "unknown key '%s'", q);
    }
    memcpy(sec, key, sn);
    sec[sn] = '\0';
    memcpy(name, dot + 1, nn);
    name[nn] = '\0';
    if (find_section(sec) < 0) {
        quote(q, sizeof(q), sec, sn);
        suggest_section(hint, sizeof(hint), sec);
        return fail(err, err_len, &w, "unknown section [%s]%s", q, hint);
    }
    int k = find_key(sec, name);
    if (k < 0) {
        quote(q, sizeof(q), name, nn);
        suggest_key(hint, sizeof(hint), sec, name);
        return fail(err, err_len, &w, "unknown key '%s' in [%s]%s", q, sec, hint);
    }
    size_t vn = strlen(eq + 1);
    const char *v = trim(eq + 1, &vn);
    if (vn >= sizeof(value)) {
        char what[256];
        describe(&keys[k], what, sizeof(what));
        return expected(err, err_len, &w, &keys[k], what, v, vn, " (too long)");
    }
    memcpy(value, v, vn);
    value[vn] = '\0';
    /* parse_value() stores nothing unless the whole value is good. */
    return parse_value(&keys[k], value, c, err, err_len, &w);
}

/* ---- relative paths ------------------------------------------------------ */

static bool is_path_key(const kdesc *k)
{
    return k->type == T_STR && (k->check == CHK_PATH || k->check == CHK_PATH_OR_EMPTY);
}

static bool is_relative(const char *v)
{
    return v[0] && v[0] != '/';
}

/* Store base/value in path key k of c when its value is relative; leading
 * "./" are dropped and "." is base itself. An empty or absolute value is
 * left alone. base is absolute. The result goes through the key's parser,
 * so one too long for the key, or one that would not load back (a control
 * character in base), is an error reported at w, told against what. */
static int resolve_one(const kdesc *k, ds_conf *c, const char *base, const char *against,
                       char *err, size_t err_len, const where *w)
{
    const char *v = (const char *)c + k->off;
    if (!is_relative(v))
        return 0;
    while (v[0] == '.' && v[1] == '/') {
        v += 2;
        while (v[0] == '/')
            v++;
    }
    const size_t n = strlen(base) + DS_CONF_STR_MAX + 2;
    char *out = malloc(n);
    if (!out)
        return fail(err, err_len, w, "%s.%s: %s", k->section, k->name, strerror(ENOMEM));
    const bool root = !strcmp(base, "/");
    if (!v[0] || !strcmp(v, "."))
        snprintf(out, n, "%s", base);
    else
        snprintf(out, n, "%s%s%s", base, root ? "" : "/", v);
    int rc = parse_value(k, out, c, err, err_len, w);
    free(out);
    if (rc && err && err_len) {
        size_t used = strlen(err);
        snprintf(err + used, err_len - used, " (a relative path, resolved against %s)", against);
    }
    return rc;
}

/* The absolute directory holding the file at path (symbolic links in that
 * directory's path resolved, the file's own name kept). 0 or -errno. */
static int file_dir(const char *path, char *dir /* PATH_MAX */)
{
    char parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(parent, sizeof(parent), ".");
    else if (slash == path)
        snprintf(parent, sizeof(parent), "/");
    else if ((size_t)(slash - path) >= sizeof(parent))
        return -ENAMETOOLONG;
    else
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
    return realpath(parent, dir) ? 0 : -errno;
}

/* The relative paths a file wrote (set[k]: line of key k, 0 = not in the
 * file) against the file's directory, in *c. */
static int resolve_file_paths(ds_conf *c, const char *path, const int *set, char *err,
                              size_t err_len)
{
    char *dir = NULL;
    int rc = 0;
    for (size_t i = 0; i < NKEYS && rc == 0; i++) {
        const kdesc *k = &keys[i];
        if (!set[i] || !is_path_key(k) || !is_relative((const char *)c + k->off))
            continue;
        const where w = {.file = path, .line = set[i]};
        if (!dir) {
            if (!(dir = malloc(PATH_MAX)))
                return fail(err, err_len, &w, "%s.%s: %s", k->section, k->name, strerror(ENOMEM));
            if ((rc = file_dir(path, dir)) < 0) {
                fail(err, err_len, &w, "%s.%s: cannot resolve a relative path: the config "
                     "file's directory: %s", k->section, k->name, strerror(-rc));
                break;
            }
        }
        rc = resolve_one(k, c, dir, "the config file's directory", err, err_len, &w);
    }
    free(dir);
    return rc;
}

int ds_conf_resolve_paths(ds_conf *c, char *err, size_t err_len)
{
    if (!c)
        return fail(err, err_len, NULL, "ds_conf_resolve_paths: no config");
    char *cwd = malloc(PATH_MAX);
    ds_conf *copy = malloc(sizeof(*copy));
    int rc = 0;
    if (!cwd || !copy) {
        rc = fail(err, err_len, NULL, "cannot resolve relative paths: %s", strerror(ENOMEM));
        goto out;
    }
    memcpy(copy, c, sizeof(*copy));
    bool have_cwd = false;
    for (size_t i = 0; i < NKEYS && rc == 0; i++) {
        const kdesc *k = &keys[i];
        if (!is_path_key(k) || !is_relative((const char *)c + k->off))
            continue;
        if (!have_cwd && !getcwd(cwd, PATH_MAX)) {
            int e = errno;
            rc = fail(err, err_len, NULL, "%s.%s: cannot resolve a relative path: the working "
                      "directory: %s", k->section, k->name, strerror(e));
            break;
        }
        have_cwd = true;
        rc = resolve_one(k, copy, cwd, "the working directory", err, err_len, NULL);
    }
    if (rc == 0)
        memcpy(c, copy, sizeof(*c));
out:
    free(copy);
    free(cwd);
    return rc;
}

/* ---- loading a file ----------------------------------------------------- */

typedef struct load_state {
    const char *path;
    const char *text; /* the whole file */
    size_t len, pos;  /* pos: start of the next unread line */
    int line;         /* number of the line being delivered / handled */
    const char *cur;  /* that line, leading blanks stripped */
    size_t cur_len;   /* its length without the newline */
    size_t cur_off;   /* bytes of cur (plus its '\n') handed to inih */
    bool pending;     /* part of cur is still to be handed over */
    ds_conf *conf;    /* the copy being filled */
    int first_line[NKEYS]; /* line each key was set on, 0 = not yet */
    int err_line;     /* line of our first error, 0 = none */
    int rc;
    char *err;
    size_t err_len;
} load_state;

static void load_fail_at(load_state *st, int rc)
{
    st->err_line = st->line;
    st->rc = rc;
}

/* A "[name]" line: check the name now (inih only tells the handler about
 * sections that have keys). Lines inih would call malformed are left for
 * inih to report. Returns false after recording an error. */
static bool check_section_line(load_state *st, const char *s, size_t n)
{
    const where w = {.file = st->path, .line = st->line};
    const char *close = memchr(s, ']', n);
    char q[QUOTE_BUF], hint[128], name[DS_CONF_STR_MAX];
    if (!close)
        return true;
    size_t nn = (size_t)(close - s - 1);
    size_t rest = n - (size_t)(close - s) - 1;
    const char *after = trim(close + 1, &rest);
    if (rest > 0 && after[0] != ';' && after[0] != '#') {
        quote(q, sizeof(q), after, rest);
        load_fail_at(st, fail(st->err, st->err_len, &w,
                              "syntax error: expected nothing after ']', found '%s'", q));
        return false;
    }
    if (nn >= sizeof(name)) {
        quote(q, sizeof(q), s + 1, nn);
        load_fail_at(st, fail(st->err, st->err_len, &w, "unknown section [%s]", q));
        return false;
    }
    memcpy(name, s + 1, nn);
    name[nn] = '\0';
    if (find_section(name) < 0) {
        quote(q, sizeof(q), name, nn);
        suggest_section(hint, sizeof(hint), name);
        load_fail_at(st, fail(st->err, st->err_len, &w, "unknown section [%s]%s", q, hint));
        return false;
    }
    return true;
}

/* The fgets-like reader inih pulls lines through (see the top of the file). */
static char *load_reader(char *buf, int num, void *stream)
{
    load_state *st = stream;
    if (st->err_line || num < 2)
        return NULL;
    if (!st->pending) {
        if (st->pos >= st->len)
            return NULL;
        const char *s = st->text + st->pos;
        const char *nl = memchr(s, '\n', st->len - st->pos);
        size_t n = nl ? (size_t)(nl - s) : st->len - st->pos;
        st->pos += n + (nl != NULL);
        st->line++;
        const where w = {.file = st->path, .line = st->line};
        if (memchr(s, '\0', n)) {
            load_fail_at(st, fail(st->err, st->err_len, &w,
                                  "expected text, found a NUL byte"));
            return NULL;
        }
        if (n > DS_CONF_LINE_MAX) {
            load_fail_at(st, fail(st->err, st->err_len, &w,
                                  "line too long (%zu bytes; at most %d)", n, DS_CONF_LINE_MAX));
            return NULL;
        }
        if (st->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3))
            s += 3, n -= 3;
        while (n && is_blank(*s))
            s++, n--;
        while (n && is_blank(s[n - 1]))
            n--;
#if !DS_INIH_RUNTIME_OPTIONS
        /* inih's line buffer is fixed: a longer line would be split. */
        if (n + 2 > (size_t)num) {
            load_fail_at(st, fail(st->err, st->err_len, &w,
                                  "line too long (%zu bytes; this inih build takes at most %d)",
                                  n, num - 2));
            return NULL;
        }
#endif
        if (n && s[0] == '[' && !check_section_line(st, s, n))
            return NULL;
        st->cur = s;
        st->cur_len = n;
        st->cur_off = 0;
        st->pending = true;
    }
    /* Hand over as much of "cur\n" as fits; inih grows its buffer and asks
     * again while the piece it got ends without a newline. */
    size_t left = st->cur_len + 1 - st->cur_off;
    size_t take = left < (size_t)num - 1 ? left : (size_t)num - 1;
    size_t from_cur = take;
    if (st->cur_off + take > st->cur_len)
        from_cur = st->cur_len - st->cur_off;
    memcpy(buf, st->cur + st->cur_off, from_cur);
    if (from_cur < take)
        buf[from_cur] = '\n';
    buf[take] = '\0';
    st->cur_off += take;
    if (st->cur_off == st->cur_len + 1)
        st->pending = false;
    return buf;
}

static int load_handler(void *user, const char *section, const char *name, const char *value)
{
    load_state *st = user;
    const where w = {.file = st->path, .line = st->line};
    char q[QUOTE_BUF], hint[128];
    if (st->err_line)
        return 0;
    if (!section[0]) {
        int any = find_key_any_section(name);
        quote(q, sizeof(q), name, strlen(name));
        hint[0] = '\0';
        if (any >= 0)
            snprintf(hint, sizeof(hint), "; '%s' is in [%s]", keys[any].name,
                     keys[any].section);
        load_fail_at(st, fail(st->err, st->err_len, &w, "key '%s' before any [section]%s", q,
                              hint));
        return 0;
    }
    if (find_section(section) < 0) {
        quote(q, sizeof(q), section, strlen(section));
        suggest_section(hint, sizeof(hint), section);
        load_fail_at(st, fail(st->err, st->err_len, &w, "unknown section [%s]%s", q, hint));
        return 0;
    }
    int k = find_key(section, name);
    if (k < 0) {
        quote(q, sizeof(q), name, strlen(name));
        suggest_key(hint, sizeof(hint), section, name);
        load_fail_at(st, fail(st->err, st->err_len, &w, "unknown key '%s' in [%s]%s", q,
                              section, hint));
        return 0;
    }
    if (st->first_line[k]) {
        load_fail_at(st, fail(st->err, st->err_len, &w, "%s.%s: duplicate key (first set at line %d)",
                              keys[k].section, keys[k].name, st->first_line[k]));
        return 0;
    }
    st->first_line[k] = st->line;
    int rc = parse_value(&keys[k], value, st->conf, st->err, st->err_len, &w);
    if (rc) {
        load_fail_at(st, rc);
        return 0;
    }
    return 1;
}

/* Read the whole file (bounded). 0, or -errno with the error in err. */
static int read_file(const char *path, char **text, size_t *len, char *err, size_t err_len)
{
    const where w = {.file = path};
    char why[128];
    /* Without blocking: a FIFO or a device is refused, not waited on. */
    int fd = ds_file_open_regular(path, NULL, why, sizeof(why));
    if (fd < 0) {
        fail(err, err_len, &w, "cannot open: %s", why);
        return fd;
    }
    int rc = 0;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap > DS_CONF_FILE_MAX) {
                rc = -EFBIG;
                fail(err, err_len, &w, "cannot open: file larger than %d bytes", DS_CONF_FILE_MAX);
                goto out_free;
            }
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                rc = -ENOMEM;
                fail(err, err_len, &w, "cannot open: %s", strerror(ENOMEM));
                goto out_free;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            fail(err, err_len, &w, "cannot open: %s", strerror(-rc));
            goto out_free;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > DS_CONF_FILE_MAX) {
        rc = -EFBIG;
        fail(err, err_len, &w, "cannot open: file larger than %d bytes", DS_CONF_FILE_MAX);
        goto out_free;
    }
    if (!buf) {
        buf = malloc(1);
        if (!buf) {
            rc = -ENOMEM;
            fail(err, err_len, &w, "cannot open: %s", strerror(ENOMEM));
            goto out_close;
        }
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    close(fd);
    return 0;

out_free:
    free(buf);
out_close:
    close(fd);
    return rc;
}

/* The text of line `line` of the file, leading and trailing blanks cut. */
static const char *line_text(const load_state *st, int line, size_t *n)
{
    const char *s = st->text, *end = st->text + st->len;
    for (int i = 1; i < line && s < end; i++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        s = nl ? nl + 1 : end;
    }
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    *n = nl ? (size_t)(nl - s) : (size_t)(end - s);
    if (line == 1 && *n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3))
        s += 3, *n -= 3;
    return trim(s, n);
}

#if DS_INIH_RUNTIME_OPTIONS
/* inih's runtime options (Debian's build), saved around our parse. */
typedef struct inih_opts {
    bool use_stack, allow_realloc, stop_on_first_error, allow_multiline, allow_no_value;
    int max_line;
} inih_opts;

static inih_opts inih_opts_swap(const inih_opts *set)
{
    inih_opts old = {ini_use_stack, ini_allow_realloc, ini_stop_on_first_error,
                     ini_allow_multiline, ini_allow_no_value, ini_max_line};
    ini_use_stack = set->use_stack;
    ini_allow_realloc = set->allow_realloc;
    ini_stop_on_first_error = set->stop_on_first_error;
    ini_allow_multiline = set->allow_multiline;
    ini_allow_no_value = set->allow_no_value;
    ini_max_line = set->max_line;
    return old;
}
#endif

int ds_conf_load(ds_conf *c, const char *path, char *err, size_t err_len)
{
    if (!c || !path)
        return fail(err, err_len, NULL, "ds_conf_load: no config or no path");
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(path, &text, &len, err, err_len);
    if (rc)
        return rc;

    /* About 10 KiB each: on the heap rather than on a caller's stack. */
    load_state *st = calloc(1, sizeof(*st));
    ds_conf *copy = malloc(sizeof(*copy));
    if (!st || !copy) {
        fail(err, err_len, &(where){.file = path}, "cannot load: %s", strerror(ENOMEM));
        rc = -ENOMEM;
        goto out_free;
    }
    memcpy(copy, c, sizeof(*copy));
    st->path = path;
    st->text = text;
    st->len = len;
    st->conf = copy;
    st->err = err;
    st->err_len = err_len;

#if DS_INIH_RUNTIME_OPTIONS
    const inih_opts ours = {.use_stack = false, .allow_realloc = true,
                            .stop_on_first_error = true, .allow_multiline = false,
                            .allow_no_value = false, .max_line = DS_CONF_LINE_MAX + 16};
    inih_opts saved = inih_opts_swap(&ours);
#endif
    int ret = ini_parse_stream(load_reader, st, load_handler, st);
#if DS_INIH_RUNTIME_OPTIONS
    inih_opts_swap(&saved);
#endif

    if (ret == -2) {
        rc = -ENOMEM;
        fail(err, err_len, &(where){.file = path}, "cannot load: %s", strerror(ENOMEM));
    } else if (ret > 0 && (st->err_line == 0 || ret < st->err_line)) {
        /* inih's own syntax error comes first in the file. */
        size_t n;
        const char *s = line_text(st, ret, &n);
        char q[QUOTE_BUF];
        quote(q, sizeof(q), s, n);
        rc = fail(err, err_len, &(where){.file = path, .line = ret},
                  "syntax error: expected %s, found '%s'",
                  n && s[0] == '[' ? "']' to close the section name" : "'key = value'", q);
    } else if (st->err_line) {
        rc = st->rc;
    } else if (ret != 0) {
        rc = fail(err, err_len, &(where){.file = path}, "cannot load: inih error %d", ret);
    } else if ((rc = resolve_file_paths(copy, path, st->first_line, err, err_len)) == 0) {
        memcpy(c, copy, sizeof(*c));
    }

out_free:
    free(copy);
    free(st);
    free(text);
    return rc;
}

/* ---- check -------------------------------------------------------------- */

/* The name of value v of enum key section.name ("?" if not in its list).
 * From conf's own table: conf/ includes the modules' lists, not their code. */
static const char *choice_name(const char *section, const char *name, int v)
{
    int k = find_key(section, name);
    for (size_t i = 0; k >= 0 && i < keys[k].n_choices; i++)
        if (keys[k].choices[i].value == v)
            return keys[k].choices[i].name;
    return "?";
}

int ds_conf_check(const ds_conf *c, char *err, size_t err_len)
{
    if (!c)
        return fail(err, err_len, NULL, "ds_conf_check: no config");

    /* Each key on its own: format the field, parse it back as the loader
     * would (trimmed), and format the result again. The value is valid when
     * it parses, and canonical when both texts agree, which is what makes
     * the dump load back to the same struct (a path with a trailing blank
     * would not). */
    char *text = malloc(DS_CONF_LINE_MAX), *again = malloc(DS_CONF_LINE_MAX);
    ds_conf *scratch = calloc(1, sizeof(*scratch));
    int rc = 0;
    if (!text || !again || !scratch) {
        rc = -ENOMEM;
        fail(err, err_len, NULL, "ds_conf_check: %s", strerror(ENOMEM));
        goto out_free;
    }
    for (size_t i = 0; i < NKEYS; i++) {
        const kdesc *k = &keys[i];
        /* An enum value outside its list (-ERANGE) is formatted as a number,
         * which the parse below refuses with the key's choices. */
        if (format_value(k, c, text, DS_CONF_LINE_MAX) == -EINVAL) {
            rc = fail(err, err_len, NULL, "%s.%s: corrupt value (unterminated text or bad count)",
                      k->section, k->name);
            goto out_free;
        }
        size_t n = strlen(text);
        const char *t = trim(text, &n);
        memmove(again, t, n);
        again[n] = '\0';
        rc = parse_value(k, again, scratch, err, err_len, NULL);
        if (rc)
            goto out_free;
        format_value(k, scratch, again, DS_CONF_LINE_MAX);
        if (strcmp(text, again)) {
            char what[256];
            describe(k, what, sizeof(what));
            rc = expected(err, err_len, NULL, k, what, text, strlen(text),
                          " (not in canonical form)");
            goto out_free;
        }
    }

    if (c->gossip.mix == DS_MIX_CROSSOVER && c->sparsify.method != DS_SPARSIFY_NONE) {
        rc = fail(err, err_len, NULL,
                  "gossip.mix = crossover requires sparsify.method = none (crossover mixing is "
                  "dense only), found sparsify.method = %s",
                  choice_name("sparsify", "method", (int)c->sparsify.method));
        goto out_free;
    }
    if (c->sparsify.value_format != DS_VALUE_F32 && c->gossip.topology == DS_TOPO_ALLREDUCE) {
        rc = fail(err, err_len, NULL,
                  "sparsify.value_format = %s requires a gossip topology (the allreduce baseline "
                  "sends f32), found gossip.topology = %s",
                  choice_name("sparsify", "value_format", (int)c->sparsify.value_format),
                  choice_name("gossip", "topology", (int)c->gossip.topology));
        goto out_free;
    }
    if (c->node.group[0] && c->gossip.topology == DS_TOPO_ALLREDUCE) {
        rc = fail(err, err_len, NULL,
                  "node.group = %s requires a gossip topology between the groups, found "
                  "gossip.topology = allreduce (every node all-reduces already; leave "
                  "node.group empty)",
                  c->node.group);
        goto out_free;
    }
    if (c->group.overlap && c->group.sparsify != DS_GROUP_SPARSIFY_NONE) {
        rc = fail(err, err_len, NULL,
                  "group.overlap = true requires group.sparsify = none (the layers' reductions "
                  "are dense), found group.sparsify = %s",
                  choice_name("group", "sparsify", (int)c->group.sparsify));
        goto out_free;
    }
    if (c->node.advertise[0]) {
        ds_hostport hp;
        if (ds_hostport_parse(c->node.advertise, &hp) == 0 && ds_host_is_wildcard(hp.host)) {
            char q[QUOTE_BUF];
            quote(q, sizeof(q), c->node.advertise, strlen(c->node.advertise));
            rc = fail(err, err_len, NULL,
                      "node.advertise: expected an address peers can dial, found the wildcard "
                      "address '%s'",
                      q);
            goto out_free;
        }
    }
    if (c->security.mode == DS_SEC_NONE) {
        ds_hostport hp;
        const char *bad = NULL, *bad_key = NULL;
        if (ds_hostport_parse(c->node.listen, &hp) || !ds_host_is_loopback(hp.host))
            bad = c->node.listen, bad_key = "node.listen";
        if (!bad && c->node.advertise[0] &&
            (ds_hostport_parse(c->node.advertise, &hp) || !ds_host_is_loopback(hp.host)))
            bad = c->node.advertise, bad_key = "node.advertise";
        for (int i = 0; !bad && i < c->cluster.seeds_count; i++)
            if (ds_hostport_parse(c->cluster.seeds[i], &hp) || !ds_host_is_loopback(hp.host))
                bad = c->cluster.seeds[i], bad_key = "cluster.seeds";
        if (bad) {
            char q[QUOTE_BUF];
            quote(q, sizeof(q), bad, strlen(bad));
            rc = fail(err, err_len, NULL,
                      "security.mode = none requires loopback addresses only (127.0.0.0/8, ::1 or "
                      "localhost), found %s = %s",
                      bad_key, q);
            goto out_free;
        }
    }
    if (c->train.nesterov && !(c->train.momentum > 0)) {
        char v[64];
        format_double(c->train.momentum, v, sizeof(v));
        rc = fail(err, err_len, NULL,
                  "train.nesterov = true requires train.momentum > 0, found train.momentum = %s",
                  v);
        goto out_free;
    }
    if (c->train.model == DS_MODEL_CUSTOM && !c->train.layers[0]) {
        rc = fail(err, err_len, NULL,
                  "train.model = custom requires train.layers (a layer list), found it empty");
        goto out_free;
    }
    if (c->train.model != DS_MODEL_CUSTOM && c->train.layers[0]) {
        char q[QUOTE_BUF];
        quote(q, sizeof(q), c->train.layers, strlen(c->train.layers));
        rc = fail(err, err_len, NULL,
                  "train.layers applies to train.model = custom only, found train.model = %s "
                  "and train.layers = '%s'",
                  choice_name("train", "model", (int)c->train.model), q);
        goto out_free;
    }
    if (c->train.model != DS_MODEL_MLP &&
        !(c->train.hidden_count == 2 && c->train.hidden[0] == 256 && c->train.hidden[1] == 256)) {
        /* The default is all we can tell from "not written"; anything else
         * was asked for and would do nothing. */
        rc = fail(err, err_len, NULL,
                  "train.hidden applies to train.model = mlp only (leave it at 256, 256), found "
                  "train.model = %s",
                  choice_name("train", "model", (int)c->train.model));
        goto out_free;
    }
    if (c->train.warmup_steps > c->train.steps) {
        /* The warm-up would never end: the run would train at a fraction
         * of train.lr throughout. */
        rc = fail(err, err_len, NULL,
                  "train.warmup_steps: expected at most train.steps (%" PRId64 "), found %" PRId64,
                  c->train.steps, c->train.warmup_steps);
        goto out_free;
    }

out_free:
    free(scratch);
    free(again);
    free(text);
    return rc;
}

/* ---- dump and help ------------------------------------------------------ */

int ds_conf_dump(const ds_conf *c, FILE *out)
{
    char *text = malloc(DS_CONF_LINE_MAX);
    const char *section = NULL;
    int rc = 0;
    if (!text)
        return -ENOMEM;
    fprintf(out, "# dsnode configuration: every key, as in effect\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const kdesc *k = &keys[i];
        if (!section || strcmp(section, k->section)) {
            section = k->section;
            fprintf(out, "\n[%s]\n", section);
        }
        if (format_value(k, c, text, DS_CONF_LINE_MAX)) {
            /* Say so in a way the loader refuses too. */
            fprintf(out, "%s = <corrupt value>\n", k->name);
            rc = -EINVAL;
            continue;
        }
        if (text[0])
            fprintf(out, "%s = %s\n", k->name, text);
        else
            fprintf(out, "%s =\n", k->name);
    }
    free(text);
    if (fflush(out) || ferror(out))
        return -EIO;
    return rc;
}

void ds_conf_help(FILE *out)
{
    char full[64], con[160];
    for (size_t i = 0; i < NKEYS; i++) {
        const kdesc *k = &keys[i];
        snprintf(full, sizeof(full), "%s.%s", k->section, k->name);
        constraint(k, con, sizeof(con));
        fprintf(out, "%-25s %-8s %-15s %-29s %s\n", full, type_names[k->type],
                k->def[0] ? k->def : "(empty)", con, k->help);
    }
}
