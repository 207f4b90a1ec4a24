/*
 * base/route.c: the default route's interface and its address (route.h),
 * from the kernel's route tables in /proc and getifaddrs.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/route.h"

/* The next line of text from *p (without its newline) into line (n bytes;
 * a longer line is cut). false at the end. */
static bool next_line(const char **p, char *line, size_t n)
{
    if (!**p)
        return false;
    const char *nl = strchr(*p, '\n');
    const size_t len = nl ? (size_t)(nl - *p) : strlen(*p);
    const size_t k = len < n - 1 ? len : n - 1;
    memcpy(line, *p, k);
    line[k] = '\0';
    *p += len + (nl ? 1 : 0);
    return true;
}

static void keep_best(bool *found, uint32_t *best, uint32_t metric, const char *ifn,
                      char *ifname)
{
    if (*found && metric >= *best)
        return;
    *found = true;
    *best = metric;
    snprintf(ifname, DS_IFNAME_MAX, "%s", ifn);
}

/* Iface Destination Gateway Flags RefCnt Use Metric Mask MTU Window IRTT,
 * after one header line; addresses, flags and mask in hex, metric decimal. */
int ds_route_default4(const char *text, char *ifname)
{
    char line[512];
    bool found = false, header = true;
    uint32_t best = 0;
    ifname[0] = '\0';
    while (text && next_line(&text, line, sizeof(line))) {
        if (header) {
            header = false;
            continue;
        }
        char ifn[DS_IFNAME_MAX];
        unsigned dest, gw, flags, refcnt, use, mask;
        uint32_t metric;
        if (sscanf(line, "%15s %x %x %x %u %u %" SCNu32 " %x", ifn, &dest, &gw, &flags, &refcnt,
                   &use, &metric, &mask) != 8)
            continue;
        if (dest != 0 || mask != 0 || !(flags & RTF_UP) || (flags & RTF_REJECT))
            continue;
        keep_best(&found, &best, metric, ifn, ifname);
    }
    return found ? 0 : -ENOENT;
}

/* dest(32 hex) dest_len src(32 hex) src_len next_hop(32 hex) metric
 * refcnt use flags (hex) ifname; no header line. */
int ds_route_default6(const char *text, char *ifname)
{
    char line[512];
    bool found = false;
    uint32_t best = 0;
    ifname[0] = '\0';
    while (text && next_line(&text, line, sizeof(line))) {
        char dest[33], src[33], hop[33], ifn[DS_IFNAME_MAX];
        unsigned dlen, slen, refcnt, use, flags;
        uint32_t metric;
        if (sscanf(line, "%32s %x %32s %x %32s %" SCNx32 " %x %x %x %15s", dest, &dlen, src, &slen,
                   hop, &metric, &refcnt, &use, &flags, ifn) != 10)
            continue;
        if (strspn(dest, "0") != 32 || dlen != 0 || !(flags & RTF_UP) || (flags & RTF_REJECT))
            continue;
        keep_best(&found, &best, metric, ifn, ifname);
    }
    return found ? 0 : -ENOENT;
}

/* The whole of a /proc file (their size is 0 to stat) into a fresh string. */
static int read_proc(const char *path, char **out)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int e = 0;
    while (buf) {
        const size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len < cap - 1) {
            if (ferror(f))
                e = -EIO;
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf)
        return -ENOMEM;
    if (e) {
        free(buf);
        return e;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

int ds_route_default_addr(int family, char *ifname, char *addr, size_t n)
{
    ifname[0] = '\0';
    if (family != AF_INET && family != AF_INET6)
        return -EAFNOSUPPORT;
    char *text = NULL;
    int e = read_proc(family == AF_INET ? "/proc/net/route" : "/proc/net/ipv6_route", &text);
    if (e == -ENOENT)
        return -ENOENT;
    if (e < 0)
        return e;
    e = family == AF_INET ? ds_route_default4(text, ifname) : ds_route_default6(text, ifname);
    free(text);
    if (e < 0)
        return e;
    struct ifaddrs *ifa0;
    if (getifaddrs(&ifa0) < 0)
        return -errno;
    e = -EADDRNOTAVAIL;
    for (struct ifaddrs *ifa = ifa0; ifa && e == -EADDRNOTAVAIL; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr || ifa->ifa_addr->sa_family != family || strcmp(ifa->ifa_name, ifname))
            continue;
        const void *a;
        if (family == AF_INET) {
            a = &((const struct sockaddr_in *)(const void *)ifa->ifa_addr)->sin_addr;
        } else {
            const struct in6_addr *a6 =
                &((const struct sockaddr_in6 *)(const void *)ifa->ifa_addr)->sin6_addr;
            if (IN6_IS_ADDR_LINKLOCAL(a6))
                continue;
            a = a6;
        }
        e = inet_ntop(family, a, addr, (socklen_t)n) ? 0 : -ENOSPC;
    }
    freeifaddrs(ifa0);
    return e;
}
