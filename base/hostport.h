/*
 * base/hostport.h: the one host:port parser of dsnode. Config keys, the
 * transport, status, dsviz and dslaunch all read addresses through it, so
 * an address one part accepts is an address every part accepts.
 *
 * Grammar (no spaces anywhere):
 *   hostport = host ":" port
 *   host     = ipv4 | "[" ipv6 "]" | name
 *   ipv4     = four decimal octets 0..255 joined by ".", no leading zeros
 *   ipv6     = what inet_pton(AF_INET6) accepts (no zone id)
 *   name     = RFC 1123 host name: labels of 1..63 letters, digits and "-",
 *              not starting or ending with "-", joined by "."; 253
 *              characters at most; the last label not all digits (that
 *              would be a malformed IPv4 address, RFC 3696 section 2)
 *   port     = decimal 0..65535, no sign, no leading zero (except "0")
 * Port 0 parses (a listener may ask the kernel for a port); callers that
 * need a real port check port >= 1 themselves.
 */
#ifndef DS_BASE_HOSTPORT_H
#define DS_BASE_HOSTPORT_H

#include <stddef.h>
#include <stdint.h>

#define DS_HOST_MAX 253
/* Longest text of a host:port: a bracketed name-length host, ":65535". */
#define DS_HOSTPORT_MAX (DS_HOST_MAX + 2 + 6)

enum ds_host_kind {
    DS_HOST_IPV4 = 0,
    DS_HOST_IPV6 = 1,
    DS_HOST_NAME = 2,
};

typedef struct ds_hostport {
    char host[DS_HOST_MAX + 1]; /* without brackets */
    uint16_t port;
    enum ds_host_kind kind;
} ds_hostport;

/* Parse s by the grammar above into *out (caller's). Returns 0, or -EINVAL
 * (out is then unspecified). */
int ds_hostport_parse(const char *s, ds_hostport *out) __attribute__((warn_unused_result));

/* Parse a host alone (no port, no brackets around an IPv6 address):
 * its kind, or -EINVAL. */
int ds_host_kind_of(const char *host);

/* "host:port", with an IPv6 host in brackets, into buf (n bytes, caller's).
 * Returns the length, or -ENAMETOOLONG when it does not fit, -EINVAL when
 * host is not a host by the grammar. */
int ds_hostport_format(const char *host, uint16_t port, char *buf, size_t n);

/* 1 when host (without brackets) is a loopback address: 127.0.0.0/8, ::1
 * or "localhost" (any case); else 0. */
int ds_host_is_loopback(const char *host);

/* 1 when host is a wildcard address: 0.0.0.0 or :: ; else 0. */
int ds_host_is_wildcard(const char *host);

#endif
