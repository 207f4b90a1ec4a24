/*
 * node/runtime/preflight.c: the file-system and network checks made before
 * a node trains (preflight.h).
 *
 * A directory is "writable" when a probe file can be created in it, not
 * when its mode bits say so: the node often runs as root, whom mode bits
 * do not stop, while a read-only mount, a full disk or a file where the
 * directory should be still do. The probe is created with O_EXCL under a
 * name of its own and always removed.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hostport.h"
#include "base/route.h"
#include "node/runtime/preflight.h"
#include "node/sec/allow.h"
#include "node/sec/keys.h"
#include "node/wire/header.h"

#define PROBE_NAME ".dsnode-probe"

/* Create, size (bytes > 0: posix_fallocate) and remove a probe file in dir.
 * 0 or a negative errno; what names the step that failed. */
static int probe_dir(const char *dir, uint64_t bytes, const char **what)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/" PROBE_NAME ".%ld", dir, (long)getpid());
    *what = "cannot create a file in it";
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    int e = 0;
    if (bytes) {
        *what = "no room for model.bin";
        e = posix_fallocate(fd, 0, (off_t)bytes);
        /* A file system without fallocate (some network ones) cannot be
         * asked ahead; the final save still reports a full disk. */
        if (e == EOPNOTSUPP || e == EINVAL)
            e = 0;
        e = -e;
    }
    if (close(fd) < 0 && !e) {
        *what = "cannot write a file in it";
        e = -errno;
    }
    unlink(path);
    return e;
}

/* An existing directory: a directory, and writable with room for bytes. */
static int check_dir(const char *key, const char *dir, uint64_t bytes, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(dir, &sb) < 0) {
        snprintf(err, err_len, "%s: %s: %s", key, dir, strerror(errno));
        return -errno;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%s: %s: expected a directory, found %s", key, dir,
                 ds_file_kind(sb.st_mode));
        return -ENOTDIR;
    }
    const char *what;
    const int e = probe_dir(dir, bytes, &what);
    if (e < 0)
        snprintf(err, err_len, "%s: %s: %s: %s", key, dir, what, strerror(-e));
    return e;
}

/* A directory that may not exist yet: itself if it exists, else its parent
 * (which must exist: the node creates one level, as `run` does). */
static int check_dir_or_parent(const char *key, const char *dir, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(dir, &sb) == 0 || errno != ENOENT)
        return check_dir(key, dir, 0, err, err_len);
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", dir);
    return check_dir(key, dirname(copy), 0, err, err_len);
}

int ds_preflight_outputs(const ds_conf *c, uint64_t model_bytes, char *err, size_t err_len)
{
    const char *dir = c->node.data_dir;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, err_len, "node.data_dir: %s: cannot create: %s", dir, strerror(errno));
        return -errno;
    }
    return check_dir("node.data_dir", dir, model_bytes, err, err_len);
}

/* ---- check-config ------------------------------------------------------------- */

static int check_keys(const ds_conf *c, char *err, size_t err_len)
{
    char why[1024];
    int e = 0;
    const char *key = NULL;
    if (c->cluster.identity_file[0]) {
        ds_identity id;
        key = "cluster.identity_file";
        if ((e = ds_identity_load(&id, c->cluster.identity_file, why, sizeof(why))) == 0)
            ds_identity_wipe(&id);
    }
    if (!e && c->cluster.key_file[0]) {
        ds_cluster_key k;
        key = "cluster.key_file";
        if ((e = ds_cluster_key_load(&k, c->cluster.key_file, why, sizeof(why))) == 0)
            ds_cluster_key_wipe(&k);
    }
    if (!e && c->cluster.allowed_keys[0]) {
        ds_allowlist *al = NULL;
        key = "cluster.allowed_keys";
        if ((e = ds_allowlist_load(&al, c->cluster.allowed_keys, why, sizeof(why))) == 0)
            ds_allowlist_free(&al);
    }
    if (e < 0)
        snprintf(err, err_len, "%s: %s", key, why);
    return e;
}

/* The four Fashion-MNIST files train/data.c reads: there, regular and
 * readable. Their content is `run`'s to check (it decodes them). */
static int check_dataset(const ds_conf *c, char *err, size_t err_len)
{
    static const char *const names[] = {
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char path[4200], why[128];
        snprintf(path, sizeof(path), "%s/%s", c->train.dataset_dir, names[i]);
        const int fd = ds_file_open_regular(path, NULL, why, sizeof(why));
        if (fd < 0) {
            snprintf(err, err_len, "train.dataset_dir: %s: %s", path, why);
            return fd;
        }
        close(fd);
    }
    return 0;
}

