/*
 * tests/test_base.c: base/ (host:port, the train.layers grammar, the default route's interface, little-endian helpers, SplitMix64's
 * bare-state step, the clock, opening a named file as a regular file).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file.h"
#include "base/hostport.h"
#include "base/layerspec.h"
#include "base/le.h"
#include "base/route.h"
#include "base/splitmix.h"

/* ---- layer lists (train.layers) --------------------------------------------- */

Test(base, layerspec_cnn_parses_and_checks)
{
    ds_layerspec sp;
    ds_layerspec_err e;
    cr_assert_eq(ds_layerspec_parse(DS_LAYERSPEC_CNN, &sp, &e), 0, "%s", e.expected);
    cr_expect_eq(sp.n, 10);
    cr_expect_eq(sp.l[0].kind, DS_L_CONV);
    cr_expect_eq(sp.l[0].k, 3);
    cr_expect_eq(sp.l[0].n, 32);
    cr_expect_eq(sp.l[2].kind, DS_L_MAXPOOL);
    cr_expect_eq(sp.l[6].kind, DS_L_FLATTEN);
    cr_expect_eq(sp.l[9].kind, DS_L_LINEAR);
    cr_expect_eq(sp.l[9].n, 10);
    cr_expect_eq(ds_layerspec_check(&sp, 1, 28, 28, 10, &e), 0, "%s", e.expected);
    /* Blanks around items and colons; the formatted items are canonical. */
    cr_assert_eq(ds_layerspec_parse(" conv5x5 : 7 ,relu,\tflatten , linear: 3 ", &sp, &e), 0);
    char t[32];
    ds_lspec_format(&sp.l[0], t, sizeof(t));
    cr_expect_str_eq(t, "conv5x5:7");
    ds_lspec_format(&sp.l[3], t, sizeof(t));
    cr_expect_str_eq(t, "linear:3");
    cr_expect_eq(ds_layerspec_check(&sp, 1, 4, 5, 3, &e), 0, "%s", e.expected);
}

/* The parse or the check of `s` fails at the text `tok` (layer index). */
static void refused(const char *s, const char *tok, int index, const char *want)
{
    ds_layerspec sp;
    ds_layerspec_err e;
    int r = ds_layerspec_parse(s, &sp, &e);
    if (r == 0)
        r = ds_layerspec_check(&sp, 1, 28, 28, 10, &e);
    cr_assert_eq(r, -EINVAL, "'%s' accepted", s);
    cr_expect_eq(e.len, strlen(tok), "'%s': token length %zu", s, e.len);
    cr_expect_eq(strncmp(s + e.at, tok, e.len), 0, "'%s': token at %zu", s, e.at);
    cr_expect_eq(e.index, index, "'%s': index %d", s, e.index);
    cr_expect(strstr(e.expected, want), "'%s': expected '%s', got '%s'", s, want, e.expected);
}

