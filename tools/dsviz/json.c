/*
 * tools/dsviz/json.c: see json.h.
 *
 * Layout: every value is one ds_jv in one array. The elements of an array
 * (members of an object) are contiguous in it, so ds_jv_at is an index.
 * Recursive descent produces children before their parent knows how many
 * there are, so a parent collects its children's values on a scratch
 * stack and moves them into the final array, contiguous, when it closes.
 * While parsing, child and string positions are indices (the arrays grow
 * and move); one pass at the end turns them into pointers.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dsviz/json.h"

struct ds_jv {
    unsigned char type;
    unsigned char b;
    double num;
    size_t n; /* string bytes, or children */
    union {
        size_t off;
        const char *s;
    } str, key; /* key: of an object member; off = SIZE_MAX for none */
    union {
        size_t off;
        const ds_jv *p;
    } kids;
};

struct ds_jdoc {
    ds_jv *vals;
    size_t n_vals, cap_vals;
    char *strs;
    size_t n_strs, cap_strs;
    const ds_jv *root;
};

typedef struct parser {
    const unsigned char *p, *start, *end;
    ds_jdoc *d;
    ds_jv *scratch;
    size_t n_scratch, cap_scratch;
    size_t total; /* values so far */
    int nomem;
    char *err;
    size_t err_len;
    int failed;
} parser;

static void fail(parser *ps, const char *what)
{
    if (ps->failed)
        return;
    ps->failed = 1;
    size_t line = 1, col = 1;
    for (const unsigned char *q = ps->start; q < ps->p && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    if (ps->err && ps->err_len)
        snprintf(ps->err, ps->err_len, "%zu:%zu: %s", line, col, what);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *np = realloc(*p, c * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = c;
    return 0;
}

static int push_scratch(parser *ps, const ds_jv *v)
{
    if (++ps->total > DS_JSON_MAX_VALUES) {
        fail(ps, "too many values");
        return -1;
    }
    if (grow((void **)&ps->scratch, &ps->cap_scratch, ps->n_scratch + 1, sizeof(ds_jv)) < 0) {
        ps->nomem = 1;
        fail(ps, "out of memory");
        return -1;
    }
    ps->scratch[ps->n_scratch++] = *v;
    return 0;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static size_t utf8_len(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    size_t len;
    uint32_t v, min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, v = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, v = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    return len;
}

static int str_put(parser *ps, const void *src, size_t n)
{
    ds_jdoc *d = ps->d;
    if (grow((void **)&d->strs, &d->cap_strs, d->n_strs + n, 1) < 0) {
        ps->nomem = 1;
        fail(ps, "out of memory");
        return -1;
    }
    memcpy(d->strs + d->n_strs, src, n);
    d->n_strs += n;
    return 0;
}

static int put_cp(parser *ps, uint32_t cp)
{
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (unsigned char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (unsigned char)(0xc0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xe0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xf0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (unsigned char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return str_put(ps, u, n);
}

static int hex4(parser *ps, uint32_t *out)
{
    if (ps->end - ps->p < 4) {
        fail(ps, "short \\u escape");
        return -1;
    }
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        const unsigned c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else {
            fail(ps, "bad hex digit in \\u escape");
            return -1;
        }
    }
    ps->p += 4;
    *out = v;
    return 0;
}

/* A string at ps->p ('"'); its place in the arena goes to *off and *len. */
static int parse_string(parser *ps, size_t *off, size_t *len)
{
    ps->p++;
    const size_t start = ps->d->n_strs;
    for (;;) {
        if (ps->p >= ps->end) {
            fail(ps, "unterminated string");
            return -1;
        }
        const unsigned c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) {
            fail(ps, "control character in a string");
            return -1;
        }
        if (c != '\\') {
            const size_t l = utf8_len(ps->p, (size_t)(ps->end - ps->p));
            if (!l) {
                fail(ps, "invalid UTF-8");
                return -1;
            }
            if (str_put(ps, ps->p, l) < 0)
                return -1;
            ps->p += l;
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) {
            fail(ps, "unterminated escape");
            return -1;
        }
        const unsigned e = *ps->p++;
        char ch;
        switch (e) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(ps, &cp) < 0)
                return -1;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    fail(ps, "lone surrogate");
                    return -1;
                }
                ps->p += 2;
                if (hex4(ps, &lo) < 0)
                    return -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    fail(ps, "lone surrogate");
                    return -1;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                fail(ps, "lone surrogate");
                return -1;
            } else if (cp == 0) {
                fail(ps, "\\u0000 in a string");
                return -1;
            }
            if (put_cp(ps, cp) < 0)
                return -1;
            continue;
        }
        default:
            fail(ps, "unknown escape");
            return -1;
        }
        if (str_put(ps, &ch, 1) < 0)
            return -1;
    }
    *len = ps->d->n_strs - start;
    *off = start;
    return str_put(ps, "", 1);
}

