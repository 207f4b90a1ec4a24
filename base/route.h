/*
 * base/route.h: the address of the interface that carries this host's
 * default route, for a node that listens on a wildcard address and must
 * tell peers an address they can dial (node.advertise, docs/config.md).
 *
 * The default route of a family is the route to 0.0.0.0/0 (or ::/0) that is
 * up and not a reject route, the lowest metric winning (the first listed
 * on a tie), as the kernel lists it in /proc/net/route (IPv4) and
 * /proc/net/ipv6_route (IPv6). Its interface's address is the first one
 * getifaddrs lists for that interface and family; for IPv6 a link-local
 * address (fe80::/10) does not count: it needs a zone id, which host:port
 * (base/hostport.h) has no place for.
 */
#ifndef DS_BASE_ROUTE_H
#define DS_BASE_ROUTE_H

#include <stddef.h>

/* Longest interface name with its NUL (IFNAMSIZ). */
#define DS_IFNAME_MAX 16

/* The interface of the default route in text, the contents of
 * /proc/net/route (default4) or /proc/net/ipv6_route (default6), into
 * ifname (DS_IFNAME_MAX bytes, caller's). Returns 0, or -ENOENT when the
 * text lists no default route (malformed lines are skipped). */
int ds_route_default4(const char *text, char *ifname);
int ds_route_default6(const char *text, char *ifname);

/* This host's default route for family (AF_INET or AF_INET6): its
 * interface into ifname (DS_IFNAME_MAX bytes) and that interface's address
 * as text, without brackets, into addr (n bytes; INET6_ADDRSTRLEN is
 * enough). Returns 0; -ENOENT when there is no default route of that
 * family; -EADDRNOTAVAIL when its interface has no usable address of that
 * family; -EAFNOSUPPORT for another family; -errno when the route file or
 * getifaddrs fails (a missing /proc/net/ipv6_route, IPv6 disabled, is
 * -ENOENT). On failure ifname holds the route's interface when one was
 * found, else "". */
int ds_route_default_addr(int family, char *ifname, char *addr, size_t n);

#endif