Test(base, layerspec_refuses_naming_the_token)
{
    refused("conv3x3:32, rleu, flatten, linear:10", "rleu", 2, "a layer: conv<K>x<K>:<C>");
    refused("conv3x3:32,, linear:10", "", 2, "a layer");
    refused("", "", 1, "a layer");
    refused("conv3x5:8, flatten, linear:10", "conv3x5:8", 1, "square kernel of odd size");
    refused("conv4x4:8, flatten, linear:10", "conv4x4:8", 1, "odd size");
    refused("conv11x11:8, flatten, linear:10", "conv11x11:8", 1, "K in 1, 3, 5, 7, 9");
    refused("conv3x3:0, flatten, linear:10", "conv3x3:0", 1, "in 1..4096");
    refused("conv3x3, flatten, linear:10", "conv3x3", 1, "conv<K>x<K>:<C>");
    refused("conv3x3:8x, flatten, linear:10", "conv3x3:8x", 1, "conv<K>x<K>:<C>");
    refused("flatten, linear:65537, linear:10", "linear:65537", 2, "in 1..65536");
    refused("flatten, linear10", "linear10", 2, "linear:<N>");
    refused("flatten, linear:-3", "linear:-3", 2, "linear:<N>");
    refused("Relu", "Relu", 1, "a layer");
    /* shapes */
    refused("linear:10", "linear:10", 1, "flatten before linear");
    refused("flatten, conv3x3:4, linear:10", "conv3x3:4", 2, "conv before flatten");
    refused("flatten, maxpool2, linear:10", "maxpool2", 2, "maxpool2 before flatten");
    refused("maxpool2, maxpool2, maxpool2, maxpool2, maxpool2, flatten, linear:10", "maxpool2", 5,
            "at least 2x2 (its input here is 1x1x1)");
    refused("relu, flatten, linear:10", "relu", 1, "relu after a conv");
    refused("conv1x1:2, relu, relu, flatten, linear:10", "relu", 3, "relu after a conv");
    refused("flatten, flatten, linear:10", "flatten", 2, "one flatten");
    refused("flatten, linear:12", "linear:12", 2, "linear:10 (one output per class)");
    refused("flatten, linear:10, relu", "relu", 3, "the last layer to be linear:10");
    refused("flatten, linear:65536, linear:65536, linear:10", "linear:65536", 3,
            "at most 2147483647 parameters");
    char params[400] = "";
    for (int i = 0; i < DS_LAYERSPEC_MAX_PARAM; i++)
        strcat(params, "conv1x1:1, ");
    strcat(params, "flatten, linear:10");
    refused(params, "linear:10", DS_LAYERSPEC_MAX_PARAM + 2, "at most 16 conv and linear layers");
    char many[400] = "";
    for (int i = 0; i < DS_LAYERSPEC_MAX; i++)
        strcat(many, "conv1x1:1, ");
    strcat(many, "flatten");
    refused(many, "flatten", DS_LAYERSPEC_MAX + 1, "at most 32 layers");
}

/* ---- host:port ------------------------------------------------------------ */

Test(base, hostport_accepts)
{
    static const struct {
        const char *s;
        const char *host;
        int port;
        enum ds_host_kind kind;
    } good[] = {
        {"127.0.0.1:7000", "127.0.0.1", 7000, DS_HOST_IPV4},
        {"0.0.0.0:1", "0.0.0.0", 1, DS_HOST_IPV4},
        {"255.255.255.255:65535", "255.255.255.255", 65535, DS_HOST_IPV4},
        {"localhost:80", "localhost", 80, DS_HOST_NAME},
        {"node-1.rack2.example.org:9", "node-1.rack2.example.org", 9, DS_HOST_NAME},
        {"a:1", "a", 1, DS_HOST_NAME},
        {"1a.2b:5", "1a.2b", 5, DS_HOST_NAME},
        {"3com.net:22", "3com.net", 22, DS_HOST_NAME},
        {"node-3.cluster:65535", "node-3.cluster", 65535, DS_HOST_NAME},
        {"[::1]:7", "::1", 7, DS_HOST_IPV6},
        {"[::]:7000", "::", 7000, DS_HOST_IPV6},
        {"[fd00:1:2::3]:5000", "fd00:1:2::3", 5000, DS_HOST_IPV6},
        {"[::ffff:10.0.0.1]:1", "::ffff:10.0.0.1", 1, DS_HOST_IPV6},
        {"127.0.0.1:0", "127.0.0.1", 0, DS_HOST_IPV4},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        ds_hostport hp;
        cr_expect_eq(ds_hostport_parse(good[i].s, &hp), 0, "'%s' refused", good[i].s);
        cr_expect_str_eq(hp.host, good[i].host);
        cr_expect_eq(hp.port, good[i].port, "%s: port %u", good[i].s, hp.port);
        cr_expect_eq(hp.kind, good[i].kind, "%s: kind %d", good[i].s, hp.kind);
    }
}