static int parse_number(parser *ps, double *out)
{
    const unsigned char *s = ps->p, *q = s;
    if (q < ps->end && *q == '-')
        q++;
    if (q < ps->end && *q == '0') {
        q++;
    } else if (q < ps->end && *q >= '1' && *q <= '9') {
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    } else {
        fail(ps, "expected a value");
        return -1;
    }
    if (q < ps->end && *q == '.') {
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail(ps, "expected a digit after '.'");
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail(ps, "expected a digit in the exponent");
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    char tmp[128];
    const size_t n = (size_t)(q - s);
    if (n >= sizeof(tmp)) {
        fail(ps, "number too long");
        return -1;
    }
    memcpy(tmp, s, n);
    tmp[n] = 0;
    const double v = strtod(tmp, NULL);
    if (!isfinite(v)) {
        fail(ps, "number out of range");
        return -1;
    }
    *out = v;
    ps->p = q;
    return 0;
}

static int lit(parser *ps, const char *word)
{
    const size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) {
        fail(ps, "expected a value");
        return -1;
    }
    ps->p += n;
    return 0;
}

/* Move scratch[from..] into the final array; returns its first index. */
static int close_container(parser *ps, size_t from, ds_jv *v)
{
    ds_jdoc *d = ps->d;
    const size_t k = ps->n_scratch - from;
    if (grow((void **)&d->vals, &d->cap_vals, d->n_vals + k, sizeof(ds_jv)) < 0) {
        ps->nomem = 1;
        fail(ps, "out of memory");
        return -1;
    }
    if (k) /* an empty container may come before anything is allocated */
        memcpy(d->vals + d->n_vals, ps->scratch + from, k * sizeof(ds_jv));
    v->kids.off = d->n_vals;
    v->n = k;
    d->n_vals += k;
    ps->n_scratch = from;
    return 0;
}

static int parse_value(parser *ps, int depth, size_t key_off);

static int parse_container(parser *ps, int depth, ds_jv *v)
{
    const int obj = *ps->p == '{';
    const unsigned char close = obj ? '}' : ']';
    if (depth >= DS_JSON_MAX_DEPTH) {
        fail(ps, "nested too deep");
        return -1;
    }
    ps->p++;
    const size_t from = ps->n_scratch;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return close_container(ps, from, v);
    }
    for (;;) {
        size_t key_off = SIZE_MAX;
        skip_ws(ps);
        if (obj) {
            size_t klen;
            if (ps->p >= ps->end || *ps->p != '"') {
                fail(ps, "expected a \"key\"");
                return -1;
            }
            if (parse_string(ps, &key_off, &klen) < 0)
                return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                fail(ps, "expected ':'");
                return -1;
            }
            ps->p++;
        }
        if (parse_value(ps, depth + 1, key_off) < 0)
            return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            break;
        }
        fail(ps, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        return -1;
    }
    return close_container(ps, from, v);
}

/* Parse one value and push it on the scratch stack. */
static int parse_value(parser *ps, int depth, size_t key_off)
{
    ds_jv v;
    memset(&v, 0, sizeof(v));
    v.key.off = key_off;
    v.str.off = SIZE_MAX;
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, "unexpected end of input");
        return -1;
    }
    switch (*ps->p) {
    case '{':
    case '[':
        v.type = *ps->p == '{' ? DS_JOBJ : DS_JARR;
        if (parse_container(ps, depth, &v) < 0)
            return -1;
        break;
    case '"':
        v.type = DS_JSTR;
        if (parse_string(ps, &v.str.off, &v.n) < 0)
            return -1;
        break;
    case 't':
        v.type = DS_JBOOL, v.b = 1;
        if (lit(ps, "true") < 0)
            return -1;
        break;
    case 'f':
        v.type = DS_JBOOL, v.b = 0;
        if (lit(ps, "false") < 0)
            return -1;
        break;
    case 'n':
        v.type = DS_JNULL;
        if (lit(ps, "null") < 0)
            return -1;
        break;
    default:
        v.type = DS_JNUM;
        if (parse_number(ps, &v.num) < 0)
            return -1;
        break;
    }
    return push_scratch(ps, &v);
}

