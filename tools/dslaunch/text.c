/*
 * tools/dslaunch/text.c: reading dsnode's lines and writing JSON.
 *
 * dsnode talks to launchers in text: log lines on stderr
 *   2026-12-02T16:43:23.628Z info n3 train step=200 loss=0.6894 ...
 * and one summary line on stdout
 *   summary node=n3 status=done steps=3000 loss=0.35 test_acc=0.8700 ...
 * Both end in key=value tokens. dslaunch reads those generically, by key, and
 * never by position, so a field that dsnode adds later is carried through to
 * the JSON report unchanged and a field it drops becomes null rather than a
 * parse failure. Nothing here trusts the text: values are cut to a fixed
 * size, numbers are accepted only when the whole value is one, and every
 * string that reaches the JSON output has a valid form (bytes that are not
 * UTF-8 are read as Latin-1). The JSON itself is jansson's: these helpers
 * only decide how a value of dsnode's text becomes a JSON value, and the
 * writer escapes everything outside printable ASCII.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dslaunch/dslaunch.h"

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int ds_kv_parse(const char *text, ds_kvline *out)
{
    out->n = 0;
    const char *p = text;
    while (*p) {
        while (is_blank(*p))
            p++;
        if (!*p)
            break;
        const char *tok = p;
        while (*p && !is_blank(*p))
            p++;
        const size_t len = (size_t)(p - tok);
        const char *eq = memchr(tok, '=', len);
        if (!eq || eq == tok || (size_t)(eq - tok) >= DS_KV_KEY_MAX || out->n >= DS_KV_MAX)
            continue;
        const size_t klen = (size_t)(eq - tok);
        char key[DS_KV_KEY_MAX];
        memcpy(key, tok, klen);
        key[klen] = '\0';
        if (ds_kv_get(out, key))
            continue; /* first value wins */
        size_t vlen = len - klen - 1;
        if (vlen >= DS_KV_VAL_MAX)
            vlen = DS_KV_VAL_MAX - 1;
        memcpy(out->key[out->n], key, klen + 1);
        memcpy(out->val[out->n], eq + 1, vlen);
        out->val[out->n][vlen] = '\0';
        out->n++;
    }
    return out->n;
}

const char *ds_kv_get(const ds_kvline *l, const char *key)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->key[i], key))
            return l->val[i];
    return NULL;
}

int ds_kv_get_double(const ds_kvline *l, const char *key, double *out)
{
    const char *v = ds_kv_get(l, key);
    if (!v)
        return -ENOENT;
    /* strtod also takes hex, inf and nan; a JSON number is the plain
     * decimal form dsnode writes, so require that grammar first. */
    if (!ds_json_is_number(v))
        return -EINVAL;
    char *end;
    double d = strtod(v, &end);
    if (*end || !isfinite(d))
        return -EINVAL;
    *out = d;
    return 0;
}

static char *next_field(char *p, char **field)
{
    while (*p == ' ')
        p++;
    if (!*p)
        return NULL;
    *field = p;
    while (*p && *p != ' ')
        p++;
    return p;
}

int ds_logline_split(char *line, ds_logline *out)
{
    char *f[4];
    char *ends[4];
    char *p = line;
    for (int i = 0; i < 4; i++) {
        if (!(p = next_field(p, &f[i])))
            return -EINVAL;
        ends[i] = p;
    }
    if (f[0][0] < '0' || f[0][0] > '9')
        return -EINVAL;
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    int ok = 0;
    for (int i = 0; i < 4; i++)
        if ((size_t)(ends[1] - f[1]) == strlen(levels[i]) &&
            !strncmp(f[1], levels[i], strlen(levels[i])))
            ok = 1;
    if (!ok)
        return -EINVAL;
    char *rest = ends[3];
    while (*rest == ' ')
        rest++;
    for (int i = 1; i < 4; i++)
        *ends[i] = '\0';
    out->level = f[1];
    out->node = f[2];
    out->component = f[3];
    out->msg = rest; /* "" when the component ended the line */
    return 0;
}

/* ---- JSON ------------------------------------------------------------------ */

/* Bytes that are not UTF-8 read as Latin-1, each byte one code point, so
 * every byte string has a JSON form and the same bytes always give the
 * same text. A new buffer (caller frees), or NULL when out of memory. */
static char *latin1_to_utf8(const char *s)
{
    const size_t n = strlen(s);
    char *out = malloc(2 * n + 1), *w = out;
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x80) {
            *w++ = (char)*p;
        } else {
            *w++ = (char)(0xc0 | (*p >> 6));
            *w++ = (char)(0x80 | (*p & 0x3f));
        }
    }
    *w = '\0';
    return out;
}