Test(base, hostport_refuses)
{
    static const char *const bad[] = {
        "", ":7000", "host", "host:", "host:65536", "host:07000", "host:+80", "host:8o",
        "::1:7000", "1.2.3:7000", "1.2.3.4.5:7000", "256.1.1.1:7", "01.2.3.4:7", "-host:7",
        "host-:7", "ho_st:7", "a..b:7", "a.:7", "host :7", " host:7", "host:7 ", "123:7",
        "1.2.3.04:7", "h:12a", "[::1]80", "h:123456", "[::1:7", "[]:7", "[127.0.0.1]:7",
        "[localhost]:7", "[::1%eth0]:7", "[:::1]:7", "[::1]:", "[::1]:x",
    };
    ds_hostport hp;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(ds_hostport_parse(bad[i], &hp), -EINVAL, "'%s' accepted", bad[i]);
    cr_expect_eq(ds_hostport_parse(NULL, &hp), -EINVAL);
    cr_expect_eq(ds_hostport_parse("a:1", NULL), -EINVAL);
}

Test(base, hostport_name_lengths)
{
    /* Labels up to 63 characters, 253 characters in all. */
    char name[300];
    ds_hostport hp;
    for (int last = 61; last <= 62; last++) {
        memset(name, 'a', 63);
        name[63] = '.';
        memset(name + 64, 'b', 63);
        name[127] = '.';
        memset(name + 128, 'c', 63);
        name[191] = '.';
        memset(name + 192, 'd', (size_t)last);
        strcpy(name + 192 + last, ":1");
        cr_expect_eq(ds_hostport_parse(name, &hp), last == 61 ? 0 : -EINVAL, "%d characters",
                     192 + last);
    }
    memset(name, 'e', 64);
    strcpy(name + 64, ":1");
    cr_expect_eq(ds_hostport_parse(name, &hp), -EINVAL, "64-character label");
    name[63] = ':';
    name[64] = '1';
    name[65] = '\0';
    cr_expect_eq(ds_hostport_parse(name, &hp), 0, "63-character label");
}

Test(base, hostport_format_round_trips)
{
    static const char *const in[] = {"127.0.0.1:7000", "[::1]:7", "node-1.example:65535",
                                     "[fd00::3]:1"};
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        ds_hostport hp;
        char buf[DS_HOSTPORT_MAX + 1];
        cr_assert_eq(ds_hostport_parse(in[i], &hp), 0);
        cr_expect_eq(ds_hostport_format(hp.host, hp.port, buf, sizeof(buf)), (int)strlen(in[i]));
        cr_expect_str_eq(buf, in[i]);
    }
    char small[8];
    cr_expect_eq(ds_hostport_format("127.0.0.1", 7000, small, sizeof(small)), -ENAMETOOLONG);
    cr_expect_eq(ds_hostport_format("bad host", 1, small, sizeof(small)), -EINVAL);
}

/* ---- the default route (route.h) ------------------------------------------- */

Test(base, route_default4)
{
    char ifn[DS_IFNAME_MAX];
    /* As the kernel writes it: a header, tabs, trailing blanks. */
    const char *one = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT   \n"
                      "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0   \n"
                      "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0   \n";
    cr_expect_eq(ds_route_default4(one, ifn), 0);
    cr_expect_str_eq(ifn, "eth0");
    /* The lowest metric wins; a down route, a reject route, a route to
     * 0.0.0.0 with a mask and a malformed line do not count. */
    const char *many = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
                       "wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n"
                       "eth1\t00000000\t0101A8C0\t0002\t0\t0\t1\t00000000\t0\t0\t0\n"
                       "blk\t00000000\t00000000\t0201\t0\t0\t2\t00000000\t0\t0\t0\n"
                       "eth2\t00000000\t0101A8C0\t0003\t0\t0\t3\t000000FF\t0\t0\t0\n"
                       "junk line\n"
                       "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
                       "eth3\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n";
    cr_expect_eq(ds_route_default4(many, ifn), 0);
    cr_expect_str_eq(ifn, "eth0");
    const char *none = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
                       "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
    cr_expect_eq(ds_route_default4(none, ifn), -ENOENT);
    cr_expect_str_eq(ifn, "");
    cr_expect_eq(ds_route_default4("", ifn), -ENOENT);
    /* The header alone: its words are not a route. */
    cr_expect_eq(ds_route_default4("Iface\tDestination\n", ifn), -ENOENT);
}

