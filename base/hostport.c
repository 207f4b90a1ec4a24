/*
 * base/hostport.c: the host:port grammar of hostport.h. Strict on purpose:
 * a typo in an address (a leading zero, a stray space, an unbracketed IPv6
 * address whose last group would read as a port) is an error at the config
 * line, not a node that dials the wrong place.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

#include "base/hostport.h"

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool parse_ipv4(const char *s, size_t n)
{
    int parts = 0;
    size_t i = 0;
    while (i < n) {
        const size_t start = i;
        int v = 0;
        while (i < n && is_digit(s[i]) && i - start < 3)
            v = v * 10 + (s[i++] - '0');
        if (i == start || v > 255 || (i - start > 1 && s[start] == '0'))
            return false;
        parts++;
        if (i == n)
            break;
        if (s[i] != '.' || parts == 4)
            return false;
        i++;
        if (i == n)
            return false;
    }
    return parts == 4;
}

static bool parse_name(const char *s, size_t n)
{
    if (n == 0 || n > DS_HOST_MAX)
        return false;
    size_t label = 0;
    bool all_digits = true;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || s[i] == '.') {
            if (label == 0 || label > 63 || s[i - 1] == '-')
                return false;
            if (i == n && all_digits)
                return false;
            label = 0;
            all_digits = true;
            continue;
        }
        const char ch = s[i];
        const bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch);
        if (!alnum && ch != '-')
            return false;
        if (ch == '-' && label == 0)
            return false;
        if (!is_digit(ch))
            all_digits = false;
        label++;
    }
    return true;
}

static bool parse_ipv6(const char *s, size_t n)
{
    char buf[INET6_ADDRSTRLEN + 1];
    unsigned char addr[16];
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    return inet_pton(AF_INET6, buf, addr) == 1;
}

static int kind_of(const char *s, size_t n)
{
    if (parse_ipv4(s, n))
        return DS_HOST_IPV4;
    if (memchr(s, ':', n))
        return parse_ipv6(s, n) ? DS_HOST_IPV6 : -EINVAL;
    return parse_name(s, n) ? DS_HOST_NAME : -EINVAL;
}

int ds_host_kind_of(const char *host)
{
    return host ? kind_of(host, strlen(host)) : -EINVAL;
}

int ds_hostport_parse(const char *s, ds_hostport *out)
{
    if (!s || !out)
        return -EINVAL;
    const char *h0 = s, *h1, *colon;
    if (*s == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':')
            return -EINVAL;
        h0 = s + 1;
        h1 = rb;
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return -EINVAL; /* none, or an IPv6 address without brackets */
        h1 = colon;
    }
    const size_t hn = (size_t)(h1 - h0);
    const int kind = kind_of(h0, hn);
    if (kind < 0 || (*s == '[') != (kind == DS_HOST_IPV6))
        return -EINVAL;
    const char *p = colon + 1;
    const size_t pn = strlen(p);
    if (pn == 0 || pn > 5 || (p[0] == '0' && pn > 1))
        return -EINVAL;
    unsigned long v = 0;
    for (size_t i = 0; i < pn; i++) {
        if (!is_digit(p[i]))
            return -EINVAL;
        v = v * 10 + (unsigned long)(p[i] - '0');
    }
    if (v > 65535)
        return -EINVAL;
    memcpy(out->host, h0, hn);
    out->host[hn] = '\0';
    out->port = (uint16_t)v;
    out->kind = (enum ds_host_kind)kind;
    return 0;
}

int ds_hostport_format(const char *host, uint16_t port, char *buf, size_t n)
{
    const int kind = ds_host_kind_of(host);
    if (kind < 0 || !buf)
        return -EINVAL;
    const char *lb = kind == DS_HOST_IPV6 ? "[" : "", *rb = kind == DS_HOST_IPV6 ? "]" : "";
    const int len = snprintf(buf, n, "%s%s%s:%u", lb, host, rb, (unsigned)port);
    if (len < 0 || (size_t)len >= n)
        return -ENAMETOOLONG;
    return len;
}

int ds_host_is_loopback(const char *host)
{
    if (!host)
        return 0;
    if (!strcasecmp(host, "localhost"))
        return 1;
    const int kind = ds_host_kind_of(host);
    if (kind == DS_HOST_IPV4)
        return !strncmp(host, "127.", 4);
    if (kind == DS_HOST_IPV6) {
        struct in6_addr a;
        return inet_pton(AF_INET6, host, &a) == 1 && IN6_IS_ADDR_LOOPBACK(&a);
    }
    return 0;
}

int ds_host_is_wildcard(const char *host)
{
    if (!host)
        return 0;
    const int kind = ds_host_kind_of(host);
    if (kind == DS_HOST_IPV4)
        return !strcmp(host, "0.0.0.0");
    if (kind == DS_HOST_IPV6) {
        struct in6_addr a;
        return inet_pton(AF_INET6, host, &a) == 1 && IN6_IS_ADDR_UNSPECIFIED(&a);
    }
    return 0;
}