json_t *ds_json_text(const char *s)
{
    if (!s)
        return json_null();
    json_t *v = json_string(s); /* NULL when s is not valid UTF-8 */
    if (v)
        return v;
    char *u = latin1_to_utf8(s);
    if (!u)
        return NULL;
    v = json_string(u);
    free(u);
    return v;
}

json_t *ds_json_number(double v)
{
    if (!isfinite(v))
        return json_null();
    /* Ten significant digits: what a reader of the report needs, and short
     * text under the writer's 15-digit precision (ds_json_write_line). */
    char b[32];
    snprintf(b, sizeof(b), "%.10g", v);
    return json_real(strtod(b, NULL));
}

int ds_json_is_number(const char *s)
{
    const char *p = s;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return 0;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-')
            p++;
        if (*p < '0' || *p > '9')
            return 0;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return *p == '\0';
}

json_t *ds_json_text_or_number(const char *s)
{
    if (!ds_json_is_number(s))
        return ds_json_text(s);
    /* An integer stays an integer when it fits; anything else that is
     * finite as a double becomes one (at most 15 significant digits, which
     * the writer gives back as written, up to trailing zeros). */
    if (!strpbrk(s, ".eE")) {
        errno = 0;
        char *end;
        const long long i = strtoll(s, &end, 10);
        if (errno == 0 && *end == '\0')
            return json_integer((json_int_t)i);
    }
    const double d = strtod(s, NULL);
    return isfinite(d) ? json_real(d) : ds_json_text(s);
}

int ds_json_set(json_t *obj, const char *key, json_t *val)
{
    if (!val)
        return -ENOMEM;
    /* jansson refuses a key that is not UTF-8: use its ds_json_text form. */
    json_t *k = ds_json_text(key);
    if (!k) {
        json_decref(val);
        return -ENOMEM;
    }
    const int r = json_object_set_new(obj, json_string_value(k), val); /* takes val */
    json_decref(k);
    return r == 0 ? 0 : -ENOMEM;
}

int ds_json_write_line(FILE *f, const json_t *v, int compact)
{
    const size_t flags = JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15) |
                         (compact ? JSON_COMPACT : 0);
    char *text = json_dumps(v, flags);
    if (!text)
        return -ENOMEM;
    const int bad = fputs(text, f) < 0 || fputc('\n', f) == EOF;
    free(text);
    return bad ? -EIO : 0;
}

/* ---- what a node waits on ------------------------------------------------ */

/* Append s to buf (n bytes, at *o), printable ASCII only. */
static void put_safe(char *buf, size_t n, size_t *o, const char *s)
{
    for (; *s && *o + 1 < n; s++)
        buf[(*o)++] = *s >= 0x20 && *s < 0x7f ? *s : '?';
    buf[*o] = 0;
}

int ds_wait_text(const char *doc, size_t len, char *buf, size_t n)
{
    buf[0] = 0;
    json_t *d = json_loadb(doc, len, 0, NULL);
    if (!json_is_object(d)) {
        json_decref(d);
        return -EINVAL;
    }
    const json_t *w = json_object_get(d, "waiting");
    const char *on = json_string_value(json_object_get(w, "on"));
    const double for_s = json_number_value(json_object_get(w, "for_s"));
    if (!json_is_object(w) || !on || for_s < DS_WAIT_SHOWN_S) {
        json_decref(d);
        return 0;
    }
    char head[96];
    const json_t *peers = json_object_get(w, "peers");
    const size_t np = json_array_size(peers);
    const json_int_t n_peers = json_integer_value(json_object_get(w, "n_peers"));
    if (!strcmp(on, "members"))
        snprintf(head, sizeof(head), "waiting %.1fs for members: %lld of %lld alive", for_s,
                 (long long)json_integer_value(json_object_get(w, "alive")),
                 (long long)json_integer_value(json_object_get(w, "want")));
    else if (!strcmp(on, "round"))
        snprintf(head, sizeof(head), "waiting %.1fs on round %lld%s", for_s,
                 (long long)json_integer_value(json_object_get(w, "round")), np ? ":" : "");
    else if (!strcmp(on, "group"))
        snprintf(head, sizeof(head), "waiting %.1fs on group reduction%s", for_s,
                 np ? " with" : "");
    else
        snprintf(head, sizeof(head), "waiting %.1fs on %.32s", for_s, on);
    size_t o = 0;
    put_safe(buf, n, &o, head);
    for (size_t i = 0; i < np; i++) {
        const char *p = json_string_value(json_array_get(peers, i));
        put_safe(buf, n, &o, i ? ", " : " ");
        put_safe(buf, n, &o, p ? p : "?");
    }
    if (n_peers > (json_int_t)np) {
        char more[32];
        snprintf(more, sizeof(more), " +%lld", (long long)(n_peers - (json_int_t)np));
        put_safe(buf, n, &o, more);
    }
    json_decref(d);
    return 0;
}