Test(base, route_default6)
{
    char ifn[DS_IFNAME_MAX];
    const char *z = "00000000000000000000000000000000";
    char text[2048];
    /* The loopback's "unreachable" default (RTF_REJECT) comes first, a
     * prefix route, then the real default with a gateway. */
    snprintf(text, sizeof(text),
             "%s 00 %s 00 %s ffffffff 00000001 00000000 00200200       lo\n"
             "fd000000000000000000000000000000 40 %s 00 %s 00000100 00000001 00000000 00000001     eth0\n"
             "%s 00 %s 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n",
             z, z, z, z, z, z, z);
    cr_expect_eq(ds_route_default6(text, ifn), 0);
    cr_expect_str_eq(ifn, "eth0");
    /* Metrics are hex: 0x100 (256) beats 0x400 (1024). */
    snprintf(text, sizeof(text),
             "%s 00 %s 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n"
             "%s 00 %s 00 fe800000000000000000000000000001 00000100 00000001 00000000 00000003    wlan0\n",
             z, z, z, z);
    cr_expect_eq(ds_route_default6(text, ifn), 0);
    cr_expect_str_eq(ifn, "wlan0");
    snprintf(text, sizeof(text), "%s 00 %s 00 %s ffffffff 00000001 00000000 00200200       lo\n", z,
             z, z);
    cr_expect_eq(ds_route_default6(text, ifn), -ENOENT);
    cr_expect_eq(ds_route_default6("", ifn), -ENOENT);
}

Test(base, route_default_addr_here)
{
    /* The real tables of this host (whether it has a default route is the
     * host's business; tests/test_addr.c makes one in a namespace). */
    char ifn[DS_IFNAME_MAX], addr[64];
    int e = ds_route_default_addr(AF_INET, ifn, addr, sizeof(addr));
    cr_expect(e == 0 || e == -ENOENT || e == -EADDRNOTAVAIL, "AF_INET: %d", e);
    if (e == 0) {
        cr_expect_eq(ds_host_kind_of(addr), DS_HOST_IPV4, "'%s'", addr);
        cr_expect_not(ds_host_is_wildcard(addr));
        cr_expect_neq(ifn[0], '\0');
    }
    e = ds_route_default_addr(AF_INET6, ifn, addr, sizeof(addr));
    cr_expect(e == 0 || e == -ENOENT || e == -EADDRNOTAVAIL, "AF_INET6: %d", e);
    if (e == 0) {
        cr_expect_eq(ds_host_kind_of(addr), DS_HOST_IPV6, "'%s'", addr);
        cr_expect_not(ds_host_is_wildcard(addr));
        cr_expect_neq(strncmp(addr, "fe80:", 5), 0, "link-local '%s'", addr);
    }
    cr_expect_eq(ds_route_default_addr(AF_UNIX, ifn, addr, sizeof(addr)), -EAFNOSUPPORT);
}

Test(base, host_classes)
{
    cr_expect(ds_host_is_loopback("127.0.0.1"));
    cr_expect(ds_host_is_loopback("127.200.3.4"));
    cr_expect(ds_host_is_loopback("LOCALHOST"));
    cr_expect(ds_host_is_loopback("::1"));
    cr_expect_not(ds_host_is_loopback("127.example.com"));
    cr_expect_not(ds_host_is_loopback("10.0.0.1"));
    cr_expect_not(ds_host_is_loopback("localhost.example"));
    cr_expect_not(ds_host_is_loopback("::2"));
    cr_expect_not(ds_host_is_loopback(NULL));
    cr_expect(ds_host_is_wildcard("0.0.0.0"));
    cr_expect(ds_host_is_wildcard("::"));
    cr_expect(ds_host_is_wildcard("0:0::0"));
    cr_expect_not(ds_host_is_wildcard("0.0.0.1"));
    cr_expect_not(ds_host_is_wildcard("localhost"));
}