int ds_jdoc_parse(const char *text, size_t len, ds_jdoc **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err && err_len)
        err[0] = 0;
    if (len > DS_JSON_MAX_INPUT) {
        if (err && err_len)
            snprintf(err, err_len, "document larger than %zu bytes", DS_JSON_MAX_INPUT);
        return -EINVAL;
    }
    ds_jdoc *d = calloc(1, sizeof(*d));
    if (!d)
        return -ENOMEM;
    parser ps = {.p = (const unsigned char *)text, .start = (const unsigned char *)text,
                 .end = (const unsigned char *)text + len, .d = d, .err = err,
                 .err_len = err_len};
    /* A UTF-8 byte order mark is allowed before the value. */
    if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
        ps.p += 3;
    int ok = parse_value(&ps, 0, SIZE_MAX) == 0;
    if (ok) {
        skip_ws(&ps);
        if (ps.p != ps.end) {
            fail(&ps, "text after the value");
            ok = 0;
        }
    }
    if (ok) {
        /* The root is the one value left on the scratch stack: it goes
         * last into the final array. */
        ds_jv unused;
        if (close_container(&ps, 0, &unused) < 0)
            ok = 0;
    }
    free(ps.scratch);
    if (!ok) {
        const int e = ps.nomem ? -ENOMEM : -EINVAL;
        ds_jdoc_free(&d);
        return e;
    }
    /* Indices to pointers (the arrays do not move any more). */
    for (size_t i = 0; i < d->n_vals; i++) {
        ds_jv *v = &d->vals[i];
        const size_t ko = v->key.off, so = v->str.off, co = v->kids.off;
        v->key.s = ko == SIZE_MAX ? NULL : d->strs + ko;
        if (v->type == DS_JSTR)
            v->str.s = d->strs + so;
        else
            v->str.s = NULL;
        if (v->type == DS_JARR || v->type == DS_JOBJ)
            v->kids.p = v->n ? d->vals + co : NULL;
        else
            v->kids.p = NULL;
    }
    d->root = &d->vals[d->n_vals - 1];
    *out = d;
    return 0;
}

void ds_jdoc_free(ds_jdoc **pd)
{
    ds_jdoc *d = pd ? *pd : NULL;
    if (!d)
        return;
    *pd = NULL;
    free(d->vals);
    free(d->strs);
    free(d);
}

const ds_jv *ds_jdoc_root(const ds_jdoc *d)
{
    return d ? d->root : NULL;
}

enum ds_jtype ds_jv_type(const ds_jv *v)
{
    return v ? (enum ds_jtype)v->type : DS_JNULL;
}

const ds_jv *ds_jv_get(const ds_jv *v, const char *key)
{
    if (!v || v->type != DS_JOBJ || !key)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->kids.p[i].key.s, key))
            return &v->kids.p[i];
    return NULL;
}

const ds_jv *ds_jv_at(const ds_jv *v, size_t i)
{
    if (!v || (v->type != DS_JARR && v->type != DS_JOBJ) || i >= v->n)
        return NULL;
    return &v->kids.p[i];
}

const char *ds_jv_key_at(const ds_jv *v, size_t i)
{
    if (!v || v->type != DS_JOBJ || i >= v->n)
        return NULL;
    return v->kids.p[i].key.s;
}

size_t ds_jv_len(const ds_jv *v)
{
    return v && (v->type == DS_JARR || v->type == DS_JOBJ) ? v->n : 0;
}

double ds_jv_num(const ds_jv *v, double dflt)
{
    return v && v->type == DS_JNUM ? v->num : dflt;
}

const char *ds_jv_str(const ds_jv *v, const char *dflt)
{
    return v && v->type == DS_JSTR ? v->str.s : dflt;
}

int ds_jv_bool(const ds_jv *v, int dflt)
{
    return v && v->type == DS_JBOOL ? v->b : dflt;
}

double ds_jv_get_num(const ds_jv *v, const char *key, double dflt)
{
    return ds_jv_num(ds_jv_get(v, key), dflt);
}

const char *ds_jv_get_str(const ds_jv *v, const char *key, const char *dflt)
{
    return ds_jv_str(ds_jv_get(v, key), dflt);
}