/* key's host:port can be bound by a TCP socket now (port 0: nothing to
 * check). SO_REUSEADDR, as the listeners set it: a port in TIME_WAIT is
 * free; one that something is bound to is not. */
static int check_port(const char *key, const char *value, char *err, size_t err_len)
{
    ds_hostport hp;
    if (!value[0] || ds_hostport_parse(value, &hp) < 0 || hp.port == 0)
        return 0; /* empty: off; malformed: conf's check said so already */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", (unsigned)hp.port);
    int g = getaddrinfo(hp.host, port, &hints, &ai);
    if (g) {
        snprintf(err, err_len, "%s: %s: cannot resolve: %s", key, value, gai_strerror(g));
        return -EHOSTUNREACH;
    }
    int e = 0;
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        e = -errno;
        snprintf(err, err_len, "%s: %s: cannot be bound now: %s", key, value, strerror(errno));
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return e;
}

int ds_preflight_advertise(const ds_conf *c, char *out, size_t n, char *how, size_t how_n,
                           char *err, size_t err_len)
{
    if (how_n)
        how[0] = '\0';
    const char *chosen = c->node.advertise[0] ? c->node.advertise : c->node.listen;
    ds_hostport hp;
    if (ds_hostport_parse(chosen, &hp) < 0) {
        snprintf(err, err_len, "%s: expected host:port, found '%s'",
                 c->node.advertise[0] ? "node.advertise" : "node.listen", chosen);
        return -EINVAL;
    }
    if (c->node.advertise[0] || !ds_host_is_wildcard(hp.host)) {
        /* Membership records and hellos carry it in a 127-byte field. */
        if (strlen(chosen) > DS_WIRE_ADDR_MAX || (size_t)snprintf(out, n, "%s", chosen) >= n) {
            snprintf(err, err_len, "%s: expected at most %d characters (the address field of "
                     "membership records), found '%s' (%zu characters)",
                     c->node.advertise[0] ? "node.advertise" : "node.listen", DS_WIRE_ADDR_MAX,
                     chosen, strlen(chosen));
            return -ENAMETOOLONG;
        }
        return 0;
    }
    const int fam = hp.kind == DS_HOST_IPV6 ? AF_INET6 : AF_INET;
    const char *v = fam == AF_INET6 ? "IPv6" : "IPv4";
    char ifn[DS_IFNAME_MAX], addr[INET6_ADDRSTRLEN], why[160];
    const int e = ds_route_default_addr(fam, ifn, addr, sizeof(addr));
    if (e == 0) {
        if (ds_hostport_format(addr, hp.port, out, n) < 0) {
            snprintf(err, err_len, "node.listen = %s: the default route's address %s does not "
                     "fit", c->node.listen, addr);
            return -ENAMETOOLONG;
        }
        snprintf(how, how_n, "%s, the interface of the %s default route", ifn, v);
        return 0;
    }
    if (e == -ENOENT)
        snprintf(why, sizeof(why), "no %s default route was found (%s)", v,
                 fam == AF_INET6 ? "/proc/net/ipv6_route" : "/proc/net/route");
    else if (e == -EADDRNOTAVAIL)
        snprintf(why, sizeof(why), "%s, the interface of the %s default route, has no %s%s "
                 "address", ifn, v, fam == AF_INET6 ? "non-link-local " : "", v);
    else
        snprintf(why, sizeof(why), "the %s default route cannot be read: %s", v, strerror(-e));
    snprintf(err, err_len, "node.listen = %s is a wildcard address and %s; set node.advertise = "
             "host:port, the address peers dial", c->node.listen, why);
    return e;
}

int ds_preflight_all(const ds_conf *c, char *err, size_t err_len)
{
    int e;
    if ((e = check_keys(c, err, err_len)) < 0 || (e = check_dataset(c, err, err_len)) < 0 ||
        (e = check_dir_or_parent("node.data_dir", c->node.data_dir, err, err_len)) < 0)
        return e;
    if (c->status.file[0]) {
        char copy[4096];
        snprintf(copy, sizeof(copy), "%s", c->status.file);
        if ((e = check_dir("status.file", dirname(copy), 0, err, err_len)) < 0)
            return e;
    }
    if ((e = check_port("node.listen", c->node.listen, err, err_len)) < 0)
        return e;
    char adv[DS_HOSTPORT_MAX + 1], how[64];
    if ((e = ds_preflight_advertise(c, adv, sizeof(adv), how, sizeof(how), err, err_len)) < 0)
        return e;
    return check_port("status.listen", c->status.listen, err, err_len);
}