/* ---- little-endian ------------------------------------------------------- */

Test(base, le_round_trips_and_byte_order)
{
    uint8_t b[8];
    ds_put64(b, 0x0807060504030201ull);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(b[i], i + 1);
    cr_expect_eq(ds_le64(b), 0x0807060504030201ull);
    cr_expect_eq(ds_le32(b + 4), 0x08070605u);
    cr_expect_eq(ds_le16(b + 6), 0x0807u);
    ds_put32(b, 0xdeadbeefu);
    cr_expect_eq(b[0], 0xef);
    cr_expect_eq(ds_le32(b), 0xdeadbeefu);
    ds_put16(b, 0xbeef);
    cr_expect_eq(b[1], 0xbe);
    cr_expect_eq(ds_le16(b), 0xbeef);
}

/* ---- SplitMix64 and the clock ---------------------------------------------- */

Test(base, splitmix_step_is_next)
{
    ds_splitmix64 g;
    ds_splitmix64_seed(&g, 1234567);
    uint64_t bare = 1234567;
    for (int i = 0; i < 100; i++)
        cr_assert_eq(ds_splitmix64_step(&bare), ds_splitmix64_next(&g));
    /* The published first output for state 1234567. */
    bare = 1234567;
    cr_expect_eq(ds_splitmix64_step(&bare), 6457827717110365317ull);
}

Test(base, clock_is_monotonic)
{
    uint64_t a = ds_now_ns(), b = ds_now_ns();
    cr_expect_geq(b, a);
    cr_expect_leq(ds_now_ms(), ds_now_ns() / 1000000u);
}

/* ---- opening a named file (issue 16) ------------------------------------- */

/* A FIFO, a directory, a device and a missing path are refused at once;
 * alarm() turns an open that blocks (a FIFO without a writer, before the
 * fix) into a crash of this test instead of a hang. */
Test(base, open_regular_refuses_without_blocking)
{
    char dir[] = "/tmp/ds_test_base.XXXXXX", fifo[64], reg[64], why[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    snprintf(reg, sizeof(reg), "%s/reg", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    FILE *f = fopen(reg, "w");
    cr_assert_not_null(f);
    fputs("text", f);
    fclose(f);
    alarm(10);

    cr_expect_eq(ds_file_open_regular(fifo, NULL, why, sizeof(why)), -EINVAL);
    cr_expect_str_eq(why, "not a regular file (a FIFO)");
    cr_expect_eq(ds_file_open_regular(dir, NULL, why, sizeof(why)), -EISDIR);
    cr_expect_str_eq(why, "Is a directory");
    cr_expect_eq(ds_file_open_regular("/dev/null", NULL, why, sizeof(why)), -EINVAL);
    cr_expect_str_eq(why, "not a regular file (a character device)");
    cr_expect_eq(ds_file_open_regular("/nonexistent/x", NULL, why, sizeof(why)), -ENOENT);
    cr_expect_str_eq(why, "No such file or directory");

    struct stat st;
    int fd = ds_file_open_regular(reg, &st, why, sizeof(why));
    cr_assert_geq(fd, 0, "%s", why);
    cr_expect_eq(st.st_size, 4);
    cr_expect_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK left set");
    cr_expect_neq(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0, "no FD_CLOEXEC");
    char buf[8] = "";
    cr_expect_eq(read(fd, buf, sizeof(buf)), 4);
    cr_expect_str_eq(buf, "text");
    close(fd);
    alarm(0);
    unlink(fifo);
    unlink(reg);
    rmdir(dir);
}
